//! Warm pools: sandboxes booted ahead for a template, each claimed once.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use mayfly_types::{PoolInfo, ResolvedLimits, SandboxId, TemplateRef};

use super::Engine;

/// One pool: its settings and its unclaimed sandboxes.
pub(crate) struct Pool {
    pub template: TemplateRef,
    pub limits: ResolvedLimits,
    pub target: u32,
    pub max: u32,
    pub refill_concurrency: u32,
    /// Booted and unclaimed, oldest first.
    pub ready: VecDeque<SandboxId>,
    /// Being booted for this pool now.
    pub filling: u32,
    pub claims: u64,
    pub misses: u64,
}

/// Every pool of an engine, by name.
#[derive(Default)]
pub(crate) struct Pools {
    pub by_name: Mutex<HashMap<String, Pool>>,
}

impl Engine {
    /// What each pool is and how full, by name.
    pub(crate) fn pool_infos(&self) -> Vec<PoolInfo> {
        let pools = self
            .inner
            .pools
            .by_name
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<PoolInfo> = pools
            .iter()
            .map(|(name, p)| PoolInfo {
                name: name.clone(),
                template: p.template.to_string(),
                target: p.target,
                max: p.max,
                refill_concurrency: p.refill_concurrency,
                limits: p.limits,
                ready: p.ready.len() as u32,
                filling: p.filling,
                claims: p.claims,
                misses: p.misses,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}
