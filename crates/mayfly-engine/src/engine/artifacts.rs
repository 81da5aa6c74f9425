//! Artifact collection in the destroy path, while the sandbox still runs,
//! and reading collected artifacts back (after the sandbox is gone too).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mayfly_types::{ArtifactInfo, ArtifactList, ExecRequest, SandboxId, WorkspaceResult};

use super::exec::Sink;
use super::sandbox::Sandbox;
use super::{now_ms, Engine};
use crate::api::Caller;
use crate::artifacts::collect::Collector;
use crate::artifacts::{plan_retention, ArtifactError, ArtifactStore};
use crate::EngineError;

/// How long the in-sandbox git commands of the patch may take.
const PATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the patch is written inside the sandbox before it is collected.
const PATCH_TMP: &str = "/tmp/.mayfly-patch.diff";

/// Where a sandbox's git workspace started.
#[derive(Debug, Clone)]
pub(crate) struct WorkspaceStart {
    pub commit: String,
    pub branch: Option<String>,
}

impl From<ArtifactError> for EngineError {
    fn from(e: ArtifactError) -> Self {
        EngineError::Internal(e.to_string())
    }
}

impl Engine {
    pub(crate) fn artifact_store(&self) -> ArtifactStore {
        ArtifactStore::new(self.inner.cfg.artifacts_dir())
    }

    /// Collects the sandbox's declared artifacts (and its workspace's
    /// patch) into the store. Called by destroy before the sandbox is
    /// stopped; runs once per sandbox (a concurrent destroy waits for it).
    /// Failures are logged, never fatal to the destroy.
    pub(crate) async fn collect_artifacts(&self, sb: &Arc<Sandbox>) {
        let mut done = sb.collected.lock().await;
        if *done {
            return;
        }
        *done = true;
        // A pool's unclaimed sandbox ran nothing; a dead one cannot be read.
        if sb.is_pooled() || sb.conn.is_closed() {
            return;
        }
        let paths = sb
            .artifacts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let ws = sb
            .workspace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let ws = ws.or_else(|| {
            // A workspace the sandbox made itself counts too.
            let fs = Self::fs_of(sb).ok()?;
            fs.stat("/workspace/.git").ok().map(|_| WorkspaceStart {
                commit: String::new(),
                branch: None,
            })
        });
        if paths.is_empty() && ws.is_none() {
            return;
        }
        let t0 = Instant::now();
        let result = match &ws {
            Some(start) => Some(self.make_patch(sb, start).await),
            None => None,
        };
        let r = self.store_artifacts(sb, paths, result).await;
        match r {
            Ok(n) => {
                tracing::debug!(id = %sb.id, artifacts = n, took = ?t0.elapsed(), "artifacts collected")
            }
            Err(e) => tracing::error!(id = %sb.id, error = %e, "collecting artifacts failed"),
        }
        self.enforce_retention().await;
    }

    /// Runs git inside the sandbox, as its root, to write the patch of
    /// everything changed since the start (untracked files included) to
    /// [`PATCH_TMP`]; returns what the workspace ended as.
    async fn make_patch(&self, sb: &Arc<Sandbox>, start: &WorkspaceStart) -> WorkspaceResult {
        let git = |args: &[&str]| {
            let mut argv: Vec<String> =
                ["git", "-c", "core.hooksPath=/dev/null", "-C", "/workspace"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
            argv.extend(args.iter().map(|s| s.to_string()));
            argv
        };
        let base = if start.commit.is_empty() {
            // A repository made in the sandbox: against its own first commit
            // is unknowable, so against HEAD.
            "HEAD".to_owned()
        } else {
            start.commit.clone()
        };
        let _ = self.quiet_exec(sb, git(&["add", "-A"])).await;
        let _ = self
            .quiet_exec(
                sb,
                git(&[
                    "diff",
                    "--cached",
                    "--binary",
                    "--no-color",
                    "--no-ext-diff",
                    &format!("--output={PATCH_TMP}"),
                    &base,
                    "--",
                ]),
            )
            .await;
        let head = self
            .quiet_exec(sb, git(&["rev-parse", "HEAD"]))
            .await
            .unwrap_or_default();
        WorkspaceResult {
            start_commit: start.commit.clone(),
            branch: start.branch.clone(),
            head,
        }
    }

    /// One command for the engine's own use: its trimmed stdout when it
    /// exits 0.
    async fn quiet_exec(&self, sb: &Arc<Sandbox>, argv: Vec<String>) -> Option<String> {
        let req = ExecRequest {
            argv,
            timeout_ms: Some(PATCH_TIMEOUT.as_millis() as u64),
            output_limit: Some(64 * 1024),
            ..Default::default()
        };
        let fut = self
            .run_exec(sb, req, Sink::Buffer, &Caller::new("artifacts"))
            .await
            .ok()?;
        let r = fut.await;
        (r.status.exit_code == Some(0))
            .then(|| String::from_utf8_lossy(&r.stdout.0).trim().to_owned())
    }

    async fn store_artifacts(
        &self,
        sb: &Arc<Sandbox>,
        paths: Vec<String>,
        workspace: Option<WorkspaceResult>,
    ) -> Result<usize, EngineError> {
        let fs = Self::fs_of(sb)?;
        let store = self.artifact_store();
        let caps = self.inner.cfg.artifact_caps;
        let id = sb.id.clone();
        let tenant = sb.tenant.read().unwrap_or_else(|p| p.into_inner()).clone();
        tokio::task::spawn_blocking(move || {
            store.begin(&id)?;
            let now = now_ms();
            let mut c = Collector {
                fs: &fs,
                store: &store,
                id: &id,
                caps,
                now_ms: now,
                used: 0,
                taken: BTreeSet::new(),
            };
            let mut artifacts: Vec<ArtifactInfo> = Vec::new();
            if workspace.is_some() {
                artifacts.push(c.collect(PATCH_TMP, Some("patch.diff"), "/workspace", true)?);
                let _ = fs.remove(PATCH_TMP, false);
            }
            for p in &paths {
                artifacts.push(c.collect(p, None, p, false)?);
            }
            let n = artifacts.len();
            store.finish(&ArtifactList {
                sandbox: id,
                tenant,
                collected_at: now_ms(),
                artifacts,
                workspace,
            })?;
            Ok::<_, EngineError>(n)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("artifact collection panicked: {e}")))?
    }

    /// Removes what the retention policy says should go. Runs at start,
    /// periodically and after each collection.
    pub(crate) async fn enforce_retention(&self) {
        let store = self.artifact_store();
        let policy = self.inner.cfg.artifact_retention;
        let _ = tokio::task::spawn_blocking(move || enforce_retention(&store, policy)).await;
    }

    /// A sandbox's artifact manifest, live or destroyed.
    pub(crate) async fn list_artifacts(&self, id: &SandboxId) -> Result<ArtifactList, EngineError> {
        // A sandbox that never existed is a 404 like any other.
        let info = self.info(id)?;
        let store = self.artifact_store();
        let id2 = id.clone();
        let m = tokio::task::spawn_blocking(move || store.manifest(&id2))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        Ok(m.unwrap_or(ArtifactList {
            sandbox: id.clone(),
            tenant: info.tenant,
            collected_at: 0,
            artifacts: Vec::new(),
            workspace: None,
        }))
    }

    /// One complete artifact, opened for reading.
    pub(crate) async fn open_artifact(
        &self,
        id: &SandboxId,
        name: &str,
    ) -> Result<(ArtifactInfo, std::fs::File), EngineError> {
        let list = self.list_artifacts(id).await?;
        let info = list
            .artifacts
            .into_iter()
            .find(|a| a.name == name && a.status == mayfly_types::ArtifactStatus::Complete)
            .ok_or_else(|| EngineError::NoSuchArtifact {
                id: id.clone(),
                name: name.chars().take(128).collect(),
            })?;
        let store = self.artifact_store();
        let id2 = id.clone();
        let info2 = info.clone();
        let file = tokio::task::spawn_blocking(move || store.open(&id2, &info2))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|_| EngineError::NoSuchArtifact {
                id: id.clone(),
                name: info.name.clone(),
            })?;
        Ok((info, file))
    }
}

/// The daemon's start: temporary leftovers of interrupted collections and
/// checkouts go, then whatever retention says should.
pub(crate) fn start_sweep(cfg: &super::EngineConfig) {
    use std::os::unix::fs::PermissionsExt;
    let store = ArtifactStore::new(cfg.artifacts_dir());
    match store.sweep() {
        Ok(0) => {}
        Ok(n) => tracing::info!(removed = n, "swept interrupted artifact collections"),
        Err(e) => tracing::warn!(error = %e, "sweeping the artifact store failed"),
    }
    // Only the daemon reads the artifacts (and the git cache).
    for d in [cfg.artifacts_dir(), cfg.git_cache_dir()] {
        let _ = std::fs::create_dir_all(&d);
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700));
    }
    let _ = std::fs::remove_dir_all(cfg.git_cache_dir().join("tmp"));
    enforce_retention(&store, cfg.artifact_retention);
}

/// The blocking half of retention.
pub(crate) fn enforce_retention(store: &ArtifactStore, policy: crate::artifacts::Retention) {
    let sets = match store.stored_sets() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "reading the artifact store failed");
            return;
        }
    };
    for id in plan_retention(&sets, policy, now_ms()) {
        match store.remove(&id) {
            Ok(()) => tracing::debug!(%id, "artifacts removed by retention"),
            Err(e) => tracing::warn!(%id, error = %e, "removing artifacts failed"),
        }
    }
}
