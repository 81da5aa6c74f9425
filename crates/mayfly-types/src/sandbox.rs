//! Sandbox specs and their public description.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Limits, ResolvedLimits, SandboxId, UnixMillis};

/// Which root filesystem a sandbox starts from.
///
/// On the wire this is a string: `host` or `dir:/absolute/path`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TemplateRef {
    /// A read-only view of the host's system directories, with a minimal `/etc`.
    Host,
    /// Any root filesystem directory, used read-only as the lower layer.
    Dir(PathBuf),
    /// A template built with `mayfly template build` (its layers, config,
    /// services, hooks and defaults), by name.
    Named(String),
}

/// The longest template name.
pub const MAX_TEMPLATE_NAME: usize = 63;

/// Whether `s` is a valid template name: `[a-z0-9][a-z0-9._-]*`, at most
/// [`MAX_TEMPLATE_NAME`] bytes, and not `host`.
pub fn is_template_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_TEMPLATE_NAME
        && s != "host"
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

/// A template string that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unknown template `{0}`: use `host`, `dir:/absolute/path` or a built template's name ([a-z0-9][a-z0-9._-]*, at most 63 bytes)")]
    Unknown(String),
    #[error("template directory `{0}` must be an absolute, normalised path")]
    NotAbsolute(String),
}

impl std::str::FromStr for TemplateRef {
    type Err = TemplateError;
    fn from_str(s: &str) -> Result<Self, TemplateError> {
        if s == "host" {
            return Ok(TemplateRef::Host);
        }
        let Some(path) = s.strip_prefix("dir:") else {
            if is_template_name(s) {
                return Ok(TemplateRef::Named(s.to_string()));
            }
            return Err(TemplateError::Unknown(s.chars().take(128).collect()));
        };
        let p = std::path::Path::new(path);
        let normal = p.is_absolute()
            && p.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
        if !normal || path.contains('\0') || path.contains(':') || path.contains(',') {
            return Err(TemplateError::NotAbsolute(path.chars().take(256).collect()));
        }
        Ok(TemplateRef::Dir(p.to_path_buf()))
    }
}

impl std::fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateRef::Host => f.write_str("host"),
            TemplateRef::Dir(p) => write!(f, "dir:{}", p.display()),
            TemplateRef::Named(n) => f.write_str(n),
        }
    }
}

impl TryFrom<String> for TemplateRef {
    type Error = TemplateError;
    fn try_from(s: String) -> Result<Self, TemplateError> {
        s.parse()
    }
}

impl From<TemplateRef> for String {
    fn from(t: TemplateRef) -> String {
        t.to_string()
    }
}

/// A TTL outside the daemon's bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ttl of {given_secs}s is out of range; allowed is 1..={max_secs} seconds")]
pub struct TtlError {
    pub given_secs: u64,
    pub max_secs: u64,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// `host` (default) or `dir:/absolute/path`.
    #[schema(value_type = Option<String>, example = "host")]
    pub template: Option<TemplateRef>,
    /// Time to live in seconds; the daemon's default when absent. The
    /// sandbox is killed at its deadline even while commands run.
    pub ttl_secs: Option<u64>,
    /// Destroy the sandbox after this many seconds without a request or a
    /// running command; the daemon's default (off unless configured) when
    /// absent, 0 for never.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default)]
    pub limits: Limits,
    /// Environment given to every command, below per-exec env.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned as given.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What the sandbox may reach outside itself; the template's policy
    /// when absent, and `none` (loopback only) when it has none.
    #[serde(default)]
    pub egress: Option<crate::EgressPolicy>,
    /// Services started before the sandbox counts as ready, after the
    /// template's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<crate::ServiceSpec>,
    /// Lifecycle hooks, run after the template's at each point.
    #[serde(default, skip_serializing_if = "crate::Hooks::is_empty")]
    pub hooks: crate::Hooks,
    /// Paths inside the sandbox collected into the artifact store before
    /// removal, besides the template's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<String>,
    /// A git checkout into `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::GitWorkspace>,
    /// Secrets for every command of the sandbox; never stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::Secret>,
}

/// `POST /v1/sandboxes/{id}/keepalive`: resets the idle timer and, with
/// `ttl_secs`, moves the deadline to that many seconds from now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeepaliveRequest {
    pub ttl_secs: Option<u64>,
}

/// The lifecycle of a sandbox. Transitions are recorded in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Ready,
    Stopping,
    Destroyed,
    Failed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Ready => "ready",
            SandboxState::Stopping => "stopping",
            SandboxState::Destroyed => "destroyed",
            SandboxState::Failed => "failed",
        }
    }

    /// Whether no further transition can happen.
    pub fn is_terminal(self) -> bool {
        matches!(self, SandboxState::Destroyed | SandboxState::Failed)
    }

    /// The legal edges of the state machine, decided in one place.
    pub fn can_move_to(self, next: SandboxState) -> bool {
        use SandboxState::*;
        matches!(
            (self, next),
            (Creating, Ready)
                | (Creating, Failed)
                | (Creating, Stopping)
                | (Ready, Stopping)
                | (Ready, Failed)
                | (Stopping, Destroyed)
                | (Stopping, Failed)
        )
    }
}

impl std::str::FromStr for SandboxState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "creating" => SandboxState::Creating,
            "ready" => SandboxState::Ready,
            "stopping" => SandboxState::Stopping,
            "destroyed" => SandboxState::Destroyed,
            "failed" => SandboxState::Failed,
            other => return Err(format!("unknown sandbox state `{other}`")),
        })
    }
}

/// What the API says about a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxInfo {
    #[schema(value_type = String, example = "mf-abcdefghjkmn")]
    pub id: SandboxId,
    pub state: SandboxState,
    #[schema(value_type = String)]
    pub template: TemplateRef,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    pub limits: ResolvedLimits,
    pub labels: BTreeMap<String, String>,
    /// First host uid of the sandbox's private id range (root inside maps here).
    pub uid_base: u32,
    /// Host pid of the sandbox's init while it runs.
    pub init_pid: Option<u32>,
    /// Why the sandbox ended, once it has (`user`, `ttl`, `daemon_crash`, …).
    pub reason: Option<String>,
    /// Milliseconds from the create call to ready, once ready. For a
    /// sandbox taken from a pool: from the claim to the answer.
    pub create_ms: Option<f64>,
    /// The tenant that owns the sandbox; absent while it waits in a pool.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Whether the create was served by a warm pool or made on request.
    #[serde(default)]
    pub source: SandboxSource,
}

/// Where a sandbox came from: made on request, or claimed from a warm pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxSource {
    /// Booted for this request.
    #[default]
    Cold,
    /// Booted ahead, and claimed by this request (never used before).
    Pool,
}

impl SandboxSource {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxSource::Cold => "cold",
            SandboxSource::Pool => "pool",
        }
    }
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_strings_parse() {
        assert_eq!("host".parse::<TemplateRef>().unwrap(), TemplateRef::Host);
        assert_eq!(
            "dir:/srv/rootfs".parse::<TemplateRef>().unwrap(),
            TemplateRef::Dir("/srv/rootfs".into())
        );
        assert_eq!(
            "pg-15".parse::<TemplateRef>().unwrap(),
            TemplateRef::Named("pg-15".into())
        );
        for bad in [
            "",
            "docker:x",
            "Pg",
            "-pg",
            "dir:rel",
            "dir:/a/../b",
            "dir:/a:b",
            "dir:/a,b",
        ] {
            assert!(bad.parse::<TemplateRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn create_request_rejects_unknown_fields() {
        assert!(serde_json::from_str::<CreateRequest>(r#"{"tmpl":"host"}"#).is_err());
        let r: CreateRequest = serde_json::from_str(r#"{"template":"host","ttl_secs":5}"#).unwrap();
        assert_eq!(r.ttl_secs, Some(5));
    }

    #[test]
    fn only_legal_transitions_are_allowed() {
        use SandboxState::*;
        assert!(Creating.can_move_to(Ready));
        assert!(Ready.can_move_to(Stopping));
        assert!(!Destroyed.can_move_to(Ready));
        assert!(!Ready.can_move_to(Creating));
        assert!(!Failed.can_move_to(Destroyed));
    }
}
