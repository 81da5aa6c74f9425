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
            panic!("status {}: the body is not JSON ({e}): {:?}", self.status, common::text(&self.body))
        })
    }
}

/// Sends one request on a fresh connection (`Connection: close`) and reads
/// the whole answer.
fn http(socket: &Path, method: &str, path: &str, ctype: Option<&str>, body: &[u8]) -> Resp {
    let mut s = UnixStream::connect(socket).expect("connecting to the daemon's socket");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(ct) = ctype {
        req.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("sending the head");
    s.write_all(body).expect("sending the body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reading the answer");
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
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Resp { status, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n").expect("a chunk size line");
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

#[tokio::test]
async fn bad_input_always_gets_a_json_4xx_and_the_daemon_keeps_serving() {
    let mut d = Daemon::start().await;
    let sb = d.create().await;
    let id = sb.id.as_str();
    let exec = format!("/v1/sandboxes/{id}/exec");
    let procs = format!("/v1/sandboxes/{id}/processes");
    let files = format!("/v1/sandboxes/{id}/files");
    let big = format!("{{\"labels\":{{{}}}}}", (0..100).map(|i| format!("\"k{i}\":\"v\"")).collect::<Vec<_>>().join(","));
    // (method, path, content type, body, the exact status when it matters)
    let cases: Vec<(&str, String, Option<&str>, String, Option<u16>)> = vec![
        ("POST", "/v1/sandboxes".into(), JSON, "{not json".into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, "".into(), None),
        ("POST", "/v1/sandboxes".into(), JSON, "[]".into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, "null".into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"tmpl":"host"}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"swap":1}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"memory_bytes":18446744073709551615}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"memory_bytes":18446744073709551616}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"memory_bytes":1}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"pids":-1}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"pids":0}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"cpu_millis":4294967296}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"limits":{"nofile":1e30}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"ttl_secs":0}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"ttl_secs":99999999999}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"ttl_secs":-5}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"ttl_secs":"10"}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"template":"docker:ubuntu"}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"template":"dir:../etc"}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"template":"dir:/etc/passwd"}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, r#"{"env":{"A=B":"x"}}"#.into(), Some(400)),
        ("POST", "/v1/sandboxes".into(), JSON, big, Some(400)),
        ("POST", "/v1/sandboxes".into(), Some("text/plain"), "{}".into(), None),
        ("PATCH", "/v1/sandboxes".into(), JSON, "{}".into(), None),
        ("GET", "/v1/nope".into(), None, "".into(), Some(404)),
        ("GET", "/v1/sandboxes/zz".into(), None, "".into(), Some(400)),
        ("GET", "/v1/sandboxes/mf-..%2F..%2Fx".into(), None, "".into(), Some(400)),
        ("DELETE", "/v1/sandboxes/mf-../../x".into(), None, "".into(), None),
        ("DELETE", "/v1/sandboxes/MF-AAAAAAAAAAAA".into(), None, "".into(), Some(400)),
        ("GET", format!("/v1/sandboxes/{UNKNOWN}"), None, "".into(), Some(404)),
        ("DELETE", format!("/v1/sandboxes/{UNKNOWN}"), None, "".into(), Some(404)),
        ("POST", format!("/v1/sandboxes/{UNKNOWN}/exec"), JSON, r#"{"argv":["true"]}"#.into(), Some(404)),
        ("GET", format!("/v1/sandboxes/{UNKNOWN}/files?path=/etc/passwd"), None, "".into(), Some(404)),
        ("POST", exec.clone(), JSON, r#"{"argv":[]}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":[""]}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":"true"}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["tr\u0000ue"]}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"shell":true}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"uid":70000}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"gid":-1}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"timeout_ms":0}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"output_limit":18446744073709551615}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"cwd":"relative"}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"stdin":"@@@"}"#.into(), Some(400)),
        ("POST", exec.clone(), JSON, r#"{"argv":["true"],"env":{"":"x"}}"#.into(), Some(400)),
        ("POST", procs.clone(), JSON, r#"{"argv":[]}"#.into(), Some(400)),
        ("GET", format!("{procs}/999/output"), None, "".into(), Some(404)),
        ("POST", format!("{procs}/999/wait?timeout_ms=abc"), None, "".into(), Some(400)),
        ("POST", format!("{procs}/notanumber/kill"), JSON, "{}".into(), Some(400)),
        ("GET", files.clone(), None, "".into(), Some(400)),
        ("GET", format!("{files}?path="), None, "".into(), Some(400)),
        ("GET", format!("{files}?path=/etc/pass%00wd"), None, "".into(), Some(400)),
        ("GET", format!("{files}?path=/workspace/nope"), None, "".into(), Some(404)),
        ("GET", format!("{files}/list?path=/proc"), None, "".into(), None),
        ("PUT", format!("{files}?path=/workspace/x&mode=zzz"), Some("application/octet-stream"), "x".into(), Some(400)),
        ("PUT", format!("/v1/sandboxes/{id}/archive?path=/workspace"), Some("application/x-tar"), "not a tar".into(), None),
        ("POST", format!("{files}/mkdir"), JSON, r#"{"path":"/workspace/x","bogus":1}"#.into(), Some(400)),
        ("GET", "/v1/events?since=abc".into(), None, "".into(), Some(400)),
        ("GET", "/v1/events?limit=-1".into(), None, "".into(), Some(400)),
    ];
    let mut failures = Vec::new();
    for (method, path, ctype, body, want) in &cases {
        let r = http(&d.socket, method, path, *ctype, body.as_bytes());
        let what = format!("{method} {path} {}", body.chars().take(80).collect::<String>());
        let json: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
        let code = json.as_ref().and_then(|j| j["code"].as_str().map(str::to_owned));
        let message = json.as_ref().and_then(|j| j["message"].as_str().map(str::to_owned));
        let ok = (400..500).contains(&r.status)
            && want.is_none_or(|w| w == r.status)
            && code.is_some()
            && message.is_some_and(|m| !m.is_empty());
        if !ok {
            failures.push(format!("{what} -> {} {}", r.status, common::text(&r.body)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad requests were not answered with the expected JSON 4xx:\n  {}",
        failures.len(),
        cases.len(),
        failures.join("\n  ")
    );
    d.assert_healthy().await;
    assert_eq!(d.sh(&sb.id, "echo alive").await, "alive\n");
    assert!(d.client.list(false).await.expect("list").len() == 1, "a bad create made a sandbox");
    let log = d.log();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
    assert!(!log.contains("internal error"), "the daemon logged an internal error:\n{log}");
}

#[tokio::test]
async fn a_well_formed_unknown_id_is_not_found() {
    let d = Daemon::start().await;
    let r = http(&d.socket, "GET", &format!("/v1/sandboxes/{UNKNOWN}"), None, b"");
    assert_eq!(r.status, 404);
    let j = r.json();
    assert_eq!(j["code"], "not_found");
    assert!(j["message"].as_str().is_some_and(|m| m.contains(UNKNOWN)), "{j}");
}

#[tokio::test]
async fn openapi_document_lists_the_sandbox_routes() {
    let d = Daemon::start().await;
    let r = http(&d.socket, "GET", "/openapi.json", None, b"");
    assert_eq!(r.status, 200);
    let doc = r.json();
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with('3')), "{}", doc["openapi"]);
    let paths = doc["paths"].as_object().expect("`paths` is an object");
    for p in ["/v1/sandboxes", "/v1/sandboxes/{id}", "/v1/sandboxes/{id}/exec"] {
        assert!(paths.contains_key(p), "OpenAPI lacks {p}: {:?}", paths.keys().collect::<Vec<_>>());
    }
    assert!(paths["/v1/sandboxes"].get("post").is_some());
}

#[tokio::test]
async fn destroy_is_idempotent() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let path = format!("/v1/sandboxes/{}", sb.id);
    let first = http(&d.socket, "DELETE", &path, None, b"");
    assert_eq!(first.status, 200, "{}", common::text(&first.body));
    assert_eq!(first.json()["state"], "destroyed");
    let second = http(&d.socket, "DELETE", &path, None, b"");
    assert_eq!(second.status, 200, "{}", common::text(&second.body));
    assert_eq!(second.json()["state"], "destroyed");
    assert_eq!(first.json()["reason"], second.json()["reason"]);
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
    // A command in a destroyed sandbox is refused with a 4xx, not a 5xx.
    let r = http(&d.socket, "POST", &format!("{path}/exec"), JSON, br#"{"argv":["true"]}"#);
    assert!((400..500).contains(&r.status), "{} {}", r.status, common::text(&r.body));
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
    let info = loop {
        let info = d.client.get(&sb.id).await.expect("get");
        if info.state == SandboxState::Destroyed || t.elapsed() > Duration::from_secs(3) {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(info.state, SandboxState::Destroyed, "3 s after a 1 s TTL: {info:?}");
    assert_eq!(info.reason.as_deref(), Some("ttl"));
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}
