//! The client against the real server (in-process, on a temporary unix socket
//! or loopback TCP) over the fake engine.

#[path = "../../mayfly-server/tests/support/fake.rs"]
mod fake;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fake::FakeEngine;
use mayfly_client::{Client, ClientError};
use mayfly_server::{app, bind_tcp, bind_unix, serve, ServerOptions};
use mayfly_types::{
    Bytes64, CreateRequest, ErrorCode, ExecEvent, ExecRequest, FileKind, Limits, MkdirRequest,
    ProcessState, RenameRequest, SandboxId, SandboxState, StartProcessRequest,
};
use tokio::sync::oneshot;

/// A daemon on a temporary unix socket, stopped on drop.
struct Daemon {
    _dir: tempfile::TempDir,
    sock: PathBuf,
    fake: Arc<FakeEngine>,
    _stop: oneshot::Sender<()>,
}

async fn daemon() -> Daemon {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("mayfly.sock");
    let fake = FakeEngine::new();
    let l = bind_unix(&sock).await.expect("bind");
    let (stop, rx) = oneshot::channel::<()>();
    tokio::spawn(serve(
        app(fake.clone(), ServerOptions::default()),
        vec![l],
        async move {
            let _ = rx.await;
        },
    ));
    Daemon {
        _dir: dir,
        sock,
        fake,
        _stop: stop,
    }
}

fn argv(args: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: args.iter().map(|s| s.to_string()).collect(),
        ..ExecRequest::default()
    }
}

#[tokio::test]
async fn sandboxes_round_trip_create_get_list_destroy() {
    let d = daemon().await;
    let c = Client::unix(&d.sock);
    assert!(c.health().await.expect("health"));
    let req = CreateRequest {
        ttl_secs: Some(30),
        limits: Limits {
            pids: Some(64),
            ..Limits::default()
        },
        ..CreateRequest::default()
    };
    let sb = c.create(&req).await.expect("create");
    assert_eq!(sb.limits.pids, 64);
    assert_eq!(c.get(&sb.id).await.expect("get"), sb);
    assert_eq!(c.list(false).await.expect("list"), vec![sb.clone()]);
    let gone = c.destroy(&sb.id).await.expect("destroy");
    assert_eq!(gone.state, SandboxState::Destroyed);
    assert_eq!(
        c.destroy(&sb.id).await.expect("destroy again").state,
        SandboxState::Destroyed
    );
    assert!(c.list(false).await.expect("list").is_empty());
    assert_eq!(c.list(true).await.expect("list all").len(), 1);
}

#[tokio::test]
async fn api_errors_carry_the_servers_code_status_and_message() {
    let d = daemon().await;
    let c = Client::unix(&d.sock);
    let missing: SandboxId = "mf-abcdefghjkmn".parse().expect("valid id");
    match c.get(&missing).await {
        Err(e @ ClientError::Api { status: 404, .. }) => {
            assert_eq!(e.code(), Some(ErrorCode::NotFound));
            assert!(e.is_not_found());
            assert!(e.to_string().contains("mf-abcdefghjkmn"), "{e}");
        }
        other => panic!("expected a 404, got {other:?}"),
    }
    let bad = CreateRequest {
        limits: Limits {
            memory_bytes: Some(1),
            ..Limits::default()
        },
        ..CreateRequest::default()
    };
    let e = c.create(&bad).await.expect_err("tiny memory is refused");
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument));

    let sb = c.create(&CreateRequest::default()).await.expect("create");
    let e = c
        .exec(&sb.id, &argv(&["nosuch"]))
        .await
        .expect_err("cannot start");
    assert!(matches!(e, ClientError::Api { status: 422, .. }), "{e:?}");
}

#[tokio::test]
async fn exec_is_byte_exact_and_audited() {
    let d = daemon().await;
    let c = Client::unix(&d.sock);
    let sb = c.create(&CreateRequest::default()).await.expect("create");
    let all: Vec<u8> = (0..=255u8).collect();
    let req = ExecRequest {
        stdin: Some(Bytes64(all.clone())),
        ..argv(&["cat"])
    };
    let r = c.exec(&sb.id, &req).await.expect("exec");
    assert_eq!(r.stdout.0, all);
    assert_eq!(r.status.exit_code, Some(0));
    let r = c.exec(&sb.id, &argv(&["exit", "3"])).await.expect("exec");
    assert_eq!(r.status.exit_code, Some(3));

    let audit = c.audit(&sb.id).await.expect("audit");
    assert_eq!(audit.len(), 2);
    assert!(audit[0].caller.starts_with("unix:uid="), "{:?}", audit[0]);
    let events = c.events(0, 10).await.expect("events");
    assert_eq!(events.len(), 1);
    assert!(c.events(1, 10).await.expect("events").is_empty());
}

#[tokio::test]
async fn exec_stream_yields_events_as_they_are_produced() {
    let d = daemon().await;
    let c = Client::unix(&d.sock);
    let sb = c.create(&CreateRequest::default()).await.expect("create");
    let mut s = c
        .exec_stream(&sb.id, &argv(&["gated"]))
        .await
        .expect("stream");
    let first = tokio::time::timeout(Duration::from_secs(5), s.next_event())
        .await
        .expect("the first event arrives while the command is held back")
        .expect("no error");
    assert_eq!(first, Some(ExecEvent::Stdout(b"first".to_vec())));
    d.fake.open_gate();
    assert_eq!(
        s.next_event().await.expect("no error"),
        Some(ExecEvent::Stderr(b"second".to_vec()))
    );
    match s.next_event().await.expect("no error") {
        Some(ExecEvent::Exit(r)) => assert_eq!(r.status.exit_code, Some(0)),
        other => panic!("expected exit, got {other:?}"),
    }
    assert_eq!(s.next_event().await.expect("no error"), None);

    let r = c
        .exec_stream(&sb.id, &argv(&["echo", "hi"]))
        .await
        .expect("stream")
        .into_result()
        .await
        .expect("result");
    assert_eq!(r.stdout.0, b"hi\n");
}

#[tokio::test]
async fn a_stream_cut_short_by_the_sandbox_is_an_error_not_a_silent_end() {
    let d = daemon().await;
    let c = Client::unix(&d.sock);
    let sb = c.create(&CreateRequest::default()).await.expect("create");
    let mut s = c
        .exec_stream(&sb.id, &argv(&["vanish"]))
        .await
        .expect("stream");
    assert_eq!(
        s.next_event().await.expect("stdout"),
        Some(ExecEvent::Stdout(b"partial".to_vec()))
    );
    let e = s.next_event().await.expect_err("no exit status");
    assert_eq!(e.code(), Some(ErrorCode::Unavailable));
    assert_eq!(s.next_event().await.expect("ended"), None);

    let e = c
        .exec_stream(&sb.id, &argv(&["nosuch"]))
        .await
        .expect_err("cannot start");
    assert_eq!(e.code(), Some(ErrorCode::ExecFailed));
}

#[tokio::test]
async fn background_processes_round_trip() {
    let d = daemon().await;
    let c = Client::unix(&d.sock);
    let sb = c.create(&CreateRequest::default()).await.expect("create");
    let req = StartProcessRequest {
        argv: vec!["server".into(), "--port".into()],
        ..StartProcessRequest::default()
    };
    let p = c.start_process(&sb.id, &req).await.expect("start");
    assert_eq!(
        c.list_processes(&sb.id).await.expect("list"),
        vec![p.clone()]
    );
    let now = c
        .wait_process(&sb.id, p.handle, Some(0))
        .await
        .expect("wait");
    assert_eq!(now.state, ProcessState::Running);
    let out = c.process_output(&sb.id, p.handle).await.expect("output");
    assert_eq!(out.stdout.0, b"server --port");
    let k = c
        .signal_process(&sb.id, p.handle, Some(15))
        .await
        .expect("kill");
    assert_eq!(k.status.and_then(|s| s.signal), Some(15));
    let k = c
        .signal_process(&sb.id, p.handle, None)
        .await
        .expect("kill");
    assert_eq!(
        k.status.and_then(|s| s.signal),
        Some(9),
        "SIGKILL by default"
    );
    let done = c.wait_process(&sb.id, p.handle, None).await.expect("wait");
    assert_eq!(done.state, ProcessState::Exited);
    assert!(c
        .process_output(&sb.id, 99)
        .await
        .expect_err("no such")
        .is_not_found());
}

#[tokio::test]
async fn files_and_archives_round_trip() {
    let d = daemon().await;
    let c = Client::unix(&d.sock);
    let id = c
        .create(&CreateRequest::default())
        .await
        .expect("create")
        .id;
    let data: Vec<u8> = (0..=255u8).rev().collect();
    let path = "/work/odd name & ü?.bin";
    let st = c
        .write_file(&id, path, data.clone(), Some(0o600))
        .await
        .expect("write");
    assert_eq!((st.name.as_str(), st.mode), (path, 0o600));
    assert_eq!(c.read_file(&id, path).await.expect("read"), data);
    assert_eq!(c.stat(&id, path).await.expect("stat").size, 256);

    let dir = c
        .mkdir(
            &id,
            &MkdirRequest {
                path: "/work".into(),
                parents: true,
                mode: Some(0o700),
            },
        )
        .await
        .expect("mkdir");
    assert_eq!((dir.kind, dir.mode), (FileKind::Dir, 0o700));
    let names: Vec<String> = c
        .list_dir(&id, "/work")
        .await
        .expect("ls")
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names, ["odd name & ü?.bin"]);

    c.rename(
        &id,
        &RenameRequest {
            from: path.into(),
            to: "/work/b".into(),
        },
    )
    .await
    .expect("rename");
    assert_eq!(c.read_file(&id, "/work/b").await.expect("read"), data);
    c.remove(&id, "/work", true).await.expect("rm -r");
    assert!(c.read_file(&id, "/work/b").await.is_err());

    let tar = vec![9u8; 4096];
    let sum = c
        .upload_tar(&id, "/workspace", tar.clone())
        .await
        .expect("upload");
    assert_eq!(sum.bytes, 4096);
    assert_eq!(
        c.download_tar(&id, "/workspace").await.expect("download"),
        tar
    );

    let e = c
        .read_file(&id, "/../etc/shadow")
        .await
        .expect_err("escape");
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument));
}

#[tokio::test]
async fn the_openapi_document_is_fetched() {
    let d = daemon().await;
    let doc = Client::unix(&d.sock).openapi().await.expect("openapi");
    assert!(doc["paths"]["/v1/sandboxes"].is_object());
}

#[tokio::test]
async fn a_missing_socket_is_a_connect_error_naming_it() {
    let c = Client::unix("/nonexistent/mayfly.sock");
    match c.health().await {
        Err(e @ ClientError::Connect { .. }) => {
            assert!(e.to_string().contains("/nonexistent/mayfly.sock"), "{e}");
            let source = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_default();
            assert!(source.contains("No such file"), "{source}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

#[tokio::test]
async fn tcp_clients_send_their_token() {
    let l = bind_tcp("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let url = format!("http://{}", l.tcp_addr().expect("addr"));
    let opts = ServerOptions {
        tcp_token: Some("tok".into()),
        ..ServerOptions::default()
    };
    let (_stop, rx) = oneshot::channel::<()>();
    tokio::spawn(serve(app(FakeEngine::new(), opts), vec![l], async move {
        let _ = rx.await;
    }));
    let good = Client::tcp(&url, Some("tok")).expect("client");
    assert!(good.health().await.expect("health"));
    let sb = good
        .create(&CreateRequest::default())
        .await
        .expect("create");
    assert_eq!(good.audit(&sb.id).await.expect("audit"), vec![]);

    for bad in [Client::tcp(&url, None), Client::tcp(&url, Some("nope"))] {
        let e = bad.expect("client").health().await.expect_err("refused");
        assert!(matches!(e, ClientError::Api { status: 401, .. }), "{e:?}");
        assert_eq!(e.code(), Some(ErrorCode::Unauthenticated));
    }
}

/// Forwards connections to `target`, counting them.
async fn counting_proxy(dir: &Path, target: PathBuf) -> (PathBuf, Arc<AtomicUsize>) {
    let path = dir.join("proxy.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind proxy");
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::UnixStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (path, count)
}

#[tokio::test]
async fn sequential_calls_reuse_one_kept_alive_connection() {
    let d = daemon().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (proxy, connections) = counting_proxy(dir.path(), d.sock.clone()).await;
    let c = Client::unix(&proxy);
    let sb = c.create(&CreateRequest::default()).await.expect("create");
    for _ in 0..20 {
        c.exec(&sb.id, &argv(&["echo", "x"])).await.expect("exec");
    }
    // Errors are read to the end too, so they do not cost a connection.
    let _ = c.read_file(&sb.id, "/missing").await;
    c.get(&sb.id).await.expect("get");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_made_before_the_client_carries_its_first_request() {
    let d = daemon().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (proxy, connections) = counting_proxy(dir.path(), d.sock.clone()).await;
    // The CLI's check that a daemon answers, made with std before any client.
    let probe = std::os::unix::net::UnixStream::connect(&proxy).expect("probe");
    let c = Client::unix_connected(&proxy, Some(probe));
    let sb = c.create(&CreateRequest::default()).await.expect("create");
    c.exec(&sb.id, &argv(&["echo", "x"])).await.expect("exec");
    c.get(&sb.id).await.expect("get");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "the probe's connection served every request; no second one was made"
    );
}
