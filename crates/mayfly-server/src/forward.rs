//! Plain TCP forwarding over the API: an upgraded request becomes a raw
//! byte stream to a port inside the sandbox (`mayfly port-forward`).

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, StatusCode};
use hyper_util::rt::TokioIo;
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
    let upstream = gw.connect(&id, port).await?;
    // Bytes either way count as the sandbox's activity, not only this
    // request: a forward in use keeps its sandbox from idling out.
    let mut upstream = crate::activity::Touching::new(upstream, gw.activity(&id));
    // A forward opened with a key ends when the key is revoked.
    let revoked = match crate::auth::api_key(&req) {
        Some(key) => crate::revocable::until_revoked(s.api.clone(), key.to_owned()),
        None => Box::pin(std::future::pending()),
    };
    let on = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(up) = on.await {
            let mut up = TokioIo::new(up);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut up, &mut upstream) => {}
                () = revoked => tracing::info!(%id, port, "a forward was cut: its API key was revoked"),
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
