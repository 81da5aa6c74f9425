//! The gateway's client connections: the accept loops (the host's listener
//! and those inside sandboxes) and how one connection is served (HTTP/1.1
//! or h2c, upgrades, its limits and deadlines).
//!
//! Deadlines, so that a client cannot hold a connection (and the daemon's
//! descriptors) forever by saying nothing, or by saying it slowly:
//! - an HTTP/1.1 request head must arrive within
//!   [`Timeouts::header_read`], counted from when the gateway starts
//!   waiting for it: the first one, and each next one on a kept-alive
//!   connection (hyper's `header_read_timeout`);
//! - a connection with no request in flight for [`Timeouts::idle`] is
//!   closed (gracefully: HTTP/2 gets a GOAWAY). This covers what the first
//!   does not: HTTP/2 connections, and clients that send too little to
//!   tell which protocol they speak.
//!
//! A request in flight (its answer still streaming, however slowly) is
//! never cut, and an upgraded connection (WebSocket) leaves this code once
//! it is upgraded: neither deadline applies to it.
//!
//! Limits, so that a client (above all code inside a sandbox, calling the
//! gateway's listener in its own namespace) cannot make the daemon hold
//! descriptors without bound: each listener serves at most
//! [`Limits::connections`] client connections at once (past that it stops
//! accepting, and new clients wait in the kernel's backlog until one
//! ends; an upgraded connection keeps its place until its relay ends), an
//! HTTP/2 client may have [`MAX_STREAMS`] requests in flight on one
//! connection, and the listener's client connections together hold at
//! most [`Limits::upstreams`] upstream connections
//! ([`super::upstream::Upstreams`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Request headers, all together, may be at most this large (HTTP/1.1 and
/// HTTP/2); past it the client gets 431.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// How long a connection closed for idleness may take to finish.
const GRACE: Duration = Duration::from_secs(5);
/// The first and the longest wait after a failed accept.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Requests one HTTP/2 client connection may have in flight at once
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_STREAMS: u32 = 100;

/// The host listener's default for both of its [`Limits`]
/// (`serve --gateway-max-connections`).
pub const HOST_MAX_CONNECTIONS: u32 = 4096;

/// How much one listener serves at once (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Client connections, upgraded ones included.
    pub connections: usize,
    /// Upstream connections, all client connections together.
    pub upstreams: usize,
}

impl Limits {
    /// The host's gateway listener (all its threads together).
    pub const HOST: Limits = Limits {
        connections: HOST_MAX_CONNECTIONS as usize,
        upstreams: HOST_MAX_CONNECTIONS as usize,
    };
    /// The listener inside one sandbox (the sandbox's own code is its
    /// only client).
    pub const IN_SANDBOX: Limits = Limits {
        connections: 64,
        upstreams: 128,
    };
}

/// A listener's places, as [`Limits`] sets them: cheap to clone, shared by
/// every thread that accepts on the listener.
#[derive(Clone)]
pub struct Slots {
    connections: Arc<Semaphore>,
    upstreams: Arc<Semaphore>,
    limits: Limits,
}

impl Slots {
    pub fn new(limits: Limits) -> Slots {
        Slots {
            connections: Arc::new(Semaphore::new(limits.connections.max(1))),
            upstreams: Arc::new(Semaphore::new(limits.upstreams.max(1))),
            limits,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The places for upstream connections.
    pub fn upstreams(&self) -> Arc<Semaphore> {
        self.upstreams.clone()
    }
}

/// A client connection's place: held by the connection's task and, once
/// the connection is upgraded, by the relay that carries it on (it rides in
/// the upgrade request's extensions).
#[derive(Clone)]
pub struct Slot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// The deadlines of a client connection (see the module's documentation).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header_read: Duration,
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_secs(30),
            idle: Duration::from_secs(60),
        }
    }
}

/// Something that accepts connections: a listener (or, in tests, one that
/// fails on purpose).
pub trait Accept {
    fn accept(&self) -> impl Future<Output = std::io::Result<TcpStream>> + Send;
}

impl Accept for TcpListener {
    async fn accept(&self) -> std::io::Result<TcpStream> {
        TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

/// Resolves when `gone` does (its sender dropped or sent); never without one.
async fn until_gone(gone: &mut Option<watch::Receiver<()>>) {
    match gone {
        Some(g) => {
            let _ = g.changed().await;
        }
        None => std::future::pending().await,
    }
}

/// Accepts connections until `gone` resolves, handing each to `on_conn`
/// with its place; with none free it accepts nothing until one is. A
/// failed accept (out of descriptors, a connection aborted before it was
/// taken, …) is waited out with a growing pause and retried: it never ends
/// the loop, which would leave a listener that takes connections into its
/// backlog and never serves them.
pub async fn accept_loop<L: Accept>(
    listener: L,
    slots: &Slots,
    mut gone: Option<watch::Receiver<()>>,
    mut on_conn: impl FnMut(TcpStream, Slot),
) {
    let mut pause = BACKOFF.0;
    loop {
        if slots.connections.available_permits() == 0 {
            tracing::warn!(
                max = slots.limits.connections,
                "a gateway listener is at its connection limit; accepting again when one ends"
            );
        }
        let permit = tokio::select! {
            p = slots.connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = until_gone(&mut gone) => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = until_gone(&mut gone) => return,
        };
        match accepted {
            Ok(s) => {
                pause = BACKOFF.0;
                on_conn(s, Slot(Arc::new(permit)));
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?pause, "gateway accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = until_gone(&mut gone) => return,
                }
                pause = (pause * 2).min(BACKOFF.1);
            }
        }
    }
}

/// Counts a connection's requests in flight (a request is in flight from
/// its head until its answer's body is done or dropped) and when the last
/// one ended. Plain atomics: a request costs no wakeup and no timer; the
/// idle check looks at them once per idle period.
#[derive(Clone)]
struct Activity(Arc<ActivityState>);

struct ActivityState {
    in_flight: AtomicUsize,
    /// When the last request ended, in ms after `since`.
    last_end_ms: AtomicU64,
    since: Instant,
}

/// One request in flight; ends on drop.
struct InFlight(Activity);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0 .0;
        a.last_end_ms
            .store(ms(a.since.elapsed()), Ordering::Relaxed);
        a.in_flight.fetch_sub(1, Ordering::Release);
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Activity {
    fn new() -> Activity {
        Activity(Arc::new(ActivityState {
            in_flight: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
            since: Instant::now(),
        }))
    }

    fn start(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::Acquire);
        InFlight(self.clone())
    }

    /// Resolves once no request has been in flight for `limit` (looked at
    /// every `limit` at most, and exactly when the last request ended
    /// `limit` ago).
    async fn idle_for(&self, limit: Duration) {
        let a = &self.0;
        let mut wait = limit;
        loop {
            tokio::time::sleep(wait).await;
            if a.in_flight.load(Ordering::Acquire) > 0 {
                wait = limit;
                continue;
            }
            let idle = Duration::from_millis(
                ms(a.since.elapsed()).saturating_sub(a.last_end_ms.load(Ordering::Relaxed)),
            );
            match limit.checked_sub(idle) {
                Some(left) if !left.is_zero() => wait = left,
                _ => return,
            }
        }
    }
}

/// An answer's body that keeps its request in flight until it is done.
struct Tracked<B> {
    body: B,
    _in_flight: InFlight,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serves one client connection on this thread's runtime, each request
/// answered by `handle`, until the client goes, the connection idles out,
/// or `gone` resolves (the listener's sandbox is being destroyed). The
/// connection holds `slot` until then; a request that asks for an upgrade
/// carries a clone of it in its extensions, for the relay to hold.
pub fn serve<F, Fut, B>(
    stream: TcpStream,
    slot: Slot,
    timeouts: Timeouts,
    mut gone: Option<watch::Receiver<()>>,
    handle: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = stream.set_nodelay(true);
    tokio::spawn(async move {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(timeouts.header_read)
            .max_buf_size(MAX_HEADER_BYTES.max(8192));
        b.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_STREAMS)
            .max_header_list_size(MAX_HEADER_BYTES as u32);
        let activity = Activity::new();
        let counted = activity.clone();
        let held = slot.clone();
        let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let in_flight = counted.start();
            if req.headers().contains_key(http::header::UPGRADE) {
                req.extensions_mut().insert(held.clone());
            }
            let answer = handle(req);
            async move {
                let resp = answer.await.map(|body| Tracked {
                    body,
                    _in_flight: in_flight,
                });
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = b.serve_connection_with_upgrades(TokioIo::new(stream), svc);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = until_gone(&mut gone) => return,
            _ = activity.idle_for(timeouts.idle) => {}
        }
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(GRACE, conn).await;
        drop(slot);
    });
}

#[cfg(test)]
mod tests {
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
}
