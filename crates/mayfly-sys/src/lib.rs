//! All of Mayfly's unsafe and syscall code, behind small, documented wrappers.
//!
//! Nothing outside this crate calls `libc` directly. Each module has its own
//! error enum whose variants carry the path, pid or value involved.

pub mod cgroup;
pub mod fs;
pub mod hardening;
