//! Descriptors: pidfds, and the descriptors a process keeps or gives up.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::ProcessError;
use crate::last_errno;

/// Opens a pidfd for `pid`.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, ProcessError> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(ProcessError::Pid {
            op: "pidfd_open",
            pid,
            source: last_errno(),
        });
    }
    // SAFETY: pidfd_open returned a fresh descriptor; it is close-on-exec.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `signal` through a pidfd (no pid-reuse race).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: i32) -> Result<(), ProcessError> {
    // SAFETY: plain syscall; a null siginfo means "as kill(2) would".
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        let e = last_errno();
        // ESRCH: it is already gone, which is what the caller wanted.
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(ProcessError::Call {
                op: "pidfd_send_signal",
                source: e,
            });
        }
    }
    Ok(())
}

/// Waits until the process behind `pidfd` has exited (its pidfd turns
/// readable), for at most `timeout`. Whether it exited in time.
pub fn wait_pidfd(pidfd: BorrowedFd<'_>, timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return true;
        }
        if n == 0 || last_errno().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

/// Closes every descriptor at or above `from` except those in `keep`.
pub fn close_fds_except(from: RawFd, keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&f| f >= from).collect();
    keep.sort_unstable();
    let mut lo = from as libc::c_uint;
    for k in keep {
        let k = k as libc::c_uint;
        if k > lo {
            // SAFETY: closing descriptors this process does not use any more.
            unsafe { libc::syscall(libc::SYS_close_range, lo, k - 1, 0) };
        }
        lo = k + 1;
    }
    // SAFETY: as above, up to the highest possible descriptor.
    unsafe { libc::syscall(libc::SYS_close_range, lo, libc::c_uint::MAX, 0) };
}

/// Points stdin, stdout and stderr at `/dev/null` (best effort): for a
/// process that outlives its parent and must not keep the parent's pipes
/// or terminal open.
pub fn stdio_to_dev_null() {
    let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    else {
        return;
    };
    for target in 0..3 {
        // SAFETY: dup2 onto the standard descriptors; `null` stays valid
        // for the call and is closed when dropped.
        unsafe { libc::dup2(null.as_raw_fd(), target) };
    }
}
