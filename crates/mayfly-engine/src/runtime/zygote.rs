//! The zygote: a small single-threaded process, forked before the async
//! runtime starts, that forks every sandbox's stub.
//!
//! Cloning from a multi-threaded daemon would leave the child with a copy of
//! one thread and whatever locks the others held; the zygote never has other
//! threads, so its children are whole. Each child is a [`stub`](super::stub):
//! it is placed in its sandbox's cgroups while idle, and later clones the
//! sandbox's init, which is then born inside those cgroups.

use std::os::fd::{AsFd, OwnedFd};

use mayfly_sys::cgroup::CgroupPlan;
use mayfly_sys::{ipc, process};
use mayfly_types::SandboxId;

use super::channel::AsyncSeq;
use super::proto::{EarlyWork, ReapPlan, ZygoteReply, ZygoteRequest};
use super::stub::{stub_main, StubHandle};
use super::RuntimeError;

/// The daemon's handle on its zygote.
pub struct Zygote {
    chan: tokio::sync::Mutex<Option<AsyncSeq>>,
    sock: std::sync::Mutex<Option<OwnedFd>>,
    pub pid: i32,
    /// The stub a one-shot engine forked as it started (see
    /// [`Zygote::start_one_shot`]), until the engine adopts it.
    early: std::sync::Mutex<Option<EarlyFork>>,
}

/// A one-shot engine's early stub: its sandbox's id and cgroups, and the
/// stub's pid, pidfd and socket.
pub(crate) struct EarlyFork {
    pub id: SandboxId,
    pub cgroup: CgroupPlan,
    /// Set when the stub was forked with its sandbox's plan.
    pub planned: Option<Planned>,
    stub: (i32, OwnedFd, OwnedFd),
}

/// A sandbox planned at a one-shot engine's start: its uid slot, leased
/// then, and its bring-up plan, which its stub was forked with.
pub(crate) struct Planned {
    pub slot: u32,
    pub lease: std::fs::File,
    pub plan: super::proto::SpawnPlan,
}

impl Zygote {
    /// Forks the zygote.
    ///
    /// Call this before any other thread exists (before the tokio runtime
    /// is built): the zygote inherits a copy of the calling thread only.
    ///
    /// A daemon's zygote compiles the seccomp filter and reads this binary
    /// ahead as it starts, so all its stubs inherit both.
    pub fn start() -> Result<Zygote, RuntimeError> {
        Self::start_with(true)
    }

    /// A one-shot engine's start: this process forks `early`'s stub (for
    /// the sandbox `id`, in `cgroup`) itself, as its first act, then the
    /// zygote (which then only forks the reaper). The engine takes the stub
    /// with [`Zygote::take_early`].
    pub(crate) fn start_one_shot(
        id: SandboxId,
        cgroup: CgroupPlan,
        early: EarlyWork,
        planned: Option<Planned>,
    ) -> Result<Zygote, RuntimeError> {
        let me = std::process::id() as i32;
        let (sid, join) = (early.id.clone(), early.join.clone());
        let stub = fork_stub(me, &sid, &join, Some(early)).map_err(RuntimeError::Setup)?;
        let zygote = Self::start_with(false)?;
        *zygote.early.lock().unwrap_or_else(|p| p.into_inner()) = Some(EarlyFork {
            id,
            cgroup,
            planned,
            stub,
        });
        Ok(zygote)
    }

    fn start_with(warm: bool) -> Result<Zygote, RuntimeError> {
        let (ours, theirs) = ipc::seqpacket_pair().map_err(RuntimeError::Ipc)?;
        let parent = std::process::id() as i32;
        // SAFETY: the caller guarantees the process is single-threaded.
        match unsafe { process::fork() }.map_err(RuntimeError::Process)? {
            process::Forked::Child => {
                drop(ours);
                zygote_main(theirs, parent, warm)
            }
            process::Forked::Parent { pid } => {
                drop(theirs);
                Ok(Zygote {
                    chan: tokio::sync::Mutex::new(None),
                    sock: std::sync::Mutex::new(Some(ours)),
                    pid,
                    early: std::sync::Mutex::new(None),
                })
            }
        }
    }

    /// Sends one request and waits for the answer, making the async
    /// wrapper of the socket on first use (inside the runtime).
    async fn ask(
        &self,
        req: &ZygoteRequest,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(ZygoteReply, Vec<OwnedFd>), RuntimeError> {
        let mut guard = self.chan.lock().await;
        if guard.is_none() {
            let sock = self
                .sock
                .lock()
                .map_err(|_| RuntimeError::ZygoteGone)?
                .take()
                .ok_or(RuntimeError::ZygoteGone)?;
            *guard = Some(AsyncSeq::new(sock)?);
        }
        let chan = guard.as_ref().ok_or(RuntimeError::ZygoteGone)?;
        let req = serde_json::to_vec(req).map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        chan.send(&req, fds)?;
        let (data, fds) = chan.recv().await?;
        let reply = serde_json::from_slice::<ZygoteReply>(&data)
            .map_err(|e| RuntimeError::Protocol(format!("bad zygote reply: {e}")))?;
        Ok((reply, fds))
    }

    /// Asks the zygote for a new stub for the future sandbox `id`, and waits
    /// until the stub has prepared its namespaces.
    pub async fn fork_stub(
        &self,
        id: &str,
        join: &[std::path::PathBuf],
    ) -> Result<StubHandle, RuntimeError> {
        let req = ZygoteRequest::ForkStub {
            id: id.to_owned(),
            join: join.to_vec(),
        };
        match self.ask(&req, &[]).await? {
            (ZygoteReply::Forked { pid }, mut fds) if fds.len() == 2 => {
                let sock = fds.pop().ok_or(RuntimeError::ZygoteGone)?;
                let pidfd = fds.pop().ok_or(RuntimeError::ZygoteGone)?;
                let stub = StubHandle::new(pid, pidfd, sock)?;
                stub.wait_prepared().await?;
                Ok(stub)
            }
            (ZygoteReply::Failed { message }, _) => Err(RuntimeError::Setup(message)),
            _ => Err(RuntimeError::Protocol("bad zygote reply".into())),
        }
    }

    /// The stub forked at start, once: None if there is none or it was
    /// taken.
    pub(crate) fn take_early(&self) -> Option<EarlyFork> {
        self.early.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Has the zygote fork a detached reaper for a sandbox; returns the
    /// reaper's pid. The reaper outlives this process.
    pub async fn fork_reaper(
        &self,
        plan: &ReapPlan,
        init_pidfd: std::os::fd::BorrowedFd<'_>,
        stub_pidfd: std::os::fd::BorrowedFd<'_>,
        go: std::os::fd::BorrowedFd<'_>,
        lease: std::os::fd::BorrowedFd<'_>,
    ) -> Result<i32, RuntimeError> {
        let req = ZygoteRequest::Reap {
            plan: Box::new(plan.clone()),
        };
        match self.ask(&req, &[init_pidfd, stub_pidfd, go, lease]).await? {
            (ZygoteReply::Detached { pid }, _) => Ok(pid),
            (ZygoteReply::Failed { message }, _) => Err(RuntimeError::Setup(message)),
            _ => Err(RuntimeError::Protocol("bad zygote reply".into())),
        }
    }
}

impl EarlyFork {
    /// The early stub, once it has done its work and prepared its
    /// namespaces. Call inside the runtime.
    pub(crate) async fn prepared(self) -> Result<StubHandle, RuntimeError> {
        let (pid, pidfd, sock) = self.stub;
        let stub = StubHandle::new(pid, pidfd, sock)?;
        stub.wait_prepared().await?;
        Ok(stub)
    }
}

fn zygote_main(sock: OwnedFd, parent: i32, warm: bool) -> ! {
    if process::set_parent_death_signal(libc::SIGKILL).is_err()
        || std::os::unix::process::parent_id() as i32 != parent
    {
        process::exit_now(1);
    }
    process::set_title("mayfly-zygote");
    // Nothing the zygote forks (stubs, inits, reapers) may hold the
    // caller's descriptors: not its terminal or the pipes a caller reads to
    // their end (`out=$(mayfly run …)` would wait for the sandbox's
    // teardown), nor anything it inherited from its own parent.
    process::stdio_to_dev_null();
    {
        use std::os::fd::AsRawFd;
        process::close_fds_except(3, &[sock.as_raw_fd()]);
    }
    // A daemon's zygote: everything it forks shares the warm-up.
    if warm {
        warm_up();
    }
    let mut read_ahead = warm;
    let me = std::process::id() as i32;
    // Stubs, and inits orphaned when their stub dies first, are reaped by
    // the kernel at once (SIGCHLD ignored, and this process is their
    // subreaper rather than the host's pid 1); the daemon watches them
    // through pidfds.
    let _ = process::set_child_subreaper();
    process::ignore_children();
    let mut buf = Vec::new();
    loop {
        let Ok(fds) = ipc::recv(sock.as_fd(), &mut buf, false) else {
            process::exit_now(0);
        };
        let sent = match serde_json::from_slice::<ZygoteRequest>(&buf) {
            Ok(ZygoteRequest::ForkStub { id, join }) => {
                forked(sock.as_fd(), fork_stub(me, &id, &join, None))
            }
            Ok(ZygoteRequest::Reap { plan }) => match fork_reaper(*plan, fds) {
                Ok(pid) => serde_json::to_vec(&ZygoteReply::Detached { pid })
                    .map(|m| ipc::send(sock.as_fd(), &m, &[])),
                Err(message) => failed(sock.as_fd(), message),
            },
            Err(e) => failed(sock.as_fd(), format!("bad request: {e}")),
        };
        if !matches!(sent, Ok(Ok(()))) {
            process::exit_now(0);
        }
        if !read_ahead {
            // Idle now: only the read-ahead is still worth doing.
            let _ = mayfly_sys::image::readahead_own_image();
            read_ahead = true;
        }
    }
}

/// Done once, before a daemon's zygote forks anything.
fn warm_up() {
    // Compiled here, so every stub and init inherits it; an init reports a
    // failure to compile as its setup error.
    let _ = super::compiled_filter();
    // Stubs and inits run this binary's code inside sandbox cgroups; cached
    // now, its pages are charged here and not to a sandbox (see
    // `mayfly_sys::image`). Only an optimisation, so a failure is ignored.
    let _ = mayfly_sys::image::readahead_own_image();
}

type Sent = Result<Result<(), ipc::IpcError>, serde_json::Error>;

/// Answers a stub request: the stub's pid, pidfd and socket, or why not.
fn forked(
    sock: std::os::fd::BorrowedFd<'_>,
    stub: Result<(i32, OwnedFd, OwnedFd), String>,
) -> Sent {
    match stub {
        Ok((pid, pidfd, stub_sock)) => serde_json::to_vec(&ZygoteReply::Forked { pid })
            .map(|m| ipc::send(sock, &m, &[pidfd.as_fd(), stub_sock.as_fd()])),
        Err(message) => failed(sock, message),
    }
}

fn failed(sock: std::os::fd::BorrowedFd<'_>, message: String) -> Sent {
    serde_json::to_vec(&ZygoteReply::Failed { message }).map(|m| ipc::send(sock, &m, &[]))
}

/// Forks a reaper: a new session, no parent-death signal (a fork clears
/// it), its standard streams on `/dev/null` so it never holds a pipe the
/// requester's caller reads to its end, and no descriptor but the two pidfds.
fn fork_reaper(plan: ReapPlan, mut fds: Vec<OwnedFd>) -> Result<i32, String> {
    if fds.len() != 4 {
        return Err(format!(
            "a reap request carries 4 descriptors, not {}",
            fds.len()
        ));
    }
    let lease = fds.pop().ok_or("no uid slot lease")?;
    let go = fds.pop().ok_or("no hand-over pipe")?;
    let stub = fds.pop().ok_or("no stub pidfd")?;
    let init = fds.pop().ok_or("no init pidfd")?;
    // SAFETY: the zygote is single-threaded.
    match unsafe { process::fork() }.map_err(|e| super::chain(&e))? {
        process::Forked::Child => {
            use std::os::fd::AsRawFd;
            let _ = process::setsid();
            process::reset_signals();
            process::stdio_to_dev_null();
            let keep = [
                init.as_raw_fd(),
                stub.as_raw_fd(),
                go.as_raw_fd(),
                lease.as_raw_fd(),
            ];
            process::close_fds_except(3, &keep);
            crate::engine::reaper::reaper_main(plan, init, stub, go, lease)
        }
        process::Forked::Parent { pid } => Ok(pid),
    }
}

/// Forks a stub, from the zygote (`work` None) or, for a one-shot engine,
/// from the engine's own process before it has any other thread (`me` is
/// the forking process).
fn fork_stub(
    me: i32,
    id: &str,
    join: &[std::path::PathBuf],
    work: Option<EarlyWork>,
) -> Result<(i32, OwnedFd, OwnedFd), String> {
    let (ours, theirs) = ipc::seqpacket_pair().map_err(|e| super::chain(&e))?;
    // SAFETY: the caller is single-threaded (the zygote, or a one-shot
    // engine before its runtime exists). Namespace flags 0: a plain fork
    // that also hands back a pidfd atomically.
    match unsafe { process::clone_into_namespaces(0) }.map_err(|e| super::chain(&e))? {
        (process::Forked::Child, _) => {
            use std::os::fd::AsRawFd;
            drop(ours);
            // Nothing of the caller's: not its terminal or pipes (the
            // zygote's are already /dev/null), not the forker's socket, only
            // the uid slot's lease of a planned sandbox.
            process::stdio_to_dev_null();
            let mut keep = vec![theirs.as_raw_fd()];
            keep.extend(work.as_ref().and_then(|w| w.lease_fd));
            process::close_fds_except(3, &keep);
            stub_main(theirs, me, id, join, work)
        }
        (process::Forked::Parent { pid }, Some(pidfd)) => Ok((pid, pidfd, ours)),
        (process::Forked::Parent { .. }, None) => Err("clone returned no pidfd".into()),
    }
}
