//! A small pool of stubs already placed in their (empty, default-limited)
//! cgroups, so a create does not wait on a cgroup attach. A stub is not a
//! sandbox: it has no namespaces, no root and no init, and it is used once.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use mayfly_sys::cgroup::{CgroupLayout, CgroupPlan};
use mayfly_types::{ResolvedLimits, SandboxId};

use super::Engine;
use crate::plan;
use crate::runtime::stub::StubHandle;
use crate::runtime::zygote::Zygote;
use crate::EngineError;

/// A stub and the cgroups it sits in; the cgroup names are its future
/// sandbox's id.
pub(crate) struct ReadyStub {
    pub id: SandboxId,
    pub stub: StubHandle,
    pub cgroup: CgroupPlan,
    /// The stub was forked with its sandbox's plan and clones init on its
    /// own (see `engine::early`).
    pub spawned: bool,
}

/// A stub that may still be in the making.
pub(crate) type StubTask =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<ReadyStub, EngineError>> + Send>>;

/// A stub whose id is known and which may still be in the making.
pub(crate) struct PendingStub {
    pub id: SandboxId,
    pub task: StubTask,
    /// The sandbox as planned before the runtime started, if it was.
    pub planned: Option<Planned>,
}

pub(crate) use crate::runtime::zygote::Planned;

#[derive(Default)]
pub(crate) struct StubPool {
    ready: Mutex<VecDeque<ReadyStub>>,
    inflight: std::sync::atomic::AtomicUsize,
}

/// Everything a stub is made from, shared by the engine and by a stub made
/// before the engine has finished opening (see [`Engine::new`]).
pub(crate) struct StubMaker {
    pub zygote: Zygote,
    /// Named in every stub marker, so only this process's death frees them.
    pub owner: super::owner::Owner,
    pub layout: CgroupLayout,
    pub default_limits: ResolvedLimits,
    pub stubs_dir: PathBuf,
    pub sandboxes_dir: PathBuf,
}

/// A one-shot engine's stub, made from the process's start (see
/// `engine::early`), and the id it will have.
pub(crate) struct EarlyStub {
    pub id: SandboxId,
    pub task: tokio::task::JoinHandle<Result<ReadyStub, EngineError>>,
    pub planned: Option<Planned>,
}

impl StubMaker {
    /// Forks a stub for the future sandbox `id` and moves it into fresh
    /// cgroups; its directories are made meanwhile.
    pub async fn make(&self, id: SandboxId) -> Result<ReadyStub, EngineError> {
        let cgroup = plan::cgroup::plan(&self.layout, &id, &self.default_limits)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        // Written before any cgroup exists, so recovery after a crash finds
        // and removes them.
        let marker = self.stubs_dir.join(id.as_str());
        super::owner::write_marker(&marker, &self.owner.marker())
            .map_err(|e| EngineError::Internal(format!("{}: {e}", marker.display())))?;
        // The directories of the `host` template (a root and /usr overlay),
        // made now rather than on the create's critical path, while the
        // zygote forks the stub.
        let dir = self.sandboxes_dir.join(id.as_str());
        let dir2 = dir.clone();
        let dirs = tokio::task::spawn_blocking(move || {
            super::create::make_dirs(&dir2, super::create::STUB_LAYERS)
        });
        let (made, stub) = tokio::join!(dirs, self.stub_in_cgroups(&id, &cgroup));
        let failure = match (made, stub) {
            (Ok(Ok(())), Ok(stub)) => {
                return Ok(ReadyStub {
                    id,
                    stub,
                    cgroup,
                    spawned: false,
                })
            }
            (made, Ok(stub)) => {
                stub.kill();
                format!("making the directories of {id}: {made:?}")
            }
            (_, Err(e)) => e.to_string(),
        };
        self.abandon(&id, &cgroup);
        Err(EngineError::Internal(failure))
    }

    /// Removes what a stub that never became ready left: its cgroups, its
    /// directories, its marker.
    pub(super) fn abandon(&self, id: &SandboxId, cgroup: &CgroupPlan) {
        let _ = mayfly_sys::cgroup::remove(cgroup);
        let _ = std::fs::remove_dir_all(self.sandboxes_dir.join(id.as_str()));
        let _ = std::fs::remove_file(self.stubs_dir.join(id.as_str()));
    }

    /// The v1 `tasks` files a stub writes itself into; none on v2, where
    /// the engine moves it (see [`StubMaker::attach`]).
    pub(super) fn joins(cgroup: &CgroupPlan) -> Vec<PathBuf> {
        if cgroup.version == mayfly_sys::cgroup::CgroupVersion::V1 {
            cgroup
                .sandbox_dirs
                .iter()
                .map(|d| d.join("tasks"))
                .collect()
        } else {
            Vec::new()
        }
    }

    /// Moves a stub into its v2 cgroup.
    pub(super) async fn attach(&self, cgroup: &CgroupPlan, pid: i32) -> Result<(), EngineError> {
        let plan = cgroup.clone();
        let attached =
            tokio::task::spawn_blocking(move || mayfly_sys::cgroup::add_process(&plan, pid)).await;
        match attached {
            Ok(Ok(())) => Ok(()),
            other => Err(EngineError::Internal(format!(
                "placing a stub in its cgroups: {other:?}"
            ))),
        }
    }

    /// Creates the stub's cgroups and has the zygote fork a stub into them.
    /// On failure the caller removes the cgroups.
    async fn stub_in_cgroups(
        &self,
        id: &SandboxId,
        cgroup: &CgroupPlan,
    ) -> Result<StubHandle, EngineError> {
        let applied = cgroup.clone();
        tokio::task::spawn_blocking(move || mayfly_sys::cgroup::apply(&applied))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|e| EngineError::Internal(format!("creating cgroups for {id}: {e}")))?;
        // On v1 the stub joins its cgroups itself (see `join_cgroups`); on
        // v2 the daemon moves it.
        let stub = self
            .zygote
            .fork_stub(id.as_str(), &Self::joins(cgroup))
            .await
            .map_err(|e| EngineError::Internal(format!("forking a stub: {e}")))?;
        if cgroup.version == mayfly_sys::cgroup::CgroupVersion::V2 {
            if let Err(e) = self.attach(cgroup, stub.pid).await {
                stub.kill();
                return Err(EngineError::Internal(format!("{id}: {e}")));
            }
        }
        Ok(stub)
    }
}

impl Engine {
    /// Forks a stub and moves it into fresh cgroups.
    async fn make_stub(&self) -> Result<ReadyStub, EngineError> {
        self.inner.maker.make(super::create::random_id()?).await
    }

    /// The next stub, with its id (the future sandbox's) fixed now: from
    /// the pool, or the one-shot engine's early stub, or one made now. A
    /// create records the sandbox under that id while the stub is still
    /// being made; an early stub that fails is replaced by one with the
    /// same id.
    pub(crate) fn next_stub(&self) -> Result<PendingStub, EngineError> {
        let pooled = self
            .inner
            .stubs
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        if let Some(s) = pooled {
            return Ok(PendingStub {
                id: s.id.clone(),
                task: Box::pin(std::future::ready(Ok(s))),
                planned: None,
            });
        }
        let maker = self.inner.maker.clone();
        if let Some(mut early) = self.take_early_stub() {
            let id = early.id.clone();
            // If the early stub failed, its replacement is sent the same
            // plan, with the same lease, as any other stub.
            let planned = early.planned.take();
            let task = Box::pin(async move {
                match early.task.await {
                    Ok(Ok(s)) => return Ok(s),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "the early stub failed; making another")
                    }
                    Err(e) => tracing::debug!(error = %e, "the early stub's task failed"),
                }
                maker.make(early.id).await
            });
            return Ok(PendingStub { id, task, planned });
        }
        let id = super::create::random_id()?;
        let made = tokio::spawn({
            let id = id.clone();
            async move { maker.make(id).await }
        });
        let task = Box::pin(async move {
            made.await
                .map_err(|e| EngineError::Internal(format!("making a stub: {e}")))?
        });
        Ok(PendingStub {
            id,
            task,
            planned: None,
        })
    }

    /// Tops the pool up to its target in the background.
    pub(crate) fn refill_stubs(&self) {
        let target = self.inner.cfg.stub_pool;
        let pool = &self.inner.stubs;
        loop {
            let have = pool.ready.lock().unwrap_or_else(|p| p.into_inner()).len()
                + pool.inflight.load(Ordering::SeqCst);
            if have >= target || self.inner.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            pool.inflight.fetch_add(1, Ordering::SeqCst);
            let engine = self.clone();
            let task = tokio::spawn(async move {
                let made = engine.make_stub().await;
                let pool = &engine.inner.stubs;
                match made {
                    Ok(s) => {
                        // The flag is checked under the pool's lock, which
                        // drain_stubs takes after setting it: a stub is either
                        // drained or discarded here, never stranded.
                        let mut ready = pool.ready.lock().unwrap_or_else(|p| p.into_inner());
                        if engine.inner.shutting_down.load(Ordering::SeqCst) {
                            drop(ready);
                            engine.discard_stub(s);
                        } else {
                            ready.push_back(s);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "refilling the stub pool failed"),
                }
                pool.inflight.fetch_sub(1, Ordering::SeqCst);
            });
            // Shutdown waits for refills in flight, so none is cut off
            // halfway with cgroups made and nobody to remove them.
            self.track_cleanup(task);
        }
    }

    /// The stub made ahead for a one-shot engine's first create, if still
    /// unclaimed.
    fn take_early_stub(&self) -> Option<EarlyStub> {
        let mut early = self
            .inner
            .early_stub
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        early.take()
    }

    /// Kills every idle stub (and an early one nobody took) and removes
    /// its cgroups.
    pub(crate) async fn drain_stubs(&self) {
        if let Some(mut early) = self.take_early_stub() {
            let limit = self.inner.cfg.setup_timeout;
            match tokio::time::timeout(limit, &mut early.task).await {
                Ok(Ok(Ok(s))) => self.discard_stub(s),
                Ok(_) => {}
                Err(_) => {
                    // Its marker was written first: the next start's
                    // recovery removes whatever it made.
                    early.task.abort();
                    tracing::warn!(id = %early.id, "the stub made ahead did not finish in time");
                }
            }
        }
        let all: Vec<ReadyStub> = self
            .inner
            .stubs
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for s in all {
            self.discard_stub(s);
        }
    }

    /// Kills an unused stub, removes its cgroups (waiting for the stub to
    /// leave them) and its marker.
    /// Discards a stub still in the making, once it is made.
    pub(crate) async fn discard_pending(&self, task: StubTask) {
        if let Ok(s) = task.await {
            self.discard_stub(s);
        }
    }

    pub(crate) fn discard_stub(&self, s: ReadyStub) {
        s.stub.kill();
        if let Err(e) = mayfly_sys::cgroup::remove(&s.cgroup) {
            tracing::warn!(id = %s.id, error = %e, "removing an unused stub's cgroups failed");
        }
        let _ = std::fs::remove_dir_all(self.inner.cfg.sandboxes_dir().join(s.id.as_str()));
        self.forget_stub(&s.id);
    }

    /// Drops a stub's marker once its sandbox has a record (or it is gone).
    pub(crate) fn forget_stub(&self, id: &SandboxId) {
        let _ = std::fs::remove_file(self.inner.cfg.stubs_dir().join(id.as_str()));
    }
}
