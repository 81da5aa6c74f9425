//! How init turns a [`SpawnCommand`] into a hardened process.
//!
//! Order matters: session and stdio first; then limits and the capability
//! sets (init has already dropped the bounding set, which every fork
//! inherits); then the uid change, the working directory and `no_new_privs`, right before
//! `execve`. The seccomp allowlist is already in force: init installed it on
//! itself before reporting ready, and it is inherited across fork and exec.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};

use mayfly_sys::{hardening, ipc, process, supervise};

use super::init::resolve_program;
use super::proto::{SpawnCommand, SpawnPlan};
use crate::plan::hardening as hplan;

/// What every exec of one sandbox shares, computed once when init starts.
pub struct ExecSetup {
    rlimits: Vec<(i32, u64, u64)>,
}

impl ExecSetup {
    pub fn new(plan: &SpawnPlan) -> Self {
        ExecSetup {
            rlimits: plan.rlimits.clone(),
        }
    }
}

/// Forks and execs `cmd` with `fds` as stdin, stdout and stderr. Returns the
/// pid once the exec has succeeded, or the errno and the failing stage.
pub fn exec_command(
    setup: &ExecSetup,
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
    let cwd = to_c(&cmd.cwd)?;
    let (err_r, err_w) = ipc::pipe().map_err(|_| (libc::EMFILE, "pipe".to_owned()))?;

    // SAFETY: init is single-threaded, so the child is a full copy.
    match unsafe { process::fork() } {
        Err(_) => Err((libc::EAGAIN, "fork".into())),
        Ok(process::Forked::Child) => {
            drop(err_r);
            let fail = |errno: i32| -> ! {
                supervise::write_errno(err_w.as_fd(), errno);
                process::exit_now(127)
            };
            let stage = |n: i32| -> ! { fail(n) };
            if process::setsid().is_err() {
                stage(-1);
            }
            for (i, fd) in fds.iter().enumerate() {
                if supervise::dup_onto(fd.as_fd(), i as i32).is_err() {
                    stage(-2);
                }
            }
            process::reset_signals();
            if hardening::set_rlimits(&setup.rlimits).is_err() {
                stage(-3);
            }
            // The bounding set was dropped by init, once, and inherited.
            if hardening::limit_capabilities(&hplan::default_capabilities()).is_err() {
                stage(-4);
            }
            if process::set_ids(cmd.uid, cmd.gid).is_err() {
                stage(-5);
            }
            if let Err(e) = supervise::chdir(&cwd) {
                fail(e.source.raw_os_error().unwrap_or(libc::ENOENT) + CHDIR_FLAG);
            }
            if hardening::set_no_new_privs().is_err() {
                stage(-6);
            }
            process::close_fds_except(3, &[std::os::fd::AsRawFd::as_raw_fd(&err_w)]);
            // Init is shielded from the OOM killer; its commands are not.
            // The fork inherited init's score and its non-dumpable flag,
            // which makes `/proc/self/oom_score_adj` the host root's. Only
            // now, with the command's credentials and none of init's
            // descriptors left, does the child become dumpable (as execve
            // of any ordinary program would make it anyway) and raise its
            // score to 0, which needs no privilege. If that fails, the
            // command does not run.
            if process::set_dumpable(true).is_err() || !reset_oom_score() {
                stage(-8);
            }
            let image = |path: CString| supervise::ExecImage {
                path,
                argv: argv.clone(),
                envp: envp.clone(),
            };
            let images: Vec<_> = candidates.into_iter().map(image).collect();
            let mut errno = libc::ENOENT;
            for img in &images {
                errno = supervise::execve(img);
                if errno != libc::ENOENT {
                    break;
                }
            }
            fail(errno)
        }
        Ok(process::Forked::Parent { pid }) => {
            drop(err_w);
            match supervise::read_errno(&err_r) {
                None => Ok(pid),
                Some(code) => {
                    // The child exits right away; init's SIGCHLD handling
                    // reaps it (it is not tracked, so nothing is reported).
                    Err(describe(code))
                }
            }
        }
    }
}

/// Sets this process's `oom_score_adj` to 0; true if it is 0 afterwards.
fn reset_oom_score() -> bool {
    const FILE: &str = "/proc/self/oom_score_adj";
    std::fs::write(FILE, "0").is_ok()
        || std::fs::read_to_string(FILE).is_ok_and(|v| v.trim() == "0")
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const CHDIR_FLAG: i32 = 1 << 16;

fn describe(code: i32) -> (i32, String) {
    match code {
        -1 => (libc::EPERM, "setsid".into()),
        -2 => (libc::EBADF, "stdio".into()),
        -3 => (libc::EPERM, "rlimits".into()),
        -4 => (libc::EPERM, "capabilities".into()),
        -5 => (libc::EPERM, "uid/gid".into()),
        -6 => (libc::EPERM, "no_new_privs".into()),
        -7 => (libc::EPERM, "seccomp".into()),
        -8 => (libc::EACCES, "oom_score_adj".into()),
        c if c >= CHDIR_FLAG => (c - CHDIR_FLAG, "chdir".into()),
        c => (c, "execve".into()),
    }
}
