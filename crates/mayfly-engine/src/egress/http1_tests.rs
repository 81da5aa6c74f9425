use super::*;

/// Runs a whole client stream through the framing, as the proxy does:
/// every request's name, and the bytes forwarded before a refusal or the
/// end of the stream (then the step that stopped it).
fn run(stream: &[u8]) -> (Vec<String>, usize, Step) {
    let mut r = Requests::default();
    let (mut names, mut at) = (Vec::new(), 0);
    loop {
        match r.next(&stream[at..]) {
            Step::Forward(n) => at += n,
            Step::Request { len, name } => {
                names.push(name);
                at += len;
            }
            other => return (names, at, other),
        }
    }
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_pipelined_request_is_framed_and_named() {
    let stream = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n\
        POST /up HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 37\r\n\r\n\
        GET / HTTP/1.1\r\nHost: inside.body\r\n\r\n\
        GET /x HTTP/1.1\r\nHost: Other.Test:80\r\n\r\n";
    let (seen, at, last) = run(stream);
    // The body's look-alike request is data, not a head.
    assert_eq!(seen, names(&["allowed.test", "allowed.test", "other.test"]));
    assert_eq!((at, last), (stream.len(), Step::NeedMore));
}

#[test]
fn chunked_bodies_are_followed_to_their_end() {
    let stream = b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
        5;ext=1\r\nhello\r\n1b\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\nTrailer: t\r\n\r\n\
        GET / HTTP/1.1\r\nHost: b.test\r\n\r\n";
    let (seen, at, last) = run(stream);
    assert_eq!(seen, names(&["a.test", "b.test"]));
    assert_eq!((at, last), (stream.len(), Step::NeedMore));
    // Split anywhere, the same.
    let mut r = Requests::default();
    let (mut pending, mut got) = (Vec::new(), Vec::new());
    for b in stream {
        pending.push(*b);
        loop {
            match r.next(&pending) {
                Step::Forward(n) => drop(pending.drain(..n)),
                Step::Request { len, name } => {
                    got.push(name);
                    pending.drain(..len);
                }
                Step::NeedMore => break,
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(got, seen);
}

#[test]
fn an_absolute_form_target_must_name_the_host() {
    let (_, at, last) = run(b"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    assert_eq!((at, last), (0, Step::Refuse(Refused::NameMismatch)));
    let (seen, _, _) =
        run(b"GET HTTP://Allowed.test:80/p?q HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    assert_eq!(seen, names(&["allowed.test"]));
    let (seen, _, _) = run(b"GET http://allowed.test/ HTTP/1.0\r\n\r\n");
    assert_eq!(seen, names(&["allowed.test"]));
    for bad in [
        &b"GET http://allowed.test@other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"[..],
        b"GET other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        b"CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n",
    ] {
        assert!(
            matches!(run(bad).2, Step::Refuse(Refused::Bad(_))),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        run(b"GET / HTTP/1.0\r\n\r\n").2,
        Step::Refuse(Refused::NoName)
    );
}

#[test]
fn ambiguous_body_framing_is_refused() {
    for bad in [
        &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloX\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n",
        b"\x16\x03\x01\x02\x00",
    ] {
        assert!(
            matches!(run(bad).2, Step::Refuse(Refused::Bad(_))),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn a_head_that_never_ends_is_refused_at_the_limit() {
    let mut huge = b"GET / HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
    huge.resize(MAX_HEAD - 1, b'x');
    assert_eq!(run(&huge).2, Step::NeedMore);
    huge.push(b'x');
    assert!(matches!(run(&huge).2, Step::Refuse(Refused::Bad(_))));
}

#[test]
fn a_websocket_upgrade_on_the_first_request_waits_for_its_response() {
    let up =
        b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let mut r = Requests::default();
    assert!(matches!(r.next(up), Step::Request { .. }));
    let frame = b"\x81\x05hello";
    assert_eq!(r.next(frame), Step::AwaitUpgrade);
    r.upgraded(true);
    assert_eq!(r.next(frame), Step::Forward(frame.len()));
    // Refused by the server: the next bytes are a request again.
    let mut r = Requests::default();
    assert!(matches!(r.next(up), Step::Request { .. }));
    r.upgraded(false);
    let next = b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n";
    assert!(matches!(r.next(next), Step::Request { name, .. } if name == "other.test"));
    // Later upgrades, and upgrades to anything else, are refused.
    assert!(matches!(r.next(up), Step::Refuse(Refused::Bad(_))));
    let h2c = b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
    assert!(matches!(run(h2c).2, Step::Refuse(Refused::Bad(_))));
}

#[test]
fn response_heads_give_their_status() {
    assert_eq!(
        response_head(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nxx"),
        Ok(Some((56, 101)))
    );
    assert_eq!(response_head(b"HTTP/1.1 200 O"), Ok(None));
    assert!(response_head(b"SSH-2.0\r\n\r\n").is_err());
}
