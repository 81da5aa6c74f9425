//! Minimal network setup inside a fresh network namespace.

use crate::last_errno;

/// Bringing the loopback interface up failed.
#[derive(Debug, thiserror::Error)]
#[error("bringing `lo` up failed at {op}")]
pub struct NetError {
    pub op: &'static str,
    #[source]
    pub source: std::io::Error,
}

/// Sets `IFF_UP` on `lo` in the caller's network namespace.
///
/// A fresh namespace has only `lo`, and it is down. One ioctl is far cheaper
/// than a netlink round trip for this single flag.
pub fn loopback_up() -> Result<(), NetError> {
    // SAFETY: plain socket creation.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(NetError {
            op: "socket",
            source: last_errno(),
        });
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    let result = (|| {
        // SAFETY: req is a valid ifreq naming `lo`; the kernel fills in flags.
        if unsafe { libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req) } < 0 {
            return Err(NetError {
                op: "SIOCGIFFLAGS",
                source: last_errno(),
            });
        }
        // SAFETY: reading and writing the flags member of the union that
        // SIOCGIFFLAGS just filled in.
        unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
        // SAFETY: req is a valid ifreq with the new flags.
        if unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &req) } < 0 {
            return Err(NetError {
                op: "SIOCSIFFLAGS",
                source: last_errno(),
            });
        }
        Ok(())
    })();
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(sock) };
    result
}
