//! Daemonless `mayfly run`: output, exit codes and `--json`; the detached
//! reaper that finishes every destroy; `kill -9` of a run; runs refused by
//! the CLI or the engine; concurrent runs in one state directory; and that
//! nothing of any of them is left behind.

mod common;

use std::process::{Output, Stdio};

use common::daemonless::{assert_runs_cleaned, assert_runs_cleaned_but};
use common::{assert_no_leaks, daemonless, daemonless_cmd, expect_exit, test_dir, text};
use mayfly_types::{ExecResult, SandboxId, SandboxState};

#[test]
fn run_prints_exactly_the_commands_output_without_a_daemon() {
    common::require_root();
    let dir = test_dir();
    let out = daemonless(
        &dir,
        &[
            "run",
            "--",
            "python3",
            "-c",
            "print(\"hello from a sandbox\")",
        ],
    );
    let stdout = expect_exit(&out, 0, "mayfly run");
    assert_eq!(stdout, "hello from a sandbox\n");
    assert_eq!(text(&out.stderr), "", "run printed to stderr");
    assert_runs_cleaned(&dir);
    // Stdout and stderr stay apart.
    let out = daemonless(&dir, &["run", "--", "sh", "-c", "echo out; echo err >&2"]);
    assert_eq!(expect_exit(&out, 0, "mayfly run"), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert_runs_cleaned(&dir);
}

/// `mayfly run` answers once its sandbox is killed and hands the rest of
/// the destroy to a detached reaper, which the record then names as its
/// owner; the reaper records the sandbox destroyed and exits.
#[test]
fn a_daemonless_run_hands_its_cleanup_to_a_reaper() {
    common::require_root();
    let dir = test_dir();
    let child = daemonless_cmd(&dir, &["run", "--", "sh", "-c", "sleep 30 & echo started"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the mayfly CLI");
    let cli_pid = child.id();
    // Reading stdout and stderr to their end returns only once nothing
    // holds them: neither the reaper nor the sandbox's own processes (the
    // background `sleep`) may keep the caller's pipes open.
    let out = child.wait_with_output().expect("waiting for mayfly run");
    assert_eq!(expect_exit(&out, 0, "mayfly run"), "started\n");
    let records = assert_runs_cleaned(&dir);
    assert_eq!(records.len(), 1);
    assert_ne!(
        records[0].owner_pid, cli_pid,
        "the record still names the CLI, not a reaper, as its owner"
    );
}

/// `kill -9` of a daemonless `mayfly run` takes its sandbox's processes
/// with it (the zygote, stub and init each die with their parent); the
/// sandbox's reaper, never handed the sandbox, removes what is left and
/// records why, and the next run finds nothing to recover.
#[tokio::test]
async fn killing_a_daemonless_run_kills_its_sandbox_and_its_reaper_cleans_up() {
    common::require_root();
    let dir = test_dir();
    let mut child = daemonless_cmd(&dir, &["run", "--", "sh", "-c", "echo up; sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("running the mayfly CLI");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("reading the command's first line");
    assert_eq!(line, "up\n");
    let state = dir.path().join("state");
    let store = mayfly_store::Store::open(&state).expect("opening the run's store");
    let live = store.list_sandboxes(false).expect("listing sandboxes");
    assert_eq!(live.len(), 1, "one live sandbox expected: {live:?}");
    let id = live[0].id.to_string();
    assert!(
        !common::host::procs_in_sandbox(&id).is_empty(),
        "the sandbox has no process to kill"
    );
    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let dead = common::eventually(std::time::Duration::from_secs(15), || {
        common::host::procs_in_sandbox(&id).is_empty()
    })
    .await;
    assert!(
        dead,
        "processes outlived the killed run: {:?}",
        common::host::procs_in_sandbox(&id)
    );
    assert_no_leaks(&state, &[id.as_str()]);
    let sid: SandboxId = id.parse().expect("an id");
    let recorded = common::eventually(std::time::Duration::from_secs(15), || {
        store
            .get_sandbox(&sid)
            .ok()
            .flatten()
            .is_some_and(|r| r.state == SandboxState::Failed)
    })
    .await;
    let rec = store
        .get_sandbox(&sid)
        .expect("reading the record")
        .expect("the killed run's record");
    assert!(recorded, "the killed run's record says {:?}", rec.state);
    // Recorded by the reaper, not by a later recovery.
    assert_eq!(
        rec.reason.as_deref(),
        Some("owner_died: the `mayfly run` that owned it died")
    );
    let out = daemonless(&dir, &["run", "--", "true"]);
    expect_exit(&out, 0, "the next mayfly run");
    assert_runs_cleaned_but(&dir, &[sid]);
}

/// A daemonless run's zygote starts making the sandbox's stub as the
/// process starts; when the run is then refused, by the engine (a ttl out
/// of range) or by the CLI (`--cpus 0`), that stub goes too: no marker,
/// directory, cgroup or process is left.
#[test]
fn a_refused_daemonless_run_leaves_nothing_behind() {
    common::require_root();
    for (args, names) in [(["--ttl", "1000d"], "ttl"), (["--cpus", "0"], "--cpus")] {
        let dir = test_dir();
        let mut argv = vec!["run"];
        argv.extend(args);
        argv.extend(["--", "true"]);
        let out = daemonless_cmd(&dir, &argv)
            .env("MAYFLY_LOG", "mayfly_engine=debug")
            .env("NO_COLOR", "1")
            .output()
            .expect("running the mayfly CLI");
        let log = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?} was accepted");
        assert!(
            log.contains(names),
            "the error does not name {names}: {log}"
        );
        // The engine logs the id of the stub it adopts.
        let id = log
            .lines()
            .find(|l| l.contains("adopting the stub made from the start"))
            .and_then(|l| l.split("id=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .map(|id| id.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-'))
            .unwrap_or_else(|| panic!("no early stub in the log: {log}"))
            .to_owned();
        assert!(id.starts_with("mf-"), "odd id {id:?} in {log}");
        assert_no_leaks(&dir.path().join("state"), &[&id]);
        let marker = dir.path().join("state/stubs").join(&id);
        assert!(!marker.exists(), "stub marker left: {}", marker.display());
    }
}

/// The shared `mayfly` parent cgroups that exist and hold no cgroup: what a
/// Mayfly instance that has finished would have left behind.
fn empty_mayfly_parents() -> Vec<std::path::PathBuf> {
    let parents: Vec<std::path::PathBuf> = if common::host::cgroup_is_v2() {
        vec!["/sys/fs/cgroup/mayfly".into()]
    } else {
        ["memory", "cpu", "cpuacct", "pids"]
            .iter()
            .map(|c| format!("/sys/fs/cgroup/{c}/mayfly").into())
            .collect()
    };
    parents
        .into_iter()
        .filter(|p| {
            std::fs::read_dir(p).is_ok_and(|entries| {
                !entries
                    .flatten()
                    .any(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            })
        })
        .collect()
}

/// A daemonless run removes the shared `mayfly` parent cgroups it made, once
/// empty. Other tests' daemons keep theirs busy with stubs and remove them
/// when they stop, so an empty parent may appear for a moment; none stays.
#[tokio::test]
async fn a_daemonless_run_leaves_no_empty_mayfly_cgroup_parent() {
    common::require_root();
    let dir = test_dir();
    let out = daemonless(&dir, &["run", "--", "true"]);
    expect_exit(&out, 0, "mayfly run");
    let settled = common::eventually(std::time::Duration::from_secs(15), || {
        empty_mayfly_parents().is_empty()
    })
    .await;
    assert!(
        settled,
        "empty mayfly cgroup parents left: {:?}",
        empty_mayfly_parents()
    );
    common::daemonless::drain_spares(&dir);
}

/// Daemonless runs sharing one state directory (parallel CI jobs on one
/// host) each start with a recovery pass; none may take another's stub,
/// directories or cgroups for a dead owner's leftovers.
#[test]
fn concurrent_daemonless_runs_in_one_state_directory_all_succeed() {
    common::require_root();
    let dir = test_dir();
    for round in 0..2 {
        let outs: Vec<Output> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..8)
                .map(|i| {
                    let dir = &dir;
                    s.spawn(move || {
                        let script = format!("sleep 0.2; echo run-{i}");
                        daemonless(dir, &["run", "--", "sh", "-c", &script])
                    })
                })
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("a run thread panicked"))
                .collect()
        });
        for (i, out) in outs.iter().enumerate() {
            let stdout = expect_exit(out, 0, &format!("concurrent run {i} of round {round}"));
            assert_eq!(stdout, format!("run-{i}\n"));
        }
    }
    assert_eq!(assert_runs_cleaned(&dir).len(), 16);
    let markers = std::fs::read_dir(dir.path().join("state/stubs"))
        .map(|r| r.count())
        .unwrap_or(0);
    assert_eq!(markers, 0, "stub markers left behind");
}

#[test]
fn run_json_output_is_an_exec_result() {
    common::require_root();
    let dir = test_dir();
    let out = daemonless(
        &dir,
        &["--json", "run", "--", "sh", "-c", "echo hi; exit 4"],
    );
    let stdout = expect_exit(&out, 4, "mayfly --json run");
    let r: ExecResult = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("`run --json` is not an ExecResult ({e}): {stdout}"));
    assert_eq!(
        (r.status.exit_code, r.stdout.0.as_slice()),
        (Some(4), b"hi\n".as_slice())
    );
    assert_runs_cleaned(&dir);
}

/// A daemonless run's sandbox lives no longer than its TTL: past it the
/// command is killed, the run says why and exits 137, and nothing is left.
#[test]
fn a_daemonless_run_ends_at_its_ttl() {
    common::require_root();
    let dir = test_dir();
    let t = std::time::Instant::now();
    let out = daemonless(&dir, &["run", "--ttl", "1s", "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    assert!(
        text(&out.stderr).contains("end of its TTL"),
        "{}",
        text(&out.stderr)
    );
    assert_runs_cleaned(&dir);
}

/// A daemonless run whose sandbox's init the OOM killer takes is recorded
/// as ended by `oom` (not as a run that died, `owner_died`), and one whose
/// command alone it kills keeps `user` with an `oom_kill` event. Both runs
/// say so, exit 137 and leave nothing behind.
#[test]
fn a_daemonless_run_killed_by_the_oom_killer_says_so_and_is_recorded() {
    common::require_root();
    let dir = test_dir();
    // Init first in the OOM killer's eyes (raising a score needs no
    // privilege), then eight 6 MiB hogs against a 32 MiB limit.
    let hogs = "echo 1000 > /proc/1/oom_score_adj; for i in 1 2 3 4 5 6 7 8; do python3 -c \
        'import time; b = bytearray(b\"x\") * (6 << 20); time.sleep(60)' & done; wait";
    let out = daemonless(&dir, &["run", "--memory", "32m", "--", "sh", "-c", hogs]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("OOM killer"),
        "{}",
        text(&out.stderr)
    );
    let big = "b = bytearray(b'x') * (64 << 20)";
    let out = daemonless(
        &dir,
        &["run", "--memory", "32m", "--", "python3", "-c", big],
    );
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("OOM killer"),
        "{}",
        text(&out.stderr)
    );
    let records = daemonless::assert_runs_ended_as(&dir, &["oom", "user"]);
    let store = mayfly_store::Store::open(&dir.path().join("state")).expect("opening the store");
    let events = store.events(0, 1000).expect("events");
    for r in &records {
        assert!(
            events
                .iter()
                .any(|e| e.sandbox_id.as_deref() == Some(r.id.as_str()) && e.kind == "oom_kill"),
            "{} ({:?}) has no oom_kill event: {events:?}",
            r.id,
            r.reason
        );
    }
}
