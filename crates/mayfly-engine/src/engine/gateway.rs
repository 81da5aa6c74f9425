//! [`GatewayApi`] for [`Engine`]: each sandbox's gateway state (token,
//! exposed ports, overrides, its network namespace) in one map, and the
//! routes in another, both read without a store query per request.
//!
//! A sandbox's entry is made at its first gateway use and removed when its
//! destroy begins ([`Engine::gateway_forget`]), which closes the namespace
//! descriptor and, through `gone`, the listener inside the sandbox.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use mayfly_store::constant_time_eq;
use mayfly_sys::netns::NetNs;
use mayfly_types::{
    check_service_name, BaselineUrl, PortInfo, RouteInfo, SandboxId, SandboxPorts, ServiceOverride,
};
use tokio::sync::{mpsc, watch};

use super::sandbox::Sandbox;
use super::Engine;
use crate::gateway::{
    GatewayApi, GatewayError, InSandboxListener, PreviewAccess, RouteTarget,
    IN_SANDBOX_GATEWAY_PORT,
};
use crate::EngineError;

/// Bytes of randomness in a sandbox's gateway token (hex-encoded).
const TOKEN_BYTES: usize = 24;

/// The engine's gateway state.
#[derive(Default)]
pub(crate) struct GatewayState {
    sandboxes: RwLock<HashMap<SandboxId, Arc<SandboxGate>>>,
    /// `None` until loaded from the store at the first use.
    routes: RwLock<Option<HashMap<String, Arc<BaselineUrl>>>>,
    /// Where listeners opened inside sandboxes go; `None` while no gateway
    /// serves them.
    listeners: Mutex<Option<mpsc::UnboundedSender<InSandboxListener>>>,
}

/// One sandbox's gateway state.
struct SandboxGate {
    sb: Arc<Sandbox>,
    token: String,
    netns: Mutex<Option<Arc<NetNs>>>,
    ports: RwLock<Ports>,
    /// Dropped with the entry: ends the sandbox's in-sandbox listener.
    _gone: watch::Sender<()>,
    gone_rx: watch::Receiver<()>,
}

#[derive(Default)]
struct Ports {
    /// Exposed port → public.
    exposed: BTreeMap<u16, bool>,
    /// Service → port.
    overrides: BTreeMap<String, u16>,
    /// Whether the in-sandbox listener was opened.
    listening: bool,
}

fn new_token() -> Result<String, EngineError> {
    let mut b = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut b).map_err(|e| EngineError::Internal(format!("getrandom: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn unreachable(id: &SandboxId, port: u16, reason: impl ToString) -> EngineError {
    GatewayError::SandboxUnreachable {
        id: id.clone(),
        port,
        reason: reason.to_string(),
    }
    .into()
}

/// Refuses the port the gateway itself listens on inside sandboxes: a
/// request forwarded there would come straight back into the gateway.
fn not_reserved(id: &SandboxId, port: u16) -> Result<(), EngineError> {
    if port == IN_SANDBOX_GATEWAY_PORT {
        return Err(GatewayError::ReservedPort {
            id: id.clone(),
            port,
        }
        .into());
    }
    Ok(())
}

impl Engine {
    fn gw(&self) -> &GatewayState {
        &self.inner.gateway
    }

    /// The gateway entry of a live, claimed sandbox, made at its first use.
    /// Not activity by itself: the caller touches the sandbox once the
    /// request is authorised ([`Engine::active_gate`] for API callers).
    fn gate(&self, id: &SandboxId) -> Result<Arc<SandboxGate>, EngineError> {
        if let Some(g) = self
            .gw()
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
        {
            return Ok(g.clone());
        }
        let sb = self.lookup_claimed(id)?;
        let token = new_token()?;
        let (tx, rx) = watch::channel(());
        let gate = {
            let mut map = self
                .gw()
                .sandboxes
                .write()
                .unwrap_or_else(|p| p.into_inner());
            map.entry(id.clone())
                .or_insert_with(|| {
                    Arc::new(SandboxGate {
                        sb: sb.clone(),
                        token,
                        netns: Mutex::new(None),
                        ports: RwLock::new(Ports::default()),
                        _gone: tx,
                        gone_rx: rx,
                    })
                })
                .clone()
        };
        // A destroy that began meanwhile has forgotten the sandbox already,
        // or will after this; either way the entry must not stay.
        if sb.is_stopping() {
            self.gateway_forget(id);
            return Err(EngineError::NoSuchSandbox(id.clone()));
        }
        Ok(gate)
    }

    /// [`Engine::gate`] for a caller already authorised (an API key, or a
    /// gateway request let through): counts as activity.
    fn active_gate(&self, id: &SandboxId) -> Result<Arc<SandboxGate>, EngineError> {
        let gate = self.gate(id)?;
        gate.sb.touch();
        Ok(gate)
    }

    /// Drops a sandbox's gateway state: its namespace descriptor, its
    /// overrides, and (through the watch) its in-sandbox listener. Called
    /// when its destroy begins.
    pub(crate) fn gateway_forget(&self, id: &SandboxId) {
        self.gw()
            .sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    fn netns_of(&self, gate: &SandboxGate) -> Result<Arc<NetNs>, EngineError> {
        let mut slot = gate.netns.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ns) = &*slot {
            return Ok(ns.clone());
        }
        use std::os::fd::AsFd;
        let ns = NetNs::of_pidfd(gate.sb.pidfd.get_ref().as_fd(), gate.sb.init_pid)
            .map_err(|e| unreachable(&gate.sb.id, 0, e))?;
        let ns = Arc::new(ns);
        *slot = Some(ns.clone());
        Ok(ns)
    }

    fn load_routes(&self) -> Result<(), EngineError> {
        if self
            .gw()
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return Ok(());
        }
        let mut map = HashMap::new();
        for (name, url) in self.inner.store.routes()? {
            match BaselineUrl::parse(&url) {
                Ok(u) => {
                    map.insert(name, Arc::new(u));
                }
                Err(e) => tracing::warn!(route = %name, error = %e, "ignoring a stored route"),
            }
        }
        let mut slot = self.gw().routes.write().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(map);
        }
        Ok(())
    }

    /// Changes the in-memory routes (loaded first by the caller).
    fn edit_routes(&self, f: impl FnOnce(&mut HashMap<String, Arc<BaselineUrl>>)) {
        let mut routes = self.gw().routes.write().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = routes.as_mut() {
            f(r);
        }
    }

    /// Opens the sandbox's in-sandbox gateway listener once, if a gateway
    /// serves such listeners.
    async fn ensure_listener(&self, gate: &Arc<SandboxGate>) -> Result<(), EngineError> {
        let Some(tx) = self
            .gw()
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return Ok(());
        };
        {
            let mut ports = gate.ports.write().unwrap_or_else(|p| p.into_inner());
            if ports.listening {
                return Ok(());
            }
            ports.listening = true;
        }
        let ns = self.netns_of(gate)?;
        let id = gate.sb.id.clone();
        let port = IN_SANDBOX_GATEWAY_PORT;
        let fd = tokio::task::spawn_blocking(move || ns.tcp_socket())
            .await
            .map_err(|e| EngineError::Internal(format!("joining the socket maker: {e}")))?
            .map_err(|e| unreachable(&id, port, e))?;
        let listener = (|| {
            let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
            sock.set_reuseaddr(true)?;
            sock.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
            sock.listen(1024)?.into_std()
        })()
        .map_err(|e| {
            gate.ports
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .listening = false;
            unreachable(
                &id,
                port,
                format!("listening on 127.0.0.1:{port} inside: {e}"),
            )
        })?;
        let _ = tx.send(InSandboxListener {
            id,
            listener,
            gone: gate.gone_rx.clone(),
        });
        Ok(())
    }
}

#[async_trait]
impl GatewayApi for Engine {
    fn preview(
        &self,
        id: &SandboxId,
        port: u16,
        token: Option<&str>,
    ) -> Result<PreviewAccess, EngineError> {
        not_reserved(id, port)?;
        let gate = self.gate(id)?;
        let access = match token {
            Some(t) if constant_time_eq(t.as_bytes(), gate.token.as_bytes()) => {
                PreviewAccess::Token
            }
            _ => {
                let public = gate
                    .ports
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .exposed
                    .get(&port)
                    .copied()
                    .unwrap_or(false);
                match (public, token) {
                    (true, _) => PreviewAccess::Public,
                    (false, None) => {
                        return Err(GatewayError::TokenRequired {
                            id: id.clone(),
                            port,
                        }
                        .into())
                    }
                    (false, Some(_)) => {
                        return Err(GatewayError::BadToken { id: id.clone() }.into())
                    }
                }
            }
        };
        // Only now: a refused request must not keep the sandbox alive.
        gate.sb.touch();
        Ok(access)
    }

    fn route(&self, service: &str, key: Option<&SandboxId>) -> Result<RouteTarget, EngineError> {
        if let Some(id) = key {
            let gates = self
                .gw()
                .sandboxes
                .read()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(g) = gates.get(id) {
                let port = g
                    .ports
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .overrides
                    .get(service)
                    .copied();
                if let Some(port) = port {
                    g.sb.touch();
                    return Ok(RouteTarget::Sandbox {
                        id: id.clone(),
                        port,
                    });
                }
            }
        }
        self.load_routes()?;
        let routes = self.gw().routes.read().unwrap_or_else(|p| p.into_inner());
        match routes.as_ref().and_then(|r| r.get(service)) {
            Some(u) => Ok(RouteTarget::Baseline(u.clone())),
            None => Err(GatewayError::NoSuchRoute {
                service: service.to_owned(),
            }
            .into()),
        }
    }

    async fn connect(
        &self,
        id: &SandboxId,
        port: u16,
    ) -> Result<tokio::net::TcpStream, EngineError> {
        not_reserved(id, port)?;
        let gate = self.active_gate(id)?;
        let ns = self.netns_of(&gate)?;
        let fd = tokio::task::spawn_blocking(move || ns.tcp_socket())
            .await
            .map_err(|e| EngineError::Internal(format!("joining the socket maker: {e}")))?
            .map_err(|e| unreachable(id, port, e))?;
        let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
        let stream = sock
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
            .map_err(|e| unreachable(id, port, e))?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    fn activity(&self, id: &SandboxId) -> Option<crate::SandboxActivity> {
        self.gate(id)
            .ok()
            .map(|g| crate::SandboxActivity::of(&g.sb))
    }

    async fn ports(&self, id: &SandboxId) -> Result<SandboxPorts, EngineError> {
        let gate = self.active_gate(id)?;
        let p = gate.ports.read().unwrap_or_else(|p| p.into_inner());
        Ok(SandboxPorts {
            sandbox_id: id.to_string(),
            token: gate.token.clone(),
            ports: p
                .exposed
                .iter()
                .map(|(port, public)| PortInfo {
                    port: *port,
                    public: *public,
                    url: None,
                })
                .collect(),
            overrides: p
                .overrides
                .iter()
                .map(|(s, port)| ServiceOverride {
                    service: s.clone(),
                    port: *port,
                })
                .collect(),
        })
    }

    async fn expose(
        &self,
        id: &SandboxId,
        port: u16,
        public: bool,
    ) -> Result<PortInfo, EngineError> {
        not_reserved(id, port)?;
        let gate = self.active_gate(id)?;
        gate.ports
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .exposed
            .insert(port, public);
        Ok(PortInfo {
            port,
            public,
            url: None,
        })
    }

    async fn unexpose(&self, id: &SandboxId, port: u16) -> Result<(), EngineError> {
        let gate = self.active_gate(id)?;
        gate.ports
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .exposed
            .remove(&port);
        Ok(())
    }

    async fn set_override(
        &self,
        id: &SandboxId,
        service: &str,
        port: u16,
    ) -> Result<ServiceOverride, EngineError> {
        check_service_name(service).map_err(|e| EngineError::Invalid(e.to_string()))?;
        not_reserved(id, port)?;
        let gate = self.active_gate(id)?;
        gate.ports
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .overrides
            .insert(service.to_owned(), port);
        // The override holds either way: without the listener (its port
        // taken inside the sandbox, say) only chains from inside miss out.
        if let Err(e) = self.ensure_listener(&gate).await {
            tracing::warn!(%id, error = %e, "no gateway listener inside the sandbox");
        }
        Ok(ServiceOverride {
            service: service.to_owned(),
            port,
        })
    }

    async fn remove_override(&self, id: &SandboxId, service: &str) -> Result<(), EngineError> {
        check_service_name(service).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.active_gate(id)?
            .ports
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .overrides
            .remove(service);
        Ok(())
    }

    async fn routes(&self) -> Result<Vec<RouteInfo>, EngineError> {
        Ok(self
            .inner
            .store
            .routes()?
            .into_iter()
            .map(|(name, url)| RouteInfo { name, url })
            .collect())
    }

    async fn put_route(&self, name: &str, url: &str) -> Result<RouteInfo, EngineError> {
        check_service_name(name).map_err(|e| EngineError::Invalid(e.to_string()))?;
        let parsed = BaselineUrl::parse(url).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.load_routes()?;
        self.inner.store.put_route(name, url)?;
        self.edit_routes(|r| {
            r.insert(name.to_owned(), Arc::new(parsed));
        });
        Ok(RouteInfo {
            name: name.to_owned(),
            url: url.to_owned(),
        })
    }

    async fn delete_route(&self, name: &str) -> Result<(), EngineError> {
        check_service_name(name).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.load_routes()?;
        if !self.inner.store.delete_route(name)? {
            return Err(GatewayError::NoRouteToRemove {
                service: name.to_owned(),
            }
            .into());
        }
        self.edit_routes(|r| {
            r.remove(name);
        });
        Ok(())
    }

    fn in_sandbox_listeners(&self) -> mpsc::UnboundedReceiver<InSandboxListener> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self
            .gw()
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }
}
