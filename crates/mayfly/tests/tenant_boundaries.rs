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
