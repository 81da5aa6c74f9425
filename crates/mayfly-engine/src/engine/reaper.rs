//! Detached destroy, for a daemonless `mayfly run`.
//!
//! A one-shot engine has its command's exit status as soon as the command
//! ends; the rest of a destroy (the directory tree, the cgroups, the record)
//! takes several more milliseconds that the caller does not need to wait
//! for, just as a daemon answers `DELETE` before its cleanup has finished.
//! The engine hands the killed sandbox to a *reaper*: a process forked by
//! the zygote (single-threaded, so the fork is whole) in a session of its
//! own, with its standard streams on `/dev/null`, that outlives `mayfly run`.
//!
//! Ownership moves with it: the record names the reaper as owner (in the
//! same transaction that marks it `stopping`), so another instance's
//! start-up recovery leaves the sandbox alone while the reaper works, and
//! destroys it for good should the reaper die first.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use mayfly_sys::process;
use mayfly_types::{SandboxId, SandboxState};

use super::destroy::{record_end, remove_remains};
use super::owner::Owner;
use super::Engine;
use crate::runtime::proto::ReapPlan;
use crate::EngineError;

impl Engine {
    /// Kills a sandbox and leaves the rest of its destroy to a detached
    /// reaper; returns once every process in it has been sent SIGKILL. If
    /// no reaper can be had, destroys it here and waits for the cleanup.
    pub async fn destroy_detached(&self, id: &SandboxId, reason: &str) -> Result<(), EngineError> {
        let sb = self.lookup(id)?;
        if sb.is_stopping() {
            self.destroy_sandbox(sb, reason).await?;
            return Ok(());
        }
        let plan = ReapPlan {
            id: sb.id.clone(),
            dir: sb.dir.clone(),
            trash: self.inner.cfg.trash_dir(),
            cgroup: sb.cgroup.clone(),
            layout: self.inner.layout().clone(),
            state_dir: self.inner.cfg.state_dir.clone(),
            reason: reason.to_owned(),
        };
        let forked = self
            .inner
            .maker
            .zygote
            .fork_reaper(&plan, sb.pidfd.get_ref().as_fd(), sb.stub.pidfd.as_fd())
            .await;
        // The reaper waits for init's exit, so the hand-over is recorded
        // before it can start: init is killed only after this transaction.
        let owner = forked.ok().and_then(|pid| Owner::of(pid as u32));
        let Some(owner) = owner else {
            tracing::warn!(%id, "no reaper; destroying in this process");
            self.destroy_sandbox(sb, reason).await?;
            self.wait_cleanup().await;
            return Ok(());
        };
        if !sb.begin_stop() {
            // Raced with another destroy (a TTL); the reaper still cleans
            // up once init is gone, and its record update is refused.
            return Ok(());
        }
        let handed = self
            .inner
            .store
            .stop_and_hand_over(id, reason, owner.pid, owner.start);
        let _ = process::pidfd_send_signal(sb.pidfd.get_ref().as_fd(), libc::SIGKILL);
        self.inner
            .sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        sb.done.store(true, Ordering::SeqCst);
        sb.destroyed.notify_waiters();
        handed?;
        Ok(())
    }
}

/// The reaper's life: wait for init's exit (its whole pid namespace goes
/// with it), kill the stub, remove the remains, record the end, and remove
/// the shared `mayfly` cgroup parents if nothing else uses them.
pub(crate) fn reaper_main(plan: ReapPlan, init: OwnedFd, stub: OwnedFd) -> ! {
    process::wipe_cmdline_and_environ("mayfly-reaper");
    // Init is killed right after the hand-over is recorded (or dies with
    // its stub, should the engine die first). Past the deadline the cgroup
    // removal below kills whatever is left.
    let _ = process::wait_pidfd(init.as_fd(), Duration::from_secs(10));
    let _ = process::pidfd_send_signal(stub.as_fd(), libc::SIGKILL);
    let ok = remove_remains(&plan.id, &plan.trash, &plan.dir, &plan.cgroup);
    if let Ok(store) = mayfly_store::Store::open(&plan.state_dir) {
        // An empty WAL spares the next daemonless run a replay of every
        // frame written since the last checkpoint; the write below then
        // starts the new WAL (and pays for its header's fsync) here.
        let _ = store.checkpoint();
        // Still `ready` only if the engine died before recording the
        // hand-over.
        if store
            .get_sandbox(&plan.id)
            .is_ok_and(|r| r.is_some_and(|r| r.state == SandboxState::Ready))
        {
            let _ = store.transition(&plan.id, SandboxState::Stopping, Some(&plan.reason));
        }
        let _ = record_end(&store, &plan.id, &plan.reason, ok);
    }
    mayfly_sys::cgroup::remove_empty_parents(&plan.layout);
    process::exit_now(0)
}
