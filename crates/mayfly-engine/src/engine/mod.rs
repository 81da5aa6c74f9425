//! The engine: owns the store, the zygote and every live sandbox, and
//! implements [`SandboxApi`](crate::SandboxApi). One verb per file.

mod api_impl;
pub(crate) mod artifacts;
mod audit;
mod buffers;
mod claims;
mod config;
mod create;
mod destroy;
mod disk;
mod early;
mod exec;
pub(crate) mod finish;
mod gateway;
mod history;
mod leases;
mod lifecycle;
mod network;
pub(crate) use leases::try_lease;
mod oom;
mod owner;
mod pool;
mod processes;
mod quota;
pub(crate) mod reaper;
mod recovery;
mod refill;
mod sandbox;
mod spec;
mod stubs;
mod template_build;
mod template_steps;
mod templates;
mod tenants;
mod usage;
mod workspace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mayfly_store::Store;
use mayfly_sys::cgroup::CgroupLayout;
use mayfly_types::SandboxId;

pub use buffers::DEFAULT_FILE_BUFFER_BYTES;
pub use config::{EngineConfig, DEFAULT_MAX_COMMANDS, DEFAULT_SPARE_NS_DIR};
pub use early::start_one_shot_zygote;
pub use lifecycle::{Lifecycle, LifecycleError};
pub use pool::{check_pool_name, DEFAULT_REFILL_CONCURRENCY, MAX_REFILL_CONCURRENCY};
pub(crate) use quota::FREED_RETRY_SECS;
pub use quota::{Admission, QuotaError};
pub use reaper::Detached;
pub use recovery::RecoveryReport;
use sandbox::Sandbox;
pub use sandbox::SandboxActivity;
pub use template_build::BuildEvents;

use crate::runtime::zygote::Zygote;
use crate::template::{self, HostEntry};
use crate::EngineError;

/// Mayfly's engine. Cheap to clone; every clone drives the same sandboxes.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: EngineConfig,
    store: Store,
    maker: Arc<stubs::StubMaker>,
    /// A one-shot engine's first stub, started before the store was open.
    early_stub: std::sync::Mutex<Option<stubs::EarlyStub>>,
    skeleton: PathBuf,
    host: Vec<(&'static str, HostEntry)>,
    sandboxes: RwLock<HashMap<SandboxId, Arc<Sandbox>>>,
    shutting_down: AtomicBool,
    /// Counts key revocations and tenant removals: requests that stay open
    /// (streams, forwards) re-check their key when it moves.
    revocations: tokio::sync::watch::Sender<u64>,
    /// This process, recorded as every sandbox's owner.
    owner: owner::Owner,
    recovery: RecoveryReport,
    /// Background directory removals, awaited by [`Engine::wait_cleanup`].
    cleanups: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// What file answers built in memory may hold at once.
    file_buffers: buffers::FileBuffers,
    stubs: stubs::StubPool,
    /// Reapers being forked for a one-shot engine's sandboxes.
    reapers: std::sync::Mutex<HashMap<SandboxId, reaper::PendingReaper>>,
    /// Warm pools of booted, unclaimed sandboxes.
    pools: pool::Pools,
    /// Tenant quotas, usage and who owns each live sandbox (admission).
    quotas: Arc<std::sync::Mutex<quota::Ledger>>,
    /// Tokens, exposed ports, overrides and routes (the gateway's maps).
    gateway: gateway::GatewayState,
    /// The state directory's daemon lock, held by a daemon for its lifetime.
    _lock: Option<std::fs::File>,
    /// The egress service, once started (daemons only).
    egress: std::sync::OnceLock<crate::egress::Egress>,
    /// Why the egress service could not start, for creates that need it.
    egress_unavailable: std::sync::Mutex<Option<String>>,
    /// Named templates: the resolve cache, layers in use, the build lock.
    templates: templates::TemplateState,
}

impl Inner {
    /// Where the host's cgroup controllers are (the stub maker's copy).
    fn layout(&self) -> &CgroupLayout {
        &self.maker.layout
    }
}

/// The directories of a stub for the `host` template, for a stub that
/// makes its own (see `engine::early`).
pub(crate) fn make_stub_dirs(dir: &std::path::Path) -> std::io::Result<()> {
    create::make_dirs(dir, create::STUB_LAYERS)
}

pub(crate) use create::prepare_dirs;
pub(crate) use owner::write_marker;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Engine {
    /// Opens the store, discovers the host, builds the embedded template and
    /// reconciles whatever a previous owner left behind.
    ///
    /// `zygote` must have been started before any thread was spawned.
    pub fn new(cfg: EngineConfig, zygote: Zygote) -> Result<Engine, EngineError> {
        // The state directory and `sandboxes/` are traverse-only for others
        // (0711): each sandbox's init reaches its mount point through them
        // as the sandbox's root, an unprivileged uid on the host.
        if let Some(scratch) = &cfg.scratch_dir {
            config::check_scratch(scratch, &cfg.state_dir)?;
        }
        for d in [
            cfg.state_dir.clone(),
            cfg.scratch_root().to_path_buf(),
            cfg.sandboxes_dir(),
            cfg.stubs_dir(),
            cfg.trash_dir(),
        ] {
            std::fs::create_dir_all(&d)
                .and_then(|()| {
                    std::fs::set_permissions(
                        &d,
                        std::os::unix::fs::PermissionsExt::from_mode(0o711),
                    )
                })
                .map_err(|e| EngineError::Internal(format!("preparing {}: {e}", d.display())))?;
        }
        // One daemon per state directory. Daemonless runs share the
        // directory with a daemon but leave its unused stubs alone.
        let lock = mayfly_sys::process::try_lock_file(&cfg.state_dir.join("daemon.lock"))
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        if lock.is_none() && cfg.stub_pool > 0 {
            return Err(EngineError::Internal(format!(
                "another Mayfly daemon already owns {}",
                cfg.state_dir.display()
            )));
        }
        // A daemon holds the lock for its lifetime; a daemonless run only
        // looked whether a daemon is there.
        let lock = if cfg.stub_pool > 0 { lock } else { None };
        leases::prepare(&cfg.slot_lease_dir).map_err(|e| {
            EngineError::Internal(format!("preparing {}: {e}", cfg.slot_lease_dir.display()))
        })?;
        let layout = match &cfg.cgroup_layout {
            Some(l) => l.clone(),
            None => CgroupLayout::discover()
                .map_err(|e| EngineError::Internal(format!("cgroups: {e}")))?,
        };
        let host = template::inspect_host(&cfg.host_root);
        let skeleton = template::ensure_host_skeleton(&cfg.templates_dir(), &cfg.host_root, &host)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let owner = owner::Owner::current();
        let maker = Arc::new(stubs::StubMaker {
            zygote,
            owner,
            layout,
            default_limits: cfg.default_limits,
            stubs_dir: cfg.stubs_dir(),
            sandboxes_dir: cfg.sandboxes_dir(),
        });
        // A one-shot engine (`mayfly run`) adopts the stub this process
        // forked as it started (see `engine::early`); it goes on being made
        // while this thread opens the store and reconciles. Should opening
        // the store fail, the stub dies with this process, and its marker (written before its cgroups) lets
        // the next start's recovery remove the rest.
        let early_stub = match tokio::runtime::Handle::try_current() {
            Ok(_) if cfg.stub_pool == 0 => maker.adopt_early(),
            _ => None,
        };
        let store = Store::open(&cfg.state_dir)?;
        let quotas = Arc::new(std::sync::Mutex::new(Engine::load_ledger(&store)?));
        let file_buffers = buffers::FileBuffers::new(cfg.file_buffer_bytes);
        let mut inner = Inner {
            cfg,
            store,
            maker,
            early_stub: std::sync::Mutex::new(early_stub),
            skeleton,
            host,
            sandboxes: RwLock::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            revocations: tokio::sync::watch::Sender::new(0),
            owner,
            recovery: RecoveryReport::default(),
            cleanups: std::sync::Mutex::new(Vec::new()),
            file_buffers,
            stubs: stubs::StubPool::default(),
            reapers: std::sync::Mutex::new(HashMap::new()),
            pools: pool::Pools::default(),
            quotas,
            gateway: Default::default(),
            _lock: lock,
            egress: std::sync::OnceLock::new(),
            egress_unavailable: std::sync::Mutex::new(None),
            templates: Default::default(),
        };
        inner.recovery = recovery::reconcile(&inner);
        if inner._lock.is_some() {
            artifacts::start_sweep(&inner.cfg);
        }
        Ok(Engine {
            inner: Arc::new(inner),
        })
    }

    /// What start-up reconciliation found and cleaned.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// Starts the TTL reaper, the disk-limit watcher, artifact retention
    /// and history pruning, and
    /// fills the stub pool. Call once, inside the tokio runtime.
    pub fn start_background(&self) {
        self.refill_stubs();
        for (name, spec) in self.inner.cfg.pools.clone() {
            if let Err(e) = self.set_pool(&name, spec, &crate::api::Caller::new("config")) {
                tracing::error!(pool = %name, error = %e, "the configured pool is invalid");
            }
        }
        self.start_refill();
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Engine { inner }.enforce_retention().await;
            }
        });
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(history::PRUNE_EVERY);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                if let Err(e) = (Engine { inner }).prune_history().await {
                    tracing::warn!(error = %e, "pruning the store's history failed");
                }
            }
        });
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(disk::CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut watch = disk::DiskWatch::default();
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Engine { inner }.check_disk(&mut watch).await;
            }
        });
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                engine.reap_expired();
            }
        });
    }

    /// Gives a live sandbox a new deadline, `ttl_secs` (or the default)
    /// from now: a parked sandbox's TTL starts when a run claims it. The
    /// deadline holds at once; the record is updated on a blocking thread,
    /// which the returned handle joins.
    pub fn renew_ttl(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<tokio::task::JoinHandle<()>, EngineError> {
        let ttl = create::ttl_secs(&self.inner.cfg, ttl_secs)?;
        let sb = self.lookup(id)?;
        let at = now_ms() + ttl * 1000;
        sb.expires_at.store(at, Ordering::Relaxed);
        let (engine, id) = (self.clone(), id.clone());
        Ok(tokio::task::spawn_blocking(move || {
            if let Err(e) = engine.inner.store.set_expires_at(&id, at) {
                tracing::warn!(error = %e, %id, "recording a new deadline failed");
            }
        }))
    }

    /// Runs `f` on the store on a blocking thread: reads of a long history
    /// and pruning stay off the runtime's workers.
    pub(crate) async fn on_store<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(&Store) -> Result<T, mayfly_store::StoreError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let engine = self.clone();
        tokio::task::spawn_blocking(move || f(&engine.inner.store))
            .await
            .map_err(|e| EngineError::Internal(format!("{what} failed: {e}")))?
            .map_err(EngineError::from)
    }

    /// How long a live sandbox has left before its deadline.
    pub fn ttl_left(&self, id: &SandboxId) -> Result<Duration, EngineError> {
        let at = self.lookup(id)?.expires_at.load(Ordering::Relaxed);
        Ok(Duration::from_millis(at.saturating_sub(now_ms())))
    }

    /// Destroys sandboxes past their deadline (even with commands running)
    /// and those idle past their idle timeout.
    fn reap_expired(&self) {
        let now = now_ms();
        for sb in self.live() {
            if sb.is_destroying() || sb.is_stopping() || sb.is_pooled() {
                continue;
            }
            let reason = if sb.expires_at.load(Ordering::Relaxed) <= now {
                "ttl"
            } else if sb.is_idle(now) {
                "idle"
            } else {
                continue;
            };
            self.destroy_in_background(sb, reason);
        }
    }

    /// Keeps a sandbox alive: resets its idle timer and, with `ttl_secs`,
    /// moves its deadline to that long from now (at most the maximum TTL).
    pub async fn keepalive(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<mayfly_types::SandboxInfo, EngineError> {
        let sb = self.lookup(id)?;
        sb.settled().await;
        if sb.is_stopping() || sb.is_destroying() {
            return Err(EngineError::NotReady {
                id: id.clone(),
                state: mayfly_types::SandboxState::Stopping,
            });
        }
        if ttl_secs.is_some() {
            let write = self.renew_ttl(id, ttl_secs)?;
            let _ = write.await;
        }
        self.info(id)
    }

    /// The first half of a draining shutdown: refuses new creates (503),
    /// destroys the pools' unclaimed sandboxes, and waits until every
    /// claimed sandbox has ended (its task deleted it, or its TTL or idle
    /// timeout did) or `grace` has passed, or `cut_short` resolves. Requests
    /// to live sandboxes are served meanwhile. Returns how many are left.
    pub async fn drain(
        &self,
        grace: Duration,
        cut_short: impl std::future::Future<Output = ()>,
    ) -> usize {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let unclaimed: Vec<SandboxId> = self
            .lock_pools()
            .values_mut()
            .flat_map(|p| {
                p.target = 0;
                p.ready.drain(..).collect::<Vec<_>>()
            })
            .collect();
        for id in unclaimed {
            if let Some(sb) = self.lookup_any(&id) {
                self.destroy_in_background(sb, "daemon_shutdown");
            }
        }
        let left = || {
            self.live()
                .iter()
                .filter(|s| !s.is_pooled() && !s.is_stopping())
                .count()
        };
        let wait = async {
            while left() > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = tokio::time::sleep(grace) => {}
            _ = cut_short => {}
        }
        left()
    }

    /// Destroys every live sandbox (daemon shutdown).
    pub async fn shutdown(&self) {
        self.shutdown_for("daemon_shutdown").await
    }

    /// Destroys every live sandbox, recording `reason` as why each ended.
    pub async fn shutdown_for(&self, reason: &'static str) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        self.dismiss_reapers().await;
        self.drain_stubs().await;
        let all = self.live();
        let tasks: Vec<_> = all
            .into_iter()
            .map(|sb| {
                let e = self.clone();
                tokio::spawn(async move { e.destroy_sandbox(sb, reason).await })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        self.wait_cleanup().await;
        let e = self.clone();
        let _ = tokio::task::spawn_blocking(move || e.stop_egress()).await;
    }

    fn live(&self) -> Vec<Arc<Sandbox>> {
        self.inner
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// A live sandbox that requests may reach: never one that waits
    /// unclaimed in a pool.
    /// Every request that reaches a sandbox goes through here, which counts
    /// as activity for its idle timeout.
    fn lookup(&self, id: &SandboxId) -> Result<Arc<Sandbox>, EngineError> {
        let sb = self.lookup_claimed(id)?;
        sb.touch();
        Ok(sb)
    }

    /// [`Engine::lookup`] without the activity: for callers that authorise
    /// the request afterwards (the gateway's token check), so a refused
    /// request never keeps a sandbox alive.
    fn lookup_claimed(&self, id: &SandboxId) -> Result<Arc<Sandbox>, EngineError> {
        self.lookup_any(id)
            .filter(|sb| !sb.is_pooled())
            .ok_or_else(|| EngineError::NoSuchSandbox(id.clone()))
    }

    /// Waits until a claim of `id` being recorded is committed (see
    /// `Sandbox::record`), so that reading its record sees the claim.
    async fn settle(&self, id: &SandboxId) {
        if let Some(sb) = self.lookup_any(id) {
            sb.settled().await;
        }
    }

    /// [`Engine::settle`] for every live sandbox.
    async fn settle_all(&self) {
        let all: Vec<_> = self
            .inner
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for sb in all {
            sb.settled().await;
        }
    }

    /// Any live sandbox, claimed or not (for the engine's own use).
    fn lookup_any(&self, id: &SandboxId) -> Option<Arc<Sandbox>> {
        self.inner
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn live_count(&self) -> usize {
        self.inner
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Destroys `sb` without waiting; shutdown waits for it.
    fn destroy_in_background(&self, sb: Arc<Sandbox>, reason: &'static str) {
        let engine = self.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = engine.destroy_sandbox(sb, reason).await {
                tracing::warn!(error = %e, reason, "destroying a sandbox failed");
            }
        });
        self.track_cleanup(task);
    }
}
