//! `GET /dashboard`: the built-in dashboard, three static files compiled
//! into the binary.
//!
//! The files hold no data and no secret, so they are served without
//! authentication (a browser cannot put a bearer token on a navigation).
//! The page asks for a token or API key and sends it with every API call it
//! makes, so it shows exactly what that caller may see: a tenant's key shows
//! its own sandboxes and events (paged, since the live event stream is for
//! admins).
//!
//! A strict Content-Security-Policy allows only these files' own script and
//! style and requests to the same origin: no inline script, no framing, no
//! other host. The page puts values from the API (labels, ids, event
//! details) into text nodes only.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The page.
pub(crate) const INDEX_HTML: &str = include_str!("../assets/dashboard/index.html");
/// Its script.
pub(crate) const APP_JS: &str = include_str!("../assets/dashboard/app.js");
/// Its style sheet.
pub(crate) const APP_CSS: &str = include_str!("../assets/dashboard/app.css");

/// The Content-Security-Policy of every dashboard file.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The paths the dashboard is served at.
pub(crate) const PATHS: [&str; 3] = ["/dashboard", "/dashboard/app.js", "/dashboard/app.css"];

/// The dashboard's routes, outside the API's authentication.
pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            PATHS[0],
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            PATHS[1],
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            PATHS[2],
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        // Like the API's: a JSON `{code, message}`, not an empty 405.
        .method_not_allowed_fallback(crate::error::method_not_allowed)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Always revalidated, so an upgraded daemon serves its own page.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every API path the page fetches, with `${…}` parts as `{id}`.
    fn fetched_paths() -> Vec<String> {
        let mut out = Vec::new();
        for quote in ['"', '`'] {
            let mut rest = APP_JS;
            let start = format!("{quote}/v1/");
            while let Some(i) = rest.find(&start) {
                let tail = &rest[i + 1..];
                let end = tail.find(quote).expect("a closed string");
                let path = tail[..end].split('?').next().unwrap_or_default();
                let mut norm = String::new();
                let mut it = path.split("${");
                norm.push_str(it.next().unwrap_or_default());
                for part in it {
                    norm.push_str("{id}");
                    norm.push_str(part.split_once('}').map(|(_, r)| r).unwrap_or(""));
                }
                out.push(norm);
                rest = &tail[end..];
            }
        }
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn the_page_fetches_only_routes_the_api_serves_by_get() {
        let paths = fetched_paths();
        assert_eq!(
            paths,
            [
                "/v1/events",
                "/v1/pools",
                "/v1/sandboxes",
                "/v1/sandboxes/{id}/usage",
                "/v1/stats"
            ],
            "the page's API calls changed: update this list and the dashboard test"
        );
        let table = crate::route_table();
        for p in &paths {
            assert!(
                table
                    .iter()
                    .any(|(m, path)| *m == http::Method::GET && path == p),
                "the dashboard fetches {p}, which the API does not serve by GET"
            );
        }
    }

    #[test]
    fn the_page_loads_only_its_own_files_and_no_inline_script() {
        assert!(INDEX_HTML.contains(r#"<script src="/dashboard/app.js" defer></script>"#));
        assert!(INDEX_HTML.contains(r#"href="/dashboard/app.css""#));
        assert_eq!(
            INDEX_HTML.matches("<script").count(),
            1,
            "one script, no inline one"
        );
        let handler = INDEX_HTML.split(" on").skip(1).find(|rest| {
            let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name_len > 0 && rest[name_len..].starts_with('=')
        });
        assert_eq!(handler, None, "no inline event handler attributes");
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"));
        assert!(!APP_JS.contains("https://"), "no other host");
        // Values reach the page as text: no markup sinks.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!APP_JS.contains(sink), "app.js uses {sink}");
        }
    }
}
