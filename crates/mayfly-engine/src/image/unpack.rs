//! Unpacking one layer's tar stream into a staging directory.
//!
//! Each entry is planned by [`Planner`] (pure) and its steps carried out
//! here with the confined descriptor operations of `mayfly_sys::fs`: every
//! parent is opened from the staging directory with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`, files are created `O_EXCL`, and nothing ever
//! follows a symlink, so even a planner bug could not write outside the
//! staging directory. A failure leaves a partial staging directory, which
//! the caller's [`Staging`](super::store::Staging) guard removes.

use std::io::{self, BufRead, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use mayfly_sys::fs::{self as sysfs, Access, FsError, Kind, Resolve};
use mayfly_sys::layer;

use super::plan::{Header, Limits, Owner, PlanError, Planner, Step};

/// Why a layer could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("writing `{path}` of the layer failed")]
    Fs {
        path: String,
        #[source]
        source: FsError,
    },
    #[error("reading the layer stream failed (corrupt or truncated archive)")]
    Read {
        #[source]
        source: io::Error,
    },
    #[error("duplicating a directory descriptor failed")]
    Descriptor(#[source] io::Error),
    #[error("the layer is {0}-compressed, which is not supported (gzip, zstd and plain tar are)")]
    Compression(&'static str),
}

/// What an unpack did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpackReport {
    /// Steps carried out (entries plus implied directories).
    pub steps: u64,
    /// Device nodes, FIFOs and AUFS bookkeeping left out.
    pub skipped: u64,
}

fn read_err(source: io::Error) -> UnpackError {
    UnpackError::Read { source }
}

/// Wraps `input` in the decompressor its first bytes call for: gzip, zstd,
/// or none (plain tar). bzip2 and xz are recognised and refused.
pub fn decompress<'a, R: BufRead + 'a>(mut input: R) -> Result<Box<dyn Read + 'a>, UnpackError> {
    let head = input.fill_buf().map_err(read_err)?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(input)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Ok(Box::new(super::zstd::ZstdFrames::new(input)))
    } else if head.starts_with(b"BZh") {
        Err(UnpackError::Compression("bzip2"))
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z']) {
        Err(UnpackError::Compression("xz"))
    } else {
        Ok(Box::new(input))
    }
}

/// Unpacks the tar stream `tar` into the directory `dest`, then reads the
/// stream to its end (so a caller hashing the input sees all of it).
pub fn unpack(
    tar: &mut dyn Read,
    dest: &Path,
    limits: Limits,
) -> Result<UnpackReport, UnpackError> {
    let fs_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| UnpackError::Fs { path, source }
    };
    let root: OwnedFd = sysfs::open_host_dir(dest).map_err(fs_err(dest))?;
    let mut planner = Planner::new(limits);
    let mut applier = Applier {
        root,
        cached: None,
        dirs: Vec::new(),
    };
    let mut report = UnpackReport::default();
    {
        let mut archive = tar::Archive::new(ZeroTail {
            inner: &mut *tar,
            tail: TAIL,
        });
        for entry in archive.entries().map_err(read_err)? {
            let mut entry = entry.map_err(read_err)?;
            let path = entry.path_bytes().into_owned();
            let link = entry.link_name_bytes().map(|l| l.into_owned());
            let hdr = entry.header();
            let header = Header {
                path: &path,
                kind: hdr.entry_type(),
                link: link.as_deref(),
                size: entry.size(),
                mode: hdr.mode().unwrap_or(0o644),
                uid: hdr.uid().unwrap_or(0),
                gid: hdr.gid().unwrap_or(0),
                mtime: hdr.mtime().ok().map(|t| i64::try_from(t).unwrap_or(0)),
            };
            for step in planner.plan(&header)? {
                applier.apply(&step, &mut entry)?;
                report.steps += 1;
            }
        }
    }
    applier.finish()?;
    io::copy(tar, &mut io::sink()).map_err(read_err)?;
    report.skipped = planner.skipped;
    Ok(report)
}

/// Zero bytes supplied after the stream's end: one block of padding and the
/// two end-of-archive blocks.
const TAIL: usize = 3 * 512;

/// Some writers (umoci 0.4, seen here) end a layer right after the last
/// file's data, with neither its padding nor the end-of-archive blocks.
/// GNU tar reads such streams; so does this, by supplying the missing zero
/// bytes. A stream cut short by more than that still fails, and every
/// layer's bytes are verified against its digest anyway.
struct ZeroTail<R> {
    inner: R,
    tail: usize,
}

impl<R: Read> Read for ZeroTail<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 || buf.is_empty() {
            return Ok(n);
        }
        let n = buf.len().min(self.tail);
        buf[..n].fill(0);
        self.tail -= n;
        Ok(n)
    }
}

struct Applier {
    root: OwnedFd,
    /// The last parent opened: entries come in tree order.
    cached: Option<(PathBuf, OwnedFd)>,
    /// Directories with a time to set once their children exist.
    dirs: Vec<(PathBuf, i64)>,
}

impl Applier {
    fn fs_err(path: &Path) -> impl FnOnce(FsError) -> UnpackError + '_ {
        move |source| UnpackError::Fs {
            path: path.display().to_string(),
            source,
        }
    }

    /// A descriptor of `rel`'s parent (no symlink anywhere) and its name.
    fn parent_of<'p>(&mut self, rel: &'p Path) -> Result<(OwnedFd, &'p Path), UnpackError> {
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(UnpackError::Descriptor);
        let name = Path::new(rel.file_name().unwrap_or(rel.as_os_str()));
        let parent = rel.parent().unwrap_or(Path::new(""));
        if parent.as_os_str().is_empty() {
            return Ok((dup(&self.root)?, name));
        }
        if let Some((cached, fd)) = &self.cached {
            if cached == parent {
                return Ok((dup(fd)?, name));
            }
        }
        let fd = sysfs::open(&self.root, parent, Access::DirHandle, Resolve::Child)
            .map_err(Self::fs_err(rel))?;
        self.cached = Some((parent.to_owned(), dup(&fd)?));
        Ok((fd, name))
    }

    fn apply(&mut self, step: &Step, data: &mut dyn Read) -> Result<(), UnpackError> {
        match step {
            // The layer root is the staging directory itself (0755, root).
            Step::Dir { path, .. } if path.as_os_str().is_empty() => Ok(()),
            Step::Dir {
                path,
                owner,
                mode,
                mtime,
            } => {
                let (parent, name) = self.parent_of(path)?;
                let fail = Self::fs_err(path);
                match sysfs::stat_at(&parent, name) {
                    Ok(st) if st.kind == Kind::Dir => {}
                    Ok(_) => {
                        // Only a whiteout of the same layer can be here.
                        sysfs::unlink_at(&parent, name, false).map_err(Self::fs_err(path))?;
                        sysfs::mkdir_at(&parent, name, 0o700).map_err(Self::fs_err(path))?;
                    }
                    Err(e) if e.is_not_found() => {
                        sysfs::mkdir_at(&parent, name, 0o700).map_err(Self::fs_err(path))?
                    }
                    Err(e) => return Err(fail(e)),
                }
                let dir = sysfs::open(&parent, name, Access::Dir, Resolve::Child)
                    .map_err(Self::fs_err(path))?;
                set_owner_mode(&dir, *owner, *mode, path)?;
                if let Some(t) = mtime {
                    self.dirs.push((path.clone(), *t));
                }
                Ok(())
            }
            Step::File {
                path,
                owner,
                mode,
                mtime,
            } => {
                let (parent, name) = self.parent_of(path)?;
                clear(&parent, name).map_err(Self::fs_err(path))?;
                let mut file =
                    sysfs::create_file(&parent, name, 0o600).map_err(Self::fs_err(path))?;
                io::copy(data, &mut file).map_err(read_err)?;
                // Owner before mode: a chown clears setuid and setgid.
                set_owner_mode(&file, *owner, *mode, path)?;
                match mtime {
                    Some(t) => sysfs::set_mtime_fd(&file, *t, path).map_err(Self::fs_err(path)),
                    None => Ok(()),
                }
            }
            Step::Symlink {
                path,
                target,
                owner,
                mtime,
            } => {
                let (parent, name) = self.parent_of(path)?;
                let fail = || Self::fs_err(path);
                clear(&parent, name).map_err(fail())?;
                sysfs::symlink_at(target, &parent, name).map_err(fail())?;
                sysfs::chown_at_nofollow(&parent, name, owner.uid, owner.gid).map_err(fail())?;
                match mtime {
                    Some(t) => sysfs::set_mtime_at(&parent, name, *t).map_err(fail()),
                    None => Ok(()),
                }
            }
            Step::HardLink { path, target } => {
                let source = sysfs::open(&self.root, target, Access::Handle, Resolve::Child)
                    .map_err(Self::fs_err(target))?;
                let (parent, name) = self.parent_of(path)?;
                clear(&parent, name).map_err(Self::fs_err(path))?;
                sysfs::link_fd_at(&source, &parent, name).map_err(Self::fs_err(path))
            }
            Step::Whiteout { path } => {
                let (parent, name) = self.parent_of(path)?;
                clear(&parent, name).map_err(Self::fs_err(path))?;
                layer::make_whiteout(&parent, name).map_err(Self::fs_err(path))
            }
            Step::Opaque { dir } => {
                let fd = sysfs::open(&self.root, dir, Access::Dir, Resolve::Child)
                    .map_err(Self::fs_err(dir))?;
                layer::set_opaque(&fd, dir).map_err(Self::fs_err(dir))
            }
        }
    }

    /// Directory times last, innermost first, since creating children
    /// changes them.
    fn finish(mut self) -> Result<(), UnpackError> {
        for (path, t) in std::mem::take(&mut self.dirs).iter().rev() {
            let (parent, name) = self.parent_of(path)?;
            sysfs::set_mtime_at(&parent, name, *t).map_err(Self::fs_err(path))?;
        }
        Ok(())
    }
}

fn set_owner_mode(
    fd: impl std::os::fd::AsFd,
    owner: Owner,
    mode: u32,
    path: &Path,
) -> Result<(), UnpackError> {
    let fail = || Applier::fs_err(path);
    sysfs::chown_fd(&fd, owner.uid, owner.gid, path).map_err(fail())?;
    sysfs::chmod_fd(&fd, mode, path).map_err(fail())
}

/// Removes a non-directory an earlier entry of the layer left at `name`.
fn clear(parent: &OwnedFd, name: &Path) -> Result<(), FsError> {
    match sysfs::unlink_at(parent, name, false) {
        Err(e) if !e.is_not_found() => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
