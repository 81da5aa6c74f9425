//! Network namespaces prepared ahead of creates.
//!
//! Making a namespace, a veth pair, two addresses, a route and bringing
//! both ends up costs milliseconds and serialises on the kernel's RTNL
//! lock, so it is done here, in the background, and a create only takes a
//! ready one. A prepared namespace is held by nothing but its descriptor
//! here: should the daemon die, the kernel frees it, and its veth pair with
//! it.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mayfly_sys::veth::VethPlan;

use super::plan::{veth_plan, MAX_NET_SLOTS};
use super::state::Shared;
use super::EgressError;

/// One ready namespace: its slot's lease, its wiring, its descriptor.
#[derive(Debug)]
pub struct Prepared {
    pub slot: u32,
    pub plan: VethPlan,
    pub ns: OwnedFd,
    _lease: File,
}

#[derive(Default)]
pub struct Pool {
    ready: Mutex<VecDeque<Prepared>>,
    making: AtomicUsize,
    /// Where the next search for a free slot starts.
    cursor: AtomicU32,
    wake: tokio::sync::Notify,
    /// Set at shutdown: nothing more is prepared.
    stopped: std::sync::atomic::AtomicBool,
}

fn ready(p: &Pool) -> std::sync::MutexGuard<'_, VecDeque<Prepared>> {
    p.ready.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn try_lease(dir: &Path, slot: u32) -> std::io::Result<Option<File>> {
    crate::engine::try_lease(dir, slot)
}

/// Leases the next free slot host-wide and wires a namespace for it.
fn make_one(shared: &Shared) -> Result<Prepared, EgressError> {
    let pool = &shared.pool;
    let start = pool.cursor.fetch_add(1, Ordering::Relaxed) % MAX_NET_SLOTS;
    for i in 0..MAX_NET_SLOTS {
        let slot = (start + i) % MAX_NET_SLOTS;
        let Some(lease) =
            try_lease(&shared.cfg.lease_dir, slot).map_err(|source| EgressError::Io {
                op: "leasing a network slot",
                source,
            })?
        else {
            continue;
        };
        pool.cursor.store(slot + 1, Ordering::Relaxed);
        let plan = veth_plan(&shared.cfg.names, slot);
        // A link of this name can only be a leftover: its lease was free.
        mayfly_sys::veth::delete_link(&plan.host_if)?;
        let ns = mayfly_sys::veth::make_netns_with_veth(&plan)?;
        return Ok(Prepared {
            slot,
            plan,
            ns,
            _lease: lease,
        });
    }
    Err(EgressError::Exhausted(MAX_NET_SLOTS))
}

/// Removes a namespace's link, then lets its slot go.
pub fn remove(p: Prepared) {
    if let Err(e) = mayfly_sys::veth::delete_link(&p.plan.host_if) {
        tracing::warn!(link = %p.plan.host_if, error = %e, "removing a sandbox's network link failed");
    }
    drop(p);
}

/// A ready namespace, or one made now when none is.
pub async fn take(shared: &Arc<Shared>) -> Result<Prepared, EgressError> {
    let got = ready(&shared.pool).pop_front();
    shared.pool.wake.notify_one();
    if let Some(p) = got {
        return Ok(p);
    }
    let s = shared.clone();
    tokio::task::spawn_blocking(move || make_one(&s))
        .await
        .map_err(|e| EgressError::Unavailable(e.to_string()))?
}

/// Keeps `pool_target` namespaces ready, one made at a time.
pub fn start(shared: Arc<Shared>) {
    tokio::spawn(async move {
        loop {
            if shared.pool.stopped.load(Ordering::Acquire) {
                return;
            }
            let target = shared.cfg.pool_target;
            let have = ready(&shared.pool).len() + shared.pool.making.load(Ordering::Acquire);
            if have < target {
                shared.pool.making.fetch_add(1, Ordering::AcqRel);
                let s = shared.clone();
                let made = tokio::task::spawn_blocking(move || make_one(&s)).await;
                shared.pool.making.fetch_sub(1, Ordering::AcqRel);
                match made {
                    Ok(Ok(p)) if shared.pool.stopped.load(Ordering::Acquire) => remove(p),
                    Ok(Ok(p)) => ready(&shared.pool).push_back(p),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "preparing a network namespace failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(_) => return,
                }
                continue;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), shared.pool.wake.notified()).await;
        }
    });
}

/// Removes every ready namespace (at shutdown).
pub fn drain(shared: &Shared) {
    shared.pool.stopped.store(true, Ordering::Release);
    let all: Vec<_> = ready(&shared.pool).drain(..).collect();
    for p in all {
        remove(p);
    }
}
