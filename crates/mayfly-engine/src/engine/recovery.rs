//! Start-up reconciliation of the store with the kernel.
//!
//! A sandbox whose owner (a daemon, or a daemonless `mayfly run`) is gone is
//! destroyed for good: its cgroups are emptied and removed (which kills any
//! process still in them), its directories are deleted, and its record is
//! marked failed with the reason. Objects with Mayfly's names that no live
//! owner claims (cgroups, directories) are removed too. Mounts need nothing:
//! they lived only in the dead sandboxes' mount namespaces.

use std::collections::HashSet;

use mayfly_store::SandboxRecord;
use mayfly_types::SandboxState;

use super::Inner;
use crate::plan;

/// What reconciliation found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    /// Records of sandboxes whose owner had died, now marked failed.
    pub records_failed: usize,
    /// Cgroup directories removed.
    pub cgroups_removed: usize,
    /// Sandbox directories removed.
    pub dirs_removed: usize,
    /// Sandboxes left alone because their owner is alive.
    pub foreign_live: usize,
    pub errors: Vec<String>,
}

fn owner_alive(rec: &SandboxRecord, me: (u32, u64)) -> bool {
    if (rec.owner_pid, rec.owner_start) == me {
        return false;
    }
    mayfly_sys::process::start_time(rec.owner_pid) == Some(rec.owner_start)
}

pub(super) fn reconcile(inner: &Inner) -> RecoveryReport {
    let mut report = RecoveryReport::default();
    let records = match inner.store.list_sandboxes(false) {
        Ok(r) => r,
        Err(e) => {
            report.errors.push(format!("listing sandboxes: {e}"));
            Vec::new()
        }
    };
    let mut keep: HashSet<String> = HashSet::new();
    // This engine's own early stub is being made while this runs.
    if let Some(early) = &*inner.early_stub.lock().unwrap_or_else(|p| p.into_inner()) {
        keep.insert(early.id.to_string());
    }
    for rec in records {
        if owner_alive(&rec, inner.owner) {
            report.foreign_live += 1;
            keep.insert(rec.id.to_string());
            continue;
        }
        match plan::cgroup::plan(inner.layout(), &rec.id, &rec.limits) {
            Ok(p) => match mayfly_sys::cgroup::remove(&p) {
                Ok(()) => {}
                Err(e) => report.errors.push(format!("{}: {e}", rec.id)),
            },
            Err(e) => report.errors.push(format!("{}: {e}", rec.id)),
        }
        let next = SandboxState::Failed;
        let why = "owner_died: recovered at daemon start";
        if let Err(e) = inner.store.transition(&rec.id, next, Some(why)) {
            report.errors.push(format!("{}: {e}", rec.id));
        } else {
            report.records_failed += 1;
            let _ = inner.store.add_event(
                Some(&rec.id),
                "recovered",
                &serde_json::json!({"previous_state": rec.state.as_str(), "owner_pid": rec.owner_pid}),
            );
        }
    }
    // Cgroups of this store's sandboxes that nobody alive claims. The cgroup
    // tree is shared by every Mayfly instance on the host (another daemon or
    // a daemonless run with its own state directory), so a cgroup with no
    // record here belongs to someone else and is left alone.
    match mayfly_sys::cgroup::list_leftovers(inner.layout()) {
        Ok(dirs) => {
            for d in dirs {
                let name = d.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let ours = name
                    .parse::<mayfly_types::SandboxId>()
                    .ok()
                    .is_some_and(|id| matches!(inner.store.get_sandbox(&id), Ok(Some(_))));
                if keep.contains(name) || !ours {
                    continue;
                }
                match mayfly_sys::cgroup::remove_dir(&d) {
                    Ok(()) => report.cgroups_removed += 1,
                    Err(e) => report.errors.push(format!("{}: {e}", d.display())),
                }
            }
        }
        Err(e) => report.errors.push(format!("listing cgroups: {e}")),
    }
    // Stubs a dead owner of this state directory made and never used (they
    // have no record; their markers name them).
    let stub_markers = if inner.no_daemon {
        std::fs::read_dir(inner.cfg.stubs_dir()).ok()
    } else {
        // A live daemon owns the directory: its stubs are not ours to sweep.
        None
    };
    if let Some(entries) = stub_markers {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                continue;
            }
            let Ok(id) = name.parse::<mayfly_types::SandboxId>() else {
                let _ = std::fs::remove_file(e.path());
                continue;
            };
            match plan::cgroup::plan(inner.layout(), &id, &inner.cfg.default_limits) {
                Ok(p) => match mayfly_sys::cgroup::remove(&p) {
                    Ok(()) => report.cgroups_removed += 1,
                    Err(err) => report.errors.push(format!("{id}: {err}")),
                },
                Err(err) => report.errors.push(format!("{id}: {err}")),
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    // Directories: sandbox dirs nobody claims, and the trash.
    let sandboxes = inner.cfg.sandboxes_dir();
    if let Ok(entries) = std::fs::read_dir(&sandboxes) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // A live daemon's idle stubs have directories but no record.
            let live_stub = !inner.no_daemon && inner.cfg.stubs_dir().join(&name).exists();
            if keep.contains(&name) || live_stub {
                continue;
            }
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => report.dirs_removed += 1,
                Err(err) => report.errors.push(format!("{}: {err}", e.path().display())),
            }
        }
    }
    // The trash directory stays; what a crash left in it goes.
    let trash = inner.cfg.trash_dir();
    if let Ok(entries) = std::fs::read_dir(&trash) {
        for e in entries.flatten() {
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                report.errors.push(format!("{}: {err}", e.path().display()));
            }
        }
    }
    if report != RecoveryReport::default() {
        tracing::info!(?report, "reconciled state left by a previous owner");
    }
    report
}
