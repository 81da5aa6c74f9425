//! How init turns a [`SpawnCommand`] into a hardened process.
//!
//! Init prepares everything here (the `PATH` search, argv, env, the
//! capability masks), and `mayfly_sys::spawn` clones a child that shares
//! init's memory rather than copying it. Order matters in the child: session
//! and stdio first; then limits and the capability sets (init has already
//! dropped the bounding set, which every child inherits); then the uid
//! change, the working directory and `no_new_privs`, right before `execve`.
//! The seccomp allowlist is already in force: init installed it on itself
//! before reporting ready, and it is inherited across clone and exec.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

use mayfly_sys::spawn::{self, stage, CapMasks, ChildStack, ExecSpec, SpawnError, CHDIR_FLAG};

use super::init::resolve_program;
use super::proto::{SpawnCommand, SpawnPlan};

/// What every exec of one sandbox shares, made once when init starts: the
/// limits, the capability sets, and the stack its children run on.
pub struct ExecSetup {
    rlimits: Vec<(i32, u64, u64)>,
    caps: CapMasks,
    stack: ChildStack,
}

impl ExecSetup {
    pub fn new(plan: &SpawnPlan, caps: CapMasks) -> std::io::Result<Self> {
        Ok(ExecSetup {
            rlimits: plan.rlimits.clone(),
            caps,
            stack: ChildStack::new()?,
        })
    }
}

/// Starts `cmd` with `fds` as stdin, stdout and stderr. Returns the pid once
/// the exec has succeeded, or the errno and the failing stage.
pub fn exec_command(
    setup: &mut ExecSetup,
    cmd: &SpawnCommand,
    fds: &[OwnedFd],
) -> Result<i32, (i32, String)> {
    let path_var = cmd
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or(DEFAULT_PATH);
    let candidates = resolve_program(&cmd.argv[0], path_var);
    if candidates.is_empty() {
        return Err((libc::ENOENT, "resolve".into()));
    }
    let to_c = |s: &str| CString::new(s).map_err(|_| (libc::EINVAL, "nul byte".to_owned()));
    let argv = cmd
        .argv
        .iter()
        .map(|a| to_c(a))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = cmd
        .env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    let stdio = match fds {
        [i, o, e] => [i.as_raw_fd(), o.as_raw_fd(), e.as_raw_fd()],
        _ => return Err((libc::EINVAL, "descriptors".into())),
    };
    let spec = ExecSpec::new(
        stdio,
        setup.rlimits.clone(),
        setup.caps,
        (cmd.uid, cmd.gid),
        to_c(&cmd.cwd)?,
        candidates,
        argv,
        envp,
    );
    // SAFETY: init is single-threaded, and `fds` stay open until this
    // returns.
    match unsafe { spawn::spawn(&spec, &mut setup.stack) } {
        Ok(pid) => Ok(pid),
        Err(SpawnError::Clone(_)) => Err((libc::EAGAIN, "fork".into())),
        // The child has exited; init's SIGCHLD handling reaps it (it is not
        // tracked, so nothing is reported).
        Err(SpawnError::Child(code)) => Err(describe(code)),
    }
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn describe(code: i32) -> (i32, String) {
    match code {
        stage::SETSID => (libc::EPERM, "setsid".into()),
        stage::STDIO => (libc::EBADF, "stdio".into()),
        stage::RLIMITS => (libc::EPERM, "rlimits".into()),
        stage::CAPABILITIES => (libc::EPERM, "capabilities".into()),
        stage::IDS => (libc::EPERM, "uid/gid".into()),
        stage::NO_NEW_PRIVS => (libc::EPERM, "no_new_privs".into()),
        stage::OOM_SCORE => (libc::EACCES, "oom_score_adj".into()),
        c if c >= CHDIR_FLAG => (c - CHDIR_FLAG, "chdir".into()),
        c => (c, "execve".into()),
    }
}
