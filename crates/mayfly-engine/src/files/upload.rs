//! Unpacking an uploaded tar archive, all or nothing.
//!
//! 1. **Plan** ([`tar_plan::plan`]): the whole header stream is validated
//!    before anything is written. A rejected archive changes nothing.
//! 2. **Stage**: the plan is carried out in a fresh directory
//!    `.mf-upload-<random>` inside the target (so the final moves are
//!    same-filesystem renames). A failure here (no space, a sandbox race)
//!    removes the staging tree, and any target directories this upload
//!    created, and changes nothing else.
//! 3. **Check**: the staged tree is compared with the target; a file where
//!    the target has a directory is a conflict, found before any move.
//! 4. **Commit**: entries are renamed into place, merging into existing
//!    directories; files and symlinks replace existing ones atomically, and
//!    an existing symlink (or file) where the archive has a directory is
//!    replaced by the directory. Existing directories keep their mode.
//!
//! The staging directory is left owned by host root with mode 0700, so no
//! sandbox process can enter it while it fills: the sandbox's root has no
//! capabilities over an owner its user namespace does not map.
//!
//! Only the commit can leave a partial result, and only if the sandbox
//! changes the target concurrently; every file that appears is complete.
//! Everything is created owned by the sandbox's root, with setuid and setgid
//! bits dropped; the archive's own owners are ignored.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use mayfly_sys::fs::{self as sysfs, Access, FsError, Kind, Replace, Resolve};

use super::ops::{ensure_dir, make_dir};
use super::path::SandboxPath;
use super::remove::remove_tree;
use super::tar_plan::{plan, Action, Planned};
use super::{temp_name, FilesError, SandboxFs};
use crate::UploadSummary;

pub(super) fn upload(
    fs: &SandboxFs,
    dir: &SandboxPath,
    archive: &[u8],
) -> Result<UploadSummary, FilesError> {
    let plan = plan(archive, &fs.limits)?;
    let (target, created) = ensure_dir(fs, dir, 0o755)?;
    let result = stage_and_commit(fs, &target, dir, archive, &plan);
    if result.is_err() {
        // Undo the directories this upload created, innermost first; each is
        // empty unless the sandbox wrote into it meanwhile, and then it stays.
        for c in created.iter().rev() {
            let _ = sysfs::unlink_at(&c.parent, Path::new(&c.name), true);
        }
    }
    result
}

fn stage_and_commit(
    fs: &SandboxFs,
    target: &OwnedFd,
    dir: &SandboxPath,
    archive: &[u8],
    plan: &[Planned],
) -> Result<UploadSummary, FilesError> {
    let staging_name = temp_name("upload");
    let staging_name = Path::new(&staging_name);
    let fail = |e| FilesError::fs(dir, e);
    fs.create(|| sysfs::mkdir_at(target, staging_name, 0o700))
        .map_err(fail)?;
    let result = sysfs::open(target, staging_name, Access::DirHandle, Resolve::Child)
        .map_err(fail)
        .and_then(|staging| {
            let summary = Stager::new(fs, &staging, dir, archive).run(plan)?;
            let mut shown = dir.to_string();
            let limit = fs.limits.max_entries;
            walk_merge(
                fs,
                staging.as_fd(),
                target.as_fd(),
                &mut shown,
                limit,
                false,
            )?;
            walk_merge(fs, staging.as_fd(), target.as_fd(), &mut shown, limit, true)?;
            Ok(summary)
        });
    // On failure this removes everything staged; on success, the emptied
    // directories that were merged into existing ones.
    let budget = fs.limits.max_entries.saturating_mul(4);
    let cleanup = remove_tree(
        target.as_fd(),
        staging_name,
        fs.limits.max_depth + 1,
        budget,
        dir,
    );
    if let (Ok(_), Err(e)) = (&result, cleanup) {
        tracing::warn!(error = %e, path = %dir, "leftover upload staging directory");
    }
    result
}

/// Carries out a plan below the staging directory.
struct Stager<'a> {
    fs: &'a SandboxFs,
    staging: &'a OwnedFd,
    dir: &'a SandboxPath,
    archive: &'a [u8],
    /// The last parent directory opened, since entries come in tree order.
    cached: Option<(PathBuf, OwnedFd)>,
}

impl<'a> Stager<'a> {
    fn new(
        fs: &'a SandboxFs,
        staging: &'a OwnedFd,
        dir: &'a SandboxPath,
        archive: &'a [u8],
    ) -> Self {
        Stager {
            fs,
            staging,
            dir,
            archive,
            cached: None,
        }
    }

    fn run(mut self, plan: &[Planned]) -> Result<UploadSummary, FilesError> {
        let mut summary = UploadSummary {
            files: 0,
            dirs: 0,
            symlinks: 0,
            bytes: 0,
        };
        for entry in plan {
            self.apply(entry)?;
            match &entry.action {
                Action::Dir => summary.dirs += 1,
                Action::File { data } => {
                    summary.files += 1;
                    summary.bytes += data.len() as u64;
                }
                Action::HardLink { .. } => summary.files += 1,
                Action::Symlink { .. } => summary.symlinks += 1,
            }
        }
        // Directory times last, innermost first, since creating children
        // changes them.
        for entry in plan.iter().rev() {
            if let (Action::Dir, Some(mtime)) = (&entry.action, entry.mtime) {
                let shown = self.shown(&entry.path);
                let (parent, name) = self.parent_of(&entry.path, &shown)?;
                sysfs::set_mtime_at(&parent, name, mtime).map_err(|e| FilesError::fs(&shown, e))?;
            }
        }
        Ok(summary)
    }

    fn shown(&self, rel: &Path) -> String {
        format!("{}/{}", self.dir, rel.display())
    }

    /// A descriptor of `rel`'s parent below the staging directory, opened
    /// without following symlinks, and `rel`'s final name.
    fn parent_of<'p>(
        &mut self,
        rel: &'p Path,
        shown: &str,
    ) -> Result<(OwnedFd, &'p Path), FilesError> {
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| FilesError::data(shown, e));
        let name = Path::new(rel.file_name().unwrap_or(rel.as_os_str()));
        let parent = rel.parent().unwrap_or(Path::new(""));
        if parent.as_os_str().is_empty() {
            return Ok((dup(self.staging)?, name));
        }
        if let Some((cached, fd)) = &self.cached {
            if cached == parent {
                return Ok((dup(fd)?, name));
            }
        }
        let fd = sysfs::open(self.staging, parent, Access::DirHandle, Resolve::Child)
            .map_err(|e| FilesError::fs(shown, e))?;
        self.cached = Some((parent.to_owned(), dup(&fd)?));
        Ok((fd, name))
    }

    fn apply(&mut self, entry: &Planned) -> Result<(), FilesError> {
        let shown = self.shown(&entry.path);
        let (parent, name) = self.parent_of(&entry.path, &shown)?;
        let fail = |e| FilesError::fs(&shown, e);
        let base = self.fs.uid_base;
        match &entry.action {
            Action::Dir => match sysfs::stat_at(&parent, name) {
                Ok(st) if st.kind == Kind::Dir => {
                    let dir =
                        sysfs::open(&parent, name, Access::Dir, Resolve::Child).map_err(fail)?;
                    sysfs::chmod_fd(&dir, entry.mode, name).map_err(fail)
                }
                Ok(_) => Err(FilesError::AlreadyExists {
                    path: shown.clone(),
                }),
                Err(e) if e.is_not_found() => make_dir(self.fs, &parent, name, entry.mode)
                    .map(drop)
                    .map_err(fail),
                Err(e) => Err(fail(e)),
            },
            Action::File { data } => {
                clear(&parent, name).map_err(fail)?;
                let mut file = self
                    .fs
                    .create(|| sysfs::create_file(&parent, name, 0o600))
                    .map_err(fail)?;
                sysfs::chown_fd(&file, base, base, name).map_err(fail)?;
                file.write_all(&self.archive[data.clone()])
                    .map_err(|e| FilesError::data(&shown, e))?;
                sysfs::chmod_fd(&file, entry.mode, name).map_err(fail)?;
                match entry.mtime {
                    Some(t) => sysfs::set_mtime_fd(&file, t, name).map_err(fail),
                    None => Ok(()),
                }
            }
            Action::Symlink { target } => {
                clear(&parent, name).map_err(fail)?;
                self.fs
                    .create(|| sysfs::symlink_at(target, &parent, name))
                    .map_err(fail)?;
                sysfs::chown_at_nofollow(&parent, name, base, base).map_err(fail)?;
                match entry.mtime {
                    Some(t) => sysfs::set_mtime_at(&parent, name, t).map_err(fail),
                    None => Ok(()),
                }
            }
            Action::HardLink { target } => {
                let source = sysfs::open(self.staging, target, Access::Handle, Resolve::Child)
                    .map_err(fail)?;
                if sysfs::stat_fd(&source, target).map_err(fail)?.kind != Kind::File {
                    return Err(FilesError::NotRegularFile {
                        path: shown.clone(),
                    });
                }
                clear(&parent, name).map_err(fail)?;
                self.fs
                    .create(|| sysfs::link_fd_at(&source, &parent, name))
                    .map_err(fail)
            }
        }
    }
}

/// Removes a non-directory left at `name` by an earlier duplicate entry.
fn clear(parent: &OwnedFd, name: &Path) -> Result<(), FsError> {
    match sysfs::unlink_at(parent, name, false) {
        Err(e) if !e.is_not_found() => Err(e),
        _ => Ok(()),
    }
}

/// Walks the staged tree against the target. With `commit` false it only
/// checks for conflicts (a staged non-directory where the target has a
/// directory); with `commit` true it moves the staged entries into place.
/// `shown` is the target's inside path, extended while descending.
fn walk_merge(
    fs: &SandboxFs,
    staged: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    shown: &mut String,
    limit: u64,
    commit: bool,
) -> Result<(), FilesError> {
    let listing = sysfs::list_dir(
        staged,
        usize::try_from(limit).unwrap_or(usize::MAX),
        Path::new(shown.as_str()),
    )
    .map_err(|e| FilesError::fs(&shown, e))?;
    if listing.truncated {
        return Err(FilesError::TooManyEntries {
            path: shown.clone(),
            limit,
        });
    }
    for entry in listing.entries {
        let name = Path::new(&entry.name);
        let len = shown.len();
        shown.push('/');
        shown.push_str(&entry.name.to_string_lossy());
        let fail = |e| FilesError::fs(&shown, e);
        let s = sysfs::stat_at(staged, name).map_err(fail)?;
        let t = match sysfs::stat_at(target, name) {
            Ok(t) => Some(t),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(fail(e)),
        };
        let s_dir = s.kind == Kind::Dir;
        match t.map(|t| t.kind == Kind::Dir) {
            Some(true) if !s_dir => {
                return Err(FilesError::IsADirectory {
                    path: shown.clone(),
                })
            }
            Some(true) => {
                let s_fd =
                    sysfs::open(staged, name, Access::DirHandle, Resolve::Child).map_err(fail)?;
                let t_fd =
                    sysfs::open(target, name, Access::DirHandle, Resolve::Child).map_err(fail)?;
                walk_merge(fs, s_fd.as_fd(), t_fd.as_fd(), shown, limit, commit)?;
            }
            _ if !commit => {}
            None => fs
                .create(|| sysfs::rename_at(staged, name, target, name, Replace::Never))
                .map_err(fail)?,
            Some(false) if s_dir => {
                sysfs::unlink_at(target, name, false).map_err(fail)?;
                fs.create(|| sysfs::rename_at(staged, name, target, name, Replace::Never))
                    .map_err(fail)?;
            }
            Some(false) => fs
                .create(|| sysfs::rename_at(staged, name, target, name, Replace::Allow))
                .map_err(fail)?,
        }
        shown.truncate(len);
    }
    Ok(())
}
