//! `GET /metrics`: OpenMetrics text that a real parser accepts, with
//! counters and histograms fed by events, exec timing from the handler, and
//! gauges computed at scrape time.

mod support;

use http::{Method, StatusCode};
use serde_json::json;
use support::openmetrics::{parse, value};
use support::*;

async fn scrape(router: &axum::Router) -> String {
    let a = send(router, empty_req(Method::GET, "/metrics")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some(mayfly_server::CONTENT_TYPE_OPENMETRICS)
    );
    String::from_utf8(a.body.to_vec()).expect("metrics are text")
}

#[tokio::test]
async fn every_metric_is_declared_and_parses_before_anything_happened() {
    let (router, _) = test_app();
    let m = parse(&scrape(&router).await);
    let kind = |name: &str| m.get(name).map(|f| f.kind.as_str());
    for name in [
        "mayfly_create_seconds",
        "mayfly_claim_seconds",
        "mayfly_exec_seconds",
        "mayfly_destroy_seconds",
    ] {
        assert_eq!(kind(name), Some("histogram"), "{name}");
        assert_eq!(m[name].unit, "seconds");
    }
    for name in ["mayfly_oom_kills", "mayfly_ttl_kills", "mayfly_creates"] {
        assert_eq!(kind(name), Some("counter"), "{name}");
    }
    // A family with labels shows once it has a label set: the failures,
    // ends, live and pool gauges appear with their first sample (see the
    // tests below); the create counters and histograms have both sources
    // from the start.
    for source in ["cold", "pool"] {
        assert_eq!(
            value(&m, "mayfly_creates_total", &[("source", source)]),
            Some(0.0)
        );
        assert_eq!(
            value(&m, "mayfly_create_seconds_count", &[("source", source)]),
            Some(0.0)
        );
    }
    assert_eq!(value(&m, "mayfly_oom_kills_total", &[]), Some(0.0));
    assert_eq!(value(&m, "mayfly_exec_seconds_count", &[]), Some(0.0));
}

#[tokio::test]
async fn events_and_execs_are_counted_and_timed() {
    let (router, fake) = test_app();
    let a = create(&router).await;
    let b = create(&router).await;
    fake.emit(
        Some(&a.id),
        "ready",
        json!({"create_ms": 3.0, "source": "cold"}),
    );
    fake.emit(
        Some(&b.id),
        "ready",
        json!({"create_ms": 0.2, "source": "cold"}),
    );
    // Booted ahead for a pool: not a create; its claim is.
    fake.emit(
        Some(&b.id),
        "ready",
        json!({"create_ms": 4.0, "pool": "py"}),
    );
    fake.emit(
        Some(&b.id),
        "claimed",
        json!({"claim_us": 450, "pool": "py", "tenant": "t"}),
    );
    fake.emit(None, "failed", json!({"reason": "internal", "error": "x"}));
    fake.emit(Some(&a.id), "oom_kill", json!({"count": 2, "total": 2}));
    fake.emit(
        Some(&a.id),
        "destroyed",
        json!({"reason": "ttl", "destroy_ms": 1.5}),
    );
    fake.emit(
        Some(&b.id),
        "destroyed",
        json!({"reason": "user; cgroup removal failed"}),
    );
    let r = send(
        &router,
        json_req(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", a.id),
            r#"{"argv":["echo","hi"]}"#,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);

    let m = parse(&scrape(&router).await);
    let v = |name: &str, labels: &[(&str, &str)]| {
        value(&m, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?}"))
    };
    assert_eq!(v("mayfly_creates_total", &[("source", "cold")]), 2.0);
    assert_eq!(v("mayfly_creates_total", &[("source", "pool")]), 1.0);
    assert_eq!(v("mayfly_create_seconds_count", &[("source", "cold")]), 2.0);
    assert!((v("mayfly_create_seconds_sum", &[("source", "cold")]) - 0.0032).abs() < 1e-9);
    // 0.2 ms lands in the 0.25 ms bucket, 3 ms only from 5 ms up.
    assert_eq!(
        v(
            "mayfly_create_seconds_bucket",
            &[("source", "cold"), ("le", "0.00025")]
        ),
        1.0
    );
    assert_eq!(
        v(
            "mayfly_create_seconds_bucket",
            &[("source", "cold"), ("le", "0.0025")]
        ),
        1.0
    );
    assert_eq!(
        v(
            "mayfly_create_seconds_bucket",
            &[("source", "cold"), ("le", "0.005")]
        ),
        2.0
    );
    assert_eq!(v("mayfly_create_seconds_count", &[("source", "pool")]), 1.0);
    assert_eq!(v("mayfly_claim_seconds_count", &[]), 1.0);
    assert!((v("mayfly_claim_seconds_sum", &[]) - 0.00045).abs() < 1e-12);
    assert_eq!(
        v("mayfly_create_failures_total", &[("reason", "internal")]),
        1.0
    );
    assert_eq!(v("mayfly_oom_kills_total", &[]), 2.0);
    assert_eq!(v("mayfly_ttl_kills_total", &[]), 1.0);
    assert_eq!(v("mayfly_sandboxes_ended_total", &[("reason", "ttl")]), 1.0);
    assert_eq!(
        v("mayfly_sandboxes_ended_total", &[("reason", "user")]),
        1.0
    );
    assert_eq!(v("mayfly_destroy_seconds_count", &[]), 1.0);
    assert_eq!(v("mayfly_exec_seconds_count", &[]), 1.0);
    // Two sandboxes made through the API are live in the default tenant.
    assert_eq!(
        v(
            "mayfly_live_sandboxes",
            &[("tenant", "default"), ("template", "host")]
        ),
        2.0
    );

    // A second scrape does not count the same events again.
    let m2 = parse(&scrape(&router).await);
    assert_eq!(
        value(&m2, "mayfly_creates_total", &[("source", "cold")]),
        Some(2.0)
    );
    assert_eq!(value(&m2, "mayfly_oom_kills_total", &[]), Some(2.0));
}

#[tokio::test]
async fn live_gauges_follow_the_sandboxes_and_drop_label_sets_that_are_gone() {
    let (router, _) = test_app();
    let a = create(&router).await;
    let m = parse(&scrape(&router).await);
    assert_eq!(
        value(&m, "mayfly_live_sandboxes", &[("tenant", "default")]),
        Some(1.0)
    );
    send(
        &router,
        empty_req(Method::DELETE, &format!("/v1/sandboxes/{}", a.id)),
    )
    .await;
    let m = parse(&scrape(&router).await);
    assert_eq!(
        value(&m, "mayfly_live_sandboxes", &[("tenant", "default")]),
        None
    );
}

#[tokio::test]
async fn hostile_label_values_are_escaped_and_still_parse() {
    let (router, _) = test_app();
    let weird = "dir:/tmp/a\\\"b\nc}d=\"e\"{";
    let body = serde_json::to_string(&json!({"template": weird})).unwrap();
    let a = send(&router, json_req(Method::POST, "/v1/sandboxes", &body)).await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
    let m = parse(&scrape(&router).await);
    assert_eq!(
        value(&m, "mayfly_live_sandboxes", &[("template", weird)]),
        Some(1.0)
    );
}

#[tokio::test]
async fn streamed_execs_are_timed_at_their_exit_event() {
    let (router, _) = test_app();
    let a = create(&router).await;
    let r = req(Method::POST, &format!("/v1/sandboxes/{}/exec", a.id))
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(axum::body::Body::from(r#"{"argv":["echo","x"]}"#))
        .unwrap();
    let resp = send(&router, r).await;
    assert!(String::from_utf8_lossy(&resp.body).contains("event: exit"));
    let m = parse(&scrape(&router).await);
    assert_eq!(value(&m, "mayfly_exec_seconds_count", &[]), Some(1.0));
}
