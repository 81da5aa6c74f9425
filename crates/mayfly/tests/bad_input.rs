//! Bad input that once got the wrong answer: each must be a 4xx with the
//! right code, never a 500, and change nothing.

mod common;

use common::Daemon;
use mayfly_client::ClientError;
use mayfly_types::{BuildRequest, ErrorCode, MkdirRequest};

fn status(e: &ClientError) -> u16 {
    match e {
        ClientError::Api { status, .. } => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_template_that_is_not_built_is_404_as_a_resource() {
    let d = Daemon::start().await;
    let e = d.client.template("no-such-template").await.unwrap_err();
    assert_eq!(
        (status(&e), e.code()),
        (404, Some(ErrorCode::NotFound)),
        "{e}"
    );
    let e = d
        .client
        .remove_template("no-such-template")
        .await
        .unwrap_err();
    assert_eq!(
        (status(&e), e.code()),
        (404, Some(ErrorCode::NotFound)),
        "{e}"
    );
}

#[tokio::test]
async fn a_template_whose_image_is_missing_or_incomplete_is_400() {
    let d = Daemon::start().await;
    let dir = common::test_dir();
    // A layout whose index is a symlink (never followed), and one whose
    // index names a blob that is not there.
    let link = dir.path().join("link");
    std::fs::create_dir(&link).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", link.join("index.json")).unwrap();
    let partial = dir.path().join("partial");
    std::fs::create_dir_all(partial.join("blobs/sha256")).unwrap();
    std::fs::write(
        partial.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let digest = format!("sha256:{}", "a".repeat(64));
    std::fs::write(
        partial.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{digest}","size":100}}]}}"#
        ),
    )
    .unwrap();
    for base in [
        "oci:/nonexistent-mayfly-image".to_owned(),
        "oci:/etc/passwd".to_owned(),
        "oci:/etc".to_owned(),
        format!("oci:{}", link.display()),
        format!("oci:{}", partial.display()),
        "docker-archive:/nonexistent-mayfly-image.tar".to_owned(),
    ] {
        let req = BuildRequest {
            spec: format!("name: bad-image\nbase: {base}\n"),
            file: None,
            context: None,
            registry_auth: None,
            no_cache: false,
        };
        let e = d.client.build_template(&req).await.unwrap_err();
        assert_eq!(
            (status(&e), e.code()),
            (400, Some(ErrorCode::InvalidArgument)),
            "{base}: {e}"
        );
    }
    assert!(d.client.templates().await.expect("templates").is_empty());
}

#[tokio::test]
async fn a_directory_mode_past_0o7777_is_400() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    for mode in [0o10000, u32::MAX] {
        let req = MkdirRequest {
            path: "/workspace/m".into(),
            parents: false,
            mode: Some(mode),
        };
        let e = d.client.mkdir(&sb.id, &req).await.unwrap_err();
        assert_eq!(
            (status(&e), e.code()),
            (400, Some(ErrorCode::InvalidArgument)),
            "{mode:#o}: {e}"
        );
    }
    assert_eq!(
        d.sh(&sb.id, "test -e /workspace/m || echo none").await,
        "none\n"
    );
}

#[tokio::test]
async fn bad_labels_are_400_and_admin_errors_name_what_was_asked() {
    let d = Daemon::start().await;
    for (k, v) in [
        ("", "x"),
        ("a\u{0}b", "x"),
        ("a", "line\nbreak"),
        ("a", "nul\u{0}"),
    ] {
        let req = mayfly_types::CreateRequest {
            labels: [(k.to_owned(), v.to_owned())].into(),
            ..mayfly_types::CreateRequest::default()
        };
        let e = d.client.create(&req).await.unwrap_err();
        assert_eq!(
            (status(&e), e.code()),
            (400, Some(ErrorCode::InvalidArgument)),
            "{k:?}={v:?}: {e}"
        );
    }
    assert!(d.client.list(true).await.expect("list").is_empty());
    // Removing a route that does not exist says just that.
    let e = d.client.delete_route("no-such-route").await.unwrap_err();
    assert_eq!(status(&e), 404, "{e}");
    assert!(!e.to_string().contains("routing key"), "{e}");
    // A pool target past the cap names the target, not a max never given.
    let spec = mayfly_types::PoolSpec {
        target: Some(i32::MAX as u32),
        ..mayfly_types::PoolSpec::default()
    };
    let e = d.client.set_pool("too-big", &spec).await.unwrap_err();
    assert_eq!(status(&e), 400, "{e}");
    assert!(e.to_string().contains("target 2147483647"), "{e}");
}
