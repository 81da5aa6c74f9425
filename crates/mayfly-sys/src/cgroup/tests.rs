//! The applier against temporary directories made to look like a cgroup2 tree.
//!
//! Real cgroupfs creates a directory's control files itself; here the tests
//! create them first, and the applier never creates a file, so a write to a
//! misspelt file fails the test instead of passing silently.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;

const ID: &str = "mf-test0000abcd";

/// A v2 plan as the engine writes it, for a tree rooted at `root`.
fn v2_plan(root: &Path) -> CgroupPlan {
    let parent = root.join(PARENT_DIR);
    let sb = parent.join(ID);
    CgroupPlan {
        version: CgroupVersion::V2,
        shared_dirs: vec![parent.clone()],
        sandbox_dirs: vec![sb.clone()],
        writes: vec![
            CgroupWrite::new(root.join("cgroup.subtree_control"), "+memory +cpu +pids"),
            CgroupWrite::new(parent.join("cgroup.subtree_control"), "+memory +cpu +pids"),
            CgroupWrite::new(sb.join("memory.max"), "536870912"),
            CgroupWrite::new(sb.join("memory.swap.max"), "0"),
            CgroupWrite::new(sb.join("memory.oom.group"), "1"),
            CgroupWrite::new(sb.join("cpu.max"), "100000 100000"),
            CgroupWrite::new(sb.join("pids.max"), "512"),
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

/// Creates `root/rel` with `content`, making parents as needed.
fn put(root: &Path, rel: &str, content: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

/// A fake cgroup2 tree holding every file the v2 plan touches.
fn fake_v2_tree() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    put(root, "cgroup.subtree_control", "");
    put(root, "mayfly/cgroup.subtree_control", "");
    for file in [
        "memory.max",
        "memory.swap.max",
        "memory.oom.group",
        "cpu.max",
        "pids.max",
        "cgroup.procs",
    ] {
        put(root, &format!("mayfly/{ID}/{file}"), "");
    }
    put(root, &format!("mayfly/{ID}/memory.current"), "4096\n");
    put(root, &format!("mayfly/{ID}/memory.peak"), "8192\n");
    put(
        root,
        &format!("mayfly/{ID}/cpu.stat"),
        "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
    );
    put(root, &format!("mayfly/{ID}/pids.current"), "3\n");
    put(
        root,
        &format!("mayfly/{ID}/memory.events"),
        "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n",
    );
    tmp
}

fn read(path: PathBuf) -> String {
    fs::read_to_string(path).unwrap()
}

#[test]
fn v2_apply_writes_every_planned_value_to_its_file() {
    let tmp = fake_v2_tree();
    let plan = v2_plan(tmp.path());
    apply(&plan).unwrap();
    for w in &plan.writes {
        assert_eq!(read(w.file.clone()), w.value, "{}", w.file.display());
    }
}

#[test]
fn v2_add_process_writes_the_pid_into_cgroup_procs() {
    let tmp = fake_v2_tree();
    let plan = v2_plan(tmp.path());
    apply(&plan).unwrap();
    add_process(&plan, 4242).unwrap();
    assert_eq!(read(plan.sandbox_dirs[0].join("cgroup.procs")), "4242");
}

#[test]
fn v2_usage_is_read_from_current_peak_stat_and_pids() {
    let tmp = fake_v2_tree();
    let plan = v2_plan(tmp.path());
    let usage = read_usage(&plan).unwrap();
    assert_eq!(
        usage,
        CgroupUsage {
            memory_bytes: 4096,
            memory_peak_bytes: Some(8192),
            cpu_usec: Some(1500),
            pids: 3,
            oom_kills: Some(2),
        }
    );
}

#[test]
fn oom_kills_are_read_from_the_oom_kill_line_and_absent_without_one() {
    let tmp = fake_v2_tree();
    let plan = v2_plan(tmp.path());
    assert_eq!(read_oom_kills(&plan).unwrap(), Some(2));
    // v1's memory.oom_control has the same shape.
    fs::write(
        &plan.usage.memory_events,
        "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n",
    )
    .unwrap();
    assert_eq!(read_oom_kills(&plan).unwrap(), Some(7));
    // Kernels before 4.13 have no `oom_kill` line.
    fs::write(
        &plan.usage.memory_events,
        "oom_kill_disable 0\nunder_oom 0\n",
    )
    .unwrap();
    assert_eq!(read_oom_kills(&plan).unwrap(), None);
    fs::remove_file(&plan.usage.memory_events).unwrap();
    assert_eq!(read_oom_kills(&plan).unwrap(), None);
}

#[test]
fn v2_usage_without_memory_peak_reports_no_peak() {
    let tmp = fake_v2_tree();
    let plan = v2_plan(tmp.path());
    fs::remove_file(&plan.usage.memory_peak).unwrap();
    assert_eq!(read_usage(&plan).unwrap().memory_peak_bytes, None);
}

#[test]
fn garbage_in_a_usage_file_is_a_parse_error_naming_the_file() {
    let tmp = fake_v2_tree();
    let plan = v2_plan(tmp.path());
    fs::write(&plan.usage.pids_current, "lots\n").unwrap();
    let err = read_usage(&plan).unwrap_err();
    assert!(
        matches!(&err, CgroupError::Parse { path, content } if path == &plan.usage.pids_current && content == "lots"),
        "{err:?}"
    );
}

#[test]
fn failed_apply_names_file_and_value_and_leaves_no_sandbox_dir() {
    // Only the parent's files exist: the sandbox directory is created by
    // apply, empty, so the first write into it fails.
    let tmp = tempfile::tempdir().unwrap();
    put(tmp.path(), "cgroup.subtree_control", "");
    put(tmp.path(), "mayfly/cgroup.subtree_control", "");
    let plan = v2_plan(tmp.path());
    let err = apply(&plan).unwrap_err();
    let expected = plan.sandbox_dirs[0].join("memory.max");
    assert!(
        matches!(&err, CgroupError::Write { path, value, .. } if path == &expected && value == "536870912"),
        "{err:?}"
    );
    assert!(err.to_string().contains("536870912"), "{err}");
    assert!(!plan.sandbox_dirs[0].exists());
    assert!(plan.shared_dirs[0].exists(), "the shared parent is kept");
}

#[test]
fn leftovers_are_the_mf_dirs_under_mayfly_and_each_can_be_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("mayfly");
    for d in ["mf-aaaaaaaaaaaa", "mf-bbbbbbbbbbbb/nested", "not-ours"] {
        fs::create_dir_all(parent.join(d)).unwrap();
    }
    let layout = CgroupLayout::V2 {
        root: tmp.path().to_owned(),
    };
    let found = list_leftovers(&layout).unwrap();
    assert_eq!(
        found,
        vec![
            parent.join("mf-aaaaaaaaaaaa"),
            parent.join("mf-bbbbbbbbbbbb")
        ]
    );
    for dir in &found {
        remove_dir(dir).unwrap();
        remove_dir(dir).unwrap(); // removing twice is fine
    }
    assert!(list_leftovers(&layout).unwrap().is_empty());
    assert!(parent.join("not-ours").exists());
}

#[test]
fn leftovers_of_v1_are_gathered_from_each_hierarchy_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mount = |name: &str| tmp.path().join(name);
    fs::create_dir_all(mount("memory/mayfly/mf-aaaaaaaaaaaa")).unwrap();
    fs::create_dir_all(mount("cpu,cpuacct/mayfly/mf-aaaaaaaaaaaa")).unwrap();
    fs::create_dir_all(mount("pids")).unwrap(); // no mayfly dir yet
    let layout = CgroupLayout::V1 {
        controllers: [
            ("memory", "memory"),
            ("cpu", "cpu,cpuacct"),
            ("cpuacct", "cpu,cpuacct"),
            ("pids", "pids"),
        ]
        .into_iter()
        .map(|(c, m)| (c.to_owned(), mount(m)))
        .collect(),
        swap_accounting: false,
    };
    assert_eq!(
        list_leftovers(&layout).unwrap(),
        vec![
            mount("cpu,cpuacct/mayfly/mf-aaaaaaaaaaaa"),
            mount("memory/mayfly/mf-aaaaaaaaaaaa"),
        ]
    );
}

#[test]
fn remove_dir_refuses_paths_that_are_not_mayfly_sandbox_cgroups() {
    for path in [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/mayfly/system.slice",
        "/tmp/mf-aaaaaaaaaaaa",
    ] {
        let err = remove_dir(Path::new(path)).unwrap_err();
        assert!(
            matches!(err, CgroupError::NotMayflyCgroup { .. }),
            "{path}: {err:?}"
        );
    }
}

#[test]
fn removing_a_plan_whose_dirs_are_gone_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    remove(&v2_plan(tmp.path())).unwrap();
}

#[test]
fn total_cache_is_read_from_a_v1_memory_stat() {
    use super::remove::parse_total_cache;
    let stat = "cache 4096\nrss 0\ntotal_cache 8192\ntotal_rss 0\n";
    assert_eq!(parse_total_cache(stat), Some(8192));
    assert_eq!(parse_total_cache("cache 0\ntotal_cache 0\n"), Some(0));
    // `cache` alone is not the hierarchical total.
    assert_eq!(parse_total_cache("cache 4096\n"), None);
    assert_eq!(parse_total_cache("total_cache lots\n"), None);
}
