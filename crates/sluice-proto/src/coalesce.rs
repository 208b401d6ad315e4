//! Completion coalescing: Algorithm 1 of "Enhancing NVMe Storage Performance
//! with Latency-Aware User Layer Semantics and Dynamically Adjusted Timeouts"
//! (`docs/isolation.md`).
//!
//! Sans-IO: the owner reports each command's start ([`Coalescer::submitted`],
//! with its [`Hint`]) and completion ([`Coalescer::completed`]), and gets a
//! [`Decision`] back: deliver this completion now, hold it, or deliver every
//! held completion plus this one ("fire an interrupt"). Held completions are
//! released by [`Coalescer::poll`] at [`Coalescer::next_deadline`]. The target
//! uses it for CapsuleResps (a fire = one flush to the host); the host uses it
//! for waking waiting tasks (a fire = one batch of wake-ups).
//!
//! Modes:
//! * `Off`: every completion is delivered at once (one notification each).
//! * `Static`: NVMe style: deliver when `threshold` completions are held, or
//!   `timeout` after the first held one.
//! * `Adaptive`: Algorithm 1 without hints: the timer is re-armed at every
//!   arrival to Δ = e^(a·(thr − coalesced)) − 1 µs, so it shrinks as the
//!   batch fills; `threshold` still fires at once.
//! * `Calibrated`: `Adaptive` plus per-I/O hints: an urgent completion is
//!   delivered at once (alone when `urgent_out_of_order`, else with every held
//!   one); a barrier fires once it and every earlier command have completed.
//! * `CalibratedFixed`: `Calibrated` with a fixed Δ (`timeout`, re-armed at
//!   every arrival) instead of the correction formula: the paper's "cint"
//!   without its correction factor, kept for the Fig. 8 comparison.
//!
//! Nothing is held longer than `hold_max` after the first held completion,
//! whatever the arrival pattern (a stream of urgent completions re-arms the
//! adaptive timer but cannot starve held ones).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// What the submitter said about one I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Hint {
    #[default]
    Normal,
    /// Complete at once (DSM Access Latency = low, CDW13 bits 5:4 = 11b).
    Urgent,
    /// Complete once this and every earlier command are done (CDW13 bit 8).
    Barrier,
}

/// CDW13 bits 5:4 = 11b: DSM Access Latency "low" (urgent).
pub const CDW13_URGENT_MASK: u32 = 0x30;
/// CDW13 bit 8 (reserved in Read/Write; Sluice's barrier).
pub const CDW13_BARRIER_BIT: u32 = 0x100;

impl Hint {
    /// The hint carried in a Read/Write CDW13 (see docs/host.md). Urgent wins
    /// when both are set.
    pub fn from_cdw13(cdw13: u32) -> Hint {
        if cdw13 & CDW13_URGENT_MASK == CDW13_URGENT_MASK {
            Hint::Urgent
        } else if cdw13 & CDW13_BARRIER_BIT != 0 {
            Hint::Barrier
        } else {
            Hint::Normal
        }
    }
}

/// Coalescing mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CoalesceMode {
    #[default]
    Off,
    Static,
    Adaptive,
    Calibrated,
    CalibratedFixed,
}

impl std::str::FromStr for CoalesceMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(CoalesceMode::Off),
            "static" => Ok(CoalesceMode::Static),
            "adaptive" => Ok(CoalesceMode::Adaptive),
            "calibrated" => Ok(CoalesceMode::Calibrated),
            "calibrated-fixed" => Ok(CoalesceMode::CalibratedFixed),
            o => Err(format!(
                "`{o}` is not one of off, static, adaptive, calibrated, calibrated-fixed"
            )),
        }
    }
}

impl CoalesceMode {
    pub fn name(self) -> &'static str {
        match self {
            CoalesceMode::Off => "off",
            CoalesceMode::Static => "static",
            CoalesceMode::Adaptive => "adaptive",
            CoalesceMode::Calibrated => "calibrated",
            CoalesceMode::CalibratedFixed => "calibrated-fixed",
        }
    }

    /// Whether per-I/O hints (urgent, barrier) are honoured.
    pub fn uses_hints(self) -> bool {
        matches!(
            self,
            CoalesceMode::Calibrated | CoalesceMode::CalibratedFixed
        )
    }
}

/// Parameters of a [`Coalescer`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoalesceConfig {
    pub mode: CoalesceMode,
    /// Held completions that fire at once (`thr`).
    pub threshold: u32,
    /// `Static`: aggregation time from the first held completion;
    /// `CalibratedFixed`: the fixed Δ, re-armed at every arrival.
    pub timeout: Duration,
    /// `Adaptive`/`Calibrated`: correction factor `a` (paper: 0.1).
    pub correction: f64,
    /// Urgent completions bypass held ones (paper: "out-of-order processing
    /// enabled"); otherwise an urgent completion flushes everything.
    pub urgent_out_of_order: bool,
    /// Hard bound on how long any completion is held.
    pub hold_max: Duration,
}

impl Default for CoalesceConfig {
    fn default() -> Self {
        CoalesceConfig {
            mode: CoalesceMode::Off,
            threshold: 16,
            timeout: Duration::from_micros(20),
            correction: 0.1,
            urgent_out_of_order: true,
            hold_max: Duration::from_millis(1),
        }
    }
}

impl CoalesceConfig {
    /// Checks the parameters; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.threshold == 0 {
            return Err(("threshold", "must be at least 1".into()));
        }
        if matches!(
            self.mode,
            CoalesceMode::Static | CoalesceMode::CalibratedFixed
        ) && self.timeout.is_zero()
        {
            return Err((
                "timeout_us",
                "must be greater than 0 (use mode = \"off\" to deliver at once)".into(),
            ));
        }
        if !(self.correction.is_finite() && self.correction > 0.0 && self.correction <= 10.0) {
            return Err(("correction", "must be in (0, 10]".into()));
        }
        if self.hold_max.is_zero() {
            return Err(("hold_max_us", "must be greater than 0".into()));
        }
        Ok(())
    }

    /// Δ(thr, coalesced) = e^(a·(thr − coalesced)) − 1, in microseconds.
    pub fn delta(&self, coalesced: u32) -> Duration {
        let x = self.correction * (self.threshold as f64 - coalesced as f64);
        let us = (x.exp() - 1.0).max(0.0);
        // In 0.0..=1e12 (NaN saturates to 0): the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ns = (us * 1000.0).min(1e12) as u64;
        Duration::from_nanos(ns)
    }
}

/// Why held completions were released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireReason {
    Threshold,
    Timeout,
    Urgent,
    Barrier,
    HoldMax,
}

/// What to do with a completion that just arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Deliver this completion alone, now (mode off, or urgent out of order);
    /// held ones stay held.
    Deliver,
    /// Keep it until a later fire.
    Hold,
    /// Deliver every held completion and this one.
    FlushAll(FireReason),
}

/// Counters of one coalescer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalesceStats {
    pub(crate) completions: u64,
    /// Deliveries (interrupts / wake-up batches).
    pub(crate) notifications: u64,
    pub(crate) fired_threshold: u64,
    pub(crate) fired_timeout: u64,
    pub(crate) fired_urgent: u64,
    pub(crate) fired_barrier: u64,
    pub(crate) fired_hold_max: u64,
    /// Sum over delivered completions of the time they were held.
    pub(crate) held_ns: u64,
}

/// Algorithm 1 as a sans-IO state machine.
#[derive(Debug, Clone)]
pub struct Coalescer {
    cfg: CoalesceConfig,
    /// Normal completions held (`coalesced`).
    coalesced: u32,
    /// Arrival times of every held completion (normal and waiting barriers).
    held_since: Vec<Instant>,
    timeout: Option<Instant>,
    next_seq: u64,
    /// key → (submission order, hint), for commands in flight.
    inflight: HashMap<u64, (u64, Hint)>,
    /// Submission order of in-flight commands (calibrated mode).
    outstanding: BTreeSet<u64>,
    /// Completed barriers waiting for earlier commands.
    waiting_barriers: BTreeSet<u64>,
    stats: CoalesceStats,
}

impl Coalescer {
    pub fn new(cfg: CoalesceConfig) -> Self {
        Coalescer {
            cfg,
            coalesced: 0,
            held_since: Vec::new(),
            timeout: None,
            next_seq: 0,
            inflight: HashMap::new(),
            outstanding: BTreeSet::new(),
            waiting_barriers: BTreeSet::new(),
            stats: CoalesceStats::default(),
        }
    }

    pub fn config(&self) -> &CoalesceConfig {
        &self.cfg
    }

    pub fn stats(&self) -> CoalesceStats {
        self.stats
    }

    /// Completions currently held.
    pub fn held(&self) -> usize {
        self.held_since.len()
    }

    /// A command identified by `key` (unique among in-flight commands) started.
    pub fn submitted(&mut self, key: u64, hint: Hint) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let hint = if self.cfg.mode.uses_hints() {
            hint
        } else {
            Hint::Normal
        };
        if let Some((old, _)) = self.inflight.insert(key, (seq, hint)) {
            self.outstanding.remove(&old);
        }
        if self.cfg.mode.uses_hints() {
            self.outstanding.insert(seq);
        }
    }

    /// A command completed; unknown keys count as normal completions.
    pub fn completed(&mut self, key: u64, now: Instant) -> Decision {
        self.stats.completions += 1;
        let (seq, hint) = match self.inflight.remove(&key) {
            Some((s, h)) => (Some(s), h),
            None => (None, Hint::Normal),
        };
        if let Some(s) = seq {
            self.outstanding.remove(&s);
        }
        match self.cfg.mode {
            CoalesceMode::Off => {
                self.stats.notifications += 1;
                Decision::Deliver
            }
            CoalesceMode::Static => {
                if self.held_since.is_empty() {
                    self.timeout = Some(now + self.cfg.timeout);
                }
                self.coalesced += 1;
                self.held_since.push(now);
                if self.coalesced >= self.cfg.threshold {
                    return self.fire(FireReason::Threshold, now);
                }
                Decision::Hold
            }
            CoalesceMode::Adaptive | CoalesceMode::Calibrated | CoalesceMode::CalibratedFixed => {
                // Algorithm 1: re-arm with the count before this arrival
                // (or the fixed Δ).
                let delta = if self.cfg.mode == CoalesceMode::CalibratedFixed {
                    self.cfg.timeout
                } else {
                    self.cfg.delta(self.coalesced)
                };
                self.timeout = Some(now + delta);
                match hint {
                    Hint::Urgent if self.cfg.urgent_out_of_order => {
                        self.stats.notifications += 1;
                        self.stats.fired_urgent += 1;
                        self.after_completion(now).unwrap_or(Decision::Deliver)
                    }
                    Hint::Urgent => {
                        self.held_since.push(now);
                        self.fire(FireReason::Urgent, now)
                    }
                    Hint::Barrier => {
                        self.held_since.push(now);
                        let s = seq.unwrap_or(0);
                        if self.outstanding.range(..s).next().is_none() {
                            self.fire(FireReason::Barrier, now)
                        } else {
                            self.waiting_barriers.insert(s);
                            Decision::Hold
                        }
                    }
                    Hint::Normal => {
                        self.coalesced += 1;
                        self.held_since.push(now);
                        if self.coalesced >= self.cfg.threshold {
                            return self.fire(FireReason::Threshold, now);
                        }
                        self.after_completion(now).unwrap_or(Decision::Hold)
                    }
                }
            }
        }
    }

    /// A completion may have satisfied a waiting barrier.
    fn after_completion(&mut self, now: Instant) -> Option<Decision> {
        let b = *self.waiting_barriers.first()?;
        if self.outstanding.range(..b).next().is_none() {
            return Some(self.fire(FireReason::Barrier, now));
        }
        None
    }

    fn fire(&mut self, why: FireReason, now: Instant) -> Decision {
        self.stats.notifications += 1;
        match why {
            FireReason::Threshold => self.stats.fired_threshold += 1,
            FireReason::Timeout => self.stats.fired_timeout += 1,
            FireReason::Urgent => self.stats.fired_urgent += 1,
            FireReason::Barrier => self.stats.fired_barrier += 1,
            FireReason::HoldMax => self.stats.fired_hold_max += 1,
        }
        for t in self.held_since.drain(..) {
            let held = now.saturating_duration_since(t).as_nanos();
            self.stats.held_ns += u64::try_from(held).unwrap_or(u64::MAX);
        }
        self.coalesced = 0;
        self.timeout = None;
        self.waiting_barriers.clear();
        Decision::FlushAll(why)
    }

    /// Fires on the timer; returns the reason when held completions must be
    /// delivered now.
    pub fn poll(&mut self, now: Instant) -> Option<FireReason> {
        if self.held_since.is_empty() {
            return None;
        }
        if let Some(first) = self.held_since.first() {
            if now >= *first + self.cfg.hold_max {
                self.fire(FireReason::HoldMax, now);
                return Some(FireReason::HoldMax);
            }
        }
        match self.timeout {
            Some(t) if now >= t => {
                self.fire(FireReason::Timeout, now);
                Some(FireReason::Timeout)
            }
            _ => None,
        }
    }

    /// When [`Self::poll`] must run next (only while something is held).
    pub fn next_deadline(&self) -> Option<Instant> {
        let first = *self.held_since.first()?;
        let cap = first + self.cfg.hold_max;
        Some(self.timeout.map_or(cap, |t| t.min(cap)))
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod tests {
    use super::*;

    fn cfg(mode: CoalesceMode) -> CoalesceConfig {
        CoalesceConfig {
            mode,
            threshold: 4,
            timeout: Duration::from_micros(20),
            correction: 0.5,
            urgent_out_of_order: true,
            hold_max: Duration::from_micros(500),
        }
    }
    const US: Duration = Duration::from_micros(1);

    #[test]
    fn hints_from_cdw13() {
        assert_eq!(Hint::from_cdw13(0), Hint::Normal);
        assert_eq!(
            Hint::from_cdw13(0x20),
            Hint::Normal,
            "access latency normal"
        );
        assert_eq!(Hint::from_cdw13(0x30), Hint::Urgent);
        assert_eq!(Hint::from_cdw13(0x100), Hint::Barrier);
        assert_eq!(Hint::from_cdw13(0x130), Hint::Urgent);
    }

    #[test]
    fn off_delivers_each() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(cfg(CoalesceMode::Off));
        for k in 0..5 {
            c.submitted(k, Hint::Normal);
            assert_eq!(c.completed(k, t0), Decision::Deliver);
        }
        assert_eq!(c.next_deadline(), None);
        assert_eq!(c.stats().notifications, 5);
    }

    #[test]
    fn static_threshold_and_timeout_exact() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(cfg(CoalesceMode::Static));
        for k in 0..3 {
            assert_eq!(c.completed(k, t0 + k as u32 * US), Decision::Hold);
        }
        // Timeout counts from the first held completion.
        assert_eq!(c.next_deadline(), Some(t0 + 20 * US));
        assert_eq!(
            c.completed(3, t0 + 5 * US),
            Decision::FlushAll(FireReason::Threshold)
        );
        assert_eq!(c.held(), 0);
        assert_eq!(c.completed(4, t0 + 10 * US), Decision::Hold);
        assert_eq!(c.poll(t0 + 29 * US), None, "one microsecond early");
        assert_eq!(c.poll(t0 + 30 * US), Some(FireReason::Timeout));
        assert_eq!(c.next_deadline(), None);
        assert_eq!(c.stats().notifications, 2);
        assert_eq!(
            c.stats().held_ns,
            (5 + 4 + 3 + 20) * 1000,
            "3 held until the threshold, 1 until the timeout"
        );
    }

    #[test]
    fn adaptive_delta_follows_formula_and_rearms() {
        let k = cfg(CoalesceMode::Adaptive);
        // a = 0.5, thr = 4: Δ(0) = e^2 - 1 = 6.389 µs; Δ(4) = 0.
        assert_eq!(k.delta(0).as_nanos(), 6389);
        assert_eq!(k.delta(3).as_nanos(), 648);
        assert_eq!(k.delta(4), Duration::ZERO);
        let t0 = Instant::now();
        let mut c = Coalescer::new(k);
        assert_eq!(c.completed(1, t0), Decision::Hold);
        assert_eq!(c.next_deadline(), Some(t0 + k.delta(0)));
        let t1 = t0 + 3 * US;
        assert_eq!(c.completed(2, t1), Decision::Hold);
        // Re-armed at the second arrival with coalesced = 1 (before it counts).
        assert_eq!(c.next_deadline(), Some(t1 + k.delta(1)));
        assert_eq!(c.poll(t1 + k.delta(1) - Duration::from_nanos(1)), None);
        assert_eq!(c.poll(t1 + k.delta(1)), Some(FireReason::Timeout));
        // Hints are ignored in adaptive mode.
        c.submitted(9, Hint::Urgent);
        assert_eq!(c.completed(9, t1 + 100 * US), Decision::Hold);
    }

    #[test]
    fn calibrated_urgent_out_of_order_and_flush_all() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(cfg(CoalesceMode::Calibrated));
        c.submitted(1, Hint::Normal);
        c.submitted(2, Hint::Urgent);
        assert_eq!(c.completed(1, t0), Decision::Hold);
        assert_eq!(c.completed(2, t0), Decision::Deliver);
        assert_eq!(c.held(), 1, "the normal one stays held");
        let mut k = cfg(CoalesceMode::Calibrated);
        k.urgent_out_of_order = false;
        let mut c = Coalescer::new(k);
        c.submitted(1, Hint::Normal);
        c.submitted(2, Hint::Urgent);
        assert_eq!(c.completed(1, t0), Decision::Hold);
        assert_eq!(c.completed(2, t0), Decision::FlushAll(FireReason::Urgent));
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn calibrated_barrier_waits_for_earlier_commands() {
        let t0 = Instant::now();
        let mut k = cfg(CoalesceMode::Calibrated);
        k.threshold = 100;
        let mut c = Coalescer::new(k);
        c.submitted(1, Hint::Normal);
        c.submitted(2, Hint::Normal);
        c.submitted(3, Hint::Barrier);
        c.submitted(4, Hint::Normal); // later: not waited for
        assert_eq!(
            c.completed(3, t0),
            Decision::Hold,
            "1 and 2 still in flight"
        );
        assert_eq!(c.completed(2, t0), Decision::Hold);
        assert_eq!(c.completed(1, t0), Decision::FlushAll(FireReason::Barrier));
        assert_eq!(c.completed(4, t0), Decision::Hold);
        // A barrier with nothing earlier outstanding fires at once.
        c.submitted(5, Hint::Barrier);
        assert_eq!(c.completed(5, t0), Decision::FlushAll(FireReason::Barrier));
    }

    #[test]
    fn calibrated_fixed_rearms_a_constant_delta_and_keeps_hints() {
        let t0 = Instant::now();
        let k = cfg(CoalesceMode::CalibratedFixed);
        let mut c = Coalescer::new(k);
        assert_eq!(c.completed(1, t0), Decision::Hold);
        assert_eq!(c.next_deadline(), Some(t0 + 20 * US));
        let t1 = t0 + 7 * US;
        assert_eq!(c.completed(2, t1), Decision::Hold);
        assert_eq!(
            c.next_deadline(),
            Some(t1 + 20 * US),
            "re-armed to the same Δ, not shrunk by the count"
        );
        assert_eq!(c.poll(t1 + 19 * US), None);
        assert_eq!(c.poll(t1 + 20 * US), Some(FireReason::Timeout));
        // Hints are honoured as in calibrated mode.
        c.submitted(3, Hint::Normal);
        c.submitted(4, Hint::Barrier);
        assert_eq!(c.completed(4, t1), Decision::Hold, "3 still in flight");
        assert_eq!(c.completed(3, t1), Decision::FlushAll(FireReason::Barrier));
        c.submitted(5, Hint::Urgent);
        assert_eq!(c.completed(5, t1), Decision::Deliver);
        assert_eq!(
            "calibrated-fixed".parse(),
            Ok(CoalesceMode::CalibratedFixed)
        );
        let mut z = k;
        z.timeout = Duration::ZERO;
        assert_eq!(z.validate().unwrap_err().0, "timeout_us");
    }

    #[test]
    fn hold_max_bounds_urgent_streams() {
        let t0 = Instant::now();
        let mut k = cfg(CoalesceMode::Calibrated);
        k.correction = 5.0; // Δ(0) is huge
        let mut c = Coalescer::new(k);
        assert_eq!(c.completed(100, t0), Decision::Hold);
        for i in 0..1000u64 {
            c.submitted(i, Hint::Urgent);
            let now = t0 + (i as u32) * US;
            let _ = c.completed(i, now);
            if let Some(r) = c.poll(now) {
                assert_eq!(r, FireReason::HoldMax);
                assert_eq!(i, 500);
                return;
            }
        }
        panic!("held completion never released");
    }

    #[test]
    fn validation_names_fields() {
        let mut k = cfg(CoalesceMode::Static);
        k.timeout = Duration::ZERO;
        assert_eq!(k.validate().unwrap_err().0, "timeout_us");
        k = cfg(CoalesceMode::Adaptive);
        k.threshold = 0;
        assert_eq!(k.validate().unwrap_err().0, "threshold");
        k = cfg(CoalesceMode::Adaptive);
        k.correction = f64::NAN;
        assert_eq!(k.validate().unwrap_err().0, "correction");
    }
}
