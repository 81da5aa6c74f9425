//! The step cache when a step changes: a template of three run steps is
//! rebuilt with its second step changed. The first step comes from the
//! cache (its layer, and the nonce it wrote, are the same), the changed
//! step and every later one run again (new layers, new content), and a
//! rebuild of the changed file is entirely cached.

mod common;

use common::templates::{build_req, build_streamed, destroy_all, named, steps_done, stored_layers};
use common::{assert_no_leaks, Daemon};
use mayfly_types::{BuildProgress, TemplateInfo};

/// Step 1 writes a nonce (a rerun would write another), step 2 the
/// `second` text, step 3 what it reads from step 2's file.
fn three_steps(name: &str, second: &str) -> String {
    format!(
        r#"
name: {name}
base: host
steps:
  - run: mkdir -p /etc/mf-rebuild && cat /proc/sys/kernel/random/uuid > /etc/mf-rebuild/one
  - run: echo {second} > /etc/mf-rebuild/two
  - env: {{STAGE: three}}
  - run: (cat /etc/mf-rebuild/two; echo "$STAGE") > /etc/mf-rebuild/three
"#
    )
}

fn step_ms(events: &[BuildProgress]) -> Vec<f64> {
    events
        .iter()
        .filter_map(|e| match e {
            BuildProgress::StepDone { ms, .. } => Some(*ms),
            _ => None,
        })
        .collect()
}

/// `(index, cached)` of the run steps (an `env` step makes no layer and is
/// always reported cached).
fn runs_done(events: &[BuildProgress]) -> Vec<(usize, bool)> {
    let runs: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            BuildProgress::Step { index, text, .. } if text.starts_with("run ") => Some(*index),
            _ => None,
        })
        .collect();
    steps_done(events)
        .into_iter()
        .filter(|(i, _)| runs.contains(i))
        .collect()
}

fn step_texts(events: &[BuildProgress]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            BuildProgress::Step { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

async fn contents(d: &Daemon, name: &str) -> (String, mayfly_types::SandboxId) {
    let sb = d.create_with(&named(name)).await;
    let out = d
        .sh(
            &sb.id,
            "cd /etc/mf-rebuild && cat one && echo -- && cat two && echo -- && cat three",
        )
        .await;
    (out, sb.id)
}

fn assert_all_cached(info: &TemplateInfo, events: &[BuildProgress]) {
    assert_eq!(info.cached_steps, info.steps, "{info:?}");
    assert!(
        steps_done(events).iter().all(|(_, cached)| *cached),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_second_step_rebuilds_it_and_every_later_step_only() {
    let d = Daemon::start().await;
    let name = format!("rebuild{}", std::process::id());

    let (v1, events) =
        build_streamed(&d, &build_req(three_steps(&name, "two-v1"), "t.yaml", None)).await;
    assert_eq!((v1.steps, v1.layers.len()), (4, 3), "{v1:?}");
    assert_eq!(
        runs_done(&events),
        [(0, false), (1, false), (3, false)],
        "a first build runs every step: {events:?}"
    );
    let first_ms = v1.build_ms;
    let (before, a) = contents(&d, &name).await;
    let nonce = before.lines().next().expect("step 1's nonce").to_owned();
    assert_eq!(before, format!("{nonce}\n--\ntwo-v1\n--\ntwo-v1\nthree\n"));

    // The second step changes.
    let (v2, events) =
        build_streamed(&d, &build_req(three_steps(&name, "two-v2"), "t.yaml", None)).await;
    assert_eq!(
        runs_done(&events),
        [(0, true), (1, false), (3, false)],
        "only the steps before the change are cached: {events:?}"
    );
    let cached = steps_done(&events).iter().filter(|(_, c)| *c).count();
    assert_eq!(v2.cached_steps, cached, "{v2:?}");
    assert_eq!(v2.layers.len(), 3);
    assert_eq!(v2.layers[0], v1.layers[0], "step 1's layer was rebuilt");
    assert_ne!(
        v2.layers[1], v1.layers[1],
        "the changed step kept its layer"
    );
    assert_ne!(
        v2.layers[2], v1.layers[2],
        "the step after the change kept its layer"
    );
    assert_ne!(v2.digest, v1.digest);
    let changed_ms = v2.build_ms;
    eprintln!(
        "changed-step rebuild: per-step ms {:?} ({:?})",
        step_ms(&events),
        step_texts(&events)
    );
    // `template inspect` says the same as the build.
    let inspected = d.client.template(&name).await.expect("inspect");
    assert_eq!(
        (&inspected.layers, &inspected.digest),
        (&v2.layers, &v2.digest)
    );

    let (after, b) = contents(&d, &name).await;
    assert_eq!(
        after,
        format!("{nonce}\n--\ntwo-v2\n--\ntwo-v2\nthree\n"),
        "a sandbox of the rebuilt template"
    );
    // The sandbox of the first build still sees its own layers.
    let old = d.sh(&a, "cat /etc/mf-rebuild/three").await;
    assert_eq!(old, "two-v1\nthree\n");

    // The changed file, built again: everything from the cache.
    let (v3, events) =
        build_streamed(&d, &build_req(three_steps(&name, "two-v2"), "t.yaml", None)).await;
    assert_all_cached(&v3, &events);
    assert_eq!((&v3.layers, &v3.digest), (&v2.layers, &v2.digest));
    let cached_ms = v3.build_ms;
    eprintln!(
        "three run steps: first build {first_ms:.0} ms, rebuild with step 2 changed \
         {changed_ms:.0} ms, unchanged rebuild {cached_ms:.1} ms"
    );

    destroy_all(&d, None, &[a.clone(), b.clone()]).await;
    d.client.remove_template(&name).await.expect("rm");
    assert_no_leaks(&d.state_dir, &[a.to_string(), b.to_string()]);
    assert_eq!(stored_layers(&d), 0, "layers left after the template went");
}

#[tokio::test]
async fn a_build_whose_client_hangs_up_runs_to_its_end_and_leaves_nothing() {
    use tokio::io::AsyncWriteExt as _;
    let d = Daemon::start().await;
    let name = format!("hangup-{}", std::process::id());
    let spec =
        format!("name: {name}\nbase: host\nsteps:\n  - run: sleep 1 && echo done > /etc/hung\n");
    let body = serde_json::to_string(&build_req(spec, "t.yaml", None)).unwrap();
    // A plain JSON build (no event stream), left in the middle of its step.
    let mut s = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    let req = format!(
        "POST /v1/templates HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    drop(s);
    // The build runs to its end: the template is there, built.
    let t = std::time::Instant::now();
    let built = loop {
        if let Ok(t) = d.client.template(&name).await {
            break t;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "the build its client left never finished; log:\n{}",
            d.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(built.name, name);
    // Its sandbox is gone, all of it.
    let all = d.client.list(true).await.expect("list");
    let ids: Vec<String> = all.iter().map(|i| i.id.to_string()).collect();
    assert!(
        all.iter().all(|i| i.state.is_terminal()),
        "a sandbox outlived the build: {all:#?}"
    );
    assert_no_leaks(&d.state_dir, &ids);
}

#[tokio::test]
async fn a_step_that_writes_a_huge_sparse_file_makes_a_sparse_layer() {
    let d = Daemon::start().await;
    let name = format!("sparse-{}", std::process::id());
    // 20 GiB of apparent size, two bytes of data at its end.
    let spec = format!(
        "name: {name}\nbase: host\nsteps:\n  - run: truncate -s 20G /var/tmp/huge && echo x >> /var/tmp/huge\n"
    );
    let t = std::time::Instant::now();
    let (built, _) = build_streamed(&d, &build_req(spec, "t.yaml", None)).await;
    assert!(
        t.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(built.name, name);
    let out = std::process::Command::new("du")
        .args(["-sk"])
        .arg(&d.state_dir)
        .output()
        .unwrap();
    let kib: u64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(kib < 200 * 1024, "the state directory holds {kib} KiB");
    let sb = d.create_with(&named(&name)).await;
    let size = d.sh(&sb.id, "stat -c %s /var/tmp/huge").await;
    assert_eq!(size.trim(), ((20u64 << 30) + 2).to_string());
    assert_eq!(d.sh(&sb.id, "tail -c 2 /var/tmp/huge").await, "x\n");
    destroy_all(&d, None, std::slice::from_ref(&sb.id)).await;
}
