//! What a sandbox's init needs to supervise children: a signalfd, poll,
//! reaping and session scans (it starts them with `spawn`).

use std::os::fd::BorrowedFd;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// A failed supervision call.
#[derive(Debug, thiserror::Error)]
#[error("{op} failed")]
pub struct SuperviseError {
    pub op: &'static str,
    #[source]
    pub source: std::io::Error,
}

fn err(op: &'static str, e: nix::Error) -> SuperviseError {
    SuperviseError {
        op,
        source: std::io::Error::from_raw_os_error(e as i32),
    }
}

/// The signals init handles through its signalfd.
const HANDLED: [Signal; 6] = [
    Signal::SIGCHLD,
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Blocks the handled signals and returns a signalfd that reports them.
pub fn signal_fd() -> Result<SignalFd, SuperviseError> {
    let mut set = SigSet::empty();
    for s in HANDLED {
        set.add(s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .map_err(|e| err("sigprocmask", e))?;
    SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| err("signalfd", e))
}

/// Drains a signalfd and returns the signal numbers read.
pub fn read_signals(sfd: &SignalFd) -> Vec<i32> {
    let mut out = Vec::new();
    while let Ok(Some(info)) = sfd.read_signal() {
        out.push(info.ssi_signo as i32);
    }
    out
}

/// Waits until one of `fds` is readable (or hung up); returns readiness flags.
pub fn poll_readable(fds: &[BorrowedFd<'_>]) -> Result<Vec<bool>, SuperviseError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut pfds: Vec<PollFd> = fds
        .iter()
        .map(|f| PollFd::new(*f, PollFlags::POLLIN))
        .collect();
    loop {
        match poll(&mut pfds, PollTimeout::NONE) {
            Ok(_) => break,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(err("poll", e)),
        }
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
        .collect())
}

/// How a reaped child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    Exited { pid: i32, code: i32 },
    Signaled { pid: i32, signal: i32 },
}

/// Reaps every child that has ended, without blocking.
pub fn reap_all() -> Vec<Reaped> {
    let mut out = Vec::new();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => out.push(Reaped::Exited {
                pid: pid.as_raw(),
                code,
            }),
            Ok(WaitStatus::Signaled(pid, sig, _)) => out.push(Reaped::Signaled {
                pid: pid.as_raw(),
                signal: sig as i32,
            }),
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(_) => continue,
        }
    }
    out
}

/// Pids (in the caller's pid namespace) whose session id is `sid`.
pub fn pids_in_session(proc_root: &str, sid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| session_of(proc_root, pid) == Some(sid))
        .collect()
}

fn session_of(proc_root: &str, pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("{proc_root}/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    // Fields after the command: state ppid pgrp session …
    rest.split(' ').nth(3)?.parse().ok()
}
