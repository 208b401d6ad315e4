//! The i-NVMe n-container setup shared by `sluice-lab cpu` and
//! `sluice-lab ksplit`: victims and the interferer's CPU hog on CPU 0, each
//! in its own cgroup v1 `cpu` cgroup with a quota, and a target whose single
//! worker is pinned to CPU 0 at nice -20. See [`SETUP`].

use super::target;
use crate::affinity::pin;
use crate::configs::{self, host, TENANT_SUBNQN};
use anyhow::{Context, Result};
use sluice_bench::{BenchArgs, BenchReport, JobReport};
use sluice_cpu::{current_tid, CpuCgroup, QuotaAgent};
use sluice_target::TargetHandle;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn thread_tid(name: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            return e.file_name().to_str()?.parse().ok();
        }
    }
    None
}

/// Fixed computation (xorshift rounds); returns a value so it is not elided.
fn burn(iters: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

/// CPU-bound threads on CPU 0, each in its own cgroup with a quota: the
/// victims (fixed work, timed) and, as in the paper's n-container setup,
/// the interferer's own computation ("sysbench") in the interferer's cgroup.
pub(super) struct Victims {
    groups: Vec<CpuCgroup>,
    iters: u64,
    /// The interferer's cgroup (its hog runs during every measurement).
    interferer: CpuCgroup,
    interferer_quota: Duration,
}

pub(super) const PERIOD: Duration = Duration::from_millis(100);

impl Victims {
    pub(super) fn new(root: &Path, n: usize, iters: u64) -> Result<Self> {
        let frac = 1.0 / (n as f64 + 1.0);
        // A fraction of the period: 0..=100_000 µs.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let quota = Duration::from_micros((PERIOD.as_micros() as f64 * frac) as u64);
        let mut groups = Vec::new();
        for i in 0..n {
            let g = CpuCgroup::create(root, &format!("sluice-victim{i}"))?;
            g.set_quota(Some(quota), PERIOD)?;
            groups.push(g);
        }
        let interferer = CpuCgroup::create(root, "sluice-interferer")?;
        interferer.set_quota(Some(quota), PERIOD)?;
        Ok(Victims {
            groups,
            iters,
            interferer,
            interferer_quota: quota,
        })
    }

    /// Starts the interferer's CPU hog on CPU 0 in its cgroup.
    fn start_hog(&self) -> (Arc<AtomicBool>, std::thread::JoinHandle<Result<()>>) {
        self.interferer
            .set_quota(Some(self.interferer_quota), PERIOD)
            .ok();
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, g) = (stop.clone(), self.interferer.clone());
        let h = std::thread::spawn(move || -> Result<()> {
            pin(0, 0)?;
            g.add_thread(current_tid())?;
            while !s2.load(Ordering::Relaxed) {
                std::hint::black_box(burn(100_000));
            }
            Ok(())
        });
        (stop, h)
    }

    /// Runs every victim once on CPU 0 in its cgroup; completion times.
    fn run(&self) -> Result<Vec<Duration>> {
        let barrier = Arc::new(Barrier::new(self.groups.len() + 1));
        let mut hs = Vec::new();
        for g in &self.groups {
            let (g, b, iters) = (g.clone(), barrier.clone(), self.iters);
            hs.push(std::thread::spawn(move || -> Result<Duration> {
                pin(0, 0)?;
                g.add_thread(current_tid())?;
                b.wait();
                let t = Instant::now();
                std::hint::black_box(burn(iters));
                Ok(t.elapsed())
            }));
        }
        barrier.wait();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("victim panicked"))?)
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Mode {
    /// Stock: the worker (nice -20) is charged to no one.
    Off,
    /// i-NVMe: worker CPU charged to the interferer (its cgroup quota is
    /// lowered by it each period, Algorithms 1-2) and the interferer's
    /// sockets throttled at T (Algorithm 3).
    INvme,
    /// Kernel charging: the worker thread runs inside the interferer's cgroup.
    Cgroup,
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::INvme => "i-NVMe",
            Mode::Cgroup => "cgroup",
        }
    }
}

/// The interferer's target: one worker on CPU 0 at nice -20 (like the
/// kernel's WQ_HIGHPRI nvme_tcp_wq).
pub(super) fn cpu_target(mode: Mode, k: u32, v: &Victims) -> Result<TargetHandle> {
    let share = v.interferer_quota.as_secs_f64() / PERIOD.as_secs_f64();
    let victims: Vec<PathBuf> = v.groups.iter().map(|g| g.path().to_path_buf()).collect();
    let t = target(&configs::cpu_target(
        mode == Mode::INvme,
        k,
        &victims,
        share,
    )?)?;
    // The thread names itself once it runs: wait for it.
    let mut tid = None;
    for _ in 0..200 {
        tid = thread_tid("sluice-worker-0");
        if tid.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let tid = tid.context("worker thread `sluice-worker-0` not found in /proc/self/task")?;
    pin(tid, 0)?;
    // Best effort, as before: without CAP_SYS_NICE the worker keeps its nice.
    let _ = rustix::process::setpriority_process(rustix::process::Pid::from_raw(tid), -20);
    if mode == Mode::Cgroup {
        v.interferer.add_thread(tid)?;
    }
    Ok(t)
}

pub(super) struct Point {
    /// Mean victim completion time alone (s): victims + interferer hog, no I/O.
    pub(super) alone: f64,
    pub(super) df: Vec<f64>,
    pub(super) iops: f64,
    pub(super) p99: f64,
    pub(super) p999: f64,
}

/// Baseline (victims + the interferer's hog, no I/O), then the same with the
/// interferer's I/O at `rate` (None: unlimited), back to back.
pub(super) fn cpu_point(
    t: &TargetHandle,
    v: &Victims,
    mode: Mode,
    rate: Option<u64>,
) -> Result<Point> {
    let (stop, hog) = v.start_hog();
    let alone_v = v.run()?;
    let alone = &alone_v[..];
    let addr = t.local_addr().to_string();
    let runtime = alone
        .iter()
        .max()
        .copied()
        .unwrap_or(Duration::from_secs(1))
        .as_secs_f64()
        * 3.0
        + 1.0;
    let rate_s = rate.map_or(String::new(), |r| format!(",rate-iops={r}"));
    let job = format!(
        "i,hostnqn={},rw=randrw,rwmixread=50,bs=4k,qd=32{rate_s}",
        host("i")
    );
    let h = std::thread::spawn(move || {
        let mut a = BenchArgs::new(addr, TENANT_SUBNQN);
        a.runtime = Some(runtime);
        a.jobs = vec![job];
        a.span = Some("64m".into());
        sluice_bench::run(a)
    });
    // i-NVMe Algorithms 1-2 from user space: each period, lower the
    // interferer's cgroup quota by the worker CPU charged to it, written
    // just after each CFS period boundary (see `QuotaAgent`).
    let charging = Arc::new(AtomicBool::new(mode == Mode::INvme));
    let agent = {
        let (c, rt, g, q) = (
            charging.clone(),
            t.tenants().clone(),
            v.interferer.clone(),
            v.interferer_quota,
        );
        std::thread::spawn(move || -> Result<()> {
            if !c.load(Ordering::Relaxed) {
                return Ok(());
            }
            let id = rt.table().id("i").unwrap_or(0);
            let mut agent = QuotaAgent::new(g, q, PERIOD)?;
            while c.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_micros(500));
                agent.poll(rt.stats(id).cpu_ns.load(Ordering::Relaxed), Instant::now())?;
            }
            Ok(())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let times = v.run()?;
    charging.store(false, Ordering::Relaxed);
    agent
        .join()
        .map_err(|_| anyhow::anyhow!("quota agent panicked"))?
        .context("driving the interferer's cgroup quota")?;
    let r = h.join().map_err(|_| anyhow::anyhow!("bench panicked"))??;
    stop.store(true, Ordering::Relaxed);
    hog.join().map_err(|_| anyhow::anyhow!("hog panicked"))??;
    let j = job_of(&r);
    Ok(Point {
        alone: alone.iter().map(|d| d.as_secs_f64()).sum::<f64>() / alone.len() as f64,
        df: times
            .iter()
            .zip(alone)
            .map(|(t, a)| t.as_secs_f64() / a.as_secs_f64())
            .collect(),
        iops: j.iops,
        p99: j.latency_us_p99,
        p999: j.latency_us_p999,
    })
}

fn job_of(r: &BenchReport) -> JobReport {
    r.jobs.first().cloned().unwrap_or_else(|| r.total.clone())
}

/// Xorshift rounds for `cpu_s` seconds of CPU on CPU 0.
pub(super) fn calibrate(cpu_s: f64) -> Result<u64> {
    pin(0, 0)?;
    let t = Instant::now();
    let n = 20_000_000u64;
    std::hint::black_box(burn(n));
    let per_s = n as f64 / t.elapsed().as_secs_f64();
    pin(0, 1)?;
    // A float to integer cast saturates (and gives 0 for NaN).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rounds = (per_s * cpu_s) as u64;
    Ok(rounds)
}

pub(super) const SETUP: &str = "Setup (the paper's n-container experiment on one core): CPU 0 holds the victims and the interferer, each in its own cgroup v1 `cpu` cgroup with quota period/n (period 100 ms, n = victims + 1). Victims run a fixed computation (xorshift rounds, 0.4 s of CPU at full speed), the interferer runs the same kind of CPU hog for the whole measurement (the paper's sysbench in the FIO container) and drives 4 KiB 50/50 random read/write I/O at QD 32 through `sluice-bench` on CPU 1 against a target whose single worker thread is pinned to CPU 0 at nice -20 (the kernel's WQ_HIGHPRI `nvme_tcp_wq` analogue; RAM backend). Degrading factor (DF) = victim completion time with the interferer's I/O / without it (hog still running), measured back to back at each point. Modes: `off` = stock (worker charged to nobody); `i-NVMe` = the worker's CPU is charged to the interferer tenant per loop batch, its cgroup quota lowered by that charge each period (Algorithms 1-2, from user space) and its sockets throttled at T (Algorithm 3: k = 8 unless stated, α = 5 ms, min T = quota/2, victims' cgroups watched for the adaptive T); `cgroup` = the worker thread placed in the interferer's cgroup (kernel charging). The machine has 2 cores shared with other jobs (QEMU, compilers), so absolute numbers are noisy; with `--repeat N` every point is measured N times and the median reported.";
