//! `sluice experiment NAME`: the tenant experiments of docs/tenants.md.
//! Each starts targets in this process, drives them with `sluice-bench`
//! jobs (one host NQN per tenant) and writes a Markdown table and SVG plots
//! under `--out`. Every figure is from one run; nothing is tuned to a goal.

use crate::svg;
use anyhow::{bail, Context, Result};
use sluice_bench::{BenchArgs, BenchReport, JobReport};
use sluice_target::tenant::cpu::{current_tid, CpuCgroup, QuotaAgent};
use sluice_target::tenant::fair::CostModel;
use sluice_target::tenant::rate::Dir;
use sluice_target::{Config, Target, TargetHandle};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct ExperimentArgs {
    /// fairness | noisy | cpu | ksplit | all, or the isolated data path
    /// ones: pinof-fig5 | pinof-fig6 | coalescing | isolation
    pub name: String,
    /// Directory for tables and plots.
    #[arg(long, default_value = "docs/experiments")]
    pub out: PathBuf,
    /// Seconds per bandwidth/latency run.
    #[arg(long, default_value_t = 3.0)]
    pub runtime: f64,
    /// Parent cgroup (v1 `cpu`) for the CPU experiments.
    #[arg(long, default_value = "/sys/fs/cgroup/cpu")]
    pub cgroup_root: PathBuf,
    /// CPU experiments: measure every point this many times and report the
    /// median (and the range).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn range(xs: &[f64]) -> (f64, f64) {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

const SUBNQN: &str = "nqn.2026-11.io.sluice:exp";

fn host(n: &str) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:exp-{n}")
}

/// Emulated SSD scaled down so the device, not this 2-core machine's CPU,
/// is the bottleneck of the bandwidth experiments.
const SCALED_SSD: &str = "read_iops_max = 20000, write_iops_max = 10000, read_bytes_per_sec_max = 400000000, write_bytes_per_sec_max = 200000000, base_read_latency_us = 80, base_write_latency_us = 20, parallelism = 8";

fn scaled_model() -> sluice_backend::SsdModel {
    sluice_backend::SsdModel {
        read_iops_max: 20000,
        write_iops_max: 10000,
        read_bytes_per_sec_max: 400_000_000,
        write_bytes_per_sec_max: 200_000_000,
        base_read_latency_us: 80,
        base_write_latency_us: 20,
        parallelism: 8,
    }
}

fn target(tenants: &str, backend: &str) -> Result<TargetHandle> {
    target_workers(tenants, backend, 1)
}

fn target_workers(tenants: &str, backend: &str, workers: u32) -> Result<TargetHandle> {
    let toml = format!(
        r#"
[target]
listen = "127.0.0.1:0"
discovery_listen = ""
polling = "interrupt"
workers = {workers}
shutdown_drain_ms = 2000
{tenants}
[[subsystem]]
nqn = "{SUBNQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
{backend}
"#
    );
    let c = Config::from_toml(&toml).with_context(|| format!("experiment config:\n{toml}"))?;
    Ok(Target::start(&c)?)
}

fn ssd_backend(model: &str) -> String {
    format!("backend = \"emulated-ssd\"\nsize = \"1GiB\"\nssd = {{ {model} }}")
}

fn tenants_toml(settings: &str, tenants: &[(&str, u32, &str)]) -> String {
    let mut s = format!("[tenants]\n{settings}\n");
    for (n, w, extra) in tenants {
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"{n}\"\nhosts = [\"{}\"]\nweight = {w}\n{extra}",
            host(n)
        );
    }
    s
}

fn bench(t: &TargetHandle, jobs: &[String], runtime: f64) -> Result<BenchReport> {
    let mut a = BenchArgs::new(t.local_addr().to_string(), SUBNQN);
    a.runtime = Some(runtime);
    a.jobs = jobs.to_vec();
    a.span = Some("256m".into());
    sluice_bench::run(a)
}

fn job<'a>(r: &'a BenchReport, name: &str) -> &'a JobReport {
    r.jobs.iter().find(|j| j.name == name).unwrap_or(&r.total)
}

fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (xs.len() as f64 * q)
}

fn write(out: &Path, name: &str, text: &str) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let p = out.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    eprintln!("wrote {}", p.display());
    Ok(())
}

pub fn run(a: ExperimentArgs) -> Result<()> {
    match a.name.as_str() {
        "fairness" => fairness(&a),
        "noisy" => noisy(&a),
        "cpu" => cpu(&a),
        "ksplit" => ksplit(&a),
        "all" => {
            fairness(&a)?;
            noisy(&a)?;
            cpu(&a)?;
            ksplit(&a)
        }
        o if crate::isolation_cmd::run(o, &a.out, a.runtime)? => Ok(()),
        o => bail!(
            "unknown experiment `{o}` (fairness, noisy, cpu, ksplit, all; {})",
            crate::isolation_cmd::NAMES
        ),
    }
}

// ---------------------------------------------------------------- fairness

/// Device time of a job under the scaled SSD's cost model (ns).
fn device_time(j: &JobReport, bs: u64) -> f64 {
    let m = CostModel::device(&scaled_model());
    j.reads as f64 * m.cost(Dir::Read, bs) as f64 + j.writes as f64 * m.cost(Dir::Write, bs) as f64
}

fn fairness(a: &ExperimentArgs) -> Result<()> {
    let pairs: [(&str, &str, u64, &str, u64); 5] = [
        (
            "W1",
            "rw=randread,bs=4k,qd=16",
            4096,
            "rw=randread,bs=128k,qd=8",
            131072,
        ),
        (
            "W2",
            "rw=randread,bs=4k,qd=8",
            4096,
            "rw=randwrite,bs=4k,qd=8",
            4096,
        ),
        (
            "W3",
            "rw=randwrite,bs=4k,qd=8",
            4096,
            "rw=randread,bs=128k,qd=8",
            131072,
        ),
        (
            "W4",
            "rw=randread,bs=128k,qd=8",
            131072,
            "rw=randwrite,bs=128k,qd=8",
            131072,
        ),
        (
            "W5",
            "rw=randrw,rwmixread=70,bs=4k,qd=8",
            4096,
            "rw=randrw,rwmixread=30,bs=4k,qd=8",
            4096,
        ),
    ];
    let modes = [
        ("off", "scheduler = \"none\""),
        (
            "fair (device cost)",
            "scheduler = \"fair\"\ncost = \"device\"",
        ),
        (
            "fair (bytes cost)",
            "scheduler = \"fair\"\ncost = \"bytes\"",
        ),
        (
            "fair (bytes, depth 32, budget 400)",
            "scheduler = \"fair\"\ncost = \"bytes\"\ndispatch_depth = 32\ndispatch_budget_us = 400",
        ),
        (
            "fair (bytes, split 32 KiB)",
            "scheduler = \"fair\"\ncost = \"bytes\"\nsplit_bytes = \"32KiB\"",
        ),
        (
            "fair (device, split 32 KiB)",
            "scheduler = \"fair\"\ncost = \"device\"\nsplit_bytes = \"32KiB\"",
        ),
    ];
    let mut md = String::new();
    let _ = writeln!(md, "# Bandwidth fairness (Flint W1-W5) on the emulated SSD\n\nCommand: `cargo run --release -p sluice-cli -- experiment fairness --runtime {}`\n\nEmulated SSD (scaled so the device is the bottleneck on this 2-core machine): `{SCALED_SSD}`. One target worker, `dispatch_depth` 8 unless stated (`budget 400` = `dispatch_budget_us = 400`, i.e. at most 400 000 bytes of cost outstanding), equal weights. Tenant A and B are two host NQNs. `Jain(bytes)` is over the two tenants' bandwidth, `Jain(dev)` over their device time (the device cost model's estimate of how long the SSD spent on each).\n", a.runtime);
    let _ = writeln!(md, "| pair | A | B | mode | A MiB/s | B MiB/s | A IOPS | B IOPS | B/A bytes | Jain(bytes) | Jain(dev) |\n|---|---|---|---|---|---|---|---|---|---|---|");
    let mut jb: Vec<Vec<f64>> = vec![vec![]; modes.len()];
    let mut jd: Vec<Vec<f64>> = vec![vec![]; modes.len()];
    for (w, ja, bsa, jbs, bsb) in pairs {
        for (mi, (mode, settings)) in modes.iter().enumerate() {
            let t = target(
                &tenants_toml(settings, &[("a", 1, ""), ("b", 1, "")]),
                &ssd_backend(SCALED_SSD),
            )?;
            let r = bench(
                &t,
                &[
                    format!("a,hostnqn={},{ja}", host("a")),
                    format!("b,hostnqn={},{jbs}", host("b")),
                ],
                a.runtime,
            )?;
            t.shutdown();
            let (x, y) = (job(&r, "a"), job(&r, "b"));
            let jbytes = jain(&[x.bandwidth_mib_s, y.bandwidth_mib_s]);
            let jdev = jain(&[device_time(x, bsa), device_time(y, bsb)]);
            jb[mi].push(jbytes);
            jd[mi].push(jdev);
            let _ = writeln!(
                md,
                "| {w} | {ja} | {jbs} | {mode} | {:.1} | {:.1} | {:.0} | {:.0} | {:.2} | {jbytes:.3} | {jdev:.3} |",
                x.bandwidth_mib_s,
                y.bandwidth_mib_s,
                x.iops,
                y.iops,
                y.bandwidth_mib_s / x.bandwidth_mib_s.max(1e-9)
            );
            eprintln!(
                "{w} {mode}: A {:.1} MiB/s B {:.1} MiB/s jain bytes {jbytes:.3} dev {jdev:.3}",
                x.bandwidth_mib_s, y.bandwidth_mib_s
            );
        }
    }
    let xs: Vec<String> = pairs.iter().map(|p| p.0.to_string()).collect();
    let s1: Vec<(String, Vec<f64>)> = modes
        .iter()
        .enumerate()
        .map(|(i, m)| (m.0.to_string(), jb[i].clone()))
        .collect();
    let s2: Vec<(String, Vec<f64>)> = modes
        .iter()
        .enumerate()
        .map(|(i, m)| (m.0.to_string(), jd[i].clone()))
        .collect();
    write(
        &a.out,
        "fairness-jain-bytes.svg",
        &svg::bars(
            "Jain's index over bandwidth (1.0 = equal)",
            "W pair",
            "Jain",
            &xs,
            &s1,
            Some(0.95),
        ),
    )?;
    write(
        &a.out,
        "fairness-jain-device.svg",
        &svg::bars(
            "Jain's index over device time",
            "W pair",
            "Jain",
            &xs,
            &s2,
            Some(0.95),
        ),
    )?;

    // Weights 1:2:4 and limits.
    let _ = writeln!(md, "\n## Weights 1:2:4 (three tenants, 4 KiB random reads, QD 16 each)\n\n`fair, 2 workers`: two target worker threads and two I/O queues per tenant (connections are dealt round robin, so every tenant has queues on both workers; the scheduler is shared).\n\n| scheduler | tenant | weight | IOPS | share | expected share | error |\n|---|---|---|---|---|---|---|");
    let mut wshares = Vec::new();
    for (mode, settings, workers) in [
        ("off", "scheduler = \"none\"", 1),
        ("fair", "scheduler = \"fair\"", 1),
        ("fair, 2 workers", "scheduler = \"fair\"", 2),
    ] {
        let t = target_workers(
            &tenants_toml(settings, &[("w1", 1, ""), ("w2", 2, ""), ("w4", 4, "")]),
            &ssd_backend(SCALED_SSD),
            workers,
        )?;
        let jobs: Vec<String> = ["w1", "w2", "w4"]
            .iter()
            .map(|n| {
                format!(
                    "{n},hostnqn={},rw=randread,bs=4k,qd=16,queues={workers}",
                    host(n)
                )
            })
            .collect();
        let r = bench(&t, &jobs, a.runtime)?;
        t.shutdown();
        let total: f64 = ["w1", "w2", "w4"].iter().map(|n| job(&r, n).iops).sum();
        let mut sh = Vec::new();
        for (n, w) in [("w1", 1.0), ("w2", 2.0), ("w4", 4.0)] {
            let share = job(&r, n).iops / total;
            let exp = w / 7.0;
            sh.push(share);
            let _ = writeln!(
                md,
                "| {mode} | {n} | {w} | {:.0} | {share:.3} | {exp:.3} | {:+.1}% |",
                job(&r, n).iops,
                (share / exp - 1.0) * 100.0
            );
        }
        wshares.push((mode.to_string(), sh));
    }
    wshares.push(("expected".into(), vec![1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]));
    write(
        &a.out,
        "fairness-weights.svg",
        &svg::bars(
            "Share of IOPS, weights 1:2:4",
            "tenant",
            "share",
            &["w1".into(), "w2".into(), "w4".into()],
            &wshares,
            None,
        ),
    )?;

    let _ = writeln!(md, "\n## Limits (fair scheduler)\n\n| tenant A workload | A limit | A measured | B (unlimited) measured |\n|---|---|---|---|");
    for (ja, limit, unit, bsa) in [
        (
            "rw=randread,bs=4k,qd=16",
            "limit = { iops = 3000 }",
            "IOPS",
            4096u64,
        ),
        (
            "rw=randread,bs=128k,qd=8",
            "limit = { read_bytes_per_sec = \"50MiB\" }",
            "MiB/s",
            131072,
        ),
    ] {
        let t = target(
            &tenants_toml("scheduler = \"fair\"", &[("a", 1, limit), ("b", 1, "")]),
            &ssd_backend(SCALED_SSD),
        )?;
        let r = bench(
            &t,
            &[
                format!("a,hostnqn={},{ja}", host("a")),
                format!("b,hostnqn={},{ja}", host("b")),
            ],
            a.runtime,
        )?;
        t.shutdown();
        let (x, y) = (job(&r, "a"), job(&r, "b"));
        let (mx, my) = if unit == "IOPS" {
            (x.iops, y.iops)
        } else {
            (x.bandwidth_mib_s, y.bandwidth_mib_s)
        };
        let _ = bsa;
        let _ = writeln!(md, "| {ja} | `{limit}` | {mx:.1} {unit} | {my:.1} {unit} |");
    }
    write(&a.out, "fairness.md", &md)
}

// ---------------------------------------------------------------- noisy

fn noisy(a: &ExperimentArgs) -> Result<()> {
    let default_ssd = "read_iops_max = 100000, read_bytes_per_sec_max = 1000000000, base_read_latency_us = 80, parallelism = 8";
    let victim = format!("v,hostnqn={},rw=randread,bs=4k,qd=1", host("v"));
    let heavy = format!("h,hostnqn={},rw=randread,bs=128k,qd=32", host("h"));
    let runs: [(&str, String, bool); 10] = [
        ("alone", "scheduler = \"none\"".into(), false),
        ("+ heavy, no isolation", "scheduler = \"none\"".into(), true),
        (
            "+ heavy, fair depth 8",
            "scheduler = \"fair\"\ndispatch_depth = 8".into(),
            true,
        ),
        (
            "+ heavy, fair depth 2",
            "scheduler = \"fair\"\ndispatch_depth = 2".into(),
            true,
        ),
        (
            "+ heavy, fair depth 8, heavy limited 400MiB/s",
            "scheduler = \"fair\"\ndispatch_depth = 8".into(),
            true,
        ),
        (
            "+ heavy, fair depth 32, budget 300 µs",
            "scheduler = \"fair\"\ndispatch_depth = 32\ndispatch_budget_us = 300".into(),
            true,
        ),
        (
            "+ heavy, fair depth 1",
            "scheduler = \"fair\"\ndispatch_depth = 1".into(),
            true,
        ),
        (
            "+ heavy, fair depth 2, heavy CPU share 0.25 (i-NVMe)",
            "scheduler = \"fair\"\ndispatch_depth = 2\ncpu_isolation = true".into(),
            true,
        ),
        (
            "+ heavy, fair depth 2, split 32 KiB",
            "scheduler = \"fair\"\ndispatch_depth = 2\nsplit_bytes = \"32KiB\"".into(),
            true,
        ),
        (
            "+ heavy, fair depth 4, split 32 KiB",
            "scheduler = \"fair\"\ndispatch_depth = 4\nsplit_bytes = \"32KiB\"".into(),
            true,
        ),
    ];
    let mut md = format!("# Noisy neighbour\n\nCommand: `cargo run --release -p sluice-cli -- experiment noisy --runtime {}`\n\nEmulated SSD with the default model (`{default_ssd}`), one worker. Victim: 4 KiB random reads at QD 1. Heavy: 128 KiB random reads at QD 32 (another host NQN).\n\n| run | victim IOPS | p50 µs | p99 µs | p99.9 µs | p99 / solo p99 | heavy MiB/s |\n|---|---|---|---|---|---|---|\n", a.runtime);
    let mut solo_p99 = 0.0;
    let mut xs = Vec::new();
    let (mut p50, mut p99, mut p999) = (vec![], vec![], vec![]);
    for (i, (name, settings, with_heavy)) in runs.iter().enumerate() {
        let limit = match i {
            4 => "limit = { read_bytes_per_sec = \"400MiB\" }",
            7 => "cpu_share = 0.25",
            _ => "",
        };
        let t = target(
            &tenants_toml(settings, &[("v", 1, ""), ("h", 1, limit)]),
            &ssd_backend(default_ssd),
        )?;
        let mut jobs = vec![victim.clone()];
        if *with_heavy {
            jobs.push(heavy.clone());
        }
        let r = bench(&t, &jobs, a.runtime)?;
        t.shutdown();
        let v = job(&r, "v");
        if i == 0 {
            solo_p99 = v.latency_us_p99;
        }
        let hb = if *with_heavy {
            job(&r, "h").bandwidth_mib_s
        } else {
            0.0
        };
        let _ = writeln!(
            md,
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {hb:.0} |",
            v.iops,
            v.latency_us_p50,
            v.latency_us_p99,
            v.latency_us_p999,
            v.latency_us_p99 / solo_p99.max(1e-9)
        );
        eprintln!(
            "{name}: p50 {:.0} p99 {:.0} p99.9 {:.0} heavy {hb:.0} MiB/s",
            v.latency_us_p50, v.latency_us_p99, v.latency_us_p999
        );
        xs.push(format!("{}", i));
        p50.push(v.latency_us_p50);
        p99.push(v.latency_us_p99);
        p999.push(v.latency_us_p999);
    }
    let _ = writeln!(
        md,
        "\nPlot x positions: {}.",
        runs.iter()
            .enumerate()
            .map(|(i, r)| format!("{i} = {}", r.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    write(
        &a.out,
        "noisy-neighbour.svg",
        &svg::bars(
            "QD1 4 KiB reader latency (µs)",
            "run",
            "µs",
            &xs,
            &[
                ("p50".into(), p50),
                ("p99".into(), p99),
                ("p99.9".into(), p999),
            ],
            Some(2.0 * solo_p99),
        ),
    )?;
    write(&a.out, "noisy-neighbour.md", &md)
}

// ---------------------------------------------------------------- CPU (i-NVMe)

fn pin(tid: i32, cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; the libc macros write into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "sched_setaffinity({tid}, cpu {cpu}): {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

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
struct Victims {
    groups: Vec<CpuCgroup>,
    iters: u64,
    /// The interferer's cgroup (its hog runs during every measurement).
    interferer: CpuCgroup,
    interferer_quota: Duration,
}

const PERIOD: Duration = Duration::from_millis(100);

impl Victims {
    fn new(root: &Path, n: usize, iters: u64) -> Result<Self> {
        let frac = 1.0 / (n as f64 + 1.0);
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
enum Mode {
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
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::INvme => "i-NVMe",
            Mode::Cgroup => "cgroup",
        }
    }
}

/// The interferer's target: one worker on CPU 0 at nice -20 (like the
/// kernel's WQ_HIGHPRI nvme_tcp_wq).
fn cpu_target(mode: Mode, k: u32, v: &Victims) -> Result<TargetHandle> {
    let share = v.interferer_quota.as_secs_f64() / PERIOD.as_secs_f64();
    let vc: Vec<String> = v
        .groups
        .iter()
        .map(|g| format!("\"{}\"", g.path().display()))
        .collect();
    let settings = format!(
        "scheduler = \"none\"\ncpu_isolation = {}\ncpu_k = {k}\nvictim_cgroups = [{}]",
        mode == Mode::INvme,
        vc.join(", ")
    );
    let t = target(
        &tenants_toml(&settings, &[("i", 1, &format!("cpu_share = {share}"))]),
        "backend = \"ram\"\nsize = \"256MiB\"",
    )?;
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
    // SAFETY: setpriority on a thread id of this process.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -20);
    }
    if mode == Mode::Cgroup {
        v.interferer.add_thread(tid)?;
    }
    Ok(t)
}

struct Point {
    /// Mean victim completion time alone (s): victims + interferer hog, no I/O.
    alone: f64,
    df: Vec<f64>,
    iops: f64,
    p99: f64,
    p999: f64,
}

/// Baseline (victims + the interferer's hog, no I/O), then the same with the
/// interferer's I/O at `rate` (None: unlimited), back to back.
fn cpu_point(t: &TargetHandle, v: &Victims, mode: Mode, rate: Option<u64>) -> Result<Point> {
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
        let mut a = BenchArgs::new(addr, SUBNQN);
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
fn calibrate(cpu_s: f64) -> Result<u64> {
    pin(0, 0)?;
    let t = Instant::now();
    let n = 20_000_000u64;
    std::hint::black_box(burn(n));
    let per_s = n as f64 / t.elapsed().as_secs_f64();
    pin(0, 1)?;
    Ok((per_s * cpu_s) as u64)
}

const SETUP: &str = "Setup (the paper's n-container experiment on one core): CPU 0 holds the victims and the interferer, each in its own cgroup v1 `cpu` cgroup with quota period/n (period 100 ms, n = victims + 1). Victims run a fixed computation (xorshift rounds, 0.4 s of CPU at full speed), the interferer runs the same kind of CPU hog for the whole measurement (the paper's sysbench in the FIO container) and drives 4 KiB 50/50 random read/write I/O at QD 32 through `sluice-bench` on CPU 1 against a target whose single worker thread is pinned to CPU 0 at nice -20 (the kernel's WQ_HIGHPRI `nvme_tcp_wq` analogue; RAM backend). Degrading factor (DF) = victim completion time with the interferer's I/O / without it (hog still running), measured back to back at each point. Modes: `off` = stock (worker charged to nobody); `i-NVMe` = the worker's CPU is charged to the interferer tenant per loop batch, its cgroup quota lowered by that charge each period (Algorithms 1-2, from user space) and its sockets throttled at T (Algorithm 3: k = 8 unless stated, α = 5 ms, min T = quota/2, victims' cgroups watched for the adaptive T); `cgroup` = the worker thread placed in the interferer's cgroup (kernel charging). The machine has 2 cores shared with other jobs (QEMU, compilers), so absolute numbers are noisy; with `--repeat N` every point is measured N times and the median reported.";

fn cpu(a: &ExperimentArgs) -> Result<()> {
    pin(0, 1)?;
    let iters = calibrate(0.4)?;
    let mut md = format!("# CPU isolation (i-NVMe Figs. 1, 4, 7)\n\nCommand: `cargo run --release -p sluice-cli -- experiment cpu --repeat {}` (as root: needs cgroup v1 `cpu` at `{}`)\n\n{SETUP}\n\n", a.repeat, a.cgroup_root.display());

    // Figs. 1 / 4: n = 2 (one victim, one interferer), interferer IOPS from low to unlimited.
    let v = Victims::new(&a.cgroup_root, 1, iters)?;
    let _ = writeln!(md, "Each point measured {} time(s); the table gives medians and the DF range.\n\n## Figs. 1 and 4: one victim, one interferer (quota 50 % each)\n\n| interferer target IOPS | mode | victim baseline s | DF | DF range | interferer IOPS | p99 µs | p99.9 µs |\n|---|---|---|---|---|---|---|---|", a.repeat);
    let rates = [Some(2000u64), Some(5000), Some(10000), Some(20000), None];
    let modes = [Mode::Off, Mode::INvme, Mode::Cgroup];
    let mut series: Vec<(String, Vec<f64>)> = modes
        .iter()
        .map(|m| (m.name().to_string(), vec![]))
        .collect();
    let mut iops_series = series.clone();
    for rate in rates {
        for (mi, mode) in modes.iter().enumerate() {
            let mut ps = Vec::new();
            for _ in 0..a.repeat {
                let t = cpu_target(*mode, 8, &v)?;
                ps.push(cpu_point(&t, &v, *mode, rate)?);
                t.shutdown();
            }
            let med = |f: &dyn Fn(&Point) -> f64| median(&ps.iter().map(f).collect::<Vec<_>>());
            let dfs: Vec<f64> = ps.iter().map(|p| p.df[0]).collect();
            let (lo, hi) = range(&dfs);
            let (df, iops) = (median(&dfs), med(&|p| p.iops));
            let rs = rate.map_or("unlimited".to_string(), |r| r.to_string());
            let _ = writeln!(
                md,
                "| {rs} | {} | {:.3} | {df:.3} | {lo:.3}-{hi:.3} | {iops:.0} | {:.0} | {:.0} |",
                mode.name(),
                med(&|p| p.alone),
                med(&|p| p.p99),
                med(&|p| p.p999)
            );
            eprintln!(
                "rate {rs} {}: DF {df:.3} ({lo:.3}-{hi:.3}) IOPS {iops:.0}",
                mode.name()
            );
            series[mi].1.push(df);
            iops_series[mi].1.push(iops);
        }
    }
    let xs: Vec<String> = rates
        .iter()
        .map(|r| r.map_or("max".into(), |r| format!("{}k", r / 1000)))
        .collect();
    write(
        &a.out,
        "cpu-fig1-4-df.svg",
        &svg::lines(
            "Victim degrading factor vs interferer target IOPS (n = 2)",
            "interferer target IOPS",
            "degrading factor",
            &xs,
            &series,
            Some(1.07),
        ),
    )?;
    write(
        &a.out,
        "cpu-fig1-4-iops.svg",
        &svg::lines(
            "Interferer IOPS achieved (n = 2)",
            "interferer target IOPS",
            "IOPS",
            &xs,
            &iops_series,
            None,
        ),
    )?;

    // Fig. 7: several victims, one unlimited interferer.
    let _ = writeln!(md, "\n## Fig. 7: n − 1 victims and one unlimited interferer, quota 1/n each\n\n| victims | mode | mean DF | max DF | mean DF range | interferer IOPS |\n|---|---|---|---|---|---|");
    let mut f7: Vec<(String, Vec<f64>)> = modes
        .iter()
        .map(|m| (m.name().to_string(), vec![]))
        .collect();
    for n in 1..=3usize {
        let frac = 1.0 / (n as f64 + 1.0);
        let v = Victims::new(&a.cgroup_root, n, (iters as f64 * frac / 0.5) as u64)?;
        for (mi, mode) in modes.iter().enumerate() {
            let (mut means, mut maxes, mut iops) = (vec![], vec![], vec![]);
            for _ in 0..a.repeat {
                let t = cpu_target(*mode, 8, &v)?;
                let p = cpu_point(&t, &v, *mode, None)?;
                t.shutdown();
                means.push(p.df.iter().sum::<f64>() / p.df.len() as f64);
                maxes.push(p.df.iter().copied().fold(0.0, f64::max));
                iops.push(p.iops);
            }
            let (lo, hi) = range(&means);
            let (mean, max) = (median(&means), median(&maxes));
            let _ = writeln!(
                md,
                "| {n} | {} | {mean:.3} | {max:.3} | {lo:.3}-{hi:.3} | {:.0} |",
                mode.name(),
                median(&iops)
            );
            eprintln!(
                "victims {n} {}: DF mean {mean:.3} max {max:.3}",
                mode.name()
            );
            f7[mi].1.push(mean);
        }
    }
    write(
        &a.out,
        "cpu-fig7.svg",
        &svg::lines(
            "Mean victim DF, one unlimited interferer",
            "victims",
            "degrading factor",
            &["1".into(), "2".into(), "3".into()],
            &f7,
            Some(1.07),
        ),
    )?;
    write(&a.out, "cpu-isolation.md", &md)
}

fn ksplit(a: &ExperimentArgs) -> Result<()> {
    pin(0, 1)?;
    let iters = calibrate(0.4)?;
    let v = Victims::new(&a.cgroup_root, 1, iters)?;
    let mut md = format!("# k-split throttling (i-NVMe Fig. 3)\n\nCommand: `cargo run --release -p sluice-cli -- experiment ksplit --repeat {}`\n\n{SETUP}\n\nHere: n = 2, interferer unlimited, mode i-NVMe, k from 2 to 32; medians of {} run(s) per k.\n\n| k | victim baseline s | interferer IOPS | p99 µs | p99.9 µs | victim DF |\n|---|---|---|---|---|---|\n", a.repeat, a.repeat);
    let ks = [2u32, 4, 8, 16, 32];
    let (mut iops, mut p99, mut p999, mut df) = (vec![], vec![], vec![], vec![]);
    for k in ks {
        let mut ps = Vec::new();
        for _ in 0..a.repeat {
            let t = cpu_target(Mode::INvme, k, &v)?;
            ps.push(cpu_point(&t, &v, Mode::INvme, None)?);
            t.shutdown();
        }
        let med = |f: &dyn Fn(&Point) -> f64| median(&ps.iter().map(f).collect::<Vec<_>>());
        let p = (
            med(&|p| p.alone),
            med(&|p| p.iops),
            med(&|p| p.p99),
            med(&|p| p.p999),
            med(&|p| p.df[0]),
        );
        let _ = writeln!(
            md,
            "| {k} | {:.3} | {:.0} | {:.0} | {:.0} | {:.3} |",
            p.0, p.1, p.2, p.3, p.4
        );
        eprintln!(
            "k {k}: IOPS {:.0} p99 {:.0} p99.9 {:.0} DF {:.3}",
            p.1, p.2, p.3, p.4
        );
        iops.push(p.1);
        p99.push(p.2);
        p999.push(p.3);
        df.push(p.4);
    }
    let xs: Vec<String> = ks.iter().map(|k| k.to_string()).collect();
    write(
        &a.out,
        "ksplit-latency.svg",
        &svg::lines(
            "Interferer tail latency vs k",
            "k",
            "µs",
            &xs,
            &[("p99".into(), p99), ("p99.9".into(), p999)],
            None,
        ),
    )?;
    write(
        &a.out,
        "ksplit-iops.svg",
        &svg::lines(
            "Interferer IOPS vs k",
            "k",
            "IOPS",
            &xs,
            &[("IOPS".into(), iops)],
            None,
        ),
    )?;
    write(
        &a.out,
        "ksplit-df.svg",
        &svg::lines(
            "Victim DF vs k",
            "k",
            "DF",
            &xs,
            &[("DF".into(), df)],
            Some(1.07),
        ),
    )?;
    write(&a.out, "ksplit.md", &md)
}
