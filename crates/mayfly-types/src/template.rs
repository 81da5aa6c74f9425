//! Template specs (the YAML file `mayfly template build` reads) and what the
//! API says about built templates.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{EgressPolicy, Hooks, Limits, ServiceSpec, UnixMillis};

/// A template file. Unknown fields are errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    /// `[a-z0-9][a-z0-9._-]*`, at most 63 bytes, not `host`.
    pub name: String,
    /// What the root starts from: `host`, `dir:/PATH`, `oci:/PATH[:TAG]` (an
    /// OCI image layout), `docker-archive:/PATH` (a `docker save` tarball)
    /// or `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]` (a registry).
    pub base: String,
    /// Build steps, run once, in order, each cached as a layer.
    #[serde(default)]
    pub steps: Vec<BuildStep>,
    /// Services every sandbox of this template runs.
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    #[serde(default)]
    pub hooks: Hooks,
    /// Default limits of the template's sandboxes (a create may override).
    #[serde(default)]
    pub limits: Limits,
    /// Egress policy of the template's sandboxes; `none` when absent.
    #[serde(default)]
    pub network: Option<EgressPolicy>,
    /// Default TTL in seconds.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// A warm pool of this template, created or updated by the build.
    #[serde(default)]
    pub pool: Option<TemplatePool>,
    /// Paths inside the sandbox collected as artifacts before removal.
    #[serde(default)]
    pub artifacts: Vec<String>,
}

/// One build step. In YAML, a one-key map: `- run: make`, `- copy: {src,
/// dest}`, `- env: {K: V}`, `- workdir: /src`, `- user: 999`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum BuildStep {
    /// A shell command (`/bin/sh -c`), or an argv.
    Run(RunStep),
    /// Copies a file or directory from the template's directory.
    Copy(CopyStep),
    /// Sets environment variables for later steps and every sandbox.
    Env(BTreeMap<String, String>),
    /// Sets the working directory for later steps and every sandbox.
    Workdir(String),
    /// Sets the uid for later steps and every sandbox's commands.
    User(u32),
}

/// `run: "make"` or `run: [make, -j2]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum RunStep {
    Shell(String),
    Argv(Vec<String>),
}

impl RunStep {
    /// The argv the step runs.
    pub fn argv(&self) -> Vec<String> {
        match self {
            RunStep::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            RunStep::Argv(v) => v.clone(),
        }
    }
}

/// `copy: {src: relative/path, dest: /absolute/path}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyStep {
    /// Relative to the template file's directory; may not leave it.
    pub src: String,
    /// Absolute path inside the image.
    pub dest: String,
}

/// The warm pool a template asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplatePool {
    pub target: u32,
    #[serde(default)]
    pub max: Option<u32>,
}

/// `POST /v1/templates`: build (or rebuild) a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildRequest {
    /// The template file's text (YAML).
    pub spec: String,
    /// The file's name, for error messages.
    #[serde(default)]
    pub file: Option<String>,
    /// Absolute directory that `copy` sources are relative to (the file's
    /// directory; the daemon reads it, so it must be on the daemon's host).
    #[serde(default)]
    pub context: Option<String>,
    /// Registry credentials for this build only; never stored.
    #[serde(default)]
    pub registry_auth: Option<RegistryAuth>,
    /// Ignore the step cache and rebuild every step.
    #[serde(default)]
    pub no_cache: bool,
}

/// Registry credentials: a user and password (or token) for basic auth,
/// also used to obtain a bearer token when the registry asks for one.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Progress of a build, streamed as SSE `progress` events, then one
/// `built` (a [`TemplateInfo`]) or `error` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BuildProgress {
    /// Fetching a base image layer: bytes done of total (when known).
    Pull {
        digest: String,
        done: u64,
        total: Option<u64>,
    },
    /// A layer unpacked into the layer store (or found there).
    Layer { digest: String, cached: bool },
    /// A build step started.
    Step {
        index: usize,
        count: usize,
        text: String,
    },
    /// A build step finished (or was served by the cache).
    StepDone { index: usize, cached: bool, ms: f64 },
    /// A line of a step's output.
    Output { line: String },
}

/// A built template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TemplateInfo {
    pub name: String,
    /// The base as written in the spec.
    pub base: String,
    /// Content digest of the whole template (its layers, config and spec).
    pub digest: String,
    /// Layer digests, bottom first.
    pub layers: Vec<String>,
    /// Bytes of the template's layers in the store (shared layers counted
    /// in full).
    pub size_bytes: u64,
    pub built_at: UnixMillis,
    /// Milliseconds the last build took.
    pub build_ms: f64,
    /// Steps served by the cache in the last build, of all steps.
    pub cached_steps: usize,
    pub steps: usize,
    /// Environment, working directory and uid of the template's commands.
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<u32>,
    /// The spec the template was built from.
    pub spec: TemplateSpec,
}

/// `GET /v1/templates`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<TemplateInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_one_key_maps() {
        let s: Vec<BuildStep> = serde_json::from_str(
            r#"[{"run":"make"},{"run":["a","b"]},{"user":999},{"workdir":"/w"},
               {"copy":{"src":"x","dest":"/y"}},{"env":{"A":"1"}}]"#,
        )
        .unwrap();
        assert_eq!(s[0], BuildStep::Run(RunStep::Shell("make".into())));
        assert_eq!(
            s[1],
            BuildStep::Run(RunStep::Argv(vec!["a".into(), "b".into()]))
        );
        assert_eq!(s[2], BuildStep::User(999));
        assert!(serde_json::from_str::<BuildStep>(r#"{"shell":"x"}"#).is_err());
    }
}
