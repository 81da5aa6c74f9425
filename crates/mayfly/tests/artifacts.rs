//! Artifacts: declared paths are collected before teardown into a store
//! outside the sandbox, survive the destroy, download through the API and
//! the CLI with matching hashes, never follow a planted symlink out, are
//! capped, expire under retention, and stay the owning tenant's.

mod common;

use std::time::Instant;

use common::keys::{code, tenant_client};
use common::{expect_exit, text, Daemon};
use mayfly_types::{ArtifactStatus, CreateRequest, ErrorCode, TenantQuotas};
use sha2::{Digest as _, Sha256};

fn sha(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn with_artifacts(paths: &[&str]) -> CreateRequest {
    CreateRequest {
        artifacts: paths.iter().map(|s| s.to_string()).collect(),
        ..CreateRequest::default()
    }
}

#[tokio::test]
async fn a_log_file_and_a_directory_are_downloadable_after_destroy_with_matching_sha256() {
    let d = Daemon::start().await;
    let sb = d
        .create_with(&with_artifacts(&[
            "/workspace/build.log",
            "/workspace/out/",
        ]))
        .await;
    d.sh(
        &sb.id,
        "echo 'step 1 ok' > /workspace/build.log && mkdir -p /workspace/out/sub && \
         echo a > /workspace/out/a.txt && echo b > /workspace/out/sub/b.txt && \
         ln -s a.txt /workspace/out/link",
    )
    .await;
    // Before the destroy nothing is collected yet.
    let before = d.client.list_artifacts(&sb.id).await.expect("list");
    assert!(before.artifacts.is_empty());
    d.client.destroy(&sb.id).await.expect("destroy");

    let list = d
        .client
        .list_artifacts(&sb.id)
        .await
        .expect("list after destroy");
    assert_eq!(list.artifacts.len(), 2, "{list:?}");
    let log = &list.artifacts[0];
    assert_eq!(
        (log.name.as_str(), log.kind.as_str()),
        ("build.log", "file")
    );
    assert_eq!(log.status, ArtifactStatus::Complete);
    let data = d
        .client
        .get_artifact(&sb.id, "build.log")
        .await
        .expect("get");
    assert_eq!(&data[..], b"step 1 ok\n");
    assert_eq!(sha(&data), log.sha256);
    assert_eq!(data.len() as u64, log.size);

    let dir = &list.artifacts[1];
    assert_eq!((dir.name.as_str(), dir.kind.as_str()), ("out.tar", "dir"));
    let tar = d
        .client
        .get_artifact(&sb.id, "out.tar")
        .await
        .expect("get tar");
    assert_eq!(sha(&tar), dir.sha256);
    let mut names: Vec<String> = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["out", "out/a.txt", "out/link", "out/sub", "out/sub/b.txt"]
    );

    // The CLI: `ls` shows both, `get -o` writes the same bytes.
    let out = expect_exit(&d.run_cli(&["artifacts", "ls", sb.id.as_str()]), 0, "ls");
    assert!(out.contains("build.log") && out.contains("out.tar") && out.contains(&log.sha256));
    let json = expect_exit(
        &d.run_cli(&["--json", "artifacts", "ls", sb.id.as_str()]),
        0,
        "ls --json",
    );
    let parsed: mayfly_types::ArtifactList = serde_json::from_str(&json).expect("json");
    assert_eq!(parsed, list);
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().to_str().unwrap();
    expect_exit(
        &d.run_cli(&["artifacts", "get", sb.id.as_str(), "out.tar", "-o", path]),
        0,
        "get -o",
    );
    assert_eq!(sha(&std::fs::read(path).unwrap()), dir.sha256);
    // Stored outside the sandbox, which is gone.
    assert!(d
        .state_dir
        .join("artifacts")
        .join(sb.id.as_str())
        .join("manifest.json")
        .exists());
    assert!(!d.sandbox_dir(&sb.id).exists());
    // An unknown name is a 404.
    let (status, c, _) = code(d.client.get_artifact(&sb.id, "nope").await);
    assert_eq!((status, c), (404, ErrorCode::NotFound));
}

#[tokio::test]
async fn a_symlink_planted_at_an_artifact_path_is_not_followed_to_the_host() {
    let d = Daemon::start().await;
    let sb = d
        .create_with(&with_artifacts(&[
            "/workspace/secret",
            "/workspace/escape/shadow",
        ]))
        .await;
    d.sh(
        &sb.id,
        "ln -s /etc/shadow /workspace/secret && ln -s / /workspace/escape",
    )
    .await;
    d.client.destroy(&sb.id).await.expect("destroy");
    let list = d.client.list_artifacts(&sb.id).await.expect("list");
    let host_shadow = std::fs::read("/etc/shadow").unwrap_or_default();
    for a in &list.artifacts {
        if a.status == ArtifactStatus::Complete {
            let data = d.client.get_artifact(&sb.id, &a.name).await.unwrap();
            assert_ne!(
                data.to_vec(),
                host_shadow,
                "the host's /etc/shadow was collected"
            );
        }
    }
    let secret = &list.artifacts[0];
    assert_eq!(secret.status, ArtifactStatus::Skipped, "{secret:?}");
    assert!(
        secret.reason.as_deref().unwrap_or("").contains("symlink"),
        "{secret:?}"
    );
    // `/workspace/escape/shadow` resolves inside the sandbox (its own /),
    // where /shadow does not exist.
    assert_eq!(list.artifacts[1].status, ArtifactStatus::Skipped);
}

#[tokio::test]
async fn an_oversized_artifact_is_recorded_as_skipped_and_the_rest_is_kept() {
    let d = Daemon::start_with(&["--artifact-max-file-bytes", "1m"]).await;
    let sb = d
        .create_with(&with_artifacts(&[
            "/workspace/huge",
            "/workspace/big/",
            "/workspace/ok",
        ]))
        .await;
    // A sparse 50 GB file costs the sandbox nothing and must cost the host nothing.
    d.sh(
        &sb.id,
        "truncate -s 50G /workspace/huge && mkdir /workspace/big && \
         head -c 2000000 /dev/urandom > /workspace/big/blob && echo ok > /workspace/ok",
    )
    .await;
    d.client.destroy(&sb.id).await.expect("destroy");
    let list = d.client.list_artifacts(&sb.id).await.expect("list");
    let [huge, big, ok] = &list.artifacts[..] else {
        panic!("{list:?}")
    };
    assert_eq!(huge.status, ArtifactStatus::Skipped);
    assert!(
        huge.reason.as_deref().unwrap().contains("over the cap"),
        "{huge:?}"
    );
    assert_eq!(big.status, ArtifactStatus::Skipped, "{big:?}");
    assert_eq!(ok.status, ArtifactStatus::Complete);
    let files = d
        .state_dir
        .join("artifacts")
        .join(sb.id.as_str())
        .join("files");
    let stored: Vec<_> = std::fs::read_dir(&files)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(stored, ["ok"], "only the complete artifact is stored");
}

#[tokio::test]
async fn retention_removes_the_oldest_sandboxes_artifacts_first() {
    // Two sandboxes of 300 KB each under a 500 KB budget: the first goes.
    let d = Daemon::start_with(&["--artifact-max-bytes", "500k"]).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let sb = d.create_with(&with_artifacts(&["/workspace/data"])).await;
        d.sh(&sb.id, "head -c 300000 /dev/urandom > /workspace/data")
            .await;
        d.client.destroy(&sb.id).await.expect("destroy");
        ids.push(sb.id);
    }
    let first = d.client.list_artifacts(&ids[0]).await.expect("list");
    let second = d.client.list_artifacts(&ids[1]).await.expect("list");
    assert!(first.artifacts.is_empty(), "the oldest was kept: {first:?}");
    assert_eq!(second.artifacts.len(), 1);
    assert!(!d.state_dir.join("artifacts").join(ids[0].as_str()).exists());
}

#[tokio::test]
async fn another_tenant_gets_404_for_the_artifacts() {
    let d = Daemon::start().await;
    let (a, _) = tenant_client(&d, "team-a", TenantQuotas::default(), false).await;
    let (b, _) = tenant_client(&d, "team-b", TenantQuotas::default(), false).await;
    let sb = a
        .create(&with_artifacts(&["/workspace/f"]))
        .await
        .expect("create");
    a.exec(&sb.id, &common::cmd(&["sh", "-c", "echo x > /workspace/f"]))
        .await
        .expect("exec");
    a.destroy(&sb.id).await.expect("destroy");
    assert_eq!(
        a.list_artifacts(&sb.id)
            .await
            .expect("own list")
            .artifacts
            .len(),
        1
    );
    let (status, c, _) = code(b.list_artifacts(&sb.id).await);
    assert_eq!((status, c), (404, ErrorCode::NotFound));
    let (status, c, _) = code(b.get_artifact(&sb.id, "f").await);
    assert_eq!((status, c), (404, ErrorCode::NotFound));
}

#[tokio::test]
async fn collection_time_for_64_mb_is_measured() {
    let d = Daemon::start().await;
    let sb = d.create_with(&with_artifacts(&["/workspace/blob"])).await;
    d.sh(&sb.id, "head -c 67108864 /dev/urandom > /workspace/blob")
        .await;
    let t0 = Instant::now();
    d.client.destroy(&sb.id).await.expect("destroy");
    let took = t0.elapsed();
    let list = d.client.list_artifacts(&sb.id).await.expect("list");
    assert_eq!(list.artifacts[0].size, 64 << 20);
    eprintln!("destroy with a 64 MiB artifact collected took {took:?}");
    let _ = text(b"");
}
