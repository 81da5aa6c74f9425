//! OCI image layout directories (`oci:/PATH[:REF]`).
//!
//! The layout's own path is trusted (the template names it), but what is
//! inside is not: `index.json` and every blob are opened below the layout
//! with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` and read only if they are
//! regular files, so a planted symlink cannot make the daemon read a host
//! file as a blob.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use mayfly_sys::fs::{self as sysfs, Access, Resolve};

use super::digest::{check_key, read_verified};
use super::spec::{self, Descriptor, Index, Manifest, Parsed, MAX_JSON_BYTES};
use super::{fetch_layers, unpack_layer, Expect, Image, ImageError, LayerStore, Progress};

/// An open layout directory.
pub(super) struct Layout {
    dir: OwnedFd,
    path: PathBuf,
}

impl Layout {
    pub fn open(path: &Path) -> Result<Layout, ImageError> {
        let dir = sysfs::open_host_dir(path).map_err(|e| ImageError::Source {
            op: "open the image layout",
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        Ok(Layout {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// Opens the regular file `rel` below the layout.
    pub fn file(&self, rel: &Path) -> Result<File, ImageError> {
        let full = self.path.join(rel);
        let fail = |e| ImageError::Source {
            op: "open",
            path: full.clone(),
            source: std::io::Error::other(e),
        };
        let handle = sysfs::open(&self.dir, rel, Access::Handle, Resolve::Child).map_err(fail)?;
        sysfs::open_regular_for_read(handle.as_fd(), rel).map_err(fail)
    }

    /// Opens the blob a descriptor names.
    pub fn blob(&self, desc: &Descriptor) -> Result<File, ImageError> {
        let hex = check_key(&desc.digest)?;
        self.file(&Path::new("blobs/sha256").join(hex))
    }

    /// Reads and verifies a small JSON blob.
    pub fn json_blob(&self, desc: &Descriptor, what: &str) -> Result<Vec<u8>, ImageError> {
        let name = format!("{what} {}", desc.digest);
        read_verified(
            self.blob(desc)?,
            &desc.digest,
            Some(desc.size),
            MAX_JSON_BYTES,
            &name,
        )
    }
}

/// Follows `desc` through up to two image indexes to an image manifest,
/// picking linux/amd64. Returns the manifest and its descriptor.
pub(super) fn resolve_manifest(
    read: impl Fn(&Descriptor, &str) -> Result<Vec<u8>, ImageError>,
    mut desc: Descriptor,
) -> Result<(Manifest, Descriptor), ImageError> {
    for _ in 0..3 {
        let bytes = read(&desc, "manifest")?;
        match spec::parse_manifest(&bytes, &format!("manifest {}", desc.digest))? {
            Parsed::Manifest(m) => return Ok((m, desc)),
            Parsed::Index(index) => desc = spec::pick_platform(&index, "the image index")?.clone(),
        }
    }
    Err(ImageError::Unsupported {
        what: "an image index nested more than twice".to_owned(),
    })
}

pub(super) async fn fetch(
    path: &Path,
    reference: Option<&str>,
    store: &LayerStore,
    progress: Progress<'_>,
) -> Result<Image, ImageError> {
    let layout = Layout::open(path)?;
    let index_file = layout.file(Path::new("index.json"))?;
    let index: Index = serde_json::from_reader(std::io::Read::take(index_file, MAX_JSON_BYTES))
        .map_err(|e| ImageError::BadJson {
            what: format!("`{}/index.json`", path.display()),
            reason: e.to_string(),
        })?;
    let top = spec::pick_reference(&index, reference)?.clone();
    let (manifest, desc) = resolve_manifest(|d, what| layout.json_blob(d, what), top)?;
    let config = layout.json_blob(&manifest.config, "image config")?;
    let config = spec::parse_config(&config)?;
    let layers = fetch_layers(&manifest.layers, store, progress, |l| async {
        unpack_layer(store, Box::new(layout.blob(l)?), Expect::layer(l)).await
    })
    .await?;
    Ok(Image {
        digest: desc.digest,
        layers,
        config: config.image_config(),
    })
}
