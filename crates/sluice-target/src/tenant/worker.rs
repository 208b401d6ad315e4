//! What a worker thread does for tenants: queue backend I/O per tenant and
//! let the namespace's shared [`BackendArbiter`] decide what goes next
//! (target-wide weights, reservations, limits and dispatch window), keep
//! per-tenant telemetry, sample the thread CPU clock once per loop batch and
//! charge it, and skip the sockets of tenants the shared [`CpuGovernor`]
//! has throttled.
//!
//! Latency: one [`Latency`] histogram per tenant per worker, recorded at
//! completion without a lock or an allocation, merged into the tenant's
//! shared histogram every [`MERGE_INTERVAL`] by [`WorkerTenancy::refresh`]
//! (and when the worker ends); see [`super::latency`].
//!
//! [`BackendArbiter`]: super::shared::BackendArbiter
//! [`CpuGovernor`]: super::shared::CpuGovernor

use super::latency::{Latency, MERGE_INTERVAL};
use super::rate::Dir;
use super::shared::Grant;
use super::{TenantId, TenantRuntime, TenantTable};
use crate::tag::BackendTag;
use foldhash::HashMap;
use sluice_backend::{AlignedBuf, BackendError, BackendQueue, IoCompletion, IoOp, IoRequest};
use sluice_config::tenants::SchedulerMode;
use sluice_cpu::BatchCharger;
use sluice_runtime::cast::{nanos, usize_from};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Work units per command (capsule in, response out) and per 16 KiB of
/// data moved (C2H/H2C PDUs, copies, digests).
const UNITS_PER_COMMAND: u64 = 2;
const BYTES_PER_UNIT: u64 = 16 * 1024;

#[derive(Debug, Clone, Copy)]
struct Meta {
    ns: usize,
    tenant: TenantId,
    dir: Dir,
    bytes: u64,
    arrived: Instant,
    /// When it was handed to the backend queue (its arrival until then).
    dispatched: Instant,
    scheduled: bool,
    cost: u64,
    /// A piece of a split request: (parent tag, offset in the parent).
    parent: Option<(u64, u64)>,
}

/// A request split into pieces (`[tenants] split_bytes`), waiting for them.
struct Split {
    /// The whole request's telemetry.
    meta: Meta,
    /// The parent's buffer: read pieces are copied in, returned at the end.
    buf: Option<AlignedBuf>,
    remaining: u64,
    result: Result<(), BackendError>,
}

/// This worker's requests waiting for the scheduler of one namespace.
#[derive(Default)]
struct NsLocal {
    /// One FIFO per tenant, in the order the arbiter was told of them.
    fifos: Vec<VecDeque<IoRequest>>,
    queued: usize,
    /// A completion freed room or a request was queued: arbitrate.
    dirty: bool,
}

/// Per-worker tenant state.
pub struct WorkerTenancy {
    id: usize,
    rt: Arc<TenantRuntime>,
    table: Arc<TenantTable>,
    local: HashMap<usize, NsLocal>,
    meta: HashMap<u64, Meta>,
    splits: HashMap<u64, Split>,
    next_piece: u64,
    charger: BatchCharger,
    charged: Vec<(TenantId, u64)>,
    last_cpu: Option<Duration>,
    /// Which tenants are throttled, as of this loop iteration.
    throttled: Vec<bool>,
    ended: Vec<(TenantId, u64)>,
    started: Vec<TenantId>,
    mine: Vec<Grant>,
    wake: Vec<usize>,
    /// This worker's latency histograms, by tenant id (one per tenant of
    /// the table, allocated when the table changes, not per I/O).
    lat: Vec<Option<Latency>>,
    /// Samples recorded since the last merge.
    lat_pending: bool,
    /// When the histograms are next merged into the shared ones.
    next_merge: Instant,
    /// Slow backend I/Os per namespace index: when this worker last logged
    /// one, and how many it has not logged since.
    slow_log: HashMap<usize, SlowLog>,
}

/// One WARN line per namespace per worker per this interval for backend
/// I/Os of `target.slow_io_ms` or longer; the line says how many it did not
/// log.
pub const SLOW_IO_LOG_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct SlowLog {
    logged: Instant,
    suppressed: u64,
}

impl std::fmt::Debug for WorkerTenancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerTenancy")
            .field("id", &self.id)
            .field("generation", &self.table.generation)
            .field("queued", &self.queued())
            .field("meta", &self.meta.len())
            .finish()
    }
}

fn dir_of(op: &IoOp) -> Dir {
    match op {
        IoOp::Read => Dir::Read,
        IoOp::Write { .. } => Dir::Write,
        _ => Dir::Other,
    }
}

impl WorkerTenancy {
    /// State of worker `id` (its index in the grant lists).
    pub fn new(rt: Arc<TenantRuntime>, id: usize) -> Self {
        assert!(id < rt.workers, "worker {id} of {}", rt.workers);
        let table = rt.table();
        let mut w = WorkerTenancy {
            id,
            rt,
            table,
            local: HashMap::default(),
            meta: HashMap::default(),
            splits: HashMap::default(),
            next_piece: 0,
            charger: BatchCharger::default(),
            charged: Vec::new(),
            last_cpu: None,
            throttled: Vec::new(),
            ended: Vec::new(),
            started: Vec::new(),
            mine: Vec::new(),
            wake: Vec::new(),
            lat: Vec::new(),
            lat_pending: false,
            next_merge: Instant::now() + MERGE_INTERVAL,
            slow_log: HashMap::default(),
        };
        w.alloc_histograms();
        w
    }

    /// A histogram for every tenant of the table (tenant ids only grow).
    fn alloc_histograms(&mut self) {
        for (id, _) in self.table.iter() {
            let i = id as usize;
            if self.lat.len() <= i {
                self.lat.resize_with(i + 1, || None);
            }
            if self.lat[i].is_none() {
                self.lat[i] = Some(Latency::new());
            }
        }
    }

    /// Adds this worker's latency histograms into the tenants' shared ones
    /// and empties them (a lock per tenant with samples).
    pub fn merge_latency(&mut self) {
        for (id, h) in (0..).zip(self.lat.iter_mut()) {
            if let Some(h) = h.as_mut().filter(|h| !h.is_empty()) {
                self.rt.stats(id).merge_latency(h);
            }
        }
        self.lat_pending = false;
    }

    pub fn runtime(&self) -> &Arc<TenantRuntime> {
        &self.rt
    }

    /// Once per loop iteration: picks up a new tenant table (cheap when
    /// unchanged) and which tenants are throttled now.
    pub fn refresh(&mut self, now: Instant) {
        if self.rt.generation() != self.table.generation {
            self.table = self.rt.table();
            self.alloc_histograms();
        }
        if now >= self.next_merge {
            if self.lat_pending {
                self.merge_latency();
            }
            self.next_merge = now + MERGE_INTERVAL;
        }
        self.rt
            .cpu
            .snapshot(now, &mut self.throttled, &mut self.ended);
        for (t, ns) in self.ended.drain(..) {
            self.rt.stats(t).throttle_ns.fetch_add(ns, Relaxed);
        }
    }

    /// The table generation, for caching a connection's tenant.
    pub fn generation(&self) -> u64 {
        self.table.generation
    }

    pub fn tenant_of(&self, hostnqn: Option<&str>) -> TenantId {
        self.table.tenant_of(hostnqn)
    }

    /// A tenant's name in the current table.
    pub fn tenant_name(&self, id: TenantId) -> Option<&str> {
        self.table.spec(id).map(|s| s.name.as_str())
    }

    /// Queues (or, with the scheduler off, submits) a backend request whose
    /// tag is already worker-unique.
    pub fn submit(
        &mut self,
        ns: usize,
        tenant: TenantId,
        req: IoRequest,
        queue: &mut dyn BackendQueue,
        now: Instant,
    ) {
        let dir = dir_of(&req.op);
        let bytes = if dir == Dir::Other { 0 } else { req.len_bytes };
        self.charger
            .add(tenant, UNITS_PER_COMMAND / 2 + bytes / BYTES_PER_UNIT);
        self.rt.stats(tenant).queue_depth.fetch_add(1, Relaxed);
        debug_assert!(
            BackendTag::from_raw(req.tag).is_conn(),
            "only connection tags are submitted: {:?}",
            BackendTag::from_raw(req.tag)
        );
        let scheduled =
            self.rt.settings.scheduler == SchedulerMode::Fair && self.rt.arbiters.get(ns).is_some();
        let meta = Meta {
            ns,
            tenant,
            dir,
            bytes,
            arrived: now,
            dispatched: now,
            scheduled,
            cost: 0,
            parent: None,
        };
        if !scheduled {
            self.meta.insert(req.tag, meta);
            queue.submit(req, now);
            return;
        }
        match self.rt.settings.split_bytes {
            Some(piece) if dir != Dir::Other && bytes > piece && req.buf.is_some() => {
                self.submit_split(meta, req, piece, now);
            }
            _ => {
                self.meta.insert(req.tag, meta);
                self.enqueue(ns, tenant, dir, req, now);
            }
        }
    }

    /// Splits a read or write into pieces of at most `piece` bytes, each
    /// scheduled on its own; the parent completes when the last piece does.
    fn submit_split(&mut self, meta: Meta, mut req: IoRequest, piece: u64, now: Instant) {
        let parent = req.tag;
        let buf = req.buf.take();
        let len = req
            .len_bytes
            .min(buf.as_ref().map_or(0, |b| b.len() as u64));
        let n = len.div_ceil(piece);
        for i in 0..n {
            let off = i * piece;
            let plen = piece.min(len - off);
            let (o, l) = (usize_from(off), usize_from(plen));
            let b = match (meta.dir, buf.as_ref()) {
                (Dir::Write, Some(src)) => AlignedBuf::from_slice(&src.as_slice()[o..o + l]),
                _ => AlignedBuf::new(l),
            };
            let tag = BackendTag::piece(self.next_piece).raw();
            self.next_piece = BackendTag::next_piece(self.next_piece);
            self.meta.insert(
                tag,
                Meta {
                    bytes: plen,
                    parent: Some((parent, off)),
                    ..meta
                },
            );
            let piece_req = IoRequest {
                tag,
                op: req.op,
                offset_bytes: req.offset_bytes + off,
                len_bytes: plen,
                buf: Some(b),
            };
            self.enqueue(meta.ns, meta.tenant, meta.dir, piece_req, now);
        }
        self.splits.insert(
            parent,
            Split {
                meta: Meta {
                    scheduled: false,
                    ..meta
                },
                buf,
                remaining: n,
                result: Ok(()),
            },
        );
    }

    /// Queues one scheduled request locally and tells the arbiter.
    fn enqueue(&mut self, ns: usize, tenant: TenantId, dir: Dir, req: IoRequest, now: Instant) {
        let bytes = if dir == Dir::Other { 0 } else { req.len_bytes };
        let Some(arb) = self.rt.arbiters.get(ns) else {
            // Unreachable: one arbiter per namespace index.
            debug_assert!(false, "no arbiter for namespace index {ns}");
            return;
        };
        let l = self.local.entry(ns).or_default();
        let i = tenant as usize;
        if l.fifos.len() <= i {
            l.fifos.resize_with(i + 1, VecDeque::new);
        }
        l.fifos[i].push_back(req);
        l.queued += 1;
        l.dirty = true;
        arb.enqueue(self.id, tenant, dir, bytes, now);
    }

    /// Runs the namespace's shared scheduler if there is reason to (queued
    /// requests, a completion, grants from other workers), wakes the workers
    /// it handed I/Os to, and sends this worker's granted I/Os to `queue`.
    pub fn dispatch(&mut self, ns: usize, queue: &mut dyn BackendQueue, now: Instant) -> bool {
        let (Some(l), Some(arb)) = (self.local.get_mut(&ns), self.rt.arbiters.get(ns)) else {
            return false;
        };
        if l.queued == 0 && !l.dirty && !arb.has_grant(self.id) {
            return false;
        }
        l.dirty = false;
        self.mine.clear();
        self.wake.clear();
        arb.arbitrate(self.id, now, &mut self.mine, &mut self.wake);
        for &w in &self.wake {
            self.rt.wake(w);
        }
        let any = !self.mine.is_empty();
        for g in self.mine.drain(..) {
            let Some(req) = l
                .fifos
                .get_mut(g.tenant as usize)
                .and_then(|f| f.pop_front())
            else {
                // The arbiter's descriptors and our FIFOs disagree: a bug.
                // Give the slot back rather than leak it.
                debug_assert!(false, "grant for tenant {} with nothing queued", g.tenant);
                tracing::error!(
                    tenant = g.tenant,
                    "scheduler grant without a queued request"
                );
                arb.complete(g.cost);
                continue;
            };
            l.queued -= 1;
            self.rt
                .stats(g.tenant)
                .sched_wait_ns
                .fetch_add(nanos(g.waited), Relaxed);
            if let Some(m) = self.meta.get_mut(&req.tag) {
                m.cost = g.cost;
                m.dispatched = now;
            }
            queue.submit(req, now);
        }
        any
    }

    /// A backend completion. Returns the completion to hand to the
    /// connection: this one, the whole request when its last piece is in,
    /// or None while pieces are outstanding.
    pub fn complete(&mut self, c: IoCompletion, now: Instant) -> Option<IoCompletion> {
        let Some(m) = self.meta.remove(&c.tag) else {
            return Some(c);
        };
        let took = now.saturating_duration_since(m.dispatched);
        if took >= self.rt.slow_io {
            self.slow_io(&m, took, now);
        }
        if m.scheduled {
            if let Some(arb) = self.rt.arbiters.get(m.ns) {
                arb.complete(m.cost);
            }
            if let Some(l) = self.local.get_mut(&m.ns) {
                l.dirty = true;
            }
        }
        let Some((parent, off)) = m.parent else {
            self.account(&m, c.result.is_ok(), now);
            return Some(c);
        };
        let Some(sp) = self.splits.get_mut(&parent) else {
            debug_assert!(false, "piece of unknown request {parent:#x}");
            return None;
        };
        match c.result {
            Ok(()) if m.dir == Dir::Read => {
                if let (Some(dst), Some(src)) = (sp.buf.as_mut(), c.read_data()) {
                    let (o, l) = (usize_from(off), usize_from(m.bytes));
                    if let (Some(d), Some(s)) = (dst.as_mut_slice().get_mut(o..o + l), src.get(..l))
                    {
                        d.copy_from_slice(s);
                    }
                }
            }
            Ok(()) => {}
            Err(e) => {
                if sp.result.is_ok() {
                    sp.result = Err(e);
                }
            }
        }
        sp.remaining -= 1;
        if sp.remaining > 0 {
            return None;
        }
        let sp = self.splits.remove(&parent)?;
        self.account(&sp.meta, sp.result.is_ok(), now);
        Some(IoCompletion::new(parent, sp.result, sp.buf))
    }

    /// Counts a backend I/O (a whole request or a piece of one) that took
    /// `target.slow_io_ms` or longer, and logs it unless this worker logged
    /// one for the namespace less than [`SLOW_IO_LOG_INTERVAL`] ago.
    fn slow_io(&mut self, m: &Meta, took: Duration, now: Instant) {
        let Some(ns) = self.rt.ns_stats.get(m.ns) else {
            return;
        };
        ns.slow_ios.fetch_add(1, Relaxed);
        let suppressed = match self.slow_log.get_mut(&m.ns) {
            Some(l) if now.saturating_duration_since(l.logged) < SLOW_IO_LOG_INTERVAL => {
                l.suppressed += 1;
                return;
            }
            Some(l) => std::mem::take(&mut l.suppressed),
            None => 0,
        };
        self.slow_log.insert(
            m.ns,
            SlowLog {
                logged: now,
                suppressed: 0,
            },
        );
        tracing::warn!(
            subsystem = %ns.nqn,
            nsid = ns.nsid,
            tenant = self.tenant_name(m.tenant).unwrap_or("?"),
            op = m.dir.name(),
            bytes = m.bytes,
            took_ms = took.as_millis(),
            slow_io_ms = self.rt.slow_io.as_millis(),
            suppressed,
            "slow backend I/O: the namespace's backend took {} ms (docs/target.md, *Slow backend I/O*)",
            took.as_millis()
        );
    }

    /// Telemetry and CPU work units of one finished request.
    fn account(&mut self, m: &Meta, ok: bool, now: Instant) {
        let st = self.rt.stats(m.tenant);
        st.queue_depth.fetch_sub(1, Relaxed);
        if !ok {
            st.errors.fetch_add(1, Relaxed);
        }
        match m.dir {
            Dir::Read => {
                st.read_ios.fetch_add(1, Relaxed);
                st.read_bytes.fetch_add(m.bytes, Relaxed);
            }
            Dir::Write => {
                st.write_ios.fetch_add(1, Relaxed);
                st.write_bytes.fetch_add(m.bytes, Relaxed);
            }
            Dir::Other => {
                st.other_ios.fetch_add(1, Relaxed);
            }
        }
        let latency = now.saturating_duration_since(m.arrived);
        if let (Dir::Read | Dir::Write, Some(ns)) = (m.dir, self.rt.ns_stats.get(m.ns)) {
            ns.ios.fetch_add(1, Relaxed);
            ns.write_ios
                .fetch_add(u64::from(m.dir == Dir::Write), Relaxed);
            ns.bytes.fetch_add(m.bytes, Relaxed);
            let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
            ns.latency_us_sum.fetch_add(us, Relaxed);
        }
        match self.lat.get_mut(m.tenant as usize) {
            Some(Some(h)) => {
                h.record(latency);
                self.lat_pending = true;
            }
            // Tenant ids come from this worker's table, which has them all.
            _ => debug_assert!(false, "no latency histogram for tenant {}", m.tenant),
        }
        self.charger
            .add(m.tenant, UNITS_PER_COMMAND / 2 + m.bytes / BYTES_PER_UNIT);
    }

    /// Whether the worker should leave this tenant's sockets unread (as of
    /// the last [`refresh`](Self::refresh)).
    pub fn throttled(&self, tenant: TenantId) -> bool {
        self.throttled
            .get(tenant as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Whether the worker's CPU is charged to tenants (`cpu_accounting`):
    /// when not, the worker need not read its thread CPU clock at all.
    pub fn cpu_accounting(&self) -> bool {
        self.rt.settings.cpu_accounting
    }

    /// Once per loop batch: charge the CPU used since the last sample.
    /// `cpu` is the thread CPU clock (read by the caller, once); the first
    /// `idle` of the CPU since the last sample was idle spin before the
    /// batch, charged to no one.
    pub fn cpu_sample(&mut self, cpu: Duration, now: Instant, idle: Duration) {
        if !self.rt.settings.cpu_accounting {
            return;
        }
        let mut delta = match self.last_cpu.replace(cpu) {
            Some(prev) => nanos(cpu.saturating_sub(prev)),
            None => 0,
        };
        let idle_ns = nanos(idle).min(delta);
        if idle_ns > 0 {
            self.rt.unattributed_cpu_ns.fetch_add(idle_ns, Relaxed);
            delta -= idle_ns;
        }
        self.charger.charge(delta, &mut self.charged);
        if self.charged.is_empty() {
            self.rt.unattributed_cpu_ns.fetch_add(delta, Relaxed);
        }
        for &(t, ns) in &self.charged {
            self.rt.stats(t).cpu_ns.fetch_add(ns, Relaxed);
        }
        // Target-wide throttles; also rolls the period (victim signal).
        self.rt.cpu.charge(&self.charged, now, &mut self.started);
        for t in self.started.drain(..) {
            self.rt.stats(t).throttle_events.fetch_add(1, Relaxed);
        }
        self.charged.clear();
    }

    /// Earliest time the worker must wake for tenants: a throttle ending,
    /// a limit-blocked I/O becoming eligible.
    pub fn next_deadline(&mut self, now: Instant) -> Option<Instant> {
        let mut d: Option<Instant> = None;
        let mut take = |x: Option<Instant>| {
            if let Some(x) = x {
                d = Some(d.map_or(x, |y| y.min(x)));
            }
        };
        take(self.rt.cpu.next_deadline());
        if self.lat_pending {
            // Merge even if the worker goes idle.
            take(Some(self.next_merge));
        }
        for (&ns, l) in &self.local {
            if l.queued > 0 {
                if let Some(arb) = self.rt.arbiters.get(ns) {
                    take(arb.next_eligible(now));
                }
            }
        }
        d
    }

    /// Queued requests still held by the scheduler (shutdown).
    pub fn queued(&self) -> usize {
        self.local.values().map(|l| l.queued).sum()
    }

    /// Requests of namespace `ns` the scheduler still holds.
    pub fn queued_for(&self, ns: usize) -> usize {
        self.local.get(&ns).map_or(0, |l| l.queued)
    }

    /// Forgets namespace `ns` (removed by a reload; nothing of it queued).
    pub fn forget_namespace(&mut self, ns: usize) {
        debug_assert_eq!(
            self.queued_for(ns),
            0,
            "namespace {ns} still has requests queued"
        );
        self.local.remove(&ns);
    }
}

impl Drop for WorkerTenancy {
    /// The last samples of a worker that ends.
    fn drop(&mut self) {
        self.merge_latency();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use crate::tenant::admin;
    use sluice_config::{
        Config, NamespaceConfig, SubsystemConfig, TargetSettings, TenantSpec, TenantsConfig,
    };

    fn runtime(workers: usize) -> Arc<TenantRuntime> {
        runtime_with(TargetSettings::default().with_workers(workers))
    }

    fn runtime_with(target: TargetSettings) -> Arc<TenantRuntime> {
        let c = Config::default()
            .with_target(target)
            .with_subsystem(
                SubsystemConfig::new("nqn.2026-11.io.sluice:lat")
                    .allow_any_host()
                    .with_namespace(NamespaceConfig::ram(1, 1 << 20)),
            )
            .with_tenants(
                TenantsConfig::fair().with_tenant(TenantSpec::new("a").with_host("nqn.x:a")),
            )
            .validated()
            .expect("valid");
        let reg = Registry::build(&c).expect("registry");
        Arc::new(TenantRuntime::new(&c, &reg))
    }

    fn finish(w: &mut WorkerTenancy, tenant: TenantId, arrived: Instant, took: Duration) {
        let m = Meta {
            ns: 0,
            tenant,
            dir: Dir::Read,
            bytes: 4096,
            arrived,
            dispatched: arrived,
            scheduled: false,
            cost: 0,
            parent: None,
        };
        w.rt.stats(tenant).queue_depth.fetch_add(1, Relaxed);
        w.account(&m, true, arrived + took);
    }

    /// A backend I/O of `slow_io_ms` or longer, from the backend queue to
    /// its completion, is counted for its namespace; a wait in the
    /// scheduler before it is not. One log line per namespace per interval,
    /// the next one saying how many it left out.
    #[test]
    fn slow_backend_ios_are_counted_from_dispatch() {
        let rt = runtime_with(TargetSettings::default().with_slow_io_ms(1000));
        let a = rt.table().id("a").expect("a");
        let mut w = WorkerTenancy::new(rt.clone(), 0);
        let mut q = sluice_backend::Backend::open_queue(
            &sluice_backend::RamBackend::new(1 << 20, 512).expect("ram"),
        )
        .expect("queue");
        let t0 = Instant::now();
        let mut next_tag = 0u16;
        // Submits a 4 KiB read at `arrive`, hands it to the backend at
        // `dispatch`, completes it at `done`.
        let mut io = |w: &mut WorkerTenancy, arrive: Instant, dispatch: Instant, done: Instant| {
            next_tag += 1;
            let req = IoRequest {
                tag: BackendTag::slot(next_tag).with_conn(0).raw(),
                op: IoOp::Read,
                offset_bytes: 0,
                len_bytes: 4096,
                buf: Some(AlignedBuf::new(4096)),
            };
            w.submit(0, a, req, &mut *q, arrive);
            assert_eq!(w.queued(), 1, "the fair scheduler queues it");
            assert!(w.dispatch(0, &mut *q, dispatch));
            let mut out = Vec::new();
            q.poll_completions(done, &mut out);
            assert_eq!(out.len(), 1);
            for c in out {
                assert!(w.complete(c, done).is_some());
            }
        };
        fn stats(rt: &TenantRuntime) -> &super::super::NamespaceStats {
            rt.ns_stats.get(0).expect("namespace 0 has stats")
        }
        let slow = |rt: &TenantRuntime| stats(rt).slow_ios.load(Relaxed);
        // The log line's names.
        assert_eq!(
            (stats(&rt).nqn.as_str(), stats(&rt).nsid),
            ("nqn.2026-11.io.sluice:lat", 1)
        );
        let ms = Duration::from_millis;
        // 999 ms at the backend: not slow.
        io(&mut w, t0, t0, t0 + ms(999));
        assert_eq!(slow(&rt), 0);
        // 5 s in the scheduler, then 10 ms at the backend: not slow.
        io(&mut w, t0, t0 + ms(5000), t0 + ms(5010));
        assert_eq!(slow(&rt), 0);
        // 1 s at the backend: slow, logged.
        io(&mut w, t0 + ms(6000), t0 + ms(6000), t0 + ms(7000));
        assert_eq!(slow(&rt), 1);
        assert_eq!(w.slow_log[&0].suppressed, 0);
        // Again 2 s later: counted, not logged.
        io(&mut w, t0 + ms(8000), t0 + ms(8000), t0 + ms(9500));
        assert_eq!((slow(&rt), w.slow_log[&0].suppressed), (2, 1));
        // An interval after the logged one: logged again.
        io(&mut w, t0 + ms(16000), t0 + ms(16000), t0 + ms(17000));
        assert_eq!((slow(&rt), w.slow_log[&0].suppressed), (3, 0));
        assert_eq!(w.slow_log[&0].logged, t0 + ms(17000));
    }

    /// A reading's idle part goes to no one and the rest to the tenants
    /// the batch served; idle beyond the delta is capped at it.
    #[test]
    fn a_reading_splits_idle_spin_from_the_batch() {
        let rt = runtime(1);
        let a = rt.table().id("a").expect("a");
        let mut w = WorkerTenancy::new(rt.clone(), 0);
        let t0 = Instant::now();
        let charged = || {
            (
                rt.stats(a).cpu_ns.load(Relaxed),
                rt.unattributed_cpu_ns.load(Relaxed),
            )
        };
        w.cpu_sample(Duration::from_micros(1000), t0, Duration::ZERO);
        assert_eq!(charged(), (0, 0), "the first reading is the origin");
        finish(&mut w, a, t0, Duration::from_micros(5));
        w.cpu_sample(Duration::from_micros(1010), t0, Duration::from_micros(4));
        assert_eq!(charged(), (6_000, 4_000));
        finish(&mut w, a, t0, Duration::from_micros(5));
        w.cpu_sample(Duration::from_micros(1013), t0, Duration::from_micros(50));
        assert_eq!(charged(), (6_000, 7_000), "idle is at most the delta");
    }

    /// Two workers record into their own histograms; nothing is shared
    /// until the merge tick, then the tenant's histogram holds both.
    #[test]
    fn workers_record_locally_and_merge_on_the_tick() {
        let rt = runtime(2);
        let a = rt.table().id("a").expect("a");
        let (mut w0, mut w1) = (
            WorkerTenancy::new(rt.clone(), 0),
            WorkerTenancy::new(rt.clone(), 1),
        );
        let t0 = Instant::now();
        for i in 0..98u64 {
            finish(&mut w0, a, t0, Duration::from_micros(100 + i));
        }
        finish(&mut w1, a, t0, Duration::from_millis(5));
        finish(&mut w1, a, t0, Duration::from_secs(600)); // clamped to 60 s
        assert!(rt.stats(a).with_latency(|l| l.is_none()), "not merged yet");
        // The pending merge is a deadline, so an idle worker wakes for it.
        let due = w0.next_deadline(t0).expect("merge deadline");
        assert!(due <= t0 + MERGE_INTERVAL + Duration::from_millis(50));
        w0.refresh(due);
        let due1 = w1.next_deadline(t0).expect("merge deadline");
        w1.refresh(due1);
        assert_eq!(w0.next_deadline(due), None, "nothing left to merge");
        rt.stats(a).with_latency(|l| {
            let l = l.expect("merged");
            assert_eq!(l.count(), 100);
            let p50 = l.quantile_seconds(0.5).expect("p50");
            assert!((p50 - 149e-6).abs() < 1e-6, "p50 {p50}");
            let p99 = l.quantile_seconds(0.99).expect("p99");
            assert!((p99 - 5e-3).abs() < 5e-5, "p99 {p99}");
            let max = l.max_seconds().expect("max");
            assert!((max - 60.0).abs() < 0.6, "max {max}");
        });
        let s = admin::stats_report(&rt);
        let lat = &s.tenants.iter().find(|t| t.name == "a").expect("a").latency;
        assert_eq!(lat.count, 100);
        assert!(lat.sum_seconds > 600.0, "the sum keeps the true duration");
        let le = |b: f64| {
            lat.buckets
                .iter()
                .find(|x| x.le_seconds == b)
                .map(|x| x.count)
        };
        assert_eq!(
            (le(100e-6), le(200e-6), le(5e-3), le(30.0)),
            (Some(1), Some(98), Some(99), Some(99))
        );
        let none = sluice_admin::schema::Latency::default();
        assert_eq!(
            sluice_admin::schema::interval_quantile(&none, lat, 0.5),
            Some(150e-6)
        );
        // Dropping a worker merges what it still holds.
        finish(&mut w1, a, t0, Duration::from_micros(7));
        drop(w1);
        assert_eq!(
            rt.stats(a).with_latency(|l| l.map(Latency::count)),
            Some(101)
        );
        drop(w0);
    }
}
