//! `/v1/pools`: warm pools of booted, unclaimed sandboxes.

use axum::extract::State;
use axum::Json;
use mayfly_types::{ApiError, PoolInfo, PoolList, PoolSpec};

use crate::auth::Who;
use crate::extract::{JsonBody, PoolPath};
use crate::{AppError, AppState};

/// The `{name}` of a pool.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct PoolNameParam {
    /// 1-63 of `a-z`, `0-9`, `_`, `.`, `-`.
    name: String,
}

/// The pools, their settings and how full they are.
#[utoipa::path(get, path = "/v1/pools", tag = "pools",
    responses(
        (status = 200, body = PoolList),
        (status = 401, description = "A wrong or revoked API key.", body = ApiError),
    ))]
pub(crate) async fn list_pools(State(s): State<AppState>) -> Result<Json<PoolList>, AppError> {
    Ok(Json(PoolList {
        pools: s.api.pools().await?,
    }))
}

/// Create or change a pool. Absent fields keep their value. A new template
/// or new limits replace the pool's unclaimed sandboxes. Admin only.
#[utoipa::path(put, path = "/v1/pools/{name}", tag = "pools", params(PoolNameParam),
    request_body(content = PoolSpec, content_type = "application/json"),
    responses(
        (status = 200, body = PoolInfo),
        (status = 400, description = "Invalid name or settings.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
    ))]
pub(crate) async fn set_pool(
    State(s): State<AppState>,
    Who(caller): Who,
    PoolPath(name): PoolPath,
    JsonBody(spec): JsonBody<PoolSpec>,
) -> Result<Json<PoolInfo>, AppError> {
    Ok(Json(s.api.set_pool(&name, spec, &caller).await?))
}

/// Empty a pool: its unclaimed sandboxes are destroyed and its target set
/// to 0. Claimed sandboxes are not touched. Admin only.
#[utoipa::path(post, path = "/v1/pools/{name}/drain", tag = "pools", params(PoolNameParam),
    responses(
        (status = 200, body = PoolInfo),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 404, description = "No such pool.", body = ApiError),
    ))]
pub(crate) async fn drain_pool(
    State(s): State<AppState>,
    Who(caller): Who,
    PoolPath(name): PoolPath,
) -> Result<Json<PoolInfo>, AppError> {
    Ok(Json(s.api.drain_pool(&name, &caller).await?))
}
