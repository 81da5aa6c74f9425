//! Secrets: given to commands as environment variables or as files on the
//! sandbox's `/run/secrets` tmpfs (mode 0400, owned by the command's uid).
//! They live in the daemon's memory and the sandbox's tmpfs only: nothing
//! here writes them to the store, the audit trail, events or logs, and
//! [`redact`] scrubs them from any output quoted in an error.

use std::sync::Arc;

use mayfly_types::Secret;

use super::check::secret_file;
use crate::engine::sandbox::Sandbox;
use crate::engine::Engine;
use crate::EngineError;

/// How a secret's value is shown when some output quoted it.
const REDACTED: &str = "<redacted>";

/// `text` with every secret value replaced.
pub(crate) fn redact<'a>(text: &str, secrets: impl IntoIterator<Item = &'a Secret>) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        // A value of a few bytes would redact half the output and reveal
        // more by its gaps than it hides; those are not scrubbed.
        if s.value.len() >= 4 {
            out = out.replace(&s.value, REDACTED);
        }
    }
    out
}

/// The environment variables `secrets` ask for.
pub(crate) fn secret_env(secrets: &[Secret]) -> impl Iterator<Item = (String, String)> + '_ {
    secrets
        .iter()
        .filter_map(|s| s.env.as_ref().map(|e| (e.clone(), s.value.clone())))
}

/// The files `secrets` ask for.
pub(crate) fn secret_files(secrets: &[Secret]) -> Vec<(String, &Secret)> {
    secrets
        .iter()
        .filter_map(|s| secret_file(s).map(|f| (f, s)))
        .collect()
}

impl Engine {
    /// Writes the file secrets of the sandbox (when their owner is not
    /// `uid` yet) and of one command, owned by `uid`, mode 0400. A
    /// create-time file secret belongs to the uid of the last command
    /// started that is not the owner already.
    pub(crate) async fn write_secret_files(
        &self,
        sb: &Arc<Sandbox>,
        extra: &[Secret],
        uid: u32,
    ) -> Result<(), EngineError> {
        let life = sb.lifecycle();
        let own_stale = {
            let mut owner = sb.secret_owner.lock().unwrap_or_else(|p| p.into_inner());
            let stale = *owner != Some(uid);
            if stale {
                *owner = Some(uid);
            }
            stale
        };
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        if own_stale {
            files.extend(
                secret_files(&life.secrets)
                    .into_iter()
                    .map(|(p, s)| (p, s.value.clone().into_bytes())),
            );
        }
        files.extend(
            secret_files(extra)
                .into_iter()
                .map(|(p, s)| (p, s.value.clone().into_bytes())),
        );
        if files.is_empty() {
            return Ok(());
        }
        // The file API resolves without crossing mounts, and /run/secrets
        // is a mount of its own: a root shell inside the sandbox writes each
        // file from its stdin (never from argv or env, which are audited or
        // visible in /proc), then hands it to `uid`.
        const WRITE: &str = "umask 077 && mkdir -p \"${1%/*}\" && cat > \"$1.new\" && \
            chown \"$2:$2\" \"$1.new\" && chmod 0400 \"$1.new\" && mv -f \"$1.new\" \"$1\"";
        for (path, value) in files {
            let argv = ["sh", "-c", WRITE, "sh", &path, &uid.to_string()]
                .map(String::from)
                .to_vec();
            self.inside_quietly(sb, argv, Some(value))
                .await
                .map_err(|why| {
                    EngineError::Internal(format!(
                        "writing secret file `{path}` in sandbox {}: {why}",
                        sb.id
                    ))
                })?;
        }
        Ok(())
    }

    /// Runs a helper command as root inside the sandbox, without secrets
    /// and without an audit record; `Err` with its stderr when it fails.
    async fn inside_quietly(
        &self,
        sb: &Arc<Sandbox>,
        argv: Vec<String>,
        stdin: Option<Vec<u8>>,
    ) -> Result<(), String> {
        let mut spec = crate::engine::exec::CommandSpec::new(
            argv,
            Default::default(),
            Some("/".into()),
            Some(0),
            None,
        )
        .map_err(|e| e.to_string())?;
        spec.no_secrets = true;
        let started = self
            .spawn_command(sb, &spec)
            .await
            .map_err(|e| e.to_string())?;
        let out = [
            Arc::new(std::sync::Mutex::new(
                crate::engine::exec::Collected::default(),
            )),
            Arc::new(std::sync::Mutex::new(
                crate::engine::exec::Collected::default(),
            )),
        ];
        let opts = crate::engine::exec::PumpOptions {
            stdin,
            timeout: Some(std::time::Duration::from_secs(10)),
            limit: 4096,
            sink: crate::engine::exec::Sink::Buffer,
        };
        let r = self.pump(sb, started, opts, out).await;
        if r.status.exit_code == Some(0) {
            Ok(())
        } else {
            Err(format!(
                "{:?}: {}",
                r.status,
                String::from_utf8_lossy(&r.stderr.0).trim_end()
            ))
        }
    }

    /// Removes an exec's file secrets after it, unless the sandbox's own
    /// secrets use the same file.
    pub(crate) async fn remove_secret_files(&self, sb: &Arc<Sandbox>, extra: &[Secret]) {
        let life = sb.lifecycle();
        let keep: Vec<String> = secret_files(&life.secrets)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let gone: Vec<String> = secret_files(extra)
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| !keep.contains(p))
            .collect();
        if gone.is_empty() {
            return;
        }
        let mut argv = vec!["rm".to_owned(), "-f".to_owned(), "--".to_owned()];
        argv.extend(gone);
        let _ = self.inside_quietly(sb, argv, None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_replaces_every_occurrence_of_every_value() {
        let s = |v: &str| Secret {
            name: "a".into(),
            value: v.into(),
            env: None,
            file: None,
        };
        let secrets = [s("hunter22"), s("abc")];
        assert_eq!(
            redact("x hunter22 y hunter22 abc", &secrets),
            "x <redacted> y <redacted> abc"
        );
    }

    #[test]
    fn env_secrets_become_variables_and_the_rest_files() {
        let secrets = vec![
            Secret {
                name: "a".into(),
                value: "v".into(),
                env: Some("A".into()),
                file: None,
            },
            Secret {
                name: "b".into(),
                value: "w".into(),
                env: None,
                file: None,
            },
        ];
        let env: Vec<_> = secret_env(&secrets).collect();
        assert_eq!(env, vec![("A".to_string(), "v".to_string())]);
        let files: Vec<_> = secret_files(&secrets).into_iter().map(|(p, _)| p).collect();
        assert_eq!(files, vec!["/run/secrets/b".to_string()]);
    }
}
