//! Daemonless `mayfly run`, made ahead: the sandbox planned before the
//! engine starts (with the run's own settings, and replanned when its
//! uid slot turns out to be recorded live), and the pre-opened network,
//! UTS and IPC namespaces each run joins once.

mod common;

use common::daemonless::{assert_runs_cleaned, assert_runs_cleaned_but};
use common::{daemonless, daemonless_cmd, expect_exit, test_dir, text};
use mayfly_types::{SandboxId, SandboxState};

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
                        disk_bytes: 1 << 30,
                    },
                    labels: Default::default(),
                    uid_slot: 0,
                    owner_pid: me,
                    owner_start: start,
                    init_pid: None,
                    reason: None,
                    create_ms: None,
                    tenant: Some("default".into()),
                    pool: None,
                    claimed_at: None,
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

/// Waits up to 15 s (a reaper leaves its set after its run has returned,
/// at its own pace) for `dir` to hold exactly one spare set; returns it.
fn one_spare(dir: &std::path::Path) -> std::path::PathBuf {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
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
    // `daemonless` runs keep their spares in the test's own directory.
    let spares = common::daemonless::spare_ns_dir(&dir);
    let run = |argv: &[&str]| daemonless(&dir, argv);
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
