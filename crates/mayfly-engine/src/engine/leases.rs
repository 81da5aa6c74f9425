//! Host-wide leases on uid slots.
//!
//! The store hands out the lowest slot that none of *its* live sandboxes
//! holds, but several Mayfly instances (daemons or daemonless runs with other
//! state directories) can share a host, and two sandboxes with the same uid
//! range would own each other's files and could signal each other's
//! processes. So a slot is also leased host-wide: an exclusive `flock` on
//! `<lease dir>/<slot>`, taken without blocking. The engine keeps the lock
//! for the sandbox's life, and the sandbox's stub holds a copy of the same
//! open file, so the lease outlives a crashed daemon for exactly as long as
//! the sandbox's processes do, and the kernel releases it when both are gone.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The default lease directory; `/run` is per boot, like the leases.
pub const DEFAULT_LEASE_DIR: &str = "/run/mayfly/uid-slots";

/// Makes the lease directory (root-only).
pub(crate) fn prepare(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The lock file of `slot`.
pub(crate) fn lease_path(dir: &Path, slot: u32) -> PathBuf {
    dir.join(format!("slot-{slot}"))
}

/// Takes the lease on `slot`, or `None` if another holder has it.
pub(crate) fn try_lease(dir: &Path, slot: u32) -> std::io::Result<Option<File>> {
    mayfly_sys::process::try_lock_file(&lease_path(dir, slot))
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Takes the lease on `slot` for sandbox `id`, and writes the id into the
/// lease file: an instance that finds a sandbox cgroup it has no record of
/// asks the leases whether a live holder names it ([`held_ids`]). Written
/// before the sandbox's first cgroup exists.
///
/// The id overwrites the last holder's in place, and the file is cut only
/// past it (ids have one length, so in practice never). Cutting it to zero
/// first would, on ext4 with `discard` (or `/run` on disk, as on some
/// hosts), free its block with a synchronous discard and make the close
/// write the new one out: a disk wait in every create.
pub(crate) fn lease_for(dir: &Path, slot: u32, id: &str) -> std::io::Result<Option<File>> {
    let Some(f) = try_lease(dir, slot)? else {
        return Ok(None);
    };
    f.write_all_at(id.as_bytes(), 0)?;
    let len = id.len() as u64;
    if f.metadata()?.len() != len {
        f.set_len(len)?;
    }
    Ok(Some(f))
}

/// The sandbox ids that the held leases name. A free lease found on the way
/// is held for a moment (a create that tries it then takes another slot).
pub(crate) fn held_ids(dir: &Path) -> std::io::Result<HashSet<String>> {
    let mut held = HashSet::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(held),
        Err(e) => return Err(e),
    };
    for e in entries.flatten() {
        let path = e.path();
        let Some(slot) = e
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("slot-"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Read first: a holder writes its id before it makes a cgroup, so
        // what a held lease says here covers every cgroup listed earlier.
        let Ok(id) = std::fs::read_to_string(&path) else {
            continue;
        };
        if try_lease(dir, slot)?.is_none() {
            held.insert(id.trim().to_owned());
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leased_slot_is_refused_until_its_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let lease_dir = dir.path().join("leases");
        prepare(&lease_dir).unwrap();
        let held = try_lease(&lease_dir, 3)
            .unwrap()
            .expect("a free slot is leased");
        // A second open file description (another instance) is refused.
        assert!(try_lease(&lease_dir, 3).unwrap().is_none());
        assert!(try_lease(&lease_dir, 4).unwrap().is_some());
        // A copy of the descriptor (the stub's) keeps the lease alive.
        let copy = held.try_clone().unwrap();
        drop(held);
        assert!(try_lease(&lease_dir, 3).unwrap().is_none());
        drop(copy);
        assert!(try_lease(&lease_dir, 3).unwrap().is_some());
    }

    #[test]
    fn held_leases_name_their_sandboxes_and_free_ones_name_none() {
        let dir = tempfile::tempdir().unwrap();
        let lease_dir = dir.path().join("leases");
        prepare(&lease_dir).unwrap();
        let a = lease_for(&lease_dir, 0, "mf-aaaaaaaaaaaa")
            .unwrap()
            .unwrap();
        let longer = lease_for(&lease_dir, 1, "mf-bbbbbbbbbbbbbbbb")
            .unwrap()
            .unwrap();
        drop(longer);
        // Slot 1 is leased again by a sandbox with a shorter id.
        let c = lease_for(&lease_dir, 1, "mf-cccc").unwrap().unwrap();
        let stub_copy = a.try_clone().unwrap();
        drop(a);
        assert!(lease_for(&lease_dir, 0, "mf-other").unwrap().is_none());
        let held = held_ids(&lease_dir).unwrap();
        assert_eq!(
            held,
            HashSet::from(["mf-aaaaaaaaaaaa".to_owned(), "mf-cccc".to_owned()])
        );
        drop((stub_copy, c));
        assert!(held_ids(&lease_dir).unwrap().is_empty());
        assert!(held_ids(&dir.path().join("none")).unwrap().is_empty());
    }

    #[test]
    fn an_unusable_lease_dir_is_an_error_not_a_busy_slot() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir");
        assert!(try_lease(&missing, 0).is_err());
    }
}
