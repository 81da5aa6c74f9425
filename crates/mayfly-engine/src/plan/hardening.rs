//! The per-command hardening plan: which capabilities a command keeps and
//! which rlimits it runs with. `mayfly_sys::hardening` applies them.

use mayfly_types::ResolvedLimits;

pub use mayfly_sys::hardening::Capability;

/// Docker's default capability set; everything else is dropped, from the
/// bounding set too, so no later `execve` can regain it.
///
/// These are capabilities over the sandbox's own user namespace, so they act
/// on the sandbox's files and processes only. They are kept because ordinary
/// root-inside workflows need them: package managers chown and chmod files
/// (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETFCAP for file capabilities, MKNOD
/// for FIFOs), daemons drop to a service user (SETUID, SETGID, SETPCAP), bind
/// low ports (NET_BIND_SERVICE), `ping` (NET_RAW, in the sandbox's own network
/// namespace), build tools `chroot` (SYS_CHROOT), supervisors signal other
/// users' processes (KILL), and login tools write audit records (AUDIT_WRITE).
/// Absent on purpose: SYS_ADMIN, SYS_PTRACE, SYS_MODULE, SYS_RAWIO,
/// SYS_RESOURCE, SYS_TIME, NET_ADMIN, DAC_READ_SEARCH, BPF, PERFMON and the
/// rest.
pub fn default_capabilities() -> Vec<Capability> {
    vec![
        Capability::CAP_CHOWN,
        Capability::CAP_DAC_OVERRIDE,
        Capability::CAP_FSETID,
        Capability::CAP_FOWNER,
        Capability::CAP_MKNOD,
        Capability::CAP_NET_RAW,
        Capability::CAP_SETGID,
        Capability::CAP_SETUID,
        Capability::CAP_SETFCAP,
        Capability::CAP_SETPCAP,
        Capability::CAP_NET_BIND_SERVICE,
        Capability::CAP_SYS_CHROOT,
        Capability::CAP_KILL,
        Capability::CAP_AUDIT_WRITE,
    ]
}

/// The rlimits every command gets, as `(libc::RLIMIT_*, soft, hard)`.
///
/// * NOFILE from the sandbox's limits, soft = hard, so a program cannot
///   raise it. Raising a hard limit needs CAP_SYS_RESOURCE in the initial
///   user namespace, so a value above the host's hard limit must be set
///   before the sandbox's user namespace is entered, or it fails there.
/// * CORE 0: a crash must not write a core file holding the process's memory
///   into the sandbox (and fill its disk).
///
/// There is no NPROC: it counts per uid across the whole host, so sandboxes
/// would share one budget; the pids cgroup limits each sandbox instead.
pub fn default_rlimits(limits: &ResolvedLimits) -> Vec<(i32, u64, u64)> {
    vec![
        (libc::RLIMIT_NOFILE as i32, limits.nofile, limits.nofile),
        (libc::RLIMIT_CORE as i32, 0, 0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_capabilities_are_dockers_fourteen_without_sys_admin() {
        let caps = default_capabilities();
        assert_eq!(caps.len(), 14);
        for denied in [
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_NET_ADMIN,
            Capability::CAP_SYS_MODULE,
            Capability::CAP_DAC_READ_SEARCH,
            Capability::CAP_SYS_RESOURCE,
        ] {
            assert!(!caps.contains(&denied), "{denied} must be dropped");
        }
    }

    #[test]
    fn rlimits_pin_nofile_from_limits_and_disable_core_dumps() {
        let limits = ResolvedLimits {
            nofile: 1024,
            ..ResolvedLimits::DEFAULT
        };
        assert_eq!(
            default_rlimits(&limits),
            vec![
                (libc::RLIMIT_NOFILE as i32, 1024, 1024),
                (libc::RLIMIT_CORE as i32, 0, 0)
            ]
        );
    }
}
