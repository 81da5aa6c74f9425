//! Stubs: one small host-side process per sandbox, forked by the zygote
//! ahead of time and placed in the sandbox's cgroups while idle.
//!
//! Moving a process into a cgroup v1 hierarchy waits for an RCU grace period
//! (the cgroup threadgroup lock), which costs 1–20 ms on a loaded host. A
//! stub takes that cost before anyone asks for a sandbox; the init it later
//! clones is born in the right cgroups. The stub then stays as init's
//! parent: init's parent-death signal is tied to it, its own to the zygote,
//! so `kill -9` of the daemon still takes every sandbox down.

use std::os::fd::{AsFd, OwnedFd};

use mayfly_sys::{ipc, mount, process};

use super::channel::AsyncSeq;
use super::proto::{EarlyWork, SpawnPlan, StubReply};
use super::RuntimeError;

/// A freshly cloned init, as its stub hands it over.
pub struct Spawned {
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub ctl: OwnedFd,
}

/// The daemon's handle on one stub.
pub struct StubHandle {
    pub pid: i32,
    pub pidfd: OwnedFd,
    chan: AsyncSeq,
}

impl StubHandle {
    pub(super) fn new(pid: i32, pidfd: OwnedFd, sock: OwnedFd) -> Result<Self, RuntimeError> {
        Ok(StubHandle {
            pid,
            pidfd,
            chan: AsyncSeq::new(sock)?,
        })
    }

    /// Waits for the stub to report its namespaces made.
    pub(super) async fn wait_prepared(&self) -> Result<(), RuntimeError> {
        let (data, _) = self.chan.recv().await?;
        match serde_json::from_slice::<StubReply>(&data) {
            Ok(StubReply::Prepared) => Ok(()),
            Ok(StubReply::Failed { message }) => Err(RuntimeError::Setup(message)),
            _ => Err(RuntimeError::Protocol("expected Prepared".into())),
        }
    }

    /// Has the stub clone and set up the sandbox's init. The stub keeps a
    /// copy of `keep` (the uid slot's lease) open until it exits. With
    /// `net` (a prepared network namespace), init is born in that one
    /// instead of the stub's own.
    pub async fn spawn(
        &self,
        plan: &SpawnPlan,
        keep: std::os::fd::BorrowedFd<'_>,
        net: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Spawned, RuntimeError> {
        let req = serde_json::to_vec(plan).map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        match net {
            Some(ns) => self.chan.send(&req, &[keep, ns])?,
            None => self.chan.send(&req, &[keep])?,
        }
        self.spawned().await
    }

    /// Waits for the init the stub cloned: on request ([`StubHandle::spawn`])
    /// or, for a stub that was given its plan when forked, on its own.
    pub async fn spawned(&self) -> Result<Spawned, RuntimeError> {
        let (data, mut fds) = self.chan.recv().await?;
        match serde_json::from_slice::<StubReply>(&data) {
            Ok(StubReply::Spawned { pid }) if fds.len() == 2 => {
                let ctl = fds.pop().ok_or(RuntimeError::Closed)?;
                let pidfd = fds.pop().ok_or(RuntimeError::Closed)?;
                Ok(Spawned { pid, pidfd, ctl })
            }
            Ok(StubReply::Failed { message }) => Err(RuntimeError::Setup(message)),
            _ => Err(RuntimeError::Protocol("bad stub reply".into())),
        }
    }

    /// Kills the stub (and so, by its death signal, any init it cloned).
    pub fn kill(&self) {
        let _ = process::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
    }
}

/// The stub's life: make the sandbox's network, UTS and IPC namespaces,
/// wait for one plan, clone init, then wait for init to end and exit.
/// Never returns.
pub(super) fn stub_main(
    sock: OwnedFd,
    parent: i32,
    id: &str,
    join: &[std::path::PathBuf],
    mut work: Option<EarlyWork>,
) -> ! {
    if process::set_parent_death_signal(libc::SIGKILL).is_err()
        || std::os::unix::process::parent_id() as i32 != parent
    {
        process::exit_now(1);
    }
    process::set_title("mayfly-stub");
    // The zygote ignores SIGCHLD; this process must reap its init itself.
    process::reset_signals();
    // Made now, while nobody waits: a network namespace costs about a
    // millisecond. They belong to the host's user namespace, so the
    // sandbox's root cannot reconfigure them (no new interfaces, routes or
    // hostname from inside), and Mayfly can configure them from outside.
    let early = work.as_ref().map_or(Ok(()), early_work);
    let prepared = match early
        .and_then(|()| join_cgroups(join))
        .and_then(|()| prepare_namespaces(id, work.as_ref().and_then(|w| w.spare_ns.as_deref())))
    {
        Ok(()) => StubReply::Prepared,
        Err(message) => StubReply::Failed { message },
    };
    let failed = matches!(prepared, StubReply::Failed { .. });
    let sent = serde_json::to_vec(&prepared).map(|m| ipc::send(sock.as_fd(), &m, &[]));
    if failed || !matches!(sent, Ok(Ok(()))) {
        process::exit_now(1);
    }
    // What comes with the plan (the uid slot's lease) is held until this
    // process exits; init closes its inherited copies first thing. A
    // planned stub inherited its lease and keeps it the same way.
    let mut _kept = Vec::new();
    let reply = match work.as_mut().and_then(|w| w.plan.take()) {
        // Planned ahead: init is cloned at once.
        Some(plan) => spawn_init(&plan),
        None => {
            let mut buf = Vec::new();
            _kept = match ipc::recv(sock.as_fd(), &mut buf, false) {
                Ok(fds) => fds,
                Err(_) => process::exit_now(0),
            };
            match serde_json::from_slice::<SpawnPlan>(&buf) {
                // A second descriptor is a prepared network namespace: the
                // stub's own is left (and ends), so init is born wired.
                Ok(plan) => match _kept.get(1) {
                    Some(ns) => mayfly_sys::veth::join_net(ns.as_fd())
                        .map_err(|e| super::chain(&e))
                        .and_then(|()| spawn_init(&plan)),
                    None => spawn_init(&plan),
                },
                Err(e) => Err(format!("bad plan: {e}")),
            }
        }
    };
    match reply {
        Ok((pid, pidfd, ctl)) => {
            let sent = serde_json::to_vec(&StubReply::Spawned { pid })
                .map(|m| ipc::send(sock.as_fd(), &m, &[pidfd.as_fd(), ctl.as_fd()]));
            drop((pidfd, ctl, sock));
            if !matches!(sent, Ok(Ok(()))) {
                let _ = process::kill(pid, libc::SIGKILL);
            }
            process::wait_for(pid);
            process::exit_now(0)
        }
        Err(message) => {
            if let Ok(m) = serde_json::to_vec(&StubReply::Failed { message }) {
                let _ = ipc::send(sock.as_fd(), &m, &[]);
            }
            process::exit_now(1)
        }
    }
}

/// A one-shot engine's stub: its marker (before anything it names exists),
/// its cgroups, and its directories (with their owner, when planned). On
/// failure the engine removes whatever was made.
fn early_work(w: &EarlyWork) -> Result<(), String> {
    let err = |what: &dyn std::fmt::Display, e: &dyn std::fmt::Display| format!("{what}: {e}");
    for d in [w.marker.parent(), w.dir.parent()].into_iter().flatten() {
        std::fs::create_dir_all(d).map_err(|e| err(&d.display(), &e))?;
    }
    crate::engine::write_marker(&w.marker, &w.marker_text)
        .map_err(|e| err(&w.marker.display(), &e))?;
    mayfly_sys::cgroup::apply(&w.cgroup).map_err(|e| err(&"creating cgroups", &e))?;
    match &w.plan {
        None => crate::engine::make_stub_dirs(&w.dir),
        Some(plan) => crate::engine::prepare_dirs(plan, 0),
    }
    .map_err(|e| err(&w.dir.display(), &e))
}

/// Moves this (single-threaded) process into v1 cgroups by writing `0` to
/// each `tasks` file. Migrating only the calling thread skips the global
/// threadgroup lock that a `cgroup.procs` write takes, whose RCU sync stalls
/// every fork on the host for a grace period.
fn join_cgroups(tasks: &[std::path::PathBuf]) -> Result<(), String> {
    for t in tasks {
        std::fs::write(t, "0").map_err(|e| format!("joining {}: {e}", t.display()))?;
    }
    Ok(())
}

/// Network, UTS and IPC namespaces of the stub's own: ready-made ones from
/// `spare` if one is there (their `lo` is already up), else new ones.
fn prepare_namespaces(id: &str, spare: Option<&std::path::Path>) -> Result<(), String> {
    let s = |e: &dyn std::error::Error| super::chain(e);
    let joined = match spare {
        Some(dir) => mayfly_sys::spare_ns::claim(dir).map_err(|e| s(&e))?,
        None => 0,
    };
    if joined == 0 {
        process::unshare(process::STUB_NAMESPACES).map_err(|e| s(&e))?;
        mayfly_sys::net::loopback_up().map_err(|e| s(&e))?;
    }
    process::set_hostname(id).map_err(|e| s(&e))
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
