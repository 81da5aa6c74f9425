//! Built templates on disk: one JSON record per name under
//! `<state>/templates/built/`, written to a temporary file, synced and
//! renamed, so a reader sees the old record or the new one, never half.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use mayfly_types::{is_template_name, TemplateInfo};

use super::{Base, TemplatesError};

/// One layer of a built template.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BuiltLayer {
    /// Its key in the layer store.
    pub key: String,
    /// The names at its top level.
    pub tops: Vec<String>,
}

/// What the registry keeps about a built template.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Built {
    pub info: TemplateInfo,
    pub base: Base,
    /// Bottom first: the base image's layers, then the steps'.
    pub layers: Vec<BuiltLayer>,
}

/// The registry directory.
#[derive(Debug, Clone)]
pub struct Registry {
    dir: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TemplatesError + '_ {
    move |source| TemplatesError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Registry {
    pub fn new(dir: PathBuf) -> Registry {
        Registry { dir }
    }

    fn file(&self, name: &str) -> Result<PathBuf, TemplatesError> {
        if !is_template_name(name) {
            return Err(TemplatesError::NotFound(name.chars().take(64).collect()));
        }
        Ok(self.dir.join(format!("{name}.json")))
    }

    /// The record of `name`, and the file's modification time.
    pub fn load(&self, name: &str) -> Result<(Built, std::time::SystemTime), TemplatesError> {
        let path = self.file(name)?;
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TemplatesError::NotFound(name.to_owned()))
            }
            Err(e) => return Err(io(&path)(e)),
        };
        let mtime = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .map_err(io(&path))?;
        let built: Built = serde_json::from_slice(&text).map_err(|e| TemplatesError::Corrupt {
            name: name.to_owned(),
            reason: e.to_string(),
        })?;
        Ok((built, mtime))
    }

    /// The modification time of `name`'s record (a cheap freshness check).
    pub fn mtime(&self, name: &str) -> Option<std::time::SystemTime> {
        let path = self.file(name).ok()?;
        std::fs::metadata(path).and_then(|m| m.modified()).ok()
    }

    /// Writes `built` atomically, replacing any earlier record.
    pub fn save(&self, built: &Built) -> Result<(), TemplatesError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io(&self.dir))?;
        let path = self.file(&built.info.name)?;
        let tmp = self
            .dir
            .join(format!(".{}.tmp.{}", built.info.name, std::process::id()));
        let json = serde_json::to_vec_pretty(built).map_err(|e| TemplatesError::Corrupt {
            name: built.info.name.clone(),
            reason: e.to_string(),
        })?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(&json).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        Ok(())
    }

    /// Every built template, by name.
    pub fn list(&self) -> Result<Vec<Built>, TemplatesError> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&self.dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(n) = name.strip_suffix(".json") {
                if is_template_name(n) {
                    match self.load(n) {
                        Ok((b, _)) => out.push(b),
                        Err(TemplatesError::NotFound(_)) => {}
                        Err(e) => tracing::warn!(template = n, "skipping a template: {e}"),
                    }
                }
            }
        }
        out.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        Ok(out)
    }

    /// Removes `name`'s record; false if there was none.
    pub fn remove(&self, name: &str) -> Result<bool, TemplatesError> {
        let path = self.file(name)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path)(e)),
        }
    }
}
