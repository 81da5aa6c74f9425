//! Samples and their order statistics.
//!
//! Percentiles use the nearest-rank method on the sorted samples: the p-th
//! percentile of n samples is the sample of rank ⌈p/100 · n⌉. It never
//! interpolates, so every reported figure is a time that was really measured.

use serde_json::{json, Value};

/// The median of `v`'s finite values (the lower one of an even count);
/// NaN when there is none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(f64::NAN)
}

/// One measure's samples, in milliseconds, each tagged with the iteration
/// it was taken in (so series sampled on different iterations still pair up).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    ms: Vec<f64>,
    at: Vec<usize>,
}

impl Samples {
    pub fn new() -> Samples {
        Samples::default()
    }

    /// Adds the sample of the next iteration.
    pub fn push(&mut self, d: std::time::Duration) {
        self.push_ms(d.as_secs_f64() * 1e3);
    }

    pub fn push_ms(&mut self, ms: f64) {
        self.push_at(self.ms.len(), ms);
    }

    /// Adds the sample of iteration `at`.
    pub fn push_at(&mut self, at: usize, ms: f64) {
        self.ms.push(ms);
        self.at.push(at);
    }

    pub fn is_empty(&self) -> bool {
        self.ms.is_empty()
    }

    /// The raw samples in the order they were taken.
    pub fn values(&self) -> &[f64] {
        &self.ms
    }

    /// Order statistics, or `None` when nothing was measured.
    pub fn summary(&self) -> Option<Summary> {
        if self.ms.is_empty() {
            return None;
        }
        let mut sorted = self.ms.clone();
        sorted.sort_by(f64::total_cmp);
        Some(Summary {
            n: sorted.len(),
            min: sorted[0],
            p50: nearest_rank(&sorted, 50.0),
            p95: nearest_rank(&sorted, 95.0),
            p99: nearest_rank(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        })
    }
}

/// What the report says about one measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    pub fn to_json(self) -> Value {
        json!({
            "n": self.n, "min_ms": self.min, "p50_ms": self.p50, "p95_ms": self.p95,
            "p99_ms": self.p99, "max_ms": self.max, "mean_ms": self.mean,
        })
    }
}

/// The nearest-rank percentile of already sorted samples.
pub fn nearest_rank(sorted: &[f64], pct: f64) -> f64 {
    assert!(!sorted.is_empty(), "no samples");
    let n = sorted.len();
    let rank = ((pct / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// The median of the ratios `a[i] / b[i]` over the iterations `i` both
/// interleaved series sampled: noise that hits one iteration hits both
/// sides of its ratio.
pub fn paired_ratio_median(a: &Samples, b: &Samples) -> Option<f64> {
    let by_iter: std::collections::HashMap<usize, f64> =
        b.at.iter().copied().zip(b.ms.iter().copied()).collect();
    let mut r: Vec<f64> =
        a.at.iter()
            .zip(&a.ms)
            .filter_map(|(i, x)| Some(x / by_iter.get(i).filter(|y| **y > 0.0)?))
            .collect();
    if r.is_empty() {
        return None;
    }
    r.sort_by(f64::total_cmp);
    Some(nearest_rank(&r, 50.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(v: &[f64]) -> Samples {
        let mut s = Samples::new();
        v.iter().for_each(|x| s.push_ms(*x));
        s
    }

    #[test]
    fn nearest_rank_picks_a_measured_sample() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 50.0), 50.0);
        assert_eq!(nearest_rank(&v, 95.0), 95.0);
        assert_eq!(nearest_rank(&v, 99.0), 99.0);
        assert_eq!(nearest_rank(&v, 100.0), 100.0);
        assert_eq!(nearest_rank(&v, 0.0), 1.0);
    }

    #[test]
    fn small_samples_round_the_rank_up() {
        // n = 10: p50 is rank 5, p95 and p99 are rank 10 (the maximum).
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 50.0), 5.0);
        assert_eq!(nearest_rank(&v, 95.0), 10.0);
        assert_eq!(nearest_rank(&v, 99.0), 10.0);
        assert_eq!(nearest_rank(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn summary_sorts_before_ranking() {
        let s = samples(&[5.0, 1.0, 4.0, 2.0, 3.0]).summary().unwrap();
        assert_eq!((s.n, s.min, s.p50, s.max, s.mean), (5, 1.0, 3.0, 5.0, 3.0));
        assert!(Samples::new().summary().is_none());
    }

    #[test]
    fn paired_ratios_are_taken_per_iteration() {
        let a = samples(&[2.0, 30.0, 4.0]);
        let b = samples(&[1.0, 10.0, 4.0]);
        assert_eq!(paired_ratio_median(&a, &b), Some(2.0));
        assert_eq!(paired_ratio_median(&a, &Samples::new()), None);
    }

    #[test]
    fn sparse_series_pair_on_their_iterations() {
        let mut sparse = Samples::new();
        sparse.push_at(0, 20.0);
        sparse.push_at(2, 40.0);
        let every = samples(&[2.0, 100.0, 4.0]);
        // Iterations 0 and 2 only: 20/2 and 40/4.
        assert_eq!(paired_ratio_median(&sparse, &every), Some(10.0));
    }
}
