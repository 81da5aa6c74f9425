//! Admission: tenant quotas and the daemon's cap on live sandboxes.
//!
//! The [`Ledger`] is pure bookkeeping (time comes in as an argument): each
//! tenant's quotas, what its live sandboxes hold, a create-rate token
//! bucket, and which tenant owns each live sandbox. A create asks it once,
//! under one lock, to check every quota and reserve its share
//! ([`Engine::admit`]); the [`Admission`] it gets back is committed to the
//! sandbox's id once the sandbox is live, or, dropped un-committed, gives
//! the reservation back. So two concurrent creates can never both take the
//! last place, and a failed create holds nothing. A destroy gives the
//! tenant its share back as soon as the sandbox is killed
//! ([`Engine::stop_quota`]: what the tenant sees as destroyed no longer
//! counts), and the daemon its place once the cleanup is done
//! ([`Engine::release_quota`]: the host is still busy until then).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use mayfly_types::{ResolvedLimits, SandboxId, TenantQuotas, TenantUsage};

use super::{now_ms, Engine};
use crate::api::Caller;
use crate::tenancy::TenancyError;
use crate::EngineError;

/// `Retry-After` for capacity that only a destroy frees (live sandboxes,
/// CPU, memory, the daemon's cap): when that happens cannot be known, so
/// the caller is asked to poll gently.
pub(crate) const FREED_RETRY_SECS: u64 = 2;

/// A create refused by a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("tenant `{tenant}` is at its quota of {max} live sandboxes")]
    Live { tenant: String, max: u32 },
    #[error("tenant `{tenant}` is at its quota of {per_min} creates per minute{}", rate_hint(*per_min, *retry_after_secs))]
    Rate {
        tenant: String,
        per_min: u32,
        retry_after_secs: u64,
    },
    #[error("tenant `{tenant}` would hold {wanted} CPU millicores, over its quota of {max} (in use: {used})")]
    Cpu {
        tenant: String,
        max: u64,
        used: u64,
        wanted: u64,
    },
    #[error("tenant `{tenant}` would hold {wanted} bytes of memory, over its quota of {max} (in use: {used})")]
    Memory {
        tenant: String,
        max: u64,
        used: u64,
        wanted: u64,
    },
    #[error("{max} sandboxes are alive, the most this daemon allows")]
    DaemonFull { max: u32 },
}

fn rate_hint(per_min: u32, retry_after_secs: u64) -> String {
    if per_min == 0 {
        "; it may create none".to_owned()
    } else {
        format!("; retry in {retry_after_secs} s")
    }
}

impl QuotaError {
    /// Whether waiting can ever admit this create: not when the quota is
    /// zero (no live sandbox, no create a minute) or smaller than the
    /// sandbox alone. Such a refusal is final (a 403, no `Retry-After`),
    /// not a 429 asking the caller to poll for capacity that never comes.
    pub fn can_pass(&self) -> bool {
        match self {
            QuotaError::Live { max, .. } => *max > 0,
            QuotaError::Rate { per_min, .. } => *per_min > 0,
            QuotaError::Cpu {
                max, used, wanted, ..
            }
            | QuotaError::Memory {
                max, used, wanted, ..
            } => wanted.saturating_sub(*used) <= *max,
            QuotaError::DaemonFull { max } => *max > 0,
        }
    }

    pub fn retry_after_secs(&self) -> u64 {
        match self {
            QuotaError::Rate {
                retry_after_secs, ..
            } => *retry_after_secs,
            _ => FREED_RETRY_SECS,
        }
    }
}

/// What one sandbox holds, and for whom (`None`: unclaimed, in a pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Charge {
    pub tenant: Option<String>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// One admission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ask {
    pub charge: Charge,
    /// A new sandbox (counted against the daemon's cap), not one claimed
    /// from a pool (already counted).
    pub new_sandbox: bool,
}

/// A create-rate token bucket: holds up to `per_min` tokens, refilled at
/// `per_min` a minute; a create takes one. Counted in integer units of
/// 1/60000 token, so a millisecond refills exactly `per_min` units.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bucket {
    per_min: u32,
    units: u64,
    at_ms: u64,
}

/// Units in one token.
const TOKEN: u64 = 60_000;

impl Bucket {
    fn full(per_min: u32, now_ms: u64) -> Bucket {
        Bucket {
            per_min,
            units: u64::from(per_min) * TOKEN,
            at_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        let cap = u64::from(self.per_min) * TOKEN;
        self.units = self
            .units
            .saturating_add(elapsed.saturating_mul(self.per_min.into()))
            .min(cap);
        self.at_ms = self.at_ms.max(now_ms);
    }

    /// Whether a token is there now, or else how many whole seconds until
    /// one is.
    fn check(&mut self, now_ms: u64) -> Result<(), u64> {
        self.refill(now_ms);
        if self.units >= TOKEN {
            return Ok(());
        }
        if self.per_min == 0 {
            // Never; `QuotaError::can_pass` makes this refusal final.
            return Err(0);
        }
        let ms = (TOKEN - self.units).div_ceil(self.per_min.into());
        Err(ms.div_ceil(1000).max(1))
    }

    fn take(&mut self) {
        self.units = self.units.saturating_sub(TOKEN);
    }
}

#[derive(Debug, Clone, Default)]
struct TenantState {
    quotas: TenantQuotas,
    usage: TenantUsage,
    bucket: Option<Bucket>,
}

/// A live sandbox's charge; `stopped` once its tenant's share is back.
#[derive(Debug)]
struct Held {
    charge: Charge,
    stopped: bool,
}

/// Every tenant's quotas and usage, and every live sandbox's charge.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    tenants: HashMap<String, TenantState>,
    charges: HashMap<SandboxId, Held>,
    /// New sandboxes admitted and not yet committed or cancelled.
    reserved: u32,
}

impl Ledger {
    pub fn new(tenants: impl IntoIterator<Item = (String, TenantQuotas)>, now_ms: u64) -> Ledger {
        let mut l = Ledger::default();
        for (name, q) in tenants {
            l.set_quotas(&name, q, now_ms);
        }
        l
    }

    /// Creates a tenant or changes its quotas; its usage stays. A lowered
    /// quota refuses the next create, and never ends a live sandbox.
    pub fn set_quotas(&mut self, name: &str, quotas: TenantQuotas, now_ms: u64) {
        let t = self.tenants.entry(name.to_owned()).or_default();
        t.quotas = quotas;
        t.bucket = quotas
            .max_creates_per_min
            .map(|per_min| match t.bucket.take() {
                Some(mut b) => {
                    b.refill(now_ms);
                    b.per_min = per_min;
                    b.units = b.units.min(u64::from(per_min) * TOKEN);
                    b
                }
                None => Bucket::full(per_min, now_ms),
            });
    }

    /// Forgets a tenant that holds nothing; else says how many sandboxes
    /// (live or being made) it has.
    pub fn remove_tenant(&mut self, name: &str) -> Result<(), u32> {
        match self.tenants.get(name) {
            Some(t) if t.usage.live > 0 => Err(t.usage.live),
            _ => {
                self.tenants.remove(name);
                Ok(())
            }
        }
    }

    pub fn usage(&self, name: &str) -> TenantUsage {
        self.tenants.get(name).map(|t| t.usage).unwrap_or_default()
    }

    /// Sandboxes alive or being made, for the daemon's cap.
    pub fn live_total(&self) -> u32 {
        u32::try_from(self.charges.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.reserved)
    }

    /// The charge of a live, admitted sandbox.
    pub fn owner(&self, id: &SandboxId) -> Option<&Charge> {
        self.charges.get(id).map(|h| &h.charge)
    }

    /// Checks every quota `ask` is subject to and, if all pass, reserves
    /// its share (and a create token). Nothing changes on refusal.
    pub fn admit(&mut self, ask: &Ask, daemon_max: u32, now_ms: u64) -> Result<(), EngineError> {
        if ask.new_sandbox && self.live_total() >= daemon_max {
            return Err(QuotaError::DaemonFull { max: daemon_max }.into());
        }
        if let Some(name) = &ask.charge.tenant {
            let t = self
                .tenants
                .get_mut(name)
                .ok_or_else(|| TenancyError::NoSuchTenant { name: name.clone() })?;
            check(name, t, &ask.charge, now_ms)?;
            if let Some(b) = &mut t.bucket {
                b.take();
            }
            t.usage.live += 1;
            t.usage.cpu_millis = t.usage.cpu_millis.saturating_add(ask.charge.cpu_millis);
            t.usage.memory_bytes = t.usage.memory_bytes.saturating_add(ask.charge.memory_bytes);
        }
        if ask.new_sandbox {
            self.reserved += 1;
        }
        Ok(())
    }

    /// Gives back what [`Ledger::admit`] reserved (the create token stays
    /// spent: a failed create still cost the host).
    pub fn cancel(&mut self, ask: &Ask) {
        if ask.new_sandbox {
            self.reserved = self.reserved.saturating_sub(1);
        }
        self.unreserve(&ask.charge);
    }

    /// Turns a reservation into the live sandbox `id`'s charge. A claimed
    /// pool sandbox's unclaimed charge is replaced.
    pub fn commit(&mut self, id: &SandboxId, ask: Ask) {
        if ask.new_sandbox {
            self.reserved = self.reserved.saturating_sub(1);
        }
        let held = Held {
            charge: ask.charge,
            stopped: false,
        };
        if let Some(old) = self.charges.insert(id.clone(), held) {
            if !old.stopped {
                self.unreserve(&old.charge);
            }
        }
    }

    /// Gives a killed sandbox's share back to its tenant; it still counts
    /// against the daemon's cap until [`Ledger::release`].
    pub fn stop(&mut self, id: &SandboxId) {
        let Some(h) = self.charges.get_mut(id) else {
            return;
        };
        if !std::mem::replace(&mut h.stopped, true) {
            let c = h.charge.clone();
            self.unreserve(&c);
        }
    }

    /// Releases what is left of a sandbox's charge when it is gone.
    /// Unknown ids are ignored.
    pub fn release(&mut self, id: &SandboxId) {
        if let Some(h) = self.charges.remove(id) {
            if !h.stopped {
                self.unreserve(&h.charge);
            }
        }
    }

    fn unreserve(&mut self, c: &Charge) {
        let Some(t) = c.tenant.as_ref().and_then(|n| self.tenants.get_mut(n)) else {
            return;
        };
        t.usage.live = t.usage.live.saturating_sub(1);
        t.usage.cpu_millis = t.usage.cpu_millis.saturating_sub(c.cpu_millis);
        t.usage.memory_bytes = t.usage.memory_bytes.saturating_sub(c.memory_bytes);
    }
}

/// One tenant's quotas against one more sandbox of `c`'s size: live count,
/// CPU and memory totals, then the create rate.
fn check(name: &str, t: &mut TenantState, c: &Charge, now_ms: u64) -> Result<(), QuotaError> {
    let (q, u) = (&t.quotas, &t.usage);
    if let Some(max) = q.max_live {
        if u.live >= max {
            return Err(QuotaError::Live {
                tenant: name.to_owned(),
                max,
            });
        }
    }
    if let Some(max) = q.max_cpu_millis {
        let wanted = u.cpu_millis.saturating_add(c.cpu_millis);
        if wanted > max {
            return Err(QuotaError::Cpu {
                tenant: name.to_owned(),
                max,
                used: u.cpu_millis,
                wanted,
            });
        }
    }
    if let Some(max) = q.max_memory_bytes {
        let wanted = u.memory_bytes.saturating_add(c.memory_bytes);
        if wanted > max {
            return Err(QuotaError::Memory {
                tenant: name.to_owned(),
                max,
                used: u.memory_bytes,
                wanted,
            });
        }
    }
    if let Some(b) = &mut t.bucket {
        b.check(now_ms)
            .map_err(|retry_after_secs| QuotaError::Rate {
                tenant: name.to_owned(),
                per_min: b.per_min,
                retry_after_secs,
            })?;
    }
    Ok(())
}

/// A create's place, reserved by [`Engine::admit`]. [`Admission::commit`]
/// it once the sandbox is live; dropping it un-committed gives the place
/// back.
#[must_use = "dropping an admission gives its reservation back"]
pub struct Admission {
    ledger: Arc<Mutex<Ledger>>,
    ask: Option<Ask>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").field("ask", &self.ask).finish()
    }
}

impl Admission {
    /// The reservation becomes live sandbox `id`'s, held until
    /// [`Engine::release_quota`] (a destroy).
    pub fn commit(mut self, id: &SandboxId) {
        if let Some(ask) = self.ask.take() {
            lock(&self.ledger).commit(id, ask);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(ask) = self.ask.take() {
            lock(&self.ledger).cancel(&ask);
        }
    }
}

fn lock(l: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    // The ledger's methods do not panic half-way; a poisoned lock still
    // holds consistent numbers.
    l.lock().unwrap_or_else(|p| p.into_inner())
}

fn charge(tenant: Option<&str>, limits: &ResolvedLimits) -> Charge {
    Charge {
        tenant: tenant.map(str::to_owned),
        cpu_millis: limits.cpu_millis.into(),
        memory_bytes: limits.memory_bytes,
    }
}

impl Engine {
    /// Admits a new sandbox of `limits` for `caller`'s tenant: the daemon's
    /// cap, then the tenant's live, CPU, memory and rate quotas, checked
    /// and reserved at once.
    pub fn admit(
        &self,
        caller: &Caller,
        limits: &ResolvedLimits,
    ) -> Result<Admission, EngineError> {
        self.admit_ask(Ask {
            charge: charge(Some(&caller.tenant), limits),
            new_sandbox: true,
        })
    }

    /// Admits a new, unclaimed sandbox for a warm pool: the daemon's cap only.
    pub fn admit_pool_fill(&self, limits: &ResolvedLimits) -> Result<Admission, EngineError> {
        self.admit_ask(Ask {
            charge: charge(None, limits),
            new_sandbox: true,
        })
    }

    /// Admits `caller`'s claim of a pool sandbox (already counted against
    /// the daemon's cap): the tenant's quotas only. The commit moves the
    /// sandbox's charge to the tenant.
    pub fn admit_claim(
        &self,
        caller: &Caller,
        limits: &ResolvedLimits,
    ) -> Result<Admission, EngineError> {
        self.admit_ask(Ask {
            charge: charge(Some(&caller.tenant), limits),
            new_sandbox: false,
        })
    }

    fn admit_ask(&self, ask: Ask) -> Result<Admission, EngineError> {
        let ledger = self.inner.quotas.clone();
        lock(&ledger).admit(&ask, self.inner.cfg.slots(), now_ms())?;
        Ok(Admission {
            ledger,
            ask: Some(ask),
        })
    }

    /// Gives back what a sandbox held against its tenant's quotas, once
    /// it is killed.
    pub(crate) fn stop_quota(&self, id: &SandboxId) {
        lock(&self.inner.quotas).stop(id);
    }

    /// Gives back everything a sandbox held (the tenant's share, if not
    /// yet, and its place under the daemon's cap); called when it leaves
    /// the live set.
    pub(crate) fn release_quota(&self, id: &SandboxId) {
        lock(&self.inner.quotas).release(id);
    }

    /// The ledger, for the tenancy API.
    pub(crate) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        lock(&self.inner.quotas)
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
