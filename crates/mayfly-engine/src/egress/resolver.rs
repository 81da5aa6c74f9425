//! The daemon's DNS resolver for sandboxes: every UDP query a sandbox sends
//! to port 53, whatever the server, arrives here.
//!
//! It answers A queries for names the sandbox's policy allows, looked up in
//! the daemon's static table first and then with the host's own resolver
//! configuration (`getaddrinfo`: `/etc/hosts`, `/etc/resolv.conf`), and
//! remembers each address it hands out, which is what lets the proxy admit
//! a connection to it. Other names get NXDOMAIN; allowed names get no AAAA
//! (sandboxes have IPv4 only).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use tokio::net::UdpSocket;

use super::policy::may_resolve;
use super::state::Shared;

/// The TTL of every answer: short, so that clients ask again and the
/// handed-out table follows what upstream says.
const ANSWER_TTL: u32 = 30;

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
        let (shared, sock) = (shared.clone(), sock.clone());
        tokio::spawn(async move {
            let reply = answer(&shared, &sandbox, query).await;
            if let Ok(bytes) = reply.to_vec() {
                let _ = sock.send_to(&bytes, peer).await;
            }
        });
    }
}

async fn answer(shared: &Shared, sandbox: &super::Attached, query: Message) -> Message {
    let mut reply = Message::new(
        query.metadata.id,
        MessageType::Response,
        query.metadata.op_code,
    );
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    let Some(q) = query.queries.first().cloned() else {
        reply.metadata.response_code = ResponseCode::FormErr;
        return reply;
    };
    reply.queries.push(q.clone());
    let name = q
        .name()
        .to_ascii()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if !may_resolve(&sandbox.policy(), &name) {
        tracing::info!(sandbox = %sandbox.id, %name, "resolver: name not allowed");
        reply.metadata.response_code = ResponseCode::NXDomain;
        return reply;
    }
    let addrs = lookup(shared, &name).await;
    if addrs.is_empty() {
        reply.metadata.response_code = ResponseCode::NXDomain;
        return reply;
    }
    if q.query_type() == RecordType::A {
        for a in addrs {
            sandbox.remember(IpAddr::V4(a), &name);
            reply.answers.push(Record::from_rdata(
                q.name().clone(),
                ANSWER_TTL,
                RData::A(A(a)),
            ));
        }
    }
    reply
}

/// The IPv4 addresses of `name`: the static table's, or the host's resolver's.
async fn lookup(shared: &Shared, name: &str) -> Vec<Ipv4Addr> {
    if let Some(a) = shared.cfg.static_hosts.get(name) {
        return a.clone();
    }
    let Ok(found) = tokio::net::lookup_host((name, 0u16)).await else {
        return Vec::new();
    };
    let mut out: Vec<Ipv4Addr> = Vec::new();
    for sa in found {
        if let SocketAddr::V4(v4) = sa {
            if !out.contains(v4.ip()) {
                out.push(*v4.ip());
            }
        }
    }
    out
}
