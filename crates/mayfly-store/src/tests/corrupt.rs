//! Rows damaged behind the store's back must come back as `Corrupt` errors
//! naming the table, row and field, never as a panic or a wrong value.

use mayfly_types::{ExecAudit, SandboxState};
use serde_json::json;

use super::{id, record};
use crate::{Store, StoreError};

/// Runs raw SQL on the store's own connection, bypassing CHECK constraints
/// the way a bit flip or a careless manual edit would.
fn damage(store: &Store, sql: &str) {
    let conn = store.conn();
    conn.pragma_update(None, "ignore_check_constraints", true)
        .unwrap();
    conn.execute_batch(sql).unwrap();
    conn.pragma_update(None, "ignore_check_constraints", false)
        .unwrap();
}

fn assert_corrupt<T: std::fmt::Debug>(
    got: Result<T, StoreError>,
    table: &str,
    id: &str,
    field: &str,
) {
    match got {
        Err(StoreError::Corrupt {
            table: t,
            id: i,
            field: f,
            ..
        }) => assert_eq!((t, i.as_str(), f), (table, id, field)),
        other => panic!("expected {table}.{field} of {id} to be corrupt, got {other:?}"),
    }
}

fn store_with_one() -> Store {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    store
}

#[test]
fn an_unknown_state_is_corrupt() {
    let store = store_with_one();
    damage(&store, "UPDATE sandboxes SET state = 'exploded'");
    let key = id(1).to_string();
    assert_corrupt(store.get_sandbox(&id(1)), "sandboxes", &key, "state");
    assert_corrupt(store.list_sandboxes(true), "sandboxes", &key, "state");
    assert_corrupt(
        store.transition(&id(1), SandboxState::Ready, None),
        "sandboxes",
        &key,
        "state",
    );
}

#[test]
fn malformed_json_columns_are_corrupt() {
    let key = id(1).to_string();
    for (sql, field) in [
        ("UPDATE sandboxes SET limits = '{'", "limits"),
        ("UPDATE sandboxes SET limits = '{\"pids\": 1}'", "limits"),
        ("UPDATE sandboxes SET labels = '[1, 2]'", "labels"),
    ] {
        let store = store_with_one();
        damage(&store, sql);
        assert_corrupt(store.get_sandbox(&id(1)), "sandboxes", &key, field);
    }
}

#[test]
fn out_of_range_numbers_are_corrupt() {
    let key = id(1).to_string();
    for (sql, field) in [
        ("UPDATE sandboxes SET uid_slot = 5000000000", "uid_slot"),
        ("UPDATE sandboxes SET created_at = -1", "created_at"),
        ("UPDATE sandboxes SET owner_pid = -7", "owner_pid"),
        ("UPDATE sandboxes SET init_pid = 1 << 40", "init_pid"),
    ] {
        let store = store_with_one();
        damage(&store, sql);
        assert_corrupt(store.get_sandbox(&id(1)), "sandboxes", &key, field);
    }
}

#[test]
fn an_invalid_sandbox_id_is_corrupt() {
    let store = store_with_one();
    damage(
        &store,
        "INSERT INTO sandboxes (id, state, template, created_at, expires_at, limits, labels, \
         uid_slot, owner_pid, owner_start) \
         SELECT '../../etc', state, template, created_at, expires_at, limits, labels, 5, \
         owner_pid, owner_start FROM sandboxes",
    );
    assert_corrupt(store.list_sandboxes(false), "sandboxes", "../../etc", "id");
}

#[test]
fn corrupt_transition_exec_and_event_rows_are_corrupt() {
    let store = store_with_one();
    store
        .record_exec(&ExecAudit {
            sandbox_id: id(1).to_string(),
            at: 1,
            argv: vec!["ls".to_owned()],
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            error: None,
            duration_us: 1,
            stdout_bytes: 1,
            stderr_bytes: 0,
            caller: "cli:pid=1".to_owned(),
            kind: None,
            output: None,
        })
        .unwrap();
    let seq = store.add_event(None, "x", &json!({})).unwrap();
    damage(
        &store,
        "UPDATE transitions SET to_state = 'sideways';
         UPDATE execs SET argv = 'ls -l';
         UPDATE events SET detail = '{';",
    );
    assert_corrupt(store.transitions(&id(1)), "transitions", "1", "to_state");
    assert_corrupt(store.execs(&id(1)), "execs", "1", "argv");
    assert_corrupt(store.events(0, 10), "events", &seq.to_string(), "detail");
}

#[test]
fn corrupt_errors_read_as_a_sentence_naming_row_and_field() {
    let store = store_with_one();
    damage(&store, "UPDATE sandboxes SET state = 'exploded'");
    let msg = store.get_sandbox(&id(1)).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!(
            "row `{}` of table `sandboxes` has a corrupt `state`",
            id(1)
        )),
        "{msg}"
    );
}
