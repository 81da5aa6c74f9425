//! An in-memory [`SandboxApi`] for testing the HTTP layer without sandboxes.
//!
//! Shared by the server's and the client's tests (the client includes this
//! file by path). Commands are a tiny script language:
//!
//! - `echo ARGS…` writes the args and a newline to stdout;
//! - `cat` copies stdin to stdout;
//! - `warn TEXT` writes TEXT to stderr;
//! - `exit N` exits with N;
//! - `gated`: (streamed) writes `first` to stdout, waits for [`FakeEngine::open_gate`],
//!   then writes `second` to stderr and exits 0;
//! - `vanish`: (streamed) writes `partial` and ends without an exit status;
//! - `nosuch` fails to start (422).
//!
//! Paths: `/internal` fails with an internal error, `/panic` panics, and a
//! path containing `..` is invalid.
//!
//! Tenants and keys live in a real in-memory store (`fake_tenancy.rs`);
//! creates honour a tenant's `max_live` quota.
//! Events are published on a bus, as the store does, under the same lock
//! that assigns their sequence numbers; [`FakeEngine::emit`] adds any event,
//! and [`FakeEngine::store_only`] one the bus never carries (as another
//! process's write).

#![allow(dead_code)]

#[path = "fake_tenancy.rs"]
mod tenancy;

#[path = "fake_exec.rs"]
mod exec;
#[path = "fake_files.rs"]
mod files;
#[path = "fake_processes.rs"]
mod processes;
#[path = "fake_records.rs"]
mod records;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use mayfly_engine::{Caller, EngineError, ExecStream, SandboxApi, UploadSummary};
use mayfly_types::{
    CreateRequest, Event, ExecAudit, ExecEvent, ExecRequest, ExecResult, FileStat, MkdirRequest,
    ProcessInfo, ProcessOutput, RenameRequest, ResolvedLimits, SandboxId, SandboxInfo,
    SandboxState, StartProcessRequest, TemplateRef,
};
use tokio::sync::{mpsc, Notify};

#[derive(Default)]
pub struct FakeEngine {
    state: Mutex<State>,
    next_id: AtomicU64,
    gate: Arc<Notify>,
    tenancy: tenancy::FakeTenancy,
}

#[derive(Default)]
struct State {
    sandboxes: BTreeMap<SandboxId, SandboxInfo>,
    files: HashMap<(SandboxId, String), Vec<u8>>,
    dirs: HashMap<(SandboxId, String), u32>,
    processes: HashMap<SandboxId, Vec<ProcessInfo>>,
    events: Vec<Event>,
    audit: Vec<ExecAudit>,
    tars: HashMap<(SandboxId, String), Vec<u8>>,
    /// Every caller the engine was handed, in order.
    callers: Vec<String>,
    pools: BTreeMap<String, mayfly_types::PoolInfo>,
    bus: Bus,
    /// The (window, task, tenant) of each stats call.
    stats_calls: Vec<(std::time::Duration, Option<String>, String)>,
}

/// The fake's event bus.
struct Bus(tokio::sync::broadcast::Sender<Event>);

impl Default for Bus {
    fn default() -> Self {
        Bus(tokio::sync::broadcast::Sender::new(1024))
    }
}

impl FakeEngine {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A fake whose bus holds only `capacity` events for a slow subscriber.
    pub fn with_bus_capacity(capacity: usize) -> Arc<Self> {
        let fake = Self::default();
        fake.lock().bus = Bus(tokio::sync::broadcast::Sender::new(capacity));
        Arc::new(fake)
    }

    /// Stores and publishes an event; returns its sequence number.
    pub fn emit(&self, sandbox: Option<&SandboxId>, kind: &str, detail: serde_json::Value) -> i64 {
        let mut st = self.lock();
        let ev = Self::stored(&mut st, sandbox, kind, detail);
        let seq = ev.seq;
        let _ = st.bus.0.send(ev);
        seq
    }

    /// Stores an event without publishing it, as a write by another
    /// process sharing the store would be.
    pub fn store_only(&self, kind: &str) -> i64 {
        Self::stored(&mut self.lock(), None, kind, serde_json::json!({})).seq
    }

    /// The (window, task, caller's tenant) of each stats call so far.
    pub fn stats_calls(&self) -> Vec<(std::time::Duration, Option<String>, String)> {
        self.lock().stats_calls.clone()
    }

    fn stored(
        st: &mut State,
        sandbox: Option<&SandboxId>,
        kind: &str,
        detail: serde_json::Value,
    ) -> Event {
        let seq = st.events.len() as i64 + 1;
        let ev = Event {
            seq,
            at: 1_700_000_000_000 + seq as u64,
            sandbox_id: sandbox.map(|s| s.to_string()),
            kind: kind.to_owned(),
            detail,
        };
        st.events.push(ev.clone());
        ev
    }

    /// Lets a `gated` stream continue past its first event.
    pub fn open_gate(&self) {
        self.gate.notify_one();
    }

    /// The callers recorded so far.
    pub fn callers(&self) -> Vec<String> {
        self.lock().callers.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ready(&self, id: &SandboxId) -> Result<(), EngineError> {
        let st = self.lock();
        let sb = st
            .sandboxes
            .get(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.clone()))?;
        if sb.state != SandboxState::Ready {
            return Err(EngineError::NotReady {
                id: id.clone(),
                state: sb.state,
            });
        }
        Ok(())
    }

    fn event(st: &mut State, id: &SandboxId, kind: &str) {
        let ev = Self::stored(st, Some(id), kind, serde_json::json!({}));
        let _ = st.bus.0.send(ev);
    }

    fn check_path(path: &str) -> Result<(), EngineError> {
        if path == "/panic" {
            panic!("the fake engine was asked to panic");
        }
        if path == "/internal" {
            return Err(EngineError::Internal(
                "disk on fire at /var/lib/mayfly/secret".into(),
            ));
        }
        if path.split('/').any(|c| c == "..") {
            return Err(EngineError::Invalid(format!(
                "path `{path}` escapes the sandbox"
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl SandboxApi for FakeEngine {
    async fn create(
        &self,
        req: CreateRequest,
        caller: &Caller,
    ) -> Result<SandboxInfo, EngineError> {
        let limits = ResolvedLimits::DEFAULT
            .with(&req.limits)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.admit(caller)?;
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut entropy = [0u8; 12];
        for (i, b) in entropy.iter_mut().enumerate() {
            *b = (n >> (5 * (i % 12))) as u8 & 31;
        }
        let id = SandboxId::from_entropy(entropy);
        let ttl = req.ttl_secs.unwrap_or(600);
        let info = SandboxInfo {
            id: id.clone(),
            state: SandboxState::Ready,
            template: req.template.unwrap_or(TemplateRef::Host),
            created_at: 1_700_000_000_000,
            expires_at: 1_700_000_000_000 + ttl * 1000,
            limits,
            labels: req.labels,
            uid_base: 100_000,
            init_pid: Some(4242),
            reason: None,
            create_ms: Some(1.5),
            tenant: Some(caller.tenant.clone()),
            source: mayfly_types::SandboxSource::Cold,
        };
        let mut st = self.lock();
        st.callers.push(caller.name.clone());
        st.sandboxes.insert(id.clone(), info.clone());
        Self::event(&mut st, &id, "created");
        Ok(info)
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, EngineError> {
        self.lock()
            .sandboxes
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::NoSuchSandbox(id.clone()))
    }

    async fn list(&self, q: mayfly_engine::ListSandboxes) -> Result<Vec<SandboxInfo>, EngineError> {
        let mut out: Vec<SandboxInfo> = self
            .lock()
            .sandboxes
            .values()
            .filter(|s| q.all || !s.state.is_terminal())
            .filter(|s| q.tenant.is_none() || s.tenant == q.tenant)
            .cloned()
            .collect();
        if q.all {
            out.sort_by_key(|s| s.created_at);
            let skip = out.len().saturating_sub(q.limit as usize);
            out.drain(..skip);
        }
        Ok(out)
    }

    async fn destroy(&self, id: &SandboxId, caller: &Caller) -> Result<SandboxInfo, EngineError> {
        let mut st = self.lock();
        st.callers.push(caller.name.clone());
        let sb = st
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.clone()))?;
        if sb.state != SandboxState::Destroyed {
            sb.state = SandboxState::Destroyed;
            sb.reason = Some("user".into());
            sb.init_pid = None;
        }
        let info = sb.clone();
        Self::event(&mut st, id, "destroyed");
        Ok(info)
    }

    async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        caller: &Caller,
    ) -> Result<ExecResult, EngineError> {
        self.ready(id)?;
        let r = Self::run(id, &req)?;
        self.record(id, &req, &r, caller);
        Ok(r)
    }

    async fn exec_stream(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        caller: &Caller,
    ) -> Result<ExecStream, EngineError> {
        self.ready(id)?;
        let r = Self::run(id, &req)?;
        self.record(id, &req, &r, caller);
        let (tx, rx) = mpsc::channel(4);
        let gate = self.gate.clone();
        let argv0 = req.argv[0].clone();
        tokio::spawn(async move {
            let ExecResult { stdout, stderr, .. } = r.clone();
            if !stdout.0.is_empty() && tx.send(ExecEvent::Stdout(stdout.0)).await.is_err() {
                return;
            }
            if argv0 == "vanish" {
                return; // dropping tx: the stream ends without an exit
            }
            if argv0 == "gated" {
                gate.notified().await;
            }
            if !stderr.0.is_empty() && tx.send(ExecEvent::Stderr(stderr.0)).await.is_err() {
                return;
            }
            let _ = tx.send(ExecEvent::Exit(r)).await;
        });
        Ok(rx)
    }

    async fn start_process(
        &self,
        id: &SandboxId,
        req: StartProcessRequest,
        caller: &Caller,
    ) -> Result<ProcessInfo, EngineError> {
        self.start_process_now(id, req, caller)
    }

    async fn list_processes(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, EngineError> {
        self.list_processes_now(id).await
    }

    async fn wait_process(
        &self,
        id: &SandboxId,
        handle: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessInfo, EngineError> {
        self.wait_process_now(id, handle, timeout_ms)
    }

    async fn process_output(
        &self,
        id: &SandboxId,
        handle: u64,
    ) -> Result<ProcessOutput, EngineError> {
        self.process_output_now(id, handle)
    }

    async fn signal_process(
        &self,
        id: &SandboxId,
        handle: u64,
        signal: i32,
    ) -> Result<ProcessInfo, EngineError> {
        self.signal_process_now(id, handle, signal)
    }

    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError> {
        self.read_file_now(id, path)
    }

    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: Bytes,
        mode: Option<u32>,
    ) -> Result<FileStat, EngineError> {
        self.write_file_now(id, path, data, mode)
    }

    async fn stat(&self, id: &SandboxId, path: &str) -> Result<FileStat, EngineError> {
        self.stat_now(id, path)
    }

    async fn list_dir(&self, id: &SandboxId, path: &str) -> Result<Vec<FileStat>, EngineError> {
        self.list_dir_now(id, path)
    }

    async fn mkdir(&self, id: &SandboxId, req: MkdirRequest) -> Result<FileStat, EngineError> {
        self.mkdir_now(id, req)
    }

    async fn remove(&self, id: &SandboxId, path: &str, recursive: bool) -> Result<(), EngineError> {
        self.remove_now(id, path, recursive)
    }

    async fn rename(&self, id: &SandboxId, req: RenameRequest) -> Result<(), EngineError> {
        self.rename_now(id, req)
    }

    async fn upload_tar(
        &self,
        id: &SandboxId,
        dir: &str,
        tar: Bytes,
    ) -> Result<UploadSummary, EngineError> {
        self.upload_tar_now(id, dir, tar)
    }

    async fn download_tar(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError> {
        self.download_tar_now(id, path)
    }

    async fn events(&self, since: i64, limit: u32) -> Result<Vec<Event>, EngineError> {
        self.events_now(since, limit)
    }

    async fn audit(&self, id: &SandboxId) -> Result<Vec<ExecAudit>, EngineError> {
        self.audit_now(id).await
    }

    async fn keepalive(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<SandboxInfo, EngineError> {
        self.keepalive_now(id, ttl_secs)
    }

    async fn pools(&self) -> Result<Vec<mayfly_types::PoolInfo>, EngineError> {
        self.pools_now()
    }

    async fn set_pool(
        &self,
        name: &str,
        spec: mayfly_types::PoolSpec,
        caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        self.set_pool_now(name, spec, caller)
    }

    async fn drain_pool(
        &self,
        name: &str,
        _caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        self.drain_pool_now(name, _caller)
    }

    fn tenancy(&self) -> Option<&dyn mayfly_engine::TenancyApi> {
        Some(self)
    }

    fn subscribe_events(&self) -> Result<mayfly_engine::EventSubscription, EngineError> {
        let st = self.lock();
        Ok(mayfly_engine::EventSubscription {
            receiver: st.bus.0.subscribe(),
            head: st.events.len() as i64,
        })
    }

    async fn usage(&self, id: &SandboxId) -> Result<mayfly_types::SandboxUsage, EngineError> {
        self.ready(id)?;
        Ok(mayfly_types::SandboxUsage {
            id: id.clone(),
            at: 1_700_000_000_000,
            cpu_seconds: Some(1.25),
            memory_bytes: 3 << 20,
            memory_peak_bytes: Some(5 << 20),
            memory_limit_bytes: 512 << 20,
            pids: 2,
            oom_kills: Some(0),
            disk: mayfly_types::DiskUsage {
                bytes: 8192,
                entries: 3,
                truncated: false,
            },
        })
    }

    async fn stats(
        &self,
        window: std::time::Duration,
        task: Option<&str>,
        caller: &Caller,
    ) -> Result<mayfly_types::StatsReport, EngineError> {
        self.lock()
            .stats_calls
            .push((window, task.map(str::to_owned), caller.tenant.clone()));
        let until = 1_700_000_000_000;
        Ok(mayfly_types::StatsReport {
            since: until - window.as_millis() as u64,
            until,
            window_secs: 300,
            task: task.map(str::to_owned),
            spin_up: Default::default(),
            spin_up_windows: Vec::new(),
            execs: Default::default(),
            tasks: Vec::new(),
        })
    }
}
