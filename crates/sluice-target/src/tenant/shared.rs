//! Target-wide tenant enforcement, shared by every worker thread.
//!
//! Connections are spread over worker threads, but a tenant's weight,
//! reservation, limit and CPU share are target-wide. Two shared pieces make
//! them so (sans-IO: time is passed in, waking a worker is a callback):
//!
//! * [`BackendArbiter`], one per namespace. The scheduler's state — a
//!   [`FairQueue`] over *descriptors* (which worker holds the I/O, its
//!   direction, size and cost), the tags, the token buckets and the dispatch
//!   window — is global; the requests themselves stay with the worker that
//!   received them, one FIFO per tenant. Whoever arbitrates (a worker that
//!   queued an I/O, saw a completion, or passed a limit's refill time) hands
//!   each decision to the worker holding that I/O: to itself at once, to
//!   another as a [`Grant`] plus a wake-up. Per tenant and worker the
//!   descriptors and the requests are in the same order, so a grant always
//!   means "the head of your FIFO for this tenant".
//! * [`CpuGovernor`]: one i-NVMe [`Throttle`] per tenant, charged by every
//!   worker, so a CPU share is a share of the whole worker pool
//!   (`workers` CPUs); it is charged CPU divided by the number of workers.

use super::fair::{CostModel, FairQueue, TenantParams};
use super::rate::Dir;
use super::TenantId;
use sluice_cpu::{Throttle, ThrottleParams, VictimWatch};
use sluice_runtime::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_runtime::cast::nanos;
use sluice_runtime::limits::WORKERS_MAX;

/// A scheduling decision for the worker holding the I/O: send the head of
/// your FIFO for `tenant` to the backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub(crate) tenant: TenantId,
    /// Cost booked in the window; returned by [`BackendArbiter::complete`].
    pub(crate) cost: u64,
    /// Time the I/O waited in the scheduler.
    pub(crate) waited: Duration,
}

struct ArbiterInner {
    fq: FairQueue<u16>,
    /// Decisions made for each worker and not yet collected by it.
    grants: Vec<Vec<Grant>>,
}

/// The scheduler of one backend (namespace), shared by all workers.
pub struct BackendArbiter {
    inner: Mutex<ArbiterInner>,
    /// Per worker: grants are waiting (checked without the lock).
    granted: Vec<AtomicBool>,
}

impl std::fmt::Debug for BackendArbiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.lock();
        f.debug_struct("BackendArbiter")
            .field("fq", &g.fq)
            .field("workers", &g.grants.len())
            .finish()
    }
}

impl BackendArbiter {
    /// `depth` and `budget` (summed cost) bound the I/Os outstanding at the
    /// backend from all workers together.
    pub fn new(cost: CostModel, depth: u32, budget: Option<u64>, workers: usize) -> Self {
        assert!(
            (1..=WORKERS_MAX).contains(&workers),
            "workers must be 1..={WORKERS_MAX}"
        );
        let mut fq = FairQueue::new(cost, depth);
        fq.set_budget(budget);
        BackendArbiter {
            inner: Mutex::new(ArbiterInner {
                fq,
                grants: vec![Vec::new(); workers],
            }),
            granted: (0..workers).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ArbiterInner> {
        lock(&self.inner)
    }

    pub fn set_params(&self, t: TenantId, params: TenantParams, now: Instant) {
        self.lock().fq.set_params(t, params, now);
    }

    /// Worker `worker` has queued one I/O of tenant `t` at the tail of its
    /// FIFO for `t`.
    pub fn enqueue(&self, worker: usize, t: TenantId, dir: Dir, bytes: u64, now: Instant) {
        debug_assert!(worker < self.granted.len());
        // Below the number of workers, at most WORKERS_MAX (64).
        #[allow(clippy::cast_possible_truncation)]
        let worker = worker as u16;
        self.lock().fq.enqueue(t, dir, bytes, worker, now);
    }

    /// The backend finished an I/O dispatched with `cost`.
    pub fn complete(&self, cost: u64) {
        self.lock().fq.complete(cost);
    }

    /// Whether decisions are waiting for `worker` (no lock).
    pub fn has_grant(&self, worker: usize) -> bool {
        self.granted
            .get(worker)
            .is_some_and(|g| g.load(Ordering::Acquire))
    }

    /// Runs the scheduler while the window has room. Decisions for `me`
    /// (and those left for it earlier) are appended to `mine` in order;
    /// workers handed new grants are appended to `wake` (once each).
    pub fn arbitrate(&self, me: usize, now: Instant, mine: &mut Vec<Grant>, wake: &mut Vec<usize>) {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(own) = inner.grants.get_mut(me) {
            mine.append(own);
        }
        if let Some(flag) = self.granted.get(me) {
            flag.store(false, Ordering::Release);
        }
        while let Some(d) = inner.fq.dequeue(now) {
            let grant = Grant {
                tenant: d.tenant,
                cost: d.cost,
                waited: d.waited,
            };
            let w = usize::from(d.item);
            if w == me {
                mine.push(grant);
            } else if let Some(list) = inner.grants.get_mut(w) {
                list.push(grant);
                if !self.granted[w].swap(true, Ordering::AcqRel) && !wake.contains(&w) {
                    wake.push(w);
                }
            } else {
                // Unreachable: enqueue only takes known workers. Free the slot.
                debug_assert!(false, "grant for unknown worker {w}");
                inner.fq.complete(d.cost);
            }
        }
    }

    /// When a limit-blocked I/O may go (None: nothing waits on a limit, or
    /// the window is full and a completion will arbitrate).
    pub fn next_eligible(&self, now: Instant) -> Option<Instant> {
        self.lock().fq.next_eligible(now)
    }

    /// I/Os outstanding at the backend, all workers.
    pub fn in_flight(&self) -> u32 {
        self.lock().fq.in_flight()
    }

    /// (cost, I/Os) served per tenant so far, all workers.
    pub fn served(&self, t: TenantId) -> (u64, u64) {
        self.lock().fq.served(t)
    }
}

struct GovernorInner {
    throttles: Vec<Option<Throttle>>,
    next_period: Option<Instant>,
    victims: Option<VictimWatch>,
}

/// One CPU throttle per tenant for the whole worker pool.
pub struct CpuGovernor {
    inner: Mutex<GovernorInner>,
    params: ThrottleParams,
    workers: u64,
    enabled: bool,
}

impl std::fmt::Debug for CpuGovernor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuGovernor")
            .field("workers", &self.workers)
            .field("enabled", &self.enabled)
            .finish()
    }
}

/// What one charge did to a tenant, for its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    pub(crate) tenant: TenantId,
    pub(crate) throttle_started: bool,
}

impl CpuGovernor {
    /// `enabled` = `cpu_isolation`; without it nothing is ever throttled.
    pub fn new(
        params: ThrottleParams,
        workers: usize,
        enabled: bool,
        victims: Option<VictimWatch>,
    ) -> Self {
        CpuGovernor {
            inner: Mutex::new(GovernorInner {
                throttles: Vec::new(),
                next_period: None,
                victims,
            }),
            params,
            workers: workers.max(1) as u64,
            enabled,
        }
    }

    fn lock(&self) -> MutexGuard<'_, GovernorInner> {
        lock(&self.inner)
    }

    /// Sets tenant `t`'s share of the worker pool (None: unthrottled).
    pub fn set_share(&self, t: TenantId, share: Option<f64>) {
        let mut g = self.lock();
        let i = t as usize;
        if g.throttles.len() <= i {
            g.throttles.resize_with(i + 1, || None);
        }
        match (share, self.enabled) {
            (Some(s), true) => match &mut g.throttles[i] {
                Some(th) => th.set_share(s),
                slot @ None => *slot = Some(Throttle::new(s, self.params)),
            },
            _ => g.throttles[i] = None,
        }
    }

    /// Which tenants are throttled now, into `out` (indexed by tenant; one
    /// lock for all). Throttles that have ended add their length to
    /// `ended` as (tenant, ns).
    pub fn snapshot(&self, now: Instant, out: &mut Vec<bool>, ended: &mut Vec<(TenantId, u64)>) {
        out.clear();
        if !self.enabled {
            return;
        }
        let mut g = self.lock();
        for (i, slot) in (0..).zip(g.throttles.iter_mut()) {
            let throttled = match slot {
                Some(th) => {
                    let before = th.throttled;
                    let r = th.is_throttled(now);
                    let d = th.throttled - before;
                    if !d.is_zero() {
                        ended.push((i, nanos(d)));
                    }
                    r
                }
                None => false,
            };
            out.push(throttled);
        }
    }

    /// Charges one worker's batch (tenant, CPU ns) and rolls the period
    /// (reading the victims' cgroups once per period, whichever worker
    /// gets there first). Tenants whose throttle started go to `started`.
    pub fn charge(&self, batch: &[(TenantId, u64)], now: Instant, started: &mut Vec<TenantId>) {
        if !self.enabled {
            return;
        }
        let mut g = self.lock();
        for &(t, ns) in batch {
            if let Some(Some(th)) = g.throttles.get_mut(t as usize) {
                let ev = th.events;
                th.charge(ns / self.workers, now);
                if th.events != ev {
                    started.push(t);
                }
            }
        }
        let period = self.params.period;
        let end = *g.next_period.get_or_insert(now + period);
        if now >= end {
            g.next_period = Some(now + period);
            let ok = g.victims.as_mut().and_then(|v| v.victims_ok());
            for th in g.throttles.iter_mut().flatten() {
                th.roll_period(now, ok);
            }
        }
    }

    /// The earliest end of a running throttle.
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.enabled {
            return None;
        }
        self.lock()
            .throttles
            .iter()
            .flatten()
            .filter_map(|t| t.next_deadline())
            .min()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sluice_config::tenants::RateSpec;
    use std::collections::VecDeque;

    /// Workers holding local FIFOs of request ids, driving one shared
    /// arbiter, with a device of `depth` slots serving each I/O in its cost
    /// (ns of virtual time). Each tenant lives on the worker(s) given.
    struct Sim {
        arb: BackendArbiter,
        fifos: Vec<Vec<VecDeque<u64>>>,
        next_id: u64,
        now: Instant,
        t0: Instant,
        busy: Vec<(Instant, u64, TenantId)>,
        served_bytes: Vec<u64>,
        served_ios: Vec<u64>,
        wakes: u64,
    }

    impl Sim {
        fn new(workers: usize, tenants: usize, depth: u32) -> Self {
            let t0 = Instant::now();
            Sim {
                arb: BackendArbiter::new(CostModel::bytes(), depth, None, workers),
                fifos: vec![vec![VecDeque::new(); tenants]; workers],
                next_id: 0,
                now: t0,
                t0,
                busy: Vec::new(),
                served_bytes: vec![0; tenants],
                served_ios: vec![0; tenants],
                wakes: 0,
            }
        }

        fn push(&mut self, w: usize, t: TenantId, bytes: u64) {
            self.fifos[w][t as usize].push_back(self.next_id);
            self.next_id += 1;
            self.arb.enqueue(w, t, Dir::Read, bytes, self.now);
        }

        /// Worker `w` arbitrates and executes its grants; woken workers do
        /// the same (as the real loop would after the wake-up).
        fn arbitrate(&mut self, w: usize, bytes_of: &impl Fn(TenantId) -> u64) {
            let mut todo = vec![w];
            while let Some(w) = todo.pop() {
                let mut mine = Vec::new();
                let mut wake = Vec::new();
                self.arb.arbitrate(w, self.now, &mut mine, &mut wake);
                self.wakes += wake.len() as u64;
                todo.extend(wake);
                for g in mine {
                    let id = self.fifos[w][g.tenant as usize].pop_front();
                    assert!(id.is_some(), "grant without a queued request");
                    let done = self.now + Duration::from_nanos(g.cost);
                    self.busy.push((done, g.cost, g.tenant));
                    self.served_bytes[g.tenant as usize] += bytes_of(g.tenant);
                    self.served_ios[g.tenant as usize] += 1;
                }
            }
        }

        /// Keeps every tenant backlogged (refill to `qd` per worker it lives
        /// on) until `horizon`.
        fn run(
            &mut self,
            horizon: Duration,
            placement: &[Vec<usize>],
            qd: usize,
            bytes_of: impl Fn(TenantId) -> u64,
        ) {
            let end = self.t0 + horizon;
            while self.now < end {
                for (t, ws) in placement.iter().enumerate() {
                    for &w in ws {
                        while self.fifos[w][t].len() < qd {
                            self.push(w, t as TenantId, bytes_of(t as TenantId));
                        }
                    }
                }
                for w in 0..self.fifos.len() {
                    self.arbitrate(w, &bytes_of);
                }
                // Next event: a completion or a limit refill.
                self.busy.sort_by_key(|b| b.0);
                let next_done = self.busy.first().map(|b| b.0);
                let next_elig = self.arb.next_eligible(self.now);
                let next = match (next_done, next_elig) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) => a,
                    (None, Some(b)) => b,
                    (None, None) => break,
                };
                self.now = next.max(self.now);
                // Completions land on whichever worker held the I/O; here
                // worker 0 sees all of them, the hardest case for grants.
                while self.busy.first().is_some_and(|b| b.0 <= self.now) {
                    let (_, cost, _) = self.busy.remove(0);
                    self.arb.complete(cost);
                }
            }
        }
    }

    #[test]
    fn tenants_on_different_workers_share_by_weight() {
        let mut sim = Sim::new(2, 2, 4);
        let now = sim.now;
        sim.arb.set_params(
            0,
            TenantParams {
                weight: 1,
                ..Default::default()
            },
            now,
        );
        sim.arb.set_params(
            1,
            TenantParams {
                weight: 3,
                ..Default::default()
            },
            now,
        );
        // Tenant 0 only on worker 0, tenant 1 only on worker 1.
        sim.run(Duration::from_millis(50), &[vec![0], vec![1]], 8, |_| 4096);
        let total = (sim.served_ios[0] + sim.served_ios[1]) as f64;
        let share1 = sim.served_ios[1] as f64 / total;
        assert!((share1 - 0.75).abs() < 0.02, "share {share1}");
        assert!(sim.wakes > 0, "grants crossed workers");
        assert!(sim.arb.in_flight() <= 4);
    }

    #[test]
    fn limit_is_global_across_workers() {
        let mut sim = Sim::new(3, 2, 8);
        let now = sim.now;
        sim.arb.set_params(
            0,
            TenantParams {
                weight: 1,
                limit: RateSpec {
                    iops: Some(10_000),
                    ..Default::default()
                },
                ..Default::default()
            },
            now,
        );
        // Tenant 0 on all three workers; tenant 1 on worker 2 uses the rest.
        sim.run(Duration::from_secs(1), &[vec![0, 1, 2], vec![2]], 4, |_| {
            4096
        });
        // 10k IOPS plus the 20 ms initial burst (200 tokens).
        assert!(
            sim.served_ios[0] <= 10_000 + 200 + 1,
            "limited tenant got {}",
            sim.served_ios[0]
        );
        assert!(sim.served_ios[0] >= 9_900, "{}", sim.served_ios[0]);
        assert!(sim.served_ios[1] > sim.served_ios[0], "work-conserving");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Random placements of backlogged tenants over workers and random
        /// weights: every grant matches a queued request (checked inside the sim),
        /// the window is never exceeded, and shares follow the weights
        /// within 5 % of the total.
        #[test]
        fn shares_hold_for_any_placement(
            workers in 1usize..4,
            weights in proptest::collection::vec(1u32..8, 2..5),
            seed in 0u64..1000,
            depth in 1u32..8,
        ) {
            let n = weights.len();
            let mut sim = Sim::new(workers, n, depth);
            let now = sim.now;
            for (t, &w) in weights.iter().enumerate() {
                sim.arb.set_params(t as TenantId, TenantParams { weight: w, ..Default::default() }, now);
            }
            let placement: Vec<Vec<usize>> = (0..n)
                .map(|t| {
                    let first = ((seed as usize) + t * 7) % workers;
                    let mut v = vec![first];
                    if (seed >> t) & 1 == 1 && workers > 1 {
                        v.push((first + 1) % workers);
                    }
                    v
                })
                .collect();
            // Every tenant stays backlogged: more queued than the window.
            sim.run(Duration::from_millis(40), &placement, depth as usize + 1, |_| 4096);
            prop_assert!(sim.arb.in_flight() <= depth);
            let total: u64 = sim.served_ios.iter().sum();
            let wsum: u32 = weights.iter().sum();
            for (t, &w) in weights.iter().enumerate() {
                let got = sim.served_ios[t] as f64 / total as f64;
                let want = f64::from(w) / f64::from(wsum);
                prop_assert!((got - want).abs() < 0.05, "tenant {} got {} want {}", t, got, want);
            }
        }
    }

    #[test]
    fn governor_share_is_of_the_pool() {
        let p = ThrottleParams::default();
        let gov = CpuGovernor::new(p, 2, true, None);
        gov.set_share(0, Some(0.25));
        let t0 = Instant::now();
        let mut now = t0;
        let mut used = 0u64;
        let mut throttled = Vec::new();
        let mut ended = Vec::new();
        let mut started = Vec::new();
        // Two workers each burn 50 us batches for tenant 0 whenever it is
        // not throttled: together they may use 0.25 x 2 CPUs = 0.5 CPU.
        while now < t0 + Duration::from_secs(2) {
            gov.snapshot(now, &mut throttled, &mut ended);
            if throttled.first().copied().unwrap_or(false) {
                now = gov.next_deadline().unwrap_or(now).max(now);
                continue;
            }
            now += Duration::from_micros(50);
            used += 2 * 50_000;
            gov.charge(&[(0, 50_000), (0, 50_000)], now, &mut started);
        }
        let cpus = used as f64 / 2e9;
        assert!((0.4..=0.55).contains(&cpus), "pool CPU used {cpus}");
        assert!(!started.is_empty());
        assert!(!ended.is_empty());
    }

    #[test]
    fn governor_disabled_never_throttles() {
        let gov = CpuGovernor::new(ThrottleParams::default(), 1, false, None);
        gov.set_share(0, Some(0.01));
        let now = Instant::now();
        let mut started = Vec::new();
        gov.charge(&[(0, 1_000_000_000)], now, &mut started);
        let mut out = Vec::new();
        gov.snapshot(now, &mut out, &mut Vec::new());
        assert!(started.is_empty());
        assert!(out.iter().all(|t| !t));
        assert_eq!(gov.next_deadline(), None);
    }
}
