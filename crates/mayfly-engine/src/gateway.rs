//! The gateway's view of the engine: the third way in, beside
//! [`crate::SandboxApi`] and [`crate::TenancyApi`].
//!
//! The hot path ([`GatewayApi::preview`], [`GatewayApi::route`],
//! [`GatewayApi::connect`]) reads in-memory maps only: no store query per
//! request. Routes are read from the store once and written through on
//! change; a sandbox's exposed ports, token and overrides live in memory and
//! go with the sandbox (removed when its destroy begins).

use std::sync::Arc;

use async_trait::async_trait;
use mayfly_types::{
    BaselineUrl, ErrorCode, PortInfo, RouteInfo, SandboxId, SandboxPorts, ServiceOverride,
};
use tokio::sync::watch;

use crate::EngineError;

/// The loopback port the daemon listens on inside a sandbox's network
/// namespace once the sandbox overrides a service, so its services can call
/// other services through the gateway (`http://127.0.0.1:15080`).
/// It is reserved: no preview, exposure, override or TCP forward may target
/// it, since a request sent there would come back into the gateway.
pub const IN_SANDBOX_GATEWAY_PORT: u16 = 15080;

/// Why the gateway refuses a request or cannot reach its upstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    #[error("port {port} of sandbox {id} is not public; present the sandbox's token (X-Mayfly-Token, or ?mayfly_token= once)")]
    TokenRequired { id: SandboxId, port: u16 },
    #[error("the token presented is not sandbox {id}'s")]
    BadToken { id: SandboxId },
    #[error("there is no route `{service}`, and the request's routing key names no sandbox that overrides it")]
    NoSuchRoute { service: String },
    #[error("there is no route `{service}`")]
    NoRouteToRemove { service: String },
    #[error("port {port} is the gateway's own listener inside sandbox {id}; it cannot be previewed, exposed, forwarded or used by an override")]
    ReservedPort { id: SandboxId, port: u16 },
    #[error("cannot reach port {port} of sandbox {id}: {reason}")]
    SandboxUnreachable {
        id: SandboxId,
        port: u16,
        reason: String,
    },
}

impl GatewayError {
    pub fn code(&self) -> ErrorCode {
        match self {
            GatewayError::TokenRequired { .. } => ErrorCode::Unauthenticated,
            GatewayError::BadToken { .. } => ErrorCode::PermissionDenied,
            GatewayError::NoSuchRoute { .. } | GatewayError::NoRouteToRemove { .. } => {
                ErrorCode::NotFound
            }
            GatewayError::ReservedPort { .. } => ErrorCode::InvalidArgument,
            GatewayError::SandboxUnreachable { .. } => ErrorCode::BadGateway,
        }
    }
}

/// Why a preview request was let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewAccess {
    /// The request presented the sandbox's token.
    Token,
    /// The port is public; the request presented no token, or not this
    /// sandbox's.
    Public,
}

/// Where a service request goes.
#[derive(Debug, Clone)]
pub enum RouteTarget {
    /// The port of the sandbox the routing key names, which overrides the
    /// service.
    Sandbox { id: SandboxId, port: u16 },
    /// The route's shared baseline.
    Baseline(Arc<BaselineUrl>),
}

/// A listener the engine opened on a sandbox's loopback; the gateway serves
/// service routing on it until `gone` closes (the sandbox's destroy began).
pub struct InSandboxListener {
    pub id: SandboxId,
    /// Non-blocking, for whichever runtime serves it.
    pub listener: std::net::TcpListener,
    pub gone: watch::Receiver<()>,
}

#[async_trait]
pub trait GatewayApi: Send + Sync {
    /// Checks a preview request for `port` of sandbox `id`: the sandbox is
    /// live and claimed, the port is not [`IN_SANDBOX_GATEWAY_PORT`], and
    /// the port is public or `token` is its token. Only a request let
    /// through counts as activity for the idle timeout.
    fn preview(
        &self,
        id: &SandboxId,
        port: u16,
        token: Option<&str>,
    ) -> Result<PreviewAccess, EngineError>;
    /// Where a request for `service` with routing key `key` goes: the
    /// sandbox `key` names if it overrides the service, else the baseline.
    /// No token is asked for: an override publishes its port, for that
    /// service, to every request carrying the sandbox's key.
    fn route(&self, service: &str, key: Option<&SandboxId>) -> Result<RouteTarget, EngineError>;
    /// A TCP connection to `127.0.0.1:port` inside the sandbox's network
    /// namespace. Never a host connection: a sandbox that is gone, stopping
    /// or unclaimed is an error, and so is [`IN_SANDBOX_GATEWAY_PORT`].
    /// Callers authorise first; the connection counts as activity.
    async fn connect(
        &self,
        id: &SandboxId,
        port: u16,
    ) -> Result<tokio::net::TcpStream, EngineError>;

    /// What a long-lived connection to sandbox `id` (a TCP forward, a
    /// WebSocket, a streamed response) touches as its bytes flow, so that
    /// traffic keeps the sandbox from idling out, not only the request
    /// that opened the connection. `None` if the sandbox is gone.
    fn activity(&self, id: &SandboxId) -> Option<crate::SandboxActivity>;

    /// The sandbox's token, exposed ports and overrides.
    async fn ports(&self, id: &SandboxId) -> Result<SandboxPorts, EngineError>;
    /// Exposes a port (public: reachable without the token); never
    /// [`IN_SANDBOX_GATEWAY_PORT`].
    async fn expose(
        &self,
        id: &SandboxId,
        port: u16,
        public: bool,
    ) -> Result<PortInfo, EngineError>;
    /// Takes a port's exposure back (it needs the token again).
    async fn unexpose(&self, id: &SandboxId, port: u16) -> Result<(), EngineError>;
    /// Routes `service` to the sandbox's `port` for requests with its key;
    /// never to [`IN_SANDBOX_GATEWAY_PORT`].
    async fn set_override(
        &self,
        id: &SandboxId,
        service: &str,
        port: u16,
    ) -> Result<ServiceOverride, EngineError>;
    async fn remove_override(&self, id: &SandboxId, service: &str) -> Result<(), EngineError>;

    async fn routes(&self) -> Result<Vec<RouteInfo>, EngineError>;
    async fn put_route(&self, name: &str, url: &str) -> Result<RouteInfo, EngineError>;
    async fn delete_route(&self, name: &str) -> Result<(), EngineError>;

    /// Listeners opened inside sandboxes (at a sandbox's first override),
    /// for the gateway to serve. Until this is called no such listener is
    /// opened; call it once.
    fn in_sandbox_listeners(&self) -> tokio::sync::mpsc::UnboundedReceiver<InSandboxListener>;
}
