//! Versioned schema migrations.
//!
//! `PRAGMA user_version` holds how many entries of [`MIGRATIONS`] a database
//! has applied. Migrations are append-only: never edit a shipped entry, add a
//! new one. A database whose version is newer than this list is refused
//! rather than guessed at, so an old binary never writes into a schema it
//! does not understand.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::StoreError;

/// The SQL condition for a live (non-terminal) sandbox. Queries must spell it
/// exactly like the partial indexes do, or SQLite will not use those indexes.
macro_rules! live {
    () => {
        "state IN ('creating', 'ready', 'stopping')"
    };
}
pub(crate) use live;

/// The SQL condition for a terminal sandbox.
macro_rules! terminal {
    () => {
        "state IN ('destroyed', 'failed')"
    };
}
pub(crate) use terminal;

/// Schema migrations, in order. Entry `i` takes the database to version `i + 1`.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: sandboxes, their transitions, the exec audit trail and events.
    concat!(
        "
CREATE TABLE sandboxes (
    id          TEXT PRIMARY KEY NOT NULL,
    state       TEXT NOT NULL
                CHECK (state IN ('creating', 'ready', 'stopping', 'destroyed', 'failed')),
    template    TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    -- When the sandbox reached a terminal state; what prune() ages by.
    ended_at    INTEGER,
    limits      TEXT NOT NULL,
    labels      TEXT NOT NULL,
    uid_slot    INTEGER NOT NULL CHECK (uid_slot >= 0),
    owner_pid   INTEGER NOT NULL,
    owner_start INTEGER NOT NULL,
    init_pid    INTEGER,
    reason      TEXT,
    create_ms   REAL
) STRICT;

-- No two live sandboxes may share a uid range. insert_sandbox() already
-- guarantees it under BEGIN IMMEDIATE; the index makes a bug there fail
-- loudly instead of handing one host uid range to two sandboxes.
CREATE UNIQUE INDEX sandboxes_live_slot ON sandboxes (uid_slot) WHERE ",
        live!(),
        ";
CREATE INDEX sandboxes_created ON sandboxes (created_at);
CREATE INDEX sandboxes_live_created ON sandboxes (created_at) WHERE ",
        live!(),
        ";
CREATE INDEX sandboxes_ended ON sandboxes (ended_at) WHERE ended_at IS NOT NULL;

CREATE TABLE transitions (
    seq        INTEGER PRIMARY KEY,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    at         INTEGER NOT NULL,
    reason     TEXT
) STRICT;
CREATE INDEX transitions_sandbox ON transitions (sandbox_id, seq);

CREATE TABLE execs (
    seq          INTEGER PRIMARY KEY,
    sandbox_id   TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    at           INTEGER NOT NULL,
    argv         TEXT NOT NULL,
    exit_code    INTEGER,
    signal       INTEGER,
    timed_out    INTEGER NOT NULL,
    error        TEXT,
    duration_us  INTEGER NOT NULL,
    stdout_bytes INTEGER NOT NULL,
    stderr_bytes INTEGER NOT NULL,
    caller       TEXT NOT NULL
) STRICT;
CREATE INDEX execs_sandbox ON execs (sandbox_id, seq);

-- AUTOINCREMENT so a seq is never reused after prune() deletes the newest
-- rows: clients page with ?since=seq and must not miss or repeat events.
-- No foreign key: recovery may report on a sandbox the store never knew.
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    sandbox_id TEXT,
    kind       TEXT NOT NULL,
    detail     TEXT NOT NULL
) STRICT;
CREATE INDEX events_sandbox ON events (sandbox_id) WHERE sandbox_id IS NOT NULL;
CREATE INDEX events_at ON events (at);
"
    ),
    // 2: tenancy and warm pools. `tenant` is who owns a sandbox (NULL while it
    // waits unclaimed in a pool); `pool` names the pool a sandbox was made
    // for (kept after its claim: it says the sandbox came from a pool);
    // `claimed_at` is when a tenant took it.
    concat!(
        "
ALTER TABLE sandboxes ADD COLUMN tenant TEXT DEFAULT 'default';
ALTER TABLE sandboxes ADD COLUMN pool TEXT;
ALTER TABLE sandboxes ADD COLUMN claimed_at INTEGER;
CREATE INDEX sandboxes_live_tenant ON sandboxes (tenant) WHERE ",
        live!(),
        ";
"
    ),
    // 3: tenants with their quotas (NULL = unlimited), and API keys. A key
    // is stored as the SHA-256 of its 32 random secret bytes, never in
    // clear. Keys outlive their tenant as revoked rows (for the audit
    // trail's `key:<id>` callers), so there is no foreign key.
    "
CREATE TABLE tenants (
    name                TEXT PRIMARY KEY NOT NULL,
    max_live            INTEGER CHECK (max_live >= 0),
    max_creates_per_min INTEGER CHECK (max_creates_per_min >= 0),
    max_cpu_millis      INTEGER CHECK (max_cpu_millis >= 0),
    max_memory_bytes    INTEGER CHECK (max_memory_bytes >= 0),
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
) STRICT;
-- The host operator's tenant: callers without a key.
INSERT INTO tenants (name, created_at, updated_at) VALUES ('default', 0, 0);

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY NOT NULL,
    tenant        TEXT NOT NULL,
    admin         INTEGER NOT NULL CHECK (admin IN (0, 1)),
    secret_sha256 BLOB NOT NULL CHECK (length(secret_sha256) = 32),
    created_at    INTEGER NOT NULL,
    revoked_at    INTEGER,
    last_used_at  INTEGER
) STRICT;
CREATE INDEX api_keys_tenant ON api_keys (tenant);
",
    // 4: gateway routes: a service name and its shared baseline URL.
    // Daemon-wide; a sandbox's overrides of them live and die with the
    // sandbox, in memory.
    "
CREATE TABLE routes (
    name       TEXT PRIMARY KEY NOT NULL,
    url        TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
",
    // 5: what an audited command was (NULL: a user's command; `hook:<point>`
    // for a lifecycle hook) and a hook's bounded, redacted output.
    "
ALTER TABLE execs ADD COLUMN kind TEXT;
ALTER TABLE execs ADD COLUMN output TEXT;
",
    // 6: what `stats` reads by time: a sandbox counts at its claim, else at
    // its creation (the expression is `stats::CREATED`, character for
    // character, so the planner uses the index), and execs by when they ran.
    "
CREATE INDEX sandboxes_counted_at ON sandboxes (COALESCE(claimed_at, created_at));
CREATE INDEX execs_at ON execs (at);
",
    // 7: what a tenant reads leads with its tenant, so a tenant's page of
    // events or its stats report reads its own rows, never every tenant's.
    // `events.tenant` and `execs.tenant` copy their sandbox's tenant when
    // they are written, and follow it when a tenant is removed. NULL is no
    // tenant's: an event about no sandbox, or what a pool sandbox did
    // before its claim (to its tenant, a pooled sandbox begins with its
    // `claimed` event, as its `created_at` is the claim's time).
    "
ALTER TABLE events ADD COLUMN tenant TEXT;
UPDATE events SET tenant = (SELECT s.tenant FROM sandboxes s WHERE s.id = events.sandbox_id
    AND (s.claimed_at IS NULL OR events.at >= s.claimed_at)) WHERE sandbox_id IS NOT NULL;
CREATE INDEX events_tenant ON events (tenant, seq);
ALTER TABLE execs ADD COLUMN tenant TEXT;
UPDATE execs SET tenant = (SELECT s.tenant FROM sandboxes s WHERE s.id = execs.sandbox_id
    AND (s.claimed_at IS NULL OR execs.at >= s.claimed_at));
CREATE INDEX execs_tenant_at ON execs (tenant, at);
CREATE INDEX sandboxes_tenant_counted_at ON sandboxes (tenant, COALESCE(claimed_at, created_at));
",
];

/// Brings the database up to the last version in [`MIGRATIONS`], or refuses
/// a newer one.
///
/// Runs under BEGIN IMMEDIATE and re-reads the version inside it, so a
/// daemon and a CLI opening a fresh state directory at once apply each
/// migration exactly once.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    migrate_with(conn, path, MIGRATIONS)
}

pub(crate) fn migrate_with(
    conn: &mut Connection,
    path: &Path,
    migrations: &[&str],
) -> Result<(), StoreError> {
    let open_err = |source| StoreError::Open {
        path: path.to_owned(),
        source,
    };
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(open_err)?;
    let found: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(open_err)?;
    // The list is a handful of entries; the cast cannot truncate.
    let known = migrations.len() as i64;
    if found > known {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known,
        });
    }
    let done = usize::try_from(found).map_err(|_| StoreError::Corrupt {
        table: "sqlite_schema",
        id: path.display().to_string(),
        field: "user_version",
        reason: format!("negative schema version {found}"),
    })?;
    for (i, sql) in migrations.iter().enumerate().skip(done) {
        tx.execute_batch(sql)
            .map_err(|source| StoreError::Migrate {
                path: path.to_owned(),
                version: i + 1,
                source,
            })?;
    }
    if done < migrations.len() {
        tx.pragma_update(None, "user_version", known)
            .map_err(open_err)?;
    }
    tx.commit().map_err(open_err)
}
