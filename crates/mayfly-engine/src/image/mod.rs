//! Images and the content-addressed layer store.

mod store;

pub use store::{GcReport, LayerStore, Staging};

impl ImageError {
    /// Whether the error is the input's fault (a bad reference, digest or
    /// credential) rather than the host's.
    pub fn is_input(&self) -> bool {
        matches!(self, ImageError::BadKey(_))
    }
}

/// Errors of the layer store and of image fetching.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("`{0}` is not a layer key (sha256:<64 lowercase hex digits>)")]
    BadKey(String),
    #[error("layer store at `{path}`: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}
