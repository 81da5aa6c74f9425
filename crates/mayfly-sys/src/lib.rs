//! All of Mayfly's unsafe and syscall code, behind small, documented wrappers.
//!
//! Nothing outside this crate calls `libc` directly. Each module has its own
//! error enum whose variants carry the path, pid or value involved.

pub mod capture;
pub mod cgroup;
pub mod du;
pub mod fs;
pub mod hardening;
pub mod image;
pub mod ipc;
pub mod layer;
pub mod mount;
pub mod net;
pub mod netns;
pub mod nft;
pub mod process;
pub mod spare_ns;
pub mod spawn;
pub mod supervise;
pub mod veth;

use std::ffi::CString;
use std::path::Path;

/// The errno of the last failed call, as an `io::Error`.
pub(crate) fn last_errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A path as a C string; interior NUL bytes are an `InvalidInput` error.
pub(crate) fn cstr(path: &Path) -> std::io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))
}
