//! The ledger's arithmetic, with time passed in.

use std::sync::{Arc, Barrier, Mutex};

use mayfly_types::{SandboxId, TenantQuotas, TenantUsage};

use super::*;

const DAEMON_MAX: u32 = 100;

fn sid(n: u8) -> SandboxId {
    SandboxId::from_entropy([n % 32; 12])
}

fn ask(tenant: &str, cpu: u64, mem: u64) -> Ask {
    Ask {
        charge: Charge {
            tenant: Some(tenant.to_owned()),
            cpu_millis: cpu,
            memory_bytes: mem,
        },
        new_sandbox: true,
    }
}

fn ledger(quotas: TenantQuotas) -> Ledger {
    Ledger::new([("t".to_owned(), quotas)], 0)
}

fn quota_err(r: Result<(), EngineError>) -> QuotaError {
    match r {
        Err(EngineError::Quota(q)) => q,
        other => panic!("expected a quota error, got {other:?}"),
    }
}

#[test]
fn the_live_quota_admits_up_to_its_maximum_and_frees_on_release() {
    let mut l = ledger(TenantQuotas {
        max_live: Some(2),
        ..TenantQuotas::default()
    });
    let a = ask("t", 1000, 1 << 20);
    l.admit(&a, DAEMON_MAX, 0).unwrap();
    l.commit(&sid(1), a.clone());
    l.admit(&a, DAEMON_MAX, 0).unwrap();
    l.commit(&sid(2), a.clone());
    let e = quota_err(l.admit(&a, DAEMON_MAX, 0));
    assert_eq!(
        e,
        QuotaError::Live {
            tenant: "t".into(),
            max: 2
        }
    );
    assert_eq!(e.retry_after_secs(), FREED_RETRY_SECS);
    assert!(e.to_string().contains("2 live sandboxes"), "{e}");
    l.release(&sid(1));
    assert_eq!(l.usage("t").live, 1);
    l.admit(&a, DAEMON_MAX, 0).unwrap();
}

#[test]
fn a_stopped_sandbox_frees_its_tenants_share_but_not_its_daemon_place() {
    let mut l = ledger(TenantQuotas {
        max_live: Some(1),
        max_cpu_millis: Some(1000),
        ..TenantQuotas::default()
    });
    let a = ask("t", 1000, 1);
    l.admit(&a, 2, 0).unwrap();
    l.commit(&sid(1), a.clone());
    l.stop(&sid(1));
    l.stop(&sid(1)); // twice changes nothing
    assert_eq!(l.usage("t"), TenantUsage::default());
    assert_eq!(l.live_total(), 1);
    assert_eq!(
        l.owner(&sid(1)).and_then(|c| c.tenant.as_deref()),
        Some("t")
    );
    l.admit(&a, 2, 0).unwrap();
    l.commit(&sid(2), a.clone());
    assert_eq!(
        quota_err(l.admit(&ask("u", 1, 1), 2, 0)),
        QuotaError::DaemonFull { max: 2 }
    );
    l.release(&sid(1));
    assert_eq!(
        l.usage("t").live,
        1,
        "the release of a stopped one takes nothing more"
    );
    assert_eq!(l.live_total(), 1);
}

#[test]
fn cpu_and_memory_totals_count_the_new_sandbox_too() {
    let mut l = ledger(TenantQuotas {
        max_cpu_millis: Some(2500),
        max_memory_bytes: Some(3 << 30),
        ..TenantQuotas::default()
    });
    l.admit(&ask("t", 1000, 1 << 30), DAEMON_MAX, 0).unwrap();
    l.admit(&ask("t", 1000, 1 << 30), DAEMON_MAX, 0).unwrap();
    let e = quota_err(l.admit(&ask("t", 1000, 1), DAEMON_MAX, 0));
    assert_eq!(
        e,
        QuotaError::Cpu {
            tenant: "t".into(),
            max: 2500,
            used: 2000,
            wanted: 3000
        }
    );
    // Half a CPU still fits; more memory than is left does not.
    let e = quota_err(l.admit(&ask("t", 500, (1 << 30) + 1), DAEMON_MAX, 0));
    assert!(
        matches!(e, QuotaError::Memory { max, .. } if max == 3 << 30),
        "{e:?}"
    );
    l.admit(&ask("t", 500, 1 << 30), DAEMON_MAX, 0).unwrap();
    assert_eq!(
        l.usage("t"),
        TenantUsage {
            live: 3,
            cpu_millis: 2500,
            memory_bytes: 3 << 30
        }
    );
}

#[test]
fn the_create_rate_is_a_token_bucket_of_one_minute() {
    let mut l = ledger(TenantQuotas {
        max_creates_per_min: Some(2),
        ..TenantQuotas::default()
    });
    let a = ask("t", 1, 1);
    l.admit(&a, DAEMON_MAX, 1_000).unwrap();
    l.admit(&a, DAEMON_MAX, 1_000).unwrap();
    let e = quota_err(l.admit(&a, DAEMON_MAX, 1_000));
    assert!(
        matches!(
            e,
            QuotaError::Rate {
                per_min: 2,
                retry_after_secs: 30,
                ..
            }
        ),
        "{e:?}"
    );
    // 20 s later two thirds of a token are back: 10 s to go.
    let e = quota_err(l.admit(&a, DAEMON_MAX, 21_000));
    assert_eq!(e.retry_after_secs(), 10);
    l.admit(&a, DAEMON_MAX, 31_000).unwrap();
    // A refused create took no token: after a full minute both are back.
    l.admit(&a, DAEMON_MAX, 91_000).unwrap();
    l.admit(&a, DAEMON_MAX, 91_000).unwrap();
    assert!(l.admit(&a, DAEMON_MAX, 91_000).is_err());
}

#[test]
fn a_zero_rate_refuses_every_create_for_good() {
    let mut l = ledger(TenantQuotas {
        max_creates_per_min: Some(0),
        ..TenantQuotas::default()
    });
    let e = quota_err(l.admit(&ask("t", 1, 1), DAEMON_MAX, 0));
    assert!(!e.can_pass(), "{e:?}");
    assert_eq!(
        e.to_string(),
        "tenant `t` is at its quota of 0 creates per minute; it may create none"
    );
    // An hour later it is still refused, and still for good.
    let e = quota_err(l.admit(&ask("t", 1, 1), DAEMON_MAX, 3_600_000));
    assert!(!e.can_pass(), "{e:?}");
    let err = crate::EngineError::Quota(e);
    assert_eq!(err.code(), mayfly_types::ErrorCode::PermissionDenied);
    assert_eq!(err.retry_after_secs(), None);
}

#[test]
fn a_quota_smaller_than_the_sandbox_alone_refuses_it_for_good() {
    let mut l = ledger(TenantQuotas {
        max_cpu_millis: Some(1_000),
        max_memory_bytes: Some(1 << 30),
        max_live: Some(5),
        ..TenantQuotas::default()
    });
    // 2 CPUs asked of a 1-CPU quota: no destroy can ever make room.
    let e = quota_err(l.admit(&ask("t", 2_000, 1), DAEMON_MAX, 0));
    assert!(!e.can_pass(), "{e:?}");
    let e = quota_err(l.admit(&ask("t", 1, 2 << 30), DAEMON_MAX, 0));
    assert!(!e.can_pass(), "{e:?}");
    // A sandbox that fits alone, refused only for what others hold, waits.
    l.admit(&ask("t", 600, 1), DAEMON_MAX, 0).unwrap();
    l.commit(&sid(1), ask("t", 600, 1));
    let e = quota_err(l.admit(&ask("t", 600, 1), DAEMON_MAX, 0));
    assert!(e.can_pass(), "{e:?}");
    let err = crate::EngineError::Quota(e);
    assert_eq!(err.code(), mayfly_types::ErrorCode::ResourceExhausted);
    assert_eq!(err.retry_after_secs(), Some(FREED_RETRY_SECS));
}

#[test]
fn a_zero_live_quota_refuses_for_good() {
    let mut l = ledger(TenantQuotas {
        max_live: Some(0),
        ..TenantQuotas::default()
    });
    let e = quota_err(l.admit(&ask("t", 1, 1), DAEMON_MAX, 0));
    assert!(matches!(e, QuotaError::Live { max: 0, .. }), "{e:?}");
    assert!(!e.can_pass());
}

#[test]
fn a_refused_quota_reserves_nothing() {
    let mut l = ledger(TenantQuotas {
        max_live: Some(5),
        max_cpu_millis: Some(1000),
        max_creates_per_min: Some(1),
        ..TenantQuotas::default()
    });
    assert!(l.admit(&ask("t", 2000, 1), DAEMON_MAX, 0).is_err());
    assert_eq!(l.usage("t"), TenantUsage::default());
    assert_eq!(l.live_total(), 0);
    // The refused create spent no token.
    l.admit(&ask("t", 1000, 1), DAEMON_MAX, 0).unwrap();
}

#[test]
fn the_daemon_cap_counts_every_tenant_and_pool_fills() {
    let mut l = Ledger::new(
        [
            ("a".to_owned(), TenantQuotas::default()),
            ("b".to_owned(), TenantQuotas::default()),
        ],
        0,
    );
    l.admit(&ask("a", 1, 1), 3, 0).unwrap();
    l.admit(&ask("b", 1, 1), 3, 0).unwrap();
    let fill = Ask {
        charge: Charge {
            tenant: None,
            cpu_millis: 1,
            memory_bytes: 1,
        },
        new_sandbox: true,
    };
    l.admit(&fill, 3, 0).unwrap();
    l.commit(&sid(9), fill);
    let e = quota_err(l.admit(&ask("a", 1, 1), 3, 0));
    assert_eq!(e, QuotaError::DaemonFull { max: 3 });
    // Claiming the pool sandbox needs no new place, and moves its charge.
    let claim = Ask {
        new_sandbox: false,
        ..ask("b", 1, 1)
    };
    l.admit(&claim, 3, 0).unwrap();
    l.commit(&sid(9), claim);
    assert_eq!(l.live_total(), 3);
    assert_eq!(l.usage("b").live, 2);
    assert_eq!(
        l.owner(&sid(9)).and_then(|c| c.tenant.as_deref()),
        Some("b")
    );
    l.release(&sid(9));
    assert_eq!(l.usage("b").live, 1);
    assert_eq!(l.live_total(), 2);
}

#[test]
fn an_unknown_tenant_is_refused() {
    let mut l = Ledger::default();
    let r = l.admit(&ask("ghost", 1, 1), DAEMON_MAX, 0);
    assert!(
        matches!(r, Err(EngineError::Tenancy(TenancyError::NoSuchTenant { ref name })) if name == "ghost"),
        "{r:?}"
    );
    assert_eq!(l.live_total(), 0);
}

#[test]
fn lowering_a_quota_refuses_the_next_create_and_keeps_the_live_ones() {
    let mut l = ledger(TenantQuotas::default());
    for n in 0..3 {
        let a = ask("t", 1, 1);
        l.admit(&a, DAEMON_MAX, 0).unwrap();
        l.commit(&sid(n), a);
    }
    l.set_quotas(
        "t",
        TenantQuotas {
            max_live: Some(1),
            ..TenantQuotas::default()
        },
        0,
    );
    assert_eq!(l.usage("t").live, 3);
    assert!(l.admit(&ask("t", 1, 1), DAEMON_MAX, 0).is_err());
    assert_eq!(l.remove_tenant("t"), Err(3));
    for n in 0..3 {
        l.release(&sid(n));
    }
    assert_eq!(l.remove_tenant("t"), Ok(()));
}

#[test]
fn a_dropped_admission_gives_its_place_back_and_a_committed_one_keeps_it() {
    let ledger = Arc::new(Mutex::new(ledger(TenantQuotas {
        max_live: Some(1),
        ..TenantQuotas::default()
    })));
    let admit = || -> Result<Admission, EngineError> {
        let a = ask("t", 1, 1);
        lock(&ledger).admit(&a, DAEMON_MAX, 0)?;
        Ok(Admission {
            ledger: ledger.clone(),
            ask: Some(a),
        })
    };
    let first = admit().unwrap();
    assert!(admit().is_err());
    drop(first);
    assert_eq!(lock(&ledger).usage("t").live, 0);
    let second = admit().unwrap();
    second.commit(&sid(1));
    assert!(admit().is_err());
    assert_eq!(lock(&ledger).usage("t").live, 1);
    lock(&ledger).release(&sid(1));
    assert!(admit().is_ok());
}

#[test]
fn concurrent_admissions_against_max_live_one_admit_exactly_one() {
    let ledger = Arc::new(Mutex::new(ledger(TenantQuotas {
        max_live: Some(1),
        ..TenantQuotas::default()
    })));
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (ledger, start) = (ledger.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let a = ask("t", 1, 1);
                let ok = lock(&ledger).admit(&a, DAEMON_MAX, 0).is_ok();
                // Hold the admission while the others try.
                let held = ok.then(|| Admission {
                    ledger: ledger.clone(),
                    ask: Some(a),
                });
                std::thread::sleep(std::time::Duration::from_millis(20));
                (ok, held.map(|h| h.commit(&sid(1))))
            })
        })
        .collect();
    let admitted = threads
        .into_iter()
        .map(|t| t.join().expect("no thread panics"))
        .filter(|(ok, _)| *ok)
        .count();
    assert_eq!(admitted, 1);
    assert_eq!(lock(&ledger).usage("t").live, 1);
}
