//! The content-addressed layer store: `<root>/sha256/<hex>/`, each layer a
//! directory tree made once in a private staging directory and renamed into
//! place, then only ever read.

use std::collections::BTreeSet;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::ImageError;

/// The layer store.
#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
}

/// A layer being made: a private directory renamed into the store on commit,
/// removed if dropped uncommitted.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    dest: PathBuf,
    done: bool,
}

/// What a garbage collection removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed: Vec<String>,
    pub freed_bytes: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The hex part of a valid key.
fn hex_of(key: &str) -> Result<&str, ImageError> {
    match key.strip_prefix("sha256:") {
        Some(h)
            if h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(h)
        }
        _ => Err(ImageError::BadKey(key.chars().take(80).collect())),
    }
}

impl LayerStore {
    /// Opens (making it, mode 0700) the store at `root`.
    pub fn open(root: &Path) -> Result<LayerStore, ImageError> {
        for d in [root.to_path_buf(), root.join("sha256"), root.join("tmp")] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .map_err(io(&d))?;
        }
        Ok(LayerStore {
            root: root.to_path_buf(),
        })
    }

    /// The store at `root`, without touching the disk (for reading paths).
    pub fn at(root: &Path) -> LayerStore {
        LayerStore {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a layer lives (whether or not it is there).
    pub fn path(&self, key: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("sha256").join(hex_of(key)?))
    }

    /// Whether a complete layer is in the store.
    pub fn contains(&self, key: &str) -> bool {
        self.path(key).is_ok_and(|p| p.is_dir())
    }

    /// Starts making a layer.
    pub fn begin(&self, key: &str) -> Result<Staging, ImageError> {
        let dest = self.path(key)?;
        let mut rnd = [0u8; 8];
        getrandom::fill(&mut rnd).map_err(|e| ImageError::Io {
            path: self.root.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let name = format!(
            "{}-{}-{}",
            hex_of(key)?,
            std::process::id(),
            rnd.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let dir = self.root.join("tmp").join(name);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&dir)
            .map_err(io(&dir))?;
        Ok(Staging {
            dir,
            dest,
            done: false,
        })
    }

    /// Bytes used by a layer (0 when absent).
    pub fn size(&self, key: &str) -> u64 {
        self.path(key)
            .ok()
            .and_then(|p| {
                let limits = mayfly_sys::du::WalkLimits {
                    max_entries: 10_000_000,
                    max_depth: 512,
                    max_time: std::time::Duration::from_secs(30),
                };
                mayfly_sys::du::disk_usage(&p, &limits).ok()
            })
            .map(|u| u.bytes)
            .unwrap_or(0)
    }

    /// Removes every layer not in `keep`, and staging directories left by
    /// builders that died.
    pub fn gc(&self, keep: &BTreeSet<String>) -> Result<GcReport, ImageError> {
        let mut report = GcReport::default();
        let dir = self.root.join("sha256");
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let key = format!("sha256:{}", entry.file_name().to_string_lossy());
            if keep.contains(&key) {
                continue;
            }
            let size = self.size(&key);
            let p = entry.path();
            remove_tree(&p).map_err(io(&p))?;
            report.freed_bytes += size;
            report.removed.push(key);
        }
        let tmp = self.root.join("tmp");
        for entry in std::fs::read_dir(&tmp).map_err(io(&tmp))? {
            let entry = entry.map_err(io(&tmp))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = remove_tree(&entry.path());
            }
        }
        Ok(report)
    }
}

/// Removes a tree, making read-only directories writable first.
fn remove_tree(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl Staging {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Renames the layer into the store. A layer another builder committed
    /// first is kept (layers with one key are the same content).
    pub fn commit(mut self) -> Result<PathBuf, ImageError> {
        self.done = true;
        match std::fs::rename(&self.dir, &self.dest) {
            Ok(()) => Ok(self.dest.clone()),
            Err(_) if self.dest.is_dir() => {
                let _ = remove_tree(&self.dir);
                Ok(self.dest.clone())
            }
            Err(e) => {
                let _ = remove_tree(&self.dir);
                Err(ImageError::Io {
                    path: self.dest.clone(),
                    source: e,
                })
            }
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            let _ = remove_tree(&self.dir);
        }
    }
}
