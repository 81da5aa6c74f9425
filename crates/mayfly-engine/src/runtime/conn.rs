//! The daemon's side of one init's control socket.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::channel::AsyncSeq;
use super::proto::{InitEvent, InitRequest, SpawnCommand};
use super::RuntimeError;

/// How a command ended, as init saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// Why a command did not start: the errno and the stage that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnFailure {
    pub errno: i32,
    pub stage: String,
}

#[derive(Default)]
struct Waiter {
    spawned: Option<oneshot::Sender<Result<i32, SpawnFailure>>>,
    exited: Option<oneshot::Sender<ExitInfo>>,
}

pub struct InitConn {
    chan: AsyncSeq,
    waiters: Mutex<HashMap<u64, Waiter>>,
    /// Set when the channel has closed (init is gone), before any waiter
    /// is dropped.
    closed: std::sync::atomic::AtomicBool,
}

impl InitConn {
    pub fn new(ctl: OwnedFd) -> Result<Arc<Self>, RuntimeError> {
        Ok(Arc::new(InitConn {
            chan: AsyncSeq::new(ctl)?,
            waiters: Mutex::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Waits for init's first message: ready, or why setup failed.
    pub async fn wait_ready(&self) -> Result<(), RuntimeError> {
        let (data, _) = self.chan.recv().await?;
        match serde_json::from_slice::<InitEvent>(&data) {
            Ok(InitEvent::Ready) => Ok(()),
            Ok(InitEvent::SetupFailed { message }) => Err(RuntimeError::Setup(message)),
            _ => Err(RuntimeError::Protocol("expected Ready".into())),
        }
    }

    /// Whether init's channel has closed: a command whose exit was never
    /// reported ended because init (and with it the sandbox) went away.
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Dispatches init's events until the channel closes. When it returns,
    /// every waiter has been dropped, so pending calls fail instead of hanging.
    pub async fn run_reader(self: Arc<Self>) {
        while let Ok((data, _)) = self.chan.recv().await {
            let Ok(ev) = serde_json::from_slice::<InitEvent>(&data) else {
                continue;
            };
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            match ev {
                InitEvent::Spawned { handle, pid } => {
                    if let Some(tx) = w.get_mut(&handle).and_then(|x| x.spawned.take()) {
                        let _ = tx.send(Ok(pid));
                    }
                }
                InitEvent::SpawnFailed {
                    handle,
                    errno,
                    stage,
                } => {
                    if let Some(mut x) = w.remove(&handle) {
                        if let Some(tx) = x.spawned.take() {
                            let _ = tx.send(Err(SpawnFailure { errno, stage }));
                        }
                    }
                }
                InitEvent::Exited {
                    handle,
                    code,
                    signal,
                } => {
                    if let Some(mut x) = w.remove(&handle) {
                        if let Some(tx) = x.exited.take() {
                            let _ = tx.send(ExitInfo { code, signal });
                        }
                    }
                }
                InitEvent::Ready | InitEvent::SetupFailed { .. } => {}
            }
        }
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Starts a command with `stdio` as its stdin, stdout and stderr. Returns
    /// its pid inside the sandbox and a receiver for its exit.
    pub async fn spawn(
        &self,
        cmd: SpawnCommand,
        stdio: [OwnedFd; 3],
    ) -> Result<Result<(i32, oneshot::Receiver<ExitInfo>), SpawnFailure>, RuntimeError> {
        let (stx, srx) = oneshot::channel();
        let (etx, erx) = oneshot::channel();
        let handle = cmd.handle;
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                handle,
                Waiter {
                    spawned: Some(stx),
                    exited: Some(etx),
                },
            );
        let msg = serde_json::to_vec(&InitRequest::Spawn(Box::new(cmd)))
            .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        let fds = [stdio[0].as_fd(), stdio[1].as_fd(), stdio[2].as_fd()];
        if let Err(e) = self.chan.send(&msg, &fds) {
            self.forget(handle);
            return Err(e);
        }
        // Our copies of the child's ends must close so EOF can arrive.
        drop(stdio);
        match srx.await {
            Ok(Ok(pid)) => Ok(Ok((pid, erx))),
            Ok(Err(f)) => Ok(Err(f)),
            Err(_) => Err(RuntimeError::Closed),
        }
    }

    fn forget(&self, handle: u64) {
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle);
    }

    /// Signals a command, or its whole session.
    pub fn signal(&self, handle: u64, signal: i32, tree: bool) -> Result<(), RuntimeError> {
        let msg = serde_json::to_vec(&InitRequest::Signal {
            handle,
            signal,
            tree,
        })
        .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        self.chan.send(&msg, &[])
    }
}
