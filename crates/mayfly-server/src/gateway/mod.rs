//! The gateway: a second HTTP listener of the daemon that forwards
//! requests into sandboxes (preview URLs) and routes service requests by
//! their routing key (the shared-baseline pattern). It speaks HTTP/1.1 and
//! HTTP/2 (h2c with prior knowledge) to clients, relays upgrades
//! (WebSocket) and streams bodies both ways; upstream it speaks HTTP/1.1
//! over keep-alive connections of each client connection's own.
//!
//! The same routing is served on a listener inside each sandbox that
//! overrides a service (`127.0.0.1:15080` there), so a sandboxed service
//! can call the next service of a chain although its namespace has only
//! loopback. That listener serves service requests only.

pub mod parse;
pub mod proxy;
pub mod upstream;

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{HeaderValue, COOKIE, SET_COOKIE};
use http::uri::PathAndQuery;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use mayfly_engine::{EngineError, InSandboxListener, RouteTarget, SandboxApi};
use mayfly_types::ErrorCode;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use parse::{ParseError, Target};
use proxy::{error, forward, GatewayBody};
use upstream::{Upstream, Upstreams};

/// The default gateway listener.
pub const DEFAULT_GATEWAY_ADDR: &str = "127.0.0.1:4180";
/// The default gateway domain: `*.localhost` resolves to loopback in
/// browsers and curl without any DNS set-up.
pub const DEFAULT_GATEWAY_DOMAIN: &str = "localhost";
/// Request headers, all together, may be at most this large (HTTP/1.1 and
/// HTTP/2); past it the client gets 431.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The gateway: cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    api: Arc<dyn SandboxApi>,
    domain: String,
}

/// Where a request came in.
#[derive(Clone)]
enum Entry {
    /// The host's gateway listener: previews and services.
    Host,
    /// A listener inside a sandbox: services only.
    InSandbox,
}

fn engine_error(e: EngineError) -> Response<GatewayBody> {
    let code = e.code();
    if code == ErrorCode::Internal {
        tracing::error!(error = %e, "gateway request failed");
        return error(code, "internal error; see the daemon's log");
    }
    error(code, e.to_string())
}

impl Gateway {
    /// A gateway over `api` answering for `*.<domain>`.
    pub fn new(api: Arc<dyn SandboxApi>, domain: &str) -> Gateway {
        Gateway {
            inner: Arc::new(Inner {
                api,
                domain: domain.trim_matches('.').to_ascii_lowercase(),
            }),
        }
    }

    /// Serves the host's gateway listener, and the listeners the engine
    /// opens inside sandboxes, until the process ends, on `threads` threads
    /// of its own. Each runs a single-threaded runtime, so a client
    /// connection, its upstream connections and the relayed bodies stay on
    /// one thread and never wait for the daemon's API work (or the API for
    /// them).
    pub fn spawn(self, listener: TcpListener, threads: usize) -> std::io::Result<()> {
        let listener = listener.into_std()?;
        let mut inside = self.inner.api.gateway().map(|g| g.in_sandbox_listeners());
        for i in 0..threads.max(1) {
            let l = listener.try_clone()?;
            let (api, domain) = (self.inner.api.clone(), self.inner.domain.clone());
            let inside = if i == 0 { inside.take() } else { None };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("mayfly-gateway-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        let gw = Gateway::new(api, &domain);
                        if let Some(mut inside) = inside {
                            let gw = gw.clone();
                            tokio::spawn(async move {
                                while let Some(l) = inside.recv().await {
                                    tokio::spawn(gw.clone().serve_in_sandbox(l));
                                }
                            });
                        }
                        gw.accept_loop(l).await;
                    })
                })?;
        }
        Ok(())
    }

    async fn accept_loop(self, listener: std::net::TcpListener) {
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "the gateway cannot serve its listener");
                return;
            }
        };
        loop {
            match listener.accept().await {
                Ok((s, _)) => self.clone().serve_conn(s, Entry::Host, None),
                Err(e) => {
                    tracing::warn!(error = %e, "gateway accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Accepts on a listener inside a sandbox until the sandbox goes.
    async fn serve_in_sandbox(self, l: InSandboxListener) {
        let InSandboxListener {
            id,
            listener,
            mut gone,
        } = l;
        tracing::debug!(%id, "serving the gateway inside the sandbox");
        let Ok(listener) = TcpListener::from_std(listener) else {
            return;
        };
        loop {
            tokio::select! {
                a = listener.accept() => match a {
                    Ok((s, _)) => self.clone().serve_conn(s, Entry::InSandbox, Some(gone.clone())),
                    Err(_) => break,
                },
                _ = gone.changed() => break,
            }
        }
    }

    fn serve_conn(self, stream: TcpStream, entry: Entry, gone: Option<watch::Receiver<()>>) {
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let mut b = auto::Builder::new(TokioExecutor::new());
            b.http1().max_buf_size(MAX_HEADER_BYTES.max(8192));
            b.http2().max_header_list_size(MAX_HEADER_BYTES as u32);
            // The client connection's own upstream connections: dropped
            // with it, which closes them.
            let conns = Upstreams::default();
            let svc = hyper::service::service_fn(move |req| {
                let (gw, entry, conns) = (self.clone(), entry.clone(), conns.clone());
                async move { Ok::<_, Infallible>(gw.handle(req, &entry, &conns).await) }
            });
            let conn = b.serve_connection_with_upgrades(TokioIo::new(stream), svc);
            match gone {
                None => {
                    let _ = conn.await;
                }
                Some(mut gone) => {
                    tokio::select! {
                        _ = conn => {}
                        _ = gone.changed() => {}
                    }
                }
            }
        });
    }

    async fn handle(
        &self,
        mut req: Request<Incoming>,
        entry: &Entry,
        conns: &Upstreams,
    ) -> Response<GatewayBody> {
        let host = parse::request_host(req.headers(), req.uri());
        let target = match parse::target(req.headers(), host.as_deref(), &self.inner.domain) {
            Ok(t) => t,
            Err(ParseError::Malformed(m)) => return error(ErrorCode::InvalidArgument, m),
            Err(e @ ParseError::NoTarget { .. }) => {
                return error(ErrorCode::NotFound, e.to_string())
            }
        };
        let Some(api) = self.inner.api.gateway() else {
            return error(ErrorCode::NotFound, "this daemon has no gateway");
        };
        match target {
            Target::Preview { id, port } => {
                if let Entry::InSandbox = entry {
                    return error(
                        ErrorCode::NotFound,
                        "the gateway inside a sandbox routes services only; name one with X-Mayfly-Service or Host <service>.<domain>",
                    );
                }
                let token = parse::token(req.headers(), req.uri());
                if let Err(e) = api.preview(&id, port, token.as_ref().map(|t| t.0.as_str())) {
                    return engine_error(e);
                }
                let from_query = token.as_ref().is_some_and(|t| t.1);
                let pq = if from_query {
                    match parse::strip_token_param(req.uri()).parse() {
                        Ok(pq) => pq,
                        Err(_) => return bad_target(),
                    }
                } else {
                    path_and_query(req.uri())
                };
                let h = req.headers_mut();
                for name in [
                    parse::TOKEN_HEADER,
                    parse::PORT_HEADER,
                    parse::SANDBOX_HEADER,
                ] {
                    h.remove(name);
                }
                if let Some(c) = h.get(COOKIE).and_then(|v| v.to_str().ok()) {
                    match parse::strip_token_cookie(c).and_then(|c| HeaderValue::from_str(&c).ok())
                    {
                        Some(v) => {
                            h.insert(COOKIE, v);
                        }
                        None => {
                            h.remove(COOKIE);
                        }
                    }
                }
                let to = Upstream::Sandbox { id: &id, port };
                let mut resp = forward(api, conns, req, to, pq).await;
                if let (true, Some((t, _))) = (from_query, token) {
                    let cookie =
                        format!("{}={t}; Path=/; HttpOnly; SameSite=Lax", parse::TOKEN_PARAM);
                    if let Ok(v) = HeaderValue::from_str(&cookie) {
                        resp.headers_mut().append(SET_COOKIE, v);
                    }
                }
                resp
            }
            Target::Service(name) => {
                let key = parse::routing_key(req.headers());
                let pq = path_and_query(req.uri());
                match api.route(&name, key.as_ref()) {
                    Ok(RouteTarget::Sandbox { id, port }) => {
                        let to = Upstream::Sandbox { id: &id, port };
                        forward(api, conns, req, to, pq).await
                    }
                    Ok(RouteTarget::Baseline(u)) => {
                        let pq = if u.prefix.is_empty() {
                            Ok(pq)
                        } else {
                            format!("{}{pq}", u.prefix).parse()
                        };
                        let Ok(pq) = pq else {
                            return bad_target();
                        };
                        let to = Upstream::Baseline {
                            host: &u.host,
                            port: u.port,
                        };
                        forward(api, conns, req, to, pq).await
                    }
                    Err(e) => engine_error(e),
                }
            }
        }
    }
}

fn path_and_query(uri: &http::Uri) -> PathAndQuery {
    uri.path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"))
}

fn bad_target() -> Response<GatewayBody> {
    error(
        ErrorCode::InvalidArgument,
        "the request target is not a valid path",
    )
}
