//! What a file API call can fail with, and the code each failure maps to.

use mayfly_sys::fs::FsError;
use mayfly_types::ErrorCode;

/// A failed file API call. Paths are inside-sandbox paths as normalised by
/// the API (`/workspace/x`), never host paths.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("path `{path}` is invalid: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    #[error("`{path}` does not exist")]
    NotFound { path: String },
    #[error("`{path}` already exists")]
    AlreadyExists { path: String },
    #[error("`{path}` is a directory")]
    IsADirectory { path: String },
    #[error("`{path}`, or one of its parents, is not a directory")]
    NotADirectory { path: String },
    #[error("`{path}` is not a regular file")]
    NotRegularFile { path: String },
    #[error("directory `{path}` is not empty")]
    NotEmpty { path: String },
    #[error("`{path}` is or contains a mount point, which the file API does not cross")]
    MountPoint { path: String },
    #[error("`{path}` is busy")]
    Busy { path: String },
    #[error("`{path}` cannot be used: {reason}")]
    Forbidden { path: String, reason: &'static str },
    #[error("`{path}` is on a {fs} filesystem, which the file API never touches")]
    ForbiddenFilesystem { path: String, fs: &'static str },
    #[error("`{path}` is on a read-only filesystem")]
    ReadOnly { path: String },
    #[error("`{path}` is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("`{path}` holds more than {limit} entries")]
    TooManyEntries { path: String, limit: u64 },
    #[error("`{path}` nests directories deeper than {limit} levels")]
    TooDeep { path: String, limit: usize },
    #[error("the sandbox has no space left for `{path}`")]
    NoSpace { path: String },
    #[error("uid {uid} is outside the sandbox's id range")]
    BadOwner { uid: u32 },
    #[error("mode {mode:#o} is not a permission (at most 0o7777)")]
    BadMode { mode: u32 },
    #[error("the kernel rejected the operation on `{path}` as invalid")]
    Rejected { path: String },
    #[error("archive entry `{entry}` is rejected: {reason}")]
    BadTarEntry { entry: String, reason: &'static str },
    #[error("the archive is malformed")]
    BadArchive {
        #[source]
        source: std::io::Error,
    },
    #[error("the archive holds more than {limit} bytes of data")]
    ArchiveTooLarge { limit: u64 },
    #[error("the archive holds more than {limit} entries")]
    ArchiveTooManyEntries { limit: u64 },
    #[error("the root directory `/` cannot be {op}")]
    RootRefused { op: &'static str },
    #[error("a file operation on `{path}` failed")]
    Io {
        path: String,
        #[source]
        source: FsError,
    },
    #[error("reading or writing the data of `{path}` failed")]
    Data {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FilesError {
    pub fn code(&self) -> ErrorCode {
        use FilesError::*;
        match self {
            InvalidPath { .. }
            | IsADirectory { .. }
            | NotADirectory { .. }
            | NotRegularFile { .. }
            | BadOwner { .. }
            | BadMode { .. }
            | Rejected { .. }
            | BadTarEntry { .. }
            | BadArchive { .. } => ErrorCode::InvalidArgument,
            NotFound { .. } => ErrorCode::NotFound,
            AlreadyExists { .. } | NotEmpty { .. } | MountPoint { .. } | Busy { .. } => {
                ErrorCode::Conflict
            }
            Forbidden { .. }
            | ForbiddenFilesystem { .. }
            | ReadOnly { .. }
            | RootRefused { .. } => ErrorCode::PermissionDenied,
            TooLarge { .. }
            | TooManyEntries { .. }
            | TooDeep { .. }
            | ArchiveTooLarge { .. }
            | ArchiveTooManyEntries { .. } => ErrorCode::TooLarge,
            NoSpace { .. } => ErrorCode::ResourceExhausted,
            Io { .. } | Data { .. } => ErrorCode::Internal,
        }
    }

    /// Classifies a syscall failure on the object the caller calls `path`.
    pub(crate) fn fs(path: impl ToString, e: FsError) -> FilesError {
        let path = path.to_string();
        match e {
            FsError::NotFound { .. } => FilesError::NotFound { path },
            FsError::AlreadyExists { .. } => FilesError::AlreadyExists { path },
            FsError::NotADirectory { .. } => FilesError::NotADirectory { path },
            FsError::IsADirectory { .. } => FilesError::IsADirectory { path },
            FsError::NotEmpty { .. } => FilesError::NotEmpty { path },
            FsError::NotRegular { .. } => FilesError::NotRegularFile { path },
            FsError::SymlinkRefused { .. } => FilesError::Forbidden {
                path,
                reason: "it goes through a magic link, a symlink loop, or a symlink \
                         that is not followed here",
            },
            FsError::PermissionDenied { .. } => FilesError::Forbidden {
                path,
                reason: "the kernel denied access",
            },
            FsError::ForbiddenFilesystem { fs, .. } => FilesError::ForbiddenFilesystem { path, fs },
            FsError::CrossesMount { .. } => FilesError::MountPoint { path },
            FsError::ReadOnly { .. } => FilesError::ReadOnly { path },
            FsError::NameTooLong { .. } => FilesError::InvalidPath {
                path,
                reason: "a name is too long",
            },
            FsError::NoSpace { .. } => FilesError::NoSpace { path },
            FsError::Busy { .. } => FilesError::Busy { path },
            FsError::Invalid { .. } => FilesError::Rejected { path },
            // A create still refused under `CreateAs` is a bug of ours.
            source @ (FsError::Os { .. } | FsError::UnmappedCreator { .. }) => {
                FilesError::Io { path, source }
            }
        }
    }

    /// Classifies an I/O error while moving file data.
    pub(crate) fn data(path: impl ToString, e: std::io::Error) -> FilesError {
        let path = path.to_string();
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FilesError::NoSpace { path },
            _ => FilesError::Data { path, source: e },
        }
    }
}
