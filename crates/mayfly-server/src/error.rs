//! The one mapping from failures to HTTP responses.
//!
//! Every error leaves the server as JSON `{code, message}` ([`ApiError`]) with
//! the status its [`ErrorCode`] maps to. Internal errors get a generic body;
//! their detail travels in a response extension to the
//! [`log_internal_errors`] middleware, which logs it exactly once.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderValue, StatusCode};
use mayfly_engine::EngineError;
use mayfly_types::{ApiError, ErrorCode};

/// An error on its way to becoming a JSON response.
#[derive(Debug)]
pub(crate) struct AppError {
    status: StatusCode,
    body: ApiError,
    /// What really went wrong, for the log only (internal errors).
    detail: Option<String>,
    /// Seconds for a `Retry-After` header (quotas, host limits).
    retry_after: Option<u64>,
}

/// The detail of an internal error, carried from the handler to the logging
/// middleware so it is logged once, with the request line beside it.
#[derive(Debug, Clone)]
pub(crate) struct InternalDetail(pub(crate) String);

impl AppError {
    /// An error whose status follows from its code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: status_of(code),
            body: ApiError::new(code, message),
            detail: None,
            retry_after: None,
        }
    }

    /// 400 `invalid_argument`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// 413 `too_large`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::TooLarge, message)
    }

    /// 415 `unsupported_media_type`.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::UnsupportedMediaType, message)
    }

    /// 500 with a generic body; `detail` goes to the log only.
    pub fn internal(detail: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: ApiError::new(ErrorCode::Internal, GENERIC_INTERNAL),
            detail: Some(detail.into()),
            retry_after: None,
        }
    }

    /// Overrides the status, for the few HTTP-level errors (405) whose status
    /// has no [`ErrorCode`] of its own.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    #[cfg(test)]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    #[cfg(test)]
    pub fn body(&self) -> &ApiError {
        &self.body
    }
}

const GENERIC_INTERNAL: &str = "internal error; see the daemon's log";

fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl From<EngineError> for AppError {
    fn from(e: EngineError) -> Self {
        let body = e.to_api();
        let detail = (body.code == ErrorCode::Internal).then(|| e.to_string());
        Self {
            status: status_of(body.code),
            body,
            detail,
            retry_after: e.retry_after_secs(),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(detail) = self.detail {
            resp.extensions_mut().insert(InternalDetail(detail));
        }
        resp
    }
}

/// Logs the detail of every internal error once, with the request line, and
/// makes sure it never reaches the client.
pub(crate) async fn log_internal_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut resp = next.run(req).await;
    if let Some(InternalDetail(detail)) = resp.extensions_mut().remove::<InternalDetail>() {
        tracing::error!(%method, %path, error = %detail, "request failed with an internal error");
    }
    resp
}

/// The JSON 404 for paths no route matches.
pub(crate) async fn no_such_route(req: Request) -> AppError {
    AppError::new(
        ErrorCode::NotFound,
        format!(
            "no route for {} {}; see /openapi.json",
            req.method(),
            req.uri().path()
        ),
    )
}

/// The JSON 405 for a known path asked with a method it does not serve.
pub(crate) async fn method_not_allowed(req: Request) -> AppError {
    AppError::invalid(format!(
        "method {} is not allowed on {}; see /openapi.json",
        req.method(),
        req.uri().path()
    ))
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
}

/// Turns a panic anywhere below it into a JSON 500 instead of a dropped
/// connection. Handlers never panic on input; this is the safety net.
pub(crate) async fn catch_panic(req: Request, next: Next) -> Response {
    use futures_util::FutureExt as _;
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(resp) => resp,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".to_owned());
            tracing::error!(%method, %path, panic = %what, "request handler panicked");
            let mut resp = (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(ApiError::new(ErrorCode::Internal, GENERIC_INTERNAL)),
            )
                .into_response();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mayfly_types::SandboxId;

    #[test]
    fn engine_errors_keep_their_code_and_message() {
        let id: SandboxId = "mf-abcdefghjkmn".parse().expect("valid id");
        let e = AppError::from(EngineError::NoSuchSandbox(id));
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.body().code, ErrorCode::NotFound);
        assert!(e.body().message.contains("mf-abcdefghjkmn"));
        assert!(e.detail.is_none());
        assert!(e.retry_after.is_none());
    }

    #[test]
    fn a_quota_refusal_is_a_429_with_retry_after() {
        let e = AppError::from(EngineError::Quota(mayfly_engine::QuotaError::Rate {
            tenant: "acme".into(),
            per_min: 2,
            retry_after_secs: 17,
        }));
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body().code, ErrorCode::ResourceExhausted);
        assert!(e.body().message.contains("2 creates per minute"), "{e:?}");
        let resp = e.into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], "17");
    }

    #[test]
    fn internal_engine_errors_hide_their_detail_from_the_body() {
        let e = AppError::from(EngineError::Internal(
            "db file at /secret is corrupt".into(),
        ));
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.body().message.contains("/secret"));
        assert!(e.detail.as_deref().is_some_and(|d| d.contains("/secret")));
    }
}
