//! `openat2(2)` with the resolution rules the file API needs.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

use super::error::{shown, FsError};

/// What an opened descriptor is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `O_PATH`: a handle for `*at` calls, `fstat` and `fstatfs`. Opening a
    /// handle never opens the object itself, so it is safe on FIFOs and
    /// device nodes.
    Handle,
    /// `O_PATH | O_DIRECTORY`: a handle that must be a directory.
    DirHandle,
    /// `O_RDONLY | O_DIRECTORY`: a directory to list, `fchmod` or `fchown`.
    /// `O_DIRECTORY` makes the open fail on anything but a directory, and
    /// opening a directory has no side effects.
    Dir,
}

/// How a path is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolve {
    /// `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`: the descriptor acts as `/`.
    /// Absolute symlinks and `..` are clamped to it; symlinks are followed in
    /// every component, magic links (`/proc/<pid>/root`, `/proc/<pid>/fd/N`)
    /// in none.
    InRoot,
    /// As [`Resolve::InRoot`], but a symlink in the final component is not
    /// followed (`O_NOFOLLOW`): a [`Access::Handle`] then refers to the link
    /// itself.
    InRootNoFollow,
    /// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV` with
    /// `O_NOFOLLOW`: a path below the descriptor with no symlink anywhere and
    /// no mount crossing. A [`Access::Handle`] on a final symlink refers to
    /// the link itself.
    Child,
}

impl Resolve {
    fn flags(self) -> (ResolveFlag, OFlag) {
        let in_root = ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS;
        match self {
            Resolve::InRoot => (in_root, OFlag::empty()),
            Resolve::InRootNoFollow => (in_root, OFlag::O_NOFOLLOW),
            Resolve::Child => (
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
                OFlag::O_NOFOLLOW,
            ),
        }
    }
}

/// `openat2` returns `EAGAIN` when a concurrent rename or mount anywhere on
/// the system could have raced a `..` lookup under `RESOLVE_IN_ROOT` or
/// `RESOLVE_BENEATH`; the kernel asks the caller to retry. A sandbox could
/// keep that going forever, so the retries are bounded.
const EAGAIN_RETRIES: usize = 128;

/// The kernel's way to reopen an `O_PATH` descriptor with real access modes:
/// the magic link always refers to the exact inode the descriptor pins.
const THREAD_SELF_FD: &str = "/proc/thread-self/fd";

/// Opens `path` relative to `dirfd` for `access`, resolved by `resolve`.
pub fn open(
    dirfd: impl AsFd,
    path: &Path,
    access: Access,
    resolve: Resolve,
) -> Result<OwnedFd, FsError> {
    let base = match access {
        Access::Handle => OFlag::O_PATH,
        Access::DirHandle => OFlag::O_PATH | OFlag::O_DIRECTORY,
        Access::Dir => OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NONBLOCK,
    };
    let (res, extra) = resolve.flags();
    let how = OpenHow::new()
        .flags(base | extra | OFlag::O_CLOEXEC)
        .resolve(res);
    openat2_retrying(dirfd.as_fd(), path, how, "open")
}

/// Opens a trusted host directory as an `O_PATH` handle, following magic
/// links: this is how the daemon gets a sandbox's root from
/// `/proc/<init-pid>/root`. Never call it with a path the sandbox controls.
pub fn open_host_dir(path: &Path) -> Result<OwnedFd, FsError> {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::from_errno(e, "open", shown(path)))
}

/// Creates a new regular file `name` below `dir` for writing. It fails if
/// anything already has that name, including a symlink (`O_EXCL` never
/// follows one). `mode` is subject to the umask; callers `fchmod` after.
pub fn create_file(dir: impl AsFd, name: &Path, mode: u32) -> Result<File, FsError> {
    let (res, extra) = Resolve::Child.flags();
    let how = OpenHow::new()
        .flags(
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_CLOEXEC
                | OFlag::O_NOCTTY
                | extra,
        )
        .mode(Mode::from_bits_truncate(mode))
        .resolve(res);
    openat2_retrying(dir.as_fd(), name, how, "create").map(File::from)
}

/// Reopens `handle` (any descriptor, typically `O_PATH`) for reading, if and
/// only if it is a regular file.
///
/// The type is checked on the handle, which pins the inode, so the sandbox
/// cannot swap in a FIFO or device node between the check and the open; the
/// reopen also uses `O_NONBLOCK | O_NOCTTY` as a second line. `path` is only
/// for error messages.
pub fn open_regular_for_read(handle: BorrowedFd<'_>, path: &Path) -> Result<File, FsError> {
    let st = fstat(handle).map_err(|e| FsError::from_errno(e, "stat", shown(path)))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(FsError::NotRegular { path: shown(path) });
    }
    let magic = format!("{THREAD_SELF_FD}/{}", handle.as_raw_fd());
    let file = nix::fcntl::open(
        magic.as_str(),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(File::from)
    .map_err(|e| FsError::from_errno(e, "reopen", shown(path)))?;
    // Belt and braces: if `/proc` were not the procfs we expect, the reopen
    // could name some other file. Only the very same inode is accepted.
    let again = fstat(file.as_fd()).map_err(|e| FsError::from_errno(e, "stat", shown(path)))?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        return Err(FsError::Os {
            op: "reopen",
            path: shown(path),
            errno: Errno::ESTALE,
        });
    }
    Ok(file)
}

fn openat2_retrying(
    dirfd: BorrowedFd<'_>,
    path: &Path,
    how: OpenHow,
    op: &'static str,
) -> Result<OwnedFd, FsError> {
    let mut tries = 0;
    loop {
        match nix::fcntl::openat2(dirfd, path, how) {
            Err(Errno::EAGAIN) if tries < EAGAIN_RETRIES => {
                tries += 1;
                // Past a few, let the renamer run rather than spin with it.
                if tries > 8 {
                    std::thread::yield_now();
                }
            }
            Err(Errno::EINTR) => {}
            other => return other.map_err(|e| FsError::from_errno(e, op, shown(path))),
        }
    }
}
