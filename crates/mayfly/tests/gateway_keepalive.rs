//! The gateway keeps one client connection's upstream connections for its
//! next requests: these tests check that reuse never stands in for
//! authorisation. Every request on a kept-alive connection is routed and
//! checked on its own (another Host goes to another sandbox; a port taken
//! back needs the token again; a destroyed sandbox is refused at once).

mod common;
#[path = "gateway/support.rs"]
mod support;

use mayfly_types::SandboxId;
use support::{daemon, error_code, sandbox_serving};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// One HTTP/1.1 request on `s` (kept alive) and its answer: status, body.
async fn exchange(s: &mut TcpStream, port: u16, id: &SandboxId) -> (u16, String) {
    let req = format!("GET / HTTP/1.1\r\nHost: {port}-{id}.localhost\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .expect("writing a request");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).await.expect("reading the answer");
        assert_eq!(n, 1, "the gateway closed the connection mid-head");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = head[9..12].parse().expect("a status code");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().expect("a content length"))
        .expect("answers here carry a content length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.expect("reading the body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A daemon with sandboxes `alpha` and `beta` each serving a public port
/// 8000, and one connection to its gateway.
async fn alpha_beta_on_one_connection() -> (common::Daemon, SandboxId, SandboxId, TcpStream) {
    let (d, gw) = daemon().await;
    let a = sandbox_serving(&d, "alpha", 8000, None).await;
    let b = sandbox_serving(&d, "beta", 8000, None).await;
    for id in [&a, &b] {
        d.client.expose(id, 8000, true).await.expect("expose");
    }
    let s = TcpStream::connect(("127.0.0.1", gw)).await.unwrap();
    (d, a, b, s)
}

#[tokio::test]
async fn each_request_on_a_kept_alive_connection_goes_where_its_host_says() {
    let (d, a, b, mut s) = alpha_beta_on_one_connection().await;
    for _ in 0..3 {
        assert_eq!(
            exchange(&mut s, 8000, &a).await,
            (200, "hello from alpha".into())
        );
        assert_eq!(
            exchange(&mut s, 8000, &b).await,
            (200, "hello from beta".into())
        );
    }
    // Taking beta's port back is felt on the very next request.
    d.client.unexpose(&b, 8000).await.expect("unexpose");
    let (status, body) = exchange(&mut s, 8000, &b).await;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (401, "unauthenticated"),
        "{body}"
    );
    assert_eq!(
        exchange(&mut s, 8000, &a).await,
        (200, "hello from alpha".into())
    );
}

#[tokio::test]
async fn a_sandbox_destroyed_mid_connection_is_refused_on_the_next_request() {
    let (d, a, b, mut s) = alpha_beta_on_one_connection().await;
    assert_eq!(
        exchange(&mut s, 8000, &a).await,
        (200, "hello from alpha".into())
    );
    assert_eq!(
        exchange(&mut s, 8000, &b).await,
        (200, "hello from beta".into())
    );
    d.client.destroy(&a).await.expect("destroy");
    // The same client connection, whose upstream connection to alpha was
    // kept: a clean JSON 404, and the connection still serves beta.
    let (status, body) = exchange(&mut s, 8000, &a).await;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (404, "not_found"),
        "{body}"
    );
    assert_eq!(
        exchange(&mut s, 8000, &b).await,
        (200, "hello from beta".into())
    );
}
