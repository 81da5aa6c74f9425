//! An async wrapper over a seqpacket socket, for the daemon's side.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use mayfly_sys::ipc::{self, IpcError};

use super::RuntimeError;

/// One seqpacket socket registered with the runtime's reactor. Receives are
/// non-blocking (`MSG_DONTWAIT`); sends block briefly, since every peer reads
/// promptly and messages are small.
pub struct AsyncSeq {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
}

impl AsyncSeq {
    pub fn new(fd: OwnedFd) -> Result<Self, RuntimeError> {
        Ok(AsyncSeq {
            fd: ipc::register_async(fd).map_err(|e| RuntimeError::Io {
                op: "registering a socket",
                source: e,
            })?,
        })
    }

    pub fn send(&self, data: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), RuntimeError> {
        ipc::send(self.fd.get_ref().as_fd(), data, fds).map_err(RuntimeError::Ipc)
    }

    pub async fn recv(&self) -> Result<(Vec<u8>, Vec<OwnedFd>), RuntimeError> {
        loop {
            let mut buf = Vec::new();
            let mut guard = self.fd.readable().await.map_err(|e| RuntimeError::Io {
                op: "waiting for a message",
                source: e,
            })?;
            match ipc::recv(self.fd.get_ref().as_fd(), &mut buf, true) {
                Ok(fds) => return Ok((buf, fds)),
                Err(e) if e.would_block() => guard.clear_ready(),
                Err(IpcError::Closed) => return Err(RuntimeError::Closed),
                Err(e) => return Err(RuntimeError::Ipc(e)),
            }
        }
    }
}
