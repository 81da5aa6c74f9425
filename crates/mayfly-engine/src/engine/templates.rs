//! Named templates in the engine: resolving a name for a create (cached,
//! checked against the record's modification time), listing, removing,
//! and collecting layers no template or live sandbox uses.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use mayfly_types::{SandboxId, TemplateInfo, TemplateRef};

use super::spec::check_template;
use super::Engine;
use crate::image::LayerStore;
use crate::templates::{Registry, Resolved, TemplatesError};
use crate::{Caller, EngineError};

/// The engine's template state.
#[derive(Default)]
pub(crate) struct TemplateState {
    /// Resolved named templates and their record's modification time.
    cache: Mutex<HashMap<String, (SystemTime, Arc<Resolved>)>>,
    /// The layers each live sandbox's root is made of.
    in_use: Mutex<HashMap<SandboxId, Vec<std::path::PathBuf>>>,
    /// One build at a time: builds are heavy and share the step cache.
    pub build: tokio::sync::Mutex<()>,
}

impl From<TemplatesError> for EngineError {
    fn from(e: TemplatesError) -> EngineError {
        match e {
            TemplatesError::NotFound(_)
            | TemplatesError::Spec { .. }
            | TemplatesError::StepFailed { .. }
            | TemplatesError::Copy { .. } => EngineError::Invalid(e.to_string()),
            TemplatesError::Image(ref i) if i.is_input() => EngineError::Invalid(e.to_string()),
            // A step that left a layer past the caps is the template's fault.
            TemplatesError::Capture {
                source:
                    mayfly_sys::capture::CaptureError::TooManyEntries(_)
                    | mayfly_sys::capture::CaptureError::TooDeep(_)
                    | mayfly_sys::capture::CaptureError::TooLarge(_),
                ..
            } => EngineError::Invalid(e.to_string()),
            other => EngineError::Internal(other.to_string()),
        }
    }
}

impl Engine {
    pub(crate) fn registry(&self) -> Registry {
        Registry::new(self.inner.cfg.registry_dir())
    }

    /// What a create's template stands for: `host` and `dir:` directly, a
    /// name from the registry.
    pub(crate) fn resolve_template(
        &self,
        template: &TemplateRef,
    ) -> Result<Arc<Resolved>, EngineError> {
        if let Some(r) = Resolved::simple(template) {
            check_template(template)?;
            return Ok(Arc::new(r));
        }
        let TemplateRef::Named(name) = template else {
            unreachable!("simple() resolves every other template");
        };
        let reg = self.registry();
        let cache = &self.inner.templates.cache;
        let mtime = reg.mtime(name);
        if let Some(m) = mtime {
            if let Some((t, r)) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
                if *t == m {
                    return Ok(r.clone());
                }
            }
        }
        let (built, mtime) = reg.load(name)?;
        let resolved = Arc::new(Resolved::from_built(&built, &self.inner.cfg.layers_dir())?);
        cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), (mtime, resolved.clone()));
        Ok(resolved)
    }

    /// Remembers the layers a live sandbox's root is made of.
    pub(crate) fn layers_in_use(&self, id: &SandboxId, resolved: &Resolved) {
        if resolved.layers.is_empty() {
            return;
        }
        self.inner
            .templates
            .in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id.clone(),
                resolved.layers.iter().map(|(p, _)| p.clone()).collect(),
            );
    }

    /// Forgets a sandbox's layers (it is gone).
    pub(crate) fn layers_released(&self, id: &SandboxId) {
        self.inner
            .templates
            .in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Every built template.
    pub fn list_templates(&self) -> Result<Vec<TemplateInfo>, EngineError> {
        Ok(self
            .registry()
            .list()?
            .into_iter()
            .map(|b| b.info)
            .collect())
    }

    /// One built template.
    pub fn template_info(&self, name: &str) -> Result<TemplateInfo, EngineError> {
        Ok(self.load_named(name)?.0.info)
    }

    /// A built template addressed by name (its own resource: a missing one
    /// is 404; named in a create, it is a bad argument, 400).
    fn load_named(
        &self,
        name: &str,
    ) -> Result<(crate::templates::Built, std::time::SystemTime), EngineError> {
        self.registry().load(name).map_err(|e| match e {
            TemplatesError::NotFound(_) => EngineError::NoSuchTemplate(e.to_string()),
            other => other.into(),
        })
    }

    /// Removes a built template, drains its pools' unclaimed sandboxes and
    /// collects the layers nothing uses any more. Admin only.
    pub async fn remove_template(
        &self,
        name: &str,
        caller: &Caller,
    ) -> Result<TemplateInfo, EngineError> {
        if !caller.admin {
            return Err(EngineError::Forbidden(
                "managing templates needs an admin key".into(),
            ));
        }
        let _build = self.inner.templates.build.lock().await;
        let (built, _) = self.load_named(name)?;
        self.registry().remove(name)?;
        self.inner
            .templates
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        self.refresh_template_pools(name);
        self.collect_layers().await?;
        Ok(built.info)
    }

    /// Removes every layer that no built template and no live sandbox uses.
    pub(crate) async fn collect_layers(&self) -> Result<crate::image::GcReport, EngineError> {
        let root = self.inner.cfg.layers_dir();
        let mut keep = BTreeSet::new();
        for b in self.registry().list()? {
            keep.extend(b.layers.into_iter().map(|l| l.key));
        }
        let in_use: Vec<std::path::PathBuf> = self
            .inner
            .templates
            .in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
            .cloned()
            .collect();
        for p in in_use {
            if let Some(hex) = p.file_name().and_then(|n| n.to_str()) {
                keep.insert(format!("sha256:{hex}"));
            }
        }
        let report = tokio::task::spawn_blocking(move || {
            if !root.exists() {
                return Ok(Default::default());
            }
            LayerStore::open(&root)?.gc(&keep)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("layer collection: {e}")))?
        .map_err(TemplatesError::from)?;
        if !report.removed.is_empty() {
            tracing::info!(
                layers = report.removed.len(),
                bytes = report.freed_bytes,
                "removed unused layers"
            );
        }
        Ok(report)
    }
}
