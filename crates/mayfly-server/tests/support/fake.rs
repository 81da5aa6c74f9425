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

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use mayfly_engine::{Caller, EngineError, ExecStream, SandboxApi, UploadSummary};
use mayfly_types::{
    Bytes64, CreateRequest, Event, ExecAudit, ExecEvent, ExecRequest, ExecResult, ExitStatus,
    FileKind, FileStat, MkdirRequest, ProcessInfo, ProcessOutput, ProcessState, RenameRequest,
    ResolvedLimits, SandboxId, SandboxInfo, SandboxState, StartProcessRequest, TemplateRef,
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

    /// Runs the fake script language; `Err` when the command cannot start.
    fn run(id: &SandboxId, req: &ExecRequest) -> Result<ExecResult, EngineError> {
        let (mut stdout, mut stderr, mut code) = (Vec::new(), Vec::new(), 0);
        let args = &req.argv[1.min(req.argv.len())..];
        match req.argv.first().map(String::as_str) {
            Some("echo") => stdout = format!("{}\n", args.join(" ")).into_bytes(),
            Some("cat") => stdout = req.stdin.clone().unwrap_or_default().0,
            Some("warn") => stderr = args.join(" ").into_bytes(),
            Some("exit") => code = args.first().and_then(|a| a.parse().ok()).unwrap_or(1),
            Some("gated") => {
                stdout = b"first".to_vec();
                stderr = b"second".to_vec();
            }
            Some("vanish") => stdout = b"partial".to_vec(),
            Some(other) => {
                return Err(EngineError::ExecFailed {
                    id: id.clone(),
                    argv0: other.to_owned(),
                    reason: "no such file or directory".into(),
                })
            }
            None => return Err(EngineError::Invalid("argv must not be empty".into())),
        }
        Ok(ExecResult {
            status: ExitStatus {
                exit_code: Some(code),
                signal: None,
                timed_out: false,
            },
            stdout_bytes: stdout.len() as u64,
            stderr_bytes: stderr.len() as u64,
            stdout: Bytes64(stdout),
            stderr: Bytes64(stderr),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_us: 42,
            hook_error: None,
        })
    }

    fn record(&self, id: &SandboxId, req: &ExecRequest, r: &ExecResult, caller: &Caller) {
        let mut st = self.lock();
        st.callers.push(caller.name.clone());
        st.audit.push(ExecAudit {
            sandbox_id: id.to_string(),
            at: 1_700_000_000_000,
            argv: req.argv.clone(),
            exit_code: r.status.exit_code,
            signal: r.status.signal,
            timed_out: r.status.timed_out,
            error: None,
            duration_us: r.duration_us,
            stdout_bytes: r.stdout_bytes,
            stderr_bytes: r.stderr_bytes,
            caller: caller.name.clone(),
            kind: None,
            output: None,
        });
    }

    fn process(&self, id: &SandboxId, handle: u64) -> Result<ProcessInfo, EngineError> {
        self.lock()
            .processes
            .get(id)
            .and_then(|ps| ps.iter().find(|p| p.handle == handle))
            .cloned()
            .ok_or_else(|| EngineError::NoSuchProcess {
                id: id.clone(),
                handle,
            })
    }

    fn set_process(&self, id: &SandboxId, info: &ProcessInfo) {
        if let Some(ps) = self.lock().processes.get_mut(id) {
            for p in ps.iter_mut().filter(|p| p.handle == info.handle) {
                *p = info.clone();
            }
        }
    }

    fn file_stat(name: &str, kind: FileKind, size: u64, mode: u32) -> FileStat {
        FileStat {
            name: name.to_owned(),
            kind,
            size,
            mode,
            uid: 0,
            gid: 0,
            mtime_ms: 1_700_000_000_000,
            link_target: None,
        }
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

    async fn list(&self, all: bool) -> Result<Vec<SandboxInfo>, EngineError> {
        Ok(self
            .lock()
            .sandboxes
            .values()
            .filter(|s| all || !s.state.is_terminal())
            .cloned()
            .collect())
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
        self.ready(id)?;
        let mut st = self.lock();
        st.callers.push(caller.name.clone());
        let ps = st.processes.entry(id.clone()).or_default();
        let info = ProcessInfo {
            handle: ps.len() as u64 + 1,
            pid: 10 + ps.len() as u32,
            argv: req.argv,
            state: ProcessState::Running,
            status: None,
            started_at: 1_700_000_000_000,
        };
        ps.push(info.clone());
        Ok(info)
    }

    async fn list_processes(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, EngineError> {
        self.get(id).await?;
        Ok(self.lock().processes.get(id).cloned().unwrap_or_default())
    }

    async fn wait_process(
        &self,
        id: &SandboxId,
        handle: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessInfo, EngineError> {
        let mut p = self.process(id, handle)?;
        // A timeout of 0 returns the current state; otherwise it "exits".
        if timeout_ms != Some(0) && p.state == ProcessState::Running {
            p.state = ProcessState::Exited;
            p.status = Some(ExitStatus {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
            });
            self.set_process(id, &p);
        }
        Ok(p)
    }

    async fn process_output(
        &self,
        id: &SandboxId,
        handle: u64,
    ) -> Result<ProcessOutput, EngineError> {
        let p = self.process(id, handle)?;
        Ok(ProcessOutput {
            stdout: Bytes64(p.argv.join(" ").into_bytes()),
            stderr: Bytes64::default(),
            stdout_truncated: false,
            stderr_truncated: false,
            state: p.state,
            status: p.status,
        })
    }

    async fn signal_process(
        &self,
        id: &SandboxId,
        handle: u64,
        signal: i32,
    ) -> Result<ProcessInfo, EngineError> {
        let mut p = self.process(id, handle)?;
        p.state = ProcessState::Exited;
        p.status = Some(ExitStatus {
            exit_code: None,
            signal: Some(signal),
            timed_out: false,
        });
        self.set_process(id, &p);
        Ok(p)
    }

    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        self.lock()
            .files
            .get(&(id.clone(), path.to_owned()))
            .map(|d| Bytes::from(d.clone()))
            .ok_or_else(|| EngineError::Invalid(format!("no such file: {path}")))
    }

    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: Bytes,
        mode: Option<u32>,
    ) -> Result<FileStat, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let size = data.len() as u64;
        self.lock()
            .files
            .insert((id.clone(), path.to_owned()), data.to_vec());
        Ok(Self::file_stat(
            path,
            FileKind::File,
            size,
            mode.unwrap_or(0o644),
        ))
    }

    async fn stat(&self, id: &SandboxId, path: &str) -> Result<FileStat, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let st = self.lock();
        let key = (id.clone(), path.to_owned());
        if let Some(d) = st.files.get(&key) {
            return Ok(Self::file_stat(path, FileKind::File, d.len() as u64, 0o644));
        }
        if let Some(mode) = st.dirs.get(&key) {
            return Ok(Self::file_stat(path, FileKind::Dir, 0, *mode));
        }
        Err(EngineError::Invalid(format!("no such file: {path}")))
    }

    async fn list_dir(&self, id: &SandboxId, path: &str) -> Result<Vec<FileStat>, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let prefix = format!("{}/", path.trim_end_matches('/'));
        let st = self.lock();
        let mut out: Vec<FileStat> = st
            .files
            .iter()
            .filter(|((sid, p), _)| sid == id && p.starts_with(&prefix))
            .map(|((_, p), d)| {
                Self::file_stat(&p[prefix.len()..], FileKind::File, d.len() as u64, 0o644)
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn mkdir(&self, id: &SandboxId, req: MkdirRequest) -> Result<FileStat, EngineError> {
        self.ready(id)?;
        Self::check_path(&req.path)?;
        let mode = req.mode.unwrap_or(0o755);
        self.lock()
            .dirs
            .insert((id.clone(), req.path.clone()), mode);
        Ok(Self::file_stat(&req.path, FileKind::Dir, 0, mode))
    }

    async fn remove(&self, id: &SandboxId, path: &str, recursive: bool) -> Result<(), EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        let mut st = self.lock();
        let key = (id.clone(), path.to_owned());
        if st.files.remove(&key).is_some() {
            return Ok(());
        }
        if st.dirs.contains_key(&key) {
            let prefix = format!("{path}/");
            let children = st
                .files
                .keys()
                .any(|(s, p)| s == id && p.starts_with(&prefix));
            if children && !recursive {
                return Err(EngineError::Invalid(format!(
                    "directory {path} is not empty"
                )));
            }
            st.files
                .retain(|(s, p), _| !(s == id && p.starts_with(&prefix)));
            st.dirs.remove(&key);
            return Ok(());
        }
        Err(EngineError::Invalid(format!("no such file: {path}")))
    }

    async fn rename(&self, id: &SandboxId, req: RenameRequest) -> Result<(), EngineError> {
        self.ready(id)?;
        Self::check_path(&req.from)?;
        Self::check_path(&req.to)?;
        let mut st = self.lock();
        let data = st
            .files
            .remove(&(id.clone(), req.from.clone()))
            .ok_or_else(|| EngineError::Invalid(format!("no such file: {}", req.from)))?;
        st.files.insert((id.clone(), req.to), data);
        Ok(())
    }

    async fn upload_tar(
        &self,
        id: &SandboxId,
        dir: &str,
        tar: Bytes,
    ) -> Result<UploadSummary, EngineError> {
        self.ready(id)?;
        Self::check_path(dir)?;
        let bytes = tar.len() as u64;
        self.lock()
            .tars
            .insert((id.clone(), dir.to_owned()), tar.to_vec());
        Ok(UploadSummary {
            files: 1,
            dirs: 1,
            symlinks: 0,
            bytes,
        })
    }

    async fn download_tar(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError> {
        self.ready(id)?;
        Self::check_path(path)?;
        self.lock()
            .tars
            .get(&(id.clone(), path.to_owned()))
            .map(|t| Bytes::from(t.clone()))
            .ok_or_else(|| EngineError::Invalid(format!("nothing uploaded to {path}")))
    }

    async fn events(&self, since: i64, limit: u32) -> Result<Vec<Event>, EngineError> {
        Ok(self
            .lock()
            .events
            .iter()
            .filter(|e| e.seq > since)
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn audit(&self, id: &SandboxId) -> Result<Vec<ExecAudit>, EngineError> {
        self.get(id).await?;
        Ok(self
            .lock()
            .audit
            .iter()
            .filter(|a| a.sandbox_id == id.as_str())
            .cloned()
            .collect())
    }

    async fn keepalive(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<SandboxInfo, EngineError> {
        let mut st = self.lock();
        let info = st
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.clone()))?;
        if let Some(t) = ttl_secs {
            info.expires_at = info.created_at + t * 1000;
        }
        Ok(info.clone())
    }

    async fn pools(&self) -> Result<Vec<mayfly_types::PoolInfo>, EngineError> {
        Ok(self.lock().pools.values().cloned().collect())
    }

    async fn set_pool(
        &self,
        name: &str,
        spec: mayfly_types::PoolSpec,
        caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        if !caller.admin {
            return Err(EngineError::Forbidden("admin only".into()));
        }
        mayfly_engine::check_pool_name(name)?;
        let target = spec.target.unwrap_or(0);
        let info = mayfly_types::PoolInfo {
            name: name.to_owned(),
            template: spec.template.unwrap_or_else(|| "host".into()),
            target,
            max: spec.max.unwrap_or(target),
            refill_concurrency: spec.refill_concurrency.unwrap_or(1),
            limits: mayfly_types::ResolvedLimits::DEFAULT,
            network: spec.network.unwrap_or(false),
            ready: target,
            filling: 0,
            claims: 0,
            misses: 0,
        };
        self.lock().pools.insert(name.to_owned(), info.clone());
        Ok(info)
    }

    async fn drain_pool(
        &self,
        name: &str,
        _caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        let mut st = self.lock();
        let p = st
            .pools
            .get_mut(name)
            .ok_or_else(|| EngineError::NoSuchPool(name.to_owned()))?;
        p.target = 0;
        p.ready = 0;
        Ok(p.clone())
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
            execs: Default::default(),
            tasks: Vec::new(),
        })
    }
}
