//! The transparent egress proxy: every TCP connection a sandbox opens is
//! redirected here. The kernel's connection tracking still knows where it
//! was going (`SO_ORIGINAL_DST`); the policy decides whether it goes there.
//! A refused connection is reset.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::peek::{http_host, tls_sni, Presented};
use super::policy::{decide, name_fits, Refusal, Verdict};
use super::state::{Attached, Shared};

/// How long a client has to present its Host header or SNI.
const PEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes read while waiting for a TLS ClientHello: one with many
/// extensions fits, a stream of junk does not. (An HTTP head may be as
/// long as [`super::http1::MAX_HEAD`].)
const PEEK_MAX_TLS: usize = 16 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
pub(super) fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// What a connection was admitted for: re-checked when the policy changes.
pub(super) struct Admitted {
    pub ip: std::net::IpAddr,
    pub port: u16,
    /// The Host header or SNI it presented, when it had to: on 80, that of
    /// the request it carries now.
    pub name: Mutex<Option<String>>,
}

impl Admitted {
    /// Whether the sandbox's policy (now) still admits this connection,
    /// and if not, why.
    pub fn verdict(&self, shared: &Shared, sandbox: &Attached) -> Result<(), Refusal> {
        let policy = sandbox.policy();
        let names = sandbox.names_for(self.ip);
        let host = shared.host_addrs().ok_or(Refusal::HostUnknown)?;
        match decide(&policy, self.ip, self.port, &names, &host) {
            Verdict::Allow => Ok(()),
            Verdict::CheckName => {
                let name = self.name.lock().unwrap_or_else(|p| p.into_inner());
                match name.as_deref() {
                    Some(n) if name_fits(&policy, n, self.port) => Ok(()),
                    Some(_) => Err(Refusal::NameMismatch),
                    None => Err(Refusal::NoName),
                }
            }
            Verdict::Refuse(why) => Err(why),
        }
    }

    pub fn set_name(&self, name: String) {
        *self.name.lock().unwrap_or_else(|p| p.into_inner()) = Some(name);
    }
}

/// Whether the policy changed since `changes` last looked, and if so,
/// whether it still admits the connection (marking the change seen).
fn recheck(
    changes: &mut watch::Receiver<u64>,
    shared: &Shared,
    sandbox: &Attached,
    admitted: &Admitted,
) -> Result<(), Refusal> {
    if changes.has_changed().unwrap_or(true) {
        changes.borrow_and_update();
        return admitted.verdict(shared, sandbox);
    }
    Ok(())
}

async fn handle(
    shared: &Shared,
    sandbox: &Arc<Attached>,
    mut client: TcpStream,
) -> Result<(), Refusal> {
    // Subscribed before the policy is read: a PATCH from now on, during
    // the peek or the connect included, is seen and re-checked.
    let mut changes = sandbox.changes();
    let Ok(dst) = mayfly_sys::veth::original_dst(client.as_fd()) else {
        reset(client);
        return Err(Refusal::AlwaysBlocked);
    };
    let admitted = Admitted {
        ip: std::net::IpAddr::V4(*dst.ip()),
        port: dst.port(),
        name: Mutex::new(None),
    };
    let refuse = |client: TcpStream, why: Refusal| {
        reset(client);
        Err(why)
    };
    let Some(host) = shared.host_addrs() else {
        return refuse(client, Refusal::HostUnknown);
    };
    let names = sandbox.names_for(admitted.ip);
    let verdict = decide(&sandbox.policy(), admitted.ip, admitted.port, &names, &host);
    if let Verdict::Refuse(why) = verdict {
        return refuse(client, why);
    }
    let Some(_slot) = sandbox.try_connect() else {
        return refuse(client, Refusal::TooManyConnections);
    };
    let mut head = Vec::new();
    let setup = async {
        if verdict == Verdict::CheckName {
            let name = read_name(&mut client, admitted.port, &mut head).await?;
            admitted.set_name(name);
            // The whole decision again, with the name, on the policy as it
            // is after the peek.
            changes.borrow_and_update();
            admitted.verdict(shared, sandbox)?;
        } else {
            recheck(&mut changes, shared, sandbox, &admitted)?;
        }
        let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst)).await {
            Ok(Ok(s)) => s,
            _ => return Err(None),
        };
        // A PATCH while connecting: refused now, not admitted unchecked.
        if let Err(why) = recheck(&mut changes, shared, sandbox, &admitted) {
            reset(upstream);
            return Err(Some(why));
        }
        Ok(upstream)
    };
    let set_up = tokio::select! {
        r = setup => r,
        () = sandbox.closed() => Err(Some(Refusal::Gone)),
    };
    let upstream = match set_up {
        Ok(s) => s,
        Err(why) => {
            reset(client);
            return why.map_or(Ok(()), Err);
        }
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let http = verdict == Verdict::CheckName && admitted.port == 80;
    let conn = super::splice::Conn {
        shared,
        sandbox,
        admitted: &admitted,
        http,
    };
    conn.splice(changes, client, upstream, head).await;
    Ok(())
}

/// Reads until the client's first bytes name a host.
async fn read_name(
    client: &mut TcpStream,
    port: u16,
    head: &mut Vec<u8>,
) -> Result<String, Option<Refusal>> {
    let (parse, max): (fn(&[u8]) -> Presented, usize) = if port == 443 {
        (tls_sni, PEEK_MAX_TLS)
    } else {
        (http_host, super::http1::MAX_HEAD)
    };
    let deadline = tokio::time::Instant::now() + PEEK_TIMEOUT;
    let mut buf = [0u8; 4096];
    let no_name = Err(Some(Refusal::NoName));
    while head.len() < max {
        let n = match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return no_name,
        };
        head.extend_from_slice(&buf[..n]);
        match parse(head) {
            Presented::NeedMore => continue,
            Presented::Name(n) => return Ok(n),
            Presented::Mismatch => return Err(Some(Refusal::NameMismatch)),
            Presented::Nothing => return no_name,
        }
    }
    no_name
}
