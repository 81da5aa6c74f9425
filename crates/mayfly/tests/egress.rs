//! Egress policies against a real daemon and real servers: a test network
//! namespace (`egt<N>`, 10.77.N.2) plays "the outside" with TCP servers on
//! 80, 443, 8080, 5000 and 7000 and a DNS server on 53 that records what
//! reaches it; the daemon's resolver maps test names to it (`--dns-hosts`).
//! Python inside the sandboxes is the client.

mod common;
#[path = "egress/support.rs"]
mod support;

use common::keys::{code, http};
use common::*;
use std::time::{Duration, Instant};

use mayfly_types::{CreateRequest, EgressMode, ErrorCode, ExecRequest};
use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn allow_list_admits_allowed_names_and_blocks_everything_else() {
    let out = Outside::start();
    let dir = test_dir();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken").expect("token file");
    let port = 20000 + (std::process::id() % 20000);
    let tcp = format!("0.0.0.0:{port}");
    let d = daemon_for(
        &out,
        &["--tcp", &tcp, "--token-file", token.to_str().expect("path")],
    )
    .await;
    let allow = ["allowed.test:80", "allowed.test:443", "*.wild.test:5000"];
    let a = create(&d, policy(EgressMode::Allow, &allow)).await;
    let b = create(&d, policy(EgressMode::Open, &[])).await;
    let (a_addr, b_addr) = (own_addr(&d, &a).await, own_addr(&d, &b).await);
    assert_ne!(a_addr, b_addr);
    let ip = out.addr.as_str();

    expect(&d, &a, &["http", "allowed.test", "80"], "OK").await;
    expect(&d, &a, &["tls", "allowed.test", "443"], "OK").await;
    expect(&d, &a, &["raw", "a.wild.test", "5000"], "OK").await;
    assert_eq!(
        out.hits("tcp 443"),
        1,
        "the allowed ClientHello reached the server"
    );
    // Other names do not resolve; other ports of an allowed name are closed.
    expect(&d, &a, &["resolve", "other.test", "0"], "BLOCKED").await;
    expect(&d, &a, &["http", "allowed.test", "8080"], "BLOCKED").await;
    // A raw IP (even one handed out for an allowed name) and a spoofed
    // Host or SNI are refused on 80/443.
    expect(&d, &a, &["http", ip, "80"], "BLOCKED").await;
    expect(&d, &a, &["http", ip, "80", "other.test"], "BLOCKED").await;
    expect(&d, &a, &["tls", ip, "443", "other.test"], "BLOCKED").await;
    expect(&d, &a, &["raw", ip, "8080"], "BLOCKED").await;
    // The host: its loopback through a name, its address (the daemon's
    // API), the sandbox's gateway; another sandbox; cloud metadata.
    expect(&d, &a, &["http", "loop.test", "80"], "BLOCKED").await;
    let host = host_addr();
    expect(&d, &a, &["http", &host, &port.to_string()], "BLOCKED").await;
    let gw = a_addr
        .rsplit_once('.')
        .map(|(n, l)| format!("{n}.{}", l.parse::<u8>().unwrap_or(2) - 1))
        .expect("addr");
    expect(&d, &a, &["http", &gw, &port.to_string()], "BLOCKED").await;
    // b serves on 8000, and listens before a tries: a must be blocked, not
    // merely refused for want of a server.
    d.sh(
        &b,
        "(python3 -m http.server 8000 >/dev/null 2>&1 &) ; python3 -c '\
         import socket, time\n\
         for _ in range(300):\n    try: socket.create_connection((\"127.0.0.1\", 8000), 1); break\n    except OSError: time.sleep(0.1)\n\
         else: raise SystemExit(\"http.server never listened on 8000\")'",
    )
    .await;
    expect(&d, &a, &["http", &b_addr, "8000"], "BLOCKED").await;
    expect(&d, &a, &["http", "169.254.169.254", "80"], "BLOCKED").await;
    // A foreign DNS server is never reached: the daemon answers instead.
    expect(&d, &a, &["dns", ip, "53", "other.test"], "ANSWERED rcode=3").await;
    expect(
        &d,
        &a,
        &["dns", ip, "53", "allowed.test"],
        "ANSWERED rcode=0 answers=1",
    )
    .await;
    assert_eq!(
        out.hits("dns"),
        0,
        "the foreign DNS server got a query: {}",
        out.log()
    );
    let before = out.hits("tcp 80") + out.hits("tcp 8080");
    assert_eq!(
        before,
        1,
        "only the allowed request reached the outside: {}",
        out.log()
    );

    // A live change: other.test opens, allowed.test closes.
    let new = policy(EgressMode::Allow, &["other.test:80"]);
    assert_eq!(d.client.set_egress(&a, &new).await.expect("patch"), new);
    assert_eq!(d.client.egress(&a).await.expect("get"), new);
    expect(&d, &a, &["http", "other.test", "80"], "OK").await;
    expect(&d, &a, &["resolve", "allowed.test", "0"], "BLOCKED").await;
    expect(&d, &a, &["http", ip, "80", "allowed.test"], "BLOCKED").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn open_mode_still_blocks_the_always_blocked_set_and_none_is_loopback_only() {
    let out = Outside::start();
    let d = daemon_for(&out, &[]).await;
    let open = create(&d, policy(EgressMode::Open, &[])).await;
    let ip = out.addr.as_str();
    expect(&d, &open, &["raw", ip, "8080"], "OK").await;
    expect(&d, &open, &["http", "other.test", "80"], "OK").await;
    expect(&d, &open, &["http", "169.254.169.254", "80"], "BLOCKED").await;
    expect(&d, &open, &["http", &host_addr(), "22"], "BLOCKED").await;
    expect(&d, &open, &["http", "loop.test", "80"], "BLOCKED").await;
    expect(&d, &open, &["raw", ip, "53"], "BLOCKED").await;
    // DNS over TLS or QUIC to a server of the sandbox's choosing would
    // bypass the resolver: 853 is closed whatever the policy.
    expect(&d, &open, &["raw", ip, "853"], "BLOCKED").await;
    expect(&d, &open, &["udp", ip, "853"], "BLOCKED").await;
    assert_eq!(
        out.hits("tcp 853") + out.hits("udp 853"),
        0,
        "{}",
        out.log()
    );

    let none = d.create().await.id;
    let ifaces = d
        .sh(&none, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        .await;
    assert_eq!(
        ifaces.trim(),
        "lo",
        "a sandbox with egress none has loopback only"
    );
    expect(&d, &none, &["raw", ip, "8080"], "BLOCKED").await;
    // It has no interface to open later.
    let r = d
        .client
        .set_egress(&none, &policy(EgressMode::Open, &[]))
        .await;
    assert_eq!(code(r).1, ErrorCode::Conflict);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_request_on_a_port_80_connection_must_name_an_allowed_host() {
    let out = Outside::start();
    let d = daemon_for(&out, &[]).await;
    let a = create(&d, policy(EgressMode::Allow, &["allowed.test:80"])).await;
    let req = |host: &str| format!("GET / HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n");
    // Two allowed requests on one connection both reach the server.
    let both = format!("{}{}", req("allowed.test"), req("allowed.test"));
    expect(&d, &a, &["send", "allowed.test", "80", &both], "OK").await;
    // A pipelined request for another name does not: the connection is
    // cut before it leaves (the first one's answer may come back first).
    let smuggled = format!("{}{}", req("allowed.test"), req("other.test"));
    let got = probe(&d, &a, &["send", "allowed.test", "80", &smuggled]).await;
    eprintln!("a pipelined request for another name: {got}");
    // An absolute-form target must name the Host.
    let absolute = "GET http://other.test/ HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n";
    expect(&d, &a, &["send", "allowed.test", "80", absolute], "BLOCKED").await;
    // The server logs the Hosts it read when each connection ends.
    let logged = eventually(Duration::from_secs(10), || {
        out.hits("host allowed.test") >= 3
    })
    .await;
    assert!(
        logged,
        "the allowed requests did not all arrive: {}",
        out.log()
    );
    assert_eq!(out.hits("host other.test"), 0, "{}", out.log());
    assert_eq!(out.hits("tcp 80"), 2, "{}", out.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_connection_cap_is_enforced() {
    let out = Outside::start();
    let d = daemon_for(&out, &[]).await;
    let mut p = policy(EgressMode::Allow, &[&format!("{}/32:7000-8080", out.addr)]);
    p.max_connections = Some(2);
    let id = create(&d, p).await;
    // Two connections hold both places; the third is tried once the test
    // has seen both reach the outside (it writes `/workspace/go`). Once
    // they close, a place is free again as soon as the proxy has seen them
    // end: retried until then.
    let script = format!(
        "import os, socket, sys, time\n\
         held = [socket.create_connection(('{0}', 7000), timeout=3) for _ in range(2)]\n\
         for s in held: s.sendall(b'x')\n\
         t = time.time()\n\
         while not os.path.exists('/workspace/go'):\n    \
             if time.time() - t > 60: sys.exit('no /workspace/go within 60 s')\n    \
             time.sleep(0.02)\n\
         try:\n    s = socket.create_connection(('{0}', 8080), timeout=3); s.sendall(b'x'); s.settimeout(3)\n    print('third', s.recv(100)[:15])\n\
         except OSError as e:\n    print('third refused', type(e).__name__)\n\
         for h in held: h.close()\n\
         t = time.time()\n\
         while True:\n    \
             try:\n        s = socket.create_connection(('{0}', 8080), timeout=3); s.sendall(b'x'); s.settimeout(3); got = s.recv(100)[:15]\n    \
             except OSError as e:\n        got = type(e).__name__\n    \
             if isinstance(got, bytes) and got.startswith(b'HTTP/1.0 200'): break\n    \
             if time.time() - t > 30: break\n    \
             time.sleep(0.1)\n\
         print('after', got)\n",
        out.addr
    );
    let req = ExecRequest {
        timeout_ms: Some(120_000),
        ..cmd(&["python3", "-c", &script])
    };
    let (c, sb) = (d.client.clone(), id.clone());
    let run = tokio::spawn(async move { c.exec(&sb, &req).await });
    let t = Instant::now();
    while out.hits("tcp 7000") < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the two held connections never reached the outside: {}",
            out.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.client
        .write_file(&id, "/workspace/go", "go", Some(0o644))
        .await
        .expect("writing /workspace/go");
    let r = tokio::time::timeout(Duration::from_secs(150), run)
        .await
        .expect("the connection script did not end")
        .expect("join")
        .expect("exec");
    let text = String::from_utf8_lossy(&r.stdout.0).into_owned();
    assert!(
        text.contains("third refused") || text.contains("third b''"),
        "the third connection passed the cap of 2: {text:?} {:?}",
        String::from_utf8_lossy(&r.stderr.0)
    );
    assert!(
        text.contains("after b'HTTP/1.0 200"),
        "a freed place is usable again: {text:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_policies_are_refused_with_400() {
    let d = Daemon::start().await;
    for body in [
        r#"{"egress": {"mode": "allow", "allow": ["10.0.0.0/33"]}}"#,
        r#"{"egress": {"mode": "allow", "allow": ["10.0.0.0/8:90-80"]}}"#,
        r#"{"egress": {"mode": "allow", "allow": ["ex*ample.com"]}}"#,
        r#"{"egress": {"mode": "allow", "allow": ["a.*.example.com"]}}"#,
        r#"{"egress": {"mode": "sometimes"}}"#,
        r#"{"egress": {"mode": "open", "max_connections": 0}}"#,
    ] {
        let r = http(&d.socket, "POST", "/v1/sandboxes", None, Some(body));
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["code"], "invalid_argument", "{body}");
    }
    let id = d.create().await.id;
    let path = format!("/v1/sandboxes/{id}/egress");
    let r = http(
        &d.socket,
        "PATCH",
        &path,
        None,
        Some(r#"{"mode":"allow","allow":["1.2.3.4:0"]}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_left_after_destroy_and_after_kill9_and_restart() {
    let out = Outside::start();
    let mut d = daemon_for(&out, &[]).await;
    let t = tag(&d);
    let id = create(&d, policy(EgressMode::Open, &[])).await;
    let addr = own_addr(&d, &id).await;
    let slot =
        mayfly_engine::egress::plan::slot_of_sandbox(addr.parse().expect("addr")).expect("slot");
    let link = format!("mf-{t}-{slot}");
    assert!(links_of(&t).contains(&link));
    assert!(table_exists(&t));
    d.client.destroy(&id).await.expect("destroy");
    // Destroy answers once the sandbox is killed; cleanup follows.
    let deadline = Instant::now() + Duration::from_secs(15);
    while links_of(&t).contains(&link) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !links_of(&t).contains(&link),
        "the sandbox's link outlived it by 15 s"
    );
    assert_no_leaks(&d.state_dir, &[id.as_str()]);

    let id2 = create(&d, policy(EgressMode::Open, &[])).await;
    d.kill9();
    // The kernel frees the namespaces, and their veth pairs, with the
    // daemon's processes (asynchronously, and slowly on a busy host); the
    // table waits for the restart.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !links_of(&t).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(links_of(&t), Vec::<String>::new(), "links after kill -9");
    d.restart().await;
    assert!(table_exists(&t), "the restarted daemon has its table again");
    assert_no_leaks(&d.state_dir, &[id2.as_str()]);
    d.stop();
    assert_eq!(links_of(&t), Vec::<String>::new(), "links after shutdown");
    assert!(!table_exists(&t), "the table outlived the daemon");
    let netns = std::fs::read_dir("/run/netns")
        .map(|r| r.count())
        .unwrap_or(0);
    let named: Vec<_> = std::fs::read_dir("/run/netns")
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        named
            .iter()
            .all(|n| !n.starts_with("mf-") && !n.starts_with("mayfly")),
        "{netns} named namespaces: {named:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_with_network_serves_creates_with_egress_and_applies_their_policy() {
    let out = Outside::start();
    let d = daemon_for(&out, &["--pool", "host=2,network=on"]).await;
    d.wait_pool("host", |p| p.ready == 2 && p.network).await;
    let info = d
        .create_with(&CreateRequest {
            egress: Some(policy(EgressMode::Allow, &["allowed.test:80"])),
            ..CreateRequest::default()
        })
        .await;
    assert_eq!(info.source, mayfly_types::SandboxSource::Pool, "{info:?}");
    expect(&d, &info.id, &["http", "allowed.test", "80"], "OK").await;
    expect(&d, &info.id, &["resolve", "other.test", "0"], "BLOCKED").await;
    // A create without egress does not take a pool sandbox with network.
    let none = d.create().await;
    assert_ne!(none.source, mayfly_types::SandboxSource::Pool);
    let ifaces = d
        .sh(
            &none.id,
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        )
        .await;
    assert_eq!(ifaces.trim(), "lo");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_table_of_a_daemon_gone_for_good_is_removed_by_the_next_daemon_to_start() {
    let out = Outside::start();
    // A table of a tag no daemon has a lease file for: an owner nobody can
    // judge (say, an older daemon), to be left alone.
    let unknown = "mayfly-fe0d";
    let _ = std::fs::remove_file("/run/mayfly/net-slots/table-fe0d");
    let doc =
        format!(r#"{{"nftables":[{{"add":{{"table":{{"family":"inet","name":"{unknown}"}}}}}}]}}"#);
    mayfly_sys::nft::apply_json(&doc).expect("adding a table");

    let mut gone = daemon_for(&out, &[]).await;
    let live = daemon_for(&out, &[]).await;
    let (t, lt) = (tag(&gone), tag(&live));
    assert!(table_exists(&t) && table_exists(&lt));
    gone.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !links_of(&t).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(links_of(&t), Vec::<String>::new(), "links after kill -9");
    assert!(
        table_exists(&t),
        "nothing removes the table before a daemon starts"
    );

    // Its state directory is never served again; the next daemon to start
    // on the host removes the table, and nothing of the live daemon's.
    let next = daemon_for(&out, &[]).await;
    let left_unknown = table_exists("fe0d");
    mayfly_sys::nft::delete_inet_table(unknown).expect("removing the test's table");
    assert!(!table_exists(&t), "the dead daemon's table is still there");
    assert!(table_exists(&lt), "the live daemon's table was removed");
    assert!(table_exists(&tag(&next)));
    assert!(
        !links_of(&lt).is_empty(),
        "the live daemon's links were removed"
    );
    assert!(left_unknown, "a table with no lease file was removed");
}
