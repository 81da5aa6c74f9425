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

use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
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
    fn an_unusable_lease_dir_is_an_error_not_a_busy_slot() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir");
        assert!(try_lease(&missing, 0).is_err());
    }
}
