//! Secrets reach the commands that need them (as env and as 0400 files on
//! a tmpfs) and nothing Mayfly keeps: not the store (database, WAL), the
//! audit trail, events, logs or error messages, not after a full lifecycle,
//! a failed create, or a daemon stop.

mod common;

use std::path::Path;

use common::{assert_no_leaks, text, Daemon};
use mayfly_types::{CreateRequest, ExecRequest, Probe, Secret, ServiceSpec};

fn secret(name: &str, value: &str, env: Option<&str>) -> Secret {
    Secret {
        name: name.into(),
        value: value.into(),
        env: env.map(Into::into),
        file: None,
    }
}

/// Every file under `dir` that contains `needle`, binary files included.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                if let Ok(data) = std::fs::read(&p) {
                    if data.windows(needle.len()).any(|w| w == needle) {
                        found.push(p.display().to_string());
                    }
                }
            }
        }
    }
    found
}

fn random_value() -> String {
    common::unique("mayfly-secret")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_reach_commands_and_nothing_mayfly_keeps() {
    let mut d = Daemon::start().await;
    let at_create = random_value();
    let at_exec = random_value();
    let req = CreateRequest {
        secrets: vec![
            secret("create_env", &at_create, Some("CREATE_TOKEN")),
            secret("create_file", &at_create, None),
            // In a directory of its own, which a non-root command must be
            // able to enter.
            Secret {
                file: Some("/run/secrets/db/password".into()),
                ..secret("db_password", &at_create, None)
            },
        ],
        ..Default::default()
    };
    let sb = d.create_with(&req).await;
    let exec = ExecRequest {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "echo \"$CREATE_TOKEN\"; cat /run/secrets/create_file; echo; \
             echo \"$EXEC_TOKEN\"; cat /run/secrets/exec_file; echo; \
             stat -c '%a %u' /run/secrets/create_file /run/secrets/exec_file; \
             cat /run/secrets/db/password; echo; stat -c '%a %u' /run/secrets/db/password"
                .into(),
        ],
        uid: Some(1000),
        secrets: vec![
            secret("exec_env", &at_exec, Some("EXEC_TOKEN")),
            secret("exec_file", &at_exec, None),
        ],
        ..Default::default()
    };
    let r = d.exec_req(&sb.id, &exec).await;
    assert_eq!(r.status.exit_code, Some(0), "{}", text(&r.stderr.0));
    let out = text(&r.stdout.0);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            at_create.as_str(),
            at_create.as_str(),
            at_exec.as_str(),
            at_exec.as_str(),
            "400 1000",
            "400 1000",
            at_create.as_str(),
            "400 1000"
        ]
    );
    // An exec's secrets are its own: gone after it, and not in the next
    // command's environment.
    let after = d
        .sh(
            &sb.id,
            "ls /run/secrets; echo \"[$EXEC_TOKEN]\"; findmnt -no FSTYPE /run/secrets",
        )
        .await;
    assert_eq!(after, "create_file\ndb\n[]\ntmpfs\n");
    // A file secret is on the tmpfs, never on the upper directory (host disk).
    assert!(files_containing(&d.sandbox_dir(&sb.id), at_create.as_bytes()).is_empty());

    // A create that fails (a service echoing the secret, then failing) does
    // not echo it.
    let mut bad = ServiceSpec {
        name: "leaky".into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "echo token is $CREATE_TOKEN; exit 1".into(),
        ],
        env: Default::default(),
        user: None,
        cwd: None,
        ready: Some(Probe::Tcp(1)),
        ready_timeout_secs: Some(5),
        restart: Default::default(),
        max_restarts: None,
    };
    bad.env.insert("X".into(), "1".into());
    let failing = CreateRequest {
        services: vec![bad],
        ..req.clone()
    };
    let e = d
        .client
        .create(&failing)
        .await
        .expect_err("the service fails");
    let msg = e.to_string();
    assert!(msg.contains("token is <redacted>"), "{msg}");
    assert!(!msg.contains(&at_create), "{msg}");

    // A task run and the audit trail.
    let audit = d.client.audit(&sb.id).await.expect("audit");
    assert!(!serde_json::to_string(&audit).unwrap().contains(&at_exec));
    let events = d.client.events(0, 1000).await.expect("events");
    let events = serde_json::to_string(&events).unwrap();
    assert!(!events.contains(&at_create) && !events.contains(&at_exec));

    d.client.destroy(&sb.id).await.expect("destroy");
    let all = d.client.list(true).await.expect("list");
    let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
    assert_no_leaks(&d.state_dir, &ids);
    d.stop();
    // The state directory (SQLite database, WAL, everything) and the
    // daemon's own stdout and stderr (its log sits beside the state dir).
    let root = d.state_dir.parent().expect("the test directory");
    for value in [&at_create, &at_exec] {
        let found = files_containing(root, value.as_bytes());
        assert!(found.is_empty(), "{value} found in {found:?}");
    }
}
