//! `/v1/sandboxes`: create, list, get, destroy.

use axum::extract::State;
use axum::Json;
use http::StatusCode;
use mayfly_engine::ListSandboxes;
use mayfly_types::{ApiError, CreateRequest, SandboxInfo, SandboxList};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Who;
use crate::extract::{page_limit, OptionalJsonBody, QueryParams, SandboxPath};
use crate::{AppError, AppState};

/// `?all=true&limit=N` on `GET /v1/sandboxes`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Include destroyed and failed sandboxes: then the most recently
    /// created ones, as many as `limit`.
    #[serde(default)]
    all: bool,
    /// With `all`: at most this many (1000 when absent, at most 10000).
    limit: Option<u32>,
}

/// Recorded sandboxes listed by `?all=true` when no `limit` is given.
pub const DEFAULT_LIST_LIMIT: u32 = 1000;
/// The largest `limit` of `?all=true`.
pub const MAX_LIST_LIMIT: u32 = 10_000;

/// Create a sandbox. An empty body creates one with the daemon's defaults.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body(content = CreateRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The sandbox is ready.", body = SandboxInfo),
        (status = 400, description = "Invalid request or limits.", body = ApiError),
        (status = 413, description = "Body over 1 MiB.", body = ApiError),
        (status = 415, description = "Not `application/json`.", body = ApiError),
        (status = 403, description = "Refused for good: a tenant key naming a host path \
            (a `dir:` template, a local repository), or a quota no wait can satisfy (zero, \
            or smaller than the sandbox alone).", body = ApiError),
        (status = 429, description = "A tenant quota or a host limit was reached; \
            `Retry-After` says when to try again.", body = ApiError),
    ))]
pub(crate) async fn create_sandbox(
    State(s): State<AppState>,
    Who(caller): Who,
    OptionalJsonBody(req): OptionalJsonBody<CreateRequest>,
) -> Result<(StatusCode, Json<SandboxInfo>), AppError> {
    let info = s.api.create(req, &caller).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// List live sandboxes, or with `?all=true` the most recently created
/// recorded ones (`limit`, 1000 by default), oldest first: the caller's
/// tenant's only, unless the caller is an admin.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListQuery),
    responses(
        (status = 200, body = SandboxList),
        (status = 400, description = "Bad query string.", body = ApiError),
    ))]
pub(crate) async fn list_sandboxes(
    State(s): State<AppState>,
    Who(caller): Who,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<SandboxList>, AppError> {
    let limit = page_limit(q.limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
    let sandboxes = s
        .api
        .list(ListSandboxes {
            all: q.all,
            tenant: (!caller.admin).then(|| caller.tenant.clone()),
            limit,
        })
        .await?;
    Ok(Json(SandboxList { sandboxes }))
}

/// Describe one sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(IdParam),
    responses(
        (status = 200, body = SandboxInfo),
        (status = 400, description = "Malformed sandbox id.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn get_sandbox(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, AppError> {
    Ok(Json(s.api.get(&id).await?))
}

/// Destroy a sandbox. Idempotent: destroying a destroyed one returns its record.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(IdParam),
    responses(
        (status = 200, description = "The sandbox's final record.", body = SandboxInfo),
        (status = 400, description = "Malformed sandbox id.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn destroy_sandbox(
    State(s): State<AppState>,
    Who(caller): Who,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, AppError> {
    Ok(Json(s.api.destroy(&id, &caller).await?))
}

/// The `{id}` path parameter, for the OpenAPI document.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct IdParam {
    /// The sandbox id: `mf-` and 12 characters of `[a-z0-9]`.
    #[param(example = "mf-abcdefghjkmn")]
    id: String,
}

/// Keep a sandbox alive: resets its idle timer and, with `ttl_secs`, moves
/// its deadline to that many seconds from now (at most the maximum TTL).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/keepalive", tag = "sandboxes", params(IdParam),
    request_body(content = Option<mayfly_types::KeepaliveRequest>, content_type = "application/json"),
    responses(
        (status = 200, body = SandboxInfo),
        (status = 400, description = "Malformed id or TTL out of range.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
        (status = 409, description = "The sandbox is stopping or ended.", body = ApiError),
    ))]
pub(crate) async fn keepalive(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    OptionalJsonBody(req): OptionalJsonBody<mayfly_types::KeepaliveRequest>,
) -> Result<Json<SandboxInfo>, AppError> {
    Ok(Json(s.api.keepalive(&id, req.ttl_secs).await?))
}
