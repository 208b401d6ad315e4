//! i-NVMe Algorithms 1-2 against the kernel: a [`QuotaAgent`] lowers a
//! cgroup v1 `cpu` quota by the CPU charged to its tenant, period by
//! period, and a busy thread in that cgroup gets correspondingly less CPU.
//! Needs root and /sys/fs/cgroup/cpu (skipped with a printed reason
//! otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_cpu::{current_tid, thread_cpu_ns, CpuCgroup, QuotaAgent};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
const PERIOD: Duration = Duration::from_millis(100);

#[test]
fn quota_agent_takes_charged_cpu_out_of_the_quota() {
    if !Path::new(CPU_ROOT).join("tasks").exists() {
        println!("SKIPPED: {CPU_ROOT} (cgroup v1 cpu) is absent");
        return;
    }
    let name = format!("sluice-cpu-agent-test-{}", std::process::id());
    let cg = match CpuCgroup::create(Path::new(CPU_ROOT), &name) {
        Ok(c) => c,
        Err(e) => {
            println!("SKIPPED: {e} (root needed)");
            return;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicI32::new(0));
    let busy = {
        let (stop, tid, cg) = (stop.clone(), tid.clone(), cg.clone());
        std::thread::spawn(move || {
            cg.add_thread(current_tid()).unwrap();
            tid.store(current_tid(), Ordering::Release);
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..10_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                }
                std::hint::black_box(x);
            }
        })
    };
    while tid.load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let tid = tid.load(Ordering::Acquire);
    let cpu_over = |d: Duration, mut tick: Box<dyn FnMut(Instant) + '_>| {
        let c0 = thread_cpu_ns(tid).unwrap();
        let t0 = Instant::now();
        while t0.elapsed() < d {
            std::thread::sleep(Duration::from_micros(500));
            tick(Instant::now());
        }
        (thread_cpu_ns(tid).unwrap() - c0) as f64 / t0.elapsed().as_nanos() as f64
    };

    // Base quota 50 %: the busy thread gets about half a CPU.
    let mut agent = QuotaAgent::new(cg.clone(), PERIOD / 2, PERIOD).unwrap();
    let alone = cpu_over(Duration::from_secs(1), Box::new(|_| {}));

    // The workers spent 30 ms per 100 ms for this tenant: the agent leaves
    // it 20 ms of quota per period.
    let start = Instant::now();
    let mut writes = 0;
    let charged = cpu_over(
        Duration::from_secs(1),
        Box::new(|now| {
            let total = (now - start).as_nanos() as u64 * 3 / 10;
            if agent.poll(total, now).unwrap().is_some() {
                writes += 1;
            }
        }),
    );
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    let _ = cg.clone().remove();
    println!(
        "busy thread CPU: alone {alone:.3}, charged 0.3 -> {charged:.3} ({writes} quota writes)"
    );
    assert!(
        alone > 0.35 && alone < 0.6,
        "base quota not applied: {alone}"
    );
    // 0.2 once charged; the window's first period still runs at the base.
    assert!(
        charged < 0.32 && charged < 0.7 * alone,
        "charge not taken out of the quota: {charged} (alone {alone})"
    );
    assert!(
        charged > 0.08,
        "quota cut far below base - charge: {charged}"
    );
    assert!(
        (8..=13).contains(&writes),
        "one write per period expected, got {writes}"
    );
}

#[test]
fn agent_is_due_on_period_boundaries_only() {
    if !Path::new(CPU_ROOT).join("tasks").exists() {
        println!("SKIPPED: {CPU_ROOT} (cgroup v1 cpu) is absent");
        return;
    }
    let name = format!("sluice-cpu-agent-due-{}", std::process::id());
    let Ok(cg) = CpuCgroup::create(Path::new(CPU_ROOT), &name) else {
        println!("SKIPPED: cannot create a cgroup (root needed)");
        return;
    };
    let mut agent = QuotaAgent::new(cg.clone(), PERIOD / 2, PERIOD).unwrap();
    let t0 = Instant::now();
    let (p, _, _) = cg.stat().unwrap();
    assert!(agent.due(p, t0), "first poll writes");
    assert!(agent.poll(0, t0).unwrap().is_some());
    // Idle cgroup: no periods counted; due again only after two periods.
    let (p, _, _) = cg.stat().unwrap();
    assert!(!agent.due(p, t0 + PERIOD));
    assert!(agent.due(p, t0 + PERIOD * 2));
    assert!(agent.due(p + 1, t0 + PERIOD / 10));
    let _ = cg.remove();
}
