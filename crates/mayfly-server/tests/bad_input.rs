//! Bad input is always a 4xx with a JSON `{code, message}`, never a 500 or a
//! panic, and never axum's plain-text rejections.

mod support;

use axum::body::Body;
use http::{Method, Request};
use mayfly_server::ServerOptions;
use mayfly_types::ErrorCode;
use support::*;

/// One bad request and what it must get.
struct Case {
    what: &'static str,
    method: Method,
    /// `{id}` is replaced by a live sandbox's id.
    uri: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: ErrorCode,
}

fn case(
    what: &'static str,
    method: Method,
    uri: &'static str,
    content_type: Option<&'static str>,
    body: &str,
    status: u16,
    code: ErrorCode,
) -> Case {
    Case {
        what,
        method,
        uri,
        content_type,
        body: body.as_bytes().to_vec(),
        status,
        code,
    }
}

const JSON: Option<&str> = Some("application/json");

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    use ErrorCode::*;
    use Method as M;
    let exec = "/v1/sandboxes/{id}/exec";
    vec![
        case(
            "malformed JSON",
            M::POST,
            "/v1/sandboxes",
            JSON,
            "{",
            400,
            InvalidArgument,
        ),
        case(
            "JSON of the wrong shape",
            M::POST,
            "/v1/sandboxes",
            JSON,
            "[1,2]",
            400,
            InvalidArgument,
        ),
        case(
            "trailing garbage",
            M::POST,
            "/v1/sandboxes",
            JSON,
            "{} x",
            400,
            InvalidArgument,
        ),
        case(
            "unknown field",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"tmpl":"host"}"#,
            400,
            InvalidArgument,
        ),
        case(
            "unknown nested field",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"limits":{"swap":1}}"#,
            400,
            InvalidArgument,
        ),
        case(
            "negative limit",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"limits":{"pids":-1}}"#,
            400,
            InvalidArgument,
        ),
        case(
            "limit beyond u32",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"limits":{"pids":99999999999}}"#,
            400,
            InvalidArgument,
        ),
        case(
            "number beyond u64",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"ttl_secs":1e400}"#,
            400,
            InvalidArgument,
        ),
        case(
            "huge but typed limit (engine range check)",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"limits":{"memory_bytes":18446744073709551615}}"#,
            400,
            InvalidArgument,
        ),
        case(
            "float where an integer goes",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"ttl_secs":1.5}"#,
            400,
            InvalidArgument,
        ),
        case(
            "bad template",
            M::POST,
            "/v1/sandboxes",
            JSON,
            r#"{"template":"dir:../x"}"#,
            400,
            InvalidArgument,
        ),
        case(
            "wrong content type",
            M::POST,
            "/v1/sandboxes",
            Some("text/plain"),
            "{}",
            415,
            UnsupportedMediaType,
        ),
        case(
            "form content type",
            M::POST,
            exec,
            Some("application/x-www-form-urlencoded"),
            "a=1",
            415,
            UnsupportedMediaType,
        ),
        case(
            "JSON body without content type",
            M::POST,
            exec,
            None,
            r#"{"argv":["echo"]}"#,
            415,
            UnsupportedMediaType,
        ),
        case(
            "exec with unknown field",
            M::POST,
            exec,
            JSON,
            r#"{"argv":["echo"],"shell":true}"#,
            400,
            InvalidArgument,
        ),
        case(
            "exec with negative uid",
            M::POST,
            exec,
            JSON,
            r#"{"argv":["echo"],"uid":-1}"#,
            400,
            InvalidArgument,
        ),
        case(
            "exec with bad base64 stdin",
            M::POST,
            exec,
            JSON,
            r#"{"argv":["cat"],"stdin":"@@"}"#,
            400,
            InvalidArgument,
        ),
        case(
            "exec with argv missing",
            M::POST,
            exec,
            JSON,
            r#"{}"#,
            400,
            InvalidArgument,
        ),
        case(
            "exec with empty argv",
            M::POST,
            exec,
            JSON,
            r#"{"argv":[]}"#,
            400,
            InvalidArgument,
        ),
        case(
            "exec with unknown query param",
            M::POST,
            "/v1/sandboxes/{id}/exec?strem=true",
            JSON,
            r#"{"argv":["echo"]}"#,
            400,
            InvalidArgument,
        ),
        case(
            "exec with non-bool stream",
            M::POST,
            "/v1/sandboxes/{id}/exec?stream=maybe",
            JSON,
            r#"{"argv":["echo"]}"#,
            400,
            InvalidArgument,
        ),
        case(
            "bad id with path characters",
            M::GET,
            "/v1/sandboxes/mf-..%2F..%2Fx",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "bad id, uppercase",
            M::GET,
            "/v1/sandboxes/mf-ABCDEFGHIJKL",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "bad id, too long",
            M::DELETE,
            "/v1/sandboxes/mf-abcdefghjkmnp",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "bad id on a nested route",
            M::GET,
            "/v1/sandboxes/nope/audit",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "dot-dot segments match no route",
            M::GET,
            "/v1/sandboxes/mf-../../x",
            None,
            "",
            404,
            NotFound,
        ),
        case(
            "non-numeric process handle",
            M::GET,
            "/v1/sandboxes/{id}/processes/abc/output",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "negative process handle",
            M::POST,
            "/v1/sandboxes/{id}/processes/-1/wait",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "wait timeout over 24h",
            M::POST,
            "/v1/sandboxes/{id}/processes/1/wait?timeout_ms=99999999999",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "wait timeout negative",
            M::POST,
            "/v1/sandboxes/{id}/processes/1/wait?timeout_ms=-5",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "signal out of range",
            M::POST,
            "/v1/sandboxes/{id}/processes/1/kill",
            JSON,
            r#"{"signal":-9}"#,
            400,
            InvalidArgument,
        ),
        case(
            "list with a non-bool all",
            M::GET,
            "/v1/sandboxes?all=yes",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "events with negative since",
            M::GET,
            "/v1/events?since=-1",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "events with limit 0",
            M::GET,
            "/v1/events?limit=0",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "events with a huge limit",
            M::GET,
            "/v1/events?limit=99999999999",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "events with junk since",
            M::GET,
            "/v1/events?since=abc",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "file read without path",
            M::GET,
            "/v1/sandboxes/{id}/files",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "file path escaping (engine)",
            M::GET,
            "/v1/sandboxes/{id}/files?path=/../etc/shadow",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "file write with a non-octal mode",
            M::PUT,
            "/v1/sandboxes/{id}/files?path=/a&mode=0999",
            None,
            "x",
            400,
            InvalidArgument,
        ),
        case(
            "file write with a huge mode",
            M::PUT,
            "/v1/sandboxes/{id}/files?path=/a&mode=77777",
            None,
            "x",
            400,
            InvalidArgument,
        ),
        case(
            "remove with non-bool recursive",
            M::DELETE,
            "/v1/sandboxes/{id}/files?path=/a&recursive=2",
            None,
            "",
            400,
            InvalidArgument,
        ),
        case(
            "mkdir with unknown field",
            M::POST,
            "/v1/sandboxes/{id}/files/mkdir",
            JSON,
            r#"{"path":"/a","p":1}"#,
            400,
            InvalidArgument,
        ),
        case(
            "rename missing to",
            M::POST,
            "/v1/sandboxes/{id}/files/rename",
            JSON,
            r#"{"from":"/a"}"#,
            400,
            InvalidArgument,
        ),
        case(
            "archive with a JSON content type",
            M::PUT,
            "/v1/sandboxes/{id}/archive?path=/w",
            JSON,
            "{}",
            415,
            UnsupportedMediaType,
        ),
        case(
            "unknown route",
            M::GET,
            "/v2/sandboxes",
            None,
            "",
            404,
            NotFound,
        ),
        case(
            "unknown nested route",
            M::GET,
            "/v1/sandboxes/{id}/nope",
            None,
            "",
            404,
            NotFound,
        ),
        case(
            "wrong method",
            M::PATCH,
            "/v1/sandboxes",
            None,
            "",
            405,
            InvalidArgument,
        ),
        case(
            "wrong method on a sandbox",
            M::PUT,
            "/v1/sandboxes/{id}",
            None,
            "",
            405,
            InvalidArgument,
        ),
        case("GET on exec", M::GET, exec, None, "", 405, InvalidArgument),
    ]
}

#[tokio::test]
async fn every_bad_input_gets_a_4xx_json_error() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    let mut failures = Vec::new();
    for c in cases() {
        let uri = c.uri.replace("{id}", sb.id.as_str());
        let mut b = Request::builder().method(c.method.clone()).uri(&uri);
        if let Some(ct) = c.content_type {
            b = b.header("content-type", ct);
        }
        let a = send(&app, b.body(Body::from(c.body)).expect("valid request")).await;
        let is_json = a
            .headers
            .get("content-type")
            .is_some_and(|v| v == "application/json");
        let parsed = serde_json::from_slice::<mayfly_types::ApiError>(&a.body).ok();
        let ok = a.status.as_u16() == c.status
            && is_json
            && parsed
                .as_ref()
                .is_some_and(|e| e.code == c.code && !e.message.is_empty());
        if !ok {
            failures.push(format!(
                "{}: {} {uri} → {} {}",
                c.what,
                c.method,
                a.status,
                String::from_utf8_lossy(&a.body)
            ));
        }
    }
    assert!(failures.is_empty(), "bad answers:\n{}", failures.join("\n"));
}

#[tokio::test]
async fn a_bad_id_error_names_the_id_and_the_expected_shape() {
    let (app, _) = test_app();
    let a = send(&app, empty_req(Method::GET, "/v1/sandboxes/mf-..%2F..%2Fx")).await;
    let e = a.api_error(400);
    assert!(e.message.contains("mf-../../x"), "{e:?}");
    assert!(e.message.contains("mf-"), "{e:?}");
}

#[tokio::test]
async fn json_bodies_over_the_cap_are_413_whether_or_not_their_length_is_declared() {
    let (app, _) = test_app();
    let big = format!(r#"{{"labels":{{"k":"{}"}}}}"#, "x".repeat(2 << 20));
    let a = send(&app, json_req(Method::POST, "/v1/sandboxes", &big)).await;
    assert_eq!(a.api_error(413).code, ErrorCode::TooLarge);

    // A chunked body has no Content-Length; the cap applies while reading.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = (0..40)
        .map(|_| Ok(bytes::Bytes::from(vec![b' '; 64 << 10])))
        .collect();
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    let r = req(Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .body(body)
        .expect("valid request");
    send(&app, r).await.api_error(413);
}

#[tokio::test]
async fn file_bodies_over_their_configurable_cap_are_413() {
    let (app, _) = test_app_with(ServerOptions {
        file_body_limit: 1000,
        ..ServerOptions::default()
    });
    let sb = create(&app).await;
    let uri = format!("/v1/sandboxes/{}/files?path=/f", sb.id);
    let ok = req(Method::PUT, &uri)
        .body(Body::from(vec![0u8; 1000]))
        .expect("valid");
    assert_eq!(send(&app, ok).await.status, 200);
    let big = req(Method::PUT, &uri)
        .body(Body::from(vec![0u8; 1001]))
        .expect("valid");
    send(&app, big).await.api_error(413);
    let tar = format!("/v1/sandboxes/{}/archive?path=/w", sb.id);
    let big = req(Method::PUT, &tar)
        .body(Body::from(vec![0u8; 1001]))
        .expect("valid");
    send(&app, big).await.api_error(413);
}

#[tokio::test]
async fn a_lying_content_length_is_a_4xx() {
    let (app, _) = test_app();
    let r = req(Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .header("content-length", "not-a-number")
        .body(Body::from("{}"))
        .expect("valid request");
    send(&app, r).await.api_error(400);
}
