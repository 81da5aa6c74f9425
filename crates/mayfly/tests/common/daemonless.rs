//! Checks for daemonless runs: every sandbox a state directory has seen
//! ended as its run said, and nothing of it is left.

use mayfly_types::{SandboxId, SandboxState};

use super::assert_no_leaks;

/// Sandbox directories left in a daemonless state directory.
pub fn sandbox_dirs_left(dir: &tempfile::TempDir) -> Vec<String> {
    std::fs::read_dir(dir.path().join("state/sandboxes"))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (up to 20 s) until every sandbox a daemonless state directory has
/// seen is recorded `destroyed` and its reaper has exited, then checks that
/// nothing of them is left on the host.
/// Returns the records.
pub fn assert_runs_cleaned(dir: &tempfile::TempDir) -> Vec<mayfly_store::SandboxRecord> {
    assert_runs_cleaned_but(dir, &[])
}

/// Where a test's daemonless runs keep their spare namespaces (see
/// `mayfly_sys::spare_ns`): beside the state directory, not the host's.
pub fn spare_ns_dir(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("spare-ns")
}

/// Waits (up to 20 s: reapers run detached, at whatever pace a busy host
/// gives them) until every sandbox of the test's state directory but
/// `except` is recorded `destroyed` and its reaper has exited; returns those
/// records.
fn wait_for_reapers(
    dir: &tempfile::TempDir,
    except: &[SandboxId],
) -> Vec<mayfly_store::SandboxRecord> {
    let state = dir.path().join("state");
    let store = mayfly_store::Store::open(&state).expect("opening the run's store");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut records = store.list_sandboxes(true).expect("listing sandboxes");
        records.retain(|r| !except.contains(&r.id));
        let done = records.iter().all(|r| {
            r.state == SandboxState::Destroyed
                && mayfly_sys::process::start_time(r.owner_pid) != Some(r.owner_start)
        });
        if done || std::time::Instant::now() >= deadline {
            return records;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Once the test's runs' reapers have exited (the last thing each does is
/// leave a spare namespace set), removes those sets: a test leaves no mount.
pub fn drain_spares(dir: &tempfile::TempDir) {
    wait_for_reapers(dir, &[]);
    drain_now(dir);
}

fn drain_now(dir: &tempfile::TempDir) {
    let spares = spare_ns_dir(dir);
    mayfly_sys::spare_ns::drain(&spares);
    let mounts = super::host::mounts_mentioning(&[&spares.to_string_lossy()]);
    assert!(mounts.is_empty(), "spare namespace mounts left: {mounts:?}");
}

/// [`assert_runs_cleaned`], for every sandbox but `except`.
pub fn assert_runs_cleaned_but(
    dir: &tempfile::TempDir,
    except: &[SandboxId],
) -> Vec<mayfly_store::SandboxRecord> {
    let records = wait_for_reapers(dir, except);
    let reasons = vec!["user"; records.len()];
    check_cleaned(dir, records, &reasons)
}

/// [`assert_runs_cleaned`], where the sandboxes ended for `reasons` (in
/// any order) rather than all by their runs' ends.
pub fn assert_runs_ended_as(
    dir: &tempfile::TempDir,
    reasons: &[&str],
) -> Vec<mayfly_store::SandboxRecord> {
    let records = wait_for_reapers(dir, &[]);
    check_cleaned(dir, records, reasons)
}

fn check_cleaned(
    dir: &tempfile::TempDir,
    records: Vec<mayfly_store::SandboxRecord>,
    reasons: &[&str],
) -> Vec<mayfly_store::SandboxRecord> {
    let state = dir.path().join("state");
    drain_now(dir);
    assert!(!records.is_empty(), "no sandbox was recorded");
    let mut ended: Vec<_> = records
        .iter()
        .map(|r| (r.state, r.reason.clone().unwrap_or_default()))
        .collect();
    let mut want: Vec<_> = reasons
        .iter()
        .map(|r| (SandboxState::Destroyed, r.to_string()))
        .collect();
    ended.sort_by(|a, b| a.1.cmp(&b.1));
    want.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(ended, want, "the runs' sandboxes did not end as expected");
    for r in &records {
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
