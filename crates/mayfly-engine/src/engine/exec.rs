//! Exec: start a command through init, feed stdin, collect or stream its
//! output byte-exactly, enforce the timeout, and audit the result (what a
//! row keeps, and the command budget, are `audit.rs`).

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mayfly_types::{
    Bytes64, ExecEvent, ExecResult, ExitStatus, DEFAULT_OUTPUT_LIMIT, MAX_OUTPUT_LIMIT,
    MAX_TIMEOUT_MS,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::sandbox::Sandbox;
use super::Engine;
use crate::api::Caller;
use crate::runtime::conn::ExitInfo;
use crate::runtime::proto::SpawnCommand;
use crate::runtime::RuntimeError;
use crate::EngineError;

/// Total bytes of argv and env one command may carry.
const MAX_COMMAND_BYTES: usize = 128 * 1024;
/// How long output may keep flowing after the command has exited (a process
/// that escaped its session can hold the pipe; we stop waiting for it).
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Past its output limit, how long a stream's drain waits between two
/// pipe-fulls it throws away.
const DISCARD_PAUSE: Duration = Duration::from_millis(10);

/// A validated command.
pub(crate) struct CommandSpec {
    pub argv: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// This command's own secrets (an exec's), on top of the sandbox's.
    pub secrets: Vec<mayfly_types::Secret>,
    /// A helper of the engine's own (one that writes secret files): gets
    /// no secrets.
    pub no_secrets: bool,
}

impl CommandSpec {
    /// Adds an exec's secrets, checked.
    pub fn with_secrets(mut self, secrets: Vec<mayfly_types::Secret>) -> Result<Self, EngineError> {
        super::lifecycle::check_secrets(&secrets)?;
        self.secrets = secrets;
        Ok(self)
    }

    /// The command part of an exec or background-process request, checked.
    pub fn new(
        argv: Vec<String>,
        env: std::collections::BTreeMap<String, String>,
        cwd: Option<String>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<Self, EngineError> {
        let spec = CommandSpec {
            argv,
            env,
            cwd,
            uid,
            gid,
            secrets: Vec::new(),
            no_secrets: false,
        };
        spec.validate()?;
        Ok(spec)
    }

    fn validate(&self) -> Result<(), EngineError> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(EngineError::Invalid("argv must name a program".into()));
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(EngineError::Invalid(
                "argv must not contain NUL bytes".into(),
            ));
        }
        super::create::check_env(&self.env)?;
        let size: usize = self.argv.iter().map(|a| a.len() + 1).sum::<usize>()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        if size > MAX_COMMAND_BYTES {
            return Err(EngineError::Invalid(format!(
                "argv and env total {size} bytes; the limit is {MAX_COMMAND_BYTES}"
            )));
        }
        if let Some(cwd) = &self.cwd {
            if !cwd.starts_with('/') || cwd.contains('\0') || cwd.len() > 4096 {
                return Err(EngineError::Invalid(format!(
                    "cwd `{}` must be an absolute path of at most 4096 bytes, without NUL",
                    cwd.chars().take(64).collect::<String>().escape_debug()
                )));
            }
        }
        for (name, v) in [("uid", self.uid), ("gid", self.gid)] {
            if v.is_some_and(|v| v >= 65536) {
                return Err(EngineError::Invalid(format!(
                    "{name} must be below 65536 (the sandbox's id range)"
                )));
            }
        }
        Ok(())
    }
}

pub(crate) fn check_limits(
    timeout_ms: Option<u64>,
    output_limit: Option<u64>,
) -> Result<u64, EngineError> {
    if timeout_ms.is_some_and(|t| t == 0 || t > MAX_TIMEOUT_MS) {
        return Err(EngineError::Invalid(format!(
            "timeout_ms must be between 1 and {MAX_TIMEOUT_MS}"
        )));
    }
    let limit = output_limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
    if limit > MAX_OUTPUT_LIMIT {
        return Err(EngineError::Invalid(format!(
            "output_limit must be at most {MAX_OUTPUT_LIMIT}"
        )));
    }
    Ok(limit)
}

/// A command that init has started.
pub(crate) struct Started {
    pub handle: u64,
    pub pid: i32,
    pub exit: oneshot::Receiver<ExitInfo>,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub t0: Instant,
}

/// Where output goes as it arrives.
#[derive(Clone)]
pub(crate) enum Sink {
    Buffer,
    Channel(mpsc::Sender<ExecEvent>),
}

/// How to drive a started command.
pub(crate) struct PumpOptions {
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    pub limit: u64,
    pub sink: Sink,
}

/// One output stream as collected so far.
#[derive(Default)]
pub(crate) struct Collected {
    pub data: Vec<u8>,
    pub total: u64,
    pub truncated: bool,
    /// What `data` holds, reserved from the daemon's buffer budget (an
    /// exec's or a background process's output; hooks and probes keep a
    /// few KiB and go unbudgeted). Past the budget, no more is kept.
    pub charge: Option<super::buffers::Charge>,
    /// The budget refused more: the rest is counted, not kept.
    pub refused: bool,
}

impl Collected {
    /// An empty stream whose kept bytes are charged to `charge`.
    pub(crate) fn charged(charge: super::buffers::Charge) -> Self {
        Collected {
            charge: Some(charge),
            ..Collected::default()
        }
    }
}

impl Engine {
    /// Starts a command through init. A command that cannot be started is
    /// recorded in the audit trail here, so every caller audits it alike.
    pub(crate) async fn start_command(
        &self,
        sb: &Arc<Sandbox>,
        spec: &CommandSpec,
        caller: &Caller,
    ) -> Result<Started, EngineError> {
        // Counted before it runs: a sandbox past its budget is refused, and
        // nothing it asks for runs unaudited.
        self.charge_command(sb)?;
        let started = self.spawn_command(sb, spec).await;
        if let Err(e) = &started {
            self.audit_exec(sb, &spec.argv, Err(e), caller);
        }
        started
    }

    pub(crate) async fn spawn_command(
        &self,
        sb: &Arc<Sandbox>,
        spec: &CommandSpec,
    ) -> Result<Started, EngineError> {
        let fail = |e: mayfly_sys::ipc::IpcError| EngineError::Internal(format!("pipe: {e}"));
        let (in_r, in_w) = mayfly_sys::ipc::pipe().map_err(fail)?;
        let (out_r, out_w) = mayfly_sys::ipc::pipe().map_err(fail)?;
        let (err_r, err_w) = mayfly_sys::ipc::pipe().map_err(fail)?;
        let mut env: std::collections::BTreeMap<String, String> =
            sb.env().iter().cloned().collect();
        env.extend(spec.env.clone());
        let defaults = sb.exec_defaults.get();
        let uid = spec
            .uid
            .or_else(|| defaults.and_then(|d| d.uid))
            .unwrap_or(0);
        let life = sb.lifecycle();
        if !spec.no_secrets && (!life.secrets.is_empty() || !spec.secrets.is_empty()) {
            // Secrets go last: what a secret names is what the command sees.
            Box::pin(self.write_secret_files(sb, &spec.secrets, uid)).await?;
            env.extend(super::lifecycle::secrets::secret_env(&life.secrets));
            env.extend(super::lifecycle::secrets::secret_env(&spec.secrets));
        }
        let handle = sb.handle();
        let cmd = SpawnCommand {
            handle,
            argv: spec.argv.clone(),
            env: env.into_iter().collect(),
            cwd: spec
                .cwd
                .clone()
                .or_else(|| defaults.and_then(|d| d.cwd.clone()))
                .unwrap_or_else(|| "/workspace".into()),
            uid,
            gid: spec.gid.unwrap_or(uid),
        };
        let t0 = Instant::now();
        match sb.conn.spawn(cmd, [in_r, out_w, err_w]).await {
            Ok(Ok((pid, exit))) => Ok(Started {
                handle,
                pid,
                exit,
                stdin: in_w,
                stdout: out_r,
                stderr: err_r,
                t0,
            }),
            Ok(Err(f)) => Err(EngineError::ExecFailed {
                id: sb.id.clone(),
                argv0: spec.argv[0].clone(),
                reason: format!(
                    "{} failed: {}",
                    f.stage,
                    std::io::Error::from_raw_os_error(f.errno)
                ),
            }),
            Err(RuntimeError::Closed) => Err(EngineError::NotReady {
                id: sb.id.clone(),
                state: mayfly_types::SandboxState::Stopping,
            }),
            Err(e) => Err(EngineError::Internal(format!("spawn in {}: {e}", sb.id))),
        }
    }

    /// Feeds stdin, drains stdout and stderr into `sink`, and waits for the
    /// exit (killing the session at the timeout).
    pub(crate) async fn pump(
        &self,
        sb: &Arc<Sandbox>,
        started: Started,
        opts: PumpOptions,
        out: [Arc<Mutex<Collected>>; 2],
    ) -> ExecResult {
        let PumpOptions {
            stdin,
            timeout,
            limit,
            sink,
        } = opts;
        let Started {
            handle,
            exit,
            stdin: stdin_fd,
            stdout,
            stderr,
            t0,
            ..
        } = started;
        let writer = tokio::spawn(async move {
            if let Some(data) = stdin {
                if let Ok(mut w) = tokio::net::unix::pipe::Sender::from_owned_fd(stdin_fd) {
                    let _ = w.write_all(&data).await;
                }
            }
        });
        let [out_c, err_c] = out;
        let readers = [
            tokio::spawn(read_stream(
                stdout,
                limit,
                sink.clone(),
                false,
                out_c.clone(),
                sb.clone(),
                handle,
            )),
            tokio::spawn(read_stream(
                stderr,
                limit,
                sink.clone(),
                true,
                err_c.clone(),
                sb.clone(),
                handle,
            )),
        ];
        let mut timed_out = false;
        let mut exit = exit;
        let info = match timeout {
            None => (&mut exit).await.ok(),
            Some(t) => match tokio::time::timeout(t, &mut exit).await {
                Ok(r) => r.ok(),
                Err(_) => {
                    timed_out = true;
                    let _ = sb.conn.signal(handle, libc::SIGKILL, true);
                    tokio::time::timeout(Duration::from_secs(10), exit)
                        .await
                        .ok()
                        .and_then(|r| r.ok())
                }
            },
        };
        writer.abort();
        for r in readers {
            let abort = r.abort_handle();
            if tokio::time::timeout(DRAIN_GRACE, r).await.is_err() {
                abort.abort();
            }
        }
        let duration_us = t0.elapsed().as_micros() as u64;
        // No exit report means init (the sandbox) went away underneath us.
        let (exit_code, signal) = match info {
            Some(i) => (i.code, i.signal),
            None => (None, Some(libc::SIGKILL)),
        };
        let take = |c: &Arc<Mutex<Collected>>| {
            let mut g = c.lock().unwrap_or_else(|p| p.into_inner());
            (std::mem::take(&mut g.data), g.total, g.truncated)
        };
        let (o, ob, ot) = take(&out_c);
        let (e, eb, et) = take(&err_c);
        ExecResult {
            status: ExitStatus {
                exit_code,
                signal,
                timed_out,
            },
            stdout: Bytes64(o),
            stderr: Bytes64(e),
            stdout_truncated: ot,
            stderr_truncated: et,
            stdout_bytes: ob,
            stderr_bytes: eb,
            duration_us,
            hook_error: None,
        }
    }
}

async fn read_stream(
    fd: OwnedFd,
    limit: u64,
    sink: Sink,
    is_stderr: bool,
    into: Arc<Mutex<Collected>>,
    sb: Arc<Sandbox>,
    handle: u64,
) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut listener_gone = false;
    loop {
        let full = {
            let c = into.lock().unwrap_or_else(|p| p.into_inner());
            c.total >= limit || c.refused
        };
        if full {
            // Nothing more is kept: the rest is counted and thrown away
            // without being copied into the daemon (a command writing
            // without end costs the daemon a `splice` per pipe-full).
            discard_rest(&rx, &into, &sink, &sb, handle).await;
            return;
        }
        // A streamed command whose listener left is abandoned: killed at
        // once, silent or not.
        let n = tokio::select! {
            r = rx.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = listener_left(&sink), if !listener_gone => {
                abandon(&sb, handle, &mut listener_gone);
                continue;
            }
        };
        let keep = {
            let mut c = into.lock().unwrap_or_else(|p| p.into_inner());
            let room = limit.saturating_sub(c.total) as usize;
            c.total += n as u64;
            let mut keep = n.min(room);
            if matches!(sink, Sink::Buffer) {
                let want = (c.data.len() + keep) as u64;
                if !c.charge.as_mut().is_none_or(|ch| ch.cover(want)) {
                    // The daemon holds its most of such buffers: the rest
                    // of this stream is counted, not kept.
                    keep = 0;
                    c.refused = true;
                }
                c.data.extend_from_slice(&buf[..keep]);
            }
            if keep < n {
                c.truncated = true;
            }
            keep
        };
        if let Sink::Channel(tx) = &sink {
            if keep > 0 && !listener_gone {
                let chunk = buf[..keep].to_vec();
                let ev = if is_stderr {
                    ExecEvent::Stderr(chunk)
                } else {
                    ExecEvent::Stdout(chunk)
                };
                if tx.send(ev).await.is_err() {
                    abandon(&sb, handle, &mut listener_gone);
                }
            }
        }
    }
}

/// Counts and discards what is left of a stream past its limit, until its
/// end; a streamed command whose listener leaves meanwhile is killed.
async fn discard_rest(
    rx: &tokio::net::unix::pipe::Receiver,
    into: &Mutex<Collected>,
    sink: &Sink,
    sb: &Sandbox,
    handle: u64,
) {
    use std::os::fd::AsFd;
    // Fewer, larger wake-ups: the cost of draining is per wake-up, not per
    // byte. (Refused past the host's per-user pipe quota: then as is.)
    let _ = mayfly_sys::ipc::set_pipe_size(rx.as_fd(), 1 << 20);
    let mut listener_gone = false;
    loop {
        tokio::select! {
            r = rx.readable() => if r.is_err() { return },
            () = listener_left(sink), if !listener_gone => {
                abandon(sb, handle, &mut listener_gone);
                continue;
            }
        }
        let moved = rx.try_io(|| mayfly_sys::ipc::discard(rx.as_fd(), 1 << 20));
        match moved {
            Ok(0) => return,
            Ok(n) => {
                {
                    let mut c = into.lock().unwrap_or_else(|p| p.into_inner());
                    c.total += n as u64;
                    c.truncated = true;
                }
                // Then a pause, for the pipe to fill: at most a hundred
                // wake-ups a second, however small the writer's writes (a
                // writer faster than 100 MiB/s waits on the full pipe).
                tokio::select! {
                    () = tokio::time::sleep(DISCARD_PAUSE) => {}
                    () = listener_left(sink), if !listener_gone => {
                        abandon(sb, handle, &mut listener_gone);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// A streamed command whose listener has gone is abandoned: killed, once.
fn abandon(sb: &Sandbox, handle: u64, listener_gone: &mut bool) {
    *listener_gone = true;
    let _ = sb.conn.signal(handle, libc::SIGKILL, true);
}

/// Resolves when a streamed command's listener has gone; never for a
/// buffered one (whose caller leaving is handled by `run_exec`).
async fn listener_left(sink: &Sink) {
    match sink {
        Sink::Channel(tx) => tx.closed().await,
        Sink::Buffer => std::future::pending().await,
    }
}
