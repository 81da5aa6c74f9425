//! The audit trail's bounds: a sandbox's command budget, and what a row
//! keeps of a command's argv and error, so that no sandbox can make the
//! store grow without limit.

use std::sync::atomic::Ordering;

use mayfly_types::{ExecAudit, ExecResult};

use super::sandbox::Sandbox;
use super::{now_ms, Engine};
use crate::api::Caller;
use crate::EngineError;

/// Bytes of a command's argv, and of its error, that the audit trail keeps
/// (a command may be 128 KiB, and a sandbox may run thousands): the rest is
/// counted, not stored.
const AUDIT_TEXT_BYTES: usize = 4096;
/// Bytes of argv and error text one sandbox's audit rows keep at
/// [`AUDIT_TEXT_BYTES`] each; past it, rows keep [`AUDIT_LEAN_TEXT_BYTES`].
/// With [`EngineConfig::max_commands`](super::EngineConfig::max_commands)
/// this bounds what one live sandbox can make the store hold (by default
/// 16 MiB plus 100,000 rows of at most 512 bytes of text and their cut
/// markers). Hooks count as commands (a run's hooks run only while the
/// sandbox is within its budget); their rows keep at most 4 KiB of output
/// each, counted here too, and at most 16 per hook point run per command.
pub(crate) const AUDIT_FULL_TEXT_BYTES: u64 = 16 << 20;
/// What a row keeps of argv, and of an error, once its sandbox has used
/// [`AUDIT_FULL_TEXT_BYTES`].
const AUDIT_LEAN_TEXT_BYTES: usize = 256;

impl Engine {
    /// Refuses a sandbox that has used its command budget, before anything
    /// of a request (a task run's `before_run` hooks) runs; charges nothing.
    pub(crate) fn check_command_budget(&self, sb: &Sandbox) -> Result<(), EngineError> {
        if sb.commands.load(Ordering::Relaxed) >= self.inner.cfg.max_commands {
            return Err(self.over_budget(sb));
        }
        Ok(())
    }

    /// Counts one command against the sandbox's budget, or refuses it.
    pub(crate) fn charge_command(&self, sb: &Sandbox) -> Result<(), EngineError> {
        if sb.commands.fetch_add(1, Ordering::Relaxed) >= self.inner.cfg.max_commands {
            sb.commands.fetch_sub(1, Ordering::Relaxed);
            return Err(self.over_budget(sb));
        }
        Ok(())
    }

    /// A hook is one of the sandbox's commands: it counts against the
    /// budget (never refused: its run, or the destroy, was let in), and so
    /// does the text its row keeps.
    pub(crate) fn count_hook(&self, sb: &Sandbox, audit: &ExecAudit) {
        sb.commands.fetch_add(1, Ordering::Relaxed);
        let kept = audit.argv.iter().map(String::len).sum::<usize>()
            + audit.error.as_ref().map_or(0, String::len)
            + audit.output.as_ref().map_or(0, String::len);
        sb.audit_text.fetch_add(kept as u64, Ordering::Relaxed);
    }

    fn over_budget(&self, sb: &Sandbox) -> EngineError {
        EngineError::Forbidden(format!(
            "sandbox {} has run {} commands, the most one sandbox may run (each is kept in the \
             audit trail); create a new sandbox",
            sb.id, self.inner.cfg.max_commands
        ))
    }

    pub(crate) fn audit_exec(
        &self,
        sb: &Sandbox,
        argv: &[String],
        r: Result<&ExecResult, &EngineError>,
        caller: &Caller,
    ) {
        let room = if sb.audit_text.load(Ordering::Relaxed) < AUDIT_FULL_TEXT_BYTES {
            AUDIT_TEXT_BYTES
        } else {
            AUDIT_LEAN_TEXT_BYTES
        };
        let mut a = ExecAudit::begin(
            sb.id.to_string(),
            now_ms(),
            audit_argv(argv, room),
            caller.name.clone(),
            None,
        );
        match r {
            Ok(r) => {
                a.exit_code = r.status.exit_code;
                a.signal = r.status.signal;
                a.timed_out = r.status.timed_out;
                a.duration_us = r.duration_us;
                a.stdout_bytes = r.stdout_bytes;
                a.stderr_bytes = r.stderr_bytes;
            }
            Err(e) => a.error = Some(audit_text(e.to_string(), room)),
        }
        let kept =
            a.argv.iter().map(String::len).sum::<usize>() + a.error.as_ref().map_or(0, String::len);
        sb.audit_text.fetch_add(kept as u64, Ordering::Relaxed);
        if let Err(e) = self.inner.store.record_exec(&a) {
            tracing::warn!(id = %sb.id, error = %e, "recording an exec in the audit trail failed");
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
fn prefix(s: &str, max: usize) -> &str {
    let mut cut = max.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `argv` as the audit trail records it: whole when its elements total at
/// most `room` bytes; else the elements that fit (the last one cut short)
/// and a last element saying how many bytes were left out.
pub(crate) fn audit_argv(argv: &[String], mut room: usize) -> Vec<String> {
    let total: usize = argv.iter().map(String::len).sum();
    if total <= room {
        return argv.to_vec();
    }
    let mut out = Vec::new();
    for a in argv {
        if room == 0 {
            break;
        }
        let kept = prefix(a, room);
        room -= kept.len();
        out.push(kept.to_owned());
        if kept.len() < a.len() {
            break;
        }
    }
    let kept: usize = out.iter().map(String::len).sum();
    out.push(format!(
        "[mayfly: {} more bytes of argv not recorded]",
        total - kept
    ));
    out
}

/// An error message as the audit trail records it: at most `room` bytes,
/// marked when cut.
fn audit_text(s: String, room: usize) -> String {
    if s.len() <= room {
        return s;
    }
    format!("{} [mayfly: cut from {} bytes]", prefix(&s, room), s.len())
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
