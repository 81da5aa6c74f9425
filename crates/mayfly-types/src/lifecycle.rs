//! What a sandbox runs besides its commands: services, lifecycle hooks,
//! artifacts, a git workspace and secrets. A template declares them and a
//! create call may add to them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A long-running process every sandbox of a template starts before it
/// counts as ready (a database, a cache).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// `[a-z0-9][a-z0-9_-]{0,31}`, unique in the sandbox.
    pub name: String,
    /// The program and its arguments (no shell unless it names one).
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Uid inside the sandbox; the template's user when absent.
    #[serde(default)]
    pub user: Option<u32>,
    /// Working directory; the template's workdir when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// How to tell the service is ready; started is ready when absent.
    #[serde(default)]
    pub ready: Option<Probe>,
    /// How long the probe may take to pass before the create fails.
    #[serde(default)]
    pub ready_timeout_secs: Option<u64>,
    #[serde(default)]
    pub restart: RestartPolicy,
    /// Restarts allowed before the service is left stopped.
    #[serde(default)]
    pub max_restarts: Option<u32>,
}

/// A readiness probe, run inside the sandbox's own network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Probe {
    /// A command that exits 0 when the service is ready.
    Exec(Vec<String>),
    /// A TCP connect to 127.0.0.1 on this port.
    Tcp(u16),
    /// An HTTP GET on 127.0.0.1 answered with a 2xx.
    Http(HttpProbe),
}

/// `GET http://127.0.0.1:{port}{path}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpProbe {
    pub port: u16,
    #[serde(default = "root_path")]
    pub path: String,
}

fn root_path() -> String {
    "/".into()
}

/// What happens when a service exits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestartPolicy {
    Never,
    #[default]
    OnFailure,
    Always,
}

/// Where a service is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    /// Started, its probe not passed yet.
    Starting,
    /// Running (and its probe passed once).
    Ready,
    /// Exited; waiting for its restart.
    Restarting,
    /// Exited and not restarted (policy `never`, or exit 0 under `on_failure`).
    Exited,
    /// Exited after using up its restarts, or never became ready.
    Failed,
}

/// `GET /v1/sandboxes/{id}/services`: one service of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServiceInfo {
    pub name: String,
    pub state: ServiceState,
    /// Times the supervisor started it again after an exit.
    pub restarts: u32,
    /// Its pid inside the sandbox while it runs.
    pub pid: Option<u32>,
    /// How its last run ended.
    pub last_exit: Option<crate::ExitStatus>,
    /// The end of its combined stdout and stderr (the last 4 KiB, lossy UTF-8).
    pub log_tail: String,
}

/// A command run inside the sandbox at one point of its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    pub command: Vec<String>,
    /// Killed after this long (default 60 s).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub on_failure: FailurePolicy,
    /// Uid inside the sandbox; the template's user when absent.
    #[serde(default)]
    pub user: Option<u32>,
}

/// What a failing hook does to the step it belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// The step fails (a create fails, a task run reports the hook's failure).
    #[default]
    Fail,
    /// Recorded in the audit log, then ignored.
    Ignore,
}

/// Hooks along create → prepare → run → finalize → remove.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    /// After the sandbox and its services are up, before it is handed out.
    #[serde(default)]
    pub after_create: Vec<Hook>,
    /// Before every exec marked as a task run.
    #[serde(default)]
    pub before_run: Vec<Hook>,
    /// After every exec marked as a task run.
    #[serde(default)]
    pub after_run: Vec<Hook>,
    /// Before teardown, before artifacts are collected.
    #[serde(default)]
    pub before_remove: Vec<Hook>,
}

impl Hooks {
    pub fn is_empty(&self) -> bool {
        self.after_create.is_empty()
            && self.before_run.is_empty()
            && self.after_run.is_empty()
            && self.before_remove.is_empty()
    }

    /// These hooks, then `more`'s, point by point.
    pub fn extended(&self, more: &Hooks) -> Hooks {
        let cat = |a: &[Hook], b: &[Hook]| a.iter().chain(b).cloned().collect();
        Hooks {
            after_create: cat(&self.after_create, &more.after_create),
            before_run: cat(&self.before_run, &more.before_run),
            after_run: cat(&self.after_run, &more.after_run),
            before_remove: cat(&self.before_remove, &more.before_remove),
        }
    }
}

/// A git checkout made into `/workspace` at create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitWorkspace {
    /// An absolute local path or a URL.
    pub repo: String,
    /// Branch, tag or commit to start from; the remote's HEAD when absent.
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
    /// A new branch created for this task at the starting commit.
    #[serde(default)]
    pub branch: Option<String>,
}

/// A secret: given at create or exec time, injected as env or as a file on
/// a tmpfs, never written anywhere Mayfly keeps.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// `[A-Za-z0-9_.-]{1,64}`.
    pub name: String,
    pub value: String,
    /// Exposed as this environment variable.
    #[serde(default)]
    pub env: Option<String>,
    /// Exposed as this file (absolute path under `/run/secrets`); the
    /// default when neither `env` nor `file` is given is
    /// `/run/secrets/<name>`.
    #[serde(default)]
    pub file: Option<String>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("env", &self.env)
            .field("file", &self.file)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_read_as_one_key_maps() {
        let p: Probe = serde_json::from_str(r#"{"tcp":5432}"#).unwrap();
        assert_eq!(p, Probe::Tcp(5432));
        let p: Probe = serde_json::from_str(r#"{"http":{"port":80}}"#).unwrap();
        assert_eq!(
            p,
            Probe::Http(HttpProbe {
                port: 80,
                path: "/".into()
            })
        );
        assert!(serde_json::from_str::<Probe>(r#"{"udp":53}"#).is_err());
    }

    #[test]
    fn secret_debug_never_shows_the_value() {
        let s = Secret {
            name: "tok".into(),
            value: "hunter2".into(),
            env: Some("TOKEN".into()),
            file: None,
        };
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
