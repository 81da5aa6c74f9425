//! Start-up reconciliation of the store with the kernel.
//!
//! A sandbox whose owner (a daemon, or a daemonless `mayfly run`) is gone is
//! destroyed for good: its cgroups are emptied and removed (which kills any
//! process still in them), its directories are deleted, and its record is
//! marked failed with the reason. Objects with Mayfly's names that no live
//! owner claims (cgroups, directories) are removed too. Mounts need nothing:
//! they lived only in the dead sandboxes' mount namespaces.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use mayfly_store::SandboxRecord;
use mayfly_types::SandboxState;

use super::owner::Owner;
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
    /// Cgroups of other instances' sandboxes whose instance is gone for
    /// good, removed.
    pub orphans_removed: usize,
    /// Sandboxes left alone because their owner is alive.
    pub foreign_live: usize,
    pub errors: Vec<String>,
}

fn owner_alive(rec: &SandboxRecord, me: Owner) -> bool {
    let owner = Owner {
        pid: rec.owner_pid,
        start: rec.owner_start,
    };
    owner != me && owner.is_alive()
}

/// The names in a directory; none when it cannot be read.
fn names(dir: &Path) -> Vec<(String, PathBuf)> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a directory tree; one already gone (its live owner finished
/// with it meanwhile) is no error.
fn remove_tree(path: &Path, report: &mut RecoveryReport) -> bool {
    match std::fs::remove_dir_all(path) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => {
            report.errors.push(format!("{}: {e}", path.display()));
            false
        }
    }
}

pub(super) fn reconcile(inner: &Inner) -> RecoveryReport {
    let mut report = RecoveryReport::default();
    // What exists, listed before any claim is read. Every owner writes its
    // claim (a stub marker, then a record) before it makes cgroups or
    // directories, and drops it only after removing them, so whatever is
    // listed here and still claimed is seen as claimed below: another
    // instance starting or finishing a sandbox meanwhile is never swept.
    let cgroups = match mayfly_sys::cgroup::list_leftovers(inner.layout()) {
        Ok(dirs) => dirs,
        Err(e) => {
            report.errors.push(format!("listing cgroups: {e}"));
            Vec::new()
        }
    };
    let dirs = names(&inner.cfg.sandboxes_dir());
    let trash = names(&inner.cfg.trash_dir());
    // Claims: stub markers of live owners (this engine's early stub among
    // them), then records of live owners.
    let mut keep: HashSet<String> = HashSet::new();
    let mut dead_stubs = Vec::new();
    for (name, path) in names(&inner.cfg.stubs_dir()) {
        if name.starts_with('.') {
            // A marker being written (see `owner::write_marker`), or one
            // whose writer died before its rename.
            if temp_marker_is_dead(&path) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let Ok(id) = name.parse::<mayfly_types::SandboxId>() else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let owner = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| Owner::parse_marker(&t));
        if owner.is_some_and(|o| o.is_alive()) {
            keep.insert(name);
        } else {
            dead_stubs.push((id, path));
        }
    }
    let records = match inner.store.list_sandboxes(false) {
        Ok(r) => r,
        Err(e) => {
            report.errors.push(format!("listing sandboxes: {e}"));
            Vec::new()
        }
    };
    for rec in records {
        if owner_alive(&rec, inner.owner) {
            report.foreign_live += 1;
            keep.insert(rec.id.to_string());
            continue;
        }
        // Only while the record still names the owner found dead: between
        // the listing and now, a daemonless run may have handed its sandbox
        // to its (live) reaper and exited.
        let next = SandboxState::Failed;
        let why = "owner_died: recovered at daemon start";
        let owner = (rec.owner_pid, rec.owner_start);
        match inner
            .store
            .transition_if_owned(&rec.id, next, Some(why), owner)
        {
            Err(mayfly_store::StoreError::OwnerChanged { .. }) => {
                report.foreign_live += 1;
                keep.insert(rec.id.to_string());
                continue;
            }
            Err(e) => {
                report.errors.push(format!("{}: {e}", rec.id));
                continue;
            }
            Ok(()) => {}
        }
        match plan::cgroup::plan(inner.layout(), &rec.id, &rec.limits) {
            Ok(p) => match mayfly_sys::cgroup::remove(&p) {
                Ok(()) => {}
                Err(e) => report.errors.push(format!("{}: {e}", rec.id)),
            },
            Err(e) => report.errors.push(format!("{}: {e}", rec.id)),
        }
        report.records_failed += 1;
        let _ = inner.store.add_event(
            Some(&rec.id),
            "recovered",
            &serde_json::json!({"previous_state": rec.state.as_str(), "owner_pid": rec.owner_pid}),
        );
    }
    // Stubs a dead owner made and never used (they have no record).
    for (id, marker) in &dead_stubs {
        if keep.contains(id.as_str()) {
            // A record took the stub over; its owner is alive.
            continue;
        }
        match plan::cgroup::plan(inner.layout(), id, &inner.cfg.default_limits) {
            Ok(p) => match mayfly_sys::cgroup::remove(&p) {
                Ok(()) => report.cgroups_removed += 1,
                Err(err) => report.errors.push(format!("{id}: {err}")),
            },
            Err(err) => report.errors.push(format!("{id}: {err}")),
        }
        let _ = std::fs::remove_file(marker);
    }
    // Cgroups of this store's sandboxes that nobody alive claims. The cgroup
    // tree is shared by every Mayfly instance on the host (another daemon or
    // a daemonless run with its own state directory), so a cgroup with no
    // record here belongs to someone else: it is removed only when it is an
    // orphan (see `remove_orphans`).
    let mut foreign = Vec::new();
    for d in cgroups {
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ours = name
            .parse::<mayfly_types::SandboxId>()
            .ok()
            .is_some_and(|id| matches!(inner.store.get_sandbox(&id), Ok(Some(_))));
        if keep.contains(name) || !d.exists() {
            continue;
        }
        if !ours {
            foreign.push(d);
            continue;
        }
        match mayfly_sys::cgroup::remove_dir(&d) {
            Ok(()) => report.cgroups_removed += 1,
            Err(e) => report.errors.push(format!("{}: {e}", d.display())),
        }
    }
    remove_orphans(inner, foreign, &mut report);
    // Directories nobody alive claims, and what a crash left in the trash.
    for (name, path) in dirs {
        if !keep.contains(&name) && remove_tree(&path, &mut report) {
            report.dirs_removed += 1;
        }
    }
    for (name, path) in trash {
        if !keep.contains(&name) {
            remove_tree(&path, &mut report);
        }
    }
    if report != RecoveryReport::default() {
        tracing::info!(?report, "reconciled state left by a previous owner");
    }
    report
}

/// A cgroup younger than this may be one another instance is making (empty
/// until its first process joins), so it is never taken for an orphan.
const ORPHAN_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(30);

/// Removes the cgroups of other instances' sandboxes whose instance is gone
/// for good (killed, and its state directory deleted or never served
/// again), which no one else would ever remove: a cgroup that no held uid
/// lease names (every live sandbox's lease names it, from before its
/// cgroups exist until after they are gone), with no task in it or under
/// it, made at least [`ORPHAN_MIN_AGE`] ago. Nothing in it is killed.
fn remove_orphans(inner: &Inner, foreign: Vec<PathBuf>, report: &mut RecoveryReport) {
    if foreign.is_empty() {
        return;
    }
    let held = match super::leases::held_ids(&inner.cfg.slot_lease_dir) {
        Ok(h) => h,
        Err(e) => {
            report.errors.push(format!("reading the uid leases: {e}"));
            return;
        }
    };
    for d in foreign {
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if held.contains(name) || name.parse::<mayfly_types::SandboxId>().is_err() {
            continue;
        }
        match mayfly_sys::cgroup::remove_orphan(&d, ORPHAN_MIN_AGE) {
            Ok(true) => report.orphans_removed += 1,
            Ok(false) => {}
            Err(e) => report.errors.push(format!("{}: {e}", d.display())),
        }
    }
}

/// Whether a stub marker's temporary file was left by a writer that died
/// before renaming it: it names a dead owner, or, still empty or cut short,
/// it is older than any write of a few bytes could take. Nothing was made
/// under its name before the rename, so removing it frees nothing else.
fn temp_marker_is_dead(path: &std::path::Path) -> bool {
    const STALE: std::time::Duration = std::time::Duration::from_secs(60);
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    match Owner::parse_marker(&text) {
        Some(owner) => !owner.is_alive(),
        None => std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE),
    }
}
