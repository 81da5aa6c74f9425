//! What the resolver and the proxy share: each attached sandbox's policy,
//! the names handed out to it, its connection count and bandwidth bucket.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use mayfly_types::{EgressPolicy, SandboxId};

use super::EgressConfig;

/// Addresses remembered per sandbox: enough for any build, bounded so a
/// sandbox cannot grow the daemon without limit.
const MAX_HANDED_OUT: usize = 4096;
/// How long the host's address list is trusted before it is read again.
const HOST_ADDRS_TTL: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One sandbox's live egress state.
pub struct Attached {
    pub id: SandboxId,
    pub addr: Ipv4Addr,
    policy: RwLock<Arc<EgressPolicy>>,
    conns: AtomicU32,
    /// Address → the names the resolver handed it out for.
    handed: Mutex<HashMap<IpAddr, Vec<String>>>,
    bucket: Mutex<Bucket>,
    /// Bumped by every policy change, so open connections re-check.
    changes: tokio::sync::watch::Sender<u64>,
}

/// A token bucket of bytes, one second deep.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Holds one of a sandbox's connection places until dropped.
pub struct ConnSlot(Arc<Attached>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.conns.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Attached {
    pub fn policy(&self) -> Arc<EgressPolicy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the policy: connections opened from now on follow it, and
    /// open ones it no longer admits are cut (see [`Attached::changes`]).
    pub fn set_policy(&self, p: EgressPolicy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(p);
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wakes on every policy change.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Takes a connection place, if the cap allows one more.
    pub fn try_connect(self: &Arc<Self>) -> Option<ConnSlot> {
        let cap = self.policy().connection_cap();
        let mut n = self.conns.load(Ordering::Acquire);
        loop {
            if n >= cap {
                return None;
            }
            match self
                .conns
                .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(ConnSlot(self.clone())),
                Err(now) => n = now,
            }
        }
    }

    pub fn remember(&self, ip: IpAddr, name: &str) {
        let mut h = lock(&self.handed);
        if h.len() >= MAX_HANDED_OUT && !h.contains_key(&ip) {
            return;
        }
        let names = h.entry(ip).or_default();
        if !names.iter().any(|n| n == name) && names.len() < 16 {
            names.push(name.to_owned());
        }
    }

    pub fn names_for(&self, ip: IpAddr) -> Vec<String> {
        lock(&self.handed).get(&ip).cloned().unwrap_or_default()
    }

    /// How long to wait before `bytes` more may pass under the bandwidth
    /// cap (zero without one). The bucket holds one second of bytes.
    pub fn charge(&self, bytes: usize) -> Duration {
        let Some(rate) = self.policy().bandwidth_bytes_per_sec else {
            return Duration::ZERO;
        };
        let rate = rate as f64;
        let mut b = lock(&self.bucket);
        let now = Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(rate);
        b.at = now;
        b.tokens -= bytes as f64;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / rate)
        }
    }
}

/// The daemon's egress state.
pub struct Shared {
    pub cfg: EgressConfig,
    by_addr: RwLock<HashMap<Ipv4Addr, Arc<Attached>>>,
    host_addrs: Mutex<(Option<Instant>, Arc<Vec<IpAddr>>)>,
    pub pool: super::netpool::Pool,
}

impl Shared {
    pub fn new(cfg: EgressConfig) -> Shared {
        Shared {
            cfg,
            by_addr: RwLock::new(HashMap::new()),
            host_addrs: Mutex::new((None, Arc::new(Vec::new()))),
            pool: super::netpool::Pool::default(),
        }
    }

    pub fn attach(&self, id: &SandboxId, addr: Ipv4Addr, policy: EgressPolicy) -> Arc<Attached> {
        let rate = policy.bandwidth_bytes_per_sec.unwrap_or(0) as f64;
        let a = Arc::new(Attached {
            id: id.clone(),
            addr,
            policy: RwLock::new(Arc::new(policy)),
            conns: AtomicU32::new(0),
            handed: Mutex::new(HashMap::new()),
            bucket: Mutex::new(Bucket {
                tokens: rate,
                at: Instant::now(),
            }),
            changes: tokio::sync::watch::Sender::new(0),
        });
        self.by_addr
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, a.clone());
        a
    }

    pub fn detach(&self, addr: Ipv4Addr) {
        self.by_addr
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&addr);
    }

    pub fn get(&self, addr: Ipv4Addr) -> Option<Arc<Attached>> {
        self.by_addr
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
    }

    /// Every address of the host, read at most once a second.
    pub fn host_addrs(&self) -> Arc<Vec<IpAddr>> {
        let mut g = lock(&self.host_addrs);
        if g.0.is_none_or(|at| at.elapsed() > HOST_ADDRS_TTL) {
            *g = (
                Some(Instant::now()),
                Arc::new(mayfly_sys::veth::host_addresses()),
            );
        }
        g.1.clone()
    }
}
