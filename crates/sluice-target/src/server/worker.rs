//! A worker thread's mio loop (edge-triggered) over its connections and
//! backend queues: the polling policy (interrupt / busy-poll / adaptive,
//! timerfd for precise sleeps), one clock read per iteration, placement of
//! I/O queues on the least loaded worker after their Connect, backend
//! submissions through the tenant scheduler, completions routed back by
//! [`BackendTag`], graceful drain on shutdown and a final backend flush.

use super::conn::{conn_tenant, more_input, read_conn, write_conn, ConnEntry};
use super::cpu_sampling::{CpuRead, CpuSampling};
use super::{WorkerReport, CONNECTIONS_PER_WORKER_MAX};
use crate::admission::Permit;
use crate::queue::QueueConnection;
use crate::registry::Registry;
use crate::tag::BackendTag;
use crate::tenant::worker::WorkerTenancy;
use foldhash::HashMap;
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use sluice_backend::{BackendQueue, IoCompletion, IoOp, IoRequest};
use sluice_runtime::clock::thread_cpu;
use sluice_runtime::{IdleGaps, Sleeper};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The worker's timerfd token (precise sleeps in interrupt and adaptive modes).
pub(super) const TIMER: Token = Token(3);
const CONN_BASE: usize = 16;
/// Backend notification fds use tokens counted down from here.
const BACKEND_TOKEN_TOP: usize = usize::MAX / 2;

/// What a worker's channel carries.
pub(super) enum Incoming {
    /// A socket the acceptor admitted and dealt to this worker.
    Accepted(TcpStream, SocketAddr, Permit),
    /// An I/O queue another worker hands over right after its Connect, so
    /// that I/O queues spread evenly over workers (the acceptor cannot tell
    /// an admin queue from an I/O queue, and round robin would put every
    /// controller's single I/O queue on the same worker).
    Moved(Box<ConnEntry>),
}

struct BackendSlot {
    queue: Box<dyn BackendQueue>,
    notify_registered: bool,
    /// The namespace it serves: gone once a reload removed its subsystem
    /// and the last queue holding it closed; then the slot is dropped
    /// ([`Worker::drop_retired_queues`]) and with it the backend.
    ns: std::sync::Weak<crate::subsystem::Namespace>,
}

/// How often a worker holding queues of retired namespaces looks again
/// whether it may drop them.
const RETIRED_QUEUE_CHECK: Duration = Duration::from_millis(200);

/// The grid every connection's periodic checks fall on, process-wide (so a
/// connection handed to another worker stays on it): the first worker
/// clock reading.
fn check_origin(now: Instant) -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(|| now)
}

pub(super) struct Worker {
    id: usize,
    pub(super) poll: Poll,
    rx: Receiver<Incoming>,
    /// Every worker's channel and waker (hand-overs), by worker index.
    pub(super) peers: Vec<(Sender<Incoming>, Arc<Waker>)>,
    /// Live I/O queues per worker, shared by all workers.
    pub(super) io_queues: Arc<Vec<AtomicUsize>>,
    reg: Arc<Registry>,
    shutdown: Arc<AtomicBool>,
    /// Connections by token index; boxed so that a slot left free after a
    /// wave of connections costs a pointer, not a whole entry.
    conns: Vec<Option<Box<ConnEntry>>>,
    free: Vec<usize>,
    queues: HashMap<usize, BackendSlot>,
    completions: Vec<IoCompletion>,
    connections_total: u64,
    /// Tenant scheduling and CPU accounting.
    tenancy: WorkerTenancy,
    /// epoll sleeps in whole milliseconds; a timerfd wakes us on time.
    pub(super) sleeper: Sleeper,
    /// The registry's `removals` as last seen.
    removals_seen: u64,
    /// When to look again for queues of retired namespaces to drop (set
    /// while some may remain).
    retired_check: Option<Instant>,
}

impl Worker {
    pub(super) fn new(
        id: usize,
        poll: Poll,
        rx: Receiver<Incoming>,
        reg: Arc<Registry>,
        shutdown: Arc<AtomicBool>,
        tenancy: WorkerTenancy,
    ) -> Self {
        Worker {
            id,
            poll,
            rx,
            peers: Vec::new(),
            io_queues: Arc::new(Vec::new()),
            reg,
            shutdown,
            conns: Vec::new(),
            free: Vec::new(),
            queues: HashMap::default(),
            completions: Vec::new(),
            connections_total: 0,
            tenancy,
            sleeper: Sleeper::without_timer(),
            removals_seen: 0,
            retired_check: None,
        }
    }

    pub(super) fn run(mut self) -> WorkerReport {
        let span = tracing::info_span!("worker", id = self.id);
        let _g = span.enter();
        let started = Instant::now();
        let mut events = Events::with_capacity(1024);
        let polling = self.reg.settings.polling;
        let mut last_work = Instant::now();
        // Start of the current idle spell, and how long idle spells last.
        let mut idle_since: Option<Instant> = None;
        let mut gaps = IdleGaps::default();
        let mut loops = 0u64;
        let mut drain_deadline: Option<Instant> = None;
        let mut next_publish = started + crate::metrics::SEND_PUBLISH_INTERVAL;
        let mut cpu_sampling = CpuSampling::new(started);
        loop {
            loops += 1;
            let now = Instant::now();
            if now >= next_publish {
                self.publish_send_stats();
                next_publish = now + crate::metrics::SEND_PUBLISH_INTERVAL;
            }
            let removals = self.reg.removals.load(Ordering::Acquire);
            if removals != self.removals_seen {
                self.removals_seen = removals;
                self.retired_check = Some(now);
            }
            if self.retired_check.is_some_and(|t| now >= t) {
                self.retired_check = self
                    .drop_retired_queues()
                    .then_some(now + RETIRED_QUEUE_CHECK);
            }
            let deadline = self.next_deadline(now);
            let timeout = self.sleeper.timeout(
                gaps.policy(polling),
                now,
                now.duration_since(last_work),
                deadline,
            );
            let timeout = if drain_deadline.is_some() {
                Some(
                    timeout
                        .unwrap_or(Duration::from_millis(10))
                        .min(Duration::from_millis(10)),
                )
            } else {
                timeout
            };
            cpu_sampling.will_poll(timeout);
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "worker poll failed");
                    break;
                }
            }
            let now = Instant::now();
            self.tenancy.refresh(now);
            // The thread CPU clock closes the previous batch, charged to
            // the tenants it served; `CpuSampling` says when to read it.
            if self.tenancy.cpu_accounting() {
                let read = cpu_sampling.after_poll(now, idle_since.is_none(), !events.is_empty());
                if let CpuRead::Read { idle } = read {
                    self.tenancy.cpu_sample(thread_cpu(), now, idle);
                }
            }
            let mut work = !events.is_empty();
            for ev in events.iter() {
                let t = ev.token().0;
                if self.sleeper.handle_event(ev.token()) {
                    continue;
                }
                if (CONN_BASE..BACKEND_TOKEN_TOP).contains(&t) {
                    if let Some(Some(e)) = self.conns.get_mut(t - CONN_BASE) {
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            e.read_ready = true;
                        }
                        if ev.is_writable() {
                            e.write_blocked = false;
                        }
                    }
                }
            }
            if self.accept_new(now) {
                work = true;
            }
            if self.shutdown.load(Ordering::Acquire) && drain_deadline.is_none() {
                drain_deadline =
                    Some(now + Duration::from_millis(self.reg.settings.shutdown_drain_ms));
                for e in self.conns.iter_mut().flatten() {
                    e.conn.begin_drain();
                }
            }
            work |= self.drive(now);
            if work {
                last_work = now;
                if let Some(t) = idle_since.take() {
                    gaps.record(now.duration_since(t));
                }
            } else if idle_since.is_none() {
                idle_since = Some(now);
            }
            if let Some(d) = drain_deadline {
                let live = self.conns.iter().flatten().count();
                if live == 0 || now >= d {
                    if live > 0 {
                        tracing::warn!(
                            connections = live,
                            "drain deadline passed; closing connections with commands in flight"
                        );
                    }
                    break;
                }
            }
        }
        // Close every connection before waiting for the backends: a host
        // whose command is still in a slow backend learns at once that the
        // target is gone, rather than at its own command timeout. Their
        // completions come to nothing (the connection is gone); what was
        // acknowledged is made durable by the final flush.
        for i in 0..self.conns.len() {
            self.remove_conn(i);
        }
        self.flush_backends();
        self.reg.send.publish_live(self.id, Default::default());
        WorkerReport {
            worker: self.id,
            cpu: thread_cpu(),
            wall: started.elapsed(),
            loops,
            connections: self.connections_total,
        }
    }

    /// The earliest timer of any connection, backend queue or tenant, as of
    /// `now` (the loop's one clock read).
    fn next_deadline(&mut self, now: Instant) -> Option<Instant> {
        let mut d: Option<Instant> = None;
        let mut take = |x: Option<Instant>| {
            if let Some(x) = x {
                d = Some(d.map_or(x, |y| y.min(x)));
            }
        };
        for e in self.conns.iter().flatten() {
            take(e.conn.poll_timeout());
            if e.window_capped && !e.write_blocked {
                // Due bytes the congestion window held back: no edge
                // announces that it opened, so the next turn comes now.
                take(Some(now));
            }
        }
        for q in self.queues.values() {
            take(q.queue.next_deadline());
            if q.queue.in_flight() > 0 && !q.notify_registered && q.queue.next_deadline().is_none()
            {
                // Completions that neither notify nor have a deadline: poll soon.
                take(Some(now + Duration::from_micros(50)));
            }
        }
        take(self.tenancy.next_deadline(now));
        take(self.retired_check);
        d
    }

    fn accept_new(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Ok(incoming) = self.rx.try_recv() {
            any = true;
            let (mut stream, peer, permit, moved) = match incoming {
                Incoming::Accepted(stream, peer, permit) => (stream, Some(peer), permit, None),
                Incoming::Moved(e) => {
                    let e = *e;
                    let peer = e.stream.peer_addr().ok();
                    (e.stream, peer, e.permit, Some((e.conn, e.tenant)))
                }
            };
            let full = self.conns.iter().flatten().count() >= CONNECTIONS_PER_WORKER_MAX;
            if moved.is_none() && (self.shutdown.load(Ordering::Acquire) || full) {
                tracing::warn!(
                    ?peer,
                    "refusing connection (shutting down, or this worker holds CONNECTIONS_PER_WORKER_MAX)"
                );
                continue;
            }
            let idx = match self.free.pop() {
                Some(i) => i,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            let token = Token(CONN_BASE + idx);
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                token,
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(?peer, error = %e, "cannot register connection");
                self.free.push(idx);
                if moved.is_some() {
                    // Counted for this worker by the one that moved it.
                    let prev = self.io_queues[self.id].fetch_sub(1, Ordering::Relaxed);
                    debug_assert!(prev > 0, "I/O queue count of worker {} underflows", self.id);
                }
                continue;
            }
            let (conn, tenant, placed) = match moved {
                Some((mut conn, tenant)) => {
                    tracing::debug!(?peer, qid = conn.qid(), "I/O queue taken over");
                    if self.shutdown.load(Ordering::Acquire) {
                        // Arrived after this worker began draining.
                        conn.begin_drain();
                    }
                    (conn, tenant, true)
                }
                None => {
                    let local = stream.local_addr().ok();
                    tracing::debug!(?peer, "connection accepted");
                    self.connections_total += 1;
                    let mut conn = QueueConnection::new(self.reg.clone(), peer, local, now);
                    conn.align_checks_to(check_origin(now));
                    (conn, None, false)
                }
            };
            self.conns[idx] = Some(Box::new(ConnEntry {
                stream,
                conn,
                // A moved socket may hold bytes whose edge the old worker saw.
                read_ready: true,
                write_blocked: false,
                window_capped: false,
                closed_socket: false,
                tenant,
                placed,
                permit,
            }));
        }
        any
    }

    /// Places an I/O queue once its Connect is answered and nothing of it
    /// is in flight: on the worker with the fewest live I/O queues (this one
    /// on a tie). Returns whether the connection was handed over.
    fn place_io_queue(&mut self, i: usize) -> bool {
        let Some(e) = self.conns.get_mut(i).and_then(|c| c.as_mut()) else {
            return false;
        };
        if e.placed
            || e.conn.qid() == 0
            || e.conn.is_closing()
            || e.conn.backend_in_flight() > 0
            || !e.conn.due().is_empty()
            || e.conn.send_deadline().is_some()
        {
            return false;
        }
        e.placed = true;
        let counts = &self.io_queues;
        let mine = counts[self.id].load(Ordering::Relaxed);
        let (best, least) = counts
            .iter()
            .enumerate()
            .map(|(w, c)| (w, c.load(Ordering::Relaxed)))
            .min_by_key(|&(w, c)| (c, w != self.id))
            .unwrap_or((self.id, mine));
        if best == self.id || least >= mine || self.shutdown.load(Ordering::Acquire) {
            counts[self.id].fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let Some(mut e) = self.conns[i].take() else {
            return false;
        };
        let _ = self.poll.registry().deregister(&mut e.stream);
        // Its send counters move with it (the new worker's live sum).
        counts[best].fetch_add(1, Ordering::Relaxed);
        let qid = e.conn.qid();
        let (tx, waker) = &self.peers[best];
        match tx.send(Incoming::Moved(e)) {
            Ok(()) => {
                let _ = waker.wake();
                tracing::info!(qid, to = best, "I/O queue handed to a less loaded worker");
                self.free.push(i);
                self.publish_send_stats();
                true
            }
            Err(std::sync::mpsc::SendError(Incoming::Moved(mut e))) => {
                // The other worker is gone (shutdown): keep it here.
                let prev = counts[best].fetch_sub(1, Ordering::Relaxed);
                debug_assert!(prev > 0, "I/O queue count of worker {best} underflows");
                counts[self.id].fetch_add(1, Ordering::Relaxed);
                let token = Token(CONN_BASE + i);
                let _ = self.poll.registry().register(
                    &mut e.stream,
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                );
                e.read_ready = true;
                self.conns[i] = Some(e);
                false
            }
            Err(_) => false,
        }
    }

    /// One pass over every connection and backend queue. Returns whether
    /// anything happened.
    fn drive(&mut self, now: Instant) -> bool {
        let mut work = false;
        let within_cwnd = self.reg.settings.send_within_cwnd;
        for i in 0..self.conns.len() {
            if self.peers.len() > 1 && self.place_io_queue(i) {
                work = true;
                continue;
            }
            let Some(e) = self.conns[i].as_mut() else {
                continue;
            };
            let tenant = conn_tenant(e, &self.tenancy);
            let throttled = self.tenancy.throttled(tenant);
            if more_input(e, throttled) {
                work |= read_conn(e, now, &self.reg.receive);
            }
            // Backend submissions.
            while let Some(sub) = e.conn.poll_backend() {
                work = true;
                let ns_index = sub.ns.index;
                let mut req = sub.req;
                req.tag = BackendTag::from_raw(req.tag).with_conn(i).raw();
                let slot = match self.queues.entry(ns_index) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        match crate::queue::open_backend_queue(
                            sub.ns.backend.as_ref(),
                            &self.reg.settings,
                        ) {
                            Ok(q) => {
                                let mut notify_registered = false;
                                if let Some(fd) = q.notify_fd() {
                                    let tok = Token(BACKEND_TOKEN_TOP + 1 + ns_index);
                                    notify_registered = self
                                        .poll
                                        .registry()
                                        .register(&mut SourceFd(&fd), tok, Interest::READABLE)
                                        .is_ok();
                                }
                                v.insert(BackendSlot {
                                    queue: q,
                                    notify_registered,
                                    ns: Arc::downgrade(&sub.ns),
                                })
                            }
                            Err(err) => {
                                tracing::error!(nsid = sub.ns.nsid, error = %err, "cannot open a backend queue");
                                self.completions.push(IoCompletion::new(
                                    req.tag,
                                    Err(err),
                                    req.buf,
                                ));
                                continue;
                            }
                        }
                    }
                };
                self.tenancy
                    .submit(ns_index, tenant, req, slot.queue.as_mut(), now);
            }
        }
        self.dispatch_fair(now);
        // Completions.
        for q in self.queues.values_mut() {
            q.queue.poll_completions(now, &mut self.completions);
        }
        let completions = std::mem::take(&mut self.completions);
        for c in completions {
            work = true;
            // Pieces of a split request come back as one completion.
            let Some(c) = self.tenancy.complete(c, now) else {
                continue;
            };
            let tag = BackendTag::from_raw(c.tag);
            debug_assert!(tag.is_conn(), "completion with a foreign tag {tag:?}");
            if let Some(Some(e)) = self.conns.get_mut(tag.conn()) {
                e.conn.handle_backend_completion(
                    IoCompletion {
                        tag: tag.local().raw(),
                        ..c
                    },
                    now,
                );
            }
        }
        work |= self.dispatch_fair(now);
        // Timers and writes.
        for i in 0..self.conns.len() {
            let Some(e) = self.conns[i].as_mut() else {
                continue;
            };
            let tenant = conn_tenant(e, &self.tenancy);
            let throttled = self.tenancy.throttled(tenant);
            if let Some(t) = e.conn.poll_timeout() {
                if t <= now {
                    e.conn.handle_timeout(now);
                }
            }
            // A response may have unblocked more input (back-pressure released).
            if more_input(e, throttled) {
                work |= read_conn(e, now, &self.reg.receive);
            }
            if !more_input(e, throttled) {
                // No more input this turn: the end of the batch.
                e.conn.handle_idle(now);
            }
            if !e.write_blocked && !e.conn.due().is_empty() {
                work |= write_conn(e, now, within_cwnd);
                if e.window_capped {
                    self.reg.send.add_window_capped_write();
                }
            }
            if e.conn.is_closed() && e.conn.backend_in_flight() == 0 {
                self.remove_conn(i);
                work = true;
            } else if e.conn.is_closed() && !e.closed_socket {
                // Keep the entry until the backend returns its buffers.
                let _ = e.stream.shutdown(std::net::Shutdown::Both);
                e.closed_socket = true;
            }
        }
        work
    }

    /// Sends what the fair schedulers allow to the backend queues.
    fn dispatch_fair(&mut self, now: Instant) -> bool {
        let t = &mut self.tenancy;
        let mut any = false;
        for (ns, slot) in self.queues.iter_mut() {
            any |= t.dispatch(*ns, slot.queue.as_mut(), now);
        }
        any
    }

    /// Publishes the send counters of this worker's live connections.
    fn publish_send_stats(&self) {
        let mut s = sluice_proto::send::SendStats::default();
        for e in self.conns.iter().flatten() {
            s.add(&e.conn.send_stats());
        }
        self.reg.send.publish_live(self.id, s);
    }

    fn remove_conn(&mut self, i: usize) {
        if let Some(mut e) = self.conns.get_mut(i).and_then(|c| c.take()) {
            if e.placed {
                if let Some(c) = self.io_queues.get(self.id) {
                    let prev = c.fetch_sub(1, Ordering::Relaxed);
                    debug_assert!(prev > 0, "I/O queue count of worker {} underflows", self.id);
                }
            }
            let _ = self.poll.registry().deregister(&mut e.stream);
            let _ = e.stream.shutdown(std::net::Shutdown::Both);
            e.conn.finish();
            self.reg.send.add_closed(&e.conn.send_stats());
            // Drop it from the live sum at once, so it is never counted twice.
            self.publish_send_stats();
            tracing::debug!(
                reason = e.conn.close_reason().unwrap_or("closed"),
                "connection removed"
            );
            self.free.push(i);
        }
    }

    /// Drops the backend queues of namespaces no one holds any more (their
    /// subsystem was removed by a reload and its last connection closed)
    /// once nothing is in flight in them, so the backend closes: a thread
    /// of its own flushes each (as at shutdown) and drops it, so a slow
    /// flush holds up no connection. True when queues of retired
    /// namespaces remain (to look again later).
    fn drop_retired_queues(&mut self) -> bool {
        let mut remain = false;
        let mut retired = Vec::new();
        for (&i, q) in &self.queues {
            match q.ns.upgrade() {
                None if q.queue.in_flight() == 0 && self.tenancy.queued_for(i) == 0 => {
                    retired.push(i);
                }
                None => remain = true,
                Some(ns) => remain |= ns.is_retired(),
            }
        }
        for i in retired {
            let Some(q) = self.queues.remove(&i) else {
                continue;
            };
            self.tenancy.forget_namespace(i);
            if q.notify_registered {
                if let Some(fd) = q.queue.notify_fd() {
                    let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
                }
            }
            let mut queue = q.queue;
            let flushing = std::thread::Builder::new()
                .name("sluice-retire".into())
                .spawn(move || {
                    submit_final_flush(queue.as_mut());
                    wait_flushed(queue.as_mut(), Instant::now() + FINAL_FLUSH_WAIT);
                    tracing::debug!(
                        ns_index = i,
                        "backend queue of a removed namespace flushed and dropped"
                    );
                });
            if let Err(e) = flushing {
                tracing::warn!(ns_index = i, error = %e, "cannot start a thread to flush a removed namespace's backend queue; dropped without a final flush");
            }
        }
        remain
    }

    /// Makes every completed write durable before the process exits.
    fn flush_backends(&mut self) {
        let deadline = Instant::now() + FINAL_FLUSH_WAIT;
        for q in self.queues.values_mut() {
            submit_final_flush(q.queue.as_mut());
        }
        for q in self.queues.values_mut() {
            wait_flushed(q.queue.as_mut(), deadline);
        }
    }
}

/// How long a final flush (at exit, or of a removed namespace) may take.
const FINAL_FLUSH_WAIT: Duration = Duration::from_secs(30);

fn submit_final_flush(q: &mut dyn BackendQueue) {
    q.submit(
        IoRequest {
            tag: BackendTag::FINAL_FLUSH.raw(),
            op: IoOp::Flush,
            offset_bytes: 0,
            len_bytes: 0,
            buf: None,
        },
        Instant::now(),
    );
}

/// Waits until `q` has nothing in flight (or `deadline`), logging a final
/// flush that failed.
fn wait_flushed(q: &mut dyn BackendQueue, deadline: Instant) {
    let mut out = Vec::new();
    while q.in_flight() > 0 && Instant::now() < deadline {
        q.poll_completions(Instant::now(), &mut out);
        if q.in_flight() > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    for c in out {
        if let Err(e) = &c.result {
            if BackendTag::from_raw(c.tag) == BackendTag::FINAL_FLUSH {
                tracing::error!(error = %e, "final backend flush failed");
            }
        }
    }
}
