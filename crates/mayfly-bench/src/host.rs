//! What the benchmark reads from the host: memory counters, process sizes,
//! the paths a destroyed sandbox must no longer have, and the machine itself.
//!
//! `/proc` and `/sys/fs/cgroup` are fields, so the parsers can be tested on
//! fixtures; the bench itself always uses the real ones.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Where the host's kernel interfaces are mounted.
#[derive(Debug, Clone)]
pub struct Host {
    pub proc: PathBuf,
    pub cgroup: PathBuf,
}

impl Default for Host {
    fn default() -> Host {
        Host {
            proc: "/proc".into(),
            cgroup: "/sys/fs/cgroup".into(),
        }
    }
}

/// The v1 controllers Mayfly makes a per-sandbox directory in.
const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "cpuacct"];

impl Host {
    /// `/proc/meminfo` in KiB per field.
    pub fn meminfo(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let p = self.proc.join("meminfo");
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(parse_kib_fields(&text))
    }

    /// A process's resident set (`VmRSS` of `/proc/PID/status`), in KiB.
    pub fn rss_kib(&self, pid: u32) -> Option<u64> {
        let text = std::fs::read_to_string(self.proc.join(format!("{pid}/status"))).ok()?;
        parse_kib_fields(&text).get("VmRSS").copied()
    }

    /// A process's proportional set (`Pss` of `/proc/PID/smaps_rollup`), in
    /// KiB: shared pages are split between the processes that map them.
    pub fn pss_kib(&self, pid: u32) -> Option<u64> {
        let text = std::fs::read_to_string(self.proc.join(format!("{pid}/smaps_rollup"))).ok()?;
        parse_kib_fields(&text).get("Pss").copied()
    }

    /// The pids whose parent is `ppid`, from every task's `children` file.
    pub fn children(&self, ppid: u32) -> Vec<u32> {
        let tasks = self.proc.join(format!("{ppid}/task"));
        let Ok(dir) = std::fs::read_dir(tasks) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for t in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Every cgroup directory a sandbox may have, on v1 and on v2.
    pub fn cgroup_dirs(&self, id: &str) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = V1_CONTROLLERS
            .iter()
            .map(|c| self.cgroup.join(c).join("mayfly").join(id))
            .collect();
        v.push(self.cgroup.join("mayfly").join(id));
        v
    }

    /// Lines of our own mount table that mention `needle`.
    pub fn mounts_mentioning(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(self.proc.join("self/mountinfo"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Whether a process with this pid exists and has not exited. A zombie
    /// has: it holds no memory, files, mounts or namespaces any more, only
    /// its pid until its parent (or whoever inherited it) reaps it.
    pub fn running(&self, pid: u32) -> bool {
        std::fs::read_to_string(self.proc.join(format!("{pid}/stat")))
            .ok()
            .is_some_and(|s| !matches!(stat_state(&s), Some('Z' | 'X')))
    }

    /// The start time (clock ticks since boot) of process `pid`, which
    /// tells a process from a later one that got the same pid.
    pub fn start_time(&self, pid: u32) -> Option<u64> {
        let stat = std::fs::read_to_string(self.proc.join(format!("{pid}/stat"))).ok()?;
        stat_start_time(&stat)
    }

    /// Whether the process that had `pid` at `start` still runs.
    pub fn still_running(&self, pid: u32, start: Option<u64>) -> bool {
        self.running(pid) && (start.is_none() || self.start_time(pid) == start)
    }
}

/// Field 22 (`starttime`) of a `/proc/PID/stat` line.
pub fn stat_start_time(stat: &str) -> Option<u64> {
    // Fields after the command name: state is field 3, so starttime is
    // the 20th of them.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The paths whose disappearance means a sandbox is fully cleaned up.
pub fn sandbox_traces(host: &Host, state_dir: &Path, id: &str) -> Vec<PathBuf> {
    let mut v = vec![
        state_dir.join("sandboxes").join(id),
        state_dir.join("trash").join(id),
    ];
    v.extend(host.cgroup_dirs(id));
    v
}

/// The state letter of a `/proc/PID/stat` line (the field after the
/// parenthesised command name, which may itself contain spaces or `)`).
pub fn stat_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// `Key:   123 kB` lines; values without a unit are kept as they are.
pub fn parse_kib_fields(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n = v.split_whitespace().next()?.parse().ok()?;
            Some((k.trim().to_owned(), n))
        })
        .collect()
}

/// The machine a run was measured on, for the report.
pub fn machine() -> BTreeMap<&'static str, String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let mem = parse_kib_fields(&read("/proc/meminfo"))
        .get("MemTotal")
        .copied()
        .unwrap_or(0);
    let cgroups = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else {
        "v1 (hybrid)"
    };
    let mut m = BTreeMap::new();
    m.insert(
        "kernel",
        read("/proc/sys/kernel/osrelease").trim().to_owned(),
    );
    m.insert(
        "nproc",
        std::thread::available_parallelism()
            .map_or(0, |n| n.get())
            .to_string(),
    );
    m.insert("cpu", cpu);
    m.insert("memory", format!("{:.1} GiB", mem as f64 / 1048576.0));
    m.insert("cgroups", cgroups.to_owned());
    // Other work on a shared host is the largest source of noise: say how
    // busy it was when the run started.
    let load: Vec<String> = read("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .map(str::to_owned)
        .collect();
    m.insert("load", load.join(" "));
    m.insert("date", command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]));
    m
}

/// The machine as one markdown list item: kernel, CPUs, memory, and how
/// busy the host was when the run started.
pub fn machine_line(m: &BTreeMap<&str, String>) -> String {
    let g = |k: &str| m.get(k).map_or("?", String::as_str);
    format!(
        "- **Machine:** Linux {}, {} vCPUs ({}), {} memory; load average {} at the start.",
        g("kernel"),
        g("nproc"),
        g("cpu"),
        g("memory"),
        g("load")
    )
}

/// The first line a command prints, or an empty string if it cannot run.
pub fn command_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_status_fields_parse_in_kib() {
        let f = parse_kib_fields("MemTotal:       24571000 kB\nMemAvailable:   2000 kB\nHugePages_Total:       0\nName:\tmayfly\n");
        assert_eq!(f["MemTotal"], 24571000);
        assert_eq!(f["MemAvailable"], 2000);
        assert_eq!(f["HugePages_Total"], 0);
        assert!(!f.contains_key("Name"));
    }

    #[test]
    fn stat_state_survives_odd_command_names() {
        assert_eq!(stat_state("42 (mayfly) S 1 42 42 0"), Some('S'));
        assert_eq!(stat_state("42 (a) b) Z 1 42"), Some('Z'));
        assert_eq!(stat_state("garbage"), None);
        let line = "7 (a b) S 1 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 1000 1";
        assert_eq!(stat_start_time(line), Some(4242));
        assert_eq!(stat_start_time("7 (x) S 1"), None);
    }

    #[test]
    fn traces_cover_dirs_and_every_cgroup_layout() {
        let host = Host {
            proc: "/p".into(),
            cgroup: "/cg".into(),
        };
        let t = sandbox_traces(&host, Path::new("/s"), "mf-abcdefghjkmn");
        let t: Vec<String> = t.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            t,
            [
                "/s/sandboxes/mf-abcdefghjkmn",
                "/s/trash/mf-abcdefghjkmn",
                "/cg/memory/mayfly/mf-abcdefghjkmn",
                "/cg/pids/mayfly/mf-abcdefghjkmn",
                "/cg/cpu/mayfly/mf-abcdefghjkmn",
                "/cg/cpuacct/mayfly/mf-abcdefghjkmn",
                "/cg/mayfly/mf-abcdefghjkmn",
            ]
        );
    }
}
