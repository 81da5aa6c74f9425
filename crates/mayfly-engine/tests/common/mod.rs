//! What the image tests share: an image built with umoci, a
//! `docker-registry` on loopback, fetches that record their progress, and
//! the merged-overlay check.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod token_server;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mayfly_engine::image::{fetch_image, Image, ImageError, ImageSource, LayerStore, PullOptions};
use mayfly_types::BuildProgress;

pub fn need_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "tests/image.rs needs root (whiteout device nodes, trusted.* xattrs, overlay mounts)"
    );
}

/// Runs a tool, failing loudly when it is missing or fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
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
pub fn build_image(dir: &Path) -> PathBuf {
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
pub struct Events(pub Mutex<Vec<BuildProgress>>);

impl Events {
    pub fn cached(&self) -> Vec<bool> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter_map(|e| match e {
                BuildProgress::Layer { cached, .. } => Some(*cached),
                _ => None,
            })
            .collect()
    }

    pub fn pulls(&self) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| matches!(e, BuildProgress::Pull { .. }))
            .count()
    }
}

pub async fn fetch(
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
pub fn assert_merged(store: &LayerStore, image: &Image) {
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
pub struct Registry {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Registry {
    /// A registry without authentication.
    pub fn start_anonymous() -> Registry {
        Self::start(|_| String::new())
    }

    /// A registry with basic auth: `entry` is an htpasswd line.
    pub fn start_htpasswd(entry: &str) -> Registry {
        Self::start(|dir| {
            let file = dir.join("htpasswd");
            std::fs::write(&file, entry).unwrap();
            format!(
                "auth:\n  htpasswd:\n    realm: mayfly-test\n    path: {}\n",
                file.display()
            )
        })
    }

    /// A registry whose config ends with what `auth` returns (an `auth:`
    /// section), given the registry's own directory.
    pub fn start(auth: impl FnOnce(&Path) -> String) -> Registry {
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
        config.push_str(&auth(dir.path()));
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
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

    /// What the registry logged (errors only).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    pub fn push(&self, layout: &Path, repo: &str, creds: Option<&str>) -> String {
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

pub fn layer_store(dir: &Path) -> LayerStore {
    LayerStore::open(&dir.join("layers")).unwrap()
}

pub fn tmp_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("layers/tmp")).unwrap().count() == 0
}
