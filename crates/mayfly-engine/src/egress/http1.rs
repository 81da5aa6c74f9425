//! HTTP/1 request framing on port 80, pure: where each request head of a
//! connection starts, so that every request is checked, not only the first.
//!
//! A keep-alive or pipelined connection carries many requests, and an origin
//! that serves many names (a CDN, a shared host) routes each by its own
//! `Host`. So the proxy follows the client's byte stream as a server would:
//! a head (its name checked), then its body (by `Content-Length`, or
//! chunked), then the next head. Whatever a server could read two ways is
//! refused rather than guessed: `Transfer-Encoding` with `Content-Length`,
//! several lengths, a coding that does not end in `chunked`, a target whose
//! authority is not the `Host`, `CONNECT`, a bare LF in chunk framing.
//!
//! An upgrade ends the framing: a websocket upgrade asked on a connection's
//! first request is followed by opaque bytes once the response is `101`
//! (the proxy watches for that status, [`response_head`]); a refused one
//! goes on as HTTP. Other upgrades (`h2c` would carry requests for any
//! name) and upgrades on later requests (whose response the proxy would
//! have to find among earlier ones) are refused.

/// The largest request head (or trailer section) read: nginx's default
/// limit is 32 KiB.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields a head may have.
const MAX_FIELDS: usize = 128;
/// The longest chunk-size line.
const MAX_CHUNK_LINE: usize = 4096;

/// Why a request stream is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// A request names no host (no `Host`, no absolute-form target).
    NoName,
    /// A request names two hosts: its target's authority and its `Host`.
    NameMismatch,
    /// A request the proxy cannot frame safely; the reason, for the log.
    Bad(&'static str),
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A whole request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Its length in bytes.
    pub len: usize,
    /// The host it names (lowercase, no port, no trailing dot).
    pub name: String,
    pub body: Body,
    /// It asks for a websocket upgrade.
    pub upgrade: bool,
}

/// Reads the request head at the start of `buf`: `None` while incomplete.
pub fn request_head(buf: &[u8]) -> Result<Option<Head>, Refused> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(Refused::Bad("request head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
            return Err(Refused::Bad("request head too large"))
        }
        Ok(httparse::Status::Complete(len)) => len,
        Err(httparse::Error::TooManyHeaders) => return Err(Refused::Bad("too many header fields")),
        Err(_) => return Err(Refused::Bad("not an HTTP/1 request")),
    };
    let method = req.method.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(Refused::Bad("CONNECT"));
    }
    let values = |name: &str| -> Vec<&[u8]> {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    };
    let name = name_of(req.path.unwrap_or_default(), &values("host"))?;
    let body = body_of(
        req.version.unwrap_or(1),
        &values("transfer-encoding"),
        &values("content-length"),
    )?;
    let upgrade = match values("upgrade").as_slice() {
        [] => false,
        [v] if is_websocket(v) => true,
        _ => return Err(Refused::Bad("an upgrade other than websocket")),
    };
    Ok(Some(Head {
        len,
        name,
        body,
        upgrade,
    }))
}

/// The one host a request names: its `Host`, and its target's authority
/// when the target is in absolute form (which a server must prefer); two
/// that differ are refused.
fn name_of(target: &str, hosts: &[&[u8]]) -> Result<String, Refused> {
    let host = match hosts {
        [] => None,
        [h] => Some(std::str::from_utf8(h).map_err(|_| Refused::Bad("a Host that is not text"))?),
        _ => return Err(Refused::Bad("several Host fields")),
    };
    let authority = if target.starts_with('/') || target == "*" {
        None
    } else {
        let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
        let rest = if lower.starts_with("http://") {
            &target[7..]
        } else if lower.starts_with("https://") {
            &target[8..]
        } else {
            return Err(Refused::Bad("a request target of no known form"));
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.contains('@') {
            return Err(Refused::Bad("user information in the request target"));
        }
        Some(authority)
    };
    match (authority.map(host_name), host.map(host_name)) {
        (Some(a), Some(h)) if a != h => Err(Refused::NameMismatch),
        (Some(n), _) | (None, Some(n)) if !n.is_empty() => Ok(n),
        _ => Err(Refused::NoName),
    }
}

/// `host[:port]` (or `[v6]:port`, which names no allowed name) as a name.
pub fn host_name(v: &str) -> String {
    let v = v.trim();
    let host = match v.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => v,
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn body_of(minor: u8, te: &[&[u8]], cl: &[&[u8]]) -> Result<Body, Refused> {
    if !te.is_empty() {
        if minor == 0 {
            return Err(Refused::Bad("Transfer-Encoding in HTTP/1.0"));
        }
        if !cl.is_empty() {
            return Err(Refused::Bad("both Transfer-Encoding and Content-Length"));
        }
        let mut codings = Vec::new();
        for v in te {
            let v =
                std::str::from_utf8(v).map_err(|_| Refused::Bad("a coding that is not text"))?;
            codings.extend(v.split(',').map(|c| c.trim().to_ascii_lowercase()));
        }
        let chunked = codings.iter().filter(|c| *c == "chunked").count();
        return match codings.last() {
            Some(last) if last == "chunked" && chunked == 1 => Ok(Body::Chunked),
            _ => Err(Refused::Bad(
                "a transfer coding that does not end in chunked",
            )),
        };
    }
    match cl {
        [] => Ok(Body::None),
        [v] if !v.is_empty() && v.len() <= 18 && v.iter().all(u8::is_ascii_digit) => {
            let n: u64 = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(Refused::Bad("a malformed Content-Length"))?;
            Ok(if n == 0 { Body::None } else { Body::Length(n) })
        }
        [_] => Err(Refused::Bad("a malformed Content-Length")),
        _ => Err(Refused::Bad("several Content-Length fields")),
    }
}

fn is_websocket(v: &[u8]) -> bool {
    v.trim_ascii().eq_ignore_ascii_case(b"websocket")
}

/// The status of the response head at the start of `buf`, and its length:
/// `None` while incomplete.
pub fn response_head(buf: &[u8]) -> Result<Option<(usize, u16)>, Refused> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut fields);
    match resp.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            Err(Refused::Bad("response head too large"))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(len)) => Ok(Some((len, resp.code.unwrap_or(0)))),
        Err(_) => Err(Refused::Bad("not an HTTP/1 response")),
    }
}

/// Where the client's byte stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    /// Trailer bytes read so far.
    Trailers(usize),
    /// The upgrade request has gone out whole; its response decides.
    AwaitUpgrade,
    /// Switched protocols: opaque bytes.
    Opaque,
}

/// What to do with the client's pending bytes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Forward this many bytes from the front of what is pending.
    Forward(usize),
    /// A request head for `name` of `len` bytes is at the front: forward
    /// it if the name is allowed.
    Request {
        len: usize,
        name: String,
    },
    /// Read more from the client first.
    NeedMore,
    /// Wait for the response to the upgrade request, then [`Requests::upgraded`].
    AwaitUpgrade,
    Refuse(Refused),
}

/// The framing of one connection's requests.
#[derive(Debug)]
pub struct Requests {
    state: State,
    first: bool,
    upgrading: bool,
}

impl Default for Requests {
    fn default() -> Requests {
        Requests {
            state: State::Head,
            first: true,
            upgrading: false,
        }
    }
}

impl Requests {
    /// The next step for `pending`, the client's bytes not yet forwarded.
    /// Each `Forward` or `Request` consumes its bytes: the caller drops
    /// them from `pending` before asking again.
    pub fn next(&mut self, pending: &[u8]) -> Step {
        match self.state {
            State::Head => match request_head(pending) {
                Err(r) => Step::Refuse(r),
                Ok(None) => Step::NeedMore,
                Ok(Some(h)) if h.upgrade && !self.first => {
                    Step::Refuse(Refused::Bad("an upgrade after the first request"))
                }
                Ok(Some(h)) => {
                    self.first = false;
                    self.upgrading = h.upgrade;
                    self.state = match h.body {
                        Body::None => self.after_request(),
                        Body::Length(n) => State::Body(n),
                        Body::Chunked => State::ChunkSize,
                    };
                    Step::Request {
                        len: h.len,
                        name: h.name,
                    }
                }
            },
            State::Body(n) | State::ChunkData(n) => {
                if pending.is_empty() {
                    return Step::NeedMore;
                }
                let k = n.min(pending.len() as u64);
                let left = n - k;
                self.state = match (self.state, left) {
                    (State::Body(_), 0) => self.after_request(),
                    (State::Body(_), _) => State::Body(left),
                    (_, 0) => State::ChunkEnd,
                    _ => State::ChunkData(left),
                };
                Step::Forward(k as usize)
            }
            State::ChunkSize => match line(pending, MAX_CHUNK_LINE) {
                Err(r) => Step::Refuse(r),
                Ok(None) => Step::NeedMore,
                Ok(Some(len)) => match chunk_size(&pending[..len - 2]) {
                    None => Step::Refuse(Refused::Bad("a malformed chunk size")),
                    Some(0) => {
                        self.state = State::Trailers(0);
                        Step::Forward(len)
                    }
                    Some(n) => {
                        self.state = State::ChunkData(n);
                        Step::Forward(len)
                    }
                },
            },
            State::ChunkEnd => match pending {
                [] | [b'\r'] => Step::NeedMore,
                [b'\r', b'\n', ..] => {
                    self.state = State::ChunkSize;
                    Step::Forward(2)
                }
                _ => Step::Refuse(Refused::Bad("chunk data longer than its size")),
            },
            State::Trailers(used) => match line(pending, MAX_HEAD - used) {
                Err(r) => Step::Refuse(r),
                Ok(None) => Step::NeedMore,
                Ok(Some(2)) => {
                    self.state = self.after_request();
                    Step::Forward(2)
                }
                Ok(Some(len)) => {
                    self.state = State::Trailers(used + len);
                    Step::Forward(len)
                }
            },
            State::AwaitUpgrade => Step::AwaitUpgrade,
            State::Opaque if pending.is_empty() => Step::NeedMore,
            State::Opaque => Step::Forward(pending.len()),
        }
    }

    /// The response to the upgrade request came: `switched` when it was
    /// `101 Switching Protocols`.
    pub fn upgraded(&mut self, switched: bool) {
        if self.state == State::AwaitUpgrade {
            self.upgrading = false;
            self.state = if switched { State::Opaque } else { State::Head };
        }
    }

    fn after_request(&self) -> State {
        if self.upgrading {
            State::AwaitUpgrade
        } else {
            State::Head
        }
    }
}

/// The length of the CRLF-ended line at the start of `buf`, CRLF included.
fn line(buf: &[u8], max: usize) -> Result<Option<usize>, Refused> {
    match buf.iter().position(|b| *b == b'\n') {
        Some(i) if i == 0 || buf[i - 1] != b'\r' => Err(Refused::Bad("a bare LF in chunk framing")),
        Some(i) if buf[..i - 1].contains(&b'\r') => Err(Refused::Bad("a bare CR in chunk framing")),
        Some(i) if i < max => Ok(Some(i + 1)),
        None if buf.len() < max => Ok(None),
        _ => Err(Refused::Bad("a chunk-size or trailer line too long")),
    }
}

/// `1*HEXDIG [ BWS ";" chunk-ext ]`, the size alone.
fn chunk_size(l: &[u8]) -> Option<u64> {
    let digits = l.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return None;
    }
    let rest = l[digits..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(&l[..digits]).ok()?, 16).ok()
}

#[cfg(test)]
#[path = "http1_tests.rs"]
mod tests;
