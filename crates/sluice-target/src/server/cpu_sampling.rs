//! When a worker reads its thread CPU clock for i-NVMe accounting, and how
//! much of a reading is idle spin charged to no one. Sans-IO: the worker
//! passes its clock readings and poll outcomes in.
//!
//! The clock is a syscall (770-810 ns here; no vDSO serves CPU clocks, and
//! this VM's perf_event page has no `cap_user_time`), so the loop reads it
//! only where a batch ends or begins, never on an idle turn (one at least
//! every [`IDLE_INTERVAL`] bounds what an idle spell leaves unread).
//!
//! A batch that starts after an idle spin does not read it at its start,
//! where the reading would delay the batch's response (about 3 % of a
//! QD 1 round trip). Its one reading comes after it, and that reading's
//! delta holds the idle spin before the batch too: the loop spun without
//! sleeping since the previous reading, so that spin's CPU is its wall
//! time, and that part of the delta goes to no one. Were the worker
//! preempted during that spin, the batch would be undercharged by at most
//! the spin's wall time, which [`IDLE_INTERVAL`] bounds. A batch that
//! starts after an epoll wait that could sleep reads the clock first, as
//! the wall time there is not CPU time.
//!
//! Back-to-back batches (a worker kept busy, as at QD 32) share one
//! reading per [`BUSY_INTERVAL`]: the CPU of the turns between two readings
//! is split among the tenants by the work units of all of them, as one
//! batch's is. The first turn that does no work after them reads at once,
//! so of the idle spin that follows a busy spell only that one turn is
//! charged to the spell's tenants.

use std::time::{Duration, Instant};

/// The longest a spinning worker goes without reading its thread CPU clock:
/// the most of an idle spin that a batch can be charged for (one that
/// starts without an event, a timer's) or that a deferred reading counts
/// as idle.
const IDLE_INTERVAL: Duration = Duration::from_micros(50);

/// The longest a busy worker defers its reading: consecutive working
/// turns within it share one. It bounds how late a CPU throttle starts
/// (a period is at least 1 ms) and how coarsely a spell's CPU is split.
const BUSY_INTERVAL: Duration = Duration::from_micros(50);

/// What a turn does about the CPU clock, after its poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CpuRead {
    /// No reading this turn.
    Skip,
    /// Read the clock; the first `idle` of the CPU since the last reading
    /// was idle spin, charged to no one.
    Read { idle: Duration },
}

/// The worker's CPU clock schedule.
#[derive(Debug)]
pub(super) struct CpuSampling {
    /// When the clock was last read.
    read_at: Instant,
    /// An epoll wait that could sleep happened since the last reading.
    waited: bool,
    /// The idle spin a batch that deferred its start reading left before
    /// it, to take out of the next reading.
    idle_before_batch: Option<Duration>,
    /// A working turn since the last reading was left for a later one.
    unread_work: bool,
}

impl CpuSampling {
    pub(super) fn new(now: Instant) -> Self {
        CpuSampling {
            read_at: now,
            waited: false,
            idle_before_batch: None,
            unread_work: false,
        }
    }

    /// Before the turn's poll, with the timeout it polls with (`None`
    /// waits without limit).
    pub(super) fn will_poll(&mut self, timeout: Option<Duration>) {
        if timeout != Some(Duration::ZERO) {
            self.waited = true;
        }
    }

    /// After the turn's poll at `now`: `after_work` when the previous turn
    /// worked (a batch may end here), `events` when the poll returned any
    /// (a batch begins).
    pub(super) fn after_poll(&mut self, now: Instant, after_work: bool, events: bool) -> CpuRead {
        let since_read = now.saturating_duration_since(self.read_at);
        if after_work && !self.waited && since_read < BUSY_INTERVAL {
            // Still busy: the next reading counts this turn too.
            self.unread_work = true;
            return CpuRead::Skip;
        }
        if !after_work && self.unread_work {
            // The first idle turn after a busy spell closes it.
            return self.read(now);
        }
        if !after_work && events && !self.waited {
            // A batch starts after an idle spin: read at its end instead.
            self.idle_before_batch = Some(since_read);
            return CpuRead::Skip;
        }
        if after_work || events || since_read >= IDLE_INTERVAL {
            return self.read(now);
        }
        CpuRead::Skip
    }

    fn read(&mut self, now: Instant) -> CpuRead {
        self.read_at = now;
        self.waited = false;
        self.unread_work = false;
        CpuRead::Read {
            idle: self.idle_before_batch.take().unwrap_or(Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Option<Duration> = Some(Duration::ZERO);

    /// A worker's turns against a virtual clock starting at `t0`.
    struct Turns {
        s: CpuSampling,
        t0: Instant,
    }

    impl Turns {
        fn new() -> Self {
            let t0 = Instant::now();
            Turns {
                s: CpuSampling::new(t0),
                t0,
            }
        }

        /// One turn: a poll with `timeout`, returning at `at_us`.
        fn turn(
            &mut self,
            timeout: Option<Duration>,
            at_us: u64,
            after_work: bool,
            events: bool,
        ) -> CpuRead {
            self.s.will_poll(timeout);
            self.s
                .after_poll(self.t0 + Duration::from_micros(at_us), after_work, events)
        }
    }

    fn read(idle_us: u64) -> CpuRead {
        CpuRead::Read {
            idle: Duration::from_micros(idle_us),
        }
    }

    /// QD 1 on a spinning worker: idle turns read nothing, the batch's own
    /// turn reads nothing, and the first idle turn after it reads with the
    /// spin before the batch marked idle.
    #[test]
    fn a_batch_after_a_spin_reads_once_at_its_end() {
        let mut w = Turns::new();
        // The start-up turn counts as work; the idle turn after it reads.
        assert_eq!(w.turn(SPIN, 0, true, false), CpuRead::Skip);
        assert_eq!(w.turn(SPIN, 1, false, false), read(0));
        for i in 2..10 {
            assert_eq!(w.turn(SPIN, i, false, false), CpuRead::Skip);
        }
        assert_eq!(w.turn(SPIN, 12, false, true), CpuRead::Skip, "deferred");
        assert_eq!(w.turn(SPIN, 20, true, false), CpuRead::Skip, "busy");
        assert_eq!(
            w.turn(SPIN, 21, false, false),
            read(11),
            "the batch's reading counts the 11 µs of spin before it as idle"
        );
        assert_eq!(w.turn(SPIN, 22, false, false), CpuRead::Skip);
    }

    /// Idle turns read at least every IDLE_INTERVAL, so a deferred batch
    /// never counts more idle than that.
    #[test]
    fn idle_spin_reads_every_interval() {
        let mut w = Turns::new();
        assert_eq!(w.turn(SPIN, 49, false, false), CpuRead::Skip);
        assert_eq!(w.turn(SPIN, 50, false, false), read(0));
        assert_eq!(w.turn(SPIN, 95, false, true), CpuRead::Skip);
        assert_eq!(w.turn(SPIN, 99, true, true), CpuRead::Skip, "busy");
        assert_eq!(w.turn(SPIN, 101, true, true), read(45));
    }

    /// After a wait that could sleep, wall time is not CPU time: the batch
    /// reads at its start, and its end reading counts nothing as idle.
    #[test]
    fn a_batch_after_a_sleep_reads_at_its_start() {
        let mut w = Turns::new();
        assert_eq!(
            w.turn(Some(Duration::from_micros(800)), 700, false, true),
            read(0)
        );
        assert_eq!(w.turn(SPIN, 710, true, false), CpuRead::Skip, "busy");
        assert_eq!(w.turn(SPIN, 711, false, false), read(0));
        // An unbounded wait counts as one that could sleep.
        assert_eq!(w.turn(None, 900, false, true), read(0));
    }

    /// Back-to-back batches (QD 32) share one reading per BUSY_INTERVAL;
    /// the first idle turn after them reads at once.
    #[test]
    fn busy_turns_share_a_reading_per_interval() {
        let mut w = Turns::new();
        assert_eq!(w.turn(SPIN, 0, true, false), CpuRead::Skip);
        assert_eq!(w.turn(SPIN, 1, false, false), read(0));
        let mut reads = 0;
        for i in 2..=501 {
            if w.turn(SPIN, i, true, true) != CpuRead::Skip {
                reads += 1;
            }
        }
        assert_eq!(reads, 10, "one reading per 50 µs of 500 µs of busy turns");
        assert_eq!(w.turn(SPIN, 502, true, false), CpuRead::Skip);
        assert_eq!(w.turn(SPIN, 503, false, false), read(0), "the spell ends");
        assert_eq!(w.turn(SPIN, 504, false, false), CpuRead::Skip);
    }

    /// A busy turn after a wait that could sleep reads: wall time there
    /// is not CPU time, and an interrupt-mode worker waits after each turn.
    #[test]
    fn a_busy_turn_after_a_sleep_reads() {
        let mut w = Turns::new();
        let wait = Some(Duration::from_micros(800));
        assert_eq!(w.turn(wait, 5, true, true), read(0));
        assert_eq!(w.turn(wait, 10, true, true), read(0));
    }
}
