//! Background processes: started, listed, waited on, read and killed
//! through the API while they run. Their output is kept by the daemon up to
//! a cap; they die with their sandbox.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mayfly_types::{
    Bytes64, ExitStatus, ProcessInfo, ProcessOutput, ProcessState, SandboxId, StartProcessRequest,
};
use tokio::sync::watch;

use super::exec::{check_limits, Collected, CommandSpec, PumpOptions, Sink};
use super::{now_ms, Engine};
use crate::api::Caller;
use crate::EngineError;

/// The most background processes one sandbox keeps track of.
const MAX_PROCESSES: usize = 256;

pub(crate) struct BgProcess {
    pub handle: u64,
    pub pid: i32,
    pub argv: Vec<String>,
    pub started_at: u64,
    pub out: [Arc<Mutex<Collected>>; 2],
    pub status: watch::Receiver<Option<ExitStatus>>,
}

impl BgProcess {
    fn info(&self) -> ProcessInfo {
        let status = *self.status.borrow();
        ProcessInfo {
            handle: self.handle,
            pid: self.pid as u32,
            argv: self.argv.clone(),
            state: if status.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            status,
            started_at: self.started_at,
        }
    }
}

impl Engine {
    pub(crate) async fn start_process_impl(
        &self,
        id: &SandboxId,
        req: StartProcessRequest,
        caller: &Caller,
    ) -> Result<ProcessInfo, EngineError> {
        let sb = self.lookup(id)?;
        let spec = CommandSpec::new(req.argv, req.env, req.cwd, req.uid, req.gid)?;
        let limit = check_limits(None, req.output_limit)?;
        {
            let mut procs = sb.procs.lock().unwrap_or_else(|p| p.into_inner());
            if procs.len() >= MAX_PROCESSES {
                // Forget finished ones before refusing.
                procs.retain(|_, p| p.status.borrow().is_none());
                if procs.len() >= MAX_PROCESSES {
                    return Err(EngineError::Exhausted(format!(
                        "sandbox {id} already tracks {MAX_PROCESSES} background processes"
                    )));
                }
            }
        }
        let started = self.start_command(&sb, &spec, caller).await?;
        let out = [
            Arc::new(Mutex::new(Collected::charged(
                self.inner.file_buffers.charge(),
            ))),
            Arc::new(Mutex::new(Collected::charged(
                self.inner.file_buffers.charge(),
            ))),
        ];
        let (tx, rx) = watch::channel(None);
        let proc_ = Arc::new(BgProcess {
            handle: started.handle,
            pid: started.pid,
            argv: spec.argv.clone(),
            started_at: now_ms(),
            out: out.clone(),
            status: rx,
        });
        sb.procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(started.handle, proc_.clone());
        let engine = self.clone();
        let sb2 = sb.clone();
        let caller = caller.clone();
        let argv = spec.argv;
        tokio::spawn(async move {
            let r = engine
                .pump(
                    &sb2,
                    started,
                    PumpOptions {
                        stdin: None,
                        timeout: None,
                        limit,
                        sink: Sink::Buffer,
                    },
                    out.clone(),
                )
                .await;
            // pump drained the buffers into `r`; put them back for readers.
            restore(&out[0], &r.stdout);
            restore(&out[1], &r.stderr);
            engine.audit_exec(&sb2, &argv, Ok(&r), &caller);
            let _ = tx.send(Some(r.status));
        });
        Ok(proc_.info())
    }

    fn process(&self, id: &SandboxId, handle: u64) -> Result<Arc<BgProcess>, EngineError> {
        let sb = self.lookup(id)?;
        let procs = sb.procs.lock().unwrap_or_else(|p| p.into_inner());
        procs
            .get(&handle)
            .cloned()
            .ok_or_else(|| EngineError::NoSuchProcess {
                id: id.clone(),
                handle,
            })
    }

    pub(crate) fn list_processes_impl(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<ProcessInfo>, EngineError> {
        let sb = self.lookup(id)?;
        let procs = sb.procs.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = procs.values().map(|p| p.info()).collect();
        v.sort_by_key(|p| p.handle);
        Ok(v)
    }

    pub(crate) async fn wait_process_impl(
        &self,
        id: &SandboxId,
        handle: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessInfo, EngineError> {
        let p = self.process(id, handle)?;
        let mut rx = p.status.clone();
        let wait = rx.wait_for(|s| s.is_some());
        match timeout_ms {
            Some(ms) => {
                let _ = tokio::time::timeout(Duration::from_millis(ms.min(3_600_000)), wait).await;
            }
            None => {
                let _ = wait.await;
            }
        }
        Ok(p.info())
    }

    pub(crate) fn process_output_impl(
        &self,
        id: &SandboxId,
        handle: u64,
    ) -> Result<ProcessOutput, EngineError> {
        let p = self.process(id, handle)?;
        let info = p.info();
        let read = |c: &Arc<Mutex<Collected>>| {
            let g = c.lock().unwrap_or_else(|p| p.into_inner());
            (g.data.clone(), g.truncated)
        };
        let (stdout, st) = read(&p.out[0]);
        let (stderr, et) = read(&p.out[1]);
        Ok(ProcessOutput {
            stdout: Bytes64(stdout),
            stderr: Bytes64(stderr),
            stdout_truncated: st,
            stderr_truncated: et,
            state: info.state,
            status: info.status,
        })
    }

    pub(crate) fn signal_process_impl(
        &self,
        id: &SandboxId,
        handle: u64,
        signal: i32,
    ) -> Result<ProcessInfo, EngineError> {
        if !(1..=64).contains(&signal) {
            return Err(EngineError::Invalid(format!(
                "signal {signal} is not a valid signal number"
            )));
        }
        let sb = self.lookup(id)?;
        let p = self.process(id, handle)?;
        if p.status.borrow().is_none() {
            sb.conn
                .signal(handle, signal, true)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
        }
        Ok(p.info())
    }
}

fn restore(c: &Arc<Mutex<Collected>>, data: &Bytes64) {
    let mut g = c.lock().unwrap_or_else(|p| p.into_inner());
    if g.data.is_empty() {
        g.data = data.0.clone();
    }
}
