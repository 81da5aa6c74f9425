//! Warm pools: sandboxes booted ahead for one template, each claimed once.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Limits, ResolvedLimits};

/// `PUT /v1/pools/{name}`: the pool's settings. Absent fields keep their
/// current value (or the default, for a new pool).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    /// The template every sandbox of the pool boots from (`host` when absent).
    pub template: Option<String>,
    /// How many sandboxes to keep booted and unclaimed.
    pub target: Option<u32>,
    /// The most sandboxes the pool holds, unclaimed, at any time.
    pub max: Option<u32>,
    /// How many sandboxes the pool boots at once while refilling.
    pub refill_concurrency: Option<u32>,
    /// The limits of the pool's sandboxes; a create must ask for the same
    /// resolved limits to be served from this pool.
    #[serde(default)]
    pub limits: Limits,
    /// Boot the pool's sandboxes with a network interface (egress blocked
    /// until claimed); they then serve creates whose egress is `allow` or
    /// `open`, and only those. False when absent for a new pool.
    #[serde(default)]
    pub network: Option<bool>,
}

/// What a pool is, and how full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolInfo {
    pub name: String,
    pub template: String,
    pub target: u32,
    pub max: u32,
    pub refill_concurrency: u32,
    pub limits: ResolvedLimits,
    /// Whether the pool's sandboxes have a network interface (and serve
    /// creates with egress `allow` or `open`).
    #[serde(default)]
    pub network: bool,
    /// Booted, unclaimed sandboxes, ready to be claimed now.
    pub ready: u32,
    /// Sandboxes being booted for the pool right now.
    pub filling: u32,
    /// Claims served since the daemon started.
    pub claims: u64,
    /// Creates that matched the pool's template but found it empty, and were
    /// booted cold instead.
    pub misses: u64,
}

/// `GET /v1/pools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<PoolInfo>,
}
