//! Turning an uploaded tar archive into a validated plan, touching nothing.
//!
//! The `tar` crate only parses headers here; its unpack and path APIs are
//! never used. Every entry is checked before anything is written:
//!
//! * paths must be relative with no `..`; `.` and empty components are dropped;
//! * only regular files, directories, symlinks and hard links are accepted
//!   (device nodes, FIFOs, sparse files and anything else are rejected);
//! * a symlink's target must be relative and must not climb above the upload
//!   directory, and no later entry may go through an earlier symlink or file
//!   (`a -> /` followed by `a/etc/x`);
//! * a hard link must name an earlier regular file of the same archive;
//! * entry count (including implied parent directories), per-file size,
//!   total data and nesting depth are capped.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tar::EntryType;

use super::path::{MAX_NAME_BYTES, MAX_PATH_BYTES};
use super::{clean_mode, FilesError, FsLimits};

/// What to create at one path below the upload directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    Dir,
    /// A regular file whose data is `archive[data]`.
    File {
        data: Range<usize>,
    },
    Symlink {
        target: PathBuf,
    },
    /// A hard link to an earlier file of the archive.
    HardLink {
        target: PathBuf,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Planned {
    /// Relative, normalised, never empty.
    pub path: PathBuf,
    pub action: Action,
    /// Permission bits without setuid and setgid.
    pub mode: u32,
    pub mtime: Option<i64>,
}

/// What an earlier entry left at a path.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File,
    Other,
}

/// Validates `archive` and lists what to create, in order. Parent
/// directories the archive only implies come before their first child.
pub(super) fn plan(archive: &[u8], limits: &FsLimits) -> Result<Vec<Planned>, FilesError> {
    let bad = |source| FilesError::BadArchive { source };
    let mut ar = tar::Archive::new(archive);
    let mut out: Vec<Planned> = Vec::new();
    let mut nodes: HashMap<PathBuf, Node> = HashMap::new();
    let mut total: u64 = 0;
    let too_many = || FilesError::ArchiveTooManyEntries {
        limit: limits.max_entries,
    };
    for entry in ar.entries().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if out.len() as u64 >= limits.max_entries {
            return Err(too_many());
        }
        let size = entry.size();
        total = total.saturating_add(size);
        if total > limits.max_archive_bytes {
            return Err(FilesError::ArchiveTooLarge {
                limit: limits.max_archive_bytes,
            });
        }
        let raw = entry.path_bytes();
        let reject = |reason| FilesError::BadTarEntry {
            entry: String::from_utf8_lossy(&raw).chars().take(200).collect(),
            reason,
        };
        let kind = entry.header().entry_type();
        let node = match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::Link => Node::File,
            EntryType::Directory => Node::Dir,
            EntryType::Symlink => Node::Other,
            // Global pax headers only carry defaults for later entries.
            EntryType::XGlobalHeader => continue,
            EntryType::Char | EntryType::Block => {
                return Err(reject("device nodes are not allowed"))
            }
            EntryType::Fifo => return Err(reject("FIFOs are not allowed")),
            EntryType::GNUSparse => return Err(reject("sparse files are not supported")),
            _ => return Err(reject("its entry type is not supported")),
        };
        let path = entry_path(&raw).map_err(reject)?;
        if path.as_os_str().is_empty() {
            // `./`: the upload directory itself, which already exists.
            if node == Node::Dir {
                continue;
            }
            return Err(reject("it names the upload directory itself"));
        }
        if path.components().count() > limits.max_depth {
            return Err(reject("it is nested too deeply"));
        }
        // No entry may go through an earlier non-directory, and missing
        // parents become directories.
        let mut parent = PathBuf::new();
        let parents: Vec<_> = path
            .parent()
            .map(|p| p.components().collect())
            .unwrap_or_default();
        for comp in parents {
            parent.push(comp);
            match nodes.get(&parent) {
                Some(Node::Dir) => {}
                Some(_) => {
                    return Err(reject(
                        "it lies under an earlier entry that is not a directory",
                    ))
                }
                None => {
                    if out.len() as u64 >= limits.max_entries {
                        return Err(too_many());
                    }
                    nodes.insert(parent.clone(), Node::Dir);
                    out.push(Planned {
                        path: parent.clone(),
                        action: Action::Dir,
                        mode: 0o755,
                        mtime: None,
                    });
                }
            }
        }
        match nodes.get(&path) {
            Some(Node::Dir) if node != Node::Dir => {
                return Err(reject("it replaces an earlier directory entry"))
            }
            Some(Node::File | Node::Other) if node == Node::Dir => {
                return Err(reject("it turns an earlier entry into a directory"))
            }
            _ => {}
        }
        let link = entry.link_name_bytes();
        let action = match kind {
            EntryType::Directory => Action::Dir,
            EntryType::Symlink => {
                let target = link.ok_or_else(|| reject("the symlink has no target"))?;
                symlink_stays_inside(&path, &target).map_err(reject)?;
                Action::Symlink {
                    target: PathBuf::from(OsStr::from_bytes(&target)),
                }
            }
            EntryType::Link => {
                let target = link.ok_or_else(|| reject("the hard link has no target"))?;
                let target = entry_path(&target).map_err(reject)?;
                if nodes.get(&target) != Some(&Node::File) || target == path {
                    return Err(reject(
                        "a hard link must name an earlier file of the archive",
                    ));
                }
                Action::HardLink { target }
            }
            _ => {
                if size > limits.max_file_bytes {
                    return Err(FilesError::TooLarge {
                        path: path.display().to_string(),
                        size,
                        limit: limits.max_file_bytes,
                    });
                }
                let start = usize::try_from(entry.raw_file_position()).unwrap_or(usize::MAX);
                let end = usize::try_from(size)
                    .ok()
                    .and_then(|s| start.checked_add(s))
                    .filter(|end| *end <= archive.len())
                    .ok_or_else(|| reject("its data is cut short"))?;
                Action::File { data: start..end }
            }
        };
        if out.len() as u64 >= limits.max_entries {
            return Err(too_many());
        }
        let default_mode = if node == Node::Dir { 0o755 } else { 0o644 };
        let mode = clean_mode(entry.header().mode().unwrap_or(default_mode));
        let mtime = entry
            .header()
            .mtime()
            .ok()
            .map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        nodes.insert(path.clone(), node);
        out.push(Planned {
            path,
            action,
            mode,
            mtime,
        });
    }
    Ok(out)
}

/// Normalises an archive path: relative, no `..`, no NUL, `.` and empty
/// components dropped. The result is empty for the archive's root (`./`).
pub(crate) fn entry_path(raw: &[u8]) -> Result<PathBuf, &'static str> {
    if raw.is_empty() {
        return Err("its path is empty");
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err("its path is longer than 4096 bytes");
    }
    if raw.contains(&0) {
        return Err("its path contains a NUL byte");
    }
    if raw[0] == b'/' {
        return Err("its path is absolute");
    }
    let mut path = PathBuf::new();
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err("its path contains `..`"),
            name if name.len() > MAX_NAME_BYTES => return Err("a name is longer than 255 bytes"),
            name => path.push(OsStr::from_bytes(name)),
        }
    }
    Ok(path)
}

/// Checks that symlink `link` pointing at `target` stays lexically inside
/// the upload directory. The daemon never follows it either way; this keeps
/// the archive from planting ladders out of the tree it was given.
fn symlink_stays_inside(link: &Path, target: &[u8]) -> Result<(), &'static str> {
    if target.is_empty() {
        return Err("the symlink target is empty");
    }
    if target.contains(&0) || target.len() > MAX_PATH_BYTES {
        return Err("the symlink target is malformed");
    }
    if target[0] == b'/' {
        return Err("the symlink target is absolute");
    }
    let mut depth = link.components().count() - 1;
    for comp in target.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                depth = depth
                    .checked_sub(1)
                    .ok_or("the symlink target leaves the upload directory")?
            }
            _ => depth += 1,
        }
    }
    Ok(())
}
