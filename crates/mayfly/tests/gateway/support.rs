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

/// Reads an HTTP head, byte by byte, up to and including its blank line.
pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut b).await.unwrap(),
            1,
            "the connection closed mid-head"
        );
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A client's (masked) final text frame carrying `msg` (under 126 bytes).
pub fn masked_text_frame(msg: &str) -> Vec<u8> {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut f = vec![0x81, 0x80 | msg.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(msg.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Opens a WebSocket to server.py's `/ws` on `s`, addressed by `host`;
/// the answer's head.
pub async fn ws_open<S>(s: &mut S, host: &str) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt as _;
    let req = format!(
        "GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(s).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    head
}

/// Sends `msg` as a text frame and checks that server.py echoes it back.
pub async fn ws_echo<S>(s: &mut S, msg: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    s.write_all(&masked_text_frame(msg)).await.unwrap();
    let mut hdr = [0u8; 2];
    s.read_exact(&mut hdr).await.unwrap();
    assert_eq!(hdr[0], 0x81, "a final text frame");
    let mut body = vec![0u8; (hdr[1] & 0x7f) as usize];
    s.read_exact(&mut body).await.unwrap();
    assert_eq!(String::from_utf8(body).unwrap(), msg);
}
