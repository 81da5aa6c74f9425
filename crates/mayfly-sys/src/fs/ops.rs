//! Descriptor-relative file operations that never follow a final symlink.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use nix::fcntl::{AtFlags, RenameFlags};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};

use super::error::{shown, FsError};

/// The type of a filesystem object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

impl Kind {
    fn from_mode(mode: u32) -> Kind {
        match SFlag::from_bits_truncate(mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            SFlag::S_IFIFO => Kind::Fifo,
            SFlag::S_IFCHR => Kind::CharDevice,
            SFlag::S_IFBLK => Kind::BlockDevice,
            SFlag::S_IFSOCK => Kind::Socket,
            _ => Kind::File,
        }
    }
}

/// What `stat` reports, with host ids (callers translate them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    /// Permission bits only (`st_mode & 0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: i64,
    pub dev: u64,
    pub ino: u64,
}

impl From<nix::sys::stat::FileStat> for Stat {
    fn from(st: nix::sys::stat::FileStat) -> Self {
        Stat {
            kind: Kind::from_mode(st.st_mode),
            perm: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_sec: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec,
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// Whether a rename may replace an existing destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    Allow,
    /// `RENAME_NOREPLACE`: fail with [`FsError::AlreadyExists`] instead.
    Never,
}

/// Filesystems that are kernel interfaces rather than storage. The daemon is
/// host root: writing `/proc/sys/...` or a cgroup file through a sandbox's
/// mount would act on the host, and a FUSE mount served by the sandbox could
/// block a daemon thread forever. The values are from `linux/magic.h`.
const FORBIDDEN_FS: &[(i64, &str)] = &[
    (0x9fa0, "procfs"),
    (0x6265_6572, "sysfs"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0xcafe_4a11, "bpf"),
    (0x6573_5546, "FUSE"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x6265_6570, "configfs"),
    (0xde5e_81e4, "efivarfs"),
    (0x6165_676c, "pstore"),
    (0xf97c_ff8c, "selinuxfs"),
    (0x4341_5d53, "smackfs"),
    (0x0765_5821, "resctrl"),
    (0x6e73_6673, "nsfs"),
];

/// Fails with [`FsError::ForbiddenFilesystem`] if `fd` lives on a kernel
/// interface filesystem (procfs, sysfs, cgroupfs and the like).
pub fn check_filesystem(fd: impl AsFd, path: &Path) -> Result<(), FsError> {
    let sfs = nix::sys::statfs::fstatfs(fd)
        .map_err(|e| FsError::from_errno(e, "inspect the filesystem of", shown(path)))?;
    // `f_type` is a signed long on x86-64 but the magics are u32 values.
    let magic = i64::from(sfs.filesystem_type().0 as u32);
    match FORBIDDEN_FS.iter().find(|(m, _)| *m == magic) {
        Some((_, fs)) => Err(FsError::ForbiddenFilesystem {
            path: shown(path),
            fs,
        }),
        None => Ok(()),
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; an empty `name` stats `dir`.
pub fn stat_at(dir: impl AsFd, name: &Path) -> Result<Stat, FsError> {
    let mut flags = AtFlags::AT_SYMLINK_NOFOLLOW;
    if name.as_os_str().is_empty() {
        flags |= AtFlags::AT_EMPTY_PATH;
    }
    nix::sys::stat::fstatat(dir, name, flags)
        .map(Stat::from)
        .map_err(|e| FsError::from_errno(e, "stat", shown(name)))
}

/// Stats the object `fd` refers to (which may be an `O_PATH` symlink handle).
pub fn stat_fd(fd: impl AsFd, path: &Path) -> Result<Stat, FsError> {
    nix::sys::stat::fstatat(
        fd,
        "",
        AtFlags::AT_SYMLINK_NOFOLLOW | AtFlags::AT_EMPTY_PATH,
    )
    .map(Stat::from)
    .map_err(|e| FsError::from_errno(e, "stat", shown(path)))
}

/// `mkdirat`; `mode` is subject to the umask, so callers `fchmod` after.
pub fn mkdir_at(dir: impl AsFd, name: &Path, mode: u32) -> Result<(), FsError> {
    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode))
        .map_err(|e| FsError::from_errno(e, "create directory", shown(name)))
}

/// `unlinkat`, which never follows a symlink: it removes the link itself.
pub fn unlink_at(dir: impl AsFd, name: &Path, is_dir: bool) -> Result<(), FsError> {
    let flag = if is_dir {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    nix::unistd::unlinkat(dir, name, flag)
        .map_err(|e| FsError::from_errno(e, "remove", shown(name)))
}

/// `renameat2`, optionally with `RENAME_NOREPLACE`. Neither name's final
/// component is followed if it is a symlink.
pub fn rename_at(
    from_dir: impl AsFd,
    from: &Path,
    to_dir: impl AsFd,
    to: &Path,
    replace: Replace,
) -> Result<(), FsError> {
    let flags = match replace {
        Replace::Allow => RenameFlags::empty(),
        Replace::Never => RenameFlags::RENAME_NOREPLACE,
    };
    nix::fcntl::renameat2(from_dir, from, to_dir, to, flags)
        .map_err(|e| FsError::from_errno(e, "rename", format!("{} -> {}", shown(from), shown(to))))
}

/// Changes the owner of the object `fd` refers to, including `O_PATH`
/// handles (`fchownat(fd, "", AT_EMPTY_PATH)`).
pub fn chown_fd(fd: impl AsFd, uid: u32, gid: u32, path: &Path) -> Result<(), FsError> {
    nix::unistd::fchownat(
        fd,
        "",
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| FsError::from_errno(e, "change the owner of", shown(path)))
}

/// Changes the owner of `name` below `dir`; a symlink itself is changed.
pub fn chown_at_nofollow(dir: impl AsFd, name: &Path, uid: u32, gid: u32) -> Result<(), FsError> {
    nix::unistd::fchownat(
        dir,
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| FsError::from_errno(e, "change the owner of", shown(name)))
}

/// `fchmod`. `fd` must be a real open descriptor, not an `O_PATH` handle.
pub fn chmod_fd(fd: impl AsFd, mode: u32, path: &Path) -> Result<(), FsError> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode & 0o7777))
        .map_err(|e| FsError::from_errno(e, "change the mode of", shown(path)))
}

/// Reads the target of symlink `name` below `dir`; an empty `name` reads the
/// `O_PATH` symlink handle `dir` itself.
pub fn readlink_at(dir: impl AsFd, name: &Path) -> Result<OsString, FsError> {
    nix::fcntl::readlinkat(dir, name)
        .map_err(|e| FsError::from_errno(e, "read the link", shown(name)))
}

/// Creates symlink `name` below `dir` pointing at `target`.
pub fn symlink_at(target: &Path, dir: impl AsFd, name: &Path) -> Result<(), FsError> {
    nix::unistd::symlinkat(target, dir, name)
        .map_err(|e| FsError::from_errno(e, "create symlink", shown(name)))
}

/// Gives the object behind `fd` (an `O_PATH` handle is fine) the extra name
/// `name` below `dir`: `linkat(fd, "", dir, name, AT_EMPTY_PATH)`. The
/// source is the pinned inode, not a path that could be swapped.
pub fn link_fd_at(fd: impl AsFd, dir: impl AsFd, name: &Path) -> Result<(), FsError> {
    nix::unistd::linkat(fd, "", dir, name, AtFlags::AT_EMPTY_PATH)
        .map_err(|e| FsError::from_errno(e, "create hard link", shown(name)))
}

/// Sets the modification time of `name` below `dir` (not following a
/// symlink), leaving the access time alone.
pub fn set_mtime_at(dir: impl AsFd, name: &Path, sec: i64) -> Result<(), FsError> {
    nix::sys::stat::utimensat(
        dir,
        name,
        &TimeSpec::UTIME_OMIT,
        &TimeSpec::new(sec, 0),
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|e| FsError::from_errno(e, "set the times of", shown(name)))
}

/// Sets the modification time of the open file `file`.
pub fn set_mtime_fd(file: &File, sec: i64, path: &Path) -> Result<(), FsError> {
    nix::sys::stat::futimens(file, &TimeSpec::UTIME_OMIT, &TimeSpec::new(sec, 0))
        .map_err(|e| FsError::from_errno(e, "set the times of", shown(path)))
}
