//! Bad input over the real unix socket, in raw HTTP/1.1: every malformed or
//! out-of-range request gets a 4xx with a JSON `{code, message}`, never a
//! 5xx, and the daemon keeps serving. Plus OpenAPI, idempotent destroy, TTL.

mod common;

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{assert_no_leaks, Daemon};
use mayfly_types::{CreateRequest, SandboxState};

/// One HTTP answer.
#[derive(Debug)]
struct Resp {
    status: u16,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: the body is not JSON ({e}): {:?}",
                self.status,
                common::text(&self.body)
            )
        })
    }
}

/// Sends one request on a fresh connection (`Connection: close`) and reads
/// the whole answer.
fn http(socket: &Path, method: &str, path: &str, ctype: Option<&str>, body: &[u8]) -> Resp {
    let mut s = UnixStream::connect(socket).expect("connecting to the daemon's socket");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(ct) = ctype {
        req.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("sending the head");
    // A server may answer (and close) before reading a body it rejects;
    // its answer is still there to read.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        assert!(
            !raw.is_empty(),
            "reading the answer to {method} {path}: {e}"
        );
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {:?}", common::text(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Resp { status, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..nl]).expect("hex").trim(), 16)
            .expect("a chunk size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[nl + 2..nl + 2 + size]);
        b = &b[nl + 4 + size..];
    }
}

const JSON: Option<&str> = Some("application/json");
const UNKNOWN: &str = "mf-aaaaaaaaaaaa";
/// Any 4xx will do.
const ANY: u16 = 0;

/// One bad request and the status it must get (or [`ANY`] 4xx).
struct Case {
    method: &'static str,
    path: String,
    ctype: Option<&'static str>,
    body: String,
    want: u16,
}

fn case(
    method: &'static str,
    path: &str,
    ctype: Option<&'static str>,
    body: &str,
    want: u16,
) -> Case {
    Case {
        method,
        path: path.to_owned(),
        ctype,
        body: body.to_owned(),
        want,
    }
}

/// Bodies of `POST /v1/sandboxes` that must be refused.
const BAD_CREATES: &[(&str, u16)] = &[
    ("{not json", 400),
    ("", ANY),
    ("[]", 400),
    ("null", 400),
    (r#"{"tmpl":"host"}"#, 400),
    (r#"{"limits":{"swap":1}}"#, 400),
    (r#"{"limits":{"memory_bytes":18446744073709551615}}"#, 400),
    (r#"{"limits":{"memory_bytes":18446744073709551616}}"#, 400),
    (r#"{"limits":{"memory_bytes":1}}"#, 400),
    (r#"{"limits":{"pids":-1}}"#, 400),
    (r#"{"limits":{"pids":0}}"#, 400),
    (r#"{"limits":{"cpu_millis":4294967296}}"#, 400),
    (r#"{"limits":{"nofile":1e30}}"#, 400),
    (r#"{"ttl_secs":0}"#, 400),
    (r#"{"ttl_secs":99999999999}"#, 400),
    (r#"{"ttl_secs":-5}"#, 400),
    (r#"{"ttl_secs":"10"}"#, 400),
    (r#"{"template":"docker:ubuntu"}"#, 400),
    (r#"{"template":"dir:../etc"}"#, 400),
    (r#"{"template":"dir:/etc/passwd"}"#, 400),
    (r#"{"env":{"A=B":"x"}}"#, 400),
];

/// Bodies of `POST …/exec` on a live sandbox that must be refused.
const BAD_EXECS: &[(&str, u16)] = &[
    (r#"{"argv":[]}"#, 400),
    (r#"{"argv":[""]}"#, 400),
    (r#"{"argv":"true"}"#, 400),
    (r#"{"argv":["tr\u0000ue"]}"#, 400),
    (r#"{"argv":["true"],"shell":true}"#, 400),
    (r#"{"argv":["true"],"uid":70000}"#, 400),
    (r#"{"argv":["true"],"gid":-1}"#, 400),
    (r#"{"argv":["true"],"timeout_ms":0}"#, 400),
    (
        r#"{"argv":["true"],"output_limit":18446744073709551615}"#,
        400,
    ),
    (r#"{"argv":["true"],"cwd":"relative"}"#, 400),
    (r#"{"argv":["true"],"stdin":"@@@"}"#, 400),
    (r#"{"argv":["true"],"env":{"":"x"}}"#, 400),
];

/// Bad ids, unknown ids, and bad input to the other routes.
fn other_cases(id: &str) -> Vec<Case> {
    let sb = format!("/v1/sandboxes/{id}");
    let gone = format!("/v1/sandboxes/{UNKNOWN}");
    let labels: Vec<String> = (0..100).map(|i| format!("\"k{i}\":\"v\"")).collect();
    let labels = format!("{{\"labels\":{{{}}}}}", labels.join(","));
    let tar = Some("application/x-tar");
    let octets = Some("application/octet-stream");
    vec![
        case("POST", "/v1/sandboxes", JSON, &labels, 400),
        case("POST", "/v1/sandboxes", Some("text/plain"), "{}", ANY),
        case("PATCH", "/v1/sandboxes", JSON, "{}", ANY),
        case("GET", "/v1/nope", None, "", 404),
        case("GET", "/v1/sandboxes/zz", None, "", 400),
        case("GET", "/v1/sandboxes/mf-..%2F..%2Fx", None, "", 400),
        case("DELETE", "/v1/sandboxes/mf-../../x", None, "", ANY),
        case("DELETE", "/v1/sandboxes/MF-AAAAAAAAAAAA", None, "", 400),
        case("GET", &gone, None, "", 404),
        case("DELETE", &gone, None, "", 404),
        case(
            "POST",
            &format!("{gone}/exec"),
            JSON,
            r#"{"argv":["true"]}"#,
            404,
        ),
        case(
            "GET",
            &format!("{gone}/files?path=/etc/passwd"),
            None,
            "",
            404,
        ),
        case(
            "POST",
            &format!("{sb}/processes"),
            JSON,
            r#"{"argv":[]}"#,
            400,
        ),
        case("GET", &format!("{sb}/processes/999/output"), None, "", 404),
        case(
            "POST",
            &format!("{sb}/processes/999/wait?timeout_ms=x"),
            None,
            "",
            400,
        ),
        case("POST", &format!("{sb}/processes/x/kill"), JSON, "{}", 400),
        case("GET", &format!("{sb}/files"), None, "", 400),
        case("GET", &format!("{sb}/files?path="), None, "", 400),
        case(
            "GET",
            &format!("{sb}/files?path=/etc/pass%00wd"),
            None,
            "",
            400,
        ),
        case(
            "GET",
            &format!("{sb}/files?path=/workspace/nope"),
            None,
            "",
            404,
        ),
        case("GET", &format!("{sb}/files/list?path=/proc"), None, "", ANY),
        case(
            "PUT",
            &format!("{sb}/files?path=/workspace/x&mode=zzz"),
            octets,
            "x",
            400,
        ),
        case(
            "PUT",
            &format!("{sb}/archive?path=/workspace"),
            tar,
            "not a tar",
            ANY,
        ),
        case(
            "POST",
            &format!("{sb}/files/mkdir"),
            JSON,
            r#"{"path":"/x","bogus":1}"#,
            400,
        ),
        case("GET", "/v1/events?since=abc", None, "", 400),
        case("GET", "/v1/events?limit=-1", None, "", 400),
    ]
}

#[tokio::test]
async fn bad_input_always_gets_a_json_4xx_and_the_daemon_keeps_serving() {
    let mut d = Daemon::start().await;
    let sb = d.create().await;
    let exec = format!("/v1/sandboxes/{}/exec", sb.id);
    let mut cases: Vec<Case> = BAD_CREATES
        .iter()
        .map(|(body, want)| case("POST", "/v1/sandboxes", JSON, body, *want))
        .chain(
            BAD_EXECS
                .iter()
                .map(|(body, want)| case("POST", &exec, JSON, body, *want)),
        )
        .collect();
    cases.extend(other_cases(sb.id.as_str()));
    let mut failures = Vec::new();
    for c in &cases {
        let r = http(&d.socket, c.method, &c.path, c.ctype, c.body.as_bytes());
        let json: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
        let field = |k: &str| json.as_ref().and_then(|j| j[k].as_str().map(str::to_owned));
        let ok = (400..500).contains(&r.status)
            && (c.want == ANY || c.want == r.status)
            && field("code").is_some()
            && field("message").is_some_and(|m| !m.is_empty());
        if !ok {
            let body: String = c.body.chars().take(80).collect();
            let got = common::text(&r.body);
            failures.push(format!(
                "{} {} {body} -> {} {got}",
                c.method, c.path, r.status
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad requests did not get the expected JSON 4xx:\n  {}",
        failures.len(),
        cases.len(),
        failures.join("\n  ")
    );
    d.assert_healthy().await;
    assert_eq!(d.sh(&sb.id, "echo alive").await, "alive\n");
    let live = d.client.list(false).await.expect("list");
    assert_eq!(live.len(), 1, "a refused create made a sandbox: {live:?}");
    let log = d.log();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
    assert!(
        !log.contains("internal error"),
        "the daemon logged an internal error:\n{log}"
    );
}

#[tokio::test]
async fn a_well_formed_unknown_id_is_not_found() {
    let d = Daemon::start().await;
    let r = http(
        &d.socket,
        "GET",
        &format!("/v1/sandboxes/{UNKNOWN}"),
        None,
        b"",
    );
    assert_eq!(r.status, 404);
    let j = r.json();
    assert_eq!(j["code"], "not_found");
    assert!(
        j["message"].as_str().is_some_and(|m| m.contains(UNKNOWN)),
        "{j}"
    );
}

#[tokio::test]
async fn openapi_document_lists_the_sandbox_routes() {
    let d = Daemon::start().await;
    let r = http(&d.socket, "GET", "/openapi.json", None, b"");
    assert_eq!(r.status, 200);
    let doc = r.json();
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with('3')),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().expect("`paths` is an object");
    for p in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/exec",
    ] {
        assert!(
            paths.contains_key(p),
            "OpenAPI lacks {p}: {:?}",
            paths.keys().collect::<Vec<_>>()
        );
    }
    assert!(paths["/v1/sandboxes"].get("post").is_some());
}

#[tokio::test]
async fn destroy_is_idempotent() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let path = format!("/v1/sandboxes/{}", sb.id);
    // Destroy may answer as soon as the sandbox is killed (`stopping`) and
    // finish the cleanup in the background; repeating it is never an error.
    let ended = |r: &Resp| {
        assert_eq!(r.status, 200, "{}", common::text(&r.body));
        let j = r.json();
        assert!(j["state"] == "stopping" || j["state"] == "destroyed", "{j}");
        assert_eq!(j["reason"], "user", "{j}");
    };
    ended(&http(&d.socket, "DELETE", &path, None, b""));
    ended(&http(&d.socket, "DELETE", &path, None, b""));
    let t = Instant::now();
    loop {
        let info = d.client.get(&sb.id).await.expect("get");
        if info.state == SandboxState::Destroyed {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "still not destroyed after 15 s: {info:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let last = http(&d.socket, "DELETE", &path, None, b"");
    assert_eq!(last.status, 200, "{}", common::text(&last.body));
    assert_eq!(
        (&last.json()["state"], &last.json()["reason"]),
        (&"destroyed".into(), &"user".into())
    );
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
    // A command in a destroyed sandbox is refused with a 4xx, not a 5xx.
    let r = http(
        &d.socket,
        "POST",
        &format!("{path}/exec"),
        JSON,
        br#"{"argv":["true"]}"#,
    );
    assert!(
        (400..500).contains(&r.status),
        "{} {}",
        r.status,
        common::text(&r.body)
    );
}

#[tokio::test]
async fn a_sandbox_is_destroyed_when_its_ttl_passes() {
    let d = Daemon::start().await;
    let t = Instant::now();
    let sb = d
        .create_with(&CreateRequest {
            ttl_secs: Some(1),
            ..CreateRequest::default()
        })
        .await;
    assert!(sb.expires_at > sb.created_at && sb.expires_at - sb.created_at <= 1000);
    // The reaper looks every 200 ms; a busy host may take a while longer.
    let info = loop {
        let info = d.client.get(&sb.id).await.expect("get");
        if info.state == SandboxState::Destroyed {
            break info;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "not destroyed 15 s after a 1 s TTL: {info:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(info.reason.as_deref(), Some("ttl"));
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}
