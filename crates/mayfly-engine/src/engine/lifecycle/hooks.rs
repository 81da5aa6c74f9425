//! Hooks: commands run inside the sandbox at four points of its life, each
//! with a timeout and a failure policy, each recorded in the audit trail
//! with `kind = hook:<point>` and its bounded, redacted output.
//!
//! What a failing hook (policy `fail`) does:
//! * `after_create`: the create fails (the sandbox is destroyed);
//! * `before_run`: the task run is not started; the exec answers 409
//!   `conflict` with the hook's output in the message;
//! * `after_run`: the run's status and output are kept and the failure is
//!   reported in `ExecResult::hook_error`;
//! * `before_remove`: recorded (audit) and logged; removal continues, since
//!   nothing may block a removal.

use std::sync::Arc;
use std::time::Duration;

use mayfly_types::{ExecAudit, FailurePolicy, Hook};

use super::check::DEFAULT_HOOK_TIMEOUT_SECS;
use super::secrets::redact;
use super::services::LOG_TAIL;
use super::LifecycleError;
use crate::api::Caller;
use crate::engine::exec::{Collected, CommandSpec, PumpOptions, Sink};
use crate::engine::sandbox::Sandbox;
use crate::engine::{now_ms, Engine};

/// Output a hook may produce that is kept (the tail is what is recorded).
const HOOK_OUTPUT: u64 = 64 * 1024;

/// The four points of a sandbox's life where hooks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookPoint {
    AfterCreate,
    BeforeRun,
    AfterRun,
    BeforeRemove,
}

impl HookPoint {
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::AfterCreate => "after_create",
            HookPoint::BeforeRun => "before_run",
            HookPoint::AfterRun => "after_run",
            HookPoint::BeforeRemove => "before_remove",
        }
    }

    fn hooks(self, h: &mayfly_types::Hooks) -> &[Hook] {
        match self {
            HookPoint::AfterCreate => &h.after_create,
            HookPoint::BeforeRun => &h.before_run,
            HookPoint::AfterRun => &h.after_run,
            HookPoint::BeforeRemove => &h.before_remove,
        }
    }
}

/// The last `max` bytes of `a` then `b`, lossy UTF-8.
fn tail(a: &[u8], b: &[u8], max: usize) -> String {
    let mut all = Vec::with_capacity(a.len() + b.len());
    all.extend_from_slice(a);
    all.extend_from_slice(b);
    let skip = all.len().saturating_sub(max);
    String::from_utf8_lossy(&all[skip..]).into_owned()
}

impl Engine {
    /// Runs the sandbox's hooks of `point` in order. The first failing hook
    /// whose policy is `fail` stops the others and is returned; failures
    /// under `ignore` are only recorded.
    pub(crate) async fn run_hooks(
        &self,
        sb: &Arc<Sandbox>,
        point: HookPoint,
        caller: &Caller,
    ) -> Result<(), LifecycleError> {
        let life = sb.lifecycle();
        for hook in point.hooks(&life.hooks) {
            let failure = self.run_hook(sb, point, hook, caller).await;
            if let Some((status, output)) = failure {
                tracing::debug!(id = %sb.id, point = point.as_str(), %status, "hook failed");
                if hook.on_failure == FailurePolicy::Fail {
                    return Err(LifecycleError::HookFailed {
                        id: sb.id.clone(),
                        point: point.as_str(),
                        argv0: hook.command[0].clone(),
                        status,
                        output,
                    });
                }
            }
        }
        Ok(())
    }

    /// One hook; `Some((status, output))` when it failed. Always audited.
    async fn run_hook(
        &self,
        sb: &Arc<Sandbox>,
        point: HookPoint,
        hook: &Hook,
        caller: &Caller,
    ) -> Option<(String, String)> {
        let secrets = &sb.lifecycle().secrets;
        let mut audit = ExecAudit::begin(
            sb.id.to_string(),
            now_ms(),
            hook.command.clone(),
            caller.name.clone(),
            Some(format!("hook:{}", point.as_str())),
        );
        let spec = CommandSpec::new(
            hook.command.clone(),
            Default::default(),
            None,
            hook.user,
            None,
        );
        let started = match spec {
            Ok(spec) => self.spawn_command(sb, &spec).await,
            Err(e) => Err(e),
        };
        let failure = match started {
            Err(e) => {
                let msg = redact(&e.to_string(), secrets);
                audit.error = Some(msg.clone());
                Some(("it could not be started".to_owned(), msg))
            }
            Ok(started) => {
                let timeout = hook.timeout_secs.unwrap_or(DEFAULT_HOOK_TIMEOUT_SECS);
                let out = [
                    Arc::new(std::sync::Mutex::new(Collected::default())),
                    Arc::new(std::sync::Mutex::new(Collected::default())),
                ];
                let opts = PumpOptions {
                    stdin: None,
                    timeout: Some(Duration::from_secs(timeout)),
                    limit: HOOK_OUTPUT,
                    sink: Sink::Buffer,
                };
                let r = self.pump(sb, started, opts, out).await;
                let output = redact(&tail(&r.stdout.0, &r.stderr.0, LOG_TAIL), secrets);
                audit.exit_code = r.status.exit_code;
                audit.signal = r.status.signal;
                audit.timed_out = r.status.timed_out;
                audit.duration_us = r.duration_us;
                audit.stdout_bytes = r.stdout_bytes;
                audit.stderr_bytes = r.stderr_bytes;
                audit.output = Some(output.clone());
                let s = r.status;
                match (s.timed_out, s.exit_code, s.signal) {
                    (true, _, _) => Some((format!("timed out after {timeout} s"), output)),
                    (false, Some(0), _) => None,
                    (false, Some(c), _) => Some((format!("exit code {c}"), output)),
                    (false, None, Some(sig)) => Some((format!("killed by signal {sig}"), output)),
                    (false, None, None) => Some(("no exit status".to_owned(), output)),
                }
            }
        };
        self.count_hook(sb, &audit);
        if let Err(e) = self.inner.store.record_exec(&audit) {
            tracing::warn!(id = %sb.id, error = %e, "recording a hook in the audit trail failed");
        }
        failure
    }

    /// The `before_remove` hooks, while the sandbox still runs: failures
    /// are recorded and never stop the removal. Run by the destroy that
    /// claimed the sandbox ([`Engine::prepare_destroy`]), once.
    pub(crate) async fn before_remove(&self, sb: &Arc<Sandbox>, caller: &Caller) {
        if sb.lifecycle().hooks.before_remove.is_empty() || sb.is_stopping() || sb.conn.is_closed()
        {
            return;
        }
        if let Err(e) = self.run_hooks(sb, HookPoint::BeforeRemove, caller).await {
            tracing::info!(id = %sb.id, error = %e, "a before_remove hook failed; removing anyway");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tail_keeps_the_newest_bytes_of_stdout_then_stderr() {
        assert_eq!(super::tail(b"abc", b"def", 4), "cdef");
        assert_eq!(super::tail(b"ab", b"", 4), "ab");
    }
}
