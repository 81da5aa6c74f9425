//! One-shot `/bin/true`, end to end, as a user would spawn it: daemonless
//! `mayfly run` against bwrap, runc, podman and the bare namespace floor.
//! `mayfly run` is measured twice: as it runs by default, served by the
//! sandbox the previous run's reaper had parked (see `mayfly_engine::park`),
//! and cold (`--park 0`), making its sandbox on its critical path. Each in
//! its own state directory.
//!
//! The tools are interleaved round-robin, one run of each per iteration with
//! the starting tool rotated, so that a burst of noise on this shared machine
//! lands on all of them alike instead of on whichever ran during it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};

use crate::daemon::Scratch;
use crate::report::Report;
use crate::stats::Samples;

/// `podman` arguments before the image for a run comparable to the other
/// peers': runc, no network, and the ulimits these hosts need (podman's
/// default RLIMIT_NOFILE exceeds the hard limit; see MACHINE.md).
pub const PODMAN_RUN: [&str; 10] = [
    "--runtime",
    "runc",
    "run",
    "--rm",
    "--network",
    "none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// Where the peers were prepared (see bench/peers-setup.sh).
#[derive(Debug, Clone)]
pub struct PeerSetup {
    pub mayfly: PathBuf,
    pub bundle: PathBuf,
    pub image: String,
    /// podman is ~200 ms a run: it runs on this many iterations only.
    pub podman_iterations: usize,
}

/// Replaced by a unique container name in a peer's argv.
const ID: &str = "{id}";

struct Tool {
    key: &'static str,
    argv: Vec<String>,
    /// Runs on iterations where `i % every == 0`.
    every: usize,
    /// `mayfly run`'s state directory, and whether it parks.
    mayfly: Option<(PathBuf, bool)>,
    samples: Samples,
    failed: bool,
}

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| (*s).to_owned()).collect()
}

/// `mayfly run -- /bin/true` without a daemon, in `state`, parking or not.
fn mayfly_tool(setup: &PeerSetup, key: &'static str, state: &Path, park: bool) -> Tool {
    let mayfly = setup.mayfly.display().to_string();
    let s = state.display().to_string();
    // The socket path names nothing, so `run` finds no daemon and runs the
    // engine in-process: the daemonless path.
    let socket = format!("{s}/no-daemon.sock");
    Tool {
        key,
        argv: argv(&[
            &mayfly,
            "--state-dir",
            &s,
            "--socket",
            &socket,
            "--spare-ns-dir",
            &format!("{s}/spare-ns"),
            "--park",
            if park { "1" } else { "0" },
            "run",
            "--",
            "/bin/true",
        ]),
        every: 1,
        mayfly: Some((state.to_path_buf(), park)),
        samples: Samples::new(),
        failed: false,
    }
}

/// The tools to compare, leaving out (with a note) the peers not set up.
fn tools(setup: &PeerSetup, scratch: &Path, iterations: usize, report: &mut Report) -> Vec<Tool> {
    let tool = |key, argv, every| Tool {
        key,
        argv,
        every,
        mayfly: None,
        samples: Samples::new(),
        failed: false,
    };
    let mut v = vec![
        mayfly_tool(setup, "run_mayfly", &scratch.join("state"), true),
        mayfly_tool(setup, "run_mayfly_cold", &scratch.join("state-cold"), false),
    ];
    if on_path("bwrap") {
        let a = "--ro-bind / / --unshare-all --die-with-parent --dev /dev --proc /proc /bin/true";
        let mut a: Vec<String> = a.split(' ').map(str::to_owned).collect();
        a.insert(0, "bwrap".into());
        v.push(tool("run_bwrap", a, 1));
    } else {
        report.note("bwrap is not installed: run bench/peers-setup.sh.");
    }
    if on_path("runc") && setup.bundle.join("config.json").is_file() {
        let b = setup.bundle.display().to_string();
        v.push(tool("run_runc", argv(&["runc", "run", "-b", &b, ID]), 1));
    } else {
        report.note(format!(
            "runc or its bundle ({}) is missing: run bench/peers-setup.sh.",
            setup.bundle.display()
        ));
    }
    let have_image = on_path("podman")
        && Command::new("podman")
            .args(["image", "exists", &setup.image])
            .status()
            .is_ok_and(|s| s.success());
    if have_image && setup.podman_iterations > 0 {
        let every = (iterations / setup.podman_iterations).max(1);
        let a: Vec<&str> = ["podman"]
            .into_iter()
            .chain(PODMAN_RUN)
            .chain([setup.image.as_str(), "/bin/true"])
            .collect();
        v.push(tool("run_podman", argv(&a), every));
    } else if setup.podman_iterations > 0 {
        report.note(format!(
            "podman or its image {} is missing: run bench/peers-setup.sh.",
            setup.image
        ));
    }
    v.push(tool(
        "run_unshare",
        argv(&[
            "unshare",
            "-U",
            "-m",
            "-p",
            "-n",
            "-i",
            "-u",
            "--fork",
            "/bin/true",
        ]),
        1,
    ));
    v
}

/// Runs the comparison and adds one series per tool to the report.
pub fn measure(
    setup: &PeerSetup,
    iterations: usize,
    warmup: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    ensure!(
        setup.mayfly.is_file(),
        "no mayfly binary at {}",
        setup.mayfly.display()
    );
    let scratch = Scratch::new("run")?;
    let mut tools = tools(setup, &scratch.path, iterations, report);
    let mut cleaned = Samples::new();
    let mut parked_again = Samples::new();
    // Sandboxes parked host-wide (each has cgroups) once the parking tool
    // has run.
    let mut parked = 0;
    let n = tools.len();
    for i in 0..warmup + iterations {
        for k in 0..n {
            let t = &mut tools[(i + k) % n];
            let due = i < warmup || (i - warmup) % t.every == 0;
            if t.failed || !due {
                continue;
            }
            let id = format!("mayfly-bench-{}-{i}", std::process::id());
            let args: Vec<&str> = t.argv[1..]
                .iter()
                .map(|a| if a == ID { id.as_str() } else { a })
                .collect();
            // A parked sandbox's reaper waits, forked ahead, until that
            // sandbox has served; a cold run's cleanup is its own reaper's,
            // a process that did not exist before the run (a reaper just
            // forked may not show its name yet).
            let earlier = processes();
            let start = Instant::now();
            let out = Command::new(&t.argv[0])
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .with_context(|| format!("spawning {}", t.argv[0]))?;
            let took = start.elapsed();
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let err: String = err.trim().chars().take(400).collect();
                report.note(format!(
                    "`{}` failed on iteration {i} ({}), so it was dropped from the comparison: {err}",
                    t.argv.join(" "),
                    out.status
                ));
                t.failed = true;
                continue;
            }
            if i >= warmup {
                t.samples.push_at(i - warmup, took.as_secs_f64() * 1e3);
            }
            let Some((state, parks)) = &t.mayfly else {
                continue;
            };
            // `mayfly run` exits once its sandbox is killed; a reaper
            // finishes the destroy (and, parking, a keeper then parks the
            // next sandbox). The next tool starts only after that, so no
            // peer is timed while Mayfly's cleanup or parking runs.
            if *parks {
                parked = 1;
            }
            let live = if *parks { 1 } else { 0 };
            let ignore = if *parks { Vec::new() } else { earlier };
            match wait_settled(state, live, parked, &ignore, start, Duration::from_secs(10)) {
                Ok(all) if i >= warmup => {
                    let series = if *parks {
                        &mut parked_again
                    } else {
                        &mut cleaned
                    };
                    series.push_at(i - warmup, all.as_secs_f64() * 1e3)
                }
                Ok(_) => {}
                Err(why) => report.note(format!(
                    "`{}`: its cleanup{} did not finish within 10 s (iteration {i}): {why}.",
                    t.key,
                    if *parks { " and parking" } else { "" }
                )),
            }
        }
    }
    let mut states = Vec::new();
    for t in tools {
        if let Some((state, _)) = &t.mayfly {
            states.push(state.clone());
        }
        if !t.failed {
            report.add(t.key, t.samples);
        }
    }
    report.add("run_mayfly_cold_cleanup", cleaned);
    report.add("run_mayfly_parked_again", parked_again);
    for state in states {
        // The parked sandbox goes (`mayfly prune`), as do the spare
        // namespaces the reapers left in the bench's own directories.
        let pruned = Command::new(&setup.mayfly)
            .arg("--state-dir")
            .arg(&state)
            .arg("--spare-ns-dir")
            .arg(state.join("spare-ns"))
            .arg("prune")
            .stdout(Stdio::null())
            .status();
        if !pruned.is_ok_and(|s| s.success()) {
            report.note(format!("`mayfly prune` failed for {}.", state.display()));
        }
        leftovers(&state, report);
    }
    Ok(())
}

/// Whether the process at `/proc/<pid>` still runs: a zombie does not (it
/// holds only its pid, until the host's init reaps it, which here takes up
/// to 2 s).
fn running(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The `/proc` directories of every process alive now.
fn processes() -> Vec<PathBuf> {
    std::fs::read_dir("/proc").map_or(Vec::new(), |d| {
        d.flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect()
    })
}

/// The pids of the reapers alive now (their command line is
/// `mayfly-reaper`).
fn reapers() -> Vec<PathBuf> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::read(p.join("cmdline")).is_ok_and(|c| c.starts_with(b"mayfly-reaper")))
        .collect()
}

/// Mayfly's cgroups on the host (v1 hierarchies, and the v2 root); nothing
/// else makes any while the bench runs.
fn sandbox_cgroups() -> usize {
    ["memory/mayfly", "pids/mayfly", "cpu/mayfly", "mayfly"]
        .iter()
        .map(|p| {
            std::fs::read_dir(Path::new("/sys/fs/cgroup").join(p)).map_or(0, |d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("mf-"))
                    .count()
            })
        })
        .max()
        .unwrap_or(0)
}

/// Polls until a daemonless run has settled: its sandbox is fully gone (no
/// directory in `trash/`, `live` under `sandboxes/`, no more than
/// `parked` sandbox cgroups in any hierarchy), its reaper (any alive now
/// but those in `ignore`) has exited (a
/// zombie counts as exited; after its record, a reaper makes the next
/// run's spare namespaces and may start a keeper), and, with `live` 1, a
/// keeper has parked the next sandbox. The time since `since`, or what
/// was still unmet after `limit`.
fn wait_settled(
    state: &Path,
    live: usize,
    parked: usize,
    ignore: &[PathBuf],
    since: Instant,
    limit: Duration,
) -> Result<Duration, String> {
    let mut reapers = reapers();
    reapers.retain(|r| !ignore.contains(r));
    let count = |d: PathBuf| std::fs::read_dir(d).map_or(0, |e| e.count());
    let socket = state.join("parked/keeper-0.sock");
    loop {
        let unmet = [
            (
                count(state.join("sandboxes")) != live,
                "sandbox directories",
            ),
            (count(state.join("trash")) != 0, "trash"),
            (sandbox_cgroups() != parked, "sandbox cgroups"),
            (reapers.iter().any(|p| running(p)), "a reaper running"),
            (live == 1 && !socket.exists(), "no parked sandbox"),
        ];
        if unmet.iter().all(|(u, _)| !u) {
            return Ok(since.elapsed());
        }
        if since.elapsed() > limit {
            let what: Vec<&str> = unmet.iter().filter(|(u, _)| *u).map(|(_, w)| *w).collect();
            return Err(format!(
                "{} ({} sandbox directories, {} cgroups)",
                what.join(", "),
                count(state.join("sandboxes")),
                sandbox_cgroups()
            ));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// A daemonless run (and `mayfly prune`) must leave its state directory
/// without sandboxes.
fn leftovers(state: &Path, report: &mut Report) {
    for sub in ["sandboxes", "trash"] {
        let dir = state.join(sub);
        let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        if left > 0 {
            report.note(format!(
                "Daemonless `mayfly run` left {left} entries in {}.",
                dir.display()
            ));
        }
    }
}
