//! The event bus: committed events are published once, in sequence order;
//! rolled-back ones never.

use mayfly_types::{Event, SandboxState};
use serde_json::json;
use tokio::sync::broadcast::error::TryRecvError;

use super::{id, record};
use crate::{Store, StoreError};

fn drain(rx: &mut tokio::sync::broadcast::Receiver<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(e) => out.push(e),
            Err(TryRecvError::Empty) => return out,
            Err(e) => panic!("the bus failed: {e:?}"),
        }
    }
}

#[test]
fn committed_events_are_published_as_stored_in_sequence_order() {
    let store = Store::open_in_memory().unwrap();
    store.add_event(None, "before", &json!({})).unwrap();
    let mut sub = store.subscribe_events().unwrap();
    assert_eq!(
        sub.head, 1,
        "the subscription begins after the stored event"
    );
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    store
        .mark_ready(&id(1), 42, 2.5, &json!({"create_ms": 2.5}))
        .unwrap();
    store
        .transition_with_event(
            &id(1),
            SandboxState::Stopping,
            Some("user"),
            ("stopping", &json!({"n": 1})),
        )
        .unwrap();
    store
        .add_event(Some(&id(1)), "note", &json!([1, 2]))
        .unwrap();
    let published = drain(&mut sub.receiver);
    let stored = store.events(sub.head, 100).unwrap();
    assert_eq!(
        published, stored,
        "what is published is exactly what was stored"
    );
    let kinds: Vec<_> = published.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["ready", "stopping", "note"]);
    let seqs: Vec<_> = published.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [2, 3, 4]);
}

#[test]
fn an_event_whose_transaction_rolls_back_is_never_published() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    let mut sub = store.subscribe_events().unwrap();
    // The event is inserted, then the transaction fails and rolls back.
    let err = store
        .transition_then(&id(1), SandboxState::Ready, None, |tx, now| {
            crate::audit::insert_event(tx, now, Some(&id(1)), "doomed", &json!({}))?;
            Err(StoreError::NotFound { id: id(1) })
        })
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    // An illegal transition inserts nothing either.
    store
        .transition_with_event(&id(1), SandboxState::Destroyed, None, ("never", &json!({})))
        .unwrap_err();
    assert!(drain(&mut sub.receiver).is_empty());
    assert!(store.events(0, 100).unwrap().is_empty());
    // The next committed event takes the sequence number the rolled-back
    // one would have had, so a reader sees no gap.
    store.add_event(None, "kept", &json!({})).unwrap();
    let got = drain(&mut sub.receiver);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].seq, got[0].kind.as_str()), (1, "kept"));
}

#[test]
fn concurrent_writers_publish_in_the_order_of_their_sequence_numbers() {
    let store = std::sync::Arc::new(Store::open_in_memory().unwrap());
    let mut sub = store.subscribe_events().unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for n in 0..100 {
                    store
                        .add_event(None, "tick", &json!({"thread": t, "n": n}))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let seqs: Vec<i64> = drain(&mut sub.receiver).iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
}
