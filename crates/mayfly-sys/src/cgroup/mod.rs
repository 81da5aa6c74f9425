//! Cgroup appliers: create a sandbox's cgroups from a plan, move processes in,
//! read usage, and tear everything down again.
//!
//! The plan itself (which directories, which files, which values) is computed
//! by a pure function in `mayfly-engine` (`plan::cgroup`). This module only
//! holds the plan's *types*, because the engine depends on this crate and not
//! the other way round, plus the thin code that performs the writes.
//!
//! Two layouts are supported:
//!
//! * [`CgroupLayout::V2`]: the unified hierarchy (production hosts). One
//!   directory per sandbox, `<root>/mayfly/<id>`.
//! * [`CgroupLayout::V1`]: hybrid hosts where memory, cpu and pids live on v1
//!   hierarchies (the development and CI hosts). One directory per hierarchy,
//!   `<mount>/mayfly/<id>`.
//!
//! Every host path comes from the layout, so the tests run the applier against
//! a temporary directory that looks like a cgroup tree.

mod apply;
mod discover;
mod remove;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use apply::{add_process, apply, read_oom_kills, read_usage, set_cpu_weight};
pub use remove::{list_leftovers, remove, remove_dir, remove_empty_parents, remove_orphan};

/// The directory under each hierarchy's root that holds every Mayfly cgroup.
pub const PARENT_DIR: &str = "mayfly";
/// The prefix of every sandbox cgroup's name (it is the sandbox id).
pub const ID_PREFIX: &str = "mf-";

/// Where the host's cgroup controllers live.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CgroupLayout {
    /// The unified hierarchy, with memory, cpu and pids available at `root`.
    V2 { root: PathBuf },
    /// v1 hierarchies, keyed by controller name (`memory`, `cpu`, `cpuacct`,
    /// `pids`); co-mounted controllers share a mountpoint.
    V1 {
        controllers: BTreeMap<String, PathBuf>,
        /// Whether `memory.memsw.*` exists (swap accounting is on). Without
        /// it, a limit on memory+swap cannot be set and the plan falls back to
        /// `memory.swappiness = 0`.
        swap_accounting: bool,
    },
}

/// Which kind of hierarchy a plan targets; decides how tasks are killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// One write into a cgroup control file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupWrite {
    pub file: PathBuf,
    pub value: String,
    /// A refused write is not an error: a later write of the plan makes
    /// the same setting (see `first_try`).
    #[serde(default)]
    pub may_fail: bool,
}

impl CgroupWrite {
    pub fn new(file: impl Into<PathBuf>, value: impl Into<String>) -> Self {
        CgroupWrite {
            file: file.into(),
            value: value.into(),
            may_fail: false,
        }
    }

    /// A write the kernel may refuse for now, made again later in the
    /// plan: how two limits that must stay ordered (v1's memory limit never
    /// above its memory+swap limit) are both raised or both lowered.
    pub fn first_try(file: impl Into<PathBuf>, value: impl Into<String>) -> Self {
        CgroupWrite {
            may_fail: true,
            ..Self::new(file, value)
        }
    }
}

/// Where a sandbox's CPU time is accounted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CpuUsageFile {
    /// v2 `cpu.stat`, whose `usage_usec` line is in microseconds.
    StatUsec(PathBuf),
    /// v1 `cpuacct.usage`, in nanoseconds.
    AcctNanos(PathBuf),
}

/// The files [`read_usage`] reads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UsageFiles {
    pub memory_current: PathBuf,
    /// Missing on v2 kernels older than 5.19; then the peak is not reported.
    pub memory_peak: PathBuf,
    /// `None` on v1 hosts without a cpuacct hierarchy.
    pub cpu: Option<CpuUsageFile>,
    pub pids_current: PathBuf,
    /// The flat-keyed file whose `oom_kill` line counts the OOM killer's
    /// kills in the sandbox: v1 `memory.oom_control`, v2 `memory.events`.
    #[serde(default)]
    pub memory_events: PathBuf,
}

/// Everything needed to create, use and remove one sandbox's cgroups.
///
/// [`apply`] creates `shared_dirs` (kept forever; existing is fine), then
/// `sandbox_dirs`, then performs `writes` in order. [`remove`] deletes only
/// `sandbox_dirs`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupPlan {
    pub version: CgroupVersion,
    pub shared_dirs: Vec<PathBuf>,
    /// One per hierarchy (a single one on v2). These receive `cgroup.procs`.
    pub sandbox_dirs: Vec<PathBuf>,
    pub writes: Vec<CgroupWrite>,
    pub usage: UsageFiles,
    /// The sandbox's CPU weight against its siblings under contention: v1
    /// `cpu.shares`, v2 `cpu.weight` (see [`set_cpu_weight`]).
    #[serde(default)]
    pub cpu_weight: PathBuf,
}

/// A sandbox's resource usage, as the kernel accounts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupUsage {
    pub memory_bytes: u64,
    pub memory_peak_bytes: Option<u64>,
    pub cpu_usec: Option<u64>,
    pub pids: u64,
    /// Kills by the OOM killer; `None` on kernels that do not count them
    /// (v1 before 4.13).
    pub oom_kills: Option<u64>,
}

/// Why a cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("could not read the mount table at {path}")]
    ReadMountinfo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no cgroup filesystem is mounted, so sandbox limits cannot be enforced")]
    NoCgroupMount,
    #[error(
        "the cgroup v1 controller `{controller}` is not mounted, so its limit cannot be enforced"
    )]
    MissingV1Controller { controller: &'static str },
    #[error("the cgroup2 hierarchy at {root} does not offer the controllers {missing:?}")]
    MissingV2Controllers { root: PathBuf, missing: Vec<String> },
    #[error("could not create the cgroup directory {path}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not write `{value}` to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds `{content}`, which is not a number")]
    Parse { path: PathBuf, content: String },
    #[error("could not kill process {pid} left in the cgroup {path}")]
    Kill {
        path: PathBuf,
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("could not remove the cgroup directory {path}")]
    Rmdir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a Mayfly sandbox cgroup, so it is not removed")]
    NotMayflyCgroup { path: PathBuf },
}

#[cfg(test)]
mod host_tests;
#[cfg(test)]
mod tests;
