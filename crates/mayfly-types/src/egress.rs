//! Egress policy: what a sandbox may reach outside itself.
//!
//! On the wire a policy is `{"mode": "allow", "allow": ["api.example.com",
//! "*.pypi.org:443", "10.1.0.0/16:5432", "192.0.2.7:8000-8099"], "deny": […],
//! "max_connections": 64, "bandwidth_bytes_per_sec": 1048576}`. Entries are
//! parsed when the request is read, so a malformed one is a 400.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How much of the outside a sandbox reaches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EgressMode {
    /// Loopback only: the sandbox has no other interface.
    #[default]
    None,
    /// Deny by default; the allow list, minus the deny list.
    Allow,
    /// Everything but the deny list and the always-blocked set.
    Open,
}

impl EgressMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EgressMode::None => "none",
            EgressMode::Allow => "allow",
            EgressMode::Open => "open",
        }
    }
}

/// The most entries a policy's allow and deny lists hold together.
pub const MAX_EGRESS_ENTRIES: usize = 256;
/// The most concurrent connections a policy may grant.
pub const MAX_EGRESS_CONNECTIONS: u32 = 65_536;
/// Concurrent connections when a policy names no cap.
pub const DEFAULT_EGRESS_CONNECTIONS: u32 = 256;

/// A sandbox's egress policy (`egress` in a create, a template's default,
/// or the body of `PATCH /v1/sandboxes/{id}/egress`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    #[serde(default)]
    pub mode: EgressMode,
    /// Entries that may be reached in `allow` mode.
    #[serde(default)]
    #[schema(value_type = Vec<String>, example = json!(["api.example.com", "*.pypi.org:443", "10.1.0.0/16:5432"]))]
    pub allow: Vec<EgressEntry>,
    /// Entries that are never reached, in `allow` and `open` mode.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub deny: Vec<EgressEntry>,
    /// Concurrent outbound connections; the daemon's default (256) when absent.
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// Bytes per second, capped each way on its own (outbound, and inbound,
    /// each up to this rate); unlimited when absent.
    #[serde(default)]
    pub bandwidth_bytes_per_sec: Option<u64>,
}

impl EgressPolicy {
    /// Checks the bounds serde cannot express.
    pub fn validate(&self) -> Result<(), EgressError> {
        if self.allow.len() + self.deny.len() > MAX_EGRESS_ENTRIES {
            return Err(EgressError::TooMany {
                max: MAX_EGRESS_ENTRIES,
            });
        }
        if let Some(c) = self.max_connections {
            if c == 0 || c > MAX_EGRESS_CONNECTIONS {
                return Err(EgressError::Connections { given: c });
            }
        }
        if self.bandwidth_bytes_per_sec == Some(0) {
            return Err(EgressError::Bandwidth);
        }
        Ok(())
    }

    pub fn connection_cap(&self) -> u32 {
        self.max_connections.unwrap_or(DEFAULT_EGRESS_CONNECTIONS)
    }
}

/// Ports an entry applies to: all, one, or an inclusive range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub const ALL: PortRange = PortRange {
        first: 1,
        last: 65535,
    };

    pub fn contains(&self, port: u16) -> bool {
        self.first <= port && port <= self.last
    }
}

/// One allow or deny entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum EgressEntry {
    /// An address block, `10.0.0.0/8` or a single address.
    Cidr {
        addr: IpAddr,
        prefix: u8,
        ports: PortRange,
    },
    /// A name; `wildcard` matches any name below `name` (`*.example.com`),
    /// not `name` itself.
    Domain {
        name: String,
        wildcard: bool,
        ports: PortRange,
    },
}

/// An egress entry or policy that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error("egress entry `{entry}` is not valid: {why}")]
    Entry { entry: String, why: &'static str },
    #[error("an egress policy holds at most {max} allow and deny entries")]
    TooMany { max: usize },
    #[error("max_connections of {given} is out of range; allowed is 1..=65536")]
    Connections { given: u32 },
    #[error("bandwidth_bytes_per_sec must be at least 1 (leave it out for no cap)")]
    Bandwidth,
}

fn bad(entry: &str, why: &'static str) -> EgressError {
    EgressError::Entry {
        entry: entry.chars().take(256).collect(),
        why,
    }
}

/// `443` or `8000-8099`.
fn parse_ports(s: &str, entry: &str) -> Result<PortRange, EgressError> {
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n > 0 && !p.starts_with('+') => Ok(n),
        _ => Err(bad(entry, "a port must be a number from 1 to 65535")),
    };
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => (port(s)?, port(s)?),
    };
    if first > last {
        return Err(bad(entry, "a port range must not run backwards"));
    }
    Ok(PortRange { first, last })
}

/// Splits `host:ports` (IPv4, names) or `[v6/len]:ports`.
fn split_ports<'a>(s: &'a str, entry: &str) -> Result<(&'a str, PortRange), EgressError> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest
            .split_once(']')
            .ok_or_else(|| bad(entry, "a `[` has no closing `]`"))?;
        return match tail {
            "" => Ok((host, PortRange::ALL)),
            t => match t.strip_prefix(':') {
                Some(p) => Ok((host, parse_ports(p, entry)?)),
                None => Err(bad(entry, "only `:PORT` may follow `]`")),
            },
        };
    }
    if s.matches(':').count() > 1 {
        // A bare IPv6 address or block, without ports.
        return Ok((s, PortRange::ALL));
    }
    match s.split_once(':') {
        Some((h, p)) => Ok((h, parse_ports(p, entry)?)),
        None => Ok((s, PortRange::ALL)),
    }
}

fn parse_cidr(host: &str, entry: &str) -> Result<Option<(IpAddr, u8)>, EgressError> {
    let (addr, len) = match host.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (host, None),
    };
    let Ok(ip) = addr.parse::<IpAddr>() else {
        if len.is_some() || addr.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(bad(entry, "the address of a CIDR is not an IP address"));
        }
        return Ok(None);
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match len {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max && !l.starts_with('+') => n,
            _ => return Err(bad(entry, "the prefix length is out of range")),
        },
    };
    if masked(ip, prefix) != ip {
        return Err(bad(
            entry,
            "the address has bits set beyond the prefix length",
        ));
    }
    Ok(Some((ip, prefix)))
}

/// `ip` with every bit past `prefix` cleared.
pub fn masked(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - prefix as u32).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// A DNS name: labels of letters, digits, `-` and `_`, at most 253 bytes.
fn check_name(name: &str, entry: &str) -> Result<(), EgressError> {
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(ok_label) {
        return Err(bad(entry, "a name must be DNS labels of letters, digits and `-`, with `*.` only as its first label"));
    }
    Ok(())
}

impl std::str::FromStr for EgressEntry {
    type Err = EgressError;
    fn from_str(entry: &str) -> Result<Self, EgressError> {
        let s = entry.trim();
        if s.is_empty() {
            return Err(bad(entry, "it is empty"));
        }
        let (host, ports) = split_ports(s, entry)?;
        if let Some((addr, prefix)) = parse_cidr(host, entry)? {
            return Ok(EgressEntry::Cidr {
                addr,
                prefix,
                ports,
            });
        }
        let lower = host.trim_end_matches('.').to_ascii_lowercase();
        let (name, wildcard) = match lower.strip_prefix("*.") {
            Some(rest) => (rest.to_owned(), true),
            None => (lower, false),
        };
        if name.contains('*') {
            return Err(bad(
                entry,
                "a wildcard may only be the whole first label (`*.example.com`)",
            ));
        }
        check_name(&name, entry)?;
        if !wildcard && !name.contains('.') && name.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(entry, "a name must not be a number"));
        }
        Ok(EgressEntry::Domain {
            name,
            wildcard,
            ports,
        })
    }
}

impl EgressEntry {
    /// Whether this domain entry names `name` (lowercase, no trailing dot).
    pub fn matches_name(&self, name: &str) -> bool {
        match self {
            EgressEntry::Domain {
                name: n,
                wildcard: false,
                ..
            } => n == name,
            EgressEntry::Domain {
                name: n,
                wildcard: true,
                ..
            } => {
                name.len() > n.len() + 1
                    && name.ends_with(n.as_str())
                    && name.as_bytes()[name.len() - n.len() - 1] == b'.'
            }
            EgressEntry::Cidr { .. } => false,
        }
    }

    /// Whether this CIDR entry covers `ip`.
    pub fn covers(&self, ip: IpAddr) -> bool {
        match *self {
            EgressEntry::Cidr { addr, prefix, .. } => {
                addr.is_ipv4() == ip.is_ipv4() && masked(ip, prefix) == addr
            }
            EgressEntry::Domain { .. } => false,
        }
    }

    pub fn ports(&self) -> PortRange {
        match self {
            EgressEntry::Cidr { ports, .. } | EgressEntry::Domain { ports, .. } => *ports,
        }
    }
}

impl std::fmt::Display for EgressEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = match self {
            EgressEntry::Cidr { addr, prefix, .. } => {
                let full = if addr.is_ipv4() { 32 } else { 128 };
                let a = match (addr, *prefix == full) {
                    (IpAddr::V4(a), true) => a.to_string(),
                    (IpAddr::V4(a), false) => format!("{a}/{prefix}"),
                    (IpAddr::V6(a), true) => format!("[{a}]"),
                    (IpAddr::V6(a), false) => format!("[{a}/{prefix}]"),
                };
                a
            }
            EgressEntry::Domain { name, wildcard, .. } => {
                format!("{}{name}", if *wildcard { "*." } else { "" })
            }
        };
        let p = self.ports();
        match (p == PortRange::ALL, p.first == p.last) {
            (true, _) => f.write_str(&host),
            (false, true) => write!(f, "{host}:{}", p.first),
            (false, false) => write!(f, "{host}:{}-{}", p.first, p.last),
        }
    }
}

impl TryFrom<String> for EgressEntry {
    type Error = EgressError;
    fn try_from(s: String) -> Result<Self, EgressError> {
        s.parse()
    }
}

impl From<EgressEntry> for String {
    fn from(e: EgressEntry) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<EgressEntry, EgressError> {
        s.parse()
    }

    #[test]
    fn entries_parse_and_print_back() {
        for s in [
            "10.0.0.0/8",
            "10.1.2.3",
            "10.1.2.3:443",
            "192.0.2.0/24:8000-8099",
            "[fd00::/8]:443",
            "[2001:db8::1]",
            "example.com",
            "*.example.com:443",
            "api.example.com:80-81",
        ] {
            assert_eq!(p(s).unwrap().to_string(), s, "{s}");
        }
        assert_eq!(p("fd00::/8").unwrap().to_string(), "[fd00::/8]");
        assert_eq!(p("Example.COM.").unwrap().to_string(), "example.com");
    }

    #[test]
    fn malformed_entries_are_refused() {
        for s in [
            "",
            "10.0.0.0/33",
            "10.0.0.1/8",
            "300.1.2.3",
            "10.0.0.0/8:0",
            "10.0.0.0/8:70000",
            "10.0.0.0/8:90-80",
            "example.com:http",
            "ex*ample.com",
            "*example.com",
            "a.*.example.com",
            "*",
            "-bad.example.com",
            "under score!.com",
            "[fd00::/8",
            "[fd00::]x",
        ] {
            assert!(p(s).is_err(), "`{s}` should be refused");
        }
    }

    #[test]
    fn a_wildcard_matches_names_below_only() {
        let w = p("*.example.com").unwrap();
        assert!(w.matches_name("a.example.com"));
        assert!(w.matches_name("b.a.example.com"));
        assert!(!w.matches_name("example.com"));
        assert!(!w.matches_name("badexample.com"));
        let exact = p("example.com").unwrap();
        assert!(exact.matches_name("example.com"));
        assert!(!exact.matches_name("a.example.com"));
    }

    #[test]
    fn cidrs_cover_their_block_only() {
        let c = p("10.1.0.0/16").unwrap();
        assert!(c.covers("10.1.200.3".parse().unwrap()));
        assert!(!c.covers("10.2.0.1".parse().unwrap()));
        assert!(!c.covers("::1".parse().unwrap()));
        assert!(p("0.0.0.0/0").unwrap().covers("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn policies_are_read_from_json_and_bounded() {
        let pol: EgressPolicy = serde_json::from_str(
            r#"{"mode":"allow","allow":["example.com:443"],"max_connections":4}"#,
        )
        .unwrap();
        assert_eq!(pol.mode, EgressMode::Allow);
        assert!(pol.validate().is_ok());
        assert!(serde_json::from_str::<EgressPolicy>(r#"{"allow":["10.0.0.0/99"]}"#).is_err());
        assert!(serde_json::from_str::<EgressPolicy>(r#"{"mode":"sometimes"}"#).is_err());
        let zero = EgressPolicy {
            max_connections: Some(0),
            ..EgressPolicy::default()
        };
        assert!(zero.validate().is_err());
    }
}
