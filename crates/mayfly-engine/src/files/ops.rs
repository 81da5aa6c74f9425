//! Single-object operations: read, write, stat, list, mkdir, rename.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use mayfly_sys::fs::{self as sysfs, Access, FsError, Kind, Replace, Resolve};
use mayfly_types::FileStat;

use super::path::SandboxPath;
use super::{clean_mode, temp_name, FilesError, SandboxFs};

pub(super) fn copy_file_to(
    fs: &SandboxFs,
    p: &SandboxPath,
    out: &mut dyn std::io::Write,
    max_bytes: u64,
) -> Result<u64, FilesError> {
    let handle = fs.handle(p, Resolve::InRootNoFollow)?;
    let st = sysfs::stat_fd(&handle, &p.rel()).map_err(|e| FilesError::fs(p, e))?;
    if st.kind != Kind::File {
        return Err(FilesError::NotRegularFile {
            path: p.to_string(),
        });
    }
    if st.size > max_bytes {
        return Err(FilesError::TooLarge {
            path: p.to_string(),
            size: st.size,
            limit: max_bytes,
        });
    }
    let file =
        sysfs::open_regular_for_read(handle.as_fd(), &p.rel()).map_err(|e| FilesError::fs(p, e))?;
    let mut from = sysfs::SparseReader::new(file).take(max_bytes);
    std::io::copy(&mut from, out).map_err(|e| FilesError::data(p, e))
}

pub(super) fn read(fs: &SandboxFs, p: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, FilesError> {
    read_with(fs, p, max_bytes, |r, size| {
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        r.read_to_end(&mut data)?;
        Ok(data)
    })
}

/// Opens the regular file `p` (of at most `max_bytes`, and at most
/// `max_file_bytes`) and hands `f` a reader of it and its size at the
/// open; what `f` reads past the limit (the file grew) fails the read.
pub(super) fn read_with<T>(
    fs: &SandboxFs,
    p: &SandboxPath,
    max_bytes: u64,
    f: impl FnOnce(&mut dyn Read, u64) -> std::io::Result<T>,
) -> Result<T, FilesError> {
    let handle = fs.handle(p, Resolve::InRoot)?;
    let st = sysfs::stat_fd(&handle, &p.rel()).map_err(|e| FilesError::fs(p, e))?;
    match st.kind {
        Kind::File => {}
        Kind::Dir => {
            return Err(FilesError::IsADirectory {
                path: p.to_string(),
            })
        }
        _ => {
            return Err(FilesError::NotRegularFile {
                path: p.to_string(),
            })
        }
    }
    let limit = max_bytes.min(fs.limits.max_file_bytes);
    if st.size > limit {
        return Err(FilesError::TooLarge {
            path: p.to_string(),
            size: st.size,
            limit,
        });
    }
    let file =
        sysfs::open_regular_for_read(handle.as_fd(), &p.rel()).map_err(|e| FilesError::fs(p, e))?;
    // The file may grow while we read; never take more than the limit.
    // Its holes are not read (a sandbox makes them for free).
    let mut from = sysfs::SparseReader::new(file).take(limit.saturating_add(1));
    let out = f(&mut from, st.size).map_err(|e| FilesError::data(p, e))?;
    if from.limit() == 0 {
        return Err(FilesError::TooLarge {
            path: p.to_string(),
            size: limit.saturating_add(1),
            limit,
        });
    }
    Ok(out)
}

pub(super) fn write(
    fs: &SandboxFs,
    p: &SandboxPath,
    data: &[u8],
    mode: Option<u32>,
    uid_inside: u32,
) -> Result<FileStat, FilesError> {
    let (parent_rel, name) = p
        .split()
        .ok_or(FilesError::IsADirectory { path: "/".into() })?;
    let limit = fs.limits.max_file_bytes;
    if data.len() as u64 > limit {
        return Err(FilesError::TooLarge {
            path: p.to_string(),
            size: data.len() as u64,
            limit,
        });
    }
    let (uid, gid) = fs.host_ids(uid_inside)?;
    let parent = fs.dir_handle(&parent_rel, p)?;
    let name = Path::new(name);
    let existing = match sysfs::stat_at(&parent, name) {
        Ok(st) => Some(st),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(FilesError::fs(p, e)),
    };
    let perm = match (mode, existing) {
        (_, Some(st)) if st.kind == Kind::Dir => {
            return Err(FilesError::IsADirectory {
                path: p.to_string(),
            })
        }
        (Some(m), _) => clean_mode(m),
        (None, Some(st)) if st.kind == Kind::File => clean_mode(st.perm),
        (None, _) => 0o644,
    };

    let tmp = temp_name("write");
    let tmp = Path::new(&tmp);
    let mut file = fs
        .create(|| sysfs::create_file(&parent, tmp, 0o600))
        .map_err(|e| FilesError::fs(p, e))?;
    let written = (|| {
        // The data goes in while the file still belongs to host root with
        // mode 0600, which the sandbox's root cannot open (its capabilities
        // do not cover unmapped owners); on the sandbox's own tmpfs mounts
        // it belongs to the sandbox's root from the start (`fs.create`), as
        // everything there does. Owner next: chown clears setuid bits, so
        // the mode is set last.
        file.write_all(data).map_err(|e| FilesError::data(p, e))?;
        sysfs::chown_fd(&file, uid, gid, tmp).map_err(|e| FilesError::fs(p, e))?;
        sysfs::chmod_fd(&file, perm, tmp).map_err(|e| FilesError::fs(p, e))?;
        // rename(2) replaces a file or symlink atomically and fails with
        // EISDIR if a directory appeared meanwhile.
        fs.create(|| sysfs::rename_at(&parent, tmp, &parent, name, Replace::Allow))
            .map_err(|e| FilesError::fs(p, e))?;
        sysfs::stat_fd(&file, tmp).map_err(|e| FilesError::fs(p, e))
    })();
    match written {
        Ok(st) => Ok(fs.file_stat(p.to_string(), &st, None)),
        Err(e) => {
            // Best effort: the temporary name may be gone if the rename happened.
            let _ = sysfs::unlink_at(&parent, tmp, false);
            Err(e)
        }
    }
}

pub(super) fn stat(fs: &SandboxFs, p: &SandboxPath) -> Result<FileStat, FilesError> {
    let handle = fs.handle(p, Resolve::InRootNoFollow)?;
    let st = sysfs::stat_fd(&handle, &p.rel()).map_err(|e| FilesError::fs(p, e))?;
    let link = if st.kind == Kind::Symlink {
        let target =
            sysfs::readlink_at(&handle, Path::new("")).map_err(|e| FilesError::fs(p, e))?;
        Some(target.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(fs.file_stat(p.to_string(), &st, link))
}

pub(super) fn list(fs: &SandboxFs, p: &SandboxPath) -> Result<Vec<FileStat>, FilesError> {
    let dir = fs.dir_handle(&p.rel(), p)?;
    let limit = fs.limits.max_entries;
    let listing = sysfs::list_dir(&dir, usize::try_from(limit).unwrap_or(usize::MAX), &p.rel())
        .map_err(|e| FilesError::fs(p, e))?;
    if listing.truncated {
        return Err(FilesError::TooManyEntries {
            path: p.to_string(),
            limit,
        });
    }
    let mut out = Vec::with_capacity(listing.entries.len());
    for entry in listing.entries {
        let name = Path::new(&entry.name);
        let st = match sysfs::stat_at(&dir, name) {
            Ok(st) => st,
            // Removed since the listing: it is simply not there any more.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(FilesError::fs(p, e)),
        };
        let link = match st.kind {
            Kind::Symlink => match sysfs::readlink_at(&dir, name) {
                Ok(t) => Some(t.to_string_lossy().into_owned()),
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(FilesError::fs(p, e)),
            },
            _ => None,
        };
        out.push(fs.file_stat(entry.name.to_string_lossy().into_owned(), &st, link));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

pub(super) fn mkdir(
    fs: &SandboxFs,
    p: &SandboxPath,
    parents: bool,
    mode: Option<u32>,
) -> Result<FileStat, FilesError> {
    let perm = clean_mode(mode.unwrap_or(0o755));
    let dir = if parents {
        ensure_dir(fs, p, perm)?.0
    } else {
        let (parent_rel, name) = p
            .split()
            .ok_or(FilesError::AlreadyExists { path: "/".into() })?;
        let parent = fs.dir_handle(&parent_rel, p)?;
        make_dir(fs, &parent, Path::new(name), perm).map_err(|e| FilesError::fs(p, e))?
    };
    let st = sysfs::stat_fd(&dir, &p.rel()).map_err(|e| FilesError::fs(p, e))?;
    Ok(fs.file_stat(p.to_string(), &st, None))
}

/// A directory `name` was created below this one by [`ensure_dir`].
pub(super) struct Created {
    pub parent: OwnedFd,
    pub name: String,
}

/// Opens directory `p`, creating it and its missing parents (`mkdir -p`);
/// the final one gets `perm`, the parents `0o755`. Existing components are
/// resolved from the root each time, so symlinks among them are followed
/// inside the sandbox. Returns the directories created, outermost first, so
/// a caller can undo them.
pub(super) fn ensure_dir(
    fs: &SandboxFs,
    p: &SandboxPath,
    perm: u32,
) -> Result<(OwnedFd, Vec<Created>), FilesError> {
    let mut cur = fs.dir_handle(Path::new("."), p)?;
    let mut created = Vec::new();
    let parts = p.parts();
    for (i, name) in parts.iter().enumerate() {
        let prefix = SandboxPath::parse(&format!("/{}", parts[..=i].join("/")))?;
        cur = match fs.dir_handle(&prefix.rel(), &prefix) {
            Ok(fd) => fd,
            Err(FilesError::NotFound { .. }) => {
                let mode = if i + 1 == parts.len() { perm } else { 0o755 };
                let fd = make_dir(fs, &cur, Path::new(name), mode)
                    .map_err(|e| FilesError::fs(&prefix, e))?;
                created.push(Created {
                    parent: cur,
                    name: name.clone(),
                });
                fd
            }
            Err(e) => return Err(e),
        };
    }
    Ok((cur, created))
}

/// `mkdirat` plus owner and mode, set through a descriptor of the new
/// directory (opened without following anything), not through its name.
/// The directory belongs to the sandbox's root.
pub(super) fn make_dir(
    fs: &SandboxFs,
    parent: &OwnedFd,
    name: &Path,
    perm: u32,
) -> Result<OwnedFd, FsError> {
    fs.create(|| sysfs::mkdir_at(parent, name, 0o700))?;
    let dir = sysfs::open(parent, name, Access::Dir, Resolve::Child)?;
    sysfs::chown_fd(&dir, fs.uid_base, fs.uid_base, name)?;
    sysfs::chmod_fd(&dir, perm, name)?;
    Ok(dir)
}

pub(super) fn rename(
    fs: &SandboxFs,
    from: &SandboxPath,
    to: &SandboxPath,
) -> Result<(), FilesError> {
    let (from_parent, from_name) = from
        .split()
        .ok_or(FilesError::RootRefused { op: "renamed" })?;
    let (to_parent, to_name) = to
        .split()
        .ok_or(FilesError::RootRefused { op: "replaced" })?;
    if to.starts_with(from) {
        return Err(FilesError::Rejected {
            path: to.to_string(),
        });
    }
    let src = fs.dir_handle(&from_parent, from)?;
    let dst = fs.dir_handle(&to_parent, to)?;
    // The source must exist: report it by its own name, not the target's.
    sysfs::stat_at(&src, Path::new(from_name)).map_err(|e| FilesError::fs(from, e))?;
    fs.create(|| {
        sysfs::rename_at(
            &src,
            Path::new(from_name),
            &dst,
            Path::new(to_name),
            Replace::Never,
        )
    })
    .map_err(|e| FilesError::fs(to, e))
}
