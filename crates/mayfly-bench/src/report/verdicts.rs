//! The targets table: each measure's target, what was measured, and
//! whether it was met.

use super::{ms, ratio_text, Report, MIB};

/// One line of the targets table: the measured value and whether it passes.
pub(super) struct Verdict {
    pub(super) measure: &'static str,
    pub(super) target: &'static str,
    pub(super) measured: String,
    pub(super) met: Option<bool>,
}

impl Report {
    pub(super) fn verdicts(&self) -> Vec<Verdict> {
        let mut v = Vec::new();
        let mut push = |measure, target, got: Option<(String, bool)>| {
            let (measured, met) =
                got.map_or(("not measured".to_owned(), None), |(m, ok)| (m, Some(ok)));
            v.push(Verdict {
                measure,
                target,
                measured,
                met,
            });
        };
        for (key, label) in [
            ("create", "cold create→ready"),
            ("create_idle", "cold create→ready, after idling"),
        ] {
            push(
                label,
                "p50 ≤ 5 ms, p99 ≤ 20 ms",
                self.get(key).map(|s| {
                    let text = format!("p50 {} ms, p99 {} ms", ms(s.p50), ms(s.p99));
                    (text, s.p50 <= 5.0 && s.p99 <= 20.0)
                }),
            );
        }
        push(
            "exec round trip of `true`",
            "p50 ≤ fork+exec p50 + 1 ms",
            self.p50("exec").zip(self.p50("fork_exec")).map(|(e, f)| {
                (
                    format!("{} − {} = +{} ms", ms(e), ms(f), ms(e - f)),
                    e - f <= 1.0,
                )
            }),
        );
        for (key, label, limit) in [
            ("destroy", "destroy, API returns", 2.0),
            ("destroy_idle", "destroy, API returns, after idling", 2.0),
            ("cleanup", "destroy, full cleanup", 50.0),
            ("cleanup_idle", "destroy, full cleanup, after idling", 50.0),
        ] {
            let target = if limit < 10.0 {
                "≤ 2 ms (judged on p50)"
            } else {
                "≤ 50 ms (judged on p50)"
            };
            push(
                label,
                target,
                self.get(key).map(|s| {
                    (
                        format!("p50 {} ms, p99 {} ms", ms(s.p50), ms(s.p99)),
                        s.p50 <= limit,
                    )
                }),
            );
        }
        push(
            "`mayfly run` vs bwrap",
            "≤ 1.0× (ratio of p50s)",
            self.ratio("run_mayfly", "run_bwrap")
                .map(|(r, pm)| (ratio_text(r, pm), r <= 1.0)),
        );
        push(
            "`mayfly run` vs podman",
            "≥ 30× faster (ratio of p50s)",
            self.ratio("run_podman", "run_mayfly")
                .map(|(r, pm)| (ratio_text(r, pm), r >= 30.0)),
        );
        push(
            "warm claim over the API (unix socket)",
            "p50 ≤ 200 µs, p99 ≤ 2 ms",
            self.get("claim").map(|s| {
                (
                    format!("p50 {} ms, p99 {} ms", ms(s.p50), ms(s.p99)),
                    s.p50 <= 0.2 && s.p99 <= 2.0,
                )
            }),
        );
        push(
            "`mayfly run` through a daemon with a warm pool vs bwrap",
            "≤ 0.5× (ratio of p50s, same loop)",
            self.ratio("run_daemon", "run_daemon_bwrap")
                .map(|(r, pm)| (ratio_text(r, pm), r <= 0.5)),
        );
        push(
            "sustained create+exec+destroy",
            "≥ 300 per second",
            self.load.as_ref().map(|l| {
                let p99 = self.get("load_cycle").map_or(0.0, |s| s.p99);
                (
                    format!(
                        "{:.0}/s ({} clients, {} cycles, {} errors, {} throttled, p99 {} ms, {:.2} ms of host CPU per cycle){}",
                        l.rate(),
                        l.clients,
                        l.total,
                        l.errors,
                        l.throttled,
                        ms(p99),
                        l.cpu_ms_per_cycle(),
                        l.peer_text()
                    ),
                    l.rate() >= 300.0 && l.errors == 0,
                )
            }),
        );
        push(
            "pool refill rate",
            "≥ 200 sandboxes per second per core",
            self.refill.as_ref().map(|r| {
                let per_core = r.per_core();
                let rounds: Vec<String> = r
                    .rounds
                    .iter()
                    .map(|d| format!("{:.0}", r.sandboxes as f64 / d.as_secs_f64() / r.cores.max(1) as f64))
                    .collect();
                (
                    format!(
                        "{per_core:.0}/s per core, median of {} rounds ({}); {} in {:.2} s on {} cores, {} boots at once; {:.2} ms of host CPU per boot",
                        r.rounds.len(),
                        rounds.join(", "),
                        r.sandboxes,
                        r.took().as_secs_f64(),
                        r.cores,
                        r.concurrency,
                        r.cpu_ms_per_boot()
                    ),
                    per_core >= 200.0,
                )
            }),
        );
        if let Some(d) = &self.density {
            let (a, m) = (
                d.attributed_per_sandbox_kib() / MIB,
                d.available_per_sandbox_kib() / MIB,
            );
            push(
                "sandboxes alive, attributed",
                "≤ 2 MiB each",
                Some((format!("{a:.2} MiB each ({} alive)", d.alive), a <= 2.0)),
            );
            push(
                "sandboxes alive, MemAvailable drop",
                "≤ 2 MiB each",
                Some((format!("{m:.2} MiB each ({} alive)", d.alive), m <= 2.0)),
            );
        } else {
            push("sandboxes alive", "≤ 2 MiB each", None);
        }
        v
    }
}
