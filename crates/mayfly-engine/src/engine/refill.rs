//! Pool refill: boots replacements in the background, within bounds.
//!
//! One task per engine wakes on every claim, drain, setting change or
//! finished boot (and every 250 ms regardless). For each pool below its
//! target it starts boots, at most `refill_concurrency` at a time per pool,
//! only one at a time in all while a cold create is in flight (those are
//! requests waiting), and never past the daemon's cap on live sandboxes. A failed boot holds that
//! pool's refill back for a second, so a broken template cannot spin.
//! Right after a claim, a pool that is still at least half full waits
//! `CLAIM_GRACE` before it boots, so the claimed sandbox's first request
//! (often an exec, as in `mayfly run`) does not share the CPU with a boot.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

use mayfly_types::SandboxId;

use super::create::Boot;
use super::{Engine, Inner};
use crate::api::Caller;

/// How often refill looks even when nothing woke it.
const TICK: Duration = Duration::from_millis(250);

impl Engine {
    /// Starts the refill task. Call once, inside the tokio runtime.
    pub(crate) fn start_refill(&self) {
        let weak: Weak<Inner> = std::sync::Arc::downgrade(&self.inner);
        let wake = self.inner.pools.wake.clone();
        tokio::spawn(async move {
            loop {
                let tick = Instant::now() + TICK;
                let deadline = {
                    let Some(inner) = weak.upgrade() else { return };
                    let engine = Engine { inner };
                    if engine.inner.shutting_down.load(Ordering::SeqCst) {
                        return;
                    }
                    engine.start_boots().map_or(tick, |t| t.min(tick))
                };
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                }
            }
        });
    }

    /// Starts the boots the pools are owed, within their bounds. Returns
    /// when the earliest boot held back by a claim's grace may start.
    fn start_boots(&self) -> Option<Instant> {
        let cap = self.inner.cfg.slots() as usize;
        let mut live = self.live_count();
        let now = Instant::now();
        let mut starts: Vec<(String, u64, Boot)> = Vec::new();
        let mut held: Option<Instant> = None;
        {
            let mut pools = self.lock_pools();
            // While cold creates are in flight (requests waiting), refill
            // runs one boot at a time across all pools: it never takes more
            // than its share, and under sustained load it still refills, so
            // claims keep being served from the pools.
            let busy = self.inner.pools.foreground.load(Ordering::SeqCst) > 0;
            let mut budget = if busy {
                1usize.saturating_sub(pools.values().map(|p| p.filling as usize).sum())
            } else {
                usize::MAX
            };
            for (name, p) in pools.iter_mut() {
                if p.backoff_until.is_some_and(|t| t > now) {
                    continue;
                }
                let grace = p.last_claim.map(|t| t + super::pool::CLAIM_GRACE);
                if let Some(until) = grace.filter(|u| *u > now) {
                    if 2 * (p.ready.len() as u32 + p.filling) >= p.target {
                        held = Some(held.map_or(until, |h| h.min(until)));
                        continue;
                    }
                }
                while (p.ready.len() as u32 + p.filling) < p.target
                    && p.filling < p.refill_concurrency
                    && live < cap
                    && budget > 0
                {
                    budget -= 1;
                    p.filling += 1;
                    live += 1;
                    starts.push((
                        name.clone(),
                        p.generation,
                        Boot {
                            template: p.template.clone(),
                            limits: p.limits,
                            ttl_secs: 0,
                            idle_secs: 0,
                            env: p.resolved.env.clone(),
                            resolved: p.resolved.clone(),
                            labels: Default::default(),
                            tenant: None,
                            pool: Some(name.clone()),
                            egress: if p.network {
                                super::network::closed_policy()
                            } else {
                                Default::default()
                            },
                            artifacts: Vec::new(),
                            workspace: None,
                            // The template's services start before the
                            // sandbox is pooled.
                            lifecycle: p.lifecycle.clone(),
                        },
                    ));
                }
            }
        }
        for (name, generation, boot) in starts {
            let engine = self.clone();
            let task = tokio::spawn(async move {
                let caller = Caller::new(format!("pool:{name}"));
                let booted = match engine.admit_pool_fill(&boot.limits) {
                    Ok(admission) => engine.boot(boot, admission, &caller, Instant::now()).await,
                    Err(e) => Err(e),
                };
                engine.finish_boot(&name, generation, booted.map(|i| i.id));
            });
            // Shutdown waits for boots in flight, which then see it and
            // destroy what they made.
            self.track_cleanup(task);
        }
        held
    }

    /// Puts a finished boot into its pool, or destroys it when the pool no
    /// longer wants it (drained, changed, full, or the daemon stopping).
    fn finish_boot(
        &self,
        name: &str,
        generation: u64,
        booted: Result<SandboxId, crate::EngineError>,
    ) {
        let stopping = self.inner.shutting_down.load(Ordering::SeqCst);
        let unwanted = {
            let mut pools = self.lock_pools();
            let pool = pools.get_mut(name);
            match (booted, pool) {
                (Ok(id), Some(p)) => {
                    p.filling = p.filling.saturating_sub(1);
                    if !stopping
                        && p.generation == generation
                        && (p.ready.len() as u32) < p.max.max(p.target)
                    {
                        p.ready.push_back(id);
                        None
                    } else {
                        Some(id)
                    }
                }
                (Ok(id), None) => Some(id),
                (Err(e), pool) => {
                    tracing::warn!(pool = name, error = %e, "booting a pool sandbox failed");
                    if let Some(p) = pool {
                        p.filling = p.filling.saturating_sub(1);
                        p.backoff_until = Some(Instant::now() + super::pool::FAILURE_BACKOFF);
                    }
                    None
                }
            }
        };
        if let Some(sb) = unwanted.and_then(|id| self.lookup_any(&id)) {
            let reason = if stopping {
                "daemon_shutdown"
            } else {
                "pool_drain"
            };
            self.destroy_in_background(sb, reason);
        }
        self.inner.pools.wake.notify_one();
    }
}
