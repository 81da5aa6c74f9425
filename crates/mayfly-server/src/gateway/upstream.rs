//! The upstream connections of one client connection.
//!
//! Each client connection of the gateway keeps its own HTTP/1.1
//! connections upstream (hyper's `client::conn::http1`), keyed by where
//! they go: a sandbox's port or a baseline's authority. A kept-alive
//! client therefore reuses one upstream connection request after request,
//! with no shared pool to check out of (no lock, no hashing of a pool key,
//! no URI to build and parse), and its upstream connections close with it.
//! Every request is still authorised on its own before it gets here: the
//! key only says which connection carries it, never whether it may.

use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use mayfly_engine::{EngineError, GatewayApi};
use mayfly_types::SandboxId;
use tokio::net::TcpStream;

/// Idle upstream connections one client connection keeps at most (an
/// HTTP/1.1 client needs one per upstream; an HTTP/2 client's concurrent
/// streams may open more, which are closed past this).
const MAX_IDLE: usize = 4;

/// Where a request goes upstream.
#[derive(Debug, Clone, Copy)]
pub enum Upstream<'a> {
    Sandbox { id: &'a SandboxId, port: u16 },
    Baseline { host: &'a str, port: u16 },
}

/// An owned [`Upstream`], keying an idle connection.
#[derive(Debug, PartialEq, Eq)]
enum Key {
    Sandbox(SandboxId, u16),
    Baseline(String, u16),
}

impl Upstream<'_> {
    fn key(&self) -> Key {
        match *self {
            Upstream::Sandbox { id, port } => Key::Sandbox(id.clone(), port),
            Upstream::Baseline { host, port } => Key::Baseline(host.to_owned(), port),
        }
    }

    fn is(&self, k: &Key) -> bool {
        match (self, k) {
            (Upstream::Sandbox { id, port }, Key::Sandbox(i, p)) => *id == i && port == p,
            (Upstream::Baseline { host, port }, Key::Baseline(h, p)) => host == h && port == p,
            _ => false,
        }
    }
}

/// Why a request could not be sent upstream.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The engine refused the connection (the sandbox is gone, …).
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot connect to {what}: {source}")]
    Connect {
        what: String,
        source: std::io::Error,
    },
    #[error("the upstream did not answer: {0}")]
    Exchange(String),
    /// The listener's client connections hold all the upstream connections
    /// it allows ([`crate::conn::Limits::upstreams`]).
    #[error("this gateway listener has {max} upstream connections open, its most; retry when some close")]
    Busy { max: usize },
}

/// What a request carries upstream: the client's body, which may not stall.
pub type UpstreamBody = super::body::Guarded<Incoming>;

/// An idle upstream connection and where it goes.
type Idle = (Key, SendRequest<UpstreamBody>);

/// One client connection's idle upstream connections: cheap to clone
/// (the clones share them). Each upstream connection, idle or busy, holds
/// one of its listener's places ([`crate::conn::Slots::upstreams`]) until
/// it closes.
#[derive(Clone)]
pub struct Upstreams {
    idle: Arc<Mutex<Vec<Idle>>>,
    places: Arc<Semaphore>,
    max: usize,
}

impl Upstreams {
    /// A client connection's upstream connections, taking their places
    /// from its listener's `slots` (shared with the listener's other client
    /// connections).
    pub fn new(slots: &crate::conn::Slots) -> Upstreams {
        let (places, max) = slots.upstreams();
        Upstreams {
            idle: Arc::default(),
            places,
            max,
        }
    }

    /// An idle connection to `to` that can take a request now; closed ones
    /// met on the way are dropped.
    fn take(&self, to: &Upstream<'_>) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|(_, s)| !s.is_closed());
        let i = idle.iter().position(|(k, s)| to.is(k) && s.is_ready())?;
        Some(idle.swap_remove(i).1)
    }

    /// Keeps `s` for the next request to `to`. It may still be carrying the
    /// previous response's body; [`Upstreams::take`] skips it until done.
    fn put(&self, to: &Upstream<'_>, s: SendRequest<UpstreamBody>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((to.key(), s));
        }
    }

    /// Sends `req` to `to` on an idle connection, or a new one, and returns
    /// the response head as it arrives. A kept-alive connection the
    /// upstream closed before taking the request is replaced once.
    /// `keep` false: the connection is not reused afterwards (an upgrade
    /// takes it over).
    pub async fn send(
        &self,
        api: &dyn GatewayApi,
        to: Upstream<'_>,
        req: Request<UpstreamBody>,
        keep: bool,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let (mut s, fresh) = match self.take(&to) {
            Some(s) => (s, false),
            None => (self.connect(api, &to).await?, true),
        };
        let resp = match s.try_send_request(req).await {
            Ok(r) => r,
            Err(mut e) => match e.take_message() {
                Some(req) if !fresh => {
                    s = self.connect(api, &to).await?;
                    s.send_request(req)
                        .await
                        .map_err(|e| UpstreamError::Exchange(why(&e)))?
                }
                _ => return Err(UpstreamError::Exchange(why(e.error()))),
            },
        };
        if keep {
            self.put(&to, s);
        }
        Ok(resp)
    }

    /// A new HTTP/1.1 connection to `to`, its connection task spawned on
    /// this thread's runtime (it ends when the peer closes or every sender
    /// is dropped, and gives its place back then).
    async fn connect(
        &self,
        api: &dyn GatewayApi,
        to: &Upstream<'_>,
    ) -> Result<SendRequest<UpstreamBody>, UpstreamError> {
        let place = self
            .places
            .clone()
            .try_acquire_owned()
            .map_err(|_| UpstreamError::Busy { max: self.max })?;
        let s = connect(api, to).await?;
        let (s, conn) = http1::Builder::new()
            .handshake(TokioIo::new(s))
            .await
            .map_err(|e| UpstreamError::Exchange(why(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
            drop(place);
        });
        Ok(s)
    }
}

fn why(e: &hyper::Error) -> String {
    std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_else(|| e.to_string())
}

/// A new TCP connection to `to`.
async fn connect(api: &dyn GatewayApi, to: &Upstream<'_>) -> Result<TcpStream, UpstreamError> {
    let stream = match *to {
        Upstream::Sandbox { id, port } => api.connect(id, port).await?,
        Upstream::Baseline { host, port } => {
            let h = host.trim_start_matches('[').trim_end_matches(']');
            let s =
                TcpStream::connect((h, port))
                    .await
                    .map_err(|source| UpstreamError::Connect {
                        what: format!("{host}:{port}"),
                        source,
                    })?;
            let _ = s.set_nodelay(true);
            s
        }
    };
    Ok(stream)
}
