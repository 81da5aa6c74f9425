//! Mayfly's embedded store: sandboxes and their state-machine transitions,
//! the exec audit trail, events, and tenants with their API keys, in one
//! SQLite file under the state directory.
//!
//! The daemon and a daemonless CLI may share the file at the same time, so
//! every read-modify-write runs under `BEGIN IMMEDIATE` (the write lock is
//! taken up front, and the busy timeout waits for it) instead of trusting
//! the in-process mutex alone.
//!
//! Events are also published in-process once their transaction commits
//! ([`Store::subscribe_events`]), so a reader never sees one that was rolled
//! back.

mod audit;
mod bus;
mod claims;
mod error;
mod history;
mod migrate;
mod routes;
mod row;
mod sandboxes;
mod stats;
mod tenants;
#[cfg(test)]
mod tests;

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mayfly_types::UnixMillis;
use rusqlite::{Connection, OpenFlags};

pub use bus::{Subscription, BUS_CAPACITY};
pub use claims::PoolClaim;
pub use error::StoreError;
pub use history::PRUNE_BATCH;
pub use sandboxes::{SandboxRecord, Transition};
pub use stats::{percentiles, StatsQuery};
pub use tenants::{constant_time_eq, KeyCheck, NewKey, TenantRecord, TenantRemoval};

/// The database file's name inside the state directory.
pub const DB_FILE: &str = "mayfly.db";

/// How long [`Store::checkpoint`] waits for other connections.
const CHECKPOINT_WAIT: Duration = Duration::from_millis(50);
/// How long a write waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// WAL pages after which a commit checkpoints (SQLite's default is 1000).
const WAL_AUTOCHECKPOINT_PAGES: u32 = 256;

/// The source of "now", in milliseconds since the epoch.
type Clock = Arc<dyn Fn() -> UnixMillis + Send + Sync>;

/// A handle on the store. Cheap to share behind an `Arc`; every method takes
/// `&self`.
pub struct Store {
    conn: Mutex<Connection>,
    /// A read-only connection for long reports ([`Store::stats`]), opened on
    /// first use (a one-shot run never pays for it). With WAL it reads a
    /// snapshot while `conn` goes on writing, so a report over a week does
    /// not hold up the creates, claims and execs that write. `None` inside:
    /// an in-memory store, or the file would not open read-only; reports
    /// then use `conn`.
    reader: OnceLock<Option<Mutex<Connection>>>,
    path: PathBuf,
    clock: Clock,
    /// Events of committed transactions, published in sequence order (see
    /// [`Store::subscribe_events`]).
    bus: tokio::sync::broadcast::Sender<mayfly_types::Event>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (creating if needed) `state_dir/mayfly.db` and migrates it.
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| StoreError::CreateDir {
                path: state_dir.to_owned(),
                source,
            })?;
        let path = state_dir.join(DB_FILE);
        // Create the file ourselves with mode 0600: SQLite gives the -wal and
        // -shm files the mode of the database file, and the audit trail
        // holds argv, which may carry secrets, whatever the umask is.
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|source| StoreError::CreateFile {
                path: path.clone(),
                source,
            })?;
        let conn = Connection::open(&path).map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        Store::init(conn, path, true)
    }

    /// A private, empty store that lives as long as the handle; for tests
    /// and for callers that want no persistence.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        Store::init(conn, path, false)
    }

    /// Replaces the wall clock that timestamps transitions, the end of a
    /// sandbox and events, so callers (and tests) can control time.
    pub fn with_clock(self, clock: impl Fn() -> UnixMillis + Send + Sync + 'static) -> Store {
        Store {
            clock: Arc::new(clock),
            ..self
        }
    }

    fn init(mut conn: Connection, path: PathBuf, want_wal: bool) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.clone(),
            source,
        };
        // The busy timeout comes first: switching to WAL needs a lock that
        // another process opening the same file may hold for a moment.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        if want_wal {
            let mode: String = conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
                .map_err(open_err)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::NoWal { path, mode });
            }
        }
        // With WAL, NORMAL loses at most the last commits on power loss, never
        // consistency; FULL would add an fsync to every create and exec.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(open_err)?;
        // No checkpoint (and its fsyncs) when the connection closes: a
        // one-shot `mayfly run` would otherwise pay for it on every exit.
        // SQLite's automatic checkpoints still bound the WAL, and a later
        // open replays it.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(open_err)?;
        // A connection that opens the database alone rebuilds the WAL index
        // by reading the whole WAL, so a one-shot `mayfly run` pays for every
        // frame left since the last checkpoint. A smaller bound than SQLite's
        // 1000 pages keeps that read short; a checkpoint then writes only the
        // few pages that changed.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
            .map_err(open_err)?;
        migrate::migrate(&mut conn, &path)?;
        Ok(Store {
            conn: Mutex::new(conn),
            reader: OnceLock::new(),
            path,
            clock: Arc::new(wall_clock),
            bus: tokio::sync::broadcast::Sender::new(BUS_CAPACITY),
        })
    }

    /// Copies the WAL into the database and truncates it to nothing, so
    /// the next process to open the store alone has no WAL to replay. For
    /// processes off every caller's path (a reaper): the next write then
    /// starts a new WAL, and syncs its header and the directory, which is
    /// why a reaper checkpoints *before* its own write. Waits at most
    /// `CHECKPOINT_WAIT` for other connections' transactions; a busy store
    /// just keeps its WAL.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let conn = self.conn();
        conn.busy_timeout(CHECKPOINT_WAIT)?;
        let done = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        conn.busy_timeout(BUSY_TIMEOUT)?;
        done?;
        Ok(())
    }

    /// The connection. A panic while it was held cannot leave a transaction
    /// open (rusqlite rolls back on drop), so a poisoned lock is still safe.
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection for long reads: the read-only one, else `conn`.
    fn read_conn(&self) -> MutexGuard<'_, Connection> {
        let reader = self.reader.get_or_init(|| {
            if self.path == Path::new(":memory:") {
                return None;
            }
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let conn = Connection::open_with_flags(&self.path, flags).ok()?;
            conn.busy_timeout(BUSY_TIMEOUT).ok()?;
            Some(Mutex::new(conn))
        });
        match reader {
            Some(m) => m.lock().unwrap_or_else(PoisonError::into_inner),
            None => self.conn(),
        }
    }

    fn now(&self) -> UnixMillis {
        (self.clock)()
    }
}

fn wall_clock() -> UnixMillis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
