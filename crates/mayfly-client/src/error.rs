//! What a client call can fail with.

use mayfly_types::{ApiError, ErrorCode};

/// A boxed lower-level cause (an I/O or HTTP error).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a call to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon answered with an error: its `{code, message}` and status.
    #[error("{}", error.message)]
    Api { status: u16, error: ApiError },
    /// The daemon could not be reached at all.
    #[error("cannot connect to the Mayfly daemon at {target}")]
    Connect {
        target: String,
        #[source]
        source: BoxError,
    },
    /// The connection failed while a request was under way.
    #[error("{request} failed before the daemon finished answering")]
    Transport {
        request: String,
        #[source]
        source: BoxError,
    },
    /// The daemon's answer is not what the API promises (a bad body).
    #[error("the daemon's answer to {request} is malformed: {reason}")]
    Protocol { request: String, reason: String },
    /// A TCP base URL that cannot be used.
    #[error("`{url}` is not a usable daemon URL: {reason}")]
    InvalidUrl { url: String, reason: String },
}

impl ClientError {
    /// The API error class, when the daemon answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { error, .. } => Some(error.code),
            _ => None,
        }
    }

    /// Whether the daemon said the sandbox, process or file does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(ErrorCode::NotFound)
    }

    /// The innermost I/O error in a hyper error chain makes the best source:
    /// "cannot connect …: No such file or directory" rather than
    /// "… client error (Connect)".
    pub(crate) fn root_cause(e: hyper_util::client::legacy::Error) -> BoxError {
        let mut cur: &(dyn std::error::Error + 'static) = &e;
        while let Some(next) = cur.source() {
            if let Some(io) = next.downcast_ref::<std::io::Error>() {
                return Box::new(std::io::Error::new(io.kind(), io.to_string()));
            }
            cur = next;
        }
        Box::new(e)
    }
}
