//! Message passing between the daemon, the zygote and each sandbox's init:
//! `SOCK_SEQPACKET` socket pairs that carry one message and its descriptors
//! (`SCM_RIGHTS`) per packet, plus pipes.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

/// The largest message (excluding descriptors) any side sends.
pub const MAX_MESSAGE: usize = 256 * 1024;
/// The most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// A failed send or receive.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("{op} failed")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the peer closed the channel")]
    Closed,
    #[error("a message was truncated (more than {MAX_MESSAGE} bytes or {MAX_FDS} descriptors)")]
    Truncated,
    #[error("the message is {0} bytes, more than the {MAX_MESSAGE} allowed")]
    TooLarge(usize),
}

impl IpcError {
    /// Whether a non-blocking call found nothing to do.
    pub fn would_block(&self) -> bool {
        matches!(self, IpcError::Io { source, .. } if source.kind() == std::io::ErrorKind::WouldBlock)
    }
}

fn nix_err(op: &'static str, e: nix::Error) -> IpcError {
    IpcError::Io {
        op,
        source: std::io::Error::from_raw_os_error(e as i32),
    }
}

/// A connected pair of close-on-exec seqpacket sockets.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), IpcError> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| nix_err("socketpair", e))
}

/// Sends one packet with optional descriptors.
pub fn send(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), IpcError> {
    if data.len() > MAX_MESSAGE {
        return Err(IpcError::TooLarge(data.len()));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    let iov = [IoSlice::new(data)];
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::Error::EINTR) => continue,
            Err(nix::Error::EPIPE) | Err(nix::Error::ECONNRESET) => return Err(IpcError::Closed),
            Err(e) => return Err(nix_err("sendmsg", e)),
        }
    }
}

/// Receives one packet and the descriptors that came with it. A zero-length
/// read means the peer has closed. With `nonblocking`, an empty socket gives
/// an error for which [`IpcError::would_block`] is true.
pub fn recv(
    sock: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    nonblocking: bool,
) -> Result<Vec<OwnedFd>, IpcError> {
    let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
    if nonblocking {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    // Peek at the next packet's length (MSG_TRUNC reports it in full) so
    // the buffer is sized to the message, not to the largest possible one.
    let peek = loop {
        let mut none: [u8; 0] = [];
        let peek_flags =
            MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC | (flags & MsgFlags::MSG_DONTWAIT);
        match nix::sys::socket::recv(sock.as_raw_fd(), &mut none, peek_flags) {
            Ok(n) => break n,
            Err(nix::Error::EINTR) => continue,
            Err(nix::Error::ECONNRESET) => return Err(IpcError::Closed),
            Err(e) => return Err(nix_err("recv(MSG_PEEK)", e)),
        }
    };
    buf.clear();
    buf.resize(peek.clamp(1, MAX_MESSAGE), 0);
    let mut cbuf = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (len, fds, truncated) = loop {
        let mut iov = [IoSliceMut::new(buf.as_mut_slice())];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cbuf), flags) {
            Ok(msg) => {
                let mut fds = Vec::new();
                if let Ok(cmsgs) = msg.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::ScmRights(raw) = c {
                            for fd in raw {
                                // SAFETY: SCM_RIGHTS hands us freshly installed
                                // descriptors that nothing else owns.
                                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                            }
                        }
                    }
                }
                let truncated = msg
                    .flags
                    .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
                break (msg.bytes, fds, truncated);
            }
            Err(nix::Error::EINTR) => continue,
            Err(nix::Error::ECONNRESET) => return Err(IpcError::Closed),
            Err(e) => return Err(nix_err("recvmsg", e)),
        }
    };
    if truncated {
        return Err(IpcError::Truncated);
    }
    if len == 0 && fds.is_empty() {
        return Err(IpcError::Closed);
    }
    buf.truncate(len);
    Ok(fds)
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> Result<(OwnedFd, OwnedFd), IpcError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| nix_err("pipe2", e))
}

/// Moves up to `max` bytes out of the pipe `pipe` into `/dev/null` without
/// copying them (`splice(2)`, non-blocking): what a reader that keeps no
/// more of a stream does with the rest, at a small part of a `read`'s cost.
/// `Ok(0)` is the end of the stream; `WouldBlock` means empty for now.
pub fn discard(pipe: BorrowedFd<'_>, max: usize) -> std::io::Result<usize> {
    use nix::fcntl::{splice, SpliceFFlags};
    static NULL: std::sync::OnceLock<std::io::Result<std::fs::File>> = std::sync::OnceLock::new();
    let null = NULL.get_or_init(|| std::fs::OpenOptions::new().write(true).open("/dev/null"));
    let null = null
        .as_ref()
        .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?;
    splice(
        pipe,
        None,
        null.as_fd(),
        None,
        max,
        SpliceFFlags::SPLICE_F_NONBLOCK,
    )
    .map_err(std::io::Error::from)
}

/// Grows the pipe `pipe`'s buffer to `bytes` (at most the host's
/// `fs.pipe-max-size`), so that a reader draining a busy writer wakes less
/// often. The pages are the writer's to fill (and to be charged for).
pub fn set_pipe_size(pipe: BorrowedFd<'_>, bytes: usize) -> Result<usize, IpcError> {
    use nix::fcntl::{fcntl, FcntlArg};
    let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
    fcntl(pipe, FcntlArg::F_SETPIPE_SZ(bytes))
        .map(|n| n as usize)
        .map_err(|e| nix_err("fcntl(F_SETPIPE_SZ)", e))
}

/// Puts a descriptor into non-blocking mode (for async readers).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> Result<(), IpcError> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| nix_err("fcntl(F_GETFL)", e))?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(|e| nix_err("fcntl(F_SETFL)", e))?;
    Ok(())
}

/// Registers an owned descriptor with the tokio reactor.
pub fn register_async(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: `fd` is owned and moved into the AsyncFd, so it cannot be
    // closed or registered elsewhere while the registration lives.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// A listening, close-on-exec, non-blocking seqpacket socket bound at
/// `path` (which must not exist), reachable only by root: the socket file
/// is made 0600 before it is listened on.
pub fn seqpacket_listen(path: &std::path::Path) -> Result<OwnedFd, IpcError> {
    use nix::sys::socket::{bind, listen, socket, Backlog, UnixAddr};
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| nix_err("socket", e))?;
    let addr = UnixAddr::new(path).map_err(|e| nix_err("socket path", e))?;
    bind(sock.as_raw_fd(), &addr).map_err(|e| nix_err("bind", e))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(
        |source| IpcError::Io {
            op: "chmod",
            source,
        },
    )?;
    let backlog = Backlog::new(8).map_err(|e| nix_err("listen", e))?;
    listen(&sock, backlog).map_err(|e| nix_err("listen", e))?;
    Ok(sock)
}

/// Accepts one connection (close-on-exec, blocking). With a non-blocking
/// listener and none pending, the error's [`IpcError::would_block`] is true.
pub fn accept(listener: BorrowedFd<'_>) -> Result<OwnedFd, IpcError> {
    loop {
        match nix::sys::socket::accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            // SAFETY: accept4 returned a fresh descriptor that nothing else owns.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(nix::Error::EINTR) | Err(nix::Error::ECONNABORTED) => continue,
            Err(e) => return Err(nix_err("accept4", e)),
        }
    }
}

/// Connects a close-on-exec seqpacket socket to the listener at `path`.
pub fn seqpacket_connect(path: &std::path::Path) -> Result<OwnedFd, IpcError> {
    use nix::sys::socket::{connect, socket, UnixAddr};
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| nix_err("socket", e))?;
    let addr = UnixAddr::new(path).map_err(|e| nix_err("socket path", e))?;
    loop {
        match connect(sock.as_raw_fd(), &addr) {
            Ok(()) => return Ok(sock),
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(nix_err("connect", e)),
        }
    }
}

/// The uid and pid of the process on the other end of a unix socket, as
/// the kernel recorded them when the connection was made.
pub fn peer(sock: BorrowedFd<'_>) -> Result<(u32, i32), IpcError> {
    let cred = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| nix_err("getsockopt(SO_PEERCRED)", e))?;
    Ok((cred.uid(), cred.pid()))
}

/// Makes blocking receives on `sock` give up after `timeout` (the error's
/// [`IpcError::would_block`] is then true).
pub fn set_recv_timeout(
    sock: BorrowedFd<'_>,
    timeout: std::time::Duration,
) -> Result<(), IpcError> {
    let tv = nix::sys::time::TimeVal::new(
        timeout.as_secs() as libc::time_t,
        timeout.subsec_micros() as libc::suseconds_t,
    );
    nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
        .map_err(|e| nix_err("setsockopt(SO_RCVTIMEO)", e))
}
