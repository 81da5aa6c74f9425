//! Base images end to end: an image built with umoci (four layers, with a
//! whiteout and an opaque directory), fetched from an OCI layout, a docker
//! archive and a real registry on loopback (Debian's `docker-registry`,
//! pushed to with skopeo), into the layer store.
//!
//! Needs root (whiteouts are device nodes, opaque marks are `trusted.*`
//! xattrs, and the merged result is checked on a real overlay mount) and
//! the tools `umoci`, `skopeo`, `docker-registry` and `htpasswd`; a missing
//! one fails the test. Run with `--test-threads=1`.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mayfly_engine::image::{fetch_image, Image, ImageError, ImageSource, LayerStore, PullOptions};
use mayfly_types::{BuildProgress, RegistryAuth};

fn need_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "tests/image.rs needs root (whiteout device nodes, trusted.* xattrs, overlay mounts)"
    );
}

/// Runs a tool, failing loudly when it is missing or fails.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{cmd}` ({e}); install it (see .ci/run)"));
    assert!(
        out.status.success(),
        "`{cmd} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds `<dir>/layout` with tag `v1`: /etc/{motd,keep}, then /opq/old,
/// then a whiteout of /etc/motd, then /opq replaced opaquely by /opq/new.
fn build_image(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    for (path, data) in [
        ("etc/motd", "hello"),
        ("etc/keep", "keep"),
        ("opq/old", "old"),
        ("newopq/new", "new"),
    ] {
        let p = src.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    std::os::unix::fs::chown(src.join("etc/keep"), Some(1000), Some(1000)).unwrap();
    let layout = dir.join("layout");
    let l = layout.to_str().unwrap();
    let image = format!("{l}:v1");
    let s = |p: &str| src.join(p).to_str().unwrap().to_owned();
    run("umoci", &["init", "--layout", l]);
    run("umoci", &["new", "--image", &image]);
    run("umoci", &["insert", "--image", &image, &s("etc"), "/etc"]);
    run("umoci", &["insert", "--image", &image, &s("opq"), "/opq"]);
    run(
        "umoci",
        &["insert", "--image", &image, "--whiteout", "/etc/motd"],
    );
    run(
        "umoci",
        &[
            "insert",
            "--image",
            &image,
            "--opaque",
            &s("newopq"),
            "/opq",
        ],
    );
    run(
        "umoci",
        &[
            "config",
            "--image",
            &image,
            "--config.env",
            "GREETING=hi",
            "--config.workingdir",
            "/opq",
        ],
    );
    layout
}

/// Collects progress events.
#[derive(Default)]
struct Events(Mutex<Vec<BuildProgress>>);

impl Events {
    fn cached(&self) -> Vec<bool> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter_map(|e| match e {
                BuildProgress::Layer { cached, .. } => Some(*cached),
                _ => None,
            })
            .collect()
    }

    fn pulls(&self) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| matches!(e, BuildProgress::Pull { .. }))
            .count()
    }
}

async fn fetch(
    src: &ImageSource,
    store: &LayerStore,
    opts: &PullOptions,
) -> (Result<Image, ImageError>, Events) {
    let events = Events::default();
    let record = |e| events.0.lock().unwrap().push(e);
    let result = fetch_image(src, store, opts, &record).await;
    (result, events)
}

/// Mounts the image's layers as a read-only overlay and checks the merged
/// view: the whiteout hid /etc/motd, the opaque /opq hid /opq/old.
fn assert_merged(store: &LayerStore, image: &Image) {
    let target = tempfile::tempdir().unwrap();
    let lowers: Vec<String> = image
        .layers
        .iter()
        .rev()
        .map(|k| store.path(k).unwrap().display().to_string())
        .collect();
    nix::mount::mount(
        Some("overlay"),
        target.path(),
        Some("overlay"),
        nix::mount::MsFlags::MS_RDONLY,
        Some(format!("lowerdir={}", lowers.join(":")).as_str()),
    )
    .expect("mount the image's layers as an overlay");
    let m = target.path();
    let seen = (
        m.join("etc/motd").exists(),
        std::fs::read_to_string(m.join("etc/keep")).ok(),
        m.join("opq/old").exists(),
        std::fs::read_to_string(m.join("opq/new")).ok(),
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(m.join("etc/keep")).unwrap()),
    );
    nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert_eq!(
        seen,
        (false, Some("keep".into()), false, Some("new".into()), 1000)
    );
}

/// A `docker-registry` on a free loopback port, killed on drop.
struct Registry {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    fn start(htpasswd: Option<&str>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("storage").display()
        );
        if let Some(entry) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, entry).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: mayfly-test\n    path: {}\n",
                file.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot run `docker-registry`; install Debian's docker-registry");
        let registry = Registry { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not start listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        registry
    }

    fn push(&self, layout: &Path, repo: &str, creds: Option<&str>) -> String {
        let dest = format!("docker://127.0.0.1:{}/{repo}", self.port);
        let src = format!("oci:{}:v1", layout.display());
        let mut args = vec!["copy", "--quiet", "--dest-tls-verify=false"];
        if let Some(c) = creds {
            args.extend(["--dest-creds", c]);
        }
        args.extend([src.as_str(), dest.as_str()]);
        run("skopeo", &args);
        format!("127.0.0.1:{}/{repo}", self.port)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn layer_store(dir: &Path) -> LayerStore {
    LayerStore::open(&dir.join("layers")).unwrap()
}

fn tmp_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("layers/tmp")).unwrap().count() == 0
}

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
    let registry = Registry::start(None);
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
    let registry = Registry::start(Some(&entry));
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
        matches!(anonymous, Err(ImageError::Unauthorized { .. })),
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
    let registry = Registry::start(None);
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
