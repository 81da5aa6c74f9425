//! Claims of pooled sandboxes, recorded in batches.

use std::collections::BTreeMap;

use mayfly_types::{SandboxId, UnixMillis};
use rusqlite::{params, TransactionBehavior};

use crate::sandboxes::json_bug;
use crate::{Store, StoreError};

/// One claim of a pooled sandbox to record (see [`Store::claim_pooled`]).
#[derive(Debug, Clone, Copy)]
pub struct PoolClaim<'a> {
    pub id: &'a SandboxId,
    pub tenant: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub claimed_at: UnixMillis,
    pub expires_at: UnixMillis,
    pub claim_ms: f64,
    /// The `claimed` event's detail.
    pub detail: &'a serde_json::Value,
}

impl Store {
    /// Records claims of pooled sandboxes, in one transaction: each gives
    /// a ready, unclaimed pool sandbox to its tenant, with its labels, its
    /// deadline, when it was claimed (also its `created_at` from now on: to
    /// its tenant, the sandbox was created by the claim) and how long the
    /// claim took (kept as its `create_ms`), and appends a `claimed` event. A
    /// claim is recorded only if its sandbox is still ready and unclaimed,
    /// so a sandbox is claimed at most once; the answer says, claim by
    /// claim, whether it was. The events are published once the
    /// transaction has committed. One transaction for every claim that
    /// arrived together is what keeps a burst of claims from paying one
    /// commit each.
    pub fn claim_pooled(&self, claims: &[PoolClaim<'_>]) -> Result<Vec<bool>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut recorded = Vec::with_capacity(claims.len());
        let mut events = Vec::new();
        for c in claims {
            let labels = serde_json::to_string(c.labels).map_err(json_bug)?;
            let changed = tx
                .prepare_cached(
                    "UPDATE sandboxes SET tenant = ?2, labels = ?3, expires_at = ?4, \
                     claimed_at = ?5, created_at = ?5, create_ms = ?6 \
                     WHERE id = ?1 AND tenant IS NULL AND state = 'ready'",
                )?
                .execute(params![
                    c.id.as_str(),
                    c.tenant,
                    labels,
                    c.expires_at,
                    c.claimed_at,
                    c.claim_ms
                ])?;
            recorded.push(changed == 1);
            if changed == 1 {
                // The claim was answered from memory: the commands and
                // events of the moments before this write are the tenant's
                // too (the boot's, before the claim, stay the pool's).
                for table in ["execs", "events"] {
                    tx.prepare_cached(&format!(
                        "UPDATE {table} SET tenant = ?2 \
                         WHERE sandbox_id = ?1 AND tenant IS NULL AND at >= ?3"
                    ))?
                    .execute(params![
                        c.id.as_str(),
                        c.tenant,
                        c.claimed_at
                    ])?;
                }
                events.push(crate::audit::insert_event(
                    &tx,
                    c.claimed_at,
                    Some(c.id),
                    "claimed",
                    c.detail,
                )?);
            }
        }
        tx.commit()?;
        for event in events {
            self.publish(&conn, event);
        }
        Ok(recorded)
    }
}
