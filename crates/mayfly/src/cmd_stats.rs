//! `mayfly stats`: spin-up percentiles, exec counts and iterations per
//! five-minute window by `task` label, over a window of time: the evidence
//! a CI or agent team shows.

use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use mayfly_types::{Percentiles, StatsReport, UnixMillis};

use crate::cli::{Cli, StatsArgs};
use crate::cmd_sandbox::client;
use crate::output;

pub async fn stats(cli: &Cli, a: &StatsArgs) -> anyhow::Result<i32> {
    let report = client(cli)?
        .stats(Some(&a.window), a.task.as_deref())
        .await?;
    if cli.json {
        output::json(&report)?;
    } else {
        let mut out = std::io::stdout().lock();
        write_report(&mut out, &report)?;
        out.flush()?;
    }
    Ok(0)
}

fn time(ms: UnixMillis) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

fn write_report(out: &mut dyn std::io::Write, r: &StatsReport) -> std::io::Result<()> {
    write!(out, "window   {} .. {}", time(r.since), time(r.until))?;
    match &r.task {
        Some(t) => writeln!(out, "  (task {t})")?,
        None => writeln!(out)?,
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<8} {:>7} {:>10} {:>10} {:>10} {:>10}",
        "SPIN-UP", "COUNT", "P50_MS", "P95_MS", "P99_MS", "MAX_MS"
    )?;
    let line = |out: &mut dyn std::io::Write, name: &str, p: &Percentiles| {
        writeln!(
            out,
            "{:<8} {:>7} {:>10} {:>10} {:>10} {:>10}",
            name,
            p.count,
            ms(p.p50_ms),
            ms(p.p95_ms),
            ms(p.p99_ms),
            ms(p.max_ms)
        )
    };
    line(out, "all", &r.spin_up.all)?;
    line(out, "cold", &r.spin_up.cold)?;
    line(out, "pool", &r.spin_up.pool)?;
    if !r.spin_up_windows.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "{:<22} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9}",
            format!("WINDOW ({}M)", r.window_secs / 60),
            "COLD_N",
            "COLD_P50",
            "COLD_P95",
            "POOL_N",
            "POOL_P50",
            "POOL_P95"
        )?;
        for w in &r.spin_up_windows {
            writeln!(
                out,
                "{:<22} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9}",
                time(w.start),
                w.cold.count,
                ms(w.cold.p50_ms),
                ms(w.cold.p95_ms),
                w.pool.count,
                ms(w.pool.p50_ms),
                ms(w.pool.p95_ms)
            )?;
        }
    }
    writeln!(out)?;
    let e = &r.execs;
    writeln!(
        out,
        "execs    {} (ok {}, failed {}, timed out {})",
        e.total, e.ok, e.failed, e.timed_out
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<24} {:>10} {:>8} {:>12} {:>8}",
        "TASK",
        "ITERATIONS",
        "EXECS",
        format!("PER_{}M", r.window_secs / 60),
        "PEAK"
    )?;
    for t in &r.tasks {
        writeln!(
            out,
            "{:<24} {:>10} {:>8} {:>12.2} {:>8}",
            t.task.as_deref().unwrap_or("(no task)"),
            t.iterations,
            t.execs,
            t.iterations_per_window,
            t.peak_iterations_per_window
        )?;
    }
    for t in &r.tasks {
        writeln!(out)?;
        writeln!(
            out,
            "{} — per {}-minute window",
            t.task.as_deref().unwrap_or("(no task)"),
            r.window_secs / 60
        )?;
        for w in &t.windows {
            writeln!(
                out,
                "  {}  iterations {:>5}  execs {:>6}",
                time(w.start),
                w.iterations,
                w.execs
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mayfly_types::{SpinUpWindow, TaskStats, TaskWindow};

    #[test]
    fn the_report_prints_percentiles_and_every_task_window() {
        let mut r = StatsReport {
            since: 1_700_000_000_000,
            until: 1_700_003_600_000,
            window_secs: 300,
            task: None,
            spin_up: Default::default(),
            spin_up_windows: vec![SpinUpWindow {
                start: 1_700_000_100_000,
                cold: Percentiles::default(),
                pool: Percentiles {
                    count: 2,
                    p50_ms: Some(0.2),
                    p95_ms: Some(0.75),
                    p99_ms: Some(0.75),
                    max_ms: Some(0.75),
                },
            }],
            execs: Default::default(),
            tasks: vec![TaskStats {
                task: Some("fix-bug-42".into()),
                iterations: 3,
                execs: 7,
                iterations_per_window: 0.25,
                peak_iterations_per_window: 2,
                windows: vec![TaskWindow {
                    start: 1_700_000_100_000,
                    iterations: 2,
                    execs: 5,
                }],
            }],
        };
        r.spin_up.cold = Percentiles {
            count: 3,
            p50_ms: Some(3.5),
            p95_ms: Some(4.25),
            p99_ms: Some(4.25),
            max_ms: Some(4.25),
        };
        let mut out = Vec::new();
        write_report(&mut out, &r).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("2023-11-14T22:13:20Z"), "{text}");
        assert!(
            text.contains("cold           3       3.50       4.25"),
            "{text}"
        );
        assert!(
            text.contains("fix-bug-42                        3        7         0.25        2"),
            "{text}"
        );
        assert!(text.contains("iterations     2  execs      5"), "{text}");
        assert!(
            text.contains(
                "2023-11-14T22:15:00Z         0         -         -       2      0.20      0.75"
            ),
            "{text}"
        );
    }
}
