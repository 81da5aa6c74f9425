//! `/v1/sandboxes/{id}/artifacts`: what a sandbox left behind, collected
//! when it was destroyed; answered after the sandbox is gone too.

use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::HeaderValue;
use mayfly_types::{ApiError, ArtifactList};
use tokio::io::AsyncReadExt;
use utoipa::IntoParams;

use crate::extract::{authorize, parse_id, path_params, truncate, SandboxPath};
use crate::openapi::Binary;
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// The `{id}` and `{name}` of an artifact route, of a sandbox the caller may
/// touch.
pub(crate) struct ArtifactPath(pub mayfly_types::SandboxId, pub String);

impl axum::extract::FromRequestParts<AppState> for ArtifactPath {
    type Rejection = AppError;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Self, AppError> {
        let params = path_params(parts, state).await?;
        let id = parse_id(&params)?;
        authorize(parts, state, &id).await?;
        let name = params
            .get("name")
            .ok_or_else(|| AppError::internal("route has no {name} parameter"))?;
        if name.is_empty() || name.len() > 255 || name.contains('/') {
            return Err(AppError::invalid(format!(
                "`{}` is not an artifact name",
                truncate(name, 64)
            )));
        }
        Ok(ArtifactPath(id, name.clone()))
    }
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct NameParam {
    /// The artifact's name, as listed.
    name: String,
}

/// List a sandbox's collected artifacts (empty until it is destroyed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/artifacts", tag = "artifacts", params(IdParam),
    responses(
        (status = 200, body = ArtifactList),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn list_artifacts(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<ArtifactList>, AppError> {
    Ok(Json(s.api.list_artifacts(&id).await?))
}

/// Download one artifact's bytes (a directory's is a tar archive).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/artifacts/{name}", tag = "artifacts",
    params(IdParam, NameParam),
    responses(
        (status = 200, description = "The artifact.", content_type = "application/octet-stream",
            body = Binary),
        (status = 404, description = "No such sandbox or artifact.", body = ApiError),
    ))]
pub(crate) async fn get_artifact(
    State(s): State<AppState>,
    ArtifactPath(id, name): ArtifactPath,
) -> Result<impl IntoResponse, AppError> {
    let (info, file) = s.api.open_artifact(&id, &name).await?;
    let file = tokio::fs::File::from_std(file);
    let stream = futures_util::stream::unfold(file, |mut f| async move {
        let mut buf = vec![0u8; 64 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    let ct = if info.kind == "dir" {
        "application/x-tar"
    } else {
        "application/octet-stream"
    };
    Ok((
        [
            (CONTENT_TYPE, HeaderValue::from_static(ct)),
            (CONTENT_LENGTH, HeaderValue::from(info.size)),
        ],
        Body::from_stream(stream),
    ))
}
