//! Hardening tests, each in a forked child so the test runner is untouched.
use super::*;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

/// The engine's real policy, the one every sandbox command runs under.
const POLICY: &str = include_str!("../../../mayfly-engine/seccomp/default.json");

/// A reduced set, like the engine's `default_capabilities` (which the
/// engine tests for content); here only the mechanism is under test.
const KEEP: [Capability; 4] = [
    Capability::CAP_CHOWN,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_KILL,
];

type Check = (&'static str, fn() -> bool);

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test drops capabilities that only root has; run the tests as root (CI does)"
    );
}

/// Runs `setup` then `checks` in a forked child; panics naming the first
/// failure.
fn in_child(setup: fn() -> Result<(), HardeningError>, checks: &[Check]) {
    // SAFETY: the test runner is multi-threaded, so the child may only
    // rely on what survives fork: glibc keeps malloc usable, and the child
    // never returns into the runner; it ends with `_exit`.
    match unsafe { fork() }.expect("fork failed") {
        ForkResult::Child => {
            // A panic must not unwind into the runner's copy in the child.
            let code = std::panic::catch_unwind(|| match setup() {
                Err(_) => 200,
                Ok(()) => checks.iter().position(|(_, ok)| !ok()).map_or(0, |i| i + 1),
            })
            .unwrap_or(201);
            // SAFETY: ends the child at once, running no destructors or
            // atexit handlers that belong to the parent's state.
            unsafe { libc::_exit(code as i32) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid failed") {
            WaitStatus::Exited(_, 0) => {}
            WaitStatus::Exited(_, 200) => panic!("hardening itself failed in the child"),
            WaitStatus::Exited(_, 201) => panic!("a check panicked in the child"),
            WaitStatus::Exited(_, n) => panic!("check failed: {}", checks[n as usize - 1].0),
            other => panic!("the child did not exit normally: {other:?}"),
        },
    }
}

fn harden_fully() -> Result<(), HardeningError> {
    set_no_new_privs()?;
    drop_capabilities(&KEEP)?;
    install_seccomp(&SeccompProgram::from_json(POLICY, native_arch()?)?)
}

fn seccomp_only() -> Result<(), HardeningError> {
    install_seccomp(&SeccompProgram::from_json(POLICY, native_arch()?)?)
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A raw syscall's errno, or 0 when it succeeded.
fn fails_with(ret: libc::c_long) -> i32 {
    if ret == -1 {
        errno()
    } else {
        0
    }
}

fn getpid_works() -> bool {
    // SAFETY: getpid takes no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
    pid > 0
}

fn unshare_denied() -> bool {
    [libc::CLONE_NEWNS, libc::CLONE_NEWUSER]
        .iter()
        .all(|&flags| {
            // SAFETY: unshare takes flags only; if it wrongly succeeded, only
            // this throwaway child would be in a new namespace.
            fails_with(unsafe { libc::unshare(flags) }.into()) == libc::EPERM
        })
}

fn mount_denied() -> bool {
    // A missing target makes the kernel say ENOENT; only seccomp says EPERM.
    // SAFETY: all pointers are NUL-terminated literals; nothing is mounted.
    let rc = unsafe {
        libc::mount(
            c"none".as_ptr(),
            c"/nonexistent-mayfly".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    fails_with(rc.into()) == libc::EPERM
}

fn keyctl_denied() -> bool {
    // KEYCTL_GET_KEYRING_ID of the session keyring, without creating it.
    // SAFETY: integer arguments only.
    let rc = unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) };
    fails_with(rc) == libc::EPERM
}

fn clone3_is_enosys() -> bool {
    // Without seccomp, a null argument is EFAULT/EINVAL; ENOSYS is the filter.
    // SAFETY: the kernel rejects the null pointer before doing anything.
    fails_with(unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) }) == libc::ENOSYS
}

fn clone_newuser_denied() -> bool {
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: with a null stack, clone behaves like fork; a child that
    // wrongly appears exits at once.
    let rc = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if rc == 0 {
        // SAFETY: leaving the accidental child immediately.
        unsafe { libc::_exit(0) }
    }
    fails_with(rc) == libc::EPERM
}

fn fork_and_wait_work() -> bool {
    // SAFETY: the grandchild only calls `_exit`.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            // SAFETY: ends the grandchild at once.
            unsafe { libc::_exit(7) }
        }
        Ok(ForkResult::Parent { child }) => {
            matches!(waitpid(child, None), Ok(WaitStatus::Exited(_, 7)))
        }
        Err(_) => false,
    }
}

fn threads_start() -> bool {
    // glibc creates threads with clone3 and falls back to clone on ENOSYS.
    std::thread::spawn(|| 5).join().ok() == Some(5)
}

/// TIOCSTI is denied, also with the upper 32 bits set (the kernel ignores
/// them); TCGETS reaches the kernel, which says /dev/null is no terminal.
fn only_terminal_injection_ioctls_denied() -> bool {
    let Ok(null) = std::fs::File::open("/dev/null") else {
        return false;
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&null);
    let mut buf = [0u8; 64]; // larger than a termios
    let mut ioctl = |req: u64| {
        // SAFETY: /dev/null is no terminal, and `buf` outlives the call
        // and can hold what TCGETS would write.
        fails_with(unsafe { libc::syscall(libc::SYS_ioctl, fd, req, buf.as_mut_ptr()) })
    };
    ioctl(0x5412) == libc::EPERM
        && ioctl(0x1_0000_5412) == libc::EPERM
        && ioctl(libc::TCGETS) == libc::ENOTTY
}

fn vsock_denied_unix_allowed() -> bool {
    // SAFETY: socket takes integers; descriptors that open are closed.
    let vsock = fails_with(unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) }.into());
    // SAFETY: as above.
    let unix = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if unix >= 0 {
        // SAFETY: `unix` is a descriptor this function owns.
        unsafe { libc::close(unix) };
    }
    vsock == libc::EPERM && unix >= 0
}

fn risky_personality_denied() -> bool {
    // SAFETY: 0xffffffff only queries; READ_IMPLIES_EXEC is refused.
    let query = unsafe { libc::personality(0xffff_ffff) };
    // SAFETY: as above.
    let risky = unsafe { libc::personality(libc::READ_IMPLIES_EXEC as libc::c_ulong) };
    query >= 0 && risky == -1 && errno() == libc::EPERM
}

fn unknown_syscall_is_eperm() -> bool {
    // The kernel alone would say ENOSYS for a number it does not know.
    // SAFETY: no such syscall exists.
    fails_with(unsafe { libc::syscall(1000) }) == libc::EPERM
}

fn dangerous_syscalls_denied() -> bool {
    let nrs = [
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
        libc::SYS_setns,
        libc::SYS_pivot_root,
        libc::SYS_add_key,
        libc::SYS_open_by_handle_at,
    ];
    // SAFETY: with all-zero arguments each call is harmless even if the
    // kernel ran it (null pointers fault, fd 0 is no namespace; a stray
    // userfaultfd would only be a descriptor of this throwaway child).
    nrs.iter()
        .all(|&nr| fails_with(unsafe { libc::syscall(nr, 0, 0, 0, 0, 0) }) == libc::EPERM)
}

/// `CapXxx:` of /proc/self/status as a bit mask.
fn cap_mask(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
}

fn kept_mask() -> u64 {
    KEEP.iter().map(|c| c.bitmask()).fold(0, |a, b| a | b)
}

fn caps_are_exactly_the_kept_set() -> bool {
    ["CapBnd:", "CapEff:", "CapPrm:", "CapInh:"]
        .iter()
        .all(|f| cap_mask(f) == Some(kept_mask()))
        && cap_mask("CapAmb:") == Some(0)
}

fn no_new_privs_is_set() -> bool {
    nix::sys::prctl::get_no_new_privs() == Ok(true)
}

#[test]
fn default_policy_compiles_into_allowlist_then_enosys_layer() {
    let program = SeccompProgram::from_json(POLICY, native_arch().unwrap()).unwrap();
    let names: Vec<&str> = program.filters().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["1-allowlist", "2-enosys"]);
}

#[test]
fn hardened_child_is_denied_namespaces_mounts_and_keys_but_runs_normally() {
    require_root();
    in_child(
        harden_fully,
        &[
            ("getpid works", getpid_works),
            ("unshare(NEWNS or NEWUSER) is EPERM", unshare_denied),
            ("mount is EPERM", mount_denied),
            ("keyctl is EPERM", keyctl_denied),
            ("clone3 is ENOSYS", clone3_is_enosys),
            ("clone with CLONE_NEWUSER is EPERM", clone_newuser_denied),
            ("fork and wait work", fork_and_wait_work),
            ("threads start", threads_start),
            (
                "only TIOCSTI is EPERM",
                only_terminal_injection_ioctls_denied,
            ),
            ("AF_VSOCK is EPERM, AF_UNIX not", vsock_denied_unix_allowed),
            ("risky personality is EPERM", risky_personality_denied),
            ("an unknown syscall is EPERM", unknown_syscall_is_eperm),
            (
                "bpf, io_uring, setns... are EPERM",
                dangerous_syscalls_denied,
            ),
            ("caps are the kept set", caps_are_exactly_the_kept_set),
            ("no_new_privs is set", no_new_privs_is_set),
        ],
    );
}

#[test]
fn without_the_filter_each_denial_check_fails_so_the_checks_discriminate() {
    require_root();
    in_child(
        || Ok(()),
        &[
            ("keyctl works", || !keyctl_denied()),
            ("mount reaches the kernel", || !mount_denied()),
            ("clone3 reaches the kernel", || !clone3_is_enosys()),
            ("TIOCSTI reaches the kernel", || {
                !only_terminal_injection_ioctls_denied()
            }),
            ("an unknown syscall is ENOSYS", || {
                !unknown_syscall_is_eperm()
            }),
        ],
    );
}

#[test]
#[should_panic(expected = "check failed: second")]
fn a_failing_check_in_the_child_fails_the_test_by_name() {
    in_child(|| Ok(()), &[("first", || true), ("second", || false)]);
}

#[test]
fn seccomp_alone_denies_namespaces_even_with_cap_sys_admin() {
    require_root();
    in_child(
        seccomp_only,
        &[
            ("CAP_SYS_ADMIN is still held", || {
                cap_mask("CapEff:").is_some_and(|m| m & (1 << 21) != 0)
            }),
            ("unshare(CLONE_NEWNS or NEWUSER) is EPERM", unshare_denied),
            ("mount is EPERM", mount_denied),
        ],
    );
}

#[test]
fn capability_drop_leaves_exactly_the_kept_set() {
    require_root();
    in_child(
        || drop_capabilities(&KEEP),
        &[("caps are the kept set", caps_are_exactly_the_kept_set)],
    );
}

#[test]
fn rlimits_are_applied_and_no_new_privs_is_set() {
    require_root();
    fn setup() -> Result<(), HardeningError> {
        set_rlimits(&[
            (libc::RLIMIT_NOFILE as i32, 100, 200),
            (libc::RLIMIT_CORE as i32, 0, 0),
        ])?;
        set_no_new_privs()
    }
    fn limits_read_back() -> bool {
        let get = |r| nix::sys::resource::getrlimit(r).ok();
        use nix::sys::resource::Resource;
        get(Resource::RLIMIT_NOFILE) == Some((100, 200))
            && get(Resource::RLIMIT_CORE) == Some((0, 0))
    }
    in_child(
        setup,
        &[
            ("rlimits read back", limits_read_back),
            ("no_new_privs", no_new_privs_is_set),
        ],
    );
}

#[test]
fn a_refused_rlimit_names_resource_and_values() {
    // Soft above hard is refused by the kernel and changes nothing.
    let err = set_rlimits(&[(libc::RLIMIT_NOFILE as i32, 300, 200)]).unwrap_err();
    assert!(
        matches!(
            err,
            HardeningError::Rlimit {
                soft: 300,
                hard: 200,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn hardened_child_can_exec_a_shell_that_runs_a_pipeline() {
    require_root();
    fn exec_shell() -> bool {
        let script = c"x=$(echo hi | cat); [ \"$x\" = hi ] && grep -q '^Seccomp:.2' /proc/self/status && ls / >/dev/null";
        let argv = [
            c"sh".as_ptr(),
            c"-c".as_ptr(),
            script.as_ptr(),
            std::ptr::null(),
        ];
        // SAFETY: argv is a NULL-terminated array of NUL-terminated
        // strings that outlive the call; on success it does not return.
        unsafe { libc::execv(c"/bin/sh".as_ptr(), argv.as_ptr()) };
        false
    }
    in_child(harden_fully, &[("the shell runs and exits 0", exec_shell)]);
}

/// Why an exec child becomes dumpable before it resets its OOM score: a
/// non-dumpable process that gave up root cannot open its own
/// `/proc/self/oom_score_adj`; a dumpable one can.
#[test]
fn a_non_dumpable_process_without_root_cannot_reset_its_own_oom_score() {
    require_root();
    fn nothing() -> Result<(), HardeningError> {
        Ok(())
    }
    fn write_score() -> bool {
        std::fs::write("/proc/self/oom_score_adj", "0").is_ok()
    }
    fn refused_while_non_dumpable() -> bool {
        crate::process::set_dumpable(false).is_ok()
            && crate::process::set_ids(65534, 65534).is_ok()
            && !write_score()
    }
    fn allowed_once_dumpable() -> bool {
        crate::process::set_dumpable(true).is_ok() && write_score()
    }
    in_child(
        nothing,
        &[
            (
                "as nobody and non-dumpable, the write is refused",
                refused_while_non_dumpable,
            ),
            ("once dumpable, the write works", allowed_once_dumpable),
        ],
    );
}
