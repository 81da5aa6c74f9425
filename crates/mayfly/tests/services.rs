//! Services: started in each sandbox's own namespaces before the create
//! answers, probed (tcp, exec), restarted by policy, and a failing one
//! fails the create with its log and leaves nothing behind.

mod common;

use std::time::{Duration, Instant};

use common::{assert_no_leaks, text, Daemon};
use mayfly_types::{
    CreateRequest, ErrorCode, Probe, RestartPolicy, SandboxState, ServiceSpec, ServiceState,
};

fn service(name: &str, command: &[&str], ready: Option<Probe>) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        user: None,
        cwd: None,
        ready,
        ready_timeout_secs: None,
        restart: RestartPolicy::OnFailure,
        max_restarts: None,
    }
}

fn with_services(services: Vec<ServiceSpec>) -> CreateRequest {
    CreateRequest {
        services,
        ..Default::default()
    }
}

fn redis() -> ServiceSpec {
    service(
        "redis",
        &[
            "/usr/bin/redis-server",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        Some(Probe::Tcp(6379)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sandboxes_each_have_their_own_redis_on_the_same_port() {
    let d = Daemon::start().await;
    let req = with_services(vec![redis()]);
    let t0 = Instant::now();
    let (a, b) = tokio::join!(d.create_with(&req), d.create_with(&req));
    eprintln!("two creates with a ready redis each: {:?}", t0.elapsed());
    let t1 = Instant::now();
    let c = d.create_with(&with_services(vec![redis()])).await;
    eprintln!("one create with a ready redis: {:?}", t1.elapsed());
    // Ready means ready: the first command already reaches it.
    let set = d
        .sh(&a.id, "redis-cli -h 127.0.0.1 -p 6379 SET k only-in-a")
        .await;
    assert_eq!(set.trim(), "OK");
    let in_a = d.sh(&a.id, "redis-cli -h 127.0.0.1 GET k").await;
    assert_eq!(in_a.trim(), "only-in-a");
    let in_b = d.sh(&b.id, "redis-cli -h 127.0.0.1 GET k").await;
    assert_eq!(in_b.trim(), "", "sandbox b sees a's key: {in_b:?}");
    let services = d.client.services(&a.id).await.expect("services");
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].name, "redis");
    assert_eq!(services[0].state, ServiceState::Ready);
    assert_eq!(services[0].restarts, 0);
    let ids = [a.id, b.id, c.id];
    for id in &ids {
        d.client.destroy(id).await.expect("destroy");
    }
    let ids: Vec<&str> = ids.iter().map(|i| i.as_str()).collect();
    assert_no_leaks(&d.state_dir, &ids);
}

/// initdb refuses root and needs its uid in /etc/passwd: the service's own
/// command adds a user line to the sandbox's (writable, overlay) /etc/passwd
/// and drops to that uid with `setpriv`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_starts_cold_as_a_service_and_answers_queries() {
    let d = Daemon::start().await;
    let bin = "/usr/lib/postgresql/15/bin";
    let mut times = Vec::new();
    for _ in 0..3 {
        // As root: a passwd line for uid 999 and its directory; then, as
        // 999, initdb and postgres.
        let script = format!(
            "echo 'postgres:x:999:999::/tmp/pg:/bin/sh' >> /etc/passwd && \
             mkdir -p /tmp/pg && chown 999:999 /tmp/pg && \
             exec setpriv --reuid=999 --regid=999 --clear-groups sh -c \
             '{bin}/initdb -D /tmp/pg/data -U postgres -A trust >/tmp/pg/initdb.log 2>&1 && \
              exec {bin}/postgres -D /tmp/pg/data -k /tmp -h 127.0.0.1 -c fsync=off'"
        );
        let mut pg = service(
            "postgres",
            &["sh", "-c", &script],
            Some(Probe::Exec(vec![
                "pg_isready".into(),
                "-h".into(),
                "127.0.0.1".into(),
                "-q".into(),
            ])),
        );
        pg.ready_timeout_secs = Some(120);
        let t0 = Instant::now();
        let sb = d.create_with(&with_services(vec![pg])).await;
        times.push(t0.elapsed());
        let r = d
            .sh(&sb.id, "psql -h 127.0.0.1 -U postgres -tAc 'select 40 + 2'")
            .await;
        assert_eq!(r.trim(), "42");
        d.client.destroy(&sb.id).await.expect("destroy");
    }
    times.sort();
    eprintln!("postgres cold create times: {times:?}, p50 {:?}", times[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_failing_its_probe_fails_the_create_with_its_log_and_leaks_nothing() {
    let d = Daemon::start().await;
    let mut bad = service(
        "never-ready",
        &["sh", "-c", "echo starting-up-but-no-port; exec sleep 60"],
        Some(Probe::Tcp(7777)),
    );
    bad.ready_timeout_secs = Some(1);
    let e = d
        .client
        .create(&with_services(vec![bad]))
        .await
        .expect_err("a service that never listens");
    assert_eq!(e.code(), Some(ErrorCode::ExecFailed), "{e:?}");
    let msg = format!("{e}");
    assert!(msg.contains("never-ready"), "{msg}");
    assert!(msg.contains("starting-up-but-no-port"), "{msg}");

    // One that exits before it is ready fails at once, not at the timeout.
    let t0 = Instant::now();
    let exits = service(
        "exits",
        &["sh", "-c", "echo boom >&2; exit 3"],
        Some(Probe::Tcp(7777)),
    );
    let e = d
        .client
        .create(&with_services(vec![exits]))
        .await
        .expect_err("a service that exits");
    let msg = format!("{e}");
    assert!(msg.contains("exit code 3") && msg.contains("boom"), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    let all = d.client.list(true).await.expect("list");
    assert_eq!(all.len(), 2, "{all:?}");
    for sb in &all {
        assert_eq!(sb.state, SandboxState::Failed, "{sb:?}");
    }
    let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
    assert_no_leaks(&d.state_dir, &ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exiting_service_is_restarted_unless_its_policy_is_never() {
    let d = Daemon::start().await;
    let script = |file: &str| format!("echo run >> /tmp/{file}; sleep 0.3; exit 1");
    let mut again = service("again", &["sh", "-c", &script("again")], None);
    again.max_restarts = Some(2);
    let mut once = service("once", &["sh", "-c", &script("once")], None);
    once.restart = RestartPolicy::Never;
    let sb = d.create_with(&with_services(vec![again, once])).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let services = loop {
        let s = d.client.services(&sb.id).await.expect("services");
        let settled = s
            .iter()
            .all(|s| matches!(s.state, ServiceState::Failed | ServiceState::Exited));
        if settled || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let again = &services[0];
    let once = &services[1];
    assert_eq!(
        (again.state, again.restarts),
        (ServiceState::Failed, 2),
        "{again:?}"
    );
    assert_eq!(
        (once.state, once.restarts),
        (ServiceState::Exited, 0),
        "{once:?}"
    );
    assert_eq!(once.last_exit.and_then(|s| s.exit_code), Some(1));
    assert_eq!(
        text(&d.exec(&sb.id, &["cat", "/tmp/again"]).await.stdout.0)
            .lines()
            .count(),
        3
    );
    assert_eq!(
        text(&d.exec(&sb.id, &["cat", "/tmp/once"]).await.stdout.0)
            .lines()
            .count(),
        1
    );
    d.client.destroy(&sb.id).await.expect("destroy");
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}
