//! The end-to-end harness: a real `mayfly serve` per test, on its own socket
//! and state directory, plus host-side probes (leaks, cgroups, processes).
//!
//! Every test starts its own [`Daemon`] and only ever looks at the ids it
//! created, so tests can run in parallel threads against one host.

// Each test binary uses a different part of the harness.
#![allow(dead_code, unused_imports)]

pub mod daemonless;
pub mod events;
pub mod history;
pub mod host;
pub mod keys;
pub mod parked;
pub mod tarball;
pub mod templates;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mayfly_client::Client;
use mayfly_types::{CreateRequest, ExecRequest, ExecResult, Limits, SandboxId, SandboxInfo};

pub use host::{assert_no_leaks, procs_in_sandbox, ProcInfo};

/// The `mayfly` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mayfly");

/// `mayflyd`, which `mayfly` hands the engine's commands to.
pub const DAEMON_BIN: &str = env!("CARGO_BIN_EXE_mayflyd");

/// Host uids from here up belong to Mayfly's sandboxes.
pub const SANDBOX_UID_START: u32 = 1 << 30;

/// Fails the test, loudly, unless it runs as root. These tests never skip.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "these end-to-end tests need root (CI runs them as root): they start the real \
         `mayfly serve`, which creates namespaces, cgroups and idmapped mounts; euid is {euid}. \
         Run them with `sudo -E cargo test -p mayfly --release -- --test-threads=2`."
    );
}

/// A port nobody listens on right now (bound, read, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding a free port")
}

/// A name no other test (or earlier run) uses: `<prefix>-<pid>-<nanos>-<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{nanos}-{n}", std::process::id())
}

/// A temporary directory under `/tmp` whose name contains `mayfly-test`,
/// traversable by others: a sandbox's init walks the state directory as the
/// sandbox's root, which is not root on the host.
pub fn test_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("mayfly-test-")
        .tempdir_in("/tmp")
        .expect("creating a temporary directory under /tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
        .expect("making the test directory traversable");
    dir
}

/// A running `mayfly serve`, stopped with SIGTERM and cleaned up on drop.
pub struct Daemon {
    pub client: Client,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// The daemon's host pid.
    pub pid: u32,
    extra_args: Vec<String>,
    child: Option<Child>,
    /// Killed with SIGKILL and not started again: what it left (sandboxes,
    /// stubs, cgroups) is only reclaimed by a start on its state directory.
    killed: bool,
    log: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Starts a daemon with default settings and waits until it answers.
    pub async fn start() -> Daemon {
        Self::start_with(&[]).await
    }

    /// Starts a daemon with extra `serve` arguments (e.g. `--max-ttl 1h`).
    pub async fn start_with(extra: &[&str]) -> Daemon {
        require_root();
        let dir = test_dir();
        let socket = dir.path().join("mayfly.sock");
        let state_dir = dir.path().join("state");
        let log = dir.path().join("daemon.log");
        let mut d = Daemon {
            client: Client::unix(&socket),
            socket,
            state_dir,
            pid: 0,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            killed: false,
            log,
            dir: Some(dir),
        };
        d.spawn().await;
        d
    }

    async fn spawn(&mut self) {
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "`mayfly serve` exited with {status} before answering; its log:\n{}",
                    self.log()
                );
            }
            if let Ok(true) = self.client.health().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "`mayfly serve` did not answer /healthz within 15 s; its log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts `mayfly serve` on this daemon's socket and state directory.
    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("opening the daemon log");
        let child = Command::new(BIN)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("serve")
            .args(&self.extra_args)
            .env("MAYFLY_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("duplicating the log fd"))
            .stderr(log)
            .spawn()
            .expect("spawning `mayfly serve`");
        self.pid = child.id();
        self.child = Some(child);
        self.killed = false;
        self.client = Client::unix(&self.socket);
    }

    /// After a SIGKILL the test did not follow with a restart (it failed
    /// first): starts the daemon once more, whose start-up recovery
    /// removes what the killed one left, and stops it, so that a failed
    /// test leaks nothing once its state directory is deleted. Recovery
    /// runs before the socket is bound, so an accepted connection means
    /// it is done.
    fn reclaim_after_kill9(&mut self) {
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && self.is_running() {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
    }

    /// Waits (up to 15 s) until pool `name` is in the state `ok` asks for,
    /// and returns it; fails with every pool and the daemon's log if not.
    pub async fn wait_pool(
        &self,
        name: &str,
        ok: impl Fn(&mayfly_types::PoolInfo) -> bool,
    ) -> mayfly_types::PoolInfo {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let pools = self.client.pools().await.expect("listing pools");
            if let Some(p) = pools.iter().find(|p| p.name == name && ok(p)) {
                return p.clone();
            }
            assert!(
                Instant::now() < deadline,
                "pool `{name}` did not reach the state waited for within 15 s: {pools:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the daemon has written to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the daemon with SIGKILL (no cleanup of its own) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("sending SIGKILL to the daemon");
            child.wait().expect("reaping the daemon");
            self.killed = true;
        }
    }

    /// Stops the daemon (SIGTERM) if it runs, and starts a new one on the
    /// same socket and state directory.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    /// Stops the daemon the way an operator does: SIGTERM, then waits up to
    /// 20 s (SIGKILL after that).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("mayfly serve ignored SIGTERM for 20 s; killing it");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Whether the daemon process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Asserts the daemon answers `/healthz` with `ok: true`.
    pub async fn assert_healthy(&mut self) {
        assert!(
            self.is_running(),
            "the daemon died; its log:\n{}",
            self.log()
        );
        let ok = self.client.health().await;
        assert!(
            matches!(ok, Ok(true)),
            "the daemon does not answer /healthz: {ok:?}; its log:\n{}",
            self.log()
        );
    }

    /// Creates a sandbox with default settings.
    pub async fn create(&self) -> SandboxInfo {
        self.create_with(&CreateRequest::default()).await
    }

    pub async fn create_with(&self, req: &CreateRequest) -> SandboxInfo {
        match self.client.create(req).await {
            Ok(info) => info,
            Err(e) => panic!("create {req:?} failed: {e:?}; daemon log:\n{}", self.log()),
        }
    }

    /// Creates a sandbox with some limits overridden.
    pub async fn create_limited(&self, limits: Limits) -> SandboxInfo {
        self.create_with(&CreateRequest {
            limits,
            ..CreateRequest::default()
        })
        .await
    }

    /// Runs `argv` and returns its buffered result; panics on an API error.
    pub async fn exec(&self, id: &SandboxId, argv: &[&str]) -> ExecResult {
        self.exec_req(id, &cmd(argv)).await
    }

    pub async fn exec_req(&self, id: &SandboxId, req: &ExecRequest) -> ExecResult {
        match self.client.exec(id, req).await {
            Ok(r) => r,
            Err(e) => panic!("exec {:?} in {id} failed: {e:?}", req.argv),
        }
    }

    /// Runs `sh -c script`, asserts it exited 0, and returns its stdout.
    pub async fn sh(&self, id: &SandboxId, script: &str) -> String {
        let r = self.exec(id, &["sh", "-c", script]).await;
        assert_eq!(
            r.status.exit_code,
            Some(0),
            "`{script}` in {id} failed: {:?}, stdout {:?}, stderr {:?}",
            r.status,
            text(&r.stdout.0),
            text(&r.stderr.0)
        );
        text(&r.stdout.0)
    }

    /// The CLI, pointed at this daemon.
    pub fn cli(&self) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir);
        c.stdin(Stdio::null());
        c
    }

    /// Runs the CLI with `args` against this daemon.
    pub fn run_cli(&self, args: &[&str]) -> Output {
        self.cli()
            .args(args)
            .output()
            .expect("running the mayfly CLI")
    }

    /// The directory a sandbox's files live in while it exists.
    pub fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.state_dir.join("sandboxes").join(id.as_str())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.killed {
            self.reclaim_after_kill9();
        }
        self.stop();
        if std::thread::panicking() {
            let log = self.log();
            let tail: String = log
                .chars()
                .skip(log.chars().count().saturating_sub(6000))
                .collect();
            eprintln!("---- mayfly serve log (tail) ----\n{tail}\n---- end of log ----");
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

/// An exec request for `argv` with everything else defaulted.
pub fn cmd(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..ExecRequest::default()
    }
}

/// Bytes as text, lossily, for messages and comparisons.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The CLI's stdout as text, after asserting it exited with `code`.
pub fn expect_exit(out: &Output, code: i32, what: &str) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: expected exit code {code}; stdout {:?}, stderr {:?}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Polls `f` every 20 ms until it returns true or `within` passes.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a host path exists (without following a final symlink).
pub fn host_exists(p: impl AsRef<Path>) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// The CLI with no daemon: `--socket` names a path nothing listens on.
pub fn daemonless_cmd(dir: &tempfile::TempDir, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--socket")
        .arg(dir.path().join("no-daemon.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(args)
        .env("MAYFLY_SPARE_NS_DIR", daemonless::spare_ns_dir(dir))
        // Cold runs: no sandbox is parked for a next run. Parked sandboxes
        // have their own tests (tests/parked.rs, `common::parked`).
        .env("MAYFLY_PARK", "0")
        .stdin(Stdio::null());
    cmd
}

/// A daemonless CLI call's output.
pub fn daemonless(dir: &tempfile::TempDir, args: &[&str]) -> Output {
    daemonless_cmd(dir, args)
        .output()
        .expect("running the mayfly CLI")
}
