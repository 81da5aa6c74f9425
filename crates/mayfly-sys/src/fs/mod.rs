//! Root-confined file syscalls: the building blocks of the sandbox file API.
//!
//! The daemon runs as host root and reaches a sandbox's filesystem through a
//! directory descriptor (the "root fd", opened from `/proc/<init>/root`).
//! Code inside the sandbox is hostile and races the daemon, so nothing here
//! takes a host path: every call is relative to a descriptor, and every walk
//! from the root goes through `openat2(2)`, which lets the kernel enforce the
//! confinement instead of a check-then-use sequence in userspace:
//!
//! * [`Resolve::InRoot`] (`RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`) treats the
//!   root fd as `/` for absolute symlinks and `..`, and refuses the
//!   `/proc/<pid>/root`-style magic links that would jump to the host.
//! * [`Resolve::Child`] (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_XDEV`) is for fd-relative walks (recursive remove, tar
//!   extraction and packing) that must never follow a symlink or enter a
//!   mount, whatever the sandbox swaps in between two calls.
//!
//! Reading goes through an `O_PATH` handle first: the inode type is checked on
//! the handle and only a regular file is then reopened for reading (see
//! [`open_regular_for_read`]), so a planted FIFO or device node is never
//! opened, which could block or have side effects.

mod creds;
mod dir;
mod error;
mod open;
mod ops;
mod sparse;

pub use creds::{create_mapped, CreateAs};
pub use dir::{list_dir, DirEntry, DirListing};
pub use error::FsError;
pub use open::{create_file, open, open_host_dir, open_regular_for_read, Access, Resolve};
pub use ops::{
    check_filesystem, chmod_fd, chown_at_nofollow, chown_fd, link_fd_at, mkdir_at, readlink_at,
    rename_at, set_mtime_at, set_mtime_fd, stat_at, stat_fd, symlink_at, unlink_at, Kind, Replace,
    Stat,
};
pub use sparse::SparseReader;

#[cfg(test)]
mod tests;
