//! Warm pools: sandboxes booted ahead for a template, each claimed once.
//!
//! A pool keeps `target` sandboxes fully booted (namespaces, root, cgroups,
//! init running, ready) and unclaimed. A create whose template and resolved
//! limits equal a pool's takes the oldest one in O(1) (`claim_from_pool`):
//! the sandbox gets the caller's tenant, labels, environment and TTL, one
//! store transaction records the claim, and it leaves the pool for good. It
//! is destroyed like any other when its task ends; the pool never takes it
//! back. Refill boots replacements in the background, at most
//! `refill_concurrency` at a time and only one in all while a cold create
//! is in flight, so it cannot starve requests.
//!
//! An unclaimed sandbox is invisible to every request (`Engine::lookup`
//! refuses it), so nothing can run in it before its claim: warm never
//! means reused.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mayfly_types::{
    PoolInfo, PoolSpec, ResolvedLimits, SandboxId, SandboxInfo, SandboxSource, SandboxState,
    TemplateRef,
};

use super::claims::ClaimRecord;
use super::create::{base_env, Boot};
use super::{now_ms, Engine};
use crate::api::Caller;
use crate::EngineError;

/// A pool's default refill concurrency.
pub const DEFAULT_REFILL_CONCURRENCY: u32 = 1;
/// The most boots one pool may run at once.
pub const MAX_REFILL_CONCURRENCY: u32 = 16;
/// How long a pool waits after a failed boot before it tries again.
pub(crate) const FAILURE_BACKOFF: Duration = Duration::from_secs(1);
/// How long refill holds off after a claim while the pool is at least half
/// full: the claimed sandbox is about to be used (`mayfly run` execs in it
/// at once), and a boot started now would take a core from that request on
/// a small host. A pool below half its target refills at once.
pub(crate) const CLAIM_GRACE: Duration = Duration::from_millis(25);

/// One pool: its settings and its unclaimed sandboxes.
pub(crate) struct Pool {
    pub template: TemplateRef,
    /// What the template stands for, resolved when the pool was set (and
    /// again when a named template is rebuilt).
    pub resolved: Arc<crate::templates::Resolved>,
    /// The template's services and hooks, which every sandbox of the pool
    /// runs before it is pooled.
    pub lifecycle: Arc<super::Lifecycle>,
    pub limits: ResolvedLimits,
    /// Sandboxes booted with a network interface, for creates with egress.
    pub network: bool,
    pub target: u32,
    pub max: u32,
    pub refill_concurrency: u32,
    /// Booted and unclaimed, oldest first.
    pub ready: VecDeque<SandboxId>,
    /// Being booted for this pool now.
    pub filling: u32,
    pub claims: u64,
    pub misses: u64,
    /// Bumped whenever the pool's sandboxes stop fitting it (new template or
    /// limits, a drain): boots of an older generation are thrown away.
    pub generation: u64,
    /// No boot starts before this (after a failure).
    pub backoff_until: Option<Instant>,
    /// When the last claim took a sandbox (see [`CLAIM_GRACE`]).
    pub last_claim: Option<Instant>,
}

/// Every pool of an engine, by name, and what wakes their refill.
#[derive(Default)]
pub(crate) struct Pools {
    pub by_name: Mutex<HashMap<String, Pool>>,
    pub wake: Arc<tokio::sync::Notify>,
    /// Cold creates in flight; refill waits while there are any.
    pub foreground: std::sync::atomic::AtomicUsize,
    /// Claims whose records are not committed yet.
    pub claims: super::claims::PendingClaims,
}

/// Held while a cold create runs: refill starts no boot meanwhile.
pub(crate) struct Foreground<'a>(&'a Pools);

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        if self.0.foreground.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.wake.notify_one();
        }
    }
}

/// Sets a sandbox's CPU weight (see `plan::cgroup::CpuWeight`). A failure
/// only costs scheduling fairness, so it is logged, not returned.
pub(crate) fn set_cpu_weight(
    id: &SandboxId,
    cgroup: &mayfly_sys::cgroup::CgroupPlan,
    weight: crate::plan::cgroup::CpuWeight,
) {
    let value = crate::plan::cgroup::cpu_weight(cgroup.version, weight);
    if let Err(e) = mayfly_sys::cgroup::set_cpu_weight(cgroup, value) {
        tracing::warn!(%id, ?weight, error = %e, "setting a sandbox's CPU weight failed");
    }
}

/// A pool name: 1–63 of `[a-z0-9_.-]`, starting with a letter or digit.
pub fn check_pool_name(name: &str) -> Result<(), EngineError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EngineError::Invalid(format!(
            "pool name `{}` is invalid: use 1-63 of a-z, 0-9, `_`, `.`, `-`, starting with a letter or digit",
            name.chars().take(64).collect::<String>().escape_debug()
        )))
    }
}

impl Engine {
    /// Marks a cold create in flight until the guard drops.
    pub(crate) fn foreground(&self) -> Foreground<'_> {
        let pools = &self.inner.pools;
        pools.foreground.fetch_add(1, Ordering::SeqCst);
        Foreground(pools)
    }

    /// Serves `boot` from a pool whose template and limits it matches:
    /// `None` when no pool fits or the fitting one is empty.
    pub(crate) async fn claim_from_pool(
        &self,
        boot: &Boot,
        caller: &Caller,
        t0: Instant,
    ) -> Result<Option<SandboxInfo>, EngineError> {
        loop {
            let taken = {
                let mut pools = self.lock_pools();
                let mut fits = pools
                    .iter_mut()
                    .filter(|(_, p)| {
                        // A create with egress takes a sandbox that has an
                        // interface; one without, a sandbox that has none.
                        p.network == (boot.egress.mode != mayfly_types::EgressMode::None)
                            && p.template == boot.template
                            && p.limits == boot.limits
                            // A pool's sandboxes run their template's
                            // services and hooks, and no create's own.
                            && *boot.lifecycle == *p.lifecycle
                    })
                    .peekable();
                if fits.peek().is_none() {
                    return Ok(None);
                }
                let mut first = None;
                let mut got = None;
                for (name, p) in fits {
                    if let Some(id) = p.ready.pop_front() {
                        p.claims += 1;
                        p.last_claim = Some(Instant::now());
                        got = Some((id, name.clone(), p.generation));
                        break;
                    }
                    first.get_or_insert(p);
                }
                if got.is_none() {
                    if let Some(p) = first {
                        p.misses += 1;
                    }
                }
                got
            };
            let Some((id, pool, generation)) = taken else {
                self.inner.pools.wake.notify_one();
                return Ok(None);
            };
            // A sandbox that died while it waited is gone from the map or
            // stopping; its destroy is under way, and the next one is tried.
            let Some(sb) = self
                .lookup_any(&id)
                .filter(|sb| !sb.is_stopping() && !sb.is_destroying())
            else {
                continue;
            };
            // The tenant's quotas hold for a claim as for a cold create (the
            // sandbox already has its place under the daemon's cap). A
            // refused claim puts the sandbox back, untouched.
            let admission = match self.admit_claim(caller, &boot.limits) {
                Ok(a) => a,
                Err(e) => {
                    self.put_back(&pool, generation, id);
                    return Err(e);
                }
            };
            let tenant = boot.tenant.clone().unwrap_or_default();
            // Held until the record below is committed: a read or change of
            // the record (get, destroy, keepalive, TTL) waits for it.
            let record = sb.record.clone().write_owned().await;
            *sb.env.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(base_env(&id, &boot.env));
            *sb.tenant.write().unwrap_or_else(|p| p.into_inner()) = Some(tenant.clone());
            let claimed_at = now_ms();
            let expires_at = claimed_at + boot.ttl_secs * 1000;
            sb.expires_at.store(expires_at, Ordering::Relaxed);
            sb.idle_ms.store(boot.idle_secs * 1000, Ordering::Relaxed);
            // Its egress was closed while it waited; the create's policy
            // applies from now on (an in-memory swap).
            if let Some(e) = sb.egress.get() {
                e.set_policy(boot.egress.clone());
            }
            sb.touch();
            admission.commit(&id);
            sb.pooled.store(false, Ordering::SeqCst);
            let claim_ms = t0.elapsed().as_secs_f64() * 1000.0;
            let info = SandboxInfo {
                id: id.clone(),
                state: SandboxState::Ready,
                template: boot.template.clone(),
                created_at: claimed_at,
                expires_at,
                limits: boot.limits,
                labels: boot.labels.clone(),
                uid_base: sb.uid_base,
                init_pid: u32::try_from(sb.init_pid).ok(),
                reason: None,
                create_ms: Some(claim_ms),
                tenant: Some(tenant.clone()),
                source: SandboxSource::Pool,
            };
            self.record_claim(
                sb,
                record,
                ClaimRecord {
                    pool,
                    tenant,
                    caller: caller.name.clone(),
                    template: boot.template.to_string(),
                    labels: boot.labels.clone(),
                    claimed_at,
                    expires_at,
                    claim_ms,
                },
            );
            return Ok(Some(info));
        }
    }

    /// Returns an unclaimed sandbox to the front of its pool after a refused
    /// claim, or destroys it if the pool changed meanwhile (a drain, a new
    /// template, limits or network: a new generation) or is full again.
    fn put_back(&self, pool: &str, generation: u64, id: SandboxId) {
        {
            let mut pools = self.lock_pools();
            if let Some(p) = pools.get_mut(pool) {
                if p.generation == generation && p.ready.len() < p.target as usize {
                    if let Some(e) = self.lookup_any(&id).and_then(|sb| sb.egress.get().cloned()) {
                        e.set_policy(super::network::closed_policy());
                    }
                    p.ready.push_front(id);
                    p.claims = p.claims.saturating_sub(1);
                    return;
                }
            }
        }
        self.evict(vec![id]);
    }

    /// Creates or changes pool `name`. A new template or new limits throw
    /// away its unclaimed sandboxes (they no longer fit); a lower `max`
    /// throws away the excess. Admin only.
    pub fn set_pool(
        &self,
        name: &str,
        spec: PoolSpec,
        caller: &Caller,
    ) -> Result<PoolInfo, EngineError> {
        if !caller.admin {
            return Err(EngineError::Forbidden(
                "managing pools needs an admin key".into(),
            ));
        }
        check_pool_name(name)?;
        let cfg = &self.inner.cfg;
        let template: Option<TemplateRef> = spec
            .template
            .as_deref()
            .map(|t| t.parse().map_err(|e| EngineError::Invalid(format!("{e}"))))
            .transpose()?;
        let resolved = match &template {
            Some(t) => Some(self.resolve_template(t)?),
            None => self.lock_pools().get(name).map(|p| p.resolved.clone()),
        };
        let resolved = match resolved {
            Some(r) => r,
            None => self.resolve_template(&TemplateRef::Host)?,
        };
        let lifecycle = Arc::new(match resolved.spec.as_deref() {
            Some(s) => super::spec::template_lifecycle(s)?,
            None => Default::default(),
        });
        let limits = self
            .template_limits(&resolved)?
            .with(&spec.limits)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let mut evicted = Vec::new();
        {
            let mut pools = self.lock_pools();
            // Validated before a new pool is made: a refused PUT leaves
            // nothing behind.
            let current = pools.get(name);
            let template = template
                .unwrap_or_else(|| current.map_or(TemplateRef::Host, |p| p.template.clone()));
            let network = spec.network.unwrap_or(current.is_some_and(|p| p.network));
            if network {
                self.egress_ready()?;
            }
            let target = spec.target.unwrap_or(current.map_or(0, |p| p.target));
            let max = spec.max.unwrap_or(current.map_or(0, |p| p.max).max(target));
            let conc = spec
                .refill_concurrency
                .unwrap_or(current.map_or(DEFAULT_REFILL_CONCURRENCY, |p| p.refill_concurrency));
            if target > max {
                return Err(EngineError::Invalid(format!(
                    "pool `{name}`: target {target} is above max {max}"
                )));
            }
            if max > cfg.slots() {
                let what = match spec.max {
                    Some(_) => format!("max {max}"),
                    None => format!("target {target} (and so its max)"),
                };
                return Err(EngineError::Invalid(format!(
                    "pool `{name}`: {what} is above the daemon's cap of {} sandboxes",
                    cfg.slots()
                )));
            }
            if !(1..=MAX_REFILL_CONCURRENCY).contains(&conc) {
                return Err(EngineError::Invalid(format!(
                    "pool `{name}`: refill_concurrency {conc} is out of range; allowed is 1..={MAX_REFILL_CONCURRENCY}"
                )));
            }
            let p = pools.entry(name.to_owned()).or_insert_with(|| Pool {
                template: TemplateRef::Host,
                resolved: resolved.clone(),
                lifecycle: lifecycle.clone(),
                limits,
                network: false,
                target: 0,
                max: 0,
                refill_concurrency: DEFAULT_REFILL_CONCURRENCY,
                ready: VecDeque::new(),
                filling: 0,
                claims: 0,
                misses: 0,
                generation: 0,
                backoff_until: None,
                last_claim: None,
            });
            if p.template != template
                || p.limits != limits
                || p.network != network
                || p.lifecycle != lifecycle
            {
                p.generation += 1;
                evicted.extend(p.ready.drain(..));
            }
            while p.ready.len() > max as usize {
                evicted.extend(p.ready.pop_back());
            }
            p.template = template;
            p.resolved = resolved;
            p.lifecycle = lifecycle;
            p.limits = limits;
            p.network = network;
            p.target = target;
            p.max = max;
            p.refill_concurrency = conc;
            p.backoff_until = None;
        }
        self.evict(evicted);
        self.inner.pools.wake.notify_one();
        self.pool_info(name)
    }

    /// Empties pool `name` and stops its refill (target 0): its unclaimed
    /// sandboxes are destroyed, and boots in flight are thrown away when
    /// they finish. Claimed sandboxes are not touched. Admin only.
    pub fn drain_pool(&self, name: &str, caller: &Caller) -> Result<PoolInfo, EngineError> {
        if !caller.admin {
            return Err(EngineError::Forbidden(
                "managing pools needs an admin key".into(),
            ));
        }
        let evicted: Vec<SandboxId> = {
            let mut pools = self.lock_pools();
            let p = pools
                .get_mut(name)
                .ok_or_else(|| EngineError::NoSuchPool(name.to_owned()))?;
            p.target = 0;
            p.generation += 1;
            p.ready.drain(..).collect()
        };
        self.evict(evicted);
        self.pool_info(name)
    }

    /// Destroys unclaimed sandboxes that left their pool.
    /// A named template was rebuilt or removed: pools of it re-resolve it
    /// and throw away their unclaimed sandboxes (made of the old layers). A
    /// pool of a removed template keeps its last resolution and stops
    /// refilling until the template is built again.
    pub(crate) fn refresh_template_pools(&self, name: &str) {
        let named = TemplateRef::Named(name.to_owned());
        let fresh = self.resolve_template(&named).ok();
        let mut evicted = Vec::new();
        {
            let mut pools = self.lock_pools();
            for p in pools.values_mut().filter(|p| p.template == named) {
                p.generation += 1;
                evicted.extend(p.ready.drain(..));
                match &fresh {
                    Some(r) => {
                        p.resolved = r.clone();
                        p.lifecycle = Arc::new(match r.spec.as_deref() {
                            Some(s) => super::spec::template_lifecycle(s).unwrap_or_default(),
                            None => Default::default(),
                        });
                        p.backoff_until = None;
                    }
                    None => {
                        p.backoff_until =
                            Some(Instant::now() + std::time::Duration::from_secs(3600 * 24 * 365));
                    }
                }
            }
        }
        self.evict(evicted);
        self.inner.pools.wake.notify_one();
    }

    fn evict(&self, ids: Vec<SandboxId>) {
        for id in ids {
            if let Some(sb) = self.lookup_any(&id) {
                self.destroy_in_background(sb, "pool_drain");
            }
        }
    }

    fn pool_info(&self, name: &str) -> Result<PoolInfo, EngineError> {
        self.pool_infos()
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| EngineError::NoSuchPool(name.to_owned()))
    }

    /// What each pool is and how full, by name.
    pub(crate) fn pool_infos(&self) -> Vec<PoolInfo> {
        let pools = self.lock_pools();
        let mut out: Vec<PoolInfo> = pools
            .iter()
            .map(|(name, p)| PoolInfo {
                name: name.clone(),
                template: p.template.to_string(),
                target: p.target,
                max: p.max,
                refill_concurrency: p.refill_concurrency,
                limits: p.limits,
                network: p.network,
                ready: p.ready.len() as u32,
                filling: p.filling,
                claims: p.claims,
                misses: p.misses,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub(crate) fn lock_pools(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pool>> {
        self.inner
            .pools
            .by_name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}
