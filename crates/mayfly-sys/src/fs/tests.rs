//! These tests run as root (as CI does); the magic-link and mount tests use
//! the host's own `/` as the root descriptor, which needs no mounts.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;

fn root_of(dir: &Path) -> OwnedFd {
    let cwd = std::fs::File::open("/").expect("open /");
    open(cwd, dir, Access::DirHandle, Resolve::InRoot).expect("open root")
}

#[test]
fn in_root_clamps_absolute_symlinks_and_dotdot_to_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("etc")).unwrap();
    std::fs::write(tmp.path().join("etc/passwd"), b"inside").unwrap();
    symlink("/", tmp.path().join("up")).unwrap();
    let root = root_of(tmp.path());
    for p in [
        "up/etc/passwd",
        "../../../etc/passwd",
        "/etc/passwd",
        "up/../up/etc/passwd",
    ] {
        let h = open(&root, Path::new(p), Access::Handle, Resolve::InRoot).unwrap();
        let f = open_regular_for_read(h.as_fd(), Path::new(p)).unwrap();
        assert_eq!(std::io::read_to_string(f).unwrap(), "inside", "{p}");
    }
}

#[test]
fn in_root_refuses_magic_links() {
    let root = root_of(Path::new("/"));
    let err = open(
        &root,
        Path::new("proc/self/root/etc"),
        Access::Handle,
        Resolve::InRoot,
    )
    .unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err}");
    let err = open(
        &root,
        Path::new("proc/self/cwd"),
        Access::Handle,
        Resolve::InRoot,
    )
    .unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err}");
}

#[test]
fn child_resolution_never_follows_a_symlink_but_can_hold_one() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    symlink("d", tmp.path().join("l")).unwrap();
    let root = root_of(tmp.path());
    // O_DIRECTORY | O_NOFOLLOW on a symlink reports ENOTDIR.
    let err = open(&root, Path::new("l"), Access::Dir, Resolve::Child).unwrap_err();
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err}");
    let err = open(&root, Path::new("l/x"), Access::Handle, Resolve::Child).unwrap_err();
    assert!(matches!(err, FsError::SymlinkRefused { .. }), "{err}");
    let h = open(&root, Path::new("l"), Access::Handle, Resolve::Child).unwrap();
    assert_eq!(stat_fd(&h, Path::new("l")).unwrap().kind, Kind::Symlink);
    assert_eq!(readlink_at(&h, Path::new("")).unwrap(), "d");
}

#[test]
fn child_resolution_refuses_to_cross_a_mount_point() {
    let root = root_of(Path::new("/"));
    let err = open(&root, Path::new("proc"), Access::Dir, Resolve::Child).unwrap_err();
    assert!(matches!(err, FsError::CrossesMount { .. }), "{err}");
}

#[test]
fn pseudo_filesystems_are_refused_and_storage_is_not() {
    let root = root_of(Path::new("/"));
    for (p, fs) in [("proc", "procfs"), ("sys", "sysfs")] {
        let h = open(&root, Path::new(p), Access::DirHandle, Resolve::InRoot).unwrap();
        match check_filesystem(&h, Path::new(p)) {
            Err(FsError::ForbiddenFilesystem { fs: got, .. }) => assert_eq!(got, fs),
            other => panic!("{p}: {other:?}"),
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    check_filesystem(root_of(tmp.path()), tmp.path()).unwrap();
}

#[test]
fn reading_a_fifo_fails_at_once_instead_of_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(
        &tmp.path().join("f"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let root = root_of(tmp.path());
    let h = open(&root, Path::new("f"), Access::Handle, Resolve::InRoot).unwrap();
    let err = open_regular_for_read(h.as_fd(), Path::new("f")).unwrap_err();
    assert!(matches!(err, FsError::NotRegular { .. }), "{err}");
}

#[test]
fn create_file_refuses_an_existing_symlink_instead_of_writing_through_it() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path().join("victim"), tmp.path().join("l")).unwrap();
    let root = root_of(tmp.path());
    let err = create_file(&root, Path::new("l"), 0o644).unwrap_err();
    assert!(matches!(
        err,
        FsError::AlreadyExists { .. } | FsError::SymlinkRefused { .. }
    ));
    assert!(!outside.path().join("victim").exists());
}

#[test]
fn rename_without_replace_keeps_the_destination() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"a").unwrap();
    std::fs::write(tmp.path().join("b"), b"b").unwrap();
    let root = root_of(tmp.path());
    let err = rename_at(&root, Path::new("a"), &root, Path::new("b"), Replace::Never).unwrap_err();
    assert!(matches!(err, FsError::AlreadyExists { .. }), "{err}");
    rename_at(&root, Path::new("a"), &root, Path::new("b"), Replace::Allow).unwrap();
    assert_eq!(std::fs::read(tmp.path().join("b")).unwrap(), b"a");
}

#[test]
fn listing_starts_over_on_each_call_and_reports_truncation() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..5 {
        std::fs::write(tmp.path().join(format!("f{i}")), b"").unwrap();
    }
    let root = root_of(tmp.path());
    let first = list_dir(&root, 3, tmp.path()).unwrap();
    assert_eq!((first.entries.len(), first.truncated), (3, true));
    let all = list_dir(&root, 10, tmp.path()).unwrap();
    assert_eq!((all.entries.len(), all.truncated), (5, false));
    assert!(all.entries.iter().all(|e| e.kind == Some(Kind::File)));
}

#[test]
fn a_hard_link_is_made_from_the_pinned_inode() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"x").unwrap();
    let root = root_of(tmp.path());
    let h = open(&root, Path::new("a"), Access::Handle, Resolve::Child).unwrap();
    link_fd_at(&h, &root, Path::new("b")).unwrap();
    let (a, b) = (
        stat_at(&root, Path::new("a")).unwrap(),
        stat_at(&root, Path::new("b")).unwrap(),
    );
    assert_eq!(a.ino, b.ino);
}

#[test]
fn errors_name_the_operation_and_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let root = root_of(tmp.path());
    let err = unlink_at(&root, Path::new("missing"), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot remove `missing`: it does not exist"
    );
}

#[test]
fn create_as_makes_names_as_the_given_ids_keeps_capabilities_and_restores_all() {
    assert_eq!(
        nix::unistd::geteuid().as_raw(),
        0,
        "this test needs root (run the suite as root, as CI does)"
    );
    let before = caps::read(None, caps::CapSet::Effective).expect("capget");
    let tmp = tempfile::tempdir().unwrap();
    // A directory only root may write: making a name there as another uid
    // needs the capabilities the guard keeps.
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let dir = std::fs::File::open(tmp.path()).unwrap();
    let owner = |name: &str| {
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(tmp.path().join(name)).unwrap())
    };
    {
        let _as = CreateAs::enter(424_242, 424_243).expect("create as");
        mkdir_at(&dir, Path::new("d"), 0o700).expect("mkdir as another uid");
        drop(create_file(&dir, Path::new("f"), 0o600).expect("create as another uid"));
    }
    assert_eq!((owner("d"), owner("f")), (424_242, 424_242));
    let gid =
        std::os::unix::fs::MetadataExt::gid(&std::fs::metadata(tmp.path().join("f")).unwrap());
    assert_eq!(gid, 424_243);
    // Back to root and the same capabilities.
    drop(create_file(&dir, Path::new("g"), 0o600).unwrap());
    assert_eq!(owner("g"), 0);
    assert_eq!(caps::read(None, caps::CapSet::Effective).unwrap(), before);

    // The retry helper makes the call once when it succeeds, twice (the
    // second as the ids given) when the first is refused for its creator.
    let mut calls = 0;
    let got = create_mapped(424_242, 424_242, || {
        calls += 1;
        Ok::<_, FsError>(calls)
    });
    assert_eq!((got.unwrap(), calls), (1, 1));
    let mut fsuids = Vec::new();
    let got = create_mapped(424_242, 424_242, || {
        // SAFETY: an invalid id (-1) changes nothing and returns the current one.
        fsuids.push(unsafe { libc::setfsuid(u32::MAX) });
        if fsuids.len() == 1 {
            Err(FsError::UnmappedCreator {
                op: "create",
                path: "x".into(),
            })
        } else {
            Ok(())
        }
    });
    assert!(got.is_ok());
    assert_eq!(fsuids, [0, 424_242]);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setfsuid(u32::MAX) }, 0);
}
