#![allow(dead_code)] // each suite uses a part of it
//! Helpers of the gateway suites: a daemon with a gateway on a free port,
//! the test server (`server.py`) inside a sandbox or on the host, and curl.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mayfly_types::{CreateRequest, SandboxId, StartProcessRequest};

use crate::common::Daemon;

pub const SERVER_PY: &str = include_str!("server.py");

pub use crate::common::free_port;

/// A daemon without a warm pool, its gateway on a free port.
pub async fn daemon() -> (Daemon, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(&["--gateway", &addr, "--pool", "host=0"]).await;
    (d, port)
}

/// A sandbox (30 min TTL) running the test server as `name` on `port`.
pub async fn sandbox_serving(
    d: &Daemon,
    name: &str,
    port: u16,
    gateway: Option<&str>,
) -> SandboxId {
    let sb = d
        .create_with(&CreateRequest {
            ttl_secs: Some(1800),
            ..CreateRequest::default()
        })
        .await;
    serve_in(d, &sb.id, name, port, gateway).await;
    sb.id
}

/// Starts the test server in a sandbox and waits until its port accepts.
pub async fn serve_in(d: &Daemon, id: &SandboxId, name: &str, port: u16, gateway: Option<&str>) {
    d.client
        .write_file(
            id,
            "/workspace/server.py",
            SERVER_PY.as_bytes().to_vec(),
            Some(0o644),
        )
        .await
        .expect("writing server.py");
    let mut argv = vec![
        "python3".to_owned(),
        "/workspace/server.py".to_owned(),
        name.to_owned(),
        port.to_string(),
    ];
    argv.extend(gateway.map(str::to_owned));
    d.client
        .start_process(
            id,
            &StartProcessRequest {
                argv,
                ..StartProcessRequest::default()
            },
        )
        .await
        .expect("starting server.py");
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.client.connect_port(id, port).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "server.py did not listen on {port} in {id} within 30 s; daemon log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The test server on the host (a baseline), killed on drop.
pub struct HostServer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl HostServer {
    pub fn start(name: &str, gateway: Option<&str>) -> HostServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("server.py");
        std::fs::write(&script, SERVER_PY).expect("writing server.py");
        let port = free_port();
        let mut cmd = Command::new("python3");
        cmd.arg(&script).arg(name).arg(port.to_string());
        cmd.args(gateway);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawning python3");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the host server did not listen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(30));
        }
        HostServer {
            child,
            port,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One curl request: (status, body). `args` go before the URL.
pub fn curl(url: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("running curl (apt install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// The `code` of a JSON error body.
pub fn error_code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("<not a JSON error: {body:?}>"))
}
