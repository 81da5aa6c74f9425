//! Collecting declared paths out of a live sandbox into the store.
//!
//! Everything is read through the sandbox's [`SandboxFs`]: walks resolve
//! inside the sandbox's root, a symlink at the declared path itself is
//! recorded as skipped (never followed, not even inside the sandbox, so a
//! link to `/etc/shadow` yields nothing), and symlinks inside a directory
//! are stored as symlinks. A file is stored as it is; a directory as a tar
//! archive (`<name>.tar`), packed by the same code as `GET /archive`.
//! Sizes are checked before copying (a sparse 50 GB file costs nothing to
//! refuse) and enforced while copying (a file that grows is cut at the cap
//! and recorded as skipped).

use std::collections::BTreeSet;

use mayfly_types::{ArtifactInfo, ArtifactStatus, FileKind, SandboxId};

use super::store::{ArtifactError, ArtifactStore};
use crate::files::{FilesError, FsLimits, SandboxFs, MAX_PATH_BYTES};
use crate::EngineError;

/// The most paths one sandbox may declare.
pub const MAX_ARTIFACTS: usize = 64;

/// Size caps of one collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// The most bytes one artifact may store.
    pub per_artifact: u64,
    /// The most bytes all of one sandbox's artifacts may store.
    pub per_sandbox: u64,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            per_artifact: 1 << 30,
            per_sandbox: 2 << 30,
        }
    }
}

/// Checks the paths a create declares: absolute, no NUL, no `..`, at most
/// [`MAX_ARTIFACTS`] of them.
pub fn check_artifact_paths(paths: &[String]) -> Result<(), EngineError> {
    if paths.len() > MAX_ARTIFACTS {
        return Err(EngineError::Invalid(format!(
            "at most {MAX_ARTIFACTS} artifact paths may be declared, not {}",
            paths.len()
        )));
    }
    for p in paths {
        let bad = |why: &str| {
            EngineError::Invalid(format!(
                "artifact path `{}` is invalid: {why}",
                p.chars().take(128).collect::<String>().escape_debug()
            ))
        };
        if !p.starts_with('/') {
            return Err(bad("it must be absolute"));
        }
        if p.len() > MAX_PATH_BYTES || p.contains('\0') {
            return Err(bad("it is too long or holds a NUL byte"));
        }
        if p.split('/').any(|c| c == "..") {
            return Err(bad("it must not contain `..`"));
        }
        if p.split('/').all(str::is_empty) {
            return Err(bad("`/` itself cannot be an artifact"));
        }
    }
    Ok(())
}

/// A file name for an artifact from its declared path: the last component,
/// with anything outside `[A-Za-z0-9._-]` turned into `_`, no leading dot,
/// made unique among `taken`.
pub(crate) fn artifact_name(path: &str, suffix: &str, taken: &mut BTreeSet<String>) -> String {
    let last = path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("root");
    let clean: String = last
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let clean = clean.trim_start_matches('.');
    let base = if clean.is_empty() { "artifact" } else { clean };
    let mut name = format!("{base}{suffix}");
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("{base}-{n}{suffix}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// One collection: the sandbox's view, where to store, and the caps.
pub struct Collector<'a> {
    pub fs: &'a SandboxFs,
    pub store: &'a ArtifactStore,
    pub id: &'a SandboxId,
    pub caps: Caps,
    pub now_ms: u64,
    /// Bytes stored so far by this collection.
    pub used: u64,
    pub taken: BTreeSet<String>,
}

impl Collector<'_> {
    /// Collects `path` as `kind_hint` (`patch` for the workspace's patch;
    /// otherwise what the path is decides). Never fails for what the
    /// sandbox did: a missing path, a symlink or an oversized tree is an
    /// artifact recorded as skipped. Only the host store failing is an error.
    pub fn collect(
        &mut self,
        path: &str,
        name: Option<&str>,
        shown: &str,
        patch: bool,
    ) -> Result<ArtifactInfo, ArtifactError> {
        let mut info = ArtifactInfo {
            name: String::new(),
            path: shown.to_owned(),
            kind: "file".into(),
            status: ArtifactStatus::Skipped,
            size: 0,
            sha256: String::new(),
            collected_at: self.now_ms,
            reason: None,
        };
        let skip = |mut info: ArtifactInfo, why: String| {
            info.reason = Some(why);
            Ok(info)
        };
        let stat = match self.fs.stat(path) {
            Ok(s) => s,
            Err(e) => {
                info.name = artifact_name(path, "", &mut self.taken);
                return skip(info, e.to_string());
            }
        };
        let dir = stat.kind == FileKind::Dir && !patch;
        if dir {
            info.kind = "dir".into();
        } else if patch {
            info.kind = "patch".into();
        }
        info.name = match name {
            Some(n) => {
                self.taken.insert(n.to_owned());
                n.to_owned()
            }
            None => artifact_name(path, if dir { ".tar" } else { "" }, &mut self.taken),
        };
        let left = self.caps.per_sandbox.saturating_sub(self.used);
        let cap = self.caps.per_artifact.min(left);
        match stat.kind {
            FileKind::Symlink => {
                return skip(
                    info,
                    format!("`{shown}` is a symlink; artifact paths are never followed"),
                )
            }
            FileKind::File | FileKind::Dir => {}
            FileKind::Other => return skip(info, format!("`{shown}` is not a regular file")),
        }
        if stat.kind == FileKind::File && stat.size > cap {
            return skip(info, over_cap(shown, Some(stat.size), cap, &self.caps));
        }
        let mut out = self.store.pending(self.id)?;
        let copied = if dir {
            let limits = FsLimits {
                max_file_bytes: cap,
                max_archive_bytes: cap,
                ..FsLimits::default()
            };
            self.fs.download_tar_to(path, &mut out, limits).map(|_| ())
        } else {
            self.fs.copy_file_to(path, &mut out, cap).map(|_| ())
        };
        // Tar headers count too: the stored bytes must fit the cap.
        let result = match copied {
            Ok(()) if out.written() > cap => Err(over_cap(shown, None, cap, &self.caps)),
            Ok(()) if stat.kind == FileKind::File && out.written() >= cap && stat.size < cap => {
                Err(over_cap(shown, None, cap, &self.caps))
            }
            Ok(()) => Ok(()),
            Err(
                FilesError::TooLarge { .. }
                | FilesError::ArchiveTooLarge { .. }
                | FilesError::ArchiveTooManyEntries { .. },
            ) => Err(over_cap(shown, None, cap, &self.caps)),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(()) => {
                let (size, sha) = out.commit(&info.name)?;
                self.used += size;
                info.size = size;
                info.sha256 = sha;
                info.status = ArtifactStatus::Complete;
                Ok(info)
            }
            Err(why) => {
                out.discard();
                skip(info, why)
            }
        }
    }
}

fn over_cap(shown: &str, size: Option<u64>, cap: u64, caps: &Caps) -> String {
    let what = match size {
        Some(s) => format!("`{shown}` is {s} bytes"),
        None => format!("`{shown}` grew or packs"),
    };
    format!(
        "{what}, over the cap of {cap} bytes left for it (per artifact {}, per sandbox {})",
        caps.per_artifact, caps.per_sandbox
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_paths_must_be_absolute_and_plain() {
        assert!(check_artifact_paths(&["/workspace/out.log".into(), "/tmp/d/".into()]).is_ok());
        for bad in ["rel/x", "/a/../etc", "/", "//", "/a\0b", ""] {
            assert!(
                check_artifact_paths(&[bad.into()]).is_err(),
                "{bad:?} accepted"
            );
        }
        let many: Vec<String> = (0..=MAX_ARTIFACTS).map(|i| format!("/f{i}")).collect();
        assert!(check_artifact_paths(&many).is_err());
    }

    #[test]
    fn names_are_plain_and_unique() {
        let mut taken = BTreeSet::new();
        assert_eq!(artifact_name("/a/out.log", "", &mut taken), "out.log");
        assert_eq!(artifact_name("/b/out.log", "", &mut taken), "out.log-2");
        assert_eq!(artifact_name("/w/dir/", ".tar", &mut taken), "dir.tar");
        assert_eq!(artifact_name("/w/.hidden x", "", &mut taken), "hidden_x");
        assert_eq!(artifact_name("/w/..", "", &mut taken), "artifact");
    }
}
