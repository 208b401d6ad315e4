//! The eIO scheduler (Flint §4.5, Algorithm 2): a PIFO in the volume
//! client that decides which pending I/O goes to the drives next.
//!
//! **Admission.** Without a limit on what is in flight, every I/O would go
//! out at once and queue inside the target and the drive, where nothing can
//! reorder it. So each drive admits at most `drive_inflight_bytes_max`
//! bytes and `drive_inflight_ios_max` I/Os at a time (one I/O is always
//! admitted to an idle drive, however large), and the whole client at most
//! `inflight_ios_max` (its NetPipe). The rest wait here, where their order
//! is chosen. A small reserve beyond the byte cap
//! (`drive_small_reserve_bytes`) is open to small I/Os only: a 4 KiB read
//! behind a drive full of 128 KiB reads goes at once instead of waiting for
//! one of them to finish.
//!
//! **Passing a blocked head.** When the lowest-ranked I/O of a drive is a
//! large one that does not fit, small I/Os of other streams may go past it,
//! but only into the reserve: the small bytes in flight stay within
//! `drive_small_reserve_bytes`. Without this a 4 KiB read whose deadline is
//! later than that of a 128 KiB read that has waited long (a streamer at
//! QD 32 behind a small cap waits milliseconds) would wait for a large
//! completion it does not need. The large head loses nothing by it: a
//! large I/O's room is counted without the small bytes the reserve holds,
//! so small I/Os in flight do not take the cap from large ones; and one
//! larger than the cap, which used to wait for an idle drive, goes once no
//! other large I/O is in flight and the small bytes are within the reserve.
//!
//! **Rank.** An I/O's rank is its arrival time plus its estimated cost,
//! scaled:
//!
//! ```text
//! cost_us = (io_cost_us + bytes / drive_bytes_per_us × (write_cost if write))
//!           × (victim_penalty if its session is a victim in the last report)
//!           / stream weight
//! rank    = arrival_us + cost_scale × cost_us
//! ```
//!
//! The lowest rank goes first. A small I/O thus overtakes large ones that
//! arrived up to `cost_scale` times their cost difference before it; a
//! stream with a larger share of the bandwidth (its weight) pays less per
//! byte; and I/O on a path the shadow view reports congested is hedged, so
//! that the client's NetPipe budget goes to I/O that can complete. The rank
//! is a deadline: `cost_scale` is how many microseconds of waiting one
//! microsecond of cost is worth. Waiting ages an I/O for free, since
//! nothing that arrives after time `rank` can go before it: no I/O starves,
//! and none waits more than `cost_scale × cost` beyond what FIFO order
//! would give it (Algorithm 2's `aging()`).
//!
//! `cost_scale` matters. At 1 the rank is FIFO plus a small offset: a 4 KiB
//! read that arrives behind a queue of 128 KiB reads that have waited
//! milliseconds (as they do behind a streamer at QD 32) still waits for all
//! of them. That was measured: the victim's P50 moved from 4.2 to 4.1 ms.
//!
//! **Order within a stream** is kept: only the oldest pending I/O of each
//! stream is in the sort window; the next enters when it leaves (its rank
//! still counts from its own arrival). Completion needs no reordering: each
//! I/O's submitter is told directly.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Pending I/Os per scheduler, at most (callers block beyond it).
pub const PENDING_MAX: usize = 1 << 16;
/// Window entries looked at for a small I/O that may pass a drive's
/// blocked head (the window holds one entry per stream).
pub const PASS_SCAN_MAX: usize = 64;

/// A stream: I/Os whose relative order is kept (a volume's I/O to one
/// drive, by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamId(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoKind {
    Read,
    Write,
}

/// The scheduler's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EioConfig {
    pub drive_inflight_bytes_max: u64,
    /// Extra bytes in flight per drive open only to small I/Os (at most
    /// `small_io_bytes` each): a small read need not wait for a large one
    /// to finish before it may go; it then waits only on the drive.
    pub drive_small_reserve_bytes: u64,
    pub small_io_bytes: u64,
    pub drive_inflight_ios_max: u32,
    pub inflight_ios_max: u32,
    /// Fixed cost of any I/O.
    pub io_cost_us: f64,
    /// Service rate assumed for a drive the view has not measured.
    pub default_bytes_per_us: f64,
    /// Writes cost this many times a read of the same size.
    pub write_cost: f64,
    /// Cost multiplier for I/O of a victim session.
    pub victim_penalty: f64,
    /// Microseconds of waiting that one microsecond of estimated cost is
    /// worth in the rank (the deadline's slack).
    pub cost_scale: f64,
}

impl Default for EioConfig {
    fn default() -> Self {
        EioConfig {
            // Enough to keep a drive's channels busy with 128 KiB reads
            // (bandwidth x unloaded latency of an NVMe drive: about 1 GB/s
            // x 200 us), little enough that a small I/O waits for few.
            drive_inflight_bytes_max: 512 << 10,
            drive_small_reserve_bytes: 64 << 10,
            small_io_bytes: 16 << 10,
            drive_inflight_ios_max: 64,
            inflight_ios_max: 1024,
            io_cost_us: 10.0,
            default_bytes_per_us: 1000.0,
            write_cost: 2.0,
            victim_penalty: 4.0,
            // A 128 KiB read (141 us of cost at 1 GB/s) gets a 9 ms
            // deadline, a 4 KiB read 0.9 ms: the small read goes first
            // unless the large one has waited 8 ms already.
            cost_scale: 64.0,
        }
    }
}

impl EioConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.drive_inflight_bytes_max == 0
            || self.drive_inflight_ios_max == 0
            || self.inflight_ios_max == 0
        {
            return Err("eio: in-flight limits must be > 0".into());
        }
        for (name, v) in [
            ("io_cost_us", self.io_cost_us),
            ("default_bytes_per_us", self.default_bytes_per_us),
            ("write_cost", self.write_cost),
            ("victim_penalty", self.victim_penalty),
            ("cost_scale", self.cost_scale),
        ] {
            if !v.is_finite() || v <= 0.0 {
                return Err(format!("eio: {name} = {v} must be a finite number > 0"));
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Entry<T> {
    token: T,
    drive: u64,
    kind: IoKind,
    bytes: u64,
    arrival_us: u64,
    weight: f64,
}

#[derive(Debug, Default)]
struct DriveQ {
    /// Front entries of the streams to this drive, by (rank, sequence):
    /// their stream and size.
    window: BTreeMap<(u64, u64), (StreamId, u64)>,
    inflight_bytes: u64,
    inflight_ios: u32,
    /// Of the above: bytes of small I/Os, and the count of large ones.
    small_inflight_bytes: u64,
    large_inflight_ios: u32,
    bytes_per_us: Option<f64>,
    victim: bool,
}

#[derive(Debug)]
struct StreamQ<T> {
    queue: VecDeque<(u64, Entry<T>)>,
    /// The window key of the front entry.
    key: Option<(u64, u64)>,
}

/// One admitted I/O.
#[derive(Debug, PartialEq, Eq)]
pub struct Admitted<T> {
    pub token: T,
    pub stream: StreamId,
    pub drive: u64,
    pub bytes: u64,
    pub waited_us: u64,
}

/// What a scheduler holds now and has done since it was made (for
/// metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EioCounters {
    /// I/Os waiting now.
    pub pending: usize,
    /// I/Os admitted and not yet completed, over every drive.
    pub inflight_ios: u32,
    /// I/Os admitted.
    pub admitted: u64,
    /// Of those, small I/Os admitted past their drive's blocked large head
    /// (into the small-I/O reserve).
    pub passed_blocked_head: u64,
    /// Time the admitted I/Os waited from arrival to admission, summed.
    pub waited_us: u64,
}

/// The PIFO. `T` is whatever the caller needs to wake the submitter.
#[derive(Debug)]
pub struct EioScheduler<T> {
    cfg: EioConfig,
    drives: BTreeMap<u64, DriveQ>,
    streams: HashMap<StreamId, StreamQ<T>>,
    seq: u64,
    pending: usize,
    inflight_ios: u32,
    admitted: u64,
    passed_blocked_head: u64,
    waited_us: u64,
}

impl<T> EioScheduler<T> {
    pub fn new(cfg: EioConfig) -> Result<EioScheduler<T>, String> {
        cfg.check()?;
        Ok(EioScheduler {
            cfg,
            drives: BTreeMap::new(),
            streams: HashMap::new(),
            seq: 0,
            pending: 0,
            inflight_ios: 0,
            admitted: 0,
            passed_blocked_head: 0,
            waited_us: 0,
        })
    }

    pub fn config(&self) -> &EioConfig {
        &self.cfg
    }

    /// Sets what the shadow view says of a drive: its measured service rate
    /// (bytes per microsecond; `None` for the default) and whether this
    /// client's session to it is a victim. Applies to I/O ranked from now.
    pub fn set_drive_view(&mut self, drive: u64, bytes_per_us: Option<f64>, victim: bool) {
        let d = self.drives.entry(drive).or_default();
        d.bytes_per_us = bytes_per_us.filter(|r| r.is_finite() && *r > 0.0);
        d.victim = victim;
    }

    fn rank(&self, e: &Entry<T>) -> u64 {
        let d = self.drives.get(&e.drive);
        let rate = d
            .and_then(|d| d.bytes_per_us)
            .unwrap_or(self.cfg.default_bytes_per_us);
        #[allow(clippy::cast_precision_loss)]
        let transfer = e.bytes as f64 / rate;
        let mut cost = self.cfg.io_cost_us
            + transfer
                * match e.kind {
                    IoKind::Read => 1.0,
                    IoKind::Write => self.cfg.write_cost,
                };
        if d.is_some_and(|d| d.victim) {
            cost *= self.cfg.victim_penalty;
        }
        cost = cost / e.weight * self.cfg.cost_scale;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let cost = cost.clamp(0.0, 1e15) as u64;
        e.arrival_us.saturating_add(cost)
    }

    /// Queues an I/O. `weight` is the stream's share (1 for equal shares).
    /// Refused (the token handed back) when `PENDING_MAX` I/Os wait.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &mut self,
        now_us: u64,
        stream: StreamId,
        drive: u64,
        kind: IoKind,
        bytes: u64,
        weight: f64,
        token: T,
    ) -> Result<(), T> {
        if self.pending >= PENDING_MAX {
            return Err(token);
        }
        let weight = if weight.is_finite() && weight > 0.0 {
            weight
        } else {
            1.0
        };
        self.seq += 1;
        let entry = Entry {
            token,
            drive,
            kind,
            bytes,
            arrival_us: now_us,
            weight,
        };
        self.drives.entry(drive).or_default();
        let s = self.streams.entry(stream).or_insert_with(|| StreamQ {
            queue: VecDeque::new(),
            key: None,
        });
        s.queue.push_back((self.seq, entry));
        self.pending += 1;
        if s.key.is_none() {
            self.promote(stream);
        }
        Ok(())
    }

    /// Puts the front of `stream` into its drive's window.
    fn promote(&mut self, stream: StreamId) {
        let Some(s) = self.streams.get(&stream) else {
            return;
        };
        let Some((seq, front)) = s.queue.front() else {
            self.streams.remove(&stream);
            return;
        };
        let key = (self.rank(front), *seq);
        let (drive, bytes) = (front.drive, front.bytes);
        if let Some(s) = self.streams.get_mut(&stream) {
            s.key = Some(key);
        }
        self.drives
            .entry(drive)
            .or_default()
            .window
            .insert(key, (stream, bytes));
    }

    fn is_small(&self, bytes: u64) -> bool {
        bytes <= self.cfg.small_io_bytes
    }

    /// Whether an I/O of `bytes` at the head of `d`'s window may go.
    ///
    /// A small I/O fits within the cap plus the reserve. A large one fits
    /// within the cap, not counting the small bytes that the reserve holds;
    /// and one that never fits (larger than the cap) goes once it is the
    /// only large one, since small I/Os passing it may keep the drive from
    /// ever being idle.
    fn has_room(&self, d: &DriveQ, bytes: u64) -> bool {
        if d.inflight_ios == 0 {
            return true;
        }
        if d.inflight_ios >= self.cfg.drive_inflight_ios_max {
            return false;
        }
        let reserve = self.cfg.drive_small_reserve_bytes;
        if self.is_small(bytes) {
            let cap = self.cfg.drive_inflight_bytes_max.saturating_add(reserve);
            return d.inflight_bytes.saturating_add(bytes) <= cap;
        }
        let counted = d
            .inflight_bytes
            .saturating_sub(d.small_inflight_bytes.min(reserve));
        counted.saturating_add(bytes) <= self.cfg.drive_inflight_bytes_max
            || (d.large_inflight_ios == 0 && d.small_inflight_bytes <= reserve)
    }

    /// Whether a small I/O of `bytes` may pass the drive's blocked head:
    /// into the reserve only.
    fn may_pass(&self, d: &DriveQ, bytes: u64) -> bool {
        self.is_small(bytes)
            && d.inflight_ios < self.cfg.drive_inflight_ios_max
            && d.small_inflight_bytes.saturating_add(bytes) <= self.cfg.drive_small_reserve_bytes
            && d.inflight_bytes.saturating_add(bytes)
                <= self
                    .cfg
                    .drive_inflight_bytes_max
                    .saturating_add(self.cfg.drive_small_reserve_bytes)
    }

    /// The window key of the I/O that `d` would send now: its head if that
    /// fits, else the lowest-ranked small I/O that may pass a large head.
    fn candidate(&self, d: &DriveQ) -> Option<(u64, u64)> {
        let mut window = d.window.iter();
        let (key, &(_, bytes)) = window.next()?;
        if self.has_room(d, bytes) {
            return Some(*key);
        }
        // Only a large head is passed (a small one goes first when it
        // fits); nothing passes when the reserve is full.
        if self.is_small(bytes) || d.small_inflight_bytes >= self.cfg.drive_small_reserve_bytes {
            return None;
        }
        window
            .take(PASS_SCAN_MAX)
            .find(|(_, (_, b))| self.may_pass(d, *b))
            .map(|(k, _)| *k)
    }

    /// The next I/O to send, if one may go now: the lowest rank among the
    /// drives with room, while the client is under its own limit.
    pub fn poll_admit(&mut self, now_us: u64) -> Option<Admitted<T>> {
        if self.inflight_ios >= self.cfg.inflight_ios_max {
            return None;
        }
        let mut best: Option<((u64, u64), u64)> = None;
        for (id, d) in &self.drives {
            let Some(key) = self.candidate(d) else {
                continue;
            };
            if best.is_none_or(|(k, _)| key < k) {
                best = Some((key, *id));
            }
        }
        let (key, drive) = best?;
        let small_io_bytes = self.cfg.small_io_bytes;
        let d = self.drives.get_mut(&drive)?;
        let passed = d.window.keys().next() != Some(&key);
        let (stream, _) = d.window.remove(&key)?;
        let s = self.streams.get_mut(&stream)?;
        let (_, e) = s.queue.pop_front()?;
        s.key = None;
        d.inflight_bytes = d.inflight_bytes.saturating_add(e.bytes);
        d.inflight_ios += 1;
        if e.bytes <= small_io_bytes {
            d.small_inflight_bytes = d.small_inflight_bytes.saturating_add(e.bytes);
        } else {
            d.large_inflight_ios += 1;
        }
        self.inflight_ios += 1;
        self.pending -= 1;
        self.promote(stream);
        let waited_us = now_us.saturating_sub(e.arrival_us);
        self.admitted += 1;
        self.passed_blocked_head += u64::from(passed);
        self.waited_us = self.waited_us.saturating_add(waited_us);
        Some(Admitted {
            token: e.token,
            stream,
            drive,
            bytes: e.bytes,
            waited_us,
        })
    }

    /// An admitted I/O of `bytes` to `drive` completed.
    pub fn complete(&mut self, drive: u64, bytes: u64) {
        if let Some(d) = self.drives.get_mut(&drive) {
            debug_assert!(d.inflight_ios > 0, "completion without admission");
            d.inflight_ios = d.inflight_ios.saturating_sub(1);
            d.inflight_bytes = d.inflight_bytes.saturating_sub(bytes);
            if bytes <= self.cfg.small_io_bytes {
                d.small_inflight_bytes = d.small_inflight_bytes.saturating_sub(bytes);
            } else {
                d.large_inflight_ios = d.large_inflight_ios.saturating_sub(1);
            }
        }
        self.inflight_ios = self.inflight_ios.saturating_sub(1);
    }

    /// I/Os waiting.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// What the scheduler holds now and has done so far.
    pub fn counters(&self) -> EioCounters {
        EioCounters {
            pending: self.pending,
            inflight_ios: self.inflight_ios,
            admitted: self.admitted,
            passed_blocked_head: self.passed_blocked_head,
            waited_us: self.waited_us,
        }
    }

    /// I/Os in flight to `drive`.
    pub fn inflight(&self, drive: u64) -> (u32, u64) {
        self.drives
            .get(&drive)
            .map_or((0, 0), |d| (d.inflight_ios, d.inflight_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched() -> EioScheduler<u32> {
        EioScheduler::new(EioConfig {
            drive_inflight_bytes_max: 256 << 10,
            ..EioConfig::default()
        })
        .expect("config")
    }

    /// `n` 4 KiB reads to drive 7 arriving at `at_us`, each its own
    /// stream (100, 101, ...) and token (the same numbers).
    fn small_reads(s: &mut EioScheduler<u32>, at_us: u64, n: u32) {
        for i in 100..100 + n {
            s.enqueue(at_us, StreamId(u64::from(i)), 7, IoKind::Read, 4096, 1.0, i)
                .expect("room");
        }
    }

    #[test]
    fn a_small_read_overtakes_large_reads_that_arrived_just_before_it() {
        let mut s = sched();
        // Two 128 KiB reads fill the drive; three more wait.
        for i in 0..5 {
            s.enqueue(
                i,
                StreamId(1),
                7,
                IoKind::Read,
                128 << 10,
                1.0,
                u32::try_from(i).expect("small"),
            )
            .expect("room");
        }
        assert_eq!(s.poll_admit(5).map(|a| a.token), Some(0));
        assert_eq!(s.poll_admit(5).map(|a| a.token), Some(1));
        assert!(s.poll_admit(5).is_none(), "the drive is full");
        // A 4 KiB read of another stream arrives at t=20.
        s.enqueue(20, StreamId(2), 7, IoKind::Read, 4096, 1.0, 100)
            .expect("room");
        s.complete(7, 128 << 10);
        let a = s.poll_admit(30).expect("room for one");
        assert_eq!(a.token, 100, "the small read goes first");
        assert_eq!(a.waited_us, 10);
        s.complete(7, 4096);
        assert_eq!(s.poll_admit(31).map(|a| a.token), Some(2));
    }

    #[test]
    fn small_ios_have_a_reserve_beyond_the_byte_cap_and_large_ones_do_not() {
        let mut s = sched(); // 256 KiB cap, 64 KiB small reserve
        for i in 0..3u32 {
            s.enqueue(
                0,
                StreamId(u64::from(i)),
                7,
                IoKind::Read,
                128 << 10,
                1.0,
                i,
            )
            .expect("room");
        }
        assert!(s.poll_admit(0).is_some() && s.poll_admit(0).is_some());
        assert!(s.poll_admit(0).is_none(), "the third 128 KiB read waits");
        // 4 KiB reads go at once, up to the reserve.
        small_reads(&mut s, 1, 17);
        let small: Vec<u32> = std::iter::from_fn(|| s.poll_admit(2).map(|a| a.token)).collect();
        assert_eq!(small.len(), 16, "{small:?}");
        assert!(small.iter().all(|t| *t >= 100));
        assert_eq!(s.inflight(7), (18, (256 << 10) + (64 << 10)));
    }

    #[test]
    fn a_small_read_passes_a_large_head_that_does_not_fit_but_only_into_the_reserve() {
        let mut s = sched(); // 256 KiB cap, 64 KiB small reserve
        for i in 0..4u32 {
            s.enqueue(0, StreamId(1), 7, IoKind::Read, 128 << 10, 1.0, i)
                .expect("room");
        }
        assert!(s.poll_admit(0).is_some() && s.poll_admit(0).is_some());
        // 4 KiB reads arrive long after: the waiting 128 KiB read ranks
        // first (it has waited past its deadline) but cannot go.
        small_reads(&mut s, 50_000, 20);
        let passed: Vec<u32> =
            std::iter::from_fn(|| s.poll_admit(50_000).map(|a| a.token)).collect();
        assert_eq!(
            passed,
            (100..116).collect::<Vec<_>>(),
            "16 x 4 KiB fill the reserve"
        );
        // A large completion: the large head goes before the small reads
        // that still wait, since it ranks first and now fits.
        s.complete(7, 128 << 10);
        assert_eq!(s.poll_admit(50_001).map(|a| a.token), Some(2));
        assert!(s.poll_admit(50_001).is_none(), "the reserve is full");
        s.complete(7, 4096);
        assert_eq!(s.poll_admit(50_002).map(|a| a.token), Some(116));
        // The counters: 20 admitted, of which 17 small reads passed the
        // blocked head (the 16, then token 116 past token 3). Waits: the
        // first two large reads and the 16 none, token 2 (arrived at 0)
        // 50_001 µs, token 116 (arrived at 50_000) 2 µs.
        let c = s.counters();
        assert_eq!((c.admitted, c.passed_blocked_head), (20, 17));
        // Waiting: token 3 and three small reads; in flight: two large
        // and 16 small reads.
        assert_eq!((c.pending, c.inflight_ios), (4, 18));
        assert_eq!(c.waited_us, 50_001 + 2);
    }

    #[test]
    fn a_head_larger_than_the_cap_that_small_reads_keep_passing_still_goes() {
        let mut s = sched(); // 256 KiB cap, 64 KiB small reserve
        s.enqueue(0, StreamId(1), 7, IoKind::Read, 128 << 10, 1.0, 0)
            .expect("room");
        s.enqueue(0, StreamId(2), 7, IoKind::Read, 512 << 10, 1.0, 1)
            .expect("room");
        assert_eq!(s.poll_admit(0).map(|a| a.token), Some(0));
        assert!(s.poll_admit(0).is_none(), "512 KiB can never fit the cap");
        // Small reads arrive later and pass it, so the drive is never idle
        // (the rule that lets an I/O larger than the cap go).
        for t in 1..20u32 {
            let token = 99 + t;
            let t = u64::from(t);
            s.enqueue(
                100_000 + t,
                StreamId(100 + t),
                7,
                IoKind::Read,
                4096,
                1.0,
                token,
            )
            .expect("room");
            if t < 10 {
                assert_eq!(s.poll_admit(100_000 + t).map(|a| a.token), Some(token));
            }
            if (2..=9).contains(&t) {
                s.complete(7, 4096);
            }
            if t == 9 {
                s.complete(7, 128 << 10);
                assert_eq!(
                    s.poll_admit(100_000 + t).map(|a| a.token),
                    Some(1),
                    "the only large one goes with a small read in flight"
                );
            }
        }
        // Small reads wait behind it now: it holds more than cap + reserve.
        assert!(s.poll_admit(100_100).is_none());
        assert_eq!(s.inflight(7), (2, (512 << 10) + 4096));
    }

    #[test]
    fn order_within_a_stream_is_kept_even_when_a_later_io_ranks_lower() {
        let mut s = sched();
        s.enqueue(0, StreamId(1), 7, IoKind::Write, 1 << 20, 1.0, 0)
            .expect("room");
        s.enqueue(1, StreamId(1), 7, IoKind::Read, 512, 1.0, 1)
            .expect("room");
        assert_eq!(s.poll_admit(2).map(|a| a.token), Some(0));
        // The big write is alone in flight; the next is admitted only after.
        assert!(s.poll_admit(2).is_none());
        s.complete(7, 1 << 20);
        assert_eq!(s.poll_admit(3).map(|a| a.token), Some(1));
    }

    #[test]
    fn a_full_drive_does_not_hold_back_another() {
        let mut s = sched();
        s.enqueue(0, StreamId(1), 1, IoKind::Read, 256 << 10, 1.0, 0)
            .expect("room");
        s.enqueue(0, StreamId(1), 1, IoKind::Read, 64 << 10, 1.0, 1)
            .expect("room");
        assert_eq!(s.poll_admit(1).map(|a| a.token), Some(0));
        // Drive 1 is full: its 64 KiB read waits, and drive 2's goes.
        s.enqueue(5, StreamId(2), 2, IoKind::Read, 4096, 1.0, 2)
            .expect("room");
        assert_eq!(s.poll_admit(6).map(|a| a.token), Some(2));
        assert!(s.poll_admit(6).is_none());
        s.complete(1, 256 << 10);
        assert_eq!(s.poll_admit(7).map(|a| a.token), Some(1));
    }

    #[test]
    fn victims_and_weights_move_ranks() {
        let mut s = sched();
        s.set_drive_view(1, None, true);
        s.enqueue(0, StreamId(1), 1, IoKind::Read, 4096, 1.0, 0)
            .expect("room");
        s.enqueue(0, StreamId(2), 2, IoKind::Read, 4096, 1.0, 1)
            .expect("room");
        s.enqueue(0, StreamId(3), 2, IoKind::Read, 8192, 4.0, 2)
            .expect("room");
        // Stream 3 pays a quarter per byte; the victim drive's read last.
        let order: Vec<u32> = std::iter::from_fn(|| s.poll_admit(0).map(|a| a.token)).collect();
        assert_eq!(order, vec![2, 1, 0]);
    }

    #[test]
    fn the_client_limit_binds_across_drives() {
        let mut s: EioScheduler<u32> = EioScheduler::new(EioConfig {
            inflight_ios_max: 2,
            ..EioConfig::default()
        })
        .expect("config");
        for d in 0..3 {
            s.enqueue(
                0,
                StreamId(d),
                d,
                IoKind::Read,
                512,
                1.0,
                u32::try_from(d).expect("small"),
            )
            .expect("room");
        }
        assert!(s.poll_admit(0).is_some() && s.poll_admit(0).is_some());
        assert!(s.poll_admit(0).is_none());
        s.complete(0, 512);
        assert!(s.poll_admit(0).is_some());
    }

    #[test]
    fn bad_config_is_refused() {
        assert!(EioScheduler::<u32>::new(EioConfig {
            write_cost: f64::NAN,
            ..EioConfig::default()
        })
        .is_err());
        assert!(EioScheduler::<u32>::new(EioConfig {
            drive_inflight_ios_max: 0,
            ..EioConfig::default()
        })
        .is_err());
    }

    proptest::proptest! {
        /// Random arrivals, sizes and completions: every I/O is admitted
        /// exactly once, in order within its stream, the limits hold, and
        /// none is passed by an I/O that arrived after its rank (no
        /// starvation) but for small ones passing a large one.
        #[test]
        fn admission_is_complete_ordered_bounded_and_starvation_free(
            ios in proptest::collection::vec((0u64..4, 0u64..3, 0u32..700, proptest::bool::ANY, 1u64..2000), 1..120),
        ) {
            let cfg = EioConfig { drive_inflight_bytes_max: 512 << 10, drive_inflight_ios_max: 4, inflight_ios_max: 6, ..EioConfig::default() };
            let mut s: EioScheduler<usize> = EioScheduler::new(cfg).expect("config");
            let mut now = 0u64;
            let mut arrival = Vec::new();
            let mut rank_of = Vec::new();
            let mut inflight: VecDeque<(u64, u64)> = VecDeque::new();
            let mut admitted: Vec<(usize, u64)> = Vec::new();
            let mut last_in_stream: HashMap<u64, usize> = HashMap::new();
            let mut next = 0usize;
            while admitted.len() < ios.len() {
                if next < ios.len() {
                    let (stream, drive, kb, write, gap) = ios[next];
                    now += gap;
                    let bytes = u64::from(kb) * 1024 + 512;
                    let kind = if write { IoKind::Write } else { IoKind::Read };
                    // Streams are pinned to a drive.
                    let drive = drive + stream * 3;
                    s.enqueue(now, StreamId(stream), drive, kind, bytes, 1.0, next).expect("room");
                    let probe = Entry { token: 0usize, drive, kind, bytes, arrival_us: now, weight: 1.0 };
                    rank_of.push(s.rank(&probe));
                    arrival.push(now);
                    next += 1;
                }
                // Complete the oldest in flight now and then.
                if (next.is_multiple_of(2) || next == ios.len()) && !inflight.is_empty() {
                    if let Some((d, b)) = inflight.pop_front() { s.complete(d, b); }
                }
                while let Some(a) = s.poll_admit(now) {
                    let (stream, ..) = ios[a.token];
                    if let Some(prev) = last_in_stream.insert(stream, a.token) {
                        proptest::prop_assert!(prev < a.token, "stream order broken");
                    }
                    inflight.push_back((a.drive, a.bytes));
                    admitted.push((a.token, now));
                    // Within the cap and the reserve, or one I/O larger
                    // than the cap with small ones in the reserve.
                    let (n, b) = s.inflight(a.drive);
                    let biggest = inflight.iter().filter(|(d, _)| *d == a.drive).map(|(_, b)| *b).max().unwrap_or(0);
                    proptest::prop_assert!(n <= 4 && b <= (512u64 << 10).max(biggest) + cfg.drive_small_reserve_bytes);
                    proptest::prop_assert!(inflight.len() <= 6);
                }
                if next == ios.len() && s.poll_admit(now).is_none() && !inflight.is_empty() {
                    if let Some((d, b)) = inflight.pop_front() { s.complete(d, b); }
                }
            }
            let mut seen = vec![false; ios.len()];
            for (t, _) in &admitted {
                proptest::prop_assert!(!seen[*t], "admitted twice");
                seen[*t] = true;
            }
            // No I/O of another stream on the same drive that arrived after
            // this one's effective rank (the highest rank of its stream up
            // to it, since order within a stream holds) went before it.
            let pos: HashMap<usize, usize> = admitted.iter().enumerate().map(|(i, (t, _))| (*t, i)).collect();
            let mut effective = rank_of.clone();
            let mut stream_max: HashMap<u64, u64> = HashMap::new();
            for (i, e) in effective.iter_mut().enumerate() {
                let m = stream_max.entry(ios[i].0).or_insert(0);
                *m = (*m).max(*e);
                *e = *m;
            }
            for i in 0..ios.len() {
                for j in 0..ios.len() {
                    let same_drive = ios[i].1 + ios[i].0 * 3 == ios[j].1 + ios[j].0 * 3;
                    // A small I/O may pass a large one that does not fit.
                    let passed = ios[j].2 < 16 && ios[i].2 >= 16;
                    if same_drive && ios[i].0 != ios[j].0 && arrival[j] > effective[i] && !passed {
                        proptest::prop_assert!(pos[&i] < pos[&j], "{j} arrived after {i}'s rank but went first");
                    }
                }
            }
        }
    }
}
