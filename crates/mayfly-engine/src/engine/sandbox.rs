//! A live sandbox as the engine holds it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
    /// The environment every command starts from.
    pub env: Vec<(String, String)>,
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
            env,
            next_handle: AtomicU64::new(1),
            procs: Mutex::new(HashMap::new()),
            fs: OnceLock::new(),
            stopping: AtomicBool::new(false),
            destroyed: Notify::new(),
            done: AtomicBool::new(false),
            lease,
            oom_seen: AtomicU64::new(0),
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Marks the sandbox stopping; true for the one caller that gets to stop it.
    pub fn begin_stop(&self) -> bool {
        !self.stopping.swap(true, Ordering::SeqCst)
    }

    pub fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}
