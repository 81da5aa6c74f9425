//! Egress: what a sandbox may reach outside itself, enforced by the daemon.
//!
//! A sandbox whose policy is not `none` joins a network namespace prepared
//! ahead of time (`netpool`): a veth pair `mf-<tag>-<slot>` ↔ `eth0`, a /30
//! of `100.96.0.0/16`, a default route to the host side. One nftables table
//! per daemon (`plan::ruleset`) sends every DNS query to the daemon's
//! resolver and every TCP connection to its transparent proxy, and drops
//! the rest. The resolver answers allowed names only and remembers what it
//! handed out; the proxy checks each connection against the policy, the
//! addresses handed out, and the Host header or TLS SNI on 80/443, then
//! splices it to its destination, under the sandbox's connection and
//! bandwidth caps. Policies live here, in memory: a `PATCH` is a swap.

pub mod plan;
pub mod policy;

mod netpool;
mod peek;
mod proxy;
mod resolver;
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
            let lease = lease_table(&names, &lease_dir)?;
            reconcile(&names, &lease_dir)?;
            Ok::<_, EgressError>(lease)
        })
        .await
        .map_err(|e| EgressError::Unavailable(e.to_string()))??;
        let (proxy_listener, dns_socket, ports) = bind().await?;
        let doc = serde_json::to_string(&plan::ruleset(&cfg.names, ports))
            .map_err(|e| EgressError::Unavailable(e.to_string()))?;
        mayfly_sys::nft::apply_json(&doc)?;
        let shared = Arc::new(state::Shared::new(cfg));
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

/// Removes what an earlier run of this daemon left (its table, its links),
/// and the links of any daemon whose slot lease nobody holds any more.
fn reconcile(names: &plan::Names, lease_dir: &std::path::Path) -> Result<(), EgressError> {
    mayfly_sys::nft::delete_inet_table(&names.table())?;
    for link in mayfly_sys::veth::list_links("mf-")? {
        let Some(slot) = link.rsplit('-').next().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let ours = names.slot_of(&link).is_some();
        // A link of another live daemon has its slot leased; leave it.
        let lease = netpool::try_lease(lease_dir, slot).ok().flatten();
        if ours || lease.is_some() {
            tracing::info!(%link, "removing a network link left by a dead daemon");
            mayfly_sys::veth::delete_link(&link)?;
        }
    }
    sweep_foreign_tables(names, lease_dir)
}

/// Takes this daemon's table lease (`<lease dir>/table-<tag>`, `flock`ed
/// for the daemon's life). Another daemon's sweep holds it for a moment
/// while it looks, so a busy lease is retried for two seconds before the
/// answer is that a daemon of this tag is running.
fn lease_table(
    names: &plan::Names,
    lease_dir: &std::path::Path,
) -> Result<std::fs::File, EgressError> {
    let path = lease_dir.join(names.table_lease());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        if let Some(f) = lock(&path)? {
            return Ok(f);
        }
        if std::time::Instant::now() >= deadline {
            return Err(EgressError::Unavailable(format!(
                "{} is held by another daemon: one with this state directory (or one whose \
                 state directory has the same tag, {}) is running",
                path.display(),
                names.tag
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn lock(path: &std::path::Path) -> Result<Option<std::fs::File>, EgressError> {
    mayfly_sys::process::try_lock_file(path).map_err(|e| EgressError::Io {
        op: "locking a table lease",
        source: std::io::Error::other(e.to_string()),
    })
}

/// Removes the tables of daemons that are gone for good (killed, and their
/// state directory deleted or never served again), which nobody else would
/// ever remove: a table whose lease file exists, nobody holds, and none of
/// whose links is left. A table without a lease file has an owner this
/// daemon cannot judge, and is left alone.
fn sweep_foreign_tables(
    names: &plan::Names,
    lease_dir: &std::path::Path,
) -> Result<(), EgressError> {
    let tables = mayfly_sys::nft::inet_tables("mayfly-")?;
    let links = mayfly_sys::veth::list_links("mf-")?;
    for other in plan::foreign_tables(names, &tables, &links) {
        let path = lease_dir.join(other.table_lease());
        if !path.exists() {
            continue;
        }
        // Held while the table goes, so its daemon cannot start meanwhile.
        let Some(_gone) = lock(&path)? else {
            continue;
        };
        tracing::info!(table = %other.table(), "removing the table of a daemon that is gone");
        mayfly_sys::nft::delete_inet_table(&other.table())?;
    }
    Ok(())
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
