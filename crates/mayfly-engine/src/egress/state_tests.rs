use super::*;
use mayfly_types::EgressMode;

fn sandbox(shared: &Shared, n: u8, bandwidth: Option<u64>) -> Arc<Attached> {
    let id = SandboxId::from_entropy([n; 12]);
    let policy = EgressPolicy {
        mode: EgressMode::Open,
        bandwidth_bytes_per_sec: bandwidth,
        ..EgressPolicy::default()
    };
    shared.attach(&id, Ipv4Addr::new(100, 96, 1, 4 * n + 2), policy)
}

#[test]
fn the_bandwidth_cap_holds_each_way_on_its_own() {
    let shared = Shared::for_tests(Vec::new());
    let a = sandbox(&shared, 1, Some(1000));
    // A full second's worth out leaves the way in untouched.
    assert_eq!(a.charge(Way::Out, 1000), Duration::ZERO);
    assert_eq!(a.charge(Way::In, 1000), Duration::ZERO);
    // Past the bucket, each way waits for its own bytes only.
    let out = a.charge(Way::Out, 500);
    assert!(out > Duration::from_millis(400), "{out:?}");
    let back = a.charge(Way::In, 250);
    assert!(
        back > Duration::from_millis(200) && back < Duration::from_millis(300),
        "{back:?}"
    );
    let free = sandbox(&shared, 2, None);
    assert_eq!(free.charge(Way::Out, 1 << 30), Duration::ZERO);
}

#[test]
fn host_lookups_are_bounded_per_sandbox_and_for_the_daemon() {
    let shared = Shared::for_tests(Vec::new());
    let sandboxes: Vec<_> = (1..=5).map(|n| sandbox(&shared, n, None)).collect();
    let mut held: Vec<_> = (0..MAX_LOOKUPS_PER_SANDBOX)
        .map(|_| shared.lookup_permit(&sandboxes[0]).expect("a place"))
        .collect();
    assert!(
        shared.lookup_permit(&sandboxes[0]).is_none(),
        "one sandbox got more than its share"
    );
    // Others still get theirs, until the daemon's places run out.
    for s in &sandboxes[1..] {
        while held.len() < MAX_LOOKUPS {
            match shared.lookup_permit(s) {
                Some(p) => held.push(p),
                None => break,
            }
        }
    }
    assert_eq!(held.len(), MAX_LOOKUPS);
    assert!(shared.lookup_permit(&sandboxes[4]).is_none());
    held.pop();
    assert!(
        shared.lookup_permit(&sandboxes[4]).is_some(),
        "a place freed is a place again"
    );
}

#[tokio::test]
async fn detach_signals_every_holder_of_the_sandbox() {
    let shared = Shared::for_tests(Vec::new());
    let a = sandbox(&shared, 1, None);
    let held = a.clone();
    let waiter = tokio::spawn(async move { held.closed().await });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    shared.detach(a.addr);
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("a holder of the sandbox was not told it is gone")
        .expect("join");
    assert!(shared.get(a.addr).is_none());
    // One that starts waiting after the detach is told at once.
    tokio::time::timeout(Duration::from_secs(1), a.closed())
        .await
        .expect("closed is remembered");
}
