//! The keeper's side: wait for a run and hand its claim over.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mayfly_sys::ipc;
use mayfly_types::{CreateRequest, ExecRequest, SandboxId};
use tokio::io::unix::AsyncFd;

use super::proto::{decode, encode, ToKeeper, ToRun};
use super::{socket_path, ExeId, ParkError, Slot, CLAIM_TIMEOUT, PROTO_VERSION};

/// A parked sandbox's listening socket.
pub struct Keeper {
    listener: AsyncFd<OwnedFd>,
    path: PathBuf,
    exe: ExeId,
    id: SandboxId,
    /// The spec the sandbox was made with, TTL left out.
    spec: CreateRequest,
    _slot: Slot,
}

/// What woke the keeper.
pub enum Next {
    /// A run has committed: serve it.
    Claim(Box<Claim>),
    /// Destroy the sandbox and exit. Holding the connection that asked (if
    /// any) until then tells the asker when it is done.
    Retire {
        why: &'static str,
        _asker: Option<OwnedFd>,
    },
}

/// A run's claim, committed: the command must run, and its result go back.
pub struct Claim {
    pub exec: ExecRequest,
    /// The TTL the run asked for, if any.
    pub ttl_secs: Option<u64>,
    /// The run's stdin (`--interactive`), read to its end.
    pub stdin: Option<Vec<u8>>,
    pub json: bool,
    /// The run's process (`SO_PEERCRED`), for the audit trail.
    pub pid: i32,
    pub stdio: Stdio,
    pub reply: Reply,
}

/// The run's stdout and stderr.
pub struct Stdio {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The connection to a run that has committed.
pub struct Reply {
    conn: AsyncFd<OwnedFd>,
}

impl Reply {
    /// Resolves when the run goes away (its process died): the command is
    /// then to be killed, as a cold run's sandbox dies with it.
    pub async fn hung_up(&self) {
        loop {
            let Ok(mut guard) = self.conn.readable().await else {
                return;
            };
            let mut buf = Vec::new();
            match ipc::recv(self.conn.get_ref().as_fd(), &mut buf, true) {
                Err(e) if e.would_block() => guard.clear_ready(),
                // The run sends nothing after `Go`: anything is a hang-up.
                _ => return,
            }
        }
    }

    /// Tells the run its exit code. Drop its [`Stdio`] first, so whatever
    /// reads its streams sees their end when the run exits.
    pub fn finish(self, code: i32) {
        let _ = ipc::send(
            self.conn.get_ref().as_fd(),
            &encode(&ToRun::Done { code }),
            &[],
        );
    }
}

fn strip_ttl(req: &CreateRequest) -> CreateRequest {
    CreateRequest {
        ttl_secs: None,
        ..req.clone()
    }
}

impl Keeper {
    /// Listens for runs in slot `slot` of `dir`, for the sandbox `id`
    /// made with `spec`. The socket appears (by rename) only once it is
    /// listening, so a run never finds a socket nobody will answer.
    pub fn bind(
        dir: &Path,
        slot: Slot,
        id: SandboxId,
        spec: &CreateRequest,
    ) -> Result<Keeper, ParkError> {
        let path = socket_path(dir, slot.index);
        let tmp = dir.join(format!(".keeper-{}.sock.new", slot.index));
        let _ = std::fs::remove_file(&tmp);
        let listener = ipc::seqpacket_listen(&tmp)?;
        std::fs::rename(&tmp, &path).map_err(|e| ParkError::io("renaming", &tmp, e))?;
        let listener =
            ipc::register_async(listener).map_err(|e| ParkError::io("polling", &path, e))?;
        Ok(Keeper {
            listener,
            path,
            exe: ExeId::current()?,
            id,
            spec: strip_ttl(spec),
            _slot: slot,
        })
    }

    /// Waits for the next run that commits, or for a reason to retire.
    /// Runs it cannot serve are refused and go cold.
    pub async fn next(&self) -> Result<Next, ParkError> {
        loop {
            let mut guard = self
                .listener
                .readable()
                .await
                .map_err(|e| ParkError::io("polling", &self.path, e))?;
            let conn = match ipc::accept(self.listener.get_ref().as_fd()) {
                Ok(c) => c,
                Err(e) if e.would_block() => {
                    guard.clear_ready();
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            drop(guard);
            if let Some(next) = self.serve(conn).await? {
                return Ok(next);
            }
        }
    }

    /// One connection: None when it came to nothing and the keeper waits on.
    async fn serve(&self, conn: OwnedFd) -> Result<Option<Next>, ParkError> {
        let Ok((0, pid)) = ipc::peer(conn.as_fd()) else {
            return Ok(None);
        };
        ipc::set_nonblocking(conn.as_fd())?;
        let conn =
            ipc::register_async(conn).map_err(|e| ParkError::io("polling", &self.path, e))?;
        let Some((msg, fds)) = recv_within(&conn, CLAIM_TIMEOUT).await else {
            return Ok(None);
        };
        let claim = match decode::<ToKeeper>(&msg) {
            Ok(ToKeeper::Claim(c)) => c,
            Ok(ToKeeper::Retire) => {
                return Ok(Some(Next::Retire {
                    why: "parked_pruned",
                    _asker: Some(conn.into_inner()),
                }))
            }
            _ => return Ok(None),
        };
        let refuse = |reason: &str| {
            let m = encode(&ToRun::Refused {
                reason: reason.to_owned(),
            });
            let _ = ipc::send(conn.get_ref().as_fd(), &m, &[]);
        };
        if claim.version != PROTO_VERSION || claim.exe != self.exe {
            // A run of another build: this keeper's binary is stale.
            refuse("another mayfly binary");
            return Ok(Some(Next::Retire {
                why: "parked_stale_binary",
                _asker: None,
            }));
        }
        let Ok::<[OwnedFd; 2], _>([stdout, stderr]) = fds.try_into() else {
            refuse("a claim carries two descriptors");
            return Ok(None);
        };
        if strip_ttl(&claim.create) != self.spec {
            refuse("another spec");
            return Ok(None);
        }
        let accepted = encode(&ToRun::Accepted {
            id: self.id.clone(),
        });
        if ipc::send(conn.get_ref().as_fd(), &accepted, &[]).is_err() {
            return Ok(None);
        }
        // Nothing runs until the run commits; one that gave up (it timed
        // out and went cold) never does, and the sandbox stays parked.
        let mut stdin = claim.interactive.then(Vec::new);
        loop {
            let Some((m, _)) = recv_within(&conn, CLAIM_TIMEOUT).await else {
                return Ok(None);
            };
            match (decode(&m), stdin.as_mut()) {
                (Ok(ToKeeper::Go), _) => break,
                (Ok(ToKeeper::Stdin(piece)), Some(buf))
                    if buf.len() + piece.0.len() <= super::MAX_STDIN =>
                {
                    buf.extend_from_slice(&piece.0)
                }
                _ => return Ok(None),
            }
        }
        // No later run may find the socket of a sandbox that is taken.
        let _ = std::fs::remove_file(&self.path);
        let claim = *claim;
        Ok(Some(Next::Claim(Box::new(Claim {
            ttl_secs: claim.create.ttl_secs,
            exec: claim.exec,
            stdin,
            json: claim.json,
            pid,
            stdio: Stdio { stdout, stderr },
            reply: Reply { conn },
        }))))
    }

    /// Removes the socket (on retiring), so no run tries it.
    pub fn close(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One message on a non-blocking connection, waiting at most `limit`.
async fn recv_within(conn: &AsyncFd<OwnedFd>, limit: Duration) -> Option<(Vec<u8>, Vec<OwnedFd>)> {
    let recv = async {
        loop {
            let mut guard = conn.readable().await.ok()?;
            let mut buf = Vec::new();
            match ipc::recv(conn.get_ref().as_fd(), &mut buf, true) {
                Ok(fds) => return Some((buf, fds)),
                Err(e) if e.would_block() => guard.clear_ready(),
                Err(_) => return None,
            }
        }
    };
    tokio::time::timeout(limit, recv).await.ok().flatten()
}
