//! A detector of stalls that no thread of the experiment causes: the
//! hypervisor descheduling a vCPU (or a long interrupts-off section in the
//! guest kernel). On this VM a vCPU vanishes for 2-5 ms about once a
//! second; perf's sampling shows no sample at all, idle or kernel, on a CPU
//! that a spinning thread otherwise fills. Such a stall delays whatever
//! I/O is in flight, with or without any scheduler; tail percentiles can be
//! taken with and without the I/Os it touched, to see how much of a tail
//! it makes (for Fig. 10, little: docs/experiments/eio-fig10.md).
//!
//! One thread per CPU, pinned to it and real-time (`SCHED_FIFO`, so that no
//! thread of ours delays its wake-up), sleeps `period` in a loop. A wake-up
//! later than `late_min` marks the whole sleep as stalled: the CPU was
//! somewhere inside it unavailable for at least the lateness. Without
//! permission for `SCHED_FIFO` the threads still run, but their lateness
//! then includes our own load, so [`Stalls::realtime`] is false and callers
//! must not exclude anything by it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Stall intervals recorded per CPU, at most (a run of minutes at one
/// stall a second needs a few hundred).
pub const STALLS_PER_CPU_MAX: usize = 1 << 16;

/// A span of time a CPU was unavailable: from a detector's sleep to its
/// late wake-up.
type Span = (Instant, Instant);

/// Running detector threads; [`StallDetector::stop`] collects them.
pub struct StallDetector {
    stop: Arc<AtomicBool>,
    /// Each thread's spans, and whether it ran real-time.
    threads: Vec<JoinHandle<(Vec<Span>, bool)>>,
}

/// What the detector saw: merged stall intervals, sorted by start.
#[derive(Debug, Default, Clone)]
pub struct Stalls {
    intervals: Vec<Span>,
    /// Every detector thread ran as `SCHED_FIFO`.
    pub realtime: bool,
}

impl StallDetector {
    /// Starts one detector per CPU in `0..cpus`.
    pub fn start(cpus: usize, period: Duration, late_min: Duration) -> StallDetector {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..cpus)
            .filter_map(|cpu| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("lab-stall-{cpu}"))
                    .spawn(move || watch(cpu, period, late_min, &stop))
                    .ok()
            })
            .collect();
        StallDetector { stop, threads }
    }

    /// Stops the threads and merges what they saw.
    pub fn stop(self) -> Stalls {
        self.stop.store(true, Ordering::Relaxed);
        let mut realtime = !self.threads.is_empty();
        let mut intervals = Vec::new();
        for t in self.threads {
            match t.join() {
                Ok((seen, rt)) => {
                    realtime &= rt;
                    intervals.extend(seen);
                }
                Err(_) => realtime = false,
            }
        }
        Stalls::merged(intervals, realtime)
    }
}

/// One CPU's detector loop.
fn watch(cpu: usize, period: Duration, late_min: Duration, stop: &AtomicBool) -> (Vec<Span>, bool) {
    let pinned = sluice_runtime::affinity::pin_thread(0, cpu).is_ok();
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads `param` only; 0 is the calling thread.
    let fifo = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) } == 0;
    let mut seen = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let asleep = Instant::now();
        std::thread::sleep(period);
        let woke = Instant::now();
        if woke.duration_since(asleep) > period + late_min && seen.len() < STALLS_PER_CPU_MAX {
            seen.push((asleep, woke));
        }
    }
    (seen, pinned && fifo)
}

impl Stalls {
    fn merged(mut intervals: Vec<Span>, realtime: bool) -> Stalls {
        intervals.sort_unstable();
        let mut out: Vec<Span> = Vec::with_capacity(intervals.len());
        for (a, b) in intervals {
            match out.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        Stalls {
            intervals: out,
            realtime,
        }
    }

    /// Whether `[start, end]` overlaps a stall.
    pub fn overlaps(&self, start: Instant, end: Instant) -> bool {
        // The first interval that ends at or after `start`.
        let i = self.intervals.partition_point(|(_, b)| *b < start);
        self.intervals.get(i).is_some_and(|(a, _)| *a <= end)
    }

    /// Stalls seen (after merging).
    pub fn count(&self) -> usize {
        self.intervals.len()
    }

    /// Time covered by stalls.
    pub fn total(&self) -> Duration {
        self.intervals
            .iter()
            .map(|(a, b)| b.duration_since(*a))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_intervals_merge_and_overlap_is_inclusive() {
        let t = Instant::now();
        let ms = |n: u64| t + Duration::from_millis(n);
        let s = Stalls::merged(vec![(ms(10), ms(12)), (ms(1), ms(3)), (ms(2), ms(5))], true);
        assert_eq!(s.count(), 2);
        assert_eq!(s.total(), Duration::from_millis(6));
        assert!(s.overlaps(ms(0), ms(1)), "touches the first stall's start");
        assert!(s.overlaps(ms(4), ms(6)));
        assert!(!s.overlaps(ms(6), ms(9)), "between the two stalls");
        assert!(s.overlaps(ms(9), ms(20)));
        assert!(s.overlaps(ms(12), ms(13)), "touches the second stall's end");
        assert!(!s.overlaps(ms(13), ms(14)));
    }

    #[test]
    fn a_detector_stops_and_reports_whether_it_was_realtime() {
        let d = StallDetector::start(1, Duration::from_millis(1), Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
        let s = d.stop();
        // A 10 s lateness threshold is never reached in 20 ms.
        assert_eq!(s.count(), 0);
        assert_eq!(s.total(), Duration::ZERO);
    }
}
