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

#[test]
fn claims_recorded_together_are_each_recorded_once_and_published() {
    let store = Store::open_in_memory().unwrap();
    let labels = std::collections::BTreeMap::from([("task".to_owned(), "ci".to_owned())]);
    for n in 1..=3 {
        let mut rec = record(id(n), 1);
        rec.tenant = None;
        rec.pool = Some("py".into());
        store.insert_sandbox(&rec, 8).unwrap();
    }
    // 1 and 2 are ready and unclaimed; 3 never became ready.
    for n in 1..=2 {
        store.mark_ready(&id(n), 42, 2.5, &json!({})).unwrap();
    }
    let mut sub = store.subscribe_events().unwrap();
    let detail = json!({"source": "pool"});
    let ids: Vec<_> = (0..=3).map(id).collect();
    let claim = |n: usize, tenant: &'static str, at: u64| crate::PoolClaim {
        id: &ids[n],
        tenant,
        labels: &labels,
        claimed_at: at,
        expires_at: at + 60_000,
        claim_ms: 0.02,
        detail: &detail,
    };
    // 1 twice in one batch: only the first is recorded.
    let recorded = store
        .claim_pooled(&[
            claim(1, "a", 10),
            claim(2, "b", 11),
            claim(3, "c", 12),
            claim(1, "d", 13),
        ])
        .unwrap();
    assert_eq!(recorded, [true, true, false, false]);
    let one = store.get_sandbox(&id(1)).unwrap().unwrap();
    assert_eq!(one.tenant.as_deref(), Some("a"), "the first claim holds");
    assert_eq!(
        (one.claimed_at, one.created_at, one.expires_at),
        (Some(10), 10, 60_010)
    );
    assert_eq!(one.labels, labels);
    assert_eq!(store.get_sandbox(&id(3)).unwrap().unwrap().tenant, None);
    // A later batch cannot claim 2 again.
    assert_eq!(store.claim_pooled(&[claim(2, "e", 20)]).unwrap(), [false]);
    let published = drain(&mut sub.receiver);
    assert_eq!(published, store.events(sub.head, 100).unwrap());
    let claimed: Vec<_> = published
        .iter()
        .map(|e| (e.kind.as_str(), e.sandbox_id.clone().unwrap()))
        .collect();
    assert_eq!(
        claimed,
        [
            ("claimed", id(1).to_string()),
            ("claimed", id(2).to_string())
        ]
    );
}
