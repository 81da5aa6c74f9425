//! Create: validate, record, lay out directories and cgroups, have the
//! zygote clone init, wait for ready.

use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use mayfly_store::SandboxRecord;
use mayfly_types::{CreateRequest, SandboxId, SandboxInfo, SandboxState};
use tokio::io::unix::AsyncFd;

use super::config::{EngineConfig, UIDS_PER_SANDBOX};
use super::sandbox::Sandbox;
use super::stubs::ReadyStub;
use super::{now_ms, Engine};
use crate::api::Caller;
use crate::plan::{self, mounts};
use crate::runtime::conn::InitConn;
use crate::runtime::proto::SpawnPlan;
use crate::runtime::stub::StubHandle;
use crate::template::plan_layers;
use crate::EngineError;

pub(crate) use super::spec::{base_env, check_env, random_id, ttl_secs, Boot, POOLED_EXPIRY};

/// The mount point of the root, relative to the sandbox's directory.
const ROOTFS: &str = "rootfs";

/// Layers whose directories a stub makes ahead: the `host` template's two
/// (the root and `/usr`); a `dir:` template needs one.
pub(crate) const STUB_LAYERS: usize = 2;

/// Per-sandbox directories: the sandbox's own directory and one (upper,
/// work) pair per layer.
pub(crate) fn sandbox_dirs(
    cfg: &EngineConfig,
    id: &SandboxId,
    layers: usize,
) -> (PathBuf, Vec<(PathBuf, PathBuf)>) {
    let dir = cfg.sandboxes_dir().join(id.as_str());
    let uppers = (0..layers)
        .map(|i| (dir.join(format!("upper{i}")), dir.join(format!("work{i}"))))
        .collect();
    (dir, uppers)
}

/// Creates the sandbox's directory, its mount point and `layers` (upper,
/// work) pairs, skipping any that exist (a stub may have made them ahead).
pub(crate) fn make_dirs(dir: &Path, layers: usize) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    let mk = |b: &std::fs::DirBuilder, p: &Path| match b.create(p) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    };
    // Traverse-only for others: the directory is private, but init must be
    // able to reach its mount point inside it.
    b.mode(0o711);
    mk(&b, dir)?;
    b.mode(0o755);
    mk(&b, &dir.join(ROOTFS))?;
    for i in 0..layers {
        mk(&b, &dir.join(format!("upper{i}")))?;
        mk(&b, &dir.join(format!("work{i}")))?;
    }
    Ok(())
}

/// The bring-up plan of a sandbox: pure, from its settings, its id and its
/// uid slot. `host` is the embedded template's skeleton and host entries.
pub(crate) fn spawn_plan(
    cfg: &EngineConfig,
    id: &SandboxId,
    slot: u32,
    template: &crate::templates::Resolved,
    limits: &mayfly_types::ResolvedLimits,
    env: &std::collections::BTreeMap<String, String>,
    host: (&Path, &[(&'static str, crate::template::HostEntry)]),
) -> SpawnPlan {
    let layers = plan_layers(template, host.0, host.1);
    let (dir, uppers) = sandbox_dirs(cfg, id, layers.len());
    let rootfs = PathBuf::from(ROOTFS);
    SpawnPlan {
        id: id.to_string(),
        uid_base: EngineConfig::uid_base(slot),
        uid_count: UIDS_PER_SANDBOX,
        layers,
        uppers,
        workdir: dir,
        before_pivot: mounts::before_pivot(&rootfs, limits),
        rootfs,
        after_pivot: mounts::after_pivot(),
        rlimits: plan::hardening::default_rlimits(limits),
        env: base_env(id, env),
    }
}

/// Makes a sandbox's directories beyond the first `made` layers' (a stub
/// makes `STUB_LAYERS` ahead) and gives the upper directories to the
/// sandbox's root: what is done before init is cloned.
pub(crate) fn prepare_dirs(plan: &SpawnPlan, made: usize) -> std::io::Result<()> {
    if plan.uppers.len() > made {
        make_dirs(&plan.workdir, plan.uppers.len())?;
    }
    own_uppers(&plan.uppers, plan.uid_base)
}

/// Gives the upper directories to the sandbox's root: the merged root takes
/// the upper's owner.
fn own_uppers(uppers: &[(PathBuf, PathBuf)], uid_base: u32) -> std::io::Result<()> {
    for (upper, _) in uppers {
        std::os::unix::fs::chown(upper, Some(uid_base), Some(uid_base))?;
    }
    Ok(())
}

impl Engine {
    /// A create: served from a warm pool when one fits, else booted now.
    pub(crate) async fn create_sandbox(
        &self,
        req: CreateRequest,
        caller: &Caller,
    ) -> Result<SandboxInfo, EngineError> {
        let t0 = Instant::now();
        let boot = self.check_create(req, None, caller)?;
        let (artifacts, workspace) = (boot.artifacts.clone(), boot.workspace.clone());
        let info = match self.claim_from_pool(&boot, caller, t0).await? {
            Some(info) => info,
            None => {
                // The daemon's cap and the tenant's quotas; given back on any failure.
                let admission = self.admit(caller, &boot.limits)?;
                let _fg = self.foreground();
                self.boot(boot, admission, caller, t0).await?
            }
        };
        self.finish_create(info, artifacts, workspace, caller).await
    }

    /// A cold create of an already resolved template (a build sandbox).
    pub(crate) async fn create_resolved(
        &self,
        req: CreateRequest,
        resolved: Arc<crate::templates::Resolved>,
        caller: &Caller,
    ) -> Result<SandboxInfo, EngineError> {
        let t0 = Instant::now();
        let boot = self.check_create(req, Some(resolved), caller)?;
        let admission = self.admit(caller, &boot.limits)?;
        let _fg = self.foreground();
        self.boot(boot, admission, caller, t0).await
    }

    /// Boots a sandbox: record, stub, plans, init, ready. `t0` is when the
    /// request arrived.
    /// `admission` holds its place under the daemon's cap (and its tenant's
    /// quotas); it is committed once the sandbox is live.
    pub(crate) async fn boot(
        &self,
        boot: Boot,
        admission: super::quota::Admission,
        caller: &Caller,
        t0: Instant,
    ) -> Result<SandboxInfo, EngineError> {
        let inner = &self.inner;
        let cfg = &inner.cfg;
        let Boot {
            template,
            limits,
            ttl_secs: ttl,
            idle_secs,
            env: req_env,
            labels,
            tenant,
            pool,
            egress,
            resolved,
            artifacts: _,
            workspace: _,
            lifecycle,
        } = boot;

        // The stub fixes the sandbox's id. The record, the uid lease and the
        // plan are made while the stub may still be in the making (a
        // daemonless run's stub starts with the process).
        let pending = self.next_stub()?;
        let id = pending.id.clone();
        let now = now_ms();
        let rec = SandboxRecord {
            id: id.clone(),
            state: SandboxState::Creating,
            template: template.to_string(),
            created_at: now,
            // A pool's sandbox gets its deadline when it is claimed.
            expires_at: if pool.is_some() {
                POOLED_EXPIRY
            } else {
                now + ttl * 1000
            },
            limits,
            labels,
            uid_slot: 0,
            owner_pid: inner.owner.pid,
            owner_start: inner.owner.start,
            init_pid: None,
            reason: None,
            create_ms: None,
            tenant,
            pool: pool.clone(),
            claimed_at: None,
        };
        let cgroup = plan::cgroup::plan(inner.layout(), &id, &limits)
            .map_err(|e| EngineError::Internal(e.to_string()));
        // A sandbox planned at start comes with its slot leased; the store
        // takes that slot or none.
        let mut pending = pending;
        let mut planned = pending.planned.take();
        let mut lease = None;
        let mut slot = self.insert_leasing(&rec, planned.as_ref(), &mut lease);
        if planned.is_some() && matches!(slot, Err(EngineError::Exhausted(_))) {
            // The slot leased at start is one that a record still shows live
            // (a sandbox whose owner let its lease go before recording its
            // end). This sandbox takes another slot, and a stub of its own
            // under the same id; the early one goes, with its init.
            tracing::debug!(%id, "the uid slot planned at start is recorded live; replanning");
            let (maker, id2) = (inner.maker.clone(), id.clone());
            let early = std::mem::replace(
                &mut pending.task,
                Box::pin(async move { maker.make(id2).await }),
            );
            self.discard_pending(early).await;
            planned = None;
            slot = self.insert_leasing(&rec, None, &mut lease);
        }
        let (slot, cgroup, lease) = match (slot, cgroup, lease) {
            (Ok(s), Ok(c), Some(l)) => (s, c, l),
            (slot, cgroup, _) => {
                self.discard_pending(pending.task).await;
                if slot.is_ok() {
                    let _ = inner
                        .store
                        .transition(&id, SandboxState::Failed, Some("plan"));
                }
                return Err(slot
                    .and(cgroup)
                    .err()
                    .unwrap_or_else(|| EngineError::Internal("create failed".into())));
            }
        };
        let uid_base = EngineConfig::uid_base(slot);
        let spawn = spawn_plan(
            cfg,
            &id,
            slot,
            &resolved,
            &limits,
            &req_env,
            (&inner.skeleton, &inner.host),
        );
        let (dir, env) = (spawn.workdir.clone(), spawn.env.clone());
        if let Some(p) = &planned {
            // Made by this same code before the runtime started; a
            // difference would be a bug, and the stub's init runs the
            // other plan, so the create fails rather than record a lie.
            if p.plan != spawn {
                self.discard_pending(pending.task).await;
                return Err(self.record_failed(
                    &id,
                    EngineError::Internal(
                        "the sandbox planned at start differs from its create".into(),
                    ),
                    caller,
                ));
            }
        }

        let t_plan = t0.elapsed();
        // A namespace prepared ahead, taken while the stub is in the making.
        let net = match self.attach_net(&id, &egress).await {
            Ok(n) => n,
            Err(e) => {
                self.discard_pending(pending.task).await;
                return Err(self.record_failed(&id, e, caller));
            }
        };
        let ReadyStub { stub, spawned, .. } = match pending.task.await {
            Ok(s) => s,
            Err(e) => {
                self.release_unused_net(net).await;
                return Err(self.record_failed(&id, e, caller));
            }
        };
        let t_stub = t0.elapsed();
        if pool.is_some() {
            // Refill yields to the sandboxes in use on a busy host; the
            // claim gives the sandbox the default weight back.
            super::pool::set_cpu_weight(&id, &cgroup, plan::cgroup::CpuWeight::Pooled);
        }
        // The record now names these cgroups; the stub marker is redundant.
        self.forget_stub(&id);
        let ns = net.as_ref().map(|(p, _)| p.ns.as_fd());
        let (pid, pidfd, conn) = match self
            .bring_up(&id, &stub, spawned, &cgroup, &spawn, &limits, &lease, ns)
            .await
        {
            Ok(x) => x,
            Err(e) => {
                stub.kill();
                self.cleanup_failed(&id, &cgroup, &dir).await;
                self.release_unused_net(net).await;
                self.refill_stubs();
                return Err(self.record_failed(&id, e, caller));
            }
        };
        let sb = Arc::new(Sandbox::new(
            id.clone(),
            uid_base,
            pid,
            rec.expires_at,
            conn.clone(),
            pidfd,
            stub,
            cgroup,
            dir,
            env,
            rec.tenant.clone(),
            lease,
        ));
        sb.idle_ms
            .store(idle_secs * 1000, std::sync::atomic::Ordering::Relaxed);
        sb.disk_limit
            .store(limits.disk_bytes, std::sync::atomic::Ordering::Relaxed);
        let _ = sb.exec_defaults.set(super::sandbox::ExecDefaults {
            cwd: resolved.workdir.clone(),
            uid: resolved.user,
        });
        self.layers_in_use(&id, &resolved);
        sb.set_lifecycle(lifecycle);
        if let Some((prepared, attached)) = net {
            let _ = sb.egress.set(attached);
            *sb.net.lock().unwrap_or_else(|p| p.into_inner()) = Some(prepared);
        }
        inner
            .sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), sb.clone());
        admission.commit(&id);
        // When init's channel closes without a destroy, the sandbox died.
        let (engine, sb2) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            conn.run_reader().await;
            engine.init_died(sb2).await;
        });
        let t_up = t0.elapsed();
        // Services ready and after_create hooks passed before the sandbox
        // is handed out or pooled; a failure has destroyed it.
        self.start_lifecycle(&sb, caller).await?;
        let create_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let detail = serde_json::json!({
            "create_ms": create_ms,
            "caller": caller.name,
            "template": template.to_string(),
            "source": "cold",
            "pool": pool,
        });
        if let Err(e) = inner.store.mark_ready(&id, pid as u32, create_ms, &detail) {
            // Live but never recorded ready: no pool would take it in and
            // no caller would get it, so it goes now, not at its TTL.
            self.destroy_in_background(sb, super::lifecycle::CREATE_FAILED);
            return Err(e.into());
        }
        tracing::debug!(%id, stub = ?t_stub, planned = ?t_plan, up = ?t_up, done = ?t0.elapsed(), "create timings");
        self.refill_stubs();
        self.info(&id)
    }

    /// Records `rec` in state `creating` with a uid slot: the one `planned`
    /// leased, or the lowest free one, leased host-wide into `lease`.
    fn insert_leasing(
        &self,
        rec: &SandboxRecord,
        planned: Option<&super::stubs::Planned>,
        lease: &mut Option<std::fs::File>,
    ) -> Result<u32, EngineError> {
        let cfg = &self.inner.cfg;
        let id = rec.id.to_string();
        self.inner
            .store
            .insert_sandbox_leasing(rec, cfg.slots(), &mut |slot| match planned {
                Some(p) if p.slot == slot => {
                    *lease = Some(p.lease.try_clone()?);
                    Ok(true)
                }
                Some(_) => Ok(false),
                None => {
                    *lease = super::leases::lease_for(&cfg.slot_lease_dir, slot, &id)?;
                    Ok(lease.is_some())
                }
            })
            .map_err(|e| match e {
                mayfly_store::StoreError::SlotsExhausted { max } => {
                    EngineError::Exhausted(format!("all {max} sandbox id ranges are in use"))
                }
                e => e.into(),
            })
    }

    /// Records a create that failed after its record was made; returns the
    /// error for the caller.
    fn record_failed(&self, id: &SandboxId, e: EngineError, caller: &Caller) -> EngineError {
        let _ = self.inner.store.transition_with_event(
            id,
            SandboxState::Failed,
            Some(&e.to_string()),
            (
                "failed",
                &serde_json::json!({"error": e.to_string(), "caller": caller.name, "reason": e.code()}),
            ),
        );
        e
    }

    /// Host-side setup (directories, cgroup limits), then the stub clones
    /// init and init reports ready.
    #[allow(clippy::too_many_arguments)]
    async fn bring_up(
        &self,
        id: &SandboxId,
        stub: &StubHandle,
        planned: bool,
        cgroup: &mayfly_sys::cgroup::CgroupPlan,
        plan: &SpawnPlan,
        limits: &mayfly_types::ResolvedLimits,
        lease: &std::fs::File,
        net: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<(i32, AsyncFd<std::os::fd::OwnedFd>, Arc<InitConn>), EngineError> {
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            EngineError::Internal(format!("{what} for sandbox {id}: {e}"))
        };
        if planned && net.is_some() {
            return Err(internal(
                "joining the network",
                &"a stub planned at start cannot join a prepared namespace",
            ));
        }
        let spawned = if planned {
            // The stub made all of this from the same plan, and its cgroups
            // with the create's limits, and cloned init on its own.
            stub.spawned().await
        } else {
            // The sandbox's directory is init's working directory. Every
            // stub comes with the directories of `STUB_LAYERS` layers
            // already made.
            prepare_dirs(plan, STUB_LAYERS)
                .map_err(|e| internal("preparing the sandbox's directories", &e))?;
            // The stub's cgroups were made with the default limits; only
            // other limits need writing.
            if limits != &self.inner.cfg.default_limits {
                mayfly_sys::cgroup::apply(cgroup)
                    .map_err(|e| internal("setting cgroup limits", &e))?;
            }
            stub.spawn(plan, lease.as_fd(), net).await
        }
        .map_err(|e| internal("spawning init", &e))?;
        let pidfd = mayfly_sys::ipc::register_async(spawned.pidfd)
            .map_err(|e| internal("watching init", &e))?;
        let conn = InitConn::new(spawned.ctl).map_err(|e| internal("connecting to init", &e))?;
        let ready = tokio::time::timeout(self.inner.cfg.setup_timeout, conn.wait_ready()).await;
        let failure = match ready {
            Ok(Ok(())) => return Ok((spawned.pid, pidfd, conn)),
            Ok(Err(e)) => internal("setting up", &e),
            Err(_) => internal("setting up", &"init did not report ready in time"),
        };
        let _ = mayfly_sys::process::pidfd_send_signal(pidfd.get_ref().as_fd(), libc::SIGKILL);
        Err(failure)
    }
}
