//! Copies an overlay upper directory out of a sandbox into a layer.
//!
//! The upper directory was written by the sandbox, so every name in it is
//! hostile: the walk holds a directory descriptor at each level and opens
//! each entry relative to it with `O_NOFOLLOW`, so a directory swapped for a
//! symlink mid-walk fails the capture instead of copying host files. What is
//! kept: directories, regular files, symlinks (as links), hard links between
//! captured files, overlay whiteouts (character devices 0/0) and the opaque
//! mark of a directory (`trusted.overlay.opaque`). Other device nodes,
//! FIFOs and sockets are skipped. Owners are shifted down by the sandbox's
//! first host uid, so a layer holds the ids the sandbox saw (0..65535); ids
//! outside the sandbox's range become 65534.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, mknod, Mode, SFlag};
use nix::unistd::{fchownat, FchownatFlags, Gid, Uid};

/// Limits on one capture.
#[derive(Debug, Clone, Copy)]
pub struct CaptureLimits {
    pub max_entries: u64,
    pub max_depth: usize,
    /// Bytes of file data (holes are not data: a sparse file is copied
    /// sparse) one capture may write.
    pub max_bytes: u64,
}

/// What a capture copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureStats {
    pub entries: u64,
    pub bytes: u64,
    pub whiteouts: u64,
    pub skipped: u64,
}

/// A capture that failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("capturing `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the layer has more than {0} entries")]
    TooManyEntries(u64),
    #[error("the layer nests deeper than {0} directories")]
    TooDeep(usize),
    #[error("the layer holds more than {0} bytes of file data")]
    TooLarge(u64),
}

const OPAQUE: &str = "trusted.overlay.opaque";
const NOBODY: u32 = 65534;

struct Walk<'a> {
    uid_base: u32,
    limits: &'a CaptureLimits,
    stats: CaptureStats,
    links: HashMap<(u64, u64), PathBuf>,
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> CaptureError + '_ {
    move |source| CaptureError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn errno_at(path: &Path) -> impl FnOnce(nix::Error) -> CaptureError + '_ {
    move |e| CaptureError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// Copies the tree at `src` into the existing, empty directory `dst`.
pub fn capture_upper(
    src: &Path,
    dst: &Path,
    uid_base: u32,
    limits: &CaptureLimits,
) -> Result<CaptureStats, CaptureError> {
    let fd = nix::fcntl::open(
        src,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno_at(src))?;
    let mut walk = Walk {
        uid_base,
        limits,
        stats: CaptureStats::default(),
        links: HashMap::new(),
    };
    copy_opaque(fd.as_fd(), dst)?;
    walk.dir(fd, dst, 0)?;
    Ok(walk.stats)
}

impl Walk<'_> {
    fn shift(&self, id: u32) -> u32 {
        match id.checked_sub(self.uid_base) {
            Some(k) if k < 65536 => k,
            _ => NOBODY,
        }
    }

    fn dir(&mut self, fd: OwnedFd, dst: &Path, depth: usize) -> Result<(), CaptureError> {
        if depth > self.limits.max_depth {
            return Err(CaptureError::TooDeep(self.limits.max_depth));
        }
        let mut names = Vec::new();
        let mut dir =
            nix::dir::Dir::from_fd(fd.try_clone().map_err(io_at(dst))?).map_err(errno_at(dst))?;
        for entry in dir.iter() {
            let entry = entry.map_err(errno_at(dst))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        for name in names {
            self.stats.entries += 1;
            if self.stats.entries > self.limits.max_entries {
                return Err(CaptureError::TooManyEntries(self.limits.max_entries));
            }
            let os = OsStr::from_bytes(&name);
            let to = dst.join(os);
            self.entry(fd.as_fd(), os, &to, depth)?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        to: &Path,
        depth: usize,
    ) -> Result<(), CaptureError> {
        let st = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno_at(to))?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let perm = st.st_mode & 0o7777;
        let (uid, gid) = (self.shift(st.st_uid), self.shift(st.st_gid));
        match kind {
            SFlag::S_IFDIR => {
                let fd = openat(
                    parent,
                    name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(errno_at(to))?;
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(to)
                    .map_err(io_at(to))?;
                copy_opaque(fd.as_fd(), to)?;
                self.dir(fd, to, depth + 1)?;
                std::fs::set_permissions(to, std::fs::Permissions::from_mode(perm))
                    .map_err(io_at(to))?;
            }
            SFlag::S_IFREG => {
                let key = (st.st_dev, st.st_ino);
                if st.st_nlink > 1 {
                    if let Some(first) = self.links.get(&key) {
                        std::fs::hard_link(first, to).map_err(io_at(to))?;
                        return Ok(());
                    }
                    self.links.insert(key, to.to_path_buf());
                }
                // Non-blocking, then checked again: a name swapped for a
                // FIFO after the stat is never waited on, nor copied.
                let fd = openat(
                    parent,
                    name,
                    OFlag::O_RDONLY
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC
                        | OFlag::O_NOCTTY
                        | OFlag::O_NONBLOCK,
                    Mode::empty(),
                )
                .map_err(errno_at(to))?;
                let mut from = std::fs::File::from(fd);
                if !from.metadata().map_err(io_at(to))?.is_file() {
                    self.stats.skipped += 1;
                    return Ok(());
                }
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(to)
                    .map_err(io_at(to))?;
                let room = self.limits.max_bytes.saturating_sub(self.stats.bytes);
                self.stats.bytes += match copy_sparse(&mut from, &mut out, room) {
                    Ok(Some(n)) => n,
                    Ok(None) => return Err(CaptureError::TooLarge(self.limits.max_bytes)),
                    Err(e) => return Err(io_at(to)(e)),
                };
                out.flush().map_err(io_at(to))?;
                // Ownership first: chown clears setuid and setgid bits.
                fchownat(
                    out.as_fd(),
                    "",
                    Some(Uid::from_raw(uid)),
                    Some(Gid::from_raw(gid)),
                    FchownatFlags::AT_EMPTY_PATH,
                )
                .map_err(errno_at(to))?;
                out.set_permissions(std::fs::Permissions::from_mode(perm))
                    .map_err(io_at(to))?;
                return Ok(());
            }
            SFlag::S_IFLNK => {
                let target = readlinkat(parent, name).map_err(errno_at(to))?;
                symlink(&target, to).map_err(io_at(to))?;
            }
            SFlag::S_IFCHR if st.st_rdev == 0 => {
                // An overlay whiteout: the file is deleted in this layer.
                mknod(to, SFlag::S_IFCHR, Mode::empty(), 0).map_err(errno_at(to))?;
                self.stats.whiteouts += 1;
            }
            _ => {
                self.stats.skipped += 1;
                return Ok(());
            }
        }
        fchownat(
            nix::fcntl::AT_FDCWD,
            to,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            FchownatFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(errno_at(to))?;
        Ok(())
    }
}

/// Copies the data of `from` into `to` and leaves its holes holes
/// (`SEEK_DATA`/`SEEK_HOLE`), so a file with a huge apparent size costs
/// the layer only its data. Returns the data bytes copied, or `None` past
/// `room` of them.
fn copy_sparse(
    from: &mut std::fs::File,
    to: &mut std::fs::File,
    room: u64,
) -> std::io::Result<Option<u64>> {
    use nix::unistd::{lseek, Whence};
    use std::io::{Seek, SeekFrom};
    let len = from.metadata()?.len();
    let mut buf = vec![0u8; 128 * 1024];
    let (mut pos, mut copied) = (0i64, 0u64);
    loop {
        let data = match lseek(from.as_fd(), pos, Whence::SeekData) {
            Ok(d) => d,
            // No data past `pos`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(from.as_fd(), data, Whence::SeekHole)?;
        from.seek(SeekFrom::Start(data as u64))?;
        to.seek(SeekFrom::Start(data as u64))?;
        let mut left = (hole - data) as u64;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let k = from.read(&mut buf[..want])?;
            if k == 0 {
                break;
            }
            copied += k as u64;
            if copied > room {
                return Ok(None);
            }
            to.write_all(&buf[..k])?;
            left -= k as u64;
        }
        pos = hole;
    }
    to.set_len(len)?;
    Ok(Some(copied))
}

/// Copies the opaque mark of the directory `fd` onto `dst`.
fn copy_opaque(fd: BorrowedFd<'_>, dst: &Path) -> Result<(), CaptureError> {
    if get_xattr(fd, OPAQUE).as_deref() == Some(b"y") {
        set_opaque(dst).map_err(io_at(dst))?;
    }
    Ok(())
}

/// Marks `dir` opaque for overlayfs: lower entries under it are hidden.
pub fn set_opaque(dir: &Path) -> std::io::Result<()> {
    let path = crate::cstr(dir)?;
    let name = CString::new(OPAQUE).expect("static name");
    // SAFETY: both strings are NUL-terminated and live across the call;
    // the value is a 1-byte buffer of the given length.
    let rc = unsafe { libc::lsetxattr(path.as_ptr(), name.as_ptr(), b"y".as_ptr().cast(), 1, 0) };
    if rc < 0 {
        return Err(crate::last_errno());
    }
    Ok(())
}

/// An extended attribute of an open file, if set and at most 64 bytes.
fn get_xattr(fd: BorrowedFd<'_>, name: &str) -> Option<Vec<u8>> {
    let name = CString::new(name).ok()?;
    let mut buf = [0u8; 64];
    // SAFETY: the name is NUL-terminated; the buffer is writable for its
    // length, which is what is passed.
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// Makes an overlay whiteout named `path`: a character device 0/0.
pub fn make_whiteout(path: &Path) -> std::io::Result<()> {
    mknod(path, SFlag::S_IFCHR, Mode::empty(), 0).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn capture_shifts_owners_and_keeps_links_whiteouts_and_opaque_dirs() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (mknod of a whiteout, chown); run it as root");
        }
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let base = 1_u32 << 30;
        let s = src.path();
        std::fs::create_dir(s.join("etc")).unwrap();
        std::fs::write(s.join("etc/passwd"), "root:x:0:0").unwrap();
        std::os::unix::fs::chown(s.join("etc/passwd"), Some(base + 999), Some(base + 999)).unwrap();
        std::fs::hard_link(s.join("etc/passwd"), s.join("etc/passwd-")).unwrap();
        symlink("/etc/shadow", s.join("escape")).unwrap();
        make_whiteout(&s.join("gone")).unwrap();
        std::fs::create_dir(s.join("opaque")).unwrap();
        set_opaque(&s.join("opaque")).unwrap();
        std::fs::write(s.join("outsider"), "x").unwrap();
        // A file of 1 TiB apparent size and 5 bytes of data.
        let sparse = std::fs::File::create(s.join("sparse")).unwrap();
        sparse.set_len(1 << 40).unwrap();
        std::os::unix::fs::FileExt::write_at(&sparse, b"tail!", (1 << 30) + 7).unwrap();
        drop(sparse);
        let limits = CaptureLimits {
            max_entries: 100,
            max_depth: 8,
            max_bytes: 1 << 20,
        };
        let st = capture_upper(s, dst.path(), base, &limits).unwrap();
        let d = dst.path();
        let m = std::fs::symlink_metadata(d.join("etc/passwd")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.nlink()), (999, 999, 2));
        assert_eq!(
            std::fs::read_link(d.join("escape")).unwrap(),
            Path::new("/etc/shadow")
        );
        let w = std::fs::symlink_metadata(d.join("gone")).unwrap();
        assert_eq!((w.mode() & libc::S_IFMT, w.rdev()), (libc::S_IFCHR, 0));
        let fd = nix::fcntl::open(&d.join("opaque"), OFlag::O_RDONLY, Mode::empty()).unwrap();
        assert_eq!(get_xattr(fd.as_fd(), OPAQUE).as_deref(), Some(&b"y"[..]));
        // Host root's file is outside the sandbox's range.
        assert_eq!(std::fs::metadata(d.join("outsider")).unwrap().uid(), NOBODY);
        assert_eq!(st.whiteouts, 1);
        // Copied sparse: the same size and data, a few blocks on disk.
        let m = std::fs::metadata(d.join("sparse")).unwrap();
        assert_eq!(m.len(), 1 << 40);
        assert!(m.blocks() < 64, "{} blocks", m.blocks());
        let mut tail = [0u8; 5];
        let f = std::fs::File::open(d.join("sparse")).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut tail, (1 << 30) + 7).unwrap();
        assert_eq!(&tail, b"tail!");
        // Data past the byte cap fails the capture.
        std::fs::write(s.join("big"), vec![1u8; 2 << 20]).unwrap();
        let over = tempfile::tempdir().unwrap();
        assert!(matches!(
            capture_upper(s, over.path(), base, &limits),
            Err(CaptureError::TooLarge(_))
        ));
        std::fs::remove_file(s.join("big")).unwrap();
        let tight = CaptureLimits {
            max_entries: 2,
            max_depth: 8,
            max_bytes: 1 << 20,
        };
        let again = tempfile::tempdir().unwrap();
        assert!(matches!(
            capture_upper(s, again.path(), base, &tight),
            Err(CaptureError::TooManyEntries(2))
        ));
    }
}
