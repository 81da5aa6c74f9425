//! The one way in: every front end (HTTP server, daemonless CLI, tests)
//! drives sandboxes through this trait.

use async_trait::async_trait;
use bytes::Bytes;
use mayfly_types::{
    CreateRequest, Event, ExecAudit, ExecEvent, ExecRequest, ExecResult, FileStat, MkdirRequest,
    PoolInfo, PoolSpec, ProcessInfo, ProcessOutput, RenameRequest, SandboxId, SandboxInfo,
    SandboxUsage, StartProcessRequest, StatsReport, UploadSummary,
};
use tokio::sync::mpsc;

use crate::EngineError;

/// The tenant of callers that present no API key: the host's operator (root
/// on the unix socket, the daemonless CLI, the daemon's own token).
pub const DEFAULT_TENANT: &str = "default";

/// What [`SandboxApi::list`] lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListSandboxes {
    /// Ended sandboxes too: then the `limit` most recently created.
    pub all: bool,
    /// Only this tenant's; `None`: every tenant's (an admin's view).
    pub tenant: Option<String>,
    /// With `all`, at most this many.
    pub limit: u32,
}

/// Who is asking: recorded in the audit trail, and what a request may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// How the caller reached us (`unix:uid=0`, `key:k-…`, `cli:pid=1`).
    pub name: String,
    /// The tenant whose sandboxes this caller sees and makes.
    pub tenant: String,
    /// Whether the caller may manage keys, tenants and pools, and sees every
    /// tenant's sandboxes.
    pub admin: bool,
}

impl Caller {
    /// The host's operator: admin, in the default tenant.
    pub fn new(name: impl Into<String>) -> Self {
        Caller {
            name: name.into(),
            tenant: DEFAULT_TENANT.to_owned(),
            admin: true,
        }
    }

    /// A tenant's caller, without admin rights.
    pub fn tenant(name: impl Into<String>, tenant: impl Into<String>) -> Self {
        Caller {
            name: name.into(),
            tenant: tenant.into(),
            admin: false,
        }
    }
}

/// A subscription to lifecycle events as they are committed: a broadcast
/// receiver of every event after `head`, the highest sequence number stored
/// when it began (read those up to it with [`SandboxApi::events`]).
pub use mayfly_store::Subscription as EventSubscription;

/// A streamed exec: events in order, ending with exactly one `ExecEvent::Exit`
/// (or with the channel closing if the sandbox died underneath it).
pub type ExecStream = mpsc::Receiver<ExecEvent>;

#[async_trait]
pub trait SandboxApi: Send + Sync + 'static {
    async fn create(&self, req: CreateRequest, caller: &Caller)
        -> Result<SandboxInfo, EngineError>;
    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, EngineError>;
    /// Live sandboxes, or with `all` the most recent recorded ones, oldest
    /// first; a tenant's only when `tenant` says so.
    async fn list(&self, q: ListSandboxes) -> Result<Vec<SandboxInfo>, EngineError>;
    /// Resets the idle timer and, with `ttl_secs`, moves the deadline.
    async fn keepalive(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<SandboxInfo, EngineError>;
    /// The sandbox's live egress policy.
    async fn egress_policy(
        &self,
        id: &SandboxId,
    ) -> Result<mayfly_types::EgressPolicy, EngineError> {
        Err(EngineError::NoSuchSandbox(id.clone()))
    }
    /// Replaces the sandbox's egress policy; it applies at once.
    async fn set_egress_policy(
        &self,
        id: &SandboxId,
        _policy: mayfly_types::EgressPolicy,
    ) -> Result<mayfly_types::EgressPolicy, EngineError> {
        Err(EngineError::NoSuchSandbox(id.clone()))
    }
    /// Idempotent: destroying a destroyed sandbox returns its record.
    async fn destroy(&self, id: &SandboxId, caller: &Caller) -> Result<SandboxInfo, EngineError>;

    async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        caller: &Caller,
    ) -> Result<ExecResult, EngineError>;
    async fn exec_stream(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        caller: &Caller,
    ) -> Result<ExecStream, EngineError>;

    async fn start_process(
        &self,
        id: &SandboxId,
        req: StartProcessRequest,
        caller: &Caller,
    ) -> Result<ProcessInfo, EngineError>;
    async fn list_processes(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, EngineError>;
    /// The sandbox's services: state, restarts, the end of their log.
    async fn services(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<mayfly_types::ServiceInfo>, EngineError> {
        Err(EngineError::NoSuchSandbox(id.clone()))
    }
    /// Waits up to `timeout_ms` (or forever) and returns the process's state.
    async fn wait_process(
        &self,
        id: &SandboxId,
        handle: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessInfo, EngineError>;
    async fn process_output(
        &self,
        id: &SandboxId,
        handle: u64,
    ) -> Result<ProcessOutput, EngineError>;
    async fn signal_process(
        &self,
        id: &SandboxId,
        handle: u64,
        signal: i32,
    ) -> Result<ProcessInfo, EngineError>;

    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError>;
    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: Bytes,
        mode: Option<u32>,
    ) -> Result<FileStat, EngineError>;
    async fn stat(&self, id: &SandboxId, path: &str) -> Result<FileStat, EngineError>;
    async fn list_dir(&self, id: &SandboxId, path: &str) -> Result<Vec<FileStat>, EngineError>;
    async fn mkdir(&self, id: &SandboxId, req: MkdirRequest) -> Result<FileStat, EngineError>;
    async fn remove(&self, id: &SandboxId, path: &str, recursive: bool) -> Result<(), EngineError>;
    async fn rename(&self, id: &SandboxId, req: RenameRequest) -> Result<(), EngineError>;
    /// Unpacks a tar archive into directory `dir` inside the sandbox.
    async fn upload_tar(
        &self,
        id: &SandboxId,
        dir: &str,
        tar: Bytes,
    ) -> Result<UploadSummary, EngineError>;
    /// Packs `path` (a file or a directory) inside the sandbox into a tar archive.
    async fn download_tar(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError>;

    /// Lifecycle events with a sequence number above `since`.
    /// The manifest of a sandbox's collected artifacts (empty until its
    /// destroy collected them); answers after the sandbox is gone.
    async fn list_artifacts(
        &self,
        id: &SandboxId,
    ) -> Result<mayfly_types::ArtifactList, EngineError> {
        Err(EngineError::NoSuchSandbox(id.clone()))
    }

    /// One complete artifact, opened for streaming.
    async fn open_artifact(
        &self,
        id: &SandboxId,
        name: &str,
    ) -> Result<(mayfly_types::ArtifactInfo, std::fs::File), EngineError> {
        let _ = name;
        Err(EngineError::NoSuchSandbox(id.clone()))
    }

    async fn events(&self, since: i64, limit: u32) -> Result<Vec<Event>, EngineError>;
    /// The exec audit trail of one sandbox.
    async fn audit(&self, id: &SandboxId) -> Result<Vec<ExecAudit>, EngineError>;

    /// The warm pools and how full they are.
    async fn pools(&self) -> Result<Vec<PoolInfo>, EngineError>;
    /// Creates or changes a pool (admin only).
    async fn set_pool(
        &self,
        name: &str,
        spec: PoolSpec,
        caller: &Caller,
    ) -> Result<PoolInfo, EngineError>;
    /// Empties a pool and stops its refill (admin only).
    async fn drain_pool(&self, name: &str, caller: &Caller) -> Result<PoolInfo, EngineError>;

    /// The tenant that owns a sandbox, or `None` while it waits unclaimed
    /// in a warm pool; `NoSuchSandbox` if there is none. What a front end
    /// checks before letting a non-admin caller near a sandbox.
    async fn owner_of(&self, id: &SandboxId) -> Result<Option<String>, EngineError> {
        Ok(self.get(id).await?.tenant)
    }

    /// Up to `limit` lifecycle events of `tenant`'s sandboxes with a
    /// sequence number above `since`. Events about no sandbox are the
    /// host's and never listed here.
    async fn tenant_events(
        &self,
        tenant: &str,
        since: i64,
        limit: u32,
    ) -> Result<Vec<Event>, EngineError> {
        // Pages through every event; an engine overrides this with a query.
        let mut owners: std::collections::HashMap<String, bool> = Default::default();
        let (mut out, mut cursor) = (Vec::new(), since);
        loop {
            let page = self.events(cursor, limit.max(1)).await?;
            if page.is_empty() {
                return Ok(out);
            }
            for e in page {
                cursor = e.seq;
                let Some(sid) = e.sandbox_id.clone() else {
                    continue;
                };
                let theirs = match owners.get(&sid) {
                    Some(t) => *t,
                    None => {
                        let t = match sid.parse::<SandboxId>() {
                            Ok(id) => {
                                matches!(self.owner_of(&id).await, Ok(Some(o)) if o == tenant)
                            }
                            Err(_) => false,
                        };
                        owners.insert(sid, t);
                        t
                    }
                };
                if theirs {
                    out.push(e);
                    if out.len() >= limit as usize {
                        return Ok(out);
                    }
                }
            }
        }
    }

    /// API keys and tenants, when this front end has them; without, every
    /// key is refused and only the host's operator can call.
    fn tenancy(&self) -> Option<&dyn crate::TenancyApi> {
        None
    }

    /// Exposed ports, routes and overrides, when this front end has a
    /// gateway; without, those routes answer 404.
    fn gateway(&self) -> Option<&dyn crate::GatewayApi> {
        None
    }

    /// Named templates, when this front end has a registry; without, those
    /// routes answer 404.
    fn templates(&self) -> Option<&dyn crate::TemplateApi> {
        None
    }

    /// Subscribes to lifecycle events as their transactions commit, in
    /// sequence order; a subscriber that lags reads the rest with
    /// [`SandboxApi::events`].
    fn subscribe_events(&self) -> Result<EventSubscription, EngineError>;
    /// What a live sandbox uses now: CPU, memory, pids, OOM kills, disk.
    async fn usage(&self, id: &SandboxId) -> Result<SandboxUsage, EngineError>;
    /// Spin-up percentiles, exec counts and iterations per five-minute
    /// window over the `window` that ends now, optionally for one `task`
    /// label; a caller who is not an admin sees only their tenant's.
    async fn stats(
        &self,
        window: std::time::Duration,
        task: Option<&str>,
        caller: &Caller,
    ) -> Result<StatsReport, EngineError>;
}
