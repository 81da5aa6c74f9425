//! The file API: read, write, list, stat, mkdir, remove, rename, and tar
//! upload and download, every path resolved inside the sandbox root.
//!
//! [`SandboxFs`] holds a descriptor of the sandbox's root (opened once from
//! `/proc/<init>/root`) and never touches a host path. The daemon is host
//! root and the sandbox is hostile, so the rules are:
//!
//! * Walks from the root use `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`:
//!   a planted `ln -s / x` resolves to the sandbox's own `/`, and
//!   `/proc/<pid>/root`-style magic links are refused by the kernel.
//! * Anything on procfs, sysfs, a cgroup filesystem and similar kernel
//!   interfaces is refused (`fstatfs`), since writing there as host root
//!   could reach the host.
//! * Reads open an `O_PATH` handle, check it is a regular file, and only then
//!   reopen it, so a FIFO never blocks and a device node is never opened.
//! * Recursive walks (remove, download, upload's staging) go one name at a
//!   time below held descriptors with `RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`:
//!   a symlink swapped in for a directory is never followed, and mounts are
//!   not crossed.
//! * Writes go to a temporary name in the same directory and are renamed
//!   over the target, so a reader never sees half a file. A symlink in the
//!   final component is replaced, never written through.
//! * Created objects belong to the sandbox (host uid `uid_base + uid`), and
//!   reported ids are translated back (ids outside the range show as 65534).
//!   On a filesystem the sandbox mounted itself (its `/tmp`, `/dev/shm` and
//!   `/run/secrets` tmpfs, owned by its user namespace), names are made with
//!   the filesystem ids of the sandbox's root, since the kernel refuses a
//!   creator it cannot map there (`SandboxFs::create`).
//!
//! Every method is synchronous and blocking; the engine calls them from
//! `spawn_blocking`. `SandboxFs` is `Send + Sync`: calls may run in parallel.

mod download;
mod error;
mod ops;
mod path;
mod remove;
pub(crate) mod tar_plan;
mod upload;

#[cfg(test)]
mod tests;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use mayfly_sys::fs::{self as sysfs, Access, Kind, Resolve, Stat};
use mayfly_types::{FileKind, FileStat, MAX_FILE_BYTES};

pub use error::FilesError;
pub use path::{MAX_PATH_BYTES, WORKDIR};

use crate::UploadSummary;
use path::SandboxPath;

/// How many host ids a sandbox's user namespace maps, from `uid_base`.
pub const ID_RANGE: u32 = 65536;
/// What ids outside the sandbox's range show as (`nobody`).
pub const OVERFLOW_ID: u32 = 65534;

/// Caps on what one call may move or walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsLimits {
    /// The largest single file read, written, uploaded or downloaded.
    pub max_file_bytes: u64,
    /// The most file data in one archive, uploaded or downloaded.
    pub max_archive_bytes: u64,
    /// The most entries in one archive, uploaded or downloaded, or in one
    /// directory listing.
    pub max_entries: u64,
    /// The deepest directory nesting a recursive walk enters. Each level
    /// holds a descriptor, so this also bounds descriptor use.
    pub max_depth: usize,
}

impl Default for FsLimits {
    fn default() -> Self {
        FsLimits {
            max_file_bytes: MAX_FILE_BYTES,
            max_archive_bytes: 1 << 30,
            max_entries: 100_000,
            max_depth: 128,
        }
    }
}

/// The file API of one sandbox, confined to its root descriptor.
#[derive(Debug)]
pub struct SandboxFs {
    root: OwnedFd,
    uid_base: u32,
    limits: FsLimits,
}

impl SandboxFs {
    /// Wraps `root`, a descriptor of the sandbox's `/` (an `O_PATH` handle is
    /// enough). Fails if it is not a directory.
    pub fn new(root: OwnedFd, uid_base: u32, limits: FsLimits) -> Result<Self, FilesError> {
        let st = sysfs::stat_fd(&root, Path::new("/")).map_err(|e| FilesError::fs("/", e))?;
        if st.kind != Kind::Dir {
            return Err(FilesError::NotADirectory { path: "/".into() });
        }
        Ok(SandboxFs {
            root,
            uid_base,
            limits,
        })
    }

    /// Opens the trusted host path `root` (such as `/proc/<init-pid>/root`)
    /// and wraps it. Open the root once, while the init pid is known to be
    /// the sandbox's, and keep the `SandboxFs`: the descriptor pins the
    /// sandbox's root even if the pid is later reused.
    pub fn open(root: &Path, uid_base: u32, limits: FsLimits) -> Result<Self, FilesError> {
        let fd = sysfs::open_host_dir(root).map_err(|e| FilesError::fs("/", e))?;
        SandboxFs::new(fd, uid_base, limits)
    }

    pub fn limits(&self) -> &FsLimits {
        &self.limits
    }

    /// Reads a whole regular file of at most `max_bytes` (and at most
    /// `max_file_bytes`). Symlinks are followed inside the sandbox.
    pub fn read(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, FilesError> {
        ops::read(self, &SandboxPath::parse(path)?, max_bytes)
    }

    /// Opens the regular file at `path` as [`SandboxFs::read`] does and
    /// hands `f` a reader of it (at most `max_bytes` plus one: more fails
    /// the read) and its size at the open.
    pub fn read_with<T>(
        &self,
        path: &str,
        max_bytes: u64,
        f: impl FnOnce(&mut dyn std::io::Read, u64) -> std::io::Result<T>,
    ) -> Result<T, FilesError> {
        ops::read_with(self, &SandboxPath::parse(path)?, max_bytes, f)
    }

    /// Replaces (or creates) the regular file at `path` with `data`,
    /// atomically, owned by `uid_inside`. The mode defaults to the replaced
    /// file's, else `0o644`; setuid and setgid bits are dropped.
    pub fn write(
        &self,
        path: &str,
        data: &[u8],
        mode: Option<u32>,
        uid_inside: u32,
    ) -> Result<FileStat, FilesError> {
        ops::write(self, &SandboxPath::parse(path)?, data, mode, uid_inside)
    }

    /// Describes `path` itself: a final symlink is reported, not followed.
    pub fn stat(&self, path: &str) -> Result<FileStat, FilesError> {
        ops::stat(self, &SandboxPath::parse(path)?)
    }

    /// The entries of directory `path`, sorted by name.
    pub fn list(&self, path: &str) -> Result<Vec<FileStat>, FilesError> {
        ops::list(self, &SandboxPath::parse(path)?)
    }

    /// Creates directory `path` (mode default `0o755`), with its missing
    /// parents if `parents`; with `parents`, an existing directory is fine.
    pub fn mkdir(
        &self,
        path: &str,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<FileStat, FilesError> {
        if let Some(mode) = mode.filter(|m| *m > 0o7777) {
            return Err(FilesError::BadMode { mode });
        }
        ops::mkdir(self, &SandboxPath::parse(path)?, parents, mode)
    }

    /// Removes `path` (a symlink itself, never its target); a non-empty
    /// directory only with `recursive`. `/` is refused.
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FilesError> {
        remove::remove(self, &SandboxPath::parse(path)?, recursive)
    }

    /// Renames `from` to `to`, never replacing an existing `to`.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), FilesError> {
        ops::rename(self, &SandboxPath::parse(from)?, &SandboxPath::parse(to)?)
    }

    /// Unpacks the tar archive `archive` into directory `dir` (created with
    /// its parents if missing), all or nothing: see the `upload` module.
    pub fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<UploadSummary, FilesError> {
        upload::upload(self, &SandboxPath::parse(dir)?, archive)
    }

    /// Packs `path` (a file, a directory tree, or a symlink as a symlink)
    /// into a tar archive named after its last component.
    pub fn download_tar(&self, path: &str) -> Result<Vec<u8>, FilesError> {
        download::download(self, &SandboxPath::parse(path)?)
    }

    /// [`SandboxFs::download_tar`] into `out`, under `limits` instead of
    /// this view's.
    pub fn download_tar_to<W: std::io::Write>(
        &self,
        path: &str,
        out: W,
        limits: FsLimits,
    ) -> Result<W, FilesError> {
        download::download_to(self, &SandboxPath::parse(path)?, out, limits)
    }

    /// Copies the regular file at `path` into `out`, at most `max_bytes`
    /// (a larger file fails with `TooLarge` before a byte is copied, and one
    /// that grows meanwhile is cut at the cap). A symlink in the final
    /// component is refused, never followed; earlier components resolve
    /// inside the sandbox. Returns the bytes copied.
    pub fn copy_file_to(
        &self,
        path: &str,
        out: &mut dyn std::io::Write,
        max_bytes: u64,
    ) -> Result<u64, FilesError> {
        ops::copy_file_to(self, &SandboxPath::parse(path)?, out, max_bytes)
    }

    /// An `O_PATH` handle of `p`, refused on kernel interface filesystems.
    fn handle(&self, p: &SandboxPath, resolve: Resolve) -> Result<OwnedFd, FilesError> {
        let fd = sysfs::open(&self.root, &p.rel(), Access::Handle, resolve)
            .map_err(|e| FilesError::fs(p, e))?;
        sysfs::check_filesystem(&fd, &p.rel()).map_err(|e| FilesError::fs(p, e))?;
        Ok(fd)
    }

    /// A handle of directory `rel` (relative to the root), refused on kernel
    /// interface filesystems; errors name `shown`.
    fn dir_handle(&self, rel: &Path, shown: &SandboxPath) -> Result<OwnedFd, FilesError> {
        let fd = sysfs::open(&self.root, rel, Access::DirHandle, Resolve::InRoot)
            .map_err(|e| FilesError::fs(shown, e))?;
        sysfs::check_filesystem(&fd, rel).map_err(|e| FilesError::fs(shown, e))?;
        Ok(fd)
    }

    /// The host uid and gid of inside id `inside`.
    /// Runs a call that makes a name (create, mkdir, symlink, link, rename
    /// to a new name). On a filesystem mounted inside the sandbox's user
    /// namespace (its `/tmp`, `/dev/shm`, `/run/secrets` tmpfs), which
    /// refuses (`EOVERFLOW`) a creator it cannot map, such as host root,
    /// the call is made again with the filesystem ids of the sandbox's root
    /// ([`sysfs::CreateAs`]); a refused call changed nothing. The caller
    /// sets the final owner either way.
    fn create<T>(
        &self,
        create: impl FnMut() -> Result<T, sysfs::FsError>,
    ) -> Result<T, sysfs::FsError> {
        sysfs::create_mapped(self.uid_base, self.uid_base, create)
    }

    fn host_ids(&self, inside: u32) -> Result<(u32, u32), FilesError> {
        if inside >= ID_RANGE {
            return Err(FilesError::BadOwner { uid: inside });
        }
        let host = self.uid_base + inside;
        Ok((host, host))
    }

    /// The inside id of host id `host`.
    fn inside_id(&self, host: u32) -> u32 {
        match host.checked_sub(self.uid_base) {
            Some(id) if id < ID_RANGE => id,
            _ => OVERFLOW_ID,
        }
    }

    fn file_stat(&self, name: String, st: &Stat, link_target: Option<String>) -> FileStat {
        FileStat {
            name,
            kind: match st.kind {
                Kind::File => FileKind::File,
                Kind::Dir => FileKind::Dir,
                Kind::Symlink => FileKind::Symlink,
                _ => FileKind::Other,
            },
            size: st.size,
            mode: st.perm,
            uid: self.inside_id(st.uid),
            gid: self.inside_id(st.gid),
            mtime_ms: st
                .mtime_sec
                .saturating_mul(1000)
                .saturating_add(st.mtime_nsec / 1_000_000),
            link_target,
        }
    }
}

/// A name no sandbox process is likely to hold, for temporary files and
/// staging directories: `.mf-<what>-<random>`. Creation uses `O_EXCL` or
/// `mkdirat`, so a collision fails instead of reusing someone's object.
fn temp_name(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes = nanos.to_le_bytes();
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(".mf-{what}-{:016x}{n:x}", u64::from_le_bytes(bytes))
}

/// Permission bits a client may set: no file type bits, no setuid/setgid.
fn clean_mode(mode: u32) -> u32 {
    mode & 0o7777 & !0o6000
}
