//! Packing a sandbox path into a tar archive.
//!
//! Symlinks are stored as symlinks and never followed, FIFOs, sockets and
//! device nodes are skipped (never opened), mount points inside the tree are
//! skipped like `tar --one-file-system` (so packing `/` leaves out `/proc`),
//! and the entry count, file sizes and total data are capped. A file that
//! shrinks while it is packed is padded with zeros, and one that grows is
//! cut, so each header's size always matches its data.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use mayfly_sys::fs::{self as sysfs, Access, DirEntry, FsError, Kind, Resolve, Stat};
use tar::{Builder, EntryType, Header};

use super::path::SandboxPath;
use super::{FilesError, SandboxFs};

pub(super) fn download(fs: &SandboxFs, p: &SandboxPath) -> Result<Vec<u8>, FilesError> {
    download_to(fs, p, Vec::new(), fs.limits)
}

/// Packs `p` into `out` under `limits` (the artifact collector streams to a
/// host file under its own caps) and returns the writer.
pub(super) fn download_to<W: Write>(
    fs: &SandboxFs,
    p: &SandboxPath,
    out: W,
    limits: super::FsLimits,
) -> Result<W, FilesError> {
    let top = fs.handle(p, Resolve::InRootNoFollow)?;
    let st = sysfs::stat_fd(&top, &p.rel()).map_err(|e| FilesError::fs(p, e))?;
    let parent_shown = match p.split() {
        Some(_) => p.parts()[..p.parts().len() - 1]
            .iter()
            .map(|s| format!("/{s}"))
            .collect(),
        None => String::new(),
    };
    let mut packer = Packer {
        fs,
        limits,
        builder: Builder::new(out),
        entries: 0,
        bytes: 0,
        parent_shown,
    };
    let base = p.name().map(PathBuf::from).unwrap_or_default();
    match st.kind {
        Kind::File => packer.file(top.as_fd(), &base)?,
        Kind::Symlink => {
            let target =
                sysfs::readlink_at(&top, Path::new("")).map_err(|e| FilesError::fs(p, e))?;
            packer.symlink(&base, &target, &st)?;
        }
        Kind::Dir => {
            if !base.as_os_str().is_empty() {
                packer.dir(&base, &st)?;
            }
            packer.walk(top, base)?;
        }
        _ => {
            return Err(FilesError::NotRegularFile {
                path: p.to_string(),
            })
        }
    }
    packer
        .builder
        .into_inner()
        .map_err(|e| FilesError::data(p, e))
}

struct Packer<'a, W: Write> {
    fs: &'a SandboxFs,
    limits: super::FsLimits,
    builder: Builder<W>,
    entries: u64,
    bytes: u64,
    /// The inside path of the packed object's parent, for error messages.
    parent_shown: String,
}

/// A directory being packed: its descriptor, its name in the archive, and
/// the names still to visit (sorted, last first).
struct Level {
    fd: OwnedFd,
    path: PathBuf,
    pending: Vec<DirEntry>,
}

impl<W: Write> Packer<'_, W> {
    fn shown(&self, rel: &Path) -> String {
        format!("{}/{}", self.parent_shown, rel.display())
    }

    fn count(&mut self) -> Result<(), FilesError> {
        self.entries += 1;
        let limit = self.limits.max_entries;
        if self.entries > limit {
            return Err(FilesError::ArchiveTooManyEntries { limit });
        }
        Ok(())
    }

    fn walk(&mut self, top: OwnedFd, base: PathBuf) -> Result<(), FilesError> {
        let pending = self.list(top.as_fd(), &base)?;
        let mut stack = vec![Level {
            fd: top,
            path: base,
            pending,
        }];
        while let Some(level) = stack.last_mut() {
            let Some(entry) = level.pending.pop() else {
                stack.pop();
                continue;
            };
            let path = level.path.join(&entry.name);
            let name = Path::new(&entry.name);
            let dir = level.fd.as_fd();
            let st = match sysfs::stat_at(dir, name) {
                Ok(st) => st,
                Err(FsError::NotFound { .. }) => continue,
                Err(e) => return Err(FilesError::fs(self.shown(&path), e)),
            };
            match st.kind {
                Kind::File => match child(dir, name, Access::Handle) {
                    Some(h) => self.file(h?.as_fd(), &path)?,
                    None => continue,
                },
                Kind::Symlink => match sysfs::readlink_at(dir, name) {
                    Ok(target) => self.symlink(&path, &target, &st)?,
                    // Gone, or no longer a symlink.
                    Err(FsError::NotFound { .. } | FsError::Invalid { .. }) => continue,
                    Err(e) => return Err(FilesError::fs(self.shown(&path), e)),
                },
                Kind::Dir => {
                    let Some(fd) = child(dir, name, Access::DirHandle) else {
                        continue;
                    };
                    let fd = fd?;
                    let max_depth = self.limits.max_depth;
                    if stack.len() >= max_depth {
                        return Err(FilesError::TooDeep {
                            path: self.shown(&path),
                            limit: max_depth,
                        });
                    }
                    self.dir(&path, &st)?;
                    let pending = self.list(fd.as_fd(), &path)?;
                    stack.push(Level { fd, path, pending });
                }
                // FIFOs, sockets and device nodes are never opened or packed.
                _ => continue,
            }
        }
        Ok(())
    }

    /// The names in `dir`, within what is left of the entry budget.
    fn list(&self, dir: BorrowedFd<'_>, path: &Path) -> Result<Vec<DirEntry>, FilesError> {
        let limit = self.limits.max_entries;
        let left = usize::try_from(limit.saturating_sub(self.entries)).unwrap_or(usize::MAX);
        let listing =
            sysfs::list_dir(dir, left, path).map_err(|e| FilesError::fs(self.shown(path), e))?;
        if listing.truncated {
            return Err(FilesError::ArchiveTooManyEntries { limit });
        }
        let mut names = listing.entries;
        names.sort_by(|a, b| b.name.cmp(&a.name));
        Ok(names)
    }

    fn header(&self, kind: EntryType, st: &Stat, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(if kind == EntryType::Symlink {
            0o777
        } else {
            st.perm
        });
        h.set_uid(self.fs.inside_id(st.uid).into());
        h.set_gid(self.fs.inside_id(st.gid).into());
        h.set_mtime(u64::try_from(st.mtime_sec).unwrap_or(0));
        h
    }

    fn dir(&mut self, path: &Path, st: &Stat) -> Result<(), FilesError> {
        self.count()?;
        let mut h = self.header(EntryType::Directory, st, 0);
        self.builder
            .append_data(&mut h, path, io::empty())
            .map_err(|e| FilesError::data(self.shown(path), e))
    }

    fn symlink(&mut self, path: &Path, target: &OsString, st: &Stat) -> Result<(), FilesError> {
        self.count()?;
        let mut h = self.header(EntryType::Symlink, st, 0);
        self.append_link_literal(&mut h, path, target.as_bytes())
            .map_err(|e| FilesError::data(self.shown(path), e))
    }

    /// Stores a link target byte for byte. `Builder::append_link` normalises
    /// targets as paths (and turns `/` into `//`), so the name goes in as is,
    /// with a GNU long-link entry ahead when it exceeds the 100-byte field.
    fn append_link_literal(
        &mut self,
        h: &mut Header,
        path: &Path,
        target: &[u8],
    ) -> io::Result<()> {
        let field = h.as_old().linkname.len();
        if target.len() > field {
            let mut long = Header::new_gnu();
            long.set_entry_type(EntryType::GNULongLink);
            long.set_path("././@LongLink")?;
            long.set_mode(0o644);
            long.set_size(target.len() as u64 + 1);
            long.set_cksum();
            self.builder.append(&long, target.chain(&[0u8][..]))?;
        }
        h.set_link_name_literal(&target[..target.len().min(field)])?;
        self.builder.append_data(h, path, io::empty())
    }

    /// Packs the regular file behind `handle`; anything else is skipped.
    fn file(&mut self, handle: BorrowedFd<'_>, path: &Path) -> Result<(), FilesError> {
        let shown = self.shown(path);
        let st = sysfs::stat_fd(handle, path).map_err(|e| FilesError::fs(&shown, e))?;
        if st.kind != Kind::File {
            return Ok(());
        }
        let limits = self.limits;
        if st.size > limits.max_file_bytes {
            return Err(FilesError::TooLarge {
                path: shown,
                size: st.size,
                limit: limits.max_file_bytes,
            });
        }
        self.bytes = self.bytes.saturating_add(st.size);
        if self.bytes > limits.max_archive_bytes {
            return Err(FilesError::ArchiveTooLarge {
                limit: limits.max_archive_bytes,
            });
        }
        self.count()?;
        let file =
            sysfs::open_regular_for_read(handle, path).map_err(|e| FilesError::fs(&shown, e))?;
        let data = sysfs::SparseReader::new(file)
            .take(st.size)
            .chain(io::repeat(0))
            .take(st.size);
        let mut h = self.header(EntryType::Regular, &st, st.size);
        self.builder
            .append_data(&mut h, path, data)
            .map_err(|e| FilesError::data(shown, e))
    }
}

/// Opens `name` below `dir` without following symlinks or crossing mounts.
/// `None` means "skip it": it vanished, became a symlink, or is a mount point.
fn child(dir: BorrowedFd<'_>, name: &Path, access: Access) -> Option<Result<OwnedFd, FilesError>> {
    match sysfs::open(dir, name, access, Resolve::Child) {
        Ok(fd) => Some(Ok(fd)),
        Err(
            FsError::NotFound { .. }
            | FsError::NotADirectory { .. }
            | FsError::SymlinkRefused { .. }
            | FsError::CrossesMount { .. },
        ) => None,
        Err(e) => Some(Err(FilesError::fs(name.display(), e))),
    }
}
