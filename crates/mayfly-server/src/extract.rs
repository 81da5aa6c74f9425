//! Extractors whose every rejection is a JSON [`AppError`].
//!
//! axum's own extractors reject with plain text. These wrappers parse the
//! same things but fail with `{code, message}` and a 4xx, and they enforce
//! the body caps from [`crate::ServerOptions`].

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::HeaderMap;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use mayfly_engine::{Caller, EngineError};
use mayfly_types::{check_key_id, check_tenant_name, SandboxId};
use serde::de::DeserializeOwned;

use crate::{AppError, AppState};

/// A JSON request body: `Content-Type: application/json`, at most
/// `json_body_limit` bytes, and a value that deserializes (unknown fields
/// and out-of-range numbers are rejected by the types themselves).
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        require_json(req.headers())?;
        let bytes = read_capped(req, state.opts.json_body_limit, "JSON body").await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Like [`JsonBody`], but an empty body without a content type means
/// `T::default()`, so `POST /v1/sandboxes` with nothing creates a default
/// sandbox and `POST …/kill` with nothing sends SIGKILL.
#[derive(Debug)]
pub(crate) struct OptionalJsonBody<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for OptionalJsonBody<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        if req.headers().get(CONTENT_TYPE).is_none() {
            let bytes = read_capped(req, state.opts.json_body_limit, "JSON body").await?;
            if bytes.is_empty() {
                return Ok(OptionalJsonBody(T::default()));
            }
            return Err(AppError::unsupported_media_type(
                "a request body needs `Content-Type: application/json`",
            ));
        }
        JsonBody::from_request(req, state)
            .await
            .map(|JsonBody(v)| OptionalJsonBody(v))
    }
}

/// A raw body (file contents, tar archives) of at most `file_body_limit` bytes.
#[derive(Debug)]
pub(crate) struct RawBody(pub Bytes);

impl FromRequest<AppState> for RawBody {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        read_capped(req, state.opts.file_body_limit, "body")
            .await
            .map(RawBody)
    }
}

/// A tar archive body: `application/x-tar`, `application/octet-stream`, or
/// no content type at all (what `curl -T` sends); anything else is 415.
#[derive(Debug)]
pub(crate) struct TarBody(pub Bytes);

impl FromRequest<AppState> for TarBody {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        if let Some(ct) = req.headers().get(CONTENT_TYPE) {
            let essence = media_essence(ct.to_str().unwrap_or(""));
            if essence != "application/x-tar" && essence != "application/octet-stream" {
                return Err(AppError::unsupported_media_type(format!(
                    "an archive upload needs `Content-Type: application/x-tar`, not `{}`",
                    truncate(&essence, 64)
                )));
            }
        }
        RawBody::from_request(req, state)
            .await
            .map(|RawBody(b)| TarBody(b))
    }
}

/// Query parameters, with a JSON 400 naming the bad parameter.
#[derive(Debug)]
pub(crate) struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(QueryParams(v)),
            Err(e) => {
                let text = e.body_text();
                let detail = text
                    .strip_prefix("Failed to deserialize query string: ")
                    .unwrap_or(&text);
                Err(AppError::invalid(format!("bad query string: {detail}")))
            }
        }
    }
}

/// The `{id}` of a sandbox route, parsed into a [`SandboxId`], of a sandbox
/// the caller may touch.
///
/// A malformed id is a 400 here; a well-formed id the engine does not know
/// is the engine's 404. Tenant isolation is enforced here, for every
/// sandbox route at once: to a non-admin caller, another tenant's sandbox
/// (or an unclaimed pool sandbox) answers exactly as a missing one does.
#[derive(Debug)]
pub(crate) struct SandboxPath(pub SandboxId);

impl FromRequestParts<AppState> for SandboxPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let params = path_params(parts, state).await?;
        let id = parse_id(&params)?;
        authorize(parts, state, &id).await?;
        Ok(SandboxPath(id))
    }
}

/// The `{name}` of a pool route, checked.
#[derive(Debug)]
pub(crate) struct PoolPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PoolPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let params = path_params(parts, state).await?;
        let name = params
            .get("name")
            .ok_or_else(|| AppError::internal("route has no {name} parameter"))?;
        mayfly_engine::check_pool_name(name)?;
        Ok(PoolPath(name.clone()))
    }
}

/// The `{name}` of a template route, checked.
#[derive(Debug)]
pub(crate) struct TemplatePath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for TemplatePath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let params = path_params(parts, state).await?;
        let name = params
            .get("name")
            .ok_or_else(|| AppError::internal("route has no {name} parameter"))?;
        if !mayfly_types::is_template_name(name) {
            return Err(mayfly_engine::EngineError::Invalid(format!(
                "`{}` is not a template name",
                name.chars().take(64).collect::<String>().escape_debug()
            ))
            .into());
        }
        Ok(TemplatePath(name.clone()))
    }
}

/// The `{id}` and `{handle}` of a background-process route, of a sandbox
/// the caller may touch (see [`SandboxPath`]).
#[derive(Debug)]
pub(crate) struct ProcessPath(pub SandboxId, pub u64);

impl FromRequestParts<AppState> for ProcessPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let params = path_params(parts, state).await?;
        let id = parse_id(&params)?;
        authorize(parts, state, &id).await?;
        let raw = params
            .get("handle")
            .ok_or_else(|| AppError::internal("route has no {handle} parameter"))?;
        let handle = raw.parse::<u64>().map_err(|_| {
            AppError::invalid(format!(
                "`{}` is not a process handle: expected a non-negative integer",
                truncate(raw, 64)
            ))
        })?;
        Ok(ProcessPath(id, handle))
    }
}

/// Lets an admin caller at any sandbox and anyone else at their tenant's
/// only; the refusal is the engine's own "does not exist".
pub(crate) async fn authorize(
    parts: &Parts,
    state: &AppState,
    id: &SandboxId,
) -> Result<(), AppError> {
    let caller = parts
        .extensions
        .get::<Caller>()
        .ok_or_else(|| AppError::internal("the authentication layer did not run"))?;
    if caller.admin {
        return Ok(());
    }
    match state.api.owner_of(id).await {
        Ok(Some(tenant)) if tenant == caller.tenant => Ok(()),
        Ok(_) => Err(EngineError::NoSuchSandbox(id.clone()).into()),
        Err(e) => Err(e.into()),
    }
}

/// The `{name}` of a tenant route: a valid tenant name, or a 400.
#[derive(Debug)]
pub(crate) struct TenantPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for TenantPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let mut params = path_params(parts, state).await?;
        let name = params
            .remove("name")
            .ok_or_else(|| AppError::internal("route has no {name} parameter"))?;
        check_tenant_name(&name).map_err(|e| AppError::invalid(e.to_string()))?;
        Ok(TenantPath(name))
    }
}

/// The `{id}` of a key route: a valid key id, or a 400.
#[derive(Debug)]
pub(crate) struct KeyPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let mut params = path_params(parts, state).await?;
        let id = params
            .remove("id")
            .ok_or_else(|| AppError::internal("route has no {id} parameter"))?;
        check_key_id(&id).map_err(|e| AppError::invalid(e.to_string()))?;
        Ok(KeyPath(id))
    }
}

pub(crate) async fn path_params<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<HashMap<String, String>, AppError> {
    Path::<HashMap<String, String>>::from_request_parts(parts, state)
        .await
        .map(|Path(p)| p)
        .map_err(|e| AppError::invalid(format!("bad path: {}", e.body_text())))
}

pub(crate) fn parse_id(params: &HashMap<String, String>) -> Result<SandboxId, AppError> {
    let raw = params
        .get("id")
        .ok_or_else(|| AppError::internal("route has no {id} parameter"))?;
    raw.parse::<SandboxId>()
        .map_err(|e| AppError::invalid(e.to_string()))
}

fn require_json(headers: &HeaderMap) -> Result<(), AppError> {
    let Some(ct) = headers.get(CONTENT_TYPE) else {
        return Err(AppError::unsupported_media_type(
            "a request body needs `Content-Type: application/json`",
        ));
    };
    let essence = media_essence(ct.to_str().unwrap_or(""));
    if essence == "application/json" {
        Ok(())
    } else {
        Err(AppError::unsupported_media_type(format!(
            "expected `Content-Type: application/json`, not `{}`",
            truncate(&essence, 64)
        )))
    }
}

/// `Application/JSON; charset=utf-8` → `application/json`.
fn media_essence(ct: &str) -> String {
    ct.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, AppError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "invalid request",
            _ => "malformed JSON",
        };
        AppError::invalid(format!("{what}: {e}"))
    })
}

/// Reads the whole body, refusing with 413 as soon as it is known to exceed
/// `cap`: from `Content-Length` before reading, or while reading a chunked one.
async fn read_capped(req: Request, cap: usize, what: &str) -> Result<Bytes, AppError> {
    let too_large = || AppError::too_large(format!("the {what} exceeds the limit of {cap} bytes"));
    if let Some(len) = req.headers().get(CONTENT_LENGTH) {
        let len = len
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| AppError::invalid("the Content-Length header is not a number"))?;
        if len > cap as u64 {
            return Err(too_large());
        }
    }
    let body: Body = req.into_body();
    match Limited::new(body, cap).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(AppError::invalid(format!(
            "the request body could not be read: {e}"
        ))),
    }
}

/// A page's `?limit=`: `default` when absent, else in `1..=max` or a 400.
pub(crate) fn page_limit(limit: Option<u32>, default: u32, max: u32) -> Result<u32, AppError> {
    let limit = limit.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(AppError::invalid(format!(
            "limit = {limit} is out of range; allowed is 1..={max}"
        )))
    }
}

pub(crate) fn truncate(s: &str, max_chars: usize) -> String {
    s.chars().take(max_chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_type_parameters_and_case_are_ignored() {
        assert_eq!(
            media_essence("Application/JSON; charset=utf-8"),
            "application/json"
        );
        assert_eq!(media_essence(""), "");
    }

    #[test]
    fn json_errors_say_whether_syntax_or_content_was_wrong() {
        let e = parse_json::<mayfly_types::ExecRequest>(b"{").unwrap_err();
        assert!(e.body().message.starts_with("malformed JSON"), "{e:?}");
        let e = parse_json::<mayfly_types::ExecRequest>(br#"{"argv":[],"x":1}"#).unwrap_err();
        assert!(e.body().message.contains("unknown field"), "{e:?}");
    }
}
