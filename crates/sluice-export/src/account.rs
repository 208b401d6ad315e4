//! Per-export (per-tenant) CPU accounting and i-NVMe throttling, for the
//! shared exporter (`sluice nbd` serving several exports) and for
//! `sluice fuse` (one export).
//!
//! Every export is one tenant: its own `sluice-host` controller with its own
//! host NQN. Two kinds of threads do protocol work:
//!
//! * the exporter's **shared** threads, which register themselves
//!   ([`CpuAccountant::register_current_thread`]): the tokio runtime workers
//!   (NBD parsing, RMW, reply encoding, task wake-ups; from the runtime's
//!   `on_thread_start`) and, for FUSE, fuser's session thread (reads
//!   `/dev/fuse` and dispatches; it registers when it serves `FUSE_INIT`);
//! * each export's **own** threads, which work for that tenant only: its
//!   `sluice-host` queue threads (NVMe/TCP) and its NBD run-to-completion
//!   threads ([`ExportAccount::add_current_thread`]).
//!
//! Once per batch (default every 2 ms, never per I/O) the accountant reads
//! the per-thread CPU clocks of all of them. The shared threads' CPU of the
//! batch is split among the exports in proportion to the work each did in
//! that batch (`4096 + bytes` per completed request, [`ExportAccount::record`]);
//! each export's own queue threads' CPU is charged to it whole. A batch with
//! no work is left unattributed. The result feeds the sans-IO i-NVMe
//! [`Throttle`] of exports with a CPU share; a throttled export's NBD
//! connections stop reading their sockets until the throttle ends (TCP
//! back-pressure holds the client), see [`ExportAccount::wait_unthrottled`];
//! its FUSE session thread stops taking requests from `/dev/fuse` (the
//! kernel's FUSE queue holds the application), see
//! [`ExportAccount::block_while_throttled`].
//!
//! The split and the throttle decisions are [`SplitCore`] (virtual inputs,
//! unit-tested); [`CpuAccountant::spawn`] drives it from a thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_admin::metrics::{counter, counters, Esc};
use sluice_admin::prometheus_client::collector::Collector;
use sluice_admin::prometheus_client::encoding::DescriptorEncoder;
use sluice_admin::prometheus_client::registry::{Registry as MetricsRegistry, Unit};
use sluice_admin::routes;
use sluice_admin::schema::{ExportStats, ExportsReport, Status};
use sluice_cpu::{BatchCharger, Throttle, ThrottleParams};
use sluice_runtime::cast::nanos;
use sluice_runtime::sync::lock;

/// Supplies the TIDs of an export's own threads (its controller's queues).
pub type TidSource = Box<dyn Fn() -> Vec<i32> + Send + Sync>;

/// Counters and throttle state of one export, shared between its NBD
/// connections and the accountant.
pub struct ExportAccount {
    pub(crate) name: String,
    pub(crate) hostnqn: String,
    /// Fraction of one CPU (0, 1]; `None`: accounted, never throttled.
    pub(crate) cpu_share: Option<f64>,
    epoch: Instant,
    /// Requests completed and their payload bytes.
    pub(crate) ios: AtomicU64,
    pub(crate) bytes: AtomicU64,
    /// Work units of the current batch (taken by the accountant).
    units: AtomicU64,
    /// CPU charged in total, and the part from the export's own queue threads.
    pub(crate) cpu_ns: AtomicU64,
    pub(crate) own_cpu_ns: AtomicU64,
    pub(crate) throttle_events: AtomicU64,
    pub(crate) throttled_ns: AtomicU64,
    /// Throttled until this many ns after `epoch` (0: not throttled).
    until_ns: AtomicU64,
    tids: Option<TidSource>,
    /// Threads working for this export alone that come and go (the NBD
    /// run-to-completion threads, one per connection).
    own_threads: Mutex<Vec<i32>>,
    /// NBD connections by path, and the requests of run-to-completion
    /// connections: run on their queue, or handed to tasks.
    pub(crate) direct_connections: AtomicU64,
    pub(crate) task_connections: AtomicU64,
    pub(crate) direct_requests: AtomicU64,
    pub(crate) handed_off_requests: AtomicU64,
    pub(crate) direct_queues_replaced: AtomicU64,
    /// Requests of a FUSE session of our own, by path (`--transport
    /// uring`; `fuse::uring` counts into these).
    pub(crate) fuse: Arc<FuseRequestCounts>,
}

/// Requests a FUSE session of our own served, by path.
#[derive(Debug, Default)]
pub struct FuseRequestCounts {
    /// Over the kernel's FUSE-over-io_uring ring.
    pub ring: AtomicU64,
    /// Over `/dev/fuse` (before the ring is ready, forgets, interrupts, or
    /// all of them when the kernel offers no ring).
    pub dev_fuse: AtomicU64,
    /// Block I/Os the ring thread ran on its own NVMe/TCP queue.
    pub direct: AtomicU64,
    /// Of those, reads whose data the queue received straight into the
    /// ring entry's payload buffer (no copy on this side).
    pub reads_in_place: AtomicU64,
    /// Direct queues that replaced a failed one.
    pub direct_replaced: AtomicU64,
}

impl std::fmt::Debug for ExportAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportAccount")
            .field("name", &self.name)
            .field("hostnqn", &self.hostnqn)
            .field("cpu_share", &self.cpu_share)
            .finish_non_exhaustive()
    }
}

/// A snapshot of an export's counters.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportCounters {
    pub name: String,
    pub hostnqn: String,
    pub cpu_share: Option<f64>,
    pub ios: u64,
    pub bytes: u64,
    pub cpu: Duration,
    pub own_cpu: Duration,
    pub throttle_events: u64,
    pub throttled: Duration,
    /// NBD connections per path, and how the requests of run-to-completion
    /// connections ran (see [`ExportAccount::record_path`]).
    pub direct_connections: u64,
    pub task_connections: u64,
    pub direct_requests: u64,
    pub handed_off_requests: u64,
    /// Direct queues that replaced a failed one under a live connection.
    pub direct_queues_replaced: u64,
    /// A FUSE session of our own: requests over the ring and over
    /// `/dev/fuse`, block I/Os on the ring's own queue, its queues replaced.
    pub fuse_ring_requests: u64,
    pub fuse_dev_requests: u64,
    pub fuse_direct_ios: u64,
    pub fuse_reads_in_place: u64,
    pub fuse_direct_queues_replaced: u64,
}

impl ExportAccount {
    pub fn new(
        name: impl Into<String>,
        hostnqn: impl Into<String>,
        cpu_share: Option<f64>,
        epoch: Instant,
        tids: Option<TidSource>,
    ) -> Arc<ExportAccount> {
        Arc::new(ExportAccount {
            name: name.into(),
            hostnqn: hostnqn.into(),
            cpu_share,
            epoch,
            ios: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            units: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            own_cpu_ns: AtomicU64::new(0),
            throttle_events: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
            until_ns: AtomicU64::new(0),
            tids,
            own_threads: Mutex::new(Vec::new()),
            direct_connections: AtomicU64::new(0),
            task_connections: AtomicU64::new(0),
            direct_requests: AtomicU64::new(0),
            handed_off_requests: AtomicU64::new(0),
            direct_queues_replaced: AtomicU64::new(0),
            fuse: Arc::default(),
        })
    }

    /// Charges the calling thread's CPU to this export whole (as its own
    /// queue threads are) until [`Self::remove_current_thread`]. For a
    /// thread that works for this export alone.
    pub fn add_current_thread(&self) {
        lock(&self.own_threads).push(sluice_runtime::clock::current_tid());
    }

    /// Stops charging the calling thread (its CPU since the last batch is
    /// not charged: at most one batch of it).
    pub fn remove_current_thread(&self) {
        let tid = sluice_runtime::clock::current_tid();
        lock(&self.own_threads).retain(|t| *t != tid);
    }

    /// The TIDs charged to this export whole.
    fn own_tids(&self) -> Vec<i32> {
        let mut v = self.tids.as_ref().map_or_else(Vec::new, |f| f());
        v.extend(lock(&self.own_threads).iter().copied());
        v
    }

    /// One NBD connection entered its transmission phase on the
    /// run-to-completion path (`direct`) or the task path.
    pub fn record_connection(&self, direct: bool) {
        let c = if direct {
            &self.direct_connections
        } else {
            &self.task_connections
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A request of a run-to-completion connection started: on its queue
    /// (`direct`) or handed to a task.
    pub fn record_path(&self, direct: bool) {
        let c = if direct {
            &self.direct_requests
        } else {
            &self.handed_off_requests
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A run-to-completion connection got a new direct queue after its
    /// queue failed.
    pub fn record_queue_replaced(&self) {
        self.direct_queues_replaced.fetch_add(1, Ordering::Relaxed);
    }

    /// One request done for this export (`bytes` of payload).
    pub fn record(&self, bytes: u64) {
        self.ios.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.units.fetch_add(4096 + bytes, Ordering::Relaxed);
    }

    /// When the export is throttled, the instant the throttle ends.
    pub fn throttled_until(&self) -> Option<Instant> {
        let u = self.until_ns.load(Ordering::Acquire);
        if u == 0 {
            return None;
        }
        let t = self.epoch + Duration::from_nanos(u);
        (t > Instant::now()).then_some(t)
    }

    /// Sleeps while the export is throttled (the NBD connection calls this
    /// before reading its socket and before dispatching each request). Each
    /// sleep lasts at most one sub-throttle (`period / k`).
    pub async fn wait_unthrottled(&self) {
        while let Some(t) = self.throttled_until() {
            tokio::time::sleep_until(t.into()).await;
        }
    }

    /// Blocks the calling thread while the export is throttled, like
    /// [`ExportAccount::wait_unthrottled`] (the FUSE session thread calls
    /// this before dispatching a read, write or fallocate, so the kernel
    /// queues the application's requests). Returns how long it waited.
    pub fn block_while_throttled(&self) -> Duration {
        let start = Instant::now();
        while let Some(t) = self.throttled_until() {
            std::thread::sleep(t.saturating_duration_since(Instant::now()));
        }
        start.elapsed()
    }

    fn set_until(&self, t: Option<Instant>) {
        let v = t.map_or(0, |t| nanos(t.saturating_duration_since(self.epoch)).max(1));
        self.until_ns.store(v, Ordering::Release);
    }

    pub fn counters(&self) -> ExportCounters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ExportCounters {
            name: self.name.clone(),
            hostnqn: self.hostnqn.clone(),
            cpu_share: self.cpu_share,
            ios: l(&self.ios),
            bytes: l(&self.bytes),
            cpu: Duration::from_nanos(l(&self.cpu_ns)),
            own_cpu: Duration::from_nanos(l(&self.own_cpu_ns)),
            throttle_events: l(&self.throttle_events),
            throttled: Duration::from_nanos(l(&self.throttled_ns)),
            direct_connections: l(&self.direct_connections),
            task_connections: l(&self.task_connections),
            direct_requests: l(&self.direct_requests),
            handed_off_requests: l(&self.handed_off_requests),
            direct_queues_replaced: l(&self.direct_queues_replaced),
            fuse_ring_requests: l(&self.fuse.ring),
            fuse_dev_requests: l(&self.fuse.dev_fuse),
            fuse_direct_ios: l(&self.fuse.direct),
            fuse_reads_in_place: l(&self.fuse.reads_in_place),
            fuse_direct_queues_replaced: l(&self.fuse.direct_replaced),
        }
    }
}

/// The sans-IO part: one batch's CPU split and the throttles.
#[derive(Debug)]
pub struct SplitCore {
    charger: BatchCharger,
    throttles: Vec<Option<Throttle>>,
    out: Vec<(u32, u64)>,
    charged: Vec<u64>,
    /// Shared-thread CPU of batches with no work.
    pub(crate) unattributed_ns: u64,
}

impl SplitCore {
    /// `shares[i]`: export i's CPU share (None: never throttled).
    pub fn new(shares: &[Option<f64>], p: ThrottleParams) -> SplitCore {
        SplitCore {
            charger: BatchCharger::default(),
            throttles: shares
                .iter()
                .map(|s| s.map(|s| Throttle::new(s, p)))
                .collect(),
            out: Vec::new(),
            charged: vec![0; shares.len()],
            unattributed_ns: 0,
        }
    }

    /// One batch: `shared_ns` of shared-thread CPU split by `units`, plus
    /// each export's `own_ns`. Returns the CPU charged to each export in
    /// this batch; the throttles are charged with it.
    pub fn batch(&mut self, now: Instant, shared_ns: u64, own_ns: &[u64], units: &[u64]) -> &[u64] {
        for c in &mut self.charged {
            *c = 0;
        }
        for (i, u) in (0u32..).zip(units) {
            if *u > 0 {
                self.charger.add(i, *u);
            }
        }
        self.charger.charge(shared_ns, &mut self.out);
        if self.out.is_empty() {
            self.unattributed_ns += shared_ns;
        }
        for (i, ns) in &self.out {
            self.charged[*i as usize] += ns;
        }
        for (i, ns) in own_ns.iter().enumerate() {
            self.charged[i] += ns;
        }
        for (i, th) in self.throttles.iter_mut().enumerate() {
            if let Some(th) = th {
                let _ = th.is_throttled(now);
                th.charge(self.charged[i], now);
            }
        }
        &self.charged
    }

    /// Whether export `i` is throttled at `now`, and until when.
    pub fn throttled_until(&mut self, i: usize, now: Instant) -> Option<Instant> {
        let th = self.throttles.get_mut(i)?.as_mut()?;
        if th.is_throttled(now) {
            th.next_deadline()
        } else {
            None
        }
    }

    /// (events, throttled time) of export `i`'s throttle.
    pub fn throttle_stats(&self, i: usize) -> (u64, Duration) {
        match self.throttles.get(i) {
            Some(Some(th)) => (th.events, th.throttled),
            _ => (0, Duration::ZERO),
        }
    }
}

/// Registry of shared threads plus the exports; runs the batch loop.
#[derive(Debug)]
pub struct CpuAccountant {
    epoch: Instant,
    shared_tids: Mutex<Vec<i32>>,
    exports: Mutex<Vec<Arc<ExportAccount>>>,
    unattributed_ns: AtomicU64,
    stop: AtomicBool,
}

impl CpuAccountant {
    pub fn new() -> Arc<CpuAccountant> {
        Arc::new(CpuAccountant {
            epoch: Instant::now(),
            shared_tids: Mutex::new(Vec::new()),
            exports: Mutex::new(Vec::new()),
            unattributed_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    /// Registers the calling thread as a shared protocol thread (call from
    /// the tokio runtime's `on_thread_start`, or from the FUSE session
    /// thread). Registering a thread twice has no effect.
    pub fn register_current_thread(&self) {
        let tid = sluice_cpu::current_tid();
        let mut g = lock(&self.shared_tids);
        if !g.contains(&tid) {
            g.push(tid);
        }
    }

    /// TIDs of the registered shared threads.
    pub fn shared_tids(&self) -> Vec<i32> {
        lock(&self.shared_tids).clone()
    }

    /// A new export account on this accountant's clock.
    pub fn add_export(
        &self,
        name: &str,
        hostnqn: &str,
        cpu_share: Option<f64>,
        tids: Option<TidSource>,
    ) -> Arc<ExportAccount> {
        let a = ExportAccount::new(name, hostnqn, cpu_share, self.epoch, tids);
        lock(&self.exports).push(a.clone());
        a
    }

    pub fn exports(&self) -> Vec<Arc<ExportAccount>> {
        lock(&self.exports).clone()
    }

    pub fn unattributed(&self) -> Duration {
        Duration::from_nanos(self.unattributed_ns.load(Ordering::Relaxed))
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Starts the batch loop on its own thread (add the exports first).
    pub fn spawn(
        self: &Arc<Self>,
        batch: Duration,
        p: ThrottleParams,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("sluice-cpu-acct".into())
            .spawn(move || me.run(batch, p))
    }

    fn run(&self, batch: Duration, p: ThrottleParams) {
        let exports = self.exports();
        let shares: Vec<Option<f64>> = exports.iter().map(|e| e.cpu_share).collect();
        let mut core = SplitCore::new(&shares, p);
        let mut last: HashMap<i32, u64> = HashMap::new();
        // Delta of a thread's CPU clock since the previous batch.
        fn delta(last: &mut HashMap<i32, u64>, tid: i32, seen: &mut Vec<i32>) -> u64 {
            seen.push(tid);
            let Some(now) = sluice_cpu::thread_cpu_ns(tid) else {
                return 0;
            };
            let prev = last.insert(tid, now);
            prev.map_or(0, |p| now.saturating_sub(p))
        }
        let mut own = vec![0u64; exports.len()];
        let mut units = vec![0u64; exports.len()];
        let mut seen = Vec::new();
        // Prime the clocks so the first batch does not charge history.
        let mut first = true;
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(batch);
            seen.clear();
            let tids = self.shared_tids();
            let shared: u64 = tids.iter().map(|t| delta(&mut last, *t, &mut seen)).sum();
            for (i, e) in exports.iter().enumerate() {
                own[i] = e
                    .own_tids()
                    .into_iter()
                    .filter(|t| *t > 0)
                    .map(|t| delta(&mut last, t, &mut seen))
                    .sum();
                units[i] = e.units.swap(0, Ordering::Relaxed);
            }
            if first {
                first = false;
                continue;
            }
            let now = Instant::now();
            let before = core.unattributed_ns;
            let charged = core.batch(now, shared, &own, &units).to_vec();
            self.unattributed_ns
                .fetch_add(core.unattributed_ns - before, Ordering::Relaxed);
            for (i, e) in exports.iter().enumerate() {
                e.cpu_ns.fetch_add(charged[i], Ordering::Relaxed);
                e.own_cpu_ns.fetch_add(own[i], Ordering::Relaxed);
                e.set_until(core.throttled_until(i, now));
                let (ev, t) = core.throttle_stats(i);
                e.throttle_events.store(ev, Ordering::Relaxed);
                e.throttled_ns.store(nanos(t), Ordering::Relaxed);
            }
            // Forget threads that are gone (reconnects start new ones).
            if last.len() > 4 * seen.len().max(16) {
                last.retain(|t, _| seen.contains(t));
            }
        }
        for e in &exports {
            e.set_until(None);
        }
    }

    /// The per-export counters as the admin API's JSON document.
    pub fn report(&self) -> ExportsReport {
        ExportsReport {
            unattributed_cpu_seconds: self.unattributed().as_secs_f64(),
            exports: self
                .exports()
                .iter()
                .map(|e| {
                    let c = e.counters();
                    ExportStats {
                        name: c.name,
                        hostnqn: c.hostnqn,
                        cpu_share: c.cpu_share,
                        ios: c.ios,
                        bytes: c.bytes,
                        cpu_seconds: c.cpu.as_secs_f64(),
                        queue_cpu_seconds: c.own_cpu.as_secs_f64(),
                        throttle_events: c.throttle_events,
                        throttle_seconds: c.throttled.as_secs_f64(),
                        nbd_direct_connections: c.direct_connections,
                        nbd_task_connections: c.task_connections,
                        nbd_direct_requests: c.direct_requests,
                        nbd_handed_off_requests: c.handed_off_requests,
                        fuse_ring_requests: c.fuse_ring_requests,
                        fuse_dev_requests: c.fuse_dev_requests,
                        fuse_direct_ios: c.fuse_direct_ios,
                        fuse_reads_in_place: c.fuse_reads_in_place,
                    }
                })
                .collect(),
        }
    }

    /// The per-export counters as metrics text (logs and tests).
    pub fn prometheus(self: &Arc<Self>) -> String {
        let mut reg = MetricsRegistry::default();
        reg.register_collector(Box::new(ExportCollector(self.clone())));
        sluice_admin::metrics::encode(&reg).unwrap_or_default()
    }
}

/// Reads the exports' atomic counters at scrape time.
#[derive(Debug)]
pub struct ExportCollector(pub Arc<CpuAccountant>);

impl Collector for ExportCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let ex: Vec<ExportCounters> = self.0.exports().iter().map(|e| e.counters()).collect();
        let e = &mut enc;
        type F = fn(&ExportCounters) -> f64;
        let families: [(&str, &str, Option<Unit>, F); 16] = [
            (
                "sluice_export_ios",
                "requests completed (NBD requests; FUSE reads, writes, fallocates, flushes)",
                None,
                |c| c.ios as f64,
            ),
            (
                "sluice_export_bytes",
                "payload bytes read and written",
                None,
                |c| c.bytes as f64,
            ),
            (
                "sluice_export_cpu",
                "exporter CPU charged (shared threads by work, plus own queue threads)",
                Some(Unit::Seconds),
                |c| c.cpu.as_secs_f64(),
            ),
            (
                "sluice_export_queue_cpu",
                "CPU of the export's own NVMe/TCP queue threads",
                Some(Unit::Seconds),
                |c| c.own_cpu.as_secs_f64(),
            ),
            (
                "sluice_export_throttle_events",
                "i-NVMe throttle events",
                None,
                |c| c.throttle_events as f64,
            ),
            (
                "sluice_export_throttle",
                "time throttled",
                Some(Unit::Seconds),
                |c| c.throttled.as_secs_f64(),
            ),
            (
                "sluice_export_nbd_direct_connections",
                "NBD connections served run to completion (own thread and queue)",
                None,
                |c| c.direct_connections as f64,
            ),
            (
                "sluice_export_nbd_task_connections",
                "NBD connections served by per-request tasks",
                None,
                |c| c.task_connections as f64,
            ),
            (
                "sluice_export_nbd_direct_requests",
                "requests of run-to-completion connections run on their queue",
                None,
                |c| c.direct_requests as f64,
            ),
            (
                "sluice_export_nbd_handed_off_requests",
                "requests of run-to-completion connections handed to tasks (unaligned, trim, zeroes, block status, refusals, retries)",
                None,
                |c| c.handed_off_requests as f64,
            ),
            (
                "sluice_export_nbd_direct_queues_replaced",
                "direct queues that replaced a failed one under a live connection",
                None,
                |c| c.direct_queues_replaced as f64,
            ),
            (
                "sluice_export_fuse_ring_requests",
                "FUSE requests served over the kernel's io_uring ring (--transport uring)",
                None,
                |c| c.fuse_ring_requests as f64,
            ),
            (
                "sluice_export_fuse_dev_requests",
                "FUSE requests of a session of our own served over /dev/fuse (before the ring is ready, forgets, interrupts; all when the kernel offers no ring)",
                None,
                |c| c.fuse_dev_requests as f64,
            ),
            (
                "sluice_export_fuse_direct_ios",
                "block I/Os the FUSE ring thread ran on its own NVMe/TCP queue",
                None,
                |c| c.fuse_direct_ios as f64,
            ),
            (
                "sluice_export_fuse_reads_in_place",
                "reads on the FUSE ring's own queue received straight into the ring's reply buffer",
                None,
                |c| c.fuse_reads_in_place as f64,
            ),
            (
                "sluice_export_fuse_direct_queues_replaced",
                "direct queues the FUSE ring got to replace a failed one",
                None,
                |c| c.fuse_direct_queues_replaced as f64,
            ),
        ];
        for (name, help, unit, f) in families {
            counters(
                e,
                name,
                help,
                unit.as_ref(),
                ex.iter().map(|c| {
                    (
                        [("export", Esc(&c.name)), ("hostnqn", Esc(&c.hostnqn))],
                        f(c),
                    )
                }),
            )?;
        }
        counter(
            e,
            "sluice_export_unattributed_cpu",
            "shared-thread CPU of batches without work",
            Some(&Unit::Seconds),
            self.0.unattributed().as_secs_f64(),
        )
    }
}

/// The exporter's parts of the admin API: `GET /metrics` (the exports'
/// counters and `extra`, such as the volumes' isolation),
/// `GET /v1/status`, `GET /v1/exports` (for [`sluice_admin::compose`]).
pub fn admin_parts(
    acct: Arc<CpuAccountant>,
    service: &str,
    extra: Vec<Box<dyn Collector>>,
) -> Vec<sluice_admin::Router> {
    let started = Instant::now();
    let mut reg = MetricsRegistry::default();
    reg.register_collector(Box::new(ExportCollector(acct.clone())));
    for c in extra {
        reg.register_collector(c);
    }
    let (a1, a2) = (acct.clone(), acct);
    let service = service.to_string();
    vec![
        routes::metrics(Arc::new(reg)),
        routes::get_json("/v1/status", move || Status {
            service: service.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_seconds: started.elapsed().as_secs_f64(),
            exports: Some(a1.exports().len()),
            ..Default::default()
        }),
        routes::get_json("/v1/exports", move || a2.report()),
    ]
}

/// A CPU share that is not a fraction of one CPU.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CpuShareError {
    #[error("`{0}` is not a number")]
    NotANumber(String),
    #[error("{0} must be in (0, 1] (a fraction of one CPU)")]
    OutOfRange(String),
}

/// Parses a CPU share: a fraction of one CPU in (0, 1] (NaN, infinities,
/// 0 and negative values are refused).
pub fn parse_cpu_share(s: &str) -> Result<f64, CpuShareError> {
    let s = s.trim();
    let f: f64 = s
        .parse()
        .map_err(|_| CpuShareError::NotANumber(s.to_string()))?;
    if f > 0.0 && f <= 1.0 {
        Ok(f)
    } else {
        Err(CpuShareError::OutOfRange(s.to_string()))
    }
}

/// One `--export NAME,nqn=SUBNQN,hostnqn=NQN[,nsid=N][,cpu-share=F][,cgroup=PATH][,read-only=1]`
/// of a shared exporter.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSpec {
    pub name: String,
    pub nqn: String,
    pub hostnqn: String,
    pub nsid: Option<u32>,
    pub cpu_share: Option<f64>,
    pub cgroup: Option<std::path::PathBuf>,
    pub read_only: bool,
}

impl std::str::FromStr for ExportSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let name = parts.next().unwrap_or_default().trim();
        if name.is_empty() || name.contains('=') {
            return Err(format!("--export `{s}` must start with an export name"));
        }
        let mut e = ExportSpec {
            name: name.into(),
            nqn: String::new(),
            hostnqn: String::new(),
            nsid: None,
            cpu_share: None,
            cgroup: None,
            read_only: false,
        };
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("--export {name}: `{kv}` is not key=value"))?;
            let v = v.trim();
            match k.trim() {
                "nqn" => e.nqn = v.into(),
                "hostnqn" => e.hostnqn = v.into(),
                "nsid" => {
                    e.nsid = Some(
                        v.parse()
                            .map_err(|_| format!("--export {name}: nsid `{v}` is not a number"))?,
                    )
                }
                "cpu-share" | "cpu_share" => {
                    e.cpu_share = Some(
                        parse_cpu_share(v)
                            .map_err(|err| format!("--export {name}: cpu-share {err}"))?,
                    );
                }
                "cgroup" => {
                    if v.is_empty() {
                        return Err(format!("--export {name}: cgroup= needs a path"));
                    }
                    e.cgroup = Some(v.into())
                }
                "read-only" | "read_only" => {
                    e.read_only = match v {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        o => return Err(format!("--export {name}: read-only=`{o}` is not 0 or 1")),
                    }
                }
                other => return Err(format!("--export {name}: unknown key `{other}`")),
            }
        }
        if e.nqn.is_empty() {
            return Err(format!("--export {name}: nqn=SUBNQN is required"));
        }
        if e.hostnqn.is_empty() {
            return Err(format!(
                "--export {name}: hostnqn=NQN is required (it is the tenant)"
            ));
        }
        Ok(e)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn metrics_and_report_keep_their_names() {
        let acct = CpuAccountant::new();
        let e = acct.add_export("g\"old", "nqn.h", Some(0.5), None);
        e.record(4096);
        let text = acct.prometheus();
        let s = sluice_admin::metrics::parse_text(&text);
        for fam in [
            "sluice_export_ios_total",
            "sluice_export_bytes_total",
            "sluice_export_cpu_seconds_total",
            "sluice_export_queue_cpu_seconds_total",
            "sluice_export_throttle_events_total",
            "sluice_export_throttle_seconds_total",
            "sluice_export_unattributed_cpu_seconds_total",
        ] {
            assert!(s.iter().any(|x| x.0 == fam), "{fam} missing in\n{text}");
        }
        let ios = s.iter().find(|x| x.0 == "sluice_export_ios_total").unwrap();
        assert_eq!(ios.2, 1.0);
        assert!(ios
            .1
            .contains(&("export".to_string(), "g\"old".to_string())));
        let r = acct.report();
        assert_eq!((r.exports[0].ios, r.exports[0].bytes), (1, 4096));
    }

    #[test]
    fn export_spec_syntax() {
        let e: ExportSpec =
            "gold,nqn=nqn.s,hostnqn=nqn.h1,nsid=2,cpu-share=0.25,cgroup=/sys/fs/cgroup/cpu/g"
                .parse()
                .unwrap();
        assert_eq!(
            (
                e.name.as_str(),
                e.nqn.as_str(),
                e.hostnqn.as_str(),
                e.nsid,
                e.cpu_share
            ),
            ("gold", "nqn.s", "nqn.h1", Some(2), Some(0.25))
        );
        assert_eq!(e.cgroup.unwrap().to_str(), Some("/sys/fs/cgroup/cpu/g"));
        for bad in [
            "nqn=x",
            "a,nqn=s",
            "a,hostnqn=h",
            "a,nqn=s,hostnqn=h,cpu-share=0",
            "a,nqn=s,hostnqn=h,cpu-share=1.5",
            "a,nqn=s,hostnqn=h,cpu-share=-1",
            "a,nqn=s,hostnqn=h,nsid=x",
            "a,nqn=s,hostnqn=h,foo=1",
            "a,nqn=s,hostnqn=h,cgroup=",
        ] {
            assert!(bad.parse::<ExportSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu_share_must_be_a_fraction_of_one_cpu() {
        for (ok, want) in [("0.05", 0.05), ("1", 1.0), (" 0.5 ", 0.5), ("1e-3", 0.001)] {
            assert_eq!(parse_cpu_share(ok), Ok(want), "{ok}");
        }
        for bad in ["0", "-0.1", "1.5", "NaN", "nan", "inf", "-inf"] {
            assert!(
                matches!(parse_cpu_share(bad), Err(CpuShareError::OutOfRange(_))),
                "{bad}"
            );
        }
        for bad in ["", "abc", "0.5x", "1/2"] {
            assert!(
                matches!(parse_cpu_share(bad), Err(CpuShareError::NotANumber(_))),
                "{bad}"
            );
        }
        let e = parse_cpu_share("2").unwrap_err().to_string();
        assert!(e.contains("(0, 1]"), "{e}");
    }

    #[test]
    fn blocking_wait_lasts_until_the_throttle_ends() {
        let a = ExportAccount::new("e", "h", Some(0.1), Instant::now(), None);
        assert!(a.block_while_throttled() < Duration::from_millis(5));
        a.set_until(Some(Instant::now() + Duration::from_millis(30)));
        let waited = a.block_while_throttled();
        assert!(
            waited >= Duration::from_millis(25) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        assert_eq!(a.throttled_until(), None);
    }

    #[test]
    fn shared_cpu_split_by_bytes_own_cpu_whole() {
        let mut c = SplitCore::new(&[None, None, None], ThrottleParams::default());
        let now = Instant::now();
        // 1 ms of shared CPU; export 0 did 3x the work of export 1; export 2 idle
        // but its queue threads used 100 µs.
        let got = c
            .batch(now, 1_000_000, &[0, 0, 100_000], &[3 * 8192, 8192, 0])
            .to_vec();
        assert_eq!(got, vec![750_000, 250_000, 100_000]);
        assert_eq!(got[0] + got[1], 1_000_000, "the split is exact");
        // A batch with no work: shared CPU unattributed, own CPU still charged.
        let got = c.batch(now, 500_000, &[7, 0, 0], &[0, 0, 0]).to_vec();
        assert_eq!(got, vec![7, 0, 0]);
        assert_eq!(c.unattributed_ns, 500_000);
    }

    #[test]
    fn capped_export_is_throttled_other_is_not() {
        // Export 0 capped at 10 % of a CPU, export 1 uncapped; both always
        // busy with equal work; the shared threads use all the wall time of
        // one CPU. With the throttle, export 0 stops contributing work while
        // throttled, so its charged CPU over time stays near its cap.
        let p = ThrottleParams::default();
        let mut c = SplitCore::new(&[Some(0.1), None], p);
        let t0 = Instant::now();
        let mut now = t0;
        let batch = Duration::from_millis(1);
        let mut total = [0u64; 2];
        let horizon = Duration::from_secs(5);
        while now < t0 + horizon {
            now += batch;
            let busy0 = c.throttled_until(0, now).is_none();
            let units = [if busy0 { 8192 } else { 0 }, 8192];
            let got = c.batch(now, batch.as_nanos() as u64, &[0, 0], &units);
            total[0] += got[0];
            total[1] += got[1];
        }
        let f0 = total[0] as f64 / horizon.as_nanos() as f64;
        assert!(c.throttle_stats(0).0 > 0);
        assert_eq!(c.throttle_stats(1).0, 0);
        assert!((0.05..=0.15).contains(&f0), "capped export used {f0}");
        assert!(total[1] > 5 * total[0]);
    }
}
