//! What a worker thread does for tenants: route backend I/O through one
//! [`FairQueue`] per backend queue, keep per-tenant telemetry, sample the
//! thread CPU clock once per loop batch and charge it, and throttle tenants
//! over their CPU share.
//!
//! Limitation: fairness and CPU shares are per worker thread. Connections
//! are spread over workers round robin, so with several workers each one
//! divides its own backend queue (and its own CPU) among the tenants it sees.

use super::cpu::{BatchCharger, Throttle, VictimWatch};
use super::fair::{FairQueue, TenantParams};
use super::rate::Dir;
use super::{SchedulerMode, TenantId, TenantRuntime, TenantTable};
use sluice_backend::{BackendQueue, IoOp, IoRequest};
use std::collections::HashMap;
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

/// Per-worker tenant state.
#[derive(Debug)]
pub struct WorkerTenancy {
    rt: Arc<TenantRuntime>,
    table: Arc<TenantTable>,
    fair: HashMap<usize, FairQueue<IoRequest>>,
    meta: HashMap<u64, Meta>,
    charger: BatchCharger,
    charged: Vec<(TenantId, u64)>,
    last_cpu: Option<Duration>,
    throttles: Vec<Option<Throttle>>,
    victims: Option<VictimWatch>,
    next_period: Option<Instant>,
}

fn dir_of(op: &IoOp) -> Dir {
    match op {
        IoOp::Read => Dir::Read,
        IoOp::Write { .. } => Dir::Write,
        _ => Dir::Other,
    }
}

impl WorkerTenancy {
    pub fn new(rt: Arc<TenantRuntime>) -> Self {
        let victims = if rt.settings.cpu_isolation && !rt.settings.victim_cgroups.is_empty() {
            match VictimWatch::new(&rt.settings.victim_cgroups) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(error = %e, "victim cgroups unreadable; adaptive T disabled");
                    None
                }
            }
        } else {
            None
        };
        let table = rt.table();
        let mut w = WorkerTenancy {
            rt,
            table,
            fair: HashMap::new(),
            meta: HashMap::new(),
            charger: BatchCharger::default(),
            charged: Vec::new(),
            last_cpu: None,
            throttles: Vec::new(),
            victims,
            next_period: None,
        };
        w.apply_table(Instant::now());
        w
    }

    pub fn runtime(&self) -> &Arc<TenantRuntime> {
        &self.rt
    }

    fn params(spec: &super::TenantSpec) -> TenantParams {
        TenantParams {
            weight: spec.weight,
            reservation: spec.reservation,
            limit: spec.limit,
        }
    }

    fn apply_table(&mut self, now: Instant) {
        let table = self.table.clone();
        for (id, spec) in table.iter() {
            for fq in self.fair.values_mut() {
                fq.set_params(id, Self::params(spec), now);
            }
            let i = id as usize;
            if self.throttles.len() <= i {
                self.throttles.resize_with(i + 1, || None);
            }
            match (spec.cpu_share, self.rt.settings.cpu_isolation) {
                (Some(s), true) => match &mut self.throttles[i] {
                    Some(t) => t.set_share(s),
                    slot @ None => *slot = Some(Throttle::new(s, self.rt.settings.throttle)),
                },
                _ => self.throttles[i] = None,
            }
        }
    }

    /// Picks up a new tenant table (cheap when unchanged).
    pub fn refresh(&mut self, now: Instant) {
        let t = self.rt.table();
        if t.generation != self.table.generation {
            self.table = t;
            self.apply_table(now);
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
        let rt = &self.rt;
        let table = &self.table;
        let fq = self.fair.entry(ns).or_insert_with(|| {
            let cost = rt
                .cost_models
                .get(ns)
                .copied()
                .unwrap_or_else(super::fair::CostModel::bytes);
            let mut fq = FairQueue::new(cost, rt.settings.dispatch_depth);
            fq.set_budget(rt.settings.dispatch_budget_us.map(|us| us * 1000));
            for (id, spec) in table.iter() {
                fq.set_params(id, Self::params(spec), now);
            }
            fq
        });
        fq.enqueue(tenant, dir, bytes, req, now);
    }

    /// Sends what the scheduler allows to the backend queue of `ns`.
    pub fn dispatch(&mut self, ns: usize, queue: &mut dyn BackendQueue, now: Instant) -> bool {
        let Some(fq) = self.fair.get_mut(&ns) else {
            return false;
        };
        let mut any = false;
        while let Some(d) = fq.dequeue(now) {
            any = true;
            self.rt
                .stats(d.tenant)
                .sched_wait_ns
                .fetch_add(d.waited.as_nanos() as u64, Relaxed);
            if let Some(m) = self.meta.get_mut(&d.item.tag) {
                m.cost = d.cost;
            }
            queue.submit(d.item, now);
        }
        any
    }

    /// A backend completion (tag as submitted). Returns the tenant.
    pub fn completed(&mut self, tag: u64, ok: bool, now: Instant) -> Option<TenantId> {
        let m = self.meta.remove(&tag)?;
        if m.scheduled {
            if let Some(fq) = self.fair.get_mut(&m.ns) {
                fq.complete(m.cost);
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

    /// Whether the worker should leave this tenant's sockets unread now.
    pub fn throttled(&mut self, tenant: TenantId, now: Instant) -> bool {
        let Some(Some(t)) = self.throttles.get_mut(tenant as usize) else {
            return false;
        };
        let before = t.throttled;
        let r = t.is_throttled(now);
        let ended = t.throttled - before;
        if !ended.is_zero() {
            self.rt
                .stats(tenant)
                .throttle_ns
                .fetch_add(ended.as_nanos() as u64, Relaxed);
        }
        r
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
        for (t, ns) in self.charged.drain(..) {
            let st = self.rt.stats(t);
            st.cpu_ns.fetch_add(ns, Relaxed);
            if let Some(Some(th)) = self.throttles.get_mut(t as usize) {
                let ev = th.events;
                th.charge(ns, now);
                if th.events != ev {
                    st.throttle_events.fetch_add(1, Relaxed);
                }
            }
        }
        // Period end: the victim signal for the adaptive threshold.
        if self.rt.settings.cpu_isolation {
            let period = self.rt.settings.throttle.period;
            let end = *self.next_period.get_or_insert(now + period);
            if now >= end {
                self.next_period = Some(now + period);
                let ok = self.victims.as_mut().and_then(|v| v.victims_ok());
                for th in self.throttles.iter_mut().flatten() {
                    th.roll_period(now, ok);
                }
            }
        }
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
        for th in self.throttles.iter().flatten() {
            take(th.next_deadline());
        }
        for fq in self.fair.values_mut() {
            take(fq.next_eligible(now));
        }
        d
    }

    /// Queued requests still held by the scheduler (shutdown).
    pub fn queued(&self) -> usize {
        self.fair.values().map(|f| f.queued()).sum()
    }
}
