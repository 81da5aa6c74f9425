//! What a hostile sandbox can plant, and proof that the host stays untouched.

use std::os::unix::fs::symlink;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mayfly_types::ErrorCode;

use super::{within, Fake, PrivateProc};
use crate::files::{FsLimits, SandboxFs};

#[test]
fn read_through_planted_root_symlink_stays_in_sandbox() {
    let f = Fake::new();
    symlink("/", f.host("/workspace/x")).unwrap();
    assert_eq!(
        f.fs.read("/workspace/x/etc/shadow", 1 << 20).unwrap(),
        b"sandbox shadow"
    );
    symlink("/etc", f.host("/workspace/etc-link")).unwrap();
    assert_eq!(
        f.fs.read("/workspace/etc-link/shadow", 1 << 20).unwrap(),
        b"sandbox shadow"
    );
}

#[test]
fn write_through_planted_root_symlink_stays_in_sandbox() {
    let f = Fake::new();
    symlink("/", f.host("/workspace/x")).unwrap();
    let name = format!("mayfly-pwned-{}", std::process::id());
    let host_tmp = std::path::Path::new("/tmp").join(&name);
    f.fs.write(&format!("/workspace/x/tmp/{name}"), b"pwned", None, 0)
        .unwrap();
    assert!(!host_tmp.exists(), "the host's /tmp was written");
    assert_eq!(
        std::fs::read(f.host(&format!("/tmp/{name}"))).unwrap(),
        b"pwned"
    );
}

#[test]
fn symlink_to_a_host_path_resolves_inside_the_sandbox() {
    let f = Fake::new();
    let before = f.outside_tree();
    let abs = f.outside.display().to_string();
    symlink(&abs, f.host("/workspace/abs")).unwrap();
    symlink("../../outside", f.host("/workspace/rel")).unwrap();
    for p in ["/workspace/abs/secret", "/workspace/rel/secret"] {
        let err = f.fs.read(p, 1 << 20).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{p}: {err}");
        let err = f.fs.write(p, b"pwned", None, 0).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{p}: {err}");
        assert!(f.fs.list(p.trim_end_matches("/secret")).is_err());
    }
    assert_eq!(f.outside_tree(), before);
}

#[test]
fn dotdot_paths_stay_in_root() {
    let f = Fake::new();
    assert_eq!(
        f.fs.read("../../etc/passwd", 1 << 20).unwrap(),
        b"sandbox passwd"
    );
    assert_eq!(
        f.fs.read("/../../../etc/passwd", 1 << 20).unwrap(),
        b"sandbox passwd"
    );
    f.fs.write("../../../outside/secret", b"pwned", None, 0)
        .unwrap_err();
    assert_eq!(
        std::fs::read(f.outside.join("secret")).unwrap(),
        b"host secret"
    );
}

#[test]
fn write_replaces_a_planted_final_symlink_instead_of_writing_through_it() {
    let f = Fake::new();
    symlink(f.outside.join("secret"), f.host("/workspace/link")).unwrap();
    symlink("/etc/shadow", f.host("/workspace/link2")).unwrap();
    f.fs.write("/workspace/link", b"new", None, 0).unwrap();
    f.fs.write("/workspace/link2", b"new", None, 0).unwrap();
    assert_eq!(
        std::fs::read(f.outside.join("secret")).unwrap(),
        b"host secret"
    );
    assert_eq!(
        std::fs::read(f.host("/etc/shadow")).unwrap(),
        b"sandbox shadow"
    );
    let meta = std::fs::symlink_metadata(f.host("/workspace/link")).unwrap();
    assert!(meta.is_file());
}

#[test]
fn magic_links_cannot_be_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("workspace")).unwrap();
    let _proc = PrivateProc::mount(&root);
    let fs = SandboxFs::open(&root, super::BASE, FsLimits::default()).unwrap();
    symlink("/proc/1/root", root.join("workspace/y")).unwrap();
    symlink("/proc/self/cwd", root.join("workspace/z")).unwrap();
    for p in [
        "/workspace/y/etc/shadow",
        "/proc/1/root/etc/shadow",
        "/proc/self/root/etc/passwd",
        "/workspace/z/Cargo.toml",
    ] {
        let err = fs.read(p, 1 << 20).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{p}: {err}");
        let err = fs.write(&format!("{p}-x"), b"pwned", None, 0).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{p}: {err}");
    }
    let err = fs.download_tar("/workspace/y/etc").unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
}

#[test]
fn procfs_inside_the_sandbox_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("workspace")).unwrap();
    let _proc = PrivateProc::mount(&root);
    let fs = SandboxFs::open(&root, super::BASE, FsLimits::default()).unwrap();
    let err = fs.read("/proc/self/status", 1 << 20).unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    let err = fs
        .write("/proc/sys/kernel/core_pattern", b"|/pwn", None, 0)
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    assert_eq!(
        fs.list("/proc").unwrap_err().code(),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        fs.stat("/proc/1").unwrap_err().code(),
        ErrorCode::PermissionDenied
    );
    // Packing `/` skips the procfs mount point instead of descending into it.
    let archive = fs.download_tar("/").unwrap();
    let mut ar = tar::Archive::new(archive.as_slice());
    let names: Vec<String> = ar
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(names, ["workspace"]);
}

#[test]
fn reading_a_fifo_fails_at_once() {
    let f = Arc::new(Fake::new());
    nix::unistd::mkfifo(
        &f.host("/workspace/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let g = Arc::clone(&f);
    let err = within(5, move || g.fs.read("/workspace/fifo", 1 << 20)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    let g = Arc::clone(&f);
    let err = within(5, move || g.fs.write("/workspace/fifo", b"x", None, 0));
    // Writing replaces the FIFO with a file, never opening it.
    assert!(err.is_ok(), "{err:?}");
}

#[test]
fn a_huge_sparse_file_is_refused_before_reading() {
    let f = Fake::new();
    let file = std::fs::File::create(f.host("/workspace/sparse")).unwrap();
    file.set_len(4 << 30).unwrap();
    let err = within(5, move || f.fs.read("/workspace/sparse", u64::MAX)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::TooLarge, "{err}");
}

#[test]
fn recursive_remove_removes_planted_symlinks_not_their_targets() {
    let f = Fake::new();
    let before = f.outside_tree();
    std::fs::create_dir_all(f.host("/workspace/t/sub")).unwrap();
    symlink(&f.outside, f.host("/workspace/t/abs")).unwrap();
    symlink("../../../outside", f.host("/workspace/t/sub/rel")).unwrap();
    symlink("/", f.host("/workspace/t/root")).unwrap();
    f.fs.remove("/workspace/t", true).unwrap();
    assert!(!f.host("/workspace/t").exists());
    assert_eq!(f.outside_tree(), before);
    assert!(f.host("/etc/passwd").exists());
    // A symlink to a directory, removed by name, is just unlinked.
    symlink(&f.outside, f.host("/workspace/l")).unwrap();
    f.fs.remove("/workspace/l", true).unwrap();
    assert_eq!(f.outside_tree(), before);
}

#[test]
fn symlink_swapped_in_during_recursive_remove_does_not_delete_outside() {
    let f = Arc::new(Fake::new());
    for d in 0..8 {
        std::fs::create_dir_all(f.outside.join(format!("d{d}"))).unwrap();
        std::fs::write(f.outside.join(format!("d{d}/keep")), "keep").unwrap();
    }
    let before = f.outside_tree();
    for round in 0..20 {
        let t = f.host("/workspace/t");
        for d in 0..8 {
            for s in 0..4 {
                let dir = t.join(format!("d{d}/s{s}"));
                std::fs::create_dir_all(&dir).unwrap();
                for i in 0..8 {
                    std::fs::write(dir.join(format!("f{i}")), "x").unwrap();
                }
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let racer = {
            let (stop, t, outside) = (Arc::clone(&stop), t.clone(), f.outside.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // The racer runs on the host, unconfined: it only ever
                    // renames real directories and plants links inside real
                    // directories, so it cannot write outside by itself.
                    let is_dir = |p: &std::path::Path| {
                        std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
                    };
                    for d in 0..8 {
                        let victim = t.join(format!("d{d}"));
                        let moved = t.join(format!("moved{d}-{n}"));
                        if is_dir(&victim) {
                            let _ = std::fs::rename(&victim, &moved);
                        }
                        let target = if n.is_multiple_of(2) {
                            outside.join(format!("d{d}"))
                        } else {
                            format!("../../../outside/d{d}").into()
                        };
                        let _ = symlink(&target, &victim);
                        for s in 0..4 {
                            if is_dir(&moved) {
                                let _ = symlink(&target, moved.join(format!("s{s}")));
                            }
                        }
                    }
                    n += 1;
                }
            })
        };
        // The walk may fail on a race; it must never touch the outside.
        let _ = f.fs.remove("/workspace/t", true);
        stop.store(true, Ordering::Relaxed);
        racer.join().unwrap();
        assert_eq!(f.outside_tree(), before, "round {round}");
        let _ = std::fs::remove_dir_all(&t);
    }
}
