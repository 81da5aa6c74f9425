//! Mayfly's engine: pure plans, thin appliers, and the sandbox lifecycle.
//!
//! A create flows: [`Engine`] validates and records it, computes the plans
//! (`plan::cgroup`, `plan::mounts`, `template`), applies the host-side parts,
//! and asks the zygote (`runtime::zygote`) to clone the sandbox's init
//! (`runtime::init`), which finishes setup inside the new namespaces.

pub mod api;
pub mod artifacts;
pub mod egress;
mod engine;
mod error;
pub mod files;
pub mod gateway;
pub mod image;
pub mod park;
pub mod plan;
pub mod runtime;
pub mod template;
pub mod templates;
pub mod tenancy;
pub mod workspace;

pub use api::{Caller, EventSubscription, ExecStream, ListSandboxes, SandboxApi};
pub use engine::Admission;
pub use engine::QuotaError;
pub use engine::{
    check_pool_name, start_one_shot_zygote, BuildEvents, Detached, Engine, EngineConfig, Lifecycle,
    LifecycleError, RecoveryReport, SandboxActivity, DEFAULT_FILE_BUFFER_BYTES,
    DEFAULT_MAX_COMMANDS, DEFAULT_REFILL_CONCURRENCY, DEFAULT_SPARE_NS_DIR, MAX_REFILL_CONCURRENCY,
};
pub use error::EngineError;
pub use gateway::{
    GatewayApi, GatewayError, InSandboxListener, PreviewAccess, RouteTarget,
    IN_SANDBOX_GATEWAY_PORT,
};
pub use mayfly_types::UploadSummary;
pub use runtime::zygote::Zygote;
pub use templates::TemplateApi;
pub use tenancy::{TenancyApi, TenancyError};
