//! The seccomp policy every sandbox command runs under, kept as data in
//! `seccomp/default.json` (seccompiler's JSON format) and compiled here.
//!
//! The policy is an allowlist modelled on Docker's default profile: about 300
//! syscalls that shells, interpreters, compilers, databases, git and make use;
//! `clone` only without namespace flags; `ioctl` without TIOCSTI/TIOCLINUX;
//! `socket` without AF_VSOCK; `personality` with Docker's safe values.
//!
//! **Unlisted syscalls fail with EPERM**, as in Docker: a denial reads as a
//! denial, and a program cannot mistake it for an old kernel and quietly take
//! a fallback path nobody reviewed. The exception is `clone3`, whose flags sit
//! behind a pointer that seccomp cannot inspect: it returns ENOSYS, because
//! glibc falls back to the filtered `clone` only on ENOSYS (threads and
//! `posix_spawn` would fail on EPERM). seccompiler gives one filter a single
//! match action, so that ENOSYS is a second, one-rule filter installed after
//! the allowlist; the kernel keeps the most severe action of all filters, and
//! between two errno results the one installed last. Newer syscalls that
//! glibc probes with an ENOSYS fallback (`faccessat2`, `fchmodat2`,
//! `close_range`, `statx`, `openat2`, `rseq`, `map_shadow_stack`…) are listed.
//!
//! **ptrace is allowed**, as in Docker on kernels from 4.8, which re-run the
//! filter after a tracer changes a syscall, so tracing cannot bypass it. The
//! tracee must pass the kernel's ptrace access check, so it is a process of
//! the same sandbox with no capability the tracer lacks; gdb, strace and
//! LeakSanitizer (which CI test runs use) need it. `kcmp`, `pidfd_getfd` and
//! `process_madvise` stay denied, as in Docker without CAP_SYS_PTRACE.
//!
//! Denied among others: mount and the new mount API, `pivot_root`, `unshare`,
//! `setns`, the keyring (`keyctl`, `add_key`, `request_key`), `bpf`,
//! `perf_event_open`, `userfaultfd`, io_uring (a frequent source of kernel
//! privilege escalations; its users fall back to epoll), `kexec_*`, module
//! loading, `open_by_handle_at`, `name_to_handle_at`, `iopl`, `ioperm`, swap,
//! `reboot`, `acct`, `quotactl`, `syslog`, `sethostname`, clock setting, and
//! NUMA policy calls.
//!
//! The policy is written for x86_64; other architectures are refused rather
//! than run unfiltered.

use mayfly_sys::hardening::{native_arch, HardeningError, TargetArch};

pub use mayfly_sys::hardening::{BpfProgram, SeccompProgram as Filter};

/// The default policy, embedded at build time.
pub const DEFAULT_POLICY: &str = include_str!("../../seccomp/default.json");

/// [`DEFAULT_POLICY`] compiled and laid out by the build script.
mod compiled {
    include!(concat!(env!("OUT_DIR"), "/seccomp_default.rs"));
}

/// Why the default filter could not be built. Creation must then fail: a
/// command never runs without its filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompPlanError {
    #[error("Mayfly's seccomp policy is written for x86_64 and cannot filter {arch:?} syscalls")]
    UnsupportedArch { arch: TargetArch },
    #[error("the default seccomp policy could not be compiled")]
    Compile {
        #[source]
        source: HardeningError,
    },
}

/// The default filter for the architecture this binary runs on.
pub fn default_filter() -> Result<Filter, SeccompPlanError> {
    let arch = native_arch().map_err(|source| SeccompPlanError::Compile { source })?;
    default_filter_for(arch)
}

/// The default filter for `arch`, laid out as a binary search on the
/// syscall number. It was compiled by the build script (`build.rs`), so
/// this only copies it; a filter the layout could not handle stayed linear
/// (the same policy, slower), and the build said so.
pub fn default_filter_for(arch: TargetArch) -> Result<Filter, SeccompPlanError> {
    if arch != TargetArch::x86_64 {
        return Err(SeccompPlanError::UnsupportedArch { arch });
    }
    Filter::from_compiled(compiled::COMPILED).map_err(|source| SeccompPlanError::Compile { source })
}

#[cfg(test)]
#[cfg(target_arch = "x86_64")]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use mayfly_sys::hardening::bpf_eval::{evaluate, SyscallData};
    use mayfly_sys::hardening::sock_filter;

    use super::*;

    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

    /// Runs one seccomp program on (arch, nr, args): the action and how
    /// many instructions ran.
    fn run(prog: &[sock_filter], arch: u32, nr: i64, args: [u64; 6]) -> (u32, usize) {
        let data = SyscallData {
            nr: nr as u32,
            arch,
            args,
        };
        evaluate(prog, &data).expect("the filter evaluates")
    }

    /// What the kernel returns with every filter installed: each runs, newest
    /// first, and the most severe action wins (the newest on a tie).
    fn verdict_on(arch: u32, nr: i64, args: [u64; 6]) -> u32 {
        let filter = default_filter().unwrap();
        let action = |r: u32| (r & libc::SECCOMP_RET_ACTION_FULL) as i32;
        let mut verdict = RET_ALLOW;
        for (_, prog) in filter.filters().iter().rev() {
            let (r, _) = run(prog, arch, nr, args);
            if action(r) < action(verdict) {
                verdict = r;
            }
        }
        verdict
    }

    fn verdict(nr: i64, args: &[u64]) -> u32 {
        let mut all = [0u64; 6];
        all[..args.len()].copy_from_slice(args);
        verdict_on(AUDIT_ARCH_X86_64, nr, all)
    }

    #[test]
    fn the_policy_compiles_into_the_allowlist_then_the_enosys_layer() {
        let filter = default_filter().unwrap();
        let names: Vec<&str> = filter.filters().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["1-allowlist", "2-enosys"]);
    }

    #[test]
    fn must_allow_syscalls_are_allowed() {
        use libc::*;
        let thread = (CLONE_VM
            | CLONE_FS
            | CLONE_FILES
            | CLONE_SIGHAND
            | CLONE_THREAD
            | CLONE_SYSVSEM
            | CLONE_SETTLS
            | CLONE_PARENT_SETTID
            | CLONE_CHILD_CLEARTID) as u64;
        let cases: &[(&str, i64, &[u64])] = &[
            ("read", SYS_read, &[]),
            ("write", SYS_write, &[]),
            ("openat", SYS_openat, &[]),
            ("close", SYS_close, &[]),
            ("execve", SYS_execve, &[]),
            ("execveat", SYS_execveat, &[]),
            ("clone for fork", SYS_clone, &[SIGCHLD as u64]),
            ("clone for a thread", SYS_clone, &[thread]),
            ("fork", SYS_fork, &[]),
            ("vfork", SYS_vfork, &[]),
            ("wait4", SYS_wait4, &[]),
            ("exit_group", SYS_exit_group, &[]),
            ("mmap", SYS_mmap, &[]),
            ("mprotect", SYS_mprotect, &[]),
            ("futex", SYS_futex, &[]),
            ("socket AF_INET", SYS_socket, &[AF_INET as u64]),
            ("socket AF_UNIX", SYS_socket, &[AF_UNIX as u64]),
            ("socket AF_NETLINK", SYS_socket, &[AF_NETLINK as u64]),
            ("connect", SYS_connect, &[]),
            ("bind", SYS_bind, &[]),
            ("accept4", SYS_accept4, &[]),
            ("ioctl TCGETS", SYS_ioctl, &[0, TCGETS]),
            ("ioctl FIONREAD", SYS_ioctl, &[0, FIONREAD]),
            ("pipe2", SYS_pipe2, &[]),
            ("getdents64", SYS_getdents64, &[]),
            ("newfstatat", SYS_newfstatat, &[]),
            ("statx", SYS_statx, &[]),
            ("faccessat2", SYS_faccessat2, &[]),
            ("fchmodat2", SYS_fchmodat2, &[]),
            ("close_range", SYS_close_range, &[]),
            ("rseq", SYS_rseq, &[]),
            ("set_robust_list", SYS_set_robust_list, &[]),
            ("arch_prctl", SYS_arch_prctl, &[]),
            ("prlimit64", SYS_prlimit64, &[]),
            ("getrandom", SYS_getrandom, &[]),
            ("epoll_pwait", SYS_epoll_pwait, &[]),
            ("shmget (postgres)", SYS_shmget, &[]),
            ("semget (postgres)", SYS_semget, &[]),
            ("memfd_create", SYS_memfd_create, &[]),
            ("setuid", SYS_setuid, &[]),
            ("setgroups", SYS_setgroups, &[]),
            ("chown", SYS_chown, &[]),
            ("chroot", SYS_chroot, &[]),
            ("kill", SYS_kill, &[]),
            ("prctl", SYS_prctl, &[]),
            ("seccomp (nested sandboxes)", SYS_seccomp, &[]),
            ("ptrace", SYS_ptrace, &[]),
            ("personality query", SYS_personality, &[0xffff_ffff]),
            ("personality PER_LINUX", SYS_personality, &[0]),
        ];
        for (what, nr, args) in cases {
            assert_eq!(verdict(*nr, args), RET_ALLOW, "{what} must be allowed");
        }
    }

    #[test]
    fn must_deny_syscalls_fail_with_eperm() {
        use libc::*;
        let cases: &[(&str, i64)] = &[
            ("mount", SYS_mount),
            ("umount2", SYS_umount2),
            ("pivot_root", SYS_pivot_root),
            ("unshare", SYS_unshare),
            ("setns", SYS_setns),
            ("keyctl", SYS_keyctl),
            ("add_key", SYS_add_key),
            ("request_key", SYS_request_key),
            ("bpf", SYS_bpf),
            ("perf_event_open", SYS_perf_event_open),
            ("userfaultfd", SYS_userfaultfd),
            ("kexec_load", SYS_kexec_load),
            ("kexec_file_load", SYS_kexec_file_load),
            ("init_module", SYS_init_module),
            ("finit_module", SYS_finit_module),
            ("delete_module", SYS_delete_module),
            ("open_by_handle_at", SYS_open_by_handle_at),
            ("name_to_handle_at", SYS_name_to_handle_at),
            ("iopl", SYS_iopl),
            ("ioperm", SYS_ioperm),
            ("swapon", SYS_swapon),
            ("swapoff", SYS_swapoff),
            ("reboot", SYS_reboot),
            ("acct", SYS_acct),
            ("lookup_dcookie", SYS_lookup_dcookie),
            ("quotactl", SYS_quotactl),
            ("quotactl_fd", SYS_quotactl_fd),
            ("io_uring_setup", SYS_io_uring_setup),
            ("io_uring_enter", SYS_io_uring_enter),
            ("fsopen", SYS_fsopen),
            ("fsmount", SYS_fsmount),
            ("move_mount", SYS_move_mount),
            ("open_tree", SYS_open_tree),
            ("mount_setattr", SYS_mount_setattr),
            ("syslog", SYS_syslog),
            ("sethostname", SYS_sethostname),
            ("settimeofday", SYS_settimeofday),
            ("clock_settime", SYS_clock_settime),
            ("vhangup", SYS_vhangup),
            ("kcmp", SYS_kcmp),
            ("pidfd_getfd", SYS_pidfd_getfd),
            ("set_mempolicy", SYS_set_mempolicy),
            ("fanotify_init", SYS_fanotify_init),
            ("uselib", SYS_uselib),
            ("an unknown syscall number", 1000),
        ];
        for (what, nr) in cases {
            assert_eq!(verdict(*nr, &[]), RET_EPERM, "{what} must fail with EPERM");
        }
    }

    #[test]
    fn clone_with_any_namespace_flag_is_denied() {
        use libc::*;
        for flag in [
            CLONE_NEWNS,
            CLONE_NEWCGROUP,
            CLONE_NEWUTS,
            CLONE_NEWIPC,
            CLONE_NEWUSER,
            CLONE_NEWPID,
            CLONE_NEWNET,
        ] {
            let flags = (flag | SIGCHLD) as u64;
            assert_eq!(
                verdict(SYS_clone, &[flags]),
                RET_EPERM,
                "clone with {flag:#x}"
            );
        }
    }

    #[test]
    fn clone3_returns_enosys_so_libc_falls_back_to_clone() {
        assert_eq!(verdict(libc::SYS_clone3, &[]), RET_ENOSYS);
    }

    #[test]
    fn terminal_injection_ioctls_are_denied_even_with_high_bits_set() {
        // The kernel truncates the request to 32 bits, so the filter must too.
        for req in [0x5412u64, 0x541C, 0x1_0000_5412, 0xFFFF_FFFF_0000_541C] {
            assert_eq!(
                verdict(libc::SYS_ioctl, &[0, req]),
                RET_EPERM,
                "ioctl {req:#x}"
            );
        }
    }

    #[test]
    fn vsock_sockets_and_risky_personalities_are_denied() {
        assert_eq!(
            verdict(libc::SYS_socket, &[libc::AF_VSOCK as u64]),
            RET_EPERM
        );
        for persona in [
            libc::READ_IMPLIES_EXEC,
            libc::ADDR_NO_RANDOMIZE,
            libc::ADDR_COMPAT_LAYOUT,
        ] {
            assert_eq!(
                verdict(libc::SYS_personality, &[persona as u64]),
                RET_EPERM,
                "{persona:#x}"
            );
        }
    }

    #[test]
    fn x32_syscall_numbers_and_foreign_architectures_are_not_allowed() {
        // The x32 ABI sets bit 30 of the number: no allowlist entry matches.
        assert_eq!(verdict(libc::SYS_read | 0x4000_0000, &[]), RET_EPERM);
        // i386 entry (int 0x80) on x86_64: the arch check kills the process.
        assert_eq!(verdict_on(AUDIT_ARCH_I386, 3, [0; 6]), RET_KILL);
    }

    #[test]
    fn other_architectures_are_refused_rather_than_unfiltered() {
        let err = default_filter_for(TargetArch::aarch64).unwrap_err();
        assert!(
            matches!(err, SeccompPlanError::UnsupportedArch { .. }),
            "{err:?}"
        );
    }

    /// seccompiler drops a syscall's unconditional allow when the same name
    /// also has a rule with arguments; the policy must never list both.
    #[test]
    fn no_syscall_is_listed_both_with_and_without_arguments() {
        let policy: serde_json::Value = serde_json::from_str(DEFAULT_POLICY).unwrap();
        for (name, filter) in policy.as_object().unwrap() {
            let mut kinds: BTreeMap<&str, BTreeSet<bool>> = BTreeMap::new();
            let mut plain = BTreeSet::new();
            for rule in filter["filter"].as_array().unwrap() {
                let syscall = rule["syscall"].as_str().unwrap();
                let has_args = rule.get("args").is_some();
                kinds.entry(syscall).or_default().insert(has_args);
                assert!(
                    has_args || plain.insert(syscall),
                    "{name}: {syscall} is listed twice"
                );
            }
            for (syscall, k) in kinds {
                assert_eq!(
                    k.len(),
                    1,
                    "{name}: {syscall} is listed with and without arguments"
                );
            }
        }
    }

    #[test]
    fn the_allowlist_is_about_the_size_of_dockers() {
        let policy: serde_json::Value = serde_json::from_str(DEFAULT_POLICY).unwrap();
        let names: BTreeSet<&str> = policy["1-allowlist"]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["syscall"].as_str().unwrap())
            .collect();
        assert!(
            (280..=330).contains(&names.len()),
            "{} syscalls",
            names.len()
        );
    }

    /// Argument values around every rule of the policy: 0, all ones, each
    /// single bit, and each value and mask of the policy with its neighbours
    /// and with the upper 32 bits set.
    fn argument_values() -> BTreeSet<u64> {
        let policy: serde_json::Value = serde_json::from_str(DEFAULT_POLICY).unwrap();
        let mut values: BTreeSet<u64> = (0..64).map(|b| 1 << b).collect();
        values.extend([0, u64::MAX]);
        for layer in policy.as_object().unwrap().values() {
            for rule in layer["filter"].as_array().unwrap() {
                let args = rule.get("args").and_then(|a| a.as_array());
                for arg in args.into_iter().flatten() {
                    let mask = arg["op"].get("masked_eq").and_then(|m| m.as_u64());
                    for v in [arg["val"].as_u64(), mask].into_iter().flatten() {
                        let high = v | 0xFFFF_FFFF_0000_0000;
                        values.extend([v, v.wrapping_add(1), v.wrapping_sub(1), high]);
                    }
                }
            }
        }
        values
    }

    /// What is installed (the tree layout) against seccompiler's own linear
    /// programs, filter by filter: every number up to 1023, the same with
    /// the x32 bit, a foreign architecture, and every argument value above
    /// in each of arguments 0 to 2, for every number (a superset of the
    /// syscalls with rules).
    /// The program compiled at build time is the policy as it reads now,
    /// compiled and laid out at run time: the build cannot drift from it.
    #[test]
    fn the_filter_compiled_at_build_time_is_the_policy_compiled_now() {
        let now = Filter::from_json(DEFAULT_POLICY, TargetArch::x86_64).unwrap();
        let built = default_filter().unwrap();
        assert_eq!(built.filters().len(), now.filters().len());
        let instructions: usize = built.filters().iter().map(|(_, p)| p.len()).sum();
        assert!(instructions > 100, "{instructions} instructions");
        assert_eq!(built, now);
    }

    #[test]
    fn the_installed_tree_gives_the_verdicts_of_seccompilers_linear_program() {
        let tree = default_filter().unwrap();
        let fallbacks = Filter::from_json(DEFAULT_POLICY, TargetArch::x86_64)
            .unwrap()
            .linear_fallbacks()
            .to_vec();
        assert!(fallbacks.is_empty(), "{fallbacks:?}");
        let linear = Filter::from_json_linear(DEFAULT_POLICY, TargetArch::x86_64).unwrap();
        assert_ne!(tree.filters(), linear.filters());
        let values = argument_values();
        for ((name, t), (_, l)) in tree.filters().iter().zip(linear.filters()) {
            for nr in (0..=1023).flat_map(|nr| [nr, nr | 0x4000_0000]) {
                let same = |arch, args| {
                    let (a, b) = (run(t, arch, nr, args).0, run(l, arch, nr, args).0);
                    assert_eq!(a, b, "{name}: nr {nr:#x}, arch {arch:#x}, args {args:x?}");
                };
                same(AUDIT_ARCH_I386, [0; 6]);
                same(AUDIT_ARCH_X86_64, [0; 6]);
                for (&v, i) in values.iter().flat_map(|v| [(v, 0), (v, 1), (v, 2)]) {
                    let mut args = [0; 6];
                    args[i] = v;
                    same(AUDIT_ARCH_X86_64, args);
                }
            }
        }
    }

    /// The most instructions any syscall number runs through in the
    /// allowlist, with arguments of 0.
    fn worst_path(filter: &Filter) -> usize {
        let allowlist = &filter.filters()[0].1;
        (0..=1023)
            .flat_map(|nr| [nr, nr | 0x4000_0000])
            .map(|nr| run(allowlist, AUDIT_ARCH_X86_64, nr, [0; 6]).1)
            .max()
            .unwrap()
    }

    #[test]
    fn the_installed_allowlist_decides_any_syscall_in_a_few_dozen_steps() {
        let linear = Filter::from_json_linear(DEFAULT_POLICY, TargetArch::x86_64).unwrap();
        let (tree, linear) = (worst_path(&default_filter().unwrap()), worst_path(&linear));
        assert!(tree < 40, "the tree takes up to {tree} steps");
        assert!(linear > 500, "the linear program took only {linear} steps");
    }
}
