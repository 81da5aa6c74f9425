//! The content-addressed layer store: `<root>/sha256/<hex>/` per layer.
//!
//! A layer is unpacked once, into a private staging directory below
//! `<root>/tmp/`, and renamed into place only when complete, so a directory
//! under `sha256/` is always a whole layer (the rename is atomic; a
//! concurrent builder that loses the race throws its copy away). Staging
//! and download names carry the builder's pid, so [`LayerStore::gc`] can
//! remove what a dead builder left. The root is mode 0700: only host root
//! reaches the layers, which sandboxes see through idmapped mounts.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use mayfly_sys::fs::{self as sysfs, FsError, Replace};

use super::digest::check_key;
use super::ImageError;

/// The layer store.
#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
}

/// A layer being unpacked; dropping it removes the directory.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    dest: PathBuf,
    done: bool,
}

/// A downloaded blob waiting to be unpacked; dropping it removes the file.
#[derive(Debug)]
pub struct TempBlob {
    pub path: PathBuf,
}

/// What [`LayerStore::gc`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed: Vec<String>,
    pub freed_bytes: u64,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.to_path_buf();
    move |source| ImageError::Io { op, path, source }
}

impl LayerStore {
    /// The store at `root`, without touching the disk (for reading paths).
    pub fn at(root: &Path) -> LayerStore {
        LayerStore {
            root: root.to_path_buf(),
        }
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Opens (creating when missing) the store at `root`.
    pub fn open(root: &Path) -> Result<LayerStore, ImageError> {
        for dir in [root.to_path_buf(), root.join("sha256"), root.join("tmp")] {
            match fs::DirBuilder::new().mode(0o700).create(&dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(io_err("create", &dir)(e))
                }
                _ => {}
            }
        }
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))
            .map_err(io_err("set the mode of", root))?;
        Ok(LayerStore {
            root: root.to_path_buf(),
        })
    }

    /// Where layer `key` (`sha256:<64 lowercase hex>`) lives.
    pub fn path(&self, key: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("sha256").join(check_key(key)?))
    }

    /// Whether layer `key` is complete in the store.
    pub fn contains(&self, key: &str) -> bool {
        self.path(key)
            .and_then(|p| fs::symlink_metadata(&p).map_err(io_err("stat", &p)))
            .is_ok_and(|m| m.is_dir())
    }

    /// A fresh private directory to unpack layer `key` into.
    pub fn begin(&self, key: &str) -> Result<Staging, ImageError> {
        let dest = self.path(key)?;
        let dir = self.temp_name(key, "")?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("create", &dir))?;
        Ok(Staging {
            dir,
            dest,
            done: false,
        })
    }

    /// A fresh file name for downloading blob `key` before it is unpacked.
    pub fn temp_blob(&self, key: &str) -> Result<TempBlob, ImageError> {
        Ok(TempBlob {
            path: self.temp_name(key, ".blob")?,
        })
    }

    fn temp_name(&self, key: &str, suffix: &str) -> Result<PathBuf, ImageError> {
        let hex = check_key(key)?;
        let mut rand = [0u8; 6];
        getrandom::fill(&mut rand).map_err(|e| ImageError::Io {
            op: "draw a random name in",
            path: self.root.clone(),
            source: io::Error::other(e.to_string()),
        })?;
        let name = format!(
            "{}-{}-{}{suffix}",
            &hex[..16],
            std::process::id(),
            hex::encode(rand)
        );
        Ok(self.root.join("tmp").join(name))
    }

    /// Bytes layer `key` takes on disk (hard links counted once); 0 when
    /// it is not in the store.
    pub fn size(&self, key: &str) -> u64 {
        self.path(key).map(|p| disk_usage(&p)).unwrap_or(0)
    }

    /// Removes every layer not in `keep`, and staging or download leftovers
    /// of builders that are no longer running.
    pub fn gc(&self, keep: &BTreeSet<String>) -> Result<GcReport, ImageError> {
        let mut report = GcReport::default();
        let layers = self.root.join("sha256");
        for entry in fs::read_dir(&layers).map_err(io_err("list", &layers))? {
            let entry = entry.map_err(io_err("list", &layers))?;
            let key = format!("sha256:{}", entry.file_name().to_string_lossy());
            if keep.contains(&key) {
                continue;
            }
            // Out of sight first (atomic), then removed at leisure.
            let doomed = self.temp_name(&key, ".gc").unwrap_or_else(|_| {
                self.root
                    .join("tmp")
                    .join(format!("bad-0-{}", entry.file_name().to_string_lossy()))
            });
            let freed = disk_usage(&entry.path());
            fs::rename(entry.path(), &doomed).map_err(io_err("remove", &entry.path()))?;
            remove_any(&doomed)?;
            report.removed.push(key);
            report.freed_bytes += freed;
        }
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(io_err("list", &tmp))? {
            let entry = entry.map_err(io_err("list", &tmp))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').nth(1).and_then(|p| p.parse::<i32>().ok());
            if pid.is_none_or(|p| !alive(p)) {
                report.freed_bytes += disk_usage(&entry.path());
                remove_any(&entry.path())?;
            }
        }
        Ok(report)
    }
}

impl Staging {
    /// The directory to unpack into (it becomes the layer's root).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves the complete layer into place and returns its path. When a
    /// concurrent builder committed the same layer first, its copy wins and
    /// this one is removed: both are the same content.
    pub fn commit(mut self) -> Result<PathBuf, ImageError> {
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o755))
            .map_err(io_err("set the mode of", &self.dir))?;
        let fs_err = |path: &Path| {
            let path = path.to_path_buf();
            move |e: FsError| ImageError::Io {
                op: "move into place",
                path,
                source: io::Error::other(e),
            }
        };
        let (from_dir, from) = split(&self.dir);
        let (to_dir, to) = split(&self.dest);
        let from_fd = sysfs::open_host_dir(from_dir).map_err(fs_err(from_dir))?;
        let to_fd = sysfs::open_host_dir(to_dir).map_err(fs_err(to_dir))?;
        match sysfs::rename_at(&from_fd, from, &to_fd, to, Replace::Never) {
            Ok(()) => self.done = true,
            // A concurrent builder committed the same content first.
            Err(FsError::AlreadyExists { .. } | FsError::NotEmpty { .. }) => {}
            Err(e) => return Err(fs_err(&self.dest)(e)),
        }
        Ok(self.dest.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            let _ = remove_any(&self.dir);
        }
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Removes a file or a whole tree (never following symlinks).
fn remove_any(path: &Path) -> Result<(), ImageError> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(io_err("remove", path))
}

/// Whether process `pid` still exists (a reused pid keeps its leftovers
/// until that process is gone too, which is harmless).
fn alive(pid: i32) -> bool {
    pid > 0 && Path::new("/proc").join(pid.to_string()).exists()
}

/// A path's parent and final name.
fn split(path: &Path) -> (&Path, &Path) {
    (
        path.parent().unwrap_or(Path::new("/")),
        Path::new(path.file_name().unwrap_or_default()),
    )
}

/// Allocated bytes below `path`, not following symlinks, each inode once.
fn disk_usage(path: &Path) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = fs::symlink_metadata(&p) else {
            continue;
        };
        if !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        total += m.blocks() * 512;
        if m.is_dir() {
            if let Ok(rd) = fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn only_committed_layers_count_and_drop_removes_staging() {
        let t = tempfile::tempdir().unwrap();
        let store = LayerStore::open(&t.path().join("layers")).unwrap();
        let mode = fs::metadata(t.path().join("layers")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let s = store.begin(&key('a')).unwrap();
        fs::write(s.dir().join("f"), b"x").unwrap();
        let staged = s.dir().to_path_buf();
        assert!(!store.contains(&key('a')));
        drop(s);
        assert!(!staged.exists());
        let s = store.begin(&key('a')).unwrap();
        fs::write(s.dir().join("f"), b"x").unwrap();
        let p = s.commit().unwrap();
        assert!(store.contains(&key('a')));
        assert_eq!(fs::read(p.join("f")).unwrap(), b"x");
        assert!(store.size(&key('a')) > 0);
        // A second builder of the same layer loses the race quietly.
        let s = store.begin(&key('a')).unwrap();
        let loser = s.dir().to_path_buf();
        assert_eq!(s.commit().unwrap(), p);
        assert!(!loser.exists());
    }

    #[test]
    fn keys_are_validated() {
        let t = tempfile::tempdir().unwrap();
        let store = LayerStore::open(t.path()).unwrap();
        for bad in ["sha256:../../etc", "sha256:AA", "md5:abc", ""] {
            assert!(store.path(bad).is_err());
            assert!(store.begin(bad).is_err());
            assert!(!store.contains(bad));
        }
    }

    #[test]
    fn gc_keeps_what_is_asked_and_removes_dead_builders_leftovers() {
        let t = tempfile::tempdir().unwrap();
        let store = LayerStore::open(t.path()).unwrap();
        for c in ['a', 'b'] {
            let s = store.begin(&key(c)).unwrap();
            fs::write(s.dir().join("f"), vec![0u8; 10_000]).unwrap();
            s.commit().unwrap();
        }
        let dead = t.path().join("tmp").join("0123-2147483646-00");
        fs::create_dir(&dead).unwrap();
        let live = store.begin(&key('c')).unwrap();
        let report = store.gc(&[key('a')].into()).unwrap();
        assert_eq!(report.removed, vec![key('b')]);
        assert!(report.freed_bytes >= 10_000);
        assert!(store.contains(&key('a')) && !store.contains(&key('b')));
        assert!(!dead.exists());
        assert!(live.dir().exists());
    }
}
