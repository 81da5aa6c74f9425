//! Observability on the wire: a sandbox's resource usage, and the stats a
//! CI or agent team shows as evidence (spin-up percentiles, exec counts,
//! iterations per five-minute window).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{SandboxId, UnixMillis};

/// `GET /v1/sandboxes/{id}/usage`: what a live sandbox uses now, read from
/// its cgroups and its upper layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxUsage {
    #[schema(value_type = String, example = "mf-abcdefghjkmn")]
    pub id: SandboxId,
    /// When the figures were read.
    pub at: UnixMillis,
    /// CPU time of every process the sandbox ever ran, in seconds; absent
    /// when the host accounts no CPU time (v1 without cpuacct).
    pub cpu_seconds: Option<f64>,
    /// Memory charged to the sandbox now (page cache included).
    pub memory_bytes: u64,
    /// The most memory ever charged; absent on v2 kernels before 5.19.
    pub memory_peak_bytes: Option<u64>,
    /// The memory limit the sandbox runs under.
    pub memory_limit_bytes: u64,
    /// Processes and threads alive now.
    pub pids: u64,
    /// Processes the kernel's OOM killer has killed in the sandbox.
    pub oom_kills: Option<u64>,
    /// Disk used by the sandbox's writable upper layers.
    pub disk: DiskUsage,
}

/// Disk used by a directory tree, counted as `du` does (allocated blocks,
/// each hard-linked inode once), without following symlinks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiskUsage {
    /// Allocated bytes (`st_blocks * 512`).
    pub bytes: u64,
    /// Files, directories, links and other entries counted.
    pub entries: u64,
    /// The walk stopped at a bound (entries, depth or time): the figures are
    /// a lower bound.
    pub truncated: bool,
}

/// Spin-up times of the creates in a stats window, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Percentiles {
    /// How many creates the figures are computed from.
    pub count: u64,
    /// Nearest-rank percentiles; absent when `count` is 0.
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// Spin-up percentiles, for every create and split by where it came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SpinUp {
    pub all: Percentiles,
    /// Booted on request.
    pub cold: Percentiles,
    /// Claimed from a warm pool.
    pub pool: Percentiles,
}

/// Execs run in a stats window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecCounts {
    pub total: u64,
    /// Exited with code 0.
    pub ok: u64,
    /// Exited non-zero, were killed by a signal, or could not start.
    pub failed: u64,
    pub timed_out: u64,
}

/// One five-minute window of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskWindow {
    /// The window's start (a multiple of five minutes since the epoch).
    pub start: UnixMillis,
    /// Sandboxes created with the task's label in the window.
    pub iterations: u64,
    /// Execs run in those sandboxes in the window.
    pub execs: u64,
}

/// Iterations of one `task` label: every sandbox created with the label is
/// one iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskStats {
    /// The `task` label; absent for sandboxes created without one.
    pub task: Option<String>,
    pub iterations: u64,
    pub execs: u64,
    /// Iterations per five-minute window, averaged over every window the
    /// stats window spans (empty ones included).
    pub iterations_per_window: f64,
    /// The busiest window's iterations.
    pub peak_iterations_per_window: u64,
    /// The windows with at least one iteration or exec, oldest first.
    pub windows: Vec<TaskWindow>,
}

/// Spin-up percentiles of the creates in one five-minute window: the P50
/// and P95 over time that a dashboard plots.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SpinUpWindow {
    /// The window's start (a multiple of five minutes since the epoch).
    pub start: UnixMillis,
    /// Booted on request.
    pub cold: Percentiles,
    /// Claimed from a warm pool.
    pub pool: Percentiles,
}

/// `GET /v1/stats`: evidence over a window of time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StatsReport {
    /// The window: `[since, until)`.
    pub since: UnixMillis,
    pub until: UnixMillis,
    /// The length of the per-task windows, in seconds (300).
    pub window_secs: u64,
    /// The `task` label the report is restricted to, if any.
    pub task: Option<String>,
    pub spin_up: SpinUp,
    /// Spin-up percentiles per five-minute window, for the windows with at
    /// least one create, oldest first.
    #[serde(default)]
    pub spin_up_windows: Vec<SpinUpWindow>,
    pub execs: ExecCounts,
    /// One entry per `task` label, by label (no label last).
    pub tasks: Vec<TaskStats>,
}

/// The length of the windows iterations are counted in: five minutes.
pub const TASK_WINDOW_MS: u64 = 5 * 60 * 1000;

/// The label whose value groups sandboxes into tasks in [`StatsReport`].
pub const TASK_LABEL: &str = "task";
