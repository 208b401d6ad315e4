//! Sliding-window counters: the bookkeeping of every shadow-view entity.
//!
//! A [`Window`] splits its span into [`WINDOW_BUCKETS`] buckets by time.
//! Samples land in the bucket of their own timestamp, so a sample that
//! arrives late (batched by an agent) still counts where it belongs, and one
//! older than the span is dropped. Old buckets are cleared as time moves
//! on, which is the view's aging (Flint §3.3: "the view service supports
//! aging automatically"). Each epoch the caller folds the current rates
//! into an EWMA.

use serde::{Deserialize, Serialize};

/// Buckets per window.
pub const WINDOW_BUCKETS: usize = 10;

/// Shortest bucket, so that a window cannot be made degenerate.
pub const BUCKET_US_MIN: u64 = 100;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Bucket {
    /// The time slot this bucket holds (`time / bucket_us`).
    slot: u64,
    ios: u64,
    writes: u64,
    bytes: u64,
    latency_us_sum: u64,
    latency_us_max: u64,
    /// Latency above the unloaded baseline of the sample's size class,
    /// summed: the queueing delay estimate.
    excess_us_sum: u64,
}

/// What a window saw over its span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub latency_us_mean: f64,
    pub latency_us_max: u64,
    /// Mean latency above each sample's unloaded baseline.
    pub queue_delay_us_mean: f64,
    /// Share of I/Os that were writes, 0..=1.
    pub write_share: f64,
}

/// One entity's sliding window with its EWMA.
#[derive(Clone, Debug)]
pub struct Window {
    bucket_us: u64,
    buckets: [Bucket; WINDOW_BUCKETS],
    /// The newest slot seen.
    head_slot: u64,
    ewma: Option<WindowStats>,
}

/// Time slot of `t_us` with buckets of `bucket_us`.
fn slot(t_us: u64, bucket_us: u64) -> u64 {
    t_us / bucket_us
}

impl Window {
    /// A window covering `span_us` (at least `WINDOW_BUCKETS *
    /// BUCKET_US_MIN`).
    pub fn new(span_us: u64) -> Window {
        let bucket_us = (span_us / WINDOW_BUCKETS as u64).max(BUCKET_US_MIN);
        Window {
            bucket_us,
            buckets: [Bucket::default(); WINDOW_BUCKETS],
            head_slot: 0,
            ewma: None,
        }
    }

    pub fn span_us(&self) -> u64 {
        self.bucket_us * WINDOW_BUCKETS as u64
    }

    fn bucket(&mut self, at_us: u64) -> Option<&mut Bucket> {
        let s = slot(at_us, self.bucket_us);
        if s > self.head_slot {
            self.head_slot = s;
        }
        if s + (WINDOW_BUCKETS as u64) <= self.head_slot {
            return None; // older than the span
        }
        #[allow(clippy::cast_possible_truncation)] // < WINDOW_BUCKETS
        let b = &mut self.buckets[(s % WINDOW_BUCKETS as u64) as usize];
        if b.slot != s {
            *b = Bucket {
                slot: s,
                ..Bucket::default()
            };
        }
        Some(b)
    }

    /// Records one I/O completed at `at_us`. Returns false when the sample
    /// is older than the window's span and was dropped.
    pub fn record(
        &mut self,
        at_us: u64,
        bytes: u64,
        latency_us: u64,
        excess_us: u64,
        write: bool,
    ) -> bool {
        let Some(b) = self.bucket(at_us) else {
            return false;
        };
        b.ios += 1;
        b.writes += u64::from(write);
        b.bytes = b.bytes.saturating_add(bytes);
        b.latency_us_sum = b.latency_us_sum.saturating_add(latency_us);
        b.latency_us_max = b.latency_us_max.max(latency_us);
        b.excess_us_sum = b.excess_us_sum.saturating_add(excess_us);
        true
    }

    /// Records `ios` I/Os completed around `at_us` at once (a target's
    /// counters over an interval): their bytes, writes, summed latency and
    /// summed excess. Returns false when dropped as older than the span.
    #[allow(clippy::too_many_arguments)]
    pub fn record_many(
        &mut self,
        at_us: u64,
        ios: u64,
        writes: u64,
        bytes: u64,
        latency_us_sum: u64,
        latency_us_max: u64,
        excess_us_sum: u64,
    ) -> bool {
        let Some(b) = self.bucket(at_us) else {
            return false;
        };
        b.ios = b.ios.saturating_add(ios);
        b.writes = b.writes.saturating_add(writes.min(ios));
        b.bytes = b.bytes.saturating_add(bytes);
        b.latency_us_sum = b.latency_us_sum.saturating_add(latency_us_sum);
        b.latency_us_max = b.latency_us_max.max(latency_us_max);
        b.excess_us_sum = b.excess_us_sum.saturating_add(excess_us_sum);
        true
    }

    /// The window's totals and rates as of `now_us`.
    pub fn stats(&self, now_us: u64) -> WindowStats {
        let now_slot = slot(now_us, self.bucket_us).max(self.head_slot);
        let oldest = (now_slot + 1).saturating_sub(WINDOW_BUCKETS as u64);
        let mut t = Bucket::default();
        for b in self
            .buckets
            .iter()
            .filter(|b| b.ios > 0 && b.slot >= oldest && b.slot <= now_slot)
        {
            t.ios += b.ios;
            t.writes += b.writes;
            t.bytes = t.bytes.saturating_add(b.bytes);
            t.latency_us_sum = t.latency_us_sum.saturating_add(b.latency_us_sum);
            t.latency_us_max = t.latency_us_max.max(b.latency_us_max);
            t.excess_us_sum = t.excess_us_sum.saturating_add(b.excess_us_sum);
        }
        // The span covered: the full buckets before the current one, plus
        // what has passed of the current one.
        let into_current = now_us.saturating_sub(now_slot * self.bucket_us);
        let covered_us = ((WINDOW_BUCKETS as u64 - 1) * self.bucket_us + into_current).max(1);
        #[allow(clippy::cast_precision_loss)]
        let (ios, covered_s) = (t.ios as f64, covered_us as f64 / 1e6);
        #[allow(clippy::cast_precision_loss)]
        WindowStats {
            ios: t.ios,
            bytes: t.bytes,
            iops: ios / covered_s,
            bytes_per_sec: t.bytes as f64 / covered_s,
            latency_us_mean: if t.ios == 0 {
                0.0
            } else {
                t.latency_us_sum as f64 / ios
            },
            latency_us_max: t.latency_us_max,
            queue_delay_us_mean: if t.ios == 0 {
                0.0
            } else {
                t.excess_us_sum as f64 / ios
            },
            write_share: if t.ios == 0 {
                0.0
            } else {
                t.writes as f64 / ios
            },
        }
    }

    /// Folds the current rates into the EWMA with weight `alpha` (0..=1)
    /// and returns it. Called once per epoch.
    pub fn fold_ewma(&mut self, now_us: u64, alpha: f64) -> WindowStats {
        let cur = self.stats(now_us);
        let next = match self.ewma {
            None => cur,
            Some(e) => {
                let mix = |old: f64, new: f64| old + alpha * (new - old);
                WindowStats {
                    iops: mix(e.iops, cur.iops),
                    bytes_per_sec: mix(e.bytes_per_sec, cur.bytes_per_sec),
                    latency_us_mean: mix(e.latency_us_mean, cur.latency_us_mean),
                    queue_delay_us_mean: mix(e.queue_delay_us_mean, cur.queue_delay_us_mean),
                    write_share: mix(e.write_share, cur.write_share),
                    ..cur
                }
            }
        };
        self.ewma = Some(next);
        next
    }

    /// The EWMA as last folded.
    pub fn ewma(&self) -> Option<WindowStats> {
        self.ewma
    }

    /// Whether the window holds no sample as of `now_us`.
    pub fn is_idle(&self, now_us: u64) -> bool {
        self.stats(now_us).ios == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_cover_the_span_and_old_samples_age_out() {
        let mut w = Window::new(1_000_000); // 10 buckets of 100 ms
        for i in 0..100u64 {
            // 100 I/Os of 4 KiB over the first second
            assert!(w.record(i * 10_000, 4096, 100, 20, i % 4 == 0));
        }
        let s = w.stats(999_999);
        assert_eq!(s.ios, 100);
        assert!((s.iops - 100.0).abs() < 1.0, "{s:?}");
        assert!((s.bytes_per_sec - 409_600.0).abs() < 5000.0, "{s:?}");
        assert!((s.latency_us_mean - 100.0).abs() < 1e-9);
        assert!((s.queue_delay_us_mean - 20.0).abs() < 1e-9);
        assert!((s.write_share - 0.25).abs() < 1e-9);
        // Half a span later, half the samples are gone.
        let s = w.stats(1_500_000);
        assert!(s.ios < 100 && s.ios >= 40, "{s:?}");
        // Two spans later, none.
        assert!(w.is_idle(3_000_000));
    }

    #[test]
    fn a_late_sample_counts_in_its_own_bucket_and_a_too_old_one_is_dropped() {
        let mut w = Window::new(1_000_000);
        assert!(w.record(2_000_000, 1, 1, 0, false));
        assert!(w.record(1_950_000, 1, 1, 0, false)); // late, within span
        assert!(!w.record(500_000, 1, 1, 0, false)); // older than the span
        assert_eq!(w.stats(2_000_000).ios, 2);
    }

    #[test]
    fn ewma_moves_towards_the_current_rate() {
        let mut w = Window::new(1_000_000);
        w.record(0, 1000, 10, 0, false);
        let a = w.fold_ewma(100_000, 0.5);
        for i in 0..10 {
            w.record(200_000 + i, 1000, 10, 0, false);
        }
        let b = w.fold_ewma(300_000, 0.5);
        let cur = w.stats(300_000);
        assert!(b.bytes_per_sec > a.bytes_per_sec && b.bytes_per_sec < cur.bytes_per_sec);
    }

    proptest::proptest! {
        #[test]
        fn stats_never_count_more_than_was_recorded(
            samples in proptest::collection::vec((0u64..5_000_000, 0u64..1_000_000, 0u64..10_000), 0..200),
            now in 0u64..6_000_000,
        ) {
            let mut w = Window::new(1_000_000);
            let mut kept = 0u64;
            for (at, bytes, lat) in &samples {
                kept += u64::from(w.record(*at, *bytes, *lat, 0, false));
            }
            let s = w.stats(now);
            proptest::prop_assert!(s.ios <= kept);
            proptest::prop_assert!(s.iops.is_finite() && s.bytes_per_sec.is_finite());
            proptest::prop_assert!(s.latency_us_max <= 10_000);
        }
    }
}
