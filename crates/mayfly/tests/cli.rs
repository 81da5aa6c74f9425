//! The `mayfly` CLI as a user runs it: `--json` output, create/ps/rm through
//! a daemon, `run` through a daemon when one answers, and a clear error when
//! none does. Daemonless `run` has its own file, `daemonless.rs`.

mod common;

use std::process::{Command, Stdio};

use common::{assert_no_leaks, daemonless, expect_exit, test_dir, text, Daemon, BIN};
use mayfly_types::{SandboxId, SandboxInfo, SandboxState};

#[tokio::test]
async fn create_ps_and_rm_manage_a_sandbox_through_the_daemon() {
    let d = Daemon::start().await;
    let out = d.run_cli(&["create"]);
    let printed = expect_exit(&out, 0, "mayfly create");
    let id: SandboxId = printed.trim().parse().expect("create prints a sandbox id");
    assert_eq!(printed, format!("{id}\n"), "create prints only the id");
    assert_eq!(
        d.client.get(&id).await.expect("get").state,
        SandboxState::Ready
    );

    let ps = expect_exit(&d.run_cli(&["ps"]), 0, "mayfly ps");
    let row = ps.lines().find(|l| l.starts_with(id.as_str()));
    assert!(
        row.is_some_and(|r| r.contains("ready")),
        "ps does not list {id} as ready:\n{ps}"
    );

    let rm = expect_exit(&d.run_cli(&["rm", id.as_str()]), 0, "mayfly rm");
    assert_eq!(rm, format!("{id}\n"));
    // rm answers once the sandbox is killed; it may show as `stopping` while
    // the cleanup finishes, and then leaves the list.
    let ps = expect_exit(&d.run_cli(&["ps"]), 0, "mayfly ps");
    let row = ps.lines().find(|l| l.starts_with(id.as_str()));
    assert!(
        row.is_none_or(|r| r.contains("stopping")),
        "after rm, ps shows:\n{ps}"
    );
    assert_no_leaks(&d.state_dir, &[id.as_str()]);
    let t = std::time::Instant::now();
    loop {
        let ps = expect_exit(&d.run_cli(&["ps"]), 0, "mayfly ps");
        if !ps.contains(id.as_str()) {
            break;
        }
        assert!(
            t.elapsed().as_secs() < 15,
            "ps still lists {id} 15 s after rm:\n{ps}\ndaemon log:\n{}",
            d.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // rm of an id that is not a sandbox id fails, and says so.
    let out = d.run_cli(&["rm", "not-an-id"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("not-an-id"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn json_output_of_create_and_ps_parses() {
    let d = Daemon::start().await;
    let out = d.run_cli(&["--json", "create", "--pids", "100", "--label", "team=e2e"]);
    let stdout = expect_exit(&out, 0, "mayfly --json create");
    let info: SandboxInfo = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("`create --json` is not a SandboxInfo ({e}): {stdout}"));
    assert_eq!(info.state, SandboxState::Ready);
    assert_eq!(info.limits.pids, 100);
    assert_eq!(info.labels.get("team").map(String::as_str), Some("e2e"));

    let stdout = expect_exit(&d.run_cli(&["--json", "ps"]), 0, "mayfly --json ps");
    let list: Vec<SandboxInfo> = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("`ps --json` is not a list of SandboxInfo ({e}): {stdout}"));
    assert_eq!(list.iter().map(|s| &s.id).collect::<Vec<_>>(), [&info.id]);
    // `ps -q`: the ids alone, for `mayfly rm $(mayfly ps -q)`.
    let quiet = expect_exit(&d.run_cli(&["ps", "-q"]), 0, "mayfly ps -q");
    assert_eq!(quiet, format!("{}\n", info.id));
    // `--json` keeps its meaning wherever it is given.
    for args in [["--json", "ps", "-q"], ["ps", "-q", "--json"]] {
        let out = expect_exit(&d.run_cli(&args), 0, "mayfly ps -q with --json");
        let list: Vec<SandboxInfo> = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{args:?} is not a list of SandboxInfo ({e}): {out}"));
        assert_eq!(list.len(), 1, "{args:?}");
    }

    let stdout = expect_exit(
        &d.run_cli(&["--json", "rm", info.id.as_str()]),
        0,
        "rm --json",
    );
    let gone: Vec<SandboxInfo> = serde_json::from_str(&stdout).expect("rm --json is a list");
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].id, info.id);
}

#[tokio::test]
async fn run_goes_through_a_daemon_when_one_answers() {
    let d = Daemon::start().await;
    let out = d.run_cli(&["run", "--", "sh", "-c", "hostname"]);
    let host = expect_exit(&out, 0, "mayfly run through the daemon");
    let id: SandboxId = host.trim().parse().expect("the hostname is a sandbox id");
    // The daemon destroys a run's sandbox as soon as its output stream
    // ends, in the background: by the time the CLI has exited it is on its
    // way out, or within moments.
    let t = std::time::Instant::now();
    loop {
        let info = d
            .client
            .get(&id)
            .await
            .expect("the daemon knows the sandbox `run` used");
        if info.state != SandboxState::Ready {
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "run left its sandbox alive: {info:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_no_leaks(&d.state_dir, &[id.as_str()]);
}

#[test]
fn exec_without_a_daemon_fails_and_points_at_mayfly_serve() {
    let dir = test_dir();
    for args in [
        vec!["exec", "mf-aaaaaaaaaaaa", "--", "true"],
        vec!["ps"],
        vec!["create"],
    ] {
        let out = daemonless(&dir, &args);
        assert_ne!(
            out.status.code(),
            Some(0),
            "`mayfly {}` succeeded",
            args.join(" ")
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("mayfly serve"),
            "`mayfly {}` said: {err}",
            args.join(" ")
        );
        assert_eq!(text(&out.stdout), "");
    }
}

/// `mktemp -d` and most temp-dir helpers make 0700 directories. A state
/// directory below one must either work, or be refused when the daemon
/// starts, with the path in the message; a daemon that answers health checks
/// but fails every create is neither.
#[tokio::test]
async fn a_state_dir_below_a_private_directory_works_or_is_refused_at_start() {
    common::require_root();
    let dir = tempfile::Builder::new()
        .prefix("mayfly-test-private-")
        .tempdir_in("/tmp")
        .expect("a temporary directory");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let socket = dir.path().join("mayfly.sock");
    let state = dir.path().join("state");
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(&state)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning mayfly serve");
    let client = mayfly_client::Client::unix(&socket);
    let t = std::time::Instant::now();
    let outcome = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Err(status);
        }
        if let Ok(true) = client.health().await {
            break Ok(());
        }
        assert!(
            t.elapsed().as_secs() < 15,
            "the daemon neither served nor exited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    match outcome {
        Err(status) => {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
                .expect("reading stderr");
            assert!(!status.success());
            assert!(
                err.contains(&state.display().to_string()),
                "refused without naming the path: {err}"
            );
        }
        Ok(()) => {
            let created = client.create(&Default::default()).await;
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
            if let Err(e) = created {
                panic!("the daemon started, then failed a plain create: {e:?}");
            }
        }
    }
}

/// The CLI hands `serve` to `mayflyd` by `execve`: the process a supervisor
/// (or a test) started is the daemon itself, so its pid is the daemon's.
#[test]
fn serve_through_the_cli_is_mayflyd_under_the_same_pid() {
    common::require_root();
    let dir = test_dir();
    let sock = dir.path().join("d.sock");
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&sock)
        .arg("serve")
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting mayfly serve");
    let pid = child.id();
    let t = std::time::Instant::now();
    while !sock.exists() {
        assert!(t.elapsed().as_secs() < 20, "no daemon socket after 20 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the daemon's exe");
    assert_eq!(
        exe,
        std::fs::canonicalize(common::DAEMON_BIN).unwrap(),
        "pid {pid} (started as `mayfly serve`) runs {}",
        exe.display()
    );
    // SIGTERM reaches the daemon itself, which shuts down cleanly.
    // SAFETY: `kill` with a live child's pid and a valid signal number.
    let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = child.wait().expect("waiting for the daemon");
    assert_eq!(status.code(), Some(0), "the daemon's exit after SIGTERM");
}

/// Installed without `mayflyd` beside it, the CLI still runs client
/// commands, and a command that needs the engine says what is missing.
#[test]
fn without_mayflyd_beside_it_the_cli_says_so() {
    let dir = test_dir();
    let lone = dir.path().join("mayfly");
    std::fs::copy(BIN, &lone).unwrap();
    let cmd = |args: &[&str]| {
        Command::new(&lone)
            .arg("--socket")
            .arg(dir.path().join("none.sock"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(args)
            .output()
            .expect("running the lone CLI")
    };
    for args in [&["serve"][..], &["run", "--", "true"], &["prune"]] {
        let out = cmd(args);
        // 125: the CLI's own failure, as for `docker run`.
        assert_eq!(out.status.code(), Some(125), "`mayfly {}`", args.join(" "));
        let err = text(&out.stderr);
        assert!(
            err.contains("needs mayflyd") && err.contains(&lone.display().to_string()),
            "`mayfly {}` said: {err}",
            args.join(" ")
        );
    }
    let out = cmd(&["ps"]);
    assert!(text(&out.stderr).contains("mayfly serve"), "{out:?}");
}
