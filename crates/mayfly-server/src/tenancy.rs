//! `/v1/tenants` and `/v1/keys`: the admin API. Every route needs an admin
//! caller ([`Admin`]); anyone else gets a 403.

use axum::extract::State;
use axum::Json;
use http::StatusCode;
use mayfly_engine::TenancyApi;
use mayfly_types::{
    ApiError, CreateKeyRequest, CreatedKey, ErrorCode, KeyInfo, KeyList, TenantInfo, TenantList,
    TenantQuotas,
};
use utoipa::IntoParams;

use crate::auth::Admin;
use crate::extract::{JsonBody, KeyPath, OptionalJsonBody, TenantPath};
use crate::{AppError, AppState};

/// The engine's tenancy, or a 404 for a front end without one.
fn tenancy(s: &AppState) -> Result<&dyn TenancyApi, AppError> {
    s.api.tenancy().ok_or_else(|| {
        AppError::new(
            ErrorCode::NotFound,
            "this daemon does not manage tenants or API keys",
        )
    })
}

/// Every tenant, with its quotas and what its live sandboxes hold.
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants",
    responses(
        (status = 200, body = TenantList),
        (status = 403, description = "Not an admin.", body = ApiError),
    ))]
pub(crate) async fn list_tenants(
    State(s): State<AppState>,
    Admin(_admin): Admin,
) -> Result<Json<TenantList>, AppError> {
    let tenants = tenancy(&s)?.tenants().await?;
    Ok(Json(TenantList { tenants }))
}

/// One tenant.
#[utoipa::path(get, path = "/v1/tenants/{name}", tag = "tenants", params(NameParam),
    responses(
        (status = 200, body = TenantInfo),
        (status = 400, description = "Invalid tenant name.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 404, description = "No such tenant.", body = ApiError),
    ))]
pub(crate) async fn get_tenant(
    State(s): State<AppState>,
    Admin(_admin): Admin,
    TenantPath(name): TenantPath,
) -> Result<Json<TenantInfo>, AppError> {
    Ok(Json(tenancy(&s)?.tenant(&name).await?))
}

/// Create a tenant, or replace its quotas. A quota left out (or an empty
/// body) is unlimited. New quotas hold from the next create on.
#[utoipa::path(put, path = "/v1/tenants/{name}", tag = "tenants", params(NameParam),
    request_body(content = TenantQuotas, content_type = "application/json"),
    responses(
        (status = 200, body = TenantInfo),
        (status = 400, description = "Invalid name or quota.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
    ))]
pub(crate) async fn put_tenant(
    State(s): State<AppState>,
    Admin(_admin): Admin,
    TenantPath(name): TenantPath,
    OptionalJsonBody(quotas): OptionalJsonBody<TenantQuotas>,
) -> Result<Json<TenantInfo>, AppError> {
    quotas
        .validate()
        .map_err(|e| AppError::invalid(e.to_string()))?;
    Ok(Json(tenancy(&s)?.put_tenant(&name, quotas).await?))
}

/// Remove a tenant and revoke its keys. It must have no live sandbox.
#[utoipa::path(delete, path = "/v1/tenants/{name}", tag = "tenants", params(NameParam),
    responses(
        (status = 204, description = "Removed."),
        (status = 400, description = "Invalid tenant name.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 404, description = "No such tenant.", body = ApiError),
        (status = 409, description = "The tenant has live sandboxes, or is `default`.",
            body = ApiError),
    ))]
pub(crate) async fn delete_tenant(
    State(s): State<AppState>,
    Admin(_admin): Admin,
    TenantPath(name): TenantPath,
) -> Result<StatusCode, AppError> {
    tenancy(&s)?.delete_tenant(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Make an API key for a tenant. The answer holds its secret, which is
/// shown this once: only a hash of it is stored.
#[utoipa::path(post, path = "/v1/keys", tag = "tenants",
    request_body(content = CreateKeyRequest, content_type = "application/json"),
    responses(
        (status = 201, body = CreatedKey),
        (status = 400, description = "Invalid request.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 404, description = "No such tenant.", body = ApiError),
    ))]
pub(crate) async fn create_key(
    State(s): State<AppState>,
    Admin(_admin): Admin,
    JsonBody(req): JsonBody<CreateKeyRequest>,
) -> Result<(StatusCode, Json<CreatedKey>), AppError> {
    mayfly_types::check_tenant_name(&req.tenant).map_err(|e| AppError::invalid(e.to_string()))?;
    let key = tenancy(&s)?.create_key(&req).await?;
    Ok((StatusCode::CREATED, Json(key)))
}

/// Every API key, revoked ones included. Never a secret.
#[utoipa::path(get, path = "/v1/keys", tag = "tenants",
    responses(
        (status = 200, body = KeyList),
        (status = 403, description = "Not an admin.", body = ApiError),
    ))]
pub(crate) async fn list_keys(
    State(s): State<AppState>,
    Admin(_admin): Admin,
) -> Result<Json<KeyList>, AppError> {
    let keys = tenancy(&s)?.keys().await?;
    Ok(Json(KeyList { keys }))
}

/// Revoke an API key: its next request gets a 401. Idempotent.
#[utoipa::path(delete, path = "/v1/keys/{id}", tag = "tenants", params(KeyIdParam),
    responses(
        (status = 200, description = "The revoked key.", body = KeyInfo),
        (status = 400, description = "Malformed key id.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 404, description = "No such key.", body = ApiError),
    ))]
pub(crate) async fn revoke_key(
    State(s): State<AppState>,
    Admin(_admin): Admin,
    KeyPath(id): KeyPath,
) -> Result<Json<KeyInfo>, AppError> {
    Ok(Json(tenancy(&s)?.revoke_key(&id).await?))
}

/// The `{name}` path parameter, for the OpenAPI document.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct NameParam {
    /// A tenant name: 1 to 63 of `[a-z0-9_-]`, starting with a letter or digit.
    #[param(example = "acme")]
    name: String,
}

/// The `{id}` path parameter of a key route, for the OpenAPI document.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct KeyIdParam {
    /// A key id: 12 lowercase hex digits.
    #[param(example = "0123456789ab")]
    id: String,
}
