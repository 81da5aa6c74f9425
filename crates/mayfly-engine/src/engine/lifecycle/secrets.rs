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
        // Through the file API, as every file the daemon puts in a sandbox:
        // resolved inside the sandbox's root (a symlink planted on the
        // tmpfs cannot lead out), written to a temporary name and renamed
        // into place, owned by `uid`, mode 0400. Its directories are the
        // sandbox root's, 0755, so a non-root `uid` can reach its file.
        let fs = Engine::fs_of(sb)?;
        let id = sb.id.clone();
        tokio::task::spawn_blocking(move || {
            for (path, value) in files {
                let parent = std::path::Path::new(&path)
                    .parent()
                    .and_then(|p| p.to_str())
                    .filter(|p| *p != super::check::SECRETS_DIR);
                if let Some(parent) = parent {
                    fs.mkdir(parent, true, Some(0o755))
                        .map_err(|e| secret_write_failed(&path, &id, &e))?;
                }
                fs.write(&path, &value, Some(0o400), uid)
                    .map_err(|e| secret_write_failed(&path, &id, &e))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| EngineError::Internal(format!("writing secret files panicked: {e}")))?
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
        let Ok(fs) = Engine::fs_of(sb) else {
            return;
        };
        // Best effort: a file the command removed itself is already gone.
        let _ = tokio::task::spawn_blocking(move || {
            for path in gone {
                let _ = fs.remove(&path, false);
            }
        })
        .await;
    }
}

/// A secret file that could not be written. The file API's error names
/// only the path and what failed, never the value.
fn secret_write_failed(
    path: &str,
    id: &mayfly_types::SandboxId,
    e: &crate::files::FilesError,
) -> EngineError {
    EngineError::Internal(format!("writing secret file `{path}` in sandbox {id}: {e}"))
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
