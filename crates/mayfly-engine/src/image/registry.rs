//! Registry pulls (`docker://HOST[:PORT]/REPO[:TAG|@sha256:...]`) with
//! `oci-client`.
//!
//! Authentication: anonymous, or the build's credentials as HTTP basic
//! auth; when the registry answers with `WWW-Authenticate: Bearer`,
//! oci-client exchanges them for a token itself. TLS is rustls (ring);
//! plain HTTP is used only for loopback registries and the ones listed in
//! [`PullOptions::insecure`].
//!
//! Layers are streamed to a download file in the store's `tmp/` while
//! hashed (never held in memory), checked, and only then unpacked.

use std::net::IpAddr;

use futures_util::StreamExt;
use mayfly_types::BuildProgress;
use oci_client::client::{linux_amd64_resolver, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth as OciAuth;
use oci_client::{Client, Reference};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::digest::{self, check_key, check_size, Hasher};
use super::spec::{
    self, Descriptor, Parsed, DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST,
};
use super::{
    fetch_layers, unpack_layer, Expect, Image, ImageError, LayerStore, Progress, PullOptions,
    MAX_LAYER_BLOB,
};

/// Whether `registry` (`host[:port]`) may be reached over plain HTTP.
pub(super) fn plain_http_allowed(registry: &str, insecure: &[String]) -> bool {
    if insecure.iter().any(|i| i == registry) {
        return true;
    }
    let host = match registry.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => registry.rsplit_once(':').map_or(registry, |(h, _)| h),
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// How often (in bytes) `Pull` progress is reported during a download.
const PROGRESS_STEP: u64 = 1 << 20;

struct Puller<'a> {
    client: Client,
    reference: Reference,
    shown: &'a str,
    /// Whether the build gave credentials (a 401 then means they were
    /// refused, not missing).
    with_credentials: bool,
}

impl Puller<'_> {
    fn error(&self, e: OciDistributionError, blob: &str) -> ImageError {
        match e {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => {
                let registry = self.reference.resolve_registry().to_owned();
                let reference = self.shown.to_owned();
                if self.with_credentials {
                    ImageError::Unauthorized {
                        registry,
                        reference,
                    }
                } else {
                    ImageError::CredentialsNeeded {
                        registry,
                        reference,
                    }
                }
            }
            OciDistributionError::DigestError(d) => ImageError::DigestMismatch {
                blob: blob.to_owned(),
                expected: "the digest that names it".to_owned(),
                actual: format!("other content ({d})"),
            },
            e => ImageError::Registry {
                reference: self.shown.to_owned(),
                source: Box::new(e),
            },
        }
    }

    /// Streams blob `digest` into `out`, hashing it; the digest (and size,
    /// when known) must match. `report` gets `(done, total)` now and then.
    async fn pull_to(
        &self,
        digest: &str,
        size: Option<u64>,
        limit: u64,
        out: &mut (dyn AsyncWrite + Unpin + Send),
        blob: &str,
        report: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<(), ImageError> {
        check_key(digest)?;
        let mut stream = self
            .client
            .pull_blob_stream(&self.reference, digest)
            .await
            .map_err(|e| self.error(e, blob))?;
        let limit = size.unwrap_or(limit).min(limit);
        let mut hasher = Hasher::default();
        let mut reported = 0;
        let mut failed = None;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            hasher.update(&chunk);
            if hasher.bytes > limit {
                return Err(ImageError::TooLarge {
                    blob: blob.to_owned(),
                    limit,
                });
            }
            out.write_all(&chunk)
                .await
                .map_err(|source| ImageError::Io {
                    op: "write the download of",
                    path: blob.into(),
                    source,
                })?;
            if hasher.bytes - reported >= PROGRESS_STEP {
                reported = hasher.bytes;
                report(reported);
            }
        }
        out.flush().await.map_err(|source| ImageError::Io {
            op: "write the download of",
            path: blob.into(),
            source,
        })?;
        let bytes = hasher.bytes;
        report(bytes);
        // A tampered blob is reported as such even when oci-client's own
        // check cut the stream first.
        digest::verify(blob, digest, &hasher.finish())?;
        if let Some(source) = failed {
            return Err(ImageError::Io {
                op: "download",
                path: blob.into(),
                source,
            });
        }
        check_size(blob, size, bytes)
    }

    async fn manifest(&self, digest: Option<&str>) -> Result<(Vec<u8>, String), ImageError> {
        let reference = match digest {
            Some(d) => Reference::with_digest(
                self.reference.resolve_registry().to_owned(),
                self.reference.repository().to_owned(),
                d.to_owned(),
            ),
            None => self.reference.clone(),
        };
        let accepted = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST];
        let (bytes, _) = self
            .client
            .pull_manifest_raw(&reference, &OciAuth::Anonymous, &accepted)
            .await
            .map_err(|e| self.error(e, "the manifest"))?;
        let actual = digest::of_bytes(&bytes);
        if let Some(expected) = digest.or(reference.digest()) {
            digest::verify(&format!("manifest {expected}"), expected, &actual)?;
        }
        Ok((bytes.to_vec(), actual))
    }
}

pub(super) async fn fetch(
    shown: &str,
    store: &LayerStore,
    opts: &PullOptions,
    progress: Progress<'_>,
) -> Result<Image, ImageError> {
    let reference: Reference = shown.parse().map_err(|e| ImageError::BadBase {
        base: format!("docker://{shown}"),
        reason: format!("it is not an image reference ({e})"),
    })?;
    let registry = reference.resolve_registry().to_owned();
    // reqwest is built without a default TLS provider; the first fetch
    // installs ring's (a later call finds it installed).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = if plain_http_allowed(&registry, &opts.insecure) {
        ClientProtocol::HttpsExcept(vec![registry.clone()])
    } else {
        ClientProtocol::Https
    };
    let client = Client::new(ClientConfig {
        protocol,
        platform_resolver: Some(Box::new(linux_amd64_resolver)),
        ..ClientConfig::default()
    });
    let auth = match &opts.auth {
        Some(a) => OciAuth::Basic(a.username.clone(), a.password.clone()),
        None => OciAuth::Anonymous,
    };
    client.store_auth_if_needed(&registry, &auth).await;
    let puller = Puller {
        client,
        reference,
        shown,
        with_credentials: opts.auth.is_some(),
    };
    // The first manifest is read by reference (tag or digest); an index's
    // linux/amd64 pick by digest.
    let (mut bytes, mut digest) = puller.manifest(None).await?;
    let mut hops = 0;
    let manifest = loop {
        match spec::parse_manifest(&bytes, &format!("manifest {digest}"))? {
            Parsed::Manifest(m) => break m,
            Parsed::Index(_) if hops == 2 => {
                return Err(ImageError::Unsupported {
                    what: "an image index nested more than twice".to_owned(),
                })
            }
            Parsed::Index(index) => {
                let pick = spec::pick_platform(&index, "the image index")?
                    .digest
                    .clone();
                (bytes, digest) = puller.manifest(Some(&pick)).await?;
                hops += 1;
            }
        }
    };
    let mut config = Vec::new();
    let config_name = format!("image config {}", manifest.config.digest);
    let no_progress = |_| {};
    puller
        .pull_to(
            &manifest.config.digest,
            Some(manifest.config.size),
            spec::MAX_JSON_BYTES,
            &mut config,
            &config_name,
            &no_progress,
        )
        .await?;
    let config = spec::parse_config(&config)?;
    let layers = fetch_layers(&manifest.layers, store, progress, |l| {
        pull_layer(&puller, store, l, progress)
    })
    .await?;
    Ok(Image {
        digest,
        layers,
        config: config.image_config(),
    })
}

async fn pull_layer(
    puller: &Puller<'_>,
    store: &LayerStore,
    l: &Descriptor,
    progress: Progress<'_>,
) -> Result<(), ImageError> {
    let name = format!("layer {}", l.digest);
    let tmp = store.temp_blob(&l.digest)?;
    let io_err = |op| {
        let path = tmp.path.clone();
        move |source| ImageError::Io { op, path, source }
    };
    let mut file = tokio::fs::File::create(&tmp.path)
        .await
        .map_err(io_err("create"))?;
    let report = |done| {
        progress(BuildProgress::Pull {
            digest: l.digest.clone(),
            done,
            total: Some(l.size),
        })
    };
    puller
        .pull_to(
            &l.digest,
            Some(l.size),
            MAX_LAYER_BLOB,
            &mut file,
            &name,
            &report,
        )
        .await?;
    drop(file);
    let file = std::fs::File::open(&tmp.path).map_err(io_err("open"))?;
    unpack_layer(store, Box::new(file), Expect::layer(l)).await
}

#[cfg(test)]
mod tests {
    use super::plain_http_allowed;

    #[test]
    fn plain_http_only_for_loopback_or_listed_registries() {
        for r in [
            "127.0.0.1:5000",
            "localhost:80",
            "localhost",
            "[::1]:5000",
            "127.8.0.1",
        ] {
            assert!(plain_http_allowed(r, &[]), "{r}");
        }
        for r in [
            "10.0.0.1:5000",
            "registry.example:5000",
            "localhost.evil:1",
            "[::2]:1",
        ] {
            assert!(!plain_http_allowed(r, &[]), "{r}");
        }
        assert!(plain_http_allowed("reg.lan:5000", &["reg.lan:5000".into()]));
        assert!(!plain_http_allowed(
            "reg.lan:5001",
            &["reg.lan:5000".into()]
        ));
    }
}
