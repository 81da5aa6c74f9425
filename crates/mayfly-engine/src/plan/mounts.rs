//! The mount plan of a sandbox: a pure function from where the root is and
//! what the limits are to the exact list of mount operations init performs.
//!
//! Order matters and is explained inline. Tests compare whole plans.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use mayfly_types::ResolvedLimits;

/// One step init performs inside the sandbox's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountOp {
    /// Create a directory if missing (a mount point in a `dir:` template).
    Mkdir {
        path: PathBuf,
        mode: u32,
    },
    /// A fresh procfs for the sandbox's pid namespace.
    Proc {
        path: PathBuf,
    },
    /// A size-limited tmpfs.
    Tmpfs {
        path: PathBuf,
        data: String,
        noexec: bool,
    },
    /// Bind one host device node (null, zero, …) onto an empty file.
    BindDevice {
        src: PathBuf,
        dst: PathBuf,
    },
    /// A private devpts instance, so ptys are not shared with the host.
    Devpts {
        path: PathBuf,
    },
    Symlink {
        target: PathBuf,
        link: PathBuf,
    },
    /// Read-only sysfs (owned by the sandbox's network namespace).
    Sysfs {
        path: PathBuf,
    },
    /// Hide a file by binding `/dev/null` over it (skipped if absent).
    MaskFile {
        path: PathBuf,
    },
    /// Hide a directory under an empty read-only tmpfs (skipped if absent).
    MaskDir {
        path: PathBuf,
    },
    /// Make a path read-only (skipped if absent).
    ReadOnly {
        path: PathBuf,
    },
}

/// Device nodes every sandbox gets, bound from the host's `/dev`.
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// OCI default masked paths: readable kernel state that leaks host details.
pub const MASKED_FILES: [&str; 6] = [
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
];
pub const MASKED_DIRS: [&str; 5] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// OCI default read-only paths: kernel knobs a sandbox must not turn.
pub const READONLY: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Steps taken before `pivot_root`, with absolute paths under `root` (the
/// sandbox's root as seen from init before pivoting).
pub fn before_pivot(root: &Path, limits: &ResolvedLimits) -> Vec<MountOp> {
    let at = |p: &str| root.join(p);
    let mut ops = vec![
        // A `dir:` template may lack mount points; on `host` these already
        // exist in the skeleton and cost one stat each.
        MountOp::Mkdir {
            path: at("proc"),
            mode: 0o555,
        },
        MountOp::Mkdir {
            path: at("dev"),
            mode: 0o755,
        },
        MountOp::Mkdir {
            path: at("sys"),
            mode: 0o555,
        },
        MountOp::Mkdir {
            path: at("tmp"),
            mode: 0o1777,
        },
        MountOp::Mkdir {
            path: at("workspace"),
            mode: 0o755,
        },
        // procfs first: later masks refer to it, and mounting proc while the
        // host's proc is still fully visible in this namespace satisfies the
        // kernel's "not more revealing" rule.
        MountOp::Proc { path: at("proc") },
        // No sysfs: the network namespace belongs to the host's user
        // namespace (made ahead of time by the stub), and sysfs may only be
        // mounted by its owner. `/sys` stays an empty directory, which the
        // OCI runtime spec allows and which hides the host's devices.
        // /dev is a small tmpfs holding only what is listed below; no host
        // device is reachable except the harmless ones bound in.
        MountOp::Tmpfs {
            path: at("dev"),
            data: "mode=755,size=65536".into(),
            noexec: true,
        },
    ];
    for d in DEVICES {
        ops.push(MountOp::BindDevice {
            src: Path::new("/dev").join(d),
            dst: at("dev").join(d),
        });
    }
    ops.extend([
        MountOp::Mkdir {
            path: at("dev/pts"),
            mode: 0o755,
        },
        MountOp::Devpts {
            path: at("dev/pts"),
        },
        MountOp::Symlink {
            target: "pts/ptmx".into(),
            link: at("dev/ptmx"),
        },
        MountOp::Mkdir {
            path: at("dev/shm"),
            mode: 0o1777,
        },
        MountOp::Tmpfs {
            path: at("dev/shm"),
            data: format!("mode=1777,size={}", limits.tmp_bytes),
            noexec: false,
        },
        MountOp::Symlink {
            target: "/proc/self/fd".into(),
            link: at("dev/fd"),
        },
        MountOp::Symlink {
            target: "/proc/self/fd/0".into(),
            link: at("dev/stdin"),
        },
        MountOp::Symlink {
            target: "/proc/self/fd/1".into(),
            link: at("dev/stdout"),
        },
        MountOp::Symlink {
            target: "/proc/self/fd/2".into(),
            link: at("dev/stderr"),
        },
        // File secrets live on a tmpfs of their own: never on the upper
        // directory (the host's disk), gone with the mount namespace. It is
        // small (secrets are at most 64 KiB each) and cannot hold programs.
        MountOp::Mkdir {
            path: at("run"),
            mode: 0o755,
        },
        MountOp::Mkdir {
            path: at("run/secrets"),
            mode: 0o755,
        },
        MountOp::Tmpfs {
            path: at("run/secrets"),
            data: "mode=755,size=1048576".into(),
            noexec: true,
        },
        MountOp::Tmpfs {
            path: at("tmp"),
            data: format!("mode=1777,size={}", limits.tmp_bytes),
            noexec: false,
        },
    ]);
    ops
}

/// Steps taken after `pivot_root`: masks over the sandbox's own proc and sys.
pub fn after_pivot() -> Vec<MountOp> {
    let mut ops = Vec::new();
    ops.extend(
        MASKED_FILES
            .iter()
            .map(|p| MountOp::MaskFile { path: p.into() }),
    );
    ops.extend(
        MASKED_DIRS
            .iter()
            .map(|p| MountOp::MaskDir { path: p.into() }),
    );
    ops.extend(
        READONLY
            .iter()
            .map(|p| MountOp::ReadOnly { path: p.into() }),
    );
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_mounts_proc_before_dev_and_tmp_is_size_limited() {
        let limits = ResolvedLimits {
            tmp_bytes: 1 << 20,
            ..ResolvedLimits::DEFAULT
        };
        let ops = before_pivot(Path::new("/r"), &limits);
        let proc_at = ops
            .iter()
            .position(|o| matches!(o, MountOp::Proc { .. }))
            .unwrap();
        let dev_at = ops
            .iter()
            .position(|o| matches!(o, MountOp::Tmpfs { path, .. } if path == Path::new("/r/dev")))
            .unwrap();
        assert!(proc_at < dev_at);
        assert_eq!(
            ops.last(),
            Some(&MountOp::Tmpfs {
                path: "/r/tmp".into(),
                data: "mode=1777,size=1048576".into(),
                noexec: false
            })
        );
    }

    #[test]
    fn plan_binds_exactly_the_minimal_device_set() {
        let ops = before_pivot(Path::new("/r"), &ResolvedLimits::DEFAULT);
        let devs: Vec<_> = ops
            .iter()
            .filter_map(|o| match o {
                MountOp::BindDevice { src, dst } => Some((src.clone(), dst.clone())),
                _ => None,
            })
            .collect();
        let expected: Vec<_> = DEVICES
            .iter()
            .map(|d| (Path::new("/dev").join(d), Path::new("/r/dev").join(d)))
            .collect();
        assert_eq!(devs, expected);
        assert!(ops.contains(&MountOp::Devpts {
            path: "/r/dev/pts".into()
        }));
    }

    #[test]
    fn after_pivot_masks_the_oci_default_set() {
        let ops = after_pivot();
        assert_eq!(ops.len(), 16);
        assert!(ops.contains(&MountOp::MaskFile {
            path: "/proc/kcore".into()
        }));
        assert!(ops.contains(&MountOp::ReadOnly {
            path: "/proc/sys".into()
        }));
        assert!(ops.contains(&MountOp::MaskDir {
            path: "/sys/firmware".into()
        }));
    }
}
