//! Egress decisions, pure: may this sandbox resolve this name, open this
//! connection, and does the name it presents on 80/443 match?

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mayfly_types::{masked, EgressEntry, EgressMode, EgressPolicy};

use super::plan::SANDBOX_NET;

/// Why a connection or a name is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The host, another sandbox, link-local or metadata, or DNS not through
    /// the daemon: whatever the policy says.
    AlwaysBlocked,
    /// A deny entry matches.
    Denied,
    /// No allow entry matches (or the mode is `none`).
    NotAllowed,
    /// On 80/443, the Host header or TLS SNI names no allowed name.
    NameMismatch,
    /// On 80/443, no Host header or SNI could be read.
    NoName,
    /// The sandbox's concurrent connection cap is reached.
    TooManyConnections,
    /// The host's addresses could never be read, so no destination can be
    /// told apart from the host: nothing is admitted (fail closed).
    HostUnknown,
    /// On 80, a request the proxy cannot frame safely: malformed, with
    /// ambiguous body framing, `CONNECT`, or an upgrade it cannot follow.
    BadRequest,
    /// The sandbox was destroyed (detached) while the connection was open.
    Gone,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::AlwaysBlocked => "always_blocked",
            Refusal::Denied => "denied",
            Refusal::NotAllowed => "not_allowed",
            Refusal::NameMismatch => "name_mismatch",
            Refusal::NoName => "no_name",
            Refusal::TooManyConnections => "too_many_connections",
            Refusal::HostUnknown => "host_addresses_unknown",
            Refusal::BadRequest => "bad_request",
            Refusal::Gone => "sandbox_gone",
        }
    }
}

/// What to do with a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Allowed for a name the resolver handed out; on 80/443 the name the
    /// client presents must be checked first ([`name_fits`]).
    CheckName,
    Refuse(Refusal),
}

/// Ports where the Host header or TLS SNI must name an allowed name.
pub fn checks_name(port: u16) -> bool {
    port == 80 || port == 443
}

fn in_v4(a: Ipv4Addr, net: (Ipv4Addr, u8)) -> bool {
    masked(IpAddr::V4(a), net.1) == IpAddr::V4(net.0)
}

/// Ports no policy opens: DNS (53) and DNS over TLS (853) anywhere but the
/// daemon's resolver, so that every name a sandbox resolves is one the
/// resolver saw. (DNS over QUIC, UDP 853, never leaves: no UDP but DNS to
/// the resolver does. DNS over HTTPS on 443 cannot be told from HTTPS but
/// by its name, which an allow list has to leave out.)
pub const DNS_PORTS: [u16; 2] = [53, 853];

/// The set no policy opens: the host (`host` is every address it has), its
/// loopback, other sandboxes, link-local and cloud metadata, multicast and
/// broadcast, and DNS ([`DNS_PORTS`]) anywhere but the daemon's resolver.
pub fn always_blocked(ip: IpAddr, port: u16, host: &[IpAddr]) -> bool {
    if DNS_PORTS.contains(&port) || host.contains(&ip) {
        return true;
    }
    match ip {
        IpAddr::V4(a) => blocked_v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => blocked_v4(v4) || host.contains(&IpAddr::V4(v4)),
            None => blocked_v6(a),
        },
    }
}

fn blocked_v4(a: Ipv4Addr) -> bool {
    a.is_loopback()
        || a.is_unspecified()
        || a.is_link_local()
        || a.is_multicast()
        || a.is_broadcast()
        || in_v4(a, (Ipv4Addr::new(0, 0, 0, 0), 8))
        || in_v4(a, SANDBOX_NET)
}

fn blocked_v6(a: Ipv6Addr) -> bool {
    let metadata = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    a.is_loopback()
        || a.is_unspecified()
        || a.is_multicast()
        || a == metadata
        // fe80::/10, link-local.
        || (a.segments()[0] & 0xffc0) == 0xfe80
}

fn names_entry(e: &EgressEntry, name: &str, port: Option<u16>) -> bool {
    e.matches_name(name) && port.is_none_or(|p| e.ports().contains(p))
}

fn denied_name(p: &EgressPolicy, name: &str, port: Option<u16>) -> bool {
    p.deny.iter().any(|e| names_entry(e, name, port))
}

/// Whether the resolver answers `name` for a sandbox with policy `p`.
pub fn may_resolve(p: &EgressPolicy, name: &str) -> bool {
    match p.mode {
        EgressMode::None => false,
        // A deny entry with ports still lets the name resolve: other ports
        // of it may be allowed.
        EgressMode::Open => !p
            .deny
            .iter()
            .any(|e| e.matches_name(name) && e.ports() == mayfly_types::PortRange::ALL),
        EgressMode::Allow => {
            p.allow.iter().any(|e| e.matches_name(name))
                && !p
                    .deny
                    .iter()
                    .any(|e| e.matches_name(name) && e.ports() == mayfly_types::PortRange::ALL)
        }
    }
}

/// Whether `name`, presented on `port` (Host header or SNI), is allowed.
pub fn name_fits(p: &EgressPolicy, name: &str, port: u16) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    match p.mode {
        EgressMode::None => false,
        EgressMode::Open => !denied_name(p, &name, Some(port)),
        EgressMode::Allow => {
            p.allow.iter().any(|e| names_entry(e, &name, Some(port)))
                && !denied_name(p, &name, Some(port))
        }
    }
}

/// The verdict on a connection to `ip:port`, for a sandbox whose resolver
/// handed `ip` out for `names` (empty when it never did).
pub fn decide(
    p: &EgressPolicy,
    ip: IpAddr,
    port: u16,
    names: &[String],
    host: &[IpAddr],
) -> Verdict {
    if always_blocked(ip, port, host) {
        return Verdict::Refuse(Refusal::AlwaysBlocked);
    }
    let cidr = |list: &[EgressEntry]| {
        list.iter()
            .any(|e| e.covers(ip) && e.ports().contains(port))
    };
    if cidr(&p.deny) {
        return Verdict::Refuse(Refusal::Denied);
    }
    if !names.is_empty() && names.iter().all(|n| denied_name(p, n, Some(port))) {
        return Verdict::Refuse(Refusal::Denied);
    }
    match p.mode {
        EgressMode::None => Verdict::Refuse(Refusal::NotAllowed),
        EgressMode::Open => Verdict::Allow,
        EgressMode::Allow if cidr(&p.allow) => Verdict::Allow,
        EgressMode::Allow if names.iter().any(|n| name_fits(p, n, port)) => {
            if checks_name(port) {
                Verdict::CheckName
            } else {
                Verdict::Allow
            }
        }
        EgressMode::Allow => Verdict::Refuse(Refusal::NotAllowed),
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
