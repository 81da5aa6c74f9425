//! The overlayfs markers an unpacked image layer needs.
//!
//! OCI layers express deletions as `.wh.NAME` files and "this directory
//! replaces the lower one" as `.wh..wh..opq`. Overlayfs has its own forms:
//! a character device 0/0 named `NAME` (a whiteout) and the
//! `trusted.overlay.opaque` xattr set to `y` on a directory. Both are only
//! honoured in lower directories when the overlay is mounted from the host's
//! user namespace, which is how Mayfly mounts it (the stub is host root).
//! Every call is relative to a directory descriptor, like [`crate::fs`].

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag};

use crate::fs::FsError;

/// The xattr that marks an overlayfs lower directory as opaque.
pub const OPAQUE_XATTR: &std::ffi::CStr = c"trusted.overlay.opaque";

/// Creates the overlayfs whiteout `name` below `dir`: a character device
/// with device number 0/0 and no permissions. It fails if `name` exists.
pub fn make_whiteout(dir: impl AsFd, name: &Path) -> Result<(), FsError> {
    nix::sys::stat::mknodat(dir, name, SFlag::S_IFCHR, Mode::empty(), 0)
        .map_err(|e| FsError::from_errno(e, "create whiteout", name.display().to_string()))
}

/// Marks the directory open at `dir` opaque (`trusted.overlay.opaque=y`).
/// `dir` must be a real open descriptor (not `O_PATH`): `fsetxattr` needs
/// one. `path` is only for error messages.
pub fn set_opaque(dir: impl AsFd, path: &Path) -> Result<(), FsError> {
    let value = b"y";
    // SAFETY: the descriptor is borrowed for the call, the name is a static
    // NUL-terminated string and the value buffer outlives the call with its
    // exact length passed.
    let rc = unsafe {
        libc::fsetxattr(
            dir.as_fd().as_raw_fd(),
            OPAQUE_XATTR.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        return Err(FsError::from_errno(
            Errno::last(),
            "mark opaque",
            path.display().to_string(),
        ));
    }
    Ok(())
}

/// Whether the directory open at `dir` carries `trusted.overlay.opaque=y`.
pub fn is_opaque(dir: impl AsFd, path: &Path) -> Result<bool, FsError> {
    let mut buf = [0u8; 8];
    // SAFETY: the descriptor is borrowed for the call, the name is a static
    // NUL-terminated string and the buffer's exact length is passed.
    let rc = unsafe {
        libc::fgetxattr(
            dir.as_fd().as_raw_fd(),
            OPAQUE_XATTR.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if rc < 0 {
        return match Errno::last() {
            Errno::ENODATA => Ok(false),
            e => Err(FsError::from_errno(
                e,
                "read the xattrs of",
                path.display().to_string(),
            )),
        };
    }
    Ok(usize::try_from(rc).ok().and_then(|n| buf.get(..n)) == Some(b"y".as_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{open, stat_at, Access, Kind, Resolve};

    #[test]
    fn whiteout_is_a_zero_char_device_and_opaque_round_trips() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (mknod and trusted.* xattrs); run it as root");
        }
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::File::open(dir.path()).unwrap();
        let fd = open(&root, Path::new("."), Access::Dir, Resolve::Child).unwrap();
        make_whiteout(&fd, Path::new("gone")).unwrap();
        let st =
            nix::sys::stat::fstatat(&fd, "gone", nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).unwrap();
        assert_eq!(st.st_rdev, 0);
        assert_eq!(
            stat_at(&fd, Path::new("gone")).unwrap().kind,
            Kind::CharDevice
        );
        assert!(make_whiteout(&fd, Path::new("gone")).is_err());
        assert!(!is_opaque(&fd, dir.path()).unwrap());
        set_opaque(&fd, dir.path()).unwrap();
        assert!(is_opaque(&fd, dir.path()).unwrap());
    }
}
