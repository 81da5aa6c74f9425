//! The error body every API failure carries.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A stable, machine-readable error class. The HTTP status follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request was malformed or a value is out of range (400).
    InvalidArgument,
    /// Authentication is missing or wrong (401).
    Unauthenticated,
    /// The operation is not allowed, e.g. a path escaping the sandbox (403).
    PermissionDenied,
    /// The sandbox, process or file does not exist (404).
    NotFound,
    /// The object is in a state that does not allow the operation (409).
    Conflict,
    /// A body, file or archive exceeds a cap (413).
    TooLarge,
    /// The request body has the wrong content type (415).
    UnsupportedMediaType,
    /// The command could not be started inside the sandbox (422).
    ExecFailed,
    /// A host limit was reached (429).
    ResourceExhausted,
    /// An unexpected failure inside the daemon (500). The body is generic.
    Internal,
    /// The daemon cannot serve right now, e.g. shutting down (503).
    Unavailable,
    /// The gateway could not reach the upstream: nothing listens on the
    /// sandbox's port, or the baseline is down (502).
    BadGateway,
    /// The gateway refused a request that has already passed through it too
    /// many times (`X-Mayfly-Hops`): a routing loop (508).
    LoopDetected,
}

impl ErrorCode {
    /// The HTTP status code this class maps to.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::TooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::ExecFailed => 422,
            ErrorCode::ResourceExhausted => 429,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable => 503,
            ErrorCode::BadGateway => 502,
            ErrorCode::LoopDetected => 508,
        }
    }

    /// The class of an HTTP status, for clients that only see the status.
    pub fn from_http_status(status: u16) -> Self {
        match status {
            401 => ErrorCode::Unauthenticated,
            403 => ErrorCode::PermissionDenied,
            404 => ErrorCode::NotFound,
            409 => ErrorCode::Conflict,
            413 => ErrorCode::TooLarge,
            415 => ErrorCode::UnsupportedMediaType,
            422 => ErrorCode::ExecFailed,
            429 => ErrorCode::ResourceExhausted,
            502 => ErrorCode::BadGateway,
            503 => ErrorCode::Unavailable,
            508 => ErrorCode::LoopDetected,
            s if (400..500).contains(&s) => ErrorCode::InvalidArgument,
            _ => ErrorCode::Internal,
        }
    }
}

/// The JSON body of every error response: `{code, message}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, thiserror::Error)]
#[error("{message} ({code:?})")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
}
