//! Tests of the cgroup plan: whole plans for v1 and v2 layouts, and one applied on this host.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mayfly_types::Limits;

use super::*;

fn id() -> SandboxId {
    "mf-abcdefgh2345".parse().unwrap()
}

fn v1_layout(pairs: &[(&str, &str)], swap_accounting: bool) -> CgroupLayout {
    CgroupLayout::V1 {
        controllers: pairs
            .iter()
            .map(|(c, m)| (c.to_string(), PathBuf::from(m)))
            .collect::<BTreeMap<_, _>>(),
        swap_accounting,
    }
}

/// The development hosts: every controller on its own v1 hierarchy.
fn hybrid(swap_accounting: bool) -> CgroupLayout {
    v1_layout(
        &[
            ("memory", "/sys/fs/cgroup/memory"),
            ("cpu", "/sys/fs/cgroup/cpu"),
            ("cpuacct", "/sys/fs/cgroup/cpuacct"),
            ("pids", "/sys/fs/cgroup/pids"),
        ],
        swap_accounting,
    )
}

fn w(file: &str, value: &str) -> CgroupWrite {
    CgroupWrite::new(file, value)
}

fn paths(p: &[&str]) -> Vec<PathBuf> {
    p.iter().map(PathBuf::from).collect()
}

#[test]
fn v2_plan_enables_controllers_then_limits_one_directory() {
    let layout = CgroupLayout::V2 {
        root: "/sys/fs/cgroup".into(),
    };
    let got = plan(&layout, &id(), &ResolvedLimits::DEFAULT).unwrap();
    let sb = "/sys/fs/cgroup/mayfly/mf-abcdefgh2345";
    let expected = CgroupPlan {
        version: CgroupVersion::V2,
        shared_dirs: paths(&["/sys/fs/cgroup/mayfly"]),
        sandbox_dirs: paths(&[sb]),
        writes: vec![
            w(
                "/sys/fs/cgroup/cgroup.subtree_control",
                "+memory +cpu +pids",
            ),
            w(
                "/sys/fs/cgroup/mayfly/cgroup.subtree_control",
                "+memory +cpu +pids",
            ),
            w(&format!("{sb}/memory.max"), "536870912"),
            w(&format!("{sb}/memory.swap.max"), "0"),
            w(&format!("{sb}/cpu.max"), "100000 100000"),
            w(&format!("{sb}/pids.max"), "512"),
        ],
        cpu_weight: format!("{sb}/cpu.weight").into(),
        usage: UsageFiles {
            memory_current: format!("{sb}/memory.current").into(),
            memory_peak: format!("{sb}/memory.peak").into(),
            cpu: Some(CpuUsageFile::StatUsec(format!("{sb}/cpu.stat").into())),
            pids_current: format!("{sb}/pids.current").into(),
            memory_events: format!("{sb}/memory.events").into(),
        },
    };
    assert_eq!(got, expected);
}

#[test]
fn v1_plan_with_swap_accounting_limits_memory_and_swap_per_hierarchy() {
    let got = plan(&hybrid(true), &id(), &ResolvedLimits::DEFAULT).unwrap();
    let d = |c: &str| format!("/sys/fs/cgroup/{c}/mayfly/mf-abcdefgh2345");
    let expected = CgroupPlan {
        version: CgroupVersion::V1,
        shared_dirs: paths(&[
            "/sys/fs/cgroup/memory/mayfly",
            "/sys/fs/cgroup/cpu/mayfly",
            "/sys/fs/cgroup/cpuacct/mayfly",
            "/sys/fs/cgroup/pids/mayfly",
        ]),
        sandbox_dirs: vec![
            d("memory").into(),
            d("cpu").into(),
            d("cpuacct").into(),
            d("pids").into(),
        ],
        writes: vec![
            CgroupWrite::first_try(
                format!("{}/memory.memsw.limit_in_bytes", d("memory")),
                "536870912",
            ),
            w(
                &format!("{}/memory.limit_in_bytes", d("memory")),
                "536870912",
            ),
            w(
                &format!("{}/memory.memsw.limit_in_bytes", d("memory")),
                "536870912",
            ),
            w(&format!("{}/cpu.cfs_period_us", d("cpu")), "100000"),
            w(&format!("{}/cpu.cfs_quota_us", d("cpu")), "100000"),
            w(&format!("{}/pids.max", d("pids")), "512"),
        ],
        cpu_weight: format!("{}/cpu.shares", d("cpu")).into(),
        usage: UsageFiles {
            memory_current: format!("{}/memory.usage_in_bytes", d("memory")).into(),
            memory_peak: format!("{}/memory.max_usage_in_bytes", d("memory")).into(),
            cpu: Some(CpuUsageFile::AcctNanos(
                format!("{}/cpuacct.usage", d("cpuacct")).into(),
            )),
            pids_current: format!("{}/pids.current", d("pids")).into(),
            memory_events: format!("{}/memory.oom_control", d("memory")).into(),
        },
    };
    assert_eq!(got, expected);
}

#[test]
fn v1_plan_without_swap_accounting_sets_swappiness_zero_instead() {
    let with = plan(&hybrid(true), &id(), &ResolvedLimits::DEFAULT).unwrap();
    let without = plan(&hybrid(false), &id(), &ResolvedLimits::DEFAULT).unwrap();
    let mem = "/sys/fs/cgroup/memory/mayfly/mf-abcdefgh2345";
    let mut expected = with.clone();
    // No memory+swap limit to raise first, nor to set after.
    expected.writes.remove(0);
    expected.writes[1] = w(&format!("{mem}/memory.swappiness"), "0");
    assert_eq!(without, expected);
}

#[test]
fn v1_comounted_cpu_and_cpuacct_get_one_directory() {
    let layout = v1_layout(
        &[
            ("memory", "/cg/memory"),
            ("cpu", "/cg/cpu,cpuacct"),
            ("cpuacct", "/cg/cpu,cpuacct"),
            ("pids", "/cg/pids"),
        ],
        false,
    );
    let got = plan(&layout, &id(), &ResolvedLimits::DEFAULT).unwrap();
    assert_eq!(
        got.shared_dirs,
        paths(&[
            "/cg/memory/mayfly",
            "/cg/cpu,cpuacct/mayfly",
            "/cg/pids/mayfly"
        ])
    );
    assert_eq!(
        got.sandbox_dirs,
        paths(&[
            "/cg/memory/mayfly/mf-abcdefgh2345",
            "/cg/cpu,cpuacct/mayfly/mf-abcdefgh2345",
            "/cg/pids/mayfly/mf-abcdefgh2345",
        ])
    );
    assert_eq!(
        got.usage.cpu,
        Some(CpuUsageFile::AcctNanos(
            "/cg/cpu,cpuacct/mayfly/mf-abcdefgh2345/cpuacct.usage".into()
        ))
    );
}

#[test]
fn v1_without_cpuacct_plans_no_cpu_usage() {
    let layout = v1_layout(&[("memory", "/m"), ("cpu", "/c"), ("pids", "/p")], false);
    let got = plan(&layout, &id(), &ResolvedLimits::DEFAULT).unwrap();
    assert_eq!(got.sandbox_dirs.len(), 3);
    assert_eq!(got.usage.cpu, None);
}

#[test]
fn per_create_overrides_reach_the_written_values() {
    let limits = ResolvedLimits::DEFAULT
        .with(&Limits {
            memory_bytes: Some(64 << 20),
            cpu_millis: Some(250),
            pids: Some(32),
            ..Limits::default()
        })
        .unwrap();
    let layout = CgroupLayout::V2 { root: "/cg".into() };
    let got = plan(&layout, &id(), &limits).unwrap();
    let values: Vec<&str> = got.writes[2..].iter().map(|w| w.value.as_str()).collect();
    assert_eq!(values, ["67108864", "0", "25000 100000", "32"]);
    let v1 = plan(&hybrid(true), &id(), &limits).unwrap();
    let values: Vec<&str> = v1.writes.iter().map(|w| w.value.as_str()).collect();
    assert_eq!(
        values,
        ["67108864", "67108864", "67108864", "100000", "25000", "32"]
    );
}

/// The v1 writes that set the memory limits, applied to a cgroup whose
/// limits are `old`, as the kernel would (memory never above memory+swap).
fn apply_v1_memory(plan: &CgroupPlan, old: u64) -> Result<(u64, u64), String> {
    let (mut mem, mut memsw) = (old, old);
    for w in &plan.writes {
        let v: u64 = w.value.parse().unwrap_or(0);
        let file = w.file.to_string_lossy();
        let ok = if file.ends_with("/memory.memsw.limit_in_bytes") {
            (v >= mem).then(|| memsw = v)
        } else if file.ends_with("/memory.limit_in_bytes") {
            (v <= memsw).then(|| mem = v)
        } else {
            Some(())
        };
        if ok.is_none() && !w.may_fail {
            return Err(format!(
                "{file} = {v} refused at memory {mem}, memsw {memsw}"
            ));
        }
    }
    Ok((mem, memsw))
}

#[test]
fn v1_memory_limits_can_be_raised_and_lowered_on_a_prepared_cgroup() {
    let with = |bytes: u64| {
        let limits = ResolvedLimits::DEFAULT
            .with(&Limits {
                memory_bytes: Some(bytes),
                ..Limits::default()
            })
            .unwrap();
        plan(&hybrid(true), &id(), &limits).unwrap()
    };
    let default = ResolvedLimits::DEFAULT.memory_bytes;
    for new in [1 << 30, 64 << 20, default] {
        assert_eq!(apply_v1_memory(&with(new), default), Ok((new, new)));
        // And on a fresh cgroup, whose limits are unlimited.
        assert_eq!(apply_v1_memory(&with(new), u64::MAX), Ok((new, new)));
    }
}

#[test]
fn v1_layout_missing_a_limiting_controller_is_refused() {
    let layout = v1_layout(&[("memory", "/m"), ("cpu", "/c")], true);
    let err = plan(&layout, &id(), &ResolvedLimits::DEFAULT).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupPlanError::MissingController {
                controller: "pids",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("mf-abcdefgh2345"), "{err}");
}

/// On the real host (root; CI runs as root): the planned cgroup applies,
/// its limits read back, a child is counted, and remove leaves nothing.
/// Also prints how long apply and remove take (no timing assertion).
#[test]
fn host_planned_cgroup_applies_limits_and_is_removed_without_leftovers() {
    use mayfly_sys::cgroup as sys;
    assert!(
        is_root(),
        "this test creates real cgroups and needs root; run the tests as root (CI does)"
    );
    let layout = CgroupLayout::discover().unwrap();
    let limits = ResolvedLimits {
        memory_bytes: 64 << 20,
        cpu_millis: 500,
        pids: 16,
        ..ResolvedLimits::DEFAULT
    };
    let sandbox = test_id();
    let p = plan(&layout, &sandbox, &limits).unwrap();
    sys::apply(&p).unwrap();
    for write in &p.writes {
        if write.file.ends_with("cgroup.subtree_control") {
            continue;
        }
        let back = std::fs::read_to_string(&write.file).unwrap();
        assert_eq!(back.trim(), write.value, "{}", write.file.display());
    }
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    sys::add_process(&p, child.id() as i32).unwrap();
    assert_eq!(sys::read_usage(&p).unwrap().pids, 1);
    sys::remove(&p).unwrap();
    child.wait().unwrap();
    for dir in &p.sandbox_dirs {
        assert!(!dir.exists(), "{} was left behind", dir.display());
    }

    let (mut apply_t, mut remove_t) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        let p = plan(&layout, &test_id(), &limits).unwrap();
        let t = Instant::now();
        sys::apply(&p).unwrap();
        apply_t.push(t.elapsed());
        let t = Instant::now();
        sys::remove(&p).unwrap();
        remove_t.push(t.elapsed());
    }
    sys::remove_empty_parents(&layout);
    println!(
        "cgroup {:?} apply p50 {:?} p95 {:?}; remove p50 {:?} p95 {:?}",
        p.version,
        pct(&mut apply_t, 50),
        pct(&mut apply_t, 95),
        pct(&mut remove_t, 50),
        pct(&mut remove_t, 95)
    );
    assert!(!sys::list_leftovers(&layout)
        .unwrap()
        .iter()
        .any(|d| d.to_string_lossy().contains("mf-test")));
}

fn pct(samples: &mut [Duration], p: usize) -> Duration {
    samples.sort();
    samples[(samples.len() - 1) * p / 100]
}

/// `/proc/self` is owned by the caller's effective uid.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `mf-test` and eight hex digits, unique enough for concurrent runs.
fn test_id() -> SandboxId {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).unwrap();
    format!("mf-test{:08x}", u32::from_le_bytes(bytes))
        .parse()
        .unwrap()
}

#[test]
fn a_pooled_sandbox_weighs_about_a_sixteenth_of_a_live_one() {
    for v in [CgroupVersion::V1, CgroupVersion::V2] {
        let (pooled, live) = (
            cpu_weight(v, CpuWeight::Pooled),
            cpu_weight(v, CpuWeight::Live),
        );
        assert!(
            pooled >= 1 && live / pooled == 16,
            "{v:?}: {pooled} vs {live}"
        );
    }
    assert_eq!(cpu_weight(CgroupVersion::V1, CpuWeight::Live), 1024);
    assert_eq!(cpu_weight(CgroupVersion::V2, CpuWeight::Live), 100);
}
