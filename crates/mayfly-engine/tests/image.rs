//! Base images end to end: an image built with umoci (four layers, with a
//! whiteout and an opaque directory), fetched from an OCI layout, a docker
//! archive and a real registry on loopback (Debian's `docker-registry`,
//! pushed to with skopeo), into the layer store.
//!
//! Needs root (whiteouts are device nodes, opaque marks are `trusted.*`
//! xattrs, and the merged result is checked on a real overlay mount) and
//! the tools `umoci`, `skopeo`, `docker-registry` and `htpasswd`; a missing
//! one fails the test. Run with `--test-threads=1`.

mod common;

use std::path::Path;
use std::time::Instant;

use common::{
    assert_merged, build_image, fetch, layer_store, need_root, run, tmp_is_empty, Registry,
};
use mayfly_engine::image::{ImageError, ImageSource, PullOptions};
use mayfly_types::RegistryAuth;

#[tokio::test]
async fn oci_layout_fetch_unpacks_each_layer_once_and_refetch_is_served_from_the_store() {
    need_root();
    let t = tempfile::tempdir().unwrap();
    let layout = build_image(t.path());
    let store = layer_store(t.path());
    let src = ImageSource::parse(&format!("oci:{}:v1", layout.display()))
        .unwrap()
        .unwrap();
    let opts = PullOptions::default();
    let start = Instant::now();
    let (first, events) = fetch(&src, &store, &opts).await;
    let cold = start.elapsed();
    let first = first.unwrap();
    assert_eq!(first.layers.len(), 4);
    assert_eq!(events.cached(), vec![false; 4]);
    assert_eq!(first.config.env, vec![("GREETING".into(), "hi".into())]);
    assert_eq!(first.config.workdir.as_deref(), Some("/opq"));
    assert_merged(&store, &first);
    let start = Instant::now();
    let (second, events) = fetch(&src, &store, &opts).await;
    let warm = start.elapsed();
    assert_eq!(second.unwrap(), first);
    assert_eq!(events.cached(), vec![true; 4]);
    assert!(tmp_is_empty(t.path()));
    eprintln!("oci layout, 4 layers: first fetch {cold:?}, cached fetch {warm:?}");
}

#[tokio::test]
async fn registry_pull_streams_verifies_and_picks_by_tag_or_digest() {
    need_root();
    let t = tempfile::tempdir().unwrap();
    let layout = build_image(t.path());
    let registry = Registry::start_anonymous();
    let reference = registry.push(&layout, "team/app:v1", None);
    let store = layer_store(t.path());
    let src = ImageSource::parse(&format!("docker://{reference}"))
        .unwrap()
        .unwrap();
    let opts = PullOptions::default();
    let start = Instant::now();
    let (image, events) = fetch(&src, &store, &opts).await;
    let cold = start.elapsed();
    let image = image.unwrap();
    assert_eq!(events.cached(), vec![false; 4]);
    assert!(
        events.pulls() >= 4,
        "every downloaded layer reports Pull progress"
    );
    assert_merged(&store, &image);
    // The same layers as the layout they were pushed from.
    let local = ImageSource::parse(&format!("oci:{}:v1", layout.display()))
        .unwrap()
        .unwrap();
    let (from_layout, events) = fetch(&local, &store, &opts).await;
    assert_eq!(from_layout.unwrap().layers, image.layers);
    assert_eq!(events.cached(), vec![true; 4]);
    // By digest, served from the store.
    let by_digest = format!(
        "docker://127.0.0.1:{}/team/app@{}",
        registry.port, image.digest
    );
    let src = ImageSource::parse(&by_digest).unwrap().unwrap();
    let start = Instant::now();
    let (again, events) = fetch(&src, &store, &opts).await;
    let warm = start.elapsed();
    assert_eq!(again.unwrap(), image);
    assert_eq!((events.cached(), events.pulls()), (vec![true; 4], 0));
    eprintln!("registry, 4 layers: first pull {cold:?}, cached pull {warm:?}");
}

#[tokio::test]
async fn registry_basic_auth_works_and_a_wrong_password_is_a_clear_error() {
    need_root();
    let t = tempfile::tempdir().unwrap();
    let layout = build_image(t.path());
    let entry = run("htpasswd", &["-Bbn", "mayfly", "s3cret"]);
    let registry = Registry::start_htpasswd(&entry);
    let reference = registry.push(&layout, "private/app:v1", Some("mayfly:s3cret"));
    let src = ImageSource::parse(&format!("docker://{reference}"))
        .unwrap()
        .unwrap();
    let store = layer_store(t.path());
    let with = |password: &str| PullOptions {
        auth: Some(RegistryAuth {
            username: "mayfly".into(),
            password: password.into(),
        }),
        insecure: Vec::new(),
    };
    let (wrong, _) = fetch(&src, &store, &with("nope")).await;
    assert!(
        matches!(wrong, Err(ImageError::Unauthorized { .. })),
        "{wrong:?}"
    );
    let (anonymous, _) = fetch(&src, &store, &PullOptions::default()).await;
    assert!(
        matches!(anonymous, Err(ImageError::CredentialsNeeded { .. })),
        "{anonymous:?}"
    );
    let (image, events) = fetch(&src, &store, &with("s3cret")).await;
    let image = image.unwrap();
    assert_eq!(events.cached(), vec![false; 4]);
    assert_merged(&store, &image);
}

/// Flips bytes in the middle of every blob file of `dir` that is not JSON
/// and larger than `min`, keeping sizes.
fn tamper_layers(dir: &Path, min: u64) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let path = e.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() && meta.len() > min {
                let mut data = std::fs::read(&path).unwrap();
                if data.first() == Some(&0x1f) {
                    let mid = data.len() / 2;
                    data[mid] ^= 0xff;
                    std::fs::write(&path, data).unwrap();
                    n += 1;
                }
            }
        }
    }
    n
}

#[tokio::test]
async fn a_tampered_layer_is_refused_naming_it_and_nothing_is_committed() {
    need_root();
    let t = tempfile::tempdir().unwrap();
    let layout = build_image(t.path());
    let registry = Registry::start_anonymous();
    let reference = registry.push(&layout, "team/app:v1", None);
    assert!(tamper_layers(&registry.dir.path().join("storage"), 32) > 0);
    let store = layer_store(t.path());
    let src = ImageSource::parse(&format!("docker://{reference}"))
        .unwrap()
        .unwrap();
    let (result, events) = fetch(&src, &store, &PullOptions::default()).await;
    match result {
        Err(ImageError::DigestMismatch { blob, .. }) => assert!(blob.starts_with("layer sha256:")),
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
    assert_eq!(events.cached(), Vec::<bool>::new());
    assert_eq!(
        std::fs::read_dir(t.path().join("layers/sha256"))
            .unwrap()
            .count(),
        0
    );
    assert!(tmp_is_empty(t.path()));
    // The same for a layout on disk.
    assert!(tamper_layers(&layout.join("blobs"), 32) > 0);
    let local = ImageSource::parse(&format!("oci:{}:v1", layout.display()))
        .unwrap()
        .unwrap();
    let (result, _) = fetch(&local, &store, &PullOptions::default()).await;
    assert!(
        matches!(result, Err(ImageError::DigestMismatch { .. })),
        "{result:?}"
    );
    assert_eq!(
        std::fs::read_dir(t.path().join("layers/sha256"))
            .unwrap()
            .count(),
        0
    );
    assert!(tmp_is_empty(t.path()));
}

#[tokio::test]
async fn docker_archive_fetch_checks_diff_ids_and_merges_the_same() {
    need_root();
    let t = tempfile::tempdir().unwrap();
    let layout = build_image(t.path());
    let archive = t.path().join("image.tar");
    run(
        "skopeo",
        &[
            "copy",
            "--quiet",
            &format!("oci:{}:v1", layout.display()),
            &format!("docker-archive:{}:team/app:v1", archive.display()),
        ],
    );
    let store = layer_store(t.path());
    let src = ImageSource::parse(&format!("docker-archive:{}", archive.display()))
        .unwrap()
        .unwrap();
    let (image, events) = fetch(&src, &store, &PullOptions::default()).await;
    let image = image.unwrap();
    assert_eq!(events.cached(), vec![false; 4]);
    assert_eq!(image.config.env, vec![("GREETING".into(), "hi".into())]);
    assert_merged(&store, &image);
    let (again, events) = fetch(&src, &store, &PullOptions::default()).await;
    assert_eq!(again.unwrap(), image);
    assert_eq!(events.cached(), vec![true; 4]);
}
