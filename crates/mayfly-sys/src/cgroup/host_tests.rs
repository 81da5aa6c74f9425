//! The applier against this host's real cgroups. These need root; CI runs as
//! root, and without it they fail with a message rather than skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test creates real cgroups and needs root; run the tests as root (CI does)"
    );
}

/// `mf-test` and eight hex digits: a valid, recognisable, unique sandbox id.
fn test_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    format!("mf-test{:08x}", nanos ^ std::process::id().rotate_left(16))
}

/// A small plan for the host's layout: a sandbox cgroup in every hierarchy
/// with a pids and a memory limit. The engine's planner makes the full one.
fn host_plan(layout: &CgroupLayout, id: &str) -> CgroupPlan {
    match layout {
        CgroupLayout::V2 { root } => {
            let parent = root.join(PARENT_DIR);
            let sb = parent.join(id);
            CgroupPlan {
                version: CgroupVersion::V2,
                shared_dirs: vec![parent.clone()],
                sandbox_dirs: vec![sb.clone()],
                writes: vec![
                    CgroupWrite::new(root.join("cgroup.subtree_control"), "+memory +cpu +pids"),
                    CgroupWrite::new(parent.join("cgroup.subtree_control"), "+memory +cpu +pids"),
                    CgroupWrite::new(sb.join("memory.max"), "67108864"),
                    CgroupWrite::new(sb.join("pids.max"), "16"),
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
        CgroupLayout::V1 { controllers, .. } => {
            let dir = |c: &str| controllers[c].join(PARENT_DIR).join(id);
            let mut mounts: Vec<&PathBuf> = controllers.values().collect();
            mounts.dedup();
            CgroupPlan {
                version: CgroupVersion::V1,
                shared_dirs: mounts.iter().map(|m| m.join(PARENT_DIR)).collect(),
                sandbox_dirs: mounts.iter().map(|m| m.join(PARENT_DIR).join(id)).collect(),
                writes: vec![
                    CgroupWrite::new(dir("memory").join("memory.limit_in_bytes"), "67108864"),
                    CgroupWrite::new(dir("pids").join("pids.max"), "16"),
                ],
                cpu_weight: dir("cpu").join("cpu.shares"),
                usage: UsageFiles {
                    memory_current: dir("memory").join("memory.usage_in_bytes"),
                    memory_peak: dir("memory").join("memory.max_usage_in_bytes"),
                    cpu: controllers
                        .contains_key("cpuacct")
                        .then(|| CpuUsageFile::AcctNanos(dir("cpuacct").join("cpuacct.usage"))),
                    pids_current: dir("pids").join("pids.current"),
                    memory_events: dir("memory").join("memory.oom_control"),
                },
            }
        }
    }
}

fn spawn_sleeper() -> Child {
    Command::new("sleep").arg("60").spawn().unwrap()
}

fn cgroup_lines_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
}

fn assert_gone(plan: &CgroupPlan) {
    for dir in &plan.sandbox_dirs {
        assert!(!dir.exists(), "{} was left behind", dir.display());
    }
}

#[test]
fn host_cgroup_holds_a_child_reports_usage_and_is_removed_with_it() {
    require_root();
    let layout = CgroupLayout::discover().unwrap();
    let id = test_id();
    let plan = host_plan(&layout, &id);
    apply(&plan).unwrap();

    let mut child = spawn_sleeper();
    add_process(&plan, child.id() as i32).unwrap();
    let membership = cgroup_lines_of(child.id());
    let expected = format!("/{PARENT_DIR}/{id}");
    let hierarchies = membership
        .lines()
        .filter(|l| l.ends_with(&expected))
        .count();
    assert_eq!(hierarchies, plan.sandbox_dirs.len(), "{membership}");

    let usage = read_usage(&plan).unwrap();
    assert_eq!(usage.pids, 1);
    assert!(usage.memory_peak_bytes.is_some());
    assert_eq!(
        usage.oom_kills,
        Some(0),
        "a fresh cgroup has seen no OOM kill"
    );

    remove(&plan).unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the task left in the cgroup was killed");
    assert_gone(&plan);
    assert!(!list_leftovers(&layout)
        .unwrap()
        .iter()
        .any(|p| p.ends_with(&id)));
    // Leave no empty `mayfly` parents behind either.
    remove_empty_parents(&CgroupLayout::discover().unwrap());
}

#[test]
fn host_remove_kills_every_task_including_forked_grandchildren() {
    require_root();
    let layout = CgroupLayout::discover().unwrap();
    let plan = host_plan(&layout, &test_id());
    apply(&plan).unwrap();
    // Join the cgroup before forking, so the grandchildren are born inside.
    let mut child = Command::new("sh")
        .args(["-c", "read _ <&0; sleep 60 & sleep 60 & wait"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    add_process(&plan, child.id() as i32).unwrap();
    drop(child.stdin.take()); // EOF lets the shell go on to fork
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while read_usage(&plan).unwrap().pids < 3 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(read_usage(&plan).unwrap().pids, 3);

    remove(&plan).unwrap();
    child.wait().unwrap();
    assert_gone(&plan);
    // Leave no empty `mayfly` parents behind either.
    remove_empty_parents(&CgroupLayout::discover().unwrap());
}

#[test]
fn host_leftover_is_found_and_removed_by_path() {
    require_root();
    let layout = CgroupLayout::discover().unwrap();
    let id = test_id();
    let plan = host_plan(&layout, &id);
    apply(&plan).unwrap();
    let mut child = spawn_sleeper();
    add_process(&plan, child.id() as i32).unwrap();

    // As after a daemon crash: only the kernel knows about the cgroup.
    let mine: Vec<PathBuf> = list_leftovers(&layout)
        .unwrap()
        .into_iter()
        .filter(|p| p.file_name() == Some(Path::new(&id).as_os_str()))
        .collect();
    assert_eq!(mine.len(), plan.sandbox_dirs.len());
    for dir in &mine {
        remove_dir(dir).unwrap();
    }
    child.wait().unwrap();
    assert_gone(&plan);
    // Leave no empty `mayfly` parents behind either.
    remove_empty_parents(&CgroupLayout::discover().unwrap());
}
