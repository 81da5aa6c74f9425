//! The store's tests. Each is named after the property it proves.

mod audit;
mod bus;
mod corrupt;
mod lifecycle;
mod migrations;
mod slots;
mod stats;
mod tenants;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mayfly_types::{ResolvedLimits, SandboxId, SandboxState, UnixMillis};

use crate::{SandboxRecord, Store};

/// A distinct, valid sandbox id for every `n`.
pub(crate) fn id(n: u64) -> SandboxId {
    let mut bytes = [0u8; 12];
    for (k, b) in bytes.iter_mut().rev().enumerate() {
        *b = ((n >> (5 * k)) & 31) as u8;
    }
    SandboxId::from_entropy(bytes)
}

pub(crate) fn record(id: SandboxId, created_at: UnixMillis) -> SandboxRecord {
    SandboxRecord {
        id,
        state: SandboxState::Creating,
        template: "host".to_owned(),
        created_at,
        expires_at: created_at + 600_000,
        limits: ResolvedLimits::DEFAULT,
        labels: BTreeMap::from([("team".to_owned(), "infra".to_owned())]),
        uid_slot: 0,
        owner_pid: 4242,
        owner_start: 123_456_789,
        init_pid: None,
        reason: None,
        create_ms: None,
        tenant: Some("default".into()),
        pool: None,
        claimed_at: None,
    }
}

/// A settable clock, shared with the store that reads it.
#[derive(Clone)]
pub(crate) struct TestClock(Arc<AtomicU64>);

impl TestClock {
    pub(crate) fn set(&self, t: UnixMillis) {
        self.0.store(t, Ordering::SeqCst);
    }
}

/// An in-memory store whose clock the test controls, starting at 1000.
pub(crate) fn clocked_store() -> (Store, TestClock) {
    let clock = TestClock(Arc::new(AtomicU64::new(1000)));
    let reader = clock.clone();
    let store = Store::open_in_memory()
        .expect("in-memory store")
        .with_clock(move || reader.0.load(Ordering::SeqCst));
    (store, clock)
}

/// Moves a sandbox through the whole happy path to `Destroyed`.
pub(crate) fn destroy(store: &Store, id: &SandboxId) {
    for to in [
        SandboxState::Ready,
        SandboxState::Stopping,
        SandboxState::Destroyed,
    ] {
        store.transition(id, to, None).expect("legal transition");
    }
}

#[test]
fn a_store_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Store>();
}
