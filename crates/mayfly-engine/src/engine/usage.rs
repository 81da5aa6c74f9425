//! Usage: what a live sandbox uses now, from its cgroups (CPU, memory,
//! pids, OOM kills) and its upper layers on disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mayfly_sys::du::{disk_usage, WalkLimits};
use mayfly_types::{DiskUsage, SandboxUsage};

use super::sandbox::Sandbox;
use super::{now_ms, Engine};
use crate::EngineError;

/// Disk walks that run at once, daemon-wide.
static WALKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

impl Engine {
    /// What `sb` uses now. Looking is not using: the caller finds `sb`
    /// without touching it, so a dashboard polling usage does not keep a
    /// sandbox from its idle timeout.
    pub(crate) async fn usage_of(&self, sb: &Arc<Sandbox>) -> Result<SandboxUsage, EngineError> {
        let id = &sb.id;
        let limits = self.info(id)?.limits;
        let cg = mayfly_sys::cgroup::read_usage(&sb.cgroup).map_err(|e| {
            // A destroy that began meanwhile removes the cgroups: a 409,
            // as for any request to a stopping sandbox.
            if sb.is_stopping() || sb.is_destroying() {
                EngineError::NotReady {
                    id: id.clone(),
                    state: mayfly_types::SandboxState::Stopping,
                }
            } else {
                EngineError::Internal(format!("reading the usage of {id}: {e}"))
            }
        })?;
        let dir = sb.dir.clone();
        // A walk may take its whole second and its entry budget's memory:
        // many usage requests at once wait their turn, not a thread each.
        let _turn = WALKS.acquire().await;
        let disk = tokio::task::spawn_blocking(move || uppers_usage(&dir, &WalkLimits::default()))
            .await
            .map_err(|e| EngineError::Internal(format!("measuring the disk of {id}: {e}")))?;
        Ok(SandboxUsage {
            id: id.clone(),
            at: now_ms(),
            cpu_seconds: cg.cpu_usec.map(|us| us as f64 / 1e6),
            memory_bytes: cg.memory_bytes,
            memory_peak_bytes: cg.memory_peak_bytes,
            memory_limit_bytes: limits.memory_bytes,
            pids: cg.pids,
            oom_kills: cg.oom_kills,
            disk,
        })
    }
}

/// The disk used by `<dir>/upper*`, the sandbox's writable layers. `dir`
/// itself is the daemon's (the sandbox cannot write in it); everything
/// below an upper is the sandbox's, and walked as hostile.
pub(crate) fn uppers_usage(dir: &Path, limits: &WalkLimits) -> DiskUsage {
    let mut uppers: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_name().as_encoded_bytes().starts_with(b"upper"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    uppers.sort();
    let mut total = DiskUsage::default();
    for upper in uppers {
        match disk_usage(&upper, limits) {
            Ok(u) => {
                total.bytes += u.bytes;
                total.entries += u.entries;
                total.truncated |= u.truncated;
            }
            Err(e) => tracing::debug!(upper = %upper.display(), error = %e, "not measured"),
        }
    }
    total
}
