//! The `direct` engine of `sluice bench`: a job's I/O runs to completion on
//! its own OS thread (one per I/O queue; one per job with the default
//! `--queues 1`), which keeps `qd` I/Os outstanding on a
//! [`sluice_host::DirectQueue`], in the manner of spdk_nvme_perf's reactor.
//! No tokio task, channel or lock is on the I/O path.
//!
//! Each outstanding I/O has a slot (its LBA, length, start time; with
//! `--verify` its own LBA region and the generations written there, as the
//! async engine's workers have). On each completion the loop records the
//! latency, verifies a read, accounts the result and submits the slot's
//! next I/O. Tickets (`--ios`, `--rate-iops`), the stop flag, the latency
//! histogram, [`crate::JobStats`] and error samples are those of the async
//! engine. `--polling` picks what the loop does when a turn completed
//! nothing: `busy` polls again at once, `adaptive:US` spins while there was
//! progress in the last US µs (20 times that while I/Os are outstanding,
//! unless the thread waits to run for a share of its spin:
//! `SpinContention`) and
//! then waits in epoll, `interrupt` waits in
//! epoll (at most 1 ms, or until the next rate-limited I/O is due).
//! `--spin-depth-max N` makes `adaptive` spin only while at most N I/Os
//! are outstanding, `--wake-batch-min SIZE` only while less than SIZE of
//! data is due, and makes a sleep with that much due last until half of
//! it has arrived ([`DirectPolling`]).
//! With `batch=1` the slots go out together as one batch whose last I/O
//! carries the Barrier hint, and the next batch waits for all of them.
//!
//! When the queue fails (the target went away) the thread asks the
//! controller, which reconnects, for a new direct queue, pausing 50 ms and
//! doubling up to 2 s between tries, until it gets one or the run ends; the
//! I/Os lost with the old queue count as errors, as on the async engine,
//! whose controller reconnects the same way.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use sluice_host::core::{Completion, Payload};
use sluice_host::{DirectQueue, HostQueueStats, IoFlags, PollingPolicy, RwBuilder};
use sluice_runtime::cast::{nanos, usize_from};
use sluice_runtime::polling::ThreadRunDelay;
use sluice_runtime::SpinContention;

use crate::{hist, mix, JobRun, JobStats, NextIo};

/// Longest wait in epoll of the interrupt and adaptive modes (the stop flag
/// and the run time are checked between waits).
const WAIT_MAX: Duration = Duration::from_millis(1);

/// What one direct thread returns.
pub(crate) type ThreadOutcome = (Histogram<u64>, HostQueueStats);

/// Pause before the first try for a new queue, doubled up to
/// [`REPLACE_PAUSE_MAX`].
const REPLACE_PAUSE_FIRST: Duration = Duration::from_millis(50);
const REPLACE_PAUSE_MAX: Duration = Duration::from_secs(2);

/// How a direct thread's loop drives its queue: what a turn that completed
/// nothing does, and how a turn's new commands are written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirectPolling {
    pub(crate) policy: PollingPolicy,
    /// With `Adaptive`: spin only while at most this many commands are
    /// outstanding on the queue, and above it wait in epoll as `Interrupt`
    /// does. A wake-up costs about as much as a round trip at QD 1 here
    /// (docs/host.md), so a loop that sleeps at QD 1 pays one per I/O and
    /// loses a third of its IOPS, while at QD 32 a wake-up serves a batch
    /// of completions and the spin only burns the core. `None`: spin at
    /// any depth.
    pub(crate) spin_depth_max: Option<usize>,
    /// Batched wake-ups: while at least this many bytes are due from the
    /// target, the loop does not spin (adaptive), and its sleeps last
    /// until half of them have arrived
    /// ([`DirectQueue::set_wake_batch_min`]). With large reads in flight a
    /// spin only burns the core while the data streams in, and a sleep
    /// that ends at the first segment wakes once per segment. `None`: off.
    pub(crate) wake_batch_min_bytes: Option<usize>,
    /// Write the turn's new commands every this many submissions (0: all
    /// at the end of the turn, in one write). At QD 32 a turn resubmits a
    /// whole batch of completions; written at once, a controller with time
    /// to spare waits while the host builds the batch (docs/host.md).
    pub(crate) submit_chunk: usize,
}

impl DirectPolling {
    /// Whether a loop on `q` may spin (the policy still decides for how
    /// long). The bytes due are counted only with `--wake-batch-min`.
    fn may_spin(&self, q: &DirectQueue) -> bool {
        self.spin_depth_max.is_none_or(|m| q.outstanding() <= m)
            && self
                .wake_batch_min_bytes
                .is_none_or(|m| q.rx_due_min_bytes() < m)
    }
}

/// Where a direct thread gets a new queue when its own fails.
#[derive(Clone)]
pub(crate) struct Replacer {
    pub(crate) ctrl: sluice_host::Controller,
    pub(crate) rt: tokio::runtime::Handle,
}

#[derive(Debug)]
enum State {
    /// Needs a ticket.
    Ready,
    /// Has a ticket, due at this time (--rate-iops), or to use as soon as
    /// the queue has a free CID.
    Waiting(Instant),
    InFlight {
        io: NextIo,
        t0: Instant,
    },
    /// No more I/O (--ios reached, the queue closed, too many errors).
    Done,
}

#[derive(Debug)]
struct Slot {
    rng: u64,
    /// The verify region (whole namespace without --verify).
    region_start: u64,
    gens: Vec<u32>,
    state: State,
    /// The slot's read buffer, recycled from read to read (no allocation
    /// and no zeroing per I/O, as an application reusing its buffers).
    buf: Vec<u8>,
    /// The slot's write buffer without --verify: filled with the job's junk
    /// once and handed back by each write's completion (no allocation and
    /// no copy per I/O).
    wbuf: Vec<u8>,
}

impl JobRun {
    /// Runs the slots `w` with `w % threads == index` on `q` until the stop
    /// flag, the I/O limit, or the queue closing; merges the counts into
    /// the job's and returns the latency histogram and the queue's counters
    /// over the run.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn direct_thread(
        self: Arc<Self>,
        mut q: DirectQueue,
        rw: RwBuilder,
        index: u32,
        threads: u32,
        start: Instant,
        polling: DirectPolling,
        replace: &Replacer,
    ) -> anyhow::Result<ThreadOutcome> {
        if let Some(cg) = &self.spec.cgroup {
            sluice_cpu::join_cgroup(cg, false)
                .with_context(|| format!("job {}: direct I/O thread", self.spec.name))?;
        }
        q.set_wake_batch_min(polling.wake_batch_min_bytes);
        let mut s0 = q.stats();
        // Counters of queues that failed and were replaced.
        let mut queue_stats = HostQueueStats::default();
        let mut h = hist()?;
        let bs = u64::from(rw.block_size_bytes());
        let qd = self.spec.qd.max(1);
        let region = self.blocks / u64::from(qd);
        let mut slots: Vec<Slot> = (0..qd.min(crate::QD_MAX))
            .filter(|w| w % threads == index)
            .map(|w| Slot {
                rng: mix(0x5eed ^ (u64::from(w) << 32) ^ nanos(start.elapsed())),
                region_start: u64::from(w) * region,
                gens: if self.verify {
                    vec![0; usize_from(region)]
                } else {
                    Vec::new()
                },
                state: State::Ready,
                buf: Vec::new(),
                wbuf: Vec::new(),
            })
            .collect();
        let flags = IoFlags {
            urgent: self.spec.urgent,
            ..Default::default()
        };
        let junk = self.junk();
        let mut local = JobStats::default();
        let mut out: Vec<(u64, sluice_host::Result<Completion>)> = Vec::with_capacity(slots.len());
        let mut last_progress = Instant::now();
        let mut contention = SpinContention::default();
        let run_delay = ThreadRunDelay::of_this_thread();
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            // batch=1: the next batch starts once the whole last one has
            // completed, and its last I/O carries the Barrier hint.
            let batch_open = !self.spec.batch
                || !slots
                    .iter()
                    .any(|s| matches!(s.state, State::InFlight { .. }));
            let barrier_slot = if self.spec.batch {
                slots.iter().rposition(|s| !matches!(s.state, State::Done))
            } else {
                None
            };
            // One clock reading per turn: the due tickets, the submissions'
            // latency stamps (their commands leave together in the poll
            // below) and the poll's own pass all use it. A vDSO
            // `clock_gettime` per I/O cost 8-10 % of this thread at 4 KiB.
            let now = Instant::now();
            // Submit: every slot that needs a ticket or whose ticket is due.
            let mut next_due: Option<Instant> = None;
            let mut submitted = false;
            let mut unsent = 0usize;
            for (i, s) in slots.iter_mut().enumerate() {
                match s.state {
                    State::InFlight { .. } | State::Done => continue,
                    _ if stopping => {
                        s.state = State::Done;
                        continue;
                    }
                    _ if !batch_open => continue,
                    State::Ready => {
                        let ticket = self.issued.fetch_add(1, Ordering::AcqRel);
                        if self.ios_limit.is_some_and(|n| ticket >= n) {
                            s.state = State::Done;
                            continue;
                        }
                        if let Some(due) = self.ticket_due(start, ticket) {
                            s.state = State::Waiting(due);
                        }
                    }
                    State::Waiting(_) => {}
                }
                if let State::Waiting(due) = s.state {
                    if due > now {
                        next_due = Some(next_due.map_or(due, |d: Instant| d.min(due)));
                        continue;
                    }
                }
                if !q.can_submit() && !q.is_closed() {
                    // No free CID (a timed-out command still holds its
                    // own): keep the ticket, retry after completions.
                    s.state = State::Waiting(start);
                    continue;
                }
                let io = self.next_io(&mut s.rng, s.region_start, region);
                let len = usize_from(io.blocks * bs);
                let flags = if barrier_slot == Some(i) {
                    IoFlags {
                        barrier: true,
                        ..flags
                    }
                } else {
                    flags
                };
                let cmd = if io.read {
                    let mut buf = std::mem::take(&mut s.buf);
                    buf.resize(len, 0);
                    rw.read_into(io.lba, buf, flags)
                } else if self.verify {
                    let data = self.write_data(&mut s.gens, s.region_start, &io, &junk);
                    rw.write(io.lba, data, flags)
                } else {
                    let mut data = std::mem::take(&mut s.wbuf);
                    if data.len() < len {
                        data.clear();
                        data.extend_from_slice(&junk[..len]);
                    } else {
                        data.truncate(len);
                    }
                    rw.write(io.lba, data, flags)
                };
                let t0 = now;
                match cmd.and_then(|(sqe, p): (_, Payload)| q.submit(sqe, p, i as u64)) {
                    Ok(()) => {
                        s.state = State::InFlight { io, t0 };
                        submitted = true;
                        unsent += 1;
                        if polling.submit_chunk > 0 && unsent == polling.submit_chunk {
                            q.flush();
                            unsent = 0;
                        }
                    }
                    Err(e) => {
                        h.record(nanos(t0.elapsed()).max(1))
                            .context("record latency")?;
                        self.done.fetch_add(1, Ordering::Relaxed);
                        self.forget(&mut s.gens, s.region_start, &io);
                        self.failed(&mut local, e.to_string());
                        s.state = if q.is_closed() {
                            State::Done
                        } else {
                            State::Ready
                        };
                    }
                }
            }
            if q.outstanding() == 0 {
                let live = slots.iter().any(|s| !matches!(s.state, State::Done));
                if !live {
                    break;
                }
            }
            // Poll: how long to wait when this turn completes nothing.
            let t = now;
            let wait = match contention.policy(polling.policy, q.outstanding() > 0, t) {
                PollingPolicy::BusyPoll => None,
                _ if submitted => None,
                PollingPolicy::Adaptive { spin_us }
                    if polling.may_spin(&q)
                        && t.saturating_duration_since(last_progress)
                            < Duration::from_micros(u64::from(spin_us)) =>
                {
                    contention.spinning(t, || run_delay.read());
                    None
                }
                PollingPolicy::Adaptive { .. } | PollingPolicy::Interrupt => {
                    contention.slept();
                    Some(
                        next_due.map_or(WAIT_MAX, |d| WAIT_MAX.min(d.saturating_duration_since(t))),
                    )
                }
            };
            let n = match q.poll_at(now, &mut out, wait) {
                Ok(n) => n,
                Err(e) => {
                    // Closed, and every command was reported.
                    for s in &mut slots {
                        if !matches!(s.state, State::InFlight { .. }) {
                            s.state = State::Done;
                        }
                    }
                    if local.error_samples.len() < 5 && local.errors == 0 {
                        local.error_samples.push(e.to_string());
                    }
                    0
                }
            };
            // One reading stamps every completion the poll returned: it is
            // taken after the poll's reads, before any is processed.
            let done_at = if n > 0 || submitted {
                let t = Instant::now();
                last_progress = t;
                t
            } else {
                now
            };
            for (token, r) in out.drain(..) {
                let Some(s) = slots.get_mut(usize_from(token)) else {
                    continue;
                };
                let State::InFlight { io, t0 } = s.state else {
                    continue;
                };
                h.record(nanos(done_at.saturating_duration_since(t0)).max(1))
                    .context("record latency")?;
                self.done.fetch_add(1, Ordering::Relaxed);
                s.state = State::Ready;
                match r {
                    Ok(c) => {
                        let data = io.read.then_some(c.data.as_slice());
                        self.completed(&mut local, &s.gens, s.region_start, &io, data);
                        if io.read {
                            s.buf = c.data;
                        } else if !self.verify {
                            s.wbuf = c.data;
                        }
                    }
                    Err(e) => {
                        let fatal = e.is_fatal_for_connection();
                        self.forget(&mut s.gens, s.region_start, &io);
                        self.failed(&mut local, e.to_string());
                        if q.is_closed() || (fatal && local.errors > 100) {
                            s.state = State::Done;
                        }
                    }
                }
            }
            if q.is_closed() && q.outstanding() == 0 {
                if let Some(nq) = self.replacement(replace) {
                    queue_stats.add(&q.stats().since(&s0));
                    q = nq;
                    s0 = q.stats();
                    // Slots stopped by the failure go on; those past the
                    // I/O limit stop again at their next ticket.
                    for s in &mut slots {
                        s.state = State::Ready;
                    }
                    continue;
                }
                for s in &mut slots {
                    s.state = State::Done;
                }
            }
        }
        self.merge_stats(local);
        queue_stats.add(&q.stats().since(&s0));
        queue_stats.spin_backoffs += contention.seen();
        Ok((h, queue_stats))
    }

    /// A new direct queue after this thread's failed, tried with growing
    /// pauses while the run goes on (`None`: the run ended first).
    fn replacement(&self, r: &Replacer) -> Option<DirectQueue> {
        let mut pause = REPLACE_PAUSE_FIRST;
        loop {
            let over = |me: &Self| {
                me.stop.load(Ordering::Acquire)
                    || me
                        .ios_limit
                        .is_some_and(|n| me.issued.load(Ordering::Acquire) >= n)
            };
            if over(self) {
                return None;
            }
            std::thread::sleep(pause);
            if over(self) {
                return None;
            }
            let got = r.rt.block_on(async {
                r.ctrl.reconnect_if_stale().await?;
                r.ctrl.connect_direct_queue().await
            });
            match got {
                Ok(q) => {
                    tracing::info!(job = %self.spec.name, "direct queue replaced");
                    return Some(q);
                }
                Err(e) => {
                    tracing::debug!(job = %self.spec.name, error = %e, "no new direct queue yet");
                    pause = (pause * 2).min(REPLACE_PAUSE_MAX);
                }
            }
        }
    }
}
