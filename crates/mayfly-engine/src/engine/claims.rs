//! A claim's record, committed after the claim is answered, together with
//! the records of every claim made meanwhile.
//!
//! A claim is answered from memory (`claim_from_pool`); its store record
//! (tenant, labels, deadline, claim time and a `claimed` event) is written
//! afterwards. A commit costs about 0.17 ms of CPU on these hosts, several
//! times the claim itself, and on a two-core host a commit that starts with
//! the answer takes the core the client needs to read it. So the first
//! claim of a batch schedules one writer on the blocking pool, which waits
//! [`GATHER`] (the answer is on its way meanwhile), then takes every claim
//! queued by then and records them in one transaction. Under a burst of
//! claims, one commit serves them all. The writer also gives each claimed
//! sandbox the default CPU weight back: a pool's sandboxes boot and wait
//! at a sixteenth of it (`plan::cgroup::CpuWeight`), so that refill yields
//! to the sandboxes in use on a busy host.
//!
//! Until its record is committed a claim holds its sandbox's record lock
//! (`Sandbox::record`): everything that reads or changes the record (get,
//! list, audit, keepalive, destroy, the TTL reaper) waits for it, so no
//! reader sees the sandbox unclaimed and no later write overtakes the
//! claim. Requests that only reach the sandbox (exec, files) do not wait.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mayfly_store::PoolClaim;

use super::pool::set_cpu_weight;
use super::sandbox::Sandbox;
use super::Engine;
use crate::plan::cgroup::CpuWeight;

/// How long a batch's writer waits before it commits: long enough for the
/// claim's answer to reach its client (a round trip on these hosts is
/// about 0.1 ms), short enough that a read right after the claim barely
/// waits for the record.
const GATHER: Duration = Duration::from_micros(250);

/// What a claim's record says.
pub(crate) struct ClaimRecord {
    pub pool: String,
    pub tenant: String,
    pub caller: String,
    pub template: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub claimed_at: u64,
    pub expires_at: u64,
    pub claim_ms: f64,
}

/// A claim whose record is not committed yet, with its record lock.
struct Pending {
    sb: Arc<Sandbox>,
    record: tokio::sync::OwnedRwLockWriteGuard<()>,
    claim: ClaimRecord,
}

/// Claims waiting for their batch's writer.
#[derive(Default)]
pub(crate) struct PendingClaims {
    queue: Mutex<Batch>,
}

#[derive(Default)]
struct Batch {
    claims: Vec<Pending>,
    /// A writer is scheduled and has not taken the queue yet.
    writer: bool,
}

impl Engine {
    /// Queues a claim's record; the first claim of a batch schedules its
    /// writer (tracked like a destroy's cleanup, so shutdown waits for it).
    ///
    /// The sandbox cannot outlive the daemon, so a claim whose record is
    /// lost to a crash before its commit leaves a record of an unclaimed
    /// pool sandbox that ended with the daemon, which is what every durable
    /// trace of it says. A commit that fails destroys the sandbox (reason
    /// `claim_failed`): nothing runs in a sandbox whose record does not say
    /// whose it is.
    pub(crate) fn record_claim(
        &self,
        sb: Arc<Sandbox>,
        record: tokio::sync::OwnedRwLockWriteGuard<()>,
        claim: ClaimRecord,
    ) {
        let schedule = {
            let mut q = self.lock_claims();
            q.claims.push(Pending { sb, record, claim });
            !std::mem::replace(&mut q.writer, true)
        };
        if !schedule {
            return;
        }
        let engine = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            std::thread::sleep(GATHER);
            let batch = {
                let mut q = engine.lock_claims();
                q.writer = false;
                std::mem::take(&mut q.claims)
            };
            engine.commit_claims(batch);
        });
        self.track_cleanup(task);
    }

    fn lock_claims(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.inner
            .pools
            .claims
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Records a batch of claims in one transaction, then releases their
    /// record locks.
    fn commit_claims(&self, batch: Vec<Pending>) {
        let t = Instant::now();
        for p in &batch {
            set_cpu_weight(&p.sb.id, &p.sb.cgroup, CpuWeight::Live);
        }
        let details: Vec<serde_json::Value> = batch
            .iter()
            .map(|p| {
                let c = &p.claim;
                serde_json::json!({
                    "claim_us": (c.claim_ms * 1000.0).round() as u64,
                    "pool": c.pool,
                    "tenant": c.tenant,
                    "caller": c.caller,
                    "template": c.template,
                    "source": "pool",
                })
            })
            .collect();
        let rows: Vec<PoolClaim<'_>> = batch
            .iter()
            .zip(&details)
            .map(|(p, detail)| PoolClaim {
                id: &p.sb.id,
                tenant: &p.claim.tenant,
                labels: &p.claim.labels,
                claimed_at: p.claim.claimed_at,
                expires_at: p.claim.expires_at,
                claim_ms: p.claim.claim_ms,
                detail,
            })
            .collect();
        let done = self.inner.store.claim_pooled(&rows);
        drop(rows);
        tracing::debug!(claims = batch.len(), record = ?t.elapsed(), "claims recorded");
        let recorded = match done {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(claims = batch.len(), error = %e, "recording claims failed");
                vec![false; batch.len()]
            }
        };
        for (p, ok) in batch.into_iter().zip(recorded) {
            let Pending { sb, record, .. } = p;
            drop(record);
            if !ok {
                tracing::error!(id = %sb.id, "a claim was not recorded; destroying the sandbox");
                self.destroy_in_background(sb, "claim_failed");
            }
        }
        // Refill only once these claims are answered and recorded: a boot
        // started earlier would compete with them for the store and the CPU.
        self.inner.pools.wake.notify_one();
    }
}
