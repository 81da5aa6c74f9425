//! Exec semantics on the real daemon: exit codes, signals, timeouts, output
//! caps, byte-exact I/O, env/cwd/uid, streaming, background processes, audit.

mod common;

use std::time::{Duration, Instant};

use common::host::commands_left;
use common::{cmd, expect_exit, test_dir, text, Daemon};
use mayfly_types::{ErrorCode, ExecEvent, ExecRequest, ProcessState, StartProcessRequest};

#[tokio::test]
async fn exit_codes_propagate_through_api_cli_and_daemonless_run() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let r = d.exec(&sb.id, &["sh", "-c", "exit 42"]).await;
    assert_eq!(
        (r.status.exit_code, r.status.signal, r.status.timed_out),
        (Some(42), None, false)
    );
    let r = d.exec(&sb.id, &["true"]).await;
    assert_eq!(r.status.exit_code, Some(0));

    let out = d.run_cli(&["exec", sb.id.as_str(), "--", "sh", "-c", "exit 7"]);
    expect_exit(&out, 7, "mayfly exec of `exit 7`");

    let dir = test_dir();
    let out = common::daemonless(&dir, &["run", "--", "sh", "-c", "exit 3"]);
    expect_exit(&out, 3, "daemonless mayfly run of `exit 3`");
    common::daemonless::drain_spares(&dir);
}

#[tokio::test]
async fn a_signal_is_reported_instead_of_an_exit_code() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let r = d.exec(&sb.id, &["sh", "-c", "kill -TERM $$"]).await;
    assert_eq!(
        (r.status.exit_code, r.status.signal),
        (None, Some(15)),
        "{:?}",
        r.status
    );
    assert!(!r.status.timed_out);
    let out = d.run_cli(&["exec", sb.id.as_str(), "--", "sh", "-c", "kill -KILL $$"]);
    expect_exit(&out, 137, "mayfly exec of a SIGKILLed shell");
}

#[tokio::test]
async fn a_timeout_kills_the_command_and_its_background_children() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let req = ExecRequest {
        timeout_ms: Some(500),
        ..cmd(&["sh", "-c", "sleep 300 & sleep 300"])
    };
    let t = Instant::now();
    let r = d.exec_req(&sb.id, &req).await;
    let took = t.elapsed();
    assert!(r.status.timed_out, "{:?}", r.status);
    assert_eq!(r.status.signal, Some(9), "{:?}", r.status);
    assert!(
        took >= Duration::from_millis(450),
        "returned after only {took:?}"
    );
    // Far below the 300 s the command would run: the timeout ended it.
    assert!(took < Duration::from_secs(10), "returned after {took:?}");

    let mut left = Vec::new();
    let gone = common::eventually(Duration::from_secs(15), || {
        left = commands_left(sb.id.as_str(), sb.init_pid);
        left.is_empty()
    })
    .await;
    assert!(gone, "processes survived the timeout: {left:?}");
    // And from inside: no `sleep` anywhere in the pid namespace.
    let comms = d.sh(&sb.id, "cat /proc/[0-9]*/comm").await;
    assert!(
        !comms.contains("sleep"),
        "inside, /proc still shows: {comms}"
    );
}

#[tokio::test]
async fn a_background_child_dies_with_its_parent() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let t = Instant::now();
    let r = d
        .exec(&sb.id, &["sh", "-c", "sleep 300 & echo started"])
        .await;
    // Far below the 300 s of the background sleep: the exec did not wait.
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the exec waited {:?}",
        t.elapsed()
    );
    assert_eq!(r.status.exit_code, Some(0));
    assert_eq!(text(&r.stdout.0), "started\n");
    let mut left = Vec::new();
    let gone = common::eventually(Duration::from_secs(15), || {
        left = commands_left(sb.id.as_str(), sb.init_pid);
        left.is_empty()
    })
    .await;
    assert!(gone, "the background sleep outlived its parent: {left:?}");
}

#[tokio::test]
async fn huge_output_is_truncated_at_the_limit_with_the_flag_set() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let req = ExecRequest {
        output_limit: Some(1 << 20),
        ..cmd(&["head", "-c", "50000000", "/dev/zero"])
    };
    let r = d.exec_req(&sb.id, &req).await;
    assert_eq!(r.status.exit_code, Some(0));
    assert_eq!(r.stdout.0.len(), 1 << 20);
    assert!(r.stdout.0.iter().all(|b| *b == 0));
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout_bytes, 50_000_000);
    assert!(!r.stderr_truncated);
    assert_eq!(r.stderr_bytes, 0);
}

#[tokio::test]
async fn binary_output_and_stdin_are_byte_exact() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let py = "import sys; sys.stdout.buffer.write(bytes(range(256))*1000)";
    let r = d.exec(&sb.id, &["python3", "-c", py]).await;
    let want: Vec<u8> = (0..=255u8).cycle().take(256_000).collect();
    assert_eq!(r.status.exit_code, Some(0), "{}", text(&r.stderr.0));
    assert_eq!(r.stdout.0.len(), want.len());
    assert!(
        r.stdout.0 == want,
        "binary stdout differs from what was written"
    );

    // Random bytes (including NUL, 0xff and invalid UTF-8) through `cat`.
    let mut input = vec![0u8; 300_000];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    for b in input.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let req = ExecRequest {
        stdin: Some(input.clone().into()),
        ..cmd(&["cat"])
    };
    let r = d.exec_req(&sb.id, &req).await;
    assert_eq!(r.status.exit_code, Some(0));
    assert!(
        r.stdout.0 == input,
        "stdin did not come back unchanged through cat"
    );
    assert_eq!(r.stdout_bytes, input.len() as u64);
}

#[tokio::test]
async fn env_cwd_and_uid_are_applied() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let req = ExecRequest {
        env: [("FOO".to_owned(), "bar".to_owned())].into(),
        cwd: Some("/tmp".into()),
        uid: Some(1000),
        ..cmd(&[
            "sh",
            "-c",
            "echo $FOO; pwd; id -u; id -g; cat /proc/self/oom_score_adj",
        ])
    };
    let r = d.exec_req(&sb.id, &req).await;
    // Commands are not shielded from the OOM killer as init is, whatever
    // their uid.
    assert_eq!(
        text(&r.stdout.0),
        "bar\n/tmp\n1000\n1000\n0\n",
        "{}",
        text(&r.stderr.0)
    );
    // The default working directory is /workspace, as root.
    assert_eq!(
        d.sh(&sb.id, "pwd; id -u; cat /proc/self/oom_score_adj")
            .await,
        "/workspace\n0\n0\n"
    );
}

#[tokio::test]
async fn a_missing_command_is_exec_failed_and_the_cli_exits_127() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let e = d
        .client
        .exec(&sb.id, &cmd(&["no-such-command-mayfly"]))
        .await
        .expect_err("running a command that does not exist");
    match &e {
        mayfly_client::ClientError::Api { status, error } => {
            assert_eq!(
                (*status, error.code),
                (422, ErrorCode::ExecFailed),
                "{error:?}"
            );
            assert!(
                error.message.contains("no-such-command-mayfly"),
                "{}",
                error.message
            );
        }
        other => panic!("expected an API error, got {other:?}"),
    }
    let out = d.run_cli(&["exec", sb.id.as_str(), "--", "no-such-command-mayfly"]);
    expect_exit(&out, 127, "mayfly exec of a missing command");
    // The sandbox is still usable.
    assert_eq!(d.sh(&sb.id, "echo fine").await, "fine\n");
}

#[tokio::test]
async fn streamed_output_arrives_before_the_command_ends() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let t = Instant::now();
    let mut stream = d
        .client
        .exec_stream(&sb.id, &cmd(&["sh", "-c", "echo a; sleep 1; echo b"]))
        .await
        .expect("starting a streamed exec");
    let mut got = Vec::new();
    while let Some(ev) = stream.next_event().await.expect("reading the stream") {
        got.push((t.elapsed(), ev));
    }
    let first_a = got
        .iter()
        .find(|(_, e)| matches!(e, ExecEvent::Stdout(b) if b.starts_with(b"a")))
        .map(|(t, _)| *t)
        .expect("an `a` chunk");
    let (exit_at, exit) = got.last().expect("an exit event");
    let ExecEvent::Exit(result) = exit else {
        panic!("the stream did not end with an exit event: {got:?}");
    };
    assert_eq!(result.status.exit_code, Some(0));
    assert!(
        *exit_at >= Duration::from_millis(900),
        "exit came after {exit_at:?}"
    );
    assert!(
        *exit_at - first_a >= Duration::from_millis(700),
        "`a` arrived at {first_a:?}, only just before the exit at {exit_at:?}"
    );
    let stdout: Vec<u8> = got
        .iter()
        .filter_map(|(_, e)| match e {
            ExecEvent::Stdout(b) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(stdout, b"a\nb\n");
}

#[tokio::test]
async fn background_processes_can_be_listed_read_killed_and_waited_on() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let req = StartProcessRequest {
        argv: vec!["sh".into(), "-c".into(), "echo hi; sleep 30".into()],
        ..StartProcessRequest::default()
    };
    let p = d.client.start_process(&sb.id, &req).await.expect("start");
    assert_eq!(p.state, ProcessState::Running);
    let list = d.client.list_processes(&sb.id).await.expect("list");
    let listed = list
        .iter()
        .find(|x| x.handle == p.handle)
        .expect("the process is listed");
    assert_eq!(
        (listed.state, &listed.argv),
        (ProcessState::Running, &req.argv)
    );

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = d
            .client
            .process_output(&sb.id, p.handle)
            .await
            .expect("output");
        if text(&out.stdout.0).contains("hi") {
            assert_eq!(out.state, ProcessState::Running);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no `hi` from the process: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let still = d
        .client
        .wait_process(&sb.id, p.handle, Some(100))
        .await
        .expect("short wait");
    assert_eq!(
        still.state,
        ProcessState::Running,
        "the process ended early: {still:?}"
    );

    d.client
        .signal_process(&sb.id, p.handle, None)
        .await
        .expect("kill");
    let done = d
        .client
        .wait_process(&sb.id, p.handle, Some(15_000))
        .await
        .expect("wait");
    assert_eq!(done.state, ProcessState::Exited, "{done:?}");
    let status = done.status.expect("an exit status");
    assert_eq!(
        (status.exit_code, status.signal),
        (None, Some(9)),
        "{status:?}"
    );
    let mut left = Vec::new();
    let gone = common::eventually(Duration::from_secs(15), || {
        left = commands_left(sb.id.as_str(), sb.init_pid);
        left.is_empty()
    })
    .await;
    assert!(gone, "the killed process's sleep survived: {left:?}");
}

#[tokio::test]
async fn the_audit_trail_records_argv_exit_and_caller_of_each_exec() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    d.exec(&sb.id, &["sh", "-c", "exit 5"]).await;
    d.exec(&sb.id, &["echo", "audited"]).await;
    let _ = d
        .client
        .exec(&sb.id, &cmd(&["no-such-command-mayfly"]))
        .await;
    let trail = d.client.audit(&sb.id).await.expect("audit");
    assert_eq!(trail.len(), 3, "{trail:#?}");
    let find = |argv0: &str| {
        trail
            .iter()
            .find(|a| a.argv.first().map(String::as_str) == Some(argv0))
            .unwrap_or_else(|| panic!("no audit entry for {argv0}: {trail:#?}"))
    };
    let sh = find("sh");
    assert_eq!(sh.argv, ["sh", "-c", "exit 5"]);
    assert_eq!(
        (sh.exit_code, sh.signal, sh.error.as_deref()),
        (Some(5), None, None)
    );
    let echo = find("echo");
    assert_eq!((echo.exit_code, echo.stdout_bytes), (Some(0), 8));
    let missing = find("no-such-command-mayfly");
    assert_eq!(missing.exit_code, None);
    assert!(
        missing.error.is_some(),
        "a failed start is audited with its error"
    );
    for a in &trail {
        assert_eq!(a.sandbox_id, sb.id.as_str());
        assert_eq!(a.caller, "unix:uid=0", "the caller of {:?}", a.argv);
    }
}

#[tokio::test]
async fn a_sandbox_past_its_command_budget_is_refused_and_nothing_runs_unaudited() {
    let d = Daemon::start_with(&["--max-commands-per-sandbox", "3"]).await;
    let sb = d.create().await;
    d.exec(&sb.id, &["true"]).await;
    let req = StartProcessRequest {
        argv: vec!["true".into()],
        ..StartProcessRequest::default()
    };
    d.client.start_process(&sb.id, &req).await.expect("start");
    // A command that fails to start counts too: it is audited.
    let _ = d
        .client
        .exec(&sb.id, &cmd(&["no-such-command-mayfly"]))
        .await;
    let marker = format!("/tmp/ran-{}", std::process::id());
    let refused = d
        .client
        .exec(&sb.id, &cmd(&["touch", &marker]))
        .await
        .expect_err("a fourth command");
    match &refused {
        mayfly_client::ClientError::Api { status, error } => {
            assert_eq!(
                (*status, error.code),
                (403, ErrorCode::PermissionDenied),
                "{error:?}"
            );
            assert!(
                error.message.contains("has run 3 commands"),
                "{}",
                error.message
            );
        }
        other => panic!("expected an API error, got {other:?}"),
    }
    let e = d
        .client
        .start_process(&sb.id, &req)
        .await
        .expect_err("a background process past the budget");
    assert!(format!("{e:?}").contains("has run 3 commands"), "{e:?}");
    let out = d.run_cli(&["exec", sb.id.as_str(), "--", "true"]);
    assert!(
        !out.status.success(),
        "the CLI exec past the budget succeeded"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has run 3 commands"), "{stderr}");
    // Nothing refused ran, and the trail holds exactly the three that did.
    let trail = d.client.audit(&sb.id).await.expect("audit");
    assert_eq!(trail.len(), 3, "{trail:#?}");
    assert!(
        trail.iter().all(|a| !a.argv.contains(&marker)),
        "{trail:#?}"
    );
    match d.client.stat(&sb.id, &marker).await {
        Err(mayfly_client::ClientError::Api { status: 404, .. }) => {}
        other => panic!("the refused command ran, or stat failed: {other:?}"),
    }
    // The budget is the sandbox's: a new one runs.
    let fresh = d.create().await;
    d.exec(&fresh.id, &["true"]).await;
}
