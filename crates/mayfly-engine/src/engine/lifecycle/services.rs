//! Services: long-running commands started in order at create, each ready
//! (its probe passed) before the next starts, then kept running by a
//! supervisor task per service under its restart policy. Their combined
//! output is kept in a bounded ring buffer.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mayfly_types::{ExitStatus, RestartPolicy, ServiceInfo, ServiceSpec, ServiceState};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use super::check::{DEFAULT_MAX_RESTARTS, DEFAULT_READY_TIMEOUT_SECS};
use super::probe::Prober;
use super::secrets::redact;
use super::LifecycleError;
use crate::engine::exec::CommandSpec;
use crate::engine::sandbox::Sandbox;
use crate::engine::Engine;
use crate::EngineError;

/// Bytes of a service's output kept (the newest).
const LOG_BYTES: usize = 64 * 1024;
/// Bytes of it quoted in an error or a listing.
pub(crate) const LOG_TAIL: usize = 4096;
/// The probe's first pause and its cap (doubling in between).
const PROBE_FIRST: Duration = Duration::from_millis(5);
const PROBE_CAP: Duration = Duration::from_millis(100);
/// The supervisor's first pause before a restart and its cap.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_CAP: Duration = Duration::from_secs(5);

/// A service of a live sandbox.
pub(crate) struct Service {
    pub spec: ServiceSpec,
    log: Arc<Mutex<VecDeque<u8>>>,
    status: Mutex<Status>,
    /// Bumped at every exit, so a waiter sees one it did not cause.
    exits: watch::Sender<u64>,
}

struct Status {
    state: ServiceState,
    restarts: u32,
    pid: Option<u32>,
    last_exit: Option<ExitStatus>,
}

impl Service {
    fn new(spec: ServiceSpec) -> Arc<Self> {
        Arc::new(Service {
            spec,
            log: Arc::new(Mutex::new(VecDeque::new())),
            status: Mutex::new(Status {
                state: ServiceState::Starting,
                restarts: 0,
                pid: None,
                last_exit: None,
            }),
            exits: watch::channel(0).0,
        })
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last `LOG_TAIL` bytes of its output, lossy UTF-8.
    pub fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let skip = log.len().saturating_sub(LOG_TAIL);
        let bytes: Vec<u8> = log.iter().skip(skip).copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn info(&self, sb: &Sandbox) -> ServiceInfo {
        let st = self.status();
        ServiceInfo {
            name: self.spec.name.clone(),
            state: st.state,
            restarts: st.restarts,
            pid: st.pid,
            last_exit: st.last_exit,
            log_tail: redact(&self.log_tail(), &sb.lifecycle().secrets),
        }
    }
}

/// Whether a service that exited with `status` is started again.
fn restarts(policy: RestartPolicy, status: &ExitStatus) -> bool {
    match policy {
        RestartPolicy::Never => false,
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => status.exit_code != Some(0),
    }
}

impl Engine {
    /// Starts the sandbox's services in order, each ready before the next.
    /// The first that exits or fails its probe fails the whole start, with
    /// its log (redacted) in the error; the caller destroys the sandbox.
    pub(crate) async fn start_services(&self, sb: &Arc<Sandbox>) -> Result<(), EngineError> {
        let life = sb.lifecycle();
        for spec in &life.services {
            let svc = Service::new(spec.clone());
            sb.services
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(svc.clone());
            let t0 = Instant::now();
            let failed = |reason: String| {
                svc.status().state = ServiceState::Failed;
                EngineError::Lifecycle(LifecycleError::ServiceFailed {
                    id: sb.id.clone(),
                    name: spec.name.clone(),
                    reason,
                    log: redact(&svc.log_tail(), &life.secrets),
                })
            };
            let cmd = CommandSpec::new(
                spec.command.clone(),
                spec.env.clone(),
                spec.cwd.clone(),
                spec.user,
                None,
            )?;
            let mut exits = svc.exits.subscribe();
            let first = self.run_service_once(sb, &svc, &cmd).await;
            if let Err(e) = first {
                return Err(failed(format!("it could not be started: {e}")));
            }
            self.wait_service_ready(sb, &svc, &mut exits)
                .await
                .map_err(failed)?;
            svc.status().state = ServiceState::Ready;
            tracing::debug!(id = %sb.id, service = %spec.name, ready = ?t0.elapsed(), "service ready");
            let engine = self.clone();
            let sb2 = sb.clone();
            tokio::spawn(async move { engine.supervise(sb2, svc, cmd, exits).await });
        }
        Ok(())
    }

    /// Starts one run of a service; a task drains its output into the log
    /// and records its exit.
    async fn run_service_once(
        &self,
        sb: &Arc<Sandbox>,
        svc: &Arc<Service>,
        cmd: &CommandSpec,
    ) -> Result<(), EngineError> {
        let started = self.spawn_command(sb, cmd).await?;
        svc.status().pid = Some(started.pid as u32);
        let readers = [
            tokio::spawn(drain(started.stdout, svc.log.clone())),
            tokio::spawn(drain(started.stderr, svc.log.clone())),
        ];
        drop(started.stdin);
        let svc = svc.clone();
        let exit = started.exit;
        tokio::spawn(async move {
            let info = exit.await.ok();
            for r in readers {
                let abort = r.abort_handle();
                if tokio::time::timeout(Duration::from_millis(200), r)
                    .await
                    .is_err()
                {
                    abort.abort();
                }
            }
            let status = match info {
                Some(i) => ExitStatus {
                    exit_code: i.code,
                    signal: i.signal,
                    timed_out: false,
                },
                None => ExitStatus {
                    exit_code: None,
                    signal: Some(libc::SIGKILL),
                    timed_out: false,
                },
            };
            {
                let mut st = svc.status();
                st.pid = None;
                st.last_exit = Some(status);
            }
            svc.exits.send_modify(|n| *n += 1);
        });
        Ok(())
    }

    /// Probes until the service is ready, it exits, or its time is up.
    async fn wait_service_ready(
        &self,
        sb: &Arc<Sandbox>,
        svc: &Arc<Service>,
        exits: &mut watch::Receiver<u64>,
    ) -> Result<(), String> {
        let spec = &svc.spec;
        let limit = Duration::from_secs(
            spec.ready_timeout_secs
                .unwrap_or(DEFAULT_READY_TIMEOUT_SECS),
        );
        let deadline = tokio::time::Instant::now() + limit;
        let exited = |svc: &Service| {
            let st = svc.status();
            format!(
                "it exited before it was ready ({})",
                describe(st.last_exit.as_ref())
            )
        };
        let Some(probe) = &spec.ready else {
            // Started is ready; a command that fails at once is still
            // caught when it has exited by now.
            tokio::task::yield_now().await;
            if *exits.borrow_and_update() > 0 {
                return Err(exited(svc));
            }
            return Ok(());
        };
        let prober = Prober::new(sb, probe, spec.user)?;
        let mut pause = PROBE_FIRST;
        loop {
            if *exits.borrow_and_update() > 0 {
                return Err(exited(svc));
            }
            if prober.once(self, sb).await {
                // Passing while exiting is not ready.
                if *exits.borrow_and_update() > 0 {
                    return Err(exited(svc));
                }
                return Ok(());
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(format!(
                    "its probe did not pass within {} s",
                    limit.as_secs()
                ));
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = exits.changed() => {}
            }
            pause = (pause * 2).min(PROBE_CAP);
        }
    }

    /// Keeps a ready service running under its restart policy until it
    /// stops for good or the sandbox goes.
    async fn supervise(
        &self,
        sb: Arc<Sandbox>,
        svc: Arc<Service>,
        cmd: CommandSpec,
        mut exits: watch::Receiver<u64>,
    ) {
        let max = svc.spec.max_restarts.unwrap_or(DEFAULT_MAX_RESTARTS);
        let mut pause = RESTART_FIRST;
        loop {
            if exits.changed().await.is_err() || sb.is_stopping() {
                return;
            }
            let last = svc.status().last_exit.unwrap_or(UNKNOWN);
            let restarts_so_far = svc.status().restarts;
            if !restarts(svc.spec.restart, &last) {
                svc.status().state = ServiceState::Exited;
                return;
            }
            if restarts_so_far >= max {
                svc.status().state = ServiceState::Failed;
                tracing::debug!(id = %sb.id, service = %svc.spec.name, "service used up its restarts");
                return;
            }
            svc.status().state = ServiceState::Restarting;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RESTART_CAP);
            if sb.is_stopping() {
                return;
            }
            {
                let mut st = svc.status();
                st.restarts += 1;
            }
            match self.run_service_once(&sb, &svc, &cmd).await {
                Ok(()) => svc.status().state = ServiceState::Ready,
                Err(_) => {
                    svc.status().state = ServiceState::Failed;
                    return;
                }
            }
        }
    }

    /// The services of a sandbox and where each is.
    pub(crate) fn services_impl(
        &self,
        id: &mayfly_types::SandboxId,
    ) -> Result<Vec<ServiceInfo>, EngineError> {
        let sb = self.lookup(id)?;
        let services = sb.services.lock().unwrap_or_else(|p| p.into_inner());
        Ok(services.iter().map(|s| s.info(&sb)).collect())
    }
}

const UNKNOWN: ExitStatus = ExitStatus {
    exit_code: None,
    signal: None,
    timed_out: false,
};

fn describe(s: Option<&ExitStatus>) -> String {
    match s {
        Some(ExitStatus {
            exit_code: Some(c), ..
        }) => format!("exit code {c}"),
        Some(ExitStatus {
            signal: Some(sig), ..
        }) => format!("killed by signal {sig}"),
        _ => "no status".into(),
    }
}

/// Appends a stream to the ring buffer, keeping its newest `LOG_BYTES`.
async fn drain(fd: OwnedFd, log: Arc<Mutex<VecDeque<u8>>>) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        log.extend(&buf[..n]);
        let over = log.len().saturating_sub(LOG_BYTES);
        log.drain(..over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_policies_decide_on_the_exit() {
        let ok = UNKNOWN;
        let bad = ExitStatus {
            exit_code: Some(1),
            ..UNKNOWN
        };
        assert!(!restarts(RestartPolicy::Never, &bad));
        assert!(restarts(RestartPolicy::OnFailure, &bad));
        assert!(!restarts(
            RestartPolicy::OnFailure,
            &ExitStatus {
                exit_code: Some(0),
                ..ok
            }
        ));
        assert!(restarts(
            RestartPolicy::Always,
            &ExitStatus {
                exit_code: Some(0),
                ..ok
            }
        ));
    }
}
