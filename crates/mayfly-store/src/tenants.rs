//! Tenants, their quotas, and API keys.
//!
//! A key is `mfk_<id>_<secret>`: `id` is 12 hex digits, public, and names the
//! key (in the audit trail as `key:<id>`); `secret` is 32 random bytes in
//! hex, shown once when the key is made. The store keeps only the SHA-256 of
//! the secret's bytes. Thirty-two random bytes cannot be guessed, so a plain
//! hash (no salt, no slow KDF) is enough: the table alone does not let
//! anyone in. A presented key is looked up by id and its hash compared in
//! constant time.

use mayfly_types::{
    Event, KeyInfo, TenantQuotas, UnixMillis, KEY_ID_LEN, KEY_PREFIX, MAX_TOTAL_QUOTA,
};
use rusqlite::{params, OptionalExtension, TransactionBehavior};
use sha2::{Digest as _, Sha256};

use crate::migrate::live;
use crate::row::Cols;
use crate::{Store, StoreError};

/// Bytes of randomness in a key's secret.
const SECRET_BYTES: usize = 32;
/// Bytes of randomness in a key's id (12 hex digits).
const ID_BYTES: usize = KEY_ID_LEN / 2;

/// A tenant as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRecord {
    pub name: String,
    pub quotas: TenantQuotas,
    pub created_at: UnixMillis,
}

/// A new key: its record and the secret to hand out once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewKey {
    pub info: KeyInfo,
    /// `mfk_<id>_<secret>`; the store does not keep it.
    pub secret: String,
}

/// What a presented key turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// The key is known, not revoked, and its secret matches.
    Valid(KeyInfo),
    /// Not of the form `mfk_<12 hex>_<64 hex>`.
    Malformed,
    /// No key has that id, or the secret does not match it.
    Wrong,
    /// The secret matches a key that has been revoked.
    Revoked(KeyInfo),
}

/// What removing a tenant did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantRemoval {
    /// Removed, and this many of its keys revoked with it.
    Removed { revoked_keys: u32 },
    /// No tenant has that name.
    Missing,
    /// The tenant still has this many live sandboxes; nothing was changed.
    HasSandboxes { live: u32 },
}

const KEY_COLUMNS: &str = "id, tenant, admin, created_at, revoked_at, last_used_at";
const TENANT_COLUMNS: &str =
    "name, max_live, max_creates_per_min, max_cpu_millis, max_memory_bytes, created_at";

impl Store {
    /// Every tenant, by name.
    pub fn tenants(&self) -> Result<Vec<TenantRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"
        ))?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(decode_tenant(row)?);
        }
        Ok(out)
    }

    pub fn tenant(&self, name: &str) -> Result<Option<TenantRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE name = ?1"
        ))?;
        let mut rows = stmt.query([name])?;
        rows.next()?.map(decode_tenant).transpose()
    }

    /// Creates the tenant, or replaces its quotas. Returns the record and
    /// whether it is new.
    pub fn put_tenant(
        &self,
        name: &str,
        quotas: &TenantQuotas,
    ) -> Result<(TenantRecord, bool), StoreError> {
        let now = self.now();
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let created_at: Option<UnixMillis> = tx
            .query_row(
                "SELECT created_at FROM tenants WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .optional()?;
        tx.execute(
            "INSERT INTO tenants (name, max_live, max_creates_per_min, max_cpu_millis, \
             max_memory_bytes, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
             ON CONFLICT (name) DO UPDATE SET max_live = ?2, max_creates_per_min = ?3, \
             max_cpu_millis = ?4, max_memory_bytes = ?5, updated_at = ?6",
            params![
                name,
                quotas.max_live,
                quotas.max_creates_per_min,
                total(quotas.max_cpu_millis)?,
                total(quotas.max_memory_bytes)?,
                now,
            ],
        )?;
        tx.commit()?;
        let rec = TenantRecord {
            name: name.to_owned(),
            quotas: *quotas,
            created_at: created_at.unwrap_or(now),
        };
        Ok((rec, created_at.is_none()))
    }

    /// Removes a tenant that has no live sandbox, and revokes its keys. Its
    /// ended sandboxes' records are kept under [`removed_tenant`].
    pub fn remove_tenant(&self, name: &str) -> Result<TenantRemoval, StoreError> {
        let now = self.now();
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists = tx
            .prepare_cached("SELECT 1 FROM tenants WHERE name = ?1")?
            .exists([name])?;
        if !exists {
            return Ok(TenantRemoval::Missing);
        }
        // A stopping sandbox is already killed: it does not hold its tenant.
        let live: u32 = tx.query_row(
            concat!(
                "SELECT count(*) FROM sandboxes WHERE tenant = ?1 AND ",
                live!(),
                " AND state != 'stopping'"
            ),
            [name],
            |r| r.get(0),
        )?;
        if live > 0 {
            return Ok(TenantRemoval::HasSandboxes { live });
        }
        let revoked = tx.execute(
            "UPDATE api_keys SET revoked_at = ?2 WHERE tenant = ?1 AND revoked_at IS NULL",
            params![name, now],
        )?;
        // Its history stays, under a name no tenant can take (`~` is not
        // allowed in one), so a tenant made later under the same name does
        // not inherit its records, audit, events or artifacts.
        let removed = removed_tenant(name, now);
        for table in ["sandboxes", "events", "execs"] {
            tx.execute(
                &format!("UPDATE {table} SET tenant = ?2 WHERE tenant = ?1"),
                params![name, removed],
            )?;
        }
        tx.execute("DELETE FROM tenants WHERE name = ?1", [name])?;
        tx.commit()?;
        Ok(TenantRemoval::Removed {
            revoked_keys: u32::try_from(revoked).unwrap_or(u32::MAX),
        })
    }

    /// Makes a key for `tenant`; `None` if there is no such tenant.
    pub fn create_key(&self, tenant: &str, admin: bool) -> Result<Option<NewKey>, StoreError> {
        let now = self.now();
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists = tx
            .prepare_cached("SELECT 1 FROM tenants WHERE name = ?1")?
            .exists([tenant])?;
        if !exists {
            return Ok(None);
        }
        // 48 random bits of id: a collision is astronomically unlikely, but
        // one would only mean drawing again.
        for _ in 0..4 {
            let id = hex(&random::<ID_BYTES>()?);
            let secret = random::<SECRET_BYTES>()?;
            let inserted = tx.execute(
                "INSERT INTO api_keys (id, tenant, admin, secret_sha256, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (id) DO NOTHING",
                params![id, tenant, admin, hash(&secret).as_slice(), now],
            )?;
            if inserted == 1 {
                tx.commit()?;
                return Ok(Some(NewKey {
                    secret: format!("{KEY_PREFIX}{id}_{}", hex(&secret)),
                    info: KeyInfo {
                        id,
                        tenant: tenant.to_owned(),
                        admin,
                        created_at: now,
                        revoked_at: None,
                        last_used_at: None,
                    },
                }));
            }
        }
        Err(StoreError::KeyIdCollisions)
    }

    /// Every key, revoked ones included, oldest first. Never a secret.
    pub fn keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, id"
        ))?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(decode_key(row)?);
        }
        Ok(out)
    }

    /// Revokes a key (idempotent: a revoked key keeps its first revocation
    /// time); `None` if there is no such key.
    pub fn revoke_key(&self, id: &str) -> Result<Option<KeyInfo>, StoreError> {
        let now = self.now();
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
            params![id, now],
        )?;
        let info = tx
            .prepare_cached(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?1"))?
            .query([id])?
            .next()?
            .map(decode_key)
            .transpose()?;
        tx.commit()?;
        Ok(info)
    }

    /// Checks a presented key. Reads only; see [`Store::touch_key`].
    pub fn verify_key(&self, presented: &str) -> Result<KeyCheck, StoreError> {
        let Some((id, secret)) = parse_key(presented) else {
            return Ok(KeyCheck::Malformed);
        };
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {KEY_COLUMNS}, secret_sha256 FROM api_keys WHERE id = ?1"
        ))?;
        let mut rows = stmt.query([id])?;
        let Some(row) = rows.next()? else {
            // Still hash and compare, so an unknown id costs what a wrong
            // secret does.
            let _ = constant_time_eq(&hash(&secret), &[0u8; 32]);
            return Ok(KeyCheck::Wrong);
        };
        let info = decode_key(row)?;
        let stored: Vec<u8> = Cols::new(row, "api_keys", 0).get(6, "secret_sha256")?;
        if !constant_time_eq(&hash(&secret), &stored) {
            return Ok(KeyCheck::Wrong);
        }
        Ok(match info.revoked_at {
            Some(_) => KeyCheck::Revoked(info),
            None => KeyCheck::Valid(info),
        })
    }

    /// Records that a key was used at `at`.
    pub fn touch_key(&self, id: &str, at: UnixMillis) -> Result<(), StoreError> {
        self.conn()
            .prepare_cached("UPDATE api_keys SET last_used_at = ?2 WHERE id = ?1")?
            .execute(params![id, at])?;
        Ok(())
    }

    /// Up to `limit` events of `tenant`'s sandboxes with a sequence number
    /// above `since`, in order, read through the `events_tenant` index, so
    /// a page costs the tenant's own events, never every tenant's. Events
    /// about no sandbox are the host's, and never a tenant's; nor is what a
    /// pool sandbox did before its claim (see migration 7).
    pub fn tenant_events(
        &self,
        tenant: &str,
        since: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(TENANT_EVENTS_SQL)?;
        let mut rows = stmt.query(params![since, limit, tenant])?;
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

/// A page of one tenant's events: `?1` since, `?2` limit, `?3` tenant.
pub(crate) const TENANT_EVENTS_SQL: &str = "SELECT seq, at, sandbox_id, kind, detail FROM events \
     WHERE tenant = ?3 AND seq > ?1 ORDER BY seq LIMIT ?2";

/// A CPU or memory total as the store's signed integer.
fn total(v: Option<u64>) -> Result<Option<i64>, StoreError> {
    v.map(|v| {
        i64::try_from(v).map_err(|_| StoreError::QuotaTooLarge {
            value: v,
            max: MAX_TOTAL_QUOTA,
        })
    })
    .transpose()
}

fn decode_tenant(row: &rusqlite::Row<'_>) -> Result<TenantRecord, StoreError> {
    let c = Cols::new(row, "tenants", 0);
    Ok(TenantRecord {
        name: c.get(0, "name")?,
        quotas: TenantQuotas {
            max_live: c.get(1, "max_live")?,
            max_creates_per_min: c.get(2, "max_creates_per_min")?,
            max_cpu_millis: c.get(3, "max_cpu_millis")?,
            max_memory_bytes: c.get(4, "max_memory_bytes")?,
        },
        created_at: c.get(5, "created_at")?,
    })
}

fn decode_key(row: &rusqlite::Row<'_>) -> Result<KeyInfo, StoreError> {
    let c = Cols::new(row, "api_keys", 0);
    Ok(KeyInfo {
        id: c.get(0, "id")?,
        tenant: c.get(1, "tenant")?,
        admin: c.get(2, "admin")?,
        created_at: c.get(3, "created_at")?,
        revoked_at: c.get(4, "revoked_at")?,
        last_used_at: c.get(5, "last_used_at")?,
    })
}

/// `mfk_<id>_<secret>` → the id and the secret's bytes.
pub(crate) fn parse_key(s: &str) -> Option<(&str, [u8; SECRET_BYTES])> {
    let rest = s.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    mayfly_types::check_key_id(id).ok()?;
    if secret.len() != SECRET_BYTES * 2 {
        return None;
    }
    let mut out = [0u8; SECRET_BYTES];
    for (i, pair) in secret.as_bytes().chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some((id, out))
}

/// A lowercase hex digit's value (uppercase is refused: one spelling per key).
fn nibble(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn hash(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

fn random<const N: usize>() -> Result<[u8; N], StoreError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| StoreError::Random {
        reason: e.to_string(),
    })?;
    Ok(b)
}

/// Compares without an early exit, so timing does not reveal how much of a
/// secret or its hash matched. (The length is not secret.)
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

/// What a removed tenant's records are kept under: `<name>~<removed at, ms>`.
pub fn removed_tenant(name: &str, at_ms: mayfly_types::UnixMillis) -> String {
    format!("{name}~{at_ms}")
}
