//! API keys, tenants and quotas against a real daemon: isolation between
//! tenants, revoked keys, every quota's 429 with `Retry-After` (a 403 when
//! no wait can help), concurrent admission, the admin API's answers to bad
//! input and to non-admins, the CLI, and that no secret is stored or logged
//! in clear.

mod common;

use common::keys::{code, http, tenant_client};
use common::{expect_exit, text, Daemon};
use mayfly_client::ClientError;
use mayfly_types::{CreateRequest, ErrorCode, Limits, SandboxId, SandboxInfo, TenantQuotas};

fn limited(cpu_millis: u32, memory_bytes: u64) -> CreateRequest {
    CreateRequest {
        limits: Limits {
            cpu_millis: Some(cpu_millis),
            memory_bytes: Some(memory_bytes),
            ..Limits::default()
        },
        ..CreateRequest::default()
    }
}

const MIB: u64 = 1 << 20;

/// Asserts `r` is the 404 a missing sandbox `id` gets.
fn not_found<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str, id: &SandboxId) {
    let (status, c, msg) = code(r);
    assert_eq!((status, c), (404, ErrorCode::NotFound), "{what}");
    assert_eq!(msg, format!("sandbox {id} does not exist"), "{what}");
}

#[tokio::test]
async fn a_tenant_sees_and_touches_only_its_own_sandboxes() {
    let d = Daemon::start().await;
    let (a, _) = tenant_client(&d, "team-a", TenantQuotas::default(), false).await;
    let (b, _) = tenant_client(&d, "team-b", TenantQuotas::default(), false).await;
    let (b_admin, _) = tenant_client(&d, "team-b", TenantQuotas::default(), true).await;
    let sa = a
        .create(&CreateRequest::default())
        .await
        .expect("a creates");
    let sb = b
        .create(&CreateRequest::default())
        .await
        .expect("b creates");
    let host = d.create().await;
    assert_eq!(sa.tenant.as_deref(), Some("team-a"));
    assert_eq!(host.tenant.as_deref(), Some("default"));

    // Every verb on a's sandbox answers b as it would for no sandbox at all.
    let missing: SandboxId = "mf-zzzzzzzzzzzz".parse().unwrap();
    let echo = common::cmd(&["echo", "hi"]);
    for id in [&sa.id, &missing] {
        not_found(b.get(id).await, "get", id);
        not_found(b.exec(id, &echo).await, "exec", id);
        not_found(b.read_file(id, "/etc/hostname").await, "read", id);
        not_found(b.write_file(id, "/tmp/x", "evil", None).await, "write", id);
        not_found(b.list_dir(id, "/").await, "list", id);
        not_found(b.audit(id).await, "audit", id);
        not_found(b.destroy(id).await, "destroy", id);
    }
    // b wrote nothing and destroyed nothing.
    let r = a
        .exec(&sa.id, &common::cmd(&["sh", "-c", "ls /tmp/x; echo ok"]))
        .await
        .unwrap();
    assert_eq!(text(&r.stdout.0).trim(), "ok", "{:?}", text(&r.stderr.0));
    assert_eq!(
        a.get(&sa.id).await.unwrap().state,
        mayfly_types::SandboxState::Ready
    );

    let ids = |l: Vec<SandboxInfo>| {
        let mut v: Vec<_> = l.into_iter().map(|s| s.id).collect();
        v.sort();
        v
    };
    assert_eq!(ids(a.list(true).await.unwrap()), vec![sa.id.clone()]);
    assert_eq!(ids(b.list(false).await.unwrap()), vec![sb.id.clone()]);
    let mut everyone = vec![sa.id.clone(), sb.id.clone(), host.id.clone()];
    everyone.sort();
    assert_eq!(ids(d.client.list(false).await.unwrap()), everyone);
    assert_eq!(ids(b_admin.list(false).await.unwrap()), everyone);
    // An admin key reaches into any tenant.
    assert_eq!(b_admin.get(&sa.id).await.unwrap().id, sa.id);

    // Events: a tenant sees only its own sandboxes'.
    let events = a.events(0, 1000).await.unwrap();
    assert!(!events.is_empty());
    assert!(events
        .iter()
        .all(|e| e.sandbox_id.as_deref() == Some(sa.id.as_str())));
    let all = d.client.events(0, 1000).await.unwrap();
    assert!(all
        .iter()
        .any(|e| e.sandbox_id.as_deref() == Some(sb.id.as_str())));

    // The owner destroys its own; the audit names the key.
    a.exec(&sa.id, &echo).await.unwrap();
    let audit = a.audit(&sa.id).await.unwrap();
    assert!(audit[0].caller.starts_with("key:"), "{:?}", audit[0].caller);
    a.destroy(&sa.id).await.unwrap();
}

#[tokio::test]
async fn a_wrong_or_revoked_key_is_a_401() {
    let d = Daemon::start().await;
    let (a, secret) = tenant_client(&d, "acme", TenantQuotas::default(), false).await;
    a.list(false).await.expect("the key works");
    let wrong = format!(
        "{}{}",
        &secret[..secret.len() - 1],
        if secret.ends_with('0') { '1' } else { '0' }
    );
    let r = http(&d.socket, "GET", "/v1/sandboxes", Some(&wrong), None);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["code"], "unauthenticated");
    assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));

    let id = &secret[4..16];
    let revoked = d.client.revoke_key(id).await.unwrap();
    assert!(revoked.revoked_at.is_some());
    let (status, c, msg) = code(a.list(false).await);
    assert_eq!((status, c), (401, ErrorCode::Unauthenticated));
    assert!(msg.contains("revoked"), "{msg}");
    // The CLI with the revoked key is refused too.
    let out = d
        .cli()
        .env("MAYFLY_API_KEY", &secret)
        .args(["ps"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("revoked"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn each_quota_answers_429_with_retry_after() {
    let d = Daemon::start().await;
    // Live sandboxes.
    let (live, key) = tenant_client(
        &d,
        "live",
        TenantQuotas {
            max_live: Some(1),
            ..Default::default()
        },
        false,
    )
    .await;
    let first = live.create(&CreateRequest::default()).await.unwrap();
    let r = http(&d.socket, "POST", "/v1/sandboxes", Some(&key), Some("{}"));
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["code"], "resource_exhausted");
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("1 live sandboxes"),
        "{}",
        r.body
    );
    let retry: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1);
    live.destroy(&first.id).await.unwrap();
    let second = live
        .create(&CreateRequest::default())
        .await
        .expect("the place is free again");
    live.destroy(&second.id).await.unwrap();

    // Creates per minute: two at once, then one every 30 s.
    let (rate, key) = tenant_client(
        &d,
        "rate",
        TenantQuotas {
            max_creates_per_min: Some(2),
            ..Default::default()
        },
        false,
    )
    .await;
    for _ in 0..2 {
        let sb = rate.create(&CreateRequest::default()).await.unwrap();
        rate.destroy(&sb.id).await.unwrap();
    }
    let r = http(&d.socket, "POST", "/v1/sandboxes", Some(&key), Some("{}"));
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("2 creates per minute"),
        "{}",
        r.body
    );
    let retry: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "{retry}");

    // CPU and memory totals, counting the new sandbox.
    let quotas = TenantQuotas {
        max_cpu_millis: Some(1500),
        max_memory_bytes: Some(1024 * MIB),
        ..Default::default()
    };
    let (tot, _) = tenant_client(&d, "totals", quotas, false).await;
    let one = tot.create(&limited(1000, 512 * MIB)).await.unwrap();
    let (status, c, msg) = code(tot.create(&limited(1000, 64 * MIB)).await);
    assert_eq!((status, c), (429, ErrorCode::ResourceExhausted));
    assert!(msg.contains("CPU millicores"), "{msg}");
    let (status, _, msg) = code(tot.create(&limited(500, 600 * MIB)).await);
    assert_eq!(status, 429);
    assert!(msg.contains("bytes of memory"), "{msg}");
    let two = tot
        .create(&limited(500, 512 * MIB))
        .await
        .expect("exactly fits");
    let usage = d.client.tenant("totals").await.unwrap().usage;
    assert_eq!(
        (usage.live, usage.cpu_millis, usage.memory_bytes),
        (2, 1500, 1024 * MIB)
    );
    for sb in [one, two] {
        tot.destroy(&sb.id).await.unwrap();
    }
    let usage = d.client.tenant("totals").await.unwrap().usage;
    assert_eq!(usage.live, 0);

    // A sandbox bigger than the whole quota can never fit: 403, no Retry-After.
    let (status, c, msg) = code(tot.create(&limited(2000, 64 * MIB)).await);
    assert_eq!((status, c), (403, ErrorCode::PermissionDenied), "{msg}");
    assert!(msg.contains("CPU millicores"), "{msg}");

    // A quota changed live holds from the next create; a zero quota is a
    // final refusal, not a 429 asking the client to poll.
    d.client
        .put_tenant(
            "live",
            &TenantQuotas {
                max_live: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(code(live.create(&CreateRequest::default()).await).0, 403);
    d.client
        .put_tenant(
            "rate",
            &TenantQuotas {
                max_creates_per_min: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let r = http(&d.socket, "POST", "/v1/sandboxes", Some(&key), Some("{}"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["code"], "permission_denied");
    assert!(
        r.header("retry-after").is_none(),
        "{:?}",
        r.header("retry-after")
    );
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("0 creates per minute; it may create none"),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn the_daemon_cap_answers_429_with_retry_after() {
    let d = Daemon::start_with(&["--max-sandboxes", "1"]).await;
    let sb = d.create().await;
    let r = http(&d.socket, "POST", "/v1/sandboxes", None, Some("{}"));
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("the most this daemon allows"));
    assert!(r.header("retry-after").is_some());
    d.client.destroy(&sb.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_against_max_live_one_admit_exactly_one() {
    let d = Daemon::start().await;
    let (c, _) = tenant_client(
        &d,
        "one",
        TenantQuotas {
            max_live: Some(1),
            ..Default::default()
        },
        false,
    )
    .await;
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.create(&CreateRequest::default()).await })
        })
        .collect();
    let mut made = Vec::new();
    for t in tasks {
        match t.await.expect("no task panics") {
            Ok(sb) => made.push(sb),
            Err(e) => assert_eq!(e.code(), Some(ErrorCode::ResourceExhausted), "{e:?}"),
        }
    }
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(c.list(false).await.unwrap().len(), 1);
    assert_eq!(d.client.tenant("one").await.unwrap().usage.live, 1);
}

#[tokio::test]
async fn bad_admin_input_is_400_and_non_admins_get_403() {
    let mut d = Daemon::start().await;
    let (_, key) = tenant_client(&d, "plain", TenantQuotas::default(), false).await;
    for (method, path, body) in [
        ("PUT", "/v1/tenants/Bad%20Name", Some("{}")),
        ("PUT", "/v1/tenants/ok", Some(r#"{"max_live":-1}"#)),
        (
            "PUT",
            "/v1/tenants/ok",
            Some(r#"{"max_memory_bytes":18446744073709551615}"#),
        ),
        ("PUT", "/v1/tenants/ok", Some(r#"{"max_live":1,"typo":2}"#)),
        ("PUT", "/v1/tenants/ok", Some("{not json")),
        ("GET", &format!("/v1/tenants/{}", "x".repeat(64)), None),
        ("DELETE", "/v1/tenants/-x", None),
        ("POST", "/v1/keys", Some(r#"{"tenant":"NOPE"}"#)),
        ("POST", "/v1/keys", Some(r#"{"admin":true}"#)),
        ("DELETE", "/v1/keys/not-a-key-id", None),
    ] {
        let r = http(&d.socket, method, path, None, body);
        assert_eq!(r.status, 400, "{method} {path}: {}", r.body);
        assert_eq!(r.json()["code"], "invalid_argument");
        // And a non-admin is refused before its input is even read.
        let r = http(&d.socket, method, path, Some(&key), body);
        assert_eq!(r.status, 403, "{method} {path}: {}", r.body);
        assert_eq!(r.json()["code"], "permission_denied");
    }
    for (method, path) in [
        ("GET", "/v1/tenants"),
        ("GET", "/v1/keys"),
        ("DELETE", "/v1/tenants/plain"),
    ] {
        let r = http(&d.socket, method, path, Some(&key), None);
        assert_eq!(r.status, 403, "{method} {path}: {}", r.body);
    }
    // Removing a tenant with a live sandbox is a conflict.
    let (p, _) = tenant_client(&d, "busy", TenantQuotas::default(), false).await;
    let sb = p.create(&CreateRequest::default()).await.unwrap();
    let (status, c, _) = code(d.client.delete_tenant("busy").await);
    assert_eq!((status, c), (409, ErrorCode::Conflict));
    p.destroy(&sb.id).await.unwrap();
    d.client.delete_tenant("busy").await.expect("empty now");
    assert_eq!(code(p.list(false).await).0, 401, "its keys went with it");
    d.assert_healthy().await;
}

#[tokio::test]
async fn keys_are_neither_stored_nor_logged_in_clear() {
    let d = Daemon::start().await;
    let (c, secret) = tenant_client(&d, "acme", TenantQuotas::default(), true).await;
    let sb = c.create(&CreateRequest::default()).await.unwrap();
    c.exec(&sb.id, &common::cmd(&["true"])).await.unwrap();
    c.destroy(&sb.id).await.unwrap();
    let hex_secret = &secret[17..];
    assert_eq!(hex_secret.len(), 64);
    let mut checked = 0;
    for entry in std::fs::read_dir(&d.state_dir).unwrap() {
        let path = entry.unwrap().path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("mayfly.db"))
        {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let content = String::from_utf8_lossy(&bytes);
        assert!(
            !content.contains(hex_secret),
            "{} holds the secret",
            path.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 1,
        "the database was not found in {}",
        d.state_dir.display()
    );
    assert!(
        !d.log().contains(hex_secret),
        "the daemon logged the secret"
    );
}

#[tokio::test]
async fn the_cli_manages_tenants_and_keys_and_acts_with_a_key() {
    let d = Daemon::start().await;
    let out = d.run_cli(&[
        "tenant",
        "set",
        "acme",
        "--max-live",
        "2",
        "--max-memory",
        "2g",
    ]);
    expect_exit(&out, 0, "tenant set");
    let ls = expect_exit(&d.run_cli(&["tenant", "ls"]), 0, "tenant ls");
    assert!(
        ls.lines()
            .any(|l| l.starts_with("acme") && l.contains("0/2")),
        "{ls}"
    );
    let secret = expect_exit(
        &d.run_cli(&["key", "create", "--tenant", "acme"]),
        0,
        "key create",
    );
    let secret = secret.trim().to_owned();
    assert!(secret.starts_with("mfk_"), "{secret}");

    let id = expect_exit(
        &d.cli()
            .env("MAYFLY_API_KEY", &secret)
            .arg("create")
            .output()
            .unwrap(),
        0,
        "create",
    );
    let ps = expect_exit(
        &d.cli().args(["--api-key", &secret, "ps"]).output().unwrap(),
        0,
        "ps",
    );
    assert!(ps.contains(id.trim()), "{ps}");
    let keys = expect_exit(&d.run_cli(&["key", "ls"]), 0, "key ls");
    assert!(
        keys.contains(&secret[4..16]) && !keys.contains(&secret[17..]),
        "{keys}"
    );

    let out = d.run_cli(&["tenant", "rm", "acme"]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "a tenant with a live sandbox stays"
    );
    expect_exit(&d.run_cli(&["rm", id.trim()]), 0, "rm");
    expect_exit(
        &d.run_cli(&["key", "revoke", &secret[4..16]]),
        0,
        "key revoke",
    );
    expect_exit(&d.run_cli(&["tenant", "rm", "acme"]), 0, "tenant rm");
    let ls = expect_exit(&d.run_cli(&["tenant", "ls"]), 0, "tenant ls");
    assert!(!ls.contains("acme"), "{ls}");
}

#[tokio::test]
async fn tenants_quotas_and_keys_survive_a_restart() {
    let mut d = Daemon::start().await;
    let quotas = TenantQuotas {
        max_live: Some(0),
        ..TenantQuotas::default()
    };
    let (c, secret) = tenant_client(&d, "kept", quotas, false).await;
    d.restart().await;
    assert!(
        c.list(false).await.unwrap().is_empty(),
        "the key still works"
    );
    let (status, _, msg) = code(c.create(&CreateRequest::default()).await);
    // A zero quota refuses for good: 403.
    assert_eq!(status, 403, "the quota was read back at start: {msg}");
    assert!(msg.contains("quota of 0 live sandboxes"), "{msg}");
    let t = d.client.tenant("kept").await.unwrap();
    assert_eq!(t.quotas, quotas);
    let keys = d.client.keys().await.unwrap();
    assert!(keys
        .iter()
        .any(|k| secret.contains(&k.id) && k.tenant == "kept"));
}
