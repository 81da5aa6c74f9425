//! Forwarding one request to its upstream, and its answer back: streamed
//! both ways (no buffering), upgrades (WebSocket) relayed as raw bytes,
//! over the client connection's own kept-alive upstream connections
//! ([`super::upstream`]).

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use mayfly_engine::GatewayApi;
use mayfly_types::{ApiError, ErrorCode};

use super::upstream::{Upstream, UpstreamError, Upstreams};
use crate::activity::{Touching, TouchingBody};

/// The body of everything the gateway answers: the upstream's, streamed,
/// or one of its own JSON errors.
/// A sandbox's streamed answer touches its idle clock as it flows.
pub type GatewayBody = Either<TouchingBody<Incoming>, Full<Bytes>>;

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
pub(super) fn upgrade_of(h: &HeaderMap) -> Option<HeaderValue> {
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

/// A `303 See Other` to `path_and_query` on the same host, with
/// `set_cookie` if any. Never cached: it may carry the cookie.
pub fn redirect(path_and_query: &str, set_cookie: Option<HeaderValue>) -> Response<GatewayBody> {
    let Some(location) = super::token::same_host_location(path_and_query) else {
        return error(
            ErrorCode::InvalidArgument,
            "the request target is not a valid path",
        );
    };
    let mut r = Response::new(Either::Right(Full::new(Bytes::new())));
    *r.status_mut() = StatusCode::SEE_OTHER;
    let h = r.headers_mut();
    h.insert(header::LOCATION, location);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(c) = set_cookie {
        h.insert(header::SET_COOKIE, c);
    }
    r
}

/// Sends `req` to `to` over one of the client connection's upstream
/// connections, with `target` (origin-form) as its request target, and
/// returns the answer as it streams in.
pub async fn forward(
    api: &dyn GatewayApi,
    conns: &Upstreams,
    mut req: Request<Incoming>,
    to: Upstream<'_>,
    target: PathAndQuery,
) -> Response<GatewayBody> {
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
    // The client connection's place, for the relay to keep once upgraded.
    let slot = req.extensions_mut().remove::<crate::conn::Slot>();
    strip_hop_by_hop(req.headers_mut());
    if let Some(u) = &upgrade {
        req.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        req.headers_mut().insert(header::UPGRADE, u.clone());
    }
    *req.uri_mut() = Uri::from(target);
    *req.version_mut() = Version::HTTP_11;
    let req = req.map(|b| super::body::Guarded::new(b, super::body::BODY_IDLE));
    let mut resp = match conns.send(api, to, req, upgrade.is_none()).await {
        Ok(r) => r,
        Err(UpstreamError::Engine(e)) => return super::engine_error(e),
        Err(e @ UpstreamError::Busy { .. }) => return error(ErrorCode::Unavailable, e.to_string()),
        Err(e) => return error(ErrorCode::BadGateway, e.to_string()),
    };
    // Traffic to a sandbox, not only this request, is its activity: a
    // WebSocket or a streamed answer in use keeps it from idling out.
    let activity = match to {
        Upstream::Sandbox { id, .. } => api.activity(id),
        Upstream::Baseline { .. } => None,
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_upgrade {
            let upstream_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = (client_side.await, upstream_side.await) {
                    let mut b = Touching::new(TokioIo::new(b), activity);
                    let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut b).await;
                }
                drop(slot);
            });
            return resp.map(|b| Either::Left(TouchingBody::new(b, None)));
        }
        return error(
            ErrorCode::BadGateway,
            "the upstream switched protocols unasked",
        );
    }
    strip_hop_by_hop(resp.headers_mut());
    resp.map(|b| Either::Left(TouchingBody::new(b, activity)))
}
