//! A daemonless run's one sandbox, set going from the very start.
//!
//! A one-shot engine (`mayfly run` without a daemon) creates exactly one
//! sandbox, at once, so everything about it is on the run's critical path.
//! Before the process has any other thread, it plans that sandbox (its id,
//! its uid slot, leased now, and its whole bring-up plan, made by the same
//! code a create uses) and forks its stub itself. The stub makes its
//! marker, cgroups (with the run's limits) and directories, its network,
//! UTS and IPC namespaces, and then clones init and has it set up, all
//! while this process goes on building its runtime and opening the store.
//! [`Engine::new`] adopts the stub, and the create records the sandbox
//! under the planned slot, checks that the plan it makes itself is the
//! stub's, and waits for init. A request that cannot be planned (an
//! invalid one, which the create then refuses; or cgroup v2, where the
//! engine moves the stub) gets a stub that waits for its plan instead.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use mayfly_sys::cgroup::{CgroupLayout, CgroupVersion};
use mayfly_types::{CreateRequest, ResolvedLimits, SandboxId, TemplateRef};

use super::owner::Owner;
use super::stubs::{EarlyStub, ReadyStub, StubMaker};
use super::{create, leases, EngineConfig};
use crate::plan;
use crate::runtime::proto::EarlyWork;
use crate::runtime::zygote::{EarlyFork, Planned, Zygote};
use crate::template;
use crate::EngineError;

/// How many uid slots a run tries to lease ahead before it leaves the
/// choice to its create (a host with that many live sandboxes has a daemon,
/// and a run goes through it).
const PLAN_SLOT_TRIES: u32 = 64;

/// Starts a one-shot engine: plans the sandbox `req` asks for and forks its
/// stub, then forks the zygote. Discovers the cgroup layout into `cfg`, so
/// the engine does not again. Call it before any other thread exists.
pub fn start_one_shot_zygote(
    cfg: &mut EngineConfig,
    req: Option<&CreateRequest>,
) -> Result<Zygote, EngineError> {
    let layout = match &cfg.cgroup_layout {
        Some(l) => l.clone(),
        None => {
            CgroupLayout::discover().map_err(|e| EngineError::Internal(format!("cgroups: {e}")))?
        }
    };
    cfg.cgroup_layout = Some(layout.clone());
    let id = create::random_id()?;
    let planned = match req {
        Some(req) if matches!(layout, CgroupLayout::V1 { .. }) => plan_ahead(cfg, &id, req),
        _ => None,
    };
    let limits = planned.as_ref().map_or(cfg.default_limits, |(l, _)| *l);
    let cgroup = plan::cgroup::plan(&layout, &id, &limits)
        .map_err(|e| EngineError::Internal(e.to_string()))?;
    let planned = planned.map(|(_, p)| p);
    let work = EarlyWork {
        id: id.to_string(),
        join: StubMaker::joins(&cgroup),
        marker: cfg.stubs_dir().join(id.as_str()),
        marker_text: Owner::current().marker(),
        cgroup: cgroup.clone(),
        dir: cfg.sandboxes_dir().join(id.as_str()),
        plan: planned.as_ref().map(|p| p.plan.clone()),
        lease_fd: planned.as_ref().map(|p| p.lease.as_raw_fd()),
        spare_ns: cfg.spare_ns_dir.clone(),
    };
    Zygote::start_one_shot(id, cgroup, work, planned)
        .map_err(|e| EngineError::Internal(format!("starting the zygote: {e}")))
}

/// The sandbox `req` asks for, planned as its create will plan it, with
/// its uid slot leased; None if the request is not one a create accepts
/// (the create then says why) or no slot is free among the first few.
fn plan_ahead(
    cfg: &EngineConfig,
    id: &SandboxId,
    req: &CreateRequest,
) -> Option<(ResolvedLimits, Planned)> {
    let template = req.template.clone().unwrap_or(TemplateRef::Host);
    // A built template is resolved by the create (from the registry).
    let resolved = crate::templates::Resolved::simple(&template)?;
    if let TemplateRef::Dir(d) = &template {
        if !d.is_dir() {
            return None;
        }
    }
    let limits = cfg.default_limits.with(&req.limits).ok()?;
    create::check_env(&req.env).ok()?;
    leases::prepare(&cfg.slot_lease_dir).ok()?;
    let (slot, lease) = (0..cfg.slots().min(PLAN_SLOT_TRIES)).find_map(|slot| {
        let lease = leases::lease_for(&cfg.slot_lease_dir, slot, id.as_str()).ok()??;
        Some((slot, lease))
    })?;
    let host = template::inspect_host(&cfg.host_root);
    let skeleton =
        template::ensure_host_skeleton(&cfg.templates_dir(), &cfg.host_root, &host).ok()?;
    let plan = create::spawn_plan(
        cfg,
        id,
        slot,
        &resolved,
        &limits,
        &req.env,
        (&skeleton, &host),
    );
    Some((limits, Planned { slot, lease, plan }))
}

impl StubMaker {
    /// Adopts the stub this process forked as it started, if it did.
    pub fn adopt_early(self: &Arc<Self>) -> Option<EarlyStub> {
        let mut early = self.zygote.take_early()?;
        let id = early.id.clone();
        tracing::debug!(%id, "adopting the stub made from the start");
        let planned = early.planned.take();
        let spawned = planned.is_some();
        let maker = self.clone();
        let task = tokio::spawn(async move { maker.take_early(early, spawned).await });
        Some(EarlyStub { id, task, planned })
    }

    async fn take_early(&self, early: EarlyFork, spawned: bool) -> Result<ReadyStub, EngineError> {
        let (id, cgroup) = (early.id.clone(), early.cgroup.clone());
        let stub = match early.prepared().await {
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
        Ok(ReadyStub {
            id,
            stub,
            cgroup,
            spawned,
        })
    }
}
