//! The name a client presents before anything reaches the destination:
//! the TLS ClientHello's SNI on 443, the HTTP Host header on 80.

/// What the first bytes of a connection say so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    /// Not enough bytes yet.
    NeedMore,
    /// A complete hello or request head, naming this host (lowercase, no
    /// port, no trailing dot).
    Name(String),
    /// Complete, but naming nothing, or not TLS / HTTP at all.
    Nothing,
    /// Complete, naming two different hosts (an HTTP request whose
    /// absolute-form target is not its `Host`).
    Mismatch,
}

/// Reads the SNI of a TLS ClientHello record.
pub fn tls_sni(buf: &[u8]) -> Presented {
    use tls_parser::{TlsExtension, TlsMessage, TlsMessageHandshake};
    // 22: a handshake record. Anything else is no ClientHello, however
    // long the record header claims to be.
    if buf.first().is_some_and(|b| *b != 22) {
        return Presented::Nothing;
    }
    let record = match tls_parser::parse_tls_plaintext(buf) {
        Ok((_, r)) => r,
        Err(tls_parser::Err::Incomplete(_)) => return Presented::NeedMore,
        Err(_) => return Presented::Nothing,
    };
    for msg in &record.msg {
        let TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)) = msg else {
            continue;
        };
        let Some(Ok((_, exts))) = hello.ext.map(tls_parser::parse_tls_extensions) else {
            return Presented::Nothing;
        };
        for ext in exts {
            if let TlsExtension::SNI(names) = ext {
                // Type 0 is a host name, the only type defined.
                if let Some((_, n)) = names.iter().find(|(t, _)| t.0 == 0) {
                    return match std::str::from_utf8(n) {
                        Ok(s) => Presented::Name(normal(s)),
                        Err(_) => Presented::Nothing,
                    };
                }
            }
        }
    }
    Presented::Nothing
}

/// Reads the name an HTTP/1 request head presents: its `Host`, which an
/// absolute-form target's authority must match ([`super::http1`]).
pub fn http_host(buf: &[u8]) -> Presented {
    match super::http1::request_head(buf) {
        Ok(None) => Presented::NeedMore,
        Ok(Some(head)) => Presented::Name(head.name),
        Err(super::http1::Refused::NameMismatch) => Presented::Mismatch,
        Err(_) => Presented::Nothing,
    }
}

fn normal(s: &str) -> String {
    s.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal TLS 1.2 ClientHello naming `host`.
    fn hello(host: &str) -> Vec<u8> {
        let name = host.as_bytes();
        let mut sni = Vec::new();
        sni.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name);
        let mut exts = vec![0, 0];
        exts.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        exts.extend_from_slice(&sni);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn sni_is_read_from_a_whole_hello_only() {
        let h = hello("API.Example.com");
        assert_eq!(tls_sni(&h), Presented::Name("api.example.com".into()));
        assert_eq!(tls_sni(&h[..20]), Presented::NeedMore);
        assert_eq!(tls_sni(b"GET / HTTP/1.1\r\n\r\n"), Presented::Nothing);
    }

    #[test]
    fn the_host_header_is_read_without_its_port() {
        let req = b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\n\r\n";
        assert_eq!(http_host(req), Presented::Name("example.com".into()));
        assert_eq!(http_host(&req[..20]), Presented::NeedMore);
        assert_eq!(http_host(b"GET / HTTP/1.1\r\n\r\n"), Presented::Nothing);
        assert_eq!(http_host(b"\x16\x03\x01garbage"), Presented::Nothing);
        let absolute = b"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        assert_eq!(http_host(absolute), Presented::Mismatch);
    }
}
