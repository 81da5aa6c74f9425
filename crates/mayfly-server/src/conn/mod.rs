//! The daemon's HTTP client connections, for the API's listeners and the
//! gateway's (the host's listener and those inside sandboxes): the accept
//! loop and how one connection is served (HTTP/1.1 or h2c, upgrades, its
//! limits and deadlines).
//!
//! Deadlines, so that a client cannot hold a connection (and the daemon's
//! descriptors) forever by saying nothing, or by saying it slowly:
//! - an HTTP/1.1 request head must arrive within
//!   [`Timeouts::header_read`], counted from when the daemon starts
//!   waiting for it: the first one, and each next one on a kept-alive
//!   connection (hyper's `header_read_timeout`), and any connection's
//!   first request must have begun within it (whatever the protocol, or
//!   before one is even chosen);
//! - a connection with no request in flight for [`Timeouts::idle`] is
//!   closed (gracefully: HTTP/2 gets a GOAWAY). This covers what the first
//!   does not: HTTP/2 connections, and clients that send too little to
//!   tell which protocol they speak.
//!
//! A request in flight (its answer still streaming, however slowly: an
//! exec's output, an event stream) is never cut, and an upgraded connection
//! (WebSocket, a TCP forward) leaves this code once it is upgraded: neither
//! deadline applies to it.
//!
//! Limits, so that a client (above all code inside a sandbox, calling the
//! gateway's listener in its own namespace) cannot make the daemon hold
//! descriptors without bound: each listener serves at most
//! [`Limits::connections`] client connections at once (past that it stops
//! accepting, and new clients wait in the kernel's backlog until one
//! ends; a gateway connection that is upgraded keeps its place until its
//! relay ends), an HTTP/2 client may have [`MAX_STREAMS`] requests in
//! flight on one connection, and a gateway listener's client connections
//! together hold at most [`Limits::upstreams`] upstream connections
//! ([`crate::gateway::upstream::Upstreams`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
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
    /// Each of the API's listeners (the unix socket, TCP); it makes no
    /// upstream connections.
    pub const API: Limits = Limits {
        connections: 4096,
        upstreams: 0,
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

    /// The places for upstream connections, and how many there are.
    pub fn upstreams(&self) -> (Arc<Semaphore>, usize) {
        (self.upstreams.clone(), self.limits.upstreams)
    }

    /// Waits until every connection served with one of these places has
    /// ended (and given it back).
    pub async fn all_returned(&self) {
        let all = u32::try_from(self.limits.connections.max(1)).unwrap_or(u32::MAX);
        let _ = self.connections.acquire_many(all).await;
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
    /// An accepted connection (with whatever the listener knows of its
    /// peer).
    type Conn: Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

/// The gateway's: requests are small and answered at once, so Nagle's
/// algorithm only adds latency.
impl Accept for TcpListener {
    type Conn = TcpStream;
    async fn accept(&self) -> std::io::Result<TcpStream> {
        let (s, _) = TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

/// What a connection does when its listener's stop signal comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStop {
    /// Ends at once, requests in flight and all (a gateway listener whose
    /// sandbox is being destroyed).
    Cut,
    /// Takes no new request and ends once those in flight are answered
    /// (the API's graceful shutdown; whoever waits bounds the wait).
    Drain,
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
    mut on_conn: impl FnMut(L::Conn, Slot),
) {
    let mut pause = BACKOFF.0;
    loop {
        if slots.connections.available_permits() == 0 {
            tracing::warn!(
                max = slots.limits.connections,
                "a listener is at its connection limit; accepting again when one ends"
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
                tracing::warn!(error = %e, retry_in = ?pause, "accept failed");
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
    /// Whether any request has begun.
    begun: AtomicBool,
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
            begun: AtomicBool::new(false),
            last_end_ms: AtomicU64::new(0),
            since: Instant::now(),
        }))
    }

    fn start(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::Acquire);
        self.0.begun.store(true, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Resolves once no request has begun within `first` of the
    /// connection's start (a client that never says which protocol it
    /// speaks, or never finishes its first head), or once no request has
    /// been in flight for `limit` (looked at every `limit` at most, and
    /// exactly when the last request ended `limit` ago).
    async fn idle_for(&self, first: Duration, limit: Duration) {
        let a = &self.0;
        tokio::time::sleep(first.min(limit)).await;
        if !a.begun.load(Ordering::Relaxed) {
            return;
        }
        let mut wait = limit.saturating_sub(first);
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
/// or `stop` resolves (the listener's sandbox is being destroyed, the
/// daemon is shutting down), which ends it as its [`OnStop`] says. The
/// connection holds `slot` until then; a request that asks for an upgrade
/// carries a clone of it in its extensions, for a relay to hold.
pub fn serve<I, F, Fut, B>(
    stream: I,
    slot: Slot,
    timeouts: Timeouts,
    stop: Option<(watch::Receiver<()>, OnStop)>,
    handle: F,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut gone, on_stop) = match stop {
        Some((rx, how)) => (Some(rx), how),
        None => (None, OnStop::Cut),
    };
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
        // The service, and so the slot, lives as long as the connection.
        let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let in_flight = counted.start();
            if req.headers().contains_key(http::header::UPGRADE) {
                req.extensions_mut().insert(slot.clone());
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
        // How long a graceful end may take: unbounded for a drain (whoever
        // waits for it bounds it), `GRACE` for an idle connection.
        let grace = tokio::select! {
            _ = conn.as_mut() => return,
            _ = until_gone(&mut gone) => match on_stop {
                OnStop::Cut => return,
                OnStop::Drain => None,
            },
            _ = activity.idle_for(timeouts.header_read, timeouts.idle) => Some(GRACE),
        };
        conn.as_mut().graceful_shutdown();
        match grace {
            Some(g) => drop(tokio::time::timeout(g, conn).await),
            None => drop(conn.await),
        }
    });
}

#[cfg(test)]
mod tests;
