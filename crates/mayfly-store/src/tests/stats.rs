//! Stats: percentiles against hand-computed values, and a window of
//! sandboxes and execs whose every figure is worked out below.

use std::collections::BTreeMap;

use mayfly_types::{ExecAudit, Percentiles, TaskWindow};

use super::{clocked_store, id, record};
use crate::stats::{creates_sql, execs_sql, window_of, windows_spanned};
use crate::{percentiles, StatsQuery, Store};

#[test]
fn percentiles_are_nearest_rank_over_every_sample() {
    // 1..=20 shuffled: p50 is rank 10, p95 rank 19, p99 rank ⌈19.8⌉ = 20.
    let mut v: Vec<f64> = (1..=20).rev().map(f64::from).collect();
    v.swap(3, 11);
    assert_eq!(
        percentiles(&mut v),
        Percentiles {
            count: 20,
            p50_ms: Some(10.0),
            p95_ms: Some(19.0),
            p99_ms: Some(20.0),
            max_ms: Some(20.0),
        }
    );
    let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
    let p = percentiles(&mut v);
    assert_eq!(
        (p.p50_ms, p.p95_ms, p.p99_ms),
        (Some(50.0), Some(95.0), Some(99.0))
    );
    // Six samples: ranks ⌈3⌉ = 3, ⌈5.7⌉ = 6, ⌈5.94⌉ = 6.
    let mut v = vec![7.0, 0.5, 10.0, 2.0, 6.0, 4.0];
    let p = percentiles(&mut v);
    assert_eq!(
        (p.p50_ms, p.p95_ms, p.p99_ms),
        (Some(4.0), Some(10.0), Some(10.0))
    );
    let p = percentiles(&mut [3.25]);
    assert_eq!(
        (p.count, p.p50_ms, p.p99_ms, p.max_ms),
        (1, Some(3.25), Some(3.25), Some(3.25))
    );
    assert_eq!(
        percentiles(&mut []),
        Percentiles {
            count: 0,
            ..Percentiles::default()
        }
    );
}

#[test]
fn stats_read_their_window_through_an_index_not_a_table_scan() {
    let (store, _) = clocked_store();
    let plan = |sql: &str| -> String {
        let conn = store.conn();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt
            .query_map(
                rusqlite::params![0, 1, None::<String>, None::<String>],
                |r| r.get::<_, String>(3),
            )
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        rows.join("; ")
    };
    let creates = plan(&creates_sql(false));
    assert!(
        creates.contains("USING INDEX sandboxes_counted_at"),
        "{creates}"
    );
    let execs = plan(&execs_sql(false));
    assert!(execs.contains("USING INDEX execs_at"), "{execs}");
    // A tenant's report reads its own rows only: the indexes lead with it.
    let creates = plan(&creates_sql(true));
    assert!(
        creates.contains(
            "USING INDEX sandboxes_tenant_counted_at (tenant=? AND <expr>>? AND <expr><?)"
        ),
        "{creates}"
    );
    let execs = plan(&execs_sql(true));
    assert!(
        execs.contains("USING INDEX execs_tenant_at (tenant=? AND at>? AND at<?)"),
        "{execs}"
    );
}

#[test]
fn a_file_stores_reports_read_on_their_own_connection_and_see_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = StatsQuery {
        window_ms: 3_600_000,
        ..StatsQuery::default()
    };
    let now = store.now();
    for n in 1..=3 {
        store.insert_sandbox(&record(id(n), now - 1000), 8).unwrap();
        store.set_ready_info(&id(n), 100, n as f64).unwrap();
        // The read-only connection (opened by the first report) sees each
        // commit of the writing one.
        assert_eq!(store.stats(&q).unwrap().spin_up.all.count, n);
    }
    assert!(
        matches!(store.reader.get(), Some(Some(_))),
        "the report did not get a connection of its own"
    );
    // It holds no write lock: writes go on while a report's statement is
    // open on it.
    let reader = store.read_conn();
    let mut stmt = reader.prepare(&creates_sql(false)).unwrap();
    let mut rows = stmt
        .query(rusqlite::params![
            0,
            i64::MAX,
            None::<String>,
            None::<String>
        ])
        .unwrap();
    assert!(rows.next().unwrap().is_some());
    store.insert_sandbox(&record(id(4), now), 8).unwrap();
}

#[test]
fn windows_are_five_minutes_aligned_to_the_epoch() {
    assert_eq!(window_of(3_123_000), 3_000_000);
    assert_eq!(window_of(3_000_000), 3_000_000);
    assert_eq!(windows_spanned(1_923_000, 3_123_000), 5);
    assert_eq!(windows_spanned(3_000_000, 3_300_000), 1);
    assert_eq!(windows_spanned(3_000_000, 3_000_001), 1);
    assert_eq!(windows_spanned(5, 5), 0);
}

/// Now is 3_123_000; a 20-minute window reaches back to 1_923_000 and
/// touches the five windows starting at 1_800_000 … 3_000_000.
const NOW: u64 = 3_123_000;
const WINDOW_MS: u64 = 1_200_000;

struct Sb {
    n: u64,
    task: Option<&'static str>,
    created_at: u64,
    create_ms: Option<f64>,
    pool: Option<(&'static str, Option<u64>)>,
    tenant: &'static str,
}

fn add(store: &Store, s: Sb) {
    let mut rec = record(id(s.n), s.created_at);
    rec.labels = BTreeMap::new();
    if let Some(t) = s.task {
        rec.labels.insert("task".into(), t.into());
    }
    rec.labels.insert("other".into(), "x".into());
    rec.tenant = Some(s.tenant.into());
    if let Some((pool, claimed_at)) = s.pool {
        rec.pool = Some(pool.into());
        rec.claimed_at = claimed_at;
    }
    store.insert_sandbox(&rec, 64).unwrap();
    if let Some(ms) = s.create_ms {
        store.set_ready_info(&id(s.n), 100, ms).unwrap();
    }
}

fn exec(store: &Store, n: u64, at: u64, exit: Option<i32>, timed_out: bool, error: bool) {
    store
        .record_exec(&ExecAudit {
            sandbox_id: id(n).to_string(),
            at,
            argv: vec!["make".into()],
            exit_code: exit,
            signal: exit.is_none().then_some(9),
            timed_out,
            error: error.then(|| "no such file".into()),
            duration_us: 10,
            stdout_bytes: 0,
            stderr_bytes: 0,
            caller: "t".into(),
            kind: None,
            output: None,
        })
        .unwrap();
}

fn fixture() -> Store {
    let (store, clock) = clocked_store();
    let sb = |n, task, created_at, create_ms| Sb {
        n,
        task,
        created_at,
        create_ms,
        pool: None,
        tenant: "default",
    };
    add(&store, sb(1, Some("alpha"), 2_000_000, Some(4.0)));
    add(&store, sb(2, Some("alpha"), 2_100_000, Some(2.0)));
    add(&store, sb(3, Some("alpha"), 2_150_000, Some(10.0)));
    // Booted for a pool long ago, claimed in the window: counts at its claim.
    add(
        &store,
        Sb {
            pool: Some(("p", Some(3_050_000))),
            ..sb(4, Some("beta"), 100, Some(0.5))
        },
    );
    add(&store, sb(5, None, 3_100_000, Some(6.0)));
    // Not counted: before the window; never ready; unclaimed in its pool.
    add(&store, sb(6, Some("alpha"), 1_000_000, Some(99.0)));
    add(&store, sb(7, Some("alpha"), 2_500_000, None));
    add(
        &store,
        Sb {
            pool: Some(("p", None)),
            ..sb(8, None, 2_500_000, Some(1.0))
        },
    );
    // Another tenant's.
    add(
        &store,
        Sb {
            tenant: "acme",
            ..sb(9, Some("alpha"), 2_200_000, Some(7.0))
        },
    );

    exec(&store, 1, 2_010_000, Some(0), false, false);
    exec(&store, 1, 2_020_000, Some(1), false, false);
    exec(&store, 2, 2_110_000, None, true, false);
    exec(&store, 3, 2_200_000, None, false, true);
    exec(&store, 4, 3_060_000, Some(0), false, false);
    exec(&store, 1, 1_500_000, Some(0), false, false); // before the window
    clock.set(NOW);
    store
}

fn w(start: u64, iterations: u64, execs: u64) -> TaskWindow {
    TaskWindow {
        start,
        iterations,
        execs,
    }
}

#[test]
fn a_window_reports_spin_up_execs_and_iterations_by_task() {
    let store = fixture();
    let r = store
        .stats(&StatsQuery {
            window_ms: WINDOW_MS,
            ..StatsQuery::default()
        })
        .unwrap();
    assert_eq!((r.since, r.until, r.window_secs), (1_923_000, NOW, 300));
    // all: 0.5 2 4 6 7 10; cold: 2 4 6 7 10 (p50 rank ⌈2.5⌉ = 3); pool: 0.5.
    let p = |count, p50, p95, p99, max| Percentiles {
        count,
        p50_ms: Some(p50),
        p95_ms: Some(p95),
        p99_ms: Some(p99),
        max_ms: Some(max),
    };
    assert_eq!(r.spin_up.all, p(6, 4.0, 10.0, 10.0, 10.0));
    assert_eq!(r.spin_up.cold, p(5, 6.0, 10.0, 10.0, 10.0));
    assert_eq!(r.spin_up.pool, p(1, 0.5, 0.5, 0.5, 0.5));
    // Per window: 1_800_000 holds 4; 2_100_000 holds 2, 10 and acme's 7;
    // 3_000_000 the claim (0.5, pool) and 6.
    let none = Percentiles::default();
    let windows: Vec<_> = r
        .spin_up_windows
        .iter()
        .map(|w| (w.start, w.cold, w.pool))
        .collect();
    assert_eq!(
        windows,
        [
            (1_800_000, p(1, 4.0, 4.0, 4.0, 4.0), none),
            (2_100_000, p(3, 7.0, 10.0, 10.0, 10.0), none),
            (
                3_000_000,
                p(1, 6.0, 6.0, 6.0, 6.0),
                p(1, 0.5, 0.5, 0.5, 0.5)
            ),
        ]
    );
    assert_eq!(
        (r.execs.total, r.execs.ok, r.execs.failed, r.execs.timed_out),
        (5, 2, 3, 1)
    );
    let tasks: Vec<_> = r.tasks.iter().map(|t| t.task.as_deref()).collect();
    assert_eq!(
        tasks,
        [Some("alpha"), Some("beta"), None],
        "by label, none last"
    );
    let alpha = &r.tasks[0];
    assert_eq!((alpha.iterations, alpha.execs), (4, 4));
    assert_eq!(alpha.windows, [w(1_800_000, 1, 2), w(2_100_000, 3, 2)]);
    assert_eq!(alpha.peak_iterations_per_window, 3);
    assert!(
        (alpha.iterations_per_window - 0.8).abs() < 1e-9,
        "4 over 5 windows"
    );
    let beta = &r.tasks[1];
    assert_eq!((beta.iterations, beta.execs), (1, 1));
    assert_eq!(beta.windows, [w(3_000_000, 1, 1)]);
    let none = &r.tasks[2];
    assert_eq!((none.iterations, none.execs), (1, 0));
    assert_eq!(none.windows, [w(3_000_000, 1, 0)]);
}

#[test]
fn a_tenant_or_a_task_narrows_every_figure() {
    let store = fixture();
    let r = store
        .stats(&StatsQuery {
            window_ms: WINDOW_MS,
            tenant: Some("default".into()),
            ..StatsQuery::default()
        })
        .unwrap();
    assert_eq!(r.spin_up.all.count, 5, "acme's sandbox is left out");
    assert_eq!(r.spin_up_windows[1].cold.count, 2, "and from its window");
    assert_eq!(r.tasks[0].iterations, 3);
    assert_eq!(r.tasks[0].windows, [w(1_800_000, 1, 2), w(2_100_000, 2, 2)]);

    let r = store
        .stats(&StatsQuery {
            window_ms: WINDOW_MS,
            task: Some("beta".into()),
            ..StatsQuery::default()
        })
        .unwrap();
    assert_eq!(r.task.as_deref(), Some("beta"));
    assert_eq!((r.spin_up.all.count, r.spin_up.pool.count), (1, 1));
    assert_eq!(r.execs.total, 1);
    assert_eq!(r.tasks.len(), 1);

    let r = store
        .stats(&StatsQuery {
            window_ms: WINDOW_MS,
            task: Some("nobody".into()),
            ..StatsQuery::default()
        })
        .unwrap();
    assert_eq!(r.spin_up.all.count, 0);
    assert_eq!(r.spin_up.all.p50_ms, None);
    assert!(r.tasks.is_empty());
}
