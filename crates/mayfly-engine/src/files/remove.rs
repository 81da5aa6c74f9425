//! Removal, including the recursive walk that never follows a symlink.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use mayfly_sys::fs::{self as sysfs, Access, FsError, Kind, Resolve};

use super::path::SandboxPath;
use super::{FilesError, SandboxFs};

/// Names read from a directory per batch during a recursive remove.
const BATCH: usize = 512;

pub(super) fn remove(fs: &SandboxFs, p: &SandboxPath, recursive: bool) -> Result<(), FilesError> {
    let (parent_rel, name) = p.split().ok_or(FilesError::RootRefused { op: "removed" })?;
    let parent = fs.dir_handle(&parent_rel, p)?;
    let name = Path::new(name);
    let st = sysfs::stat_at(&parent, name).map_err(|e| FilesError::fs(p, e))?;
    if st.kind != Kind::Dir {
        return sysfs::unlink_at(&parent, name, false).map_err(|e| FilesError::fs(p, e));
    }
    if !recursive {
        return sysfs::unlink_at(&parent, name, true).map_err(|e| FilesError::fs(p, e));
    }
    let budget = fs.limits.max_entries.saturating_mul(100);
    remove_tree(parent.as_fd(), name, fs.limits.max_depth, budget, p)
}

/// One directory being emptied: a descriptor of it, and its name in the
/// directory below it on the stack.
struct Frame {
    fd: OwnedFd,
    name: OsString,
}

/// Removes directory `name` below `parent` and everything in it.
///
/// Every step acts on a descriptor the walk holds: entries are removed with
/// `unlinkat`, which never follows a symlink, and a subdirectory is entered
/// only through a `RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV` open of one name.
/// If the sandbox swaps a directory for a symlink, the open fails and the
/// symlink itself is unlinked; if it moves a held directory elsewhere, the
/// walk keeps emptying that same directory, which is still inside the
/// sandbox. A mount point stops the walk with [`FilesError::MountPoint`].
///
/// The walk is iterative, holds one descriptor per level up to `max_depth`,
/// and gives up after `budget` steps, so a sandbox that keeps creating files
/// cannot pin a daemon thread forever. `shown` names the tree in errors.
pub(super) fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &Path,
    max_depth: usize,
    mut budget: u64,
    shown: &SandboxPath,
) -> Result<(), FilesError> {
    let too_many = FilesError::TooManyEntries {
        path: shown.to_string(),
        limit: budget,
    };
    let fail = |e: FsError| FilesError::fs(shown, e);
    let top = sysfs::open(parent, name, Access::DirHandle, Resolve::Child).map_err(fail)?;
    let mut stack = vec![Frame {
        fd: top,
        name: name.as_os_str().to_owned(),
    }];
    while let Some(frame) = stack.last() {
        budget = match budget.checked_sub(1) {
            Some(b) => b,
            None => return Err(too_many),
        };
        let batch = sysfs::list_dir(&frame.fd, BATCH, name).map_err(fail)?;
        if batch.entries.is_empty() {
            let Some(done) = stack.pop() else { break };
            let below = stack.last().map_or(parent, |f| f.fd.as_fd());
            match sysfs::unlink_at(below, Path::new(&done.name), true) {
                Ok(()) => {}
                Err(FsError::NotFound { .. }) => {}
                // Refilled behind our back: go round again.
                Err(FsError::NotEmpty { .. }) => {
                    let fd = sysfs::open(
                        below,
                        Path::new(&done.name),
                        Access::DirHandle,
                        Resolve::Child,
                    )
                    .map_err(fail)?;
                    stack.push(Frame {
                        fd,
                        name: done.name,
                    });
                }
                Err(e) => return Err(fail(e)),
            }
            continue;
        }
        let dir = frame.fd.as_fd();
        let mut descend = None;
        for entry in batch.entries {
            budget = budget.saturating_sub(1);
            let entry_name = Path::new(&entry.name);
            let st = match sysfs::stat_at(dir, entry_name) {
                Ok(st) => st,
                Err(FsError::NotFound { .. }) => continue,
                Err(e) => return Err(fail(e)),
            };
            if st.kind == Kind::Dir {
                match sysfs::open(dir, entry_name, Access::DirHandle, Resolve::Child) {
                    Ok(fd) => {
                        descend = Some(Frame {
                            fd,
                            name: entry.name,
                        });
                        break;
                    }
                    // Swapped for a symlink or a file since the stat: unlink it below.
                    Err(FsError::NotADirectory { .. } | FsError::SymlinkRefused { .. }) => {}
                    Err(FsError::NotFound { .. }) => continue,
                    Err(e) => return Err(fail(e)),
                }
            }
            match sysfs::unlink_at(dir, entry_name, false) {
                // A directory appeared under this name: the next batch sees it.
                Ok(()) | Err(FsError::NotFound { .. } | FsError::IsADirectory { .. }) => {}
                Err(e) => return Err(fail(e)),
            }
        }
        if let Some(child) = descend {
            if stack.len() >= max_depth {
                return Err(FilesError::TooDeep {
                    path: shown.to_string(),
                    limit: max_depth,
                });
            }
            stack.push(child);
        }
    }
    Ok(())
}
