//! Audit and lifecycle records, as the store keeps them and the API shows them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::UnixMillis;

/// A lifecycle event (`created`, `ready`, `destroyed`, `failed`, `reaped`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Monotonic sequence number, for `?since=`.
    pub seq: i64,
    pub at: UnixMillis,
    pub sandbox_id: Option<String>,
    pub kind: String,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// One exec, as the audit trail records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecAudit {
    pub sandbox_id: String,
    pub at: UnixMillis,
    pub argv: Vec<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Set when the command could not be started at all.
    pub error: Option<String>,
    pub duration_us: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Who asked: `unix:uid=1000`, `tcp:token`, `cli:pid=123`.
    pub caller: String,
    /// What ran: absent for a user's command; `hook:<point>` for a
    /// lifecycle hook (`hook:after_create`, `hook:before_run`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A hook's output, bounded (the last 4 KiB of stdout then stderr,
    /// lossy UTF-8) with secret values redacted; absent for user commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl ExecAudit {
    /// The record of a command about to run: no outcome yet (the caller
    /// fills it in when the command ends, or could not start).
    pub fn begin(
        sandbox_id: String,
        at: UnixMillis,
        argv: Vec<String>,
        caller: String,
        kind: Option<String>,
    ) -> ExecAudit {
        ExecAudit {
            sandbox_id,
            at,
            argv,
            exit_code: None,
            signal: None,
            timed_out: false,
            error: None,
            duration_us: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
            caller,
            kind,
            output: None,
        }
    }
}
