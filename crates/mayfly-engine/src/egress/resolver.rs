//! The daemon's DNS resolver for sandboxes: every UDP query a sandbox sends
//! to port 53, whatever the server, arrives here.
//!
//! It answers A queries for names the sandbox's policy allows, looked up in
//! the daemon's static table first and then with the host's own resolver
//! configuration (`getaddrinfo`), and remembers each address it hands out,
//! which is what lets the proxy admit a connection to it. Other names get
//! NXDOMAIN; allowed names get no AAAA (sandboxes have IPv4 only).
//!
//! * Names are read label by label: a query whose labels hold anything but
//!   letters, digits, `-` and `_` (an escaped dot in a label would look like
//!   `x\.pub.example.com` and match `*.pub.example.com`) is REFUSED.
//! * Names are looked up fully qualified (`name.`), so the host's search
//!   domains are never appended: an allowed name that does not exist must
//!   not resolve to `name.corp.internal`. (glibc then does not match the
//!   host's `/etc/hosts`, whose names have no trailing dot: `--dns-hosts`
//!   is the way to name hosts by hand.)
//! * Each lookup takes a place of its sandbox's and of the daemon's
//!   (`state::MAX_LOOKUPS_PER_SANDBOX`, `state::MAX_LOOKUPS`), held until
//!   its blocking call returns; with none free the answer is SERVFAIL at
//!   once, and a lookup that takes longer than [`LOOKUP_TIMEOUT`] is
//!   answered SERVFAIL.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{rdata::A, Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

use super::policy::may_resolve;
use super::state::{Attached, LookupPermit, Shared};

/// The TTL of every answer: short, so that clients ask again and the
/// handed-out table follows what upstream says.
const ANSWER_TTL: u32 = 30;

/// How long a client waits for a host lookup before it gets SERVFAIL.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest name: 253 characters, written without its final dot.
const MAX_NAME: usize = 253;

pub async fn serve(shared: Arc<Shared>, sock: UdpSocket) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let Some(addr) = super::sandbox_of(peer) else {
            continue;
        };
        let Some(sandbox) = shared.get(addr) else {
            continue;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let reply = match prepare(&shared, &sandbox, query) {
            Answer::Done(reply) => reply,
            Answer::Lookup(pending) => match shared.lookup_permit(&sandbox) {
                Some(permit) => {
                    let sock = sock.clone();
                    tokio::spawn(async move {
                        let reply = pending.look_up(&sandbox, permit).await;
                        send(&sock, &reply, peer).await;
                    });
                    continue;
                }
                None => {
                    tracing::info!(sandbox = %sandbox.id, "resolver: too many lookups at once");
                    pending.fail(ResponseCode::ServFail)
                }
            },
        };
        send(&sock, &reply, peer).await;
    }
}

async fn send(sock: &UdpSocket, reply: &Message, peer: SocketAddr) {
    if let Ok(bytes) = reply.to_vec() {
        let _ = sock.send_to(&bytes, peer).await;
    }
}

/// A query answered at once, or one that needs a host lookup.
enum Answer {
    Done(Message),
    Lookup(Pending),
}

/// A reply waiting for the addresses of `name`.
struct Pending {
    reply: Message,
    query: Query,
    name: String,
}

fn prepare(shared: &Shared, sandbox: &Attached, query: Message) -> Answer {
    let mut reply = Message::new(
        query.metadata.id,
        MessageType::Response,
        query.metadata.op_code,
    );
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    let done = |mut reply: Message, code| {
        reply.metadata.response_code = code;
        Answer::Done(reply)
    };
    let Some(q) = query.queries.first().cloned() else {
        return done(reply, ResponseCode::FormErr);
    };
    reply.queries.push(q.clone());
    let Some(name) = hostname(q.name()) else {
        tracing::info!(sandbox = %sandbox.id, name = %q.name(), "resolver: not a host name");
        return done(reply, ResponseCode::Refused);
    };
    if !may_resolve(&sandbox.policy(), &name) {
        tracing::info!(sandbox = %sandbox.id, %name, "resolver: name not allowed");
        return done(reply, ResponseCode::NXDomain);
    }
    let pending = Pending {
        reply,
        query: q,
        name,
    };
    match shared.cfg.static_hosts.get(&pending.name) {
        Some(addrs) => Answer::Done(pending.answer(sandbox, addrs.clone())),
        None => Answer::Lookup(pending),
    }
}

impl Pending {
    fn fail(mut self, code: ResponseCode) -> Message {
        self.reply.metadata.response_code = code;
        self.reply
    }

    /// Looks the name up with the host's resolver, on a blocking thread
    /// that keeps `permit` until `getaddrinfo` returns.
    async fn look_up(self, sandbox: &Attached, permit: LookupPermit) -> Message {
        let fqdn = format!("{}.", self.name);
        let lookup = tokio::task::spawn_blocking(move || {
            let found = std::net::ToSocketAddrs::to_socket_addrs(&(fqdn.as_str(), 0u16));
            drop(permit);
            found.map(|it| it.collect::<Vec<_>>()).unwrap_or_default()
        });
        match tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await {
            Ok(Ok(found)) => {
                let mut addrs: Vec<Ipv4Addr> = Vec::new();
                for sa in found {
                    if let SocketAddr::V4(v4) = sa {
                        if !addrs.contains(v4.ip()) {
                            addrs.push(*v4.ip());
                        }
                    }
                }
                self.answer(sandbox, addrs)
            }
            _ => {
                tracing::info!(sandbox = %sandbox.id, name = %self.name, "resolver: host lookup timed out");
                self.fail(ResponseCode::ServFail)
            }
        }
    }

    fn answer(mut self, sandbox: &Attached, addrs: Vec<Ipv4Addr>) -> Message {
        if addrs.is_empty() {
            return self.fail(ResponseCode::NXDomain);
        }
        if self.query.query_type() == RecordType::A {
            for a in addrs {
                sandbox.remember(IpAddr::V4(a), &self.name);
                self.reply.answers.push(Record::from_rdata(
                    self.query.name().clone(),
                    ANSWER_TTL,
                    RData::A(A(a)),
                ));
            }
        }
        self.reply
    }
}

/// The host name `name` spells (lowercase, no final dot), when every label
/// is made of letters, digits, `-` and `_` only.
fn hostname(name: &Name) -> Option<String> {
    let mut out = String::new();
    for label in name.iter() {
        let ok = !label.is_empty()
            && label
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_');
        if !ok {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.extend(label.iter().map(|b| b.to_ascii_lowercase() as char));
    }
    (!out.is_empty() && out.len() <= MAX_NAME).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&[u8]]) -> Name {
        Name::from_labels(l.iter().copied()).expect("a name")
    }

    #[test]
    fn only_host_names_are_read_and_escaped_dots_are_refused() {
        assert_eq!(
            hostname(&labels(&[b"Api", b"Example", b"com"])).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            hostname(&labels(&[b"_dmarc", b"x-1", b"com"])).as_deref(),
            Some("_dmarc.x-1.com")
        );
        // `x\.pub.example.com` would match `*.pub.example.com`.
        assert_eq!(hostname(&labels(&[b"x.pub", b"example", b"com"])), None);
        for bad in [&b"x\\y"[..], b"a b", b"caf\xc3\xa9", b"a\0b", b"*"] {
            assert_eq!(hostname(&labels(&[bad, b"com"])), None, "{bad:?}");
        }
        assert_eq!(hostname(&Name::root()), None);
    }
}
