//! A daemonless run's one stub, made from the very start.
//!
//! A one-shot engine (`mayfly run` without a daemon) creates exactly one
//! sandbox, at once. Its stub (marker, cgroups, directories, network, UTS
//! and IPC namespaces) is on that create's critical path, so it is not made
//! on request: the zygote forks it as its first act and the stub does all
//! of that work itself, while this process goes on parsing, building its
//! runtime and opening the store. [`Engine::new`] then adopts it.

use std::sync::Arc;

use mayfly_sys::cgroup::{CgroupLayout, CgroupPlan, CgroupVersion};
use mayfly_types::SandboxId;

use super::owner::Owner;
use super::stubs::{EarlyStub, ReadyStub, StubMaker};
use super::EngineConfig;
use crate::plan;
use crate::runtime::proto::EarlyWork;
use crate::runtime::zygote::Zygote;
use crate::EngineError;

/// Starts a one-shot engine's zygote, whose first act is to fork the stub
/// of the engine's sandbox. Discovers the cgroup layout into `cfg`, so the
/// engine does not again. Call it before any other thread exists.
pub fn start_one_shot_zygote(cfg: &mut EngineConfig) -> Result<Zygote, EngineError> {
    let layout = match &cfg.cgroup_layout {
        Some(l) => l.clone(),
        None => {
            CgroupLayout::discover().map_err(|e| EngineError::Internal(format!("cgroups: {e}")))?
        }
    };
    cfg.cgroup_layout = Some(layout.clone());
    let id = super::create::random_id()?;
    let cgroup = plan::cgroup::plan(&layout, &id, &cfg.default_limits)
        .map_err(|e| EngineError::Internal(e.to_string()))?;
    let work = EarlyWork {
        id: id.to_string(),
        join: StubMaker::joins(&cgroup),
        marker: cfg.stubs_dir().join(id.as_str()),
        marker_text: Owner::current().marker(),
        cgroup: cgroup.clone(),
        dir: cfg.sandboxes_dir().join(id.as_str()),
    };
    Zygote::start_one_shot(id, cgroup, work)
        .map_err(|e| EngineError::Internal(format!("starting the zygote: {e}")))
}

impl StubMaker {
    /// Adopts the stub a one-shot zygote forked as it started, if it did.
    pub fn adopt_early(self: &Arc<Self>) -> Option<EarlyStub> {
        let (id, cgroup) = self.zygote.take_early()?;
        tracing::debug!(%id, "adopting the stub made from the start");
        let maker = self.clone();
        let id2 = id.clone();
        let task = tokio::spawn(async move { maker.take_early(id2, cgroup).await });
        Some(EarlyStub { id, task })
    }

    async fn take_early(
        &self,
        id: SandboxId,
        cgroup: CgroupPlan,
    ) -> Result<ReadyStub, EngineError> {
        let stub = match self.zygote.take_early_stub().await {
            Ok(stub) => stub,
            Err(e) => {
                self.abandon(&id, &cgroup);
                return Err(EngineError::Internal(format!(
                    "the early stub of {id}: {e}"
                )));
            }
        };
        if cgroup.version == CgroupVersion::V2 {
            if let Err(e) = self.attach(&cgroup, stub.pid).await {
                stub.kill();
                self.abandon(&id, &cgroup);
                return Err(e);
            }
        }
        Ok(ReadyStub { id, stub, cgroup })
    }
}
