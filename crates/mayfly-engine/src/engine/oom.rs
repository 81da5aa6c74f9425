//! OOM kills: read from the sandbox's memory cgroup (v1 `memory.oom_control`,
//! v2 `memory.events`, line `oom_kill`) after a command ends by SIGKILL and
//! when the sandbox dies, and recorded as `oom_kill` events.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::sandbox::Sandbox;
use super::Engine;

/// The OOM killer counts a kill right after it sends SIGKILL, which races
/// with the victim's exit being reported; one more look this much later
/// settles it.
const RECHECK: Duration = Duration::from_millis(20);

impl Engine {
    /// Records an `oom_kill` event `{count, total}` if the OOM killer has
    /// killed in the sandbox since the last look; whether it had.
    pub(crate) fn record_oom_kills(&self, sb: &Sandbox) -> bool {
        let total = match mayfly_sys::cgroup::read_oom_kills(&sb.cgroup) {
            Ok(Some(n)) => n,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(id = %sb.id, error = %e, "reading the OOM kill count failed");
                return false;
            }
        };
        let seen = sb.oom_seen.fetch_max(total, Ordering::SeqCst);
        if total <= seen {
            return false;
        }
        let detail = serde_json::json!({"count": total - seen, "total": total});
        if let Err(e) = self
            .inner
            .store
            .add_event(Some(&sb.id), "oom_kill", &detail)
        {
            tracing::warn!(id = %sb.id, error = %e, "recording an OOM kill failed");
        }
        true
    }

    /// A command of `sb` ended by SIGKILL while init lives: record the OOM
    /// kill if that is what it was, off the exec's answer path.
    pub(crate) fn check_oom_after_kill(&self, sb: &Arc<Sandbox>) {
        let (engine, sb) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            if !engine.record_oom_kills(&sb) {
                tokio::time::sleep(RECHECK).await;
                engine.record_oom_kills(&sb);
            }
        });
    }

    /// Init's channel closed: unless a destroy is under way, the sandbox
    /// died by itself. It ended by `oom` if the OOM killer has killed in it
    /// since the last look (init itself, or what init's death followed
    /// from), else by `init_exited`.
    pub(crate) async fn init_died(&self, sb: Arc<Sandbox>) {
        if sb.is_stopping() {
            return;
        }
        let mut oom = self.record_oom_kills(&sb);
        if !oom {
            tokio::time::sleep(RECHECK).await;
            oom = self.record_oom_kills(&sb);
        }
        let reason = if oom { "oom" } else { "init_exited" };
        let _ = self.destroy_sandbox(sb, reason).await;
    }

    /// Whether the OOM killer has killed in the sandbox `id` (recording
    /// any kill not yet recorded): a daemonless run asks once its command
    /// ended by SIGKILL, before the spawned look of
    /// [`Engine::check_oom_after_kill`] has had a chance to run.
    pub fn oom_killed(&self, id: &mayfly_types::SandboxId) -> bool {
        self.lookup(id).is_ok_and(|sb| self.has_oom_kills(&sb))
    }

    /// Whether the OOM killer has ever killed in `sb`, recording any kill
    /// not yet recorded.
    fn has_oom_kills(&self, sb: &Sandbox) -> bool {
        self.record_oom_kills(sb) || sb.oom_seen.load(Ordering::SeqCst) > 0
    }

    /// The reason a detached destroy records: `oom` instead of the
    /// caller's when init is already dead and the OOM killer has killed in
    /// the sandbox (the command's end was init's death, which the engine's
    /// own look, [`Engine::init_died`], may not have reached yet).
    pub(crate) fn reason_at_stop<'a>(&self, sb: &Sandbox, reason: &'a str) -> &'a str {
        let init_dead = mayfly_sys::process::wait_pidfd(sb.pidfd.get_ref().as_fd(), Duration::ZERO);
        if init_dead && self.has_oom_kills(sb) {
            "oom"
        } else {
            reason
        }
    }
}
