//! The ordinary behaviour of each operation.

use std::os::unix::fs::{chown, symlink, MetadataExt, PermissionsExt};

use mayfly_types::{ErrorCode, FileKind};

use super::{Fake, BASE};

#[test]
fn write_then_read_round_trips_binary_data() {
    let f = Fake::new();
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let st = f.fs.write("/workspace/bin", &data, None, 0).unwrap();
    assert_eq!(
        (st.name.as_str(), st.kind, st.size),
        ("/workspace/bin", FileKind::File, 70_000)
    );
    assert_eq!(f.fs.read("bin", u64::MAX).unwrap(), data);
}

#[test]
fn write_creates_files_owned_by_the_sandbox_and_stat_translates_back() {
    let f = Fake::new();
    let st = f.fs.write("/workspace/root-owned", b"x", None, 0).unwrap();
    let meta = std::fs::metadata(f.host("/workspace/root-owned")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (BASE, BASE));
    assert_eq!((st.uid, st.gid), (0, 0));

    f.fs.write("/workspace/user-owned", b"x", None, 1000)
        .unwrap();
    let meta = std::fs::metadata(f.host("/workspace/user-owned")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (BASE + 1000, BASE + 1000));
    let st = f.fs.stat("/workspace/user-owned").unwrap();
    assert_eq!((st.uid, st.gid), (1000, 1000));
}

#[test]
fn ids_outside_the_sandbox_range_show_as_nobody() {
    let f = Fake::new();
    std::fs::write(f.host("/workspace/host-owned"), b"x").unwrap();
    chown(f.host("/workspace/host-owned"), Some(0), Some(0)).unwrap();
    let st = f.fs.stat("/workspace/host-owned").unwrap();
    assert_eq!((st.uid, st.gid), (65534, 65534));
}

#[test]
fn write_refuses_an_owner_outside_the_sandbox_range() {
    let f = Fake::new();
    let err = f.fs.write("/workspace/x", b"x", None, 65536).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(!f.host("/workspace/x").exists());
}

#[test]
fn write_drops_setuid_and_setgid_and_keeps_an_existing_mode() {
    let f = Fake::new();
    let st = f.fs.write("/workspace/s", b"x", Some(0o6755), 0).unwrap();
    assert_eq!(st.mode, 0o755);
    f.fs.write("/workspace/m", b"x", Some(0o600), 0).unwrap();
    let st = f.fs.write("/workspace/m", b"y", None, 0).unwrap();
    assert_eq!(st.mode, 0o600);
    let mode = std::fs::metadata(f.host("/workspace/m"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
}

#[test]
fn write_replaces_atomically_and_leaves_no_temporary_file() {
    let f = Fake::new();
    f.fs.write("/workspace/a", b"old", None, 0).unwrap();
    f.fs.write("/workspace/a", b"new", None, 0).unwrap();
    assert_eq!(std::fs::read(f.host("/workspace/a")).unwrap(), b"new");
    let names: Vec<_> =
        f.fs.list("/workspace")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
    assert_eq!(names, ["a"]);
}

#[test]
fn write_refuses_to_replace_a_directory() {
    let f = Fake::new();
    std::fs::create_dir(f.host("/workspace/d")).unwrap();
    let err = f.fs.write("/workspace/d", b"x", None, 0).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(f.host("/workspace/d").is_dir());
    let err = f.fs.write("/", b"x", None, 0).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
}

#[test]
fn reading_a_directory_or_a_missing_file_gives_clear_errors() {
    let f = Fake::new();
    let err = f.fs.read("/workspace", 100).unwrap_err();
    assert_eq!(
        (err.code(), err.to_string()),
        (
            ErrorCode::InvalidArgument,
            "`/workspace` is a directory".into()
        )
    );
    let err = f.fs.read("/workspace/nope", 100).unwrap_err();
    assert_eq!(
        (err.code(), err.to_string()),
        (
            ErrorCode::NotFound,
            "`/workspace/nope` does not exist".into()
        )
    );
}

#[test]
fn read_over_the_callers_cap_is_too_large() {
    let f = Fake::new();
    std::fs::write(f.host("/workspace/big"), vec![7u8; 100]).unwrap();
    assert_eq!(
        f.fs.read("/workspace/big", 99).unwrap_err().code(),
        ErrorCode::TooLarge
    );
    assert_eq!(f.fs.read("/workspace/big", 100).unwrap().len(), 100);
}

#[test]
fn stat_reports_a_symlink_without_following_it() {
    let f = Fake::new();
    symlink("/etc/shadow", f.host("/workspace/l")).unwrap();
    let st = f.fs.stat("/workspace/l").unwrap();
    assert_eq!(st.kind, FileKind::Symlink);
    assert_eq!(st.link_target.as_deref(), Some("/etc/shadow"));
    assert_eq!(f.fs.stat("/").unwrap().kind, FileKind::Dir);
}

#[test]
fn list_is_sorted_and_describes_each_entry() {
    let f = Fake::new();
    f.fs.write("/workspace/b", b"12", None, 0).unwrap();
    f.fs.mkdir("/workspace/a", false, None).unwrap();
    symlink("b", f.host("/workspace/c")).unwrap();
    let got: Vec<_> =
        f.fs.list("/workspace")
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.kind, s.link_target))
            .collect();
    assert_eq!(
        got,
        [
            ("a".to_owned(), FileKind::Dir, None),
            ("b".to_owned(), FileKind::File, None),
            ("c".to_owned(), FileKind::Symlink, Some("b".to_owned())),
        ]
    );
    assert_eq!(
        f.fs.list("/workspace/b").unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
}

#[test]
fn mkdir_sets_owner_and_mode_and_parents_makes_the_chain() {
    let f = Fake::new();
    let st = f.fs.mkdir("/workspace/p/q/r", true, Some(0o700)).unwrap();
    assert_eq!((st.kind, st.mode, st.uid), (FileKind::Dir, 0o700, 0));
    let meta = std::fs::metadata(f.host("/workspace/p/q")).unwrap();
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o7777),
        (BASE, 0o755)
    );
    // mkdir -p of an existing directory is fine; plain mkdir is a conflict.
    f.fs.mkdir("/workspace/p/q/r", true, None).unwrap();
    let err = f.fs.mkdir("/workspace/p/q/r", false, None).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Conflict);
    let err = f.fs.mkdir("/workspace/x/y", false, None).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
}

#[test]
fn rename_moves_and_never_replaces() {
    let f = Fake::new();
    f.fs.write("/workspace/a", b"a", None, 0).unwrap();
    f.fs.write("/workspace/b", b"b", None, 0).unwrap();
    let err = f.fs.rename("/workspace/a", "/workspace/b").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Conflict);
    f.fs.rename("/workspace/a", "/tmp/a").unwrap();
    assert_eq!(std::fs::read(f.host("/tmp/a")).unwrap(), b"a");
    let err =
        f.fs.rename("/workspace/missing", "/workspace/c")
            .unwrap_err();
    assert_eq!(err.to_string(), "`/workspace/missing` does not exist");
    f.fs.mkdir("/workspace/d", false, None).unwrap();
    let err =
        f.fs.rename("/workspace/d", "/workspace/d/inner")
            .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(
        f.fs.rename("/", "/x").unwrap_err().code(),
        ErrorCode::PermissionDenied
    );
}

#[test]
fn remove_handles_files_empty_and_full_directories() {
    let f = Fake::new();
    f.fs.write("/workspace/f", b"x", None, 0).unwrap();
    f.fs.remove("/workspace/f", false).unwrap();
    f.fs.mkdir("/workspace/d/e/g", true, None).unwrap();
    f.fs.write("/workspace/d/e/file", b"x", None, 0).unwrap();
    let err = f.fs.remove("/workspace/d", false).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Conflict);
    f.fs.remove("/workspace/d", true).unwrap();
    assert!(!f.host("/workspace/d").exists());
    assert_eq!(
        f.fs.remove("/workspace/d", true).unwrap_err().code(),
        ErrorCode::NotFound
    );
}

#[test]
fn remove_refuses_the_root() {
    let f = Fake::new();
    for p in ["/", "/..", "../../.."] {
        let err = f.fs.remove(p, true).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{p}");
    }
    assert!(f.host("/etc/passwd").exists());
}

#[test]
fn remove_stops_at_the_depth_cap_instead_of_exhausting_descriptors() {
    let f = Fake::with_limits(super::FsLimits {
        max_depth: 4,
        ..Default::default()
    });
    std::fs::create_dir_all(f.host("/workspace/a/b/c/d/e/f")).unwrap();
    let err = f.fs.remove("/workspace/a", true).unwrap_err();
    assert_eq!(err.code(), ErrorCode::TooLarge);
}

#[test]
fn relative_paths_are_inside_the_workspace() {
    let f = Fake::new();
    f.fs.write("notes.txt", b"hi", None, 0).unwrap();
    assert_eq!(
        std::fs::read(f.host("/workspace/notes.txt")).unwrap(),
        b"hi"
    );
    assert_eq!(
        f.fs.stat("./notes.txt").unwrap().name,
        "/workspace/notes.txt"
    );
}
