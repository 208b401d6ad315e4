//! i-NVMe CPU accounting and throttling (sans-IO), and the cgroup v1 `cpu`
//! controller for charging threads through the kernel.
//!
//! **Accounting.** A worker reads its thread CPU clock once per loop batch
//! (`CLOCK_THREAD_CPUTIME_ID` costs 0.4-1 µs, too much per I/O; idle turns
//! of a spinning worker share one reading, and a batch after an idle spin
//! reads only at its end: `server/cpu_sampling.rs`) and hands the delta,
//! less the idle spin it holds, to [`BatchCharger::charge`], which splits
//! it among the tenants in proportion to the work units done for each in
//! that batch (PDUs and bytes; see `worker.rs`). A batch with no tenant
//! work is charged to no one (target overhead).
//!
//! **Throttling** ([`Throttle`], Algorithm 3 with the adaptive threshold of
//! §III-C/D). Per tenant and worker: `quota = cpu_share × period`,
//! `min T = quota / 2`, `T` starts at `min T`. CPU charged since the last
//! sub-throttle is the tenant's `runtime`; when it reaches `T / k` the
//! tenant is throttled for `τ = (period − T) / k` (k-split: k short pauses
//! instead of one long one), during which the worker does not read its
//! sockets (TCP back-pressure holds the host). After k throttles `T += α`
//! (capped at the quota). At the end of each period, if the watched victims
//! failed to use their quota (isolation violation), `T ← max(T − ½(T − min
//! T), min T)`. Without a victim signal, T only rises to the quota, so the
//! tenant's CPU share is the hard cap.
//!
//! The code lives in the shared crate `sluice-cpu` (the host-side exporter
//! uses the same throttle and cgroup helpers); this module only starts the
//! per-tenant cgroup quota agents ([`ChargeAgents`]).

use super::TenantRuntime;
use sluice_cpu::{CpuCgroup, QuotaAgent, TenantId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the charging thread looks for CFS period boundaries.
const CHARGE_POLL: Duration = Duration::from_micros(500);

/// The thread that takes each tenant's charged worker CPU out of its own
/// cgroup's CFS quota (`[[tenant]] charge_cgroup`, i-NVMe Algorithms 1-2
/// through [`QuotaAgent`]). On stop the base quotas are put back.
#[derive(Debug)]
pub struct ChargeAgents {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ChargeAgents {
    /// Starts the thread if some tenant has a `charge_cgroup` (the table
    /// as of now; the key cannot change at run time).
    pub fn start(rt: &Arc<TenantRuntime>) -> std::io::Result<Option<Self>> {
        let table = rt.table();
        let mut agents: Vec<(TenantId, String, QuotaAgent, CpuCgroup, Duration, Duration)> =
            Vec::new();
        for (id, spec) in table.iter() {
            let Some(path) = &spec.charge_cgroup else {
                continue;
            };
            let opened = cgroup_base_quota(path).and_then(|(cg, quota, period)| {
                let agent =
                    QuotaAgent::new(cg.clone(), quota, period).map_err(|e| e.to_string())?;
                Ok((agent, cg, quota, period))
            });
            match opened {
                Ok((agent, cg, quota, period)) => {
                    tracing::info!(tenant = %spec.name, cgroup = %path.display(), quota_us = u64::try_from(quota.as_micros()).unwrap_or(u64::MAX), "charging the tenant's worker CPU to its cgroup quota");
                    agents.push((id, spec.name.clone(), agent, cg, quota, period));
                }
                Err(e) => {
                    tracing::error!(tenant = %spec.name, error = %e, "cannot charge the tenant's cgroup")
                }
            }
        }
        if agents.is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, rt) = (stop.clone(), rt.clone());
        let thread = std::thread::Builder::new()
            .name("sluice-cpu-charge".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    std::thread::sleep(CHARGE_POLL);
                    let now = Instant::now();
                    agents.retain_mut(|(id, name, agent, ..)| {
                        let charged = rt.stats(*id).cpu_ns.load(Ordering::Relaxed);
                        match agent.poll(charged, now) {
                            Ok(_) => true,
                            Err(e) => {
                                tracing::error!(tenant = %name, error = %e, "charging the tenant's cgroup failed; stopped for this tenant");
                                false
                            }
                        }
                    });
                }
                for (_, name, _, cg, quota, period) in agents {
                    if let Err(e) = cg.set_quota(Some(quota), period) {
                        tracing::warn!(tenant = %name, error = %e, "cannot restore the cgroup's base quota");
                    }
                }
            })?;
        Ok(Some(ChargeAgents {
            stop,
            thread: Some(thread),
        }))
    }

    /// Stops charging and restores the base quotas.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ChargeAgents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A tenant's `charge_cgroup`, with the CFS quota and period it has now
/// (the base the charged CPU is taken out of). Errors say what is wrong.
pub fn cgroup_base_quota(p: &std::path::Path) -> Result<(CpuCgroup, Duration, Duration), String> {
    let cg = CpuCgroup::open(p).map_err(|e| e.to_string())?;
    match cg.quota().map_err(|e| e.to_string())? {
        (Some(quota), period) if !period.is_zero() => Ok((cg, quota, period)),
        _ => Err(format!(
            "`{}` has no CPU quota (cpu.cfs_quota_us = -1); set the tenant's quota first",
            p.display()
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sluice_cpu::{BatchCharger, QuotaCharger, Throttle, ThrottleParams, QUOTA_MIN};
    use std::fs;
    use std::path::Path;
    use std::time::{Duration, Instant};

    proptest! {
        /// A tenant that always has work never gets more than its share of
        /// CPU over whole periods (k-split throttling, adaptive T capped at
        /// the quota), and is throttled about k times per T.
        #[test]
        fn cpu_share_enforced(share in 0.05f64..0.95, k in 2u32..32, batch_us in 5u64..200) {
            let p = ThrottleParams { k, ..Default::default() };
            let mut th = Throttle::new(share, p);
            let t0 = Instant::now();
            let mut now = t0;
            let mut used = 0u64;
            let horizon = Duration::from_secs(2);
            while now < t0 + horizon {
                if th.is_throttled(now) {
                    now = th.next_deadline().unwrap_or(now).max(now);
                    continue;
                }
                // One batch of work for this tenant: CPU = wall time.
                let b = batch_us * 1000;
                now += Duration::from_nanos(b);
                used += b;
                th.charge(b, now);
            }
            let frac = used as f64 / horizon.as_nanos() as f64;
            // Bound: share plus one batch overshoot per sub-slice.
            let slack = (batch_us as f64 * 1000.0 * k as f64) / p.period.as_nanos() as f64;
            prop_assert!(frac <= share + slack + 0.01, "used {frac} share {share}");
            prop_assert!(frac >= share * 0.5 - 0.01, "used {frac} share {share}: T never rose above min T");
            prop_assert!(th.events > 0);
        }
    }

    #[test]
    fn violation_lowers_threshold_to_min() {
        let p = ThrottleParams::default();
        let mut th = Throttle::new(0.5, p);
        let now = Instant::now();
        // Push T up with many throttles.
        let mut t = now;
        for _ in 0..200 {
            t += Duration::from_millis(1);
            let _ = th.is_throttled(t);
            th.charge(10_000_000, t);
            t = th.next_deadline().unwrap_or(t);
        }
        assert_eq!(
            th.threshold(),
            Duration::from_millis(50),
            "T rises to the quota"
        );
        for _ in 0..30 {
            th.roll_period(t, Some(false));
        }
        assert!(th.threshold() <= Duration::from_micros(25_010));
        assert!(th.threshold() >= Duration::from_millis(25));
    }

    #[test]
    fn quota_charging_carries_debt() {
        let mut q = QuotaCharger::new(Duration::from_millis(50));
        assert_eq!(q.next_quota(10_000_000), Duration::from_millis(40));
        assert_eq!(q.next_quota(0), Duration::from_millis(50));
        assert_eq!(q.next_quota(70_000_000), QUOTA_MIN);
        // 21 ms of debt left from the 70 ms.
        assert_eq!(q.next_quota(0), Duration::from_millis(29));
    }

    #[test]
    fn batch_cpu_split_by_units() {
        let mut c = BatchCharger::default();
        c.add(0, 100);
        c.add(3, 300);
        let mut out = Vec::new();
        c.charge(1000, &mut out);
        assert_eq!(out, vec![(0, 250), (3, 750)]);
        c.charge(500, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn cgroup_errors_name_the_path() {
        let e = CpuCgroup::open("/nonexistent/cg").unwrap_err().to_string();
        assert!(
            e.contains("/nonexistent/cg") && e.contains("does not exist"),
            "{e}"
        );
        let e = CpuCgroup::create(Path::new("/nonexistent"), "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent"), "{e}");
        let e = CpuCgroup::create(Path::new("/tmp"), "../x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a valid cgroup name"), "{e}");
        // A directory that looks like a cgroup but whose `tasks` cannot be written.
        let d = std::env::temp_dir().join(format!("sluice-cg-{}", std::process::id()));
        let _ = fs::create_dir_all(d.join("tasks"));
        fs::write(d.join("cpu.cfs_quota_us"), "-1").unwrap();
        let g = CpuCgroup::open(&d).unwrap();
        let e = g.add_thread(1).unwrap_err().to_string();
        assert!(e.contains("cannot write") && e.contains("tasks"), "{e}");
        let _ = fs::remove_dir_all(&d);
    }
}
