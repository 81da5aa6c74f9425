//! Directory listing from a descriptor.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::{Dir, Type};

use super::error::{shown, FsError};
use super::open::{open, Access, Resolve};
use super::ops::Kind;

/// One name in a directory. `kind` comes from `d_type` and is a hint only:
/// the entry can be replaced at any moment, so callers that act on it must
/// re-check with a no-follow `stat` or a [`Resolve::Child`] open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: Option<Kind>,
}

/// The first names of a directory, without `.` and `..`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirListing {
    pub entries: Vec<DirEntry>,
    /// More entries exist than the limit allowed.
    pub truncated: bool,
}

/// Lists up to `limit` entries of directory `dir` (an `O_PATH` handle is
/// fine). A fresh descriptor is opened on `.` so `dir`'s own file offset is
/// never moved, and every call starts from the beginning of the directory.
pub fn list_dir(dir: impl AsFd, limit: usize, path: &Path) -> Result<DirListing, FsError> {
    let fd = open(dir, Path::new("."), Access::Dir, Resolve::Child)?;
    let mut handle = Dir::from_fd(fd).map_err(|e| FsError::from_errno(e, "list", shown(path)))?;
    let mut listing = DirListing::default();
    for entry in handle.iter() {
        let entry = entry.map_err(|e| FsError::from_errno(e, "list", shown(path)))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if listing.entries.len() >= limit {
            listing.truncated = true;
            break;
        }
        listing.entries.push(DirEntry {
            name: std::ffi::OsStr::from_bytes(name).to_owned(),
            kind: entry.file_type().map(kind_of),
        });
    }
    Ok(listing)
}

fn kind_of(t: Type) -> Kind {
    match t {
        Type::Fifo => Kind::Fifo,
        Type::CharacterDevice => Kind::CharDevice,
        Type::Directory => Kind::Dir,
        Type::BlockDevice => Kind::BlockDevice,
        Type::File => Kind::File,
        Type::Symlink => Kind::Symlink,
        Type::Socket => Kind::Socket,
    }
}
