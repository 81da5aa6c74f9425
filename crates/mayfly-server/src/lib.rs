//! Mayfly's REST API: thin axum handlers over [`mayfly_engine::SandboxApi`].
//!
//! Handlers extract, call the engine, and map the result; they hold no
//! sandbox logic. [`app`] builds the one route table; [`serve`] runs it on
//! the daemon's unix socket and, optionally, on TCP with a bearer token.
//!
//! Every failure is JSON `{code, message}` with a 4xx or 5xx status, including
//! malformed input, unknown routes and wrong methods.

use std::sync::Arc;
use std::time::Duration;

use mayfly_engine::SandboxApi;

mod activity;
mod artifacts;
mod auth;
pub mod conn;
mod dashboard;
mod egress;
mod error;
mod events;
mod exec;
mod extract;
mod feed;
mod files;
mod forward;
pub mod gateway;
mod listen;
mod metrics;
mod observe;
mod openapi;
mod pools;
mod ports;
mod processes;
mod revocable;
mod routes;
mod run;
mod sandboxes;
mod templates;
mod tenancy;

pub use auth::Peer;
pub(crate) use error::AppError;
pub use listen::{bind_tcp, bind_unix, serve, ListenError, Listener};
pub use metrics::CONTENT_TYPE_OPENMETRICS;
pub use openapi::ApiDoc;
pub use routes::{app, route_table};

/// A JSON request body may be at most this large (1 MiB).
pub const DEFAULT_JSON_BODY_LIMIT: usize = 1 << 20;
/// A file or archive upload may be at most this large (1 GiB).
pub const DEFAULT_FILE_BODY_LIMIT: usize = 1 << 30;
/// An idle event stream sends a comment line this often, through proxies
/// that would close a silent connection.
pub const DEFAULT_SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How the API behaves, independent of which sockets serve it.
#[derive(Clone)]
pub struct ServerOptions {
    /// The bearer token TCP requests must present. With `None` (or empty),
    /// every TCP request is refused with 401 and only the unix socket works.
    pub tcp_token: Option<String>,
    /// Cap on JSON request bodies; larger ones get 413.
    pub json_body_limit: usize,
    /// Cap on file and tar uploads; larger ones get 413.
    pub file_body_limit: usize,
    /// How often an idle event stream sends a keep-alive comment.
    pub sse_keep_alive: Duration,
    /// Where the daemon's gateway answers, for the preview URLs the API
    /// hands out; `None` without a gateway.
    pub gateway: Option<GatewayAddr>,
}

/// The gateway's domain and port, as preview URLs spell them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayAddr {
    pub domain: String,
    pub port: u16,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            tcp_token: None,
            json_body_limit: DEFAULT_JSON_BODY_LIMIT,
            file_body_limit: DEFAULT_FILE_BODY_LIMIT,
            sse_keep_alive: DEFAULT_SSE_KEEP_ALIVE,
            gateway: None,
        }
    }
}

impl std::fmt::Debug for ServerOptions {
    /// Never prints the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("tcp_token", &self.tcp_token.as_ref().map(|_| "<redacted>"))
            .field("json_body_limit", &self.json_body_limit)
            .field("file_body_limit", &self.file_body_limit)
            .field("sse_keep_alive", &self.sse_keep_alive)
            .field("gateway", &self.gateway)
            .finish()
    }
}

/// What every handler can reach.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) api: Arc<dyn SandboxApi>,
    pub(crate) opts: Arc<ServerOptions>,
    pub(crate) metrics: Arc<metrics::Metrics>,
}
