//! What front ends call to build, list, inspect and remove templates.

use mayfly_types::{BuildRequest, TemplateInfo};

use crate::{BuildEvents, Caller, EngineError};

/// Named templates, for front ends that have a registry.
#[async_trait::async_trait]
pub trait TemplateApi: Send + Sync {
    /// Builds (or rebuilds) a template; progress goes to `events`. Admin only.
    async fn template_build(
        &self,
        req: BuildRequest,
        caller: &Caller,
        events: Option<BuildEvents>,
    ) -> Result<TemplateInfo, EngineError>;
    async fn template_list(&self) -> Result<Vec<TemplateInfo>, EngineError>;
    async fn template_get(&self, name: &str) -> Result<TemplateInfo, EngineError>;
    /// Removes a template and the layers nothing else uses. Admin only.
    async fn template_remove(
        &self,
        name: &str,
        caller: &Caller,
    ) -> Result<TemplateInfo, EngineError>;
}

#[async_trait::async_trait]
impl TemplateApi for crate::Engine {
    async fn template_build(
        &self,
        req: BuildRequest,
        caller: &Caller,
        events: Option<BuildEvents>,
    ) -> Result<TemplateInfo, EngineError> {
        // A build boots a sandbox, runs steps in it and captures its layer:
        // one its caller leaves (a client hanging up, a daemon shutting
        // down with the request in flight) runs to its end in a task the
        // shutdown waits for, as a create does, so its sandbox is always
        // destroyed and never left stopping or creating.
        let (engine, tracker, caller) = (self.clone(), self.clone(), caller.clone());
        crate::engine::finish::FinishOnDrop::new(
            async move { engine.build_template(req, &caller, events).await },
            |built: Result<TemplateInfo, EngineError>| match built {
                Ok(t) => tracing::info!(template = %t.name, "built after its caller left"),
                Err(e) => tracing::info!(error = %e, "a build its caller left failed"),
            },
        )
        .on_handover(move |task| tracker.track_cleanup(task))
        .await
    }

    async fn template_list(&self) -> Result<Vec<TemplateInfo>, EngineError> {
        let engine = self.clone();
        tokio::task::spawn_blocking(move || engine.list_templates())
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
    }

    async fn template_get(&self, name: &str) -> Result<TemplateInfo, EngineError> {
        self.template_info(name)
    }

    async fn template_remove(
        &self,
        name: &str,
        caller: &Caller,
    ) -> Result<TemplateInfo, EngineError> {
        self.remove_template(name, caller).await
    }
}
