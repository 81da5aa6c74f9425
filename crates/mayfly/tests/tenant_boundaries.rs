//! What a tenant's key may not reach through a create: the daemon host's
//! own files. A `dir:` template and a local workspace repository are read
//! by the daemon as root, so they are an admin's alone, and a tenant is
//! refused before the path is even looked at.

mod common;

use common::keys::{http, tenant_client};
use common::Daemon;
use mayfly_types::TenantQuotas;

#[tokio::test]
async fn a_tenant_cannot_name_host_paths_in_a_create() {
    let mut d = Daemon::start().await;
    let (tenant, key) = tenant_client(&d, "team-a", TenantQuotas::default(), false).await;
    let repo = tempfile::tempdir().unwrap();
    let bodies = [
        r#"{"template":"dir:/"}"#.to_owned(),
        r#"{"template":"dir:/nonexistent-mayfly-dir"}"#.to_owned(),
        format!(r#"{{"workspace":{{"repo":"{}"}}}}"#, repo.path().display()),
        format!(
            r#"{{"workspace":{{"repo":"file://{}"}}}}"#,
            repo.path().display()
        ),
        format!(
            r#"{{"workspace":{{"repo":"FILE://{}"}}}}"#,
            repo.path().display()
        ),
    ];
    for body in &bodies {
        for path in ["/v1/sandboxes", "/v1/run"] {
            let body = if path == "/v1/run" {
                // A run's create request sits under `sandbox`.
                format!(r#"{{"exec":{{"argv":["true"]}},"sandbox":{body}}}"#)
            } else {
                body.clone()
            };
            let r = http(&d.socket, "POST", path, Some(&key), Some(&body));
            assert_eq!(r.status, 403, "POST {path} {body}: {}", r.body);
            assert_eq!(r.json()["code"], "permission_denied", "{body}");
            let msg = r.json()["message"].as_str().unwrap_or_default().to_owned();
            assert!(msg.contains("admin"), "{msg}");
            // The same message whether or not the path exists: no oracle.
            assert!(!msg.contains("does not exist"), "{msg}");
        }
    }
    assert!(
        tenant.list(true).await.unwrap().is_empty(),
        "no refused create left a record"
    );
    // The operator still may: a missing directory is the operator's 400.
    let r = http(
        &d.socket,
        "POST",
        "/v1/sandboxes",
        None,
        Some(r#"{"template":"dir:/nonexistent-mayfly-dir"}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["code"], "invalid_argument");
    d.assert_healthy().await;
}

/// A key is checked when a request arrives, and again for every request it
/// holds open when a key is revoked: an admin key's live event stream (every
/// tenant's events) is cut at its revocation, not at the daemon's exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_loses_the_stream_it_holds_open() {
    let d = Daemon::start().await;
    let (_, secret) = tenant_client(&d, "ops", TenantQuotas::default(), true).await;
    let (_, other) = tenant_client(&d, "ops", TenantQuotas::default(), true).await;
    let stream = |key: &str| {
        std::process::Command::new("curl")
            .args(["-sS", "-N", "--max-time", "60", "--unix-socket"])
            .arg(&d.socket)
            .args(["-H", &format!("Authorization: Bearer {key}")])
            .args(["-H", "Accept: text/event-stream"])
            .arg("http://mayfly/v1/events")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("curl")
    };
    let mut revoked = stream(&secret);
    let mut kept = stream(&other);
    // Both streams are open and live: a create's events reach them.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let sb = d.create().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(revoked.try_wait().unwrap().is_none(), "the stream is open");
    d.client.revoke_key(&secret[4..16]).await.expect("revoke");
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = revoked.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the revoked key's stream is still open 10 s later"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let out = revoked.wait_with_output().unwrap();
    let got = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(got.contains(sb.id.as_str()), "it was live before: {got}");
    assert!(
        !status.success(),
        "cut, not ended as if complete: {status:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The other key's stream stays.
    assert!(
        kept.try_wait().unwrap().is_none(),
        "the other key's stream was cut"
    );
    kept.kill().unwrap();
    let _ = kept.wait();
}

/// A refused `PUT /v1/pools/{name}` leaves no pool behind.
#[tokio::test]
async fn an_invalid_new_pool_is_refused_whole() {
    let d = Daemon::start().await;
    for body in [
        r#"{"target":5,"max":2}"#,
        r#"{"target":1,"refill_concurrency":0}"#,
        r#"{"target":1,"max":1000000}"#,
    ] {
        let r = http(&d.socket, "PUT", "/v1/pools/fresh", None, Some(body));
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let pools = d.client.pools().await.expect("pools");
        assert!(
            pools.iter().all(|p| p.name != "fresh"),
            "{body}: the refused pool exists: {pools:?}"
        );
    }
}

/// With `--tenant-repo`, a tenant's workspace must come from one of the
/// prefixes; an admin is not limited, and a bad prefix stops the daemon.
#[tokio::test]
async fn tenant_repositories_are_limited_to_the_configured_prefixes() {
    let d = Daemon::start_with(&["--tenant-repo", "git://127.0.0.1:9/team/"]).await;
    let (_, key) = tenant_client(&d, "team-a", TenantQuotas::default(), false).await;
    let ws = |repo: &str| format!(r#"{{"workspace":{{"repo":"{repo}"}}}}"#);
    for repo in [
        "git://127.0.0.1:9/other/x.git",
        "git://127.0.0.1:9/team.evil/x.git",
        "https://127.0.0.1:9/team/x.git",
    ] {
        let r = http(
            &d.socket,
            "POST",
            "/v1/sandboxes",
            Some(&key),
            Some(&ws(repo)),
        );
        assert_eq!(r.status, 403, "{repo}: {}", r.body);
        assert!(r.body.contains("git://127.0.0.1:9/team/"), "{}", r.body);
    }
    // Allowed: it gets as far as the fetch, which fails (nothing listens).
    for (who, repo) in [
        (Some(key.as_str()), "git://127.0.0.1:9/team/x.git"),
        (None, "git://127.0.0.1:9/other/x.git"),
    ] {
        let r = http(&d.socket, "POST", "/v1/sandboxes", who, Some(&ws(repo)));
        assert_ne!(r.status, 403, "{repo}: {}", r.body);
        assert_ne!(r.status, 201, "{repo}: {}", r.body);
    }
    for bad in [
        "https://git.example.test",
        "ftp://x/",
        "https:///",
        "git://host/a b/",
    ] {
        let out = d
            .cli()
            .args(["serve", "--tenant-repo", bad, "--help"])
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0), "{bad} was taken");
    }
}
