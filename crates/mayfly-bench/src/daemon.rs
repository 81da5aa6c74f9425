//! A private Mayfly daemon for the API measures: its own socket and state
//! directory under a scratch directory, stopped (and its sandboxes with it)
//! when the bench is done, even on error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mayfly_client::Client;

/// A scratch directory removed on drop.
#[derive(Debug)]
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> anyhow::Result<Scratch> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("mayfly-bench-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running `mayfly serve`.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub client: Client,
    log: PathBuf,
}

impl Daemon {
    /// Starts `mayfly --socket S --state-dir D serve` in `dir` and waits until
    /// it answers `/healthz`.
    pub async fn start(mayfly: &Path, dir: &Path, max_sandboxes: u32) -> anyhow::Result<Daemon> {
        Self::start_with(mayfly, dir, max_sandboxes, &[]).await
    }

    /// As [`Daemon::start`], with more `serve` arguments.
    pub async fn start_with(
        mayfly: &Path,
        dir: &Path,
        max_sandboxes: u32,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let socket = dir.join("mayfly.sock");
        let state_dir = dir.join("state");
        let log = dir.join("daemon.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(mayfly)
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state_dir)
            // No pool at start: the cold measures must boot every sandbox;
            // the pool measures make their own through the API.
            .args([
                "serve",
                "--max-sandboxes",
                &max_sandboxes.to_string(),
                "--pool",
                "host=0",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {} serve", mayfly.display()))?;
        let mut d = Daemon {
            child: Some(child),
            client: Client::unix(&socket),
            socket,
            state_dir,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                d.child = None;
                bail!(
                    "the daemon exited with {status} before it was ready:\n{}",
                    d.log_tail()
                );
            }
            if d.client.health().await.unwrap_or(false) {
                return Ok(d);
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon did not answer /healthz within 30 s:\n{}",
                    d.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The last lines the daemon logged, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Asks the daemon to shut down (SIGTERM: it destroys what is still
    /// alive) and waits for it; SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        signal(child.id(), "TERM");
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    eprintln!(
                        "mayfly-bench: the daemon exited with {status}:\n{}",
                        self.log_tail()
                    );
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the daemon ignored SIGTERM for {grace:?} and was killed:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Only reached when a measure failed: still give the daemon the
        // chance to destroy its sandboxes before it is killed.
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "TERM");
            for _ in 0..300 {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends a signal by pid with kill(1): no `unsafe` needed in this crate.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stderr(Stdio::null())
        .status();
}
