//! HTTP/1 over a unix socket or TCP, with pooled keep-alive connections.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as Pool;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

use crate::ClientError;

/// How long an idle pooled connection is kept for reuse.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Connects every request to one unix socket, whatever the URI says.
#[derive(Clone, Debug)]
pub(crate) struct UnixConnector {
    path: Arc<Path>,
    /// A connection made before the client existed (the CLI's check that
    /// a daemon answers), used for the first request instead of a new one.
    ready: Arc<std::sync::Mutex<Option<std::os::unix::net::UnixStream>>>,
}

impl tower::Service<Uri> for UnixConnector {
    type Response = TokioIo<UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.path.clone();
        let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner()).take();
        Box::pin(async move {
            if let Some(s) = ready {
                s.set_nonblocking(true)?;
                return UnixStream::from_std(s).map(TokioIo::new);
            }
            UnixStream::connect(&*path).await.map(TokioIo::new)
        })
    }
}

/// A pool of connections to the daemon.
#[derive(Clone, Debug)]
pub(crate) enum Transport {
    Unix(Pool<UnixConnector, Full<Bytes>>),
    Tcp(Pool<HttpConnector, Full<Bytes>>),
}

impl Transport {
    pub(crate) fn unix(path: &Path, ready: Option<std::os::unix::net::UnixStream>) -> Self {
        let connector = UnixConnector {
            path: Arc::from(path),
            ready: Arc::new(std::sync::Mutex::new(ready)),
        };
        Transport::Unix(builder().build(connector))
    }

    pub(crate) fn tcp() -> Self {
        let mut connector = HttpConnector::new();
        // Small request/response pairs: do not let Nagle hold them back.
        connector.set_nodelay(true);
        Transport::Tcp(builder().build(connector))
    }

    /// Sends one request; connection failures become [`ClientError::Connect`].
    pub(crate) async fn send(
        &self,
        req: http::Request<Full<Bytes>>,
        target: &str,
        what: &str,
    ) -> Result<http::Response<Incoming>, ClientError> {
        let result = match self {
            Transport::Unix(c) => c.request(req).await,
            Transport::Tcp(c) => c.request(req).await,
        };
        result.map_err(|e| {
            if e.is_connect() {
                ClientError::Connect {
                    target: target.to_owned(),
                    source: ClientError::root_cause(e),
                }
            } else {
                ClientError::Transport {
                    request: what.to_owned(),
                    source: ClientError::root_cause(e),
                }
            }
        })
    }
}

fn builder() -> hyper_util::client::legacy::Builder {
    let mut b = Pool::builder(TokioExecutor::new());
    b.pool_idle_timeout(IDLE_TIMEOUT);
    b
}
