//! Observability on the real daemon: OOM kills (event, metric, end reason),
//! usage read from cgroups and upper layers (and not fooled by symlinks),
//! metrics checked by a real OpenMetrics parser, the event stream under
//! concurrent creates, and stats by task label through the CLI.

mod common;

#[path = "../../mayfly-server/tests/support/openmetrics.rs"]
mod openmetrics;

use std::time::Duration;

use common::events::{events_of, wait_for_event};
use common::{expect_exit, Daemon};
use mayfly_types::{CreateRequest, Event, Limits, SandboxState, StartProcessRequest};

/// Allocates and touches 256 MiB: far beyond a 32 MiB sandbox.
const HOG: &[&str] = &["python3", "-c", "b = bytearray(b'x') * (256 << 20)"];

fn small() -> CreateRequest {
    CreateRequest {
        limits: Limits {
            memory_bytes: Some(32 << 20),
            ..Limits::default()
        },
        ..CreateRequest::default()
    }
}

async fn metrics(d: &Daemon) -> std::collections::BTreeMap<String, openmetrics::Family> {
    openmetrics::parse(&d.client.metrics().await.expect("GET /metrics"))
}

#[tokio::test]
async fn an_exec_killed_by_the_oom_killer_is_an_oom_kill_event_and_metric() {
    let d = Daemon::start().await;
    let before = metrics(&d).await;
    assert_eq!(
        openmetrics::value(&before, "mayfly_oom_kills_total", &[]),
        Some(0.0)
    );
    let sb = d.create_with(&small()).await;
    let r = d.exec(&sb.id, HOG).await;
    assert_eq!(
        r.status.signal,
        Some(9),
        "the hog is SIGKILLed: {:?}",
        r.status
    );
    let ev = wait_for_event(&d, &sb.id, "oom_kill").await;
    assert_eq!(ev.detail["count"], 1, "{ev:?}");
    assert_eq!(ev.detail["total"], 1, "{ev:?}");
    let m = metrics(&d).await;
    assert_eq!(
        openmetrics::value(&m, "mayfly_oom_kills_total", &[]),
        Some(1.0)
    );
    let u = d.client.usage(&sb.id).await.expect("usage");
    assert_eq!(u.oom_kills, Some(1));
    // A shell reports its child's SIGKILL as 137; that is looked at too.
    let script = format!("{} -c \"{}\"", HOG[0], HOG[2]);
    let r = d.exec(&sb.id, &["sh", "-c", &script]).await;
    assert_eq!(r.status.exit_code, Some(137), "{:?}", r.status);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while events_of(&d, &sb.id, "oom_kill").await.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no second oom_kill event within 30 s: {:?}; log:\n{}",
            events_of(&d, &sb.id, "oom_kill").await,
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = metrics(&d).await;
    assert_eq!(
        openmetrics::value(&m, "mayfly_oom_kills_total", &[]),
        Some(2.0)
    );
    // The sandbox lives on; the next exec works, and a later destroy does
    // not count the same kill again.
    assert_eq!(d.exec(&sb.id, &["true"]).await.status.exit_code, Some(0));
    d.client.destroy(&sb.id).await.expect("destroy");
    wait_for_event(&d, &sb.id, "destroyed").await;
    assert_eq!(events_of(&d, &sb.id, "oom_kill").await.len(), 2);
}

#[tokio::test]
async fn a_sandbox_whose_init_the_oom_killer_takes_ends_as_oom() {
    let d = Daemon::start().await;
    let sb = d.create_with(&small()).await;
    let init = sb.init_pid.expect("a live sandbox has an init");
    // Mark init as the OOM killer's first choice: its score gains the whole
    // limit, more than any one of the small hogs below can reach. (Raising
    // a score needs no privilege; lowering one does.)
    std::fs::write(format!("/proc/{init}/oom_score_adj"), "1000").expect("raising init's score");
    // Eight processes of 6 MiB each: together far beyond the 32 MiB.
    let hogs = "for i in 1 2 3 4 5 6 7 8; do python3 -c \
        'import time; b = bytearray(b\"x\") * (6 << 20); time.sleep(60)' & done; wait";
    let req = StartProcessRequest {
        argv: vec!["sh".into(), "-c".into(), hogs.into()],
        ..StartProcessRequest::default()
    };
    d.client
        .start_process(&sb.id, &req)
        .await
        .expect("starting the hogs");
    let ev = wait_for_event(&d, &sb.id, "destroyed").await;
    assert_eq!(ev.detail["reason"], "oom", "{ev:?}");
    let info = d.client.get(&sb.id).await.expect("get");
    assert_eq!(
        (info.state, info.reason.as_deref()),
        (SandboxState::Destroyed, Some("oom"))
    );
    assert!(!events_of(&d, &sb.id, "oom_kill").await.is_empty());
    let m = metrics(&d).await;
    assert_eq!(
        openmetrics::value(&m, "mayfly_sandboxes_ended_total", &[("reason", "oom")]),
        Some(1.0)
    );
}

#[tokio::test]
async fn usage_rises_with_cpu_and_files_and_a_symlink_to_root_adds_nothing() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let u0 = d.client.usage(&sb.id).await.expect("usage");
    assert_eq!(u0.memory_limit_bytes, sb.limits.memory_bytes);
    assert!(u0.pids >= 1, "{u0:?}");
    assert!(u0.memory_bytes > 0, "{u0:?}");
    assert!(!u0.disk.truncated, "{u0:?}");

    d.sh(
        &sb.id,
        // Burns until the process itself has used 0.5 s of CPU (however
        // busy the host is), all of it charged to the sandbox's cgroup.
        "python3 -c 'import time\nwhile time.process_time() < 0.5: pass'",
    )
    .await;
    let u1 = d.client.usage(&sb.id).await.expect("usage");
    let burnt = u1.cpu_seconds.expect("cpu time") - u0.cpu_seconds.expect("cpu time");
    assert!(burnt >= 0.5, "0.5 s of CPU burnt shows as {burnt} s");

    d.sh(
        &sb.id,
        "head -c 8388608 /dev/urandom > /workspace/blob && sync",
    )
    .await;
    let u2 = d.client.usage(&sb.id).await.expect("usage");
    assert!(
        u2.disk.bytes >= u1.disk.bytes + (8 << 20),
        "8 MiB written: {:?} then {:?}",
        u1.disk,
        u2.disk
    );
    assert!(u2.memory_peak_bytes.expect("peak") >= u2.memory_bytes.min(1));

    d.sh(
        &sb.id,
        "ln -s / /workspace/host && ln -s /usr /workspace/usr && ln -s . /workspace/self \
         && mkdir -p /workspace/d && ln -s ../.. /workspace/d/up",
    )
    .await;
    let u3 = d.client.usage(&sb.id).await.expect("usage");
    assert!(!u3.disk.truncated, "{:?}", u3.disk);
    assert!(
        u3.disk.bytes < u2.disk.bytes + (256 << 10),
        "links to / and /usr add no more than their own blocks: {:?} then {:?}",
        u2.disk,
        u3.disk
    );
    assert!(
        u3.disk.entries <= u2.disk.entries + 6,
        "{:?} then {:?}",
        u2.disk,
        u3.disk
    );

    // `mayfly top` shows it, as a table and as JSON.
    let out = d.run_cli(&["top"]);
    let table = expect_exit(&out, 0, "mayfly top");
    assert!(
        table.contains(sb.id.as_str()) && table.contains("DISK"),
        "{table}"
    );
    let out = d.run_cli(&["--json", "top"]);
    let rows: serde_json::Value =
        serde_json::from_str(&expect_exit(&out, 0, "mayfly top --json")).expect("JSON");
    let row = rows
        .as_array()
        .and_then(|r| r.iter().find(|r| r["id"] == sb.id.as_str()))
        .unwrap_or_else(|| panic!("{rows}"));
    assert!(row["disk"]["bytes"].as_u64().unwrap() >= 8 << 20, "{row}");
    assert_eq!(row["tenant"], "default");
}

#[tokio::test]
async fn metrics_of_a_real_daemon_parse_and_count_what_happened() {
    // No pool at start, so every create below is cold; the pool's own
    // figures are checked at the end.
    let d = Daemon::start_with(&["--max-ttl", "1h", "--pool", "host=0"]).await;
    let a = d.create().await;
    let b = d.create().await;
    let ttl = d
        .create_with(&CreateRequest {
            ttl_secs: Some(1),
            ..CreateRequest::default()
        })
        .await;
    d.exec(&a.id, &["true"]).await;
    d.client.destroy(&b.id).await.expect("destroy");
    wait_for_event(&d, &b.id, "destroyed").await;
    wait_for_event(&d, &ttl.id, "destroyed").await;
    let m = metrics(&d).await;
    let v = |name: &str, labels: &[(&str, &str)]| openmetrics::value(&m, name, labels);
    assert_eq!(v("mayfly_creates_total", &[("source", "cold")]), Some(3.0));
    assert_eq!(
        v("mayfly_create_seconds_count", &[("source", "cold")]),
        Some(3.0)
    );
    assert!(v("mayfly_create_seconds_sum", &[("source", "cold")]).unwrap() > 0.0);
    assert_eq!(v("mayfly_exec_seconds_count", &[]), Some(1.0));
    assert_eq!(v("mayfly_destroy_seconds_count", &[]), Some(2.0));
    assert_eq!(
        v("mayfly_sandboxes_ended_total", &[("reason", "user")]),
        Some(1.0)
    );
    assert_eq!(
        v("mayfly_sandboxes_ended_total", &[("reason", "ttl")]),
        Some(1.0)
    );
    assert_eq!(v("mayfly_ttl_kills_total", &[]), Some(1.0));
    assert_eq!(
        v(
            "mayfly_live_sandboxes",
            &[("tenant", "default"), ("template", "host")]
        ),
        Some(1.0)
    );

    // A pool: its fill is a gauge, and a claim counts as a pool create
    // with its claim time.
    let spec = mayfly_types::PoolSpec {
        target: Some(1),
        ..Default::default()
    };
    d.client.set_pool("warm", &spec).await.expect("set pool");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let m = metrics(&d).await;
        let ready = openmetrics::value(&m, "mayfly_pool_ready", &[("pool", "warm")]);
        if ready == Some(1.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pool gauge did not show the booted sandbox within 15 s: {ready:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = d.create().await;
    assert_eq!(c.source, mayfly_types::SandboxSource::Pool);
    // The claim is counted from its `claimed` event, which is committed
    // just after the claim is answered; a read of the claimed sandbox
    // answers once it is, and a scrape sees every event committed before
    // it.
    d.client.get(&c.id).await.expect("the claimed record");
    let m = metrics(&d).await;
    let v = |name: &str, labels: &[(&str, &str)]| openmetrics::value(&m, name, labels);
    assert_eq!(v("mayfly_creates_total", &[("source", "pool")]), Some(1.0));
    assert_eq!(v("mayfly_claim_seconds_count", &[]), Some(1.0));
    assert_eq!(v("mayfly_creates_total", &[("source", "cold")]), Some(3.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_has_no_gap_or_repeat_under_concurrent_creates() {
    let d = Daemon::start().await;
    let first = d.create().await;
    let mut stream = d.client.event_stream(Some(0)).await.expect("event stream");
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let c = d.client.clone();
            tokio::spawn(async move {
                for _ in 0..6 {
                    let sb = c.create(&CreateRequest::default()).await.expect("create");
                    c.destroy(&sb.id).await.expect("destroy");
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    d.client.destroy(&first.id).await.expect("destroy");
    // Every destroy has finished once all 13 `destroyed` events are stored.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let all = loop {
        let all = d.client.events(0, 10_000).await.expect("events");
        let destroyed = all.iter().filter(|e| e.kind == "destroyed").count();
        if destroyed == 13 {
            break all;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{destroyed} of 13 `destroyed` events within 30 s: {all:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let last = all.last().expect("events").seq;
    let mut streamed = Vec::new();
    while streamed.last().map(|e: &Event| e.seq) != Some(last) {
        let next = tokio::time::timeout(Duration::from_secs(10), stream.next_event())
            .await
            .expect("the stream keeps up")
            .expect("no stream error")
            .expect("the stream stays open");
        streamed.push(next);
    }
    assert_eq!(
        streamed, all,
        "the stream is exactly the stored events, in order"
    );
}

#[tokio::test]
async fn stats_group_iterations_and_execs_by_task_label() {
    // Cold creates only: the spin-up figures below are the cold ones.
    let d = Daemon::start_with(&["--pool", "host=0"]).await;
    let labeled = |task: &str| CreateRequest {
        labels: [("task".to_owned(), task.to_owned())].into(),
        ..CreateRequest::default()
    };
    for _ in 0..3 {
        let sb = d.create_with(&labeled("fix-bug")).await;
        d.exec(&sb.id, &["true"]).await;
        d.exec(&sb.id, &["false"]).await;
    }
    d.create_with(&labeled("lint")).await;

    let out = d.run_cli(&["--json", "stats", "--window", "10m"]);
    let r: mayfly_types::StatsReport =
        serde_json::from_str(&expect_exit(&out, 0, "mayfly stats --json")).expect("a report");
    assert_eq!(r.spin_up.cold.count, 4);
    let (p50, p95, p99) = (
        r.spin_up.cold.p50_ms.unwrap(),
        r.spin_up.cold.p95_ms.unwrap(),
        r.spin_up.cold.p99_ms.unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p95 && p95 <= p99, "{:?}", r.spin_up);
    assert_eq!((r.execs.total, r.execs.ok, r.execs.failed), (6, 3, 3));
    let fix = r
        .tasks
        .iter()
        .find(|t| t.task.as_deref() == Some("fix-bug"))
        .expect("fix-bug");
    assert_eq!((fix.iterations, fix.execs), (3, 6));
    let windows: u64 = fix.windows.iter().map(|w| w.iterations).sum();
    assert_eq!(windows, 3, "{fix:?}");

    let out = d.run_cli(&["stats", "--window", "10m", "--task", "lint"]);
    let text = expect_exit(&out, 0, "mayfly stats --task lint");
    assert!(text.contains("lint") && !text.contains("fix-bug"), "{text}");
    let out = d.run_cli(&["stats", "--window", "nonsense"]);
    assert_ne!(out.status.code(), Some(0));
}

#[tokio::test]
async fn polling_a_sandbox_s_usage_does_not_keep_it_from_idling_out() {
    let d = Daemon::start().await;
    let sb = d
        .create_with(&CreateRequest {
            idle_timeout_secs: Some(2),
            ..CreateRequest::default()
        })
        .await;
    let t = std::time::Instant::now();
    let info = loop {
        // A dashboard's poll; once the sandbox is gone, 404 or 409.
        let _ = d.client.usage(&sb.id).await;
        let info = d.client.get(&sb.id).await.unwrap();
        if info.state.is_terminal() {
            break info;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "usage polls kept the sandbox alive: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(info.reason.as_deref(), Some("idle"), "{info:?}");
}
