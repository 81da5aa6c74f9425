//! Forwarding one request to its upstream, and its answer back: streamed
//! both ways (no buffering), upgrades (WebSocket) relayed as raw bytes,
//! upstream connections pooled and kept alive per (sandbox, port) or
//! baseline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use mayfly_engine::SandboxApi;
use mayfly_types::{ApiError, ErrorCode, SandboxId};
use tokio::net::TcpStream;

/// The body of everything the gateway answers: the upstream's, streamed,
/// or one of its own JSON errors.
pub type GatewayBody = Either<Incoming, Full<Bytes>>;

/// Upstream URIs of a sandbox port have the host `<id>.mayfly.sandbox`
/// (never resolvable), so the pool keys them apart from baselines and the
/// connector knows to connect inside the sandbox.
const SANDBOX_SUFFIX: &str = ".mayfly.sandbox";

/// Pooled upstream connections idle this long are closed.
const POOL_IDLE: Duration = Duration::from_secs(30);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connects upstream: inside a sandbox's network namespace through the
/// engine, or to a baseline on the host.
#[derive(Clone)]
pub struct Connector {
    api: Arc<dyn SandboxApi>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let api = self.api.clone();
        Box::pin(async move {
            let host = uri.host().ok_or("upstream URI without a host")?;
            let port = uri.port_u16().unwrap_or(80);
            if let Some(id) = host.strip_suffix(SANDBOX_SUFFIX) {
                let id: SandboxId = id.parse()?;
                let gw = api.gateway().ok_or("no gateway")?;
                return Ok(TokioIo::new(gw.connect(&id, port).await?));
            }
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let s = TcpStream::connect((host, port)).await?;
            let _ = s.set_nodelay(true);
            Ok(TokioIo::new(s))
        })
    }
}

pub type UpstreamClient = Client<Connector, Incoming>;

pub fn client(api: Arc<dyn SandboxApi>) -> UpstreamClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .pool_max_idle_per_host(256)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(Connector { api })
}

/// Where a request goes upstream.
pub enum Upstream<'a> {
    Sandbox { id: &'a SandboxId, port: u16 },
    Baseline { authority: &'a str, prefix: &'a str },
}

/// Headers that belong to one connection, not to the request (RFC 9110
/// 7.6.1), plus the gateway's own.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Headers the Connection header names are hop-by-hop too.
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP.iter()) {
        h.remove(n);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
}

/// Whether a request asks to switch protocols (WebSocket, …).
fn upgrade_of(h: &HeaderMap) -> Option<HeaderValue> {
    let wants = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    wants.then(|| h.get(header::UPGRADE).cloned()).flatten()
}

/// A JSON error of the gateway's own.
pub fn error(code: ErrorCode, message: impl Into<String>) -> Response<GatewayBody> {
    let body = serde_json::to_vec(&ApiError::new(code, message)).unwrap_or_default();
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *r.status_mut() = StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Sends `req` to `to`, with `path_and_query` as its target, and returns
/// the answer as it streams in.
pub async fn forward(
    client: &UpstreamClient,
    mut req: Request<Incoming>,
    to: Upstream<'_>,
    path_and_query: &str,
) -> Response<GatewayBody> {
    let uri = match &to {
        Upstream::Sandbox { id, port } => {
            format!("http://{id}{SANDBOX_SUFFIX}:{port}{path_and_query}")
        }
        Upstream::Baseline { authority, prefix } => {
            format!("http://{authority}{prefix}{path_and_query}")
        }
    };
    let uri: Uri = match uri.parse() {
        Ok(u) => u,
        Err(_) => {
            return error(
                ErrorCode::InvalidArgument,
                "the request target is not a valid path",
            )
        }
    };
    // HTTP/2 requests carry their host in the URI; the upstream speaks
    // HTTP/1.1 and reads it from Host.
    if !req.headers().contains_key(header::HOST) {
        if let Some(a) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, a);
        }
    }
    let upgrade = upgrade_of(req.headers());
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    strip_hop_by_hop(req.headers_mut());
    if let Some(u) = &upgrade {
        req.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        req.headers_mut().insert(header::UPGRADE, u.clone());
    }
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    let mut resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            let why = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.to_string());
            return error(
                ErrorCode::BadGateway,
                format!("the upstream did not answer: {why}"),
            );
        }
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_upgrade {
            let upstream_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = (client_side.await, upstream_side.await) {
                    let _ =
                        tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b))
                            .await;
                }
            });
            return resp.map(Either::Left);
        }
        return error(
            ErrorCode::BadGateway,
            "the upstream switched protocols unasked",
        );
    }
    strip_hop_by_hop(resp.headers_mut());
    resp.map(Either::Left)
}
