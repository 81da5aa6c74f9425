//! Sandboxes, their uid slots and their state-machine transitions.

use std::collections::BTreeMap;

use mayfly_types::{Event, ResolvedLimits, SandboxId, SandboxState, UnixMillis};
use rusqlite::{params, OptionalExtension, TransactionBehavior};

use crate::migrate::live;
use crate::row::Cols;
use crate::{Store, StoreError};

/// A sandbox as the store records it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRecord {
    pub id: SandboxId,
    pub state: SandboxState,
    /// `TemplateRef`'s string form.
    pub template: String,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    pub limits: ResolvedLimits,
    pub labels: BTreeMap<String, String>,
    /// Index of the sandbox's private host uid range; allocated by
    /// [`Store::insert_sandbox`].
    pub uid_slot: u32,
    /// Pid of the process that owns the sandbox (daemon or daemonless CLI).
    pub owner_pid: u32,
    /// That process's start time (`/proc/pid/stat` field 22), to tell a live
    /// owner from a reused pid.
    pub owner_start: u64,
    pub init_pid: Option<u32>,
    pub reason: Option<String>,
    pub create_ms: Option<f64>,
    /// The tenant that owns the sandbox; `None` while it waits in a pool.
    pub tenant: Option<String>,
    /// The pool the sandbox was made for, if it was made ahead for one.
    pub pool: Option<String>,
    /// When a tenant claimed it from its pool.
    pub claimed_at: Option<UnixMillis>,
}

/// One edge taken in a sandbox's state machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// `None` for the first record, when the sandbox came into being.
    pub from: Option<SandboxState>,
    pub to: SandboxState,
    pub at: UnixMillis,
    pub reason: Option<String>,
}

pub(crate) const SANDBOX_COLUMNS: &str =
    "id, state, template, created_at, expires_at, limits, labels, \
     uid_slot, owner_pid, owner_start, init_pid, reason, create_ms, tenant, pool, claimed_at";

impl Store {
    /// Inserts a sandbox in state `Creating` and atomically allocates the
    /// lowest uid slot in `0..max_slots` that no live sandbox holds. Returns
    /// the slot; `rec.uid_slot` and `rec.state` are ignored.
    pub fn insert_sandbox(&self, rec: &SandboxRecord, max_slots: u32) -> Result<u32, StoreError> {
        self.insert_sandbox_leasing(rec, max_slots, &mut |_| Ok(true))
    }

    /// As [`Store::insert_sandbox`], but a slot that no live record of this
    /// store holds is taken only if `lease(slot)` also accepts it (it returns
    /// false for a slot that someone outside this store holds, such as
    /// another Mayfly instance on the host); the next free slot is tried.
    pub fn insert_sandbox_leasing(
        &self,
        rec: &SandboxRecord,
        max_slots: u32,
        lease: &mut dyn FnMut(u32) -> std::io::Result<bool>,
    ) -> Result<u32, StoreError> {
        let limits = serde_json::to_string(&rec.limits).map_err(json_bug)?;
        let labels = serde_json::to_string(&rec.labels).map_err(json_bug)?;
        let now = self.now();
        let mut conn = self.conn();
        // IMMEDIATE takes the write lock before reading the held slots, so
        // another process cannot pick the same slot between read and insert.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists = tx
            .prepare_cached("SELECT 1 FROM sandboxes WHERE id = ?1")?
            .exists([rec.id.as_str()])?;
        if exists {
            return Err(StoreError::AlreadyExists { id: rec.id.clone() });
        }
        let slot = lowest_free_slot(&tx, max_slots, lease)?;
        tx.prepare_cached(
            "INSERT INTO sandboxes (id, state, template, created_at, expires_at, limits, labels, \
             uid_slot, owner_pid, owner_start, init_pid, reason, create_ms, tenant, pool, \
             claimed_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        )?
        .execute(params![
            rec.id.as_str(),
            SandboxState::Creating.as_str(),
            rec.template,
            rec.created_at,
            rec.expires_at,
            limits,
            labels,
            slot,
            rec.owner_pid,
            rec.owner_start,
            rec.init_pid,
            rec.reason,
            rec.create_ms,
            rec.tenant,
            rec.pool,
            rec.claimed_at,
        ])?;
        insert_transition(&tx, &rec.id, None, SandboxState::Creating, now, None)?;
        tx.commit()?;
        Ok(slot)
    }

    /// Moves a sandbox to `to` if the state machine allows it from its
    /// current state, sets `reason` when given, and records the transition.
    pub fn transition(
        &self,
        id: &SandboxId,
        to: SandboxState,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.transition_then(id, to, reason, |_, _| Ok(None))
    }

    /// As [`Store::transition`], only while the record still names `owner`
    /// (pid, start time) as its owner; otherwise `OwnerChanged`. For a
    /// decision made on an owner read earlier (recovery finding it dead),
    /// which must not apply to a sandbox handed to another owner since.
    pub fn transition_if_owned(
        &self,
        id: &SandboxId,
        to: SandboxState,
        reason: Option<&str>,
        owner: (u32, u64),
    ) -> Result<(), StoreError> {
        self.transition_checked(id, to, reason, Some(owner), |_, _| Ok(None))
    }

    /// A transition, then `more` inside the same transaction. The event
    /// `more` may insert is published once the transaction has committed.
    pub(crate) fn transition_then(
        &self,
        id: &SandboxId,
        to: SandboxState,
        reason: Option<&str>,
        more: impl FnOnce(&rusqlite::Transaction<'_>, UnixMillis) -> Result<Option<Event>, StoreError>,
    ) -> Result<(), StoreError> {
        self.transition_checked(id, to, reason, None, more)
    }

    fn transition_checked(
        &self,
        id: &SandboxId,
        to: SandboxState,
        reason: Option<&str>,
        owner: Option<(u32, u64)>,
        more: impl FnOnce(&rusqlite::Transaction<'_>, UnixMillis) -> Result<Option<Event>, StoreError>,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut conn = self.conn();
        // Read and write under one write lock: two processes racing to move
        // the same sandbox must see each other's result, not the same "from".
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let row: Option<(String, u32, u64)> = tx
            .prepare_cached("SELECT state, owner_pid, owner_start FROM sandboxes WHERE id = ?1")?
            .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        let Some((state, pid, start)) = row else {
            return Err(StoreError::NotFound { id: id.clone() });
        };
        if owner.is_some_and(|o| o != (pid, start)) {
            return Err(StoreError::OwnerChanged {
                id: id.clone(),
                pid,
            });
        }
        let from: SandboxState = state.parse().map_err(|reason| StoreError::Corrupt {
            table: "sandboxes",
            id: id.to_string(),
            field: "state",
            reason,
        })?;
        if !from.can_move_to(to) {
            return Err(StoreError::IllegalTransition {
                id: id.clone(),
                from,
                to,
            });
        }
        let ended_at = to.is_terminal().then_some(now);
        tx.prepare_cached(
            "UPDATE sandboxes SET state = ?2, reason = COALESCE(?3, reason), \
             ended_at = COALESCE(?4, ended_at) WHERE id = ?1",
        )?
        .execute(params![id.as_str(), to.as_str(), reason, ended_at])?;
        insert_transition(&tx, id, Some(from), to, now, reason)?;
        let event = more(&tx, now)?;
        tx.commit()?;
        if let Some(event) = event {
            self.publish(&conn, event);
        }
        Ok(())
    }

    /// Moves a sandbox to `to` (as [`Store::transition`] does) and appends
    /// an event, in one transaction.
    pub fn transition_with_event(
        &self,
        id: &SandboxId,
        to: SandboxState,
        reason: Option<&str>,
        event: (&str, &serde_json::Value),
    ) -> Result<(), StoreError> {
        self.transition_then(id, to, reason, |tx, now| {
            crate::audit::insert_event(tx, now, Some(id), event.0, event.1).map(Some)
        })
    }

    /// Moves a creating sandbox to `Ready`, records its init's host pid and
    /// how long the create took, and appends a `ready` event, in one
    /// transaction.
    pub fn mark_ready(
        &self,
        id: &SandboxId,
        init_pid: u32,
        create_ms: f64,
        detail: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.transition_then(id, SandboxState::Ready, None, |tx, now| {
            tx.prepare_cached("UPDATE sandboxes SET init_pid = ?2, create_ms = ?3 WHERE id = ?1")?
                .execute(params![id.as_str(), init_pid, create_ms])?;
            crate::audit::insert_event(tx, now, Some(id), "ready", detail).map(Some)
        })
    }

    /// Moves a sandbox to `Stopping` and hands it to a new owner (the
    /// detached reaper that finishes destroying it), in one transaction: a
    /// recovery that runs meanwhile sees a live owner, or, once the reaper
    /// has died unfinished, a dead one.
    pub fn stop_and_hand_over(
        &self,
        id: &SandboxId,
        reason: &str,
        owner_pid: u32,
        owner_start: u64,
    ) -> Result<(), StoreError> {
        self.transition_then(id, SandboxState::Stopping, Some(reason), |tx, _| {
            tx.prepare_cached(
                "UPDATE sandboxes SET owner_pid = ?2, owner_start = ?3 WHERE id = ?1",
            )?
            .execute(params![id.as_str(), owner_pid, owner_start])?;
            Ok(None)
        })
    }

    /// Records the init's host pid and how long the create took.
    pub fn set_ready_info(
        &self,
        id: &SandboxId,
        init_pid: u32,
        create_ms: f64,
    ) -> Result<(), StoreError> {
        let changed = self
            .conn()
            .prepare_cached("UPDATE sandboxes SET init_pid = ?2, create_ms = ?3 WHERE id = ?1")?
            .execute(params![id.as_str(), init_pid, create_ms])?;
        if changed == 0 {
            return Err(StoreError::NotFound { id: id.clone() });
        }
        Ok(())
    }

    /// Moves a live sandbox's deadline (a parked sandbox gets its TTL when
    /// a run claims it).
    pub fn set_expires_at(&self, id: &SandboxId, expires_at: UnixMillis) -> Result<(), StoreError> {
        let changed = self
            .conn()
            .prepare_cached("UPDATE sandboxes SET expires_at = ?2 WHERE id = ?1")?
            .execute(params![id.as_str(), expires_at])?;
        if changed == 0 {
            return Err(StoreError::NotFound { id: id.clone() });
        }
        Ok(())
    }

    pub fn get_sandbox(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1"
        ))?;
        let mut rows = stmt.query([id.as_str()])?;
        match rows.next()? {
            Some(row) => Ok(Some(decode_sandbox(row)?)),
            None => Ok(None),
        }
    }

    /// Sandboxes ordered by creation time (then insertion order); only live
    /// ones unless `include_terminal`.
    pub fn list_sandboxes(&self, include_terminal: bool) -> Result<Vec<SandboxRecord>, StoreError> {
        let sql = if include_terminal {
            format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes ORDER BY created_at, rowid")
        } else {
            format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE {} ORDER BY created_at, rowid",
                live!()
            )
        };
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(decode_sandbox(row)?);
        }
        Ok(out)
    }

    /// The sandbox's transitions, oldest first.
    pub fn transitions(&self, id: &SandboxId) -> Result<Vec<Transition>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT seq, from_state, to_state, at, reason FROM transitions \
             WHERE sandbox_id = ?1 ORDER BY seq",
        )?;
        let mut rows = stmt.query([id.as_str()])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let c = Cols::new(row, "transitions", 0);
            let from: Option<String> = c.get(1, "from_state")?;
            let from = match from {
                Some(s) => Some(
                    s.parse::<SandboxState>()
                        .map_err(|e| c.corrupt("from_state", e))?,
                ),
                None => None,
            };
            out.push(Transition {
                from,
                to: c.parse(2, "to_state")?,
                at: c.get(3, "at")?,
                reason: c.get(4, "reason")?,
            });
        }
        Ok(out)
    }
}

/// The lowest slot below `max` that no live sandbox holds and `lease`
/// accepts.
///
/// Walks the held slots in order through the partial unique index, trying
/// each gap in turn, so the cost is the number of slots below the one taken.
fn lowest_free_slot(
    conn: &rusqlite::Connection,
    max: u32,
    lease: &mut dyn FnMut(u32) -> std::io::Result<bool>,
) -> Result<u32, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT uid_slot FROM sandboxes WHERE ",
        live!(),
        " ORDER BY uid_slot"
    ))?;
    let mut held = stmt.query_map([], |r| r.get::<_, i64>(0))?;
    let mut next_held = held.next().transpose()?;
    for slot in 0..max {
        while next_held.is_some_and(|h| h < i64::from(slot)) {
            next_held = held.next().transpose()?;
        }
        if next_held == Some(i64::from(slot)) {
            continue;
        }
        match lease(slot) {
            Ok(true) => return Ok(slot),
            Ok(false) => {}
            Err(source) => return Err(StoreError::Lease { slot, source }),
        }
    }
    Err(StoreError::SlotsExhausted { max })
}

fn insert_transition(
    conn: &rusqlite::Connection,
    id: &SandboxId,
    from: Option<SandboxState>,
    to: SandboxState,
    at: UnixMillis,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO transitions (sandbox_id, from_state, to_state, at, reason) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        id.as_str(),
        from.map(SandboxState::as_str),
        to.as_str(),
        at,
        reason
    ])?;
    Ok(())
}

pub(crate) fn decode_sandbox(row: &rusqlite::Row<'_>) -> Result<SandboxRecord, StoreError> {
    let c = Cols::new(row, "sandboxes", 0);
    let id = c
        .key()
        .parse::<SandboxId>()
        .map_err(|e| c.corrupt("id", e.to_string()))?;
    Ok(SandboxRecord {
        id,
        state: c.parse(1, "state")?,
        template: c.get(2, "template")?,
        created_at: c.get(3, "created_at")?,
        expires_at: c.get(4, "expires_at")?,
        limits: c.json(5, "limits")?,
        labels: c.json(6, "labels")?,
        uid_slot: c.get(7, "uid_slot")?,
        owner_pid: c.get(8, "owner_pid")?,
        owner_start: c.get(9, "owner_start")?,
        init_pid: c.get(10, "init_pid")?,
        reason: c.get(11, "reason")?,
        create_ms: c.get(12, "create_ms")?,
        tenant: c.get(13, "tenant")?,
        pool: c.get(14, "pool")?,
        claimed_at: c.get(15, "claimed_at")?,
    })
}

/// Serialising plain data structs with string keys cannot fail; if it ever
/// does, report it as a conversion error rather than panic.
pub(crate) fn json_bug(e: serde_json::Error) -> StoreError {
    StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}
