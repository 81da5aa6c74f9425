//! `/v1/sandboxes/{id}/egress`: a sandbox's live egress policy.

use axum::extract::State;
use axum::Json;
use mayfly_types::{ApiError, EgressPolicy};

use crate::extract::{JsonBody, SandboxPath};
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// The sandbox's egress policy as it is now.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/egress", tag = "sandboxes", params(IdParam),
    responses(
        (status = 200, body = EgressPolicy),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn get_egress(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<EgressPolicy>, AppError> {
    Ok(Json(s.api.egress_policy(&id).await?))
}

/// Replace the sandbox's egress policy, without restarting it: DNS queries
/// and connections from now on follow the new one, and open connections it
/// no longer admits are reset (those it still admits keep running).
#[utoipa::path(patch, path = "/v1/sandboxes/{id}/egress", tag = "sandboxes", params(IdParam),
    request_body(content = EgressPolicy, content_type = "application/json"),
    responses(
        (status = 200, body = EgressPolicy),
        (status = 400, description = "A malformed entry (CIDR, port range, wildcard) or cap.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
        (status = 409, description = "The sandbox was created with egress `none` and has no network.", body = ApiError),
    ))]
pub(crate) async fn patch_egress(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    JsonBody(policy): JsonBody<EgressPolicy>,
) -> Result<Json<EgressPolicy>, AppError> {
    Ok(Json(s.api.set_egress_policy(&id, policy).await?))
}
