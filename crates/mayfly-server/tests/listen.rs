//! Real sockets: bearer auth on TCP, peer credentials on the unix socket, and
//! the socket file's life cycle.

mod support;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;

use mayfly_server::{app, bind_tcp, bind_unix, serve, ListenError, Listener, ServerOptions};
use mayfly_types::ApiError;
use support::FakeEngine;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::oneshot;

/// A served app and the switch that stops it.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), ListenError>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), self.done)
            .await
            .expect("the server stops promptly")
            .expect("the server task did not panic")
            .expect("the server ended cleanly");
    }
}

fn start(
    fake: std::sync::Arc<FakeEngine>,
    opts: ServerOptions,
    listeners: Vec<Listener>,
) -> Running {
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(serve(app(fake, opts), listeners, async move {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        done,
    }
}

/// Sends one HTTP/1.1 request and returns (status, headers+body text).
async fn http<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    method: &str,
    path: &str,
    extra: &str,
    body: &str,
) -> (u16, String) {
    let ct = if body.is_empty() {
        ""
    } else {
        "Content-Type: application/json\r\n"
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{ct}{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .await
        .expect("write the request");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read the answer");
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    (status, out)
}

fn body_of(answer: &str) -> &str {
    answer.split("\r\n\r\n").nth(1).unwrap_or("")
}

async fn tcp(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    extra: &str,
    body: &str,
) -> (u16, String) {
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    http(s, method, path, extra, body).await
}

#[tokio::test]
async fn tcp_needs_the_right_bearer_token() {
    let fake = FakeEngine::new();
    let opts = ServerOptions {
        tcp_token: Some("s3cret-token".into()),
        ..ServerOptions::default()
    };
    let l = bind_tcp("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = l.tcp_addr().expect("a TCP address");
    let server = start(fake.clone(), opts, vec![l]);

    let (status, answer) = tcp(addr, "GET", "/healthz", "", "").await;
    assert_eq!(status, 401);
    assert!(answer
        .to_ascii_lowercase()
        .contains("www-authenticate: bearer"));
    let e: ApiError = serde_json::from_str(body_of(&answer)).expect("a JSON error");
    assert_eq!(e.code, mayfly_types::ErrorCode::Unauthenticated);

    for wrong in [
        "Bearer s3cret-tokeN",
        "Bearer s3cret",
        "Basic s3cret-token",
        "bearer",
    ] {
        let (status, _) = tcp(
            addr,
            "GET",
            "/healthz",
            &format!("Authorization: {wrong}\r\n"),
            "",
        )
        .await;
        assert_eq!(status, 401, "{wrong} was accepted");
    }
    // Unknown routes do not reveal themselves without the token either.
    let (status, _) = tcp(addr, "GET", "/nope", "", "").await;
    assert_eq!(status, 401);

    let auth = "Authorization: Bearer s3cret-token\r\n";
    let (status, _) = tcp(addr, "GET", "/healthz", auth, "").await;
    assert_eq!(status, 200);
    let (status, _) = tcp(addr, "POST", "/v1/sandboxes", auth, "{}").await;
    assert_eq!(status, 201);
    let callers = fake.callers();
    assert!(callers[0].starts_with("tcp:127.0.0.1:"), "{callers:?}");
    server.stop().await;
}

#[tokio::test]
async fn tcp_without_a_configured_token_refuses_everything() {
    let l = bind_tcp("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = l.tcp_addr().expect("a TCP address");
    let opts = ServerOptions {
        tcp_token: Some(String::new()),
        ..ServerOptions::default()
    };
    let server = start(FakeEngine::new(), opts, vec![l]);
    let (status, _) = tcp(addr, "GET", "/healthz", "Authorization: Bearer \r\n", "").await;
    assert_eq!(status, 401);
    server.stop().await;
}

#[tokio::test]
async fn the_unix_socket_needs_no_token_and_records_the_peer_uid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("run/mayfly/api.sock");
    let fake = FakeEngine::new();
    let l = bind_unix(&sock).await.expect("bind");
    let server = start(fake.clone(), ServerOptions::default(), vec![l]);

    let s = tokio::net::UnixStream::connect(&sock)
        .await
        .expect("connect");
    let (status, _) = http(s, "POST", "/v1/sandboxes", "", "{}").await;
    assert_eq!(status, 201);
    let my_uid = std::fs::metadata(dir.path()).expect("stat").uid();
    assert_eq!(fake.callers(), vec![format!("unix:uid={my_uid}")]);

    let mode = std::fs::symlink_metadata(&sock)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "the socket is owner and group only");
    let dir_mode = std::fs::metadata(sock.parent().expect("parent"))
        .expect("stat")
        .mode();
    assert_eq!(dir_mode & 0o777, 0o755 & !umask_bits(dir.path()));

    server.stop().await;
    assert!(!sock.exists(), "the socket is removed at shutdown");
}

/// The bits the umask took from a fresh 0777 directory.
fn umask_bits(base: &Path) -> u32 {
    let probe = base.join("umask-probe");
    std::fs::create_dir(&probe).expect("mkdir");
    let mode = std::fs::metadata(&probe).expect("stat").mode() & 0o777;
    0o777 & !mode
}

#[tokio::test]
async fn a_stale_socket_is_replaced_but_a_live_one_or_a_plain_file_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("api.sock");

    // A socket file nobody listens on: left by a crashed daemon.
    drop(std::os::unix::net::UnixListener::bind(&sock).expect("bind"));
    assert!(sock.exists());
    let live = bind_unix(&sock)
        .await
        .expect("the stale socket is replaced");

    // Now one is live: a second daemon must not steal it.
    match bind_unix(&sock).await {
        Err(ListenError::InUse { .. }) => {}
        other => panic!("expected InUse, got {other:?}"),
    }
    drop(live);

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"precious").expect("write");
    match bind_unix(&file).await {
        Err(ListenError::NotASocket { .. }) => {}
        other => panic!("expected NotASocket, got {other:?}"),
    }
    assert_eq!(std::fs::read(&file).expect("read"), b"precious");
}

#[tokio::test]
async fn one_server_serves_unix_and_tcp_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("api.sock");
    let u = bind_unix(&sock).await.expect("bind unix");
    let t = bind_tcp("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind tcp");
    let addr = t.tcp_addr().expect("addr");
    assert!(t.describe().starts_with("tcp:127.0.0.1:"));
    assert_eq!(u.describe(), format!("unix:{}", sock.display()));
    let opts = ServerOptions {
        tcp_token: Some("t".into()),
        ..ServerOptions::default()
    };
    let server = start(FakeEngine::new(), opts, vec![u, t]);
    let s = tokio::net::UnixStream::connect(&sock)
        .await
        .expect("connect");
    assert_eq!(http(s, "GET", "/healthz", "", "").await.0, 200);
    assert_eq!(tcp(addr, "GET", "/healthz", "", "").await.0, 401);
    assert_eq!(
        tcp(addr, "GET", "/healthz", "Authorization: Bearer t\r\n", "")
            .await
            .0,
        200
    );
    server.stop().await;
}

#[tokio::test]
async fn a_router_served_without_peer_info_fails_closed() {
    let (app, _) = support::test_app();
    let a = support::send_raw(&app, support::empty_req(http::Method::GET, "/healthz")).await;
    a.api_error(401);
}

/// Reads until the peer closes, for at most `limit`; how long it took.
async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    let t = std::time::Instant::now();
    let mut sink = Vec::new();
    match tokio::time::timeout(limit, s.read_to_end(&mut sink)).await {
        Ok(_) => Some(t.elapsed()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn clients_that_say_nothing_or_too_little_are_cut_and_hold_up_no_one() {
    let t = bind_tcp("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind tcp");
    let addr = t.tcp_addr().expect("addr");
    let opts = ServerOptions {
        tcp_token: Some("t".into()),
        ..ServerOptions::default()
    };
    let server = start(FakeEngine::new(), opts, vec![t]);
    // Anyone who can reach the port, token or not: one says nothing, one
    // starts a request head and never ends it.
    let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    // Others are served meanwhile.
    let auth = "Authorization: Bearer t\r\n";
    assert_eq!(tcp(addr, "GET", "/healthz", auth, "").await.0, 200);
    // A connection's first request must begin within 30 s.
    let (a, b) = tokio::join!(
        closed_within(&mut silent, Duration::from_secs(45)),
        closed_within(&mut slow, Duration::from_secs(45)),
    );
    let slow_took = b.expect("a request head trickled for 45 s was never cut");
    let silent_took = a.expect("a silent connection was held for 45 s");
    assert!(
        slow_took >= Duration::from_secs(25),
        "cut early: {slow_took:?}"
    );
    assert!(
        silent_took >= Duration::from_secs(25),
        "cut early: {silent_took:?}"
    );
    assert_eq!(tcp(addr, "GET", "/healthz", auth, "").await.0, 200);
    server.stop().await;
}
