//! Parsing a template's `base` string into an image source (pure).

use std::path::PathBuf;

use super::ImageError;

/// Where a template's base image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// `oci:/PATH[:REF]`: an OCI image layout directory; `REF` is matched
    /// against the `org.opencontainers.image.ref.name` annotation.
    OciLayout {
        path: PathBuf,
        reference: Option<String>,
    },
    /// `docker-archive:/PATH`: a `docker save` (or `skopeo copy ...
    /// docker-archive:`) tarball.
    DockerArchive { path: PathBuf },
    /// `docker://HOST[:PORT]/REPO[:TAG|@sha256:...]`: a registry image; the
    /// reference is stored without the scheme.
    Registry { reference: String },
}

impl ImageSource {
    /// Parses a `base`. `host` and `dir:/PATH` are not images: `Ok(None)`.
    /// Anything else that is not one of the forms above is an error.
    pub fn parse(base: &str) -> Result<Option<ImageSource>, ImageError> {
        let bad = |reason: &str| ImageError::BadBase {
            base: base.to_owned(),
            reason: reason.to_owned(),
        };
        if base == "host" || base.starts_with("dir:") {
            return Ok(None);
        }
        if base.contains('\0') {
            return Err(bad("it contains a NUL byte"));
        }
        if let Some(rest) = base.strip_prefix("oci:") {
            // The reference is what follows the last `:` of the final path
            // component, as skopeo reads `oci:` names.
            let (path, reference) = match rest.rsplit_once(':') {
                Some((p, r)) if !r.contains('/') => (p, Some(r)),
                _ => (rest, None),
            };
            if let Some(r) = reference {
                if r.is_empty() {
                    return Err(bad("the reference after `:` is empty"));
                }
            }
            return Ok(Some(ImageSource::OciLayout {
                path: absolute(path).ok_or_else(|| bad("the layout path must be absolute"))?,
                reference: reference.map(str::to_owned),
            }));
        }
        if let Some(rest) = base.strip_prefix("docker-archive:") {
            return Ok(Some(ImageSource::DockerArchive {
                path: absolute(rest).ok_or_else(|| bad("the archive path must be absolute"))?,
            }));
        }
        if let Some(rest) = base.strip_prefix("docker://") {
            let reference: oci_client::Reference = rest
                .parse()
                .map_err(|e| bad(&format!("it is not an image reference ({e})")))?;
            if reference
                .digest()
                .is_some_and(|d| !d.starts_with("sha256:"))
            {
                return Err(bad("only sha256 digests are supported"));
            }
            return Ok(Some(ImageSource::Registry {
                reference: rest.to_owned(),
            }));
        }
        Err(bad(
            "expected `host`, `dir:/PATH`, `oci:/PATH[:REF]`, `docker-archive:/PATH` or \
             `docker://HOST/REPO[:TAG]`",
        ))
    }
}

fn absolute(path: &str) -> Option<PathBuf> {
    (path.starts_with('/')).then(|| PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(base: &str) -> Option<ImageSource> {
        ImageSource::parse(base).unwrap()
    }

    #[test]
    fn host_and_dir_are_not_images() {
        assert_eq!(ok("host"), None);
        assert_eq!(ok("dir:/srv/root"), None);
    }

    #[test]
    fn oci_layout_takes_an_optional_reference_after_the_last_colon() {
        assert_eq!(
            ok("oci:/img/layout"),
            Some(ImageSource::OciLayout {
                path: "/img/layout".into(),
                reference: None
            })
        );
        assert_eq!(
            ok("oci:/img/layout:v1.2"),
            Some(ImageSource::OciLayout {
                path: "/img/layout".into(),
                reference: Some("v1.2".into())
            })
        );
        assert_eq!(
            ok("oci:/a:b/layout"),
            Some(ImageSource::OciLayout {
                path: "/a:b/layout".into(),
                reference: None
            })
        );
    }

    #[test]
    fn archives_and_registries_parse() {
        assert_eq!(
            ok("docker-archive:/tmp/x.tar"),
            Some(ImageSource::DockerArchive {
                path: "/tmp/x.tar".into()
            })
        );
        assert_eq!(
            ok("docker://127.0.0.1:5000/team/app:1"),
            Some(ImageSource::Registry {
                reference: "127.0.0.1:5000/team/app:1".into()
            })
        );
    }

    #[test]
    fn malformed_bases_are_errors_not_panics() {
        for base in [
            "",
            "oci:relative",
            "oci:/x:",
            "docker-archive:x.tar",
            "docker://",
            "docker://HOST/UPPER",
            "docker://h/r@md5:abc",
            "ftp://x",
            "oci:/x\0",
        ] {
            assert!(ImageSource::parse(base).is_err(), "{base:?} should fail");
        }
    }
}
