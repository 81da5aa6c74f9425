//! A typed Rust client of Mayfly's REST API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mayfly_client::ClientError> {
//! use mayfly_client::Client;
//! use mayfly_types::{CreateRequest, ExecRequest};
//!
//! let client = Client::unix("/run/mayfly/mayfly.sock");
//! let sb = client.create(&CreateRequest::default()).await?;
//! let out = client
//!     .exec(&sb.id, &ExecRequest { argv: vec!["true".into()], ..Default::default() })
//!     .await?;
//! assert_eq!(out.status.exit_code, Some(0));
//! client.destroy(&sb.id).await?;
//! # Ok(()) }
//! ```
//!
//! A [`Client`] is cheap to clone and keeps its connections alive between
//! calls, so repeated execs do not pay for a new connection each time.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use mayfly_types::{ApiError, ErrorCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

mod admin;
mod api;
mod error;
mod gateway;
mod observe;
mod sse;
mod templates;
mod transport;

pub use error::{BoxError, ClientError};
pub use gateway::PortStream;
pub use mayfly_types::UploadSummary;
pub use observe::EventStream;
pub use sse::ExecStream;
pub use templates::{BuildEvent, BuildStream};

use transport::Transport;

/// A connection pool to one Mayfly daemon.
#[derive(Clone, Debug)]
pub struct Client {
    transport: Transport,
    /// `http://localhost` for unix sockets, else the TCP base URL.
    base: Arc<str>,
    /// `Bearer <token>`, sent on every request when set.
    auth: Option<HeaderValue>,
    /// Where the daemon is, for error messages.
    target: Arc<str>,
}

/// What a request carries.
pub(crate) enum Body {
    Empty,
    Json(Vec<u8>),
    Raw(Bytes, &'static str),
}

impl Client {
    /// A client of the daemon listening on the unix socket at `path`.
    /// Nothing is connected until the first call.
    pub fn unix(path: impl AsRef<Path>) -> Client {
        Client::unix_connected(path, None)
    }

    /// [`Client::unix`] whose first request goes over `conn`, a connection
    /// to the same socket made already (for example to check that a daemon
    /// answers), instead of a new one.
    pub fn unix_connected(
        path: impl AsRef<Path>,
        conn: Option<std::os::unix::net::UnixStream>,
    ) -> Client {
        let path: PathBuf = path.as_ref().to_path_buf();
        Client {
            transport: Transport::unix(&path, conn),
            base: Arc::from("http://localhost"),
            auth: None,
            target: Arc::from(format!("unix:{}", path.display())),
        }
    }

    /// A client of a daemon's TCP listener, e.g. `http://127.0.0.1:7777`,
    /// sending `Authorization: Bearer <token>` when a token is given.
    pub fn tcp(base_url: &str, token: Option<&str>) -> Result<Client, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: base_url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = base_url.parse().map_err(|_| invalid("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(invalid("TLS is not supported; use http:// or a tunnel")),
            _ => return Err(invalid("expected http://HOST:PORT")),
        }
        let Some(authority) = uri.authority() else {
            return Err(invalid("expected http://HOST:PORT"));
        };
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid("the URL must have no path or query"));
        }
        let auth = token
            .map(|t| HeaderValue::from_str(&format!("Bearer {t}")))
            .transpose()
            .map_err(|_| invalid("the token contains characters not allowed in a header"))?;
        let base = format!("http://{authority}");
        Ok(Client {
            transport: Transport::tcp(),
            target: Arc::from(base.as_str()),
            base: Arc::from(base),
            auth,
        })
    }

    /// Where this client sends requests: `unix:PATH` or `http://HOST:PORT`.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Sends a request and returns the response if its status is a success;
    /// an error status becomes [`ClientError::Api`].
    pub(crate) async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Body,
        accept: Option<&'static str>,
    ) -> Result<(hyper::Response<Incoming>, String), ClientError> {
        let what = format!("{method} {path_and_query}");
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path_and_query));
        if let Some(auth) = &self.auth {
            builder = builder.header(AUTHORIZATION, auth.clone());
        }
        if let Some(accept) = accept {
            builder = builder.header(ACCEPT, accept);
        }
        let body = match body {
            Body::Empty => Full::new(Bytes::new()),
            Body::Json(b) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(b))
            }
            Body::Raw(b, ct) => {
                builder = builder.header(CONTENT_TYPE, ct);
                Full::new(b)
            }
        };
        let req = builder.body(body).map_err(|e| ClientError::Protocol {
            request: what.clone(),
            reason: format!("the request cannot be built: {e}"),
        })?;
        let resp = self.transport.send(req, &self.target, &what).await?;
        if resp.status().is_success() {
            return Ok((resp, what));
        }
        let status = resp.status().as_u16();
        let bytes = read_body(resp, &what).await?;
        let error = serde_json::from_slice::<ApiError>(&bytes).unwrap_or_else(|_| {
            // Not our JSON (a proxy?): keep what it said, classed by status.
            let text = String::from_utf8_lossy(&bytes);
            ApiError::new(
                ErrorCode::from_http_status(status),
                format!(
                    "HTTP {status}: {}",
                    text.chars().take(200).collect::<String>()
                ),
            )
        });
        Err(ClientError::Api { status, error })
    }

    /// A call whose answer is JSON of type `T`.
    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
        body: Body,
    ) -> Result<T, ClientError> {
        let (resp, what) = self.call(method, path_and_query, body, None).await?;
        let bytes = read_body(resp, &what).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol {
            request: what,
            reason: format!("invalid JSON: {e}"),
        })
    }

    /// A call whose answer is raw bytes.
    pub(crate) async fn bytes(
        &self,
        method: Method,
        path_and_query: &str,
    ) -> Result<Bytes, ClientError> {
        let (resp, what) = self.call(method, path_and_query, Body::Empty, None).await?;
        read_body(resp, &what).await
    }

    /// A call whose answer has no body worth reading.
    pub(crate) async fn empty(
        &self,
        method: Method,
        path_and_query: &str,
        body: Body,
    ) -> Result<(), ClientError> {
        let (resp, what) = self.call(method, path_and_query, body, None).await?;
        // Read it anyway, so the connection goes back to the pool.
        read_body(resp, &what).await.map(|_| ())
    }

    /// `GET /healthz`: whether the daemon says it is serving.
    pub async fn health(&self) -> Result<bool, ClientError> {
        #[derive(serde::Deserialize)]
        struct Health {
            ok: bool,
        }
        let h: Health = self.json(Method::GET, "/healthz", Body::Empty).await?;
        Ok(h.ok)
    }

    /// `GET /openapi.json`: the daemon's OpenAPI document.
    pub async fn openapi(&self) -> Result<serde_json::Value, ClientError> {
        self.json(Method::GET, "/openapi.json", Body::Empty).await
    }
}

pub(crate) fn json_body<T: Serialize>(value: &T) -> Result<Body, ClientError> {
    serde_json::to_vec(value)
        .map(Body::Json)
        .map_err(|e| ClientError::Protocol {
            request: "encoding the request".to_owned(),
            reason: e.to_string(),
        })
}

pub(crate) async fn read_body(
    resp: hyper::Response<Incoming>,
    what: &str,
) -> Result<Bytes, ClientError> {
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ClientError::Transport {
            request: what.to_owned(),
            source: Box::new(e),
        })
}

/// Percent-encodes a query value: everything but unreserved characters and `/`.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("/a b/ü&x=1"), "/a%20b/%C3%BC%26x%3D1");
        assert_eq!(encode("plain/path-1.txt"), "plain/path-1.txt");
    }

    #[test]
    fn tcp_urls_must_be_plain_http_without_a_path() {
        assert!(Client::tcp("http://127.0.0.1:7777", None).is_ok());
        assert!(Client::tcp("http://127.0.0.1:7777/", Some("t")).is_ok());
        for bad in [
            "https://h:1",
            "ftp://h",
            "h:1",
            "http://h:1/v1",
            "http://h:1/?a=1",
            "::",
        ] {
            assert!(
                matches!(Client::tcp(bad, None), Err(ClientError::InvalidUrl { .. })),
                "{bad} accepted"
            );
        }
        assert!(Client::tcp("http://h:1", Some("bad\ntoken")).is_err());
    }
}
