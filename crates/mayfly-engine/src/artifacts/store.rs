//! The artifact store on disk:
//!
//! ```text
//! <state>/artifacts/<sandbox-id>/files/<name>    one file per artifact
//! <state>/artifacts/<sandbox-id>/manifest.json   written last
//! ```
//!
//! Each file is written under a temporary name (`.tmp-…`) in the same
//! directory, fsynced, renamed, and the directory fsynced; the manifest is
//! written the same way after every artifact is in place. A directory
//! without a manifest is a collection that never finished (a crash): the
//! startup sweep removes it, and nothing lists it meanwhile.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use mayfly_types::{ArtifactInfo, ArtifactList, SandboxId};
use sha2::{Digest as _, Sha256};

use super::retention::StoredSet;

pub const MANIFEST: &str = "manifest.json";
const FILES: &str = "files";
const TMP_PREFIX: &str = ".tmp-";

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("writing artifacts at {path} failed")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the artifact manifest at {path} is unreadable")]
    BadManifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The artifact store under one root directory.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    root: PathBuf,
}

/// A file being written: bytes go to a temporary file and into a SHA-256.
pub struct Pending {
    dir: PathBuf,
    tmp: PathBuf,
    file: File,
    hash: Sha256,
    written: u64,
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hash.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Pending {
    pub fn written(&self) -> u64 {
        self.written
    }

    /// fsyncs the data, renames it to `name` and fsyncs the directory.
    /// Returns the size and the hex SHA-256.
    pub fn commit(self, name: &str) -> Result<(u64, String), ArtifactError> {
        self.file.sync_all().map_err(io_err(&self.tmp))?;
        let target = self.dir.join(name);
        fs::rename(&self.tmp, &target).map_err(io_err(&target))?;
        sync_dir(&self.dir)?;
        Ok((self.written, hex(&self.hash.finalize())))
    }

    /// Removes the temporary file.
    pub fn discard(self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

impl ArtifactStore {
    pub fn new(root: PathBuf) -> Self {
        ArtifactStore { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.root.join(id.to_string())
    }

    fn files_dir(&self, id: &SandboxId) -> PathBuf {
        self.sandbox_dir(id).join(FILES)
    }

    /// Starts a sandbox's collection: its directory, emptied of anything a
    /// previous, interrupted collection left.
    pub fn begin(&self, id: &SandboxId) -> Result<(), ArtifactError> {
        let dir = self.sandbox_dir(id);
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
        }
        let files = self.files_dir(id);
        fs::create_dir_all(&files).map_err(io_err(&files))?;
        Ok(())
    }

    /// A new temporary file in the sandbox's files directory.
    pub fn pending(&self, id: &SandboxId) -> Result<Pending, ArtifactError> {
        let dir = self.files_dir(id);
        let tmp = dir.join(format!("{TMP_PREFIX}{}", random_suffix()));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        Ok(Pending {
            dir,
            tmp,
            file,
            hash: Sha256::new(),
            written: 0,
        })
    }

    /// Writes the manifest, last, atomically: from now on the collection
    /// counts as complete.
    pub fn finish(&self, list: &ArtifactList) -> Result<(), ArtifactError> {
        let dir = self.sandbox_dir(&list.sandbox);
        let tmp = dir.join(format!("{TMP_PREFIX}{}", random_suffix()));
        let data = serde_json::to_vec_pretty(list).map_err(|e| ArtifactError::Io {
            path: tmp.clone(),
            source: io::Error::other(e),
        })?;
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(&data).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        let target = dir.join(MANIFEST);
        fs::rename(&tmp, &target).map_err(io_err(&target))?;
        sync_dir(&dir)?;
        sync_dir(&self.root)
    }

    /// A sandbox's manifest; `None` when it has none (never collected,
    /// removed by retention, or interrupted).
    pub fn manifest(&self, id: &SandboxId) -> Result<Option<ArtifactList>, ArtifactError> {
        let path = self.sandbox_dir(id).join(MANIFEST);
        match fs::read(&path) {
            Ok(data) => serde_json::from_slice(&data)
                .map(Some)
                .map_err(|source| ArtifactError::BadManifest { path, source }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Opens a complete artifact of the manifest for reading.
    pub fn open(&self, id: &SandboxId, info: &ArtifactInfo) -> Result<File, ArtifactError> {
        let path = self.files_dir(id).join(&info.name);
        File::open(&path).map_err(io_err(&path))
    }

    /// Removes a sandbox's artifacts: the manifest first, so a crash
    /// halfway leaves an unlisted directory the sweep removes.
    pub fn remove(&self, id: &str) -> Result<(), ArtifactError> {
        let dir = self.root.join(id);
        let manifest = dir.join(MANIFEST);
        match fs::remove_file(&manifest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&manifest)(e)),
        }
        fs::remove_dir_all(&dir).map_err(io_err(&dir))
    }

    /// Every complete collection, for retention.
    pub fn stored_sets(&self) -> Result<Vec<StoredSet>, ArtifactError> {
        let mut sets = Vec::new();
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(sets),
            Err(e) => return Err(io_err(&self.root)(e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(id) = name.parse::<SandboxId>() else {
                continue;
            };
            if let Ok(Some(m)) = self.manifest(&id) {
                sets.push(StoredSet {
                    sandbox: name,
                    collected_at: m.collected_at,
                    bytes: m.artifacts.iter().map(|a| a.size).sum(),
                });
            }
        }
        Ok(sets)
    }

    /// The startup sweep: removes temporary files and sandbox directories
    /// without a manifest (collections a crash interrupted). Returns how
    /// many it removed.
    pub fn sweep(&self) -> Result<usize, ArtifactError> {
        fs::create_dir_all(&self.root).map_err(io_err(&self.root))?;
        let mut removed = 0;
        for entry in fs::read_dir(&self.root)
            .map_err(io_err(&self.root))?
            .flatten()
        {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir {
                if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                    let _ = fs::remove_file(&path);
                    removed += 1;
                }
                continue;
            }
            if !path.join(MANIFEST).exists() {
                let _ = fs::remove_dir_all(&path);
                removed += 1;
                continue;
            }
            for sub in [path.clone(), path.join(FILES)] {
                let Ok(list) = fs::read_dir(&sub) else {
                    continue;
                };
                for e in list.flatten() {
                    if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                        let _ = fs::remove_file(e.path());
                        removed += 1;
                    }
                }
            }
        }
        Ok(removed)
    }
}

fn sync_dir(dir: &Path) -> Result<(), ArtifactError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn random_suffix() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        b = crate::engine::now_ms().to_le_bytes();
    }
    hex(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SandboxId {
        SandboxId::from_entropy([7; 12])
    }

    #[test]
    fn a_collection_without_its_manifest_is_swept_and_never_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(tmp.path().join("artifacts"));
        store.begin(&id()).unwrap();
        let mut p = store.pending(&id()).unwrap();
        p.write_all(b"half").unwrap();
        // Crash here: a temporary file, no manifest.
        drop(p);
        assert!(store.manifest(&id()).unwrap().is_none());
        assert!(store.stored_sets().unwrap().is_empty());
        assert_eq!(store.sweep().unwrap(), 1);
        assert!(!tmp.path().join("artifacts").join(id().to_string()).exists());
    }

    #[test]
    fn a_finished_collection_lists_and_hashes() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(tmp.path().join("artifacts"));
        store.begin(&id()).unwrap();
        let mut p = store.pending(&id()).unwrap();
        p.write_all(b"abc").unwrap();
        let (size, sha) = p.commit("log.txt").unwrap();
        assert_eq!(size, 3);
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let list = ArtifactList {
            sandbox: id(),
            tenant: Some("t".into()),
            collected_at: 5,
            artifacts: vec![ArtifactInfo {
                name: "log.txt".into(),
                path: "/log.txt".into(),
                kind: "file".into(),
                status: mayfly_types::ArtifactStatus::Complete,
                size,
                sha256: sha,
                collected_at: 5,
                reason: None,
            }],
            workspace: None,
        };
        store.finish(&list).unwrap();
        assert_eq!(store.sweep().unwrap(), 0);
        assert_eq!(store.manifest(&id()).unwrap(), Some(list));
        assert_eq!(store.stored_sets().unwrap()[0].bytes, 3);
        store.remove(&id().to_string()).unwrap();
        assert!(store.manifest(&id()).unwrap().is_none());
    }
}
