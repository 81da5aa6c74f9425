//! Base images for templates: fetching OCI images into the layer store.
//!
//! A template's `base` names an image ([`ImageSource::parse`]): an OCI
//! layout directory, a `docker save` archive or a registry reference.
//! [`fetch_image`] reads its manifest and config and unpacks each layer not
//! yet in the [`LayerStore`] into `<store>/sha256/<hex>/`, where it is
//! shared read-only by every template that uses it. Overlayfs stacks the
//! layers as lower directories (top first), so OCI whiteouts become overlay
//! whiteouts while unpacking ([`plan`] has the rules for hostile input).
//!
//! Every blob is hashed while it is read and compared with the digest that
//! names it (manifest, config, layers); a mismatch names the blob and
//! nothing is committed. A layer's key is the digest of the blob as stored
//! (compressed); a docker archive's layers are keyed by their files'
//! sha256, and checked against the config's `diff_ids`.

mod archive;
mod digest;
mod layout;
pub mod plan;
mod registry;
mod source;
mod spec;
mod store;
pub mod unpack;
mod zstd;

use std::io::{BufReader, Read};
use std::path::PathBuf;

use mayfly_types::{BuildProgress, RegistryAuth};

pub use source::ImageSource;
pub use store::{GcReport, LayerStore, Staging};

use digest::HashingReader;
use unpack::UnpackError;

/// Options of a fetch.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Credentials for a registry (basic auth, or exchanged for a bearer
    /// token when the registry asks for one).
    pub auth: Option<RegistryAuth>,
    /// `host:port` registries allowed over plain HTTP. Loopback registries
    /// (`127.0.0.1`, `localhost`, `::1`) always are.
    pub insecure: Vec<String>,
}

/// What an image's config says about running it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    pub env: Vec<(String, String)>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
}

/// A fetched image: every layer is in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The manifest's digest (for a docker archive, which has no manifest
    /// blob, the config's digest: Docker's image id).
    pub digest: String,
    /// Layer keys (`sha256:<hex>`), bottom first.
    pub layers: Vec<String>,
    pub config: ImageConfig,
}

/// Why an image could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("base `{base}` is not valid: {reason}")]
    BadBase { base: String, reason: String },
    #[error("`{digest}` is not a sha256 digest")]
    BadDigest { digest: String },
    #[error("{blob} is corrupt or was tampered with: expected digest {expected}, read {actual}")]
    DigestMismatch {
        blob: String,
        expected: String,
        actual: String,
    },
    #[error("{blob} has {actual} bytes where its descriptor says {expected}")]
    SizeMismatch {
        blob: String,
        expected: u64,
        actual: u64,
    },
    #[error("{what} is not valid JSON of the expected shape: {reason}")]
    BadJson { what: String, reason: String },
    #[error("{what} is not supported")]
    Unsupported { what: String },
    #[error("no image found: {what}")]
    NoManifest { what: String },
    #[error("{blob} is larger than the {limit}-byte limit")]
    TooLarge { blob: String, limit: u64 },
    #[error("cannot {op} `{path}`")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The image the spec names (an OCI layout or an archive on the host)
    /// cannot be opened or read: missing, not a layout, or incomplete.
    #[error("cannot {op} `{path}`, the image the template names")]
    Source {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the archive `{path}` is malformed: {reason}")]
    BadArchive { path: PathBuf, reason: String },
    #[error("layer {layer} cannot be unpacked")]
    Layer {
        layer: String,
        #[source]
        source: UnpackError,
    },
    /// With a token registry, the token server is what checks them.
    #[error(
        "registry {registry} (or its token server) refused the credentials given for `{reference}`"
    )]
    Unauthorized { registry: String, reference: String },
    #[error(
        "registry {registry} asks for credentials to pull `{reference}`, and the build gave none \
         (`mayfly template build --registry-user USER --registry-password-stdin`)"
    )]
    CredentialsNeeded { registry: String, reference: String },
    #[error("pulling `{reference}` from the registry failed")]
    Registry {
        reference: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("an unpacking task failed")]
    Task(#[source] tokio::task::JoinError),
}

impl ImageError {
    /// Whether the error is the input's fault (a bad reference, digest,
    /// credential or image) rather than the host's.
    pub fn is_input(&self) -> bool {
        !matches!(self, ImageError::Io { .. } | ImageError::Task(_))
    }
}

/// The progress callback of a fetch.
pub type Progress<'a> = &'a (dyn Fn(BuildProgress) + Send + Sync);

/// Fetches `src` into `store`: verifies its manifest and config, and
/// unpacks every layer not already there. Reports `Pull` while
/// downloading and one `Layer` per layer (`cached` when it was present).
pub async fn fetch_image(
    src: &ImageSource,
    store: &LayerStore,
    opts: &PullOptions,
    progress: Progress<'_>,
) -> Result<Image, ImageError> {
    match src {
        ImageSource::OciLayout { path, reference } => {
            layout::fetch(path, reference.as_deref(), store, progress).await
        }
        ImageSource::DockerArchive { path } => archive::fetch(path, store, progress).await,
        ImageSource::Registry { reference } => {
            registry::fetch(reference, store, opts, progress).await
        }
    }
}

/// The largest layer blob accepted when its size is not known up front.
pub(crate) const MAX_LAYER_BLOB: u64 = 32 << 30;

/// What the bytes of one layer blob must hash to.
pub(crate) struct Expect {
    /// The store key, and the digest of the blob as read.
    pub key: String,
    /// The blob's size, when a descriptor gave it.
    pub size: Option<u64>,
    /// The digest of the uncompressed tar stream, when known (`diff_ids`).
    pub diff_id: Option<String>,
    /// How errors name the blob.
    pub name: String,
}

/// Unpacks the layer blob `file` into the store (on a blocking thread),
/// checking it hashes to what `expect` says. On any failure the staging
/// directory is removed; on a digest mismatch that is the error reported,
/// whatever else failed (a tampered blob often fails to decompress too).
pub(crate) async fn unpack_layer(
    store: &LayerStore,
    file: Box<dyn Read + Send>,
    expect: Expect,
) -> Result<(), ImageError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || unpack_layer_blocking(&store, file, &expect))
        .await
        .map_err(ImageError::Task)?
}

fn unpack_layer_blocking(
    store: &LayerStore,
    file: Box<dyn Read + Send>,
    e: &Expect,
) -> Result<(), ImageError> {
    let staging = store.begin(&e.key)?;
    let mut blob = HashingReader::new(file, e.size.unwrap_or(MAX_LAYER_BLOB));
    let unpacked = (|| {
        let mut input = unpack::decompress(BufReader::new(&mut blob))?;
        let mut tar = HashingReader::new(&mut input, u64::MAX);
        unpack::unpack(&mut tar, staging.dir(), plan::Limits::default())?;
        Ok::<_, UnpackError>(tar.hasher.finish())
    })();
    let drained = blob.drain();
    let read = blob.hasher.bytes;
    let actual = blob.hasher.finish();
    digest::verify(&e.name, &e.key, &actual)?;
    digest::check_size(&e.name, e.size, read)?;
    let layer_err = |source| ImageError::Layer {
        layer: e.key.clone(),
        source,
    };
    let diff = unpacked.map_err(layer_err)?;
    drained.map_err(|source| layer_err(UnpackError::Read { source }))?;
    if let Some(diff_id) = &e.diff_id {
        digest::verify(&format!("{} (uncompressed)", e.name), diff_id, &diff)?;
    }
    staging.commit().map(drop)
}

impl Expect {
    /// What a layer blob named by a descriptor must be.
    pub fn layer(desc: &spec::Descriptor) -> Expect {
        Expect {
            key: desc.digest.clone(),
            size: Some(desc.size),
            diff_id: None,
            name: format!("layer {}", desc.digest),
        }
    }
}

/// Brings each layer of a manifest into the store, bottom first, with
/// `fetch` for the ones not already there, and reports each. Returns the
/// layer keys.
pub(crate) async fn fetch_layers<'a, F, Fut>(
    layers: &'a [spec::Descriptor],
    store: &LayerStore,
    progress: Progress<'_>,
    mut fetch: F,
) -> Result<Vec<String>, ImageError>
where
    F: FnMut(&'a spec::Descriptor) -> Fut,
    Fut: std::future::Future<Output = Result<(), ImageError>>,
{
    let mut keys = Vec::new();
    for l in layers {
        digest::check_key(&l.digest)?;
        let cached = store.contains(&l.digest);
        if !cached {
            fetch(l).await?;
        }
        layer_done(progress, &l.digest, cached);
        keys.push(l.digest.clone());
    }
    Ok(keys)
}

/// Reports a layer found in, or added to, the store.
pub(crate) fn layer_done(progress: Progress<'_>, key: &str, cached: bool) {
    progress(BuildProgress::Layer {
        digest: key.to_owned(),
        cached,
    });
}
