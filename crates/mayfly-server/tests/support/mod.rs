//! Helpers for driving the router in-process.

#![allow(dead_code)]

pub mod fake;
pub mod openmetrics;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use mayfly_server::{app, Peer, ServerOptions};
use mayfly_types::{ApiError, SandboxInfo};
use tower::ServiceExt as _;

pub use fake::FakeEngine;

/// The uid the in-process requests claim to come from over the unix socket.
pub const TEST_UID: u32 = 4321;

pub fn test_app() -> (Router, Arc<FakeEngine>) {
    test_app_with(ServerOptions::default())
}

pub fn test_app_with(opts: ServerOptions) -> (Router, Arc<FakeEngine>) {
    let fake = FakeEngine::new();
    (app(fake.clone(), opts), fake)
}

/// A response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} body is not the expected JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts the answer is a JSON `{code, message}` with `status`.
    pub fn api_error(&self, status: u16) -> ApiError {
        assert_eq!(
            self.status.as_u16(),
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap_or("")),
            Some("application/json"),
            "error bodies are JSON"
        );
        let e: ApiError = self.json();
        assert!(!e.message.is_empty(), "error messages are not empty");
        e
    }
}

/// A request builder that looks like it came over the unix socket.
pub fn req(method: Method, uri: &str) -> http::request::Builder {
    Request::builder().method(method).uri(uri)
}

pub fn json_req(method: Method, uri: &str, body: &str) -> Request<Body> {
    req(method, uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .expect("valid request")
}

pub fn empty_req(method: Method, uri: &str) -> Request<Body> {
    req(method, uri).body(Body::empty()).expect("valid request")
}

/// Sends `r` as a unix-socket peer with uid [`TEST_UID`].
pub async fn send(app: &Router, mut r: Request<Body>) -> Answer {
    r.extensions_mut().insert(ConnectInfo(Peer::Unix {
        uid: Some(TEST_UID),
    }));
    send_raw(app, r).await
}

/// Sends `r` with whatever peer info it carries (none by default).
pub async fn send_raw(app: &Router, r: Request<Body>) -> Answer {
    let resp = app
        .clone()
        .oneshot(r)
        .await
        .expect("the router is infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("the body can be read")
        .to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

/// Creates a default sandbox and returns it.
pub async fn create(app: &Router) -> SandboxInfo {
    let a = send(app, json_req(Method::POST, "/v1/sandboxes", "{}")).await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
    a.json()
}
