use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mayfly_types::{EgressMode, EgressPolicy, SandboxId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// Two connected loopback sockets.
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr"))
        .await
        .expect("connect");
    let (b, _) = l.accept().await.expect("accept");
    (a, b)
}

/// What the far end read until the stream ended, and how it ended.
async fn read_all(s: &mut TcpStream, within: Duration) -> (Vec<u8>, &'static str) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let how = loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Err(_) => break "still open",
            Ok(Ok(0)) => break "closed",
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
            Ok(Err(_)) => break "error",
        }
    };
    (got, how)
}

struct Setup {
    shared: Arc<Shared>,
    sandbox: Arc<Attached>,
    /// The sandbox's end and the destination's end.
    app: TcpStream,
    server: TcpStream,
    task: tokio::task::JoinHandle<()>,
}

/// A sandbox with `allow` whose connection to port `port` is spliced.
async fn spliced(allow: &[&str], port: u16, idle: IdleLimits, head: &[u8]) -> Setup {
    let mut shared = Shared::for_tests(Vec::new());
    shared.idle = idle;
    let shared = Arc::new(shared);
    let policy = EgressPolicy {
        mode: EgressMode::Allow,
        allow: allow.iter().map(|e| e.parse().expect("entry")).collect(),
        ..EgressPolicy::default()
    };
    let sandbox = shared.attach(
        &SandboxId::from_entropy([3; 12]),
        Ipv4Addr::new(100, 96, 1, 2),
        policy,
    );
    let (app, client) = pair().await;
    let (upstream, server) = pair().await;
    let (s, sb, head) = (shared.clone(), sandbox.clone(), head.to_vec());
    let name = (port == 80).then(|| "allowed.test".to_owned());
    let task = tokio::spawn(async move {
        let admitted = Admitted {
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
            port,
            name: Mutex::new(name),
        };
        let conn = Conn {
            shared: &s,
            sandbox: &sb,
            admitted: &admitted,
            http: port == 80,
        };
        conn.splice(sb.changes(), client, upstream, head).await;
    });
    Setup {
        shared,
        sandbox,
        app,
        server,
        task,
    }
}

const LONG: IdleLimits = IdleLimits {
    idle: Duration::from_secs(600),
    half_closed: Duration::from_secs(600),
};

async fn ends(task: tokio::task::JoinHandle<()>, within: Duration, what: &str) {
    tokio::time::timeout(within, task)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .expect("join");
}

#[tokio::test]
async fn a_detached_sandbox_cuts_its_open_connections() {
    let mut s = spliced(&["192.0.2.7/32:7000"], 7000, LONG, b"").await;
    s.app.write_all(b"x").await.expect("write");
    let mut one = [0u8; 1];
    s.server
        .read_exact(&mut one)
        .await
        .expect("the byte arrives");
    s.shared.detach(s.sandbox.addr);
    ends(
        s.task,
        Duration::from_secs(5),
        "the connection outlived its sandbox's detach",
    )
    .await;
    assert_eq!(
        read_all(&mut s.server, Duration::from_secs(5)).await.1,
        "reset"
    );
    assert_eq!(
        read_all(&mut s.app, Duration::from_secs(5)).await.1,
        "reset"
    );
}

#[tokio::test]
async fn a_silent_connection_is_cut_after_the_idle_limit() {
    let idle = IdleLimits {
        idle: Duration::from_millis(300),
        half_closed: Duration::from_millis(300),
    };
    let mut s = spliced(&["192.0.2.7/32:7000"], 7000, idle, b"").await;
    // Traffic keeps it open past the limit...
    for _ in 0..4 {
        s.app.write_all(b"x").await.expect("write");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(!s.task.is_finished(), "cut while bytes were moving");
    // ...and silence ends it.
    ends(
        s.task,
        Duration::from_secs(5),
        "a silent connection lived on",
    )
    .await;
    let (got, how) = read_all(&mut s.server, Duration::from_secs(5)).await;
    assert_eq!((got.as_slice(), how), (&b"xxxx"[..], "reset"));
}

#[tokio::test]
async fn a_half_closed_connection_with_a_silent_peer_is_cut_sooner() {
    let idle = IdleLimits {
        idle: Duration::from_secs(600),
        half_closed: Duration::from_millis(300),
    };
    let mut s = spliced(&["192.0.2.7/32:7000"], 7000, idle, b"").await;
    s.app.write_all(b"x").await.expect("write");
    s.app.shutdown().await.expect("shutdown");
    // The server sees the end of the sandbox's half, and stays silent.
    let (got, how) = read_all(&mut s.server, Duration::from_secs(5)).await;
    assert_eq!((got.as_slice(), how), (&b"x"[..], "closed"));
    ends(
        s.task,
        Duration::from_secs(5),
        "a half-closed connection with a silent peer lived on",
    )
    .await;
}

#[tokio::test]
async fn a_later_request_naming_a_host_not_allowed_is_refused() {
    let first = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
    let second = b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n";
    let mut s = spliced(&["allowed.test:80"], 80, LONG, first).await;
    // The first was read by the peek: the splice starts with it.
    s.app.write_all(second).await.expect("write");
    let (got, how) = read_all(&mut s.server, Duration::from_secs(5)).await;
    assert_eq!(
        (String::from_utf8_lossy(&got).as_ref(), how),
        (std::str::from_utf8(first).unwrap(), "reset"),
        "only the allowed request reaches the server"
    );
    ends(s.task, Duration::from_secs(5), "the connection lived on").await;
}

#[tokio::test]
async fn allowed_requests_on_one_connection_all_pass() {
    let first = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
    let post = b"POST /p HTTP/1.1\r\nHost: Allowed.Test\r\nContent-Length: 5\r\n\r\nHost:";
    let mut s = spliced(&["allowed.test:80"], 80, LONG, first).await;
    s.app.write_all(post).await.expect("write");
    s.app.shutdown().await.expect("shutdown");
    let (got, how) = read_all(&mut s.server, Duration::from_secs(5)).await;
    let mut want = first.to_vec();
    want.extend_from_slice(post);
    assert_eq!((got, how), (want, "closed"));
    s.server
        .write_all(b"HTTP/1.1 200 OK\r\n\r\n")
        .await
        .expect("write");
    drop(s.server);
    ends(s.task, Duration::from_secs(5), "the connection did not end").await;
    let (got, how) = read_all(&mut s.app, Duration::from_secs(5)).await;
    assert_eq!(
        (got.as_slice(), how),
        (&b"HTTP/1.1 200 OK\r\n\r\n"[..], "closed")
    );
}

#[tokio::test]
async fn a_websocket_upgrade_is_opaque_once_switched() {
    let up = b"GET /ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let mut s = spliced(&["allowed.test:80"], 80, LONG, up).await;
    let mut got = vec![0u8; up.len()];
    s.server
        .read_exact(&mut got)
        .await
        .expect("the upgrade request");
    let switched = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
    s.server.write_all(switched).await.expect("write");
    let mut back = vec![0u8; switched.len()];
    s.app.read_exact(&mut back).await.expect("the 101");
    // Frames that would be a refused head as HTTP pass as they are.
    let frame = b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n";
    s.app.write_all(frame).await.expect("write");
    let mut got = vec![0u8; frame.len()];
    s.server.read_exact(&mut got).await.expect("the frame");
    assert_eq!(got, frame);
    drop(s.app);
    drop(s.server);
    ends(s.task, Duration::from_secs(5), "the connection did not end").await;
}
