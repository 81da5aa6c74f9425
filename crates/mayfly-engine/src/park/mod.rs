//! Parked sandboxes: a daemonless `mayfly run` served by a sandbox booted
//! before it asked.
//!
//! A daemonless run does all of a sandbox's bring-up on its critical path.
//! So, as the warm pools do for a daemon, the reaper of each such
//! run, once its own sandbox is gone, starts a *keeper*: a `mayflyd park`
//! process that boots one fresh sandbox with the default spec (through the
//! same early plan and create as a run) and waits for a run to claim it on
//! a root-only unix socket, `<state>/parked/keeper-<k>.sock`.
//!
//! A run that finds one sends its create and exec requests and its stdout
//! and stderr (`SCM_RIGHTS`; stdin, with `--interactive`, it has read to its
//! end first, as a cold run does, and sends as data). The keeper accepts only a request it
//! can serve as a cold run would (the same spec, ignoring the TTL, which it
//! applies; the same `mayflyd` build). The claim takes two steps, so a
//! command runs at most once: the keeper answers `Accepted`, the run
//! commits with `Go`, and only then does the command start. A run that gets
//! anything else, or nothing within [`CLAIM_TIMEOUT`], runs cold instead.
//! The keeper writes the command's output to the run's own streams, closes
//! them, sends the exit code, and destroys the sandbox as a run would
//! (through a reaper, which starts the next keeper).
//!
//! A parked sandbox is never reused: it serves one run. A keeper idle for
//! its idle time (10 minutes by default) destroys its sandbox and exits, as
//! it does when `mayfly prune` asks, or on SIGTERM. `kill -9` of a keeper
//! takes its sandbox's processes with it (each stub's parent-death signal),
//! and the next engine start's recovery removes the rest, as for any run.
//!
//! At most `target` keepers live per state directory: each holds the
//! `flock` of a slot file `keeper-<k>.lock` for its whole life.

mod claim;
mod keeper;
mod proto;

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use claim::{retire_all, try_claim, ClaimRequest, Claimed};
pub use keeper::{Claim, Keeper, Next, Reply, Stdio};

/// How long a run waits for a keeper's answer before it runs cold.
pub const CLAIM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The most stdin a run hands a keeper; a run with more runs cold.
pub const MAX_STDIN: usize = 1 << 30;

/// Stdin goes to a keeper in pieces this large (base64 in JSON, within
/// one packet).
const STDIN_CHUNK: usize = 128 * 1024;

/// The most keepers a state directory may have (the slots prune checks).
pub const MAX_KEEPERS: u32 = 8;

/// The protocol between a run and a keeper; both are the same binary
/// (checked by [`ExeId`]), so this only guards against surprises.
pub const PROTO_VERSION: u32 = 1;

/// A parked-sandbox failure.
#[derive(Debug, thiserror::Error)]
pub enum ParkError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to a keeper: {0}")]
    Ipc(#[from] mayfly_sys::ipc::IpcError),
    #[error("a keeper sent a message that does not parse: {0}")]
    Protocol(String),
    #[error("the keeper of the parked sandbox died while the command ran")]
    KeeperDied,
}

impl ParkError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        ParkError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What a daemonless run's reaper needs to start the next keeper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParkPlan {
    /// `<state>/parked`.
    pub dir: PathBuf,
    /// Keepers to keep per state directory (1..=[`MAX_KEEPERS`]).
    pub target: u32,
    /// The arguments of `/proc/self/exe` that make a keeper (the CLI's
    /// business; the engine only runs them).
    pub argv: Vec<OsString>,
}

/// The directory of a state directory's keepers.
pub fn park_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("parked")
}

fn socket_path(dir: &Path, slot: u32) -> PathBuf {
    dir.join(format!("keeper-{slot}.sock"))
}

fn lock_path(dir: &Path, slot: u32) -> PathBuf {
    dir.join(format!("keeper-{slot}.lock"))
}

/// Makes `dir` (root only: it holds the sockets a run hands its streams to).
pub fn prepare_dir(dir: &Path) -> Result<(), ParkError> {
    std::fs::create_dir_all(dir)
        .and_then(|()| {
            std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        })
        .map_err(|e| ParkError::io("preparing", dir, e))
}

/// A keeper slot, held (by `flock`) while its keeper lives.
pub struct Slot {
    pub index: u32,
    _lock: File,
}

/// Takes the first free slot of `target`; None when every one has a keeper.
pub fn take_slot(dir: &Path, target: u32) -> Result<Option<Slot>, ParkError> {
    for index in 0..target.min(MAX_KEEPERS) {
        let path = lock_path(dir, index);
        match mayfly_sys::process::try_lock_file(&path) {
            Ok(Some(lock)) => return Ok(Some(Slot { index, _lock: lock })),
            Ok(None) => continue,
            Err(e) => {
                return Err(ParkError::io(
                    "locking",
                    &path,
                    std::io::Error::other(e.to_string()),
                ))
            }
        }
    }
    Ok(None)
}

/// Whether a keeper could start now (a slot of `target` is free). The
/// keeper takes the slot itself; two racing starters leave one keeper.
pub fn has_free_slot(dir: &Path, target: u32) -> bool {
    matches!(take_slot(dir, target), Ok(Some(_)))
}

/// The environment variable that tells a keeper when the run whose reaper
/// started it ended (unix ms): a `mayfly prune` since then means the
/// keeper must not park (see [`pruned_since`]).
pub const AFTER_ENV: &str = "MAYFLY_PARK_AFTER";

/// Starts a keeper as `plan` says, detached (in the reaper's session;
/// standard streams on `/dev/null`; an empty environment but [`AFTER_ENV`];
/// in `/`), without waiting for it. Only when a slot is free.
pub fn spawn_keeper(plan: &ParkPlan, run_ended_at: u64) -> Result<bool, ParkError> {
    prepare_dir(&plan.dir)?;
    if plan.target == 0 || !has_free_slot(&plan.dir, plan.target) {
        return Ok(false);
    }
    let exe = Path::new("/proc/self/exe");
    std::process::Command::new(exe)
        .arg0("mayflyd")
        .args(&plan.argv)
        .env_clear()
        .env(AFTER_ENV, run_ended_at.to_string())
        // It may live for minutes: it holds no directory of the caller's.
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| ParkError::io("starting a keeper from", exe, e))?;
    Ok(true)
}

fn pruned_path(dir: &Path) -> PathBuf {
    dir.join("pruned-at")
}

/// Records that `mayfly prune` ran now (unix ms).
fn mark_pruned(dir: &Path, now: u64) -> Result<(), ParkError> {
    let tmp = dir.join(".pruned-at.new");
    std::fs::write(&tmp, now.to_string())
        .and_then(|()| std::fs::rename(&tmp, pruned_path(dir)))
        .map_err(|e| ParkError::io("writing", &tmp, e))
}

/// Whether `mayfly prune` ran at or after `t` (unix ms). A keeper started
/// by the reaper of a run that ended before a prune does not park: after
/// `mayfly prune` returns, no earlier run parks anything.
pub fn pruned_since(dir: &Path, t: u64) -> bool {
    std::fs::read_to_string(pruned_path(dir))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|p| p >= t)
}

/// Which engine binary (`mayflyd`) a process runs or would hand a run to: a
/// run and a keeper must be the same build (a rebuilt binary is a new inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExeId {
    pub dev: u64,
    pub ino: u64,
}

impl ExeId {
    /// This process's binary.
    pub fn current() -> Result<ExeId, ParkError> {
        ExeId::of(Path::new("/proc/self/exe"))
    }

    /// The binary at `path` (symlinks followed).
    pub fn of(path: &Path) -> Result<ExeId, ParkError> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).map_err(|e| ParkError::io("stat", path, e))?;
        Ok(ExeId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}
