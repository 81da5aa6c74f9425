use std::collections::BTreeSet;
use std::sync::Arc;

use mayfly_types::SandboxState;

use super::{destroy, id, record};
use crate::{Store, StoreError};

#[test]
fn allocation_returns_the_lowest_free_slot() {
    let store = Store::open_in_memory().unwrap();
    let slots: Vec<u32> = (0..4)
        .map(|n| store.insert_sandbox(&record(id(n), n), 16).unwrap())
        .collect();
    assert_eq!(slots, [0, 1, 2, 3]);

    store
        .transition(&id(1), SandboxState::Failed, Some("test"))
        .unwrap();
    store
        .transition(&id(2), SandboxState::Failed, Some("test"))
        .unwrap();
    assert_eq!(store.insert_sandbox(&record(id(10), 10), 16).unwrap(), 1);
    assert_eq!(store.insert_sandbox(&record(id(11), 11), 16).unwrap(), 2);
    assert_eq!(store.insert_sandbox(&record(id(12), 12), 16).unwrap(), 4);
}

#[test]
fn slots_of_destroyed_and_failed_sandboxes_are_reused() {
    let store = Store::open_in_memory().unwrap();
    assert_eq!(store.insert_sandbox(&record(id(0), 0), 1).unwrap(), 0);
    destroy(&store, &id(0));
    assert_eq!(store.insert_sandbox(&record(id(1), 1), 1).unwrap(), 0);
    store
        .transition(&id(1), SandboxState::Failed, Some("boom"))
        .unwrap();
    assert_eq!(store.insert_sandbox(&record(id(2), 2), 1).unwrap(), 0);
}

#[test]
fn stopping_sandboxes_keep_their_slot() {
    // A sandbox being torn down still owns files and processes in its uid
    // range; handing the range out before it is destroyed would share it.
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(0), 0), 2).unwrap();
    store.transition(&id(0), SandboxState::Ready, None).unwrap();
    store
        .transition(&id(0), SandboxState::Stopping, None)
        .unwrap();
    assert_eq!(store.insert_sandbox(&record(id(1), 1), 2).unwrap(), 1);
}

#[test]
fn allocation_errors_when_every_slot_is_held() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(0), 0), 2).unwrap();
    store.insert_sandbox(&record(id(1), 1), 2).unwrap();
    let err = store.insert_sandbox(&record(id(2), 2), 2).unwrap_err();
    assert!(
        matches!(err, StoreError::SlotsExhausted { max: 2 }),
        "{err:?}"
    );
    assert_eq!(store.get_sandbox(&id(2)).unwrap(), None);
    assert!(store.transitions(&id(2)).unwrap().is_empty());

    let err = store.insert_sandbox(&record(id(3), 3), 0).unwrap_err();
    assert!(
        matches!(err, StoreError::SlotsExhausted { max: 0 }),
        "{err:?}"
    );
}

#[test]
fn slots_held_above_a_lowered_maximum_do_not_block_lower_ones() {
    let store = Store::open_in_memory().unwrap();
    for n in 0..3 {
        store.insert_sandbox(&record(id(n), n), 8).unwrap();
    }
    store
        .transition(&id(0), SandboxState::Failed, None)
        .unwrap();
    assert_eq!(store.insert_sandbox(&record(id(9), 9), 1).unwrap(), 0);
}

#[test]
fn insert_ignores_the_given_state_and_slot() {
    let store = Store::open_in_memory().unwrap();
    let mut rec = record(id(7), 70);
    rec.state = SandboxState::Ready;
    rec.uid_slot = 99;
    assert_eq!(store.insert_sandbox(&rec, 8).unwrap(), 0);
    let got = store.get_sandbox(&id(7)).unwrap().unwrap();
    assert_eq!(got.state, SandboxState::Creating);
    assert_eq!(got.uid_slot, 0);
}

#[test]
fn a_duplicate_id_is_rejected_without_taking_a_slot() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    let err = store.insert_sandbox(&record(id(1), 2), 8).unwrap_err();
    assert!(
        matches!(&err, StoreError::AlreadyExists { id: i } if *i == id(1)),
        "{err:?}"
    );
    assert_eq!(store.list_sandboxes(true).unwrap().len(), 1);
    assert_eq!(store.insert_sandbox(&record(id(2), 3), 8).unwrap(), 1);
}

/// Inserts `count` sandboxes numbered from `base`, failing every third one
/// after the next insert, so allocation runs against a shifting set of
/// gaps. Returns the ids still live and the slots they were given.
fn churn(store: &Store, base: u64, count: u64) -> Vec<(mayfly_types::SandboxId, u32)> {
    let mut live = Vec::new();
    for n in base..base + count {
        let slot = store
            .insert_sandbox(&record(id(n), n), 10_000)
            .unwrap_or_else(|e| panic!("insert {n}: {e:?}"));
        live.push((id(n), slot));
        if n % 3 == 2 {
            let (gone, _) = live.remove(0);
            store
                .transition(&gone, SandboxState::Failed, Some("churn"))
                .unwrap();
        }
    }
    live
}

/// The slots the store holds for live sandboxes must be exactly the ones
/// handed out, with no two alike.
fn assert_unique_and_recorded(store: &Store, handed_out: &[(mayfly_types::SandboxId, u32)]) {
    let live = store.list_sandboxes(false).unwrap();
    let slots: BTreeSet<u32> = live.iter().map(|r| r.uid_slot).collect();
    assert_eq!(slots.len(), live.len(), "two live sandboxes share a slot");
    let mut recorded: Vec<_> = live.iter().map(|r| (r.id.clone(), r.uid_slot)).collect();
    let mut expected = handed_out.to_vec();
    recorded.sort();
    expected.sort();
    assert_eq!(recorded, expected);
}

#[test]
fn two_handles_on_one_file_never_share_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Arc::new(Store::open(dir.path()).unwrap());
    let cli = Arc::new(Store::open(dir.path()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = if t % 2 == 0 { &daemon } else { &cli }.clone();
            std::thread::spawn(move || churn(&store, t * 1000, 30))
        })
        .collect();
    let handed_out: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(handed_out.len(), 4 * 20);
    assert_unique_and_recorded(&daemon, &handed_out);
    assert_unique_and_recorded(&cli, &handed_out);
}

const CHILD_ENV: &str = "MAYFLY_STORE_TEST_SLOT_CHILD";

#[test]
fn slots_stay_unique_across_processes() {
    // Re-run as a child: this same test, told by the environment to churn.
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (dir, base) = spec.rsplit_once('|').expect("child spec");
        let store = Store::open(std::path::Path::new(dir)).unwrap();
        churn(&store, base.parse().unwrap(), 30);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let name = format!(
        "{}::slots_stay_unique_across_processes",
        module_path!().split_once("::").unwrap().1
    );
    let children: Vec<_> = [1000u64, 2000]
        .iter()
        .map(|base| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--test-threads=1", "--quiet"])
                .env(CHILD_ENV, format!("{}|{base}", dir.path().display()))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut handed_out = churn(&store, 0, 30);
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "child ran no test: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // The children's share, as the store recorded it, must be theirs.
    for base in [1000u64, 2000] {
        for n in base..base + 30 {
            if let Some(r) = store.get_sandbox(&id(n)).unwrap() {
                if !r.state.is_terminal() {
                    handed_out.push((r.id, r.uid_slot));
                }
            }
        }
    }
    assert_eq!(handed_out.len(), 3 * 20);
    assert_unique_and_recorded(&store, &handed_out);
}

#[test]
fn a_slot_leased_elsewhere_is_skipped_and_a_lease_error_fails_the_insert() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(0), 0), 8).unwrap();
    // Slot 0 is held here; 1 and 2 are held by another instance.
    let mut asked = Vec::new();
    let slot = store
        .insert_sandbox_leasing(&record(id(1), 1), 8, &mut |s| {
            asked.push(s);
            Ok(s > 2)
        })
        .unwrap();
    assert_eq!((slot, asked), (3, vec![1, 2, 3]));
    // Nothing free anywhere.
    let err = store
        .insert_sandbox_leasing(&record(id(2), 2), 8, &mut |_| Ok(false))
        .unwrap_err();
    assert!(
        matches!(err, StoreError::SlotsExhausted { max: 8 }),
        "{err}"
    );
    // An I/O failure is reported with the slot, and nothing is inserted.
    let err = store
        .insert_sandbox_leasing(&record(id(3), 3), 8, &mut |_| {
            Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
        })
        .unwrap_err();
    assert!(matches!(err, StoreError::Lease { slot: 1, .. }), "{err}");
    assert_eq!(store.get_sandbox(&id(3)).unwrap(), None);
    assert_eq!(store.get_sandbox(&id(2)).unwrap(), None);
}
