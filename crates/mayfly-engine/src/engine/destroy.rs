//! Destroy: kill init (and with it the whole pid namespace), remove the
//! cgroups, and delete the sandbox's directories. Mounts need no unmounting:
//! they exist only in the sandbox's mount namespace, which dies with it.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mayfly_sys::cgroup::CgroupPlan;
use mayfly_types::{SandboxId, SandboxInfo, SandboxState, TemplateRef};

use super::config::EngineConfig;
use super::sandbox::Sandbox;
use super::Engine;
use crate::EngineError;

impl Engine {
    /// Destroys a live sandbox and waits for the full cleanup. Concurrent
    /// calls wait for the first to finish. The work runs in a task of its
    /// own, so a caller that goes away (a client that hangs up) cannot leave
    /// a destroy half done.
    pub(crate) async fn destroy_sandbox(
        &self,
        sb: Arc<Sandbox>,
        reason: &str,
    ) -> Result<SandboxInfo, EngineError> {
        let (engine, reason) = (self.clone(), reason.to_owned());
        tokio::spawn(async move { engine.destroy_now(sb, &reason).await })
            .await
            .map_err(|e| EngineError::Internal(format!("a destroy failed: {e}")))?
    }

    async fn destroy_now(
        &self,
        sb: Arc<Sandbox>,
        reason: &str,
    ) -> Result<SandboxInfo, EngineError> {
        sb.settled().await;
        let caller = crate::api::Caller::new(format!("mayfly:{reason}"));
        if !self.hooks_then_stop(&sb, reason, &caller).await {
            sb.wait_destroyed(Duration::from_secs(30)).await;
            return self.info(&sb.id);
        }
        self.finish_destroy(sb, reason).await
    }

    /// What every destroy does before its cleanup: claims the sandbox and
    /// runs what comes before the kill ([`Engine::prepare_destroy`]), or
    /// waits for the destroy that claimed it first, then kills it. True for
    /// the one caller that stopped it, which finishes the destroy.
    pub(crate) async fn hooks_then_stop(
        &self,
        sb: &Arc<Sandbox>,
        reason: &str,
        caller: &crate::api::Caller,
    ) -> bool {
        if !self.prepare_destroy(sb, reason, caller).await {
            self.await_stop(sb).await;
        }
        self.stop_sandbox(sb, reason)
    }

    /// Claims the sandbox's destroy for this caller and does what comes
    /// before the kill, while the sandbox still runs: its `before_remove`
    /// hooks (unless its create failed) and then the artifact collection.
    /// False, having done nothing, when another destroy has claimed it:
    /// that one's hooks may still be running, and it records the reason.
    async fn prepare_destroy(
        &self,
        sb: &Arc<Sandbox>,
        reason: &str,
        caller: &crate::api::Caller,
    ) -> bool {
        if !sb.begin_destroy() {
            return false;
        }
        if reason != super::lifecycle::CREATE_FAILED {
            self.before_remove(sb, caller).await;
        }
        if !sb.is_stopping() {
            self.collect_artifacts(sb).await;
        }
        true
    }

    /// Waits until the destroy another caller claimed has killed the
    /// sandbox (its hooks have their own timeouts).
    async fn await_stop(&self, sb: &Sandbox) {
        while !sb.is_stopping() && !sb.done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The fast half of destroy: record `stopping` and SIGKILL init (which
    /// kills the whole pid namespace) and its stub. Returns false if another
    /// caller is already destroying the sandbox.
    pub(crate) fn stop_sandbox(&self, sb: &Sandbox, reason: &str) -> bool {
        if !sb.begin_stop() {
            return false;
        }
        self.gateway_forget(&sb.id);
        self.stop_quota(&sb.id);
        // Nothing runs on its layers any more.
        self.layers_released(&sb.id);
        let _ = self
            .inner
            .store
            .transition(&sb.id, SandboxState::Stopping, Some(reason));
        let _ = mayfly_sys::process::pidfd_send_signal(sb.pidfd.get_ref().as_fd(), libc::SIGKILL);
        true
    }

    /// The slow half: wait for init to be gone, remove the cgroups, discard
    /// the directories, record `destroyed`.
    pub(crate) async fn finish_destroy(
        &self,
        sb: Arc<Sandbox>,
        reason: &str,
    ) -> Result<SandboxInfo, EngineError> {
        let store = &self.inner.store;
        let t0 = std::time::Instant::now();
        let exited = tokio::time::timeout(Duration::from_secs(10), sb.pidfd.readable()).await;
        if exited.is_err() {
            tracing::error!(id = %sb.id, "init did not exit within 10 s of SIGKILL");
        }
        // The stub exits by itself once init is gone; this only hurries it.
        sb.stub.kill();
        // Kills by the OOM killer not recorded yet (a background process's)
        // are read before the cgroup goes.
        self.record_oom_kills(&sb);
        self.release_net(&sb).await;
        let trash = self.inner.cfg.trash_dir();
        let (dir, cgroup, id) = (sb.dir.clone(), sb.cgroup.clone(), sb.id.clone());
        let t_exit = t0.elapsed();
        let removed =
            tokio::task::spawn_blocking(move || remove_remains(&id, &trash, &dir, &cgroup)).await;
        tracing::debug!(id = %sb.id, exit = ?t_exit, removed = ?t0.elapsed(), "destroy timings");
        let cgroup_ok = matches!(removed, Ok(true));
        self.inner
            .sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sb.id);
        self.release_quota(&sb.id);
        let destroy_ms = t0.elapsed().as_secs_f64() * 1000.0;
        record_end(store, &sb.id, reason, cgroup_ok, Some(destroy_ms))?;
        sb.done.store(true, Ordering::SeqCst);
        sb.destroyed.notify_waiters();
        self.info(&sb.id)
    }

    /// Destroys the sandbox a create made for a caller that has gone
    /// (reason `abandoned`), without waiting.
    pub(crate) fn destroy_abandoned(&self, id: &SandboxId) {
        if let Some(sb) = self.lookup_any(id) {
            self.destroy_in_background(sb, "abandoned");
        }
    }

    /// Remembers a background cleanup so [`Engine::wait_cleanup`] can await it.
    pub(crate) fn track_cleanup(&self, task: tokio::task::JoinHandle<()>) {
        let mut pending = self
            .inner
            .cleanups
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        pending.retain(|t| !t.is_finished());
        pending.push(task);
    }

    /// Waits until every background cleanup started so far (and any they
    /// start in turn) has finished, then removes the shared `mayfly` cgroup
    /// parents if they are empty, so a daemonless run or a daemon leaves
    /// nothing of Mayfly in the cgroup trees. A parent still holding another
    /// instance's sandboxes or stubs stays; one removed while another
    /// instance makes a sandbox is made again by `cgroup::apply`.
    pub async fn wait_cleanup(&self) {
        loop {
            let tasks: Vec<_> = std::mem::take(
                &mut *self
                    .inner
                    .cleanups
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()),
            );
            if tasks.is_empty() {
                mayfly_sys::cgroup::remove_empty_parents(self.inner.layout());
                return;
            }
            for t in tasks {
                let _ = t.await;
            }
        }
    }

    pub(crate) async fn cleanup_failed(&self, id: &SandboxId, cgroup: &CgroupPlan, dir: &Path) {
        let cgroup = cgroup.clone();
        let doomed = dir
            .exists()
            .then(|| move_to_trash(&self.inner.cfg.trash_dir(), dir));
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(d) = doomed {
                let _ = std::fs::remove_dir_all(&d);
            }
            mayfly_sys::cgroup::remove(&cgroup)
        })
        .await;
        tracing::debug!(%id, "cleaned up after a failed create");
    }

    /// The public description of a sandbox, from the store.
    pub(crate) fn info(&self, id: &SandboxId) -> Result<SandboxInfo, EngineError> {
        let rec = self
            .inner
            .store
            .get_sandbox(id)?
            .ok_or_else(|| EngineError::NoSuchSandbox(id.clone()))?;
        Ok(record_to_info(rec))
    }
}

pub(crate) fn record_to_info(rec: mayfly_store::SandboxRecord) -> SandboxInfo {
    SandboxInfo {
        template: rec.template.parse().unwrap_or(TemplateRef::Host),
        uid_base: EngineConfig::uid_base(rec.uid_slot),
        init_pid: if rec.state.is_terminal() {
            None
        } else {
            rec.init_pid
        },
        id: rec.id,
        state: rec.state,
        created_at: rec.created_at,
        expires_at: rec.expires_at,
        limits: rec.limits,
        labels: rec.labels,
        reason: rec.reason,
        create_ms: rec.create_ms,
        source: if rec.pool.is_some() {
            mayfly_types::SandboxSource::Pool
        } else {
            mayfly_types::SandboxSource::Cold
        },
        tenant: rec.tenant,
    }
}

/// Moves a sandbox directory into the trash (so a crash mid-removal leaves
/// it where recovery empties it) and returns where it now is.
fn move_to_trash(trash: &Path, dir: &Path) -> PathBuf {
    let name = dir.file_name().map(|n| n.to_owned()).unwrap_or_default();
    let target = trash.join(name);
    if std::fs::rename(dir, &target).is_ok() {
        target
    } else {
        dir.to_path_buf()
    }
}

/// The blocking half of every destroy, in the daemon and in a reaper:
/// delete the sandbox's directory, then remove its cgroups. Whether the
/// cgroups are gone.
///
/// Files go first: the overlay is `volatile`, so what the sandbox wrote is
/// still dirty in the page cache and charged to its memory cgroup; deleting
/// the files drops those pages without writeback, so reclaiming the
/// cgroup's charges before rmdir does not stall behind the disk. Deleting
/// with `remove_dir_all` never follows symlinks, so an upper layer full of
/// links planted by the sandbox cannot redirect it.
pub(crate) fn remove_remains(
    id: &SandboxId,
    trash: &Path,
    dir: &Path,
    cgroup: &CgroupPlan,
) -> bool {
    let doomed = move_to_trash(trash, dir);
    let _ = std::fs::remove_dir_all(&doomed);
    match mayfly_sys::cgroup::remove(cgroup) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(%id, error = %e, "removing the sandbox's cgroups failed");
            false
        }
    }
}

/// Records the end of a destroy: `destroyed`, or `failed` when the cgroups
/// could not be removed, with a `destroyed` event saying why it ended and,
/// when known, how long the destroy took from the kill.
pub(crate) fn record_end(
    store: &mayfly_store::Store,
    id: &SandboxId,
    reason: &str,
    cgroup_ok: bool,
    destroy_ms: Option<f64>,
) -> Result<(), EngineError> {
    let (state, why) = if reason == super::lifecycle::CREATE_FAILED {
        // A create whose services or after_create hooks failed.
        (SandboxState::Failed, reason.to_owned())
    } else if cgroup_ok {
        (SandboxState::Destroyed, reason.to_owned())
    } else {
        (
            SandboxState::Failed,
            format!("{reason}; cgroup removal failed"),
        )
    };
    store.transition_with_event(
        id,
        state,
        Some(&why),
        (
            "destroyed",
            &serde_json::json!({"reason": reason, "destroy_ms": destroy_ms, "cgroup_removed": cgroup_ok}),
        ),
    )?;
    Ok(())
}
