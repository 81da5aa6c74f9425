//! A sandbox's egress: which policy a create gets, the prepared namespace
//! it joins, the live policy change, and the release at destroy.

use std::sync::Arc;

use mayfly_types::{EgressMode, EgressPolicy, SandboxId, TemplateRef};

use super::sandbox::Sandbox;
use super::Engine;
use crate::egress::{Attached, Egress, EgressConfig, Prepared};
use crate::EngineError;

/// The policy of a pool's sandbox until it is claimed: an interface, and
/// nothing it may reach.
pub(crate) fn closed_policy() -> EgressPolicy {
    EgressPolicy {
        mode: EgressMode::Allow,
        ..EgressPolicy::default()
    }
}

impl Engine {
    /// Starts the egress service (resolver, proxy, ruleset, namespace
    /// pool). When it cannot start, the daemon still serves sandboxes with
    /// policy `none`, and a create asking for more is refused with the
    /// reason, which is also logged now.
    pub async fn enable_egress(&self, cfg: EgressConfig) {
        match Egress::start(cfg).await {
            Ok(e) => {
                let _ = self.inner.egress.set(e);
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress policies other than `none` are unavailable");
                *self
                    .inner
                    .egress_unavailable
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            }
        }
    }

    /// The policy a create gets: its own, else its template's, else `none`.
    pub(crate) fn egress_for(
        &self,
        asked: Option<EgressPolicy>,
        template: &TemplateRef,
    ) -> Result<EgressPolicy, EngineError> {
        let policy = asked
            .or_else(|| {
                self.inner
                    .cfg
                    .template_egress
                    .iter()
                    .find(|(t, _)| t == template)
                    .map(|(_, p)| p.clone())
            })
            .unwrap_or_default();
        policy
            .validate()
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        if policy.mode != EgressMode::None {
            self.egress()?;
        }
        Ok(policy)
    }

    /// Whether creates with egress can be served (for a pool with network).
    pub(crate) fn egress_ready(&self) -> Result<(), EngineError> {
        self.egress().map(drop)
    }

    fn egress(&self) -> Result<&Egress, EngineError> {
        self.inner.egress.get().ok_or_else(|| {
            let why = self
                .inner
                .egress_unavailable
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| "this engine runs without a daemon".into());
            EngineError::Unavailable(format!(
                "egress policies other than `none` need the daemon's egress service: {why}"
            ))
        })
    }

    /// A prepared namespace and live state for a new sandbox whose policy
    /// is not `none`.
    pub(crate) async fn attach_net(
        &self,
        id: &SandboxId,
        policy: &EgressPolicy,
    ) -> Result<Option<(Prepared, Arc<Attached>)>, EngineError> {
        if policy.mode == EgressMode::None {
            return Ok(None);
        }
        self.egress()?
            .attach(id, policy.clone())
            .await
            .map(Some)
            .map_err(|e| EngineError::Internal(format!("network for sandbox {id}: {e}")))
    }

    /// Gives a sandbox's namespace back (its link removed) once its
    /// processes are gone.
    pub(crate) async fn release_net(&self, sb: &Sandbox) {
        let taken = sb.net.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some(p), Some(e)) = (taken, self.inner.egress.get()) {
            e.detach(p).await;
        }
    }

    /// Releases the namespace of a create that failed before its sandbox
    /// was recorded live.
    pub(crate) async fn release_unused_net(&self, net: Option<(Prepared, Arc<Attached>)>) {
        if let (Some((p, _)), Some(e)) = (net, self.inner.egress.get()) {
            e.detach(p).await;
        }
    }

    /// The live policy of a sandbox.
    pub fn egress_policy(&self, id: &SandboxId) -> Result<EgressPolicy, EngineError> {
        let sb = self.lookup(id)?;
        Ok(sb
            .egress
            .get()
            .map(|a| (*a.policy()).clone())
            .unwrap_or_default())
    }

    /// Replaces a sandbox's policy; new connections and DNS queries follow
    /// it at once. A sandbox created with `none` has no interface to open.
    pub fn set_egress_policy(
        &self,
        id: &SandboxId,
        policy: EgressPolicy,
    ) -> Result<EgressPolicy, EngineError> {
        policy
            .validate()
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let sb = self.lookup(id)?;
        let Some(attached) = sb.egress.get() else {
            if policy.mode == EgressMode::None {
                return Ok(policy);
            }
            return Err(EngineError::Conflict(format!(
                "sandbox {id} was created with egress `none` and has no network interface; create it with `allow` or `open` to change its policy later"
            )));
        };
        attached.set_policy(policy.clone());
        tracing::info!(%id, mode = policy.mode.as_str(), "egress policy changed");
        Ok(policy)
    }

    /// Removes the egress service's namespaces and table (daemon shutdown).
    pub(crate) fn stop_egress(&self) {
        if let Some(e) = self.inner.egress.get() {
            e.stop();
        }
    }
}
