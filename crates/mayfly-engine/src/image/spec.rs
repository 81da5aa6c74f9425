//! The parts of the OCI image and Docker formats Mayfly reads (pure).
//!
//! Only the fields used are declared; unknown fields are ignored, since
//! images carry many Mayfly has no use for.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ImageConfig, ImageError};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The annotation that names a manifest in an OCI layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Manifests and blobs are small JSON; anything bigger is refused before it
/// is parsed.
pub const MAX_JSON_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
}

/// An image index (OCI) or manifest list (Docker), and an OCI layout's
/// `index.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Index {
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// What a manifest blob turned out to be.
pub enum Parsed {
    Index(Index),
    Manifest(Manifest),
}

/// Parses a manifest blob, telling an index from an image manifest by its
/// `mediaType` or, when absent, by its shape.
pub fn parse_manifest(bytes: &[u8], what: &str) -> Result<Parsed, ImageError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    let bad = |e: serde_json::Error| ImageError::BadJson {
        what: what.to_owned(),
        reason: e.to_string(),
    };
    let probe: Probe = serde_json::from_slice(bytes).map_err(bad)?;
    let is_index = match probe.media_type.as_deref() {
        Some(OCI_INDEX | DOCKER_LIST) => true,
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => false,
        Some(other) => {
            return Err(ImageError::Unsupported {
                what: format!("{what} of media type `{other}`"),
            })
        }
        None => probe.manifests.is_some(),
    };
    if is_index {
        serde_json::from_slice(bytes)
            .map(Parsed::Index)
            .map_err(bad)
    } else {
        serde_json::from_slice(bytes)
            .map(Parsed::Manifest)
            .map_err(bad)
    }
}

/// Picks the linux/amd64 entry of an index; an index with a single entry
/// and no platform is taken as it is.
pub fn pick_platform<'a>(index: &'a Index, what: &str) -> Result<&'a Descriptor, ImageError> {
    let linux_amd64 = |d: &&Descriptor| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    };
    if let Some(d) = index.manifests.iter().find(linux_amd64) {
        return Ok(d);
    }
    match index.manifests.as_slice() {
        [only] if only.platform.is_none() => Ok(only),
        _ => Err(ImageError::NoManifest {
            what: format!("{what} has no linux/amd64 image"),
        }),
    }
}

/// Picks the manifest an OCI layout's `index.json` names `reference`, or
/// with none asked for, its only manifest or the one named `latest`.
pub fn pick_reference<'a>(
    index: &'a Index,
    reference: Option<&str>,
) -> Result<&'a Descriptor, ImageError> {
    let named = |name: &str| {
        index
            .manifests
            .iter()
            .find(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(name))
    };
    match reference {
        Some(r) => named(r).ok_or_else(|| ImageError::NoManifest {
            what: format!("the layout has no manifest named `{r}`"),
        }),
        None => match index.manifests.as_slice() {
            [only] => Ok(only),
            _ => named("latest").ok_or_else(|| ImageError::NoManifest {
                what: "the layout holds several manifests and none is named `latest`; \
                       name one with `oci:/PATH:REF`"
                    .to_owned(),
            }),
        },
    }
}

/// The runtime part of an image config blob.
#[derive(Debug, Default, Deserialize)]
pub struct ConfigFile {
    #[serde(default)]
    pub config: Option<RunConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// Parses a config blob.
pub fn parse_config(bytes: &[u8]) -> Result<ConfigFile, ImageError> {
    serde_json::from_slice(bytes).map_err(|e| ImageError::BadJson {
        what: "the image config".to_owned(),
        reason: e.to_string(),
    })
}

impl ConfigFile {
    /// What Mayfly keeps of the config. `Env` entries without `=` are
    /// dropped; empty strings count as absent.
    pub fn image_config(&self) -> ImageConfig {
        let c = self.config.as_ref();
        let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        ImageConfig {
            env: c
                .and_then(|c| c.env.as_ref())
                .map(|env| {
                    env.iter()
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
            entrypoint: c.and_then(|c| c.entrypoint.clone()).unwrap_or_default(),
            cmd: c.and_then(|c| c.cmd.clone()).unwrap_or_default(),
            workdir: c.and_then(|c| non_empty(&c.working_dir)),
            user: c.and_then(|c| non_empty(&c.user)),
        }
    }
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ArchiveEntry {
    pub config: String,
    #[serde(default)]
    pub layers: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(digest: &str, plat: Option<(&str, &str)>, name: Option<&str>) -> Descriptor {
        Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: digest.into(),
            size: 1,
            annotations: name
                .map(|n| [(REF_NAME.to_owned(), n.to_owned())].into())
                .unwrap_or_default(),
            platform: plat.map(|(os, arch)| Platform {
                os: os.into(),
                architecture: arch.into(),
            }),
        }
    }

    #[test]
    fn index_picks_linux_amd64() {
        let index = Index {
            manifests: vec![
                desc("a", Some(("linux", "arm64")), None),
                desc("b", Some(("linux", "amd64")), None),
            ],
        };
        assert_eq!(pick_platform(&index, "x").unwrap().digest, "b");
        let arm = Index {
            manifests: vec![desc("a", Some(("linux", "arm64")), None)],
        };
        assert!(pick_platform(&arm, "x").is_err());
    }

    #[test]
    fn layout_reference_picks_by_annotation_or_latest() {
        let index = Index {
            manifests: vec![desc("a", None, Some("v1")), desc("b", None, Some("latest"))],
        };
        assert_eq!(pick_reference(&index, Some("v1")).unwrap().digest, "a");
        assert_eq!(pick_reference(&index, None).unwrap().digest, "b");
        assert!(pick_reference(&index, Some("v2")).is_err());
    }

    #[test]
    fn config_keeps_env_entrypoint_cmd_workdir_user() {
        let c = parse_config(
            br#"{"config":{"Env":["A=1","B=x=y","junk"],"Entrypoint":["/e"],"Cmd":["c"],
                "WorkingDir":"/w","User":""}}"#,
        )
        .unwrap()
        .image_config();
        assert_eq!(
            c.env,
            vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        assert_eq!(c.entrypoint, vec!["/e".to_owned()]);
        assert_eq!(c.cmd, vec!["c".to_owned()]);
        assert_eq!(c.workdir.as_deref(), Some("/w"));
        assert_eq!(c.user, None);
    }

    #[test]
    fn manifest_kind_is_told_by_media_type_or_shape() {
        let m = br#"{"schemaVersion":2,"config":{"digest":"sha256:1","size":1},"layers":[]}"#;
        assert!(matches!(parse_manifest(m, "m"), Ok(Parsed::Manifest(_))));
        let i = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(parse_manifest(i, "m"), Ok(Parsed::Index(_))));
        let odd = br#"{"mediaType":"text/plain"}"#;
        assert!(parse_manifest(odd, "m").is_err());
    }
}
