//! The store's history is bounded: at start (and every 10 minutes) the
//! daemon prunes ended sandboxes older than `--history`, with their exec
//! audit and events, and keeps newer ones and every live one.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{cmd, Daemon};
use mayfly_types::CreateRequest;

const DAY_MS: u64 = 86_400_000;

/// Moves a sandbox's end `days` into the past, in the daemon's database
/// (the daemon is stopped), with Debian's python3 and its sqlite3 module.
fn age(d: &Daemon, id: &str, days: u64) {
    let db = d.state_dir.join("mayfly.db");
    let script = format!(
        "import sqlite3, sys\n\
         c = sqlite3.connect(sys.argv[1])\n\
         n = c.execute('UPDATE sandboxes SET ended_at = ended_at - {} WHERE id = ?', (sys.argv[2],)).rowcount\n\
         c.commit()\n\
         assert n == 1, n\n",
        days * DAY_MS
    );
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .arg(&db)
        .arg(id)
        .output()
        .expect("running python3 (apt-get install python3)");
    assert!(
        out.status.success(),
        "ageing {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_prunes_history_older_than_the_setting_and_keeps_the_rest() {
    let mut d = Daemon::start_with(&["--history", "30d"]).await;
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
    age(&d, old.as_str(), 31);
    age(&d, recent.as_str(), 29);
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
}
