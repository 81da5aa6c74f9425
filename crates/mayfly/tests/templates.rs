//! Named templates end to end: a PostgreSQL template whose `initdb` runs in
//! a build step, two sandboxes each with their own database, a warm pool
//! whose sandboxes are claimed with Postgres already up, the step cache,
//! an OCI image base built with umoci, and bad template files.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::templates::{
    build_req, claim_from_pool, destroy_all, named, p50, set_template_pool, stored_layers,
};
use common::{assert_no_leaks, test_dir, unique, Daemon};
use mayfly_types::ErrorCode;

/// The Postgres example template (`initdb` in a build step), renamed.
fn pg_template(name: &str) -> String {
    include_str!("../../../examples/templates/postgres.yaml").replacen(
        "name: postgres\n",
        &format!("name: {name}\n"),
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_template_isolated_databases_cached_rebuild_and_warm_claims() {
    let d = Daemon::start().await;
    let name = format!("pg{}", std::process::id());
    let spec = pg_template(&name);

    let built = d
        .client
        .build_template(&build_req(spec.clone(), "pg.yaml", None))
        .await
        .expect("build the postgres template");
    assert_eq!(built.steps, 4);
    assert_eq!(
        built.layers.len(),
        2,
        "two run steps, two layers: {built:?}"
    );
    assert_eq!(built.user, Some(999));
    eprintln!("postgres template first build: {:.0} ms", built.build_ms);

    // Unchanged: every step comes from the cache.
    let mut rebuilds = Vec::new();
    for _ in 0..5 {
        let again = d
            .client
            .build_template(&build_req(spec.clone(), "pg.yaml", None))
            .await
            .expect("rebuild");
        assert_eq!(again.cached_steps, again.steps);
        assert_eq!(again.digest, built.digest);
        rebuilds.push(again.build_ms);
    }
    eprintln!("unchanged rebuild p50: {:.2} ms", p50(rebuilds));

    // Two sandboxes, each with its own Postgres on 127.0.0.1:5432.
    let mut cold = Vec::new();
    let t0 = Instant::now();
    let a = d.create_with(&named(&name)).await;
    cold.push(t0.elapsed().as_secs_f64() * 1000.0);
    let t0 = Instant::now();
    let b = d.create_with(&named(&name)).await;
    cold.push(t0.elapsed().as_secs_f64() * 1000.0);
    eprintln!("cold creates with postgres ready: {cold:?} ms");
    assert_eq!(
        d.sh(
            &a.id,
            "psql -qtAc 'create table t(x int); insert into t values (7); select sum(x) from t'"
        )
        .await
        .trim(),
        "7"
    );
    let other = d
        .sh(
            &b.id,
            "psql -tAc \"select count(*) from pg_tables where tablename = 't'\"",
        )
        .await;
    assert_eq!(other.trim(), "0", "sandbox b sees a's table");
    let who = d.sh(&a.id, "id -u; echo $PGUSER").await;
    assert_eq!(
        who.split_whitespace().collect::<Vec<_>>(),
        ["999", "postgres"]
    );

    // A warm pool of the template: claims come with Postgres up.
    set_template_pool(&d, &name, 2).await;
    let mut ids = vec![a.id.clone(), b.id.clone()];
    let mut claims = Vec::new();
    for _ in 0..3 {
        let sb = claim_from_pool(&d, &name).await;
        claims.push(sb.create_ms.expect("claim time"));
        // Ready means ready: the first query needs no wait.
        assert_eq!(d.sh(&sb.id, "psql -tAc 'select 1'").await.trim(), "1");
        ids.push(sb.id);
    }
    eprintln!("pool claims of a sandbox with postgres ready (in daemon): {claims:?} ms");
    destroy_all(&d, Some(&name), &ids).await;
    let removed = d.client.remove_template(&name).await.expect("rm");
    assert_eq!(removed.name, name);
    let e = d.client.create(&named(&name)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");
    let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_no_leaks(&d.state_dir, &names);
    // Its layers went with it.
    assert_eq!(
        stored_layers(&d),
        0,
        "layers left after the template was removed"
    );
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An OCI image layout of two layers made with umoci: busybox and a file,
/// then that file deleted and another added (a whiteout in layer two).
fn busybox_layout(dir: &Path) -> std::path::PathBuf {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    run(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout));
    run(Command::new("umoci")
        .args(["new", "--image"])
        .arg(format!("{}:v1", layout.display())));
    for (i, script) in [
        "mkdir -p bin etc tmp proc dev sys workspace && cp /bin/busybox bin/ && ln -s busybox bin/sh && echo one > etc/gone",
        "rm etc/gone && echo two > etc/kept",
    ]
    .iter()
    .enumerate()
    {
        let _ = std::fs::remove_dir_all(&bundle);
        run(Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:v1", layout.display()))
            .arg(&bundle));
        run(Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(bundle.join("rootfs")));
        run(Command::new("umoci")
            .args(["repack", "--image"])
            .arg(format!("{}:v1", layout.display()))
            .arg(&bundle));
        eprintln!("layer {} packed", i + 1);
    }
    layout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_layout_template_with_a_copy_step_and_bad_files() {
    assert!(
        Command::new("umoci").arg("--version").output().is_ok(),
        "`umoci` is needed (apt-get install umoci); CI installs it"
    );
    let d = Daemon::start().await;
    let dir = test_dir();
    let layout = busybox_layout(dir.path());
    std::fs::create_dir_all(dir.path().join("ctx/conf")).unwrap();
    std::fs::write(dir.path().join("ctx/conf/app.ini"), "port=8080\n").unwrap();
    let name = unique("oci")
        .replace(['-'], "")
        .chars()
        .take(40)
        .collect::<String>();
    let spec = format!(
        "name: {name}\nbase: oci:{}:v1\nsteps:\n  - copy: {{src: conf, dest: /etc/app}}\n  - run: [/bin/busybox, sh, -c, 'echo built > /built']\n  - workdir: /etc/app\n",
        layout.display()
    );
    let info = d
        .client
        .build_template(&build_req(spec, "oci.yaml", Some(&dir.path().join("ctx"))))
        .await
        .expect("build from an OCI layout");
    assert_eq!(
        info.layers.len(),
        4,
        "two image layers, copy, run: {info:?}"
    );
    let sb = d.create_with(&named(&name)).await;
    let out = d
        .sh(
            &sb.id,
            "cat /built /etc/app/app.ini /etc/kept; pwd; test -e /etc/gone && echo STILL-THERE; true",
        )
        .await;
    assert_eq!(out, "built\nport=8080\ntwo\n/etc/app\n", "{out}");
    d.client.destroy(&sb.id).await.expect("destroy");

    // Bad files: the error names the file, the field and the position.
    let bad = build_req(
        format!("name: {name}\nbase: host\nsteps:\n  - shell: make\n"),
        "bad.yaml",
        None,
    );
    let e = d.client.build_template(&bad).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument));
    let msg = e.to_string();
    assert!(
        msg.contains("bad.yaml:4:") && msg.contains("steps[0]"),
        "{msg}"
    );
    let escape = build_req(
        format!("name: {name}\nbase: host\nsteps:\n  - copy: {{src: ../../etc, dest: /x}}\n"),
        "esc.yaml",
        Some(&dir.path().join("ctx")),
    );
    let e = d.client.build_template(&escape).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");
    let failing = build_req(
        format!("name: {name}x\nbase: host\nsteps:\n  - run: echo about-to-fail; exit 3\n"),
        "fail.yaml",
        None,
    );
    let e = d.client.build_template(&failing).await.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("exit status 3") && msg.contains("about-to-fail"),
        "{msg}"
    );
    assert_no_leaks(&d.state_dir, &[sb.id.to_string()]);
}
