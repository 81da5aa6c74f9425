//! The load measure's peer: `bwrap … /bin/true` run back to back by as
//! many concurrent loops as the load has clients, in the same bench run,
//! and the host CPU each cycle (Mayfly's create+exec+destroy, bwrap's whole
//! run) costs. bwrap does less per run than a Mayfly cycle (no API, no
//! cgroups, no overlay root, no records), so its rate is a ceiling for what
//! any sandbox made per task can sustain on the host.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// bwrap's arguments: every namespace, a read-only host root, a fresh
/// `/dev` and `/proc` (as in the `mayfly run` against bwrap measure).
pub const BWRAP_ARGS: &str =
    "--ro-bind / / --unshare-all --die-with-parent --dev /dev --proc /proc /bin/true";

/// Busy CPU time of the whole host (every state but idle and iowait), read
/// from `/proc/stat`.
#[derive(Debug, Clone, Copy)]
pub struct HostCpu(u64);

impl HostCpu {
    pub fn now() -> anyhow::Result<HostCpu> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        parse_busy_ticks(&stat)
            .map(HostCpu)
            .context("no `cpu` line in /proc/stat")
    }

    /// CPU time used since `earlier`. `/proc/stat` counts in USER_HZ,
    /// which is 100 on every Linux this runs on.
    pub fn since(self, earlier: HostCpu) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0) * 10)
    }
}

/// The busy ticks of the aggregate `cpu` line: user, nice, system, irq,
/// softirq and steal (idle and iowait left out; guest time is already in
/// user).
fn parse_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    Some(at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

/// What the peer load saw.
#[derive(Debug, Clone)]
pub struct PeerLoad {
    pub runs: usize,
    pub concurrency: usize,
    pub wall: Duration,
    pub cpu: Duration,
}

impl PeerLoad {
    pub fn rate(&self) -> f64 {
        self.runs as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn cpu_ms_per_run(&self) -> f64 {
        self.cpu.as_secs_f64() * 1000.0 / self.runs.max(1) as f64
    }
}

/// Runs `bwrap … /bin/true` `runs` times, `concurrency` at once. Any failed
/// run fails the measure.
pub fn bwrap_load(runs: usize, concurrency: usize) -> anyhow::Result<PeerLoad> {
    let left = Arc::new(AtomicUsize::new(runs));
    let cpu0 = HostCpu::now()?;
    let t = Instant::now();
    let loops: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let left = left.clone();
            std::thread::spawn(move || -> anyhow::Result<()> {
                while left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let st = Command::new("bwrap")
                        .args(BWRAP_ARGS.split(' '))
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .status()
                        .context("running bwrap (run bench/peers-setup.sh)")?;
                    anyhow::ensure!(st.success(), "bwrap failed: {st}");
                }
                Ok(())
            })
        })
        .collect();
    let mut first_error = None;
    for l in loops {
        match l.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(anyhow::anyhow!("a bwrap loop panicked"));
            }
        }
    }
    let wall = t.elapsed();
    let cpu = HostCpu::now()?.since(cpu0);
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(PeerLoad {
        runs,
        concurrency,
        wall,
        cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_ticks_leave_idle_and_iowait_out() {
        let stat = "cpu  100 2 30 5000 7 4 6 1 0 0\ncpu0 50 1 15 2500 3 2 3 0 0 0\n";
        assert_eq!(parse_busy_ticks(stat), Some(100 + 2 + 30 + 4 + 6 + 1));
        assert_eq!(parse_busy_ticks("intr 1 2 3\n"), None);
        assert_eq!(parse_busy_ticks("cpu  1 x 3\n"), None);
    }

    #[test]
    fn host_cpu_is_read_and_never_goes_back() {
        let a = HostCpu::now().expect("reading /proc/stat");
        let b = HostCpu::now().expect("reading /proc/stat");
        // Counters only grow, so the earlier reading minus the later is 0.
        assert_eq!(a.since(b), Duration::ZERO);
        assert!(b.since(a) < Duration::from_secs(3600));
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        let c = HostCpu::now().expect("reading /proc/stat");
        assert!(
            c.since(a) >= Duration::from_millis(20),
            "50 ms of spinning showed as {:?} of host CPU",
            c.since(a)
        );
    }
}
