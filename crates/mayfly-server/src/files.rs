//! `/v1/sandboxes/{id}/files` and `/archive`: the file API.
//!
//! Paths are query parameters and are resolved by the engine inside the
//! sandbox's root; the server only carries them.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};
use mayfly_engine::UploadSummary;
use mayfly_types::{ApiError, FileStat, MkdirRequest, RenameRequest};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::extract::{truncate, JsonBody, QueryParams, RawBody, SandboxPath, TarBody};
use crate::openapi::Binary;
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// `?path=P`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PathQuery {
    /// A path inside the sandbox (relative paths are relative to `/`).
    path: String,
}

/// `?path=P&mode=0644` on `PUT …/files`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct WriteQuery {
    /// A path inside the sandbox.
    path: String,
    /// Permission bits as an octal string, like chmod: `644`, `0644` or
    /// `0o644`, at most `7777`. The engine's default (0644) when absent.
    #[param(example = "0644")]
    mode: Option<String>,
}

/// `?path=P&recursive=true` on `DELETE …/files`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RemoveQuery {
    /// A path inside the sandbox.
    path: String,
    /// Remove a directory and everything under it.
    #[serde(default)]
    recursive: bool,
}

/// Read a file's bytes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files", params(IdParam, PathQuery),
    responses(
        (status = 200, description = "The file's contents.", content_type = "application/octet-stream",
            body = Binary),
        (status = 400, description = "Invalid path.", body = ApiError),
        (status = 403, description = "The path escapes the sandbox.", body = ApiError),
        (status = 404, description = "No such sandbox or file.", body = ApiError),
        (status = 413, description = "The file is over the read cap.", body = ApiError),
    ))]
pub(crate) async fn read_file(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<PathQuery>,
) -> Result<impl IntoResponse, AppError> {
    let data = s.api.read_file(&id, &q.path).await?;
    Ok((content_type("application/octet-stream"), data))
}

/// Write a file (created or truncated) from the raw request body.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files", params(IdParam, WriteQuery),
    request_body(content = Binary, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "The written file.", body = FileStat),
        (status = 400, description = "Invalid path or mode.", body = ApiError),
        (status = 403, description = "The path escapes the sandbox.", body = ApiError),
        (status = 404, description = "No such sandbox or parent directory.", body = ApiError),
        (status = 413, description = "The body is over the upload cap.", body = ApiError),
    ))]
pub(crate) async fn write_file(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<WriteQuery>,
    RawBody(data): RawBody,
) -> Result<Json<FileStat>, AppError> {
    let mode = q.mode.as_deref().map(parse_mode).transpose()?;
    Ok(Json(s.api.write_file(&id, &q.path, data, mode).await?))
}

/// Remove a file, or a directory (with `recursive=true` if it is not empty).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(IdParam, RemoveQuery),
    responses(
        (status = 204, description = "Removed."),
        (status = 400, description = "Invalid path.", body = ApiError),
        (status = 404, description = "No such sandbox or file.", body = ApiError),
        (status = 409, description = "A non-empty directory without `recursive`.", body = ApiError),
    ))]
pub(crate) async fn remove_file(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<RemoveQuery>,
) -> Result<StatusCode, AppError> {
    s.api.remove(&id, &q.path, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Describe one path without following a final symlink.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(IdParam, PathQuery),
    responses(
        (status = 200, body = FileStat),
        (status = 404, description = "No such sandbox or file.", body = ApiError),
    ))]
pub(crate) async fn stat_file(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<PathQuery>,
) -> Result<Json<FileStat>, AppError> {
    Ok(Json(s.api.stat(&id, &q.path).await?))
}

/// List a directory's entries.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(IdParam, PathQuery),
    responses(
        (status = 200, body = Vec<FileStat>),
        (status = 404, description = "No such sandbox or directory.", body = ApiError),
    ))]
pub(crate) async fn list_dir(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<PathQuery>,
) -> Result<Json<Vec<FileStat>>, AppError> {
    Ok(Json(s.api.list_dir(&id, &q.path).await?))
}

/// Create a directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files", params(IdParam),
    request_body(content = MkdirRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The new directory.", body = FileStat),
        (status = 400, description = "Invalid request.", body = ApiError),
        (status = 409, description = "The path exists.", body = ApiError),
    ))]
pub(crate) async fn mkdir(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    JsonBody(req): JsonBody<MkdirRequest>,
) -> Result<Json<FileStat>, AppError> {
    Ok(Json(s.api.mkdir(&id, req).await?))
}

/// Rename (move) a path within the sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", tag = "files", params(IdParam),
    request_body(content = RenameRequest, content_type = "application/json"),
    responses(
        (status = 204, description = "Renamed."),
        (status = 400, description = "Invalid request.", body = ApiError),
        (status = 404, description = "No such sandbox or source path.", body = ApiError),
    ))]
pub(crate) async fn rename(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    JsonBody(req): JsonBody<RenameRequest>,
) -> Result<StatusCode, AppError> {
    s.api.rename(&id, req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Unpack a tar archive into directory `path`.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(IdParam, PathQuery),
    request_body(content = Binary, content_type = "application/x-tar"),
    responses(
        (status = 200, body = UploadSummary),
        (status = 400, description = "Invalid path or an evil archive entry.", body = ApiError),
        (status = 413, description = "The archive is over a size or entry cap.", body = ApiError),
        (status = 415, description = "Not `application/x-tar`.", body = ApiError),
    ))]
pub(crate) async fn upload_archive(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<PathQuery>,
    TarBody(tar): TarBody,
) -> Result<Json<UploadSummary>, AppError> {
    Ok(Json(s.api.upload_tar(&id, &q.path, tar).await?))
}

/// Pack a file or directory into a tar archive.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(IdParam, PathQuery),
    responses(
        (status = 200, description = "The archive.", content_type = "application/x-tar",
            body = Binary),
        (status = 404, description = "No such sandbox or path.", body = ApiError),
        (status = 413, description = "The tree is over a size or entry cap.", body = ApiError),
    ))]
pub(crate) async fn download_archive(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<PathQuery>,
) -> Result<impl IntoResponse, AppError> {
    let tar = s.api.download_tar(&id, &q.path).await?;
    Ok((content_type("application/x-tar"), tar))
}

fn content_type(ct: &'static str) -> [(http::HeaderName, HeaderValue); 1] {
    [(CONTENT_TYPE, HeaderValue::from_static(ct))]
}

/// Parses a chmod-style octal mode: `644`, `0644` or `0o644`, at most `7777`.
fn parse_mode(s: &str) -> Result<u32, AppError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    let bad = || {
        AppError::invalid(format!(
            "mode `{}` is not an octal permission like `0644` (at most 7777)",
            truncate(s, 32)
        ))
    };
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return Err(bad());
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| bad())?;
    if mode > 0o7777 {
        return Err(bad());
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_like_chmod() {
        assert_eq!(parse_mode("644").ok(), Some(0o644));
        assert_eq!(parse_mode("0644").ok(), Some(0o644));
        assert_eq!(parse_mode("0o4755").ok(), Some(0o4755));
        for bad in [
            "",
            "0o",
            "8",
            "-644",
            "+644",
            "10000",
            "0x1ff",
            "999999999999",
            "64 4",
        ] {
            assert!(parse_mode(bad).is_err(), "{bad} accepted");
        }
    }
}
