//! Per-tenant latency (scheduler arrival to backend completion) in
//! `hdrhistogram` histograms.
//!
//! * Unit: microseconds (rounded to the nearest µs), range
//!   0 .. [`LATENCY_MAX_US`] (60 s), [`LATENCY_SIGFIG`] = 2 significant
//!   digits (a value is reported within 1 %; below 256 µs exactly).
//!   Longer latencies are clamped to 60 s (counted, never a panic); the
//!   `_sum` keeps their true duration.
//! * Recording: each worker thread owns one [`Latency`] per tenant
//!   (`tenant/worker.rs`) and records into it at completion: no lock, no
//!   atomic, no allocation. Every [`MERGE_INTERVAL`] (on the worker's
//!   `refresh`, the tenant telemetry tick; an idle worker with unmerged
//!   samples wakes for it) the worker adds its histograms into the
//!   tenant's shared one ([`super::TenantStats::merge_latency`], a `Mutex`
//!   taken only then and at scrape time) and resets its own. So the
//!   exported figures lag completions by at most that interval.
//! * Export: Prometheus buckets at the fixed bounds [`LE_BOUNDS_US`] and
//!   the same cumulative buckets in `/v1/stats`, plus quantiles since
//!   start (see `docs/tenants.md`).
//!
//! Memory: one histogram is about 20 KiB (2 560 `u64` counts; 3 digits
//! would take 136 KiB, which at the limits of 256 tenants and 64 workers
//! is over 2 GiB); a worker holds one per tenant in the table, the shared
//! side one per tenant that has completed I/O.

use hdrhistogram::Histogram;
use std::time::Duration;

/// Highest trackable latency, µs (60 s); longer ones are clamped to it.
pub const LATENCY_MAX_US: u64 = 60_000_000;
/// Significant decimal digits kept.
pub const LATENCY_SIGFIG: u8 = 2;
/// How often a worker merges its histograms into the shared ones.
pub const MERGE_INTERVAL: Duration = crate::metrics::SEND_PUBLISH_INTERVAL;

/// The `le` bounds (µs) of `sluice_tenant_latency_seconds` and of
/// `/v1/stats` buckets: 1, 2, 5 µs; 1, 1.5, 2, 3, 5, 7 per decade from
/// 10 µs to 700 ms; 1, 2, 5, 10, 20, 30 s; then `+Inf`, which holds the
/// latencies over 30 s and those clamped to [`LATENCY_MAX_US`].
pub const LE_BOUNDS_US: [u64; 39] = [
    1, 2, 5, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1_000, 1_500, 2_000, 3_000,
    5_000, 7_000, 10_000, 15_000, 20_000, 30_000, 50_000, 70_000, 100_000, 150_000, 200_000,
    300_000, 500_000, 700_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000, 30_000_000,
];

/// A latency distribution: an hdrhistogram in µs plus the exact sum.
#[derive(Clone)]
pub struct Latency {
    hist: Histogram<u64>,
    sum_ns: u64,
}

impl std::fmt::Debug for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Latency")
            .field("count", &self.count())
            .field("sum_ns", &self.sum_ns)
            .finish()
    }
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    /// An empty histogram (allocates about 136 KiB: not for the I/O path).
    pub fn new() -> Self {
        #[allow(clippy::expect_used)]
        let hist = Histogram::new_with_bounds(1, LATENCY_MAX_US, LATENCY_SIGFIG)
            .expect("1 us .. 60 s at 3 digits are valid hdrhistogram bounds");
        Latency { hist, sum_ns: 0 }
    }

    /// Records one latency; clamped to [`LATENCY_MAX_US`], never fails.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.hist.saturating_record(ns.saturating_add(500) / 1000);
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Sum of the recorded latencies (exact, not clamped), seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    /// Adds this histogram into `into` and empties this one.
    pub fn merge_into(&mut self, into: &mut Latency) {
        if let Err(e) = into.hist.add(&self.hist) {
            // Same bounds on both sides: cannot happen.
            debug_assert!(false, "latency merge: {e:?}");
            tracing::error!(error = ?e, "latency histogram merge failed");
        }
        into.sum_ns = into.sum_ns.saturating_add(self.sum_ns);
        self.hist.reset();
        self.sum_ns = 0;
    }

    /// Quantile `q` in seconds (the highest value equivalent to it at
    /// hdrhistogram's precision); None when empty.
    pub fn quantile_seconds(&self, q: f64) -> Option<f64> {
        (!self.is_empty()).then(|| self.hist.value_at_quantile(q) as f64 / 1e6)
    }

    /// Largest recorded latency in seconds (within the precision).
    pub fn max_seconds(&self) -> Option<f64> {
        (!self.is_empty()).then(|| self.hist.max() as f64 / 1e6)
    }

    /// Counts per bound of [`LE_BOUNDS_US`] (not cumulative) and the count
    /// above the last one. A histogram bucket is counted under the first
    /// bound its lowest equivalent value does not exceed, so a latency of
    /// exactly a bound is counted under it (exact below 256 µs, within
    /// 1 % above).
    pub fn bucket_counts(&self) -> ([u64; LE_BOUNDS_US.len()], u64) {
        let mut counts = [0u64; LE_BOUNDS_US.len()];
        let mut over = 0u64;
        for v in self.hist.iter_recorded() {
            let low = self.hist.lowest_equivalent(v.value_iterated_to());
            match LE_BOUNDS_US.iter().position(|&b| low <= b) {
                Some(i) => counts[i] += v.count_at_value(),
                None => over += v.count_at_value(),
            }
        }
        (counts, over)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::TenantStats;

    fn us(x: u64) -> Duration {
        Duration::from_micros(x)
    }

    /// Within hdrhistogram's precision at 2 digits (and the µs rounding).
    fn close(got: Option<f64>, want_us: f64) -> bool {
        got.is_some_and(|g| (g * 1e6 - want_us).abs() <= want_us * 1e-2 + 1.0)
    }

    #[test]
    fn two_workers_merge_into_the_shared_histogram() {
        let shared = TenantStats::default();
        let (mut w0, mut w1) = (Latency::new(), Latency::new());
        // Worker 0: 1..=900 µs, worker 1: 10 ms x 90 and 50 ms x 10.
        for i in 1..=900u64 {
            w0.record(us(i));
        }
        for _ in 0..90 {
            w1.record(Duration::from_millis(10));
        }
        for _ in 0..10 {
            w1.record(Duration::from_millis(50));
        }
        shared.merge_latency(&mut w0);
        shared.merge_latency(&mut w1);
        assert!(w0.is_empty() && w1.is_empty(), "merging resets the locals");
        shared.with_latency(|l| {
            let l = l.expect("merged");
            assert_eq!(l.count(), 1000);
            assert!(close(l.quantile_seconds(0.5), 500.0), "p50");
            assert!(close(l.quantile_seconds(0.9), 900.0), "p90");
            assert!(close(l.quantile_seconds(0.95), 10_000.0), "p95");
            assert!(close(l.quantile_seconds(0.999), 50_000.0), "p99.9");
            assert!(close(l.max_seconds(), 50_000.0), "max");
            let want = (900.0 * 901.0 / 2.0) * 1e-6 + 0.9 + 0.5;
            assert!((l.sum_seconds() - want).abs() < 1e-9, "exact sum");
            let (counts, over) = l.bucket_counts();
            let at = |b: u64| {
                counts[..=LE_BOUNDS_US.iter().position(|&x| x == b).expect("bound")]
                    .iter()
                    .sum::<u64>()
            };
            // Exact below 256 µs; above, a bucket 1 % wide may straddle a
            // bound (701..=703 µs share 700's bucket at 2 digits).
            assert_eq!((at(100), at(1_000)), (100, 900));
            assert!((700..=707).contains(&at(700)), "le 700: {}", at(700));
            assert_eq!((at(10_000), at(50_000), over), (990, 1000, 0));
        });
        // A second round adds to the first.
        w1.record(us(3));
        shared.merge_latency(&mut w1);
        shared.with_latency(|l| assert_eq!(l.map(Latency::count), Some(1001)));
    }

    #[test]
    fn out_of_range_latency_is_clamped_not_a_panic() {
        let mut l = Latency::new();
        l.record(Duration::from_secs(3600));
        l.record(Duration::MAX);
        l.record(Duration::ZERO);
        l.record(Duration::from_nanos(400));
        assert_eq!(l.count(), 4);
        assert!(close(l.max_seconds(), LATENCY_MAX_US as f64));
        assert_eq!(l.quantile_seconds(0.5), Some(0.0));
        let (counts, over) = l.bucket_counts();
        assert_eq!((counts[0], over), (2, 2), "clamped ones are in +Inf");
        let mut shared = Latency::new();
        l.merge_into(&mut shared);
        assert_eq!(shared.count(), 4);
    }

    #[test]
    fn bounds_are_increasing_and_below_the_max() {
        assert!(LE_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
        assert!(LE_BOUNDS_US.iter().all(|&b| b < LATENCY_MAX_US));
    }
}
