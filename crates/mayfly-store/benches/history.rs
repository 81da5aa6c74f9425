//! How the store's history costs as it grows: `stats` over 1 hour, 1 day and
//! 7 days (the host's, and a small tenant's), a small tenant's page of
//! events, and `prune` (batched), on a store of a week of sandboxes.
//!
//! `cargo bench -p mayfly-store --bench history [-- SANDBOXES]` (default
//! 100,000: one every 6 s for 7 days, each with two execs, all ended). The
//! store is a file in a temporary directory (put TMPDIR on a tmpfs to leave
//! the disk out). Prints medians; it is a benchmark, not a test.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mayfly_store::{SandboxRecord, StatsQuery, Store, PRUNE_BATCH};
use mayfly_types::{ExecAudit, ResolvedLimits, SandboxId, SandboxState};

const WEEK_MS: u64 = 7 * 24 * 3600 * 1000;
const NOW: u64 = 1_800_000_000_000;

fn id(n: u64) -> SandboxId {
    let mut bytes = [0u8; 12];
    for (k, b) in bytes.iter_mut().rev().enumerate() {
        *b = ((n >> (5 * k)) & 31) as u8;
    }
    SandboxId::from_entropy(bytes)
}

/// The tenant holding one sandbox in [`SMALL_EVERY`]; the rest are the
/// default tenant's.
const SMALL: &str = "small";
const SMALL_EVERY: u64 = 1000;

/// Sandbox `i`, created at `at`: every other one a pool claim.
fn record(i: u64, at: u64) -> SandboxRecord {
    SandboxRecord {
        id: id(i),
        state: SandboxState::Creating,
        template: "host".into(),
        created_at: at,
        expires_at: at + 600_000,
        limits: ResolvedLimits::DEFAULT,
        labels: BTreeMap::from([("task".into(), format!("task-{}", i % 20))]),
        uid_slot: 0,
        owner_pid: 1,
        owner_start: 1,
        init_pid: None,
        reason: None,
        create_ms: None,
        tenant: Some(
            if i.is_multiple_of(SMALL_EVERY) {
                SMALL
            } else {
                "default"
            }
            .into(),
        ),
        pool: i.is_multiple_of(2).then(|| "host".into()),
        claimed_at: i.is_multiple_of(2).then_some(at),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse().expect("SANDBOXES is a number"))
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let clock = Arc::new(AtomicU64::new(NOW - WEEK_MS));
    let reader = clock.clone();
    let store = Store::open(dir.path())
        .expect("a store")
        .with_clock(move || reader.load(Ordering::SeqCst));

    let t0 = Instant::now();
    let step = WEEK_MS / n;
    for i in 0..n {
        let at = NOW - WEEK_MS + i * step;
        clock.store(at, Ordering::SeqCst);
        let sid = id(i);
        let rec = record(i, at);
        store.insert_sandbox(&rec, 1024).expect("insert");
        store
            .set_ready_info(&sid, 100, 0.03 + (i % 7) as f64)
            .expect("ready info");
        store
            .add_event(Some(&sid), "created", &serde_json::json!({}))
            .expect("event");
        for k in 0..2 {
            store
                .record_exec(&ExecAudit {
                    sandbox_id: sid.to_string(),
                    at: at + k,
                    argv: vec!["make".into(), "test".into()],
                    exit_code: Some(0),
                    signal: None,
                    timed_out: false,
                    error: None,
                    duration_us: 900,
                    stdout_bytes: 10,
                    stderr_bytes: 0,
                    caller: "unix:uid=0".into(),
                    kind: None,
                    output: None,
                })
                .expect("exec");
        }
        for to in [
            SandboxState::Ready,
            SandboxState::Stopping,
            SandboxState::Destroyed,
        ] {
            store.transition(&sid, to, None).expect("transition");
        }
    }
    clock.store(NOW, Ordering::SeqCst);
    store.checkpoint().expect("checkpoint");
    let db = std::fs::metadata(dir.path().join("mayfly.db"))
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "filled: {n} sandboxes, {} execs, over 7 days in {:.1} s; database {:.1} MiB",
        2 * n,
        t0.elapsed().as_secs_f64(),
        db as f64 / (1 << 20) as f64
    );

    for (name, window_ms) in [("1h", 3_600_000), ("24h", 86_400_000), ("7d", WEEK_MS)] {
        let q = StatsQuery {
            window_ms,
            ..StatsQuery::default()
        };
        let mut times = Vec::new();
        let mut count = 0;
        for _ in 0..15 {
            let t = Instant::now();
            let r = store.stats(&q).expect("stats");
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            count = r.spin_up.all.count;
        }
        println!(
            "stats over {name:>3}: median {:8.2} ms over 15 runs ({count} creates in the window)",
            median(times)
        );
    }

    // A tenant with one sandbox in SMALL_EVERY: its 7-day report, and its
    // first page of events, should cost its own rows, not everyone's.
    let q = StatsQuery {
        window_ms: WEEK_MS,
        tenant: Some(SMALL.into()),
        ..StatsQuery::default()
    };
    let mut times = Vec::new();
    let mut count = 0;
    for _ in 0..15 {
        let t = Instant::now();
        count = store.stats(&q).expect("stats").spin_up.all.count;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "stats over  7d for one tenant: median {:8.3} ms over 15 runs ({count} creates)",
        median(times)
    );
    let mut times = Vec::new();
    let mut len = 0;
    for _ in 0..15 {
        let t = Instant::now();
        len = store.tenant_events(SMALL, 0, 100).expect("events").len();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "one tenant's first page of events: median {:8.3} ms over 15 runs ({len} events)",
        median(times)
    );

    // `GET /v1/sandboxes?all=true`: the whole table (as it was) against the
    // most recent 1000 (as it is).
    for (name, f) in [
        (
            "every record (list_sandboxes)",
            Box::new(|| store.list_sandboxes(true).expect("list").len()) as Box<dyn Fn() -> usize>,
        ),
        (
            "the newest 1000 (list_recent)",
            Box::new(|| store.list_recent(None, 1000).expect("list").len()),
        ),
    ] {
        let mut times = Vec::new();
        let mut len = 0;
        for _ in 0..9 {
            let t = Instant::now();
            len = f();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        println!(
            "listing {name}: median {:8.2} ms over 9 runs ({len} records)",
            median(times)
        );
    }

    // Writes (a create's insert) while 7-day reports run on another thread,
    // against the same writes alone: how long does a report hold them up?
    let write = |i: u64| {
        let sid = id(1_000_000 + i);
        let mut rec = store
            .get_sandbox(&id(n - 1))
            .expect("get")
            .expect("a record");
        rec.id = sid;
        rec.state = SandboxState::Creating;
        let t = Instant::now();
        store.insert_sandbox(&rec, 1024).expect("insert");
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        store
            .transition(&id(1_000_000 + i), SandboxState::Failed, Some("bench"))
            .expect("end");
        ms
    };
    let alone: Vec<f64> = (0..200).map(write).collect();
    let during = std::thread::scope(|s| {
        let reports = s.spawn(|| {
            let q = StatsQuery {
                window_ms: WEEK_MS,
                ..StatsQuery::default()
            };
            for _ in 0..5 {
                store.stats(&q).expect("stats");
            }
        });
        let mut v = Vec::new();
        let mut i = 200;
        while !reports.is_finished() {
            v.push(write(i));
            i += 1;
        }
        v
    });
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "a write alone: median {:.3} ms, max {:.2} ms ({} writes); while 7-day reports run: \
         median {:.3} ms, max {:.2} ms ({} writes)",
        median(alone.clone()),
        max(&alone),
        alone.len(),
        median(during.clone()),
        max(&during),
        during.len()
    );

    // Prune the older half, a batch at a time, as the daemon does.
    let t = Instant::now();
    let mut batches = Vec::new();
    let mut pruned = 0;
    loop {
        let b = Instant::now();
        let k = store
            .prune_batch(NOW - WEEK_MS / 2, PRUNE_BATCH)
            .expect("prune");
        batches.push(b.elapsed().as_secs_f64() * 1000.0);
        pruned += k;
        if k < PRUNE_BATCH {
            break;
        }
    }
    let longest = batches.iter().copied().fold(0.0, f64::max);
    println!(
        "prune: {pruned} sandboxes (with their execs, transitions and events) in {:.2} s; \
         {} batches of at most {PRUNE_BATCH}, median {:.1} ms, longest {:.1} ms",
        t.elapsed().as_secs_f64(),
        batches.len(),
        median(batches),
        longest
    );

    // What a daemonless run's reaper pays when nothing is old enough.
    let mut noop = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let k = store
            .prune_batch(NOW - WEEK_MS / 2, PRUNE_BATCH)
            .expect("prune");
        assert_eq!(k, 0);
        noop.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "prune with nothing to prune: median {:.0} µs over 50",
        median(noop)
    );
}
