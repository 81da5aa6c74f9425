//! The fake's commands: the tiny script language (see `fake.rs`) and the
//! audit record of each run.

use mayfly_engine::{Caller, EngineError};
use mayfly_types::{Bytes64, ExecAudit, ExecRequest, ExecResult, ExitStatus, SandboxId};

use super::FakeEngine;

impl FakeEngine {
    /// Runs the fake script language; `Err` when the command cannot start.
    pub(super) fn run(id: &SandboxId, req: &ExecRequest) -> Result<ExecResult, EngineError> {
        let (mut stdout, mut stderr, mut code) = (Vec::new(), Vec::new(), 0);
        let args = &req.argv[1.min(req.argv.len())..];
        match req.argv.first().map(String::as_str) {
            Some("echo") => stdout = format!("{}\n", args.join(" ")).into_bytes(),
            Some("cat") => stdout = req.stdin.clone().unwrap_or_default().0,
            Some("warn") => stderr = args.join(" ").into_bytes(),
            Some("exit") => code = args.first().and_then(|a| a.parse().ok()).unwrap_or(1),
            Some("gated") => {
                stdout = b"first".to_vec();
                stderr = b"second".to_vec();
            }
            Some("vanish") => stdout = b"partial".to_vec(),
            Some(other) => {
                return Err(EngineError::ExecFailed {
                    id: id.clone(),
                    argv0: other.to_owned(),
                    reason: "no such file or directory".into(),
                })
            }
            None => return Err(EngineError::Invalid("argv must not be empty".into())),
        }
        Ok(ExecResult {
            status: ExitStatus {
                exit_code: Some(code),
                signal: None,
                timed_out: false,
            },
            stdout_bytes: stdout.len() as u64,
            stderr_bytes: stderr.len() as u64,
            stdout: Bytes64(stdout),
            stderr: Bytes64(stderr),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_us: 42,
            hook_error: None,
        })
    }

    pub(super) fn record(
        &self,
        id: &SandboxId,
        req: &ExecRequest,
        r: &ExecResult,
        caller: &Caller,
    ) {
        let mut st = self.lock();
        st.callers.push(caller.name.clone());
        st.audit.push(ExecAudit {
            sandbox_id: id.to_string(),
            at: 1_700_000_000_000,
            argv: req.argv.clone(),
            exit_code: r.status.exit_code,
            signal: r.status.signal,
            timed_out: r.status.timed_out,
            error: None,
            duration_us: r.duration_us,
            stdout_bytes: r.stdout_bytes,
            stderr_bytes: r.stderr_bytes,
            caller: caller.name.clone(),
            kind: None,
            output: None,
        });
    }
}
