//! Egress: what a sandbox may reach outside itself, enforced by the daemon.
//!
//! A sandbox whose policy is not `none` joins a network namespace prepared
//! ahead of time (`netpool`): a veth pair `mf-<tag>-<slot>` ↔ `eth0`, a /30
//! of `100.96.0.0/16`, a default route to the host side. One nftables table
//! per daemon (`plan::ruleset`) sends every DNS query to the daemon's
//! resolver and every TCP connection to its transparent proxy, and drops
//! the rest. The resolver answers allowed names only and remembers what it
//! handed out; the proxy checks each connection against the policy, the
//! addresses handed out, and the TLS SNI on 443 or every request's Host on
//! 80, then splices it to its destination (`splice`), under the sandbox's
//! connection and bandwidth caps, until it ends, is revoked by a `PATCH`,
//! goes idle, or its sandbox is detached. Policies live here, in memory: a
//! `PATCH` is a swap.

pub mod plan;
pub mod policy;

mod hostaddrs;
mod http1;
mod netpool;
mod peek;
mod proxy;
mod reconcile;
mod resolver;
mod splice;
mod state;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;

pub use netpool::Prepared;
pub use state::Attached;

/// How the daemon runs egress.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Names the daemon's links and table.
    pub names: plan::Names,
    /// Host-wide leases of network slots (`slot-<n>` files, `flock`ed).
    pub lease_dir: PathBuf,
    /// Prepared namespaces kept ready.
    pub pool_target: usize,
    /// Names answered from this table before the host's resolver (tests
    /// and air-gapped hosts): `name → addresses`.
    pub static_hosts: HashMap<String, Vec<Ipv4Addr>>,
}

/// An egress failure.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress is unavailable on this daemon: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Nft(#[from] mayfly_sys::nft::NftError),
    #[error(transparent)]
    Veth(#[from] mayfly_sys::veth::VethError),
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("all {0} network slots are in use")]
    Exhausted(u32),
}

/// The daemon's egress service. Cheap to clone.
#[derive(Clone)]
pub struct Egress {
    shared: Arc<state::Shared>,
    /// Says to other daemons that this one lives and guards its table.
    _table_lease: Arc<std::fs::File>,
}

impl Egress {
    /// Reconciles what an earlier run left, applies the ruleset, and starts
    /// the resolver, the proxy and the namespace pool. Needs a runtime.
    pub async fn start(cfg: EgressConfig) -> Result<Egress, EgressError> {
        mayfly_sys::nft::find()?;
        let lease_dir = cfg.lease_dir.clone();
        std::fs::create_dir_all(&lease_dir).map_err(|source| EgressError::Io {
            op: "creating the network slot lease directory",
            source,
        })?;
        let names = cfg.names.clone();
        let table_lease = tokio::task::spawn_blocking(move || {
            let lease = reconcile::lease_table(&names, &lease_dir)?;
            reconcile::reconcile(&reconcile::System, &names, &lease_dir)?;
            Ok::<_, EgressError>(lease)
        })
        .await
        .map_err(|e| EgressError::Unavailable(e.to_string()))??;
        let (proxy_listener, dns_socket, ports) = bind().await?;
        let doc = serde_json::to_string(&plan::ruleset(&cfg.names, ports))
            .map_err(|e| EgressError::Unavailable(e.to_string()))?;
        // One transaction: the table made if missing, deleted and made
        // again, so a table left by an earlier run guards its links until
        // this one replaces it.
        mayfly_sys::nft::apply_json(&doc)?;
        let shared = Arc::new(state::Shared::new(cfg, hostaddrs::HostAddrs::system()));
        tokio::spawn(proxy::serve(shared.clone(), proxy_listener));
        tokio::spawn(resolver::serve(shared.clone(), dns_socket));
        netpool::start(shared.clone());
        Ok(Egress {
            shared,
            _table_lease: Arc::new(table_lease),
        })
    }

    /// Takes a prepared namespace for a new sandbox (made now if none is
    /// ready), and registers `policy` for its address.
    pub async fn attach(
        &self,
        id: &mayfly_types::SandboxId,
        policy: mayfly_types::EgressPolicy,
    ) -> Result<(Prepared, Arc<Attached>), EgressError> {
        let prepared = netpool::take(&self.shared).await?;
        let attached = self.shared.attach(id, prepared.plan.sandbox_addr, policy);
        Ok((prepared, attached))
    }

    /// Forgets a sandbox's address and removes its link (on a blocking
    /// thread: the removal waits for the kernel).
    pub async fn detach(&self, prepared: Prepared) {
        self.shared.detach(prepared.plan.sandbox_addr);
        let _ = tokio::task::spawn_blocking(move || netpool::remove(prepared)).await;
    }

    /// Removes this daemon's table and every link it holds; at shutdown.
    pub fn stop(&self) {
        netpool::drain(&self.shared);
        let _ = mayfly_sys::nft::delete_inet_table(&self.shared.cfg.names.table());
    }
}

async fn bind() -> Result<(tokio::net::TcpListener, tokio::net::UdpSocket, plan::Ports), EgressError>
{
    let io = |op| move |source| EgressError::Io { op, source };
    // Bound on every address: the rules redirect to the address of the
    // interface a packet came in on (each sandbox's host side). Only
    // sandbox addresses are served; the input chain admits only
    // redirected packets from sandbox links.
    let any = std::net::SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let tcp = tokio::net::TcpListener::bind(any)
        .await
        .map_err(io("binding the egress proxy"))?;
    let udp = tokio::net::UdpSocket::bind(any)
        .await
        .map_err(io("binding the resolver"))?;
    let ports = plan::Ports {
        proxy: tcp.local_addr().map_err(io("egress proxy address"))?.port(),
        dns: udp.local_addr().map_err(io("resolver address"))?.port(),
    };
    Ok((tcp, udp, ports))
}

/// The address a connection's peer has, when it is a sandbox's.
fn sandbox_of(peer: std::net::SocketAddr) -> Option<Ipv4Addr> {
    match peer.ip() {
        IpAddr::V4(a) => plan::slot_of_sandbox(a).map(|_| a),
        IpAddr::V6(a) => a
            .to_ipv4_mapped()
            .filter(|a| plan::slot_of_sandbox(*a).is_some()),
    }
}
