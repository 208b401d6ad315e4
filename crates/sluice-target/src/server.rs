//! The I/O layer: listeners, worker threads and their event loops.
//!
//! An acceptor thread accepts connections on the I/O and discovery ports and
//! hands each to a worker, round robin. Each worker owns its connections
//! (mio, edge-triggered), one backend queue per namespace it touches, and
//! drives the sans-IO [`QueueConnection`]s: read → process → submit backend
//! I/O → poll completions → run timers → write. The clock is read once per
//! loop iteration and passed down.
//!
//! Polling policy (config `target.polling`): `interrupt` sleeps in epoll
//! until a socket, a completion fd or a timer is due; `busy-poll` never
//! sleeps; `adaptive` polls for `adaptive_spin_us` after the last work, then
//! sleeps. Each worker reports the CPU time its thread used.

use crate::queue::QueueConnection;
use crate::subsystem::{Registry, RegistryError};
use crate::tenant::admin::AdminServer;
use crate::tenant::worker::WorkerTenancy;
use crate::tenant::{TenantId, TenantRuntime};
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use sluice_backend::{BackendQueue, IoCompletion, IoOp, IoRequest};
use sluice_config::{Config, PollingMode};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Errors starting the target.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: io::Error },
    #[error("cannot start worker threads: {0}")]
    Thread(io::Error),
}

/// CPU and activity of one worker thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkerReport {
    pub worker: usize,
    pub cpu: Duration,
    pub wall: Duration,
    pub loops: u64,
    pub connections: u64,
}

/// What the target did, reported at shutdown.
#[derive(Debug, Clone, Default)]
pub struct ShutdownReport {
    pub workers: Vec<WorkerReport>,
    /// CPU (user + system) of the whole process.
    pub process_cpu: Duration,
    /// Send path and coalescing totals of every queue (issue 4).
    pub send: crate::send::SendStats,
    /// Read and Write commands served (for per-I/O ratios).
    pub io_commands: u64,
}

/// Starts targets.
#[derive(Debug)]
pub struct Target;

/// A running target.
#[derive(Debug)]
pub struct TargetHandle {
    reg: Arc<Registry>,
    shutdown: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
    workers: Vec<JoinHandle<WorkerReport>>,
    acceptor: Option<JoinHandle<()>>,
    acceptor_waker: Arc<Waker>,
    local_addr: SocketAddr,
    discovery_addr: Option<SocketAddr>,
    started: Instant,
    tenants: Arc<TenantRuntime>,
    admin: Option<AdminServer>,
    charging: Option<crate::tenant::cpu::ChargeAgents>,
    io_queues: Arc<Vec<AtomicUsize>>,
}

const WAKER: Token = Token(0);
const LISTEN_IO: Token = Token(1);
/// The worker's timerfd (precise sleeps in interrupt and adaptive modes).
const TIMER: Token = Token(3);
/// Deadlines closer than this are met by polling instead of sleeping: a
/// wake-up costs about as much here.
const SPIN_BELOW: Duration = Duration::from_micros(100);
const LISTEN_DISC: Token = Token(2);
const CONN_BASE: usize = 16;
/// Backend notification fds use tokens counted down from here.
const BACKEND_TOKEN_TOP: usize = usize::MAX / 2;
/// Bytes read from one socket before moving on to others (fairness).
const READ_BUDGET_BYTES: usize = 1 << 20;
/// Connections per worker.
pub const CONNECTIONS_PER_WORKER_MAX: usize = 4096;

impl Target {
    /// Opens backends, binds listeners and starts the worker threads.
    pub fn start(config: &Config) -> Result<TargetHandle, StartError> {
        let reg = Arc::new(Registry::build(config)?);
        let tenants = Arc::new(TenantRuntime::new(config, &reg));
        let admin = match tenants.settings.admin_listen {
            Some(a) => Some(
                AdminServer::start(a, tenants.clone())
                    .map_err(|source| StartError::Listen { addr: a, source })?,
            ),
            None => None,
        };
        let charging =
            crate::tenant::cpu::ChargeAgents::start(&tenants).map_err(StartError::Thread)?;
        let st = &reg.settings;
        let std_listener =
            std::net::TcpListener::bind(st.listen).map_err(|source| StartError::Listen {
                addr: st.listen,
                source,
            })?;
        let local_addr = std_listener
            .local_addr()
            .map_err(|source| StartError::Listen {
                addr: st.listen,
                source,
            })?;
        std_listener
            .set_nonblocking(true)
            .map_err(|source| StartError::Listen {
                addr: st.listen,
                source,
            })?;
        let disc_listener = match st.discovery_listen {
            Some(a) => {
                let l = std::net::TcpListener::bind(a)
                    .map_err(|source| StartError::Listen { addr: a, source })?;
                l.set_nonblocking(true)
                    .map_err(|source| StartError::Listen { addr: a, source })?;
                Some(l)
            }
            None => None,
        };
        let discovery_addr = disc_listener.as_ref().and_then(|l| l.local_addr().ok());
        let shutdown = Arc::new(AtomicBool::new(false));

        let mut senders = Vec::new();
        let mut wakers = Vec::new();
        let mut workers = Vec::new();
        // Every worker's poll and waker exist before any worker runs: the
        // shared tenant schedulers wake workers by index.
        let mut polls = Vec::new();
        for _ in 0..st.workers {
            let poll = Poll::new().map_err(StartError::Thread)?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(StartError::Thread)?);
            wakers.push(waker);
            polls.push(poll);
        }
        let grant_wakers = wakers.clone();
        tenants.set_waker(Box::new(move |i| {
            if let Some(w) = grant_wakers.get(i) {
                let _ = w.wake();
            }
        }));
        let mut receivers = Vec::new();
        for _ in 0..st.workers {
            let (tx, rx) = channel();
            senders.push(tx);
            receivers.push(rx);
        }
        let peers: Vec<(Sender<Incoming>, Arc<Waker>)> = senders
            .iter()
            .cloned()
            .zip(wakers.iter().cloned())
            .collect();
        let io_queues: Arc<Vec<AtomicUsize>> =
            Arc::new((0..st.workers).map(|_| AtomicUsize::new(0)).collect());
        for (id, (poll, rx)) in polls.into_iter().zip(receivers).enumerate() {
            let mut w = Worker::new(id, poll, rx, reg.clone(), shutdown.clone());
            w.peers = peers.clone();
            w.io_queues = io_queues.clone();
            w.tenancy = Some(WorkerTenancy::new(tenants.clone(), id));
            match TimerFd::new(&w.poll) {
                Ok(t) => w.timer = Some(t),
                Err(e) => {
                    tracing::warn!(error = %e, "no timerfd; timers will have millisecond granularity")
                }
            }
            let h = std::thread::Builder::new()
                .name(format!("sluice-worker-{id}"))
                .spawn(move || w.run())
                .map_err(StartError::Thread)?;
            workers.push(h);
        }

        let apoll = Poll::new().map_err(StartError::Thread)?;
        let acceptor_waker =
            Arc::new(Waker::new(apoll.registry(), WAKER).map_err(StartError::Thread)?);
        let mut io_l = TcpListener::from_std(std_listener);
        apoll
            .registry()
            .register(&mut io_l, LISTEN_IO, Interest::READABLE)
            .map_err(StartError::Thread)?;
        let mut disc_l = disc_listener.map(TcpListener::from_std);
        if let Some(l) = disc_l.as_mut() {
            apoll
                .registry()
                .register(l, LISTEN_DISC, Interest::READABLE)
                .map_err(StartError::Thread)?;
        }
        let acc = Acceptor {
            poll: apoll,
            io_l,
            disc_l,
            senders,
            wakers: wakers.clone(),
            shutdown: shutdown.clone(),
            next: AtomicUsize::new(0),
        };
        let acceptor = std::thread::Builder::new()
            .name("sluice-accept".into())
            .spawn(move || acc.run())
            .map_err(StartError::Thread)?;

        tracing::info!(listen = %local_addr, discovery = ?discovery_addr, workers = st.workers, polling = ?st.polling, "target started");
        Ok(TargetHandle {
            reg,
            shutdown,
            wakers,
            workers,
            acceptor: Some(acceptor),
            acceptor_waker,
            local_addr,
            discovery_addr,
            started: Instant::now(),
            tenants,
            admin,
            charging,
            io_queues,
        })
    }
}

impl TargetHandle {
    /// Address the I/O port is bound to (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
    pub fn discovery_addr(&self) -> Option<SocketAddr> {
        self.discovery_addr
    }
    pub fn registry(&self) -> &Arc<Registry> {
        &self.reg
    }
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
    /// Tenant table, counters and run-time updates.
    pub fn tenants(&self) -> &Arc<TenantRuntime> {
        &self.tenants
    }
    /// Live I/O queues on each worker (placed after their Connect).
    pub fn io_queues_per_worker(&self) -> Vec<usize> {
        self.io_queues
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Address of the admin endpoint, when configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr())
    }

    /// Graceful shutdown: stop accepting, let in-flight commands finish and
    /// their responses reach the hosts (bounded by `shutdown_drain_ms`),
    /// flush every backend, join the threads.
    pub fn shutdown(mut self) -> ShutdownReport {
        self.shutdown.store(true, Ordering::Release);
        let _ = self.acceptor_waker.wake();
        for w in &self.wakers {
            let _ = w.wake();
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let mut report = ShutdownReport::default();
        for h in self.workers.drain(..) {
            if let Ok(r) = h.join() {
                report.workers.push(r);
            }
        }
        if let Some(c) = self.charging.take() {
            c.stop();
        }
        report.process_cpu = process_cpu();
        report.send = self.reg.send.snapshot();
        report.io_commands = self.io_commands();
        report
    }

    /// Send path and coalescing totals so far (live queues as of their
    /// worker's last publish, see [`crate::metrics::SendTotals`]).
    pub fn send_totals(&self) -> crate::send::SendStats {
        self.reg.send.snapshot()
    }

    /// Read and Write commands served so far, all hosts.
    pub fn io_commands(&self) -> u64 {
        self.reg
            .hosts
            .snapshot()
            .iter()
            .map(|(_, s)| s.read_commands + s.write_commands)
            .sum()
    }
}

/// CPU time (user + system) of the whole process so far.
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the calling thread (one clock read: sample per batch, not per I/O).
pub fn thread_cpu() -> Duration {
    Duration::from_nanos(sluice_cpu::current_thread_cpu_ns())
}

struct Acceptor {
    poll: Poll,
    io_l: TcpListener,
    disc_l: Option<TcpListener>,
    senders: Vec<Sender<Incoming>>,
    wakers: Vec<Arc<Waker>>,
    shutdown: Arc<AtomicBool>,
    next: AtomicUsize,
}

impl Acceptor {
    fn run(mut self) {
        let mut events = Events::with_capacity(16);
        loop {
            if let Err(e) = self.poll.poll(&mut events, None) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "acceptor poll failed");
                    return;
                }
            }
            if self.shutdown.load(Ordering::Acquire) {
                return;
            }
            for ev in events.iter() {
                let l = match ev.token() {
                    LISTEN_IO => &self.io_l,
                    LISTEN_DISC => match &self.disc_l {
                        Some(l) => l,
                        None => continue,
                    },
                    _ => continue,
                };
                loop {
                    match l.accept() {
                        Ok((s, peer)) => {
                            let _ = s.set_nodelay(true);
                            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
                            if self.senders[i].send(Incoming::Accepted(s, peer)).is_ok() {
                                let _ = self.wakers[i].wake();
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            // EMFILE and friends: log, back off briefly, keep serving.
                            tracing::warn!(error = %e, "accept failed");
                            std::thread::sleep(Duration::from_millis(10));
                            break;
                        }
                    }
                }
            }
        }
    }
}

struct ConnEntry {
    stream: TcpStream,
    conn: QueueConnection,
    /// Readable edge seen and not yet read to WouldBlock.
    read_ready: bool,
    /// Last write hit WouldBlock; wait for a writable edge.
    write_blocked: bool,
    closed_socket: bool,
    /// (tenant table generation, tenant) once the host NQN is known.
    tenant: Option<(u64, TenantId)>,
    /// An I/O queue counted in `io_queues` (placed after its Connect).
    placed: bool,
}

/// What a worker's channel carries.
enum Incoming {
    /// A socket the acceptor dealt to this worker.
    Accepted(TcpStream, SocketAddr),
    /// An I/O queue another worker hands over right after its Connect, so
    /// that I/O queues spread evenly over workers (the acceptor cannot tell
    /// an admin queue from an I/O queue, and round robin would put every
    /// controller's single I/O queue on the same worker).
    Moved(Box<ConnEntry>),
}

struct BackendSlot {
    queue: Box<dyn BackendQueue>,
    notify_registered: bool,
}

struct Worker {
    id: usize,
    poll: Poll,
    rx: Receiver<Incoming>,
    /// Every worker's channel and waker (hand-overs), by worker index.
    peers: Vec<(Sender<Incoming>, Arc<Waker>)>,
    /// Live I/O queues per worker, shared by all workers.
    io_queues: Arc<Vec<AtomicUsize>>,
    reg: Arc<Registry>,
    shutdown: Arc<AtomicBool>,
    conns: Vec<Option<ConnEntry>>,
    free: Vec<usize>,
    queues: HashMap<usize, BackendSlot>,
    completions: Vec<IoCompletion>,
    connections_total: u64,
    /// Tenant scheduling and CPU accounting (always set by `Target::start`).
    tenancy: Option<WorkerTenancy>,
    /// epoll sleeps in whole milliseconds; a timerfd wakes us on time.
    timer: Option<TimerFd>,
}

/// A non-blocking CLOCK_MONOTONIC timerfd, armed with relative times.
#[derive(Debug)]
struct TimerFd {
    fd: std::os::fd::OwnedFd,
    armed: Option<Instant>,
}

impl TimerFd {
    fn new(poll: &Poll) -> io::Result<TimerFd> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain syscall; the returned fd is owned below.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        poll.registry()
            .register(&mut SourceFd(&fd.as_raw_fd()), TIMER, Interest::READABLE)?;
        Ok(TimerFd { fd, armed: None })
    }

    /// Arms the timer to fire `after` from now (re-arming replaces it).
    fn arm(&mut self, at: Instant, after: Duration) {
        use std::os::fd::AsRawFd;
        if self.armed == Some(at) {
            return;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                // A zero value would disarm: fire after at least 1 ns.
                tv_nsec: (after
                    .subsec_nanos()
                    .max(if after.as_secs() == 0 { 1 } else { 0 }))
                    as libc::c_long,
            },
        };
        // SAFETY: valid fd and itimerspec; the old value is not needed.
        if unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) }
            == 0
        {
            self.armed = Some(at);
        }
    }

    /// Clears the expiration count after the timer fired.
    fn drain(&mut self) {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 8];
        // SAFETY: reading 8 bytes into a valid buffer from our fd.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        self.armed = None;
    }
}

impl Worker {
    fn new(
        id: usize,
        poll: Poll,
        rx: Receiver<Incoming>,
        reg: Arc<Registry>,
        shutdown: Arc<AtomicBool>,
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
            queues: HashMap::new(),
            completions: Vec::new(),
            connections_total: 0,
            tenancy: None,
            timer: None,
        }
    }

    fn run(mut self) -> WorkerReport {
        let span = tracing::info_span!("worker", id = self.id);
        let _g = span.enter();
        let started = Instant::now();
        let mut events = Events::with_capacity(1024);
        let polling = self.reg.settings.polling;
        let mut last_work = Instant::now();
        let mut loops = 0u64;
        let mut drain_deadline: Option<Instant> = None;
        let mut next_publish = started + crate::metrics::SEND_PUBLISH_INTERVAL;
        loop {
            loops += 1;
            let now = Instant::now();
            if now >= next_publish {
                self.publish_send_stats();
                next_publish = now + crate::metrics::SEND_PUBLISH_INTERVAL;
            }
            let deadline = self.next_deadline(now);
            // Deadlines under SPIN_BELOW are met by polling; longer sleeps
            // use the timerfd (epoll itself sleeps in whole milliseconds).
            let until_deadline = deadline.map(|d| d.saturating_duration_since(now));
            let until_deadline = match (until_deadline, self.timer.as_mut()) {
                (Some(t), _) if t < SPIN_BELOW => Some(Duration::ZERO),
                (Some(t), Some(timer)) => {
                    if let Some(d) = deadline {
                        timer.arm(d, t);
                    }
                    None
                }
                (Some(t), None) if t < Duration::from_millis(1) => Some(Duration::ZERO),
                (other, _) => other,
            };
            let timeout = match polling {
                PollingMode::BusyPoll => Some(Duration::ZERO),
                PollingMode::Interrupt => until_deadline,
                PollingMode::Adaptive { spin_us } => {
                    if now.duration_since(last_work) < Duration::from_micros(spin_us) {
                        Some(Duration::ZERO)
                    } else {
                        until_deadline
                    }
                }
            };
            let timeout = if drain_deadline.is_some() {
                Some(
                    timeout
                        .unwrap_or(Duration::from_millis(10))
                        .min(Duration::from_millis(10)),
                )
            } else {
                timeout
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "worker poll failed");
                    break;
                }
            }
            let now = Instant::now();
            if let Some(t) = self.tenancy.as_mut() {
                // One thread-CPU clock read per loop batch, charged to the
                // tenants served in the previous batch.
                t.refresh(now);
                t.cpu_sample(thread_cpu(), now);
            }
            let mut work = !events.is_empty();
            for ev in events.iter() {
                let t = ev.token().0;
                if ev.token() == TIMER {
                    if let Some(timer) = self.timer.as_mut() {
                        timer.drain();
                    }
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
        self.flush_backends();
        for i in 0..self.conns.len() {
            self.remove_conn(i);
        }
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
        }
        for q in self.queues.values() {
            take(q.queue.next_deadline());
            if q.queue.in_flight() > 0 && !q.notify_registered && q.queue.next_deadline().is_none()
            {
                // Completions that neither notify nor have a deadline: poll soon.
                take(Some(now + Duration::from_micros(50)));
            }
        }
        if let Some(t) = self.tenancy.as_mut() {
            take(t.next_deadline(now));
        }
        d
    }

    fn accept_new(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Ok(incoming) = self.rx.try_recv() {
            any = true;
            let (mut stream, peer, moved) = match incoming {
                Incoming::Accepted(stream, peer) => (stream, Some(peer), None),
                Incoming::Moved(e) => {
                    let e = *e;
                    let peer = e.stream.peer_addr().ok();
                    (e.stream, peer, Some((e.conn, e.tenant)))
                }
            };
            let full = self.conns.iter().flatten().count() >= CONNECTIONS_PER_WORKER_MAX;
            if moved.is_none() && (self.shutdown.load(Ordering::Acquire) || full) {
                tracing::warn!(
                    ?peer,
                    "refusing connection (shutting down or connection limit reached)"
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
                    self.io_queues[self.id].fetch_sub(1, Ordering::Relaxed);
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
                    (
                        QueueConnection::new(self.reg.clone(), peer, local, now),
                        None,
                        false,
                    )
                }
            };
            self.conns[idx] = Some(ConnEntry {
                stream,
                conn,
                // A moved socket may hold bytes whose edge the old worker saw.
                read_ready: true,
                write_blocked: false,
                closed_socket: false,
                tenant,
                placed,
            });
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
        match tx.send(Incoming::Moved(Box::new(e))) {
            Ok(()) => {
                let _ = waker.wake();
                tracing::info!(qid, to = best, "I/O queue handed to a less loaded worker");
                self.free.push(i);
                self.publish_send_stats();
                true
            }
            Err(std::sync::mpsc::SendError(Incoming::Moved(mut e))) => {
                // The other worker is gone (shutdown): keep it here.
                counts[best].fetch_sub(1, Ordering::Relaxed);
                counts[self.id].fetch_add(1, Ordering::Relaxed);
                let token = Token(CONN_BASE + i);
                let _ = self.poll.registry().register(
                    &mut e.stream,
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                );
                e.read_ready = true;
                self.conns[i] = Some(*e);
                false
            }
            Err(_) => false,
        }
    }

    /// One pass over every connection and backend queue. Returns whether
    /// anything happened.
    fn drive(&mut self, now: Instant) -> bool {
        let mut work = false;
        for i in 0..self.conns.len() {
            if self.peers.len() > 1 && self.place_io_queue(i) {
                work = true;
                continue;
            }
            let Some(e) = self.conns[i].as_mut() else {
                continue;
            };
            let tenant = conn_tenant(e, self.tenancy.as_ref());
            let throttled = self.tenancy.as_ref().is_some_and(|t| t.throttled(tenant));
            if e.read_ready && e.conn.wants_read() && !throttled {
                work |= read_conn(e, now);
            }
            // Backend submissions.
            while let Some(sub) = e.conn.poll_backend() {
                work = true;
                let ns_index = sub.ns.index;
                let mut req = sub.req;
                req.tag = ((i as u64) << 32) | (req.tag & 0xffff_ffff);
                let slot = match self.queues.entry(ns_index) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        match sub.ns.backend.open_queue() {
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
                                })
                            }
                            Err(err) => {
                                tracing::error!(nsid = sub.ns.nsid, error = %err, "cannot open a backend queue");
                                self.completions.push(IoCompletion {
                                    tag: req.tag,
                                    result: Err(err),
                                    buf: req.buf,
                                });
                                continue;
                            }
                        }
                    }
                };
                match self.tenancy.as_mut() {
                    Some(t) => t.submit(ns_index, tenant, req, slot.queue.as_mut(), now),
                    None => slot.queue.submit(req, now),
                }
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
            let c = match self.tenancy.as_mut() {
                Some(t) => match t.complete(c, now) {
                    Some(c) => c,
                    None => continue,
                },
                None => c,
            };
            let idx = (c.tag >> 32) as usize;
            if let Some(Some(e)) = self.conns.get_mut(idx) {
                e.conn.handle_backend_completion(
                    IoCompletion {
                        tag: c.tag & 0xffff_ffff,
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
            let tenant = conn_tenant(e, self.tenancy.as_ref());
            let throttled = self.tenancy.as_ref().is_some_and(|t| t.throttled(tenant));
            if let Some(t) = e.conn.poll_timeout() {
                if t <= now {
                    e.conn.handle_timeout(now);
                }
            }
            // A response may have unblocked more input (back-pressure released).
            if e.read_ready && e.conn.wants_read() && !throttled {
                work |= read_conn(e, now);
            }
            if !e.write_blocked && !e.conn.due().is_empty() {
                work |= write_conn(e, now);
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
        let Some(t) = self.tenancy.as_mut() else {
            return false;
        };
        let mut any = false;
        for (ns, slot) in self.queues.iter_mut() {
            any |= t.dispatch(*ns, slot.queue.as_mut(), now);
        }
        any
    }

    /// Publishes the send counters of this worker's live connections.
    fn publish_send_stats(&self) {
        let mut s = crate::send::SendStats::default();
        for e in self.conns.iter().flatten() {
            s.add(&e.conn.send_stats());
        }
        self.reg.send.publish_live(self.id, s);
    }

    fn remove_conn(&mut self, i: usize) {
        if let Some(mut e) = self.conns.get_mut(i).and_then(|c| c.take()) {
            if e.placed {
                if let Some(c) = self.io_queues.get(self.id) {
                    c.fetch_sub(1, Ordering::Relaxed);
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

    /// Makes every completed write durable before the process exits.
    fn flush_backends(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for q in self.queues.values_mut() {
            q.queue.submit(
                IoRequest {
                    tag: u64::MAX,
                    op: IoOp::Flush,
                    offset_bytes: 0,
                    len_bytes: 0,
                    buf: None,
                },
                Instant::now(),
            );
        }
        let mut out = Vec::new();
        for q in self.queues.values_mut() {
            while q.queue.in_flight() > 0 && Instant::now() < deadline {
                q.queue.poll_completions(Instant::now(), &mut out);
                if q.queue.in_flight() > 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            for c in out.drain(..) {
                if let (u64::MAX, Err(e)) = (c.tag, &c.result) {
                    tracing::error!(error = %e, "final backend flush failed");
                }
            }
        }
    }
}

/// The connection's tenant, cached once its host NQN is known.
fn conn_tenant(e: &mut ConnEntry, t: Option<&WorkerTenancy>) -> TenantId {
    let Some(t) = t else { return 0 };
    let gen = t.generation();
    match e.tenant {
        Some((g, id)) if g == gen => id,
        _ => {
            let host = e.conn.hostnqn();
            let id = t.tenant_of(host);
            if host.is_some() {
                e.tenant = Some((gen, id));
            }
            id
        }
    }
}

fn read_conn(e: &mut ConnEntry, now: Instant) -> bool {
    let mut total = 0usize;
    loop {
        if !e.conn.wants_read() {
            return total > 0;
        }
        let buf = e.conn.recv_buf();
        match e.stream.read(buf) {
            Ok(0) => {
                e.read_ready = false;
                e.conn.handle_peer_closed("peer closed the connection");
                return true;
            }
            Ok(n) => {
                e.conn.handle_received(n, now);
                total += n;
                if total >= READ_BUDGET_BYTES {
                    // Leave read_ready set: more may be waiting.
                    return true;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                e.read_ready = false;
                return total > 0;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                e.read_ready = false;
                e.conn.handle_peer_closed(&format!("read error: {err}"));
                return true;
            }
        }
    }
}

fn write_conn(e: &mut ConnEntry, now: Instant) -> bool {
    let mut wrote = false;
    loop {
        let due = e.conn.due();
        if due.is_empty() {
            return wrote;
        }
        match e.stream.write(due) {
            Ok(0) => {
                e.conn.handle_peer_closed("socket accepted no bytes");
                return true;
            }
            Ok(n) => {
                wrote = true;
                e.conn.consume(n, now);
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                e.write_blocked = true;
                return wrote;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                e.conn.handle_peer_closed(&format!("write error: {err}"));
                return true;
            }
        }
    }
}
