//! Creating a sandbox's cgroups, moving processes in, and reading usage.

use std::io::{ErrorKind, Write};
use std::path::Path;

use super::{CgroupError, CgroupPlan, CgroupUsage, CpuUsageFile};

/// How many times a sandbox cgroup's mkdir is retried after its shared
/// parent vanished.
const PARENT_RETRIES: u32 = 8;

/// Creates the plan's directories and performs its writes, in order.
///
/// Existing directories are reused: the shared parents always exist after the
/// first sandbox, and a sandbox directory may be a pre-created one. If any
/// step fails, the sandbox directories are removed again before the error is
/// returned, so a failed create leaves nothing behind.
pub fn apply(plan: &CgroupPlan) -> Result<(), CgroupError> {
    for dir in &plan.shared_dirs {
        mkdir(dir)?;
    }
    let result = plan
        .sandbox_dirs
        .iter()
        .try_for_each(|dir| {
            // Another instance may remove the (then empty) shared parent
            // between our two mkdirs: make it again. Each retry's window is
            // two syscalls wide, so a few suffice under any churn.
            let mut tries = 0;
            loop {
                match mkdir(dir) {
                    Err(CgroupError::Mkdir { source, .. })
                        if source.kind() == ErrorKind::NotFound && tries < PARENT_RETRIES =>
                    {
                        tries += 1;
                        plan.shared_dirs.iter().try_for_each(|p| mkdir(p))?;
                    }
                    r => return r,
                }
            }
        })
        .and_then(|()| {
            plan.writes
                .iter()
                .try_for_each(|w| match write_file(&w.file, &w.value) {
                    Err(_) if w.may_fail => Ok(()),
                    r => r,
                })
        });
    if result.is_err() {
        // The original error is the one worth reporting; a failure to clean
        // up is found again by the leftover sweep at the next start.
        let _ = super::remove(plan);
    }
    result
}

/// Moves `pid` (a whole process) into every sandbox directory of the plan.
pub fn add_process(plan: &CgroupPlan, pid: i32) -> Result<(), CgroupError> {
    let value = pid.to_string();
    plan.sandbox_dirs
        .iter()
        .try_for_each(|dir| write_file(&dir.join("cgroup.procs"), &value))
}

/// Reads the sandbox's current memory, peak memory, CPU time and task count.
pub fn read_usage(plan: &CgroupPlan) -> Result<CgroupUsage, CgroupError> {
    let files = &plan.usage;
    let memory_peak_bytes = match read_u64(&files.memory_peak) {
        Ok(v) => Some(v),
        Err(CgroupError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let cpu_usec = match &files.cpu {
        None => None,
        Some(CpuUsageFile::AcctNanos(path)) => Some(read_u64(path)? / 1000),
        Some(CpuUsageFile::StatUsec(path)) => Some(read_stat_key(path, "usage_usec")?),
    };
    Ok(CgroupUsage {
        memory_bytes: read_u64(&files.memory_current)?,
        memory_peak_bytes,
        cpu_usec,
        pids: read_u64(&files.pids_current)?,
        oom_kills: read_oom_kills(plan)?,
    })
}

/// How many processes of the sandbox the OOM killer has killed, from the
/// `oom_kill` line of `memory.oom_control` (v1) or `memory.events` (v2);
/// `None` where the kernel keeps no such count.
pub fn read_oom_kills(plan: &CgroupPlan) -> Result<Option<u64>, CgroupError> {
    let path = &plan.usage.memory_events;
    match read_stat_key(path, "oom_kill") {
        Ok(n) => Ok(Some(n)),
        Err(CgroupError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => Ok(None),
        Err(CgroupError::Parse { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != ErrorKind::AlreadyExists => Err(CgroupError::Mkdir {
            path: path.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Sets the sandbox's CPU weight: `value` goes into the plan's
/// `cpu_weight` file (v1 `cpu.shares`, v2 `cpu.weight`).
pub fn set_cpu_weight(plan: &CgroupPlan, value: u32) -> Result<(), CgroupError> {
    write_file(&plan.cpu_weight, &value.to_string())
}

/// Writes `value` with a single `write(2)`, as cgroupfs expects.
pub(super) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    let err = |source| CgroupError::Write {
        path: path.to_owned(),
        value: value.to_owned(),
        source,
    };
    // Truncating is a no-op on cgroupfs and keeps fake trees exact in tests.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(err)?;
    let written = file.write(value.as_bytes()).map_err(err)?;
    if written != value.len() {
        return Err(err(std::io::Error::new(
            ErrorKind::WriteZero,
            "the kernel accepted only part of the value",
        )));
    }
    Ok(())
}

pub(super) fn read_string(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    let content = read_string(path)?;
    content.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_owned(),
        content: content.trim().chars().take(64).collect(),
    })
}

/// Reads `key value` from a flat-keyed file such as `cpu.stat`.
fn read_stat_key(path: &Path, key: &str) -> Result<u64, CgroupError> {
    let content = read_string(path)?;
    content
        .lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .ok_or_else(|| CgroupError::Parse {
            path: path.to_owned(),
            content: format!("no `{key}` line"),
        })
}
