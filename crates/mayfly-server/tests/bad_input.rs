//! Bad input is always a 4xx with a JSON `{code, message}`, never a 500 or a
//! panic, and never axum's plain-text rejections.

mod support;

use axum::body::Body;
use http::{Method, Request};
use mayfly_server::ServerOptions;
use mayfly_types::ErrorCode;
use support::*;

#[path = "bad_input/cases.rs"]
mod cases;

use cases::cases;

#[tokio::test]
async fn every_bad_input_gets_a_4xx_json_error() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let mut failures = Vec::new();
    for c in cases() {
        let uri = c.uri.replace("{id}", sb.id.as_str());
        let mut b = Request::builder().method(c.method.clone()).uri(&uri);
        if let Some(ct) = c.content_type {
            b = b.header("content-type", ct);
        }
        let a = send(&app, b.body(Body::from(c.body)).expect("valid request")).await;
        let is_json = a
            .headers
            .get("content-type")
            .is_some_and(|v| v == "application/json");
        let parsed = serde_json::from_slice::<mayfly_types::ApiError>(&a.body).ok();
        let ok = a.status.as_u16() == c.status
            && is_json
            && parsed
                .as_ref()
                .is_some_and(|e| e.code == c.code && !e.message.is_empty());
        if !ok {
            failures.push(format!(
                "{}: {} {uri} → {} {}",
                c.what,
                c.method,
                a.status,
                String::from_utf8_lossy(&a.body)
            ));
        }
    }
    assert!(failures.is_empty(), "bad answers:\n{}", failures.join("\n"));
}

#[tokio::test]
async fn a_bad_id_error_names_the_id_and_the_expected_shape() {
    let (app, _) = test_app();
    let a = send(&app, empty_req(Method::GET, "/v1/sandboxes/mf-..%2F..%2Fx")).await;
    let e = a.api_error(400);
    assert!(e.message.contains("mf-../../x"), "{e:?}");
    assert!(e.message.contains("mf-"), "{e:?}");
}

#[tokio::test]
async fn json_bodies_over_the_cap_are_413_whether_or_not_their_length_is_declared() {
    let (app, _) = test_app();
    let big = format!(r#"{{"labels":{{"k":"{}"}}}}"#, "x".repeat(2 << 20));
    let a = send(&app, json_req(Method::POST, "/v1/sandboxes", &big)).await;
    assert_eq!(a.api_error(413).code, ErrorCode::TooLarge);

    // A chunked body has no Content-Length; the cap applies while reading.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = (0..40)
        .map(|_| Ok(bytes::Bytes::from(vec![b' '; 64 << 10])))
        .collect();
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    let r = req(Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .body(body)
        .expect("valid request");
    send(&app, r).await.api_error(413);
}

#[tokio::test]
async fn file_bodies_over_their_configurable_cap_are_413() {
    let (app, _) = test_app_with(ServerOptions {
        file_body_limit: 1000,
        ..ServerOptions::default()
    });
    let sb = create(&app).await;
    let uri = format!("/v1/sandboxes/{}/files?path=/f", sb.id);
    let ok = req(Method::PUT, &uri)
        .body(Body::from(vec![0u8; 1000]))
        .expect("valid");
    assert_eq!(send(&app, ok).await.status, 200);
    let big = req(Method::PUT, &uri)
        .body(Body::from(vec![0u8; 1001]))
        .expect("valid");
    send(&app, big).await.api_error(413);
    let tar = format!("/v1/sandboxes/{}/archive?path=/w", sb.id);
    let big = req(Method::PUT, &tar)
        .body(Body::from(vec![0u8; 1001]))
        .expect("valid");
    send(&app, big).await.api_error(413);
}

#[tokio::test]
async fn a_lying_content_length_is_a_4xx() {
    let (app, _) = test_app();
    let r = req(Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .header("content-length", "not-a-number")
        .body(Body::from("{}"))
        .expect("valid request");
    send(&app, r).await.api_error(400);
}

/// A body that stops arriving is cut once it has sent nothing for a minute
/// (the clock is paused: tokio moves it on while everything waits), and
/// answered with a JSON 4xx instead of holding its connection for good.
#[tokio::test(start_paused = true)]
async fn a_request_body_that_stops_arriving_is_cut() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    for (method, uri, ct) in [
        (
            Method::PUT,
            "/v1/sandboxes/{id}/files?path=/workspace/z",
            "application/octet-stream",
        ),
        (Method::POST, "/v1/sandboxes/{id}/exec", "application/json"),
        (
            Method::PUT,
            "/v1/sandboxes/{id}/archive?path=/workspace",
            "application/x-tar",
        ),
    ] {
        let uri = uri.replace("{id}", sb.id.as_str());
        use futures_util::StreamExt as _;
        let start = futures_util::stream::iter([Ok::<_, std::io::Error>(
            bytes::Bytes::from_static(b"{\"ar"),
        )]);
        let body = Body::from_stream(start.chain(futures_util::stream::pending()));
        let r = Request::builder()
            .method(method.clone())
            .uri(&uri)
            .header("content-type", ct)
            .body(body)
            .expect("valid request");
        let t = tokio::time::Instant::now();
        let a = tokio::time::timeout(std::time::Duration::from_secs(600), send(&app, r))
            .await
            .unwrap_or_else(|_| panic!("{method} {uri}: a stalled body was never cut"));
        assert!(
            t.elapsed() >= std::time::Duration::from_secs(60),
            "{method} {uri}: cut early"
        );
        assert!(
            a.status.is_client_error(),
            "{method} {uri}: {} {:?}",
            a.status,
            a.body
        );
        let e: mayfly_types::ApiError = serde_json::from_slice(&a.body)
            .unwrap_or_else(|_| panic!("{method} {uri}: not JSON: {:?}", a.body));
        assert!(!e.message.is_empty());
    }
}
