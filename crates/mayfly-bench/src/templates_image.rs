//! What the template measures build from: a multi-layer OCI image layout
//! made with `umoci` (the same image podman imports), and the template
//! files of the OCI, Postgres and Redis templates.

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context};

/// The directory whose tree becomes the image's "dependencies" layer: a
/// real library tree of a few thousand files.
const DEPS: &str = "/usr/lib/python3.11";
const BUSYBOX: &str = "/bin/busybox";

/// What the image is made of.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub layers: usize,
    /// Files and bytes of the unpacked image.
    pub files: u64,
    pub bytes: u64,
}

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Counts regular files and their bytes under `dir`, without following
/// symlinks.
fn tree_size(dir: &Path) -> (u64, u64) {
    let mut total = (0, 0);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return total;
    };
    for e in entries.flatten() {
        let Ok(md) = e.path().symlink_metadata() else {
            continue;
        };
        if md.is_dir() {
            let (f, b) = tree_size(&e.path());
            total = (total.0 + f, total.1 + b);
        } else if md.is_file() {
            total = (total.0 + 1, total.1 + md.len());
        }
    }
    total
}

/// An OCI image layout at `layout` (tag `v1`) of three layers: a busybox
/// root, a dependencies tree, and a config layer that deletes a file of
/// the layer below (a whiteout) and adds one.
pub fn build_layout(layout: &Path) -> anyhow::Result<Stats> {
    ensure!(
        Path::new(DEPS).is_dir() && Path::new(BUSYBOX).is_file(),
        "{DEPS} and {BUSYBOX} are needed for the image (apt-get install python3 busybox-static)"
    );
    let image = format!("{}:v1", layout.display());
    let bundle = layout.with_extension("bundle");
    run(Command::new("umoci").args(["init", "--layout"]).arg(layout))
        .context("umoci is needed: apt-get install umoci")?;
    run(Command::new("umoci").args(["new", "--image", &image]))?;
    let deps_dest = format!(
        "usr/lib/{}",
        Path::new(DEPS)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("deps")
    );
    let layers = [
        format!(
            "mkdir -p bin etc tmp proc dev sys root workspace && cp {BUSYBOX} bin/busybox && \
             for a in $(bin/busybox --list); do [ $a = busybox ] || ln -sf busybox bin/$a; done && \
             echo 'root:x:0:0:root:/root:/bin/sh' > etc/passwd && echo 'root:x:0:' > etc/group"
        ),
        format!("mkdir -p usr/lib && cp -a {DEPS} {deps_dest} && echo gone > etc/stale"),
        "rm etc/stale && echo 'mode = bench' > etc/app.conf".to_owned(),
    ];
    for script in &layers {
        let _ = std::fs::remove_dir_all(&bundle);
        run(Command::new("umoci")
            .args(["unpack", "--image", &image])
            .arg(&bundle))?;
        run(Command::new("sh")
            .args(["-c", script])
            .current_dir(bundle.join("rootfs")))?;
        run(Command::new("umoci")
            .args(["repack", "--image", &image])
            .arg(&bundle))?;
    }
    let (files, bytes) = tree_size(&bundle.join("rootfs"));
    let _ = std::fs::remove_dir_all(&bundle);
    Ok(Stats {
        layers: layers.len(),
        files,
        bytes,
    })
}

/// The OCI template: the image and one `run` step (a fourth layer).
pub fn oci_template(name: &str, layout: &Path) -> String {
    format!(
        "name: {name}\nbase: oci:{}:v1\nsteps:\n  - run: [/bin/sh, -c, 'echo built > /etc/built']\n",
        layout.display()
    )
}

/// Imports the layout into podman's store; the image id.
pub fn podman_import(layout: &Path) -> anyhow::Result<String> {
    let id = run(Command::new("podman")
        .args(["pull", "--quiet"])
        .arg(format!("oci:{}:v1", layout.display())))?;
    ensure!(!id.is_empty(), "podman pull printed no image id");
    Ok(id)
}

pub fn podman_remove(id: &str) {
    let _ = Command::new("podman").args(["rmi", "-f", id]).output();
}

/// The Postgres example template (`initdb` in a build step), as
/// `bench-postgres`.
pub fn postgres_template() -> String {
    include_str!("../../../examples/templates/postgres.yaml").replacen(
        "name: postgres\n",
        "name: bench-postgres\n",
        1,
    )
}

pub const POSTGRES_CHECK: &[&str] = &[
    "psql",
    "-h",
    "127.0.0.1",
    "-U",
    "postgres",
    "-tAc",
    "select 1",
];

/// The Redis example template, as `bench-redis`.
pub fn redis_template() -> String {
    include_str!("../../../examples/templates/redis.yaml").replacen(
        "name: redis\n",
        "name: bench-redis\n",
        1,
    )
}

pub const REDIS_CHECK: &[&str] = &["redis-cli", "-h", "127.0.0.1", "PING"];
