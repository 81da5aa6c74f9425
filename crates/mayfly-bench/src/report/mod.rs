//! The report: series of samples, notes, the density result, and how to
//! print them as markdown (docs/BENCHMARKS.md) and JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::density::{Density, FIELDS};
use crate::stats::{paired_ratio_median, Samples, Summary};

mod verdicts;

/// Every series the bench can produce, in report order, with its label.
const MEASURES: [(&str, &str); 24] = [
    ("create", "create→ready, API round trip"),
    ("create_daemon", "create→ready, daemon's own `create_ms`"),
    ("destroy", "destroy, API returns"),
    ("cleanup", "destroy, full cleanup"),
    ("create_idle", "create→ready, after idling"),
    ("destroy_idle", "destroy, API returns, after idling"),
    ("cleanup_idle", "destroy, full cleanup, after idling"),
    ("exec", "exec `true`, API round trip"),
    ("exec_daemon", "exec `true`, daemon's own `duration_us`"),
    ("fork_exec", "fork+exec `/bin/true` (floor)"),
    (
        "claim",
        "warm claim (create from a full pool), API round trip",
    ),
    ("claim_daemon", "warm claim, daemon's own `create_ms`"),
    (
        "claim_floor",
        "`GET /healthz` round trip, same client, just before each claim (floor)",
    ),
    (
        "run_daemon",
        "`mayfly run -- /bin/true` through a daemon with a warm pool",
    ),
    (
        "run_daemon_bwrap",
        "`bwrap … /bin/true`, same loop as the line above",
    ),
    (
        "load_cycle",
        "create+exec+destroy under load (one client's cycle)",
    ),
    (
        "run_mayfly",
        "`mayfly run -- /bin/true`, daemonless (served by a parked sandbox)",
    ),
    (
        "run_mayfly_parked_again",
        "… until the next sandbox is parked and its reaper has exited (not a peer measure)",
    ),
    (
        "run_mayfly_cold",
        "`mayfly run --park 0 -- /bin/true`, daemonless, cold",
    ),
    (
        "run_mayfly_cold_cleanup",
        "… until its reaper has removed everything (not a peer measure)",
    ),
    ("run_bwrap", "`bwrap --unshare-all … /bin/true`"),
    ("run_runc", "`runc run` (busybox bundle)"),
    ("run_podman", "`podman --runtime runc run --rm`"),
    ("run_unshare", "`unshare -U -m -p -n -i -u --fork` (floor)"),
];

const MIB: f64 = 1024.0;

/// The refill measure: `sandboxes` booted into an empty pool, `concurrency`
/// at once, on `cores` cores, once per round; `rounds` holds how long each
/// round took, `cpu` the host's busy CPU time across each.
#[derive(Debug, Clone)]
pub struct Refill {
    pub sandboxes: u32,
    pub cores: u32,
    pub concurrency: u32,
    pub rounds: Vec<std::time::Duration>,
    pub cpu: Vec<std::time::Duration>,
}

impl Refill {
    /// The median round (the upper one of an even count, so never the
    /// faster of two).
    pub fn took(&self) -> std::time::Duration {
        let secs = upper_median(self.rounds.iter().map(|d| d.as_secs_f64()));
        std::time::Duration::try_from_secs_f64(secs).unwrap_or_default()
    }

    /// The host's busy CPU time per boot, in ms, median over the rounds
    /// (the upper one of an even count).
    pub fn cpu_ms_per_boot(&self) -> f64 {
        let boots = self.sandboxes.max(1) as f64;
        upper_median(self.cpu.iter().map(|d| d.as_secs_f64() * 1000.0 / boots))
    }

    /// Sandboxes per second per core, of the median round.
    pub fn per_core(&self) -> f64 {
        self.sandboxes as f64 / self.took().as_secs_f64() / self.cores.max(1) as f64
    }
}

/// The median of `v` (the upper one of an even count); NaN when empty.
fn upper_median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Everything one run measured.
#[derive(Debug, Default)]
pub struct Report {
    series: BTreeMap<&'static str, Samples>,
    notes: Vec<String>,
    pub density: Option<Density>,
    /// Sandboxes booted, boots at once, and how long the pool took to fill.
    pub refill: Option<Refill>,
    pub load: Option<Load>,
    pub machine: BTreeMap<&'static str, String>,
    pub versions: BTreeMap<&'static str, String>,
    pub command: String,
}

/// What the load measure saw.
#[derive(Debug, Default)]
pub struct Load {
    pub clients: usize,
    pub total: usize,
    pub wall: std::time::Duration,
    pub errors: usize,
    pub throttled: usize,
    pub from_pool: usize,
    pub first_error: Option<String>,
    /// Busy CPU time of the whole host over the load's wall time.
    pub cpu: std::time::Duration,
    /// bwrap's run of the same size, or why it failed.
    pub peer: Option<Result<crate::peer_load::PeerLoad, String>>,
}

impl Load {
    /// Completed cycles per second.
    pub fn rate(&self) -> f64 {
        (self.total - self.errors - self.throttled) as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Host CPU time per completed cycle, ms.
    pub fn cpu_ms_per_cycle(&self) -> f64 {
        let done = (self.total - self.errors - self.throttled).max(1);
        self.cpu.as_secs_f64() * 1000.0 / done as f64
    }

    /// bwrap's figures in the same run, for the verdict line.
    fn peer_text(&self) -> String {
        match &self.peer {
            Some(Ok(p)) => format!(
                "; bwrap … /bin/true, {} at once, same run: {:.0}/s, {:.2} ms of host CPU per run (Mayfly {:.2}× its rate)",
                p.concurrency,
                p.rate(),
                p.cpu_ms_per_run(),
                self.rate() / p.rate().max(1e-9)
            ),
            Some(Err(e)) => format!("; the bwrap load failed: {e}"),
            None => String::new(),
        }
    }
}

impl Report {
    pub fn new(
        machine: BTreeMap<&'static str, String>,
        versions: BTreeMap<&'static str, String>,
        command: String,
    ) -> Report {
        Report {
            machine,
            versions,
            command,
            ..Report::default()
        }
    }

    pub fn add(&mut self, key: &'static str, samples: Samples) {
        debug_assert!(
            MEASURES.iter().any(|(k, _)| *k == key),
            "unknown series {key}"
        );
        if !samples.is_empty() {
            self.series.insert(key, samples);
        }
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    fn get(&self, key: &str) -> Option<Summary> {
        self.series.get(key).and_then(Samples::summary)
    }

    fn p50(&self, key: &str) -> Option<f64> {
        self.get(key).map(|s| s.p50)
    }

    /// `a / b` of p50s and the median per-iteration ratio.
    fn ratio(&self, a: &str, b: &str) -> Option<(f64, Option<f64>)> {
        let r = self.p50(a)? / self.p50(b)?;
        Some((
            r,
            paired_ratio_median(self.series.get(a)?, self.series.get(b)?),
        ))
    }

    pub fn markdown(&self) -> String {
        let mut o = String::from(include_str!("../method.md"));
        let m = |k: &str| self.machine.get(k).cloned().unwrap_or_default();
        let _ = writeln!(o, "\n## Results\n\nMeasured on {}.\n", m("date"));
        let _ = writeln!(
            o,
            "- **Machine:** Linux {}, {} vCPUs ({}), {} memory, cgroups {}; load average {} at the start.",
            m("kernel"),
            m("nproc"),
            m("cpu"),
            m("memory"),
            m("cgroups"),
            m("load")
        );
        let vers: Vec<String> = self
            .versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(o, "- **Versions:** {}.", vers.join(", "));
        let _ = writeln!(o, "- **Reproduce** (as root, from the repository root):\n\n  ```sh\n  cargo build --release -p mayfly -p mayfly-bench\n  bash bench/peers-setup.sh\n  {}\n  ```", self.command);

        o.push_str("\n### Against the targets\n\n| measure | target | measured | met |\n| --- | --- | --- | --- |\n");
        for v in self.verdicts() {
            let met = match v.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {met} |",
                v.measure, v.target, v.measured
            );
        }

        let mut rows = Vec::new();
        for (key, label) in MEASURES {
            if let Some(s) = self.get(key) {
                let (p50, p95, p99, max) = (ms(s.p50), ms(s.p95), ms(s.p99), ms(s.max));
                rows.push(format!(
                    "| {label} | {} | {p50} | {p95} | {p99} | {max} |",
                    s.n
                ));
            }
        }
        table(
            &mut o,
            "Latency (milliseconds)",
            "| measure | N | p50 | p95 | p99 | max |\n| --- | ---: | ---: | ---: | ---: | ---: |",
            &rows,
        );

        let mut rows = Vec::new();
        for (a, b, label) in [
            ("run_mayfly", "run_bwrap", "mayfly run / bwrap"),
            ("run_mayfly_cold", "run_bwrap", "mayfly run cold / bwrap"),
            (
                "run_mayfly_cold_cleanup",
                "run_bwrap",
                "mayfly run cold until its reaper is done / bwrap",
            ),
            ("run_mayfly", "run_unshare", "mayfly run / unshare floor"),
            ("run_mayfly", "run_runc", "mayfly run / runc"),
            ("run_podman", "run_mayfly", "podman / mayfly run"),
            ("run_podman", "run_mayfly_cold", "podman / mayfly run cold"),
            ("exec", "fork_exec", "exec over API / fork+exec"),
            (
                "run_daemon",
                "run_daemon_bwrap",
                "mayfly run via warm daemon / bwrap",
            ),
        ] {
            if let Some((r, pm)) = self.ratio(a, b) {
                let pm = pm.map_or("—".to_owned(), |p| format!("{p:.2}×"));
                rows.push(format!("| {label} | {r:.2}× | {pm} |"));
            }
        }
        if let Some((e, f)) = self.p50("exec").zip(self.p50("fork_exec")) {
            rows.push(format!(
                "| exec over API − fork+exec (p50s) | +{} ms | |",
                ms(e - f)
            ));
        }
        table(
            &mut o,
            "Ratios",
            "| ratio | of p50s | per-iteration median |\n| --- | ---: | ---: |",
            &rows,
        );

        if let Some(d) = &self.density {
            self.density_md(&mut o, d);
        }
        o.push_str("\n### Notes\n\n");
        if self.notes.is_empty() {
            o.push_str("- Nothing failed, was skipped or leaked in this run.\n");
        }
        for n in &self.notes {
            let _ = writeln!(o, "- {n}");
        }
        o
    }

    fn density_md(&self, o: &mut String, d: &Density) {
        let n = d.alive.max(1) as f64;
        let row = |o: &mut String, what: &str, kib: f64| {
            let _ = writeln!(o, "| {what} | {:.1} MiB | {:.0} KiB |", kib / MIB, kib / n);
        };
        let _ = writeln!(
            o,
            "\n### {} sandboxes alive\n\nCreated one after another in {:.1} s; destroyed in {:.1} s; all cleaned up after {}.\n\n| quantity | total | per sandbox |\n| --- | ---: | ---: |",
            d.alive,
            d.create_total.as_secs_f64(),
            d.destroy_total.as_secs_f64(),
            d.cleanup_total.map_or("— (not within the limit)".to_owned(), |c| format!("{:.1} s", c.as_secs_f64())),
        );
        row(
            o,
            "daemon RSS growth",
            (d.daemon_rss_kib.1 as f64) - d.daemon_rss_kib.0 as f64,
        );
        row(
            o,
            &format!("helper processes' PSS growth ({} helpers)", d.helpers),
            d.helpers_pss_kib.1 as f64 - d.helpers_pss_kib.0 as f64,
        );
        row(o, "sandbox inits, PSS", d.inits_pss_kib as f64);
        row(
            o,
            "sandbox inits, RSS (for reference)",
            d.inits_rss_kib as f64,
        );
        for f in FIELDS {
            row(o, &format!("`{f}` change"), d.delta(f) as f64);
        }
        row(
            o,
            "**attributed: daemon + inits + Slab/KernelStack/PageTables**",
            d.attributed_per_sandbox_kib() * n,
        );
        row(
            o,
            "**MemAvailable drop**",
            d.available_per_sandbox_kib() * n,
        );
        let _ = writeln!(
            o,
            "\nThe daemon's RSS was {:.1} MiB before and {:.1} MiB after.",
            d.daemon_rss_kib.0 as f64 / MIB,
            d.daemon_rss_kib.1 as f64 / MIB
        );
    }

    pub fn json(&self) -> Value {
        let measures: BTreeMap<&str, Value> = self
            .series
            .iter()
            .filter_map(|(k, s)| {
                let mut v = s.summary()?.to_json();
                v["samples_ms"] = json!(s.values());
                Some((*k, v))
            })
            .collect();
        let verdicts: Vec<Value> = self
            .verdicts()
            .into_iter()
            .map(|v| json!({"measure": v.measure, "target": v.target, "measured": v.measured, "met": v.met}))
            .collect();
        json!({
            "machine": self.machine, "versions": self.versions, "command": self.command,
            "measures": measures, "targets": verdicts,
            "density": self.density.as_ref().map(Density::to_json), "notes": self.notes,
            "refill": self.refill.as_ref().map(|r| json!({"sandboxes": r.sandboxes, "cores": r.cores, "concurrency": r.concurrency, "seconds": r.took().as_secs_f64(), "per_core": r.per_core(), "cpu_ms_per_boot": r.cpu_ms_per_boot(), "cpu_seconds": r.cpu.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>(), "rounds": r.rounds.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>()})),
            "load": self.load.as_ref().map(|l| json!({"clients": l.clients, "total": l.total, "seconds": l.wall.as_secs_f64(), "per_second": l.rate(), "errors": l.errors, "throttled": l.throttled, "from_pool": l.from_pool, "first_error": l.first_error, "host_cpu_ms_per_cycle": l.cpu_ms_per_cycle(), "bwrap": l.peer.as_ref().map(|p| match p {
                Ok(p) => json!({"runs": p.runs, "at_once": p.concurrency, "seconds": p.wall.as_secs_f64(), "per_second": p.rate(), "host_cpu_ms_per_run": p.cpu_ms_per_run()}),
                Err(e) => json!({"error": e}),
            })})),
        })
    }
}

/// A section with a table, left out when it would have no rows.
fn table(o: &mut String, title: &str, header: &str, rows: &[String]) {
    if !rows.is_empty() {
        let _ = writeln!(o, "\n### {title}\n\n{header}\n{}", rows.join("\n"));
    }
}

/// Milliseconds with three significant decimals below 1 ms, two above.
fn ms(v: f64) -> String {
    if v.abs() < 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio_text(r: f64, paired: Option<f64>) -> String {
    match paired {
        Some(p) => format!("{r:.2}× (per-iteration median {p:.2}×)"),
        None => format!("{r:.2}×"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(v: &[f64]) -> Samples {
        let mut s = Samples::new();
        v.iter().for_each(|x| s.push_ms(*x));
        s
    }

    #[test]
    fn verdicts_are_computed_from_the_samples() {
        let mut r = Report::default();
        r.add("create", series(&[3.0, 4.0, 30.0]));
        r.add("run_mayfly", series(&[4.0, 5.0]));
        r.add("run_bwrap", series(&[5.0, 6.0]));
        let v = r.verdicts();
        // p99 of [3, 4, 30] is 30 ms: the create target is missed.
        assert_eq!(v[0].met, Some(false));
        let met = |label: &str| v.iter().find(|x| x.measure == label).unwrap().met;
        assert_eq!(met("`mayfly run` vs bwrap"), Some(true));
        // Nothing measured, nothing claimed.
        assert_eq!(met("exec round trip of `true`"), None);
        assert!(r.markdown().contains(
            "| `mayfly run` vs podman | ≥ 30× faster (ratio of p50s) | not measured | — |"
        ));
    }
}
