//! Starting a command from a sandbox's init without copying init.
//!
//! A `fork` copies the parent's page tables and anonymous memory map, only
//! for the child to throw them away at `execve`; for init that was about a
//! quarter of a millisecond of every exec, measured. [`spawn`] instead
//! clones with `CLONE_VM | CLONE_VFORK` onto a stack of its own, as glibc's
//! `posix_spawn` and Go's `forkExec` do: the child runs in init's memory,
//! init is suspended until the child has called `execve` (or exited), and
//! nothing is copied.
//!
//! Sharing init's memory constrains the child. It runs only raw system
//! calls on data prepared before the clone ([`ExecSpec`]): it allocates
//! nothing, takes no lock, touches no Rust state of init's, and never
//! returns. Ids are changed with the raw system calls, not glibc's wrappers,
//! which would try to signal init's other threads. A failure is reported the
//! way the earlier fork-and-pipe protocol did: a code (a negative stage, the
//! `chdir` errno plus [`CHDIR_FLAG`], or the `execve` errno) that the child
//! stores in the shared [`ExecSpec`] before it exits with 127.

use std::ffi::{c_void, CStr, CString};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

/// Added to a `chdir` errno in a failure code.
pub const CHDIR_FLAG: i32 = 1 << 16;

/// Failure codes of the stages before `chdir` and `execve`.
pub mod stage {
    pub const SETSID: i32 = -1;
    pub const STDIO: i32 = -2;
    pub const RLIMITS: i32 = -3;
    pub const CAPABILITIES: i32 = -4;
    pub const IDS: i32 = -5;
    pub const NO_NEW_PRIVS: i32 = -6;
    pub const OOM_SCORE: i32 = -8;
}

/// The capability sets a command gets, as the kernel's bit masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapMasks {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
}

/// Everything the child needs, prepared before the clone.
pub struct ExecSpec {
    /// Become stdin, stdout and stderr.
    pub stdio: [RawFd; 3],
    /// (resource, soft, hard).
    pub rlimits: Vec<(i32, u64, u64)>,
    pub caps: CapMasks,
    pub uid: u32,
    pub gid: u32,
    pub cwd: CString,
    /// Tried in order while `execve` answers ENOENT (a `PATH` search).
    pub paths: Vec<CString>,
    /// Owned here; `argv_ptrs` and `envp_ptrs` point into them.
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    failure: AtomicI32,
}

impl ExecSpec {
    /// A spec; the pointer arrays for `execve` are built here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        stdio: [RawFd; 3],
        rlimits: Vec<(i32, u64, u64)>,
        caps: CapMasks,
        (uid, gid): (u32, u32),
        cwd: CString,
        paths: Vec<CString>,
        argv: Vec<CString>,
        envp: Vec<CString>,
    ) -> ExecSpec {
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        ExecSpec {
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            stdio,
            rlimits,
            caps,
            uid,
            gid,
            cwd,
            paths,
            _argv: argv,
            _envp: envp,
            failure: AtomicI32::new(0),
        }
    }
}

/// Room for the child's few frames of raw system calls.
const STACK: usize = 64 * 1024;

/// The stack [`spawn`]'s child runs on: mapped once and reused by every
/// spawn of its owner, with an inaccessible guard page below it, so that an
/// overflow faults instead of writing into the caller's memory.
///
/// One stack is enough for any number of spawns: `CLONE_VFORK` suspends
/// the caller until the child has exec'd or exited, and [`spawn`] borrows
/// the stack mutably, so no two children ever share it. Mapping it once
/// (rather than allocating and zeroing 64 KiB per spawn) also keeps a
/// sandbox's first exec from copying the heap pages init inherited from its
/// parent: zeroing them was 15 copy-on-write faults, measured.
#[derive(Debug)]
pub struct ChildStack {
    base: *mut c_void,
    len: usize,
}

impl ChildStack {
    /// Maps the stack and its guard page, and touches its top page (the
    /// only one a child normally uses), so that cost is paid here, ahead.
    pub fn new() -> std::io::Result<ChildStack> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .unwrap_or(4096)
            .max(4096);
        let len = STACK + page;
        // SAFETY: a fresh private anonymous mapping at an address the kernel
        // picks; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the first page of the mapping made above.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the last word of the mapping's top page, which is mapped
        // read-write above and not shared with anything.
        unsafe { std::ptr::write_volatile((stack.top() - 8) as *mut u64, 0) };
        Ok(stack)
    }

    /// The initial stack pointer: the mapping's (16-byte aligned) end.
    fn top(&self) -> usize {
        (self.base as usize + self.len) & !15
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, which no child uses any more
        // (a spawn borrows the stack until its child has exec'd or exited).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Starts `spec`'s command on `stack`. Returns its pid once it has called
/// `execve`, or the failure code its child stored (the child has then exited
/// with 127, and the caller reaps it like any child).
///
/// # Safety
///
/// The descriptors named in `spec` must stay open until this returns. The
/// child touches nothing but `spec` and `stack`, so other threads of the
/// caller (there are none in init) may go on running.
pub unsafe fn spawn(spec: &ExecSpec, stack: &mut ChildStack) -> Result<i32, SpawnError> {
    // SAFETY: `child` never returns into Rust code of this process; it runs
    // on `stack`, which is borrowed for this whole call (CLONE_VFORK
    // suspends this thread until the child has exec'd or exited), and reads
    // `spec` only.
    let pid = unsafe {
        libc::clone(
            child,
            stack.top() as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            spec as *const ExecSpec as *mut c_void,
        )
    };
    if pid < 0 {
        return Err(SpawnError::Clone(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EAGAIN),
        ));
    }
    match spec.failure.load(Ordering::SeqCst) {
        0 => Ok(pid),
        code => Err(SpawnError::Child(code)),
    }
}

/// Why [`spawn`] started nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnError {
    /// `clone` itself failed, with this errno.
    Clone(i32),
    /// The child failed before its command ran, with this code (see the
    /// module documentation).
    Child(i32),
}

/// `__user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `__user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

fn errno() -> i32 {
    // SAFETY: reading this thread's errno, which the child shares with the
    // suspended parent and has just set.
    unsafe { *libc::__errno_location() }
}

/// The child: raw system calls only, on `spec`'s prepared data.
extern "C" fn child(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ExecSpec` that `spawn` borrows for the child's
    // whole life.
    let spec = unsafe { &*(arg as *const ExecSpec) };
    let fail = |code: i32| -> ! {
        spec.failure.store(code, Ordering::SeqCst);
        // SAFETY: ends this child only (no CLONE_THREAD).
        unsafe { libc::_exit(127) }
    };
    // SAFETY: each call is a plain system call on integers, on pointers
    // into `spec`, or on stack buffers.
    unsafe {
        if libc::setsid() < 0 {
            fail(stage::SETSID);
        }
        for (i, &fd) in spec.stdio.iter().enumerate() {
            if libc::dup2(fd, i as i32) < 0 {
                fail(stage::STDIO);
            }
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        for &(resource, soft, hard) in &spec.rlimits {
            let value = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(resource as _, &value) < 0 {
                fail(stage::RLIMITS);
            }
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) < 0
        {
            fail(stage::CAPABILITIES);
        }
        let c = spec.caps;
        let half = |m: u64, hi: bool| if hi { (m >> 32) as u32 } else { m as u32 };
        let data = [false, true].map(|hi| CapData {
            effective: half(c.effective, hi),
            permitted: half(c.permitted, hi),
            inheritable: half(c.inheritable, hi),
        });
        let header = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) < 0 {
            fail(stage::CAPABILITIES);
        }
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0
            || libc::syscall(libc::SYS_setresgid, spec.gid, spec.gid, spec.gid) < 0
            || libc::syscall(libc::SYS_setresuid, spec.uid, spec.uid, spec.uid) < 0
        {
            fail(stage::IDS);
        }
        if libc::chdir(spec.cwd.as_ptr()) < 0 {
            fail(errno() + CHDIR_FLAG);
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
            fail(stage::NO_NEW_PRIVS);
        }
        libc::syscall(libc::SYS_close_range, 3u32, libc::c_uint::MAX, 0u32);
        // Init is shielded from the OOM killer and non-dumpable; its
        // commands are neither. Only now, with the command's credentials and
        // none of init's descriptors, does the child become dumpable (as an
        // execve of any ordinary program would make it anyway) and set its
        // score to 0, which needs no privilege.
        if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) < 0 || !reset_oom_score() {
            fail(stage::OOM_SCORE);
        }
        let mut code = libc::ENOENT;
        for path in &spec.paths {
            libc::execve(
                path.as_ptr(),
                spec.argv_ptrs.as_ptr(),
                spec.envp_ptrs.as_ptr(),
            );
            code = errno();
            if code != libc::ENOENT {
                break;
            }
        }
        fail(code)
    }
}

/// Sets `oom_score_adj` to 0; true if it is 0 afterwards. Raw calls on
/// stack buffers only.
fn reset_oom_score() -> bool {
    const FILE: &CStr = c"/proc/self/oom_score_adj";
    // SAFETY: plain calls on a static C string and stack buffers.
    unsafe {
        let fd = libc::open(FILE.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if wrote == 1 {
                return true;
            }
        }
        let fd = libc::open(FILE.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let mut buf = [0u8; 8];
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n >= 1 && buf[0] == b'0' && (n == 1 || buf[1] == b'\n')
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;

    use super::*;

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    /// Spawns `argv` with a pipe as stdout; returns (pid or error, output).
    fn run(cwd: &str, paths: &[&str], argv: &[&str]) -> (Result<i32, SpawnError>, String) {
        let (mut read, write) = std::io::pipe().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: plain getters.
        let ids = unsafe { (libc::getuid(), libc::getgid()) };
        let spec = ExecSpec::new(
            [null.as_raw_fd(), write.as_raw_fd(), null.as_raw_fd()],
            vec![(libc::RLIMIT_NOFILE as i32, 64, 64)],
            // What dropping the supplementary groups needs; nothing else.
            crate::hardening::command_cap_masks(&[
                crate::hardening::Capability::CAP_SETGID,
                crate::hardening::Capability::CAP_SETUID,
            ])
            .unwrap(),
            ids,
            c(cwd),
            paths.iter().map(|p| c(p)).collect(),
            argv.iter().map(|a| c(a)).collect(),
            vec![c("GREETING=hello")],
        );
        let mut stack = ChildStack::new().unwrap();
        // SAFETY: the descriptors outlive the call.
        let r = unsafe { spawn(&spec, &mut stack) };
        drop(write);
        let mut out = String::new();
        read.read_to_string(&mut out).unwrap();
        (r, out)
    }

    fn reap(pid: i32) -> i32 {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_child_stack_has_a_guard_page_below_it_and_is_reused() {
        let mut stack = ChildStack::new().unwrap();
        let base = stack.base as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let perms = |addr: usize| {
            maps.lines()
                .find(|l| {
                    let (range, _) = l.split_once(' ').unwrap();
                    let (lo, hi) = range.split_once('-').unwrap();
                    let (lo, hi) = (
                        usize::from_str_radix(lo, 16).unwrap(),
                        usize::from_str_radix(hi, 16).unwrap(),
                    );
                    (lo..hi).contains(&addr)
                })
                .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
        };
        assert_eq!(perms(base).as_deref(), Some("---p"), "the guard page");
        assert_eq!(perms(stack.top() - 8).as_deref(), Some("rw-p"), "the stack");
        // Two spawns on the one stack, one after the other.
        for _ in 0..2 {
            let spec = ExecSpec::new(
                [0, 1, 2],
                Vec::new(),
                crate::hardening::command_cap_masks(&[
                    crate::hardening::Capability::CAP_SETGID,
                    crate::hardening::Capability::CAP_SETUID,
                ])
                .unwrap(),
                // SAFETY: plain getters.
                unsafe { (libc::getuid(), libc::getgid()) },
                c("/"),
                vec![c("/bin/true")],
                vec![c("true")],
                Vec::new(),
            );
            // SAFETY: this process's own stdio stays open.
            let pid = unsafe { spawn(&spec, &mut stack) }.expect("spawned");
            assert_eq!(reap(pid), 0);
        }
    }

    #[test]
    fn a_spawned_command_gets_its_cwd_env_limits_stdio_and_capabilities() {
        let script = "pwd; echo $GREETING; ulimit -n; grep CapEff /proc/self/status";
        let (r, out) = run(
            "/tmp",
            &["/nonexistent/sh", "/bin/sh"],
            &["sh", "-c", script],
        );
        let pid = r.expect("spawned");
        assert_eq!(reap(pid), 0);
        assert_eq!(out, "/tmp\nhello\n64\nCapEff:\t00000000000000c0\n");
    }

    #[test]
    fn failures_before_the_command_runs_come_back_as_codes() {
        let (r, _) = run("/", &["/nonexistent/x"], &["x"]);
        assert_eq!(r, Err(SpawnError::Child(libc::ENOENT)));
        let (r, _) = run("/nonexistent", &["/bin/true"], &["true"]);
        assert_eq!(r, Err(SpawnError::Child(CHDIR_FLAG + libc::ENOENT)));
        let (r, _) = run("/", &["/tmp"], &["tmp"]);
        assert_eq!(r, Err(SpawnError::Child(libc::EACCES)));
    }
}
