//! What the resolver and the proxy share: each attached sandbox's policy,
//! the names handed out to it, its connection count, bandwidth buckets and
//! DNS lookup places, and the signal that ends its connections at detach.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use mayfly_types::{EgressPolicy, SandboxId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::hostaddrs::HostAddrs;
use super::EgressConfig;

/// Addresses remembered per sandbox: enough for any build, bounded so a
/// sandbox cannot grow the daemon without limit.
const MAX_HANDED_OUT: usize = 4096;
/// Host lookups (`getaddrinfo`, each on a blocking thread) one sandbox may
/// have running at once.
pub const MAX_LOOKUPS_PER_SANDBOX: usize = 16;
/// Host lookups the whole daemon may have running at once: well under
/// tokio's blocking pool, so a flood of queries cannot starve the other
/// blocking work (files, the store) of threads.
pub const MAX_LOOKUPS: usize = 64;
/// How long a spliced connection may carry nothing either way.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long a connection one side of which has ended may carry nothing.
pub const HALF_CLOSED_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which way bytes go through the proxy. Each way has its own bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From the sandbox to the outside.
    Out,
    /// From the outside to the sandbox.
    In,
}

/// One sandbox's live egress state.
pub struct Attached {
    pub id: SandboxId,
    pub addr: Ipv4Addr,
    policy: RwLock<Arc<EgressPolicy>>,
    conns: AtomicU32,
    /// Address → the names the resolver handed it out for.
    handed: Mutex<HashMap<IpAddr, Vec<String>>>,
    /// The bandwidth cap's buckets, one per [`Way`].
    out: Mutex<Bucket>,
    back: Mutex<Bucket>,
    /// Places for host lookups ([`MAX_LOOKUPS_PER_SANDBOX`]).
    lookups: Arc<Semaphore>,
    /// Bumped by every policy change, so open connections re-check.
    changes: tokio::sync::watch::Sender<u64>,
    /// Set when the sandbox is detached: every connection of it ends.
    /// (Its proxy tasks hold this value, so its being dropped cannot be
    /// the signal.)
    closed: tokio::sync::watch::Sender<bool>,
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

/// A place for one host lookup, the sandbox's and the daemon's; held until
/// the lookup's blocking call returns (not merely until it times out).
pub struct LookupPermit {
    _own: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
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

    /// Wakes on every policy change. The version current now counts as
    /// seen: subscribe *before* reading the policy a decision is made on.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Ends every connection of this sandbox, open or being set up.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Resolves once [`Attached::close`] has been called.
    pub async fn closed(&self) {
        let mut rx = self.closed.subscribe();
        // The sender lives as long as `self`, so this only ends at close.
        let _ = rx.wait_for(|c| *c).await;
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

    /// How long to wait before `bytes` more may pass `way` under the
    /// bandwidth cap (zero without one). The cap holds each way on its own
    /// (an upload does not slow a download); each bucket holds one second
    /// of bytes.
    pub fn charge(&self, way: Way, bytes: usize) -> Duration {
        let Some(rate) = self.policy().bandwidth_bytes_per_sec else {
            return Duration::ZERO;
        };
        let rate = rate as f64;
        let mut b = lock(match way {
            Way::Out => &self.out,
            Way::In => &self.back,
        });
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

/// How long a spliced connection may stay silent before it is cut.
#[derive(Debug, Clone, Copy)]
pub struct IdleLimits {
    /// Nothing either way, both ways open.
    pub idle: Duration,
    /// Nothing either way once one side has ended its half.
    pub half_closed: Duration,
}

impl Default for IdleLimits {
    fn default() -> IdleLimits {
        IdleLimits {
            idle: IDLE_TIMEOUT,
            half_closed: HALF_CLOSED_IDLE_TIMEOUT,
        }
    }
}

/// The daemon's egress state.
pub struct Shared {
    pub cfg: EgressConfig,
    by_addr: RwLock<HashMap<Ipv4Addr, Arc<Attached>>>,
    host_addrs: HostAddrs,
    /// Places for host lookups, daemon-wide ([`MAX_LOOKUPS`]).
    lookups: Arc<Semaphore>,
    pub idle: IdleLimits,
    pub pool: super::netpool::Pool,
}

impl Shared {
    pub fn new(cfg: EgressConfig, host_addrs: HostAddrs) -> Shared {
        Shared {
            cfg,
            by_addr: RwLock::new(HashMap::new()),
            host_addrs,
            lookups: Arc::new(Semaphore::new(MAX_LOOKUPS)),
            idle: IdleLimits::default(),
            pool: super::netpool::Pool::default(),
        }
    }

    pub fn attach(&self, id: &SandboxId, addr: Ipv4Addr, policy: EgressPolicy) -> Arc<Attached> {
        let rate = policy.bandwidth_bytes_per_sec.unwrap_or(0) as f64;
        let bucket = || {
            Mutex::new(Bucket {
                tokens: rate,
                at: Instant::now(),
            })
        };
        let a = Arc::new(Attached {
            id: id.clone(),
            addr,
            policy: RwLock::new(Arc::new(policy)),
            conns: AtomicU32::new(0),
            handed: Mutex::new(HashMap::new()),
            out: bucket(),
            back: bucket(),
            lookups: Arc::new(Semaphore::new(MAX_LOOKUPS_PER_SANDBOX)),
            changes: tokio::sync::watch::Sender::new(0),
            closed: tokio::sync::watch::Sender::new(false),
        });
        let old = self
            .by_addr
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, a.clone());
        if let Some(old) = old {
            old.close();
        }
        a
    }

    /// Forgets the sandbox at `addr` and ends every connection it has.
    pub fn detach(&self, addr: Ipv4Addr) {
        let gone = self
            .by_addr
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&addr);
        if let Some(a) = gone {
            a.close();
        }
    }

    pub fn get(&self, addr: Ipv4Addr) -> Option<Arc<Attached>> {
        self.by_addr
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
    }

    /// Every address of the host, read at most once a second; `None` when
    /// they could never be read (then nothing is admitted).
    pub fn host_addrs(&self) -> Option<Arc<Vec<IpAddr>>> {
        self.host_addrs.get()
    }

    /// A place for one host lookup for `sandbox`, if both it and the
    /// daemon have one free.
    pub fn lookup_permit(&self, sandbox: &Attached) -> Option<LookupPermit> {
        let own = sandbox.lookups.clone().try_acquire_owned().ok()?;
        let all = self.lookups.clone().try_acquire_owned().ok()?;
        Some(LookupPermit {
            _own: own,
            _all: all,
        })
    }
}

#[cfg(test)]
impl Shared {
    /// A daemon's state with no kernel objects behind it, for unit tests:
    /// `host` are the host's addresses.
    pub fn for_tests(host: Vec<IpAddr>) -> Shared {
        let cfg = EgressConfig {
            names: super::plan::Names { tag: "7e57".into() },
            lease_dir: std::path::PathBuf::from("/nonexistent"),
            pool_target: 0,
            static_hosts: HashMap::new(),
        };
        let read: super::hostaddrs::ReadAddrs = Box::new(move || Ok(host.clone()));
        Shared::new(cfg, HostAddrs::new(read, Duration::from_secs(3600)))
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
