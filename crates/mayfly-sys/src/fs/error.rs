//! The errors of the root-confined file syscalls.

use nix::errno::Errno;

/// A failed file syscall. Each variant names the operation and the path it
/// was given (relative to the descriptor it was called on), and classifies
/// the errno so callers can map it without matching raw numbers.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("cannot {op} `{path}`: it does not exist")]
    NotFound { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: it already exists")]
    AlreadyExists { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: a component is not a directory")]
    NotADirectory { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: it is a directory")]
    IsADirectory { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: the directory is not empty")]
    NotEmpty { op: &'static str, path: String },
    /// `ELOOP`: a symlink where none may be followed, a magic link, or a loop.
    #[error("cannot {op} `{path}`: it goes through a symlink that may not be followed here")]
    SymlinkRefused { op: &'static str, path: String },
    /// `EXDEV`: the path crosses a mount point, or a rename spans two mounts.
    #[error("cannot {op} `{path}`: it crosses a mount point")]
    CrossesMount { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: permission denied")]
    PermissionDenied { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: the filesystem is read-only")]
    ReadOnly { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: the name is too long")]
    NameTooLong { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: no space or quota is left")]
    NoSpace { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: it is busy or a mount point")]
    Busy { op: &'static str, path: String },
    #[error("cannot {op} `{path}`: the kernel rejected the request as invalid")]
    Invalid { op: &'static str, path: String },
    /// `EOVERFLOW` on a create: the filesystem was mounted in a user
    /// namespace (a sandbox's own tmpfs) that cannot map the caller's
    /// filesystem uid or gid, so it cannot own the new inode. See
    /// [`super::CreateAs`].
    #[error("cannot {op} `{path}`: the filesystem cannot map the creator's ids")]
    UnmappedCreator { op: &'static str, path: String },
    /// The object is on procfs, sysfs, a cgroup filesystem or another kernel
    /// interface the daemon must never read or write as host root.
    #[error("`{path}` is on a {fs} filesystem, which the file API never touches")]
    ForbiddenFilesystem { path: String, fs: &'static str },
    /// A read was asked of something that is not a regular file.
    #[error("`{path}` is not a regular file")]
    NotRegular { path: String },
    #[error("cannot {op} `{path}`")]
    Os {
        op: &'static str,
        path: String,
        #[source]
        errno: Errno,
    },
}

impl FsError {
    /// Classifies `errno` from operation `op` on `path`.
    pub(crate) fn from_errno(errno: Errno, op: &'static str, path: impl Into<String>) -> Self {
        let path = path.into();
        match errno {
            Errno::ENOENT => FsError::NotFound { op, path },
            Errno::EEXIST => FsError::AlreadyExists { op, path },
            Errno::ENOTDIR => FsError::NotADirectory { op, path },
            Errno::EISDIR => FsError::IsADirectory { op, path },
            Errno::ENOTEMPTY => FsError::NotEmpty { op, path },
            Errno::ELOOP => FsError::SymlinkRefused { op, path },
            Errno::EXDEV => FsError::CrossesMount { op, path },
            Errno::EACCES | Errno::EPERM => FsError::PermissionDenied { op, path },
            Errno::EROFS => FsError::ReadOnly { op, path },
            Errno::ENAMETOOLONG => FsError::NameTooLong { op, path },
            Errno::ENOSPC | Errno::EDQUOT => FsError::NoSpace { op, path },
            // EAGAIN (EWOULDBLOCK): a lease the sandbox holds on the file,
            // or lookups that kept racing renames; the caller may retry.
            Errno::EBUSY | Errno::EAGAIN => FsError::Busy { op, path },
            Errno::EINVAL => FsError::Invalid { op, path },
            Errno::EOVERFLOW => FsError::UnmappedCreator { op, path },
            errno => FsError::Os { op, path, errno },
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, FsError::NotFound { .. })
    }

    /// The create failed only because of who created: retry it under
    /// [`super::CreateAs`].
    pub fn is_unmapped_creator(&self) -> bool {
        matches!(self, FsError::UnmappedCreator { .. })
    }
}

/// The display form of a path given to a wrapper, for error context.
pub(crate) fn shown(path: &std::path::Path) -> String {
    if path.as_os_str().is_empty() {
        ".".to_owned()
    } else {
        path.to_string_lossy().into_owned()
    }
}
