//! The store's history is bounded: at start (and every 10 minutes) the
//! daemon prunes ended sandboxes older than `--history`, with their exec
//! audit and events, and keeps newer ones and every live one.

mod common;

use std::time::{Duration, Instant};

use common::daemonless::{assert_runs_cleaned, drain_spares};
use common::history::age_end;
use common::{cmd, daemonless, expect_exit, test_dir, Daemon};
use mayfly_types::CreateRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_prunes_history_older_than_the_setting_and_keeps_the_rest() {
    let mut d = Daemon::start_with(&["--history", "30d", "--pool", "host=0"]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let sb = d
            .client
            .create(&CreateRequest::default())
            .await
            .expect("create");
        d.client.exec(&sb.id, &cmd(&["true"])).await.expect("exec");
        ids.push(sb.id);
    }
    let (old, recent, live) = (&ids[0], &ids[1], &ids[2]);
    for id in [old, recent] {
        d.client.destroy(id).await.expect("destroy");
    }
    d.stop();
    age_end(&d.state_dir, old.as_str(), 31);
    age_end(&d.state_dir, recent.as_str(), 29);
    d.restart().await;

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let all = d.client.list(true).await.expect("list");
        if all.iter().all(|s| &s.id != old) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{old} (ended 31 days ago) was not pruned within 15 s; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(d.client.audit(old).await.map_or(true, |a| a.is_empty()));
    let events = d.client.events(0, 10_000).await.expect("events");
    assert!(
        events
            .iter()
            .all(|e| e.sandbox_id.as_deref() != Some(old.as_str())),
        "the pruned sandbox's events are gone"
    );
    // Ended 29 days ago: kept, with its audit and events.
    let all = d.client.list(true).await.expect("list");
    assert!(all.iter().any(|s| &s.id == recent), "{all:?}");
    assert_eq!(d.client.audit(recent).await.expect("audit").len(), 1);
    assert!(events
        .iter()
        .any(|e| e.sandbox_id.as_deref() == Some(recent.as_str())));
    assert!(
        d.log().contains("pruned ended sandboxes' history"),
        "{}",
        d.log()
    );
    // The live one was recovered (or destroyed by the stop) but never
    // pruned: its record is there either way.
    assert!(all.iter().any(|s| &s.id == live), "{all:?}");

    // A long history is listed from its newest end, as far as `limit`.
    let newest = d.client.list_recent(true, Some(1)).await.expect("list");
    assert_eq!(newest.len(), 1, "{newest:?}");
    assert_eq!(&newest[0].id, live, "the last created");
    let out = d.run_cli(&["ps", "-a", "--limit", "2", "-q"]);
    let printed = expect_exit(&out, 0, "mayfly ps -a --limit 2 -q");
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        [recent.as_str(), live.as_str()]
    );
    let out = d.run_cli(&["ps", "--limit", "2"]);
    assert_ne!(out.status.code(), Some(0), "--limit needs -a");
}

/// Without a daemon: each run's reaper prunes one batch after its run.
#[test]
fn a_daemonless_run_prunes_old_history_without_a_daemon() {
    common::require_root();
    let dir = test_dir();
    expect_exit(&daemonless(&dir, &["run", "--", "true"]), 0, "mayfly run");
    let first = assert_runs_cleaned(&dir);
    let ended: Vec<_> = first
        .iter()
        .filter(|r| r.state == mayfly_types::SandboxState::Destroyed)
        .collect();
    assert_eq!(ended.len(), 1, "{first:?}");
    let old = ended[0].id.clone();
    age_end(&dir.path().join("state"), old.as_str(), 31);

    expect_exit(&daemonless(&dir, &["run", "--", "true"]), 0, "mayfly run");
    let after = assert_runs_cleaned(&dir);
    assert!(
        after.iter().all(|r| r.id != old),
        "the run ended 31 days ago is still recorded: {after:?}"
    );
    assert!(
        after
            .iter()
            .any(|r| r.state == mayfly_types::SandboxState::Destroyed),
        "the second run is recorded: {after:?}"
    );
    drain_spares(&dir);
}
