//! Named templates: YAML specs built into layers, kept in a registry, and
//! resolved into what a sandbox's root is planned from.
//!
//! * `spec`: the file format and its checks (pure).
//! * `base`: a spec's `base:` string (pure).
//! * `keys`: the content keys of build steps, which the step cache is (pure).
//! * `registry`: built templates on disk, `<state>/templates/built/<name>.json`.
//!
//! Builds (steps run in build sandboxes, layers captured) are the engine's
//! (`engine/template_build.rs`), as is resolving a name for a create.

mod api;
pub mod base;
pub mod keys;
pub mod registry;
pub mod spec;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mayfly_types::{TemplateRef, TemplateSpec};

pub use api::TemplateApi;
pub use base::Base;
pub use registry::{Built, BuiltLayer, Registry};
pub use spec::parse_spec;

/// Errors of template files, builds and the registry.
#[derive(Debug, thiserror::Error)]
pub enum TemplatesError {
    /// A template file that does not parse or check.
    #[error("{file}{}: {}{reason}", position(.line, .column), if .field.is_empty() { String::new() } else { format!("{}: ", .field) })]
    Spec {
        file: String,
        field: String,
        line: Option<usize>,
        column: Option<usize>,
        reason: String,
    },
    #[error("template `{0}` is not built (see `mayfly template build`)")]
    NotFound(String),
    #[error("step {index} (`{text}`) failed: {reason}")]
    StepFailed {
        index: usize,
        text: String,
        reason: String,
    },
    #[error("copy step {index}: {reason}")]
    Copy { index: usize, reason: String },
    #[error("the base image: {0}")]
    Image(#[from] crate::image::ImageError),
    #[error("capturing step {index}'s layer: {source}")]
    Capture {
        index: usize,
        #[source]
        source: mayfly_sys::capture::CaptureError,
    },
    #[error("template registry at `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("template `{name}`'s record is damaged: {reason}")]
    Corrupt { name: String, reason: String },
}

fn position(line: &Option<usize>, column: &Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

/// A template made ready to plan a sandbox from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `host`, `dir:…` or the built template's name.
    pub template: TemplateRef,
    pub base: Base,
    /// Directories layered on the base, bottom first, each with the names
    /// at its top level (which decide the host overlays it joins).
    pub layers: Vec<(PathBuf, Vec<String>)>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<u32>,
    /// The spec of a built template (its services, hooks and defaults).
    pub spec: Option<Arc<TemplateSpec>>,
}

impl Resolved {
    /// `host` and `dir:` need no registry; a named template does (None).
    pub fn simple(template: &TemplateRef) -> Option<Resolved> {
        let base = match template {
            TemplateRef::Host => Base::Host,
            TemplateRef::Dir(d) => Base::Dir(d.clone()),
            TemplateRef::Named(_) => return None,
        };
        Some(Resolved {
            template: template.clone(),
            base,
            layers: Vec::new(),
            env: BTreeMap::new(),
            workdir: None,
            user: None,
            spec: None,
        })
    }

    /// A built template's record, with its layers found in `layers_root`.
    pub fn from_built(built: &Built, layers_root: &Path) -> Result<Resolved, TemplatesError> {
        let mut r = Resolved::partial(
            TemplateRef::Named(built.info.name.clone()),
            built.base.clone(),
            &built.layers,
            layers_root,
        )?;
        r.env = built.info.env.clone();
        r.workdir = built.info.workdir.clone();
        r.user = built.info.user;
        r.spec = Some(Arc::new(built.info.spec.clone()));
        Ok(r)
    }

    /// Layers on a base and nothing else (no config, no lifecycle): what a
    /// build sandbox of a template being built is made of.
    pub fn partial(
        template: TemplateRef,
        base: Base,
        built: &[BuiltLayer],
        layers_root: &Path,
    ) -> Result<Resolved, TemplatesError> {
        let store = crate::image::LayerStore::at(layers_root);
        let mut layers = Vec::with_capacity(built.len());
        for l in built {
            layers.push((store.path(&l.key)?, l.tops.clone()));
        }
        Ok(Resolved {
            template,
            base,
            layers,
            env: BTreeMap::new(),
            workdir: None,
            user: None,
            spec: None,
        })
    }
}
