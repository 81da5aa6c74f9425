//! The cgroup plan of a sandbox: a pure function from the host's layout, the
//! sandbox id and its limits to the exact directories and writes.
//!
//! The plan's types live in `mayfly_sys::cgroup`, next to the applier that
//! executes them (the engine depends on `mayfly-sys`, not the reverse). Tests
//! compare whole plans, for both layouts.

use std::path::{Path, PathBuf};

use mayfly_types::{ResolvedLimits, SandboxId};

pub use mayfly_sys::cgroup::{
    CgroupLayout, CgroupPlan, CgroupVersion, CgroupWrite, CpuUsageFile, UsageFiles, PARENT_DIR,
};

/// The CFS period; the quota is expressed against it.
pub const CPU_PERIOD_USEC: u64 = 100_000;

/// What v2 enables for the levels above a sandbox.
const V2_SUBTREE: &str = "+memory +cpu +pids";

/// A sandbox's CPU weight against the other sandboxes when the host is
/// busy (quotas cap each one; weights share what is left between them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuWeight {
    /// A pool's sandbox, from its boot until its claim: a sixteenth of a
    /// live one's, so refill takes a bounded share of a busy host's CPU
    /// and never starves the sandboxes in use.
    Pooled,
    /// Claimed or created cold: the kernel's default.
    Live,
}

/// The value of a plan's `cpu_weight` file (v1 `cpu.shares`, default
/// 1024; v2 `cpu.weight`, default 100) for `weight`.
pub fn cpu_weight(version: CgroupVersion, weight: CpuWeight) -> u32 {
    match (version, weight) {
        (CgroupVersion::V1, CpuWeight::Live) => 1024,
        (CgroupVersion::V1, CpuWeight::Pooled) => 64,
        (CgroupVersion::V2, CpuWeight::Live) => 100,
        (CgroupVersion::V2, CpuWeight::Pooled) => 6,
    }
}

/// Why no plan could be made. The layout from discovery always has what is
/// needed; this guards hand-made layouts, failing rather than skipping a limit.
#[derive(Debug, thiserror::Error)]
pub enum CgroupPlanError {
    #[error(
        "the cgroup layout has no `{controller}` hierarchy, so sandbox {id} cannot be limited"
    )]
    MissingController {
        id: SandboxId,
        controller: &'static str,
    },
}

/// Plans the cgroups of sandbox `id` with `limits` on `layout`.
pub fn plan(
    layout: &CgroupLayout,
    id: &SandboxId,
    limits: &ResolvedLimits,
) -> Result<CgroupPlan, CgroupPlanError> {
    match layout {
        CgroupLayout::V2 { root } => Ok(plan_v2(root, id, limits)),
        CgroupLayout::V1 {
            controllers,
            swap_accounting,
        } => {
            let mount = |controller: &'static str| {
                controllers
                    .get(controller)
                    .map(PathBuf::as_path)
                    .ok_or_else(|| CgroupPlanError::MissingController {
                        id: id.clone(),
                        controller,
                    })
            };
            let mounts = V1Mounts {
                memory: mount("memory")?,
                cpu: mount("cpu")?,
                cpuacct: controllers.get("cpuacct").map(PathBuf::as_path),
                pids: mount("pids")?,
            };
            Ok(plan_v1(&mounts, *swap_accounting, id, limits))
        }
    }
}

/// The quota for `cpu_millis` thousandths of a CPU, per [`CPU_PERIOD_USEC`].
fn cpu_quota_usec(limits: &ResolvedLimits) -> u64 {
    u64::from(limits.cpu_millis) * CPU_PERIOD_USEC / 1000
}

/// One directory, `<root>/mayfly/<id>`.
///
/// A controller is usable in a cgroup only when every ancestor enables it for
/// its children, so the root and `mayfly` both get `+memory +cpu +pids`
/// (idempotent writes). Swap is off (`memory.swap.max = 0`).
/// `memory.oom.group` is left off, as on v1 and in Docker: an OOM kill takes
/// the process that grew, not the sandbox, so the task can read the failure
/// and go on (init cannot always shield itself: lowering its
/// `oom_score_adj` needs CAP_SYS_RESOURCE, which some hosts withhold).
fn plan_v2(root: &Path, id: &SandboxId, limits: &ResolvedLimits) -> CgroupPlan {
    let parent = root.join(PARENT_DIR);
    let sb = parent.join(id.as_str());
    CgroupPlan {
        version: CgroupVersion::V2,
        shared_dirs: vec![parent.clone()],
        sandbox_dirs: vec![sb.clone()],
        writes: vec![
            CgroupWrite::new(root.join("cgroup.subtree_control"), V2_SUBTREE),
            CgroupWrite::new(parent.join("cgroup.subtree_control"), V2_SUBTREE),
            CgroupWrite::new(sb.join("memory.max"), limits.memory_bytes.to_string()),
            CgroupWrite::new(sb.join("memory.swap.max"), "0"),
            CgroupWrite::new(
                sb.join("cpu.max"),
                format!("{} {CPU_PERIOD_USEC}", cpu_quota_usec(limits)),
            ),
            CgroupWrite::new(sb.join("pids.max"), limits.pids.to_string()),
        ],
        cpu_weight: sb.join("cpu.weight"),
        usage: UsageFiles {
            memory_current: sb.join("memory.current"),
            memory_peak: sb.join("memory.peak"),
            cpu: Some(CpuUsageFile::StatUsec(sb.join("cpu.stat"))),
            pids_current: sb.join("pids.current"),
            memory_events: sb.join("memory.events"),
        },
    }
}

struct V1Mounts<'a> {
    memory: &'a Path,
    cpu: &'a Path,
    cpuacct: Option<&'a Path>,
    pids: &'a Path,
}

/// One directory per hierarchy, `<mount>/mayfly/<id>`; co-mounted
/// controllers (`cpu,cpuacct`) share one.
///
/// The kernel keeps `memory.limit_in_bytes` at or below
/// `memory.memsw.limit_in_bytes`, refusing any write that would break that.
/// A plan is applied to a fresh cgroup, and again (with other limits) to a
/// stub's prepared one, so it cannot know whether it raises or lowers them:
/// it writes memory+swap first (refused when lowering: [`CgroupWrite::first_try`]),
/// then memory, then memory+swap again, which works either way. Without swap
/// accounting, `memory.swappiness = 0` keeps the sandbox's pages out of swap
/// instead. The OOM killer stays enabled (`memory.oom_control` untouched), so
/// a hog is killed rather than the sandbox hanging. cpuacct is joined only to
/// read CPU time.
fn plan_v1(
    m: &V1Mounts,
    swap_accounting: bool,
    id: &SandboxId,
    limits: &ResolvedLimits,
) -> CgroupPlan {
    let dir = |mount: &Path| mount.join(PARENT_DIR).join(id.as_str());
    let mut mounts: Vec<&Path> = Vec::new();
    for mount in [Some(m.memory), Some(m.cpu), m.cpuacct, Some(m.pids)]
        .into_iter()
        .flatten()
    {
        if !mounts.contains(&mount) {
            mounts.push(mount);
        }
    }
    let (mem, cpu, pids) = (dir(m.memory), dir(m.cpu), dir(m.pids));
    let memory_bytes = limits.memory_bytes.to_string();
    let memsw = mem.join("memory.memsw.limit_in_bytes");
    let (raise, swap) = if swap_accounting {
        (
            Some(CgroupWrite::first_try(&memsw, memory_bytes.clone())),
            CgroupWrite::new(&memsw, memory_bytes.clone()),
        )
    } else {
        (None, CgroupWrite::new(mem.join("memory.swappiness"), "0"))
    };
    CgroupPlan {
        version: CgroupVersion::V1,
        shared_dirs: mounts.iter().map(|p| p.join(PARENT_DIR)).collect(),
        sandbox_dirs: mounts.iter().map(|p| dir(p)).collect(),
        writes: raise
            .into_iter()
            .chain([
                CgroupWrite::new(mem.join("memory.limit_in_bytes"), memory_bytes),
                swap,
                CgroupWrite::new(cpu.join("cpu.cfs_period_us"), CPU_PERIOD_USEC.to_string()),
                CgroupWrite::new(
                    cpu.join("cpu.cfs_quota_us"),
                    cpu_quota_usec(limits).to_string(),
                ),
                CgroupWrite::new(pids.join("pids.max"), limits.pids.to_string()),
            ])
            .collect(),
        cpu_weight: cpu.join("cpu.shares"),
        usage: UsageFiles {
            memory_current: mem.join("memory.usage_in_bytes"),
            memory_peak: mem.join("memory.max_usage_in_bytes"),
            cpu: m
                .cpuacct
                .map(|a| CpuUsageFile::AcctNanos(dir(a).join("cpuacct.usage"))),
            pids_current: pids.join("pids.current"),
            memory_events: mem.join("memory.oom_control"),
        },
    }
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
