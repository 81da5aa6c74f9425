//! Creating inodes as a sandbox's root, on this thread only.
//!
//! A filesystem mounted inside a sandbox's user namespace (the tmpfs on its
//! `/tmp`, `/dev/shm`, `/run/secrets`) belongs to that namespace, and the
//! kernel refuses (`EOVERFLOW`) to create an inode there whose owner it
//! cannot map, such as host root, the daemon. [`CreateAs`] switches the
//! calling thread's filesystem uid and gid to ids the sandbox maps, keeping
//! the thread's capabilities, so the create goes through; the caller then
//! gives the inode its final owner as before.
//!
//! Filesystem ids and capabilities are per thread in Linux (glibc's
//! `setfsuid` does not broadcast to other threads, unlike `setuid`), so
//! nothing else in the process changes, and the guard restores both when it
//! drops, also on unwinding: the thread may be a shared blocking-pool thread.

use caps::{CapSet, CapsHashSet};
use nix::errno::Errno;

use super::FsError;

/// The thread creates as another uid and gid until this drops.
#[must_use = "the ids switch back when the guard drops"]
#[derive(Debug)]
pub struct CreateAs {
    effective: CapsHashSet,
}

impl CreateAs {
    /// Files and directories this thread creates from now on are owned by
    /// host `uid`:`gid`. The thread keeps its effective capabilities
    /// (switching the filesystem uid away from 0 would drop the file
    /// ones), so permission checks are those of the daemon, as without
    /// the guard.
    pub fn enter(uid: u32, gid: u32) -> Result<CreateAs, FsError> {
        let effective = caps::read(None, CapSet::Effective).map_err(cap_err)?;
        // SAFETY: setfsgid and setfsuid take plain integers, change only
        // the calling thread's credentials, and cannot fail in a way that
        // corrupts state; the result is checked by reading the ids back.
        unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
        }
        let guard = CreateAs { effective };
        // SAFETY: as above; an invalid id (-1) changes nothing and returns
        // the current one.
        let (now_uid, now_gid) = unsafe { (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX)) };
        if now_uid as u32 != uid || now_gid as u32 != gid {
            return Err(FsError::Os {
                op: "setfsuid",
                path: String::new(),
                errno: Errno::EPERM,
            });
        }
        caps::set(None, CapSet::Effective, &guard.effective).map_err(cap_err)?;
        Ok(guard)
    }
}

impl Drop for CreateAs {
    fn drop(&mut self) {
        // SAFETY: as in `enter`. Back to fsuid 0, the kernel raises the
        // file capabilities again; the effective set is then restored
        // exactly.
        unsafe {
            libc::setfsuid(0);
            libc::setfsgid(0);
        }
        let _ = caps::set(None, CapSet::Effective, &self.effective);
    }
}

fn cap_err(_: caps::errors::CapsError) -> FsError {
    FsError::Os {
        op: "capset",
        path: String::new(),
        errno: Errno::last(),
    }
}

/// Runs `create`; if the filesystem refused the creator's ids, runs it
/// again as `uid`:`gid` (see [`CreateAs`]).
pub fn create_mapped<T>(
    uid: u32,
    gid: u32,
    mut create: impl FnMut() -> Result<T, FsError>,
) -> Result<T, FsError> {
    match create() {
        Err(e) if e.is_unmapped_creator() => {
            let _as = CreateAs::enter(uid, gid)?;
            create()
        }
        other => other,
    }
}
