//! Per-process hardening, applied in a freshly forked child just before
//! `execve`: rlimits, `no_new_privs`, a reduced capability set, and the
//! seccomp allowlist, installed last.
//!
//! The child is a fork of a single-threaded process, so these may allocate,
//! but they are short and do nothing else. Which limits, capabilities and
//! syscalls is decided by the engine's plans; this module only applies them.

use std::collections::HashSet;
use std::io;

use caps::{CapSet, CapsHashSet};

pub mod bpf_eval;
mod bpf_layout;

pub use bpf_layout::LayoutError;
pub use caps::Capability;
pub use seccompiler::{sock_filter, BpfProgram, TargetArch};

/// Why a hardening step failed. Each one aborts the exec: a command never
/// runs with less protection than was asked for.
#[derive(Debug, thiserror::Error)]
pub enum HardeningError {
    #[error("could not set rlimit {resource} to soft {soft} and hard {hard}")]
    Rlimit {
        resource: i32,
        soft: u64,
        hard: u64,
        #[source]
        source: io::Error,
    },
    #[error("could not set no_new_privs")]
    NoNewPrivs {
        #[source]
        source: io::Error,
    },
    #[error("could not drop capability number {cap} from the bounding set")]
    BoundingSet {
        cap: u8,
        #[source]
        source: io::Error,
    },
    #[error("could not set the {set} capability set")]
    CapSet {
        set: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("the seccomp policy does not compile for {arch:?}")]
    Compile {
        arch: TargetArch,
        #[source]
        source: seccompiler::Error,
    },
    #[error("seccomp filters cannot be built for the `{arch}` architecture")]
    UnsupportedArch { arch: &'static str },
    #[error("the seccomp policy holds no filter")]
    EmptyPolicy,
    #[error("could not install seccomp filter `{name}`")]
    Seccomp {
        name: String,
        #[source]
        source: seccompiler::Error,
    },
}

/// Sets each `(resource, soft, hard)`; `u64::MAX` means unlimited.
///
/// Resources are the `libc::RLIMIT_*` numbers, so plans stay plain data that
/// can cross a socket. Raising a hard limit needs CAP_SYS_RESOURCE in the
/// initial user namespace, so limits above the host's are refused here.
pub fn set_rlimits(limits: &[(i32, u64, u64)]) -> Result<(), HardeningError> {
    for &(resource, soft, hard) in limits {
        let value = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        // SAFETY: `value` is a valid rlimit that outlives the call; an
        // unknown resource number is rejected by the kernel with EINVAL.
        let rc = unsafe { libc::setrlimit(resource as _, &value) };
        if rc != 0 {
            return Err(HardeningError::Rlimit {
                resource,
                soft,
                hard,
                source: io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// Sets `no_new_privs`, so no later `execve` can gain privileges (setuid
/// binaries, file capabilities) and an unprivileged seccomp filter is allowed.
pub fn set_no_new_privs() -> Result<(), HardeningError> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| HardeningError::NoNewPrivs { source: e.into() })
}

/// Reduces the process to the capabilities in `keep`.
///
/// The bounding set goes first, by number up to the kernel's last capability,
/// so capabilities newer than the `caps` crate are dropped too. Then the
/// ambient set is cleared, and the inheritable, effective and permitted sets
/// become `keep` (limited to what is permitted now). Effective is lowered
/// before permitted, because the kernel refuses an effective set larger than
/// the permitted one.
pub fn drop_capabilities(keep: &[Capability]) -> Result<(), HardeningError> {
    drop_bounding_set(keep)?;
    limit_capabilities(keep)
}

/// Drops every capability but `keep` from the bounding set (one
/// `PR_CAPBSET_DROP`, and one new set of credentials, per capability). The
/// bounding set is inherited by fork, so a process that forks many children
/// (a sandbox's init) drops it once for all of them; it only limits what a
/// later `execve` can gain, not the capabilities the caller holds now.
pub fn drop_bounding_set(keep: &[Capability]) -> Result<(), HardeningError> {
    let keep_idx: HashSet<u8> = keep.iter().map(|c| c.index()).collect();
    for cap in 0..64u8 {
        if keep_idx.contains(&cap) {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes a capability number and no pointers.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if rc != 0 {
            let source = io::Error::last_os_error();
            if source.raw_os_error() == Some(libc::EINVAL) {
                break; // past the kernel's last capability
            }
            return Err(HardeningError::BoundingSet { cap, source });
        }
    }
    Ok(())
}

/// The capability sets a command spawned by this process gets (see
/// `spawn`): `keep`, limited to what this process has permitted now, as
/// effective, permitted and inheritable masks.
pub fn command_cap_masks(keep: &[Capability]) -> Result<crate::spawn::CapMasks, HardeningError> {
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|source| HardeningError::CapSet {
            set: "permitted",
            source,
        })?;
    let mask = keep
        .iter()
        .filter(|c| permitted.contains(c))
        .fold(0u64, |m, c| m | (1u64 << c.index()));
    Ok(crate::spawn::CapMasks {
        effective: mask,
        permitted: mask,
        inheritable: mask,
    })
}

/// Clears the ambient set and narrows the inheritable, effective and
/// permitted sets to `keep` (those of them the caller has).
pub fn limit_capabilities(keep: &[Capability]) -> Result<(), HardeningError> {
    let set_err = |set| move |source| HardeningError::CapSet { set, source };
    caps::clear(None, CapSet::Ambient).map_err(set_err("ambient"))?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(set_err("permitted"))?;
    let target: CapsHashSet = keep
        .iter()
        .copied()
        .filter(|c| permitted.contains(c))
        .collect();
    caps::set(None, CapSet::Inheritable, &target).map_err(set_err("inheritable"))?;
    caps::set(None, CapSet::Effective, &target).map_err(set_err("effective"))?;
    caps::set(None, CapSet::Permitted, &target).map_err(set_err("permitted"))?;
    Ok(())
}

/// A filter compiled ahead of time: its name and its instructions as
/// (code, jt, jf, k).
pub type CompiledFilter = (&'static str, &'static [(u16, u8, u8, u32)]);

/// A compiled seccomp policy: one or more BPF filters, installed in order.
///
/// A policy file (seccompiler's JSON format) may hold several filters; they
/// are installed sorted by name. The kernel runs every installed filter and
/// keeps the most severe action; between two `errno` results, the filter
/// installed last wins. That is how the allowlist's EPERM default is refined
/// to ENOSYS for a few syscalls that libc must see as "not implemented".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeccompProgram {
    filters: Vec<(String, BpfProgram)>,
    linear_fallbacks: Vec<(String, LayoutError)>,
}

impl SeccompProgram {
    /// Compiles a policy file for `arch`, each filter laid out as a binary
    /// search on the syscall number (see `bpf_layout`): the kernel runs the
    /// filter for every syscall number when it is installed, and seccompiler's
    /// linear chain of ~300 comparisons made that the bulk of a first exec.
    ///
    /// A filter whose shape the layout does not recognise keeps seccompiler's
    /// program, which enforces the same policy, only slower;
    /// [`linear_fallbacks`](Self::linear_fallbacks) names each one, and why,
    /// for the caller to report.
    pub fn from_json(json: &str, arch: TargetArch) -> Result<SeccompProgram, HardeningError> {
        let mut program = SeccompProgram::from_json_linear(json, arch)?;
        for (name, filter) in &mut program.filters {
            match bpf_layout::tree_layout(filter) {
                Ok(tree) => *filter = tree,
                Err(reason) => program.linear_fallbacks.push((name.clone(), reason)),
            }
        }
        Ok(program)
    }

    /// Compiles a policy file for `arch` into seccompiler's programs as they
    /// are: one `jeq` per syscall, in a chain. The reference that the tree
    /// layout is tested against.
    pub fn from_json_linear(
        json: &str,
        arch: TargetArch,
    ) -> Result<SeccompProgram, HardeningError> {
        let map = seccompiler::compile_from_json(json.as_bytes(), arch)
            .map_err(|source| HardeningError::Compile { arch, source })?;
        let mut filters: Vec<(String, BpfProgram)> = map.into_iter().collect();
        if filters.is_empty() {
            return Err(HardeningError::EmptyPolicy);
        }
        filters.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(SeccompProgram {
            filters,
            linear_fallbacks: Vec::new(),
        })
    }

    /// A program compiled ahead of time (by a build script): each filter's
    /// name and its instructions as (code, jt, jf, k), in installation
    /// order.
    pub fn from_compiled(filters: &[CompiledFilter]) -> Result<SeccompProgram, HardeningError> {
        if filters.is_empty() {
            return Err(HardeningError::EmptyPolicy);
        }
        let filters = filters
            .iter()
            .map(|(name, prog)| {
                let prog = prog
                    .iter()
                    .map(|&(code, jt, jf, k)| sock_filter { code, jt, jf, k })
                    .collect();
                (name.to_string(), prog)
            })
            .collect();
        Ok(SeccompProgram {
            filters,
            linear_fallbacks: Vec::new(),
        })
    }

    /// The filters by name, in installation order.
    pub fn filters(&self) -> &[(String, BpfProgram)] {
        &self.filters
    }

    /// The filters that [`from_json`](Self::from_json) left in seccompiler's
    /// linear layout, and why; empty for the default policy (a test checks).
    pub fn linear_fallbacks(&self) -> &[(String, LayoutError)] {
        &self.linear_fallbacks
    }
}

/// The architecture this binary runs on, as seccomp sees it.
pub fn native_arch() -> Result<TargetArch, HardeningError> {
    let arch = std::env::consts::ARCH;
    TargetArch::try_from(arch).map_err(|_| HardeningError::UnsupportedArch { arch })
}

/// Installs every filter of `program`; call it last, right before `execve`.
///
/// Also sets `no_new_privs` (seccompiler does so before each filter).
pub fn install_seccomp(program: &SeccompProgram) -> Result<(), HardeningError> {
    for (name, filter) in &program.filters {
        seccompiler::apply_filter(filter).map_err(|source| HardeningError::Seccomp {
            name: name.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The irreversible steps run in a forked child, so the test runner itself
/// keeps its privileges (as in youki). The child runs a list of named checks
/// and exits with the number of the first that fails; the parent names it.
#[cfg(test)]
mod tests;
