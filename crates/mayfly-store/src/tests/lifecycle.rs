use std::collections::BTreeMap;

use mayfly_types::{ExecAudit, ResolvedLimits, SandboxState};
use serde_json::json;

use super::{clocked_store, destroy, id, record};
use crate::{Store, StoreError, Transition};

fn exec_of(n: u64) -> ExecAudit {
    ExecAudit {
        sandbox_id: id(n).to_string(),
        at: 1,
        argv: vec!["true".to_owned()],
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        error: None,
        duration_us: 10,
        stdout_bytes: 0,
        stderr_bytes: 0,
        caller: "cli:pid=1".to_owned(),
        kind: None,
        output: None,
    }
}

#[test]
fn a_record_round_trips_every_field() {
    let store = Store::open_in_memory().unwrap();
    let mut rec = record(id(5), 1_700_000_000_000);
    rec.template = "dir:/srv/rootfs".to_owned();
    rec.limits = ResolvedLimits {
        memory_bytes: 1 << 30,
        pids: 64,
        ..ResolvedLimits::DEFAULT
    };
    rec.labels = BTreeMap::from([
        ("ünïcode".to_owned(), "✓".to_owned()),
        ("empty".to_owned(), String::new()),
    ]);
    rec.owner_start = i64::MAX as u64;
    rec.owner_pid = u32::MAX;
    let slot = store.insert_sandbox(&rec, 8).unwrap();
    store.set_ready_info(&id(5), 31337, 2.75).unwrap();
    store.transition(&id(5), SandboxState::Ready, None).unwrap();

    let expected = crate::SandboxRecord {
        state: SandboxState::Ready,
        uid_slot: slot,
        init_pid: Some(31337),
        create_ms: Some(2.75),
        ..rec
    };
    assert_eq!(store.get_sandbox(&id(5)).unwrap(), Some(expected));
    assert_eq!(store.get_sandbox(&id(6)).unwrap(), None);
}

#[test]
fn illegal_transitions_are_rejected_and_change_nothing() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    let before = store.get_sandbox(&id(1)).unwrap();

    let err = store
        .transition(&id(1), SandboxState::Destroyed, Some("skip"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::IllegalTransition {
                from: SandboxState::Creating,
                to: SandboxState::Destroyed,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "sandbox {} cannot move from `creating` to `destroyed`",
            id(1)
        )
    );
    assert_eq!(store.get_sandbox(&id(1)).unwrap(), before);
    assert_eq!(store.transitions(&id(1)).unwrap().len(), 1);

    destroy(&store, &id(1));
    for to in [
        SandboxState::Ready,
        SandboxState::Creating,
        SandboxState::Failed,
        SandboxState::Destroyed,
    ] {
        let err = store.transition(&id(1), to, Some("again")).unwrap_err();
        assert!(
            matches!(err, StoreError::IllegalTransition { .. }),
            "{err:?}"
        );
    }
    let after = store.get_sandbox(&id(1)).unwrap().unwrap();
    assert_eq!((after.state, after.reason), (SandboxState::Destroyed, None));
    assert_eq!(store.transitions(&id(1)).unwrap().len(), 4);
}

#[test]
fn unknown_sandboxes_are_not_found() {
    let store = Store::open_in_memory().unwrap();
    let err = store
        .transition(&id(9), SandboxState::Ready, None)
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NotFound { id: i } if *i == id(9)),
        "{err:?}"
    );
    let err = store.set_ready_info(&id(9), 1, 1.0).unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    let err = store.record_exec(&exec_of(9)).unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(store.transitions(&id(9)).unwrap().is_empty());
}

#[test]
fn transitions_are_recorded_in_order_with_time_and_reason() {
    use SandboxState::*;
    let (store, clock) = clocked_store();
    store.insert_sandbox(&record(id(1), 1000), 8).unwrap();
    // Two transitions in the same millisecond still come back in order.
    store.transition(&id(1), Ready, None).unwrap();
    clock.set(2000);
    store.transition(&id(1), Stopping, Some("ttl")).unwrap();
    clock.set(2000);
    store.transition(&id(1), Destroyed, None).unwrap();

    let t = |from, to, at, reason: Option<&str>| Transition {
        from,
        to,
        at,
        reason: reason.map(str::to_owned),
    };
    assert_eq!(
        store.transitions(&id(1)).unwrap(),
        [
            t(None, Creating, 1000, None),
            t(Some(Creating), Ready, 1000, None),
            t(Some(Ready), Stopping, 2000, Some("ttl")),
            t(Some(Stopping), Destroyed, 2000, None),
        ]
    );
    // A transition without a reason keeps the one already given.
    let rec = store.get_sandbox(&id(1)).unwrap().unwrap();
    assert_eq!((rec.state, rec.reason.as_deref()), (Destroyed, Some("ttl")));
}

#[test]
fn listing_is_ordered_by_creation_and_hides_terminal_by_default() {
    let store = Store::open_in_memory().unwrap();
    // Inserted out of order, with a tie at 20 broken by insertion order.
    for (n, created) in [(1, 30), (2, 10), (3, 20), (4, 20), (5, 5)] {
        store.insert_sandbox(&record(id(n), created), 8).unwrap();
    }
    store
        .transition(&id(5), SandboxState::Failed, Some("boom"))
        .unwrap();
    let ids = |all| -> Vec<_> {
        store
            .list_sandboxes(all)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(ids(false), [id(2), id(3), id(4), id(1)]);
    assert_eq!(ids(true), [id(5), id(2), id(3), id(4), id(1)]);
}

#[test]
fn prune_removes_only_old_terminal_sandboxes_and_their_rows() {
    use SandboxState::*;
    let (store, clock) = clocked_store();
    // old_dead ends at 100, new_dead at 300; old_live is old but still live.
    let (old_dead, new_dead, old_live) = (id(1), id(2), id(3));
    clock.set(50);
    for (n, sb) in [&old_dead, &new_dead, &old_live].into_iter().enumerate() {
        store
            .insert_sandbox(&record(sb.clone(), n as u64), 8)
            .unwrap();
        store.record_exec(&exec_of(n as u64 + 1)).unwrap();
        store.add_event(Some(sb), "created", &json!({})).unwrap();
    }
    store.add_event(None, "daemon_started", &json!({})).unwrap();
    store
        .add_event(Some(&id(99)), "leak_found", &json!({}))
        .unwrap();
    clock.set(100);
    store.transition(&old_dead, Failed, Some("boom")).unwrap();
    clock.set(300);
    store.transition(&new_dead, Failed, Some("boom")).unwrap();
    store.add_event(None, "recent", &json!({})).unwrap();

    assert_eq!(store.prune(200).unwrap(), 1);

    assert_eq!(store.get_sandbox(&old_dead).unwrap(), None);
    assert!(store.transitions(&old_dead).unwrap().is_empty());
    assert!(store.execs(&old_dead).unwrap().is_empty());
    for kept in [&new_dead, &old_live] {
        assert!(store.get_sandbox(kept).unwrap().is_some());
        assert!(!store.transitions(kept).unwrap().is_empty());
        assert_eq!(store.execs(kept).unwrap().len(), 1);
    }
    let events: Vec<(Option<String>, String)> = store
        .events(0, 100)
        .unwrap()
        .into_iter()
        .map(|e| (e.sandbox_id, e.kind))
        .collect();
    assert_eq!(
        events,
        [
            (Some(new_dead.to_string()), "created".to_owned()),
            (Some(old_live.to_string()), "created".to_owned()),
            (None, "recent".to_owned()),
        ]
    );
    assert_eq!(store.prune(200).unwrap(), 0);
    assert_eq!(store.prune(301).unwrap(), 1);
    assert_eq!(store.list_sandboxes(true).unwrap().len(), 1);
}

#[test]
fn prune_batches_take_the_longest_ended_first_and_stop_at_their_limit() {
    let (store, clock) = clocked_store();
    // Five sandboxes ending at 110, 120, … 150, each with an event; and
    // three old events of no sandbox.
    for n in 1..=5 {
        clock.set(50);
        store.insert_sandbox(&record(id(n), 0), 8).unwrap();
        store
            .add_event(Some(&id(n)), "created", &json!({}))
            .unwrap();
        clock.set(100 + 10 * n);
        store
            .transition(&id(n), SandboxState::Failed, Some("boom"))
            .unwrap();
    }
    for _ in 0..3 {
        store.add_event(None, "tick", &json!(null)).unwrap();
    }
    clock.set(1000);
    let left = |store: &Store| -> Vec<_> {
        let mut v: Vec<_> = store
            .list_sandboxes(true)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        v.sort();
        v
    };
    assert_eq!(store.prune_batch(500, 2).unwrap(), 2);
    assert_eq!(
        left(&store),
        [id(3), id(4), id(5)],
        "the two that ended first"
    );
    // Two of the three orphaned events went with the first batch.
    let orphans = |store: &Store| {
        store
            .events(0, 100)
            .unwrap()
            .iter()
            .filter(|e| e.sandbox_id.is_none())
            .count()
    };
    assert_eq!(orphans(&store), 1);
    assert_eq!(store.prune_batch(500, 2).unwrap(), 2);
    assert_eq!(
        store.prune_batch(500, 2).unwrap(),
        1,
        "fewer than the limit: done"
    );
    assert!(left(&store).is_empty());
    assert_eq!(store.events(0, 100).unwrap().len(), 0);
    assert_eq!(store.prune_batch(500, 2).unwrap(), 0);
}

#[test]
fn event_seqs_are_never_reused_after_prune() {
    let (store, clock) = clocked_store();
    clock.set(10);
    let last = (0..3)
        .map(|_| store.add_event(None, "tick", &json!(null)).unwrap())
        .last()
        .unwrap();
    clock.set(100);
    store.prune(50).unwrap();
    assert!(store.events(0, 10).unwrap().is_empty());
    let next = store.add_event(None, "tick", &json!(null)).unwrap();
    assert!(next > last, "{next} <= {last}");
}

fn event_kinds(store: &Store) -> Vec<String> {
    let events = store.events(0, 10).unwrap();
    events.into_iter().map(|e| e.kind).collect()
}

#[test]
fn mark_ready_records_pid_timing_transition_and_event_at_once() {
    let (store, _clock) = clocked_store();
    store.insert_sandbox(&record(id(7), 1), 8).unwrap();
    store
        .mark_ready(&id(7), 4321, 3.5, &json!({"caller": "t"}))
        .unwrap();
    let rec = store.get_sandbox(&id(7)).unwrap().unwrap();
    assert_eq!(rec.state, SandboxState::Ready);
    assert_eq!((rec.init_pid, rec.create_ms), (Some(4321), Some(3.5)));
    assert_eq!(event_kinds(&store), ["ready"]);
    // Not from a terminal state: nothing is written, not even the event.
    store
        .transition(&id(7), SandboxState::Stopping, None)
        .unwrap();
    store
        .transition_with_event(
            &id(7),
            SandboxState::Destroyed,
            Some("user"),
            ("destroyed", &json!({})),
        )
        .unwrap();
    let err = store.mark_ready(&id(7), 1, 1.0, &json!({})).unwrap_err();
    assert!(matches!(err, StoreError::IllegalTransition { .. }), "{err}");
    assert_eq!(event_kinds(&store), ["ready", "destroyed"]);
    assert_eq!(
        store.get_sandbox(&id(7)).unwrap().unwrap().init_pid,
        Some(4321)
    );
}

/// Recovery decides on an owner it read earlier: its transition applies
/// only while the record still names that owner, not after a hand-over.
#[test]
fn a_transition_on_an_owner_read_earlier_is_refused_after_a_hand_over() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    store.insert_sandbox(&record(id(2), 1), 8).unwrap();
    let cli = (4242, 123_456_789);
    // Sandbox 1 is handed to a reaper after its owner was read.
    store.stop_and_hand_over(&id(1), "user", 777, 55).unwrap();
    let refused = store.transition_if_owned(&id(1), SandboxState::Failed, Some("owner_died"), cli);
    assert!(
        matches!(refused, Err(StoreError::OwnerChanged { pid: 777, .. })),
        "{refused:?}"
    );
    let rec = store.get_sandbox(&id(1)).unwrap().unwrap();
    assert_eq!((rec.state, rec.owner_pid), (SandboxState::Stopping, 777));
    // Sandbox 2 still has the owner read: the transition applies.
    store
        .transition_if_owned(&id(2), SandboxState::Failed, Some("owner_died"), cli)
        .unwrap();
    let rec = store.get_sandbox(&id(2)).unwrap().unwrap();
    assert_eq!(rec.state, SandboxState::Failed);
}

#[test]
fn the_most_recent_records_are_listed_per_tenant_without_unclaimed_pool_sandboxes() {
    let (store, clock) = clocked_store();
    // 1..=6 created at 10, 20, … 60: odd ones team-a's, even ones team-b's;
    // 2 ended; 7 (at 70) waits unclaimed in a pool.
    for n in 1..=6u64 {
        let mut rec = record(id(n), 10 * n);
        rec.tenant = Some(if n % 2 == 1 { "team-a" } else { "team-b" }.into());
        store.insert_sandbox(&rec, 16).unwrap();
    }
    clock.set(100);
    destroy(&store, &id(2));
    let mut pooled = record(id(7), 70);
    pooled.tenant = None;
    pooled.pool = Some("p".into());
    store.insert_sandbox(&pooled, 16).unwrap();
    let ids = |tenant: Option<&str>, limit: u32| -> Vec<_> {
        store
            .list_recent(tenant, limit)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(
        ids(None, 3),
        [id(4), id(5), id(6)],
        "newest three, oldest first"
    );
    assert_eq!(ids(None, 100), (1..=6).map(id).collect::<Vec<_>>());
    // Another tenant's records do not use up a tenant's limit.
    assert_eq!(ids(Some("team-b"), 2), [id(4), id(6)]);
    assert_eq!(
        ids(Some("team-b"), 100),
        [id(2), id(4), id(6)],
        "ended ones too"
    );
    assert!(ids(Some("nobody"), 10).is_empty());
}
