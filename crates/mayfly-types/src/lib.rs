//! Wire and spec types shared by every Mayfly crate.
//!
//! This crate performs no I/O. Everything here is plain data plus validation,
//! so it can be used by the daemon, the client, the CLI and the tests alike.

mod artifact;
mod bytes;
mod egress;
mod error;
mod event;
mod exec;
mod files;
mod gateway;
mod id;
mod lifecycle;
mod limits;
mod pool;
mod sandbox;
mod template;
mod tenant;
mod usage;

pub use artifact::{ArtifactInfo, ArtifactList, ArtifactStatus, WorkspaceResult};
pub use bytes::Bytes64;
pub use egress::{
    masked, EgressEntry, EgressError, EgressMode, EgressPolicy, PortRange,
    DEFAULT_EGRESS_CONNECTIONS, MAX_EGRESS_CONNECTIONS, MAX_EGRESS_ENTRIES,
};
pub use error::{ApiError, ErrorCode};
pub use event::{Event, ExecAudit};
pub use exec::{
    ExecEvent, ExecRequest, ExecResult, ExitStatus, ProcessInfo, ProcessOutput, ProcessState,
    RunRequest, SignalRequest, StartProcessRequest, DEFAULT_OUTPUT_LIMIT, MAX_OUTPUT_LIMIT,
    MAX_TIMEOUT_MS,
};
pub use files::{FileKind, FileStat, MkdirRequest, RenameRequest, UploadSummary, MAX_FILE_BYTES};
pub use gateway::{
    check_port, check_service_name, BaselineUrl, ExposeRequest, OverrideRequest, PortInfo,
    RouteInfo, RouteList, RouteRequest, SandboxPorts, ServiceNameError, ServiceOverride, UrlError,
    MAX_SERVICE_NAME,
};
pub use id::{IdError, SandboxId};
pub use lifecycle::{
    FailurePolicy, GitWorkspace, Hook, Hooks, HttpProbe, Probe, RestartPolicy, Secret, ServiceInfo,
    ServiceSpec, ServiceState,
};
pub use limits::{LimitError, Limits, ResolvedLimits};
pub use pool::{PoolInfo, PoolList, PoolSpec};
pub use sandbox::{
    is_template_name, CreateRequest, KeepaliveRequest, SandboxInfo, SandboxList, SandboxSource,
    SandboxState, TemplateError, TemplateRef, TtlError, MAX_TEMPLATE_NAME,
};
pub use template::{
    BuildProgress, BuildRequest, BuildStep, CopyStep, RegistryAuth, RunStep, TemplateInfo,
    TemplateList, TemplatePool, TemplateSpec,
};
pub use tenant::{
    check_key_id, check_tenant_name, CreateKeyRequest, CreatedKey, KeyIdError, KeyInfo, KeyList,
    TenantInfo, TenantList, TenantNameError, TenantQuotas, TenantUsage, KEY_ID_LEN, KEY_PREFIX,
    MAX_COUNT_QUOTA, MAX_TENANT_NAME, MAX_TOTAL_QUOTA,
};
pub use usage::{
    DiskUsage, ExecCounts, Percentiles, SandboxUsage, SpinUp, SpinUpWindow, StatsReport, TaskStats,
    TaskWindow, TASK_LABEL, TASK_WINDOW_MS,
};

/// Milliseconds since the Unix epoch; the one time unit on the wire.
pub type UnixMillis = u64;
