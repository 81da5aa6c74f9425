//! Commands run inside a sandbox: foreground execs and background processes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Bytes64, CreateRequest};

/// Default cap on each of stdout and stderr kept for a buffered result.
pub const DEFAULT_OUTPUT_LIMIT: u64 = 16 * 1024 * 1024;
/// The largest output cap a request may ask for.
pub const MAX_OUTPUT_LIMIT: u64 = 256 * 1024 * 1024;
/// The longest timeout a request may ask for (24 h).
pub const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments. No shell is involved unless argv names one.
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; `/workspace` when absent.
    pub cwd: Option<String>,
    /// Uid inside the sandbox (0..65535); 0 when absent.
    pub uid: Option<u32>,
    /// Gid inside the sandbox; the uid's value when absent.
    pub gid: Option<u32>,
    /// Bytes fed to the command's stdin, then EOF.
    pub stdin: Option<Bytes64>,
    /// Kill the whole process tree after this many milliseconds.
    pub timeout_ms: Option<u64>,
    /// Cap on each of stdout and stderr; the rest is discarded and flagged.
    pub output_limit: Option<u64>,
    /// A task run: the sandbox's `before_run` hooks run before it and its
    /// `after_run` hooks after it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run: bool,
    /// Secrets for this command only; never stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::Secret>,
}

/// `POST /v1/run`: one command in a sandbox made for it, destroyed as soon
/// as the command ends (or the client goes away).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The sandbox, as for `POST /v1/sandboxes`; a matching warm pool serves it.
    #[serde(default)]
    pub sandbox: CreateRequest,
    /// The command.
    pub exec: ExecRequest,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExitStatus {
    /// The exit code, when the command exited.
    pub exit_code: Option<i32>,
    /// The signal number, when a signal killed it.
    pub signal: Option<i32>,
    /// Whether Mayfly killed it because its timeout passed.
    pub timed_out: bool,
}

impl ExitStatus {
    /// The code a shell would report: the exit code, or 128 + signal.
    pub fn shell_code(&self) -> i32 {
        match (self.exit_code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 255,
        }
    }
}

/// The buffered answer of an exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    #[serde(flatten)]
    pub status: ExitStatus,
    pub stdout: Bytes64,
    pub stderr: Bytes64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Total bytes the command wrote to each stream, kept or not.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub duration_us: u64,
    /// A task run (`run: true`) whose `after_run` hook failed under policy
    /// `fail`: what failed. The command's own status and output are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_error: Option<String>,
}

/// One event of a streamed exec (`Accept: text/event-stream`).
///
/// SSE event names are `stdout`, `stderr` (data: base64) and `exit`
/// (data: the JSON of an [`ExecResult`] with empty stdout and stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(ExecResult),
}

/// `POST /v1/sandboxes/{id}/processes`: start a command in the background.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessRequest {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Cap on each of stdout and stderr kept by the daemon.
    pub output_limit: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    Running,
    Exited,
}

/// A background process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    /// The process handle, unique within the sandbox.
    pub handle: u64,
    /// Pid inside the sandbox.
    pub pid: u32,
    pub argv: Vec<String>,
    pub state: ProcessState,
    pub status: Option<ExitStatus>,
    pub started_at: u64,
}

/// `GET /v1/sandboxes/{id}/processes/{handle}/output`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessOutput {
    pub stdout: Bytes64,
    pub stderr: Bytes64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub state: ProcessState,
    pub status: Option<ExitStatus>,
}

/// `POST /v1/sandboxes/{id}/processes/{handle}/kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal number; SIGKILL (9) when absent.
    pub signal: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_code_follows_shell_convention() {
        let s = ExitStatus {
            exit_code: None,
            signal: Some(9),
            timed_out: true,
        };
        assert_eq!(s.shell_code(), 137);
    }

    #[test]
    fn exec_request_rejects_unknown_fields_and_negative_numbers() {
        assert!(serde_json::from_str::<ExecRequest>(r#"{"argv":["true"],"shell":1}"#).is_err());
        assert!(serde_json::from_str::<ExecRequest>(r#"{"argv":["true"],"uid":-1}"#).is_err());
    }
}
