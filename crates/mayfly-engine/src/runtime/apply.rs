//! The thin applier of [`MountOp`]s. Every decision was made by the plan.

use std::path::Path;

use mayfly_sys::mount::{self, MountError};

use crate::plan::mounts::MountOp;

const NOSUID: libc::c_ulong = libc::MS_NOSUID;
const NODEV: libc::c_ulong = libc::MS_NODEV;
const NOEXEC: libc::c_ulong = libc::MS_NOEXEC;

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// Performs one mount step. Masks of paths that do not exist are skipped,
/// as in runc: a kernel without `/proc/acpi` has nothing to hide there.
pub fn apply_mount_op(op: &MountOp) -> Result<(), MountError> {
    match op {
        MountOp::Mkdir { path, mode } => {
            if !mount::is_dir(path) {
                mount::ensure_dir(path, *mode)?;
            }
            Ok(())
        }
        MountOp::Proc { path } => mount::mount(
            Some("proc"),
            path,
            Some("proc"),
            NOSUID | NODEV | NOEXEC,
            None,
        ),
        MountOp::Sysfs { path } => mount::mount(
            Some("sysfs"),
            path,
            Some("sysfs"),
            NOSUID | NODEV | NOEXEC | libc::MS_RDONLY,
            None,
        ),
        MountOp::Tmpfs { path, data, noexec } => {
            let flags = NOSUID | NODEV | if *noexec { NOEXEC } else { 0 };
            mount::mount(Some("tmpfs"), path, Some("tmpfs"), flags, Some(data))
        }
        MountOp::BindDevice { src, dst } => {
            mount::ensure_file(dst)?;
            let s = src.to_string_lossy();
            mount::mount(Some(&s), dst, None, libc::MS_BIND, None)
        }
        MountOp::Devpts { path } => mount::mount(
            Some("devpts"),
            path,
            Some("devpts"),
            NOSUID | NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        ),
        MountOp::Symlink { target, link } => {
            std::os::unix::fs::symlink(target, link).map_err(|source| MountError::Path {
                op: "symlink",
                path: link.clone(),
                source,
            })
        }
        MountOp::MaskFile { path } => {
            if !exists(path) {
                return Ok(());
            }
            mount::mount(Some("/dev/null"), path, None, libc::MS_BIND, None)
        }
        MountOp::MaskDir { path } => {
            if !mount::is_dir(path) {
                return Ok(());
            }
            mount::mount(
                Some("tmpfs"),
                path,
                Some("tmpfs"),
                libc::MS_RDONLY | NOSUID | NODEV | NOEXEC,
                Some("size=0"),
            )
        }
        MountOp::ReadOnly { path } => {
            if !exists(path) {
                return Ok(());
            }
            mount::bind_readonly(path)
        }
    }
}
