//! Inside-sandbox paths, validated and lexically normalised.
//!
//! Absolute paths are taken as given; relative ones are interpreted against
//! [`WORKDIR`], the sandbox's default working directory. `.` and empty
//! components are dropped and `..` is applied lexically, clamped at `/`,
//! the same way `RESOLVE_IN_ROOT` clamps it. Lexical `..` means `a/link/..`
//! is `a` even when `link` is a symlink; that is the rule of `docker cp`
//! too, and it lets every operation know its final component up front. The
//! kernel still resolves every remaining component, so normalisation is a
//! convenience, not the confinement.

use std::fmt;
use std::path::{Path, PathBuf};

use super::FilesError;

/// Where relative paths start.
pub const WORKDIR: &str = "/workspace";
/// The longest path accepted, as `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;
/// The longest single name, as `NAME_MAX`.
pub const MAX_NAME_BYTES: usize = 255;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SandboxPath {
    parts: Vec<String>,
}

impl SandboxPath {
    pub(crate) fn parse(input: &str) -> Result<Self, FilesError> {
        let bad = |reason| FilesError::InvalidPath {
            path: input.chars().take(200).collect(),
            reason,
        };
        if input.is_empty() {
            return Err(bad("it is empty"));
        }
        if input.len() > MAX_PATH_BYTES {
            return Err(bad("it is longer than 4096 bytes"));
        }
        if input.contains('\0') {
            return Err(bad("it contains a NUL byte"));
        }
        let full = if input.starts_with('/') {
            input.to_owned()
        } else {
            format!("{WORKDIR}/{input}")
        };
        let mut parts: Vec<String> = Vec::new();
        for part in full.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                name if name.len() > MAX_NAME_BYTES => {
                    return Err(bad("a component is longer than 255 bytes"))
                }
                name => parts.push(name.to_owned()),
            }
        }
        Ok(SandboxPath { parts })
    }

    /// The path relative to the root descriptor (`.` for the root).
    pub(crate) fn rel(&self) -> PathBuf {
        rel_of(&self.parts)
    }

    /// The parent relative to the root descriptor, and the final name; `None`
    /// for the root itself.
    pub(crate) fn split(&self) -> Option<(PathBuf, &str)> {
        let (name, parent) = self.parts.split_last()?;
        Some((rel_of(parent), name.as_str()))
    }

    pub(crate) fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The final name, or `None` for the root.
    pub(crate) fn name(&self) -> Option<&str> {
        self.parts.last().map(String::as_str)
    }

    /// Whether `self` is `other` or lies below it.
    pub(crate) fn starts_with(&self, other: &SandboxPath) -> bool {
        self.parts.starts_with(&other.parts)
    }
}

fn rel_of(parts: &[String]) -> PathBuf {
    if parts.is_empty() {
        PathBuf::from(".")
    } else {
        parts.iter().map(Path::new).collect()
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parts.is_empty() {
            return f.write_str("/");
        }
        for part in &self.parts {
            write!(f, "/{part}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        SandboxPath::parse(s).unwrap().to_string()
    }

    #[test]
    fn relative_paths_start_at_the_workspace() {
        assert_eq!(norm("src/main.rs"), "/workspace/src/main.rs");
        assert_eq!(norm("."), "/workspace");
        assert_eq!(norm("/etc/hosts"), "/etc/hosts");
    }

    #[test]
    fn dotdot_is_clamped_at_the_root() {
        assert_eq!(norm("../../etc/passwd"), "/etc/passwd");
        assert_eq!(norm("/../../../x"), "/x");
        assert_eq!(norm("/a/./b//../c/"), "/a/c");
        assert!(SandboxPath::parse("/..").unwrap().parts().is_empty());
    }

    #[test]
    fn empty_nul_and_overlong_paths_are_rejected() {
        for bad in [
            String::new(),
            "a\0b".to_owned(),
            "a/".repeat(2049),
            format!("/{}", "n".repeat(256)),
        ] {
            let err = SandboxPath::parse(&bad).unwrap_err();
            assert_eq!(
                err.code(),
                mayfly_types::ErrorCode::InvalidArgument,
                "{bad:.20}"
            );
        }
    }

    #[test]
    fn split_gives_the_parent_relative_to_the_root_and_the_name() {
        let p = SandboxPath::parse("/a/b/c").unwrap();
        assert_eq!(p.split(), Some((PathBuf::from("a/b"), "c")));
        let p = SandboxPath::parse("/a").unwrap();
        assert_eq!(p.split(), Some((PathBuf::from("."), "a")));
        assert_eq!(SandboxPath::parse("/").unwrap().split(), None);
        assert_eq!(SandboxPath::parse("/").unwrap().rel(), PathBuf::from("."));
    }
}
