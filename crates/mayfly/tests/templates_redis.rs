//! Redis as a named template: its config written by a build step, a
//! `redis-server` service on 127.0.0.1:6379 inside each sandbox's own
//! network namespace, two sandboxes with their own data, and a warm pool
//! whose claims answer `PING` at once.

mod common;

use std::time::Instant;

use common::templates::{
    build_req, claim_from_pool, destroy_all, named, set_template_pool, stored_layers,
};
use common::{assert_no_leaks, Daemon};
use mayfly_types::{ErrorCode, SandboxSource};

fn redis_template(name: &str) -> String {
    assert!(
        std::path::Path::new("/usr/bin/redis-server").exists()
            && std::path::Path::new("/usr/bin/redis-cli").exists(),
        "redis-server and redis-cli are needed (apt-get install redis-server); CI installs them"
    );
    // The config is the build step's layer; `dir /tmp` because the sandbox's
    // root user may write there, and nothing is saved anyway.
    format!(
        r#"
name: {name}
base: host
steps:
  - run: |
      mkdir -p /etc/mf-redis
      cat > /etc/mf-redis/redis.conf <<'EOF'
      bind 127.0.0.1
      port 6379
      save ""
      appendonly no
      dir /tmp
      daemonize no
      EOF
services:
  - name: redis
    command: [/usr/bin/redis-server, /etc/mf-redis/redis.conf]
    ready: {{tcp: 6379}}
    ready_timeout_secs: 30
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_template_isolated_data_and_warm_claims_answer_ping() {
    let d = Daemon::start().await;
    let name = format!("redis{}", std::process::id());
    let built = d
        .client
        .build_template(&build_req(redis_template(&name), "redis.yaml", None))
        .await
        .unwrap_or_else(|e| panic!("build the redis template: {e}; log:\n{}", d.log()));
    assert_eq!((built.steps, built.layers.len()), (1, 1), "{built:?}");
    eprintln!("redis template first build: {:.0} ms", built.build_ms);

    // Two sandboxes, each with its own Redis on 127.0.0.1:6379.
    let t0 = Instant::now();
    let a = d.create_with(&named(&name)).await;
    let b = d.create_with(&named(&name)).await;
    eprintln!(
        "two cold creates with redis ready: {:.0} ms",
        t0.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(a.source, SandboxSource::Cold);
    let set = d.sh(&a.id, "redis-cli -h 127.0.0.1 SET k only-in-a").await;
    assert_eq!(set.trim(), "OK");
    let in_a = d.sh(&a.id, "redis-cli -h 127.0.0.1 GET k").await;
    assert_eq!(in_a.trim(), "only-in-a");
    let in_b = d.sh(&b.id, "redis-cli -h 127.0.0.1 EXISTS k").await;
    assert_eq!(in_b.trim(), "0", "sandbox b sees a's key");
    // The server runs with the config the build step wrote.
    let dir = d.sh(&b.id, "redis-cli -h 127.0.0.1 CONFIG GET dir").await;
    assert_eq!(dir.split_whitespace().collect::<Vec<_>>(), ["dir", "/tmp"]);
    let services = d.client.services(&a.id).await.expect("services");
    assert_eq!(services.len(), 1, "{services:?}");
    assert_eq!(services[0].name, "redis");

    // A warm pool of the template: a claim's Redis answers at once.
    set_template_pool(&d, &name, 2).await;
    let mut ids = vec![a.id.clone(), b.id.clone()];
    let mut claims = Vec::new();
    for i in 0..3 {
        let sb = claim_from_pool(&d, &name).await;
        let create_ms = sb.create_ms.expect("a claim reports its create_ms");
        let t0 = Instant::now();
        // No retry: the first command of a claimed sandbox reaches Redis.
        let pong = d
            .exec(&sb.id, &["redis-cli", "-h", "127.0.0.1", "PING"])
            .await;
        let ping_ms = t0.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(
            (pong.status.exit_code, common::text(&pong.stdout.0).trim()),
            (Some(0), "PONG"),
            "claim {i}: {pong:?}"
        );
        let fresh = d.sh(&sb.id, "redis-cli -h 127.0.0.1 EXISTS k").await;
        assert_eq!(fresh.trim(), "0", "a claimed sandbox sees a's key");
        eprintln!(
            "pool claim {i}: daemon-side create_ms {create_ms:.3} ms, \
             first `redis-cli PING` exec {ping_ms:.1} ms"
        );
        claims.push(create_ms);
        ids.push(sb.id);
    }
    eprintln!("pool claims of a sandbox with redis ready (create_ms, in daemon): {claims:?} ms");

    destroy_all(&d, Some(&name), &ids).await;
    d.client.remove_template(&name).await.expect("rm");
    let e = d.client.create(&named(&name)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");
    let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_no_leaks(&d.state_dir, &names);
    assert_eq!(stored_layers(&d), 0, "layers left after the template went");
}
