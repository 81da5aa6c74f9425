//! Daemonless `mayfly run`: output, exit codes and `--json`; the detached
//! reaper that finishes every destroy; `kill -9` of a run; runs refused by
//! the CLI or the engine; concurrent runs in one state directory; and that
//! nothing of any of them is left behind.

mod common;

use std::process::{Output, Stdio};

use common::{assert_no_leaks, daemonless, daemonless_cmd, expect_exit, test_dir, text};
use mayfly_types::{ExecResult, SandboxId, SandboxState};

/// Sandbox directories left in a daemonless state directory.
fn sandbox_dirs_left(dir: &tempfile::TempDir) -> Vec<String> {
    std::fs::read_dir(dir.path().join("state/sandboxes"))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (up to 5 s) until every sandbox a daemonless state directory has
/// seen is recorded `destroyed` and its reaper has exited, then checks that
/// nothing of them is left on the host.
/// Returns the records.
fn assert_runs_cleaned(dir: &tempfile::TempDir) -> Vec<mayfly_store::SandboxRecord> {
    assert_runs_cleaned_but(dir, &[])
}

/// [`assert_runs_cleaned`], for every sandbox but `except`.
fn assert_runs_cleaned_but(
    dir: &tempfile::TempDir,
    except: &[SandboxId],
) -> Vec<mayfly_store::SandboxRecord> {
    let state = dir.path().join("state");
    let store = mayfly_store::Store::open(&state).expect("opening the run's store");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let records = loop {
        let mut records = store.list_sandboxes(true).expect("listing sandboxes");
        records.retain(|r| !except.contains(&r.id));
        let done = records.iter().all(|r| {
            r.state == SandboxState::Destroyed
                && mayfly_sys::process::start_time(r.owner_pid) != Some(r.owner_start)
        });
        if done || std::time::Instant::now() >= deadline {
            break records;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(!records.is_empty(), "no sandbox was recorded");
    for r in &records {
        assert_eq!(
            (r.state, r.reason.as_deref()),
            (SandboxState::Destroyed, Some("user")),
            "{} did not end as destroyed by its run",
            r.id
        );
        assert!(
            mayfly_sys::process::start_time(r.owner_pid) != Some(r.owner_start),
            "{}'s reaper (pid {}) still runs after recording it destroyed",
            r.id,
            r.owner_pid
        );
    }
    let ids: Vec<String> = records.iter().map(|r| r.id.to_string()).collect();
    assert_no_leaks(&state, &ids);
    assert!(
        sandbox_dirs_left(dir).is_empty(),
        "runs left {:?}",
        sandbox_dirs_left(dir)
    );
    records
}

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
    let dead = common::eventually(std::time::Duration::from_secs(5), || {
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
    let recorded = common::eventually(std::time::Duration::from_secs(5), || {
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
    let settled = common::eventually(std::time::Duration::from_secs(3), || {
        empty_mayfly_parents().is_empty()
    })
    .await;
    assert!(
        settled,
        "empty mayfly cgroup parents left: {:?}",
        empty_mayfly_parents()
    );
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

/// A daemonless run's sandbox is planned and brought up before its engine
/// has started (see `engine::early`); it still gets what the run asked for:
/// the memory limit (a hog is OOM-killed), the size of `/tmp`, and the
/// sandbox-wide environment.
#[test]
fn a_daemonless_run_planned_at_start_gets_the_runs_own_settings() {
    common::require_root();
    let dir = test_dir();
    let out = daemonless(
        &dir,
        &[
            "run",
            "--tmp",
            "7m",
            "--env",
            "PLANNED=yes",
            "--",
            "sh",
            "-c",
            "echo $PLANNED; df -k /tmp | tail -1 | awk '{print $2}'",
        ],
    );
    assert_eq!(expect_exit(&out, 0, "mayfly run"), "yes\n7168\n");
    let out = daemonless(
        &dir,
        &[
            "run",
            "--memory",
            "48m",
            "--",
            "python3",
            "-c",
            "b = bytearray(256 * 1024 * 1024); print('survived')",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(137),
        "a 256 MiB hog under a 48 MiB limit: {out:?}"
    );
    assert!(!text(&out.stdout).contains("survived"), "{out:?}");
    assert_runs_cleaned(&dir);
}

/// A daemonless run leases its uid slot before it can read the store. If
/// the store still shows that slot held by a live sandbox (one whose owner
/// let the lease go before recording its end), the run's create takes
/// another slot, with a stub of its own under the same id, and the run
/// succeeds; the stub made at start leaves nothing behind.
#[test]
fn a_run_whose_planned_slot_is_recorded_live_replans_and_succeeds() {
    common::require_root();
    let dir = test_dir();
    let state = dir.path().join("state");
    // Every slot a run tries to lease ahead is recorded live here, owned by
    // this (live) test process, so recovery leaves the records alone.
    let me = std::process::id();
    let start = mayfly_sys::process::start_time(me).expect("this process's start time");
    let fakes: Vec<SandboxId> = {
        let store = mayfly_store::Store::open(&state).expect("opening the store");
        (0..64u32)
            .map(|n| {
                let id: SandboxId = format!("mf-fake{n:08}").parse().expect("a valid id");
                let rec = mayfly_store::SandboxRecord {
                    id: id.clone(),
                    state: SandboxState::Creating,
                    template: "host".into(),
                    created_at: 0,
                    expires_at: u64::MAX / 2,
                    limits: mayfly_types::ResolvedLimits {
                        memory_bytes: 1 << 30,
                        cpu_millis: 1000,
                        pids: 512,
                        tmp_bytes: 64 << 20,
                        nofile: 1024,
                    },
                    labels: Default::default(),
                    uid_slot: 0,
                    owner_pid: me,
                    owner_start: start,
                    init_pid: None,
                    reason: None,
                    create_ms: None,
                };
                let slot = store
                    .insert_sandbox(&rec, 64)
                    .expect("recording a fake sandbox");
                assert_eq!(slot, n);
                id
            })
            .collect()
    };
    let out = daemonless_cmd(&dir, &["run", "--", "sh", "-c", "echo replanned"])
        .env("MAYFLY_LOG", "mayfly_engine=debug")
        .env("NO_COLOR", "1")
        .output()
        .expect("running the mayfly CLI");
    assert_eq!(expect_exit(&out, 0, "mayfly run"), "replanned\n");
    assert!(
        text(&out.stderr).contains("replanning"),
        "the run did not take the replanning path: {}",
        text(&out.stderr)
    );
    let records = assert_runs_cleaned_but(&dir, &fakes);
    let run: Vec<_> = records.iter().filter(|r| !fakes.contains(&r.id)).collect();
    assert_eq!(run.len(), 1, "{records:?}");
    assert!(
        run[0].uid_slot >= 64,
        "the run kept slot {}",
        run[0].uid_slot
    );
}

/// The `.net` files of spare namespace sets in `dir`.
fn spare_nets(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "net"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits up to 5 s for `dir` to hold exactly one spare set; returns it.
fn one_spare(dir: &std::path::Path) -> std::path::PathBuf {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let nets = spare_nets(dir);
        if nets.len() == 1 {
            return nets[0].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "expected one spare set in {}, found {nets:?}",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A daemonless run joins the spare network, UTS and IPC namespaces that an
/// earlier run's reaper made (see `mayfly_sys::spare_ns`) instead of making
/// its own: its network namespace is the spare's, with `lo` up, and its
/// hostname is its id. Each set is used once (the run removes it), and every
/// run's reaper leaves a new one.
#[test]
fn daemonless_runs_join_each_pre_opened_namespace_set_once() {
    use std::os::unix::fs::MetadataExt;
    common::require_root();
    let dir = test_dir();
    let spares = dir.path().join("spare-ns");
    let run = |argv: &[&str]| {
        daemonless_cmd(&dir, argv)
            .env("MAYFLY_SPARE_NS_DIR", &spares)
            .output()
            .expect("running the mayfly CLI")
    };
    // None yet: the first run makes its own, and its reaper leaves a set.
    let out = run(&["run", "--", "true"]);
    expect_exit(&out, 0, "mayfly run");
    let spare = one_spare(&spares);
    let inode = std::fs::metadata(&spare)
        .expect("the spare's nsfs file")
        .ino();
    for kind in ["uts", "ipc"] {
        assert!(spare.with_extension(kind).exists(), "no {kind} in the set");
    }
    let out = run(&[
        "run",
        "--",
        "sh",
        "-c",
        "readlink /proc/self/ns/net; hostname; grep -c ':' /proc/net/dev; \
         python3 -c \"import socket; s = socket.create_server(('127.0.0.1', 0)); \
         socket.create_connection(s.getsockname()); print('lo up')\"",
    ]);
    let stdout = expect_exit(&out, 0, "mayfly run");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], format!("net:[{inode}]"), "{stdout}");
    assert!(lines[1].starts_with("mf-"), "hostname {:?}", lines[1]);
    // Only `lo`, and it is up (a connection to 127.0.0.1 works).
    assert_eq!(lines[2..], ["1", "lo up"], "{stdout}");
    // The set it took is gone; its reaper left another.
    let next = one_spare(&spares);
    assert_ne!(next, spare, "the used set is still offered");
    assert!(!spare.exists() && !spare.with_extension("uts").exists());
    assert_runs_cleaned(&dir);
    mayfly_sys::spare_ns::drain(&spares);
    assert!(spare_nets(&spares).is_empty());
    let mounts = common::host::mounts_mentioning(&[spares.to_str().expect("utf-8 path")]);
    assert!(mounts.is_empty(), "spare mounts left: {mounts:?}");
}
