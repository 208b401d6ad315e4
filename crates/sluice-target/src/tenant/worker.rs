//! What a worker thread does for tenants: queue backend I/O per tenant and
//! let the namespace's shared [`BackendArbiter`] decide what goes next
//! (target-wide weights, reservations, limits and dispatch window), keep
//! per-tenant telemetry, sample the thread CPU clock once per loop batch and
//! charge it, and skip the sockets of tenants the shared [`CpuGovernor`]
//! has throttled.
//!
//! [`BackendArbiter`]: super::shared::BackendArbiter
//! [`CpuGovernor`]: super::shared::CpuGovernor

use super::cpu::BatchCharger;
use super::rate::Dir;
use super::shared::Grant;
use super::{SchedulerMode, TenantId, TenantRuntime, TenantTable};
use sluice_backend::{BackendQueue, IoOp, IoRequest};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Work units per command (capsule in, response out) and per 16 KiB of
/// data moved (C2H/H2C PDUs, copies, digests).
const UNITS_PER_COMMAND: u64 = 2;
const BYTES_PER_UNIT: u64 = 16 * 1024;

#[derive(Debug)]
struct Meta {
    ns: usize,
    tenant: TenantId,
    dir: Dir,
    bytes: u64,
    arrived: Instant,
    scheduled: bool,
    cost: u64,
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
    charger: BatchCharger,
    charged: Vec<(TenantId, u64)>,
    last_cpu: Option<Duration>,
    /// Which tenants are throttled, as of this loop iteration.
    throttled: Vec<bool>,
    ended: Vec<(TenantId, u64)>,
    started: Vec<TenantId>,
    mine: Vec<Grant>,
    wake: Vec<usize>,
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
        WorkerTenancy {
            id,
            rt,
            table,
            local: HashMap::new(),
            meta: HashMap::new(),
            charger: BatchCharger::default(),
            charged: Vec::new(),
            last_cpu: None,
            throttled: Vec::new(),
            ended: Vec::new(),
            started: Vec::new(),
            mine: Vec::new(),
            wake: Vec::new(),
        }
    }

    pub fn runtime(&self) -> &Arc<TenantRuntime> {
        &self.rt
    }

    /// Once per loop iteration: picks up a new tenant table (cheap when
    /// unchanged) and which tenants are throttled now.
    pub fn refresh(&mut self, now: Instant) {
        let t = self.rt.table();
        if t.generation != self.table.generation {
            self.table = t;
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
        let scheduled = self.rt.settings.scheduler == SchedulerMode::Fair;
        self.meta.insert(
            req.tag,
            Meta {
                ns,
                tenant,
                dir,
                bytes,
                arrived: now,
                scheduled,
                cost: 0,
            },
        );
        if !scheduled {
            queue.submit(req, now);
            return;
        }
        let Some(arb) = self.rt.arbiters.get(ns) else {
            // Unreachable: one arbiter per namespace index. Do not hold it.
            debug_assert!(false, "no arbiter for namespace index {ns}");
            if let Some(m) = self.meta.get_mut(&req.tag) {
                m.scheduled = false;
            }
            queue.submit(req, now);
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
                .fetch_add(g.waited.as_nanos() as u64, Relaxed);
            if let Some(m) = self.meta.get_mut(&req.tag) {
                m.cost = g.cost;
            }
            queue.submit(req, now);
        }
        any
    }

    /// A backend completion (tag as submitted). Returns the tenant.
    pub fn completed(&mut self, tag: u64, ok: bool, now: Instant) -> Option<TenantId> {
        let m = self.meta.remove(&tag)?;
        if m.scheduled {
            if let Some(arb) = self.rt.arbiters.get(m.ns) {
                arb.complete(m.cost);
            }
            if let Some(l) = self.local.get_mut(&m.ns) {
                l.dirty = true;
            }
        }
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
        st.record_latency(now.saturating_duration_since(m.arrived));
        self.charger
            .add(m.tenant, UNITS_PER_COMMAND / 2 + m.bytes / BYTES_PER_UNIT);
        Some(m.tenant)
    }

    /// Whether the worker should leave this tenant's sockets unread (as of
    /// the last [`refresh`](Self::refresh)).
    pub fn throttled(&self, tenant: TenantId) -> bool {
        self.throttled
            .get(tenant as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Once per loop batch: charge the CPU used since the last sample.
    /// `cpu` is the thread CPU clock (read by the caller, once).
    pub fn cpu_sample(&mut self, cpu: Duration, now: Instant) {
        if !self.rt.settings.cpu_accounting {
            return;
        }
        let delta = match self.last_cpu.replace(cpu) {
            Some(prev) => cpu.saturating_sub(prev).as_nanos() as u64,
            None => 0,
        };
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
}
