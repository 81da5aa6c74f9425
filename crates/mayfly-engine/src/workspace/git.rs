//! Running git on the host: the object cache and the checkout.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use mayfly_types::GitWorkspace;
use sha2::{Digest as _, Sha256};

use crate::artifacts::store::hex;

/// How long one git command may run (a fetch of a large repository).
pub(super) const GIT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a create waits for another create's fetch of the same repo.
const LOCK_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The repository or ref does not exist or cannot be fetched: the
    /// caller's mistake.
    #[error("git {op} failed: {detail}")]
    Git { op: &'static str, detail: String },
    #[error("git {op} did not finish within {secs} s")]
    Timeout { op: &'static str, secs: u64 },
    #[error("preparing the git workspace at {path} failed")]
    Host {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for the git cache lock of {path} timed out")]
    Locked { path: PathBuf },
    /// The tree to check out is past a workspace's caps.
    #[error("its tree holds {what}, more than a workspace may hold")]
    TooLarge { what: String },
}

impl WorkspaceError {
    /// True when the create's request is at fault (a 4xx).
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            WorkspaceError::Git { .. } | WorkspaceError::TooLarge { .. }
        )
    }
}

fn host(path: &Path) -> impl FnOnce(std::io::Error) -> WorkspaceError + '_ {
    move |source| WorkspaceError::Host {
        path: path.to_path_buf(),
        source,
    }
}

/// A `git` command that reads no configuration but ours: no system or
/// global config, no hooks, no terminal prompts, and only the plain
/// transports (`ext::` and `fd::` are refused by `GIT_ALLOW_PROTOCOL`).
pub fn git() -> tokio::process::Command {
    let mut c = tokio::process::Command::new("git");
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", "file:http:https:git:ssh")
        .env("LC_ALL", "C")
        .args(["-c", "core.hooksPath=/dev/null"])
        .args(["-c", "protocol.file.allow=always"])
        .args(["-c", "core.fsmonitor=false"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

/// Runs `cmd` with the timeout; its stdout on success.
async fn run(op: &'static str, mut cmd: tokio::process::Command) -> Result<String, WorkspaceError> {
    let out = tokio::time::timeout(GIT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| WorkspaceError::Timeout {
            op,
            secs: GIT_TIMEOUT.as_secs(),
        })?
        .map_err(host(Path::new("git")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let detail: String = err.trim().chars().take(400).collect();
        return Err(WorkspaceError::Git { op, detail });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The local object cache: one bare mirror per repository.
#[derive(Debug, Clone)]
pub struct GitCache {
    pub dir: PathBuf,
}

/// A checkout made on the host, ready to stream into a sandbox.
#[derive(Debug)]
pub struct Checkout {
    /// Holds the working tree; removed when dropped.
    pub tmp: tempfile::TempDir,
    pub start_commit: String,
    pub branch: Option<String>,
    pub fetch_ms: f64,
    pub clone_ms: f64,
}

impl Checkout {
    pub fn tree(&self) -> PathBuf {
        self.tmp.path().join("ws")
    }

    /// The working tree as a tar, entries owned by root (the upload gives
    /// everything to the sandbox's root anyway), symlinks kept as symlinks.
    pub fn tar(&self) -> Result<Vec<u8>, WorkspaceError> {
        let tree = self.tree();
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        // The upload refuses sparse entries; a checkout has holes only by chance.
        b.sparse(false);
        b.mode(tar::HeaderMode::Deterministic);
        b.append_dir_all(".", &tree).map_err(host(&tree))?;
        b.into_inner().map_err(host(&tree))
    }
}

impl GitCache {
    /// `<dir>/<sha256 of repo>.git`.
    pub fn mirror_of(&self, repo: &str) -> PathBuf {
        let h = Sha256::digest(repo.as_bytes());
        self.dir.join(format!("{}.git", hex(&h)))
    }

    /// Takes the repository's lock, polling (a `flock` per repository, so
    /// two creates of one repository fetch one after the other and every
    /// Mayfly instance on the host agrees).
    async fn lock(&self, mirror: &Path) -> Result<std::fs::File, WorkspaceError> {
        let path = mirror.with_extension("lock");
        let t0 = Instant::now();
        loop {
            match mayfly_sys::process::try_lock_file(&path) {
                Ok(Some(f)) => return Ok(f),
                Ok(None) if t0.elapsed() < LOCK_TIMEOUT => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Ok(None) => return Err(WorkspaceError::Locked { path }),
                Err(e) => {
                    return Err(WorkspaceError::Host {
                        path,
                        source: std::io::Error::other(e.to_string()),
                    })
                }
            }
        }
    }

    /// Brings the mirror of `repo` up to date: made with `clone --mirror`
    /// into a temporary name and renamed the first time, fetched after.
    async fn update(&self, repo: &str, mirror: &Path) -> Result<(), WorkspaceError> {
        if mirror.join("HEAD").exists() {
            let mut c = git();
            c.arg("-C")
                .arg(mirror)
                .args(["fetch", "--prune", "--quiet", "origin"]);
            return run("fetch", c).await.map(drop);
        }
        let tmp = mirror.with_extension(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let mut c = git();
        c.args(["clone", "--mirror", "--quiet", "--"])
            .arg(repo)
            .arg(&tmp);
        if let Err(e) = run("clone", c).await {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, mirror).map_err(host(mirror))
    }

    /// Fetches `ws.repo` into the cache and checks `ws.git_ref` (or the
    /// remote's HEAD) out into a fresh host directory under `tmp_root`, on
    /// the task branch when one is named (else detached).
    pub async fn checkout(
        &self,
        ws: &GitWorkspace,
        tmp_root: &Path,
    ) -> Result<Checkout, WorkspaceError> {
        std::fs::create_dir_all(&self.dir).map_err(host(&self.dir))?;
        let mirror = self.mirror_of(&ws.repo);
        let t0 = Instant::now();
        let lock = self.lock(&mirror).await?;
        self.update(&ws.repo, &mirror).await?;
        let fetch_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let rev = format!("{}^{{commit}}", ws.git_ref.as_deref().unwrap_or("HEAD"));
        let mut c = git();
        c.arg("-C")
            .arg(&mirror)
            .args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
            .arg(&rev);
        let start_commit = run("rev-parse", c).await.map_err(|_| WorkspaceError::Git {
            op: "rev-parse",
            detail: format!(
                "ref `{}` does not name a commit of the repository",
                ws.git_ref.as_deref().unwrap_or("HEAD")
            ),
        })?;
        let caps = crate::files::FsLimits::default();
        super::size::check(
            &mirror,
            &start_commit,
            caps.max_archive_bytes,
            caps.max_entries,
        )
        .await?;
        std::fs::create_dir_all(tmp_root).map_err(host(tmp_root))?;
        let tmp = tempfile::Builder::new()
            .prefix("ws-")
            .tempdir_in(tmp_root)
            .map_err(host(tmp_root))?;
        let tree = tmp.path().join("ws");
        let t1 = Instant::now();
        // A local clone hardlinks the mirror's objects: no network, and a
        // repository that stands alone once copied into the sandbox.
        let mut c = git();
        c.args(["clone", "--no-checkout", "--quiet", "--"])
            .arg(&mirror)
            .arg(&tree);
        run("clone", c).await?;
        drop(lock);
        let mut c = git();
        c.arg("-C")
            .arg(&tree)
            .args(["remote", "set-url", "origin", "--"])
            .arg(&ws.repo);
        run("remote", c).await?;
        let mut c = git();
        c.arg("-C").arg(&tree).args(["checkout", "--quiet"]);
        match &ws.branch {
            Some(b) => c.arg("-b").arg(b).arg(&start_commit),
            None => c.arg("--detach").arg(&start_commit),
        };
        run("checkout", c).await?;
        Ok(Checkout {
            tmp,
            start_commit,
            branch: ws.branch.clone(),
            fetch_ms,
            clone_ms: t1.elapsed().as_secs_f64() * 1000.0,
        })
    }
}
