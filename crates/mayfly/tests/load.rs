//! Load and failure against a real daemon with a warm pool: K concurrent
//! clients create, exec and destroy with zero errors and zero leaks, and a
//! `kill -9` of the daemon in the middle of that load is reconciled on
//! restart: every record true, the pool refilled, nothing left behind.
//!
//! The full 10,000-sandbox run is `mayfly-bench pool` (docs/BENCHMARKS.md);
//! this keeps a smaller one in every test run.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mayfly_client::{Client, ClientError};
use mayfly_types::{CreateRequest, ErrorCode, SandboxSource, SandboxState};

#[derive(Default)]
struct Tally {
    done: AtomicUsize,
    from_pool: AtomicUsize,
    throttled: AtomicUsize,
    errors: std::sync::Mutex<Vec<String>>,
    latencies: std::sync::Mutex<Vec<Duration>>,
}

/// One client: create, exec `true`, destroy, until `left` runs out or
/// `stop` is set.
async fn client(c: Client, left: Arc<AtomicUsize>, stop: Arc<AtomicBool>, t: Arc<Tally>) {
    while !stop.load(Ordering::SeqCst)
        && left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        let t0 = Instant::now();
        let r: Result<SandboxSource, ClientError> = async {
            let sb = c.create(&CreateRequest::default()).await?;
            let e = c.exec(&sb.id, &cmd(&["true"])).await;
            c.destroy(&sb.id).await?;
            let e = e?;
            if e.status.exit_code != Some(0) {
                return Err(ClientError::Protocol {
                    request: format!("exec true in {}", sb.id),
                    reason: format!("{:?}", e.status),
                });
            }
            Ok(sb.source)
        }
        .await;
        match r {
            Ok(src) => {
                t.done.fetch_add(1, Ordering::SeqCst);
                if src == SandboxSource::Pool {
                    t.from_pool.fetch_add(1, Ordering::SeqCst);
                }
                t.latencies.lock().unwrap().push(t0.elapsed());
            }
            Err(ClientError::Api { error, .. }) if error.code == ErrorCode::ResourceExhausted => {
                t.throttled.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => t.errors.lock().unwrap().push(e.to_string()),
        }
    }
}

/// Starts `clients` load clients sharing `total` cycles; set the flag to
/// stop them early.
fn start_clients(
    c: &Client,
    clients: usize,
    total: usize,
) -> (
    Arc<AtomicBool>,
    Arc<Tally>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let left = Arc::new(AtomicUsize::new(total));
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let tasks = (0..clients)
        .map(|_| tokio::spawn(client(c.clone(), left.clone(), stop.clone(), tally.clone())))
        .collect();
    (stop, tally, tasks)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

/// Every record the store has, by id and state.
fn records(state: &std::path::Path) -> Vec<mayfly_store::SandboxRecord> {
    mayfly_store::Store::open(state)
        .expect("opening the store")
        .list_sandboxes(true)
        .expect("listing records")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_run_without_errors_or_leaks() {
    const CLIENTS: usize = 32;
    const TOTAL: usize = 600;
    let mut d = Daemon::start_with(&["--pool", "host=16,concurrency=2"]).await;
    let t = Instant::now();
    let (_stop, tally, tasks) = start_clients(&d.client, CLIENTS, TOTAL);
    for task in tasks {
        task.await.expect("a client panicked");
    }
    let wall = t.elapsed();
    let errors = tally.errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "{} errors, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
    let done = tally.done.load(Ordering::SeqCst);
    assert_eq!(done + tally.throttled.load(Ordering::SeqCst), TOTAL);
    let mut lat = tally.latencies.lock().unwrap().clone();
    eprintln!(
        "load: {CLIENTS} clients, {done} cycles in {:.2} s = {:.0}/s, {} from the pool; cycle p50 {:?}, p95 {:?}, p99 {:?}",
        wall.as_secs_f64(),
        done as f64 / wall.as_secs_f64(),
        tally.from_pool.load(Ordering::SeqCst),
        pct(&mut lat, 0.50),
        pct(&mut lat, 0.95),
        pct(&mut lat, 0.99),
    );
    d.assert_healthy().await;
    let state = d.state_dir.clone();
    d.stop();
    let recs = records(&state);
    assert!(
        recs.len() >= TOTAL,
        "{} records for {TOTAL} sandboxes",
        recs.len()
    );
    assert!(
        recs.iter().all(|r| r.state == SandboxState::Destroyed),
        "not every sandbox ended destroyed: {:?}",
        recs.iter().find(|r| r.state != SandboxState::Destroyed)
    );
    let ids: Vec<String> = recs.iter().map(|r| r.id.to_string()).collect();
    assert_no_leaks(&state, &ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_load_is_reconciled_on_restart() {
    let mut d = Daemon::start_with(&["--pool", "host=8,concurrency=2"]).await;
    let (stop, tally, tasks) = start_clients(&d.client, 16, usize::MAX);
    // Let the load run, then kill the daemon under it.
    let t = Instant::now();
    while tally.done.load(Ordering::SeqCst) < 100 && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        tally.done.load(Ordering::SeqCst) >= 100,
        "the load did not get going"
    );
    d.kill9();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("a client panicked");
    }
    let before = records(&d.state_dir);
    let t = Instant::now();
    d.restart().await;
    let up = t.elapsed();
    // Reconciliation runs before the daemon answers: within seconds.
    assert!(up < Duration::from_secs(10), "restart took {up:?}");
    let old: std::collections::BTreeSet<String> = before.iter().map(|r| r.id.to_string()).collect();
    let after = records(&d.state_dir);
    let mut live_old = Vec::new();
    for r in after.iter().filter(|r| old.contains(r.id.as_str())) {
        if !r.state.is_terminal() {
            live_old.push(r.id.to_string());
        }
    }
    assert!(
        live_old.is_empty(),
        "records of the killed daemon still live: {live_old:?}"
    );
    // The pool refills with new sandboxes: eight boots, two at a time, at
    // the pool's low CPU weight, which a busy host makes slow.
    let t = Instant::now();
    loop {
        let pools = d.client.pools().await.expect("pools");
        if pools.iter().any(|p| p.name == "host" && p.ready == 8) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the pool did not refill within 30 s of the restart: {pools:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every old sandbox is gone from the host: no cgroup, directory,
    // process or mount; and the daemon serves new work.
    let old_ids: Vec<String> = old.into_iter().collect();
    assert!(
        old_ids.len() > 100,
        "only {} sandboxes before the kill",
        old_ids.len()
    );
    assert_no_leaks(&d.state_dir, &old_ids);
    let sb = d.create().await;
    assert_eq!(d.sh(&sb.id, "echo ok").await, "ok\n");
    eprintln!(
        "kill -9 after {} cycles: restart and reconciliation of {} records in {:?}",
        tally.done.load(Ordering::SeqCst),
        old_ids.len(),
        up
    );
    let state = d.state_dir.clone();
    d.stop();
    let all: Vec<String> = records(&state).iter().map(|r| r.id.to_string()).collect();
    assert_no_leaks(&state, &all);
}
