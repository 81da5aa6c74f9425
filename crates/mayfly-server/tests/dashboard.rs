//! `GET /dashboard`: the page and its files are served without a token
//! (they hold no data), with their security headers; the data they read is
//! not; other methods get the API's JSON 405.

mod support;

use http::{Method, StatusCode};
use mayfly_types::ErrorCode;
use support::*;

#[tokio::test]
async fn the_files_are_public_and_locked_down_but_the_data_is_not() {
    // `send_raw` attaches no peer: like a TCP request without a token.
    let (router, _) = test_app();
    for (path, kind) in [
        ("/dashboard", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ] {
        let a = send_raw(&router, empty_req(Method::GET, path)).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        let header = |name: &str| {
            a.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(header("content-type").starts_with(kind), "{path}");
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert_eq!(header("cache-control"), "no-cache");
        assert!(!a.body.is_empty());
    }
    for path in [
        "/v1/stats",
        "/v1/sandboxes",
        "/v1/pools",
        "/dashboard/secret",
    ] {
        let a = send_raw(&router, empty_req(Method::GET, path)).await;
        assert_eq!(a.api_error(401).code, ErrorCode::Unauthenticated, "{path}");
    }
}

#[tokio::test]
async fn other_methods_get_a_json_405() {
    let (router, _) = test_app();
    for (method, path) in [
        (Method::POST, "/dashboard"),
        (Method::DELETE, "/dashboard/app.js"),
        (Method::PUT, "/dashboard/app.css"),
    ] {
        let a = send_raw(&router, empty_req(method.clone(), path)).await;
        let e = a.api_error(405);
        assert!(
            e.message
                .contains(&format!("method {method} is not allowed on {path}")),
            "{e:?}"
        );
    }
}
