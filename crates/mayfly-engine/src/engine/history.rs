//! Keeping the store's history bounded.
//!
//! Every sandbox leaves its record, transitions, exec audit and events in
//! the store when it ends: the evidence `mayfly stats`, `mayfly audit` and
//! `GET /v1/events` read. A daemon that runs for months would grow its
//! database without end, and every query over it slower. Ended sandboxes
//! whose end is older than [`EngineConfig::history`] are pruned with all of
//! their rows, at start and then every [`PRUNE_EVERY`], in transactions of
//! [`mayfly_store::PRUNE_BATCH`] sandboxes each, so the store's write lock
//! (which creates, claims and execs also take) is never held for long.
//! Live sandboxes are never pruned. A daemonless run's reaper prunes one
//! batch after its run, so a store that no daemon ever opens stays bounded
//! too.
//!
//! [`EngineConfig::history`]: crate::EngineConfig::history

use std::time::Duration;

use mayfly_store::PRUNE_BATCH;

use super::{now_ms, Engine};
use crate::EngineError;

/// How often the history is pruned.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// A pause between two batches: other writers go first.
const BETWEEN_BATCHES: Duration = Duration::from_millis(5);

impl Engine {
    /// Prunes the ended sandboxes older than the configured history; returns
    /// how many went. Nothing with `history: None`.
    pub async fn prune_history(&self) -> Result<u64, EngineError> {
        let Some(keep) = self.inner.cfg.history else {
            return Ok(0);
        };
        let mut total = 0;
        loop {
            let n = self
                .on_store("pruning the history", move |s| prune_once(s, keep))
                .await?;
            total += n;
            if n < PRUNE_BATCH {
                break;
            }
            tokio::time::sleep(BETWEEN_BATCHES).await;
        }
        if total > 0 {
            tracing::info!(
                pruned = total,
                older_than_secs = keep.as_secs(),
                "pruned ended sandboxes' history"
            );
        }
        Ok(total)
    }
}

/// One batch: ended sandboxes older than `keep`; returns how many went.
pub(crate) fn prune_once(
    store: &mayfly_store::Store,
    keep: Duration,
) -> Result<u64, mayfly_store::StoreError> {
    let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
    store.prune_batch(now_ms().saturating_sub(keep_ms), PRUNE_BATCH)
}
