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

/// `pid` and every process below it.
pub fn descendants(pid: u32) -> Vec<ProcInfo> {
    let all: Vec<ProcInfo> = all_pids().into_iter().filter_map(proc_info).collect();
    let mut out: Vec<ProcInfo> = all.iter().filter(|p| p.pid == pid).cloned().collect();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].pid;
        out.extend(all.iter().filter(|p| p.ppid == parent).cloned());
        i += 1;
    }
    out
}

/// The sandbox ids (`mf-…`) of every Mayfly cgroup that `pid` or any of
/// its descendants sits in: the daemon's live sandboxes, and whatever it
/// has prepared ahead of time for future ones.
pub fn cgroup_ids_below(pid: u32) -> std::collections::BTreeSet<String> {
    descendants(pid)
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).ok())
        .flat_map(|c| {
            c.lines()
                .filter_map(|l| l.split("/mayfly/").nth(1))
                .filter_map(|rest| rest.split('/').next())
                .filter(|id| id.starts_with("mf-"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
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

/// The pid namespace of a process (`pid:[4026532181]`).
pub fn pid_ns(pid: u32) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    Some(link.to_string_lossy().into_owned())
}

/// Live (non-zombie) processes inside sandbox `id` other than its init.
pub fn commands_left(id: &str, init_pid: Option<u32>) -> Vec<ProcInfo> {
    procs_inside(id, init_pid)
        .into_iter()
        .filter(|p| !p.is_zombie() && Some(p.pid) != init_pid)
        .collect()
}

/// Processes running *inside* sandbox `id`: in its cgroups and in the pid
/// namespace of its init (host pid `init_pid`). Mayfly's host-side helpers
/// that sit in the sandbox's cgroups (its stub) are not inside.
pub fn procs_inside(id: &str, init_pid: Option<u32>) -> Vec<ProcInfo> {
    let init_pid = init_pid.expect("a live sandbox reports its init's host pid");
    let ns = pid_ns(init_pid).expect("the sandbox's init is running");
    procs_in_sandbox(id)
        .into_iter()
        .filter(|p| pid_ns(p.pid).as_deref() == Some(ns.as_str()))
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
/// cgroups, no named network namespace, and no sandbox or trash directory.
///
/// Destroy answers once the sandbox is SIGKILLed and finishes the cleanup in
/// the background, so everything gets up to 15 s to disappear (a slow or
/// busy CI host; it is usually gone within milliseconds).
pub fn assert_no_leaks<S: AsRef<str>>(state_dir: &Path, ids: &[S]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut problems = leaks(state_dir, ids);
    while !problems.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        problems = leaks(state_dir, ids);
    }
    assert!(
        problems.is_empty(),
        "{} leak(s) of {} sandbox(es), 15 s after they ended:\n  {}",
        problems.len(),
        ids.len(),
        problems.join("\n  ")
    );
}

/// What is left of sandboxes `ids` right now, one line per object.
pub fn leaks<S: AsRef<str>>(state_dir: &Path, ids: &[S]) -> Vec<String> {
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
        for d in ["sandboxes", "trash"] {
            let p = state_dir.join(d).join(id);
            if std::fs::symlink_metadata(&p).is_ok() {
                problems.push(format!("directory left: {}", p.display()));
            }
        }
        // Stub markers, whole or still under their temporary name.
        for name in [id.to_owned(), format!(".{id}")] {
            let p = state_dir.join("stubs").join(name);
            if std::fs::symlink_metadata(&p).is_ok() {
                problems.push(format!("stub marker left: {}", p.display()));
            }
        }
    }
    problems
}

fn host_netns_named(id: &str) -> bool {
    std::fs::read_dir("/run/netns").is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().contains(id))
    })
}
