//! Mayfly's engine: pure plans, thin appliers, and the sandbox lifecycle.

pub mod api;
mod error;
pub mod files;

pub use api::{Caller, ExecStream, SandboxApi, UploadSummary};
pub use error::EngineError;
