//! Streamed exec: SSE framing, order, and output sent as it is produced.

mod support;

use std::time::Duration;

use axum::body::Body;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use mayfly_types::ExecResult;
use support::*;
use tower::ServiceExt as _;

/// Reads SSE frames off a live response body, one event at a time.
struct Events {
    body: Body,
    buf: String,
}

impl Events {
    /// The next `(event, data)`, skipping comments (keep-alives).
    async fn next(&mut self) -> Option<(String, String)> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut name, mut data) = (String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ").or(line.strip_prefix("event:")) {
                        name = v.to_owned();
                    } else if let Some(v) =
                        line.strip_prefix("data: ").or(line.strip_prefix("data:"))
                    {
                        data = v.to_owned();
                    }
                }
                if !name.is_empty() {
                    return Some((name, data));
                }
                continue;
            }
            let frame = self.body.frame().await?.expect("the body can be read");
            if let Ok(d) = frame.into_data() {
                self.buf
                    .push_str(std::str::from_utf8(&d).expect("SSE is text"));
            }
        }
    }
}

async fn stream(
    app: &axum::Router,
    id: &str,
    argv: &str,
    via_query: bool,
) -> (StatusCode, String, Events) {
    let uri = if via_query {
        format!("/v1/sandboxes/{id}/exec?stream=true")
    } else {
        format!("/v1/sandboxes/{id}/exec")
    };
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("content-type", "application/json");
    if !via_query {
        b = b.header("accept", "text/event-stream");
    }
    let mut r = b
        .body(Body::from(format!(r#"{{"argv":{argv}}}"#)))
        .expect("valid request");
    r.extensions_mut()
        .insert(axum::extract::ConnectInfo(mayfly_server::Peer::Unix {
            uid: Some(TEST_UID),
        }));
    let resp = app.clone().oneshot(r).await.expect("infallible");
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    (
        resp.status(),
        ct,
        Events {
            body: resp.into_body(),
            buf: String::new(),
        },
    )
}

#[tokio::test]
async fn events_arrive_in_order_with_base64_data_and_exit_last() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    for via_query in [false, true] {
        let (status, ct, mut ev) =
            stream(&app, sb.id.as_str(), r#"["warn","oops"]"#, via_query).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ct, "text/event-stream");
        let (name, data) = ev.next().await.expect("a stderr event");
        assert_eq!(name, "stderr");
        assert_eq!(STANDARD.decode(data).expect("base64"), b"oops");
        let (name, data) = ev.next().await.expect("an exit event");
        assert_eq!(name, "exit");
        let r: ExecResult = serde_json::from_str(&data).expect("exit data is an ExecResult");
        assert_eq!(r.status.exit_code, Some(0));
        assert!(
            r.stdout.0.is_empty() && r.stderr.0.is_empty(),
            "output is not repeated"
        );
        assert_eq!(r.stderr_bytes, 4, "byte counts are kept");
        assert!(ev.next().await.is_none(), "nothing follows exit");
    }
}

#[tokio::test]
async fn output_is_sent_before_the_command_finishes() {
    let (app, fake) = test_app();
    let sb = create(&app).await;
    let (_, _, mut ev) = stream(&app, sb.id.as_str(), r#"["gated"]"#, false).await;
    // The fake holds the rest of the command back until the gate opens, so
    // the first event can only arrive here if it was not buffered.
    let first = tokio::time::timeout(Duration::from_secs(5), ev.next())
        .await
        .expect("the first event arrives while the command still runs")
        .expect("an event");
    assert_eq!(first.0, "stdout");
    assert_eq!(STANDARD.decode(first.1).expect("base64"), b"first");
    fake.open_gate();
    let names: Vec<String> = [ev.next().await, ev.next().await]
        .into_iter()
        .map(|e| e.expect("an event").0)
        .collect();
    assert_eq!(names, ["stderr", "exit"]);
}

#[tokio::test]
async fn a_stream_that_ends_without_exit_ends_with_an_error_event() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let (_, _, mut ev) = stream(&app, sb.id.as_str(), r#"["vanish"]"#, false).await;
    assert_eq!(ev.next().await.expect("stdout").0, "stdout");
    let (name, data) = ev.next().await.expect("an error event");
    assert_eq!(name, "error");
    let e: mayfly_types::ApiError = serde_json::from_str(&data).expect("error data is an ApiError");
    assert_eq!(e.code, mayfly_types::ErrorCode::Unavailable);
    assert!(ev.next().await.is_none());
}

#[tokio::test]
async fn a_stream_that_cannot_start_is_a_plain_json_error() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let (status, ct, _) = stream(&app, sb.id.as_str(), r#"["nosuch"]"#, false).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(ct, "application/json");
}
