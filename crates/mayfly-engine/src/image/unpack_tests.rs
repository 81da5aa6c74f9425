//! Unpacking real tar streams, ordinary and hostile. These need root
//! (chown, mknod of whiteouts, `trusted.*` xattrs, overlay mounts).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use tar::{EntryType, Header};

use super::*;

fn need_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the image unpack tests need root (chown, mknod, trusted.* xattrs); run them as root"
    );
}

/// Appends an entry with a raw name (no checks, as a hostile tool would).
fn raw(out: &mut Vec<u8>, name: &str, kind: EntryType, link: &str, data: &[u8], uid: u64) {
    let mut h = Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(if kind == EntryType::Directory {
        0o755
    } else {
        0o4755
    });
    h.set_uid(uid);
    h.set_gid(uid);
    h.set_mtime(1_000_000);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn unpack_into(tar: &[u8], dest: &Path) -> Result<UnpackReport, UnpackError> {
    let mut input = decompress(tar).unwrap();
    unpack(&mut input, dest, Limits::default())
}

#[test]
fn ordinary_layer_unpacks_with_owners_modes_links_and_whiteouts() {
    need_root();
    let mut t = Vec::new();
    raw(&mut t, "./", EntryType::Directory, "", b"", 0);
    raw(&mut t, "bin/", EntryType::Directory, "", b"", 0);
    raw(&mut t, "bin/su", EntryType::Regular, "", b"#!", 0);
    raw(&mut t, "bin/su2", EntryType::Link, "bin/su", b"", 0);
    raw(&mut t, "bin/sh", EntryType::Symlink, "/bin/busybox", b"", 0);
    raw(&mut t, "home/u/f", EntryType::Regular, "", b"data", 1000);
    raw(&mut t, "home/big", EntryType::Regular, "", b"", 100_000);
    raw(&mut t, "dev/null", EntryType::Char, "", b"", 0);
    raw(&mut t, "etc/.wh.motd", EntryType::Regular, "", b"", 0);
    raw(&mut t, "var/.wh..wh..opq", EntryType::Regular, "", b"", 0);
    let t = finish(t);
    // Gzip-compressed, as registries serve layers.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&t).unwrap();
    let gz = gz.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let report = unpack_into(&gz, dir.path()).unwrap();
    assert_eq!(report.skipped, 1);
    let d = dir.path();
    let su = fs::metadata(d.join("bin/su")).unwrap();
    assert_eq!(su.mode() & 0o7777, 0o4755, "setuid is kept");
    assert_eq!(su.nlink(), 2, "the hard link shares the inode");
    assert_eq!(
        fs::read_link(d.join("bin/sh")).unwrap(),
        Path::new("/bin/busybox")
    );
    let f = fs::metadata(d.join("home/u/f")).unwrap();
    assert_eq!((f.uid(), f.gid()), (1000, 1000));
    assert_eq!(fs::read(d.join("home/u/f")).unwrap(), b"data");
    let big = fs::metadata(d.join("home/big")).unwrap();
    assert_eq!(
        (big.uid(), big.gid()),
        (65534, 65534),
        "out-of-range ids become nobody"
    );
    assert!(!d.join("dev/null").exists(), "device nodes are skipped");
    let wh = fs::symlink_metadata(d.join("etc/motd")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    let var = fs::File::open(d.join("var")).unwrap();
    assert!(mayfly_sys::layer::is_opaque(&var, Path::new("var")).unwrap());
    assert_eq!(fs::metadata(d.join("bin")).unwrap().mtime(), 1_000_000);
}

/// Runs a hostile stream into a fresh directory inside a sentinel parent
/// and checks it failed without writing anything outside.
fn refused(build: impl FnOnce(&mut Vec<u8>)) -> UnpackError {
    need_root();
    let outer = tempfile::tempdir().unwrap();
    let dest = outer.path().join("layer");
    fs::create_dir(&dest).unwrap();
    let mut t = Vec::new();
    build(&mut t);
    let err = unpack_into(&finish(t), &dest).expect_err("the hostile layer must be refused");
    let outside: Vec<_> = fs::read_dir(outer.path()).unwrap().flatten().collect();
    assert_eq!(outside.len(), 1, "nothing was written next to the layer");
    err
}

#[test]
fn parent_and_absolute_paths_are_refused() {
    refused(|t| raw(t, "../x", EntryType::Regular, "", b"x", 0));
    refused(|t| raw(t, "/abs", EntryType::Regular, "", b"x", 0));
}

#[test]
fn writing_through_a_planted_symlink_is_refused() {
    let e = refused(|t| {
        raw(t, "a", EntryType::Symlink, "..", b"", 0);
        raw(t, "a/passwd", EntryType::Regular, "", b"pwned", 0);
    });
    assert!(e.to_string().contains("not a directory"), "{e}");
    refused(|t| {
        raw(t, "a", EntryType::Symlink, "/etc", b"", 0);
        raw(t, "a/", EntryType::Directory, "", b"", 0);
    });
}

#[test]
fn hard_links_outside_or_to_nothing_are_refused() {
    refused(|t| raw(t, "l", EntryType::Link, "../../etc/shadow", b"", 0));
    refused(|t| raw(t, "l", EntryType::Link, "/etc/shadow", b"", 0));
    refused(|t| raw(t, "l", EntryType::Link, "nothing", b"", 0));
}

#[test]
fn whiteouts_of_dot_dot_or_with_slashes_are_refused() {
    refused(|t| raw(t, ".wh...", EntryType::Regular, "", b"", 0));
    refused(|t| raw(t, "a/.wh.../b", EntryType::Regular, "", b"", 0));
    refused(|t| raw(t, ".wh.etc/passwd", EntryType::Regular, "", b"", 0));
}

#[test]
fn truncated_and_unsupported_streams_fail_cleanly() {
    need_root();
    let mut t = Vec::new();
    raw(&mut t, "f", EntryType::Regular, "", &[7u8; 4000], 0);
    t.truncate(1500);
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        unpack_into(&t, dir.path()),
        Err(UnpackError::Read { .. })
    ));
    let xz = [0xfdu8, b'7', b'z', b'X', b'Z', 0];
    assert!(matches!(
        decompress(&xz[..]).err(),
        Some(UnpackError::Compression("xz"))
    ));
}

#[test]
fn zstd_layers_unpack() {
    need_root();
    let mut t = Vec::new();
    raw(&mut t, "etc/motd", EntryType::Regular, "", b"zstd", 0);
    let z = ruzstd::encoding::compress_to_vec(
        &finish(t)[..],
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    let dir = tempfile::tempdir().unwrap();
    unpack_into(&z, dir.path()).unwrap();
    assert_eq!(fs::read(dir.path().join("etc/motd")).unwrap(), b"zstd");
}

#[test]
fn a_stream_without_its_final_padding_and_end_blocks_unpacks() {
    need_root();
    // As umoci 0.4 writes layers: the last file's data, then nothing.
    let mut t = Vec::new();
    raw(&mut t, "etc/", EntryType::Directory, "", b"", 0);
    raw(&mut t, "etc/motd", EntryType::Regular, "", b"hi\n", 0);
    t.truncate(t.len() - 512 + 3);
    let dir = tempfile::tempdir().unwrap();
    unpack_into(&t, dir.path()).unwrap();
    assert_eq!(fs::read(dir.path().join("etc/motd")).unwrap(), b"hi\n");
}

/// Mounts the given layers (top first) as a read-only overlay; unmounted
/// on drop.
struct Overlay(tempfile::TempDir);

impl Overlay {
    fn mount(lowers: &[&Path]) -> Overlay {
        let target = tempfile::tempdir().unwrap();
        let lowerdir: Vec<_> = lowers.iter().map(|p| p.display().to_string()).collect();
        nix::mount::mount(
            Some("overlay"),
            target.path(),
            Some("overlay"),
            nix::mount::MsFlags::MS_RDONLY,
            Some(format!("lowerdir={}", lowerdir.join(":")).as_str()),
        )
        .expect("mount the overlay");
        Overlay(target)
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn stacked_layers_hide_whited_out_files_and_opaque_directories() {
    need_root();
    let mut lower = Vec::new();
    raw(&mut lower, "etc/motd", EntryType::Regular, "", b"hi", 0);
    raw(&mut lower, "etc/keep", EntryType::Regular, "", b"k", 0);
    raw(&mut lower, "opq/old", EntryType::Regular, "", b"o", 0);
    let mut upper = Vec::new();
    raw(&mut upper, "etc/.wh.motd", EntryType::Regular, "", b"", 0);
    raw(
        &mut upper,
        "opq/.wh..wh..opq",
        EntryType::Regular,
        "",
        b"",
        0,
    );
    raw(&mut upper, "opq/new", EntryType::Regular, "", b"n", 0);
    let (l, u) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    unpack_into(&finish(lower), l.path()).unwrap();
    unpack_into(&finish(upper), u.path()).unwrap();
    let merged = Overlay::mount(&[u.path(), l.path()]);
    let m = merged.0.path();
    assert!(
        !m.join("etc/motd").exists(),
        "the whiteout hides the lower file"
    );
    assert_eq!(fs::read(m.join("etc/keep")).unwrap(), b"k");
    assert!(
        !m.join("opq/old").exists(),
        "the opaque dir hides lower entries"
    );
    assert_eq!(fs::read(m.join("opq/new")).unwrap(), b"n");
}
