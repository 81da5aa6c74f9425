//! Trees of files for round trips, and hand-made tar archives for attacks
//! (the `tar` crate refuses to write `..` or absolute names, so evil headers
//! are laid out byte by byte).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// One entry of a tree, keyed by its relative path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Permission bits (`mode & 0o777`) and content.
    File {
        mode: u32,
        data: Vec<u8>,
    },
    Dir,
    Symlink(String),
}

pub type Tree = BTreeMap<String, Node>;

/// A tree as short, comparable lines (`path: file 644 65536 bytes #hash`),
/// so a failed comparison prints a readable diff instead of raw bytes.
pub fn summary(tree: &Tree) -> BTreeMap<String, String> {
    tree.iter()
        .map(|(path, node)| {
            let what = match node {
                Node::Dir => "dir".to_owned(),
                Node::Symlink(t) => format!("symlink -> {t}"),
                Node::File { mode, data } => {
                    // FNV-1a: enough to tell contents apart in a message.
                    let hash = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
                    });
                    format!("file {mode:o} {} bytes #{hash:016x}", data.len())
                }
            };
            (path.clone(), what)
        })
        .collect()
}

/// A file, a script, nested and empty directories, a relative symlink and
/// binary content that is not UTF-8.
pub fn sample_tree() -> Tree {
    let mut x: u32 = 0x1234_5678;
    let binary: Vec<u8> = (0..65_536)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 24) as u8
        })
        .collect();
    let file = |mode, data: &[u8]| Node::File {
        mode,
        data: data.to_vec(),
    };
    Tree::from([
        ("hello.txt".into(), file(0o644, b"hello\n")),
        (
            "run.sh".into(),
            file(0o755, b"#!/bin/sh\necho script ran\n"),
        ),
        ("nested".into(), Node::Dir),
        ("nested/empty".into(), Node::Dir),
        ("nested/deeper".into(), Node::Dir),
        ("nested/deeper/bin.dat".into(), file(0o600, &binary)),
        ("nested/deeper/zeros".into(), file(0o644, &[0u8; 1000])),
        ("link".into(), Node::Symlink("nested/deeper/bin.dat".into())),
    ])
}

/// A tar archive of `tree`, parents first.
pub fn tar_of(tree: &Tree) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, node) in tree {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        match node {
            Node::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, format!("{path}/"), std::io::empty())
            }
            Node::File { mode, data } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, data.as_slice())
            }
            Node::Symlink(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, target)
            }
        }
        .expect("building a tar archive");
    }
    b.into_inner().expect("finishing a tar archive")
}

/// The tree in a tar archive. A leading `./` is dropped and a root entry
/// `.` is skipped.
pub fn read_tree(archive: &[u8]) -> Tree {
    let mut tree = Tree::new();
    let mut ar = tar::Archive::new(archive);
    for entry in ar.entries().expect("reading the archive") {
        let mut e = entry.expect("an archive entry");
        let raw = e
            .path()
            .expect("an entry path")
            .to_string_lossy()
            .into_owned();
        let name = raw
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_owned();
        if name.is_empty() || name == "." {
            continue;
        }
        let node = match e.header().entry_type() {
            tar::EntryType::Directory => Node::Dir,
            tar::EntryType::Symlink => Node::Symlink(
                e.link_name()
                    .expect("a link name")
                    .expect("a symlink has a target")
                    .to_string_lossy()
                    .into_owned(),
            ),
            tar::EntryType::Regular => {
                let mode = e.header().mode().expect("a mode") & 0o777;
                let mut data = Vec::new();
                e.read_to_end(&mut data).expect("entry data");
                Node::File { mode, data }
            }
            other => panic!("unexpected entry type {other:?} for {raw}"),
        };
        tree.insert(name, node);
    }
    tree
}

/// Writes `tree` below `root` on the host.
pub fn write_tree(root: &Path, tree: &Tree) {
    std::fs::create_dir_all(root).expect("creating the tree's root");
    for (path, node) in tree {
        let p = root.join(path);
        match node {
            Node::Dir => std::fs::create_dir_all(&p).expect("mkdir"),
            Node::File { mode, data } => {
                std::fs::write(&p, data).expect("writing a file");
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))
                    .expect("chmod");
            }
            Node::Symlink(target) => std::os::unix::fs::symlink(target, &p).expect("symlink"),
        }
    }
}

/// The tree below `root` on the host.
pub fn tree_of_dir(root: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel))
            .expect("reading a directory")
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let m = std::fs::symlink_metadata(e.path()).expect("metadata");
            let node = if m.is_dir() {
                stack.push(path.clone());
                Node::Dir
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(e.path()).expect("readlink");
                Node::Symlink(t.to_string_lossy().into_owned())
            } else {
                Node::File {
                    mode: m.permissions().mode() & 0o777,
                    data: std::fs::read(e.path()).expect("reading a file"),
                }
            };
            tree.insert(path, node);
        }
    }
    tree
}

/// One hand-made tar entry.
pub struct RawEntry {
    name: String,
    typeflag: u8,
    link: String,
    data: Vec<u8>,
}

impl RawEntry {
    pub fn file(name: &str, data: &[u8]) -> Self {
        Self::new(name, b'0', "", data)
    }
    pub fn symlink(name: &str, target: &str) -> Self {
        Self::new(name, b'2', target, b"")
    }
    pub fn hardlink(name: &str, target: &str) -> Self {
        Self::new(name, b'1', target, b"")
    }
    /// `b'3'` a character device, `b'4'` a block device, `b'6'` a FIFO.
    pub fn device(name: &str, typeflag: u8) -> Self {
        Self::new(name, typeflag, "", b"")
    }
    fn new(name: &str, typeflag: u8, link: &str, data: &[u8]) -> Self {
        assert!(
            name.len() < 100 && link.len() < 100,
            "names must fit a ustar header"
        );
        RawEntry {
            name: name.into(),
            typeflag,
            link: link.into(),
            data: data.to_vec(),
        }
    }
}

fn octal(field: &mut [u8], value: u64) {
    let s = format!("{value:0width$o}\0", width = field.len() - 1);
    field.copy_from_slice(s.as_bytes());
}

/// A ustar archive with exactly these headers, names untouched.
pub fn raw_tar(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = [0u8; 512];
        h[..e.name.len()].copy_from_slice(e.name.as_bytes());
        octal(&mut h[100..108], 0o644);
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], e.data.len() as u64);
        octal(&mut h[136..148], 1_700_000_000);
        h[156] = e.typeflag;
        h[157..157 + e.link.len()].copy_from_slice(e.link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        if matches!(e.typeflag, b'3' | b'4') {
            octal(&mut h[329..337], 1);
            octal(&mut h[337..345], 3);
        }
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        let ck = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(ck.as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(&e.data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}
