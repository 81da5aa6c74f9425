//! Reading a gateway request: what it addresses (a sandbox's port or a
//! service), its routing key, and how often the gateway forwarded it
//! already. Pure functions over headers; the token is [`super::token`]'s.

use http::header::{HeaderMap, HOST};
use http::Uri;
use mayfly_types::{check_service_name, SandboxId};

/// `X-Mayfly-Sandbox: <id>`: with `X-Mayfly-Port`, a preview request;
/// otherwise a service request's routing key.
pub const SANDBOX_HEADER: &str = "x-mayfly-sandbox";
/// `X-Mayfly-Port: <port>`: the sandbox port of a header-based preview.
pub const PORT_HEADER: &str = "x-mayfly-port";
/// `X-Mayfly-Service: <name>`: the service of a service request.
pub const SERVICE_HEADER: &str = "x-mayfly-service";
/// `X-Mayfly-Hops: <n>`: how many times the gateway has forwarded the
/// request already. The gateway sets it to n + 1 on every request it
/// forwards and refuses one that arrives with [`MAX_HOPS`] or more, so a
/// request routed in a loop (a baseline or a sandbox that sends it back to
/// the gateway, headers and all) ends there, not at the daemon's last
/// descriptor.
pub const HOPS_HEADER: &str = "x-mayfly-hops";
/// The most times one request may pass through the gateway.
pub const MAX_HOPS: u32 = 10;
/// The W3C baggage member that carries the routing key.
pub const BAGGAGE_KEY: &str = "mayfly-sandbox";

/// What a gateway request addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `port` of sandbox `id` (a preview URL, or the two headers).
    Preview { id: SandboxId, port: u16 },
    /// A service, routed by the request's key.
    Service(String),
}

/// Why a request names nothing the gateway can serve (400 or 404).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{0}")]
    Malformed(String),
    #[error("the request names neither a sandbox port (Host `<port>-<sandbox id>.{domain}`, or X-Mayfly-Sandbox with X-Mayfly-Port) nor a service (Host `<service>.{domain}`, or X-Mayfly-Service)")]
    NoTarget { domain: String },
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ParseError> {
    single(h, name)?;
    match h.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()))
            .map_err(|_| ParseError::Malformed(format!("the {name} header is not visible ASCII"))),
    }
}

/// A routing header given twice is ambiguous: refused, never the first
/// one silently.
fn single(h: &HeaderMap, name: &str) -> Result<(), ParseError> {
    if h.get_all(name).iter().nth(1).is_some() {
        return Err(ParseError::Malformed(format!(
            "the {name} header is given more than once"
        )));
    }
    Ok(())
}

/// The `Host` header's port, when it has one, must be a port.
fn check_host_port(h: &HeaderMap) -> Result<(), ParseError> {
    let Some(raw) = h.get(HOST).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let malformed = || ParseError::Malformed("the Host header is malformed".into());
    let after_host = match raw.strip_prefix('[') {
        Some(v6) => v6
            .split_once(']')
            .map(|(_, rest)| rest)
            .ok_or_else(malformed)?,
        None => raw.find(':').map_or("", |i| &raw[i..]),
    };
    match after_host.strip_prefix(':') {
        Some(port) => parse_port(port).map(|_| ()),
        None if after_host.is_empty() => Ok(()),
        None => Err(malformed()),
    }
}

fn parse_id(raw: &str) -> Result<SandboxId, ParseError> {
    raw.parse::<SandboxId>()
        .map_err(|e| ParseError::Malformed(e.to_string()))
}

fn parse_port(raw: &str) -> Result<u16, ParseError> {
    raw.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
        ParseError::Malformed(format!(
            "`{}` is not a port: expected 1 to 65535",
            raw.chars().take(16).collect::<String>()
        ))
    })
}

/// The host a request was sent to, lower-cased and without its port:
/// `Host`, or the URI's authority (HTTP/2).
pub fn request_host(h: &HeaderMap, uri: &Uri) -> Option<String> {
    let raw = match h.get(HOST).and_then(|v| v.to_str().ok()) {
        Some(v) => v,
        None => uri.authority()?.as_str(),
    };
    let host = if raw.starts_with('[') {
        raw.split_inclusive(']').next().unwrap_or(raw)
    } else {
        raw.split(':').next().unwrap_or(raw)
    };
    Some(host.to_ascii_lowercase())
}

/// What the request addresses. The headers win over the host:
/// `X-Mayfly-Port` (with `X-Mayfly-Sandbox`) is a preview, then
/// `X-Mayfly-Service` a service; then the host `<label>.<domain>`, where
/// a label starting with a digit is `<port>-<id>` and any other a service.
pub fn target(h: &HeaderMap, host: Option<&str>, domain: &str) -> Result<Target, ParseError> {
    check_host_port(h)?;
    single(h, SANDBOX_HEADER)?;
    if let Some(port) = header_str(h, PORT_HEADER)? {
        let port = parse_port(port)?;
        let id = header_str(h, SANDBOX_HEADER)?.ok_or_else(|| {
            ParseError::Malformed("X-Mayfly-Port needs X-Mayfly-Sandbox: <sandbox id>".into())
        })?;
        return Ok(Target::Preview {
            id: parse_id(id)?,
            port,
        });
    }
    if let Some(service) = header_str(h, SERVICE_HEADER)? {
        let service = service.to_ascii_lowercase();
        check_service_name(&service).map_err(|e| ParseError::Malformed(e.to_string()))?;
        return Ok(Target::Service(service));
    }
    let no_target = || ParseError::NoTarget {
        domain: domain.to_owned(),
    };
    let label = host
        .and_then(|h| h.strip_suffix(domain))
        .and_then(|h| h.strip_suffix('.'))
        .ok_or_else(no_target)?;
    if label.is_empty() || label.contains('.') {
        return Err(no_target());
    }
    if label.as_bytes()[0].is_ascii_digit() {
        let (port, id) = label.split_once('-').ok_or_else(|| {
            ParseError::Malformed(format!(
                "`{label}` is not a preview host label: expected `<port>-<sandbox id>`"
            ))
        })?;
        return Ok(Target::Preview {
            id: parse_id(id)?,
            port: parse_port(port)?,
        });
    }
    check_service_name(label).map_err(|e| ParseError::Malformed(e.to_string()))?;
    Ok(Target::Service(label.to_owned()))
}

/// The routing key of a service request: `X-Mayfly-Sandbox`, else the
/// `mayfly-sandbox` member of the W3C `baggage` headers. A key that is not
/// a sandbox id is no key (the request goes to the baseline, unchanged).
pub fn routing_key(h: &HeaderMap) -> Option<SandboxId> {
    if let Some(v) = h.get(SANDBOX_HEADER) {
        return v.to_str().ok()?.trim().parse().ok();
    }
    h.get_all("baggage")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| baggage_value(v, BAGGAGE_KEY))
        .and_then(|v| v.parse().ok())
}

/// The value of `key` in one W3C baggage header: comma-separated list
/// members `key=value`, each with optional `;`-separated properties,
/// optional whitespace around every part, and a percent-encoded value.
pub fn baggage_value(header: &str, key: &str) -> Option<String> {
    header.split(',').find_map(|member| {
        let kv = member.split(';').next()?;
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| {
            percent_encoding::percent_decode_str(v.trim())
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// The request's hop count ([`HOPS_HEADER`]; none is 0): the largest of
/// its values, so a proxy that appends rather than replaces cannot lower it.
pub fn hops(h: &HeaderMap) -> Result<u32, ParseError> {
    let mut most = 0;
    for v in h.get_all(HOPS_HEADER) {
        let bad =
            || ParseError::Malformed(format!("the {HOPS_HEADER} header is not a count of hops"));
        for n in v.to_str().map_err(|_| bad())?.split(',') {
            // Saturates: a huge count is a loop, not a malformed request.
            let n = n.trim();
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            most = most.max(n.parse::<u32>().unwrap_or(u32::MAX));
        }
    }
    Ok(most)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    const ID: &str = "mf-abcdefghijk2";

    #[test]
    fn preview_hosts_and_headers_name_a_sandbox_port() {
        let h = HeaderMap::new();
        let want = Target::Preview {
            id: ID.parse().unwrap(),
            port: 8080,
        };
        let host = format!("8080-{ID}.localhost");
        assert_eq!(target(&h, Some(&host), "localhost"), Ok(want.clone()));
        let h = headers(&[("x-mayfly-sandbox", ID), ("x-mayfly-port", "8080")]);
        assert_eq!(target(&h, Some("127.0.0.1"), "localhost"), Ok(want));
    }

    #[test]
    fn service_hosts_and_headers_name_a_service() {
        let h = HeaderMap::new();
        assert_eq!(
            target(&h, Some("payments.gw.example"), "gw.example"),
            Ok(Target::Service("payments".into()))
        );
        let h = headers(&[("x-mayfly-service", "Payments")]);
        assert_eq!(
            target(&h, Some("127.0.0.1"), "localhost"),
            Ok(Target::Service("payments".into()))
        );
    }

    #[test]
    fn malformed_hosts_are_refused_not_guessed() {
        let h = HeaderMap::new();
        for host in [
            "0-mf-abcdefghijk2.localhost",
            "70000-mf-abcdefghijk2.localhost",
            "8080-mf-ABC.localhost",
            "8080.localhost",
            "8080-.localhost",
            "bad_name.localhost",
        ] {
            assert!(
                matches!(
                    target(&h, Some(host), "localhost"),
                    Err(ParseError::Malformed(_))
                ),
                "{host}"
            );
        }
        for host in ["localhost", "a.b.localhost", "example.com", ".localhost"] {
            assert!(
                matches!(
                    target(&h, Some(host), "localhost"),
                    Err(ParseError::NoTarget { .. })
                ),
                "{host}"
            );
        }
        let h = headers(&[("x-mayfly-port", "99999"), ("x-mayfly-sandbox", ID)]);
        assert!(target(&h, None, "localhost").is_err());
        let h = headers(&[("x-mayfly-port", "80")]);
        assert!(target(&h, None, "localhost").is_err());
        // A Host whose port is not a port.
        let preview = format!("8000-{ID}.localhost");
        for host in [":99999", ":abc", ":", ":80:80", ":-1"] {
            let h = headers(&[("host", &format!("{preview}{host}"))]);
            assert!(
                matches!(
                    target(&h, Some(&preview), "localhost"),
                    Err(ParseError::Malformed(_))
                ),
                "{host}"
            );
        }
        for host in ["", ":7792"] {
            let h = headers(&[("host", &format!("{preview}{host}"))]);
            assert!(target(&h, Some(&preview), "localhost").is_ok(), "{host}");
        }
        let h = headers(&[("host", "[::1]:80")]);
        assert!(check_host_port(&h).is_ok());
        let h = headers(&[("host", "[::1]x")]);
        assert!(check_host_port(&h).is_err());
    }

    #[test]
    fn routing_headers_given_twice_are_refused() {
        let cases: [&[(&str, &str)]; 4] = [
            &[
                ("x-mayfly-port", "80"),
                ("x-mayfly-port", "81"),
                ("x-mayfly-sandbox", ID),
            ],
            &[
                ("x-mayfly-port", "80"),
                ("x-mayfly-sandbox", ID),
                ("x-mayfly-sandbox", ID),
            ],
            &[
                ("x-mayfly-service", "payments"),
                ("x-mayfly-service", "orders"),
            ],
            &[
                ("x-mayfly-service", "payments"),
                ("x-mayfly-sandbox", ID),
                ("x-mayfly-sandbox", ID),
            ],
        ];
        for pairs in cases {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(http::HeaderName::from_static(k), v.parse().unwrap());
            }
            assert!(
                matches!(target(&h, None, "localhost"), Err(ParseError::Malformed(_))),
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn request_host_drops_the_port_and_case() {
        let h = headers(&[("host", "8080-MF-x.LocalHost:4180")]);
        assert_eq!(
            request_host(&h, &Uri::from_static("/")).as_deref(),
            Some("8080-mf-x.localhost")
        );
        let uri: Uri = "http://svc.localhost:1/x".parse().unwrap();
        assert_eq!(
            request_host(&HeaderMap::new(), &uri).as_deref(),
            Some("svc.localhost")
        );
        let h = headers(&[("host", "[::1]:80")]);
        assert_eq!(
            request_host(&h, &Uri::from_static("/")).as_deref(),
            Some("[::1]")
        );
    }

    #[test]
    fn baggage_is_parsed_as_w3c_list_members() {
        assert_eq!(
            baggage_value(
                "a=1, mayfly-sandbox = mf-x ;prop=2;flag ,b=3",
                "mayfly-sandbox"
            ),
            Some("mf-x".into())
        );
        assert_eq!(
            baggage_value("k=caf%C3%A9%20au%2Clait", "k"),
            Some("café au,lait".into())
        );
        assert_eq!(baggage_value("mayfly-sandboxx=1,x", "mayfly-sandbox"), None);
        assert_eq!(baggage_value("", "k"), None);
        let h = headers(&[
            ("baggage", "userid=alice"),
            ("baggage", &format!("sp=1,mayfly-sandbox={ID};ttl=5")),
        ]);
        assert_eq!(routing_key(&h), Some(ID.parse().unwrap()));
        let h = headers(&[
            ("baggage", &format!("mayfly-sandbox={ID}")),
            ("x-mayfly-sandbox", "junk"),
        ]);
        assert_eq!(routing_key(&h), None, "the header wins, and junk is no key");
    }

    #[test]
    fn hops_are_counted_from_every_value_and_junk_is_refused() {
        assert_eq!(hops(&HeaderMap::new()), Ok(0));
        let h = headers(&[("x-mayfly-hops", "3"), ("x-mayfly-hops", "1, 7")]);
        assert_eq!(hops(&h), Ok(7), "the largest value counts");
        let h = headers(&[("x-mayfly-hops", "99999999999999999999")]);
        assert_eq!(hops(&h), Ok(u32::MAX), "saturates");
        for junk in ["", "-1", "two", "1;2", "+3"] {
            let h = headers(&[("x-mayfly-hops", junk)]);
            assert!(
                matches!(hops(&h), Err(ParseError::Malformed(_))),
                "{junk:?}"
            );
        }
    }
}
