//! Warm pools against a real daemon: claims are fresh and never reused,
//! misfits go cold and say so, unclaimed sandboxes are unreachable, and the
//! pool API refuses bad input.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use mayfly_client::ClientError;
use mayfly_types::{CreateRequest, ErrorCode, Limits, PoolInfo, PoolSpec, SandboxSource};

async fn pool(d: &Daemon, name: &str) -> PoolInfo {
    let pools = d.client.pools().await.expect("listing pools");
    pools
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no pool `{name}`"))
}

/// Waits until pool `name` holds `ready` unclaimed sandboxes.
async fn wait_ready(d: &Daemon, name: &str, ready: u32) -> PoolInfo {
    d.wait_pool(name, |p| p.ready == ready && p.filling == 0)
        .await
}

/// The ids of the live sandboxes waiting unclaimed in a pool, as the
/// store records them, oldest first.
fn unclaimed(d: &Daemon) -> Vec<String> {
    let store = mayfly_store::Store::open(&d.state_dir).expect("opening the store");
    store
        .list_sandboxes(false)
        .expect("listing records")
        .into_iter()
        .filter(|r| r.tenant.is_none())
        .map(|r| r.id.to_string())
        .collect()
}

/// A daemon whose `host` pool holds two unclaimed sandboxes, and their ids.
async fn two_waiting() -> (Daemon, Vec<String>) {
    let d = Daemon::start_with(&["--pool", "host=2,concurrency=2"]).await;
    wait_ready(&d, "host", 2).await;
    let waiting = unclaimed(&d);
    assert_eq!(waiting.len(), 2, "{waiting:?}");
    (d, waiting)
}

/// The ids of every live sandbox the store records.
fn live(d: &Daemon) -> Vec<String> {
    let store = mayfly_store::Store::open(&d.state_dir).expect("opening the store");
    store
        .list_sandboxes(false)
        .expect("listing records")
        .into_iter()
        .map(|r| r.id.to_string())
        .collect()
}

fn code(e: ClientError) -> ErrorCode {
    match e {
        ClientError::Api { error, .. } => error.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_claimed_sandbox_is_fresh_and_never_goes_back() {
    let d = Daemon::start_with(&["--pool", "host=2,concurrency=2"]).await;
    wait_ready(&d, "host", 2).await;
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..6 {
        let sb = d
            .create_with(&CreateRequest {
                labels: BTreeMap::from([("round".into(), round.to_string())]),
                env: BTreeMap::from([("GREETING".into(), format!("hi{round}"))]),
                ttl_secs: Some(120),
                ..CreateRequest::default()
            })
            .await;
        assert_eq!(sb.source, SandboxSource::Pool, "round {round}: {sb:?}");
        assert_eq!(sb.tenant.as_deref(), Some("default"));
        assert_eq!(sb.labels.get("round"), Some(&round.to_string()));
        assert!(seen.insert(sb.id.clone()), "{} was handed out twice", sb.id);
        // The TTL runs from the claim, not from the boot.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            sb.expires_at > now + 110_000 && sb.expires_at <= now + 121_000,
            "expires_at {} vs now {now}",
            sb.expires_at
        );
        // Nothing of an earlier claim is here, and the claim's env is.
        let out = d
            .sh(
                &sb.id,
                "ls -A /tmp; cat /marker 2>/dev/null; echo $GREETING; ps -e -o comm= | grep -c sleep || true",
            )
            .await;
        assert_eq!(
            out,
            format!("hi{round}\n0\n"),
            "round {round}: leftovers from an earlier claim"
        );
        d.sh(
            &sb.id,
            "echo dirty > /marker; echo x > /tmp/x; sleep 1000 & echo started",
        )
        .await;
        d.client.destroy(&sb.id).await.expect("destroy");
        // A destroyed sandbox stays destroyed: the pool never takes it back.
        let after = d.client.get(&sb.id).await.expect("get");
        assert!(
            matches!(
                after.state,
                mayfly_types::SandboxState::Stopping | mayfly_types::SandboxState::Destroyed
            ),
            "{after:?}"
        );
        wait_ready(&d, "host", 2).await;
    }
    let p = pool(&d, "host").await;
    assert_eq!(p.claims, 6);
    assert_eq!(p.misses, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_made_together_are_each_recorded_and_streamed() {
    let d = Daemon::start_with(&["--pool", "host=8,concurrency=4"]).await;
    wait_ready(&d, "host", 8).await;
    let mut stream = d.client.event_stream(None).await.expect("event stream");
    // Eight claims at once: their records are committed together, after
    // the answers.
    let claims: Vec<_> = (0..8)
        .map(|n| {
            let c = d.client.clone();
            tokio::spawn(async move {
                let req = CreateRequest {
                    labels: BTreeMap::from([("n".into(), n.to_string())]),
                    ..CreateRequest::default()
                };
                c.create(&req).await.expect("claim")
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for (n, c) in claims.into_iter().enumerate() {
        let sb = c.await.expect("claim task");
        assert_eq!(sb.source, SandboxSource::Pool, "{sb:?}");
        // A read right after the answer sees the claim's record.
        let rec = d.client.get(&sb.id).await.expect("the claimed record");
        assert_eq!(rec.tenant.as_deref(), Some("default"));
        assert_eq!(rec.labels.get("n"), Some(&n.to_string()), "{rec:?}");
        assert_eq!(rec.created_at, sb.created_at);
        assert!(ids.insert(sb.id.to_string()), "{} claimed twice", sb.id);
    }
    // Each claim is one stored `claimed` event, also published live.
    let mut streamed = std::collections::BTreeSet::new();
    while streamed.len() < ids.len() {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next_event())
            .await
            .unwrap_or_else(|_| panic!("claimed events streamed: {streamed:?} of {ids:?}"))
            .expect("no stream error")
            .expect("the stream stays open");
        if ev.kind == "claimed" {
            assert!(streamed.insert(ev.sandbox_id.clone().expect("its sandbox")));
        }
    }
    assert_eq!(streamed, ids);
    let stored: std::collections::BTreeSet<_> = d
        .client
        .events(0, 10_000)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == "claimed")
        .filter_map(|e| e.sandbox_id)
        .collect();
    assert_eq!(stored, ids);
    assert_eq!(pool(&d, "host").await.claims, 8);
}

/// A create whose limits fit no pool of the default spec (served cold).
async fn misfit(d: &Daemon) -> mayfly_types::SandboxInfo {
    d.create_limited(Limits {
        memory_bytes: Some(256 << 20),
        ..Limits::default()
    })
    .await
}

/// A sandbox's CPU weight file: v1 `cpu.shares`, v2 `cpu.weight`.
fn cpu_weight(id: &str) -> (String, u32) {
    let v1 = format!("/sys/fs/cgroup/cpu/mayfly/{id}/cpu.shares");
    let v2 = format!("/sys/fs/cgroup/mayfly/{id}/cpu.weight");
    for path in [v1, v2] {
        if let Ok(text) = std::fs::read_to_string(&path) {
            let w = text.trim().parse().expect("a weight");
            return (path, w);
        }
    }
    panic!("sandbox {id} has no cpu.shares or cpu.weight file");
}

#[tokio::test]
async fn pool_sandboxes_wait_at_a_low_cpu_weight_and_get_the_default_when_claimed() {
    let (d, waiting) = two_waiting().await;
    // v1 `cpu.shares` defaults to 1024, v2 `cpu.weight` to 100.
    let v1 = cpu_weight(&waiting[0]).0.ends_with("cpu.shares");
    let (low, default) = if v1 { (64, 1024) } else { (6, 100) };
    for id in &waiting {
        let (path, w) = cpu_weight(id);
        assert_eq!(w, low, "{path}: a pooled sandbox's weight");
    }
    let sb = d.create().await;
    assert_eq!(sb.source, SandboxSource::Pool);
    // The claim's record is committed once a read of it answers.
    d.client.get(&sb.id).await.expect("the claimed record");
    let (path, w) = cpu_weight(sb.id.as_str());
    assert_eq!(w, default, "{path}: a claimed sandbox's weight");
    // A cold create never had a low weight.
    let cold = misfit(&d).await;
    assert_eq!(cold.source, SandboxSource::Cold);
    assert_eq!(cpu_weight(cold.id.as_str()).1, default);
}

#[tokio::test]
async fn a_create_that_does_not_fit_goes_cold_and_says_so() {
    let d = Daemon::start_with(&["--pool", "host=1"]).await;
    wait_ready(&d, "host", 1).await;
    let other = misfit(&d).await;
    assert_eq!(other.source, SandboxSource::Cold);
    let p = pool(&d, "host").await;
    assert_eq!((p.claims, p.misses, p.ready), (0, 0, 1), "{p:?}");
    // An empty pool: the create is served cold and counted as a miss.
    d.client.drain_pool("host").await.expect("drain");
    let cold = d.create().await;
    assert_eq!(cold.source, SandboxSource::Cold);
    assert!(cold.create_ms.unwrap_or(0.0) > 0.0);
    let p = pool(&d, "host").await;
    assert_eq!((p.target, p.ready, p.misses), (0, 0, 1), "{p:?}");
    // The CLI says where a sandbox came from.
    let out = d.run_cli(&["--json", "create"]);
    let info: mayfly_types::SandboxInfo =
        serde_json::from_slice(&out.stdout).expect("create --json prints the sandbox");
    assert_eq!(info.source, SandboxSource::Cold);
}

#[tokio::test]
async fn unclaimed_sandboxes_cannot_be_reached() {
    let (d, waiting) = two_waiting().await;
    let listed = d.client.list(false).await.expect("list");
    assert!(
        listed.is_empty(),
        "unclaimed sandboxes are listed: {listed:?}"
    );
    for id in &waiting {
        let id: mayfly_types::SandboxId = id.parse().expect("a sandbox id");
        assert_eq!(
            code(d.client.get(&id).await.unwrap_err()),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(d.client.exec(&id, &cmd(&["true"])).await.unwrap_err()),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(d.client.read_file(&id, "/etc/hostname").await.unwrap_err()),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(d.client.destroy(&id).await.unwrap_err()),
            ErrorCode::NotFound
        );
    }
    // Still both there, untouched, and claimable.
    assert_eq!(pool(&d, "host").await.ready, 2);
    let sb = d.create().await;
    assert!(
        waiting.contains(&sb.id.to_string()),
        "claimed {} not from {waiting:?}",
        sb.id
    );
}

#[tokio::test]
async fn pool_settings_change_live_and_bad_ones_are_refused() {
    let d = Daemon::start_with(&["--pool", "host=1"]).await;
    let first = wait_ready(&d, "host", 1).await;
    assert_eq!(first.limits, mayfly_types::ResolvedLimits::DEFAULT);
    let before = unclaimed(&d);
    // New limits: the waiting sandbox no longer fits and is replaced.
    let spec = PoolSpec {
        target: Some(3),
        max: Some(4),
        refill_concurrency: Some(1),
        limits: Limits {
            memory_bytes: Some(128 << 20),
            ..Limits::default()
        },
        ..PoolSpec::default()
    };
    let p = d.client.set_pool("host", &spec).await.expect("set");
    assert_eq!((p.target, p.max, p.refill_concurrency), (3, 4, 1));
    // Refill boots one at a time: watched until the pool is full.
    let mut most_filling = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let p = pool(&d, "host").await;
        most_filling = most_filling.max(p.filling);
        if p.ready == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pool `host` did not reach 3 ready within 30 s: {p:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(most_filling, 1, "refill concurrency 1 was exceeded");
    wait_ready(&d, "host", 3).await;
    assert!(
        eventually(Duration::from_secs(15), || !live(&d).contains(&before[0])).await,
        "the sandbox that no longer fits was not destroyed; log:\n{}",
        d.log()
    );
    let sb = d
        .create_limited(Limits {
            memory_bytes: Some(128 << 20),
            ..Limits::default()
        })
        .await;
    assert_eq!(sb.source, SandboxSource::Pool);
    assert_eq!(sb.limits.memory_bytes, 128 << 20);

    // A second pool for a `dir:` template.
    let p = d
        .client
        .set_pool(
            "rootdir",
            &PoolSpec {
                template: Some("dir:/".into()),
                target: Some(1),
                ..PoolSpec::default()
            },
        )
        .await
        .expect("a second pool");
    assert_eq!(p.template, "dir:/");
    wait_ready(&d, "rootdir", 1).await;
    let sb = d
        .create_with(&CreateRequest {
            template: Some("dir:/".parse().unwrap()),
            ..CreateRequest::default()
        })
        .await;
    assert_eq!(sb.source, SandboxSource::Pool);

    for (name, bad) in [
        (
            "host",
            PoolSpec {
                target: Some(5),
                max: Some(2),
                ..PoolSpec::default()
            },
        ),
        (
            "host",
            PoolSpec {
                refill_concurrency: Some(0),
                ..PoolSpec::default()
            },
        ),
        (
            "host",
            PoolSpec {
                max: Some(1 << 30),
                ..PoolSpec::default()
            },
        ),
        (
            "host",
            PoolSpec {
                template: Some("docker:x".into()),
                ..PoolSpec::default()
            },
        ),
        (
            "host",
            PoolSpec {
                template: Some("dir:/nonexistent".into()),
                ..PoolSpec::default()
            },
        ),
        (
            "host",
            PoolSpec {
                limits: Limits {
                    memory_bytes: Some(1),
                    ..Limits::default()
                },
                ..PoolSpec::default()
            },
        ),
        ("Bad.Name", PoolSpec::default()),
    ] {
        let e = d.client.set_pool(name, &bad).await.unwrap_err();
        assert_eq!(code(e), ErrorCode::InvalidArgument, "{name} {bad:?}");
    }
    assert_eq!(
        code(d.client.drain_pool("nope").await.unwrap_err()),
        ErrorCode::NotFound
    );
    let out = d.run_cli(&["pool", "set", "host", "--target", "9", "--max", "2"]);
    let err = expect_exit(&out, 125, "pool set with target above max");
    assert!(err.is_empty());
    assert!(text(&out.stderr).contains("target 9 is above max 2"));
    let out = d.run_cli(&["pool", "ls"]);
    let table = expect_exit(&out, 0, "pool ls");
    assert!(
        table.contains("rootdir") && table.contains("dir:/"),
        "{table}"
    );

    // Drain destroys the waiting sandboxes and stops refill. Both pools
    // first refill what was claimed from them above.
    wait_ready(&d, "host", 3).await;
    wait_ready(&d, "rootdir", 1).await;
    let waiting: Vec<String> = unclaimed(&d);
    assert_eq!(
        waiting.len(),
        4,
        "3 for host and 1 for rootdir: {waiting:?}"
    );
    let p = d.client.drain_pool("host").await.expect("drain");
    assert_eq!((p.target, p.ready), (0, 0));
    assert!(
        eventually(Duration::from_secs(15), || unclaimed(&d).len() == 1).await,
        "drained sandboxes stayed: {:?}; log:\n{}",
        unclaimed(&d),
        d.log()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(pool(&d, "host").await.ready, 0, "a drained pool refilled");
}

#[tokio::test]
async fn a_daemon_with_a_pool_leaves_nothing_behind() {
    let mut d = Daemon::start_with(&["--pool", "host=3,concurrency=3"]).await;
    wait_ready(&d, "host", 3).await;
    let claimed = d.create().await;
    wait_ready(&d, "host", 3).await;
    let mut ids = live(&d);
    assert_eq!(ids.len(), 4, "{ids:?}");
    // kill -9, restart: recovery removes every sandbox of the dead daemon,
    // claimed or not, and the pool refills with new ones.
    d.kill9();
    d.restart().await;
    wait_ready(&d, "host", 3).await;
    let now = live(&d);
    assert!(
        ids.iter().all(|i| !now.contains(i)),
        "sandboxes of the killed daemon survived: {ids:?} vs {now:?}"
    );
    let rec = d.client.get(&claimed.id).await.expect("the claimed record");
    assert_eq!(rec.state, mayfly_types::SandboxState::Failed);
    ids.extend(now);
    let state = d.state_dir.clone();
    d.stop();
    assert_no_leaks(&state, &ids);
}
