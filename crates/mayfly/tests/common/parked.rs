//! Daemonless runs with parking on (the default): each run's reaper
//! starts a keeper that parks a sandbox for the next run.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mayfly_types::{SandboxId, SandboxState};

use super::{daemonless, daemonless_cmd, expect_exit};

/// A daemonless CLI call with parking on, in the test's state directory.
pub fn parked_cmd(dir: &tempfile::TempDir, args: &[&str]) -> Command {
    let mut cmd = daemonless_cmd(dir, args);
    cmd.env("MAYFLY_PARK", "1");
    cmd
}

pub fn parked_run(dir: &tempfile::TempDir, args: &[&str]) -> Output {
    parked_cmd(dir, args)
        .output()
        .expect("running the mayfly CLI")
}

pub fn socket(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("state/parked/keeper-0.sock")
}

fn store(dir: &tempfile::TempDir) -> mayfly_store::Store {
    mayfly_store::Store::open(&dir.path().join("state")).expect("opening the store")
}

/// The records of the test's state directory.
pub fn records(dir: &tempfile::TempDir) -> Vec<mayfly_store::SandboxRecord> {
    store(dir).list_sandboxes(true).expect("listing sandboxes")
}

/// Waits (up to 15 s) for a keeper to have parked a sandbox; returns the
/// sandbox's record (its owner is the keeper).
pub fn wait_parked(dir: &tempfile::TempDir) -> mayfly_store::SandboxRecord {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if socket(dir).exists() {
            let parked: Vec<_> = records(dir)
                .into_iter()
                .filter(|r| r.state == SandboxState::Ready)
                .collect();
            if let [one] = parked.as_slice() {
                return one.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no sandbox was parked within 15 s; records: {:?}",
            records(dir)
                .iter()
                .map(|r| (r.id.to_string(), r.state, r.reason.clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `mayfly prune`, which must succeed.
pub fn prune(dir: &tempfile::TempDir) -> String {
    let out = daemonless(dir, &["prune"]);
    expect_exit(&out, 0, "mayfly prune")
}

/// Waits (up to 30 s: keepers and reapers run detached, at whatever pace a
/// busy host gives them) until no record of the state directory is live
/// and no owner they name still runs, failing if that does not happen;
/// then checks that nothing of any of them is left on the host. Returns
/// the records.
pub fn assert_all_gone(dir: &tempfile::TempDir) -> Vec<mayfly_store::SandboxRecord> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let owner_runs = |r: &mayfly_store::SandboxRecord| {
        mayfly_sys::process::start_time(r.owner_pid) == Some(r.owner_start)
    };
    let records = loop {
        let records = records(dir);
        if records
            .iter()
            .all(|r| r.state.is_terminal() && !owner_runs(r))
        {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "30 s on, not every record ended with its owner gone: {:?}",
            records
                .iter()
                .filter(|r| !r.state.is_terminal() || owner_runs(r))
                .map(|r| (r.id.to_string(), r.state, r.owner_pid, owner_runs(r)))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    super::daemonless::drain_spares(dir);
    let ids: Vec<String> = records.iter().map(|r| r.id.to_string()).collect();
    super::assert_no_leaks(&dir.path().join("state"), &ids);
    let left = super::daemonless::sandbox_dirs_left(dir);
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
    assert!(!socket(dir).exists(), "a keeper's socket is left");
    records
}

/// The record of sandbox `id`.
pub fn record(dir: &tempfile::TempDir, id: &SandboxId) -> mayfly_store::SandboxRecord {
    store(dir)
        .get_sandbox(id)
        .expect("reading a record")
        .expect("the record exists")
}

/// The callers of every exec the store audited in sandbox `id`.
pub fn audit_callers(dir: &tempfile::TempDir, id: &SandboxId) -> Vec<String> {
    store(dir)
        .execs(id)
        .expect("reading the audit trail")
        .into_iter()
        .map(|a| a.caller)
        .collect()
}

/// A test directory whose keepers are retired when it is dropped, even by
/// a failing test, before the directory goes (a keeper outlives its runs).
pub struct ParkedDir(Option<tempfile::TempDir>);

pub fn parked_dir() -> ParkedDir {
    ParkedDir(Some(super::test_dir()))
}

impl std::ops::Deref for ParkedDir {
    type Target = tempfile::TempDir;
    fn deref(&self) -> &tempfile::TempDir {
        self.0.as_ref().expect("the directory")
    }
}

impl Drop for ParkedDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = daemonless(&dir, &["prune"]);
            let _ = dir.close();
        }
    }
}

/// A test directory in which a first (cold) run has had a sandbox parked;
/// and that sandbox's record.
pub fn parked_start() -> (ParkedDir, mayfly_store::SandboxRecord) {
    let dir = parked_dir();
    expect_exit(&parked_run(&dir, &["run", "--", "true"]), 0, "first run");
    let parked = wait_parked(&dir);
    (dir, parked)
}

/// Ends a test whose last run leaves a keeper: waits for it to park,
/// prunes, and checks that nothing is left. Returns the records.
pub fn prune_parked(dir: &ParkedDir) -> Vec<mayfly_store::SandboxRecord> {
    wait_parked(dir);
    prune(dir);
    assert_all_gone(dir)
}

/// The first line a spawned run printed on its piped stdout.
pub fn first_line(child: &mut std::process::Child) -> String {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().expect("a piped stdout")),
        &mut line,
    )
    .expect("reading the run's stdout");
    line
}

/// Waits (up to `secs`) for sandbox `id` to be recorded destroyed; returns
/// the reason recorded.
pub fn wait_destroyed(dir: &tempfile::TempDir, id: &SandboxId, secs: u64) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = record(dir, id);
        if r.state == SandboxState::Destroyed {
            return r.reason;
        }
        assert!(
            Instant::now() < deadline,
            "{id} was not destroyed within {secs} s: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
