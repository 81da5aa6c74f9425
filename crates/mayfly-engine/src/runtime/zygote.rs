//! The zygote: a small single-threaded process, forked before the async
//! runtime starts, that forks every sandbox's stub.
//!
//! Cloning from a multi-threaded daemon would leave the child with a copy of
//! one thread and whatever locks the others held; the zygote never has other
//! threads, so its children are whole. Each child is a [`stub`](super::stub):
//! it is placed in its sandbox's cgroups while idle, and later clones the
//! sandbox's init, which is then born inside those cgroups.

use std::os::fd::{AsFd, OwnedFd};

use mayfly_sys::{ipc, process};

use super::channel::AsyncSeq;
use super::proto::{ZygoteReply, ZygoteRequest};
use super::stub::{stub_main, StubHandle};
use super::RuntimeError;

/// The daemon's handle on its zygote.
pub struct Zygote {
    chan: tokio::sync::Mutex<Option<AsyncSeq>>,
    sock: std::sync::Mutex<Option<OwnedFd>>,
    pub pid: i32,
}

impl Zygote {
    /// Forks the zygote.
    ///
    /// Call this before any other thread exists (before the tokio runtime
    /// is built): the zygote inherits a copy of the calling thread only.
    pub fn start() -> Result<Zygote, RuntimeError> {
        // Compiled here, before the fork, so every init inherits it.
        super::compiled_filter().map_err(RuntimeError::Setup)?;
        // Stubs and inits run this binary's code inside sandbox cgroups;
        // cached now, its pages are charged here and not to a sandbox (see
        // `mayfly_sys::image`). Only an optimisation, so a failure is logged.
        if let Err(e) = mayfly_sys::image::readahead_own_image() {
            tracing::debug!(error = %e, "reading the executable ahead failed");
        }
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

    /// Asks the zygote for a new stub for the future sandbox `id`, and waits
    /// until the stub has prepared its namespaces.
    pub async fn fork_stub(
        &self,
        id: &str,
        join: &[std::path::PathBuf],
    ) -> Result<StubHandle, RuntimeError> {
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
        let req = serde_json::to_vec(&ZygoteRequest::ForkStub {
            id: id.to_owned(),
            join: join.to_vec(),
        })
        .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        chan.send(&req, &[])?;
        let (data, mut fds) = chan.recv().await?;
        match serde_json::from_slice::<ZygoteReply>(&data) {
            Ok(ZygoteReply::Forked { pid }) if fds.len() == 2 => {
                let sock = fds.pop().ok_or(RuntimeError::ZygoteGone)?;
                let pidfd = fds.pop().ok_or(RuntimeError::ZygoteGone)?;
                drop(guard);
                let stub = StubHandle::new(pid, pidfd, sock)?;
                stub.wait_prepared().await?;
                Ok(stub)
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
    process::wipe_cmdline_and_environ("mayfly-zygote");
    // Stubs, and inits orphaned when their stub dies first, are reaped by
    // the kernel at once (SIGCHLD ignored, and this process is their
    // subreaper rather than the host's pid 1); the daemon watches them
    // through pidfds.
    let _ = process::set_child_subreaper();
    process::ignore_children();
    let mut buf = Vec::new();
    loop {
        if ipc::recv(sock.as_fd(), &mut buf, false).is_err() {
            process::exit_now(0);
        }
        let reply = match serde_json::from_slice::<ZygoteRequest>(&buf) {
            Ok(ZygoteRequest::ForkStub { id, join }) => fork_stub(&id, &join),
            Err(e) => Err(format!("bad request: {e}")),
        };
        let sent = match reply {
            Ok((pid, pidfd, stub_sock)) => serde_json::to_vec(&ZygoteReply::Forked { pid })
                .map(|m| ipc::send(sock.as_fd(), &m, &[pidfd.as_fd(), stub_sock.as_fd()])),
            Err(message) => serde_json::to_vec(&ZygoteReply::Failed { message })
                .map(|m| ipc::send(sock.as_fd(), &m, &[])),
        };
        if !matches!(sent, Ok(Ok(()))) {
            process::exit_now(0);
        }
    }
}

fn fork_stub(id: &str, join: &[std::path::PathBuf]) -> Result<(i32, OwnedFd, OwnedFd), String> {
    let (ours, theirs) = ipc::seqpacket_pair().map_err(|e| super::chain(&e))?;
    let me = std::process::id() as i32;
    // SAFETY: the zygote is single-threaded. Namespace flags 0: a plain fork
    // that also hands back a pidfd atomically.
    match unsafe { process::clone_into_namespaces(0) }.map_err(|e| super::chain(&e))? {
        (process::Forked::Child, _) => {
            drop(ours);
            stub_main(theirs, me, id, join)
        }
        (process::Forked::Parent { pid }, Some(pidfd)) => Ok((pid, pidfd, ours)),
        (process::Forked::Parent { .. }, None) => Err("clone returned no pidfd".into()),
    }
}
