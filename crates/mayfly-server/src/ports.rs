//! `/v1/sandboxes/{id}/ports`, `/overrides` and `/v1/routes`: what the
//! gateway exposes and where it routes. The gateway itself (the proxy) is
//! in `gateway/`.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Json;
use mayfly_engine::GatewayApi;
use mayfly_types::{
    check_port, check_service_name, ApiError, ErrorCode, ExposeRequest, OverrideRequest, PortInfo,
    RouteInfo, RouteList, RouteRequest, SandboxId, SandboxPorts, ServiceOverride,
};

use crate::auth::Admin;
use crate::extract::{authorize, parse_id, path_params, JsonBody, SandboxPath};
use crate::{AppError, AppState};

/// The `{id}` and `{port}` of a port route, checked (tenancy included).
pub(crate) struct PortPath(pub SandboxId, pub u16);

impl FromRequestParts<AppState> for PortPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let params = path_params(parts, state).await?;
        let id = parse_id(&params)?;
        authorize(parts, state, &id).await?;
        let raw = params.get("port").map(String::as_str).unwrap_or("");
        let port = raw
            .parse::<u32>()
            .map_err(|_| AppError::invalid(format!("`{raw}` is not a port number")))
            .and_then(|p| check_port(p).map_err(AppError::invalid))?;
        Ok(PortPath(id, port))
    }
}

/// The `{id}` and `{service}` of an override route, checked.
pub(crate) struct OverridePath(pub SandboxId, pub String);

impl FromRequestParts<AppState> for OverridePath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let mut params = path_params(parts, state).await?;
        let id = parse_id(&params)?;
        authorize(parts, state, &id).await?;
        let service = params.remove("service").unwrap_or_default();
        check_service_name(&service).map_err(|e| AppError::invalid(e.to_string()))?;
        Ok(OverridePath(id, service))
    }
}

/// The `{name}` of a route, checked.
pub(crate) struct RoutePath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for RoutePath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let mut params = path_params(parts, state).await?;
        let name = params.remove("name").unwrap_or_default();
        check_service_name(&name).map_err(|e| AppError::invalid(e.to_string()))?;
        Ok(RoutePath(name))
    }
}

fn gateway(s: &AppState) -> Result<&dyn GatewayApi, AppError> {
    s.api
        .gateway()
        .ok_or_else(|| AppError::new(ErrorCode::NotFound, "this daemon has no gateway"))
}

/// The preview URL of `port` of `id`, when the daemon runs a gateway.
fn url(s: &AppState, id: &SandboxId, port: u16) -> Option<String> {
    s.opts
        .gateway
        .as_ref()
        .map(|g| format!("http://{port}-{id}.{}:{}", g.domain, g.port))
}

/// The sandbox's gateway token, exposed ports and service overrides.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "gateway",
    params(("id" = String, Path, description = "The sandbox id.")),
    responses(
        (status = 200, body = SandboxPorts),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn list_ports(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxPorts>, AppError> {
    let mut ports = gateway(&s)?.ports(&id).await?;
    for p in &mut ports.ports {
        p.url = url(&s, &id, p.port);
    }
    Ok(Json(ports))
}

/// Expose a port of the sandbox through the gateway; `public` makes it
/// reachable without the sandbox's token. Port 15080, the gateway's own
/// inside the sandbox, is refused.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/ports/{port}", tag = "gateway",
    params(("id" = String, Path, description = "The sandbox id."),
           ("port" = u16, Path, description = "1 to 65535.")),
    request_body(content = ExposeRequest, content_type = "application/json"),
    responses(
        (status = 200, body = PortInfo),
        (status = 400, description = "A port out of range, or the reserved 15080.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn expose_port(
    State(s): State<AppState>,
    PortPath(id, port): PortPath,
    JsonBody(req): JsonBody<ExposeRequest>,
) -> Result<Json<PortInfo>, AppError> {
    let mut info = gateway(&s)?.expose(&id, port, req.public).await?;
    info.url = url(&s, &id, port);
    Ok(Json(info))
}

/// Take a port's exposure back: it needs the token again.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}", tag = "gateway",
    params(("id" = String, Path, description = "The sandbox id."),
           ("port" = u16, Path, description = "1 to 65535.")),
    responses(
        (status = 204, description = "Not exposed any more."),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn unexpose_port(
    State(s): State<AppState>,
    PortPath(id, port): PortPath,
) -> Result<StatusCode, AppError> {
    gateway(&s)?.unexpose(&id, port).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Route a service to this sandbox's port for requests whose routing key
/// names the sandbox. This publishes the port, for that service, to every
/// request that reaches the gateway with the sandbox's key: no token is
/// asked for. Port 15080, the gateway's own inside the sandbox, is refused.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/overrides/{service}", tag = "gateway",
    params(("id" = String, Path, description = "The sandbox id."),
           ("service" = String, Path, description = "A service name.")),
    request_body(content = OverrideRequest, content_type = "application/json"),
    responses(
        (status = 200, body = ServiceOverride),
        (status = 400, description = "A bad service name or port, or the reserved 15080.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn set_override(
    State(s): State<AppState>,
    OverridePath(id, service): OverridePath,
    JsonBody(req): JsonBody<OverrideRequest>,
) -> Result<Json<ServiceOverride>, AppError> {
    let port = check_port(req.port).map_err(AppError::invalid)?;
    Ok(Json(gateway(&s)?.set_override(&id, &service, port).await?))
}

/// Stop overriding a service: its requests go to the baseline again.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/overrides/{service}", tag = "gateway",
    params(("id" = String, Path, description = "The sandbox id."),
           ("service" = String, Path, description = "A service name.")),
    responses(
        (status = 204, description = "Removed (or there was none)."),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn remove_override(
    State(s): State<AppState>,
    OverridePath(id, service): OverridePath,
) -> Result<StatusCode, AppError> {
    gateway(&s)?.remove_override(&id, &service).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The routes: each service's shared baseline.
#[utoipa::path(get, path = "/v1/routes", tag = "gateway",
    responses(
        (status = 200, body = RouteList),
        (status = 401, description = "A wrong or revoked API key.", body = ApiError),
    ))]
pub(crate) async fn list_routes(State(s): State<AppState>) -> Result<Json<RouteList>, AppError> {
    Ok(Json(RouteList {
        routes: gateway(&s)?.routes().await?,
    }))
}

/// Create or replace a route. Admin only.
#[utoipa::path(put, path = "/v1/routes/{name}", tag = "gateway",
    params(("name" = String, Path, description = "A service name.")),
    request_body(content = RouteRequest, content_type = "application/json"),
    responses(
        (status = 200, body = RouteInfo),
        (status = 400, description = "A bad name or URL.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
    ))]
pub(crate) async fn put_route(
    State(s): State<AppState>,
    _admin: Admin,
    RoutePath(name): RoutePath,
    JsonBody(req): JsonBody<RouteRequest>,
) -> Result<Json<RouteInfo>, AppError> {
    Ok(Json(gateway(&s)?.put_route(&name, &req.url).await?))
}

/// Remove a route. Admin only.
#[utoipa::path(delete, path = "/v1/routes/{name}", tag = "gateway",
    params(("name" = String, Path, description = "A service name.")),
    responses(
        (status = 204, description = "Removed."),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 404, description = "No such route.", body = ApiError),
    ))]
pub(crate) async fn delete_route(
    State(s): State<AppState>,
    _admin: Admin,
    RoutePath(name): RoutePath,
) -> Result<StatusCode, AppError> {
    gateway(&s)?.delete_route(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
