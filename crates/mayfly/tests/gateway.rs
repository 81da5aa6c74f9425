//! The gateway's preview path against a real daemon and real servers in
//! sandboxes: host- and header-based preview URLs, tokens and public
//! ports, WebSocket, HTTP/2 (h2c), streaming, TCP forwarding, bad input,
//! and that nothing (processes, mounts, namespace descriptors, listeners)
//! is left after a destroy or a daemon crash.

mod common;
#[path = "gateway/support.rs"]
mod support;

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::host::assert_no_leaks;
use common::keys::{code, tenant_client};
use mayfly_types::{ErrorCode, SandboxId, TenantQuotas};
use support::{curl, daemon, error_code, read_head, sandbox_serving, ws_echo, ws_open};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn host(port: u16, id: &SandboxId) -> String {
    format!("Host: {port}-{id}.localhost")
}

#[tokio::test]
async fn preview_urls_serve_a_page_from_inside_the_sandbox_with_its_token() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    let token = d.client.ports(&id).await.expect("ports").token;
    let base = format!("http://127.0.0.1:{gw}/");
    let tok = format!("X-Mayfly-Token: {token}");

    // Host-based: `<port>-<id>.localhost` resolves to loopback by itself.
    let url = format!("http://8000-{id}.localhost:{gw}/");
    assert_eq!(curl(&url, &["-H", &tok]), (200, "hello from inside".into()));
    // Header-based.
    let (hs, hp) = (format!("X-Mayfly-Sandbox: {id}"), "X-Mayfly-Port: 8000");
    assert_eq!(
        curl(&base, &["-H", &hs, "-H", hp, "-H", &tok]),
        (200, "hello from inside".into())
    );

    // Without a token: 401; with another: 403; both JSON.
    let (s, b) = curl(&url, &[]);
    assert_eq!(
        (s, error_code(&b).as_str()),
        (401, "unauthenticated"),
        "{b}"
    );
    let (s, b) = curl(&base, &["-H", &hs, "-H", hp, "-H", "X-Mayfly-Token: nope"]);
    assert_eq!(
        (s, error_code(&b).as_str()),
        (403, "permission_denied"),
        "{b}"
    );

    // The query parameter sets a cookie (on a redirect to the URL without
    // it), and the cookie alone then works; neither the parameter nor the
    // token headers reach the server.
    let jar = tempfile::NamedTempFile::new().unwrap();
    let jar = jar.path().to_str().unwrap();
    let with_q = format!("http://8000-{id}.localhost:{gw}/headers?mayfly_token={token}");
    let (s, seen) = curl(&with_q, &["-L", "-c", jar, "-b", jar]);
    assert_eq!(s, 200);
    assert!(!seen.contains(&token), "the token leaked upstream: {seen}");
    assert_eq!(curl(&url, &["-b", jar]).0, 200, "the cookie grants access");
    let (_, seen) = curl(
        &format!("http://8000-{id}.localhost:{gw}/headers"),
        &["-H", &tok],
    );
    assert!(
        !seen.contains("x-mayfly-token") && seen.contains("host: 8000-"),
        "{seen}"
    );

    // A public port needs no token; taking it back needs the token again.
    let p = d.client.expose(&id, 8000, true).await.expect("expose");
    assert_eq!(p.url.as_deref(), Some(url.trim_end_matches('/')));
    assert_eq!(curl(&url, &[]), (200, "hello from inside".into()));
    let listed = d.client.ports(&id).await.unwrap();
    assert_eq!(listed.ports.len(), 1);
    assert!(listed.ports[0].public);
    d.client.unexpose(&id, 8000).await.expect("unexpose");
    assert_eq!(curl(&url, &[]).0, 401);
}

#[tokio::test]
async fn websocket_h2c_and_streaming_pass_through() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    d.client.expose(&id, 8000, true).await.expect("expose");

    // HTTP/2 with prior knowledge (h2c) from the client.
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "-w",
            "\n%{http_version} %{http_code}",
        ])
        .arg(format!("http://8000-{id}.localhost:{gw}/"))
        .output()
        .expect("curl");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out, "hello from inside\n2 200", "h2c through the gateway");

    // WebSocket: the upgrade is relayed and frames echo both ways.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw))
        .await
        .unwrap();
    let head = ws_open(&mut s, &format!("8000-{id}.localhost")).await;
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    for msg in ["hello ws", "second frame"] {
        ws_echo(&mut s, msg).await;
    }

    // Streaming: the first chunk arrives long before the last is sent.
    // (The server sends three chunks 700 ms apart, then ends the answer
    // 700 ms after the last: buffered, chunk 0 would come with the end.)
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw))
        .await
        .unwrap();
    let req = format!(
        "GET /stream HTTP/1.1\r\n{}\r\nConnection: close\r\n\r\n",
        host(8000, &id)
    );
    let t0 = Instant::now();
    s.write_all(req.as_bytes()).await.unwrap();
    let (mut seen, mut first, mut buf) = (String::new(), None, [0u8; 4096]);
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        if first.is_none() && seen.contains("chunk 0") {
            first = Some(t0.elapsed());
        }
    }
    let (first, total) = (first.expect("chunk 0 arrived"), t0.elapsed());
    assert!(seen.contains("chunk 2"), "{seen}");
    // Measured from chunk 0's arrival, not from the request, so a slow
    // host's latency before the server starts answering does not count.
    assert!(
        total - first >= Duration::from_millis(1400),
        "not streamed: first chunk after {first:?}, whole answer after {total:?}"
    );
}

#[tokio::test]
async fn tcp_forwarding_reaches_a_port_inside_the_sandbox() {
    let (d, _) = daemon().await;
    let id = sandbox_serving(&d, "inside", 5432, None).await;
    // Through the client: raw bytes both ways.
    let mut s = d.client.connect_port(&id, 5432).await.expect("connect");
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.ends_with("hello from inside"), "{out}");

    // Through the CLI: a host listener forwarding to the sandbox.
    let listen = format!("127.0.0.1:{}", support::free_port());
    let mut child = d
        .cli()
        .args(["port-forward", id.as_str(), "5432", "--listen", &listen])
        .stdout(Stdio::piped())
        .spawn()
        .expect("mayfly port-forward");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("forwarding"), "{line}");
    let got = curl(&format!("http://{listen}/"), &[]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(got, (200, "hello from inside".into()));

    // Nothing listens on that port: a clean 502 before any upgrade.
    let (status, c, _) = code(d.client.connect_port(&id, 5999).await);
    assert_eq!((status, c), (502, ErrorCode::BadGateway));
}

#[tokio::test]
async fn bad_gateway_input_gets_clean_4xx_json() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    let base = format!("http://127.0.0.1:{gw}/");
    let token = d.client.ports(&id).await.unwrap().token;
    let tok = format!("X-Mayfly-Token: {token}");
    let cases: Vec<(Vec<String>, u16, &str)> = vec![
        (
            vec![format!("Host: bad_name.localhost")],
            400,
            "invalid_argument",
        ),
        (
            vec![format!("Host: 0-{id}.localhost")],
            400,
            "invalid_argument",
        ),
        (
            vec![format!("Host: 70000-{id}.localhost")],
            400,
            "invalid_argument",
        ),
        (
            vec!["Host: 8080-mf-BAD.localhost".into()],
            400,
            "invalid_argument",
        ),
        (vec!["Host: 8080.localhost".into()], 400, "invalid_argument"),
        (
            vec!["Host: 8080-mf-zzzzzzzzzzzz.localhost".into()],
            404,
            "not_found",
        ),
        (vec!["Host: example.com".into()], 404, "not_found"),
        (vec!["Host: a.b.localhost".into()], 404, "not_found"),
        (vec!["X-Mayfly-Port: 80".into()], 400, "invalid_argument"),
        (
            vec![
                format!("X-Mayfly-Sandbox: {id}"),
                "X-Mayfly-Port: -1".into(),
            ],
            400,
            "invalid_argument",
        ),
        (vec!["X-Mayfly-Service: nosuch".into()], 404, "not_found"),
        (
            vec![format!("Host: 5999-{id}.localhost"), tok.clone()],
            502,
            "bad_gateway",
        ),
    ];
    for (headers, want, want_code) in cases {
        let args: Vec<&str> = headers.iter().flat_map(|h| ["-H", h.as_str()]).collect();
        let (s, b) = curl(&base, &args);
        assert_eq!(
            (s, error_code(&b).as_str()),
            (want, want_code),
            "{headers:?}: {b}"
        );
    }
    // Huge headers: refused by the HTTP layer with 431, for both protocols.
    let big = format!("X-Big: {}", "x".repeat(100_000));
    let h = host(8000, &id);
    assert_eq!(curl(&base, &["-H", &h, "-H", &big]).0, 431);
    let many: Vec<String> = (0..2000)
        .map(|i| format!("X-H{i}: {}", "y".repeat(40)))
        .collect();
    let mut args = vec!["--http2-prior-knowledge", "-H", h.as_str()];
    args.extend(many.iter().flat_map(|m| ["-H", m.as_str()]));
    let s = curl(&base, &args).0;
    assert!(
        s == 431 || s == 0 || (400..500).contains(&s),
        "h2 huge headers: {s}"
    );
    // The daemon is still fine.
    assert_eq!(curl(&base, &["-H", &h, "-H", &tok]).0, 200);

    // The API: ports out of range, bad names, other tenants' sandboxes.
    for p in ["0", "70000", "abc"] {
        let r = common::keys::http(
            &d.socket,
            "PUT",
            &format!("/v1/sandboxes/{id}/ports/{p}"),
            None,
            Some("{}"),
        );
        assert_eq!(r.status, 400, "port {p}: {}", r.body);
    }
    let r = common::keys::http(
        &d.socket,
        "PUT",
        &format!("/v1/sandboxes/{id}/overrides/Bad_Name"),
        None,
        Some(r#"{"port":80}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let r = common::keys::http(
        &d.socket,
        "PUT",
        &format!("/v1/sandboxes/{id}/overrides/api"),
        None,
        Some(r#"{"port":0}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    for url in ["https://x", "http://a:0", "ftp://x", "http://u@h"] {
        let body = serde_json::json!({ "url": url }).to_string();
        let r = common::keys::http(&d.socket, "PUT", "/v1/routes/api", None, Some(&body));
        assert_eq!(r.status, 400, "{url}: {}", r.body);
    }
    let (other, _) = tenant_client(&d, "other", TenantQuotas::default(), false).await;
    let (s, c, _) = code(other.ports(&id).await);
    assert_eq!(
        (s, c),
        (404, ErrorCode::NotFound),
        "another tenant's sandbox is not there"
    );
    let (s, c, _) = code(other.expose(&id, 8000, true).await);
    assert_eq!((s, c), (404, ErrorCode::NotFound));
    let (s, c, _) = code(other.set_override(&id, "api", 8000).await);
    assert_eq!((s, c), (404, ErrorCode::NotFound));
    let (s, c, _) = code(other.put_route("api", "http://127.0.0.1:1").await);
    assert_eq!(
        (s, c),
        (403, ErrorCode::PermissionDenied),
        "routes are the admin's"
    );
}

/// The links in a process's fd table that are network namespaces.
fn netns_fds(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .filter(|l| l.starts_with("net:["))
                .collect()
        })
        .unwrap_or_default()
}

/// The inodes of every TCP socket in the network namespace of `pid`.
fn tcp_inodes_in_netns_of(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(9).map(str::to_owned))
        .filter(|i| i != "0")
        .collect()
}

/// Which of `inodes` the process `pid` holds as socket descriptors.
fn sockets_held(pid: u32, inodes: &[String]) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .filter(|l| inodes.iter().any(|i| *l == format!("socket:[{i}]")))
                .collect()
        })
        .unwrap_or_default()
}

/// Anything on the host still holding network namespace `ns` (a process
/// in it, or a descriptor of it).
fn holders_of(ns: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if std::fs::read_link(p.path().join("ns/net")).is_ok_and(|l| l.to_string_lossy() == ns) {
            out.push(format!("process {pid} lives in it"));
        }
        if let Ok(fds) = std::fs::read_dir(p.path().join("fd")) {
            for fd in fds.flatten() {
                if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == ns) {
                    out.push(format!("process {pid} holds it as fd {:?}", fd.file_name()));
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn destroy_and_daemon_crash_leave_no_namespace_listener_or_process() {
    let (mut d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    let init = d.client.get(&id).await.unwrap().init_pid.expect("init pid") as u32;
    let ns = std::fs::read_link(format!("/proc/{init}/ns/net"))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let token = d.client.ports(&id).await.unwrap().token;
    // An override opens the in-sandbox listener; a request on a client
    // connection kept open keeps that connection's upstream connection.
    d.client.set_override(&id, "api", 8000).await.unwrap();
    let url = format!("http://8000-{id}.localhost:{gw}/");
    let mut client = tokio::net::TcpStream::connect(("127.0.0.1", gw))
        .await
        .unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\n{}\r\nX-Mayfly-Token: {token}\r\n\r\n",
        host(8000, &id)
    );
    client.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut client).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // (The daemon also holds the namespaces it prepared ahead for egress.)
    assert!(
        netns_fds(d.pid).contains(&ns),
        "the daemon does not hold the sandbox's namespace"
    );
    // The daemon's sockets inside the sandbox: the 15080 listener and the
    // kept-alive upstream connection.
    let inside = tcp_inodes_in_netns_of(init);
    let held = sockets_held(d.pid, &inside);
    assert!(
        held.len() >= 2,
        "expected a listener and a kept-alive connection: {held:?}"
    );

    d.client.destroy(&id).await.unwrap();
    let mut left = Vec::new();
    let gone = common::eventually(Duration::from_secs(15), || {
        left = holders_of(&ns);
        left.is_empty()
    })
    .await;
    assert!(
        gone,
        "the sandbox's network namespace is still held: {left:?}"
    );
    assert!(!netns_fds(d.pid).contains(&ns));
    let mut held = Vec::new();
    let closed = common::eventually(Duration::from_secs(15), || {
        held = sockets_held(d.pid, &inside);
        held.is_empty()
    })
    .await;
    assert!(
        closed,
        "the daemon still holds sockets of the sandbox: {held:?}"
    );
    assert_no_leaks(&d.state_dir, &[id.as_str()]);
    let (s, b) = curl(&url, &["-H", &format!("X-Mayfly-Token: {token}")]);
    assert_eq!(
        (s, error_code(&b).as_str()),
        (404, "not_found"),
        "never a host connection"
    );

    // A crash with a live, previewed sandbox, then a restart on the same
    // gateway port.
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    d.client.expose(&id, 8000, true).await.unwrap();
    d.client.set_override(&id, "api", 8000).await.unwrap();
    let url = format!("http://8000-{id}.localhost:{gw}/");
    assert_eq!(curl(&url, &[]).0, 200);
    d.kill9();
    d.restart().await;
    assert_no_leaks(&d.state_dir, &[id.as_str()]);
    let (s, _) = curl(&url, &[]);
    assert_eq!(
        s, 404,
        "the restarted daemon's gateway answers, and the sandbox is gone"
    );
}
