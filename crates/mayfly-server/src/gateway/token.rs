//! The gateway's own credential: the sandbox token a preview request
//! presents, and taking it off every request before it is forwarded,
//! wherever it goes (a sandbox or a baseline). Pure functions over headers
//! and the request target.
//!
//! Cookies are read and stripped as bytes, in every `Cookie` header, by the
//! one rule ([`cookie_name`]), so a request cannot hide the token from the
//! stripping (a second header, a non-ASCII neighbour) that the lookup would
//! still find.

use http::header::{HeaderMap, HeaderValue, COOKIE};
use http::Uri;

/// `X-Mayfly-Token: <token>`: the sandbox's gateway token.
pub const TOKEN_HEADER: &str = "x-mayfly-token";
/// The query parameter (and cookie) that carries the token in a browser.
pub const TOKEN_PARAM: &str = "mayfly_token";

/// Where a request presented its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Header,
    /// `?mayfly_token=`: the gateway answers with the cookie (once verified)
    /// and sends a browser to the URL without it.
    Query,
    Cookie,
}

/// The token a request presents, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented {
    pub token: String,
    pub source: Source,
}

/// The token a request presents: `X-Mayfly-Token`, else the
/// `mayfly_token` query parameter, else the `mayfly_token` cookie.
pub fn presented(h: &HeaderMap, uri: &Uri) -> Option<Presented> {
    let found = |token: String, source| Some(Presented { token, source });
    if let Some(v) = h.get(TOKEN_HEADER) {
        // Not ASCII: no token of ours, so it is refused, never skipped.
        let t = String::from_utf8_lossy(v.as_bytes()).trim().to_owned();
        return found(t, Source::Header);
    }
    if let Some(t) = uri.query().and_then(query_token) {
        return found(t, Source::Query);
    }
    cookie_token(h).and_then(|t| found(t, Source::Cookie))
}

/// Whether a query pair `k=v` (or `k`) is the token parameter; the name is
/// compared percent-decoded, as a server upstream would read it.
fn is_token_param(pair: &str) -> bool {
    let name = pair.split('=').next().unwrap_or(pair);
    percent_encoding::percent_decode_str(name).eq(TOKEN_PARAM.bytes())
}

fn query_token(q: &str) -> Option<String> {
    q.split('&').find_map(|pair| {
        let (_, v) = pair.split_once('=')?;
        is_token_param(pair).then(|| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Whether the request target carries the token parameter.
pub fn has_query_token(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(is_token_param))
}

/// The path and query without the token parameter.
pub fn without_token_param(uri: &Uri) -> String {
    let path = uri.path();
    let Some(q) = uri.query() else {
        return path.to_owned();
    };
    let kept: Vec<&str> = q.split('&').filter(|p| !is_token_param(p)).collect();
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// The `name=value` pairs of every `Cookie` header, trimmed, as bytes.
fn cookie_pairs(h: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    h.get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty())
}

/// A cookie pair's name: up to the first `=`, trimmed (a pair without `=`
/// is all name).
fn cookie_name(pair: &[u8]) -> &[u8] {
    pair.split(|b| *b == b'=')
        .next()
        .unwrap_or(pair)
        .trim_ascii()
}

fn cookie_token(h: &HeaderMap) -> Option<String> {
    cookie_pairs(h).find_map(|pair| {
        if cookie_name(pair) != TOKEN_PARAM.as_bytes() {
            return None;
        }
        let v = pair.splitn(2, |b| *b == b'=').nth(1).unwrap_or(b"");
        Some(String::from_utf8_lossy(v.trim_ascii()).into_owned())
    })
}

/// Removes the token cookie from every `Cookie` header and joins the other
/// cookies into one header, as an HTTP/2 client's split cookies must be
/// joined for HTTP/1.1 (RFC 9113, 8.2.3).
pub fn strip_cookies(h: &mut HeaderMap) {
    if !h.contains_key(COOKIE) {
        return;
    }
    let mut kept = Vec::new();
    for pair in cookie_pairs(h).filter(|p| cookie_name(p) != TOKEN_PARAM.as_bytes()) {
        if !kept.is_empty() {
            kept.extend_from_slice(b"; ");
        }
        kept.extend_from_slice(pair);
    }
    h.remove(COOKIE);
    // The bytes all came from valid values; should that ever fail, the
    // cookies go, never the token with them.
    if let Ok(v) = HeaderValue::from_bytes(&kept) {
        if !kept.is_empty() {
            h.insert(COOKIE, v);
        }
    }
}

/// Takes the gateway's token off a request: the header, the cookie; the
/// query parameter is left to [`without_token_param`].
pub fn strip_headers(h: &mut HeaderMap) {
    h.remove(TOKEN_HEADER);
    strip_cookies(h);
}

/// The `Set-Cookie` value for a verified token. Only a token of the
/// engine's alphabet (hex) is ever written into a header, so nothing a
/// client sent can add cookie attributes.
pub fn set_cookie(token: &str) -> Option<HeaderValue> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    HeaderValue::from_str(&format!(
        "{TOKEN_PARAM}={token}; Path=/; HttpOnly; SameSite=Lax"
    ))
    .ok()
}

/// A `Location` for `path_and_query` on this same host. A path starting
/// with `//` (or `/\`) would read as another host (`//evil.example/`); the
/// `/.` put before it keeps it a path here.
pub fn same_host_location(path_and_query: &str) -> Option<HeaderValue> {
    let loc = if path_and_query.starts_with("//") || path_and_query.starts_with("/\\") {
        format!("/.{path_and_query}")
    } else if path_and_query.starts_with('/') {
        path_and_query.to_owned()
    } else {
        format!("/{path_and_query}")
    };
    HeaderValue::from_str(&loc).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    fn found(t: &str, source: Source) -> Option<Presented> {
        Some(Presented {
            token: t.into(),
            source,
        })
    }

    #[test]
    fn tokens_come_from_the_header_then_the_query_then_a_cookie() {
        let uri: Uri = "/a?x=1&mayfly_token=t%31&y=2".parse().unwrap();
        assert_eq!(
            presented(&HeaderMap::new(), &uri),
            found("t1", Source::Query)
        );
        let h = headers(&[("x-mayfly-token", b" t3 "), ("cookie", b"mayfly_token=t2")]);
        assert_eq!(presented(&h, &uri), found("t3", Source::Header));
        let h = headers(&[
            ("cookie", b"a=1"),
            ("cookie", b"b=\xff; mayfly_token = t2 "),
        ]);
        assert_eq!(
            presented(&h, &Uri::from_static("/")),
            found("t2", Source::Cookie),
            "in any Cookie header, beside non-ASCII bytes"
        );
        assert_eq!(presented(&HeaderMap::new(), &Uri::from_static("/")), None);
    }

    #[test]
    fn the_query_parameter_is_stripped_whatever_its_spelling() {
        let uri: Uri = "/a?x=1&mayfly_token=t&y=2&mayfly%5Ftoken=u&mayfly_token"
            .parse()
            .unwrap();
        assert!(has_query_token(&uri));
        assert_eq!(without_token_param(&uri), "/a?x=1&y=2");
        let uri: Uri = "/a?mayfly_token=t".parse().unwrap();
        assert_eq!(without_token_param(&uri), "/a");
        let uri: Uri = "/a?mayfly_tokens=1".parse().unwrap();
        assert!(!has_query_token(&uri));
        assert_eq!(without_token_param(&uri), "/a?mayfly_tokens=1");
    }

    #[test]
    fn the_token_cookie_is_stripped_from_every_cookie_header_and_the_rest_kept() {
        let mut h = headers(&[
            ("cookie", b"a=1; mayfly_token=t1"),
            ("cookie", b"b=caf\xc3\xa9;mayfly_token=t2;  ;c"),
            ("cookie", b" mayfly_token =t3"),
            ("x-mayfly-token", b"t4"),
        ]);
        strip_headers(&mut h);
        let left: Vec<&[u8]> = h.get_all(COOKIE).iter().map(|v| v.as_bytes()).collect();
        assert_eq!(left, vec![&b"a=1; b=caf\xc3\xa9; c"[..]]);
        assert!(!h.contains_key(TOKEN_HEADER));

        let mut h = headers(&[
            ("cookie", b"mayfly_token=t1"),
            ("cookie", b"mayfly_token=t2"),
        ]);
        strip_cookies(&mut h);
        assert!(!h.contains_key(COOKIE), "nothing left: no Cookie header");
        let mut h = headers(&[("cookie", b"mayfly_tokens=1")]);
        strip_cookies(&mut h);
        assert_eq!(h[COOKIE], "mayfly_tokens=1", "only the exact name goes");
    }

    #[test]
    fn only_a_token_of_hex_digits_becomes_a_cookie() {
        assert_eq!(
            set_cookie("ab12").unwrap(),
            "mayfly_token=ab12; Path=/; HttpOnly; SameSite=Lax"
        );
        for bad in ["", "x; Domain=localhost", "ab\r\n", "ab cd", "é"] {
            assert_eq!(set_cookie(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn redirect_locations_stay_on_this_host() {
        let loc = |pq: &str| same_host_location(pq).unwrap();
        assert_eq!(loc("/a?x=1"), "/a?x=1");
        assert_eq!(loc("//evil.example/x"), "/.//evil.example/x");
        assert_eq!(loc("/\\evil.example/x"), "/./\\evil.example/x");
        assert_eq!(loc("*"), "/*");
    }
}
