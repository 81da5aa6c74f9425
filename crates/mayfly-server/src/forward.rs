//! Plain TCP forwarding over the API: an upgraded request becomes a raw
//! byte stream to a port inside the sandbox (`mayfly port-forward`).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use mayfly_types::{ApiError, ErrorCode};

use crate::ports::PortPath;
use crate::{AppError, AppState};

/// The protocol name of the upgrade.
pub const TCP_UPGRADE: &str = "mayfly-tcp";

/// Open a TCP connection to `127.0.0.1:{port}` inside the sandbox. Send
/// `Connection: Upgrade` and `Upgrade: mayfly-tcp`; after the `101` the
/// connection carries the raw bytes both ways until either side closes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/connect", tag = "gateway",
    params(("id" = String, Path, description = "The sandbox id."),
           ("port" = u16, Path, description = "1 to 65535.")),
    responses(
        (status = 101, description = "Switched to a raw TCP stream."),
        (status = 400, description = "No `Upgrade: mayfly-tcp`, a port out of range, or the reserved 15080.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
        (status = 502, description = "Nothing listens on the port.", body = ApiError),
    ))]
pub(crate) async fn connect_port(
    State(s): State<AppState>,
    PortPath(id, port): PortPath,
    mut req: Request,
) -> Result<Response, AppError> {
    let asks = req
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(TCP_UPGRADE));
    if !asks {
        return Err(AppError::invalid(format!(
            "this route needs `Connection: Upgrade` and `Upgrade: {TCP_UPGRADE}`"
        )));
    }
    let gw = s
        .api
        .gateway()
        .ok_or_else(|| AppError::new(ErrorCode::NotFound, "this daemon has no gateway"))?;
    // Connect first, so a closed port is a clean error, not a dead stream.
    let mut upstream = gw.connect(&id, port).await?;
    // A forward opened with a key ends when the key is revoked.
    let revoked = match crate::auth::api_key(&req) {
        Some(key) => crate::revocable::until_revoked(s.api.clone(), key.to_owned()),
        None => Box::pin(std::future::pending()),
    };
    let on = hyper::upgrade::on(&mut req);
    let api = s.api.clone();
    tokio::spawn(async move {
        if let Ok(up) = on.await {
            let mut up = Counted::new(TokioIo::new(up));
            let moved = up.count.clone();
            // Bytes moving count as activity for the idle timeout, as a
            // request does; an open forward with nothing moving does not.
            let active = async {
                let mut seen = 0;
                loop {
                    tokio::time::sleep(ACTIVITY_TICK).await;
                    let now = moved.load(Ordering::Relaxed);
                    if now != seen {
                        seen = now;
                        if let Some(g) = api.gateway() {
                            g.touch(&id);
                        }
                    }
                }
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut up, &mut upstream) => {}
                () = revoked => tracing::info!(%id, port, "a forward was cut: its API key was revoked"),
                () = active => {}
            }
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    resp.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(TCP_UPGRADE));
    Ok(resp)
}

/// How often a forward that moved bytes marks its sandbox active.
const ACTIVITY_TICK: std::time::Duration = std::time::Duration::from_secs(2);

/// A stream that counts the bytes read from it.
struct Counted<S> {
    inner: S,
    count: Arc<AtomicU64>,
}

impl<S> Counted<S> {
    fn new(inner: S) -> Self {
        Counted {
            inner,
            count: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            self.count.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
