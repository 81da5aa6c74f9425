//! Templates: which read-only layers form a sandbox's root.
//!
//! `host` is an embedded template: a small skeleton (minimal `/etc`, the
//! top-level directories and the host's merged-/usr symlinks) under which
//! each real host system directory (`/usr`, and `/bin`, `/lib*` where they
//! are not symlinks) is its own overlay. Overlayfs does not descend into
//! submounts of a lower layer, so the host's system directories cannot sit
//! under one overlay; each gets its own.

use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::templates::{Base, Resolved};

/// One overlay of a sandbox root: its lower layers and where it is mounted
/// (relative to the sandbox root; `""` is the root itself).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layer {
    pub lowers: Vec<PathBuf>,
    pub target: PathBuf,
}

/// Host system directories considered for the `host` template.
pub const HOST_SYSTEM_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// What a host system directory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    Dir,
    Symlink(PathBuf),
    Missing,
}

/// Errors preparing a template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template directory `{0}` does not exist or is not a directory")]
    NotADirectory(PathBuf),
    #[error("building the host template skeleton at `{path}` failed")]
    Skeleton {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The overlays of a sandbox's root, from its resolved template and a
/// description of the host (pure). Layers built on the base stack above it,
/// top first, as overlayfs wants; on the `host` base each layer also joins
/// the overlay of every host system directory it has entries under.
pub fn plan_layers(t: &Resolved, skeleton: &Path, host: &[(&str, HostEntry)]) -> Vec<Layer> {
    let stacked = || t.layers.iter().rev().map(|(p, _)| p.clone());
    match &t.base {
        Base::Dir(dir) => vec![Layer {
            lowers: stacked().chain([dir.clone()]).collect(),
            target: PathBuf::new(),
        }],
        Base::Image(_) => vec![Layer {
            lowers: stacked().collect(),
            target: PathBuf::new(),
        }],
        Base::Host => {
            let mut layers = vec![Layer {
                lowers: stacked().chain([skeleton.to_path_buf()]).collect(),
                target: PathBuf::new(),
            }];
            for (name, entry) in host {
                if *entry == HostEntry::Dir {
                    let built = t
                        .layers
                        .iter()
                        .rev()
                        .filter(|(_, tops)| tops.iter().any(|x| x == name))
                        .map(|(p, _)| p.join(name));
                    layers.push(Layer {
                        lowers: built.chain([Path::new("/").join(name)]).collect(),
                        target: PathBuf::from(name),
                    });
                }
            }
            layers
        }
    }
}

/// Looks at the host's system directories.
pub fn inspect_host(host_root: &Path) -> Vec<(&'static str, HostEntry)> {
    HOST_SYSTEM_DIRS
        .iter()
        .map(|name| {
            let p = host_root.join(name);
            let entry = match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => std::fs::read_link(&p)
                    .map(HostEntry::Symlink)
                    .unwrap_or(HostEntry::Missing),
                Ok(m) if m.is_dir() => HostEntry::Dir,
                _ => HostEntry::Missing,
            };
            (*name, entry)
        })
        .collect()
}

/// `/etc` entries copied into the skeleton. Anything not listed (shadow,
/// ssh keys, sudoers, credentials, the host's users) stays invisible.
pub const ETC_ALLOWLIST: [&str; 31] = [
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "gai.conf",
    "host.conf",
    "inputrc",
    "issue",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "login.defs",
    "magic",
    "magic.mime",
    "mime.types",
    "networks",
    "nsswitch.conf",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "python3.11",
    "rpc",
    "services",
    "shells",
    "ssl",
    "timezone",
];

/// Paths under `/etc` never copied even inside an allowed directory.
pub const ETC_DENYLIST: [&str; 1] = ["ssl/private"];

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
bin:x:2:2:bin:/bin:/usr/sbin/nologin\n\
sys:x:3:3:sys:/dev:/usr/sbin/nologin\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str =
    "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\ntty:x:5:\nusers:x:100:\nnogroup:x:65534:\n";
const HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// Builds the `host` skeleton under `templates_dir` once, atomically (a
/// temporary directory renamed into place), and returns its path. Several
/// processes may race here; the loser's copy is discarded.
pub fn ensure_host_skeleton(
    templates_dir: &Path,
    host_root: &Path,
    host: &[(&str, HostEntry)],
) -> Result<PathBuf, TemplateError> {
    // v3: `run/secrets` is in the skeleton, so mounting the secrets tmpfs
    // copies nothing up (v2 cost every sandbox two directories on disk).
    let dest = templates_dir.join("host-v3");
    if dest.join(".complete").exists() {
        return Ok(dest);
    }
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TemplateError::Skeleton { path, source }
    };
    std::fs::create_dir_all(templates_dir).map_err(err(templates_dir))?;
    let tmp = templates_dir.join(format!(".host-v3.tmp.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    build_skeleton(&tmp, host_root, host).map_err(err(&tmp))?;
    std::fs::write(tmp.join(".complete"), b"").map_err(err(&tmp))?;
    if std::fs::rename(&tmp, &dest).is_err() {
        // Someone else finished first (or an incomplete one is in the way).
        if !dest.join(".complete").exists() {
            let _ = std::fs::remove_dir_all(&dest);
            std::fs::rename(&tmp, &dest).map_err(err(&dest))?;
        } else {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    Ok(dest)
}

fn build_skeleton(root: &Path, host_root: &Path, host: &[(&str, HostEntry)]) -> io::Result<()> {
    let mkdir = |p: &str, mode: u32| {
        let path = root.join(p);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
    };
    mkdir("", 0o755)?;
    for (d, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("tmp", 0o1777),
        ("workspace", 0o755),
        ("root", 0o700),
        ("home", 0o755),
        ("etc", 0o755),
        ("run", 0o755),
        // The secrets tmpfs's mount point (`plan::mounts`): here, mounting
        // it copies no directory up into the sandbox's upper layer.
        ("run/secrets", 0o755),
        ("var/tmp", 0o1777),
        ("var/lib", 0o755),
        ("var/cache", 0o755),
        ("var/log", 0o755),
        ("opt", 0o755),
        ("mnt", 0o755),
        ("srv", 0o755),
    ] {
        mkdir(d, mode)?;
    }
    for (name, entry) in host {
        match entry {
            HostEntry::Dir => mkdir(name, 0o755)?,
            HostEntry::Symlink(target) => symlink(target, root.join(name))?,
            HostEntry::Missing => {}
        }
    }
    let etc = root.join("etc");
    for name in ETC_ALLOWLIST {
        let src = host_root.join("etc").join(name);
        if std::fs::symlink_metadata(&src).is_ok() {
            copy_tree(&src, &etc.join(name), Path::new(name))?;
        }
    }
    std::fs::write(etc.join("passwd"), PASSWD)?;
    std::fs::write(etc.join("group"), GROUP)?;
    std::fs::write(etc.join("hosts"), HOSTS)?;
    std::fs::write(etc.join("hostname"), "sandbox\n")?;
    // Every DNS query of a sandbox with egress lands on the daemon's
    // resolver whatever server it names; this one is routed (see
    // `egress::plan::RESOLVER_ADDR`), and unreachable without egress.
    std::fs::write(etc.join("resolv.conf"), "nameserver 100.96.0.53\n")?;
    symlink("/proc/self/mounts", etc.join("mtab"))?;
    Ok(())
}

/// Copies regular files, directories and symlinks (never following them);
/// anything else is skipped.
fn copy_tree(src: &Path, dst: &Path, rel: &Path) -> io::Result<()> {
    if ETC_DENYLIST.iter().any(|d| rel == Path::new(d)) {
        return Ok(());
    }
    let meta = std::fs::symlink_metadata(src)?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        symlink(std::fs::read_link(src)?, dst)?;
    } else if ft.is_dir() {
        std::fs::create_dir(dst)?;
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        for entry in std::fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(
                &entry.path(),
                &dst.join(entry.file_name()),
                &rel.join(entry.file_name()),
            )?;
        }
    } else if ft.is_file() {
        std::fs::copy(src, dst)?;
    }
    Ok(())
}

use std::os::unix::fs::MetadataExt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_layers_overlay_each_real_system_dir_and_skip_symlinks() {
        let host = [
            ("usr", HostEntry::Dir),
            ("bin", HostEntry::Symlink("usr/bin".into())),
            ("lib64", HostEntry::Dir),
            ("lib32", HostEntry::Missing),
        ];
        let host_t = Resolved::simple(&mayfly_types::TemplateRef::Host).unwrap();
        let layers = plan_layers(&host_t, Path::new("/s/host-v3"), &host);
        assert_eq!(
            layers,
            vec![
                Layer {
                    lowers: vec!["/s/host-v3".into()],
                    target: "".into()
                },
                Layer {
                    lowers: vec!["/usr".into()],
                    target: "usr".into()
                },
                Layer {
                    lowers: vec!["/lib64".into()],
                    target: "lib64".into()
                },
            ]
        );
    }

    #[test]
    fn dir_template_is_one_layer() {
        let dir_t =
            Resolved::simple(&mayfly_types::TemplateRef::Dir("/srv/rootfs".into())).unwrap();
        let layers = plan_layers(&dir_t, Path::new("/s"), &[]);
        assert_eq!(
            layers,
            vec![Layer {
                lowers: vec!["/srv/rootfs".into()],
                target: "".into()
            }]
        );
    }

    #[test]
    fn built_layers_stack_above_the_base_and_join_the_host_dirs_they_touch() {
        let mut t = Resolved::simple(&mayfly_types::TemplateRef::Host).unwrap();
        t.layers = vec![
            ("/l/a".into(), vec!["etc".into(), "usr".into()]),
            ("/l/b".into(), vec!["var".into()]),
        ];
        let host = [("usr", HostEntry::Dir), ("lib64", HostEntry::Dir)];
        let layers = plan_layers(&t, Path::new("/sk"), &host);
        assert_eq!(
            layers,
            vec![
                Layer {
                    lowers: vec!["/l/b".into(), "/l/a".into(), "/sk".into()],
                    target: "".into()
                },
                Layer {
                    lowers: vec!["/l/a/usr".into(), "/usr".into()],
                    target: "usr".into()
                },
                Layer {
                    lowers: vec!["/lib64".into()],
                    target: "lib64".into()
                },
            ]
        );
        t.base = Base::Image("oci:/x".into());
        assert_eq!(
            plan_layers(&t, Path::new("/sk"), &host),
            vec![Layer {
                lowers: vec!["/l/b".into(), "/l/a".into()],
                target: "".into()
            }]
        );
    }

    #[test]
    fn skeleton_copies_allowlisted_etc_and_never_secrets() {
        let host = tempfile::tempdir().unwrap();
        let etc = host.path().join("etc");
        std::fs::create_dir_all(etc.join("ssl/private")).unwrap();
        std::fs::create_dir_all(etc.join("ssl/certs")).unwrap();
        std::fs::write(etc.join("ssl/private/key.pem"), "SECRET").unwrap();
        std::fs::write(etc.join("ssl/certs/ca.pem"), "CA").unwrap();
        std::fs::write(etc.join("shadow"), "root:SECRET").unwrap();
        std::fs::write(etc.join("passwd"), "alice:x:1000:1000::/home/alice:/bin/sh").unwrap();
        std::fs::write(etc.join("os-release"), "ID=test").unwrap();
        let out = tempfile::tempdir().unwrap();
        let sk = ensure_host_skeleton(out.path(), host.path(), &[("usr", HostEntry::Dir)]).unwrap();
        assert!(sk.join("etc/ssl/certs/ca.pem").exists());
        assert!(!sk.join("etc/ssl/private").exists());
        assert!(!sk.join("etc/shadow").exists());
        let passwd = std::fs::read_to_string(sk.join("etc/passwd")).unwrap();
        assert!(passwd.starts_with("root:") && !passwd.contains("alice"));
        assert!(sk.join("usr").is_dir() && sk.join("workspace").is_dir());
        assert!(sk.join("run/secrets").is_dir());
        // A second call reuses the finished skeleton.
        assert_eq!(
            ensure_host_skeleton(out.path(), host.path(), &[]).unwrap(),
            sk
        );
    }
}
