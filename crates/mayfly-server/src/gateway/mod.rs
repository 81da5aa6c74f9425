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
//!
//! Whatever a request addresses, the gateway's own token never goes on
//! with it (header, cookie or query parameter), and every request it
//! forwards carries its hop count (`X-Mayfly-Hops`), so a loop is cut.

pub mod body;
pub mod parse;
pub mod proxy;
pub mod token;
pub mod upstream;

use std::sync::Arc;

use http::header::{HeaderValue, SET_COOKIE};
use http::uri::PathAndQuery;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use mayfly_engine::{EngineError, InSandboxListener, PreviewAccess, RouteTarget, SandboxApi};
use mayfly_types::ErrorCode;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::conn::{self, Limits, OnStop, Slot, Slots, Timeouts};
use parse::{ParseError, Target};
use proxy::{error, forward, redirect, GatewayBody};
use token::Source;
use upstream::{Upstream, Upstreams};

/// The default gateway listener.
pub const DEFAULT_GATEWAY_ADDR: &str = "127.0.0.1:4180";
/// The default gateway domain: `*.localhost` resolves to loopback in
/// browsers and curl without any DNS set-up.
pub const DEFAULT_GATEWAY_DOMAIN: &str = "localhost";

/// The gateway: cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    api: Arc<dyn SandboxApi>,
    domain: String,
    timeouts: Timeouts,
    /// The host listener's places, shared by every gateway thread.
    host: Slots,
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

fn parse_error(e: ParseError) -> Response<GatewayBody> {
    match e {
        ParseError::Malformed(m) => error(ErrorCode::InvalidArgument, m),
        e @ ParseError::NoTarget { .. } => error(ErrorCode::NotFound, e.to_string()),
    }
}

impl Gateway {
    /// A gateway over `api` answering for `*.<domain>`.
    pub fn new(api: Arc<dyn SandboxApi>, domain: &str) -> Gateway {
        Gateway::with_options(api, domain, Timeouts::default(), Limits::HOST)
    }

    /// [`Gateway::new`] with the client connections' deadlines and the
    /// host listener's limits.
    pub fn with_options(
        api: Arc<dyn SandboxApi>,
        domain: &str,
        timeouts: Timeouts,
        host: Limits,
    ) -> Gateway {
        Gateway::with_slots(api, domain, timeouts, Slots::new(host))
    }

    fn with_slots(
        api: Arc<dyn SandboxApi>,
        domain: &str,
        timeouts: Timeouts,
        host: Slots,
    ) -> Gateway {
        Gateway {
            inner: Arc::new(Inner {
                api,
                domain: domain.trim_matches('.').to_ascii_lowercase(),
                timeouts,
                host,
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
            let (timeouts, host) = (self.inner.timeouts, self.inner.host.clone());
            let inside = if i == 0 { inside.take() } else { None };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("mayfly-gateway-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        // Each thread its own: no reference count shared
                        // between threads on the per-request path.
                        let gw = Gateway::with_slots(api, &domain, timeouts, host.clone());
                        if let Some(mut inside) = inside {
                            let gw = gw.clone();
                            tokio::spawn(async move {
                                while let Some(l) = inside.recv().await {
                                    tokio::spawn(gw.clone().serve_in_sandbox(l));
                                }
                            });
                        }
                        let l = match TcpListener::from_std(l) {
                            Ok(l) => l,
                            Err(e) => {
                                tracing::error!(error = %e, "the gateway cannot serve its listener");
                                return;
                            }
                        };
                        conn::accept_loop(l, &host, None, |s, slot| {
                            gw.clone().serve_conn(s, slot, &host, Entry::Host, None)
                        })
                        .await;
                    })
                })?;
        }
        Ok(())
    }

    /// Accepts on a listener inside a sandbox until the sandbox goes.
    async fn serve_in_sandbox(self, l: InSandboxListener) {
        let InSandboxListener { id, listener, gone } = l;
        tracing::debug!(%id, "serving the gateway inside the sandbox");
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(%id, error = %e, "the gateway cannot serve the listener inside the sandbox");
                return;
            }
        };
        let conn_gone = gone.clone();
        // The sandbox's own places: its code cannot take the host's.
        let slots = Slots::new(Limits::IN_SANDBOX);
        conn::accept_loop(listener, &slots, Some(gone), |s, slot| {
            self.clone()
                .serve_conn(s, slot, &slots, Entry::InSandbox, Some(conn_gone.clone()))
        })
        .await;
    }

    fn serve_conn(
        self,
        stream: TcpStream,
        slot: Slot,
        slots: &Slots,
        entry: Entry,
        gone: Option<watch::Receiver<()>>,
    ) {
        // The client connection's own upstream connections: dropped with
        // it, which closes them.
        let conns = Upstreams::new(slots);
        let timeouts = self.inner.timeouts;
        let stop = gone.map(|g| (g, OnStop::Cut));
        conn::serve(stream, slot, timeouts, stop, move |req| {
            let (gw, entry, conns) = (self.clone(), entry.clone(), conns.clone());
            async move { gw.handle(req, &entry, &conns).await }
        });
    }

    async fn handle(
        &self,
        mut req: Request<Incoming>,
        entry: &Entry,
        conns: &Upstreams,
    ) -> Response<GatewayBody> {
        // First, before any lookup: a request in a loop costs nothing more.
        let hops = match parse::hops(req.headers()) {
            Ok(n) => n,
            Err(e) => return parse_error(e),
        };
        if hops >= parse::MAX_HOPS {
            return error(
                ErrorCode::LoopDetected,
                format!(
                    "the request has passed through the gateway {hops} times ({}): it is routed in a loop",
                    parse::HOPS_HEADER
                ),
            );
        }
        req.headers_mut()
            .insert(parse::HOPS_HEADER, HeaderValue::from(hops + 1));
        let host = parse::request_host(req.headers(), req.uri());
        let target = match parse::target(req.headers(), host.as_deref(), &self.inner.domain) {
            Ok(t) => t,
            Err(e) => return parse_error(e),
        };
        let Some(api) = self.inner.api.gateway() else {
            return error(ErrorCode::NotFound, "this daemon has no gateway");
        };
        // The gateway's token goes no further, wherever the request goes
        // (it is read for previews only, before it is taken off).
        let presented = match target {
            Target::Preview { .. } => token::presented(req.headers(), req.uri()),
            Target::Service(_) => None,
        };
        let query_token = token::has_query_token(req.uri());
        let pq = if query_token {
            match token::without_token_param(req.uri()).parse() {
                Ok(pq) => pq,
                Err(_) => return bad_target(),
            }
        } else {
            path_and_query(req.uri())
        };
        token::strip_headers(req.headers_mut());
        match target {
            Target::Preview { id, port } => {
                if let Entry::InSandbox = entry {
                    return error(
                        ErrorCode::NotFound,
                        "the gateway inside a sandbox routes services only; name one with X-Mayfly-Service or Host <service>.<domain>",
                    );
                }
                let offered = presented.as_ref().map(|p| p.token.as_str());
                let access = match api.preview(&id, port, offered) {
                    Ok(a) => a,
                    Err(e) => return engine_error(e),
                };
                // The cookie only for the token verified, from the query.
                let cookie = match (&presented, access) {
                    (Some(p), PreviewAccess::Token) if p.source == Source::Query => {
                        token::set_cookie(&p.token)
                    }
                    _ => None,
                };
                // A browser is sent on to the URL without the token, so the
                // page never sees it (location.href, Referer).
                // (Not an upgrade: a WebSocket client follows no redirect.)
                let navigation = matches!(*req.method(), Method::GET | Method::HEAD)
                    && proxy::upgrade_of(req.headers()).is_none();
                if query_token && navigation {
                    return redirect(pq.as_str(), cookie);
                }
                let h = req.headers_mut();
                h.remove(parse::PORT_HEADER);
                h.remove(parse::SANDBOX_HEADER);
                let to = Upstream::Sandbox { id: &id, port };
                let mut resp = forward(api, conns, req, to, pq).await;
                if let Some(c) = cookie {
                    resp.headers_mut().append(SET_COOKIE, c);
                }
                resp
            }
            Target::Service(name) => {
                let key = parse::routing_key(req.headers());
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
