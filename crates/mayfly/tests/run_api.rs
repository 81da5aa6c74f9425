//! `POST /v1/run` (one command in a sandbox made for it) and the claim
//! record written after a pool claim is answered.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use mayfly_client::ClientError;
use mayfly_types::{CreateRequest, ErrorCode, ExecEvent, RunRequest, SandboxSource, SandboxState};

fn run_req(argv: &[&str]) -> RunRequest {
    RunRequest {
        sandbox: CreateRequest {
            labels: BTreeMap::from([("task".into(), "run-api".into())]),
            ..CreateRequest::default()
        },
        exec: cmd(argv),
    }
}

/// The store's record of `id`, read directly.
fn record(d: &Daemon, id: &mayfly_types::SandboxId) -> mayfly_store::SandboxRecord {
    mayfly_store::Store::open(&d.state_dir)
        .expect("opening the store")
        .get_sandbox(id)
        .expect("reading the record")
        .unwrap_or_else(|| panic!("no record of {id}"))
}

/// Whether the store records no live sandbox that was handed out.
fn no_claimed_sandbox(d: &Daemon) -> bool {
    mayfly_store::Store::open(&d.state_dir)
        .and_then(|s| s.list_sandboxes(false))
        .map(|r| r.iter().all(|r| r.tenant.is_none()))
        .unwrap_or(false)
}

async fn wait_destroyed(d: &Daemon, id: &mayfly_types::SandboxId) {
    let done = eventually(Duration::from_secs(15), || {
        record(d, id).state == SandboxState::Destroyed && !d.sandbox_dir(id).exists()
    })
    .await;
    assert!(
        done,
        "{id} was not destroyed: {:?}; log:\n{}",
        record(d, id),
        d.log()
    );
    assert!(
        host::procs_in_sandbox(id.as_str()).is_empty(),
        "processes of {id} outlived it"
    );
}

#[tokio::test]
async fn a_run_streams_its_command_and_takes_its_sandbox_with_it() {
    let d = Daemon::start_with(&["--pool", "host=1"]).await;
    let (id, mut stream) = d
        .client
        .run(&run_req(&["sh", "-c", "echo out; echo err >&2; exit 7"]))
        .await
        .expect("run");
    let (mut out, mut err, mut code) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = stream.next_event().await.expect("the stream") {
        match ev {
            ExecEvent::Stdout(b) => out.extend_from_slice(&b),
            ExecEvent::Stderr(b) => err.extend_from_slice(&b),
            ExecEvent::Exit(r) => code = r.status.exit_code,
        }
    }
    assert_eq!(
        (text(&out), text(&err), code),
        ("out\n".into(), "err\n".into(), Some(7))
    );
    wait_destroyed(&d, &id).await;
    let rec = record(&d, &id);
    assert_eq!(rec.labels.get("task").map(String::as_str), Some("run-api"));
    assert_eq!(rec.reason.as_deref(), Some("user"));
    // `mayfly run` through the daemon takes the same path, exit code included.
    let out = d.run_cli(&["run", "--", "sh", "-c", "echo via-cli; exit 3"]);
    assert_eq!(expect_exit(&out, 3, "mayfly run"), "via-cli\n");
    assert!(
        eventually(Duration::from_secs(15), || no_claimed_sandbox(&d)).await,
        "a run's sandbox outlived it; log:\n{}",
        d.log()
    );
}

#[tokio::test]
async fn a_client_that_goes_away_mid_run_takes_the_sandbox_with_it() {
    let d = Daemon::start().await;
    let (id, mut stream) = d
        .client
        .run(&run_req(&["sh", "-c", "echo started; exec sleep 600"]))
        .await
        .expect("run");
    match stream.next_event().await.expect("the stream") {
        Some(ExecEvent::Stdout(b)) => assert_eq!(text(&b), "started\n"),
        other => panic!("expected the first output, got {other:?}"),
    }
    assert_eq!(
        d.client.get(&id).await.expect("get").state,
        SandboxState::Ready
    );
    drop(stream);
    wait_destroyed(&d, &id).await;
}

#[tokio::test]
async fn a_bad_run_is_refused_and_leaves_nothing() {
    let d = Daemon::start().await;
    let code = |e: ClientError| match e {
        ClientError::Api { status, error } => (status, error.code),
        other => panic!("expected an API error, got {other:?}"),
    };
    // A command that cannot start: the sandbox made for it goes at once.
    let e = d
        .client
        .run(&run_req(&["/no/such/program"]))
        .await
        .map(|_| ())
        .unwrap_err();
    let (status, c) = code(e);
    assert!((400..500).contains(&status), "{status} {c:?}");
    // An empty argv and bad limits are 400s.
    let (status, _) = code(d.client.run(&run_req(&[])).await.map(|_| ()).unwrap_err());
    assert_eq!(status, 400);
    let mut bad = run_req(&["true"]);
    bad.sandbox.ttl_secs = Some(0);
    let (status, c) = code(d.client.run(&bad).await.map(|_| ()).unwrap_err());
    assert_eq!((status, c), (400, ErrorCode::InvalidArgument));
    // Unknown fields and a body that is not JSON.
    for body in [r#"{"exec":{"argv":["true"]},"extra":1}"#, "not json", "{}"] {
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--unix-socket",
            ])
            .arg(&d.socket)
            .args(["-H", "content-type: application/json", "-d", body])
            .arg("http://mayfly/v1/run")
            .output()
            .expect("curl");
        let status = text(&out.stdout);
        assert!(
            status.starts_with('4'),
            "POST /v1/run with {body:?} answered {status}"
        );
    }
    assert!(
        eventually(Duration::from_secs(15), || no_claimed_sandbox(&d)).await,
        "a refused run left a sandbox; log:\n{}",
        d.log()
    );
    // Every sandbox the runs made is destroyed, and its directory gone.
    let all = mayfly_store::Store::open(&d.state_dir)
        .and_then(|s| s.list_sandboxes(true))
        .expect("listing every record");
    let made: Vec<_> = all.iter().filter(|r| r.tenant.is_some()).collect();
    assert_eq!(made.len(), 2, "the two runs that got a sandbox: {made:?}");
    for r in made {
        wait_destroyed(&d, &r.id).await;
    }
}

/// A claim is answered before its record is written; whatever reads or
/// ends the sandbox right after still sees the claim.
#[tokio::test]
async fn a_claim_is_recorded_before_anything_reads_or_ends_it() {
    let d = Daemon::start_with(&["--pool", "host=4,concurrency=2"]).await;
    for round in 0..8 {
        // Wait on the pool's own count: a pooled record can be in the
        // store while its sandbox still boots, and a create then is cold.
        d.wait_pool("host", |p| p.ready >= 1).await;
        let label = format!("r{round}");
        let sb = d
            .create_with(&CreateRequest {
                labels: BTreeMap::from([("round".into(), label.clone())]),
                ..CreateRequest::default()
            })
            .await;
        assert_eq!(sb.source, SandboxSource::Pool, "round {round}: {sb:?}");
        if round % 2 == 0 {
            let got = d
                .client
                .get(&sb.id)
                .await
                .expect("get right after the claim");
            assert_eq!(got.tenant.as_deref(), Some("default"));
            assert_eq!(got.labels.get("round"), Some(&label));
            assert_eq!(got.created_at, sb.created_at);
            assert_eq!(got.expires_at, sb.expires_at);
        }
        d.client
            .destroy(&sb.id)
            .await
            .expect("destroy right after the claim");
        let rec = record(&d, &sb.id);
        assert_eq!(rec.tenant.as_deref(), Some("default"), "{rec:?}");
        assert_eq!(rec.labels.get("round"), Some(&label), "{rec:?}");
        assert!(rec.claimed_at.is_some(), "{rec:?}");
        assert_eq!(rec.reason.as_deref(), Some("user"), "{rec:?}");
    }
    let events = d.client.events(0, 10_000).await.expect("events");
    let claimed = events.iter().filter(|e| e.kind == "claimed").count();
    assert_eq!(claimed, 8, "claimed events: {events:?}");
}
