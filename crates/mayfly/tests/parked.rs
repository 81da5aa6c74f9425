//! Daemonless runs served by parked sandboxes (`mayfly_engine::park`):
//! a run's reaper starts a keeper, which boots one sandbox ahead for the
//! next run; that run hands it its command and streams; each parked
//! sandbox serves one run and is never reused. Runs it does not fit go
//! cold. Keepers retire on `mayfly prune`, when idle, and when a run of
//! another binary comes; a killed keeper or run leaves nothing behind.

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::parked::{
    assert_all_gone, audit_callers, first_line, parked_cmd, parked_dir, parked_run, parked_start,
    prune, prune_parked, record, records, socket, wait_destroyed, wait_parked,
};
use common::{expect_exit, text};
use mayfly_types::{ExecResult, SandboxState};

/// The second run is served by the sandbox the first run's reaper had a
/// keeper park: one made before the run started, whose audit trail names
/// the run. Output, exit code and the streams are a cold run's.
#[test]
fn a_run_is_served_by_the_sandbox_parked_after_the_previous_one() {
    common::require_root();
    let dir = parked_dir();
    let first = parked_run(&dir, &["run", "--", "hostname"]);
    let first_host = expect_exit(&first, 0, "first run");
    let parked = wait_parked(&dir);
    assert_ne!(first_host.trim(), parked.id.as_str());
    // Only root reaches the keeper.
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.path().join("state/parked")), 0o700);
    assert_eq!(mode(&socket(&dir)), 0o600);

    let started = mayfly_engine_now_ms();
    let child = parked_cmd(
        &dir,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "hostname; echo $$; id -u; printf '\\000\\377' >&2; exit 9",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("running the mayfly CLI");
    let pid = child.id();
    let out = child.wait_with_output().expect("waiting for the run");
    let stdout = expect_exit(&out, 9, "the parked run");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout:?}");
    assert_eq!(
        lines[0],
        parked.id.as_str(),
        "not served by the parked sandbox"
    );
    assert_eq!(lines[2], "0", "not root inside");
    assert_eq!(out.stderr, b"\x00\xff", "stderr is not byte-exact");
    assert!(
        parked.created_at <= started,
        "the sandbox was not made before the run"
    );
    assert_eq!(
        audit_callers(&dir, &parked.id),
        vec![format!("cli:pid={pid}")]
    );
    // Served once: the next keeper parks another sandbox.
    let next = wait_parked(&dir);
    assert_ne!(next.id, parked.id);
    let done = record(&dir, &parked.id);
    assert_eq!(
        (done.state, done.reason.as_deref()),
        (SandboxState::Destroyed, Some("user"))
    );
    assert!(prune(&dir).contains("removed 1 parked"));
    let all = assert_all_gone(&dir);
    assert_eq!(all.len(), 3);
    assert_eq!(
        record(&dir, &next.id).reason.as_deref(),
        Some("parked_pruned")
    );
}

fn mayfly_engine_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Nothing a run does is seen by the next: each parked sandbox is fresh.
#[test]
fn parked_sandboxes_are_never_reused() {
    common::require_root();
    let dir = parked_dir();
    let probe = "ls /workspace /tmp; echo mark > /workspace/mark; echo mark > /tmp/mark; \
                 echo x >> /etc/hosts; sleep 1000 & echo ran";
    let mut seen = Vec::new();
    expect_exit(&parked_run(&dir, &["run", "--", "true"]), 0, "first run");
    for i in 0..3 {
        let parked = wait_parked(&dir);
        seen.push(parked.id.clone());
        let out = parked_run(&dir, &["run", "--", "sh", "-c", probe]);
        assert_eq!(
            expect_exit(&out, 0, "a parked run"),
            "/tmp:\n\n/workspace:\nran\n",
            "run {i} saw an earlier run's files"
        );
        let hosts = parked_run(&dir, &["run", "--", "grep", "-c", "^x$", "/etc/hosts"]);
        expect_exit(&hosts, 1, "an earlier run's /etc/hosts edit is gone");
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3);
    // The last run's reaper starts a keeper: prune once it has parked.
    prune_parked(&dir);
}

/// A run whose spec differs from the parked one (limits, labels, a
/// template) is refused by the keeper and runs cold; the sandbox stays
/// parked for a run it fits. A TTL alone fits: it is applied on claim.
#[test]
fn a_run_the_parked_sandbox_does_not_fit_runs_cold() {
    common::require_root();
    let (dir, parked) = parked_start();
    let out = parked_run(&dir, &["run", "--memory", "96m", "--", "hostname"]);
    let host = expect_exit(&out, 0, "a run with a memory limit");
    assert_ne!(
        host.trim(),
        parked.id.as_str(),
        "a misfit was served parked"
    );
    let out = parked_run(&dir, &["run", "-l", "a=b", "--", "hostname"]);
    assert_ne!(
        expect_exit(&out, 0, "a labelled run").trim(),
        parked.id.as_str()
    );
    assert_eq!(record(&dir, &parked.id).state, SandboxState::Ready);
    // A TTL fits, and holds from the claim.
    let out = parked_run(
        &dir,
        &["run", "--ttl", "1s", "--", "sh", "-c", "hostname; sleep 30"],
    );
    assert_eq!(out.status.code(), Some(137));
    assert_eq!(text(&out.stdout).trim(), parked.id.as_str());
    assert!(
        text(&out.stderr).contains("end of its TTL"),
        "{}",
        text(&out.stderr)
    );
    prune_parked(&dir);
}

/// `--json`, `-i` and `--timeout` through a parked sandbox.
#[test]
fn json_stdin_and_timeouts_work_through_a_parked_sandbox() {
    common::require_root();
    let (dir, parked) = parked_start();
    let out = parked_run(
        &dir,
        &["--json", "run", "--", "sh", "-c", "hostname; exit 4"],
    );
    let r: ExecResult = serde_json::from_slice(&out.stdout).expect("an ExecResult");
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(r.stdout.0, format!("{}\n", parked.id).into_bytes());

    wait_parked(&dir);
    let mut child = parked_cmd(&dir, &["run", "-i", "--", "sh", "-c", "hostname; wc -c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running the mayfly CLI");
    let input = vec![b'z'; 200_000];
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &input).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = expect_exit(&out, 0, "an interactive parked run");
    assert!(stdout.ends_with("200000\n"), "{stdout:?}");

    let parked = wait_parked(&dir);
    let t = Instant::now();
    let out = parked_run(
        &dir,
        &[
            "run",
            "--timeout",
            "500ms",
            "--",
            "sh",
            "-c",
            "hostname; sleep 30 & sleep 30",
        ],
    );
    assert_eq!(out.status.code(), Some(137));
    assert_eq!(text(&out.stdout).trim(), parked.id.as_str());
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(text(&out.stderr).contains("timed out"));
    prune_parked(&dir);
}

/// A run's stdin is read once, before it claims: a run the parked sandbox
/// does not fit goes cold with the same bytes; and the keeper is never
/// handed the run's stdin descriptor (a keeper reading a terminal after
/// its run is gone would steal the user's input).
#[test]
fn stdin_is_read_by_the_run_and_survives_a_cold_fallback() {
    common::require_root();
    let (dir, parked) = parked_start();
    let input: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    for (args, warm) in [
        (
            vec![
                "run",
                "--memory",
                "80m",
                "-i",
                "--",
                "sh",
                "-c",
                "hostname; md5sum",
            ],
            false,
        ),
        (
            vec!["run", "-i", "--", "sh", "-c", "hostname; md5sum"],
            true,
        ),
    ] {
        let mut child = parked_cmd(&dir, &args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running the mayfly CLI");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &input).unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = expect_exit(&out, 0, "an interactive run");
        let (host, sum) = stdout.split_once('\n').unwrap();
        assert_eq!(host == parked.id.as_str(), warm, "{args:?}");
        let want = std::process::Command::new("sh")
            .args(["-c", "head -c 300000 /dev/stdin | md5sum"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                std::io::Write::write_all(&mut c.stdin.take().unwrap(), &input)?;
                c.wait_with_output()
            })
            .unwrap();
        assert_eq!(sum, text(&want.stdout), "stdin was not passed whole");
    }
    // A keeper serving a run holds the run's stdout (the command's output
    // goes there) but never its stdin, even one left open.
    let next = wait_parked(&dir);
    let (r, w) = mayfly_sys::ipc::pipe().unwrap();
    let mut child = parked_cmd(&dir, &["run", "--", "sh", "-c", "hostname; sleep 2"])
        .stdin(Stdio::from(r))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    assert_eq!(line.trim(), next.id.as_str(), "not served parked");
    let ino = |p: String| std::fs::metadata(p).ok().map(|m| m.ino());
    let keeper_fds: Vec<u64> = std::fs::read_dir(format!("/proc/{}/fd", next.owner_pid))
        .unwrap()
        .flatten()
        .filter_map(|e| ino(e.path().display().to_string()))
        .collect();
    let run_stdin = ino(format!("/proc/{}/fd/0", child.id())).unwrap();
    let run_stdout = ino(format!("/proc/{}/fd/1", child.id())).unwrap();
    assert!(
        keeper_fds.contains(&run_stdout),
        "the check sees no descriptor"
    );
    assert!(
        !keeper_fds.contains(&run_stdin),
        "the keeper holds the run's stdin"
    );
    assert!(child.wait().unwrap().success());
    drop(w);
    prune_parked(&dir);
}

/// `kill -9` of a run a parked sandbox serves: the keeper sees the run's
/// end, kills the command, and the sandbox is destroyed as a run's is.
#[test]
fn killing_a_run_served_parked_kills_its_command() {
    common::require_root();
    let (dir, parked) = parked_start();
    let mut child = parked_cmd(&dir, &["run", "--", "sh", "-c", "echo up; sleep 600"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("running the mayfly CLI");
    let line = first_line(&mut child);
    assert_eq!(line, "up\n");
    let init = record(&dir, &parked.id).init_pid.expect("init's pid");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        wait_destroyed(&dir, &parked.id, 30).as_deref(),
        Some("user")
    );
    assert!(
        common::host::proc_info(init).is_none_or(|p| p.is_zombie()),
        "init still runs"
    );
    prune_parked(&dir);
}

/// `kill -9` of a keeper: its sandbox dies with it, the next run runs
/// (cold: nobody answers the socket), and that run's recovery removes
/// the remains and records why.
#[test]
fn a_killed_keeper_leaves_nothing_after_the_next_run() {
    common::require_root();
    let (dir, parked) = parked_start();
    // SAFETY: kill(2) on a pid the record names; no memory is involved.
    let killed = unsafe { libc::kill(parked.owner_pid as i32, libc::SIGKILL) };
    assert_eq!(killed, 0, "killing the keeper");
    // kill(2) only sends the signal: the next run comes once the keeper is
    // dead (until then it would still count as the sandbox's live owner).
    let deadline = Instant::now() + Duration::from_secs(15);
    while mayfly_sys::process::start_time(parked.owner_pid) == Some(parked.owner_start) {
        assert!(
            Instant::now() < deadline,
            "the keeper (pid {}) outlived its SIGKILL by 15 s",
            parked.owner_pid
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = parked_run(&dir, &["run", "--", "hostname"]);
    let host = expect_exit(&out, 0, "the run after");
    assert_ne!(host.trim(), parked.id.as_str());
    let r = record(&dir, &parked.id);
    assert_eq!(r.state, SandboxState::Failed, "{r:?}");
    assert!(r.reason.as_deref().unwrap_or("").contains("died"), "{r:?}");
    prune_parked(&dir);
}

/// `mayfly prune` right after a run (a CI job's last step): the run's
/// reaper may not have started its keeper yet; that keeper must not park,
/// and the reaper must not leave spare namespaces either.
#[test]
fn prune_right_after_a_run_leaves_nothing_parked() {
    common::require_root();
    let dir = parked_dir();
    for _ in 0..3 {
        expect_exit(&parked_run(&dir, &["run", "--", "true"]), 0, "a run");
        prune(&dir);
        // Longer than a keeper takes to boot here.
        std::thread::sleep(Duration::from_millis(500));
        // Nor does the run's reaper leave spare namespaces after the prune.
        let spares = common::daemonless::spare_ns_dir(&dir);
        let left = common::host::mounts_mentioning(&[&spares.to_string_lossy()]);
        assert!(
            left.is_empty(),
            "spare namespaces made after prune: {left:?}"
        );
        assert_all_gone(&dir);
    }
}

/// A keeper nobody claims destroys its sandbox after its idle time.
#[test]
fn an_idle_keeper_destroys_its_sandbox() {
    common::require_root();
    let dir = parked_dir();
    let out = parked_cmd(&dir, &["run", "--", "true"])
        .env("MAYFLY_PARK_IDLE", "1s")
        .output()
        .unwrap();
    expect_exit(&out, 0, "first run");
    let parked = wait_parked(&dir);
    assert_eq!(
        wait_destroyed(&dir, &parked.id, 15).as_deref(),
        Some("parked_idle")
    );
    let all = assert_all_gone(&dir);
    assert_eq!(all.len(), 2);
}

/// A run of another `mayfly` binary (a rebuild) is never served by a
/// keeper of the old one: the keeper refuses it and retires.
#[test]
fn a_keeper_retires_when_a_run_of_another_binary_comes() {
    common::require_root();
    let (dir, parked) = parked_start();
    // A rebuild replaces both binaries (the CLI finds `mayflyd` beside it).
    let rebuilt = dir.path().join("rebuilt");
    std::fs::create_dir(&rebuilt).unwrap();
    let copy = rebuilt.join("mayfly");
    std::fs::copy(common::BIN, &copy).unwrap();
    std::fs::copy(common::DAEMON_BIN, rebuilt.join("mayflyd")).unwrap();
    let template = parked_cmd(&dir, &["run", "--", "hostname"]);
    let out = std::process::Command::new(&copy)
        .args(template.get_args())
        .envs(template.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .unwrap();
    let host = expect_exit(&out, 0, "a run of the rebuilt binary");
    assert_ne!(host.trim(), parked.id.as_str());
    assert_eq!(
        wait_destroyed(&dir, &parked.id, 30).as_deref(),
        Some("parked_stale_binary")
    );
    // The rebuilt binary's reaper parks the next one.
    let next = wait_parked(&dir);
    assert_ne!(next.id, parked.id);
    prune(&dir);
    assert_eq!(assert_all_gone(&dir).len(), records(&dir).len());
}
