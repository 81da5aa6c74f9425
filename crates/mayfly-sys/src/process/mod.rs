//! Process and namespace syscalls: clone into new namespaces, id maps,
//! pidfds, credentials, prctl and friends.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;

use crate::last_errno;

mod fds;
pub use fds::{close_fds_except, pidfd_open, pidfd_send_signal, stdio_to_dev_null, wait_pidfd};

/// A failed process or namespace operation, naming the pid involved.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{op} failed")]
    Call {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} on pid {pid} failed")]
    Pid {
        op: &'static str,
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("writing `{value}` to {path} failed")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
}

fn call(op: &'static str) -> ProcessError {
    ProcessError::Call {
        op,
        source: last_errno(),
    }
}

/// The namespaces a sandbox's stub makes ahead of time, as host root: the
/// sandbox inherits them, owned by the host's user namespace.
pub const STUB_NAMESPACES: libc::c_int =
    libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;

/// The namespaces a sandbox's init is cloned into. The cgroup namespace is
/// entered later, by init itself.
pub const SANDBOX_NAMESPACES: libc::c_int =
    libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;

/// Moves the caller into new namespaces.
pub fn unshare(flags: libc::c_int) -> Result<(), ProcessError> {
    // SAFETY: plain syscall with integer flags.
    if unsafe { libc::unshare(flags) } < 0 {
        return Err(call("unshare"));
    }
    Ok(())
}

/// Whether this is the parent or the child after a fork or clone.
pub enum Forked {
    Parent { pid: i32 },
    Child,
}

/// Forks into new namespaces (fork-like: the child continues on a copy of
/// the caller's stack). The parent also gets a pidfd for the child, made
/// atomically by the kernel (`CLONE_PIDFD`), so there is no window in which
/// the child could exit and its pid be reused before the pidfd exists.
///
/// # Safety
/// The caller must be single-threaded, exactly as for `fork(2)`: the child
/// gets a copy of only the calling thread.
pub unsafe fn clone_into_namespaces(
    flags: libc::c_int,
) -> Result<(Forked, Option<OwnedFd>), ProcessError> {
    let mut pidfd: libc::c_int = -1;
    // SAFETY: with a null stack pointer clone behaves like fork; the caller
    // guarantees there are no other threads whose state could be torn. With
    // CLONE_PIDFD the kernel stores the pidfd through the parent_tid pointer,
    // which points at a live local.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::CLONE_PIDFD | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    match rc {
        r if r < 0 => Err(call("clone")),
        0 => Ok((Forked::Child, None)),
        pid => {
            // SAFETY: the kernel just installed this descriptor for us.
            let fd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            Ok((Forked::Parent { pid: pid as i32 }, Some(fd)))
        }
    }
}

/// Plain `fork(2)`.
///
/// # Safety
/// Same contract as [`clone_into_namespaces`]: the caller is single-threaded.
pub unsafe fn fork() -> Result<Forked, ProcessError> {
    // SAFETY: the caller guarantees it is single-threaded.
    match unsafe { libc::fork() } {
        r if r < 0 => Err(call("fork")),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent { pid }),
    }
}

/// Writes `uid_map` and `gid_map` of `pid`: inside ids `0..count` map to host
/// ids `base..base+count`.
pub fn write_id_maps(pid: i32, base: u32, count: u32) -> Result<(), ProcessError> {
    let line = format!("0 {base} {count}\n");
    for file in ["uid_map", "gid_map"] {
        let path = PathBuf::from(format!("/proc/{pid}/{file}"));
        std::fs::write(&path, &line).map_err(|source| ProcessError::Write {
            path,
            value: line.trim().to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// `kill(2)`, treating "no such process" as success.
pub fn kill(pid: i32, signal: i32) -> Result<(), ProcessError> {
    // SAFETY: plain syscall with integer arguments.
    if unsafe { libc::kill(pid, signal) } < 0 {
        let e = last_errno();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(ProcessError::Pid {
                op: "kill",
                pid,
                source: e,
            });
        }
    }
    Ok(())
}

/// Becomes uid/gid 0 of the current user namespace, with no supplementary groups.
pub fn become_root_in_userns() -> Result<(), ProcessError> {
    set_ids(0, 0)
}

/// Sets real, effective and saved uid and gid; drops supplementary groups.
pub fn set_ids(uid: u32, gid: u32) -> Result<(), ProcessError> {
    // SAFETY: an empty group list is valid.
    if unsafe { libc::setgroups(0, std::ptr::null()) } < 0 {
        return Err(call("setgroups"));
    }
    // SAFETY: plain syscalls with integer arguments.
    if unsafe { libc::setresgid(gid, gid, gid) } < 0 {
        return Err(call("setresgid"));
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(uid, uid, uid) } < 0 {
        return Err(call("setresuid"));
    }
    Ok(())
}

/// Enters a new cgroup namespace rooted at the caller's current cgroup.
pub fn unshare_cgroup_ns() -> Result<(), ProcessError> {
    // SAFETY: plain syscall.
    if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } < 0 {
        return Err(call("unshare(CLONE_NEWCGROUP)"));
    }
    Ok(())
}

/// Asks the kernel to send `signal` to this process when its parent dies.
pub fn set_parent_death_signal(signal: i32) -> Result<(), ProcessError> {
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(call("prctl(PR_SET_PDEATHSIG)"));
    }
    Ok(())
}

/// Sets whether this process is dumpable. A non-dumpable process cannot be
/// ptraced by same-uid processes, and its `/proc/<pid>` files (`mem`,
/// `environ`, fds, but also its own `oom_score_adj`) belong to the host's
/// root, so not even the process itself can open them once its uid changed.
pub fn set_dumpable(dumpable: bool) -> Result<(), ProcessError> {
    // SAFETY: plain prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_SET_DUMPABLE,
            libc::c_ulong::from(dumpable),
            0,
            0,
            0,
        )
    } < 0
    {
        return Err(call("prctl(PR_SET_DUMPABLE)"));
    }
    Ok(())
}

/// Sets the UTS hostname.
pub fn set_hostname(name: &str) -> Result<(), ProcessError> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        return Err(call("sethostname"));
    }
    Ok(())
}

/// Resets every signal disposition to default and unblocks all signals, as
/// a freshly exec'd program expects.
pub fn reset_signals() {
    // SAFETY: an all-empty sigset is valid; sigprocmask with it unblocks all.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    for sig in 1..32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: restoring the default handler is always valid.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// Starts a new session with the caller as its leader.
pub fn setsid() -> Result<(), ProcessError> {
    // SAFETY: plain syscall.
    if unsafe { libc::setsid() } < 0 {
        return Err(call("setsid"));
    }
    Ok(())
}

/// Terminates the process immediately, without running destructors or
/// flushing anything (the only safe exit in a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no user-space state.
    unsafe { libc::_exit(code) }
}

/// The start time of a live `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), used with the pid to detect pid reuse. A zombie is
/// not alive: it answers `None`.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after the last ')' are well-formed: state is the first.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    if matches!(fields.next(), Some("Z") | Some("X") | None) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Makes orphaned descendants reparent to this process instead of the
/// host's pid 1.
pub fn set_child_subreaper() -> Result<(), ProcessError> {
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } < 0 {
        return Err(call("prctl(PR_SET_CHILD_SUBREAPER)"));
    }
    Ok(())
}

/// Sets SIGCHLD to SIG_IGN, so the kernel reaps children on exit.
pub fn ignore_children() {
    // SAFETY: setting a standard disposition for SIGCHLD.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
}

/// Writes `value` to `/proc/<pid>/<file>`.
pub fn write_proc(pid: i32, file: &str, value: &str) -> Result<(), ProcessError> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    std::fs::write(&path, value).map_err(|source| ProcessError::Write {
        path,
        value: value.to_owned(),
        source,
    })
}

/// Blocks until the child `pid` has ended, and reaps it.
pub fn wait_for(pid: i32) {
    let mut status = 0;
    loop {
        // SAFETY: waiting on our own child with a valid status pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Raises the soft open-file limit to the hard limit and returns the new
/// value. A daemon holds a few descriptors per live sandbox.
pub fn raise_nofile_limit() -> Result<u64, ProcessError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 {
        return Err(call("getrlimit(RLIMIT_NOFILE)"));
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } < 0 {
        return Err(call("setrlimit(RLIMIT_NOFILE)"));
    }
    Ok(lim.rlim_cur)
}

/// Takes an exclusive, non-blocking `flock` on `path` (creating it). The
/// lock lasts as long as the returned descriptor. `Ok(None)`: someone else
/// holds it.
pub fn try_lock_file(path: &std::path::Path) -> Result<Option<std::fs::File>, ProcessError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| ProcessError::Write {
            path: path.to_path_buf(),
            value: "lock".into(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } < 0 {
        let e = last_errno();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        return Err(ProcessError::Call {
            op: "flock",
            source: e,
        });
    }
    Ok(Some(file))
}

/// Names this helper process `title` (at most 15 bytes): its task name
/// (`comm`, what `ps`, `top` and `pgrep` show), and its command line and
/// environment strings, overwritten in place, so `/proc/<pid>/cmdline` and
/// `environ` show `title` and nothing
/// of what the process inherited (a forked helper would otherwise expose
/// the daemon's arguments, tokens included, to every sandbox).
///
/// The kernel reports the argument and environment areas of the process's
/// own initial stack in `/proc/self/stat` (fields 48–51); both are ordinary
/// writable memory of this process.
///
/// Do not call `std::env::args` afterwards: it reads those strings.
pub fn set_title(title: &str) {
    if let Ok(name) = std::ffi::CString::new(title) {
        // Only the calling thread's name; these helpers are single-threaded.
        let _ = nix::sys::prctl::set_name(&name);
    }
    // Read once per address space: a process forked after the first call
    // (every stub and init is forked from the zygote, which names itself
    // first) inherits the answer with the memory it describes.
    static AREAS: std::sync::OnceLock<Option<[(usize, usize); 2]>> = std::sync::OnceLock::new();
    let Some(areas) = AREAS.get_or_init(title_areas) else {
        return;
    };
    for (i, &(start, end)) in areas.iter().enumerate() {
        if start == 0 || end <= start || end - start > 1 << 20 {
            continue;
        }
        // SAFETY: [start, end) is this process's own argument (or
        // environment) string area on its initial stack, as reported by the
        // kernel (to this process, or to the one it was forked from, whose
        // memory it copies); it is mapped and writable for the life of the
        // process, and nothing else in this single-threaded process uses it
        // any more.
        let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
        area.fill(0);
        // The first area is the command line: it shows the title.
        if i == 0 {
            let n = title.len().min(area.len().saturating_sub(1));
            area[..n].copy_from_slice(&title.as_bytes()[..n]);
        }
    }
}

/// The argument and environment string areas of this process's initial
/// stack, from `/proc/self/stat` (fields 48–51).
fn title_areas() -> Option<[(usize, usize); 2]> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let close = stat.rfind(')')?;
    // Fields after the command name start at field 3; arg_start is field 48.
    let f: Vec<usize> = stat[close + 2..]
        .split(' ')
        .skip(45)
        .take(4)
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let [arg_start, arg_end, env_start, env_end] = f[..] else {
        return None;
    };
    Some([(arg_start, arg_end), (env_start, env_end)])
}

#[cfg(test)]
mod tests {
    use super::parse_start_time;

    #[test]
    fn start_time_reads_field_22_and_treats_zombies_as_dead() {
        let live =
            "42 (we ird) name) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(live), Some(987654));
        let zombie = live.replace(") S ", ") Z ");
        assert_eq!(parse_start_time(&zombie), None);
    }

    #[test]
    fn a_title_names_the_task_and_hides_the_original_arguments() {
        // In a forked child, so the test runner's own argv stays intact.
        // SAFETY: the child only touches its own memory and exits.
        match unsafe { super::fork() }.expect("fork") {
            super::Forked::Child => {
                super::set_title("mayfly-test");
                let cmd = std::fs::read("/proc/self/cmdline").unwrap_or_default();
                let env = std::fs::read("/proc/self/environ").unwrap_or_default();
                let comm = std::fs::read("/proc/self/comm").unwrap_or_default();
                // The test binary's path (…/deps/mayfly_sys-…) is gone.
                let ok = cmd.starts_with(b"mayfly-test")
                    && comm == b"mayfly-test\n"
                    && !cmd.windows(5).any(|w| w == b"deps/")
                    && env.iter().all(|&b| b == 0);
                super::exit_now(if ok { 0 } else { 1 })
            }
            super::Forked::Parent { pid } => {
                let mut status = 0;
                // SAFETY: waiting on our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
            }
        }
    }

    #[test]
    fn own_start_time_is_known() {
        assert!(super::start_time(std::process::id()).is_some());
    }
}
