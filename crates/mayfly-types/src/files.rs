//! The file API's types.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The largest single file read or written through the API (1 GiB).
pub const MAX_FILE_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// What `stat` and `list` report; ids are as seen inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileStat {
    /// The entry's name (for `list`) or the path asked for (for `stat`).
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ms: i64,
    /// The link target, for symlinks. It is never followed by the daemon.
    pub link_target: Option<String>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
    #[serde(default)]
    pub parents: bool,
    pub mode: Option<u32>,
}

/// `POST /v1/sandboxes/{id}/files/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub from: String,
    pub to: String,
}

/// The result of a tar upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UploadSummary {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
}
