//! Run-to-completion I/O queues: [`DirectQueue`], one NVMe/TCP I/O queue
//! pair driven by the thread that owns it, as spdk_nvme_perf's reactor
//! drives its qpairs.
//!
//! The threaded path (`queue.rs`) hands every command from the caller's
//! task to a per-connection thread (a mutex-protected submission queue, an
//! eventfd wake-up) and every completion back on a oneshot channel: two
//! thread crossings per I/O. A `DirectQueue` has none: the owner calls
//! [`DirectQueue::submit`] and [`DirectQueue::poll`] itself, and `poll`
//! writes the pending PDUs (many per `write`), reads until `EWOULDBLOCK`,
//! feeds the sans-IO [`QueuePairCore`], runs its timers and hands back the
//! completions. No channel and no lock is on the I/O path; the only
//! blocking is the optional wait in `poll` (epoll on the one socket).
//!
//! Created by [`crate::Controller::connect_direct_queue`], which opens one
//! more I/O queue of the controller's association (ICReq/ICResp, Fabrics
//! Connect with the next unused QID). The queue is `Send`: connect it from
//! async code, then move it to the thread that will drive it. Dropping it
//! closes the socket; commands still outstanding are abandoned.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use sluice_proto::coalesce::CoalesceMode;
use sluice_proto::command::Sqe;
use sluice_proto::send::{FlushReason, SendConfig};
use sluice_runtime::{PollingPolicy, Sleeper};
use tokio::sync::mpsc;

use crate::core::{Completion, CoreConfig, Event, LentBuf, Payload, QueuePairCore};
use crate::error::{HostError, Result};
use crate::queue::{HostQueueStats, TimedOutCommand};
use crate::rw::{IoFlags, RwBuilder};

const SOCKET: Token = Token(0);
/// The token of the queue's timerfd (sub-millisecond sleeps).
const TIMER: Token = Token(1);
/// Most reads per pass before the pass returns (the next poll continues).
const READS_PER_PASS_MAX: usize = 64;
/// Granularity of command timeout checks.
const TIMER_CHECK: Duration = Duration::from_millis(1);
/// Longest wait of a poll during connect.
const CONNECT_WAIT: Duration = Duration::from_millis(10);
/// Largest receive low-water mark of a batched sleep (the kernel also
/// caps it at half its largest receive buffer).
const LOW_WATER_MAX_BYTES: usize = 1024 * 1024;
/// Smallest one (below it a sleep wakes for any byte).
const LOW_WATER_MIN_BYTES: usize = 32;
/// The token of the Fabrics Connect (the only command in flight then).
const CONNECT_TOKEN: u64 = u64::MAX;

/// Everything needed to open a direct queue (built by the controller).
#[derive(Debug)]
pub(crate) struct DirectParams {
    pub(crate) addr: SocketAddr,
    pub(crate) core: CoreConfig,
    /// Send scheduler (its `coalescing` part is the target's, ignored).
    pub(crate) send: SendConfig,
    pub(crate) connect_timeout: Duration,
    /// See [`crate::ConnectOptions::tcp_congestion`].
    pub(crate) tcp_congestion: Option<String>,
    /// The Fabrics Connect command and its data.
    pub(crate) connect: (Sqe, Payload),
    /// Where timed-out commands go (for an Abort on the admin queue).
    pub(crate) timeouts: Option<mpsc::UnboundedSender<TimedOutCommand>>,
}

/// One I/O queue pair driven by its owner's thread: no queue thread, no
/// channels, no locks. See the module documentation.
#[derive(Debug)]
pub struct DirectQueue {
    qid: u16,
    depth: u16,
    core: QueuePairCore,
    stream: mio::net::TcpStream,
    poll: Poll,
    events: Events,
    /// Sleeps to sub-millisecond deadlines (a freight timer of 50 µs):
    /// epoll alone rounds every timeout up to a whole millisecond.
    sleeper: Sleeper,
    /// When the core's command timers are checked next.
    next_timer: Instant,
    /// The clock of the last pass (submissions are stamped with it).
    last_now: Instant,
    /// Commands submitted whose completion was not handed out yet.
    outstanding: usize,
    /// Why the queue closed, once it did.
    close_reason: Option<HostError>,
    stats: HostQueueStats,
    waits: u64,
    timeouts: Option<mpsc::UnboundedSender<TimedOutCommand>>,
    /// The socket may hold bytes: epoll (edge-triggered) reported it
    /// readable since the last read that emptied it (`EWOULDBLOCK`, or a
    /// short read), or the last pass's reads stopped at their cap. While false, a pass asks epoll (a zero
    /// timeout) instead of calling `recv`: a spinning `recv` takes the
    /// socket's lock on every turn and contends with the kernel delivering
    /// the very reply it waits for (`__pv_queued_spin_lock_slowpath` was
    /// 11.5 % of the bench's core at QD 1), as spdk_nvme_perf does not.
    read_ready: bool,
    /// Sleeps while at least this many bytes are due wait for half of
    /// them (see [`DirectQueue::set_wake_batch_min`]).
    wake_batch_min_bytes: Option<usize>,
    /// Sleeps that waited for a batch (a low-water mark above 1).
    batched_sleeps: u64,
    /// The socket's receive low-water mark as last set (1: the kernel's
    /// default, any byte wakes).
    low_water_bytes: usize,
}

fn transport(what: &str, e: std::io::Error) -> HostError {
    HostError::Transport(format!("{what}: {e}"))
}

impl DirectQueue {
    /// Connects the socket and runs ICReq/ICResp and the Fabrics Connect
    /// (blocking; the controller calls it on a blocking-pool thread).
    /// Returns the queue and the Connect's completion, which the controller
    /// interprets (refusal, ATR, ASCR).
    pub(crate) fn open(p: DirectParams) -> Result<(DirectQueue, Result<Completion>)> {
        let stream =
            crate::queue::connect_socket(p.addr, p.connect_timeout, p.tcp_congestion.as_deref())?;
        let mut stream = mio::net::TcpStream::from_std(stream);
        let poll = Poll::new().map_err(|e| transport("epoll", e))?;
        poll.registry()
            .register(&mut stream, SOCKET, Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| transport("epoll register", e))?;
        let (sleeper, timer_err) = Sleeper::new(poll.registry(), TIMER);
        if let Some(e) = timer_err {
            tracing::warn!(error = %e, "no timerfd for the direct queue: its sub-millisecond timers are met by polling");
        }
        let now = Instant::now();
        let mut sc = p.send;
        sc.coalescing.mode = CoalesceMode::Off;
        let qid = p.core.qid;
        let depth = p.core.depth;
        let mut q = DirectQueue {
            qid,
            depth,
            core: QueuePairCore::with_scheduler(p.core, now, sc.build(false)),
            stream,
            poll,
            events: Events::with_capacity(4),
            sleeper,
            next_timer: now,
            last_now: now,
            outstanding: 0,
            close_reason: None,
            stats: HostQueueStats::default(),
            waits: 0,
            timeouts: p.timeouts,
            read_ready: true,
            wake_batch_min_bytes: None,
            batched_sleeps: 0,
            low_water_bytes: 1,
        };
        // ICReq/ICResp: the core bounds the exchange by the command timeout
        // (it closes, and `poll` then returns the reason).
        let mut done = Vec::new();
        while !q.core.is_ready() {
            q.poll(&mut done, Some(CONNECT_WAIT))?;
        }
        let (sqe, payload) = p.connect;
        let r = q.execute_blocking(sqe, payload)?;
        Ok((q, r))
    }

    /// Runs one command to completion, blocking (the Connect, and the
    /// DH-HMAC-CHAP exchange after it, while nothing else is in flight).
    /// Bounded by the command timeout. The outer `Err` is the queue's
    /// failure; the inner result is the command's.
    pub(crate) fn execute_blocking(
        &mut self,
        sqe: Sqe,
        payload: Payload,
    ) -> Result<Result<Completion>> {
        debug_assert_eq!(self.outstanding, 0, "setup commands run alone");
        let mut done = Vec::new();
        self.submit(sqe, payload, CONNECT_TOKEN)?;
        let r = loop {
            self.poll(&mut done, Some(CONNECT_WAIT))?;
            if let Some(i) = done.iter().position(|(t, _)| *t == CONNECT_TOKEN) {
                break done.swap_remove(i).1;
            }
        };
        // Count I/O only.
        self.stats = HostQueueStats::default();
        self.waits = 0;
        Ok(r)
    }

    /// Queue ID.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Command slots (CIDs) of the queue.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// Commands submitted whose completion [`Self::poll`] has not handed
    /// out yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Whether [`Self::submit`] would take a command now (a CID is free and
    /// the queue is open). A timed-out command keeps its CID until its late
    /// completion arrives, so this can be false with fewer than `depth`
    /// commands outstanding.
    pub fn can_submit(&self) -> bool {
        self.core.can_submit()
    }

    /// The connection is closed (lost, refused, or a protocol error); every
    /// outstanding command has been or will be failed by [`Self::poll`].
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// Counters so far: submissions, completions, socket writes (`sends`)
    /// and reads (`reads`) that moved bytes, the send scheduler's flushes,
    /// sleeps in epoll ([`Self::waits`]). `notifications` and `held_ns`
    /// stay 0 (nothing is woken), and so does `spin_backoffs` (the caller
    /// decides how it spins).
    pub fn stats(&self) -> HostQueueStats {
        let s = self.core.send_stats();
        HostQueueStats {
            flushes: s.flushes,
            flush_pdus: s.flush_pdus,
            timer_flushes: s.reason(FlushReason::Timer),
            wait_ns_latency: s.wait_ns_latency,
            waited_latency: s.waited_latency,
            wait_ns_data: s.wait_ns_data,
            waited_data: s.waited_data,
            rx_direct_bytes: self.core.rx_direct_bytes(),
            sleeps: self.waits,
            batched_sleeps: self.batched_sleeps,
            ..self.stats
        }
    }

    /// For owners that wait on several descriptors themselves (poll(2) on
    /// [`AsRawFd::as_raw_fd`] and their own): bytes taken from the core are
    /// waiting for room in the socket, so wait for it to be writable too.
    pub fn wants_write(&self) -> bool {
        !self.core.transmit_due().is_empty()
    }

    /// For such owners too: the latest instant by which [`Self::poll`]
    /// must run again even if the socket stays quiet (a command deadline or
    /// a send-scheduler timer); `None` when nothing is pending.
    pub fn next_deadline(&self) -> Option<Instant> {
        // Command timers are looked at every TIMER_CHECK at most.
        let timers = self.core.poll_timeout().map(|t| t.max(self.next_timer));
        [timers, self.core.send_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Batched wake-ups: while at least `min_bytes` are due from the
    /// controller for the commands outstanding
    /// ([`Self::rx_due_min_bytes`]), a sleep in [`Self::poll`] lasts until
    /// about half of them have arrived (a socket low-water mark,
    /// `SO_RCVLOWAT`, of that half rounded down to a power of two, at most
    /// 1 MiB) or until its deadline, instead of ending at the first byte.
    /// A loop keeping large reads in flight then wakes once per batch of
    /// completions instead of once per arriving segment, and copies them
    /// in fewer, larger reads: at 128 KiB reads, QD 8, against Sluice's
    /// target, the host's CPU falls by a third against a spinning loop's
    /// and by a sixth against one that wakes per segment, at the same
    /// bandwidth (docs/host.md). Each completion may wait for its batch,
    /// so this trades latency for CPU. A command that fails sends less
    /// than its data, so the sleep may last until its deadline. `None`
    /// (the default): every sleep ends at the first byte.
    pub fn set_wake_batch_min(&mut self, min_bytes: Option<usize>) {
        self.wake_batch_min_bytes = min_bytes;
    }

    /// A lower bound on the bytes the controller still sends for the
    /// commands outstanding ([`QueuePairCore::rx_due_min_bytes`]).
    pub fn rx_due_min_bytes(&self) -> usize {
        self.core.rx_due_min_bytes()
    }

    /// Times [`Self::poll`] blocked in epoll.
    pub fn waits(&self) -> u64 {
        self.waits
    }

    /// Queues a command; its completion comes out of [`Self::poll`] with
    /// `token`. The CID and SGL are filled in here; the bytes go out at the
    /// next `poll`. Fails with [`HostError::QueueFull`] when no CID is free,
    /// with the close reason when the queue is closed, and with
    /// [`HostError::InvalidArgument`] for a transfer over the limits.
    pub fn submit(&mut self, sqe: Sqe, payload: Payload, token: u64) -> Result<()> {
        if self.core.is_closed() {
            return Err(self.close_error());
        }
        if !self.core.can_submit() {
            return Err(HostError::QueueFull {
                qid: self.qid,
                depth: self.depth,
            });
        }
        // The clock is read only by `poll`: the command's deadline (and a
        // send-scheduler freight timer) counts from the last pass, at most
        // one loop turn earlier.
        self.core.submit(self.last_now, sqe, payload, token)?;
        self.outstanding += 1;
        self.stats.submitted += 1;
        Ok(())
    }

    /// A Read of `len_bytes` at `lba` built by `rw` (as
    /// [`crate::Namespace::read`] builds it; one command, at most
    /// [`RwBuilder::max_command_bytes`]), then [`Self::submit`].
    pub fn submit_read(
        &mut self,
        rw: &RwBuilder,
        lba: u64,
        len_bytes: usize,
        flags: IoFlags,
        token: u64,
    ) -> Result<()> {
        let (sqe, payload) = rw.read(lba, len_bytes, flags)?;
        self.submit(sqe, payload, token)
    }

    /// [`Self::submit_read`] into `buf`, a recycled buffer (its length is
    /// the read's; it comes back as the completion's data).
    pub fn submit_read_into(
        &mut self,
        rw: &RwBuilder,
        lba: u64,
        buf: Vec<u8>,
        flags: IoFlags,
        token: u64,
    ) -> Result<()> {
        let (sqe, payload) = rw.read_into(lba, buf, flags)?;
        self.submit(sqe, payload, token)
    }

    /// [`Self::submit_read`] into memory the caller lends (see
    /// [`LentBuf`]): the data lands there, and the completion's data is
    /// empty.
    pub fn submit_read_lent(
        &mut self,
        rw: &RwBuilder,
        lba: u64,
        buf: LentBuf,
        flags: IoFlags,
        token: u64,
    ) -> Result<()> {
        let (sqe, payload) = rw.read_lent(lba, buf, flags)?;
        self.submit(sqe, payload, token)
    }

    /// A Write of `data` at `lba` built by `rw` (as
    /// [`crate::Namespace::write`] builds it; one command), then
    /// [`Self::submit`].
    pub fn submit_write(
        &mut self,
        rw: &RwBuilder,
        lba: u64,
        data: Vec<u8>,
        flags: IoFlags,
        token: u64,
    ) -> Result<()> {
        let (sqe, payload) = rw.write(lba, data, flags)?;
        self.submit(sqe, payload, token)
    }

    /// Writes the commands submitted so far (and anything else due) now,
    /// without reading or waiting: a caller that submits a long batch can
    /// let the controller start on its first part while it builds the rest
    /// (`sluice bench --submit-chunk`). Failures close the queue, as in
    /// [`Self::poll`].
    pub fn flush(&mut self) {
        let now = self.last_now;
        self.core.handle_idle(now);
        self.core.poll_send(now);
        self.write();
    }

    /// Drives the queue: writes every pending byte (all due PDUs in as few
    /// writes as the socket takes), reads until `EWOULDBLOCK` (at most 64
    /// reads; the next poll continues), feeds the core, runs its command
    /// timers, and appends the completions to `out` as `(token, result)`.
    /// The clock is read once per pass. If the pass completed nothing and
    /// `wait` is `Some`, blocks in epoll on the socket for at most `wait`
    /// (less when a command deadline or a send-scheduler timer comes
    /// sooner; a timerfd makes sub-millisecond waits exact, and waits under
    /// 100 µs (`SPIN_BELOW`) do not block) and makes one
    /// more pass. `None` never blocks (busy poll).
    ///
    /// Returns how many completions were appended. When the connection is
    /// lost every outstanding command completes with the error; after that
    /// (nothing left to report) `poll` returns the close reason as `Err`.
    pub fn poll(
        &mut self,
        out: &mut Vec<(u64, Result<Completion>)>,
        wait: Option<Duration>,
    ) -> Result<usize> {
        self.poll_at(Instant::now(), out, wait)
    }

    /// [`Self::poll`] with the clock already read: a caller that reads it
    /// once per turn of its own loop (for its timers and latency stamps)
    /// passes that reading, and the pass reads no clock of its own (the
    /// pass after a wait reads it again). A reading earlier than the last
    /// one the queue saw is taken as that one: its clock never goes back.
    pub fn poll_at(
        &mut self,
        now: Instant,
        out: &mut Vec<(u64, Result<Completion>)>,
        wait: Option<Duration>,
    ) -> Result<usize> {
        let before = out.len();
        let now = now.max(self.last_now);
        let drained = self.pass(now, out);
        if out.len() == before && drained && !self.core.is_closed() {
            if let Some(w) = wait {
                let deadline = [
                    self.core.poll_timeout(),
                    self.core.send_deadline(),
                    Some(now + w),
                ]
                .into_iter()
                .flatten()
                .min();
                // Below SPIN_BELOW no sleep (one more pass; the caller
                // polls again); else the timerfd, armed for the deadline,
                // wakes epoll on time.
                let t =
                    self.sleeper
                        .timeout(PollingPolicy::Interrupt, now, Duration::ZERO, deadline);
                if t != Some(Duration::ZERO) {
                    self.waits += 1;
                    self.set_low_water();
                    self.wait_events(t);
                }
                let now = Instant::now();
                self.pass(now, out);
            }
        }
        let n = out.len() - before;
        if n == 0 && self.core.is_closed() && self.outstanding == 0 {
            return Err(self.close_error());
        }
        Ok(n)
    }

    /// One pass at `now`; returns whether the reads reached `EWOULDBLOCK`
    /// (or the queue closed), i.e. whether blocking is safe.
    fn pass(&mut self, now: Instant, out: &mut Vec<(u64, Result<Completion>)>) -> bool {
        self.last_now = now;
        // The caller submitted its batch before polling.
        self.flush();
        // Under a low-water mark epoll reports only a batch: look anyway.
        self.read_ready |= self.low_water_bytes > 1;
        if !self.read_ready {
            // Readiness without the socket's lock (see `read_ready`).
            self.wait_events(Some(Duration::ZERO));
        }
        let drained = if self.read_ready {
            let drained = self.read(now);
            self.read_ready = !drained;
            drained
        } else {
            true
        };
        if now >= self.next_timer {
            self.core.handle_timeout(now);
            self.next_timer = now + TIMER_CHECK;
        }
        // What the received PDUs made due (H2CData for R2Ts, a TermReq).
        if self.core.has_transmit() {
            if drained {
                self.core.handle_idle(now);
            }
            self.core.poll_send(now);
            self.write();
        }
        self.collect(out);
        drained || self.core.is_closed()
    }

    /// Before a sleep: the socket's low-water mark for the batch to wait
    /// for (1 when wake-ups are not batched or too little is due). Set
    /// only when it changes (one `setsockopt`).
    fn set_low_water(&mut self) {
        let due = self.core.rx_due_min_bytes();
        let want = match self.wake_batch_min_bytes {
            Some(min) if due >= min.max(1) => low_water_for(due),
            _ => 1,
        };
        if want != self.low_water_bytes {
            if let Err(e) = sluice_runtime::net::set_recv_low_water(&self.stream, want) {
                tracing::warn!(qid = self.qid, error = %e, "SO_RCVLOWAT refused: the direct queue stops batching its sleeps");
                self.wake_batch_min_bytes = None;
                return;
            }
            self.low_water_bytes = want;
        }
        if want > 1 {
            self.batched_sleeps += 1;
        }
    }

    /// Writes what the core has due straight from its send buffer (no copy
    /// on this side) until the socket would block.
    fn write(&mut self) {
        loop {
            match self.core.transmit_to(&mut self.stream) {
                Ok(None) => break,
                Ok(Some(0)) => {
                    self.core.handle_connection_lost("socket write returned 0");
                    break;
                }
                Ok(Some(n)) => {
                    self.stats.sends += 1;
                    self.stats.send_bytes += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.core.handle_connection_lost(&format!("write: {e}"));
                    break;
                }
            }
        }
    }

    /// Waits in epoll for at most `timeout` and hands the events on: the
    /// timer's to the sleeper, the socket's readability to `read_ready`.
    fn wait_events(&mut self, timeout: Option<Duration>) {
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            if e.kind() != ErrorKind::Interrupted {
                self.core.close(&format!("epoll wait: {e}"));
            }
        }
        for ev in &self.events {
            if ev.token() == SOCKET {
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    self.read_ready = true;
                }
            } else {
                self.sleeper.handle_event(ev.token());
            }
        }
    }

    /// Reads until the socket is empty (true: `EWOULDBLOCK`, or a short
    /// read) or the per-pass cap (false).
    fn read(&mut self, now: Instant) -> bool {
        for _ in 0..READS_PER_PASS_MAX {
            if self.core.is_closed() {
                return true;
            }
            match self.core.read_draining(now, &mut self.stream) {
                Ok((0, _)) => {
                    self.core
                        .handle_connection_lost("controller closed the connection");
                    return true;
                }
                Ok((_, drained)) => {
                    self.stats.reads += 1;
                    if drained {
                        // A short read emptied the socket: epoll reports
                        // what comes next, no `recv` needed to see
                        // EWOULDBLOCK.
                        return true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.core.handle_connection_lost(&format!("read: {e}"));
                    return true;
                }
            }
        }
        false
    }

    fn collect(&mut self, out: &mut Vec<(u64, Result<Completion>)>) {
        while let Some(ev) = self.core.poll_event() {
            match ev {
                Event::Complete { token, result } => {
                    self.outstanding = self.outstanding.saturating_sub(1);
                    self.stats.completions += 1;
                    out.push((token, result));
                }
                Event::TimedOut { qid, cid, opcode } => {
                    if let Some(t) = &self.timeouts {
                        let _ = t.send(TimedOutCommand { qid, cid, opcode });
                    }
                }
                Event::Closed(e) => {
                    tracing::debug!(qid = self.qid, error = %e, "direct queue closed");
                    self.close_reason = Some(e);
                }
            }
        }
    }

    fn close_error(&self) -> HostError {
        self.close_reason
            .clone()
            .unwrap_or_else(|| HostError::ConnectionLost(format!("queue {} closed", self.qid)))
    }
}

/// The low-water mark for a sleep while `due_bytes` are still to come:
/// half of them, rounded down to a power of two (so that the mark changes,
/// and costs a `setsockopt`, rarely), at most [`LOW_WATER_MAX_BYTES`]; 1
/// (any byte) when that is under [`LOW_WATER_MIN_BYTES`].
fn low_water_for(due_bytes: usize) -> usize {
    let half = due_bytes / 2;
    if half < LOW_WATER_MIN_BYTES {
        return 1;
    }
    (1usize << half.ilog2()).min(LOW_WATER_MAX_BYTES)
}

impl AsRawFd for DirectQueue {
    /// The socket (to wait on several queues at once, e.g. with poll(2)).
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

impl Drop for DirectQueue {
    fn drop(&mut self) {
        // Best effort: a final TermReq the core queued, then close.
        let _ = self.core.transmit_to(&mut self.stream);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
