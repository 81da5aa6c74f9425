//! The run's side: find a parked sandbox and hand it the command; and
//! `mayfly prune`'s: retire every keeper.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mayfly_sys::ipc;
use mayfly_types::{CreateRequest, ExecRequest, SandboxId};

use super::proto::{decode, encode, ClaimMsg, ToKeeper, ToRun};
use super::{lock_path, ExeId, ParkError, MAX_KEEPERS, MAX_STDIN, PROTO_VERSION, STDIN_CHUNK};

/// What a run asks a keeper for.
pub struct ClaimRequest<'a> {
    pub create: &'a CreateRequest,
    pub exec: &'a ExecRequest,
    /// The run's stdin, read to its end (`--interactive`).
    pub stdin: Option<&'a [u8]>,
    pub json: bool,
    /// The run's stdout and stderr.
    pub stdio: [BorrowedFd<'a>; 2],
    /// The engine binary that would run the command cold (`mayflyd`): a
    /// keeper serves only a run of its own build.
    pub engine: ExeId,
}

/// A parked sandbox that has committed to run the command.
pub struct Claimed {
    pub id: SandboxId,
    conn: OwnedFd,
}

impl Claimed {
    /// Waits for the command to end; its output has then been written to
    /// the run's streams. Returns the exit code the run exits with.
    pub fn wait(self) -> Result<i32, ParkError> {
        ipc::set_recv_timeout(self.conn.as_fd(), Duration::ZERO)?;
        let mut buf = Vec::new();
        loop {
            match ipc::recv(self.conn.as_fd(), &mut buf, false) {
                Ok(_) => {}
                Err(ipc::IpcError::Closed) => return Err(ParkError::KeeperDied),
                Err(e) => return Err(e.into()),
            }
            if let ToRun::Done { code } = decode(&buf)? {
                return Ok(code);
            }
        }
    }
}

/// The keepers' sockets in `dir` (none if it does not exist).
fn sockets(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("keeper-") && n.ends_with(".sock"))
        })
        .collect();
    out.sort();
    out
}

/// Hands the run to a parked sandbox in `dir`, if one takes it. `Ok(None)`
/// means none did and nothing ran: the run goes cold.
pub fn try_claim(dir: &Path, req: &ClaimRequest<'_>) -> Result<Option<Claimed>, ParkError> {
    let socks = sockets(dir);
    if socks.is_empty() {
        return Ok(None);
    }
    let msg = encode(&ToKeeper::Claim(Box::new(ClaimMsg {
        version: PROTO_VERSION,
        exe: req.engine,
        create: req.create.clone(),
        exec: req.exec.clone(),
        interactive: req.stdin.is_some(),
        json: req.json,
    })));
    if msg.len() > ipc::MAX_MESSAGE || req.stdin.is_some_and(|b| b.len() > MAX_STDIN) {
        return Ok(None);
    }
    for path in socks {
        if let Some(claimed) = claim_one(&path, &msg, req) {
            return Ok(Some(claimed));
        }
    }
    Ok(None)
}

/// One keeper: `Claim`, then (on `Accepted`) the stdin and `Go`. None
/// whenever the keeper cannot have started the command (it starts only
/// after `Go` arrives).
fn claim_one(path: &Path, msg: &[u8], req: &ClaimRequest<'_>) -> Option<Claimed> {
    let conn = ipc::seqpacket_connect(path).ok()?;
    // Only root may serve a run: the socket is in a root-only directory,
    // and the peer is checked as well.
    if ipc::peer(conn.as_fd()).ok()?.0 != 0 {
        return None;
    }
    ipc::set_recv_timeout(conn.as_fd(), super::CLAIM_TIMEOUT).ok()?;
    ipc::send(conn.as_fd(), msg, &req.stdio).ok()?;
    let mut buf = Vec::new();
    ipc::recv(conn.as_fd(), &mut buf, false).ok()?;
    let ToRun::Accepted { id } = decode(&buf).ok()? else {
        return None;
    };
    for piece in req.stdin.unwrap_or_default().chunks(STDIN_CHUNK) {
        let m = encode(&ToKeeper::Stdin(piece.to_vec().into()));
        ipc::send(conn.as_fd(), &m, &[]).ok()?;
    }
    ipc::send(conn.as_fd(), &encode(&ToKeeper::Go), &[]).ok()?;
    Some(Claimed { id, conn })
}

/// Retires every keeper of `dir`: each destroys its sandbox and exits.
/// Keepers still booting are waited for and retired too, and keepers that
/// runs which ended before now are about to start will not park. Returns
/// how many were retired; fails if some keeper is still there after
/// `timeout`.
pub fn retire_all(dir: &Path, timeout: Duration) -> Result<usize, ParkError> {
    // Made if missing: a run's reaper may be about to start the first
    // keeper, which must find the mark.
    super::prepare_dir(dir)?;
    super::mark_pruned(dir, crate::engine::now_ms())?;
    let deadline = Instant::now() + timeout;
    let mut retired = 0;
    loop {
        for path in sockets(dir) {
            let Ok(conn) = ipc::seqpacket_connect(&path) else {
                // Nobody listens: a keeper that was killed left it.
                if slot_free(&path) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            };
            if ipc::send(conn.as_fd(), &encode(&ToKeeper::Retire), &[]).is_err() {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            ipc::set_recv_timeout(conn.as_fd(), left.max(Duration::from_millis(1)))?;
            let mut buf = Vec::new();
            // The keeper closes the connection once its sandbox is gone.
            while ipc::recv(conn.as_fd(), &mut buf, false).is_ok() {}
            retired += 1;
        }
        if (0..MAX_KEEPERS).all(|k| lock_free(&lock_path(dir, k))) {
            return Ok(retired);
        }
        if Instant::now() >= deadline {
            return Err(ParkError::io(
                "retiring the keepers of",
                dir,
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the slot a socket belongs to has no keeper.
fn slot_free(sock: &Path) -> bool {
    let Some(slot) = sock.file_name().and_then(|n| n.to_str()).and_then(|n| {
        n.strip_prefix("keeper-")?
            .strip_suffix(".sock")?
            .parse()
            .ok()
    }) else {
        return false;
    };
    lock_free(&lock_path(sock.parent().unwrap_or(Path::new(".")), slot))
}

/// Whether no keeper holds the slot lock at `path` (none was ever made
/// there, or its keeper has exited).
fn lock_free(path: &Path) -> bool {
    !path.exists() || matches!(mayfly_sys::process::try_lock_file(path), Ok(Some(_)))
}
