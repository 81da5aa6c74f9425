//! The gateway against hostile or careless input, with a real daemon: a
//! routing loop is cut (the reserved in-sandbox port, the hop count), the
//! token never reaches an upstream however it is sent (a redirect takes it
//! out of the browser's URL; every Cookie header is stripped), only a
//! verified token becomes a cookie, refused requests do not keep a
//! sandbox alive, a sandbox that floods its own gateway listener with
//! connections makes the daemon hold only a bounded number of descriptors,
//! and request bodies (under the stall guard) reach the upstream whole.

mod common;
#[path = "gateway/support.rs"]
mod support;

use std::time::{Duration, Instant};

use common::keys::code;
use mayfly_types::{CreateRequest, ErrorCode, SandboxId, StartProcessRequest};
use support::{curl, daemon, error_code, sandbox_serving, HostServer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One raw HTTP/1.1 request (its head lines, `Connection: close` added) to
/// the gateway, and the whole answer, head and body.
async fn raw(gw: u16, head: &[&[u8]]) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw))
        .await
        .expect("connecting to the gateway");
    let mut req = Vec::new();
    for line in head {
        req.extend_from_slice(line);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"Connection: close\r\n\r\n");
    s.write_all(&req).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .expect("the gateway answered within 20 s")
        .expect("reading the answer");
    String::from_utf8_lossy(&out).into_owned()
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test]
async fn nothing_may_target_the_gateways_own_port_inside_a_sandbox() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    let token = d.client.ports(&id).await.unwrap().token;
    let (s, c, m) = code(d.client.set_override(&id, "api", 15080).await);
    assert_eq!((s, c), (400, ErrorCode::InvalidArgument), "override: {m}");
    let (s, c, m) = code(d.client.expose(&id, 15080, true).await);
    assert_eq!((s, c), (400, ErrorCode::InvalidArgument), "expose: {m}");
    let (s, c, m) = code(d.client.connect_port(&id, 15080).await);
    assert_eq!((s, c), (400, ErrorCode::InvalidArgument), "forward: {m}");
    let url = format!("http://15080-{id}.localhost:{gw}/");
    let (s, b) = curl(&url, &["-H", &format!("X-Mayfly-Token: {token}")]);
    assert_eq!(
        (s, error_code(&b).as_str()),
        (400, "invalid_argument"),
        "{b}"
    );
    let listed = d.client.ports(&id).await.unwrap();
    assert!(listed.ports.is_empty() && listed.overrides.is_empty());
}

#[tokio::test]
async fn a_request_routed_in_a_loop_is_cut_with_508() {
    let (d, gw) = daemon().await;
    // A baseline that is the gateway itself: each pass sends the request,
    // X-Mayfly-Service and all, straight back in.
    d.client
        .put_route("loop", &format!("http://127.0.0.1:{gw}"))
        .await
        .unwrap();
    let base = HostServer::start("base-api", None);
    d.client.put_route("api", &base.url()).await.unwrap();
    let url = format!("http://127.0.0.1:{gw}/headers");
    let (s, b) = curl(&url, &["-H", "X-Mayfly-Service: api"]);
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("x-mayfly-hops: 1\n"), "one pass is counted: {b}");
    let fds = fd_count(d.pid);

    let t = Instant::now();
    let (s, b) = curl(&url, &["-H", "X-Mayfly-Service: loop"]);
    assert_eq!(
        (s, error_code(&b).as_str()),
        (508, "loop_detected"),
        "after {:?}: {b}",
        t.elapsed()
    );
    // A count the client sends is honoured; junk is refused.
    for (hops, want) in [("10", 508), ("9, 12", 508), ("many", 400)] {
        let h = format!("X-Mayfly-Hops: {hops}");
        let (s, b) = curl(&url, &["-H", "X-Mayfly-Service: api", "-H", &h]);
        assert_eq!(s, want, "{hops}: {b}");
    }
    // The daemon is fine, and the loop's connections are all closed.
    assert_eq!(curl(&url, &["-H", "X-Mayfly-Service: api"]).0, 200);
    let mut now = 0;
    let settled = common::eventually(Duration::from_secs(15), || {
        now = fd_count(d.pid);
        now <= fds + 8
    })
    .await;
    assert!(settled, "the daemon held {fds} descriptors, now {now}");
}

#[tokio::test]
async fn a_query_token_redirects_a_browser_to_the_url_without_it() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    let token = d.client.ports(&id).await.unwrap().token;
    let origin = format!("http://8000-{id}.localhost:{gw}");

    // The answer is a redirect: nothing reached the sandbox yet.
    let with_q = format!("{origin}/headers?x=1&mayfly_token={token}&y=2");
    let (s, head) = curl(&with_q, &["-D", "-", "-o", "/dev/null"]);
    let head = head.to_ascii_lowercase();
    assert_eq!(s, 303, "{head}");
    assert!(
        head.contains("\r\nlocation: /headers?x=1&y=2\r\n"),
        "{head}"
    );
    assert!(
        head.contains(&format!(
            "set-cookie: mayfly_token={token}; path=/; httponly"
        )),
        "{head}"
    );
    assert!(head.contains("cache-control: no-store"), "{head}");
    let (s, _) = curl(&with_q, &["-I"]);
    assert_eq!(s, 303, "HEAD too");

    // A browser (curl with a cookie jar) lands on the clean URL, which the
    // page's script would see and send as Referer: no token anywhere, and
    // none upstream.
    let jar = tempfile::NamedTempFile::new().unwrap();
    let jar = jar.path().to_str().unwrap();
    let out = std::process::Command::new("curl")
        .args(["-s", "-L", "-c", jar, "-b", jar, "-w", "\n%{url_effective}"])
        .arg(&with_q)
        .output()
        .expect("curl");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let (page, landed) = out.rsplit_once('\n').unwrap();
    assert_eq!(landed, format!("{origin}/headers?x=1&y=2"));
    assert!(page.starts_with("GET /headers?x=1&y=2\n"), "{page}");
    let referer = format!("Referer: {landed}");
    let (_, seen) = curl(&format!("{origin}/headers"), &["-b", jar, "-H", &referer]);
    assert!(seen.contains("referer: "), "{seen}");
    for seen in [page, seen.as_str()] {
        assert!(
            !seen.contains(&token) && !seen.contains("mayfly_token"),
            "{seen}"
        );
    }

    // A path that would read as another host stays on this one.
    let (s, head) = curl(
        &format!("{origin}//evil.example/?mayfly_token={token}"),
        &["-D", "-", "-o", "/dev/null"],
    );
    assert_eq!(s, 303);
    assert!(head.contains("location: /.//evil.example/\r\n"), "{head}");
}

#[tokio::test]
async fn only_a_verified_token_becomes_a_cookie_on_a_public_port() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    d.client.expose(&id, 8000, true).await.unwrap();
    let origin = format!("http://8000-{id}.localhost:{gw}");
    // Any token opens a public port; a forged one sets no cookie, let
    // alone the attributes it smuggles in.
    for forged in ["x%3B%20Domain%3Dlocalhost", "x;%20Path=/", "nope"] {
        let (s, head) = curl(
            &format!("{origin}/?mayfly_token={forged}"),
            &["-D", "-", "-o", "/dev/null"],
        );
        assert!(!head.to_ascii_lowercase().contains("set-cookie"), "{head}");
        assert_eq!(s, 303, "{head}");
    }
    let token = d.client.ports(&id).await.unwrap().token;
    let (_, head) = curl(
        &format!("{origin}/?mayfly_token={token}"),
        &["-D", "-", "-o", "/dev/null"],
    );
    assert!(head.contains(&format!("mayfly_token={token};")), "{head}");
}

#[tokio::test]
async fn the_token_reaches_no_upstream_however_it_is_sent() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    let token = d.client.ports(&id).await.unwrap().token;
    let host = format!("Host: 8000-{id}.localhost");

    // The token cookie in a second Cookie header, after a non-ASCII one:
    // it opens the port, and is stripped; the other cookies go on.
    let c2 = format!("Cookie: mayfly_token={token}; b=2");
    let out = raw(
        gw,
        &[
            b"GET /headers HTTP/1.1",
            host.as_bytes(),
            b"Cookie: a=1; caf=\xc3\xa9",
            c2.as_bytes(),
        ],
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("a=1") && out.contains("b=2"), "{out}");
    assert!(!out.contains(&token), "the token leaked upstream: {out}");

    // Header and query together (a POST: forwarded, not redirected): the
    // query parameter goes too.
    let hdr = format!("X-Mayfly-Token: {token}");
    let line = format!("POST /headers?mayfly_token={token}&x=1 HTTP/1.1");
    let out = raw(
        gw,
        &[
            line.as_bytes(),
            host.as_bytes(),
            hdr.as_bytes(),
            b"Content-Length: 0",
        ],
    )
    .await;
    assert!(out.contains("\r\n\r\nPOST /headers?x=1\n"), "{out}");
    assert!(!out.contains(&token), "{out}");

    // A service request: to a baseline, and to an overriding sandbox.
    let base = HostServer::start("base-api", None);
    d.client.put_route("api", &base.url()).await.unwrap();
    d.client.set_override(&id, "api", 8000).await.unwrap();
    let line = format!("GET /headers?mayfly_token={token}&x=1 HTTP/1.1");
    let cookie = format!("Cookie: c=3; mayfly_token={token}");
    for key in [None, Some(id.clone())] {
        let key = key.map(|k: SandboxId| format!("X-Mayfly-Sandbox: {k}"));
        let mut head: Vec<&[u8]> = vec![
            line.as_bytes(),
            b"Host: 127.0.0.1",
            b"X-Mayfly-Service: api",
            hdr.as_bytes(),
            cookie.as_bytes(),
        ];
        head.extend(key.as_ref().map(|k| k.as_bytes()));
        let out = raw(gw, &head).await;
        assert!(out.contains("\r\n\r\nGET /headers?x=1\n"), "{key:?}: {out}");
        assert!(out.contains("cookie: c=3\n"), "{key:?}: {out}");
        assert!(!out.contains(&token), "{key:?}: {out}");
    }
}

#[tokio::test]
async fn refused_gateway_requests_do_not_keep_a_sandbox_alive() {
    let (d, gw) = daemon().await;
    let sb = d
        .create_with(&CreateRequest {
            idle_timeout_secs: Some(2),
            ..CreateRequest::default()
        })
        .await;
    let token = d.client.ports(&sb.id).await.unwrap().token;
    let url = format!("http://8000-{}.localhost:{gw}/", sb.id);
    let tok = format!("X-Mayfly-Token: {token}");
    // Authorised requests are activity (nothing listens: 502, but let in).
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        assert_eq!(curl(&url, &["-H", &tok]).0, 502);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let info = d.client.get(&sb.id).await.unwrap();
    assert!(!info.state.is_terminal(), "reaped while used: {info:?}");
    // Refused ones are not: the sandbox idles out under them.
    let t = Instant::now();
    let info = loop {
        for args in [&[][..], &["-H", "X-Mayfly-Token: nope"][..]] {
            assert!(matches!(curl(&url, args).0, 401 | 403 | 404));
        }
        let info = d.client.get(&sb.id).await.unwrap();
        if info.state.is_terminal() {
            break info;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "refused requests kept the sandbox alive: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(info.reason.as_deref(), Some("idle"), "{info:?}");
}

/// Opens 150 connections to the sandbox's gateway listener, each sending a
/// request for the `api` service, and holds them all.
const FLOOD_PY: &str = "import socket, time
socks = []
for i in range(150):
    s = socket.create_connection(('127.0.0.1', 15080))
    s.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\nX-Mayfly-Service: api\\r\\n\\r\\n')
    socks.append(s)
print('holding', len(socks), flush=True)
time.sleep(600)
";

#[tokio::test]
async fn a_sandbox_flooding_its_gateway_listener_holds_few_daemon_descriptors() {
    let (d, gw) = daemon().await;
    let base = HostServer::start("base-api", None);
    d.client.put_route("api", &base.url()).await.unwrap();
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    // An override gives the sandbox its gateway listener (15080).
    d.client.set_override(&id, "api", 8000).await.unwrap();
    let before = fd_count(d.pid);
    let flood = d
        .client
        .start_process(
            &id,
            &StartProcessRequest {
                argv: vec!["python3".into(), "-c".into(), FLOOD_PY.into()],
                ..StartProcessRequest::default()
            },
        )
        .await
        .expect("starting the flood");
    // 64 client connections served (the in-sandbox limit), each with its
    // upstream connection to the baseline; the rest wait in the backlog.
    let mut now = 0;
    let flooded = common::eventually(Duration::from_secs(20), || {
        now = fd_count(d.pid);
        now >= before + 2 * 64
    })
    .await;
    // The flood prints once its last connection is made, which on a loaded
    // host can come after the daemon's descriptors were counted.
    let t = std::time::Instant::now();
    let out = loop {
        let out = d.client.process_output(&id, flood.handle).await.unwrap();
        let out = format!(
            "stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stdout.0),
            String::from_utf8_lossy(&out.stderr.0)
        );
        if out.contains("holding 150") || t.elapsed() > Duration::from_secs(20) {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        flooded,
        "the flood never took the listener's 64 places: {before} descriptors, now {now}; {out}"
    );
    assert!(
        out.contains("holding 150"),
        "the flood's 150 connections were not all made: {out}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = fd_count(d.pid) - before;
    eprintln!("a flood of 150 connections: the daemon holds {held} more descriptors");
    assert!(
        held <= 2 * 64 + 24,
        "150 connections made the daemon hold {held} more descriptors"
    );
    // The host's gateway and the API are not held up by it.
    let url = format!("http://127.0.0.1:{gw}/");
    let (s, b) = curl(&url, &["-H", "X-Mayfly-Service: api"]);
    assert_eq!(s, 200, "{b}");
    assert!(d.client.get(&id).await.is_ok());
    // Once the flood ends, the places come back and the sandbox's own
    // requests are served again.
    d.client
        .signal_process(&id, flood.handle, None)
        .await
        .unwrap();
    let inside = d
        .sh(
            &id,
            "python3 -c \"import http.client as h; c=h.HTTPConnection('127.0.0.1',15080,timeout=20); \
             c.request('GET','/',headers={'X-Mayfly-Service':'api'}); print(c.getresponse().status)\"",
        )
        .await;
    assert_eq!(inside, "200\n");
    let settled = common::eventually(Duration::from_secs(15), || {
        now = fd_count(d.pid);
        now <= before + 8
    })
    .await;
    assert!(settled, "the daemon held {before} descriptors, now {now}");
}

/// 64 kept-alive connections to the sandbox's gateway listener (all it
/// serves at once), each calling `api`, then `api2`, then `api3`; prints
/// how many answers had each status.
const FAN_OUT_PY: &str = "import http.client as h
cs = [h.HTTPConnection('127.0.0.1', 15080, timeout=30) for _ in range(64)]
counts = {}
for svc in ['api', 'api2', 'api3']:
    for c in cs:
        c.request('GET', '/', headers={'X-Mayfly-Service': svc})
        r = c.getresponse()
        r.read()
        counts[r.status] = counts.get(r.status, 0) + 1
print(sorted(counts.items()))
";

#[tokio::test]
async fn a_sandbox_s_calls_hold_at_most_128_upstream_connections() {
    let (d, _gw) = daemon().await;
    // Three baselines: each client connection keeps one upstream
    // connection to each (192 in all, were there no limit).
    let bases: Vec<_> = ["base-api", "base-api2", "base-api3"]
        .iter()
        .map(|n| HostServer::start(n, None))
        .collect();
    for (svc, b) in ["api", "api2", "api3"].iter().zip(&bases) {
        d.client.put_route(svc, &b.url()).await.unwrap();
    }
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    d.client.set_override(&id, "other", 8000).await.unwrap();
    d.client
        .write_file(
            &id,
            "/workspace/fan.py",
            FAN_OUT_PY.as_bytes().to_vec(),
            None,
        )
        .await
        .unwrap();
    let out = d.sh(&id, "python3 /workspace/fan.py").await;
    // The first 128 upstream connections are made; the rest are refused
    // with a 503 that says why, while those are open.
    assert_eq!(out, "[(200, 128), (503, 64)]\n");
    let url = format!("http://127.0.0.1:{}/", bases[0].port);
    assert_eq!(curl(&url, &[]).0, 200, "the baseline itself is fine");
}

#[tokio::test]
async fn request_bodies_stream_upstream_whole_sized_or_chunked() {
    let (d, gw) = daemon().await;
    let id = sandbox_serving(&d, "inside", 8000, None).await;
    d.client.expose(&id, 8000, true).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("body");
    // 8 MiB of varied bytes.
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let want = {
        use sha2::Digest as _;
        let hex: String = sha2::Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{} {hex}", data.len())
    };
    let url = format!("http://8000-{id}.localhost:{gw}/upload");
    let at = format!("@{}", file.display());
    // With a length, then chunked (curl streams a file of unknown size).
    let chunked = ["-H", "Transfer-Encoding: chunked"];
    for extra in [&[][..], &chunked[..]] {
        let mut args = vec!["-X", "POST", "--data-binary", &at];
        args.extend_from_slice(extra);
        let (s, b) = curl(&url, &args);
        assert_eq!((s, b.as_str()), (200, want.as_str()), "{extra:?}");
    }
}
