//! Tearing sandbox cgroups down, and finding the ones a crash left behind.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::apply::{read_string, write_file};
use super::{CgroupError, CgroupLayout, CgroupPlan, ID_PREFIX, PARENT_DIR};

/// Page cache (bytes) a v1 memory cgroup may still hold at removal without
/// being reclaimed first.
const RECLAIM_ABOVE: u64 = 64 * 1024;

/// How long a cgroup may stay busy (tasks still exiting) before giving up.
const BUSY_DEADLINE: Duration = Duration::from_secs(2);

/// Kills every task left in the plan's sandbox cgroups and removes them.
///
/// Missing directories are fine, so this is idempotent. Every directory is
/// attempted even when one fails; the first error is returned.
pub fn remove(plan: &CgroupPlan) -> Result<(), CgroupError> {
    let mut first = None;
    for dir in &plan.sandbox_dirs {
        if let Err(e) = remove_tree(dir) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Removes one sandbox cgroup found by [`list_leftovers`], killing its tasks.
///
/// Only a directory named `mf-*` inside a `mayfly` directory is touched, so a
/// wrong path from a stale record cannot remove someone else's cgroup.
pub fn remove_dir(dir: &Path) -> Result<(), CgroupError> {
    let named = |p: Option<&Path>, ok: &dyn Fn(&str) -> bool| {
        p.and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .is_some_and(ok)
    };
    if !named(Some(dir), &|n| n.starts_with(ID_PREFIX))
        || !named(dir.parent(), &|n| n == PARENT_DIR)
    {
        return Err(CgroupError::NotMayflyCgroup {
            path: dir.to_owned(),
        });
    }
    remove_tree(dir)
}

/// Removes a sandbox cgroup found by [`list_leftovers`] that nobody uses:
/// only when neither it nor any cgroup under it has a task, and it was made
/// at least `min_age` ago (a cgroup being made is empty until its first
/// process joins). Nothing is killed. Returns whether it was removed; a
/// cgroup in use, too young, or made busy meanwhile (`EBUSY`) is left.
pub fn remove_orphan(dir: &Path, min_age: Duration) -> Result<bool, CgroupError> {
    let age = std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok());
    if age.is_none_or(|a| a < min_age) || has_tasks(dir)? {
        return Ok(false);
    }
    match remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(CgroupError::Rmdir { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Whether `dir` or any cgroup under it has a task.
fn has_tasks(dir: &Path) -> Result<bool, CgroupError> {
    match read_string(&dir.join("cgroup.procs")) {
        Ok(p) if !p.trim().is_empty() => return Ok(true),
        Ok(_) => {}
        Err(CgroupError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
            return Ok(false)
        }
        Err(e) => return Err(e),
    }
    for child in subdirs(dir)? {
        if has_tasks(&child)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Removes the shared `mayfly` parent directories that are empty, so an
/// idle host keeps no trace of Mayfly in its cgroup trees. A parent still
/// holding sandboxes (`EBUSY`/`ENOTEMPTY`) is left alone.
pub fn remove_empty_parents(layout: &CgroupLayout) {
    let roots: BTreeSet<&Path> = match layout {
        CgroupLayout::V2 { root } => BTreeSet::from([root.as_path()]),
        CgroupLayout::V1 { controllers, .. } => {
            controllers.values().map(PathBuf::as_path).collect()
        }
    };
    for root in roots {
        let _ = std::fs::remove_dir(root.join(PARENT_DIR));
    }
}

/// Every `mayfly/mf-*` directory of the layout's hierarchies, sorted.
pub fn list_leftovers(layout: &CgroupLayout) -> Result<Vec<PathBuf>, CgroupError> {
    let roots: BTreeSet<&Path> = match layout {
        CgroupLayout::V2 { root } => BTreeSet::from([root.as_path()]),
        CgroupLayout::V1 { controllers, .. } => {
            controllers.values().map(PathBuf::as_path).collect()
        }
    };
    let mut found = Vec::new();
    for root in roots {
        let parent = root.join(PARENT_DIR);
        found.extend(subdirs(&parent)?.into_iter().filter(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(ID_PREFIX))
        }));
    }
    found.sort();
    Ok(found)
}

/// Kills the tasks of `dir`, removes its child cgroups (a sandbox with a
/// delegated subtree may have made some), then removes `dir` itself, retrying
/// while exiting tasks keep it busy.
fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    if !dir.exists() {
        return Ok(());
    }
    kill_tasks(dir)?;
    for child in subdirs(dir)? {
        remove_tree(&child)?;
    }
    let deadline = Instant::now() + BUSY_DEADLINE;
    let mut pause = Duration::from_micros(100);
    // v1 memory: a removed cgroup lingers, offline but allocated, for as
    // long as pages (the sandbox's page cache) are still charged to it, and
    // thousands of such dying cgroups slow every later cgroup operation.
    // Reclaiming the charges first lets the kernel free it at rmdir. The
    // reclaim drains every CPU's page lists (about 2 ms even when there is
    // nothing to reclaim), so it is done only when more than a few pages of
    // page cache are charged: a sandbox that was the first to read a shared
    // file (the loader's `ld.so.cache` of the template) leaves those pages
    // cached for the next one, and its cgroup is freed once they are
    // reclaimed. Kernel memory is reparented at rmdir and needs no reclaim.
    // The reclaim fails with EBUSY while tasks remain, so it is tried before
    // each rmdir.
    let force_empty = dir.join("memory.force_empty");
    let stat = dir.join("memory.stat");
    let reclaim = force_empty.exists();
    loop {
        if reclaim && charged_cache(&stat).is_none_or(|c| c > RECLAIM_ABOVE) {
            let _ = std::fs::write(&force_empty, "0");
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                // A task forked between the read and the kill, or is still
                // exiting: kill again and give it a moment.
                kill_tasks(dir)?;
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(source) => {
                return Err(CgroupError::Rmdir {
                    path: dir.to_owned(),
                    source,
                })
            }
        }
    }
}

/// The page cache still charged to a v1 memory cgroup (`total_cache` in
/// `memory.stat`, in bytes), or None if it cannot be read.
fn charged_cache(stat: &Path) -> Option<u64> {
    parse_total_cache(&std::fs::read_to_string(stat).ok()?)
}

pub(super) fn parse_total_cache(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("total_cache "))
        .and_then(|v| v.trim().parse().ok())
}

/// Kills every task in `dir` and its descendants.
///
/// v2 has `cgroup.kill`, which the kernel applies atomically, racing no fork.
/// v1 has no such file, so the pids in `cgroup.procs` are sent SIGKILL; tasks
/// forked meanwhile are caught by the retry in [`remove_tree`].
fn kill_tasks(dir: &Path) -> Result<(), CgroupError> {
    let kill_file = dir.join("cgroup.kill");
    if kill_file.exists() {
        return write_file(&kill_file, "1");
    }
    let procs_file = dir.join("cgroup.procs");
    let procs = match read_string(&procs_file) {
        Ok(p) => p,
        Err(CgroupError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        match kill(Pid::from_raw(pid), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(errno) => {
                return Err(CgroupError::Kill {
                    path: dir.to_owned(),
                    pid,
                    source: errno.into(),
                })
            }
        }
    }
    Ok(())
}

/// The subdirectories of `dir`; none when `dir` does not exist.
fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let err = |source| CgroupError::Read {
        path: dir.to_owned(),
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(err)?;
        if entry.file_type().map_err(err)?.is_dir() {
            dirs.push(entry.path());
        }
    }
    Ok(dirs)
}
