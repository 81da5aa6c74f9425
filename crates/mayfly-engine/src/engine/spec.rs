//! What a create asks for, validated: the checks, the environment every
//! command starts from, the TTL, and [`Boot`], what the engine boots.

use std::sync::Arc;

use mayfly_types::{CreateRequest, SandboxId, TemplateRef};

use crate::api::Caller;
use crate::EngineError;

/// Where a pool's unclaimed sandbox's deadline sits: never reached.
pub(crate) const POOLED_EXPIRY: u64 = i64::MAX as u64;

/// What to boot, validated.
#[derive(Debug, Clone)]
pub(crate) struct Boot {
    pub template: TemplateRef,
    pub limits: mayfly_types::ResolvedLimits,
    pub ttl_secs: u64,
    /// Idle timeout in seconds; 0 for none.
    pub idle_secs: u64,
    pub env: std::collections::BTreeMap<String, String>,
    pub labels: std::collections::BTreeMap<String, String>,
    /// `None` for a pool's sandbox, until it is claimed.
    pub tenant: Option<String>,
    /// The pool this sandbox is booted for.
    pub pool: Option<String>,
    pub egress: mayfly_types::EgressPolicy,
    /// What the template stands for (layers, defaults, lifecycle).
    pub resolved: std::sync::Arc<crate::templates::Resolved>,
    /// Paths collected before teardown (a template prepends its own).
    pub artifacts: Vec<String>,
    /// A git checkout into `/workspace`, made once the sandbox is up.
    pub workspace: Option<mayfly_types::GitWorkspace>,
    /// Services, hooks and secrets (the template's, then the request's).
    pub lifecycle: std::sync::Arc<super::Lifecycle>,
}

/// A `dir:` template must be a directory.
pub(crate) fn check_template(template: &TemplateRef) -> Result<(), EngineError> {
    if let TemplateRef::Dir(d) = template {
        if !std::fs::metadata(d).is_ok_and(|m| m.is_dir()) {
            return Err(EngineError::Invalid(format!(
                "template directory `{}` does not exist or is not a directory",
                d.display()
            )));
        }
    }
    Ok(())
}

/// A `dir:` template and a local workspace repository (a path or a
/// `file://` URL) name files on the daemon's host, which the daemon reads as
/// root: only an admin may name them. Checked before the path is looked at,
/// so a tenant cannot even learn whether it exists.
///
/// A tenant's remote repository is fetched by the daemon, from the host's
/// network: with `tenant_repos` set, it must start with one of them.
pub(crate) fn check_host_paths(
    req: &CreateRequest,
    caller: &Caller,
    tenant_repos: &[String],
) -> Result<(), EngineError> {
    if caller.admin {
        return Ok(());
    }
    if let Some(TemplateRef::Dir(_)) = &req.template {
        return Err(EngineError::Forbidden(
            "a `dir:` template names a directory on the daemon's host: only an admin may use one; use `host` or a built template".into(),
        ));
    }
    if let Some(ws) = &req.workspace {
        if crate::workspace::is_local_repo(&ws.repo) {
            return Err(EngineError::Forbidden(
                "a workspace repository on the daemon's host (a path or a file:// URL) is for admins only; use an http(s):// or git:// URL".into(),
            ));
        }
        if !tenant_repos.is_empty() && !tenant_repos.iter().any(|p| ws.repo.starts_with(p.as_str()))
        {
            return Err(EngineError::Forbidden(format!(
                "this daemon takes a tenant's workspace repositories only from: {}",
                tenant_repos.join(", ")
            )));
        }
    }
    Ok(())
}

/// Environment keys must be non-empty, without `=` or NUL.
pub(crate) fn check_env(
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(), EngineError> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(EngineError::Invalid(format!(
                "environment variable name `{}` is invalid: it must be non-empty and contain neither `=` nor NUL",
                k.escape_debug()
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::Invalid(format!(
                "the value of environment variable `{}` contains a NUL byte",
                k.escape_debug()
            )));
        }
    }
    Ok(())
}

pub(crate) fn check_labels(
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), EngineError> {
    if labels.len() > 64 || labels.iter().any(|(k, v)| k.len() > 128 || v.len() > 1024) {
        return Err(EngineError::Invalid(
            "labels are limited to 64 entries, keys of 128 bytes and values of 1024 bytes".into(),
        ));
    }
    for (k, v) in labels {
        if k.is_empty() || k.chars().any(char::is_control) || v.chars().any(char::is_control) {
            return Err(EngineError::Invalid(format!(
                "label `{}` is invalid: keys must be non-empty, and neither keys nor values may \
                 hold control characters",
                k.chars().take(64).collect::<String>().escape_debug()
            )));
        }
    }
    Ok(())
}

pub(crate) fn random_id() -> Result<SandboxId, EngineError> {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).map_err(|e| EngineError::Internal(format!("getrandom: {e}")))?;
    Ok(SandboxId::from_entropy(b))
}

/// The environment every command of a sandbox starts from.
pub(crate) fn base_env(
    id: &SandboxId,
    extra: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut env: std::collections::BTreeMap<String, String> = [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/root"),
        ("LANG", "C.UTF-8"),
        ("TERM", "xterm"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    env.insert("HOSTNAME".into(), id.to_string());
    env.insert("MAYFLY_SANDBOX_ID".into(), id.to_string());
    for (k, v) in extra {
        env.insert(k.clone(), v.clone());
    }
    env.into_iter().collect()
}

/// A create's TTL in seconds: the default when none is asked for, and
/// never above the maximum.
pub(crate) fn ttl_secs(cfg: &super::EngineConfig, asked: Option<u64>) -> Result<u64, EngineError> {
    match asked {
        None => Ok(cfg.default_ttl.as_secs()),
        Some(t) if t >= 1 && t <= cfg.max_ttl.as_secs() => Ok(t),
        Some(t) => Err(EngineError::Invalid(
            mayfly_types::TtlError {
                given_secs: t,
                max_secs: cfg.max_ttl.as_secs(),
            }
            .to_string(),
        )),
    }
}

impl super::Engine {
    /// Validates a create request into what to boot. A named template's
    /// layers, env, limits, TTL and network are the defaults the request
    /// overrides.
    pub(crate) fn check_create(
        &self,
        req: CreateRequest,
        resolved: Option<Arc<crate::templates::Resolved>>,
        caller: &Caller,
    ) -> Result<Boot, EngineError> {
        let cfg = &self.inner.cfg;
        if self
            .inner
            .shutting_down
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(EngineError::ShuttingDown);
        }
        check_host_paths(&req, caller, &cfg.tenant_repos)?;
        let template = req.template.clone().unwrap_or(TemplateRef::Host);
        let resolved = match resolved {
            Some(r) => r,
            None => self.resolve_template(&template)?,
        };
        let tspec = resolved.spec.as_deref();
        let ttl = ttl_secs(cfg, req.ttl_secs.or(tspec.and_then(|s| s.ttl_secs)))?;
        let idle_secs = match req.idle_timeout_secs {
            None => cfg.default_idle.as_secs(),
            Some(t) if t <= cfg.max_ttl.as_secs() => t,
            Some(t) => {
                return Err(EngineError::Invalid(format!(
                    "idle_timeout_secs of {t} is out of range; allowed is 0..={}",
                    cfg.max_ttl.as_secs()
                )))
            }
        };
        let limits = self
            .template_limits(&resolved)?
            .with(&req.limits)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        check_env(&req.env)?;
        check_labels(&req.labels)?;
        let egress = self.egress_for(
            req.egress.or_else(|| tspec.and_then(|s| s.network.clone())),
            &template,
        )?;
        let mut env = resolved.env.clone();
        env.extend(req.env);
        // The template's artifact paths, then the request's.
        let mut artifacts: Vec<String> = tspec.map(|s| s.artifacts.clone()).unwrap_or_default();
        artifacts.extend(req.artifacts);
        crate::artifacts::check_artifact_paths(&artifacts)?;
        if let Some(ws) = &req.workspace {
            crate::workspace::check_workspace(ws)?;
        }
        // The template's services and hooks first, then the request's.
        let lifecycle = super::lifecycle::lifecycle_of(req.services, req.hooks, req.secrets)?;
        let lifecycle = match tspec {
            Some(s) => super::Lifecycle::with_template(template_lifecycle(s)?, lifecycle)?,
            None => lifecycle,
        };
        Ok(Boot {
            template,
            limits,
            ttl_secs: ttl,
            idle_secs,
            env,
            labels: req.labels,
            tenant: Some(caller.tenant.clone()),
            pool: None,
            egress,
            resolved,
            artifacts,
            workspace: req.workspace,
            lifecycle: Arc::new(lifecycle),
        })
    }

    /// The daemon's default limits under a template's own.
    pub(crate) fn template_limits(
        &self,
        resolved: &crate::templates::Resolved,
    ) -> Result<mayfly_types::ResolvedLimits, EngineError> {
        let cfg = &self.inner.cfg;
        match resolved.spec.as_deref() {
            Some(s) => cfg
                .default_limits
                .with(&s.limits)
                .map_err(|e| EngineError::Invalid(format!("template limits: {e}"))),
            None => Ok(cfg.default_limits),
        }
    }
}

/// A template's services and hooks (its secrets come only with creates).
pub(crate) fn template_lifecycle(
    spec: &mayfly_types::TemplateSpec,
) -> Result<super::Lifecycle, EngineError> {
    super::Lifecycle::new(spec.services.clone(), spec.hooks.clone(), Vec::new())
}
