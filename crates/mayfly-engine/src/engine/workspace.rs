//! The end of a create: the sandbox's artifact list and its git workspace.

use std::sync::Arc;
use std::time::Instant;

use mayfly_types::{GitWorkspace, SandboxInfo};

use super::artifacts::WorkspaceStart;
use super::sandbox::Sandbox;
use super::Engine;
use crate::api::Caller;
use crate::workspace::{GitCache, WorkspaceError};
use crate::EngineError;

impl Engine {
    /// Gives a booted (or claimed) sandbox its artifact list and, when asked
    /// for, its git workspace. A workspace that cannot be made destroys the
    /// sandbox, whole, before the create fails: nothing is left behind.
    pub(crate) async fn finish_create(
        &self,
        info: SandboxInfo,
        artifacts: Vec<String>,
        workspace: Option<GitWorkspace>,
        caller: &Caller,
    ) -> Result<SandboxInfo, EngineError> {
        if artifacts.is_empty() && workspace.is_none() {
            return Ok(info);
        }
        let sb = self.lookup(&info.id)?;
        sb.artifacts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(artifacts);
        let Some(ws) = workspace else {
            return Ok(info);
        };
        match self.checkout_workspace(&sb, &ws).await {
            Ok(start) => {
                *sb.workspace.lock().unwrap_or_else(|p| p.into_inner()) = Some(start);
                Ok(info)
            }
            Err(e) => {
                tracing::debug!(id = %info.id, caller = %caller.name, error = %e, "the workspace failed");
                // Nothing to collect from a sandbox that never started.
                *sb.collected.lock().await = true;
                let _ = self.destroy_sandbox(sb, "workspace_failed").await;
                Err(e)
            }
        }
    }

    /// Fetches the repository into the cache, checks it out on the host and
    /// streams the tree into `/workspace` through the file API's upload.
    async fn checkout_workspace(
        &self,
        sb: &Arc<Sandbox>,
        ws: &GitWorkspace,
    ) -> Result<WorkspaceStart, EngineError> {
        let t0 = Instant::now();
        let cache = GitCache {
            dir: self.inner.cfg.git_cache_dir(),
        };
        let tmp_root = cache.dir.join("tmp");
        let co = cache.checkout(ws, &tmp_root).await.map_err(|e| match e {
            e @ (WorkspaceError::Git { .. } | WorkspaceError::TooLarge { .. }) => {
                EngineError::Invalid(format!(
                    "the workspace repository `{}` could not be checked out: {e}",
                    ws.repo.chars().take(256).collect::<String>()
                ))
            }
            e => EngineError::Internal(e.to_string()),
        })?;
        let fs = Self::fs_of(sb)?;
        let (start, branch) = (co.start_commit.clone(), co.branch.clone());
        let (fetch_ms, clone_ms) = (co.fetch_ms, co.clone_ms);
        let summary = tokio::task::spawn_blocking(move || {
            let tar = co.tar().map_err(|e| EngineError::Internal(e.to_string()))?;
            fs.upload_tar("/workspace", &tar).map_err(EngineError::from)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("the workspace upload panicked: {e}")))??;
        tracing::debug!(
            id = %sb.id, fetch_ms, clone_ms, files = summary.files,
            total = ?t0.elapsed(), "workspace checked out"
        );
        Ok(WorkspaceStart {
            commit: start,
            branch,
        })
    }
}
