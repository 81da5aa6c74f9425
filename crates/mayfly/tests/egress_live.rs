//! Live egress changes against a real daemon and real servers: a `PATCH`
//! cuts the open connections its new policy no longer admits (and keeps
//! the others), one during a connection's setup applies to it, a destroy
//! cuts every connection of the sandbox, and the bandwidth cap holds end
//! to end.

mod common;
#[path = "egress/support.rs"]
mod support;

use std::time::{Duration, Instant};

use common::{cmd, eventually};
use mayfly_types::{EgressMode, ExecRequest};
use support::*;

/// Holds a connection to port 7000 (a server that never answers) and says
/// how it ended, in seconds since it was opened.
const HOLD: &str = "import socket, sys, time\n\
s = socket.create_connection((sys.argv[1], 7000), timeout=3)\n\
t = time.time()\n\
s.sendall(b'x')\n\
s.settimeout(20)\n\
try:\n    d = s.recv(100)\n    print('closed %r after %.2f' % (d, time.time() - t))\n\
except socket.timeout:\n    print('open after %.2f' % (time.time() - t))\n\
except OSError as e:\n    print('cut %s after %.2f' % (type(e).__name__, time.time() - t))\n";

/// Reads port 7001 (4 MiB once it got a byte, then close) to the end:
/// `bytes seconds`.
const DRAIN: &str = "import socket, sys, time\n\
s = socket.create_connection((sys.argv[1], 7001), timeout=3)\n\
s.sendall(b'x')\n\
s.settimeout(30)\n\
t = time.time(); n = 0\n\
while True:\n    d = s.recv(1 << 16)\n    if not d: break\n    n += len(d)\n\
print(n, '%.3f' % (time.time() - t))\n";

/// Opens a connection to port 7002 (a server that never answers nor
/// closes) and holds it.
const SILENT: &str = "import socket, sys, time\n\
s = socket.create_connection((sys.argv[1], 7002), timeout=3)\n\
s.sendall(b'x')\n\
print('connected', flush=True)\n\
time.sleep(120)\n";

/// Connects to allowed.test:80, says so in /workspace/connected, and sends
/// its request only once /workspace/go exists.
const SLOW_HOST: &str = "import os, socket, time\n\
s = socket.create_connection(('allowed.test', 80), timeout=3)\n\
open('/workspace/connected', 'w').close()\n\
t = time.time()\n\
while not os.path.exists('/workspace/go') and time.time() - t < 30: time.sleep(0.02)\n\
try:\n    s.sendall(b'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n'); s.settimeout(3)\n    d = s.recv(100)\n    print('OK' if d.startswith(b'HTTP/1.0 200') else 'BLOCKED %r' % d)\n\
except OSError as e:\n    print('BLOCKED', type(e).__name__)\n";

fn after_secs(text: &str) -> f64 {
    text.rsplit(' ')
        .next()
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("no time in {text:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_patch_cuts_open_connections_it_no_longer_admits_and_keeps_the_rest() {
    let out = Outside::start();
    let d = daemon_for(&out, &[]).await;
    let held = format!("{}/32:7000", out.addr);
    let id = create(&d, policy(EgressMode::Allow, &[&held])).await;
    let req = ExecRequest {
        argv: ["python3", "-c", HOLD, &out.addr]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        timeout_ms: Some(60_000),
        ..ExecRequest::default()
    };
    let (c, sb) = (d.client.clone(), id.clone());
    let run = tokio::spawn(async move { c.exec(&sb, &req).await });
    let t = Instant::now();
    while out.hits("tcp 7000") == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the held connection never reached the outside: {}",
            out.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = Instant::now();
    // Still admitted: an entry more. The connection must stay.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wider = policy(EgressMode::Allow, &[&held, "other.test:80"]);
    d.client.set_egress(&id, &wider).await.expect("patch 1");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // No longer admitted: the connection must be cut now.
    let patched = opened.elapsed().as_secs_f64();
    let narrower = policy(EgressMode::Allow, &["other.test:80"]);
    d.client.set_egress(&id, &narrower).await.expect("patch 2");
    let r = tokio::time::timeout(Duration::from_secs(40), run)
        .await
        .expect("the held connection's command did not end")
        .expect("join")
        .expect("exec");
    let text = String::from_utf8_lossy(&r.stdout.0).trim().to_owned();
    eprintln!("held connection: {text} (patch 2 sent {patched:.2} s after it opened)");
    assert!(
        text.starts_with("cut ConnectionResetError"),
        "the connection was not reset by the narrowing PATCH: {text:?} {}",
        String::from_utf8_lossy(&r.stderr.0)
    );
    let at = after_secs(&text);
    assert!(
        at >= 1.2,
        "the connection was cut at {at:.2} s, before the PATCH that no longer admits it \
         (sent at {patched:.2} s): the one that still admitted it cut it"
    );
    // New connections follow the new policy too.
    expect(&d, &id, &["raw", &out.addr, "7000"], "BLOCKED").await;
    expect(&d, &id, &["http", "other.test", "80"], "OK").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_bandwidth_cap_holds_end_to_end() {
    let out = Outside::start();
    let d = daemon_for(&out, &[]).await;
    let entry = format!("{}/32:7001", out.addr);
    let fast = create(&d, policy(EgressMode::Allow, &[&entry])).await;
    let mut capped = policy(EgressMode::Allow, &[&entry]);
    capped.bandwidth_bytes_per_sec = Some(1 << 20);
    let slow = create(&d, capped).await;
    let mut secs = Vec::new();
    for id in [&fast, &slow] {
        let r = d.exec(id, &["python3", "-c", DRAIN, &out.addr]).await;
        let text = String::from_utf8_lossy(&r.stdout.0).trim().to_owned();
        let (bytes, s) = text
            .split_once(' ')
            .unwrap_or_else(|| panic!("{text:?} {}", String::from_utf8_lossy(&r.stderr.0)));
        assert_eq!(bytes, (4 << 20).to_string(), "every byte arrives");
        secs.push(s.parse::<f64>().expect("seconds"));
    }
    eprintln!(
        "4 MiB: uncapped {:.3} s, capped at 1 MiB/s {:.3} s",
        secs[0], secs[1]
    );
    // The bucket holds one second of bytes: 1 MiB at once, 3 MiB at 1 MiB/s.
    assert!(
        (2.7..12.0).contains(&secs[1]),
        "4 MiB under a 1 MiB/s cap took {:.3} s",
        secs[1]
    );
    assert!(
        secs[0] < secs[1] / 2.0,
        "the uncapped sandbox was not faster: {secs:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn destroying_a_sandbox_cuts_its_connections_to_a_silent_server() {
    let out = Outside::start();
    let d = daemon_for(&out, &[]).await;
    let id = create(
        &d,
        policy(EgressMode::Allow, &[&format!("{}/32:7002", out.addr)]),
    )
    .await;
    let req = ExecRequest {
        argv: ["python3", "-c", SILENT, &out.addr]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        timeout_ms: Some(120_000),
        ..ExecRequest::default()
    };
    let (c, sb) = (d.client.clone(), id.clone());
    let run = tokio::spawn(async move { c.exec(&sb, &req).await });
    let held = eventually(Duration::from_secs(20), || {
        out.hits("tcp 7002") == 1 && sockets_to(d.pid, &out.addr, 7002) == 1
    })
    .await;
    assert!(
        held,
        "the connection never reached the outside: {}",
        out.log()
    );
    d.client.destroy(&id).await.expect("destroy");
    let t = Instant::now();
    let freed = eventually(Duration::from_secs(15), || {
        sockets_to(d.pid, &out.addr, 7002) == 0
    })
    .await;
    eprintln!(
        "the daemon's upstream socket went {:?} after the destroy",
        t.elapsed()
    );
    assert!(
        freed,
        "the daemon still holds its connection to a silent server 15 s after the destroy"
    );
    let reset = eventually(Duration::from_secs(5), || out.hits("reset 7002") == 1).await;
    assert!(
        reset,
        "the server never saw the connection reset: {}",
        out.log()
    );
    let _ = run.await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_patch_while_a_connection_is_being_set_up_applies_to_it() {
    let out = Outside::start();
    let d = daemon_for(&out, &[]).await;
    let id = create(&d, policy(EgressMode::Allow, &["allowed.test:80"])).await;
    let req = ExecRequest {
        timeout_ms: Some(60_000),
        ..cmd(&["python3", "-c", SLOW_HOST])
    };
    let (c, sb) = (d.client.clone(), id.clone());
    let run = tokio::spawn(async move { c.exec(&sb, &req).await });
    let t = Instant::now();
    while d
        .sh(&id, "test -e /workspace/connected && echo yes || true")
        .await
        .trim()
        != "yes"
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the client never connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The proxy has admitted the connection by its address and waits for
    // its Host; now the destination's address is denied.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut denied = policy(EgressMode::Allow, &["allowed.test:80"]);
    denied.deny = vec![format!("{}/32", out.addr).parse().expect("entry")];
    d.client.set_egress(&id, &denied).await.expect("patch");
    d.client
        .write_file(&id, "/workspace/go", "go", Some(0o644))
        .await
        .expect("writing /workspace/go");
    let r = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the client did not end")
        .expect("join")
        .expect("exec");
    let text = String::from_utf8_lossy(&r.stdout.0).trim().to_owned();
    assert!(
        text.starts_with("BLOCKED"),
        "a connection set up across a PATCH that denies it got through: {text:?} {}",
        String::from_utf8_lossy(&r.stderr.0)
    );
    assert_eq!(out.hits("tcp 80"), 0, "{}", out.log());
}
