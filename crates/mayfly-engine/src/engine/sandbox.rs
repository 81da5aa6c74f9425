//! A live sandbox as the engine holds it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use mayfly_sys::cgroup::CgroupPlan;
use mayfly_types::SandboxId;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::processes::BgProcess;
use crate::files::SandboxFs;
use crate::runtime::conn::InitConn;
use crate::runtime::stub::StubHandle;

pub(crate) struct Sandbox {
    pub id: SandboxId,
    pub uid_base: u32,
    pub init_pid: i32,
    /// Unix ms; moved when a parked sandbox is claimed.
    pub expires_at: AtomicU64,
    pub conn: Arc<InitConn>,
    pub pidfd: AsyncFd<OwnedFd>,
    /// init's parent on the host; killed with the sandbox.
    pub stub: StubHandle,
    pub cgroup: CgroupPlan,
    /// `<state>/sandboxes/<id>`: upper and work directories and the mount point.
    pub dir: PathBuf,
    /// The environment every command starts from (set again when a pool's
    /// sandbox is claimed).
    pub env: RwLock<Arc<Vec<(String, String)>>>,
    /// The owning tenant; `None` while the sandbox waits in a pool.
    pub tenant: RwLock<Option<String>>,
    /// True while the sandbox waits unclaimed in a pool: no request can
    /// reach it, so a claimed sandbox is one nobody has used.
    pub pooled: AtomicBool,
    /// Unix ms of the last request that touched the sandbox.
    pub last_active: AtomicU64,
    /// Destroyed after this long without a request or a running command
    /// (ms; 0: never).
    pub idle_ms: AtomicU64,
    /// Foreground commands in flight.
    pub busy: std::sync::atomic::AtomicUsize,
    pub next_handle: AtomicU64,
    pub procs: Mutex<HashMap<u64, Arc<BgProcess>>>,
    pub fs: OnceLock<Arc<SandboxFs>>,
    stopping: AtomicBool,
    /// Fires when destroy has finished, for concurrent destroy calls.
    pub destroyed: Notify,
    pub done: AtomicBool,
    /// The host-wide lease on the uid range, released when the sandbox is
    /// dropped (the stub holds a copy while it lives, and a daemonless
    /// run's reaper one until it has recorded the end).
    pub lease: std::fs::File,
    /// OOM kills already recorded as events (the cgroup's count when last
    /// looked at).
    pub oom_seen: AtomicU64,
    /// The record's write lock while a pool claim's record is being
    /// committed (after the claim is answered). Whatever reads or changes
    /// the record first waits for it ([`Sandbox::settled`]), so it sees the
    /// claim and never overtakes it.
    pub record: Arc<tokio::sync::RwLock<()>>,
    /// The sandbox's prepared network namespace (egress other than `none`),
    /// taken back by destroy.
    pub net: Mutex<Option<crate::egress::Prepared>>,
    /// Its live egress state (policy, connections), shared with the proxy.
    pub egress: OnceLock<Arc<crate::egress::Attached>>,
    /// The template's working directory and user for commands that name none.
    pub exec_defaults: OnceLock<ExecDefaults>,
    /// Paths collected before teardown (`collect_artifacts`); a template
    /// may extend the list.
    pub artifacts: Mutex<Vec<String>>,
    /// Where the git workspace started, when the create asked for one.
    pub workspace: Mutex<Option<super::artifacts::WorkspaceStart>>,
    /// Held while artifacts are collected; true once they have been.
    pub collected: tokio::sync::Mutex<bool>,
    /// Its services, hooks and create-time secrets (set once at boot).
    lifecycle: OnceLock<Arc<super::Lifecycle>>,
    /// Its services as they run.
    pub services: Mutex<Vec<Arc<super::lifecycle::services::Service>>>,
    /// The uid its create-time file secrets belong to now.
    pub secret_owner: Mutex<Option<u32>>,
    /// Commands started through the API (each one an audit row), against
    /// [`EngineConfig::max_commands`](super::EngineConfig::max_commands).
    pub commands: AtomicU64,
    /// Bytes of argv and error text its audit rows have kept in full;
    /// past [`AUDIT_FULL_TEXT_BYTES`](super::audit::AUDIT_FULL_TEXT_BYTES),
    /// rows keep a short prefix.
    pub audit_text: AtomicU64,
    /// Set by the first destroy, before its `before_remove` hooks run;
    /// later ones (and the TTL and idle reaper) leave the sandbox to it.
    destroying: AtomicBool,
    /// The most its writable layers may hold (`limits.disk_bytes`).
    pub disk_limit: AtomicU64,
    /// An upper bound of what its writable layers hold: the last measure
    /// plus everything the filesystem grew by since (`engine::disk`).
    pub disk_bound: AtomicU64,
}

/// A command's working directory and uid when its request names none.
#[derive(Debug, Clone, Default)]
pub(crate) struct ExecDefaults {
    pub cwd: Option<String>,
    pub uid: Option<u32>,
}

impl Sandbox {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: SandboxId,
        uid_base: u32,
        init_pid: i32,
        expires_at: u64,
        conn: Arc<InitConn>,
        pidfd: AsyncFd<OwnedFd>,
        stub: StubHandle,
        cgroup: CgroupPlan,
        dir: PathBuf,
        env: Vec<(String, String)>,
        tenant: Option<String>,
        lease: std::fs::File,
    ) -> Self {
        Sandbox {
            id,
            uid_base,
            init_pid,
            expires_at: AtomicU64::new(expires_at),
            conn,
            pidfd,
            stub,
            cgroup,
            dir,
            env: RwLock::new(Arc::new(env)),
            pooled: AtomicBool::new(tenant.is_none()),
            last_active: AtomicU64::new(super::now_ms()),
            idle_ms: AtomicU64::new(0),
            busy: std::sync::atomic::AtomicUsize::new(0),
            tenant: RwLock::new(tenant),
            next_handle: AtomicU64::new(1),
            procs: Mutex::new(HashMap::new()),
            fs: OnceLock::new(),
            stopping: AtomicBool::new(false),
            destroyed: Notify::new(),
            done: AtomicBool::new(false),
            lease,
            oom_seen: AtomicU64::new(0),
            record: Arc::new(tokio::sync::RwLock::new(())),
            net: Mutex::new(None),
            egress: OnceLock::new(),
            exec_defaults: OnceLock::new(),
            artifacts: Mutex::new(Vec::new()),
            workspace: Mutex::new(None),
            collected: tokio::sync::Mutex::new(false),
            lifecycle: OnceLock::new(),
            services: Mutex::new(Vec::new()),
            secret_owner: Mutex::new(None),
            commands: AtomicU64::new(0),
            audit_text: AtomicU64::new(0),
            destroying: AtomicBool::new(false),
            disk_limit: AtomicU64::new(u64::MAX),
            disk_bound: AtomicU64::new(0),
        }
    }

    /// Its services, hooks and secrets; empty until boot sets them.
    pub fn lifecycle(&self) -> Arc<super::Lifecycle> {
        self.lifecycle.get().cloned().unwrap_or_default()
    }

    pub fn set_lifecycle(&self, l: Arc<super::Lifecycle>) {
        let _ = self.lifecycle.set(l);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Whether a destroy has begun (its hooks may still be running).
    pub fn is_destroying(&self) -> bool {
        self.destroying.load(Ordering::SeqCst)
    }

    /// Claims the sandbox's destroy; true for the one caller that gets it.
    pub fn begin_destroy(&self) -> bool {
        !self.destroying.swap(true, Ordering::SeqCst)
    }

    /// Waits (at most `limit`) for the destroy another caller is running
    /// to finish.
    pub async fn wait_destroyed(&self, limit: std::time::Duration) {
        let notified = self.destroyed.notified();
        if !self.done.load(Ordering::SeqCst) {
            let _ = tokio::time::timeout(limit, notified).await;
        }
    }

    /// Marks the sandbox stopping; true for the one caller that gets to stop it.
    pub fn begin_stop(&self) -> bool {
        !self.stopping.swap(true, Ordering::SeqCst)
    }

    /// The environment every command starts from.
    pub fn env(&self) -> Arc<Vec<(String, String)>> {
        self.env.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A request touched the sandbox now.
    pub fn touch(&self) {
        self.last_active.store(super::now_ms(), Ordering::Relaxed);
    }

    /// Whether nothing has touched the sandbox for its idle timeout and no
    /// command runs in it (foreground or background).
    pub fn is_idle(&self, now: u64) -> bool {
        let idle = self.idle_ms.load(Ordering::Relaxed);
        idle > 0
            && now.saturating_sub(self.last_active.load(Ordering::Relaxed)) >= idle
            && self.busy.load(Ordering::SeqCst) == 0
            && self
                .procs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .all(|p| p.status.borrow().is_some())
    }

    /// Waits until no claim record is being written for this sandbox.
    pub async fn settled(&self) {
        drop(self.record.read().await);
    }

    pub fn is_pooled(&self) -> bool {
        self.pooled.load(Ordering::SeqCst)
    }

    pub fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}

/// What a long-lived connection to a sandbox (a TCP forward, a WebSocket,
/// a streamed response) touches as its bytes flow, so that traffic, not
/// only requests, keeps the sandbox from idling out. Holds the sandbox
/// weakly: an open connection keeps its idle clock going, nothing else.
#[derive(Clone)]
pub struct SandboxActivity(std::sync::Weak<Sandbox>);

impl SandboxActivity {
    pub(crate) fn of(sb: &Arc<Sandbox>) -> Self {
        SandboxActivity(Arc::downgrade(sb))
    }

    /// Bytes went to or came from the sandbox just now.
    pub fn touch(&self) {
        if let Some(sb) = self.0.upgrade() {
            sb.touch();
        }
    }
}

impl std::fmt::Debug for SandboxActivity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.0.upgrade().map(|sb| sb.id.to_string());
        f.debug_tuple("SandboxActivity").field(&id).finish()
    }
}

/// Counts a foreground command in flight for as long as it lives.
pub(crate) struct Busy(Arc<Sandbox>);

impl Busy {
    pub fn new(sb: &Arc<Sandbox>) -> Busy {
        sb.busy.fetch_add(1, Ordering::SeqCst);
        Busy(sb.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}
