//! The transparent egress proxy: every TCP connection a sandbox opens is
//! redirected here. The kernel's connection tracking still knows where it
//! was going (`SO_ORIGINAL_DST`); the policy decides whether it goes there.
//! A refused connection is reset.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::peek::{http_host, tls_sni, Presented};
use super::policy::{decide, name_fits, Refusal, Verdict};
use super::state::{Attached, Shared};

/// How long a client has to present its Host header or SNI.
const PEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes read while waiting for a name: a ClientHello with many
/// extensions fits, a stream of junk does not.
const PEEK_MAX: usize = 16 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const CHUNK: usize = 64 * 1024;

pub async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Some(sandbox) = super::sandbox_of(peer).and_then(|a| shared.get(a)) else {
            reset(stream);
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(why) = handle(&shared, &sandbox, stream).await {
                tracing::info!(sandbox = %sandbox.id, reason = why.as_str(), "egress: connection refused");
            }
        });
    }
}

/// Closes with a reset, so the client sees a refusal at once.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// What a connection was admitted for: re-checked when the policy changes.
struct Admitted {
    ip: std::net::IpAddr,
    port: u16,
    /// The Host header or SNI it presented, when it had to.
    name: Option<String>,
}

impl Admitted {
    /// Whether the sandbox's policy (now) still admits this connection.
    fn still_allowed(&self, shared: &Shared, sandbox: &Attached) -> bool {
        let policy = sandbox.policy();
        let names = sandbox.names_for(self.ip);
        match decide(&policy, self.ip, self.port, &names, &shared.host_addrs()) {
            Verdict::Allow => true,
            Verdict::CheckName => self
                .name
                .as_deref()
                .is_some_and(|n| name_fits(&policy, n, self.port)),
            Verdict::Refuse(_) => false,
        }
    }
}

async fn handle(
    shared: &Shared,
    sandbox: &Arc<Attached>,
    mut client: TcpStream,
) -> Result<(), Refusal> {
    let Ok(dst) = mayfly_sys::veth::original_dst(client.as_fd()) else {
        reset(client);
        return Err(Refusal::AlwaysBlocked);
    };
    let ip = std::net::IpAddr::V4(*dst.ip());
    let policy = sandbox.policy();
    let names = sandbox.names_for(ip);
    let verdict = decide(&policy, ip, dst.port(), &names, &shared.host_addrs());
    let refuse = |client: TcpStream, why: Refusal| {
        reset(client);
        Err(why)
    };
    if let Verdict::Refuse(why) = verdict {
        return refuse(client, why);
    }
    let Some(_slot) = sandbox.try_connect() else {
        return refuse(client, Refusal::TooManyConnections);
    };
    let mut admitted = Admitted {
        ip,
        port: dst.port(),
        name: None,
    };
    let mut head = Vec::new();
    if verdict == Verdict::CheckName {
        match read_name(&mut client, dst.port(), &mut head).await {
            Some(name) if name_fits(&sandbox.policy(), &name, dst.port()) => {
                admitted.name = Some(name);
            }
            Some(_) => return refuse(client, Refusal::NameMismatch),
            None => return refuse(client, Refusal::NoName),
        }
    }
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst)).await {
        Ok(Ok(s)) => s,
        _ => {
            reset(client);
            return Ok(());
        }
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    splice(shared, sandbox, &admitted, client, upstream, head).await;
    Ok(())
}

/// Reads until the client's first bytes name a host (or cannot).
async fn read_name(client: &mut TcpStream, port: u16, head: &mut Vec<u8>) -> Option<String> {
    let parse = if port == 443 { tls_sni } else { http_host };
    let deadline = tokio::time::Instant::now() + PEEK_TIMEOUT;
    let mut buf = [0u8; 4096];
    while head.len() < PEEK_MAX {
        let n = tokio::time::timeout_at(deadline, client.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
        match parse(head) {
            Presented::NeedMore => continue,
            Presented::Name(n) => return Some(n),
            Presented::Nothing => return None,
        }
    }
    None
}

/// Copies both ways until both sides are done, under the sandbox's
/// bandwidth cap (checked per chunk, so a `PATCH` applies at once). A
/// policy change that no longer admits the connection resets both sides.
async fn splice(
    shared: &Shared,
    sandbox: &Attached,
    admitted: &Admitted,
    client: TcpStream,
    upstream: TcpStream,
    head: Vec<u8>,
) {
    let mut changes = sandbox.changes();
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let cut = {
        let out = async {
            if !head.is_empty() {
                tokio::time::sleep(sandbox.charge(head.len())).await;
                if uw.write_all(&head).await.is_err() {
                    return;
                }
            }
            pump(sandbox, &mut cr, &mut uw).await;
            let _ = uw.shutdown().await;
        };
        let back = async {
            pump(sandbox, &mut ur, &mut cw).await;
            let _ = cw.shutdown().await;
        };
        let revoked = async {
            while changes.changed().await.is_ok() {
                if !admitted.still_allowed(shared, sandbox) {
                    return;
                }
            }
            // The sandbox is gone: its connections end with its namespace.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            _ = async { tokio::join!(out, back) } => false,
            () = revoked => true,
        }
    };
    if cut {
        tracing::info!(sandbox = %sandbox.id, ip = %admitted.ip, port = admitted.port,
            "egress: open connection cut, the policy no longer admits it");
        // Whole again, so that no write half sends a FIN when dropped:
        // the peers see a reset, not an orderly end.
        for s in [cr.reunite(cw), ur.reunite(uw)].into_iter().flatten() {
            let _ = s.set_zero_linger();
        }
    }
}

async fn pump(
    sandbox: &Attached,
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let wait = sandbox.charge(n);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
