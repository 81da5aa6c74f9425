//! Detached destroy, for a daemonless `mayfly run`.
//!
//! A one-shot engine has its command's exit status as soon as the command
//! ends; the rest of a destroy (the directory tree, the cgroups, the record)
//! takes several more milliseconds that the caller does not need to wait
//! for, just as a daemon answers `DELETE` before its cleanup has finished.
//! So each such sandbox gets a *reaper*: a process forked by the zygote
//! (single-threaded, so the fork is whole) before the sandbox's command starts,
//! in a session of its own, with its standard streams on `/dev/null`, that
//! outlives `mayfly run`.
//!
//! The reaper first waits on a pipe from the engine. `g` (followed by when
//! the sandbox was stopped) means the sandbox was handed over (`x` means it was not needed after all: the
//! engine destroyed the sandbox itself, and the reaper just exits): the record already names the reaper as owner
//! and says `stopping` (one transaction), and init has been killed. End of
//! file without it means the engine died first (its zygote, the stub and
//! init die with it); the reaper then records the sandbox `failed`
//! (`owner_died`) itself instead of leaving that to the next start's
//! recovery. Either way it waits for init's exit (the whole pid namespace
//! goes with it), removes the remains, records the end, prunes one batch of
//! old history (see `engine::history`), and exits.

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

/// The byte that tells a reaper it is not needed: its engine destroyed the
/// sandbox itself (a keeper retiring, or shutdown). It then exits at once.
const DISMISSED: u8 = b'x';

/// A reaper forked for a sandbox, and the pipe that hands the sandbox over.
pub(crate) struct Reaper {
    owner: Owner,
    go: std::fs::File,
}

impl Reaper {
    /// Tells the reaper it is not needed; it exits at once.
    fn dismiss(&self) {
        let _ = std::io::Write::write_all(&mut &self.go, &[DISMISSED]);
    }
}

pub(crate) type PendingReaper = tokio::task::JoinHandle<Result<Reaper, EngineError>>;

impl Engine {
    /// Has the zygote fork a sandbox's reaper, so that
    /// [`Engine::destroy_detached`] finds it ready; returns once it is
    /// forked. Call it after the create and before the command starts (a
    /// run killed later then always has a reaper to clean up; a keeper has
    /// its sandbox's reaper ready before it offers the sandbox).
    pub async fn prepare_reaper_now(&self, id: &SandboxId) -> Result<(), EngineError> {
        let reaper = self
            .spawn_reaper(self.lookup(id)?)
            .await
            .map_err(|e| EngineError::Internal(format!("forking the reaper of {id}: {e}")))??;
        let ready = tokio::spawn(async move { Ok(reaper) });
        self.reapers().insert(id.clone(), ready);
        Ok(())
    }

    /// Has the zygote fork `sb`'s reaper, on a task.
    fn spawn_reaper(&self, sb: std::sync::Arc<super::sandbox::Sandbox>) -> PendingReaper {
        let plan = ReapPlan {
            id: sb.id.clone(),
            dir: sb.dir.clone(),
            trash: self.inner.cfg.trash_dir(),
            cgroup: sb.cgroup.clone(),
            layout: self.inner.layout().clone(),
            state_dir: self.inner.cfg.state_dir.clone(),
            spare_ns: self.inner.cfg.spare_ns_dir.clone(),
            park: self.inner.cfg.park.clone(),
            history: self.inner.cfg.history,
        };
        let maker = self.inner.maker.clone();
        tokio::spawn(async move {
            let fail = |what: &str, e: &dyn std::fmt::Display| {
                EngineError::Internal(format!("{what} for the reaper of {}: {e}", plan.id))
            };
            let (go_r, go_w) = mayfly_sys::ipc::pipe().map_err(|e| fail("a pipe", &e))?;
            let pid = maker
                .zygote
                .fork_reaper(
                    &plan,
                    sb.pidfd.get_ref().as_fd(),
                    sb.stub.pidfd.as_fd(),
                    go_r.as_fd(),
                    sb.lease.as_fd(),
                )
                .await
                .map_err(|e| fail("forking", &e))?;
            let owner = Owner::of(pid as u32).ok_or_else(|| fail("finding", &"it exited"))?;
            Ok(Reaper {
                owner,
                go: std::fs::File::from(go_w),
            })
        })
    }

    /// Sends every reaper prepared for a sandbox away, before the engine
    /// destroys those sandboxes itself (without this, a reaper would take
    /// the closed pipe for the engine's death and record the sandbox
    /// failed).
    pub(crate) async fn dismiss_reapers(&self) {
        let pending: Vec<PendingReaper> = self.reapers().drain().map(|(_, r)| r).collect();
        for p in pending {
            if let Ok(Ok(reaper)) = p.await {
                reaper.dismiss();
            }
        }
    }

    fn reapers(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<SandboxId, PendingReaper>> {
        self.inner.reapers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills a sandbox and leaves the rest of its destroy to its reaper;
    /// returns once every process in it has been sent SIGKILL. Without a
    /// reaper, destroys it here and waits for the cleanup.
    pub async fn destroy_detached(&self, id: &SandboxId, reason: &str) -> Result<(), EngineError> {
        self.stop_detached(id, reason).await?.hand_over()
    }

    /// The first half of [`Engine::destroy_detached`]: marks the sandbox
    /// stopping and sends SIGKILL to every process in it (so nothing of it
    /// runs once this returns); [`Detached::hand_over`] then records the
    /// reaper as its owner and lets it finish. A keeper answers its run in
    /// between.
    pub async fn stop_detached(
        &self,
        id: &SandboxId,
        reason: &str,
    ) -> Result<Detached, EngineError> {
        let sb = self.lookup(id)?;
        let pending = self.reapers().remove(id);
        let pending = pending.unwrap_or_else(|| self.spawn_reaper(sb.clone()));
        let reaper = pending.await.ok().and_then(Result::ok);
        let reason = self.reason_at_stop(&sb, reason);
        let stopped_at = super::now_ms();
        let done = |reaper| Detached {
            engine: self.clone(),
            stopped_at,
            sb: sb.clone(),
            reason: reason.to_owned(),
            reaper,
        };
        let Some(reaper) = reaper else {
            tracing::warn!(%id, "no reaper; destroying in this process");
            self.destroy_sandbox(sb.clone(), reason).await?;
            self.wait_cleanup().await;
            return Ok(done(None));
        };
        if !sb.begin_stop() {
            // Another destroy in this engine stopped it first (init's
            // death, a TTL) and records its own reason. The reaper is not
            // needed (left to the closed pipe, it would record the sandbox
            // `owner_died`); that destroy is waited for, so that a run
            // never exits in the middle of it.
            reaper.dismiss();
            sb.wait_destroyed(Duration::from_secs(30)).await;
            self.wait_cleanup().await;
            return Ok(done(None));
        }
        let _ = process::pidfd_send_signal(sb.pidfd.get_ref().as_fd(), libc::SIGKILL);
        Ok(done(Some(reaper)))
    }
}

/// A sandbox killed by [`Engine::stop_detached`], not yet handed to its
/// reaper.
pub struct Detached {
    engine: Engine,
    /// When the sandbox was stopped (unix ms).
    stopped_at: u64,
    sb: std::sync::Arc<super::sandbox::Sandbox>,
    reason: String,
    /// None when nothing is left to hand over.
    reaper: Option<Reaper>,
}

impl Detached {
    /// Records the reaper as the sandbox's owner, `stopping`, and only
    /// then lets it act; the engine forgets the sandbox.
    pub fn hand_over(self) -> Result<(), EngineError> {
        let Some(reaper) = self.reaper else {
            return Ok(());
        };
        let (inner, id) = (&self.engine.inner, &self.sb.id);
        let handed =
            inner
                .store
                .stop_and_hand_over(id, &self.reason, reaper.owner.pid, reaper.owner.start);
        if handed.is_ok() {
            // One write (atomic on a pipe): `g` and when the sandbox was
            // stopped, which is before its run returned.
            let mut msg = [0u8; 9];
            msg[0] = b'g';
            msg[1..].copy_from_slice(&self.stopped_at.to_le_bytes());
            let _ = std::io::Write::write_all(&mut &reaper.go, &msg);
        }
        inner
            .sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.engine.release_quota(id);
        self.sb.done.store(true, Ordering::SeqCst);
        self.sb.destroyed.notify_waiters();
        handed?;
        Ok(())
    }
}

/// The reaper's life: wait to be handed the sandbox (or for the engine's
/// death), wait for init's exit, kill the stub, remove the remains, record
/// the end, and remove the shared `mayfly` cgroup parents if nothing else
/// uses them.
/// It holds the sandbox's uid slot lease until it exits, after recording
/// the end: a slot whose lease is free is then never one that a record
/// still shows live (a daemonless run leases its slot before it can read
/// the store; see `engine::early`). Last, it makes spare namespaces and
/// starts a keeper, each if there are fewer than wanted.
pub(crate) fn reaper_main(
    plan: ReapPlan,
    init: OwnedFd,
    stub: OwnedFd,
    go: OwnedFd,
    _lease: OwnedFd,
) -> ! {
    process::set_title("mayfly-reaper");
    let mut go = std::fs::File::from(go);
    let mut msg = [0u8; 9];
    let handed = loop {
        match std::io::Read::read(&mut go, &mut msg) {
            Ok(n) if n >= 1 && msg[0] == DISMISSED => process::exit_now(0),
            Ok(n) => break n >= 1,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    drop(go);
    // When the engine stopped the sandbox (before its run returned); a
    // `mayfly prune` since then means no keeper (see `park::pruned_since`).
    let mut stopped = [0u8; 8];
    stopped.copy_from_slice(&msg[1..]);
    let stopped_at = u64::from_le_bytes(stopped);
    // Past the deadline the cgroup removal below kills whatever is left.
    let _ = process::wait_pidfd(init.as_fd(), Duration::from_secs(10));
    let _ = process::pidfd_send_signal(stub.as_fd(), libc::SIGKILL);
    let ok = remove_remains(&plan.id, &plan.trash, &plan.dir, &plan.cgroup);
    if let Ok(store) = mayfly_store::Store::open(&plan.state_dir) {
        // An empty WAL spares the next daemonless run a replay of every
        // frame written since the last checkpoint; the write below then
        // starts the new WAL (and pays for its header's fsync) here.
        let _ = store.checkpoint();
        record(&store, &plan.id, handed, ok);
        // Daemonless runs keep their history bounded without a daemon: one
        // batch per run, which keeps up with one record per run.
        if let Some(keep) = plan.history.filter(|_| handed) {
            let _ = super::history::prune_once(&store, keep);
        }
    }
    mayfly_sys::cgroup::remove_empty_parents(&plan.layout);
    // Last, off everyone's critical path: fresh namespaces for the next
    // run's stub to join, made in this process, which then exits. Not after
    // a run that died: its reaper only cleans up.
    if let Some(dir) = plan.spare_ns.as_ref().filter(|_| handed) {
        // What a maker or claimer killed halfway left (the few files of a
        // small directory).
        mayfly_sys::spare_ns::sweep(dir);
        if mayfly_sys::spare_ns::count(dir) < super::config::SPARE_NS_TARGET {
            if let Ok(name) = super::create::random_id() {
                let name = name.as_str().replacen("mf-", "spare-", 1);
                let _ = mayfly_sys::spare_ns::make(dir, &name);
                // Made, then checked: a `mayfly prune` that marked before
                // this check has the set taken back here; one that marks
                // after it drains the set itself (it marks first).
                let pruned = crate::park::park_dir(&plan.state_dir);
                if crate::park::pruned_since(&pruned, stopped_at) {
                    mayfly_sys::spare_ns::remove(dir, &name);
                }
            }
        }
    }
    // Then the next run's sandbox, parked by a keeper of its own (which
    // claims one of those sets).
    if let Some(park) = plan.park.as_ref().filter(|_| handed) {
        let _ = crate::park::spawn_keeper(park, stopped_at);
    }
    process::exit_now(0)
}

/// Records how the sandbox ended: destroyed for the reason its engine gave
/// when it handed it over, or failed because that engine died.
fn record(store: &mayfly_store::Store, id: &SandboxId, handed: bool, cgroup_ok: bool) {
    if handed {
        let reason = store
            .get_sandbox(id)
            .ok()
            .flatten()
            .and_then(|r| r.reason)
            .unwrap_or_else(|| "user".into());
        let _ = record_end(store, id, &reason, cgroup_ok, None);
    } else {
        let why = "owner_died: the `mayfly run` that owned it died";
        if store
            .transition(id, SandboxState::Failed, Some(why))
            .is_ok()
        {
            let _ = store.add_event(
                Some(id),
                "recovered",
                &serde_json::json!({"previous_state": "ready", "by": "reaper"}),
            );
        }
    }
}
