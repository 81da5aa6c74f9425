//! Disk usage of a directory tree the sandbox controls.
//!
//! A sandbox's upper layer is written by the sandbox: it can hold symlinks
//! to `/`, directories swapped for symlinks while we walk, millions of empty
//! files, FIFOs and device nodes, or a chain of directories thousands deep.
//! The walk therefore never resolves a path: every step is relative to an
//! open directory descriptor, every `stat` is `fstatat(AT_SYMLINK_NOFOLLOW)`,
//! a directory is entered only by `openat(O_DIRECTORY | O_NOFOLLOW)` and only
//! if the descriptor opened is the inode just stat'ed (a swap in between is
//! skipped), nothing but a directory is ever opened (a FIFO would block),
//! and no other filesystem is entered. It is bounded in entries, depth (and
//! so in open descriptors) and time, and says when a bound cut it short.
//! Sizes are allocated blocks (`st_blocks * 512`), each hard-linked inode
//! counted once, as `du` reports them.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// Bounds on one walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkLimits {
    /// Entries stat'ed, across the whole walk.
    pub max_entries: u64,
    /// Directory levels below the root; also bounds the descriptors held
    /// open at once (one per level).
    pub max_depth: usize,
    /// Wall-clock time.
    pub max_time: Duration,
}

impl Default for WalkLimits {
    fn default() -> Self {
        WalkLimits {
            max_entries: 250_000,
            max_depth: 128,
            max_time: Duration::from_secs(1),
        }
    }
}

/// The bytes in use on the filesystem that holds `path` (`statvfs`: its
/// blocks less its free blocks): cheap to read, so a watcher can tell
/// whether anything was written since it last looked.
pub fn filesystem_used(path: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    let blocks = st.blocks().saturating_sub(st.blocks_free());
    Ok(blocks.saturating_mul(st.fragment_size()))
}

/// What a walk counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Allocated bytes, each inode once.
    pub bytes: u64,
    /// Entries counted, the root included.
    pub entries: u64,
    /// A bound stopped the walk: the figures are a lower bound.
    pub truncated: bool,
}

/// Why a walk could not start. Once it has, entries that vanish or change
/// under it are skipped rather than reported.
#[derive(Debug, thiserror::Error)]
pub enum DuError {
    #[error("cannot open the directory {path} without following links")]
    OpenRoot {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot list the directory {path}")]
    ListRoot {
        path: PathBuf,
        #[source]
        source: Errno,
    },
}

/// One directory being walked: its descriptor, the names still to visit
/// (listed when it was opened), and its depth below the root.
struct Level {
    dir: Dir,
    names: Vec<OsString>,
    depth: usize,
}

/// Adds up the disk used by the tree at `root` (which must be a directory,
/// not a symlink to one), within `limits`.
pub fn disk_usage(root: &Path, limits: &WalkLimits) -> Result<DiskUsage, DuError> {
    walk_tree(root, limits).map(|w| w.usage)
}

/// [`disk_usage`], with the walk's own counters.
fn walk_tree(root: &Path, limits: &WalkLimits) -> Result<Walk, DuError> {
    let deadline = Instant::now() + limits.max_time;
    let fd =
        nix::fcntl::open(root, dir_flags(), Mode::empty()).map_err(|source| DuError::OpenRoot {
            path: root.to_owned(),
            source,
        })?;
    let st = nix::sys::stat::fstat(&fd).map_err(|source| DuError::OpenRoot {
        path: root.to_owned(),
        source,
    })?;
    let mut walk = Walk {
        dev: st.st_dev,
        limits: *limits,
        deadline,
        usage: DiskUsage::default(),
        linked: HashSet::new(),
        pending: 0,
        peak_pending: 0,
    };
    walk.count(&st);
    let mut dir = Dir::from_fd(fd).map_err(|source| DuError::ListRoot {
        path: root.to_owned(),
        source,
    })?;
    let names = walk.list(&mut dir).map_err(|source| DuError::ListRoot {
        path: root.to_owned(),
        source,
    })?;
    let mut stack = vec![Level {
        dir,
        names,
        depth: 0,
    }];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.names.pop() else {
            stack.pop();
            continue;
        };
        walk.pending -= 1;
        if walk.out_of_bounds() {
            walk.usage.truncated = true;
            break;
        }
        let depth = top.depth;
        if let Some(child) = walk.visit(&top.dir, &name, depth) {
            stack.push(child);
        }
    }
    Ok(walk)
}

/// Flags for opening a directory to walk: never through a symlink, and
/// never anything that is not a directory.
fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

struct Walk {
    /// The root's filesystem; the walk never leaves it.
    dev: u64,
    limits: WalkLimits,
    deadline: Instant,
    usage: DiskUsage,
    /// Inodes with more than one link already counted.
    linked: HashSet<(u64, u64)>,
    /// Names listed and not yet visited, on every level of the stack: they
    /// count against the entry budget too, or a chain of wide directories
    /// would hold `max_depth` times `max_entries` names in memory.
    pending: u64,
    /// The most `pending` ever was.
    peak_pending: u64,
}

impl Walk {
    fn out_of_bounds(&self) -> bool {
        // Reading the clock on every entry would cost more than the stat.
        self.usage.entries >= self.limits.max_entries
            || (self.usage.entries & 0xff == 0 && Instant::now() >= self.deadline)
    }

    fn count(&mut self, st: &FileStat) {
        self.usage.entries += 1;
        let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        if st.st_nlink > 1 && !is_dir && !self.linked.insert((st.st_dev, st.st_ino)) {
            return;
        }
        let blocks = u64::try_from(st.st_blocks).unwrap_or(0);
        self.usage.bytes = self.usage.bytes.saturating_add(blocks.saturating_mul(512));
    }

    /// The names in `dir`, at most as many as the entry budget has left
    /// once the names already waiting are counted (one more, to know it was
    /// cut), and no more once the walk's time is up.
    fn list(&mut self, dir: &mut Dir) -> Result<Vec<OsString>, Errno> {
        let room = self
            .limits
            .max_entries
            .saturating_sub(self.usage.entries.saturating_add(self.pending))
            + 1;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if names.len() as u64 >= room
                || (names.len() & 0xff == 0xff && Instant::now() >= self.deadline)
            {
                self.usage.truncated = true;
                break;
            }
            names.push(std::ffi::OsStr::from_bytes(name).to_owned());
        }
        self.pending += names.len() as u64;
        self.peak_pending = self.peak_pending.max(self.pending);
        Ok(names)
    }

    /// Counts `name` in `parent`; returns the directory to descend into, if
    /// it is one and may be entered.
    fn visit(&mut self, parent: &Dir, name: &OsString, depth: usize) -> Option<Level> {
        let name = Path::new(name);
        // Gone since it was listed: nothing to count.
        let st =
            nix::sys::stat::fstatat(parent.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        self.count(&st);
        let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        if !is_dir || st.st_dev != self.dev {
            return None;
        }
        if depth + 1 > self.limits.max_depth {
            self.usage.truncated = true;
            return None;
        }
        // ELOOP or ENOTDIR: it was swapped for a symlink or a file since the
        // stat; it has been counted as what it was.
        let fd = nix::fcntl::openat(parent.as_fd(), name, dir_flags(), Mode::empty()).ok()?;
        let now = nix::sys::stat::fstat(&fd).ok()?;
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
            // Another directory was swapped in: skip it rather than count a
            // tree twice (or walk in a loop).
            return None;
        }
        let mut dir = Dir::from_fd(fd).ok()?;
        let names = self.list(&mut dir).ok()?;
        Some(Level {
            dir,
            names,
            depth: depth + 1,
        })
    }
}

#[cfg(test)]
mod tests;
