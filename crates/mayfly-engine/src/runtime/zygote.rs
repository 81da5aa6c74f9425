//! The zygote: a small single-threaded process, forked before the async
//! runtime starts, that clones every sandbox's init.
//!
//! Cloning from a multi-threaded daemon would leave the child with a copy of
//! one thread and whatever locks the others held; the zygote never has other
//! threads, so its children are whole. It also does the host-side half of
//! sandbox setup, which needs host root: writing the id maps, placing init in
//! its cgroup, and building the idmapped overlay mounts that init attaches.

use std::os::fd::{AsFd, OwnedFd};

use mayfly_sys::{ipc, mount, process};

use super::channel::AsyncSeq;
use super::proto::{SpawnPlan, ZygoteReply, ZygoteRequest};
use super::RuntimeError;

/// The daemon's handle on its zygote.
pub struct Zygote {
    chan: tokio::sync::Mutex<Option<AsyncSeq>>,
    sock: std::sync::Mutex<Option<OwnedFd>>,
    pub pid: i32,
}

/// A freshly cloned init, as the zygote hands it over.
pub struct Spawned {
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub ctl: OwnedFd,
}

impl Zygote {
    /// Forks the zygote.
    ///
    /// Call this before any other thread exists (before the tokio runtime
    /// is built): the zygote inherits a copy of the calling thread only.
    pub fn start() -> Result<Zygote, RuntimeError> {
        let (ours, theirs) = ipc::seqpacket_pair().map_err(RuntimeError::Ipc)?;
        let parent = std::process::id() as i32;
        // SAFETY: the caller guarantees the process is single-threaded.
        match unsafe { process::fork() }.map_err(RuntimeError::Process)? {
            process::Forked::Child => {
                drop(ours);
                zygote_main(theirs, parent)
            }
            process::Forked::Parent { pid } => {
                drop(theirs);
                Ok(Zygote {
                    chan: tokio::sync::Mutex::new(None),
                    sock: std::sync::Mutex::new(Some(ours)),
                    pid,
                })
            }
        }
    }

    /// Asks the zygote to clone an init for `plan`.
    pub async fn spawn(&self, plan: &SpawnPlan) -> Result<Spawned, RuntimeError> {
        let mut guard = self.chan.lock().await;
        if guard.is_none() {
            // The async wrapper is made lazily, inside the runtime.
            let sock = self
                .sock
                .lock()
                .map_err(|_| RuntimeError::ZygoteGone)?
                .take()
                .ok_or(RuntimeError::ZygoteGone)?;
            *guard = Some(AsyncSeq::new(sock)?);
        }
        let chan = guard.as_ref().ok_or(RuntimeError::ZygoteGone)?;
        let req = serde_json::to_vec(&ZygoteRequest::Spawn(Box::new(plan.clone())))
            .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        chan.send(&req, &[])?;
        let (data, mut fds) = chan.recv().await?;
        match serde_json::from_slice::<ZygoteReply>(&data) {
            Ok(ZygoteReply::Spawned { pid }) if fds.len() == 2 => {
                let ctl = fds.pop().ok_or(RuntimeError::ZygoteGone)?;
                let pidfd = fds.pop().ok_or(RuntimeError::ZygoteGone)?;
                Ok(Spawned { pid, pidfd, ctl })
            }
            Ok(ZygoteReply::Failed { message }) => Err(RuntimeError::Setup(message)),
            _ => Err(RuntimeError::Protocol("bad zygote reply".into())),
        }
    }
}

fn zygote_main(sock: OwnedFd, parent: i32) -> ! {
    if process::set_parent_death_signal(libc::SIGKILL).is_err()
        || std::os::unix::process::parent_id() as i32 != parent
    {
        process::exit_now(1);
    }
    // Inits are reaped by the kernel; the daemon watches them via pidfds.
    process::ignore_children();
    let mut buf = Vec::new();
    loop {
        if ipc::recv(sock.as_fd(), &mut buf, false).is_err() {
            process::exit_now(0);
        }
        let reply = match serde_json::from_slice::<ZygoteRequest>(&buf) {
            Ok(ZygoteRequest::Spawn(plan)) => spawn_init(&plan),
            Err(e) => Err(format!("bad request: {e}")),
        };
        let sent = match reply {
            Ok((pid, pidfd, ctl)) => serde_json::to_vec(&ZygoteReply::Spawned { pid })
                .map(|m| ipc::send(sock.as_fd(), &m, &[pidfd.as_fd(), ctl.as_fd()])),
            Err(message) => serde_json::to_vec(&ZygoteReply::Failed { message })
                .map(|m| ipc::send(sock.as_fd(), &m, &[])),
        };
        if !matches!(sent, Ok(Ok(()))) {
            process::exit_now(0);
        }
    }
}

fn spawn_init(plan: &SpawnPlan) -> Result<(i32, OwnedFd, OwnedFd), String> {
    let s = |e: &dyn std::error::Error| super::chain(e);
    let (ctl_daemon, ctl_init) = ipc::seqpacket_pair().map_err(|e| s(&e))?;
    let (setup_parent, setup_child) = ipc::seqpacket_pair().map_err(|e| s(&e))?;
    // SAFETY: the zygote is single-threaded.
    let forked = unsafe { process::clone_into_namespaces(process::SANDBOX_NAMESPACES) }
        .map_err(|e| s(&e))?;
    let (pid, pidfd) = match forked {
        (process::Forked::Child, _) => {
            drop(ctl_daemon);
            drop(setup_parent);
            super::init::run(plan, ctl_init, setup_child)
        }
        (process::Forked::Parent { pid }, Some(pidfd)) => (pid, pidfd),
        (process::Forked::Parent { .. }, None) => return Err("clone returned no pidfd".into()),
    };
    drop(ctl_init);
    drop(setup_child);
    let host_side = || -> Result<(), String> {
        process::write_id_maps(pid, plan.uid_base, plan.uid_count).map_err(|e| s(&e))?;
        // init should never be the OOM killer's pick: losing it loses the
        // sandbox. Lowering the score needs CAP_SYS_RESOURCE, which some
        // hosts withhold even from root; init is tiny, so the killer prefers
        // the process that actually grew, and this is only extra margin.
        let _ = process::write_proc(pid, "oom_score_adj", "-1000");
        for procs in &plan.cgroup_procs {
            std::fs::write(procs, pid.to_string())
                .map_err(|e| format!("adding init to {}: {e}", procs.display()))?;
        }
        let userns = std::fs::File::open(format!("/proc/{pid}/ns/user"))
            .map_err(|e| format!("opening the sandbox user namespace: {e}"))?;
        let mut mounts = Vec::with_capacity(plan.layers.len());
        for (layer, (upper, work)) in plan.layers.iter().zip(&plan.uppers) {
            let lowers = layer
                .lowers
                .iter()
                .map(|l| mount::idmapped_tree(l, userns.as_fd()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| s(&e))?;
            mounts.push(mount::overlay(&lowers, upper, work).map_err(|e| s(&e))?);
        }
        let borrowed: Vec<_> = mounts.iter().map(|m| m.as_fd()).collect();
        ipc::send(setup_parent.as_fd(), b"go", &borrowed).map_err(|e| s(&e))
    };
    if let Err(e) = host_side() {
        let _ = process::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        return Err(e);
    }
    Ok((pid, pidfd, ctl_daemon))
}
