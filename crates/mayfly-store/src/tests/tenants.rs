use mayfly_types::{ExecAudit, SandboxState, TenantQuotas};

use super::{clocked_store, destroy, id, record};
use crate::tenants::{constant_time_eq, hash, parse_key};
use crate::{KeyCheck, Store, TenantRemoval, DB_FILE};

fn quotas() -> TenantQuotas {
    TenantQuotas {
        max_live: Some(3),
        max_creates_per_min: Some(60),
        max_cpu_millis: Some(4000),
        max_memory_bytes: Some(8 << 30),
    }
}

#[test]
fn a_fresh_store_has_only_the_default_tenant_without_quotas() {
    let store = Store::open_in_memory().unwrap();
    let tenants = store.tenants().unwrap();
    assert_eq!(tenants.len(), 1);
    assert_eq!(tenants[0].name, "default");
    assert_eq!(tenants[0].quotas, TenantQuotas::default());
    assert!(store.keys().unwrap().is_empty());
}

#[test]
fn putting_a_tenant_creates_it_then_replaces_its_quotas() {
    let (store, clock) = clocked_store();
    let (rec, created) = store.put_tenant("acme", &quotas()).unwrap();
    assert!(created);
    assert_eq!(rec.created_at, 1000);
    assert_eq!(store.tenant("acme").unwrap(), Some(rec.clone()));

    clock.set(2000);
    let fewer = TenantQuotas {
        max_live: Some(1),
        ..TenantQuotas::default()
    };
    let (rec2, created) = store.put_tenant("acme", &fewer).unwrap();
    assert!(!created);
    assert_eq!(rec2.created_at, 1000, "an update keeps the creation time");
    let read = store.tenant("acme").unwrap().unwrap();
    assert_eq!(read.quotas, fewer, "absent quotas become unlimited");
    assert_eq!(store.tenant("nobody").unwrap(), None);
    let names: Vec<_> = store
        .tenants()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["acme", "default"]);
}

#[test]
fn the_largest_quotas_round_trip_and_larger_ones_are_refused() {
    let store = Store::open_in_memory().unwrap();
    let max = TenantQuotas {
        max_live: Some(u32::MAX),
        max_creates_per_min: Some(0),
        max_cpu_millis: Some(i64::MAX as u64),
        max_memory_bytes: Some(i64::MAX as u64),
    };
    store.put_tenant("big", &max).unwrap();
    assert_eq!(store.tenant("big").unwrap().unwrap().quotas, max);
    let over = TenantQuotas {
        max_memory_bytes: Some(u64::MAX),
        ..TenantQuotas::default()
    };
    assert!(store.put_tenant("big", &over).is_err());
    assert_eq!(store.tenant("big").unwrap().unwrap().quotas, max);
}

#[test]
fn a_new_key_verifies_and_its_secret_is_not_in_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.put_tenant("acme", &quotas()).unwrap();
    let key = store
        .create_key("acme", false)
        .unwrap()
        .expect("tenant exists");
    assert!(key.secret.starts_with(&format!("mfk_{}_", key.info.id)));
    assert_eq!(key.secret.len(), 4 + 12 + 1 + 64);
    assert_eq!(key.info.tenant, "acme");
    assert!(!key.info.admin);

    match store.verify_key(&key.secret).unwrap() {
        KeyCheck::Valid(info) => assert_eq!(info, key.info),
        other => panic!("a fresh key does not verify: {other:?}"),
    }
    assert_eq!(store.keys().unwrap(), vec![key.info.clone()]);

    // Neither the secret's text nor its raw bytes are stored anywhere:
    // database, WAL or shared memory.
    store.checkpoint().unwrap();
    let (_, raw) = parse_key(&key.secret).unwrap();
    let hex_secret = &key.secret[key.secret.len() - 64..];
    for name in [DB_FILE.to_owned(), format!("{DB_FILE}-wal")] {
        let Ok(bytes) = std::fs::read(dir.path().join(&name)) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(hex_secret), "{name} holds the secret in hex");
        assert!(
            !bytes.windows(raw.len()).any(|w| w == raw),
            "{name} holds the secret's bytes"
        );
    }
    // What is kept instead is the hash.
    let db = std::fs::read(dir.path().join(DB_FILE)).unwrap();
    assert!(db.windows(32).any(|w| w == hash(&raw)));
}

#[test]
fn wrong_malformed_and_unknown_keys_do_not_verify() {
    let store = Store::open_in_memory().unwrap();
    let key = store.create_key("default", true).unwrap().unwrap();
    assert!(key.info.admin);
    let s = &key.secret;
    // One digit of the secret changed.
    let last = s.chars().last().unwrap();
    let flipped = format!(
        "{}{}",
        &s[..s.len() - 1],
        if last == '0' { '1' } else { '0' }
    );
    assert_eq!(store.verify_key(&flipped).unwrap(), KeyCheck::Wrong);
    // Another id with the same secret.
    let other_id = format!("mfk_000000000000{}", &s[16..]);
    assert_eq!(store.verify_key(&other_id).unwrap(), KeyCheck::Wrong);
    for bad in [
        "",
        "mfk_",
        "token",
        &s[..s.len() - 1],
        &format!("{s}0"),
        &s.to_uppercase(),
        &s.replacen("mfk_", "mfx_", 1),
        &format!("{}g", &s[..s.len() - 1]),
    ] {
        assert_eq!(store.verify_key(bad).unwrap(), KeyCheck::Malformed, "{bad}");
    }
}

#[test]
fn keys_are_made_only_for_existing_tenants() {
    let store = Store::open_in_memory().unwrap();
    assert_eq!(store.create_key("ghost", false).unwrap(), None);
    assert!(store.keys().unwrap().is_empty());
}

#[test]
fn a_revoked_key_is_recognised_as_revoked_and_revoking_is_idempotent() {
    let (store, clock) = clocked_store();
    let key = store.create_key("default", false).unwrap().unwrap();
    clock.set(5000);
    let revoked = store.revoke_key(&key.info.id).unwrap().unwrap();
    assert_eq!(revoked.revoked_at, Some(5000));
    clock.set(9000);
    let again = store.revoke_key(&key.info.id).unwrap().unwrap();
    assert_eq!(again.revoked_at, Some(5000), "the first revocation stands");
    assert_eq!(
        store.verify_key(&key.secret).unwrap(),
        KeyCheck::Revoked(again)
    );
    assert_eq!(store.revoke_key("0123456789ab").unwrap(), None);
}

#[test]
fn touching_a_key_records_its_last_use() {
    let store = Store::open_in_memory().unwrap();
    let key = store.create_key("default", false).unwrap().unwrap();
    store.touch_key(&key.info.id, 7777).unwrap();
    assert_eq!(store.keys().unwrap()[0].last_used_at, Some(7777));
}

#[test]
fn a_tenant_with_live_sandboxes_is_not_removed() {
    let store = Store::open_in_memory().unwrap();
    store.put_tenant("acme", &quotas()).unwrap();
    let mut rec = record(id(1), 10);
    rec.tenant = Some("acme".into());
    store.insert_sandbox(&rec, 8).unwrap();
    assert_eq!(
        store.remove_tenant("acme").unwrap(),
        TenantRemoval::HasSandboxes { live: 1 }
    );
    assert!(store.tenant("acme").unwrap().is_some());
    store.transition(&id(1), SandboxState::Ready, None).unwrap();
    assert_eq!(
        store.remove_tenant("acme").unwrap(),
        TenantRemoval::HasSandboxes { live: 1 }
    );
    // A stopping sandbox is already killed and holds its tenant no more.
    store
        .transition(&id(1), SandboxState::Stopping, None)
        .unwrap();
    assert_eq!(
        store.remove_tenant("acme").unwrap(),
        TenantRemoval::Removed { revoked_keys: 0 }
    );
    assert_eq!(store.remove_tenant("acme").unwrap(), TenantRemoval::Missing);
    // Ended sandboxes never hold one.
    store.put_tenant("acme", &quotas()).unwrap();
    let mut rec = record(id(2), 10);
    rec.tenant = Some("acme".into());
    store.insert_sandbox(&rec, 8).unwrap();
    destroy(&store, &id(2));
    assert_eq!(
        store.remove_tenant("acme").unwrap(),
        TenantRemoval::Removed { revoked_keys: 0 }
    );
    // Its history stays, under a name a new `acme` does not have.
    store.put_tenant("acme", &quotas()).unwrap();
    for n in [1, 2] {
        let t = store.get_sandbox(&id(n)).unwrap().unwrap().tenant.unwrap();
        assert!(t.starts_with("acme~"), "{t}");
        assert!(mayfly_types::check_tenant_name(&t).is_err(), "{t}");
    }
}

#[test]
fn removing_a_tenant_revokes_its_keys_and_only_its_keys() {
    let store = Store::open_in_memory().unwrap();
    store.put_tenant("acme", &quotas()).unwrap();
    store.put_tenant("other", &quotas()).unwrap();
    let a1 = store.create_key("acme", false).unwrap().unwrap();
    let a2 = store.create_key("acme", true).unwrap().unwrap();
    let o = store.create_key("other", false).unwrap().unwrap();
    assert_eq!(
        store.remove_tenant("acme").unwrap(),
        TenantRemoval::Removed { revoked_keys: 2 }
    );
    for k in [&a1, &a2] {
        assert!(matches!(
            store.verify_key(&k.secret).unwrap(),
            KeyCheck::Revoked(_)
        ));
    }
    assert!(matches!(
        store.verify_key(&o.secret).unwrap(),
        KeyCheck::Valid(_)
    ));
    // Re-creating the tenant does not bring its old keys back.
    store.put_tenant("acme", &quotas()).unwrap();
    assert!(matches!(
        store.verify_key(&a1.secret).unwrap(),
        KeyCheck::Revoked(_)
    ));
}

#[test]
fn tenant_events_hold_only_that_tenants_sandboxes() {
    let store = Store::open_in_memory().unwrap();
    for (n, tenant) in [(1, Some("a")), (2, Some("b")), (3, None)] {
        let mut rec = record(id(n), 10);
        rec.tenant = tenant.map(str::to_owned);
        store.insert_sandbox(&rec, 8).unwrap();
        store
            .add_event(Some(&id(n)), "created", &serde_json::json!({}))
            .unwrap();
    }
    store
        .add_event(None, "recovered", &serde_json::json!({}))
        .unwrap();
    let a = store.tenant_events("a", 0, 100).unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].sandbox_id.as_deref(), Some(id(1).as_str()));
    // Paging: nothing after the last one seen, and the limit holds.
    assert!(store.tenant_events("a", a[0].seq, 100).unwrap().is_empty());
    assert_eq!(store.tenant_events("b", 0, 1).unwrap().len(), 1);
    assert!(store.tenant_events("c", 0, 100).unwrap().is_empty());
}

#[test]
fn a_pooled_sandbox_is_its_tenants_from_its_claim() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let t = Arc::new(AtomicU64::new(10));
    let clock = t.clone();
    let store = Store::open_in_memory()
        .unwrap()
        .with_clock(move || clock.load(Ordering::SeqCst));
    let mut rec = record(id(1), 10);
    rec.tenant = None;
    rec.pool = Some("py".into());
    store.insert_sandbox(&rec, 8).unwrap();
    store
        .mark_ready(&id(1), 42, 2.5, &serde_json::json!({}))
        .unwrap();
    store
        .add_event(Some(&id(1)), "pool-only", &serde_json::json!({}))
        .unwrap();
    let exec_at = |at| ExecAudit::begin(id(1).to_string(), at, vec!["x".into()], "c".into(), None);
    store.record_exec(&exec_at(15)).unwrap();
    // Claimed at 20 in memory; the claim's write lands at 25, after an
    // event and a command of the claimed sandbox were written.
    t.store(22, Ordering::SeqCst);
    store
        .add_event(Some(&id(1)), "early", &serde_json::json!({}))
        .unwrap();
    store.record_exec(&exec_at(23)).unwrap();
    t.store(25, Ordering::SeqCst);
    let labels = std::collections::BTreeMap::new();
    let detail = serde_json::json!({"source": "pool"});
    let claim = crate::PoolClaim {
        id: &id(1),
        tenant: "a",
        labels: &labels,
        claimed_at: 20,
        expires_at: 60_020,
        claim_ms: 0.02,
        detail: &detail,
    };
    assert_eq!(store.claim_pooled(&[claim]).unwrap(), [true]);
    store
        .add_event(Some(&id(1)), "after", &serde_json::json!({}))
        .unwrap();
    let kinds: Vec<_> = store
        .tenant_events("a", 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["early", "claimed", "after"]);
    // The admin's page still holds all of them.
    assert_eq!(
        store.events(0, 100).unwrap().len(),
        5,
        "ready, pool-only, early, claimed, after"
    );
    // The command after the claim is the tenant's; the boot's is not.
    let tenants: Vec<(i64, Option<String>)> = store
        .conn()
        .prepare("SELECT at, tenant FROM execs ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(tenants, [(15, None), (23, Some("a".to_owned()))]);
}

#[test]
fn a_removed_tenants_events_go_with_its_history() {
    let store = Store::open_in_memory().unwrap();
    store.put_tenant("acme", &quotas()).unwrap();
    let mut rec = record(id(1), 10);
    rec.tenant = Some("acme".into());
    store.insert_sandbox(&rec, 8).unwrap();
    store
        .add_event(Some(&id(1)), "created", &serde_json::json!({}))
        .unwrap();
    destroy(&store, &id(1));
    let before = store.tenant_events("acme", 0, 100).unwrap();
    assert!(!before.is_empty());
    assert_eq!(
        store.remove_tenant("acme").unwrap(),
        TenantRemoval::Removed { revoked_keys: 0 }
    );
    store.put_tenant("acme", &quotas()).unwrap();
    assert!(store.tenant_events("acme", 0, 100).unwrap().is_empty());
    let moved = store.get_sandbox(&id(1)).unwrap().unwrap().tenant.unwrap();
    assert_eq!(store.tenant_events(&moved, 0, 100).unwrap(), before);
}

#[test]
fn a_tenants_page_of_events_reads_its_own_through_an_index() {
    let store = Store::open_in_memory().unwrap();
    let conn = store.conn();
    let mut stmt = conn
        .prepare(&format!(
            "EXPLAIN QUERY PLAN {}",
            crate::tenants::TENANT_EVENTS_SQL
        ))
        .unwrap();
    let plan = stmt
        .query_map(rusqlite::params![0, 100, "a"], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .join("; ");
    assert!(
        plan.contains("USING INDEX events_tenant (tenant=? AND seq>?)"),
        "{plan}"
    );
    assert!(!plan.contains("TEMP B-TREE"), "{plan}");
}

#[test]
fn hashes_compare_in_full() {
    assert!(constant_time_eq(&hash(b"x"), &hash(b"x")));
    assert!(!constant_time_eq(&hash(b"x"), &hash(b"y")));
    assert!(!constant_time_eq(b"ab", b"abc"));
}
