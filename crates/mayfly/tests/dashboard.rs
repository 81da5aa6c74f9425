//! The built-in dashboard on a real daemon, loaded in jsdom by
//! `tests/dashboard/check.cjs`: its files come from the daemon over TCP, its
//! API calls carry the token given in the URL's fragment, and what it shows
//! is checked against the sandboxes, execs, pools and events made here.
//!
//! Needs Node.js and jsdom: `.ci/run` installs jsdom into
//! `target/node-test/node_modules` (or point `MAYFLY_NODE_MODULES` at
//! another `node_modules`). Without them the test fails and says so.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::keys::tenant_client;
use common::{assert_no_leaks, cmd, free_port, test_dir, Daemon};
use mayfly_types::{CreateRequest, Limits, SandboxSource, TenantQuotas};

/// A `task` label that would run script if it were ever put in as markup.
const HOSTILE: &str = "<img src=x onerror=\"document.title='owned'\">";

fn node_modules() -> PathBuf {
    let dir = std::env::var_os("MAYFLY_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/node-test/node_modules")
        });
    assert!(
        dir.join("jsdom").is_dir(),
        "jsdom is not installed in {}: run `npm install --prefix target/node-test jsdom@26.1.0` \
         from the repository root (as .ci/run does), or set MAYFLY_NODE_MODULES",
        dir.display()
    );
    dir
}

/// Runs the page check; returns what it saw, or fails with its stderr.
fn check_page(args: &[&str]) -> serde_json::Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/check.cjs");
    let mut child = Command::new("node")
        .arg(&script)
        .args(args)
        .env("MAYFLY_NODE_MODULES", node_modules())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running `node` (install Node.js 18 or later): {e}"));
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().expect("waiting for node").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("node's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the dashboard check failed ({}):\n{}{}",
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("the check prints one JSON line")
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_what_the_daemon_holds_and_follows_its_events() {
    let dir = test_dir();
    let token = "dashboard-t0ken";
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).expect("token file");
    let addr = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_with(&[
        "--tcp",
        &addr,
        "--token-file",
        token_file.to_str().expect("a UTF-8 path"),
    ])
    .await;
    d.wait_pool("host", |p| p.ready == p.target && p.target > 0)
        .await;

    // One from the pool, with an exec; one booted cold (other limits), with
    // a hostile task label.
    let pooled = d
        .client
        .create(&CreateRequest {
            labels: BTreeMap::from([("task".to_string(), "fix-42".to_string())]),
            ..CreateRequest::default()
        })
        .await
        .expect("create from the pool");
    assert_eq!(pooled.source, SandboxSource::Pool);
    let r = d
        .client
        .exec(&pooled.id, &cmd(&["true"]))
        .await
        .expect("exec");
    assert_eq!(r.status.exit_code, Some(0));
    let cold = d
        .client
        .create(&CreateRequest {
            labels: BTreeMap::from([("task".to_string(), HOSTILE.to_string())]),
            limits: Limits {
                memory_bytes: Some(64 << 20),
                ..Limits::default()
            },
            ..CreateRequest::default()
        })
        .await
        .expect("cold create");
    assert_eq!(cold.source, SandboxSource::Cold);

    let base = format!("http://{addr}");
    let seen = tokio::task::spawn_blocking({
        let (base, id) = (base.clone(), pooled.id.to_string());
        move || check_page(&["admin", &base, token, &id, "fix-42", HOSTILE])
    })
    .await
    .expect("the check's thread");
    println!("the dashboard showed: {seen}");

    assert_eq!(seen["wrong_token"], "the bearer token is wrong");
    assert_eq!(
        seen["fragment_after_load"], "",
        "the token left the address bar"
    );
    assert_eq!(seen["token_stored"], true);
    assert_eq!(seen["live"], "2");
    let row = strings(&seen["sandbox_row"]);
    assert_eq!(
        row[..5],
        [pooled.id.as_str(), "host", "default", "fix-42", "pool"]
    );
    assert!(row[8].ends_with("iB"), "memory in use: {row:?}");
    assert!(row[10].parse::<u32>().expect("pids") >= 1, "{row:?}");
    let pools: Vec<Vec<String>> = seen["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .map(strings)
        .collect();
    assert!(
        pools.iter().any(|p| p[0] == "host" && p[3] == "4"),
        "{pools:?}"
    );
    assert!(
        seen["pool_spin"].as_str().expect("text").ends_with(" p50"),
        "{seen}"
    );
    assert!(
        seen["cold_spin"]
            .as_str()
            .expect("text")
            .ends_with(" ms p50"),
        "{seen}"
    );
    assert_eq!(seen["execs"], "1");
    let tasks: Vec<Vec<String>> = seen["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(strings)
        .collect();
    assert!(
        tasks.contains(&vec![
            "fix-42".into(),
            "1".into(),
            "1".into(),
            "0.08".into(),
            "1".into()
        ]),
        "{tasks:?}"
    );
    assert!(
        tasks.iter().any(|t| t[0] == HOSTILE && t[1] == "1"),
        "{tasks:?}"
    );
    assert_eq!(seen["hostile_shown"], true);
    assert_eq!(seen["img_elements"], 0, "a label became markup");
    let series = strings(&seen["chart_series"]);
    assert_eq!(series, ["cold p50", "cold p95", "pool p50", "pool p95"]);
    let kinds = strings(&seen["event_kinds"]);
    assert!(kinds.contains(&"destroyed".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"claimed".to_string()), "{kinds:?}");
    assert_eq!(
        seen["errors"],
        serde_json::json!([]),
        "the page's script failed"
    );

    // A tenant's API key: its own sandbox and its own events only (paged:
    // the live stream is for admins).
    let (acme, key) = tenant_client(&d, "acme", TenantQuotas::default(), false).await;
    let theirs = acme
        .create(&CreateRequest::default())
        .await
        .expect("the tenant's create");
    let seen = tokio::task::spawn_blocking({
        let id = theirs.id.to_string();
        move || check_page(&["tenant", &base, &key, &id])
    })
    .await
    .expect("the check's thread");
    println!("the tenant's dashboard showed: {seen}");
    assert_eq!(strings(&seen["ids"]), [theirs.id.as_str()]);
    assert_eq!(seen["live"], "1");
    assert_eq!(strings(&seen["event_sandboxes"]), [theirs.id.as_str()]);
    assert_eq!(seen["events_state"], "(your tenant's, every few seconds)");
    assert_eq!(strings(&seen["pools"]), ["host"]);
    assert_eq!(seen["errors"], serde_json::json!([]));

    acme.destroy(&theirs.id).await.expect("destroy");
    for id in [&pooled.id, &cold.id] {
        d.client.destroy(id).await.expect("destroy");
    }
    assert_no_leaks(
        &d.state_dir,
        &[pooled.id.as_str(), cold.id.as_str(), theirs.id.as_str()],
    );
}
