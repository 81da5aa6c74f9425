//! Sockets in another network namespace.
//!
//! A socket belongs to the network namespace its creator was in when it
//! called `socket()`, for its whole life. So the daemon can reach
//! `127.0.0.1:PORT` *inside* a sandbox (whose namespace has only loopback)
//! by creating the socket there and then using it from any thread: the
//! gateway connects to a sandbox's port this way, and listens on a
//! sandbox's loopback the same way.
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling thread only.
//! It is done on a short-lived thread of its own, never on a thread of the
//! async runtime: a thread left in a sandbox's namespace by a failed
//! restore would otherwise go on making host connections from there. The
//! thread ends after one socket, whatever happens.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::last_errno;

/// `PIDFD_GET_NET_NAMESPACE` (`_IO(0xFF, 4)`, Linux 6.11): the network
/// namespace of the process a pidfd refers to, as a new descriptor.
const PIDFD_GET_NET_NAMESPACE: libc::c_ulong = 0xFF04;

/// Why a namespace could not be opened or a socket made in it.
#[derive(Debug, thiserror::Error)]
pub enum NetNsError {
    #[error("the process of the pidfd is gone, so its network namespace cannot be opened")]
    ProcessGone,
    #[error("cannot open the network namespace of the pidfd")]
    FromPidfd {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the network namespace {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a network namespace", path.display())]
    NotNetNs { path: PathBuf },
    #[error("cannot enter the network namespace at {op}")]
    Enter {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the thread that makes sockets in a network namespace died")]
    Thread,
}

/// An open network namespace. Holding it keeps the namespace alive; drop it
/// when its sandbox goes.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
}

impl NetNs {
    /// The network namespace of the live process `pidfd` refers to.
    ///
    /// Race-free: the pidfd names one process for good, so a recycled pid
    /// cannot hand out another process's namespace (least of all the
    /// host's). On kernels without the pidfd ioctl it falls back to
    /// `/proc/<pid>/ns/net`, checking afterwards that the pidfd's process
    /// still lives, which proves `pid` was still that process at the open.
    pub fn of_pidfd(pidfd: BorrowedFd<'_>, pid: i32) -> Result<NetNs, NetNsError> {
        // SAFETY: the ioctl takes no argument and returns a new descriptor
        // or -1; the pidfd is a valid open descriptor we borrow.
        let fd = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_NET_NAMESPACE as _, 0) };
        if fd >= 0 {
            // SAFETY: the kernel just gave us this descriptor; we own it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            return Ok(NetNs { fd });
        }
        let err = last_errno();
        match err.raw_os_error() {
            Some(libc::ESRCH) => return Err(NetNsError::ProcessGone),
            Some(libc::ENOTTY) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => {}
            _ => return Err(NetNsError::FromPidfd { source: err }),
        }
        let ns = NetNs::open(Path::new(&format!("/proc/{pid}/ns/net")))?;
        if crate::process::pidfd_send_signal(pidfd, 0).is_err() {
            return Err(NetNsError::ProcessGone);
        }
        Ok(ns)
    }

    /// Opens a namespace file (`/proc/PID/ns/net`, a bind mount of one) and
    /// checks that it is a network namespace.
    pub fn open(path: &Path) -> Result<NetNs, NetNsError> {
        let file = std::fs::File::open(path).map_err(|source| NetNsError::Open {
            path: path.to_owned(),
            source,
        })?;
        let ns = NetNs { fd: file.into() };
        // SAFETY: NS_GET_NSTYPE takes no argument and returns the type.
        let ty = unsafe { libc::ioctl(ns.fd.as_raw_fd(), NS_GET_NSTYPE as _, 0) };
        if ty != libc::CLONE_NEWNET {
            return Err(NetNsError::NotNetNs {
                path: path.to_owned(),
            });
        }
        Ok(ns)
    }

    /// A new non-blocking, close-on-exec TCP socket (IPv4) created inside
    /// this namespace. It stays in it wherever it is used from.
    pub fn tcp_socket(&self) -> Result<OwnedFd, NetNsError> {
        let target = self
            .fd
            .try_clone()
            .map_err(|source| NetNsError::Enter { op: "dup", source })?;
        std::thread::Builder::new()
            .name("mayfly-netns".into())
            .spawn(move || socket_in(target.as_fd()))
            .map_err(|_| NetNsError::Thread)?
            .join()
            .map_err(|_| NetNsError::Thread)?
    }
}

/// `NS_GET_NSTYPE` (`_IO(0xb7, 0x3)`): the namespace type of an nsfs file.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// On the calling (dedicated, about to end) thread: enter `target`, make
/// the socket, and go back to where the thread was.
fn socket_in(target: BorrowedFd<'_>) -> Result<OwnedFd, NetNsError> {
    let home =
        std::fs::File::open("/proc/thread-self/ns/net").map_err(|source| NetNsError::Open {
            path: "/proc/thread-self/ns/net".into(),
            source,
        })?;
    setns(target, "setns into the sandbox")?;
    // SAFETY: plain socket creation; the flags are valid.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    let made = if raw < 0 {
        Err(NetNsError::Enter {
            op: "socket",
            source: last_errno(),
        })
    } else {
        // SAFETY: socket() just returned this descriptor; we own it.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    };
    // The thread ends right after this, so a failed restore cannot leak
    // the sandbox's namespace into other work; it is still reported.
    setns(home.as_fd(), "setns back to the daemon's namespace")?;
    made
}

fn setns(ns: BorrowedFd<'_>, op: &'static str) -> Result<(), NetNsError> {
    // SAFETY: `ns` is an open nsfs descriptor; CLONE_NEWNET only changes
    // the calling thread's network namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(NetNsError::Enter {
            op,
            source: last_errno(),
        });
    }
    Ok(())
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket made through the namespace of this very process connects,
    /// and the calling thread's namespace never changes.
    #[tokio::test]
    async fn socket_in_own_namespace_leaves_caller_where_it_was() {
        let before = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        let ns = NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
        let fd = ns.tcp_socket().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
        sock.connect(addr).await.unwrap();
        assert_eq!(
            std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
            before
        );
    }

    /// A file that is not a network namespace is refused.
    #[test]
    fn open_refuses_other_namespace_types() {
        let e = NetNs::open(Path::new("/proc/self/ns/uts")).unwrap_err();
        assert!(matches!(e, NetNsError::NotNetNs { .. }), "{e}");
    }
}
