//! Deadlines against a real daemon: the TTL kills even while commands run,
//! idle sandboxes are reaped but busy ones are not, keepalive extends, and
//! a draining shutdown serves live sandboxes while refusing new ones;
//! traffic on a TCP forward or a relayed WebSocket counts as activity.

mod common;
#[path = "gateway/support.rs"]
mod support;

use std::time::{Duration, Instant};

use common::*;
use mayfly_client::ClientError;
use mayfly_types::{CreateRequest, ErrorCode, SandboxId, SandboxInfo, SandboxState};

/// Polls the record until it is terminal; fails if `within` passes first.
async fn wait_ended(d: &Daemon, id: &SandboxId, within: Duration) -> SandboxInfo {
    let t = Instant::now();
    loop {
        let info = d.client.get(id).await.expect("get");
        if info.state.is_terminal() {
            return info;
        }
        assert!(
            t.elapsed() < within,
            "{id} did not end within {within:?}: {info:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn code(e: ClientError) -> ErrorCode {
    match e {
        ClientError::Api { error, .. } => error.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_ttl_kills_a_sandbox_even_while_a_command_runs() {
    let d = Daemon::start().await;
    let sb = d
        .create_with(&CreateRequest {
            ttl_secs: Some(2),
            ..CreateRequest::default()
        })
        .await;
    let t = Instant::now();
    let r = d.client.exec(&sb.id, &cmd(&["sleep", "60"])).await;
    let took = t.elapsed();
    // Far below the 60 s the command would run: the TTL ended it.
    assert!(
        took < Duration::from_secs(20),
        "the command outlived the 2 s TTL: it ran {took:?}: {r:?}"
    );
    if let Ok(r) = &r {
        assert_eq!(r.status.signal, Some(9), "{r:?}");
    }
    let info = wait_ended(&d, &sb.id, Duration::from_secs(15)).await;
    assert_eq!(info.state, SandboxState::Destroyed, "{info:?}");
    assert_eq!(info.reason.as_deref(), Some("ttl"));
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}

#[tokio::test]
async fn an_idle_sandbox_is_reaped_but_a_busy_one_is_not() {
    let d = Daemon::start_with(&["--idle-timeout", "1s"]).await;
    let idle = d.create().await;
    // Per-create: 0 turns the daemon's default off.
    let never = d
        .create_with(&CreateRequest {
            idle_timeout_secs: Some(0),
            ..CreateRequest::default()
        })
        .await;
    // Each busy sandbox gets its command as soon as it is made: it is idle
    // until then, and a create on a busy host can take a second.
    let fg = d.create().await;
    // A foreground command keeps its sandbox busy for 3 s.
    let fg_exec = {
        let (c, id) = (d.client.clone(), fg.id.clone());
        tokio::spawn(async move { c.exec(&id, &cmd(&["sleep", "3"])).await })
    };
    let bg = d.create().await;
    // A background process keeps its sandbox busy while it runs.
    d.client
        .start_process(
            &bg.id,
            &mayfly_types::StartProcessRequest {
                argv: vec!["sleep".into(), "3".into()],
                ..Default::default()
            },
        )
        .await
        .expect("starting a background process");
    let info = wait_ended(&d, &idle.id, Duration::from_secs(15)).await;
    assert_eq!(info.state, SandboxState::Destroyed, "{info:?}");
    assert_eq!(info.reason.as_deref(), Some("idle"));
    // 1.5 s past the idle timeout, the busy ones live.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in [&fg.id, &bg.id, &never.id] {
        let info = d.client.get(id).await.expect("get");
        assert_eq!(
            info.state,
            SandboxState::Ready,
            "{id} was reaped while busy"
        );
    }
    let r = fg_exec.await.expect("join").expect("the exec finishes");
    assert_eq!(r.status.exit_code, Some(0));
    // Once their commands end, they go idle and are reaped too.
    for id in [&fg.id, &bg.id] {
        let info = wait_ended(&d, id, Duration::from_secs(15)).await;
        assert_eq!(info.reason.as_deref(), Some("idle"), "{info:?}");
    }
    assert_eq!(
        d.client.get(&never.id).await.expect("get").state,
        SandboxState::Ready
    );
}

#[tokio::test]
async fn keepalive_extends_the_deadline_and_refuses_bad_input() {
    let d = Daemon::start_with(&["--max-ttl", "1h"]).await;
    let sb = d
        .create_with(&CreateRequest {
            ttl_secs: Some(2),
            ..CreateRequest::default()
        })
        .await;
    let info = d
        .client
        .keepalive(&sb.id, Some(30))
        .await
        .expect("keepalive");
    assert!(
        info.expires_at >= sb.expires_at + 25_000,
        "{} -> {}",
        sb.expires_at,
        info.expires_at
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        d.client.get(&sb.id).await.expect("get").state,
        SandboxState::Ready,
        "the sandbox died at its old deadline"
    );
    // Without a TTL it only counts as activity.
    let same = d.client.keepalive(&sb.id, None).await.expect("keepalive");
    assert_eq!(same.expires_at, info.expires_at);
    assert_eq!(
        code(d.client.keepalive(&sb.id, Some(7200)).await.unwrap_err()),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(d.client.keepalive(&sb.id, Some(0)).await.unwrap_err()),
        ErrorCode::InvalidArgument
    );
    let unknown: SandboxId = "mf-aaaaaaaaaaaa".parse().unwrap();
    assert_eq!(
        code(d.client.keepalive(&unknown, None).await.unwrap_err()),
        ErrorCode::NotFound
    );
    d.client.destroy(&sb.id).await.expect("destroy");
    let e = d.client.keepalive(&sb.id, None).await.unwrap_err();
    assert!(
        matches!(code(e), ErrorCode::Conflict | ErrorCode::NotFound),
        "keepalive on a destroyed sandbox"
    );
    assert_eq!(
        code(
            d.client
                .create(&CreateRequest {
                    idle_timeout_secs: Some(7200),
                    ..CreateRequest::default()
                })
                .await
                .unwrap_err()
        ),
        ErrorCode::InvalidArgument
    );
}

#[tokio::test]
async fn a_draining_shutdown_serves_live_sandboxes_and_refuses_new_ones() {
    let mut d = Daemon::start_with(&[
        "--shutdown",
        "drain",
        "--shutdown-grace",
        "20s",
        "--pool",
        "host=1",
    ])
    .await;
    let sb = d.create().await;
    // The pool holds an unclaimed sandbox for the drain to take.
    d.wait_pool("host", |p| p.ready == 1 && p.filling == 0)
        .await;
    // SAFETY: kill(2) on the daemon's pid, a child of this test we have not reaped.
    unsafe { libc::kill(d.pid as i32, libc::SIGTERM) };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(d.is_running(), "the daemon did not wait for its sandbox");
    let e = d
        .client
        .create(&CreateRequest::default())
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::Unavailable);
    assert_eq!(d.sh(&sb.id, "echo still here").await, "still here\n");
    d.client.destroy(&sb.id).await.expect("destroy");
    // Well within the 20 s grace, which would end it anyway.
    let t = Instant::now();
    while d.is_running() && t.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !d.is_running(),
        "the daemon kept running 15 s after its last sandbox ended; log:\n{}",
        d.log()
    );
    let state = d.state_dir.clone();
    let store = mayfly_store::Store::open(&state).expect("store");
    let recs = store.list_sandboxes(true).expect("records");
    assert!(recs.iter().all(|r| r.state.is_terminal()), "{recs:?}");
    let mine = recs.iter().find(|r| r.id == sb.id).expect("its record");
    assert_eq!(mine.reason.as_deref(), Some("user"));
    // The pool's unclaimed sandbox went with the drain.
    assert!(recs
        .iter()
        .any(|r| r.tenant.is_none() && r.reason.as_deref() == Some("daemon_shutdown")));
    let ids: Vec<String> = recs.iter().map(|r| r.id.to_string()).collect();
    assert_no_leaks(&state, &ids);
}

/// A request in flight does not hold a shutdown up: a command with no
/// timeout (`sleep` for a day) ends with its sandbox, in both modes (a
/// drain after its grace), and the record says `daemon_shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_does_not_wait_for_a_request_in_flight() {
    for args in [
        &[][..],
        &["--shutdown", "drain", "--shutdown-grace", "1s"][..],
    ] {
        let mut d = Daemon::start_with(args).await;
        let sb = d.create().await;
        let (client, id) = (d.client.clone(), sb.id.clone());
        let exec =
            tokio::spawn(async move { client.exec(&id, &common::cmd(&["sleep", "86400"])).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!exec.is_finished(), "{args:?}: the exec is running");
        let t = Instant::now();
        // SAFETY: kill(2) on the daemon's pid, a child of this test we have not reaped.
        unsafe { libc::kill(d.pid as i32, libc::SIGTERM) };
        while d.is_running() && t.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !d.is_running(),
            "{args:?}: the daemon still runs 20 s after SIGTERM; log:\n{}",
            d.log()
        );
        let r = tokio::time::timeout(Duration::from_secs(5), exec)
            .await
            .expect("the exec's request ended with the daemon")
            .expect("join");
        if let Ok(out) = r {
            assert_ne!(out.status.exit_code, Some(0), "{args:?}: {out:?}");
        }
        let store = mayfly_store::Store::open(&d.state_dir).expect("store");
        let recs = store.list_sandboxes(true).expect("records");
        let mine = recs.iter().find(|r| r.id == sb.id).expect("its record");
        assert_eq!(mine.reason.as_deref(), Some("daemon_shutdown"), "{args:?}");
        let ids: Vec<String> = recs.iter().map(|r| r.id.to_string()).collect();
        assert_no_leaks(&d.state_dir, &ids);
    }
}

/// Starts server.py in `id` in a session of its own (`setsid -f`), not as
/// a background process the daemon tracks (one would keep the sandbox busy
/// by itself), the way a template's service (a Postgres, say) runs, and
/// waits until `port` accepts.
async fn serve_detached(d: &Daemon, id: &SandboxId, port: u16) {
    d.client
        .write_file(
            id,
            "/workspace/server.py",
            support::SERVER_PY.as_bytes().to_vec(),
            Some(0o644),
        )
        .await
        .expect("writing server.py");
    // The command waits until the server listens: its session is killed
    // when it ends, and `setsid -f`'s child may not have left it yet.
    let line = format!(
        "setsid -f python3 /workspace/server.py inside {port} </dev/null >/dev/null 2>&1\n\
         python3 -c \"import socket, time\n\
         for _ in range(600):\n    \
         try:\n        socket.create_connection(('127.0.0.1', {port}), 0.2); break\n    \
         except OSError: time.sleep(0.05)\""
    );
    let r = d.client.exec(id, &cmd(&["sh", "-c", &line])).await;
    assert_eq!(r.expect("exec").status.exit_code, Some(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.client.connect_port(id, port).await.is_err() {
        assert!(Instant::now() < deadline, "no server on {port} in {id}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn traffic_on_a_forward_or_a_websocket_keeps_a_sandbox_from_idling_out() {
    let (d, gw) = support::daemon().await;
    let req = CreateRequest {
        ttl_secs: Some(1800),
        idle_timeout_secs: Some(3),
        ..CreateRequest::default()
    };
    let (fwd, ws) = (d.create_with(&req).await, d.create_with(&req).await);
    serve_detached(&d, &fwd.id, 8000).await;
    serve_detached(&d, &ws.id, 8000).await;
    d.client.expose(&ws.id, 8000, true).await.expect("expose");
    // A WebSocket through a TCP forward, and one through the gateway,
    // each opened right after a keepalive (a cold create and a server's
    // start on a busy host can take longer than an idle timeout).
    d.client.keepalive(&fwd.id, None).await.expect("keepalive");
    let mut a = d.client.connect_port(&fwd.id, 8000).await.expect("forward");
    support::ws_open(&mut a, "inside").await;
    d.client.keepalive(&ws.id, None).await.expect("keepalive");
    let mut b = tokio::net::TcpStream::connect(("127.0.0.1", gw))
        .await
        .expect("gateway");
    support::ws_open(&mut b, &format!("8000-{}.localhost", ws.id)).await;
    // Over two idle timeouts with a frame each way every 250 ms and no API
    // request: only the traffic keeps the two alive.
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(7) {
        support::ws_echo(&mut a, &format!("forward {n}")).await;
        support::ws_echo(&mut b, &format!("gateway {n}")).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for id in [&fwd.id, &ws.id] {
        let info = d.client.get(id).await.expect("get");
        assert_eq!(
            info.state,
            SandboxState::Ready,
            "{id} idled out while its connection carried {n} frames: {info:?}"
        );
    }
    // Silent, with both connections still open: both idle out.
    for id in [&fwd.id, &ws.id] {
        let info = wait_ended(&d, id, Duration::from_secs(15)).await;
        assert_eq!(info.reason.as_deref(), Some("idle"), "{info:?}");
    }
    drop((a, b));
    assert_no_leaks(&d.state_dir, &[fwd.id.as_str(), ws.id.as_str()]);
}
