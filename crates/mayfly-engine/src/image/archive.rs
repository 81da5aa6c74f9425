//! `docker save` archives (`docker-archive:/PATH`), also as written by
//! `skopeo copy ... docker-archive:`.
//!
//! The archive is a tar of `manifest.json`, a config blob and one tar per
//! layer (`<id>/layer.tar`, `<hex>.tar` or `blobs/sha256/<hex>`; Docker
//! links repeated layers with symlinks). Nothing here is content-addressed
//! by a manifest digest, so the chain of trust is: the config is hashed
//! (and checked against its name when the name is a digest), and each
//! layer's uncompressed stream must hash to the config's `diff_ids` entry.
//! A layer's store key is the sha256 of its file as stored.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::digest::{self, check_key, Hasher};
use super::spec::{self, ArchiveEntry, MAX_JSON_BYTES};
use super::{layer_done, unpack_layer, Expect, Image, ImageError, LayerStore, Progress};

/// Where each member of the archive is.
struct Members {
    path: PathBuf,
    files: HashMap<String, (u64, u64)>,
    links: HashMap<String, String>,
}

/// At most this many members are indexed.
const MAX_MEMBERS: usize = 100_000;

impl Members {
    fn index(path: &Path) -> Result<Members, ImageError> {
        let bad = |reason: String| ImageError::BadArchive {
            path: path.to_path_buf(),
            reason,
        };
        let file = File::open(path).map_err(|source| ImageError::Source {
            op: "open",
            path: path.to_path_buf(),
            source,
        })?;
        let mut members = Members {
            path: path.to_path_buf(),
            files: HashMap::new(),
            links: HashMap::new(),
        };
        let mut ar = tar::Archive::new(file);
        for entry in ar.entries_with_seek().map_err(|e| bad(e.to_string()))? {
            let entry = entry.map_err(|e| bad(e.to_string()))?;
            if members.files.len() + members.links.len() >= MAX_MEMBERS {
                return Err(bad(format!("it has more than {MAX_MEMBERS} members")));
            }
            let name = normalize(&String::from_utf8_lossy(&entry.path_bytes()));
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    members
                        .files
                        .insert(name, (entry.raw_file_position(), entry.size()));
                }
                tar::EntryType::Symlink => {
                    let target = entry.link_name_bytes().unwrap_or_default();
                    let dir = Path::new(&name).parent().unwrap_or(Path::new(""));
                    let joined = dir.join(String::from_utf8_lossy(&target).as_ref());
                    members
                        .links
                        .insert(name, normalize(&joined.to_string_lossy()));
                }
                _ => {}
            }
        }
        Ok(members)
    }

    /// Opens member `name` (following the archive's own symlinks) as a
    /// reader of exactly its bytes, and says how many there are.
    fn open(&self, name: &str) -> Result<(Box<dyn Read + Send>, u64), ImageError> {
        let mut name = normalize(name);
        for _ in 0..8 {
            if let Some(&(offset, size)) = self.files.get(&name) {
                let mut file = File::open(&self.path).map_err(|source| ImageError::Source {
                    op: "open",
                    path: self.path.clone(),
                    source,
                })?;
                file.seek(SeekFrom::Start(offset))
                    .map_err(|source| ImageError::Source {
                        op: "read",
                        path: self.path.clone(),
                        source,
                    })?;
                return Ok((Box::new(file.take(size)), size));
            }
            match self.links.get(&name) {
                Some(target) => name = target.clone(),
                None => break,
            }
        }
        Err(ImageError::BadArchive {
            path: self.path.clone(),
            reason: format!("it has no file `{name}`"),
        })
    }
}

/// `./a//b/../c` → `a/c` (lexically; `..` above the top is dropped).
fn normalize(name: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for comp in name.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join("/")
}

/// The digest a member's name spells, if it spells one: `<hex>.json`,
/// `<hex>.tar` or `blobs/sha256/<hex>`.
fn digest_in_name(name: &str) -> Option<String> {
    let base = name.rsplit('/').next()?;
    let hex = base
        .strip_suffix(".json")
        .or_else(|| base.strip_suffix(".tar"))
        .unwrap_or(base);
    let key = format!("sha256:{hex}");
    digest::sha256_hex(&key).is_some().then_some(key)
}

fn hash_member(members: &Members, name: &str) -> Result<String, ImageError> {
    let (mut r, _) = members.open(name)?;
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf).map_err(|source| ImageError::Source {
            op: "read",
            path: members.path.join(name),
            source,
        })?;
        if n == 0 {
            return Ok(hasher.finish());
        }
        hasher.update(&buf[..n]);
    }
}

pub(super) async fn fetch(
    path: &Path,
    store: &LayerStore,
    progress: Progress<'_>,
) -> Result<Image, ImageError> {
    let members = Arc::new(Members::index(path)?);
    let (manifest, _) = members.open("manifest.json")?;
    let entries: Vec<ArchiveEntry> = serde_json::from_reader(manifest.take(MAX_JSON_BYTES))
        .map_err(|e| ImageError::BadJson {
            what: "the archive's manifest.json".to_owned(),
            reason: e.to_string(),
        })?;
    let [entry] = entries.as_slice() else {
        return Err(ImageError::Unsupported {
            what: format!(
                "an archive of {} images (only single-image archives are)",
                entries.len()
            ),
        });
    };
    let (config_reader, _) = members.open(&entry.config)?;
    let mut config_bytes = Vec::new();
    config_reader
        .take(MAX_JSON_BYTES)
        .read_to_end(&mut config_bytes)
        .map_err(|source| ImageError::Source {
            op: "read",
            path: path.join(&entry.config),
            source,
        })?;
    let config_digest = digest::of_bytes(&config_bytes);
    if let Some(named) = digest_in_name(&entry.config) {
        digest::verify("the image config", &named, &config_digest)?;
    }
    let config = spec::parse_config(&config_bytes)?;
    let diff_ids = config.rootfs.as_ref().map(|r| &r.diff_ids);
    if diff_ids.map(Vec::len) != Some(entry.layers.len()) {
        return Err(ImageError::BadJson {
            what: "the image config".to_owned(),
            reason: "its rootfs.diff_ids do not match the archive's layers".to_owned(),
        });
    }
    let diff_ids = diff_ids.cloned().unwrap_or_default();
    let mut layers = Vec::new();
    for (name, diff_id) in entry.layers.iter().zip(diff_ids) {
        check_key(&diff_id)?;
        let (m, n) = (Arc::clone(&members), name.clone());
        let key = tokio::task::spawn_blocking(move || hash_member(&m, &n))
            .await
            .map_err(ImageError::Task)??;
        if let Some(named) = digest_in_name(name) {
            digest::verify(&format!("layer file `{name}`"), &named, &key)?;
        }
        let cached = store.contains(&key);
        if !cached {
            let (reader, size) = members.open(name)?;
            let expect = Expect {
                key: key.clone(),
                size: Some(size),
                diff_id: Some(diff_id),
                name: format!("layer file `{name}`"),
            };
            unpack_layer(store, reader, expect).await?;
        }
        layer_done(progress, &key, cached);
        layers.push(key);
    }
    Ok(Image {
        digest: config_digest,
        layers,
        config: config.image_config(),
    })
}
