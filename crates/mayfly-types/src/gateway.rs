//! The gateway: exposed ports and preview URLs, routes (a service's shared
//! baseline) and a sandbox's overrides of them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The longest service name (one DNS label).
pub const MAX_SERVICE_NAME: usize = 63;

/// Why a string is not a service name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not a service name: expected 1 to 63 characters of [a-z0-9-], starting with a letter and not ending with `-`")]
pub struct ServiceNameError {
    pub given: String,
}

/// A service name is one DNS label that starts with a letter, so
/// `<service>.<domain>` never reads as a preview host (`<port>-<id>`).
pub fn check_service_name(name: &str) -> Result<(), ServiceNameError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= MAX_SERVICE_NAME
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(ServiceNameError {
            given: name.chars().take(80).collect(),
        })
    }
}

/// Why a string is not a baseline URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("`{given}` is not a baseline URL: it must start with `http://` (the gateway speaks plain HTTP to baselines)")]
    Scheme { given: String },
    #[error("`{given}` is not a baseline URL: {why}")]
    Malformed { given: String, why: &'static str },
}

/// A route's baseline: `http://HOST[:PORT][/PREFIX]`, no user, query or
/// fragment. A request's path is appended to `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineUrl {
    /// `host:port` (IPv6 hosts in brackets), as it goes into a URI.
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Empty, or `/…` without a trailing `/`.
    pub prefix: String,
}

impl BaselineUrl {
    pub fn parse(given: &str) -> Result<BaselineUrl, UrlError> {
        let bad = |why| UrlError::Malformed {
            given: given.chars().take(200).collect(),
            why,
        };
        let rest = given
            .strip_prefix("http://")
            .ok_or_else(|| UrlError::Scheme {
                given: given.chars().take(200).collect(),
            })?;
        if given.len() > 2048 {
            return Err(bad("longer than 2048 characters"));
        }
        if rest.contains(['?', '#', '@', ' ', '\\']) || rest.chars().any(|c| c.is_control()) {
            return Err(bad(
                "it may not have a user, query, fragment, space or backslash",
            ));
        }
        let (auth, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = auth.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed `[`"))?;
            h.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("the bracketed host is not an IPv6 address"))?;
            (format!("[{h}]"), after.strip_prefix(':'))
        } else {
            match auth.split_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (auth.to_owned(), None),
            }
        };
        if host.is_empty()
            || !host.starts_with('[')
                && !host
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
        {
            return Err(bad(
                "the host is empty or has characters a host cannot have",
            ));
        }
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?,
        };
        let prefix = path.trim_end_matches('/').to_owned();
        Ok(BaselineUrl {
            authority: format!("{host}:{port}"),
            host: host.to_ascii_lowercase(),
            port,
            prefix,
        })
    }
}

/// `PUT /v1/sandboxes/{id}/ports/{port}`: expose a port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposeRequest {
    /// Reachable through the gateway without the sandbox's token.
    #[serde(default)]
    pub public: bool,
}

/// An exposed port of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PortInfo {
    pub port: u16,
    /// Reachable without the token.
    pub public: bool,
    /// The preview URL (`http://<port>-<id>.<domain>:<gateway port>`), when
    /// the daemon runs a gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// A service of a sandbox that its overriding port serves instead of the
/// route's baseline, for requests that carry the sandbox's routing key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServiceOverride {
    pub service: String,
    pub port: u16,
}

/// `PUT /v1/sandboxes/{id}/overrides/{service}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideRequest {
    /// The sandbox's port that serves the service (1–65535).
    pub port: u32,
}

/// `GET /v1/sandboxes/{id}/ports`: how to reach a sandbox through the
/// gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxPorts {
    pub sandbox_id: String,
    /// The sandbox's gateway token: `X-Mayfly-Token: <token>`, or
    /// `?mayfly_token=<token>` once (it sets a cookie). Any port of the
    /// sandbox is reachable with it.
    pub token: String,
    /// Exposed ports (public ones need no token).
    pub ports: Vec<PortInfo>,
    pub overrides: Vec<ServiceOverride>,
}

/// A route: a service name and its shared baseline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RouteInfo {
    pub name: String,
    /// `http://HOST[:PORT][/PREFIX]`
    pub url: String,
}

/// `PUT /v1/routes/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteRequest {
    pub url: String,
}

/// `GET /v1/routes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RouteList {
    pub routes: Vec<RouteInfo>,
}

/// A port number from the wire: 1 to 65535.
pub fn check_port(port: u32) -> Result<u16, String> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("port {port} is out of range: expected 1 to 65535"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_dns_labels_starting_with_a_letter() {
        for ok in ["payments", "a", "svc-2", &"a".repeat(63)] {
            assert!(check_service_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "8080-mf-x", "Pay", "a-", "a.b", "a_b", &"a".repeat(64)] {
            assert!(check_service_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn baseline_urls_parse_into_authority_and_prefix() {
        let u = BaselineUrl::parse("http://127.0.0.1:9001/api/").unwrap();
        assert_eq!(
            u,
            BaselineUrl {
                authority: "127.0.0.1:9001".into(),
                host: "127.0.0.1".into(),
                port: 9001,
                prefix: "/api".into()
            }
        );
        let u = BaselineUrl::parse("http://[::1]").unwrap();
        assert_eq!((u.authority.as_str(), u.port), ("[::1]:80", 80));
        for bad in [
            "https://x",
            "http://",
            "http://a:0",
            "http://a:70000",
            "http://u@a",
            "http://a/?q",
            "http://a b",
            "http://[zz]",
        ] {
            assert!(BaselineUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ports_out_of_range_are_refused() {
        assert_eq!(check_port(8080), Ok(8080));
        assert!(check_port(0).is_err());
        assert!(check_port(65536).is_err());
    }
}
