//! The I/O layer of one queue pair: a dedicated thread owns the TCP socket
//! (non-blocking, TCP_NODELAY) and drives a [`QueuePairCore`].
//!
//! Callers submit from any thread or task; completions come back through
//! tokio oneshot channels, so the API is async while the receive path is
//! governed by a [`PollingPolicy`]:
//!
//! * `Interrupt`: the thread sleeps in epoll (via mio) until the socket or a
//!   submission wakes it.
//! * `BusyPoll`: the thread never sleeps; it spins over non-blocking reads,
//!   writes and the submission queue (one core per queue at 100 %).
//! * `Adaptive { spin_us }`: spins while there was progress in the last
//!   `spin_us` microseconds (20 times that while commands are outstanding:
//!   `PollingPolicy::while_outstanding`, unless the thread waits to run
//!   for a share of its spin: `SpinContention`), then sleeps like
//!   `Interrupt`.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};
use sluice_proto::coalesce::{CoalesceConfig, CoalesceMode, Coalescer, Decision, Hint};
use sluice_proto::command::Sqe;
use sluice_proto::send::{FlushReason, SendConfig, SendStats};
use sluice_runtime::cast::usize_from;
use sluice_runtime::polling::ThreadRunDelay;
use sluice_runtime::sync::lock;
use sluice_runtime::{PollingPolicy, Sleeper, SpinContention};
use tokio::sync::{mpsc, oneshot};

use crate::core::{Completion, CoreConfig, Event, Negotiated, Payload, QueuePairCore};
use crate::error::{HostError, Result};

/// Longest a sleeping queue thread waits before re-checking timers.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(100);
/// Granularity of command timeout checks.
const TIMER_CHECK: Duration = Duration::from_millis(1);
/// Most reads per loop turn before other work gets a chance.
const READS_PER_TURN_MAX: usize = 64;

const SOCKET: Token = Token(0);
const WAKER: Token = Token(1);
const TIMER: Token = Token(2);

/// Counters of one queue's I/O thread (completions, wake-ups, the send
/// scheduler's flushes and waits), readable at any time with
/// `QueueHandle::stats` and summed per controller by
/// [`crate::Controller::io_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostQueueStats {
    /// Commands submitted to the wire.
    pub submitted: u64,
    /// Completions that reached the queue thread.
    pub completions: u64,
    /// Wake-up batches: one per completion delivered alone, one per
    /// coalescer fire that woke held completions.
    pub notifications: u64,
    /// Socket write calls that moved bytes.
    pub sends: u64,
    pub(crate) send_bytes: u64,
    /// Socket read calls that returned bytes.
    pub reads: u64,
    /// C2HData bytes the socket wrote straight into read buffers (the bulk
    /// of large reads; the rest went through the receive buffer).
    pub rx_direct_bytes: u64,
    /// Completions held by the coalescer, total ns from arrival to wake-up.
    pub held_ns: u64,
    /// Send scheduler: containers flushed and PDUs they carried.
    pub flushes: u64,
    pub flush_pdus: u64,
    /// Flushes by the timer trigger (a PDU waited the full freight timer).
    pub timer_flushes: u64,
    /// Time PDUs waited in the latency / data freight, total ns, and PDUs.
    pub wait_ns_latency: u64,
    pub waited_latency: u64,
    pub wait_ns_data: u64,
    pub waited_data: u64,
    /// Times the I/O loop slept in epoll (adaptive and interrupt modes).
    pub sleeps: u64,
    /// Of those, the sleeps of a direct queue that waited for a batch of
    /// completions (`DirectQueue::set_wake_batch_min`).
    pub batched_sleeps: u64,
    /// Times an adaptive loop's long spin backed off because its thread
    /// waited to run (`SpinContention`).
    pub spin_backoffs: u64,
}

impl HostQueueStats {
    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &HostQueueStats) {
        self.submitted += o.submitted;
        self.completions += o.completions;
        self.notifications += o.notifications;
        self.sends += o.sends;
        self.send_bytes += o.send_bytes;
        self.reads += o.reads;
        self.rx_direct_bytes += o.rx_direct_bytes;
        self.held_ns += o.held_ns;
        self.flushes += o.flushes;
        self.flush_pdus += o.flush_pdus;
        self.timer_flushes += o.timer_flushes;
        self.wait_ns_latency += o.wait_ns_latency;
        self.waited_latency += o.waited_latency;
        self.wait_ns_data += o.wait_ns_data;
        self.waited_data += o.waited_data;
        self.sleeps += o.sleeps;
        self.batched_sleeps += o.batched_sleeps;
        self.spin_backoffs += o.spin_backoffs;
    }
    /// `self - o`, per counter (for a measured window).
    pub fn since(&self, o: &HostQueueStats) -> HostQueueStats {
        HostQueueStats {
            submitted: self.submitted.saturating_sub(o.submitted),
            completions: self.completions.saturating_sub(o.completions),
            notifications: self.notifications.saturating_sub(o.notifications),
            sends: self.sends.saturating_sub(o.sends),
            send_bytes: self.send_bytes.saturating_sub(o.send_bytes),
            reads: self.reads.saturating_sub(o.reads),
            rx_direct_bytes: self.rx_direct_bytes.saturating_sub(o.rx_direct_bytes),
            held_ns: self.held_ns.saturating_sub(o.held_ns),
            flushes: self.flushes.saturating_sub(o.flushes),
            flush_pdus: self.flush_pdus.saturating_sub(o.flush_pdus),
            timer_flushes: self.timer_flushes.saturating_sub(o.timer_flushes),
            wait_ns_latency: self.wait_ns_latency.saturating_sub(o.wait_ns_latency),
            waited_latency: self.waited_latency.saturating_sub(o.waited_latency),
            wait_ns_data: self.wait_ns_data.saturating_sub(o.wait_ns_data),
            waited_data: self.waited_data.saturating_sub(o.waited_data),
            sleeps: self.sleeps.saturating_sub(o.sleeps),
            batched_sleeps: self.batched_sleeps.saturating_sub(o.batched_sleeps),
            spin_backoffs: self.spin_backoffs.saturating_sub(o.spin_backoffs),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    submitted: AtomicU64,
    completions: AtomicU64,
    notifications: AtomicU64,
    sends: AtomicU64,
    send_bytes: AtomicU64,
    reads: AtomicU64,
    rx_direct_bytes: AtomicU64,
    held_ns: AtomicU64,
    sleeps: AtomicU64,
    spin_backoffs: AtomicU64,
    /// The send scheduler's counters, published by the queue thread.
    send: Mutex<SendStats>,
}

impl Counters {
    fn snapshot(&self) -> HostQueueStats {
        HostQueueStats {
            submitted: self.submitted.load(Ordering::Relaxed),
            completions: self.completions.load(Ordering::Relaxed),
            notifications: self.notifications.load(Ordering::Relaxed),
            sends: self.sends.load(Ordering::Relaxed),
            send_bytes: self.send_bytes.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            rx_direct_bytes: self.rx_direct_bytes.load(Ordering::Relaxed),
            held_ns: self.held_ns.load(Ordering::Relaxed),
            sleeps: self.sleeps.load(Ordering::Relaxed),
            spin_backoffs: self.spin_backoffs.load(Ordering::Relaxed),
            ..HostQueueStats::default()
        }
    }
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

struct Request {
    sqe: Sqe,
    payload: Payload,
    reply: oneshot::Sender<Result<Completion>>,
}

#[derive(Debug)]
struct Shared {
    qid: u16,
    pending: Mutex<VecDeque<Request>>,
    parked: AtomicBool,
    shutdown: AtomicBool,
    closed: AtomicBool,
    waker: Waker,
    close_reason: Mutex<Option<HostError>>,
    counters: Counters,
    /// The queue thread's TID (0 until it runs).
    tid: AtomicI32,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Request({:?})", self.sqe)
    }
}

/// A command that timed out, for the controller to Abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOutCommand {
    pub(crate) qid: u16,
    pub(crate) cid: u16,
    pub(crate) opcode: u8,
}

/// Handle to one queue pair's I/O thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct QueueHandle {
    shared: Arc<Shared>,
}

/// Everything needed to open one queue pair.
#[derive(Debug, Clone)]
pub struct QueueParams {
    pub(crate) addr: SocketAddr,
    pub(crate) core: CoreConfig,
    pub(crate) polling: PollingPolicy,
    pub(crate) connect_timeout: Duration,
    /// For tracing spans.
    pub(crate) hostnqn: String,
    /// Completion coalescing of wake-ups (I/O queues; `Off` delivers each
    /// completion at once).
    pub(crate) coalescing: CoalesceConfig,
    /// Send scheduler of I/O queues (the admin queue is always immediate).
    /// Its `coalescing` part is the target's and is ignored here.
    pub(crate) send: SendConfig,
    /// cgroup the queue thread moves itself into before anything else
    /// (see [`crate::ConnectOptions::cgroup`]).
    pub(crate) cgroup: Option<PathBuf>,
    /// cgroup v2 domain cgroups: allow moving the whole process.
    pub(crate) cgroup_procs: bool,
    /// See [`crate::ConnectOptions::tcp_congestion`].
    pub(crate) tcp_congestion: Option<String>,
}

/// Connects a queue's socket (blocking, within `timeout`) and sets what
/// every queue sets: TCP_NODELAY, the congestion control asked for, and
/// non-blocking mode.
pub(crate) fn connect_socket(
    addr: SocketAddr,
    timeout: Duration,
    tcp_congestion: Option<&str>,
) -> Result<TcpStream> {
    let transport = |what: &str, e: std::io::Error| HostError::Transport(format!("{what}: {e}"));
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| transport(&format!("connect to {addr}"), e))?;
    stream
        .set_nodelay(true)
        .map_err(|e| transport("TCP_NODELAY", e))?;
    if let Some(cc) = tcp_congestion {
        sluice_runtime::net::set_tcp_congestion(&stream, cc)
            .map_err(|e| transport(&format!("TCP congestion control `{cc}`"), e))?;
    }
    stream
        .set_nonblocking(true)
        .map_err(|e| transport("non-blocking", e))?;
    Ok(stream)
}

impl QueueHandle {
    /// Connects the TCP socket, starts the I/O thread and completes the
    /// ICReq/ICResp exchange.
    pub async fn connect(
        p: QueueParams,
        timeouts: Option<mpsc::UnboundedSender<TimedOutCommand>>,
    ) -> Result<QueueHandle> {
        let addr = p.addr;
        let connect_timeout = p.connect_timeout;
        let cc = p.tcp_congestion.clone();
        let stream = tokio::task::spawn_blocking(move || {
            connect_socket(addr, connect_timeout, cc.as_deref())
        })
        .await
        .map_err(|e| HostError::Transport(format!("connect task: {e}")))??;
        let poll = Poll::new().map_err(|e| HostError::Transport(format!("epoll: {e}")))?;
        let waker = Waker::new(poll.registry(), WAKER)
            .map_err(|e| HostError::Transport(format!("eventfd: {e}")))?;
        let qid = p.core.qid;
        let shared = Arc::new(Shared {
            qid,
            pending: Mutex::new(VecDeque::new()),
            parked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            waker,
            close_reason: Mutex::new(None),
            counters: Counters::default(),
            tid: AtomicI32::new(0),
        });
        let (ready_tx, ready_rx) = oneshot::channel();
        let sh = shared.clone();
        std::thread::Builder::new()
            .name(format!("sluice-q{qid}"))
            .spawn(move || {
                let span = tracing::debug_span!("queue", hostnqn = %p.hostnqn, qid);
                let _g = span.enter();
                sh.tid
                    .store(sluice_runtime::clock::current_tid(), Ordering::Release);
                if let Some(cg) = &p.cgroup {
                    match sluice_cpu::join_cgroup(cg, p.cgroup_procs) {
                        Ok(how) => tracing::debug!(cgroup = %cg.display(), ?how, "queue thread joined cgroup"),
                        Err(e) => {
                            sh.closed.store(true, Ordering::Release);
                            let _ = ready_tx.send(Err(HostError::Cgroup(format!(
                                "queue {qid} thread: {e}"
                            ))));
                            return;
                        }
                    }
                }
                let co = (qid > 0 && p.coalescing.mode != CoalesceMode::Off)
                    .then(|| Coalescer::new(p.coalescing));
                let mut d = Driver {
                    co,
                    held: Vec::new(),
                    core: {
                        let mut sc = p.send;
                        sc.coalescing.mode = CoalesceMode::Off;
                        QueuePairCore::with_scheduler(p.core, Instant::now(), sc.build(false))
                    },
                    stream: mio::net::TcpStream::from_std(stream),
                    poll,
                    shared: sh,
                    polling: p.polling,
                    replies: Vec::new(),
                    free_tokens: Vec::new(),
                    ready_tx: Some(ready_tx),
                    timeouts,
                };
                d.run();
            })
            .map_err(|e| HostError::Transport(format!("spawn queue thread: {e}")))?;
        ready_rx
            .await
            .map_err(|_| HostError::ConnectionLost("queue thread exited".into()))??;
        Ok(QueueHandle { shared })
    }

    pub fn qid(&self) -> u16 {
        self.shared.qid
    }

    /// Counters of this queue's thread so far.
    pub fn stats(&self) -> HostQueueStats {
        let mut h = self.shared.counters.snapshot();
        let s = lock(&self.shared.counters.send);
        h.flushes = s.flushes;
        h.flush_pdus = s.flush_pdus;
        h.timer_flushes = s.reason(FlushReason::Timer);
        h.wait_ns_latency = s.wait_ns_latency;
        h.waited_latency = s.waited_latency;
        h.wait_ns_data = s.wait_ns_data;
        h.waited_data = s.waited_data;
        h
    }

    /// The TID of this queue's I/O thread (0 before it started).
    pub fn tid(&self) -> i32 {
        self.shared.tid.load(Ordering::Acquire)
    }

    /// The I/O thread has stopped (connection lost or closed).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    fn wake(&self) {
        if self.shared.parked.swap(false, Ordering::AcqRel) {
            let _ = self.shared.waker.wake();
        }
    }

    /// Queues a command; the receiver yields its completion.
    pub fn submit(&self, sqe: Sqe, payload: Payload) -> oneshot::Receiver<Result<Completion>> {
        let (tx, rx) = oneshot::channel();
        if self.is_closed() {
            let _ = tx.send(Err(self.close_error()));
            return rx;
        }
        lock(&self.shared.pending).push_back(Request {
            sqe,
            payload,
            reply: tx,
        });
        self.wake();
        rx
    }

    /// Submits and waits.
    pub async fn execute(&self, sqe: Sqe, payload: Payload) -> Result<Completion> {
        let rx = self.submit(sqe, payload);
        wait(rx).await
    }

    fn close_error(&self) -> HostError {
        lock(&self.shared.close_reason)
            .clone()
            .unwrap_or_else(|| HostError::ConnectionLost(format!("queue {} closed", self.qid())))
    }

    /// Asks the thread to finish outstanding commands, then close the socket.
    pub fn shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
    }
}

/// Waits for a submitted command's completion.
pub async fn wait(rx: oneshot::Receiver<Result<Completion>>) -> Result<Completion> {
    rx.await
        .map_err(|_| HostError::ConnectionLost("queue thread dropped the command".into()))?
}

struct Driver {
    /// Batches completion wake-ups (Algorithm 1); `None` = deliver each.
    co: Option<Coalescer>,
    /// Completions held by the coalescer (token, result, arrival).
    held: Vec<(usize, Result<Completion>, Instant)>,
    core: QueuePairCore,
    stream: mio::net::TcpStream,
    poll: Poll,
    shared: Arc<Shared>,
    polling: PollingPolicy,
    replies: Vec<Option<oneshot::Sender<Result<Completion>>>>,
    free_tokens: Vec<usize>,
    ready_tx: Option<oneshot::Sender<Result<Negotiated>>>,
    timeouts: Option<mpsc::UnboundedSender<TimedOutCommand>>,
}

impl Driver {
    fn run(&mut self) {
        let mut events = Events::with_capacity(8);
        if let Err(e) = self.poll.registry().register(
            &mut self.stream,
            SOCKET,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            self.core.close(&format!("epoll register: {e}"));
        }
        let (mut sleeper, timer_err) = Sleeper::new(self.poll.registry(), TIMER);
        if let Some(e) = timer_err {
            tracing::warn!(error = %e, "no timerfd; sleeps will have millisecond granularity");
        }
        let mut next_timer = Instant::now();
        let mut last_progress = Instant::now();
        let mut contention = SpinContention::default();
        let run_delay = ThreadRunDelay::of_this_thread();
        loop {
            let now = Instant::now();
            let mut progress = false;
            if self.core.is_ready() {
                progress |= self.take_submissions(now);
            }
            // Each turn takes every submission waiting (or fills the
            // queue): the end of a batch.
            self.core.handle_idle(now);
            self.core.poll_send(now);
            progress |= self.write();
            progress |= self.read(now);
            if now >= next_timer {
                self.core.handle_timeout(now);
                next_timer = now + TIMER_CHECK;
            }
            progress |= self.deliver();
            let co_wait = self.coalesce_timer(now);
            if self.core.is_closed() {
                self.finish();
                return;
            }
            if self.shared.shutdown.load(Ordering::Acquire)
                && self.core.in_flight() == 0
                && self.pending_empty()
                && self.core.transmit_due().is_empty()
                && !self.core.has_transmit()
            {
                self.core.close("shut down by the host");
                let _ = self.deliver();
                self.finish();
                return;
            }
            if progress {
                last_progress = now;
                self.publish_send_stats();
                continue;
            }
            // Precise deadlines (held completions, PDUs held in a send
            // freight) go to the sleeper's timerfd; the coarse ones (command
            // timeouts, checked every TIMER_CHECK, and the idle cap) only
            // bound epoll's millisecond timeout, so they cost no timerfd
            // re-arm per sleep.
            let precise = [co_wait.map(|w| now + w), self.core.send_deadline()]
                .into_iter()
                .flatten()
                .min();
            let coarse = self
                .core
                .poll_timeout()
                .map_or(IDLE_WAIT_MAX, |t| {
                    t.saturating_duration_since(now) + TIMER_CHECK
                })
                .min(IDLE_WAIT_MAX);
            let timeout = sleeper
                .timeout(
                    contention.policy(self.polling, self.core.in_flight() > 0, now),
                    now,
                    now.duration_since(last_progress),
                    precise,
                )
                .map_or(coarse, |t| t.min(coarse));
            if timeout == Duration::ZERO {
                if matches!(self.polling, PollingPolicy::Adaptive { .. }) {
                    let before = contention.seen();
                    contention.spinning(now, || run_delay.read());
                    if contention.seen() != before {
                        bump(&self.shared.counters.spin_backoffs, 1);
                    }
                }
                std::hint::spin_loop();
                continue;
            }
            contention.slept();
            // Sleep until the socket, a submission or the deadline.
            self.shared.parked.store(true, Ordering::Release);
            if !self.pending_empty() || self.shared.shutdown.load(Ordering::Acquire) {
                self.shared.parked.store(false, Ordering::Release);
                continue;
            }
            bump(&self.shared.counters.sleeps, 1);
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != ErrorKind::Interrupted {
                    self.core.close(&format!("epoll wait: {e}"));
                }
            }
            for ev in events.iter() {
                sleeper.handle_event(ev.token());
            }
            self.shared.parked.store(false, Ordering::Release);
        }
    }

    /// Copies the send scheduler's counters where [`QueueHandle::stats`]
    /// reads them (only when they changed).
    fn publish_send_stats(&self) {
        let s = self.core.send_stats();
        let mut g = lock(&self.shared.counters.send);
        if g.flushes != s.flushes {
            *g = s;
        }
    }

    fn pending_empty(&self) -> bool {
        lock(&self.shared.pending).is_empty()
    }

    fn take_submissions(&mut self, now: Instant) -> bool {
        let mut progress = false;
        let mut q = lock(&self.shared.pending);
        while self.core.can_submit() {
            let Some(req) = q.pop_front() else { break };
            progress = true;
            let token = match self.free_tokens.pop() {
                Some(t) => t,
                None => {
                    self.replies.push(None);
                    self.replies.len() - 1
                }
            };
            let hint = Hint::from_cdw13(req.sqe.cdw(13));
            match self.core.submit(now, req.sqe, req.payload, token as u64) {
                Ok(_) => {
                    bump(&self.shared.counters.submitted, 1);
                    self.replies[token] = Some(req.reply);
                    if let Some(co) = self.co.as_mut() {
                        co.submitted(token as u64, hint);
                    }
                }
                Err(e) => {
                    self.free_tokens.push(token);
                    let _ = req.reply.send(Err(e));
                }
            }
        }
        progress
    }

    /// Writes what the core has due straight from its send buffer (no copy
    /// on this side) until the socket would block.
    fn write(&mut self) -> bool {
        let mut progress = false;
        loop {
            match self.core.transmit_to(&mut self.stream) {
                Ok(None) => break,
                Ok(Some(0)) => {
                    self.core.handle_connection_lost("socket write returned 0");
                    break;
                }
                Ok(Some(n)) => {
                    progress = true;
                    bump(&self.shared.counters.sends, 1);
                    bump(&self.shared.counters.send_bytes, n as u64);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.core.handle_connection_lost(&format!("write: {e}"));
                    break;
                }
            }
        }
        progress
    }

    fn read(&mut self, now: Instant) -> bool {
        let mut progress = false;
        for _ in 0..READS_PER_TURN_MAX {
            if self.core.is_closed() {
                break;
            }
            match self.core.read_draining(now, &mut self.stream) {
                Ok((0, _)) => {
                    self.core
                        .handle_connection_lost("controller closed the connection");
                    break;
                }
                Ok((_, drained)) => {
                    bump(&self.shared.counters.reads, 1);
                    self.shared
                        .counters
                        .rx_direct_bytes
                        .store(self.core.rx_direct_bytes(), Ordering::Relaxed);
                    if drained {
                        // A short read emptied the socket; the next bytes
                        // raise a new edge.
                        return true;
                    }
                    progress = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return progress,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.core.handle_connection_lost(&format!("read: {e}"));
                    break;
                }
            }
        }
        // Stopped before WouldBlock: report progress so the loop comes back
        // before sleeping (epoll is edge-triggered).
        true
    }

    fn deliver(&mut self) -> bool {
        let mut progress = false;
        while let Some(ev) = self.core.poll_event() {
            progress = true;
            match ev {
                Event::Complete { token, result } => {
                    let t = usize_from(token);
                    let now = Instant::now();
                    bump(&self.shared.counters.completions, 1);
                    let decision = match self.co.as_mut() {
                        Some(co) => co.completed(token, now),
                        None => Decision::Deliver,
                    };
                    match decision {
                        Decision::Deliver => {
                            bump(&self.shared.counters.notifications, 1);
                            self.wake_one(t, result)
                        }
                        Decision::Hold => self.held.push((t, result, now)),
                        Decision::FlushAll(_) => {
                            self.held.push((t, result, now));
                            self.wake_held();
                        }
                    }
                }
                Event::TimedOut { qid, cid, opcode } => {
                    if let Some(t) = &self.timeouts {
                        let _ = t.send(TimedOutCommand { qid, cid, opcode });
                    }
                }
                Event::Closed(e) => {
                    *lock(&self.shared.close_reason) = Some(e.clone());
                    if let Some(tx) = self.ready_tx.take() {
                        let _ = tx.send(Err(e));
                    }
                }
            }
        }
        if self.core.is_ready() {
            if let (Some(tx), Some(n)) = (self.ready_tx.take(), self.core.negotiated()) {
                let _ = tx.send(Ok(n));
            }
        }
        progress
    }

    fn wake_one(&mut self, t: usize, result: Result<Completion>) {
        if let Some(tx) = self.replies.get_mut(t).and_then(|r| r.take()) {
            let _ = tx.send(result);
            self.free_tokens.push(t);
        }
    }

    /// Delivers every held completion (one coalesced notification).
    fn wake_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let now = Instant::now();
        let c = &self.shared.counters;
        bump(&c.notifications, 1);
        let held_ns: u64 = self
            .held
            .iter()
            .map(|(_, _, at)| {
                let ns = now.saturating_duration_since(*at).as_nanos();
                u64::try_from(ns).unwrap_or(u64::MAX)
            })
            .sum();
        bump(&c.held_ns, held_ns);
        for (t, r, _) in std::mem::take(&mut self.held) {
            self.wake_one(t, r);
        }
    }

    /// Runs the coalescer's timer; returns how long until it must run again.
    fn coalesce_timer(&mut self, now: Instant) -> Option<Duration> {
        let co = self.co.as_mut()?;
        if co.poll(now).is_some() {
            self.wake_held();
        }
        self.co
            .as_ref()
            .and_then(|c| c.next_deadline())
            .map(|d| d.saturating_duration_since(now))
    }

    /// Flushes a final TermReq (best effort), fails queued requests, exits.
    fn finish(&mut self) {
        self.wake_held();
        self.shared.closed.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline {
            match self.core.transmit_to(&mut self.stream) {
                Ok(None | Some(0)) => break,
                Ok(Some(_)) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        let reason = lock(&self.shared.close_reason)
            .clone()
            .unwrap_or_else(|| HostError::ConnectionLost("queue closed".into()));
        for r in lock(&self.shared.pending).drain(..) {
            let _ = r.reply.send(Err(reason.clone()));
        }
        for r in self.replies.iter_mut().filter_map(|r| r.take()) {
            let _ = r.send(Err(reason.clone()));
        }
        if let Some(tx) = self.ready_tx.take() {
            let _ = tx.send(Err(reason));
        }
        tracing::debug!("queue thread exits");
    }
}
