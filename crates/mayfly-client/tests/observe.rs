//! The client's observability calls against the real server (in-process,
//! on a temporary unix socket) over the fake engine: the event stream,
//! metrics, usage and stats; and a stream that ends when the daemon stops.

#[path = "../../mayfly-server/tests/support/fake.rs"]
mod fake;

use std::time::Duration;

use fake::FakeEngine;
use mayfly_client::Client;
use mayfly_server::{app, bind_unix, serve, ServerOptions};
use mayfly_types::{CreateRequest, ErrorCode};
use tokio::sync::oneshot;

struct Daemon {
    _dir: tempfile::TempDir,
    client: Client,
    fake: std::sync::Arc<FakeEngine>,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
}

async fn daemon() -> Daemon {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("mayfly.sock");
    let fake = FakeEngine::new();
    let l = bind_unix(&sock).await.expect("bind");
    let (stop, rx) = oneshot::channel::<()>();
    let served = tokio::spawn({
        let router = app(fake.clone(), ServerOptions::default());
        async move {
            serve(router, vec![l], async move {
                let _ = rx.await;
            })
            .await
            .expect("serving");
        }
    });
    Daemon {
        client: Client::unix(&sock),
        _dir: dir,
        fake,
        stop: Some(stop),
        served,
    }
}

#[tokio::test]
async fn the_event_stream_yields_stored_then_live_events() {
    let d = daemon().await;
    let a = d.client.create(&CreateRequest::default()).await.unwrap();
    let mut s = d.client.event_stream(Some(0)).await.unwrap();
    let first = s.next_event().await.unwrap().expect("the stored event");
    assert_eq!((first.seq, first.kind.as_str()), (1, "created"));
    d.client.destroy(&a.id).await.unwrap();
    let next = s.next_event().await.unwrap().expect("the live event");
    assert_eq!((next.seq, next.kind.as_str()), (2, "destroyed"));
    assert_eq!(next.sandbox_id.as_deref(), Some(a.id.as_str()));
}

#[tokio::test]
async fn an_open_event_stream_ends_when_the_daemon_stops() {
    let mut d = daemon().await;
    let mut s = d.client.event_stream(None).await.unwrap();
    d.fake.emit(None, "x", serde_json::json!({}));
    assert!(s.next_event().await.unwrap().is_some());
    drop(d.stop.take());
    let end = tokio::time::timeout(Duration::from_secs(10), s.next_event())
        .await
        .expect("the stream ends instead of holding the shutdown");
    assert!(matches!(end, Ok(None)), "{end:?}");
    tokio::time::timeout(Duration::from_secs(10), &mut d.served)
        .await
        .expect("the server stops")
        .unwrap();
}

#[tokio::test]
async fn metrics_usage_and_stats_round_trip() {
    let d = daemon().await;
    let a = d.client.create(&CreateRequest::default()).await.unwrap();
    let text = d.client.metrics().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("mayfly_live_sandboxes{"), "{text}");
    let u = d.client.usage(&a.id).await.unwrap();
    assert_eq!((u.id, u.pids, u.disk.bytes), (a.id.clone(), 2, 8192));
    let r = d
        .client
        .stats(Some("2h"), Some("fix bug/42"))
        .await
        .unwrap();
    assert_eq!(r.task.as_deref(), Some("fix bug/42"));
    assert_eq!(r.until - r.since, 2 * 3600 * 1000);
    let calls = d.fake.stats_calls();
    assert_eq!(
        calls.last().map(|c| c.1.as_deref()),
        Some(Some("fix bug/42"))
    );
    let e = d.client.stats(Some("forever"), None).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument));
    d.client.destroy(&a.id).await.unwrap();
    let e = d.client.usage(&a.id).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict));
}
