use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rusqlite::Connection;

use super::{id, record};
use crate::migrate::{live, migrate, migrate_with, terminal, MIGRATIONS};
use crate::{Store, StoreError, DB_FILE};

fn user_version(conn: &Connection) -> i64 {
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

fn schema(conn: &Connection) -> Vec<String> {
    let mut stmt = conn
        .prepare(
            "SELECT type || ' ' || name || ' ' || IFNULL(sql, '') FROM sqlite_schema ORDER BY name",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

fn raw(dir: &Path) -> Connection {
    Connection::open(dir.join(DB_FILE)).unwrap()
}

#[test]
fn reopening_and_remigrating_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.insert_sandbox(&record(id(1), 10), 8).unwrap();
    let before = schema(&raw(dir.path()));
    drop(store);

    let store = Store::open(dir.path()).unwrap();
    let mut conn = raw(dir.path());
    assert_eq!(schema(&conn), before);
    assert_eq!(user_version(&conn), MIGRATIONS.len() as i64);
    assert!(store.get_sandbox(&id(1)).unwrap().is_some());

    migrate(&mut conn, dir.path()).unwrap();
    assert_eq!(schema(&conn), before);
    assert_eq!(user_version(&conn), MIGRATIONS.len() as i64);
}

#[test]
fn a_database_from_a_newer_mayfly_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let newer = MIGRATIONS.len() as i64 + 1;
    raw(dir.path())
        .pragma_update(None, "user_version", newer)
        .unwrap();

    let err = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, StoreError::TooNew { found, known, .. } if found == newer && known == newer - 1),
        "{err:?}"
    );
    assert!(err.to_string().contains("newer than"), "{err}");
    assert_eq!(user_version(&raw(dir.path())), newer);
}

#[test]
fn a_new_migration_applies_on_top_and_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    Store::open(dir.path())
        .unwrap()
        .insert_sandbox(&record(id(1), 10), 8)
        .unwrap();
    let mut next: Vec<&str> = MIGRATIONS.to_vec();
    next.push("CREATE TABLE extra (x INTEGER) STRICT;");
    let mut conn = raw(dir.path());
    migrate_with(&mut conn, dir.path(), &next).unwrap();
    assert_eq!(user_version(&conn), next.len() as i64);
    let n: i64 = conn
        .query_row("SELECT count(*) FROM sandboxes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    conn.execute("INSERT INTO extra VALUES (1)", []).unwrap();
}

#[test]
fn a_failing_migration_rolls_back_entirely() {
    let mut conn = Connection::open_in_memory().unwrap();
    let broken = [MIGRATIONS[0], "CREATE TABLE broken (;"];
    let err = migrate_with(&mut conn, Path::new(":memory:"), &broken).unwrap_err();
    assert!(
        matches!(err, StoreError::Migrate { version: 2, .. }),
        "{err:?}"
    );
    assert_eq!(user_version(&conn), 0);
    assert!(schema(&conn).is_empty(), "{:?}", schema(&conn));
}

#[test]
fn the_state_dir_and_database_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("var/lib/mayfly");
    let store = Store::open(&state).unwrap();
    store
        .add_event(None, "started", &serde_json::json!({}))
        .unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join(DB_FILE)), 0o600);
    assert_eq!(mode(&state.join(format!("{DB_FILE}-wal"))), 0o600);
}

#[test]
fn the_database_runs_in_wal_mode_with_foreign_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let conn = store.conn();
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    let fk: bool = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .unwrap();
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    assert_eq!((mode.as_str(), fk, sync), ("wal", true, 1));
}

#[test]
fn live_and_terminal_sql_match_the_state_machine() {
    use mayfly_types::SandboxState::*;
    for s in [Creating, Ready, Stopping, Destroyed, Failed] {
        let quoted = format!("'{}'", s.as_str());
        assert_eq!(live!().contains(&quoted), !s.is_terminal(), "{s:?}");
        assert_eq!(terminal!().contains(&quoted), s.is_terminal(), "{s:?}");
        assert!(MIGRATIONS[0].contains(&quoted), "{s:?} missing from CHECK");
    }
}

#[test]
fn slot_and_listing_queries_use_indexes() {
    let store = Store::open_in_memory().unwrap();
    let conn = store.conn();
    let plan = |sql: &str| -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt.query_map([], |r| r.get::<_, String>(3)).unwrap();
        rows.collect::<Result<Vec<_>, _>>().unwrap().join("; ")
    };
    for (sql, index) in [
        (
            concat!(
                "SELECT uid_slot FROM sandboxes WHERE ",
                live!(),
                " ORDER BY uid_slot"
            ),
            "sandboxes_live_slot",
        ),
        (
            concat!(
                "SELECT id FROM sandboxes WHERE ",
                live!(),
                " ORDER BY created_at, rowid"
            ),
            "sandboxes_live_created",
        ),
        (
            "SELECT id FROM sandboxes ORDER BY created_at, rowid",
            "sandboxes_created",
        ),
        (
            concat!(
                "SELECT id FROM sandboxes WHERE ended_at < 5 AND ",
                terminal!()
            ),
            "sandboxes_ended",
        ),
        (
            "SELECT seq FROM transitions WHERE sandbox_id = 'x' ORDER BY seq",
            "transitions_sandbox",
        ),
        (
            "SELECT seq FROM execs WHERE sandbox_id = 'x' ORDER BY seq",
            "execs_sandbox",
        ),
        (
            "SELECT seq FROM events WHERE sandbox_id = 'x'",
            "events_sandbox",
        ),
        ("SELECT seq FROM events WHERE at < 5", "events_at"),
        (
            "SELECT seq FROM events WHERE seq > 5 ORDER BY seq LIMIT 3",
            "INTEGER PRIMARY KEY",
        ),
        (
            "SELECT 1 FROM sandboxes WHERE id = 'x'",
            "sqlite_autoindex_sandboxes_1",
        ),
    ] {
        let p = plan(sql);
        assert!(p.contains(index), "{sql}: {p}");
        assert!(!p.contains("TEMP B-TREE"), "{sql} sorts: {p}");
    }
}

#[test]
fn migration_7_gives_old_events_and_execs_their_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = raw(dir.path());
    migrate_with(&mut conn, dir.path(), &MIGRATIONS[..6]).unwrap();
    // 1: tenant a's from the start; 2: pooled, claimed by b at 50.
    conn.execute_batch(
        "INSERT INTO sandboxes (id, state, template, created_at, expires_at, limits, labels, \
         uid_slot, owner_pid, owner_start, tenant, pool, claimed_at) VALUES \
         ('sb-1', 'ready', 't', 10, 99, '{}', '{}', 1, 1, 1, 'a', NULL, NULL), \
         ('sb-2', 'ready', 't', 50, 99, '{}', '{}', 2, 1, 1, 'b', 'py', 50);
         INSERT INTO events (at, sandbox_id, kind, detail) VALUES \
         (10, 'sb-1', 'created', '{}'), (20, 'sb-2', 'ready', '{}'), \
         (50, 'sb-2', 'claimed', '{}'), (60, NULL, 'recovered', '{}');
         INSERT INTO execs (sandbox_id, at, argv, timed_out, duration_us, stdout_bytes, \
         stderr_bytes, caller) VALUES ('sb-2', 20, '[]', 0, 1, 0, 0, 'hook'), \
         ('sb-2', 70, '[]', 0, 1, 0, 0, 'key:x');",
    )
    .unwrap();
    drop(conn);
    drop(Store::open(dir.path()).unwrap());
    let conn = raw(dir.path());
    let tenants = |table: &str| -> Vec<Option<String>> {
        conn.prepare(&format!("SELECT tenant FROM {table} ORDER BY rowid"))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let s = |t: &str| Some(t.to_owned());
    // What the pooled sandbox did before its claim is no tenant's.
    assert_eq!(tenants("events"), [s("a"), None, s("b"), None]);
    assert_eq!(tenants("execs"), [None, s("b")]);
}
