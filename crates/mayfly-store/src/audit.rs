//! The exec audit trail and the event log.

use mayfly_types::{Event, ExecAudit, SandboxId};
use rusqlite::params;

use crate::row::Cols;
use crate::{Store, StoreError};

impl Store {
    /// Appends one exec to the audit trail of its sandbox.
    pub fn record_exec(&self, audit: &ExecAudit) -> Result<(), StoreError> {
        let id: SandboxId = audit
            .sandbox_id
            .parse()
            .map_err(|source| StoreError::InvalidId { source })?;
        // JSON keeps every argv element exact, including NULs and control
        // characters, and can be read by any SQLite client during an audit.
        let argv = serde_json::to_string(&audit.argv)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        // Insert only if the sandbox exists, so an unknown id is NotFound
        // rather than a bare foreign-key failure.
        let changed = self
            .conn()
            .prepare_cached(
                "INSERT INTO execs (sandbox_id, at, argv, exit_code, signal, timed_out, error, \
                 duration_us, stdout_bytes, stderr_bytes, caller, kind, output, tenant) \
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, tenant \
                 FROM sandboxes WHERE id = ?1",
            )?
            .execute(params![
                id.as_str(),
                audit.at,
                argv,
                audit.exit_code,
                audit.signal,
                audit.timed_out,
                audit.error,
                audit.duration_us,
                audit.stdout_bytes,
                audit.stderr_bytes,
                audit.caller,
                audit.kind,
                audit.output,
            ])?;
        if changed == 0 {
            return Err(StoreError::NotFound { id });
        }
        Ok(())
    }

    /// The sandbox's execs, in the order they were recorded.
    pub fn execs(&self, id: &SandboxId) -> Result<Vec<ExecAudit>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT seq, sandbox_id, at, argv, exit_code, signal, timed_out, error, \
             duration_us, stdout_bytes, stderr_bytes, caller, kind, output \
             FROM execs WHERE sandbox_id = ?1 ORDER BY seq",
        )?;
        let mut rows = stmt.query([id.as_str()])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let c = Cols::new(row, "execs", 0);
            out.push(ExecAudit {
                sandbox_id: c.get(1, "sandbox_id")?,
                at: c.get(2, "at")?,
                argv: c.json(3, "argv")?,
                exit_code: c.get(4, "exit_code")?,
                signal: c.get(5, "signal")?,
                timed_out: c.get(6, "timed_out")?,
                error: c.get(7, "error")?,
                duration_us: c.get(8, "duration_us")?,
                stdout_bytes: c.get(9, "stdout_bytes")?,
                stderr_bytes: c.get(10, "stderr_bytes")?,
                caller: c.get(11, "caller")?,
                kind: c.get(12, "kind")?,
                output: c.get(13, "output")?,
            });
        }
        Ok(out)
    }

    /// Appends an event, timestamped now; returns its sequence number.
    pub fn add_event(
        &self,
        sandbox: Option<&SandboxId>,
        kind: &str,
        detail: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        let now = self.now();
        let conn = self.conn();
        // Autocommit: the insert is committed when it returns.
        let event = insert_event(&conn, now, sandbox, kind, detail)?;
        let seq = event.seq;
        self.publish(&conn, event);
        Ok(seq)
    }

    /// Up to `limit` events with a sequence number greater than `since`, in
    /// order. Page by passing the last `seq` seen as the next `since`.
    pub fn events(&self, since: i64, limit: u32) -> Result<Vec<Event>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT seq, at, sandbox_id, kind, detail FROM events \
             WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )?;
        let mut rows = stmt.query(params![since, limit])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let c = Cols::new(row, "events", 0);
            out.push(Event {
                seq: c.get(0, "seq")?,
                at: c.get(1, "at")?,
                sandbox_id: c.get(2, "sandbox_id")?,
                kind: c.get(3, "kind")?,
                detail: c.json(4, "detail")?,
            });
        }
        Ok(out)
    }
}

/// Appends an event on `conn` (a connection or an open transaction) and
/// returns it, to be published once its transaction has committed.
pub(crate) fn insert_event(
    conn: &rusqlite::Connection,
    at: mayfly_types::UnixMillis,
    sandbox: Option<&SandboxId>,
    kind: &str,
    detail: &serde_json::Value,
) -> Result<Event, StoreError> {
    conn.prepare_cached(
        "INSERT INTO events (at, sandbox_id, kind, detail, tenant) \
         VALUES (?1, ?2, ?3, ?4, (SELECT tenant FROM sandboxes WHERE id = ?2))",
    )?
    .execute(params![
        at,
        sandbox.map(SandboxId::as_str),
        kind,
        detail.to_string()
    ])?;
    Ok(Event {
        seq: conn.last_insert_rowid(),
        at,
        sandbox_id: sandbox.map(|s| s.to_string()),
        kind: kind.to_owned(),
        detail: detail.clone(),
    })
}
