//! Stats over a window of time: spin-up percentiles, exec counts, and
//! iterations per five-minute window grouped by the `task` label.
//!
//! The rows come from SQL; percentiles are computed here, in Rust, from
//! every sample (nearest rank), so they are exact rather than estimated
//! from histogram buckets.

use std::collections::BTreeMap;

use mayfly_types::{
    ExecCounts, Percentiles, SpinUp, SpinUpWindow, StatsReport, TaskStats, TaskWindow, UnixMillis,
    TASK_WINDOW_MS,
};
use rusqlite::params;

use crate::row::Cols;
use crate::{Store, StoreError};

/// What a stats report covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsQuery {
    /// The window ends now and reaches back this far.
    pub window_ms: u64,
    /// Only sandboxes whose `task` label is this.
    pub task: Option<String>,
    /// Only this tenant's sandboxes.
    pub tenant: Option<String>,
}

/// When a sandbox counts as created for its caller: its claim if it came
/// from a pool, else its record. Unclaimed pool sandboxes are no one's
/// create yet, and a create that never became ready has no spin-up time.
const CREATED: &str = "COALESCE(claimed_at, created_at)";
const COUNTED: &str = "create_ms IS NOT NULL AND (pool IS NULL OR claimed_at IS NOT NULL)";
const TASK: &str = "json_extract(labels, '$.task')";

/// The task a report is narrowed to (`?4`; NULL: any), and its tenant
/// (`?3`) when `tenant` is set. The two forms are two statements, not one
/// `?3 IS NULL OR` condition, so a tenant's report reads through the
/// indexes that lead with the tenant (migration 7): its cost is that
/// tenant's rows in the window, never every tenant's.
fn filter(tenant_col: Option<&str>) -> String {
    let task = format!("(?4 IS NULL OR {TASK} = ?4)");
    match tenant_col {
        Some(col) => format!("{col} = ?3 AND {task}"),
        None => format!("?3 IS NULL AND {task}"),
    }
}

/// The creates in `[?1, ?2)`: read through the `sandboxes_counted_at`
/// index (migration 6), whose expression is [`CREATED`], or, for one
/// tenant, `sandboxes_tenant_counted_at`.
pub(crate) fn creates_sql(tenant: bool) -> String {
    format!(
        "SELECT id, {TASK}, {CREATED}, create_ms, pool IS NOT NULL FROM sandboxes \
         WHERE {CREATED} >= ?1 AND {CREATED} < ?2 AND {COUNTED} AND {}",
        filter(tenant.then_some("tenant"))
    )
}

/// The execs in `[?1, ?2)` by task and window: read through `execs_at`,
/// or, for one tenant, `execs_tenant_at`.
pub(crate) fn execs_sql(tenant: bool) -> String {
    format!(
        "SELECT {TASK}, e.at / {TASK_WINDOW_MS}, COUNT(*), \
         SUM(e.exit_code IS 0 AND e.error IS NULL), SUM(e.timed_out) \
         FROM execs e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.at >= ?1 AND e.at < ?2 AND {} GROUP BY 1, 2",
        filter(tenant.then_some("e.tenant"))
    )
}

/// One task's figures as they are gathered.
#[derive(Default)]
struct TaskAcc {
    iterations: u64,
    execs: u64,
    /// Window start → (iterations, execs).
    windows: BTreeMap<UnixMillis, (u64, u64)>,
}

impl Store {
    /// The stats of the window that ends now; see [`StatsReport`].
    pub fn stats(&self, q: &StatsQuery) -> Result<StatsReport, StoreError> {
        let until = self.now();
        let since = until.saturating_sub(q.window_ms);
        let mut tasks: BTreeMap<Option<String>, TaskAcc> = BTreeMap::new();
        let (mut all, mut cold, mut pool) = (Vec::new(), Vec::new(), Vec::new());
        // Window start → (cold, pool) samples.
        let mut spin_windows: BTreeMap<UnixMillis, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        let mut execs = ExecCounts::default();
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(&creates_sql(q.tenant.is_some()))?;
        let mut rows = stmt.query(params![since, until, q.tenant, q.task])?;
        while let Some(row) = rows.next()? {
            let c = Cols::new(row, "sandboxes", 0);
            let task: Option<String> = c.get(1, "labels")?;
            let at: UnixMillis = c.get(2, "created_at")?;
            let ms: f64 = c.get(3, "create_ms")?;
            let from_pool: bool = c.get(4, "pool")?;
            all.push(ms);
            if from_pool { &mut pool } else { &mut cold }.push(ms);
            let w = spin_windows.entry(window_of(at)).or_default();
            if from_pool { &mut w.1 } else { &mut w.0 }.push(ms);
            let acc = tasks.entry(task).or_default();
            acc.iterations += 1;
            acc.windows.entry(window_of(at)).or_default().0 += 1;
        }
        drop(rows);
        let mut stmt = conn.prepare_cached(&execs_sql(q.tenant.is_some()))?;
        let mut rows = stmt.query(params![since, until, q.tenant, q.task])?;
        while let Some(row) = rows.next()? {
            let c = Cols::new(row, "execs", 1);
            let task: Option<String> = c.get(0, "labels")?;
            let window: u64 = c.get(1, "at")?;
            let (n, ok, timed_out): (u64, u64, u64) = (
                c.get(2, "seq")?,
                c.get(3, "exit_code")?,
                c.get(4, "timed_out")?,
            );
            execs.total += n;
            execs.ok += ok;
            execs.failed += n - ok;
            execs.timed_out += timed_out;
            let acc = tasks.entry(task).or_default();
            acc.execs += n;
            acc.windows.entry(window * TASK_WINDOW_MS).or_default().1 += n;
        }
        let spanned = windows_spanned(since, until);
        let mut tasks: Vec<TaskStats> = tasks
            .into_iter()
            .map(|(task, acc)| task_stats(task, acc, spanned))
            .collect();
        // By label, sandboxes without one last.
        tasks.sort_by(|a, b| (a.task.is_none(), &a.task).cmp(&(b.task.is_none(), &b.task)));
        Ok(StatsReport {
            since,
            until,
            window_secs: TASK_WINDOW_MS / 1000,
            task: q.task.clone(),
            spin_up: SpinUp {
                all: percentiles(&mut all),
                cold: percentiles(&mut cold),
                pool: percentiles(&mut pool),
            },
            spin_up_windows: spin_windows
                .into_iter()
                .map(|(start, (mut cold, mut pool))| SpinUpWindow {
                    start,
                    cold: percentiles(&mut cold),
                    pool: percentiles(&mut pool),
                })
                .collect(),
            execs,
            tasks,
        })
    }
}

fn task_stats(task: Option<String>, acc: TaskAcc, spanned: u64) -> TaskStats {
    let peak = acc.windows.values().map(|w| w.0).max().unwrap_or(0);
    TaskStats {
        task,
        iterations: acc.iterations,
        execs: acc.execs,
        iterations_per_window: acc.iterations as f64 / spanned.max(1) as f64,
        peak_iterations_per_window: peak,
        windows: acc
            .windows
            .into_iter()
            .map(|(start, (iterations, execs))| TaskWindow {
                start,
                iterations,
                execs,
            })
            .collect(),
    }
}

/// The start of the five-minute window (aligned to the epoch) holding `at`.
pub(crate) fn window_of(at: UnixMillis) -> UnixMillis {
    at - at % TASK_WINDOW_MS
}

/// How many five-minute windows `[since, until)` touches.
pub(crate) fn windows_spanned(since: UnixMillis, until: UnixMillis) -> u64 {
    if until <= since {
        return 0;
    }
    window_of(until - 1) / TASK_WINDOW_MS - window_of(since) / TASK_WINDOW_MS + 1
}

/// Nearest-rank percentiles of `samples` (sorted in place): the p-th
/// percentile is the smallest sample with at least p% of the samples at or
/// below it, i.e. the one at rank ⌈p/100 · n⌉.
pub fn percentiles(samples: &mut [f64]) -> Percentiles {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    // In integers: 0.95 · 20 in floating point is 19.000000000000004,
    // whose ceiling would be one rank too high.
    let rank = |p: usize| -> Option<f64> {
        let r = (p * n).div_ceil(100);
        (n > 0).then(|| samples[r.clamp(1, n) - 1])
    };
    Percentiles {
        count: n as u64,
        p50_ms: rank(50),
        p95_ms: rank(95),
        p99_ms: rank(99),
        max_ms: samples.last().copied(),
    }
}
