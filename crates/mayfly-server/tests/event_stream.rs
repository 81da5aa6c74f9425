//! `GET /v1/events` as server-sent events: the stored events after `since`,
//! then live ones, each exactly once and in order, across the backfill/live
//! boundary, after the bus drops events for a slow reader, and for events
//! that only the store has.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use mayfly_server::{app, ServerOptions};
use mayfly_types::Event;
use support::*;
use tower::ServiceExt as _;

/// A live SSE body, read one frame at a time.
struct Stream {
    body: Body,
    buf: String,
}

impl Stream {
    /// The next event (comments skipped), or `None` if nothing arrives
    /// within `within`.
    async fn next_within(&mut self, within: Duration) -> Option<(String, Event)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut data) = (String::new(), None);
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ").or(line.strip_prefix("id:")) {
                        id = v.to_owned();
                    } else if let Some(v) =
                        line.strip_prefix("data: ").or(line.strip_prefix("data:"))
                    {
                        data = Some(serde_json::from_str(v).expect("data is an Event"));
                    }
                }
                if let Some(ev) = data {
                    return Some((id, ev));
                }
                continue;
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(d) = frame.expect("readable").into_data() {
                self.buf
                    .push_str(std::str::from_utf8(&d).expect("SSE is text"));
            }
        }
    }

    async fn next(&mut self) -> Event {
        self.next_within(Duration::from_secs(10))
            .await
            .expect("an event within 10 s")
            .1
    }
}

async fn open(router: &axum::Router, uri: &str, last_id: Option<&str>) -> (StatusCode, Stream) {
    let mut b = req(Method::GET, uri).header("accept", "text/event-stream");
    if let Some(id) = last_id {
        b = b.header("last-event-id", id);
    }
    let mut r = b.body(Body::empty()).expect("valid request");
    r.extensions_mut()
        .insert(axum::extract::ConnectInfo(mayfly_server::Peer::Unix {
            uid: Some(TEST_UID),
        }));
    let resp = router.clone().oneshot(r).await.expect("infallible");
    let status = resp.status();
    (
        status,
        Stream {
            body: resp.into_body(),
            buf: String::new(),
        },
    )
}

#[tokio::test]
async fn each_event_has_its_seq_as_id_and_the_event_as_data() {
    let (router, fake) = test_app();
    fake.emit(None, "first", serde_json::json!({"a": 1}));
    let (status, mut s) = open(&router, "/v1/events?since=0", None).await;
    assert_eq!(status, StatusCode::OK);
    let (id, ev) = s
        .next_within(Duration::from_secs(5))
        .await
        .expect("an event");
    assert_eq!(id, "1");
    assert_eq!((ev.seq, ev.kind.as_str()), (1, "first"));
    assert_eq!(ev.detail, serde_json::json!({"a": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_then_live_has_no_gap_and_no_repeat_under_concurrent_creates() {
    let (router, fake) = test_app();
    for _ in 0..30 {
        fake.emit(None, "old", serde_json::json!({}));
    }
    // Writers run while the stream subscribes and backfills.
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move {
                for _ in 0..40 {
                    create(&router).await;
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2)).await;
    let (_, mut s) = open(&router, "/v1/events?since=10", None).await;
    for w in writers {
        w.await.expect("writer");
    }
    let total = 30 + 4 * 40;
    let mut seqs = Vec::new();
    while seqs.last() != Some(&total) {
        seqs.push(s.next().await.seq);
    }
    assert_eq!(seqs, (11..=total).collect::<Vec<i64>>());
    assert!(
        s.next_within(Duration::from_millis(200)).await.is_none(),
        "nothing is repeated after the last one"
    );
}

#[tokio::test]
async fn a_reader_that_lags_behind_the_bus_gets_the_lost_events_from_the_store() {
    let fake = support::fake::FakeEngine::with_bus_capacity(4);
    let router = app(fake.clone(), ServerOptions::default());
    let (_, mut s) = open(&router, "/v1/events", None).await;
    // Nothing reads the body meanwhile, so the bus overwrites most of them.
    for n in 0..100 {
        fake.emit(None, "burst", serde_json::json!({"n": n}));
    }
    for n in 0..100 {
        let ev = s.next().await;
        assert_eq!((ev.seq, &ev.detail["n"]), (n + 1, &serde_json::json!(n)));
    }
    // And it goes on live afterwards.
    fake.emit(None, "after", serde_json::json!({}));
    assert_eq!(s.next().await.kind, "after");
}

#[tokio::test]
async fn events_only_the_store_has_are_streamed_in_their_place() {
    let (router, fake) = test_app();
    let (_, mut s) = open(&router, "/v1/events", None).await;
    fake.emit(None, "a", serde_json::json!({}));
    fake.store_only("b"); // another process's write: never on this bus
    fake.emit(None, "c", serde_json::json!({}));
    let kinds: Vec<String> = [s.next().await, s.next().await, s.next().await]
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["a", "b", "c"]);
    // With nothing after it on the bus, it still arrives (the store is
    // looked at while the stream is idle).
    fake.store_only("d");
    assert_eq!(s.next().await.kind, "d");
}

#[tokio::test]
async fn without_since_a_stream_starts_with_the_next_event() {
    let (router, fake) = test_app();
    fake.emit(None, "old", serde_json::json!({}));
    let (_, mut s) = open(&router, "/v1/events", None).await;
    fake.emit(None, "new", serde_json::json!({}));
    let ev = s.next().await;
    assert_eq!((ev.seq, ev.kind.as_str()), (2, "new"));
}

#[tokio::test]
async fn last_event_id_resumes_after_it_and_overrides_since() {
    let (router, fake) = test_app();
    for n in 0..5 {
        fake.emit(None, "e", serde_json::json!({"n": n}));
    }
    let (_, mut s) = open(&router, "/v1/events?since=1", Some("3")).await;
    assert_eq!(s.next().await.seq, 4);
    assert_eq!(s.next().await.seq, 5);
    for bad in ["x", "-1", "1.5", ""] {
        let mut r = req(Method::GET, "/v1/events")
            .header("accept", "text/event-stream")
            .header("last-event-id", bad)
            .body(Body::empty())
            .unwrap();
        r.extensions_mut()
            .insert(axum::extract::ConnectInfo(mayfly_server::Peer::Unix {
                uid: Some(TEST_UID),
            }));
        let a = send_raw(&router, r).await;
        a.api_error(400);
    }
}

#[tokio::test]
async fn an_idle_stream_sends_keep_alive_comments() {
    let fake = support::fake::FakeEngine::new();
    let opts = ServerOptions {
        sse_keep_alive: Duration::from_millis(50),
        ..ServerOptions::default()
    };
    let router = app(fake, opts);
    let (_, mut s) = open(&router, "/v1/events", None).await;
    let frame = tokio::time::timeout(Duration::from_secs(5), s.body.frame())
        .await
        .expect("a frame within 5 s")
        .expect("the stream is open")
        .expect("readable");
    let text = String::from_utf8(frame.into_data().expect("data").to_vec()).unwrap();
    assert!(text.starts_with(':'), "a comment line: {text:?}");
}

#[tokio::test]
async fn without_the_event_stream_accept_events_are_a_json_page() {
    let (router, fake) = test_app();
    for _ in 0..3 {
        fake.emit(None, "e", serde_json::json!({}));
    }
    let a = send(
        &router,
        empty_req(Method::GET, "/v1/events?since=1&limit=1"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let page: Vec<Event> = a.json();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
    send(&router, empty_req(Method::GET, "/v1/events?since=-1"))
        .await
        .api_error(400);
}

#[tokio::test]
async fn a_stream_is_cheap_to_drop() {
    let (router, fake) = test_app();
    let fake: Arc<_> = fake;
    let (_, s) = open(&router, "/v1/events", None).await;
    drop(s);
    // A dropped reader is no error for writers.
    assert_eq!(fake.emit(None, "e", serde_json::json!({})), 1);
}
