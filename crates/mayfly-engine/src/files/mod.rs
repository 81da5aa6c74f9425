//! The file API: every path resolved inside the sandbox root. (stub: being written)

use mayfly_types::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("path `{path}` is invalid: {reason}")]
    InvalidPath { path: String, reason: &'static str },
}

impl FilesError {
    pub fn code(&self) -> ErrorCode {
        match self {
            FilesError::InvalidPath { .. } => ErrorCode::InvalidArgument,
        }
    }
}
