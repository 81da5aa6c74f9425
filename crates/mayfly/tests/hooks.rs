//! Lifecycle hooks: their order, their failure policies at each point, the
//! audit trail's record of them, and `mayfly exec --run`.

mod common;

use common::{assert_no_leaks, expect_exit, text, Daemon};
use mayfly_types::{CreateRequest, ErrorCode, ExecRequest, FailurePolicy, Hook, Hooks};

fn hook(script: &str, on_failure: FailurePolicy) -> Hook {
    Hook {
        command: vec!["sh".into(), "-c".into(), script.into()],
        timeout_secs: Some(10),
        on_failure,
        user: None,
    }
}

/// A task run (`run: true`) of `script`.
fn task_run(script: &str) -> ExecRequest {
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        run: true,
        ..Default::default()
    }
}

fn log(point: &str) -> Hook {
    hook(&format!("echo {point} >> /tmp/order"), FailurePolicy::Fail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_run_in_order_around_task_runs_and_are_audited() {
    let d = Daemon::start().await;
    let req = CreateRequest {
        hooks: Hooks {
            after_create: vec![log("after_create")],
            before_run: vec![log("before_run")],
            after_run: vec![
                hook("echo after-run-noise; exit 4", FailurePolicy::Ignore),
                log("after_run"),
            ],
            before_remove: vec![log("before_remove")],
        },
        ..Default::default()
    };
    let sb = d.create_with(&req).await;
    // A plain exec is not a task run.
    d.sh(&sb.id, "echo exec >> /tmp/order").await;
    let run = task_run("echo run >> /tmp/order");
    let r = d.exec_req(&sb.id, &run).await;
    assert_eq!(r.status.exit_code, Some(0));
    assert_eq!(r.hook_error, None, "an ignored failure is not reported");
    // The CLI's --run is a task run too.
    let out = d.run_cli(&[
        "exec",
        "--run",
        sb.id.as_str(),
        "--",
        "sh",
        "-c",
        "echo cli >> /tmp/order",
    ]);
    expect_exit(&out, 0, "mayfly exec --run");
    let order = d.sh(&sb.id, "cat /tmp/order").await;
    assert_eq!(
        order.lines().collect::<Vec<_>>(),
        [
            "after_create",
            "exec",
            "before_run",
            "run",
            "after_run",
            "before_run",
            "cli",
            "after_run"
        ]
    );
    let audit = d.client.audit(&sb.id).await.expect("audit");
    let kinds: Vec<_> = audit.iter().map(|a| a.kind.as_deref()).collect();
    assert_eq!(kinds[0], Some("hook:after_create"), "{audit:#?}");
    let ignored = audit
        .iter()
        .find(|a| a.exit_code == Some(4))
        .expect("the failed after_run hook is audited");
    assert_eq!(ignored.kind.as_deref(), Some("hook:after_run"));
    assert_eq!(ignored.output.as_deref(), Some("after-run-noise\n"));
    assert!(
        audit.iter().any(|a| a.kind.is_none()),
        "user execs have no kind"
    );

    // before_remove runs first in destroy, while the sandbox still runs:
    // its audit record is there afterwards.
    d.client.destroy(&sb.id).await.expect("destroy");
    let audit = d.client.audit(&sb.id).await.expect("audit");
    assert_eq!(
        audit.last().and_then(|a| a.kind.as_deref()),
        Some("hook:before_remove")
    );
    assert_eq!(audit.last().and_then(|a| a.exit_code), Some(0));
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_hooks_fail_their_step_by_policy_and_never_block_removal() {
    let d = Daemon::start().await;
    // after_create fail: the create fails, nothing stays.
    let req = CreateRequest {
        hooks: Hooks {
            after_create: vec![hook("echo cannot-prepare; exit 7", FailurePolicy::Fail)],
            ..Default::default()
        },
        ..Default::default()
    };
    let e = d.client.create(&req).await.expect_err("after_create fails");
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("exit code 7") && msg.contains("cannot-prepare"),
        "{msg}"
    );

    let req = CreateRequest {
        hooks: Hooks {
            before_run: vec![hook("test -e /tmp/allowed", FailurePolicy::Fail)],
            after_run: vec![hook("echo cleanup-failed; exit 5", FailurePolicy::Fail)],
            before_remove: vec![hook("exit 9", FailurePolicy::Fail)],
            ..Default::default()
        },
        ..Default::default()
    };
    let sb = d.create_with(&req).await;
    let run = task_run("echo ran; touch /tmp/ran");
    // before_run fail: the run is refused with 409 and does not start.
    let e = d
        .client
        .exec(&sb.id, &run)
        .await
        .expect_err("before_run fails");
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e:?}");
    assert!(e.to_string().contains("before_run"), "{e}");
    let ran = d.exec(&sb.id, &["test", "-e", "/tmp/ran"]).await;
    assert_eq!(
        ran.status.exit_code,
        Some(1),
        "the run must not have started"
    );
    // The CLI says so and exits non-zero.
    let out = d.run_cli(&["exec", "--run", sb.id.as_str(), "--", "true"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("before_run"),
        "{}",
        text(&out.stderr)
    );

    // after_run fail: the command's output and status are kept, the
    // failure is reported beside them.
    d.sh(&sb.id, "touch /tmp/allowed").await;
    let r = d.exec_req(&sb.id, &run).await;
    assert_eq!(r.status.exit_code, Some(0));
    assert_eq!(text(&r.stdout.0), "ran\n");
    let h = r.hook_error.expect("the after_run failure is reported");
    assert!(
        h.contains("after_run") && h.contains("cleanup-failed"),
        "{h}"
    );
    let out = d.run_cli(&["exec", "--run", sb.id.as_str(), "--", "echo", "hi"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed after_run fails the CLI run"
    );
    assert_eq!(text(&out.stdout), "hi\n");

    // before_remove fail: recorded, and the sandbox goes anyway.
    d.client.destroy(&sb.id).await.expect("destroy");
    let audit = d.client.audit(&sb.id).await.expect("audit");
    let last = audit.last().expect("audited");
    assert_eq!(
        (last.kind.as_deref(), last.exit_code),
        (Some("hook:before_remove"), Some(9))
    );
    let all = d.client.list(true).await.expect("list");
    let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
    assert_no_leaks(&d.state_dir, &ids);
}

/// A TTL destroy claims the sandbox before its `before_remove` hooks run:
/// the hook runs whole (the reaper does not start another destroy on its
/// next tick and kill it), a keepalive meanwhile is refused, and a user's
/// DELETE waits for it and leaves the reason as `ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_destroy_runs_its_slow_before_remove_hook_whole() {
    let d = Daemon::start().await;
    let req = CreateRequest {
        ttl_secs: Some(1),
        hooks: Hooks {
            before_remove: vec![hook("sleep 2; echo slow-done", FailurePolicy::Fail)],
            ..Default::default()
        },
        ..Default::default()
    };
    let sb = d.create_with(&req).await;
    let t0 = std::time::Instant::now();
    // The deadline passes at 1 s and the reaper looks every 200 ms: by
    // 1.6 s the hook has started, and it runs until about 3.2 s.
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let (status, code, _) = common::keys::code(d.client.keepalive(&sb.id, Some(60)).await);
    assert_eq!(
        (status, code),
        (409, ErrorCode::Conflict),
        "a sandbox being destroyed cannot be kept alive"
    );
    let info = d.client.destroy(&sb.id).await.expect("destroy");
    assert!(
        t0.elapsed() >= std::time::Duration::from_millis(2800),
        "the DELETE waited for the hook: {:?}",
        t0.elapsed()
    );
    assert!(info.state.is_terminal() || info.state == mayfly_types::SandboxState::Stopping);
    let audit = d.client.audit(&sb.id).await.expect("audit");
    let hooks: Vec<_> = audit
        .iter()
        .filter(|a| a.kind.as_deref() == Some("hook:before_remove"))
        .collect();
    assert_eq!(hooks.len(), 1, "the hook ran once: {audit:#?}");
    assert_eq!(hooks[0].exit_code, Some(0), "{audit:#?}");
    assert_eq!(hooks[0].output.as_deref(), Some("slow-done\n"));
    for _ in 0..100 {
        if d.client.get(&sb.id).await.unwrap().state.is_terminal() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let end = d.client.get(&sb.id).await.unwrap();
    assert_eq!(end.reason.as_deref(), Some("ttl"), "{end:?}");
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}

/// Sends `body` to `path` on the daemon's socket and hangs up after `after`,
/// before any answer.
async fn hang_up(socket: &std::path::Path, path: &str, body: &str, after: std::time::Duration) {
    use tokio::io::AsyncWriteExt as _;
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_client_hangs_up_midway_is_destroyed_not_stranded() {
    let d = Daemon::start().await;
    // Both ways in, each abandoned in the middle of a 1 s after_create hook.
    let sandbox = r#"{"hooks":{"after_create":[{"command":["sleep","1"]}]}}"#;
    let run = format!(r#"{{"sandbox":{sandbox},"exec":{{"argv":["true"]}}}}"#);
    let gap = std::time::Duration::from_millis(400);
    hang_up(&d.socket, "/v1/sandboxes", sandbox, gap).await;
    hang_up(&d.socket, "/v1/run", &run, gap).await;
    // The creates finish, find their callers gone, and destroy what they made.
    let t = std::time::Instant::now();
    let all = loop {
        let all = d.client.list(true).await.unwrap();
        if all.len() == 2 && all.iter().all(|s| s.state.is_terminal()) {
            break all;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "the abandoned creates' sandboxes, 20 s on: {all:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    for s in &all {
        assert_eq!(s.reason.as_deref(), Some("abandoned"), "{s:#?}");
    }
    assert!(d.client.list(false).await.unwrap().is_empty());
    let ids: Vec<String> = all.iter().map(|s| s.id.to_string()).collect();
    assert_no_leaks(&d.state_dir, &ids);
    // The uid slots and the daemon's places came back: creates still work.
    let sb = d.create().await;
    d.client.destroy(&sb.id).await.unwrap();
}

#[tokio::test]
async fn hooks_count_against_the_command_budget_and_do_not_run_past_it() {
    let d = Daemon::start_with(&["--max-commands-per-sandbox", "4"]).await;
    let req = CreateRequest {
        hooks: Hooks {
            before_run: vec![log("before_run")],
            after_run: vec![log("after_run")],
            ..Default::default()
        },
        ..Default::default()
    };
    let sb = d.create_with(&req).await;
    let run = task_run("echo run >> /tmp/order");
    // One task run is three commands: its two hooks and itself.
    let r = d.exec_req(&sb.id, &run).await;
    assert_eq!(r.status.exit_code, Some(0));
    // The fourth command of the budget; then a run is refused before its
    // before_run hook runs, and nothing more is recorded.
    let order = d.sh(&sb.id, "cat /tmp/order").await;
    assert_eq!(order, "before_run\nrun\nafter_run\n");
    let e = d
        .client
        .exec(&sb.id, &run)
        .await
        .expect_err("past the budget");
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e:?}");
    assert!(e.to_string().contains("has run 4 commands"), "{e}");
    let trail = d.client.audit(&sb.id).await.expect("audit");
    assert_eq!(trail.len(), 4, "{trail:#?}");
    d.client.destroy(&sb.id).await.expect("destroy");
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}
