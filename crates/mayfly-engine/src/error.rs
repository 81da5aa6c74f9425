//! The engine's error, rolled up from each module's own error.

use mayfly_types::{ErrorCode, SandboxId, SandboxState};

/// Everything a [`crate::SandboxApi`] call can fail with.
///
/// Each variant knows its [`ErrorCode`]; front ends map that code to a status
/// and show `Display` as the message, except for internal errors, which get a
/// generic message and are logged once by the server.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is malformed or out of range.
    #[error("{0}")]
    Invalid(String),
    #[error("sandbox {0} does not exist")]
    NoSuchSandbox(SandboxId),
    #[error("sandbox {id} has no artifact `{name}`")]
    NoSuchArtifact { id: SandboxId, name: String },
    #[error("there is no pool `{0}`")]
    NoSuchPool(String),
    /// A template addressed as a resource of its own is not built.
    #[error("{0}")]
    NoSuchTemplate(String),
    /// The caller may not do this (an admin's operation).
    #[error("{0}")]
    Forbidden(String),
    #[error("sandbox {id} has no process {handle}")]
    NoSuchProcess { id: SandboxId, handle: u64 },
    #[error("sandbox {id} is {state:?}, not ready")]
    NotReady { id: SandboxId, state: SandboxState },
    #[error("command `{argv0}` could not be started in sandbox {id}: {reason}")]
    ExecFailed {
        id: SandboxId,
        argv0: String,
        reason: String,
    },
    #[error(transparent)]
    Files(#[from] crate::files::FilesError),
    #[error("host limit reached: {0}")]
    Exhausted(String),
    /// A tenant's quota or the daemon's cap on live sandboxes.
    #[error(transparent)]
    Quota(#[from] crate::engine::QuotaError),
    #[error(transparent)]
    Tenancy(#[from] crate::tenancy::TenancyError),
    #[error(transparent)]
    Gateway(#[from] crate::gateway::GatewayError),
    #[error(transparent)]
    Lifecycle(#[from] crate::engine::LifecycleError),
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// A service the request needs is not running on this daemon.
    #[error("{0}")]
    Unavailable(String),
    /// The sandbox's state does not allow the change.
    #[error("{0}")]
    Conflict(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Store(#[from] mayfly_store::StoreError),
}

impl EngineError {
    pub fn code(&self) -> ErrorCode {
        match self {
            EngineError::Invalid(_) => ErrorCode::InvalidArgument,
            EngineError::Forbidden(_) => ErrorCode::PermissionDenied,
            EngineError::NoSuchSandbox(_)
            | EngineError::NoSuchPool(_)
            | EngineError::NoSuchTemplate(_)
            | EngineError::NoSuchProcess { .. }
            | EngineError::NoSuchArtifact { .. } => ErrorCode::NotFound,
            EngineError::NotReady { .. } | EngineError::Conflict(_) => ErrorCode::Conflict,
            EngineError::Unavailable(_) => ErrorCode::Unavailable,
            EngineError::ExecFailed { .. } => ErrorCode::ExecFailed,
            EngineError::Files(e) => e.code(),
            EngineError::Quota(q) if !q.can_pass() => ErrorCode::PermissionDenied,
            EngineError::Exhausted(_) | EngineError::Quota(_) => ErrorCode::ResourceExhausted,
            EngineError::Tenancy(e) => e.code(),
            EngineError::Gateway(e) => e.code(),
            EngineError::Lifecycle(e) => e.code(),
            EngineError::ShuttingDown => ErrorCode::Unavailable,
            EngineError::Internal(_) | EngineError::Store(_) => ErrorCode::Internal,
        }
    }

    /// How long a refused caller should wait before trying again (an HTTP
    /// front end sends it as `Retry-After`), for errors that pass.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            EngineError::Quota(q) => q.can_pass().then(|| q.retry_after_secs()),
            // The uid ranges free up as sandboxes end.
            EngineError::Exhausted(_) => Some(crate::engine::FREED_RETRY_SECS),
            _ => None,
        }
    }

    /// The `{code, message}` body a front end shows for this error.
    pub fn to_api(&self) -> mayfly_types::ApiError {
        let code = self.code();
        let message = if code == ErrorCode::Internal {
            "internal error; see the daemon's log".to_owned()
        } else {
            self.to_string()
        };
        mayfly_types::ApiError::new(code, message)
    }
}
