//! The fake's background processes (the trait methods in `fake.rs`
//! delegate here).

use mayfly_engine::{Caller, EngineError, SandboxApi};
use mayfly_types::{
    Bytes64, ExitStatus, ProcessInfo, ProcessOutput, ProcessState, SandboxId, StartProcessRequest,
};

use super::FakeEngine;

impl FakeEngine {
    pub(super) fn start_process_now(
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

    pub(super) async fn list_processes_now(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<ProcessInfo>, EngineError> {
        self.get(id).await?;
        Ok(self.lock().processes.get(id).cloned().unwrap_or_default())
    }

    pub(super) fn wait_process_now(
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

    pub(super) fn process_output_now(
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

    pub(super) fn signal_process_now(
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

    pub(super) fn process(&self, id: &SandboxId, handle: u64) -> Result<ProcessInfo, EngineError> {
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

    pub(super) fn set_process(&self, id: &SandboxId, info: &ProcessInfo) {
        if let Some(ps) = self.lock().processes.get_mut(id) {
            for p in ps.iter_mut().filter(|p| p.handle == info.handle) {
                *p = info.clone();
            }
        }
    }
}
