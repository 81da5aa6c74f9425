//! The fake's files: what its file API stores, per sandbox and path, in
//! memory (the trait methods in `fake.rs` delegate here).

use bytes::Bytes;
use mayfly_engine::{EngineError, UploadSummary};
use mayfly_types::{FileKind, FileStat, MkdirRequest, RenameRequest, SandboxId};

use super::FakeEngine;

impl FakeEngine {
    pub(super) fn read_file_now(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        self.lock()
            .files
            .get(&(id.clone(), path.to_owned()))
            .map(|d| Bytes::from(d.clone()))
            .ok_or_else(|| EngineError::Invalid(format!("no such file: {path}")))
    }

    pub(super) fn write_file_now(
        &self,
        id: &SandboxId,
        path: &str,
        data: Bytes,
        mode: Option<u32>,
    ) -> Result<FileStat, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let size = data.len() as u64;
        self.lock()
            .files
            .insert((id.clone(), path.to_owned()), data.to_vec());
        Ok(Self::file_stat(
            path,
            FileKind::File,
            size,
            mode.unwrap_or(0o644),
        ))
    }

    pub(super) fn stat_now(&self, id: &SandboxId, path: &str) -> Result<FileStat, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let st = self.lock();
        let key = (id.clone(), path.to_owned());
        if let Some(d) = st.files.get(&key) {
            return Ok(Self::file_stat(path, FileKind::File, d.len() as u64, 0o644));
        }
        if let Some(mode) = st.dirs.get(&key) {
            return Ok(Self::file_stat(path, FileKind::Dir, 0, *mode));
        }
        Err(EngineError::Invalid(format!("no such file: {path}")))
    }

    pub(super) fn list_dir_now(
        &self,
        id: &SandboxId,
        path: &str,
    ) -> Result<Vec<FileStat>, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let prefix = format!("{}/", path.trim_end_matches('/'));
        let st = self.lock();
        let mut out: Vec<FileStat> = st
            .files
            .iter()
            .filter(|((sid, p), _)| sid == id && p.starts_with(&prefix))
            .map(|((_, p), d)| {
                Self::file_stat(&p[prefix.len()..], FileKind::File, d.len() as u64, 0o644)
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub(super) fn mkdir_now(
        &self,
        id: &SandboxId,
        req: MkdirRequest,
    ) -> Result<FileStat, EngineError> {
        self.ready(id)?;
        Self::check_path(&req.path)?;
        let mode = req.mode.unwrap_or(0o755);
        self.lock()
            .dirs
            .insert((id.clone(), req.path.clone()), mode);
        Ok(Self::file_stat(&req.path, FileKind::Dir, 0, mode))
    }

    pub(super) fn remove_now(
        &self,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<(), EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let mut st = self.lock();
        let key = (id.clone(), path.to_owned());
        if st.files.remove(&key).is_some() {
            return Ok(());
        }
        if st.dirs.contains_key(&key) {
            let prefix = format!("{path}/");
            let children = st
                .files
                .keys()
                .any(|(s, p)| s == id && p.starts_with(&prefix));
            if children && !recursive {
                return Err(EngineError::Invalid(format!(
                    "directory {path} is not empty"
                )));
            }
            st.files
                .retain(|(s, p), _| !(s == id && p.starts_with(&prefix)));
            st.dirs.remove(&key);
            return Ok(());
        }
        Err(EngineError::Invalid(format!("no such file: {path}")))
    }

    pub(super) fn rename_now(&self, id: &SandboxId, req: RenameRequest) -> Result<(), EngineError> {
        self.ready(id)?;
        Self::check_path(&req.from)?;
        Self::check_path(&req.to)?;
        let mut st = self.lock();
        let data = st
            .files
            .remove(&(id.clone(), req.from.clone()))
            .ok_or_else(|| EngineError::Invalid(format!("no such file: {}", req.from)))?;
        st.files.insert((id.clone(), req.to), data);
        Ok(())
    }

    pub(super) fn upload_tar_now(
        &self,
        id: &SandboxId,
        dir: &str,
        tar: Bytes,
    ) -> Result<UploadSummary, EngineError> {
        self.ready(id)?;
        Self::check_path(dir)?;
        let bytes = tar.len() as u64;
        self.lock()
            .tars
            .insert((id.clone(), dir.to_owned()), tar.to_vec());
        Ok(UploadSummary {
            files: 1,
            dirs: 1,
            symlinks: 0,
            bytes,
        })
    }

    pub(super) fn download_tar_now(
        &self,
        id: &SandboxId,
        path: &str,
    ) -> Result<Bytes, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        self.lock()
            .tars
            .get(&(id.clone(), path.to_owned()))
            .map(|t| Bytes::from(t.clone()))
            .ok_or_else(|| EngineError::Invalid(format!("nothing uploaded to {path}")))
    }

    pub(super) fn file_stat(name: &str, kind: FileKind, size: u64, mode: u32) -> FileStat {
        FileStat {
            name: name.to_owned(),
            kind,
            size,
            mode,
            uid: 0,
            gid: 0,
            mtime_ms: 1_700_000_000_000,
            link_target: None,
        }
    }
}
