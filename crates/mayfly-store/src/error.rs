//! What can go wrong in the store. Each variant carries the context needed to
//! act on it (path, sandbox id, row) and never repeats its source's message.

use std::path::PathBuf;

use mayfly_types::{IdError, SandboxId, SandboxState};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the state directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot create the database file {path}")]
    CreateFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot open the database {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },

    #[error("the database {path} stays in `{mode}` journal mode instead of WAL; put the state directory on a local filesystem")]
    NoWal { path: PathBuf, mode: String },

    #[error("the database {path} has schema version {found}, newer than the {known} this Mayfly knows; upgrade Mayfly or use another state directory")]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },

    #[error("the migration of {path} to schema version {version} failed")]
    Migrate {
        path: PathBuf,
        version: usize,
        #[source]
        source: rusqlite::Error,
    },

    #[error("a database operation failed")]
    Sqlite(#[from] rusqlite::Error),

    #[error("sandbox {id} cannot move from `{}` to `{}`", .from.as_str(), .to.as_str())]
    IllegalTransition {
        id: SandboxId,
        from: SandboxState,
        to: SandboxState,
    },

    #[error("there is no sandbox {id} in the store")]
    NotFound { id: SandboxId },

    #[error("sandbox {id} is owned by another process now (pid {pid})")]
    OwnerChanged { id: SandboxId, pid: u32 },

    #[error("sandbox {id} is already in the store")]
    AlreadyExists { id: SandboxId },

    #[error("all {max} uid slots are held by live sandboxes")]
    SlotsExhausted { max: u32 },

    #[error("leasing uid slot {slot}")]
    Lease {
        slot: u32,
        #[source]
        source: std::io::Error,
    },

    #[error("the exec audit record names an invalid sandbox id")]
    InvalidId {
        #[source]
        source: IdError,
    },

    #[error("a quota of {value} is more than the store can hold ({max})")]
    QuotaTooLarge { value: u64, max: u64 },

    #[error("four random key ids in a row were taken; the random source is broken")]
    KeyIdCollisions,

    #[error("the system's random source failed: {reason}")]
    Random { reason: String },

    /// A row read back from the database does not decode. `id` is the row's
    /// key: the sandbox id, or the sequence number for events and execs.
    #[error("row `{id}` of table `{table}` has a corrupt `{field}`: {reason}")]
    Corrupt {
        table: &'static str,
        id: String,
        field: &'static str,
        reason: String,
    },
}
