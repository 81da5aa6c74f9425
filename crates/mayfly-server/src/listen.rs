//! Binding the daemon's sockets and serving the router on them.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{
    DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::pin::Pin;

use axum::extract::ConnectInfo;
use axum::Router;
use http::Request;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tower::ServiceExt as _;

use crate::conn::{self, Accept, Limits, OnStop, Slots, Timeouts};
use crate::Peer;

/// Mode of the directory holding the socket: others may traverse it.
const SOCKET_DIR_MODE: u32 = 0o755;
/// Mode of the socket: its owner and group may connect, nobody else.
const SOCKET_MODE: u32 = 0o660;

/// Failures to bind or serve a listener.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot create the socket directory {}", path.display())]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot inspect {}", path.display())]
    Inspect { path: PathBuf, source: io::Error },
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    #[error("another daemon is already serving on {}", path.display())]
    InUse { path: PathBuf },
    #[error("cannot remove the stale socket {}", path.display())]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("cannot bind the unix socket {}", path.display())]
    BindUnix { path: PathBuf, source: io::Error },
    #[error("cannot set the mode of {} to {SOCKET_MODE:o}", path.display())]
    Chmod { path: PathBuf, source: io::Error },
    #[error("cannot bind the TCP address {addr}")]
    BindTcp { addr: SocketAddr, source: io::Error },
}

/// A bound listener, ready for [`serve`].
#[derive(Debug)]
pub enum Listener {
    /// The unix socket at `path`; `inode` identifies the file we bound, so
    /// shutdown removes it only if it is still ours.
    Unix {
        listener: UnixListener,
        path: PathBuf,
        inode: (u64, u64),
    },
    /// A TCP listener; its requests need the bearer token.
    Tcp(TcpListener),
}

impl Listener {
    /// `unix:/run/mayfly/mayfly.sock` or `tcp:127.0.0.1:7777`, for logs.
    pub fn describe(&self) -> String {
        match self {
            Listener::Unix { path, .. } => format!("unix:{}", path.display()),
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp:{a}"),
                Err(_) => "tcp:?".to_owned(),
            },
        }
    }

    /// The bound address of a TCP listener (useful after binding port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix { .. } => None,
        }
    }
}

/// Binds the daemon's unix socket at `path`.
///
/// Creates the parent directory (mode 0755) if needed, replaces a stale
/// socket left by a dead daemon, refuses to touch a live one or a file that
/// is not a socket, and leaves the socket at mode 0660.
pub async fn bind_unix(path: &Path) -> Result<Listener, ListenError> {
    let path = path.to_path_buf();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(SOCKET_DIR_MODE)
            .create(dir)
            .map_err(|source| ListenError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    remove_stale_socket(&path).await?;
    let listener = UnixListener::bind(&path).map_err(|source| ListenError::BindUnix {
        path: path.clone(),
        source,
    })?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(
        |source| ListenError::Chmod {
            path: path.clone(),
            source,
        },
    )?;
    let meta = std::fs::symlink_metadata(&path).map_err(|source| ListenError::Inspect {
        path: path.clone(),
        source,
    })?;
    Ok(Listener::Unix {
        listener,
        path,
        inode: (meta.dev(), meta.ino()),
    })
}

/// Removes a socket file nobody listens on any more. A socket that still
/// accepts connections belongs to a running daemon and is left alone.
async fn remove_stale_socket(path: &Path) -> Result<(), ListenError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ListenError::Inspect {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ListenError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        return Err(ListenError::InUse {
            path: path.to_path_buf(),
        });
    }
    std::fs::remove_file(path).map_err(|source| ListenError::RemoveStale {
        path: path.to_path_buf(),
        source,
    })
}

/// Binds a TCP listener. Its requests need `ServerOptions::tcp_token`.
pub async fn bind_tcp(addr: SocketAddr) -> Result<Listener, ListenError> {
    TcpListener::bind(addr)
        .await
        .map(Listener::Tcp)
        .map_err(|source| ListenError::BindTcp { addr, source })
}

type ServeFuture = Pin<Box<dyn Future<Output = Result<(), ListenError>> + Send>>;

/// Turns `true` when the daemon stops serving, for requests that would
/// otherwise never end (event streams): attached to every request by
/// [`serve`], so graceful shutdown does not wait on them forever.
#[derive(Clone)]
pub(crate) struct Stopping(pub(crate) tokio::sync::watch::Receiver<bool>);

/// Serves `app` on every listener until `shutdown` completes, then stops
/// accepting, lets in-flight requests finish, and removes the unix socket.
///
/// In-flight requests include exec streams, which last as long as their
/// command: bound the wait with a timeout around this future if needed.
///
/// Each request carries the [`Peer`] of its connection, from which the
/// authentication layer derives the caller and decides whether a token is
/// needed. Connections are served by [`crate::conn`], with its deadlines
/// and at most [`Limits::API`] at once on each listener, so that no client
/// can hold the daemon's descriptors by opening connections and saying
/// nothing.
pub async fn serve(
    app: Router,
    listeners: Vec<Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ListenError> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        // Nobody listening any more just means every server already ended.
        let _ = stop_tx.send(true);
    });
    let futures: Vec<ServeFuture> = listeners
        .into_iter()
        .map(|l| serve_one(app.clone(), l, stop_rx.clone()))
        .collect();
    futures_util::future::try_join_all(futures)
        .await
        .map(|_| ())
}

fn serve_one(
    app: Router,
    l: Listener,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> ServeFuture {
    let name = l.describe();
    tracing::info!(listener = %name, "serving the API");
    let app = app.layer(axum::Extension(Stopping(stop.clone())));
    // The stop signal as the connection machinery takes it: the sender
    // dropped.
    let (gone_tx, gone) = watch::channel(());
    tokio::spawn(async move {
        // An error means the sender is gone, which also means stop.
        let _ = stop.wait_for(|stopped| *stopped).await;
        drop(gone_tx);
    });
    match l {
        Listener::Unix {
            listener,
            path,
            inode,
        } => Box::pin(async move {
            serve_on(UnixApi(listener), app, gone).await;
            remove_if_ours(&path, inode);
            Ok(())
        }),
        Listener::Tcp(listener) => Box::pin(async move {
            serve_on(TcpApi(listener), app, gone).await;
            Ok(())
        }),
    }
}

/// Accepts and serves until `gone`, then waits for every connection to
/// drain.
async fn serve_on<L, I>(listener: L, app: Router, gone: watch::Receiver<()>)
where
    L: Accept<Conn = (I, Peer)>,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let slots = Slots::new(Limits::API);
    let stop = gone.clone();
    conn::accept_loop(listener, &slots, Some(gone), |(io, peer), slot| {
        let app = app.clone();
        let handle = move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer.clone()));
            let app = app.clone();
            async move {
                match app.oneshot(req.map(axum::body::Body::new)).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                }
            }
        };
        let stop = Some((stop.clone(), OnStop::Drain));
        // The deadlines the gateway's connections have too.
        conn::serve(io, slot, Timeouts::default(), stop, handle);
    })
    .await;
    slots.all_returned().await;
}

/// The API's unix socket: each connection with its peer's uid
/// (`SO_PEERCRED`).
struct UnixApi(UnixListener);

impl Accept for UnixApi {
    type Conn = (UnixStream, Peer);
    async fn accept(&self) -> io::Result<(UnixStream, Peer)> {
        let (s, _) = self.0.accept().await?;
        let uid = s.peer_cred().ok().map(|cred| cred.uid());
        Ok((s, Peer::Unix { uid }))
    }
}

/// The API's TCP listener: each connection with its peer's address.
struct TcpApi(TcpListener);

impl Accept for TcpApi {
    type Conn = (TcpStream, Peer);
    async fn accept(&self) -> io::Result<(TcpStream, Peer)> {
        let (s, addr) = self.0.accept().await?;
        let _ = s.set_nodelay(true);
        Ok((s, Peer::Tcp { addr }))
    }
}

/// Removes the socket file if it is still the one we bound, not one a newer
/// daemon has put there since.
fn remove_if_ours(path: &Path, inode: (u64, u64)) {
    let ours = std::fs::symlink_metadata(path)
        .map(|m| (m.dev(), m.ino()) == inode)
        .unwrap_or(false);
    if ours {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the socket at shutdown");
        }
    }
}
