//! Tar download: links stay links, specials are skipped, caps hold.

use std::os::unix::fs::symlink;
use std::sync::Arc;

use mayfly_types::ErrorCode;

use super::{within, Fake};
use crate::files::FsLimits;

/// Each entry's path, type letter and link target or data.
fn entries(archive: &[u8]) -> Vec<(String, char, String)> {
    let mut ar = tar::Archive::new(archive);
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let kind = e.header().entry_type();
            let (letter, what) = match kind {
                tar::EntryType::Symlink => {
                    ('l', e.link_name().unwrap().unwrap().display().to_string())
                }
                tar::EntryType::Directory => ('d', String::new()),
                _ => {
                    let mut s = String::new();
                    std::io::Read::read_to_string(&mut e, &mut s).unwrap();
                    ('f', s)
                }
            };
            (path, letter, what)
        })
        .collect()
}

fn e(path: &str, kind: char, what: &str) -> (String, char, String) {
    (path.to_owned(), kind, what.to_owned())
}

#[test]
fn download_of_a_dir_with_a_symlink_to_root_emits_the_symlink_not_roots_contents() {
    let f = Fake::new();
    f.fs.mkdir("/workspace/out/sub", true, None).unwrap();
    f.fs.write("/workspace/out/a.txt", b"A", None, 0).unwrap();
    f.fs.write("/workspace/out/sub/b.txt", b"B", None, 0)
        .unwrap();
    symlink("/", f.host("/workspace/out/root")).unwrap();
    symlink(&f.outside, f.host("/workspace/out/host")).unwrap();
    let archive = f.fs.download_tar("/workspace/out").unwrap();
    assert_eq!(
        entries(&archive),
        [
            e("out", 'd', ""),
            e("out/a.txt", 'f', "A"),
            e("out/host", 'l', &f.outside.display().to_string()),
            e("out/root", 'l', "/"),
            e("out/sub", 'd', ""),
            e("out/sub/b.txt", 'f', "B"),
        ]
    );
}

#[test]
fn download_of_a_symlink_packs_the_link_itself() {
    let f = Fake::new();
    symlink("/etc", f.host("/workspace/etc-link")).unwrap();
    let archive = f.fs.download_tar("/workspace/etc-link").unwrap();
    assert_eq!(entries(&archive), [e("etc-link", 'l', "/etc")]);
    let archive = f.fs.download_tar("/etc/passwd").unwrap();
    assert_eq!(entries(&archive), [e("passwd", 'f', "sandbox passwd")]);
}

#[test]
fn download_skips_fifos_without_blocking() {
    let f = Arc::new(Fake::new());
    f.fs.mkdir("/workspace/out", false, None).unwrap();
    nix::unistd::mkfifo(
        &f.host("/workspace/out/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    f.fs.write("/workspace/out/z", b"z", None, 0).unwrap();
    let g = Arc::clone(&f);
    let archive = within(5, move || g.fs.download_tar("/workspace/out")).unwrap();
    assert_eq!(entries(&archive), [e("out", 'd', ""), e("out/z", 'f', "z")]);
    let g = Arc::clone(&f);
    let err = within(5, move || g.fs.download_tar("/workspace/out/fifo")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

#[test]
fn download_over_the_entry_cap_is_too_large() {
    let f = Fake::with_limits(FsLimits {
        max_entries: 5,
        ..Default::default()
    });
    for i in 0..5 {
        f.fs.write(&format!("/workspace/d/f{i}"), b"", None, 0)
            .unwrap_or_else(|_| {
                f.fs.mkdir("/workspace/d", false, None).unwrap();
                f.fs.write(&format!("/workspace/d/f{i}"), b"", None, 0)
                    .unwrap()
            });
    }
    let err = f.fs.download_tar("/workspace/d").unwrap_err();
    assert_eq!(err.code(), ErrorCode::TooLarge, "{err}");
}

#[test]
fn download_over_the_size_cap_is_too_large() {
    let f = Fake::with_limits(FsLimits {
        max_archive_bytes: 150,
        ..Default::default()
    });
    f.fs.mkdir("/workspace/d", false, None).unwrap();
    f.fs.write("/workspace/d/a", &[1; 100], None, 0).unwrap();
    f.fs.write("/workspace/d/b", &[2; 100], None, 0).unwrap();
    let err = f.fs.download_tar("/workspace/d").unwrap_err();
    assert_eq!(err.code(), ErrorCode::TooLarge, "{err}");
}

#[test]
fn download_refuses_a_huge_sparse_file_without_reading_it() {
    let f = Fake::new();
    std::fs::create_dir(f.host("/workspace/d")).unwrap();
    let file = std::fs::File::create(f.host("/workspace/d/sparse")).unwrap();
    file.set_len(8 << 30).unwrap();
    let err = within(5, move || f.fs.download_tar("/workspace/d")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::TooLarge, "{err}");
}

#[test]
fn download_then_upload_round_trips_a_tree() {
    let f = Fake::new();
    f.fs.mkdir("/workspace/src/a/b", true, Some(0o750)).unwrap();
    f.fs.write("/workspace/src/a/b/data", &[0, 1, 2, 255], Some(0o600), 0)
        .unwrap();
    f.fs.write("/workspace/src/top", b"top", None, 1000)
        .unwrap();
    symlink("a/b/data", f.host("/workspace/src/link")).unwrap();
    // Names and targets over the 100-byte header fields, byte for byte.
    let long = "n".repeat(150);
    f.fs.write(&format!("/workspace/src/{long}"), b"long", None, 0)
        .unwrap();
    symlink(format!("./{long}//x/"), f.host("/workspace/src/long-link")).unwrap();
    let archive = f.fs.download_tar("/workspace/src").unwrap();
    f.fs.upload_tar("/tmp/copy", &archive).unwrap();
    assert_eq!(
        Fake::tree(&f.host("/tmp/copy/src")),
        Fake::tree(&f.host("/workspace/src"))
    );
    let st = f.fs.stat("/tmp/copy/src/a/b/data").unwrap();
    assert_eq!(st.mode, 0o600);
    assert_eq!(f.fs.stat("/tmp/copy/src/a/b").unwrap().mode, 0o750);
}
