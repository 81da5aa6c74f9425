//! The connection machinery against raw clients on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use http_body_util::{Full, StreamBody};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

const SHORT: Timeouts = Timeouts {
    header_read: Duration::from_millis(400),
    idle: Duration::from_millis(600),
};

type TestBody = http_body_util::Either<
    Full<Bytes>,
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
>;

/// A gateway-like server with [`SHORT`] deadlines: `/slow` streams four
/// chunks 500 ms apart (longer, in all, than either deadline); anything
/// else is `ok`.
async fn server() -> u16 {
    server_with(SHORT, Limits::HOST).await
}

async fn server_with(timeouts: Timeouts, limits: Limits) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let slots = Slots::new(limits);
    tokio::spawn(async move {
        accept_loop(l, &slots, None, |s, slot| {
            serve(s, slot, timeouts, None, handler)
        })
        .await
    });
    port
}

async fn handler(req: Request<Incoming>) -> Response<TestBody> {
    if req.uri().path() != "/slow" {
        return Response::new(TestBody::Left(Full::new(Bytes::from("ok"))));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        for i in 0..4 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let chunk = Frame::data(Bytes::from(format!("chunk{i};")));
            let _ = tx.send(Ok(chunk)).await;
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::new(TestBody::Right(StreamBody::new(stream)))
}

/// Reads until the peer closes; how long that took, and what came.
async fn until_closed(s: &mut TcpStream) -> (Duration, String) {
    let t = Instant::now();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out));
    let _ = read.await.expect("the gateway never closed the connection");
    (t.elapsed(), String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn a_client_that_sends_its_head_too_slowly_is_cut_off() {
    let port = server().await;
    let t = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // Trickles a header byte by byte, never ending the head.
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if s.write_all(b"X").await.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(3), trickle).await;
    let (_, out) = until_closed(&mut s).await;
    assert!(!out.contains(" 200 "), "{out}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "held {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn a_client_that_sends_nothing_or_idles_after_a_request_is_closed() {
    let port = server().await;
    let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (took, _) = until_closed(&mut silent).await;
    assert!(took < Duration::from_secs(3), "closed after {took:?}");

    let mut kept = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (took, out) = until_closed(&mut kept).await;
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("ok"),
        "{out}"
    );
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
}

#[tokio::test]
async fn an_answer_streaming_longer_than_the_deadlines_is_not_cut() {
    let port = server().await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (took, out) = until_closed(&mut s).await;
    assert!(out.contains("chunk3;"), "cut after {took:?}: {out}");
}

/// Sends one kept-alive request and reads its whole answer ("ok").
async fn ask(s: &mut TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while !out.ends_with(b"ok") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed after {}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn past_its_connection_limit_a_listener_serves_the_next_client_only_when_one_ends() {
    let long = Timeouts {
        header_read: Duration::from_secs(30),
        idle: Duration::from_secs(30),
    };
    let port = server_with(
        long,
        Limits {
            connections: 2,
            upstreams: 2,
        },
    )
    .await;
    let mut first = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut second = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert!(ask(&mut first).await.starts_with("HTTP/1.1 200"));
    assert!(ask(&mut second).await.starts_with("HTTP/1.1 200"));
    // The third is connected (the kernel's backlog) but not served.
    let mut third = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(500), ask(&mut third)).await;
    assert!(waiting.is_err(), "served past the limit: {waiting:?}");
    // Its request is answered as soon as a place frees.
    drop(first);
    let served = tokio::time::timeout(Duration::from_secs(5), async {
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        while !out.ends_with(b"ok") {
            let n = third.read(&mut buf).await.unwrap();
            assert!(n > 0);
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .expect("the waiting client was served once a connection ended");
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    // The other connection was served throughout.
    assert!(ask(&mut second).await.starts_with("HTTP/1.1 200"));
}

/// Fails its first accepts as a listener out of descriptors does.
struct Failing {
    fails: AtomicUsize,
    inner: TcpListener,
}

impl Accept for Failing {
    type Conn = TcpStream;
    async fn accept(&self) -> std::io::Result<TcpStream> {
        if self.fails.load(Ordering::SeqCst) > 0 {
            self.fails.fetch_sub(1, Ordering::SeqCst);
            // EMFILE: out of descriptors.
            return Err(std::io::Error::from_raw_os_error(24));
        }
        self.inner.accept().await.map(|(s, _)| s)
    }
}

#[tokio::test]
async fn failed_accepts_are_retried_until_the_listener_is_gone() {
    let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = inner.local_addr().unwrap().port();
    let l = Failing {
        fails: AtomicUsize::new(3),
        inner,
    };
    let (tx, rx) = watch::channel(());
    let (conns_tx, mut conns) = tokio::sync::mpsc::unbounded_channel();
    let lp = tokio::spawn(async move {
        let slots = Slots::new(Limits::HOST);
        accept_loop(l, &slots, Some(rx), move |s, _| {
            let _ = conns_tx.send(s);
        })
        .await
    });
    let _c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), conns.recv()).await;
    assert!(
        matches!(got, Ok(Some(_))),
        "the loop stopped accepting after failures"
    );
    drop(tx);
    tokio::time::timeout(Duration::from_secs(5), lp)
        .await
        .expect("the loop ends when its listener's sandbox goes")
        .unwrap();
}

#[tokio::test]
async fn a_drained_connection_finishes_its_request_and_a_cut_one_does_not() {
    for (how, finished) in [(OnStop::Drain, true), (OnStop::Cut, false)] {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (stop_tx, stop) = watch::channel(());
        let slots = Slots::new(Limits::API);
        let served = slots.clone();
        let lp = tokio::spawn(async move {
            let gone = stop.clone();
            accept_loop(l, &served, Some(gone), |s, slot| {
                serve(s, slot, SHORT, Some((stop.clone(), how)), handler)
            })
            .await;
            served.all_returned().await;
        });
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(stop_tx);
        let (_, out) = until_closed(&mut s).await;
        assert_eq!(out.contains("chunk3;"), finished, "{how:?}: {out}");
        tokio::time::timeout(Duration::from_secs(5), lp)
            .await
            .expect("the listener ends once its connections have")
            .unwrap();
    }
}
