//! Host-side probes: processes, cgroups, mounts and directories that a
//! sandbox may leave behind, found by the names Mayfly gives them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The v1 hierarchies Mayfly puts a sandbox in.
const V1_CONTROLLERS: [&str; 4] = ["memory", "cpu", "cpuacct", "pids"];
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// One host process, from `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: u32,
    pub comm: String,
    /// `R`, `S`, `Z`…
    pub state: char,
    pub ppid: u32,
    /// The real uid, as the host sees it.
    pub uid: u32,
}

impl ProcInfo {
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }
}

/// Every pid in the host's `/proc`.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// What `/proc/<pid>/status` says, or `None` if the process is gone.
pub fn proc_info(pid: u32) -> Option<ProcInfo> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    Some(ProcInfo {
        pid,
        comm: field("Name:")?.to_owned(),
        state: field("State:")?.chars().next()?,
        ppid: field("PPid:")?.parse().ok()?,
        uid: field("Uid:")?.split_whitespace().next()?.parse().ok()?,
    })
}

/// The process's start time in clock ticks (field 22 of `/proc/<pid>/stat`),
/// to tell a process from a later one that reuses its pid.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; fields follow the last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// Processes directly below `pid`.
pub fn children_of(pid: u32) -> Vec<ProcInfo> {
    all_pids()
        .into_iter()
        .filter_map(proc_info)
        .filter(|p| p.ppid == pid)
        .collect()
}

/// Host processes in any cgroup of sandbox `id` (`…/mayfly/<id>` in
/// `/proc/<pid>/cgroup`), zombies included.
pub fn procs_in_sandbox(id: &str) -> Vec<ProcInfo> {
    let needle = format!("mayfly/{id}");
    all_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l.contains(&needle)))
        })
        .filter_map(proc_info)
        .collect()
}

/// Whether `/sys/fs/cgroup` itself is a cgroup2 (unified) mount.
pub fn cgroup_is_v2() -> bool {
    let Ok(c) = std::ffi::CString::new(CGROUP_ROOT) else {
        return false;
    };
    // SAFETY: statfs(2) on a NUL-terminated path into a zeroed, owned struct.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type == libc::CGROUP2_SUPER_MAGIC
    }
}

/// Every directory a cgroup of sandbox `id` could have on this host.
pub fn cgroup_candidates(id: &str) -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    if cgroup_is_v2() {
        return vec![root.join("mayfly").join(id)];
    }
    let mut v: Vec<PathBuf> = V1_CONTROLLERS
        .iter()
        .map(|c| root.join(c).join("mayfly").join(id))
        .collect();
    // The hybrid layout's controller-less cgroup2 tree must stay unused too.
    v.push(root.join("unified").join("mayfly").join(id));
    v
}

/// The cgroup directories of sandbox `id` that exist now.
pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    cgroup_candidates(id)
        .into_iter()
        .filter(|p| p.exists())
        .collect()
}

/// Reads a file of sandbox `id`'s cgroup: `v1` = (controller, file) on a v1
/// host, `v2_file` on a unified one.
pub fn cgroup_file(id: &str, v1: (&str, &str), v2_file: &str) -> Option<String> {
    let root = Path::new(CGROUP_ROOT);
    let p = if cgroup_is_v2() {
        root.join("mayfly").join(id).join(v2_file)
    } else {
        root.join(v1.0).join("mayfly").join(id).join(v1.1)
    };
    std::fs::read_to_string(p).ok()
}

/// How many processes the kernel OOM-killed in sandbox `id`'s memory cgroup
/// (`oom_kill` of `memory.oom_control` on v1, `memory.events` on v2).
pub fn oom_kills(id: &str) -> Option<u64> {
    let text = cgroup_file(id, ("memory", "memory.oom_control"), "memory.events")?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Lines of this process's mount table that mention any of `needles`.
pub fn mounts_mentioning(needles: &[&str]) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| needles.iter().any(|n| l.contains(n)))
        .map(str::to_owned)
        .collect()
}

/// Asserts that nothing of sandboxes `ids` is left on the host: no mount
/// mentioning the state directory or an id, no cgroup, no process in their
/// cgroups, no named network namespace, and no sandbox or trash directory
/// (directories are removed in the background, so they get 2 s).
pub fn assert_no_leaks<S: AsRef<str>>(state_dir: &Path, ids: &[S]) {
    let state = state_dir.to_string_lossy().into_owned();
    let mut problems = Vec::new();
    let mut needles = vec![state.as_str()];
    needles.extend(ids.iter().map(|i| i.as_ref()));
    for line in mounts_mentioning(&needles) {
        problems.push(format!("mount left: {line}"));
    }
    for id in ids {
        let id = id.as_ref();
        for dir in cgroup_dirs(id) {
            problems.push(format!("cgroup left: {}", dir.display()));
        }
        for p in procs_in_sandbox(id) {
            problems.push(format!("process left in {id}'s cgroup: {p:?}"));
        }
        if host_netns_named(id) {
            problems.push(format!("named network namespace left: /run/netns/{id}"));
        }
    }
    let dirs = |ids: &[S]| -> Vec<PathBuf> {
        ids.iter()
            .flat_map(|id| {
                ["sandboxes", "trash"].map(|d| state_dir.join(d).join(id.as_ref()))
            })
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut left = dirs(ids);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = dirs(ids);
    }
    for d in left {
        problems.push(format!("directory left 2 s after destroy: {}", d.display()));
    }
    assert!(
        problems.is_empty(),
        "{} leak(s) of {} sandbox(es):\n  {}",
        problems.len(),
        ids.len(),
        problems.join("\n  ")
    );
}

fn host_netns_named(id: &str) -> bool {
    std::fs::read_dir("/run/netns").is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().contains(id))
    })
}
