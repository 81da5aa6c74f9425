//! Memory cost of many idle sandboxes alive at once.
//!
//! Two views, both reported per sandbox:
//! - *attributed*: the daemon's RSS growth (plus its helper processes'
//!   PSS growth), the sandbox inits' PSS, and the growth of the kernel's
//!   own allocations (Slab, KernelStack, PageTables) in `/proc/meminfo`;
//! - *MemAvailable drop*: everything the machine lost, which also catches
//!   what no counter attributes, but also whatever else ran meanwhile.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::api::{call, create, wait_gone, Ledger, CLEANUP_LIMIT};
use crate::daemon::Daemon;
use crate::host::{sandbox_traces, Host};
use crate::report::Report;

/// The meminfo fields whose change is reported.
pub const FIELDS: [&str; 7] = [
    "MemAvailable",
    "Slab",
    "SUnreclaim",
    "KernelStack",
    "PageTables",
    "Shmem",
    "Cached",
];
/// The fields that count as the kernel's overhead in the attributed view.
const KERNEL: [&str; 3] = ["Slab", "KernelStack", "PageTables"];

/// What was measured with `alive` sandboxes up.
#[derive(Debug, Clone)]
pub struct Density {
    pub wanted: usize,
    pub alive: usize,
    pub create_total: Duration,
    pub destroy_total: Duration,
    pub cleanup_total: Option<Duration>,
    pub daemon_rss_kib: (u64, u64),
    pub helpers_pss_kib: (u64, u64),
    pub helpers: usize,
    pub inits_pss_kib: u64,
    pub inits_rss_kib: u64,
    pub meminfo_kib: (BTreeMap<String, u64>, BTreeMap<String, u64>),
}

impl Density {
    /// After minus before of a meminfo field, in KiB (negative = shrank).
    pub fn delta(&self, field: &str) -> i64 {
        let get = |m: &BTreeMap<String, u64>| m.get(field).copied().unwrap_or(0) as i64;
        get(&self.meminfo_kib.1) - get(&self.meminfo_kib.0)
    }

    pub fn daemon_growth_kib(&self) -> i64 {
        (self.daemon_rss_kib.1 as i64 - self.daemon_rss_kib.0 as i64)
            + (self.helpers_pss_kib.1 as i64 - self.helpers_pss_kib.0 as i64)
    }

    pub fn kernel_growth_kib(&self) -> i64 {
        KERNEL.iter().map(|f| self.delta(f)).sum()
    }

    /// Daemon + inits + kernel, in KiB per sandbox.
    pub fn attributed_per_sandbox_kib(&self) -> f64 {
        let total = self.daemon_growth_kib() + self.inits_pss_kib as i64 + self.kernel_growth_kib();
        total as f64 / self.alive.max(1) as f64
    }

    /// The fall in MemAvailable, in KiB per sandbox.
    pub fn available_per_sandbox_kib(&self) -> f64 {
        -self.delta("MemAvailable") as f64 / self.alive.max(1) as f64
    }

    pub fn to_json(&self) -> Value {
        let deltas: BTreeMap<&str, i64> = FIELDS.iter().map(|f| (*f, self.delta(f))).collect();
        json!({
            "wanted": self.wanted, "alive": self.alive,
            "create_total_ms": self.create_total.as_secs_f64() * 1e3,
            "destroy_total_ms": self.destroy_total.as_secs_f64() * 1e3,
            "cleanup_total_ms": self.cleanup_total.map(|d| d.as_secs_f64() * 1e3),
            "daemon_rss_kib": [self.daemon_rss_kib.0, self.daemon_rss_kib.1],
            "helpers_pss_kib": [self.helpers_pss_kib.0, self.helpers_pss_kib.1],
            "helpers": self.helpers,
            "inits_pss_kib": self.inits_pss_kib, "inits_rss_kib": self.inits_rss_kib,
            "meminfo_delta_kib": deltas,
            "attributed_per_sandbox_kib": self.attributed_per_sandbox_kib(),
            "memavailable_per_sandbox_kib": self.available_per_sandbox_kib(),
        })
    }
}

/// The daemon's descendants that are not sandboxes (the zygote and other
/// helpers): their count and summed PSS. Sandbox inits and everything
/// below them are skipped.
fn helpers(host: &Host, daemon: u32, inits: &HashSet<u32>) -> (usize, u64) {
    let (mut n, mut kib) = (0, 0);
    let mut stack = vec![daemon];
    while let Some(p) = stack.pop() {
        for c in host.children(p) {
            if !inits.contains(&c) {
                n += 1;
                kib += host.pss_kib(c).unwrap_or(0);
                stack.push(c);
            }
        }
    }
    (n, kib)
}

/// Lets freed memory and deferred kernel work (RCU, slab frees) settle.
fn settle() {
    std::thread::sleep(Duration::from_secs(2));
}

/// Creates `wanted` sandboxes, measures, destroys them all.
pub async fn measure(
    d: &Daemon,
    host: &Host,
    wanted: usize,
    ledger: &mut Ledger,
    report: &mut Report,
) -> anyhow::Result<()> {
    let pid = d.pid();
    let no_inits = HashSet::new();
    settle();
    let mem_before = host.meminfo()?;
    let rss_before = host.rss_kib(pid).context("reading the daemon's VmRSS")?;
    let (_, helpers_before) = helpers(host, pid, &no_inits);

    let mut alive = Vec::with_capacity(wanted);
    let t = Instant::now();
    for i in 0..wanted {
        match create(&d.client, ledger).await {
            Ok((sb, _)) => alive.push(sb),
            Err(e) => {
                report.note(format!(
                    "Density: create {} of {wanted} failed, measured with {i}: {e:#}",
                    i + 1
                ));
                break;
            }
        }
    }
    let create_total = t.elapsed();
    settle();

    let measured = async {
        let listed = call("listing sandboxes", d.client.list(false)).await?;
        let inits: HashSet<u32> = listed.iter().filter_map(|s| s.init_pid).collect();
        if inits.len() < alive.len() {
            let with_pid = listed.iter().filter(|s| s.init_pid.is_some()).count();
            report.note(format!(
                "Density: of {} sandboxes created, the daemon listed {} ({with_pid} with an init pid, \
                 {} distinct).",
                alive.len(),
                listed.len(),
                inits.len()
            ));
        }
        let rss_after = host.rss_kib(pid).context("reading the daemon's VmRSS")?;
        let (n_helpers, helpers_after) = helpers(host, pid, &inits);
        let inits_pss_kib = inits.iter().filter_map(|p| host.pss_kib(*p)).sum();
        let inits_rss_kib = inits.iter().filter_map(|p| host.rss_kib(*p)).sum();
        let mem_after = host.meminfo()?;
        anyhow::Ok(Density {
            wanted,
            alive: alive.len(),
            create_total,
            destroy_total: Duration::ZERO,
            cleanup_total: None,
            daemon_rss_kib: (rss_before, rss_after),
            helpers_pss_kib: (helpers_before, helpers_after),
            helpers: n_helpers,
            inits_pss_kib,
            inits_rss_kib,
            meminfo_kib: (mem_before, mem_after),
        })
    }
    .await;

    // Destroy everything whatever happened above.
    let t = Instant::now();
    let mut traces = Vec::new();
    for sb in &alive {
        if let Err(e) = call(format!("destroying {}", sb.id), d.client.destroy(&sb.id)).await {
            report.note(format!("Density: {e:#}"));
        }
        traces.extend(sandbox_traces(host, &d.scratch_root, sb.id.as_str()));
    }
    let destroy_total = t.elapsed();
    let limit = destroy_total + CLEANUP_LIMIT;
    let cleanup_total = wait_gone(host, &traces, None, t, limit);
    if cleanup_total.is_none() {
        report.note(format!(
            "Density: some sandboxes were not fully cleaned up {limit:?} after the first destroy."
        ));
    }
    let mut m = measured?;
    m.destroy_total = destroy_total;
    m.cleanup_total = cleanup_total;
    report.density = Some(m);
    Ok(())
}
