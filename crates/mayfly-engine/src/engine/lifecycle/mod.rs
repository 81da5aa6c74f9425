//! What a sandbox runs besides its commands: services started before it
//! counts as ready, hooks around its lifecycle, and secrets given to its
//! commands. Built once per create by [`lifecycle_of`] (a template's part
//! first, then the request's: [`Lifecycle::with_template`]), carried in
//! `Boot`, and kept on the `Sandbox`.

mod check;
pub(crate) mod hooks;
mod probe;
pub(crate) mod secrets;
pub(crate) mod services;

use mayfly_types::{Hooks, Secret, ServiceSpec};

pub(crate) use check::check_secrets;

/// Why a lifecycle step failed. Messages never carry a secret's value: any
/// output quoted is redacted first.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// A service exited or failed its probe before it was ready.
    #[error("service `{name}` of sandbox {id} did not become ready: {reason}; its log ends with:\n{log}")]
    ServiceFailed {
        id: mayfly_types::SandboxId,
        name: String,
        reason: String,
        log: String,
    },
    /// A hook whose failure policy is `fail` failed.
    #[error(
        "{point} hook `{argv0}` of sandbox {id} failed ({status}); its output ends with:\n{output}"
    )]
    HookFailed {
        id: mayfly_types::SandboxId,
        point: &'static str,
        argv0: String,
        status: String,
        output: String,
    },
}

impl LifecycleError {
    pub fn code(&self) -> mayfly_types::ErrorCode {
        match self {
            // The sandbox could be made, but what it was asked to run failed.
            LifecycleError::ServiceFailed { .. } => mayfly_types::ErrorCode::ExecFailed,
            // A precondition the caller declared (a hook) does not hold.
            LifecycleError::HookFailed { .. } => mayfly_types::ErrorCode::Conflict,
        }
    }
}

/// A sandbox's services, hooks and create-time secrets, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// Started in this order, each ready before the next starts.
    pub services: Vec<ServiceSpec>,
    pub hooks: Hooks,
    /// Given to every command of the sandbox (services and hooks included).
    pub secrets: Vec<Secret>,
}

impl Lifecycle {
    /// A lifecycle from its parts, validated.
    pub fn new(
        services: Vec<ServiceSpec>,
        hooks: Hooks,
        secrets: Vec<Secret>,
    ) -> Result<Self, crate::EngineError> {
        let l = Lifecycle {
            services,
            hooks,
            secrets,
        };
        check::check(&l)?;
        Ok(l)
    }

    /// A template's lifecycle with a request's added: the template's
    /// services start first and its hooks run first at each point; a
    /// request's secret replaces the template's of the same name. The
    /// result is validated again (a request's service may not take a
    /// template's service's name).
    pub fn with_template(
        template: Lifecycle,
        request: Lifecycle,
    ) -> Result<Self, crate::EngineError> {
        let mut secrets: Vec<Secret> = template
            .secrets
            .into_iter()
            .filter(|s| !request.secrets.iter().any(|r| r.name == s.name))
            .collect();
        secrets.extend(request.secrets);
        let mut services = template.services;
        services.extend(request.services);
        Lifecycle::new(services, template.hooks.extended(&request.hooks), secrets)
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.hooks.is_empty() && self.secrets.is_empty()
    }
}

/// The lifecycle a create asks for: its services, hooks and secrets,
/// validated. A template's lifecycle is joined to it with
/// [`Lifecycle::with_template`] (in `check_create`).
pub(crate) fn lifecycle_of(
    services: Vec<ServiceSpec>,
    hooks: Hooks,
    secrets: Vec<Secret>,
) -> Result<Lifecycle, crate::EngineError> {
    Lifecycle::new(services, hooks, secrets)
}

/// Why a sandbox whose services or `after_create` hooks failed ended.
pub(crate) const CREATE_FAILED: &str = "create_failed";

impl crate::engine::Engine {
    /// What makes a booted sandbox ready beyond its init: its file secrets
    /// written, its services started and ready in order, then its
    /// `after_create` hooks. Any failure destroys the sandbox (as a failed
    /// create: nothing is left behind) and is returned.
    pub(crate) async fn start_lifecycle(
        &self,
        sb: &std::sync::Arc<crate::engine::sandbox::Sandbox>,
        caller: &crate::api::Caller,
    ) -> Result<(), crate::EngineError> {
        let life = sb.lifecycle();
        if life.services.is_empty()
            && life.hooks.after_create.is_empty()
            && secrets::secret_files(&life.secrets).is_empty()
        {
            return Ok(());
        }
        // Starting services counts as activity: no idle reaping meanwhile.
        let busy = crate::engine::sandbox::Busy::new(sb);
        let started = async {
            self.write_secret_files(sb, &[], 0).await?;
            self.start_services(sb).await?;
            self.run_hooks(sb, hooks::HookPoint::AfterCreate, caller)
                .await?;
            Ok(())
        }
        .await;
        drop(busy);
        if let Err(e) = &started {
            tracing::debug!(id = %sb.id, error = %e, "a create's services or hooks failed");
            let _ = self.destroy_sandbox(sb.clone(), CREATE_FAILED).await;
        }
        started
    }
}
