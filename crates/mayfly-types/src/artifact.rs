//! Artifacts: files and directories a sandbox leaves behind, collected
//! before teardown into a store outside the sandbox.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How one declared artifact ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactStatus {
    /// Collected whole: `size` bytes with `sha256`.
    Complete,
    /// Not collected; `reason` says why (missing, a symlink, over a cap…).
    Skipped,
}

/// One artifact of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactInfo {
    /// The name to download it by: the declared path's last component
    /// (`.tar` appended for a directory), made unique; `patch.diff` for a
    /// git workspace's patch.
    pub name: String,
    /// The declared path inside the sandbox (`/workspace` for the patch).
    pub path: String,
    /// `file`, `dir` (stored as a tar archive) or `patch`.
    pub kind: String,
    pub status: ArtifactStatus,
    /// Bytes stored (0 when skipped).
    pub size: u64,
    /// Lowercase hex SHA-256 of the stored bytes (empty when skipped).
    pub sha256: String,
    /// Unix ms.
    pub collected_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a git workspace ended as, recorded with the patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceResult {
    /// The commit the workspace was checked out at.
    pub start_commit: String,
    /// The task branch, when one was asked for.
    #[serde(default)]
    pub branch: Option<String>,
    /// HEAD at collection (empty if it could not be read).
    pub head: String,
}

/// `GET /v1/sandboxes/{id}/artifacts`: the manifest of a sandbox's artifacts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactList {
    #[schema(value_type = String)]
    pub sandbox: crate::SandboxId,
    pub tenant: Option<String>,
    /// Unix ms when the collection finished.
    pub collected_at: u64,
    pub artifacts: Vec<ArtifactInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceResult>,
}
