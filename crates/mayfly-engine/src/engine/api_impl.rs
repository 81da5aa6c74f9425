//! [`SandboxApi`] for [`Engine`]: argument checks and dispatch to the verbs.

use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mayfly_types::{
    CreateRequest, Event, ExecAudit, ExecEvent, ExecRequest, ExecResult, FileStat, MkdirRequest,
    ProcessInfo, ProcessOutput, RenameRequest, SandboxId, SandboxInfo, SandboxState, SandboxUsage,
    StartProcessRequest, StatsReport,
};
use tokio::sync::mpsc;

use super::destroy::record_to_info;
use super::exec::{check_limits, Collected, CommandSpec, PumpOptions, Sink};
use super::lifecycle::hooks::HookPoint;
use super::sandbox::Sandbox;
use super::Engine;
use crate::api::{Caller, EventSubscription, ExecStream, ListSandboxes, SandboxApi};
use crate::files::{FsLimits, SandboxFs};
use crate::EngineError;
use mayfly_types::UploadSummary;

impl Engine {
    /// The sandbox's file view, opened on first use through init's root.
    fn fs(&self, id: &SandboxId) -> Result<Arc<SandboxFs>, EngineError> {
        let sb = self.lookup(id)?;
        // A sandbox being torn down serves no more file requests.
        if sb.is_stopping() {
            return Err(EngineError::Conflict(format!(
                "sandbox {id} is being destroyed"
            )));
        }
        Self::fs_of(&sb)
    }

    /// [`Engine::fs`] of a sandbox already looked up.
    pub(crate) fn fs_of(sb: &Sandbox) -> Result<Arc<SandboxFs>, EngineError> {
        let id = &sb.id;
        let gone = || EngineError::Conflict(format!("sandbox {id} has stopped"));
        if let Some(fs) = sb.fs.get() {
            return Ok(fs.clone());
        }
        let root = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(format!("/proc/{}/root", sb.init_pid))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT | libc::ESRCH) => gone(),
                _ => EngineError::Internal(format!("opening the root of {id}: {e}")),
            })?;
        // The open went by pid: only init's pidfd proves the pid was still
        // init's (alive, or a zombie whose pid cannot be reused) when the
        // root was opened, not a host process that took the pid after init
        // died, whose root would be the host's.
        let init = sb.pidfd.get_ref().as_fd();
        if mayfly_sys::process::pidfd_send_signal(init, 0).is_err() {
            return Err(gone());
        }
        let fs = Arc::new(
            SandboxFs::new(root.into(), sb.uid_base, FsLimits::default())
                .map_err(EngineError::from)?,
        );
        Ok(sb.fs.get_or_init(|| fs).clone())
    }

    /// A file answer that failed because the daemon's file buffers were
    /// full is a 503 to retry, not the I/O error the refused write became.
    fn over_file_budget(
        &self,
        r: Result<Bytes, EngineError>,
        refused: &std::sync::atomic::AtomicBool,
    ) -> Result<Bytes, EngineError> {
        if r.is_err() && refused.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(EngineError::Unavailable(format!(
                "the daemon holds its most ({} MiB) of file contents for other answers; \
                 retry shortly",
                self.inner.file_buffers.total() >> 20
            )));
        }
        r
    }

    async fn with_fs<T: Send + 'static>(
        &self,
        id: &SandboxId,
        f: impl FnOnce(&SandboxFs) -> Result<T, crate::files::FilesError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let fs = self.fs(id)?;
        tokio::task::spawn_blocking(move || f(&fs))
            .await
            .map_err(|e| EngineError::Internal(format!("file operation panicked: {e}")))?
            .map_err(EngineError::from)
    }

    pub(crate) async fn run_exec(
        &self,
        sb: &Arc<Sandbox>,
        req: ExecRequest,
        sink: Sink,
        caller: &Caller,
    ) -> Result<impl std::future::Future<Output = ExecResult> + Send + 'static, EngineError> {
        let spec = CommandSpec::new(req.argv, req.env, req.cwd, req.uid, req.gid)?
            .with_secrets(req.secrets)?;
        let limit = check_limits(req.timeout_ms, req.output_limit)?;
        // A task run starts only once its `before_run` hooks passed.
        let run = req.run;
        if run {
            // Past its budget nothing runs, its hooks included.
            self.check_command_budget(sb)?;
            self.run_hooks(sb, HookPoint::BeforeRun, caller).await?;
        }
        let started = self.start_command(sb, &spec, caller).await?;
        let engine = self.clone();
        let sb = sb.clone();
        let caller = caller.clone();
        let timeout = req.timeout_ms.map(Duration::from_millis);
        let stdin = req.stdin.map(|b| b.0);
        // A command in flight keeps the sandbox from counting as idle.
        let busy = super::sandbox::Busy::new(&sb);
        // A caller that leaves (a client hanging up on a buffered exec)
        // abandons the command: it is killed, and the rest (its audit row,
        // its secret files' removal, its `after_run` hooks) still runs, in a
        // task a shutdown waits for.
        let (handle, killer, tracker) = (started.handle, sb.clone(), self.clone());
        let kill_on_handover = move |task| {
            let _ = killer.conn.signal(handle, libc::SIGKILL, true);
            tracker.track_cleanup(task);
        };
        let work = async move {
            let _busy = busy;
            let charged = || {
                let charge = engine.inner.file_buffers.charge();
                Arc::new(std::sync::Mutex::new(Collected::charged(charge)))
            };
            let out = [charged(), charged()];
            let opts = PumpOptions {
                stdin,
                timeout,
                limit,
                sink,
            };
            let mut r = engine.pump(&sb, started, opts, out).await;
            engine.audit_exec(&sb, &spec.argv, Ok(&r), &caller);
            if !spec.secrets.is_empty() {
                engine.remove_secret_files(&sb, &spec.secrets).await;
            }
            if run {
                if let Err(e) = engine.run_hooks(&sb, HookPoint::AfterRun, &caller).await {
                    r.hook_error = Some(e.to_string());
                }
            }
            // A command killed while init lives (or a shell reporting a
            // child's SIGKILL as 137) may be the OOM killer's victim; one
            // that died with init is looked at by `init_died`.
            let killed = r.status.signal == Some(libc::SIGKILL)
                || r.status.exit_code == Some(128 + libc::SIGKILL);
            if killed && !r.status.timed_out && !sb.conn.is_closed() {
                engine.check_oom_after_kill(&sb);
            }
            r
        };
        Ok(super::finish::FinishOnDrop::new(work, |_| {}).on_handover(kill_on_handover))
    }
}

/// A live sandbox waiting unclaimed in a pool: invisible to requests.
fn unclaimed(info: &SandboxInfo) -> bool {
    info.tenant.is_none() && !info.state.is_terminal()
}

#[async_trait]
impl SandboxApi for Engine {
    async fn create(
        &self,
        req: CreateRequest,
        caller: &Caller,
    ) -> Result<SandboxInfo, EngineError> {
        // A caller that goes away mid-create (a client hanging up, dropping
        // this future at an await) cannot cut a boot or a claim short: the
        // rest of the create runs in a task of its own (`FinishOnDrop`),
        // and a sandbox made for a caller gone by then is destroyed
        // (`abandoned`), not left to its TTL. A shutdown waits for that task
        // (`wait_cleanup`), so a create cut off by the daemon's own exit
        // still ends, and its sandbox goes.
        let (engine, orphans, caller) = (self.clone(), self.clone(), caller.clone());
        let tracker = self.clone();
        super::finish::FinishOnDrop::new(
            async move { engine.create_sandbox(req, &caller).await },
            move |made: Result<SandboxInfo, EngineError>| {
                if let Ok(info) = made {
                    tracing::debug!(id = %info.id, "its caller left before the create answered");
                    orphans.destroy_abandoned(&info.id);
                }
            },
        )
        .on_handover(move |task| tracker.track_cleanup(task))
        .await
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, EngineError> {
        self.settle(id).await;
        let info = self.info(id)?;
        if unclaimed(&info) {
            return Err(EngineError::NoSuchSandbox(id.clone()));
        }
        Ok(info)
    }

    async fn list(&self, q: ListSandboxes) -> Result<Vec<SandboxInfo>, EngineError> {
        self.settle_all().await;
        let records = if q.all {
            // A long history is read off the runtime's workers, on the
            // store's reading connection, and only as far as `limit`.
            let (tenant, limit) = (q.tenant.clone(), q.limit);
            self.on_store("listing sandboxes", move |s| {
                s.list_recent(tenant.as_deref(), limit)
            })
            .await?
        } else {
            self.inner.store.list_sandboxes(false)?
        };
        Ok(records
            .into_iter()
            .map(record_to_info)
            .filter(|i| !unclaimed(i))
            .filter(|i| q.tenant.is_none() || i.tenant == q.tenant)
            .collect())
    }

    async fn keepalive(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<SandboxInfo, EngineError> {
        Engine::keepalive(self, id, ttl_secs).await
    }

    async fn egress_policy(
        &self,
        id: &SandboxId,
    ) -> Result<mayfly_types::EgressPolicy, EngineError> {
        Engine::egress_policy(self, id)
    }

    async fn set_egress_policy(
        &self,
        id: &SandboxId,
        policy: mayfly_types::EgressPolicy,
    ) -> Result<mayfly_types::EgressPolicy, EngineError> {
        Engine::set_egress_policy(self, id, policy)
    }

    async fn destroy(&self, id: &SandboxId, caller: &Caller) -> Result<SandboxInfo, EngineError> {
        if self.lookup_any(id).is_some_and(|sb| sb.is_pooled()) {
            return Err(EngineError::NoSuchSandbox(id.clone()));
        }
        match self.lookup(id) {
            Ok(sb) => {
                sb.settled().await;
                tracing::debug!(%id, caller = %caller.name, "destroy");
                // Hooks, artifacts and the kill run in a task of their own:
                // a client that hangs up mid-hook cannot leave the destroy
                // claimed and never finished. A destroy already under way
                // (a TTL's, with its hooks) is waited for, not overtaken.
                let (engine, caller) = (self.clone(), caller.clone());
                let stop = tokio::spawn(async move {
                    // Answer once the sandbox is dead (its init and every
                    // process in it are SIGKILLed); cleanup finishes in the
                    // background.
                    if engine.hooks_then_stop(&sb, "user", &caller).await {
                        let e = engine.clone();
                        let tracker = tokio::spawn(async move {
                            if let Err(err) = e.finish_destroy(sb, "user").await {
                                tracing::warn!(error = %err, "finishing a destroy failed");
                            }
                        });
                        engine.track_cleanup(tracker);
                    }
                });
                stop.await
                    .map_err(|e| EngineError::Internal(format!("a destroy failed: {e}")))?;
                self.info(id)
            }
            // Idempotent: a sandbox that already ended answers with its record.
            Err(_) => {
                let info = self.info(id)?;
                if info.state.is_terminal() {
                    Ok(info)
                } else {
                    Err(EngineError::NotReady {
                        id: id.clone(),
                        state: info.state,
                    })
                }
            }
        }
    }

    async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        caller: &Caller,
    ) -> Result<ExecResult, EngineError> {
        let sb = self.live_ready(id)?;
        let fut = self.run_exec(&sb, req, Sink::Buffer, caller).await?;
        Ok(fut.await)
    }

    async fn exec_stream(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        caller: &Caller,
    ) -> Result<ExecStream, EngineError> {
        let sb = self.live_ready(id)?;
        let (tx, rx) = mpsc::channel(64);
        let fut = self
            .run_exec(&sb, req, Sink::Channel(tx.clone()), caller)
            .await?;
        tokio::spawn(async move {
            let r = fut.await;
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
        self.live_ready(id)?;
        self.start_process_impl(id, req, caller).await
    }

    async fn services(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<mayfly_types::ServiceInfo>, EngineError> {
        self.services_impl(id)
    }

    async fn list_processes(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, EngineError> {
        self.list_processes_impl(id)
    }

    async fn wait_process(
        &self,
        id: &SandboxId,
        handle: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessInfo, EngineError> {
        self.wait_process_impl(id, handle, timeout_ms).await
    }

    async fn process_output(
        &self,
        id: &SandboxId,
        handle: u64,
    ) -> Result<ProcessOutput, EngineError> {
        self.process_output_impl(id, handle)
    }

    async fn signal_process(
        &self,
        id: &SandboxId,
        handle: u64,
        signal: i32,
    ) -> Result<ProcessInfo, EngineError> {
        self.signal_process_impl(id, handle, signal)
    }

    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError> {
        let path = path.to_owned();
        let mut buf = self.inner.file_buffers.buffer();
        let refused = buf.refused_flag();
        let read = self
            .with_fs(id, move |fs| {
                fs.read_with(&path, mayfly_types::MAX_FILE_BYTES, |r, size| {
                    buf.fill_from(r, size)
                })
                .map(|_| buf.into_bytes())
            })
            .await;
        self.over_file_budget(read, &refused)
    }

    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: Bytes,
        mode: Option<u32>,
    ) -> Result<FileStat, EngineError> {
        let path = path.to_owned();
        self.with_fs(id, move |fs| fs.write(&path, &data, mode, 0))
            .await
    }

    async fn stat(&self, id: &SandboxId, path: &str) -> Result<FileStat, EngineError> {
        let path = path.to_owned();
        self.with_fs(id, move |fs| fs.stat(&path)).await
    }

    async fn list_dir(&self, id: &SandboxId, path: &str) -> Result<Vec<FileStat>, EngineError> {
        let path = path.to_owned();
        self.with_fs(id, move |fs| fs.list(&path)).await
    }

    async fn mkdir(&self, id: &SandboxId, req: MkdirRequest) -> Result<FileStat, EngineError> {
        self.with_fs(id, move |fs| fs.mkdir(&req.path, req.parents, req.mode))
            .await
    }

    async fn remove(&self, id: &SandboxId, path: &str, recursive: bool) -> Result<(), EngineError> {
        let path = path.to_owned();
        self.with_fs(id, move |fs| fs.remove(&path, recursive))
            .await
    }

    async fn rename(&self, id: &SandboxId, req: RenameRequest) -> Result<(), EngineError> {
        self.with_fs(id, move |fs| fs.rename(&req.from, &req.to))
            .await
    }

    async fn upload_tar(
        &self,
        id: &SandboxId,
        dir: &str,
        tar: Bytes,
    ) -> Result<UploadSummary, EngineError> {
        let dir = dir.to_owned();
        self.with_fs(id, move |fs| fs.upload_tar(&dir, &tar)).await
    }

    async fn download_tar(&self, id: &SandboxId, path: &str) -> Result<Bytes, EngineError> {
        let path = path.to_owned();
        let buf = self.inner.file_buffers.buffer();
        let refused = buf.refused_flag();
        let packed = self
            .with_fs(id, move |fs| {
                fs.download_tar_to(&path, buf, *fs.limits())
                    .map(super::buffers::Buffer::into_bytes)
            })
            .await;
        self.over_file_budget(packed, &refused)
    }

    async fn list_artifacts(
        &self,
        id: &SandboxId,
    ) -> Result<mayfly_types::ArtifactList, EngineError> {
        Engine::list_artifacts(self, id).await
    }

    async fn open_artifact(
        &self,
        id: &SandboxId,
        name: &str,
    ) -> Result<(mayfly_types::ArtifactInfo, std::fs::File), EngineError> {
        Engine::open_artifact(self, id, name).await
    }

    async fn events(&self, since: i64, limit: u32) -> Result<Vec<Event>, EngineError> {
        Ok(self.inner.store.events(since, limit.min(10_000))?)
    }

    async fn audit(&self, id: &SandboxId) -> Result<Vec<ExecAudit>, EngineError> {
        self.settle(id).await;
        self.info(id)?;
        Ok(self.inner.store.execs(id)?)
    }

    async fn pools(&self) -> Result<Vec<mayfly_types::PoolInfo>, EngineError> {
        Ok(self.pool_infos())
    }

    async fn set_pool(
        &self,
        name: &str,
        spec: mayfly_types::PoolSpec,
        caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        Engine::set_pool(self, name, spec, caller)
    }

    async fn drain_pool(
        &self,
        name: &str,
        caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        Engine::drain_pool(self, name, caller)
    }

    async fn owner_of(&self, id: &SandboxId) -> Result<Option<String>, EngineError> {
        self.owner(id)
    }

    async fn tenant_events(
        &self,
        tenant: &str,
        since: i64,
        limit: u32,
    ) -> Result<Vec<Event>, EngineError> {
        self.events_of(tenant, since, limit)
    }

    fn tenancy(&self) -> Option<&dyn crate::TenancyApi> {
        Some(self)
    }

    fn gateway(&self) -> Option<&dyn crate::GatewayApi> {
        Some(self)
    }

    fn templates(&self) -> Option<&dyn crate::TemplateApi> {
        Some(self)
    }

    fn subscribe_events(&self) -> Result<EventSubscription, EngineError> {
        Ok(self.inner.store.subscribe_events()?)
    }

    async fn usage(&self, id: &SandboxId) -> Result<SandboxUsage, EngineError> {
        let sb = self.live_ready_untouched(id)?;
        self.usage_of(&sb).await
    }

    async fn stats(
        &self,
        window: Duration,
        task: Option<&str>,
        caller: &Caller,
    ) -> Result<StatsReport, EngineError> {
        let q = mayfly_store::StatsQuery {
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            task: task.map(str::to_owned),
            // An admin sees every tenant; anyone else their own.
            tenant: (!caller.admin).then(|| caller.tenant.clone()),
        };
        // A report over a long window reads for a while (on the store's own
        // read-only connection).
        self.on_store("the stats report", move |s| s.stats(&q))
            .await
    }
}

impl Engine {
    /// A live sandbox that can run commands (not stopping); the request
    /// counts as activity.
    fn live_ready(&self, id: &SandboxId) -> Result<Arc<Sandbox>, EngineError> {
        let sb = self.live_ready_untouched(id)?;
        sb.touch();
        Ok(sb)
    }

    /// [`Engine::live_ready`] for a request that only looks (usage), which
    /// is not activity and keeps no sandbox from idling out.
    fn live_ready_untouched(&self, id: &SandboxId) -> Result<Arc<Sandbox>, EngineError> {
        let found = self.lookup_claimed(id);
        match found {
            Ok(sb) if !sb.is_stopping() => Ok(sb),
            Ok(_) => Err(EngineError::NotReady {
                id: id.clone(),
                state: SandboxState::Stopping,
            }),
            Err(e) => match self.info(id) {
                Ok(info) if !unclaimed(&info) => Err(EngineError::NotReady {
                    id: id.clone(),
                    state: info.state,
                }),
                _ => Err(e),
            },
        }
    }
}
