//! File API tests against a temporary directory posing as a sandbox root.
//!
//! They run as root, as CI does: the daemon's view is reproduced by opening
//! the fake root as the root descriptor, and "the host" is everything
//! outside it, watched through a sentinel directory next to it.

mod attacks;
mod basics;
mod tar_in;
mod tar_out;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{FsLimits, SandboxFs};

/// A sandbox uid base as the engine hands them out (slot 7).
pub(super) const BASE: u32 = 100_000_000 + 65536 * 7;

pub(super) struct Fake {
    _tmp: tempfile::TempDir,
    /// The fake sandbox root, as the host sees it.
    pub root: PathBuf,
    /// A host directory next to the root that no call may touch.
    pub outside: PathBuf,
    pub fs: SandboxFs,
}

impl Fake {
    pub fn new() -> Self {
        Fake::with_limits(FsLimits::default())
    }

    pub fn with_limits(limits: FsLimits) -> Self {
        let tmp = tempfile::tempdir().expect("create a temporary directory");
        let root = tmp.path().join("root");
        for d in ["workspace", "tmp", "etc"] {
            std::fs::create_dir_all(root.join(d)).expect("create the fake root");
        }
        std::fs::write(root.join("etc/shadow"), "sandbox shadow").expect("write");
        std::fs::write(root.join("etc/passwd"), "sandbox passwd").expect("write");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).expect("create the outside directory");
        std::fs::write(outside.join("secret"), "host secret").expect("write");
        let fs = SandboxFs::open(&root, BASE, limits).expect("open the fake root");
        Fake {
            _tmp: tmp,
            root,
            outside,
            fs,
        }
    }

    /// The host path of inside path `p`.
    pub fn host(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// Every path below `dir` (host path) with its content or link target,
    /// never following symlinks: to assert that nothing changed.
    pub fn tree(dir: &Path) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut todo = vec![dir.to_owned()];
        while let Some(d) = todo.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
                let meta = std::fs::symlink_metadata(&p).expect("lstat");
                let what = if meta.is_symlink() {
                    format!("-> {}", std::fs::read_link(&p).expect("readlink").display())
                } else if meta.is_dir() {
                    todo.push(p.clone());
                    "dir".to_owned()
                } else if meta.is_file() {
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap_or_default()).into_owned()
                } else {
                    "special".to_owned()
                };
                out.insert(rel, what);
            }
        }
        out
    }

    pub fn outside_tree(&self) -> BTreeMap<String, String> {
        Fake::tree(&self.outside)
    }
}

/// Runs `f` on another thread and fails the test if it takes longer than
/// `secs`: for calls that must not block (FIFOs).
pub(super) fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("the call blocked instead of failing at once")
}

/// A procfs instance mounted at `<root>/proc` in a private mount namespace
/// of the calling test thread (libtest runs each test on its own thread),
/// so nothing is visible to the host. Open the `SandboxFs` after this: a
/// descriptor opened before the `unshare` does not see the new mount.
pub(super) struct PrivateProc {
    target: PathBuf,
}

impl PrivateProc {
    pub fn mount(root: &Path) -> PrivateProc {
        use nix::mount::{mount, MsFlags};
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .expect("unshare the mount namespace (the tests need root)");
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .expect("make the mount tree private");
        let target = root.join("proc");
        std::fs::create_dir_all(&target).expect("create <root>/proc");
        mount(
            Some("proc"),
            &target,
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .expect("mount procfs");
        PrivateProc { target }
    }
}

impl Drop for PrivateProc {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.target, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Builds a tar archive from raw headers, bypassing the `tar` crate's own
/// path checks, so the tests can write whatever an attacker would.
pub(super) struct RawTar(Vec<u8>);

impl RawTar {
    pub fn new() -> Self {
        RawTar(Vec::new())
    }

    pub fn entry(mut self, name: &[u8], kind: tar::EntryType, link: &[u8], data: &[u8]) -> Self {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(kind);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    pub fn file(self, name: &str, data: &[u8]) -> Self {
        self.entry(name.as_bytes(), tar::EntryType::Regular, b"", data)
    }

    pub fn dir(self, name: &str) -> Self {
        self.entry(name.as_bytes(), tar::EntryType::Directory, b"", b"")
    }

    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.entry(
            name.as_bytes(),
            tar::EntryType::Symlink,
            target.as_bytes(),
            b"",
        )
    }

    pub fn hardlink(self, name: &str, target: &str) -> Self {
        self.entry(
            name.as_bytes(),
            tar::EntryType::Link,
            target.as_bytes(),
            b"",
        )
    }

    /// A header only, claiming `size` bytes of data that never follow.
    pub fn header_only(mut self, name: &str, size: u64) -> Self {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(size);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0u8, 1024));
        self.0
    }
}
