//! The build steps that need no sandbox: `copy` (files from the template's
//! directory into a layer) and the base image's layers.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use mayfly_types::{BuildProgress, BuildRequest, CopyStep};
use sha2::{Digest, Sha256};

use super::template_build::top_names;
use super::Engine;
use crate::image::{fetch_image, ImageSource, LayerStore, PullOptions};
use crate::templates::keys;
use crate::templates::{BuiltLayer, TemplatesError};
use crate::EngineError;

/// The most entries a copy step may copy.
const MAX_COPY_ENTRIES: u64 = 200_000;

impl Engine {
    /// A `copy` step: hashes the source, and makes its layer unless cached.
    /// Returns whether the cache served it.
    pub(super) async fn copy_step(
        &self,
        index: usize,
        step: &CopyStep,
        context: &Path,
        store: &LayerStore,
        chain: &mut super::template_build::Chain,
        no_cache: bool,
    ) -> Result<bool, EngineError> {
        let (context, step2, store2) = (context.to_path_buf(), step.clone(), store.clone());
        let (parent, cfg) = (chain.parent.clone(), chain.cfg.clone());
        let (key, hit) = tokio::task::spawn_blocking(move || {
            let src = source_path(&context, &step2.src)
                .map_err(|reason| TemplatesError::Copy { index, reason })?;
            let content = hash_tree(&src).map_err(|e| TemplatesError::Copy {
                index,
                reason: format!("reading `{}`: {e}", src.display()),
            })?;
            let key = keys::copy_key(&parent, &step2.dest, &content, &cfg);
            let hit = !no_cache && store2.contains(&key);
            if !hit {
                make_copy_layer(&src, &step2.dest, cfg.user.unwrap_or(0), &store2, &key)
                    .map_err(|reason| TemplatesError::Copy { index, reason })?;
            }
            Ok::<_, TemplatesError>((key, hit))
        })
        .await
        .map_err(|e| EngineError::Internal(format!("copy step: {e}")))??;
        let tops = top_names(&store.path(&key).map_err(TemplatesError::from)?);
        chain.layers.push(BuiltLayer {
            key: key.clone(),
            tops,
        });
        chain.parent = key;
        Ok(hit)
    }

    /// The chain of an image base: its layers, fetched into the store.
    pub(super) async fn image_chain(
        &self,
        base: &str,
        store: &LayerStore,
        req: &BuildRequest,
        emit: &(dyn Fn(BuildProgress) + Send + Sync),
    ) -> Result<super::template_build::Chain, EngineError> {
        let src = ImageSource::parse(base)
            .map_err(TemplatesError::from)?
            .ok_or_else(|| EngineError::Invalid(format!("base `{base}` is not an image")))?;
        let opts = PullOptions {
            auth: req.registry_auth.clone(),
            ..Default::default()
        };
        let image = fetch_image(&src, store, &opts, emit)
            .await
            .map_err(TemplatesError::from)?;
        if image.layers.is_empty() {
            return Err(EngineError::Invalid(format!(
                "base `{base}`: the image has no layers"
            )));
        }
        let mut layers = Vec::with_capacity(image.layers.len());
        for key in &image.layers {
            let tops = top_names(&store.path(key).map_err(TemplatesError::from)?);
            layers.push(BuiltLayer {
                key: key.clone(),
                tops,
            });
        }
        let user = image.config.user.as_deref().and_then(|u| {
            let uid = u.split(':').next().unwrap_or("");
            let parsed = uid.parse::<u32>().ok().filter(|u| *u <= 65535);
            if parsed.is_none() && !uid.is_empty() {
                tracing::warn!(
                    user = u,
                    "the image's user is not a numeric uid; using root"
                );
            }
            parsed
        });
        Ok(super::template_build::Chain {
            parent: keys::base_key(
                &crate::templates::Base::Image(base.to_owned()),
                Some(&image.digest),
            ),
            layers,
            cfg: keys::StepConfig {
                env: image.config.env.into_iter().collect(),
                workdir: image.config.workdir.filter(|w| w.starts_with('/')),
                user,
            },
        })
    }
}

/// The copy source inside the context directory; it may not leave it, even
/// through a symlink.
fn source_path(context: &Path, src: &str) -> Result<PathBuf, String> {
    let ctx = context
        .canonicalize()
        .map_err(|e| format!("template directory `{}`: {e}", context.display()))?;
    let joined = ctx.join(src);
    let meta = std::fs::symlink_metadata(&joined).map_err(|e| format!("`{src}`: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err(format!("`{src}` is a symlink; copy its target instead"));
    }
    let real = joined.canonicalize().map_err(|e| format!("`{src}`: {e}"))?;
    if !real.starts_with(&ctx) {
        return Err(format!("`{src}` leaves the template's directory"));
    }
    Ok(real)
}

/// A digest of a file or tree: names, kinds, modes, link targets, contents.
fn hash_tree(path: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut count = 0u64;
    hash_into(path, Path::new(""), &mut h, &mut count)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn hash_into(path: &Path, rel: &Path, h: &mut Sha256, count: &mut u64) -> std::io::Result<()> {
    *count += 1;
    if *count > MAX_COPY_ENTRIES {
        return Err(std::io::Error::other(format!(
            "more than {MAX_COPY_ENTRIES} entries"
        )));
    }
    let meta = std::fs::symlink_metadata(path)?;
    let rel_s = rel.to_string_lossy();
    h.update((rel_s.len() as u64).to_le_bytes());
    h.update(rel_s.as_bytes());
    h.update(meta.mode().to_le_bytes());
    let ft = meta.file_type();
    if ft.is_symlink() {
        let t = std::fs::read_link(path)?;
        h.update(t.to_string_lossy().as_bytes());
    } else if ft.is_file() {
        h.update(meta.len().to_le_bytes());
        let mut f = std::fs::File::open(path)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    } else if ft.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        for n in names {
            hash_into(&path.join(&n), &rel.join(&n), h, count)?;
        }
    }
    Ok(())
}

/// Makes the layer of a copy: `src` at `dest`, owned by `uid`.
fn make_copy_layer(
    src: &Path,
    dest: &str,
    uid: u32,
    store: &LayerStore,
    key: &str,
) -> Result<(), String> {
    let staging = store.begin(key).map_err(|e| e.to_string())?;
    let target = staging.dir().join(dest.trim_start_matches('/'));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    let limits = mayfly_sys::capture::CaptureLimits {
        max_entries: MAX_COPY_ENTRIES,
        max_depth: 128,
        max_bytes: super::template_build::MAX_LAYER_BYTES,
    };
    let meta = std::fs::symlink_metadata(src).map_err(|e| e.to_string())?;
    if meta.is_dir() {
        std::fs::create_dir_all(&target).map_err(|e| e.to_string())?;
        mayfly_sys::capture::capture_upper(src, &target, 0, &limits).map_err(|e| e.to_string())?;
    } else {
        std::fs::copy(src, &target).map_err(|e| e.to_string())?;
    }
    chown_tree(&target, uid).map_err(|e| e.to_string())?;
    staging.commit().map_err(|e| e.to_string())?;
    Ok(())
}

/// Gives a copied tree (never following its symlinks) to `uid`.
fn chown_tree(path: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for e in std::fs::read_dir(path)? {
            chown_tree(&e?.path(), uid)?;
        }
    } else if meta.is_file() {
        // chown cleared setuid/setgid; copied files keep their other bits.
        std::fs::set_permissions(
            path,
            std::os::unix::fs::PermissionsExt::from_mode(meta.mode() & 0o777),
        )?;
    }
    Ok(())
}
