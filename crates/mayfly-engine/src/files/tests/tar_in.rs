//! Tar upload: evil archives are rejected whole, good ones land complete.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::PathBuf;

use mayfly_types::ErrorCode;
use tar::EntryType;

use super::{Fake, RawTar, BASE};
use crate::files::tar_plan::{plan, Action, Planned};
use crate::files::{FilesError, FsLimits};
use crate::UploadSummary;

/// Uploads `archive` into `/workspace/up`, expects `code`, and checks that
/// nothing changed: no target directory, nothing outside, nothing on the host.
fn assert_rejected(f: &Fake, archive: &[u8], code: ErrorCode) -> FilesError {
    let before_root = Fake::tree(&f.root);
    let before_outside = f.outside_tree();
    let err = f.fs.upload_tar("/workspace/up", archive).unwrap_err();
    assert_eq!(err.code(), code, "{err}");
    assert_eq!(Fake::tree(&f.root), before_root, "the sandbox changed");
    assert_eq!(f.outside_tree(), before_outside, "the outside changed");
    err
}

#[test]
fn tar_entry_with_dotdot_is_rejected() {
    let f = Fake::new();
    for name in ["../x", "a/../../x", "a/b/../../../outside/pwned", ".."] {
        let archive = RawTar::new()
            .file("ok", b"fine")
            .file(name, b"pwned")
            .finish();
        let err = assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
        assert!(err.to_string().contains("`..`"), "{err}");
    }
}

#[test]
fn tar_entry_with_absolute_path_is_rejected() {
    let f = Fake::new();
    let host = format!("/tmp/mayfly-abs-{}", std::process::id());
    let archive = RawTar::new().file(&host, b"pwned").finish();
    assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    let archive = RawTar::new().file("/etc/x", b"pwned").finish();
    assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    assert!(!std::path::Path::new(&host).exists());
}

#[test]
fn tar_device_and_fifo_nodes_are_rejected() {
    let f = Fake::new();
    for kind in [EntryType::Char, EntryType::Block, EntryType::Fifo] {
        let archive = RawTar::new()
            .file("ok", b"x")
            .entry(b"dev", kind, b"", b"")
            .finish();
        assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    }
}

#[test]
fn tar_symlink_to_root_then_entry_through_it_is_rejected() {
    let f = Fake::new();
    let archive = RawTar::new()
        .symlink("a", "/")
        .file("a/etc/x", b"pwned")
        .finish();
    assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    // Even a harmless-looking relative symlink may not be gone through.
    let archive = RawTar::new()
        .dir("sub")
        .symlink("a", "sub")
        .file("a/x", b"x")
        .finish();
    let err = assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("not a directory"), "{err}");
    let archive = RawTar::new().file("a", b"file").file("a/x", b"x").finish();
    assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
}

#[test]
fn tar_symlinks_pointing_outside_the_upload_are_rejected() {
    let f = Fake::new();
    for target in [
        "/",
        "/etc/passwd",
        "../..",
        "../../x",
        "a/../../../x",
        "../../outside",
    ] {
        let archive = RawTar::new().dir("d").symlink("d/l", target).finish();
        assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    }
    // From `d/l`, `..` is the upload directory itself, which is inside.
    let archive = RawTar::new()
        .dir("d")
        .symlink("d/l", "..")
        .symlink("d/m", "../x")
        .finish();
    f.fs.upload_tar("/workspace/up", &archive).unwrap();
    assert_eq!(
        std::fs::read_link(f.host("/workspace/up/d/l")).unwrap(),
        PathBuf::from("..")
    );
}

#[test]
fn tar_hardlinks_out_of_the_archive_are_rejected() {
    let f = Fake::new();
    for target in [
        "/etc/passwd",
        "../../etc/passwd",
        "etc/passwd",
        "missing",
        "d",
    ] {
        let archive = RawTar::new().dir("d").hardlink("h", target).finish();
        assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    }
}

#[test]
fn tar_with_too_many_entries_is_rejected() {
    let f = Fake::with_limits(FsLimits {
        max_entries: 10,
        ..Default::default()
    });
    let mut tar = RawTar::new();
    for i in 0..11 {
        tar = tar.file(&format!("f{i}"), b"");
    }
    let err = assert_rejected(&f, &tar.finish(), ErrorCode::TooLarge);
    assert_eq!(err.to_string(), "the archive holds more than 10 entries");
    // Implied parent directories count too.
    let archive = RawTar::new().file("a/b/c/d/e/f/g/h/i/j/k", b"").finish();
    assert_rejected(&f, &archive, ErrorCode::TooLarge);
}

#[test]
fn tar_with_100_001_entries_is_rejected_at_the_default_cap() {
    let f = Fake::new();
    let mut tar = RawTar::new();
    for i in 0..100_001 {
        tar = tar.file(&format!("f{i}"), b"");
    }
    let err = assert_rejected(&f, &tar.finish(), ErrorCode::TooLarge);
    assert_eq!(
        err.to_string(),
        "the archive holds more than 100000 entries"
    );
}

#[test]
fn tar_over_the_size_cap_is_rejected() {
    let f = Fake::with_limits(FsLimits {
        max_archive_bytes: 1000,
        max_file_bytes: 600,
        ..Default::default()
    });
    let archive = RawTar::new()
        .file("a", &[1; 500])
        .file("b", &[2; 501])
        .finish();
    assert_rejected(&f, &archive, ErrorCode::TooLarge);
    let archive = RawTar::new().file("big", &[1; 601]).finish();
    assert_rejected(&f, &archive, ErrorCode::TooLarge);
    // A header may claim a terabyte that never follows: refused on the claim.
    let archive = RawTar::new().header_only("huge", 1 << 40).finish();
    assert_rejected(&f, &archive, ErrorCode::TooLarge);
}

#[test]
fn truncated_or_garbage_archives_are_rejected() {
    let f = Fake::new();
    let mut archive = RawTar::new().file("a", &[1; 2000]).finish();
    archive.truncate(1200);
    assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    assert_rejected(&f, &[0x55; 700], ErrorCode::InvalidArgument);
}

#[test]
fn tar_upload_creates_files_dirs_and_links_owned_by_the_sandbox() {
    let f = Fake::new();
    let archive = RawTar::new()
        .dir("./")
        .dir("src")
        .file("src/main.rs", b"fn main() {}")
        .entry(b"src/run.sh", EntryType::Regular, b"", b"#!/bin/sh")
        .symlink("src/link", "main.rs")
        .hardlink("src/hard", "src/main.rs")
        .file("deep/er/file", b"x")
        .finish();
    let summary = f.fs.upload_tar("/workspace/up/new", &archive).unwrap();
    assert_eq!(
        summary,
        UploadSummary {
            files: 4,
            dirs: 3,
            symlinks: 1,
            bytes: 22
        }
    );
    let up = f.host("/workspace/up/new");
    assert_eq!(
        std::fs::read(up.join("src/main.rs")).unwrap(),
        b"fn main() {}"
    );
    assert_eq!(
        std::fs::read_link(up.join("src/link")).unwrap(),
        PathBuf::from("main.rs")
    );
    let (m, h) = (
        std::fs::metadata(up.join("src/main.rs")).unwrap(),
        std::fs::metadata(up.join("src/hard")).unwrap(),
    );
    assert_eq!(m.ino(), h.ino());
    assert_eq!((m.uid(), m.gid(), m.mtime()), (BASE, BASE, 1_700_000_000));
    let l = std::fs::symlink_metadata(up.join("src/link")).unwrap();
    assert_eq!(l.uid(), BASE);
    assert_eq!(std::fs::metadata(up.join("deep/er")).unwrap().uid(), BASE);
    assert_eq!(
        std::fs::metadata(f.host("/workspace/up")).unwrap().uid(),
        BASE
    );
    let names: Vec<_> =
        f.fs.list("/workspace/up/new")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
    assert_eq!(names, ["deep", "src"], "no staging directory is left");
}

#[test]
fn tar_upload_strips_setuid_and_setgid() {
    let f = Fake::new();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o6755);
    h.set_size(1);
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut h, "suid", &b"x"[..]).unwrap();
    f.fs.upload_tar("/workspace", &b.into_inner().unwrap())
        .unwrap();
    let mode = std::fs::metadata(f.host("/workspace/suid"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
}

#[test]
fn tar_upload_merges_into_an_existing_tree() {
    let f = Fake::new();
    f.fs.mkdir("/workspace/src/keep", true, None).unwrap();
    f.fs.write("/workspace/src/old.rs", b"old", None, 0)
        .unwrap();
    f.fs.write("/workspace/src/untouched.rs", b"same", None, 0)
        .unwrap();
    let archive = RawTar::new()
        .file("src/old.rs", b"new")
        .file("src/keep/k", b"k")
        .finish();
    f.fs.upload_tar("/workspace", &archive).unwrap();
    assert_eq!(f.fs.read("/workspace/src/old.rs", 100).unwrap(), b"new");
    assert_eq!(
        f.fs.read("/workspace/src/untouched.rs", 100).unwrap(),
        b"same"
    );
    assert_eq!(f.fs.read("/workspace/src/keep/k", 100).unwrap(), b"k");
}

#[test]
fn tar_upload_replaces_a_planted_symlink_instead_of_writing_through_it() {
    let f = Fake::new();
    let before = f.outside_tree();
    symlink(&f.outside, f.host("/workspace/d")).unwrap();
    symlink("/etc", f.host("/workspace/e")).unwrap();
    let archive = RawTar::new()
        .file("d/secret", b"pwned")
        .file("e/shadow", b"pwned")
        .finish();
    f.fs.upload_tar("/workspace", &archive).unwrap();
    assert_eq!(f.outside_tree(), before);
    assert_eq!(f.fs.read("/etc/shadow", 100).unwrap(), b"sandbox shadow");
    assert!(std::fs::symlink_metadata(f.host("/workspace/d"))
        .unwrap()
        .is_dir());
}

#[test]
fn tar_upload_conflicting_with_a_directory_changes_nothing() {
    let f = Fake::new();
    f.fs.mkdir("/workspace/up/x", true, None).unwrap();
    let archive = RawTar::new()
        .file("a", b"a")
        .file("b/c", b"c")
        .file("x", b"file over dir")
        .finish();
    let err = assert_rejected(&f, &archive, ErrorCode::InvalidArgument);
    assert_eq!(err.to_string(), "`/workspace/up/x` is a directory");
}

#[test]
fn tar_plan_lists_implied_directories_before_their_children() {
    let archive = RawTar::new()
        .file("a/b/f", b"data")
        .symlink("a/l", "b/f")
        .finish();
    let got = plan(&archive, &FsLimits::default()).unwrap();
    let dir = |p: &str| Planned {
        path: p.into(),
        action: Action::Dir,
        mode: 0o755,
        mtime: None,
    };
    assert_eq!(
        got,
        [
            dir("a"),
            dir("a/b"),
            Planned {
                path: "a/b/f".into(),
                action: Action::File { data: 512..516 },
                mode: 0o644,
                mtime: Some(1_700_000_000),
            },
            Planned {
                path: "a/l".into(),
                action: Action::Symlink {
                    target: "b/f".into()
                },
                mode: 0o644,
                mtime: Some(1_700_000_000),
            },
        ]
    );
}
