//! History: the most recent records, and pruning the old ones.
//!
//! The store keeps an ended sandbox's record, transitions, exec audit and
//! events until the engine prunes them (see `engine::history` in
//! mayfly-engine); reads of a long history go through the reports'
//! connection so they do not hold up writes.

use mayfly_types::UnixMillis;
use rusqlite::{params, TransactionBehavior};

use crate::migrate::{live, terminal};
use crate::sandboxes::{decode_sandbox, SANDBOX_COLUMNS};
use crate::{SandboxRecord, Store, StoreError};

/// Sandboxes [`Store::prune`] removes per transaction.
pub const PRUNE_BATCH: u64 = 500;

impl Store {
    /// The `limit` most recently created sandboxes, live or ended, of
    /// `tenant` (every tenant's with `None`), oldest first; sandboxes
    /// waiting unclaimed in a pool are left out. Read on the reports'
    /// connection: a long history does not hold up writes.
    pub fn list_recent(
        &self,
        tenant: Option<&str>,
        limit: u32,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        let sql = format!(
            "SELECT * FROM (SELECT {SANDBOX_COLUMNS}, rowid AS r FROM sandboxes \
             WHERE (?1 IS NULL OR tenant = ?1) AND NOT (tenant IS NULL AND {}) \
             ORDER BY created_at DESC, rowid DESC LIMIT ?2) ORDER BY created_at, r",
            live!()
        );
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![tenant, limit])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(decode_sandbox(row)?);
        }
        Ok(out)
    }

    /// Deletes terminal sandboxes that ended before `before`, with their
    /// transitions, execs and events; returns how many sandboxes went.
    ///
    /// Events older than `before` that belong to no sandbox left in the store
    /// (daemon-wide events, or ones about objects recovery found without a
    /// record) go too, so the database stays bounded. Done in batches of
    /// [`PRUNE_BATCH`] (see [`Store::prune_batch`]).
    pub fn prune(&self, before: UnixMillis) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let n = self.prune_batch(before, PRUNE_BATCH)?;
            total += n;
            if n < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    /// One transaction of [`Store::prune`]: at most `limit` sandboxes (the
    /// longest ended first) and at most `limit` orphaned events, so the
    /// write lock is held for a bounded time and creates, claims and execs
    /// go on between batches. Returns how many sandboxes went; fewer than
    /// `limit` means nothing older is left.
    pub fn prune_batch(&self, before: UnixMillis, limit: u64) -> Result<u64, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids: Vec<String> = tx
            .prepare_cached(concat!(
                "SELECT id FROM sandboxes WHERE ended_at < ?1 AND ",
                terminal!(),
                " ORDER BY ended_at LIMIT ?2"
            ))?
            .query_map(params![before, limit], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        {
            let mut events = tx.prepare_cached("DELETE FROM events WHERE sandbox_id = ?1")?;
            // Transitions and execs follow through ON DELETE CASCADE.
            let mut sandboxes = tx.prepare_cached("DELETE FROM sandboxes WHERE id = ?1")?;
            for id in &ids {
                events.execute([id])?;
                sandboxes.execute([id])?;
            }
        }
        tx.prepare_cached(
            "DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE at < ?1 AND \
             (sandbox_id IS NULL OR NOT EXISTS \
             (SELECT 1 FROM sandboxes s WHERE s.id = events.sandbox_id)) LIMIT ?2)",
        )?
        .execute(params![before, limit])?;
        tx.commit()?;
        Ok(ids.len() as u64)
    }
}
