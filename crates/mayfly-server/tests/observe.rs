//! `GET /v1/sandboxes/{id}/usage` and `GET /v1/stats`: answers, and 4xx for
//! bad input.

mod support;

use std::time::Duration;

use http::{Method, StatusCode};
use mayfly_types::{SandboxUsage, StatsReport};
use support::*;

#[tokio::test]
async fn usage_of_a_live_sandbox_and_4xx_otherwise() {
    let (router, _) = test_app();
    let sb = create(&router).await;
    let a = send(
        &router,
        empty_req(Method::GET, &format!("/v1/sandboxes/{}/usage", sb.id)),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let u: SandboxUsage = a.json();
    assert_eq!((u.id, u.cpu_seconds), (sb.id.clone(), Some(1.25)));
    send(
        &router,
        empty_req(Method::GET, "/v1/sandboxes/not-an-id/usage"),
    )
    .await
    .api_error(400);
    send(
        &router,
        empty_req(Method::GET, "/v1/sandboxes/mf-abcdefghjkmn/usage"),
    )
    .await
    .api_error(404);
    send(
        &router,
        empty_req(Method::DELETE, &format!("/v1/sandboxes/{}", sb.id)),
    )
    .await;
    send(
        &router,
        empty_req(Method::GET, &format!("/v1/sandboxes/{}/usage", sb.id)),
    )
    .await
    .api_error(409);
}

#[tokio::test]
async fn stats_take_a_window_and_a_task_and_the_callers_tenant() {
    let (router, fake) = test_app();
    let a = send(&router, empty_req(Method::GET, "/v1/stats")).await;
    assert_eq!(a.status, StatusCode::OK);
    let r: StatsReport = a.json();
    assert_eq!(r.until - r.since, 3600 * 1000, "one hour by default");
    let a = send(
        &router,
        empty_req(Method::GET, "/v1/stats?window=90m&task=ci%2Fnightly"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        fake.stats_calls().last().cloned(),
        Some((
            Duration::from_secs(5400),
            Some("ci/nightly".to_owned()),
            "default".to_owned()
        ))
    );
}

#[tokio::test]
async fn bad_stats_queries_are_400_with_a_reason() {
    let (router, _) = test_app();
    let long = "x".repeat(2000);
    for q in [
        "window=soon".to_owned(),
        "window=0s".to_owned(),
        "window=100d".to_owned(),
        "window=".to_owned(),
        "task=".to_owned(),
        format!("task={long}"),
        "tsak=x".to_owned(),
    ] {
        let e = send(&router, empty_req(Method::GET, &format!("/v1/stats?{q}")))
            .await
            .api_error(400);
        assert!(!e.message.is_empty(), "{q}");
    }
}
