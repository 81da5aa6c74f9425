//! The gateway routes: exposed ports, tokens, TCP forwarding, routes and
//! overrides.

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONNECTION, UPGRADE};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use mayfly_types::{
    ExposeRequest, OverrideRequest, PortInfo, RouteInfo, RouteList, RouteRequest, SandboxId,
    SandboxPorts, ServiceOverride,
};

use crate::{encode, json_body, read_body, Body, Client, ClientError};

/// A raw byte stream to a port inside a sandbox ([`Client::connect_port`]).
pub type PortStream = TokioIo<hyper::upgrade::Upgraded>;

impl Client {
    /// `GET /v1/sandboxes/{id}/ports`: the sandbox's gateway token, exposed
    /// ports (with their preview URLs) and overrides.
    pub async fn ports(&self, id: &SandboxId) -> Result<SandboxPorts, ClientError> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/ports"),
            Body::Empty,
        )
        .await
    }

    /// `PUT /v1/sandboxes/{id}/ports/{port}`: exposes a port; `public`
    /// makes it reachable without the token.
    pub async fn expose(
        &self,
        id: &SandboxId,
        port: u16,
        public: bool,
    ) -> Result<PortInfo, ClientError> {
        let p = format!("/v1/sandboxes/{id}/ports/{port}");
        self.json(Method::PUT, &p, json_body(&ExposeRequest { public })?)
            .await
    }

    /// `DELETE /v1/sandboxes/{id}/ports/{port}`.
    pub async fn unexpose(&self, id: &SandboxId, port: u16) -> Result<(), ClientError> {
        let p = format!("/v1/sandboxes/{id}/ports/{port}");
        self.empty(Method::DELETE, &p, Body::Empty).await
    }

    /// `PUT /v1/sandboxes/{id}/overrides/{service}`: requests for `service`
    /// whose routing key names this sandbox go to its `port`.
    pub async fn set_override(
        &self,
        id: &SandboxId,
        service: &str,
        port: u16,
    ) -> Result<ServiceOverride, ClientError> {
        let p = format!("/v1/sandboxes/{id}/overrides/{}", encode(service));
        let body = json_body(&OverrideRequest { port: port.into() })?;
        self.json(Method::PUT, &p, body).await
    }

    /// `DELETE /v1/sandboxes/{id}/overrides/{service}`.
    pub async fn remove_override(&self, id: &SandboxId, service: &str) -> Result<(), ClientError> {
        let p = format!("/v1/sandboxes/{id}/overrides/{}", encode(service));
        self.empty(Method::DELETE, &p, Body::Empty).await
    }

    /// `GET /v1/routes`.
    pub async fn routes(&self) -> Result<Vec<RouteInfo>, ClientError> {
        let list: RouteList = self.json(Method::GET, "/v1/routes", Body::Empty).await?;
        Ok(list.routes)
    }

    /// `PUT /v1/routes/{name}`: a service's baseline (admin).
    pub async fn put_route(&self, name: &str, url: &str) -> Result<RouteInfo, ClientError> {
        let p = format!("/v1/routes/{}", encode(name));
        let body = json_body(&RouteRequest {
            url: url.to_owned(),
        })?;
        self.json(Method::PUT, &p, body).await
    }

    /// `DELETE /v1/routes/{name}` (admin).
    pub async fn delete_route(&self, name: &str) -> Result<(), ClientError> {
        let p = format!("/v1/routes/{}", encode(name));
        self.empty(Method::DELETE, &p, Body::Empty).await
    }

    /// `GET /v1/sandboxes/{id}/ports/{port}/connect`, upgraded: a raw TCP
    /// stream to `127.0.0.1:port` inside the sandbox.
    pub async fn connect_port(&self, id: &SandboxId, port: u16) -> Result<PortStream, ClientError> {
        let path = format!("/v1/sandboxes/{id}/ports/{port}/connect");
        let what = format!("GET {path}");
        let mut b = Request::builder()
            .method(Method::GET)
            .uri(format!("{}{}", self.base, path))
            .header(CONNECTION, "upgrade")
            .header(UPGRADE, "mayfly-tcp");
        if let Some(auth) = &self.auth {
            b = b.header(AUTHORIZATION, auth.clone());
        }
        let req = b
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Protocol {
                request: what.clone(),
                reason: format!("the request cannot be built: {e}"),
            })?;
        let mut resp = self.transport.send(req, &self.target, &what).await?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = resp.status().as_u16();
            let bytes = read_body(resp, &what).await?;
            let error = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                mayfly_types::ApiError::new(
                    mayfly_types::ErrorCode::from_http_status(status),
                    format!("HTTP {status}"),
                )
            });
            return Err(ClientError::Api { status, error });
        }
        let up = hyper::upgrade::on(&mut resp)
            .await
            .map_err(|e| ClientError::Protocol {
                request: what,
                reason: format!("the upgrade failed: {e}"),
            })?;
        Ok(TokioIo::new(up))
    }
}
