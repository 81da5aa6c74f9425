//! Readiness probes: a command inside the sandbox, or a TCP connect (and an
//! HTTP GET) to 127.0.0.1 *in the sandbox's own network namespace*, through
//! a socket made there (the gateway's way in), so two sandboxes can each
//! have a service on the same port.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use mayfly_sys::netns::NetNs;
use mayfly_types::Probe;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::engine::exec::{Collected, CommandSpec, PumpOptions, Sink};
use crate::engine::sandbox::Sandbox;
use crate::engine::Engine;

/// The most one probe attempt may take.
const ATTEMPT: Duration = Duration::from_secs(5);

/// A probe made ready to run again and again.
pub(super) enum Prober {
    Exec(CommandSpec),
    Tcp(Arc<NetNs>, u16),
    Http(Arc<NetNs>, u16, String),
}

impl Prober {
    pub(super) fn new(sb: &Sandbox, probe: &Probe, uid: Option<u32>) -> Result<Self, String> {
        let ns = || {
            NetNs::of_pidfd(sb.pidfd.get_ref().as_fd(), sb.init_pid)
                .map(Arc::new)
                .map_err(|e| format!("opening the sandbox's network namespace: {e}"))
        };
        Ok(match probe {
            Probe::Exec(argv) => Prober::Exec(
                CommandSpec::new(argv.clone(), Default::default(), None, uid, None)
                    .map_err(|e| e.to_string())?,
            ),
            Probe::Tcp(port) => Prober::Tcp(ns()?, *port),
            Probe::Http(h) => Prober::Http(ns()?, h.port, h.path.clone()),
        })
    }

    /// One attempt: true when the service answered as ready.
    pub(super) async fn once(&self, engine: &Engine, sb: &Arc<Sandbox>) -> bool {
        match self {
            Prober::Exec(spec) => {
                let Ok(started) = engine.spawn_command(sb, spec).await else {
                    return false;
                };
                let out = [
                    Arc::new(std::sync::Mutex::new(Collected::default())),
                    Arc::new(std::sync::Mutex::new(Collected::default())),
                ];
                let opts = PumpOptions {
                    stdin: None,
                    timeout: Some(ATTEMPT),
                    limit: 4096,
                    sink: Sink::Buffer,
                };
                let r = engine.pump(sb, started, opts, out).await;
                r.status.exit_code == Some(0)
            }
            Prober::Tcp(ns, port) => connect(ns, *port).await.is_some(),
            Prober::Http(ns, port, path) => {
                let Some(mut s) = connect(ns, *port).await else {
                    return false;
                };
                let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
                let answer = async {
                    s.write_all(req.as_bytes()).await.ok()?;
                    let mut buf = [0u8; 16];
                    let mut n = 0;
                    while n < 12 {
                        let k = s.read(&mut buf[n..]).await.ok()?;
                        if k == 0 {
                            break;
                        }
                        n += k;
                    }
                    Some(buf[..n].to_vec())
                };
                match tokio::time::timeout(ATTEMPT, answer).await {
                    Ok(Some(head)) => http_2xx(&head),
                    _ => false,
                }
            }
        }
    }
}

async fn connect(ns: &Arc<NetNs>, port: u16) -> Option<tokio::net::TcpStream> {
    let ns = ns.clone();
    let fd = tokio::task::spawn_blocking(move || ns.tcp_socket())
        .await
        .ok()?
        .ok()?;
    let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    tokio::time::timeout(
        ATTEMPT,
        sock.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
    )
    .await
    .ok()?
    .ok()
}

/// `HTTP/1.x 2..`: the status line of a success.
fn http_2xx(head: &[u8]) -> bool {
    head.len() >= 10 && head.starts_with(b"HTTP/1.") && head[8] == b' ' && head[9] == b'2'
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_2xx_status_lines_pass() {
        assert!(super::http_2xx(b"HTTP/1.1 200 OK"));
        assert!(super::http_2xx(b"HTTP/1.0 204 No"));
        assert!(!super::http_2xx(b"HTTP/1.1 404 Not"));
        assert!(!super::http_2xx(b"SSH-2.0-Open"));
        assert!(!super::http_2xx(b""));
    }
}
