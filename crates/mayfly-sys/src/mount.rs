//! Mount syscalls: the new mount API (idmapped detached mounts, overlay
//! contexts, `move_mount`) and the classic `mount(2)` family.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::{cstr, last_errno};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// `struct mount_attr` from `<linux/mount.h>`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A failed mount operation, with what was being mounted where.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{op} of `{path}` failed")]
    Path {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("overlay option `{key}={value}` was refused")]
    OverlayOption {
        key: String,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} failed")]
    Call {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn path_err(op: &'static str, path: &Path) -> MountError {
    MountError::Path {
        op,
        path: path.to_path_buf(),
        source: last_errno(),
    }
}

/// Clones `path` into a detached mount whose files appear owned through the
/// id mapping of `userns`, read-only. This is what lets a sandbox's root own
/// its template layers without one byte of them being chowned on disk.
pub fn idmapped_tree(path: &Path, userns: BorrowedFd<'_>) -> Result<OwnedFd, MountError> {
    let c = cstr(path).map_err(|source| MountError::Path {
        op: "open_tree",
        path: path.into(),
        source,
    })?;
    // SAFETY: c is a valid NUL-terminated string; the flags are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(path_err("open_tree", path));
    }
    // SAFETY: open_tree returned a fresh descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: attr lives across the call and its size is passed; the path is
    // the empty string with AT_EMPTY_PATH, so only `tree` is affected.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(path_err("mount_setattr(MOUNT_ATTR_IDMAP)", path));
    }
    Ok(tree)
}

/// Builds a detached overlay mount. Each lower is a detached mount fd (read
/// through `/proc/self/fd/N`, which the kernel resolves to that mount).
pub fn overlay(lowers: &[OwnedFd], upper: &Path, work: &Path) -> Result<OwnedFd, MountError> {
    // SAFETY: the name is a static NUL-terminated string.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"overlay".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(MountError::Call {
            op: "fsopen(overlay)",
            source: last_errno(),
        });
    }
    // SAFETY: fsopen returned a fresh descriptor that nothing else owns.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    let lowerdir = lowers
        .iter()
        .map(|l| format!("/proc/self/fd/{}", l.as_raw_fd()))
        .collect::<Vec<_>>()
        .join(":");
    let set = |key: &str, value: &str| -> Result<(), MountError> {
        let k = CString::new(key).expect("static key");
        let v = CString::new(value).map_err(|_| MountError::OverlayOption {
            key: key.into(),
            value: value.into(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        };
        if rc < 0 {
            return Err(MountError::OverlayOption {
                key: key.into(),
                value: value.into(),
                source: last_errno(),
            });
        }
        Ok(())
    };
    set("lowerdir", &lowerdir)?;
    set("upperdir", &upper.to_string_lossy())?;
    set("workdir", &work.to_string_lossy())?;
    // The upper layer is thrown away with the sandbox, so it never needs
    // syncing: without `volatile`, unmounting (when the sandbox's mount
    // namespace dies) syncs the whole upper filesystem, which costs 7–11 ms
    // per overlay on a busy host and makes teardown depend on unrelated
    // writes.
    // SAFETY: a NUL-terminated static key; flags take no value.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_SET_FLAG,
            c"volatile".as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    };
    if rc < 0 {
        return Err(MountError::OverlayOption {
            key: "volatile".into(),
            value: String::new(),
            source: last_errno(),
        });
    }
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc < 0 {
        return Err(path_err("overlay create", upper));
    }
    // SAFETY: fs is a configured filesystem context; nodev is a mount attribute.
    let m = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_NODEV as libc::c_uint,
        )
    };
    if m < 0 {
        return Err(path_err("fsmount(overlay)", upper));
    }
    // SAFETY: fsmount returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(m as RawFd) })
}

/// Attaches a detached mount at `target` in the caller's mount namespace.
pub fn move_mount(mnt: BorrowedFd<'_>, target: &Path) -> Result<(), MountError> {
    let t = cstr(target).map_err(|source| MountError::Path {
        op: "move_mount",
        path: target.into(),
        source,
    })?;
    // SAFETY: both strings are NUL-terminated; MOVE_MOUNT_F_EMPTY_PATH makes
    // the (empty) source path refer to `mnt` itself.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(path_err("move_mount", target));
    }
    Ok(())
}

/// Classic `mount(2)`.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), MountError> {
    let s = source.map(|s| CString::new(s).unwrap_or_default());
    let f = fstype.map(|s| CString::new(s).unwrap_or_default());
    let d = data.map(|s| CString::new(s).unwrap_or_default());
    let t = cstr(target).map_err(|source| MountError::Path {
        op: "mount",
        path: target.into(),
        source,
    })?;
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that
    // outlives the call.
    let rc = unsafe {
        libc::mount(
            p(&s),
            t.as_ptr(),
            p(&f),
            flags,
            p(&d) as *const libc::c_void,
        )
    };
    if rc < 0 {
        return Err(path_err("mount", target));
    }
    Ok(())
}

/// Makes the whole mount tree private so nothing propagates back to the host.
pub fn make_rprivate() -> Result<(), MountError> {
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
}

/// Enters `new_root` and detaches the old root entirely.
pub fn pivot_into(new_root: &Path) -> Result<(), MountError> {
    let c = cstr(new_root).map_err(|source| MountError::Path {
        op: "pivot_root",
        path: new_root.into(),
        source,
    })?;
    // SAFETY: c is a valid path string.
    if unsafe { libc::chdir(c.as_ptr()) } < 0 {
        return Err(path_err("chdir", new_root));
    }
    // The "." "." form stacks the old root on top of the new one, so the old
    // root can be detached without needing a directory for it inside.
    // SAFETY: both arguments are static strings.
    if unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) } < 0 {
        return Err(path_err("pivot_root", new_root));
    }
    // SAFETY: static string; MNT_DETACH lazily unmounts the old root.
    if unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) } < 0 {
        return Err(path_err("umount2(old root)", new_root));
    }
    // SAFETY: static string.
    if unsafe { libc::chdir(c"/".as_ptr()) } < 0 {
        return Err(path_err("chdir", Path::new("/")));
    }
    Ok(())
}

/// Bind-mounts `path` onto itself and remounts it read-only.
pub fn bind_readonly(path: &Path) -> Result<(), MountError> {
    let p = path.to_string_lossy();
    mount(Some(&p), path, None, libc::MS_BIND | libc::MS_REC, None)?;
    mount(
        None,
        path,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
}

/// Creates a directory (and parents) if missing; mode applies to new ones.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<(), MountError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|source| MountError::Path {
            op: "mkdir",
            path: path.into(),
            source,
        })
}

/// Creates an empty file to serve as a bind-mount target.
pub fn ensure_file(path: &Path) -> Result<(), MountError> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|source| MountError::Path {
            op: "create",
            path: path.into(),
            source,
        })
}

/// Whether `path` is a directory (without following a final symlink).
pub fn is_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Changes the working directory.
pub fn chdir(path: &Path) -> Result<(), MountError> {
    std::env::set_current_dir(path).map_err(|source| MountError::Path {
        op: "chdir",
        path: path.to_path_buf(),
        source,
    })
}
