//! Deciding what one tar entry of an image layer becomes (pure).
//!
//! A layer is streamed, so it is planned entry by entry: [`Planner::plan`]
//! sees each header in order, keeps what earlier entries left at each path,
//! and returns the steps to carry out, touching nothing. The rules:
//!
//! * paths are relative with no `..` (the upload parser's
//!   [`entry_path`](crate::files::tar_plan::entry_path)); `./` is the layer
//!   root;
//! * no entry may go through an earlier non-directory of the same layer
//!   (`a -> /etc` then `a/passwd`), and the applier walks with
//!   `RESOLVE_NO_SYMLINKS`, so nothing is ever written through a symlink;
//! * symlink targets are not checked: they are data, resolved inside the
//!   sandbox's root (where absolute targets are normal), never by Mayfly;
//! * a hard link must name an earlier regular file of the same layer;
//! * `.wh.NAME` becomes an overlay whiteout `NAME`, and `.wh..wh..opq` marks
//!   its directory opaque. A whiteout of a name this layer already created
//!   is dropped (OCI: whiteouts only hide lower layers). Other `.wh..wh.`
//!   names (AUFS bookkeeping) are skipped; a `.wh.` name used as a directory
//!   is an error;
//! * device nodes and FIFOs are **skipped** (counted, not created): the
//!   sandbox gets its own `/dev`, and the only character devices in the
//!   store are whiteouts. Sparse files and unknown types are errors;
//! * owners are kept when below 65536, the range a sandbox maps; larger ids
//!   become 65534 (`nobody`). Setuid and setgid bits are kept: they only
//!   ever act inside the sandbox's user namespace;
//! * entries (with implied directories), data bytes and depth are capped.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tar::EntryType;

use crate::files::tar_plan::entry_path;

/// Caps on one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: u64,
    pub max_bytes: u64,
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 1_000_000,
            max_bytes: 64 << 30,
            max_depth: 128,
        }
    }
}

/// The id an out-of-range owner becomes.
pub const NOBODY: u32 = 65534;

/// An owner inside the sandbox's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// One tar header, as the planner needs it.
#[derive(Debug, Clone)]
pub struct Header<'a> {
    pub path: &'a [u8],
    pub kind: EntryType,
    pub link: Option<&'a [u8]>,
    pub size: u64,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: Option<i64>,
}

/// What to do below the layer's staging directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create (or, when it exists, update) a directory; an existing
    /// whiteout there is replaced.
    Dir {
        path: PathBuf,
        owner: Owner,
        mode: u32,
        mtime: Option<i64>,
    },
    /// Create a regular file from the entry's data.
    File {
        path: PathBuf,
        owner: Owner,
        mode: u32,
        mtime: Option<i64>,
    },
    Symlink {
        path: PathBuf,
        target: PathBuf,
        owner: Owner,
        mtime: Option<i64>,
    },
    HardLink {
        path: PathBuf,
        target: PathBuf,
    },
    Whiteout {
        path: PathBuf,
    },
    Opaque {
        dir: PathBuf,
    },
}

/// Why an entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("entry `{entry}` is refused: {reason}")]
    BadEntry { entry: String, reason: &'static str },
    #[error("the layer has more than {limit} entries")]
    TooManyEntries { limit: u64 },
    #[error("the layer holds more than {limit} bytes of file data")]
    TooLarge { limit: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File,
    /// A symlink or a hard link's second name: never a parent.
    Other,
    Whiteout,
}

/// The state of one layer's plan.
#[derive(Debug, Default)]
pub struct Planner {
    limits: Limits,
    nodes: HashMap<PathBuf, Node>,
    entries: u64,
    bytes: u64,
    /// Device nodes and FIFOs left out.
    pub skipped: u64,
}

const WH: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
const META: &[u8] = b".wh..wh.";

impl Planner {
    pub fn new(limits: Limits) -> Self {
        Planner {
            limits,
            ..Planner::default()
        }
    }

    /// The steps for one entry, implied parent directories first. Skipped
    /// entries give none.
    pub fn plan(&mut self, h: &Header<'_>) -> Result<Vec<Step>, PlanError> {
        let reject = |reason| PlanError::BadEntry {
            entry: String::from_utf8_lossy(h.path).chars().take(200).collect(),
            reason,
        };
        let node = match h.kind {
            EntryType::Regular | EntryType::Continuous => Node::File,
            EntryType::Link => Node::Other,
            EntryType::Directory => Node::Dir,
            EntryType::Symlink => Node::Other,
            EntryType::XGlobalHeader => return Ok(Vec::new()),
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                self.skipped += 1;
                return Ok(Vec::new());
            }
            EntryType::GNUSparse => return Err(reject("sparse files are not supported")),
            _ => return Err(reject("its entry type is not supported")),
        };
        let path = entry_path(h.path).map_err(reject)?;
        if path.components().count() > self.limits.max_depth {
            return Err(reject("it is nested too deeply"));
        }
        let names: Vec<&[u8]> = path.iter().map(|c| c.as_bytes()).collect();
        if let Some((_, dirs)) = names.split_last() {
            if dirs.iter().any(|d| d.starts_with(META)) {
                self.skipped += 1;
                return Ok(Vec::new());
            }
            if dirs.iter().any(|d| d.starts_with(WH)) {
                return Err(reject("a whiteout name is used as a directory"));
            }
        }
        let mut steps = Vec::new();
        let Some(last) = names.last().copied() else {
            // `./`: the layer root, which exists; keep its mode and owner.
            if node != Node::Dir {
                return Err(reject("it names the layer root but is not a directory"));
            }
            self.count(1)?;
            steps.push(Step::Dir {
                path,
                owner: owner(h),
                mode: h.mode & 0o7777,
                mtime: h.mtime,
            });
            return Ok(steps);
        };
        let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
        if last == OPAQUE {
            self.parents(&path, &mut steps, &reject)?;
            if parent.as_os_str().is_empty() {
                // The layer root is an overlay's lower root, where the
                // kernel ignores the opaque mark; nothing to do.
                return Ok(steps);
            }
            self.count(1)?;
            steps.push(Step::Opaque { dir: parent });
            return Ok(steps);
        }
        if last.starts_with(META) {
            self.skipped += 1;
            return Ok(steps);
        }
        if let Some(name) = last.strip_prefix(WH) {
            if name.is_empty() || name == b"." || name == b".." {
                return Err(reject("it whites out no valid name"));
            }
            self.parents(&path, &mut steps, &reject)?;
            let target = parent.join(OsStr::from_bytes(name));
            if self.nodes.contains_key(&target) {
                // Created by this very layer: a whiteout only hides lower ones.
                return Ok(steps);
            }
            self.count(1)?;
            self.nodes.insert(target.clone(), Node::Whiteout);
            steps.push(Step::Whiteout { path: target });
            return Ok(steps);
        }
        self.parents(&path, &mut steps, &reject)?;
        match (self.nodes.get(&path), node) {
            (Some(Node::Dir), n) if n != Node::Dir => {
                return Err(reject("it replaces an earlier directory of the layer"))
            }
            (Some(Node::File | Node::Other), Node::Dir) => {
                return Err(reject("it turns an earlier entry into a directory"))
            }
            _ => {}
        }
        let owner = owner(h);
        let mode = h.mode & 0o7777;
        let step = match h.kind {
            EntryType::Directory => Step::Dir {
                path: path.clone(),
                owner,
                mode,
                mtime: h.mtime,
            },
            EntryType::Symlink => {
                let target = h.link.ok_or_else(|| reject("the symlink has no target"))?;
                if target.is_empty() || target.contains(&0) || target.len() > 4096 {
                    return Err(reject("the symlink target is empty or malformed"));
                }
                Step::Symlink {
                    path: path.clone(),
                    target: PathBuf::from(OsStr::from_bytes(target)),
                    owner,
                    mtime: h.mtime,
                }
            }
            EntryType::Link => {
                let target = h
                    .link
                    .ok_or_else(|| reject("the hard link has no target"))?;
                let target = entry_path(target).map_err(reject)?;
                if self.nodes.get(&target) != Some(&Node::File) || target == path {
                    return Err(reject(
                        "a hard link must name an earlier file of the same layer",
                    ));
                }
                Step::HardLink {
                    path: path.clone(),
                    target,
                }
            }
            _ => {
                self.bytes = self.bytes.saturating_add(h.size);
                if self.bytes > self.limits.max_bytes {
                    return Err(PlanError::TooLarge {
                        limit: self.limits.max_bytes,
                    });
                }
                Step::File {
                    path: path.clone(),
                    owner,
                    mode,
                    mtime: h.mtime,
                }
            }
        };
        self.count(1)?;
        self.nodes.insert(path, node);
        steps.push(step);
        Ok(steps)
    }

    /// Missing parents become directories; none may be an earlier
    /// non-directory (a whiteout is replaced by the directory).
    fn parents(
        &mut self,
        path: &Path,
        steps: &mut Vec<Step>,
        reject: &dyn Fn(&'static str) -> PlanError,
    ) -> Result<(), PlanError> {
        let mut parent = PathBuf::new();
        let Some(dirs) = path.parent() else {
            return Ok(());
        };
        for comp in dirs.components() {
            parent.push(comp);
            match self.nodes.get(&parent) {
                Some(Node::Dir) => {}
                Some(Node::File | Node::Other) => {
                    return Err(reject(
                        "it lies under an earlier entry that is not a directory",
                    ))
                }
                Some(Node::Whiteout) | None => {
                    self.count(1)?;
                    self.nodes.insert(parent.clone(), Node::Dir);
                    steps.push(Step::Dir {
                        path: parent.clone(),
                        owner: Owner { uid: 0, gid: 0 },
                        mode: 0o755,
                        mtime: None,
                    });
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, n: u64) -> Result<(), PlanError> {
        self.entries += n;
        if self.entries > self.limits.max_entries {
            return Err(PlanError::TooManyEntries {
                limit: self.limits.max_entries,
            });
        }
        Ok(())
    }
}

/// Ids below 65536 are kept; others become `nobody`.
fn owner(h: &Header<'_>) -> Owner {
    let map = |id: u64| {
        u32::try_from(id)
            .ok()
            .filter(|id| *id < 65536)
            .unwrap_or(NOBODY)
    };
    Owner {
        uid: map(h.uid),
        gid: map(h.gid),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
