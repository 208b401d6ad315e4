//! `sluice experiment pinof-fig5 | pinof-fig6 | coalescing`: the isolated
//! data path experiments of docs/isolation.md (issue 4).
//!
//! Each point starts a target in this process with its worker pinned to CPU
//! 0, runs `sluice-bench` with its threads pinned to CPU 1 (the affinity of
//! the calling thread is inherited by the threads it starts, which is what
//! `taskset` does for a process), stops the target and keeps both sides'
//! counters. The settings being compared run back to back at each x value,
//! so every ratio comes from one run. Nothing is tuned to the papers' claims.

use crate::svg;
use anyhow::{bail, Context, Result};
use sluice_bench::{BenchArgs, BenchReport, JobReport};
use sluice_proto::coalesce::CoalesceMode;
use sluice_target::send::SendStats;
use sluice_target::{Config, Target};
use std::fmt::Write as _;
use std::path::Path;

const SUBNQN: &str = "nqn.2026-11.io.sluice:iso";

/// Runs `name`; `Ok(false)` if it is not one of ours.
pub fn run(name: &str, out: &Path, runtime: f64) -> Result<bool> {
    match name {
        "pinof-fig5" => fig5(out, runtime)?,
        "pinof-fig6" => fig6(out, runtime)?,
        "coalescing" => coalescing(out, runtime)?,
        "isolation" => {
            fig5(out, runtime)?;
            fig6(out, runtime)?;
            coalescing(out, runtime)?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The experiment names this module handles.
pub const NAMES: &str = "pinof-fig5, pinof-fig6, coalescing, isolation (all three)";

fn set_mask(set: &libc::cpu_set_t) -> Result<()> {
    // SAFETY: a valid cpu_set_t; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn set_affinity(cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; the libc macro writes into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    };
    set_mask(&set)
}

fn get_mask() -> Result<libc::cpu_set_t> {
    // SAFETY: sched_getaffinity fills the zeroed set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
        }
        Ok(set)
    }
}

/// CPUs online (not the affinity of the calling thread).
fn cpus() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

const RAM: &str = "backend = \"ram\"\nsize = \"1GiB\"";
/// The emulated SSD with its default model (a modest datacenter drive).
const SSD: &str = "backend = \"emulated-ssd\"\nsize = \"1GiB\"";

/// One target setting.
#[derive(Debug, Clone)]
struct TargetSetup {
    scheduler: &'static str,
    /// `[target.send]` lines.
    send: String,
    /// Target response coalescing mode.
    coalescing: CoalesceMode,
}

impl TargetSetup {
    fn sched(s: &'static str) -> Self {
        TargetSetup {
            scheduler: s,
            send: String::new(),
            coalescing: CoalesceMode::Off,
        }
    }
}

/// Result of one point: the bench report and the target's send totals.
struct Point {
    bench: BenchReport,
    send: SendStats,
    target_ios: u64,
}

fn point(ts: &TargetSetup, backend: &str, b: &BenchArgs) -> Result<Point> {
    let toml = format!(
        r#"
[target]
listen = "127.0.0.1:0"
discovery_listen = ""
polling = "interrupt"
workers = 1
shutdown_drain_ms = 2000
send_scheduler = "{}"
[target.send]
{}
[target.coalescing]
mode = "{}"
[[subsystem]]
nqn = "{SUBNQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
{backend}
"#,
        ts.scheduler,
        ts.send,
        ts.coalescing.name()
    );
    let c = Config::from_toml(&toml).with_context(|| format!("experiment config:\n{toml}"))?;
    let pin = cpus() >= 2;
    let saved = get_mask()?;
    if pin {
        set_affinity(0)?;
    }
    let t = Target::start(&c);
    if pin {
        set_affinity(1)?;
    }
    let t = match t {
        Ok(t) => t,
        Err(e) => {
            set_mask(&saved)?;
            return Err(e.into());
        }
    };
    let mut a = b.clone();
    a.target = t.local_addr().to_string();
    a.nqn = SUBNQN.into();
    let r = sluice_bench::run(a);
    set_mask(&saved)?;
    let rep = t.shutdown();
    Ok(Point {
        bench: r?,
        send: rep.send,
        target_ios: rep.io_commands,
    })
}

fn bench_args(runtime: f64) -> BenchArgs {
    let mut a = BenchArgs::new("", SUBNQN);
    a.runtime = Some(runtime);
    a.span = Some("256m".into());
    a
}

fn write(out: &Path, name: &str, text: &str) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let p = out.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    eprintln!("wrote {}", p.display());
    Ok(())
}

fn per(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

fn pdus_per_flush(s: &SendStats) -> f64 {
    per(s.flush_pdus, s.flushes)
}

fn header(md: &mut String, title: &str, cmd: &str, runtime: f64, load0: &str) {
    let _ = writeln!(md, "# {title}\n");
    let _ = writeln!(md, "Command: `{cmd}`\n");
    let _ = writeln!(
        md,
        "Release build; {runtime} s per point; target worker pinned to CPU 0, bench threads to CPU 1 ({} CPUs online); loopback TCP; load average (1/5/15 min) before: {load0}.\n",
        cpus()
    );
}

fn r(x: f64, base: f64) -> String {
    if base == 0.0 {
        "n/a".into()
    } else {
        format!("{:.3}", x / base)
    }
}

// ------------------------------------------------------------ PINoF Fig. 5

fn fig5(out: &Path, runtime: f64) -> Result<()> {
    let load0 = loadavg();
    // The last setting runs the isolated scheduler on both sides (host:
    // `sluice bench --send-scheduler isolated`); the others only on the target.
    let scheds = ["immediate", "unified", "isolated", "isolated+host"];
    let writes = [0u8, 25, 50, 75, 100];
    let mut md = String::new();
    header(
        &mut md,
        "PINoF Fig. 5: 4 KiB random I/O, QD 8, varying write ratio",
        &format!("sluice experiment pinof-fig5 --runtime {runtime}"),
        runtime,
        &load0,
    );
    for (bname, backend) in [("RAM", RAM), ("emulated SSD", SSD)] {
        // [sched][write idx] -> (mean, p99, MiB/s)
        let mut res = vec![vec![(0.0, 0.0, 0.0); writes.len()]; scheds.len()];
        let _ = writeln!(md, "## {bname}\n");
        let _ = writeln!(
            md,
            "| writes | scheduler | IOPS | MiB/s | mean µs | p99 µs | target PDUs/flush | target sends/I/O | host sends/I/O | load |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        for (wi, w) in writes.iter().enumerate() {
            for (si, s) in scheds.iter().enumerate() {
                let mut a = bench_args(runtime);
                a.rw = sluice_bench::RwMode::RandRw;
                a.rwmixread = 100 - w;
                a.qd = 8;
                let ts = if *s == "isolated+host" {
                    a.send_scheduler = sluice_proto::send::SchedulerKind::Isolated;
                    TargetSetup::sched("isolated")
                } else {
                    TargetSetup::sched(s)
                };
                let p = point(&ts, backend, &a)?;
                let t = &p.bench.total;
                res[si][wi] = (t.latency_us_mean, t.latency_us_p99, t.bandwidth_mib_s);
                let _ = writeln!(
                    md,
                    "| {w}% | {s} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {:.3} | {:.3} | {} |",
                    t.iops,
                    t.bandwidth_mib_s,
                    t.latency_us_mean,
                    t.latency_us_p99,
                    pdus_per_flush(&p.send),
                    per(p.send.sends, p.target_ios),
                    t.host.send_syscalls_per_io,
                    loadavg()
                );
                eprintln!(
                    "fig5 {bname} writes {w}% {s}: {:.0} IOPS mean {:.1} us p99 {:.1} us",
                    t.iops, t.latency_us_mean, t.latency_us_p99
                );
            }
        }
        let _ = writeln!(
            md,
            "\nRatios (same run): isolated / unified and isolated / immediate.\n"
        );
        let _ = writeln!(
            md,
            "| writes | mean lat iso/uni | p99 iso/uni | BW iso/uni | mean lat iso/imm | BW iso/imm | mean lat iso+host/uni | BW iso+host/uni |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for (wi, w) in writes.iter().enumerate() {
            let (im, ip, ib) = res[2][wi];
            let (um, up, ub) = res[1][wi];
            let (mm, _, mb) = res[0][wi];
            let (hm, _, hb) = res[3][wi];
            let _ = writeln!(
                md,
                "| {w}% | {} | {} | {} | {} | {} | {} | {} |",
                r(im, um),
                r(ip, up),
                r(ib, ub),
                r(im, mm),
                r(ib, mb),
                r(hm, um),
                r(hb, ub)
            );
        }
        let _ = writeln!(md);
        let xs: Vec<String> = writes.iter().map(|w| format!("{w}%")).collect();
        let tag = if bname == "RAM" { "ram" } else { "ssd" };
        let series = |f: &dyn Fn(&(f64, f64, f64)) -> f64| -> Vec<(String, Vec<f64>)> {
            scheds
                .iter()
                .enumerate()
                .map(|(si, s)| (s.to_string(), res[si].iter().map(f).collect()))
                .collect()
        };
        write(
            out,
            &format!("pinof-fig5-{tag}-latency.svg"),
            &svg::lines(
                &format!("PINoF Fig. 5 ({bname}): mean latency, 4 KiB QD 8"),
                "write ratio",
                "mean latency (µs)",
                &xs,
                &series(&|x| x.0),
                None,
            ),
        )?;
        write(
            out,
            &format!("pinof-fig5-{tag}-p99.svg"),
            &svg::lines(
                &format!("PINoF Fig. 5 ({bname}): p99 latency, 4 KiB QD 8"),
                "write ratio",
                "p99 latency (µs)",
                &xs,
                &series(&|x| x.1),
                None,
            ),
        )?;
        write(
            out,
            &format!("pinof-fig5-{tag}-bandwidth.svg"),
            &svg::bars(
                &format!("PINoF Fig. 5 ({bname}): bandwidth, 4 KiB QD 8"),
                "write ratio",
                "MiB/s",
                &xs,
                &series(&|x| x.2),
                None,
            ),
        )?;
        let _ = writeln!(
            md,
            "Plots: `pinof-fig5-{tag}-latency.svg`, `pinof-fig5-{tag}-p99.svg`, `pinof-fig5-{tag}-bandwidth.svg`.\n"
        );
    }
    let _ = writeln!(md, "Load average after: {}.", loadavg());
    write(out, "pinof-fig5.md", &md)
}

// ------------------------------------------------------------ PINoF Fig. 6

/// PINoF_Nprio: weights 1/1/1 and both freights 64 KiB / 16 (PINoF §5).
const NPRIO: &str = "weight_r2t = 1\nweight_response = 1\nweight_data = 1\nlatency_size = \"64KiB\"\nlatency_degree = 16";

fn fig6(out: &Path, runtime: f64) -> Result<()> {
    let load0 = loadavg();
    let sizes = [4u64, 8, 16, 32, 64, 128];
    let setups = [("isolated (priorities)", ""), ("isolated Nprio", NPRIO)];
    let mut md = String::new();
    header(
        &mut md,
        "PINoF Fig. 6: random writes, QD 8, 4 KiB to 128 KiB (in-capsule limit 8 KiB)",
        &format!("sluice experiment pinof-fig6 --runtime {runtime}"),
        runtime,
        &load0,
    );
    let _ = writeln!(
        md,
        "Nprio = `weight_r2t = weight_response = weight_data = 1`, latency freight 64 KiB / 16 (data freight is 64 KiB / 16 already).\n"
    );
    for (bname, backend) in [("RAM", RAM), ("emulated SSD", SSD)] {
        let mut res = vec![vec![(0.0, 0.0); sizes.len()]; setups.len()];
        let _ = writeln!(md, "## {bname}\n");
        let _ = writeln!(
            md,
            "| block | setting | IOPS | MiB/s | mean µs | p99 µs | target PDUs/flush | flushes by priority | R2T-bearing? | load |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        for (bi, kib) in sizes.iter().enumerate() {
            for (si, (sname, send)) in setups.iter().enumerate() {
                let mut a = bench_args(runtime);
                a.rw = sluice_bench::RwMode::RandWrite;
                a.qd = 8;
                a.bs = format!("{kib}k").parse().map_err(anyhow::Error::msg)?;
                let ts = TargetSetup {
                    scheduler: "isolated",
                    send: send.to_string(),
                    coalescing: CoalesceMode::Off,
                };
                let p = point(&ts, backend, &a)?;
                let t = &p.bench.total;
                res[si][bi] = (t.iops, t.latency_us_mean);
                let _ = writeln!(
                    md,
                    "| {kib} KiB | {sname} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {} | {} |",
                    t.iops,
                    t.bandwidth_mib_s,
                    t.latency_us_mean,
                    t.latency_us_p99,
                    pdus_per_flush(&p.send),
                    p.send.reason(sluice_target::send::FlushReason::Priority),
                    if *kib > 8 { "yes" } else { "no" },
                    loadavg()
                );
                eprintln!(
                    "fig6 {bname} {kib}k {sname}: {:.0} IOPS mean {:.1} us",
                    t.iops, t.latency_us_mean
                );
            }
        }
        let _ = writeln!(md, "\nRatios (same run): priorities / Nprio.\n");
        let _ = writeln!(md, "| block | IOPS prio/Nprio | mean lat prio/Nprio |");
        let _ = writeln!(md, "|---|---|---|");
        for (bi, kib) in sizes.iter().enumerate() {
            let _ = writeln!(
                md,
                "| {kib} KiB | {} | {} |",
                r(res[0][bi].0, res[1][bi].0),
                r(res[0][bi].1, res[1][bi].1)
            );
        }
        let _ = writeln!(md);
        let xs: Vec<String> = sizes.iter().map(|k| format!("{k}K")).collect();
        let tag = if bname == "RAM" { "ram" } else { "ssd" };
        let series = |k: usize| -> Vec<(String, Vec<f64>)> {
            setups
                .iter()
                .enumerate()
                .map(|(si, (n, _))| {
                    (
                        n.to_string(),
                        res[si]
                            .iter()
                            .map(|x| if k == 0 { x.0 } else { x.1 })
                            .collect(),
                    )
                })
                .collect()
        };
        write(
            out,
            &format!("pinof-fig6-{tag}-iops.svg"),
            &svg::bars(
                &format!("PINoF Fig. 6 ({bname}): IOPS, random writes QD 8"),
                "block size",
                "IOPS",
                &xs,
                &series(0),
                None,
            ),
        )?;
        write(
            out,
            &format!("pinof-fig6-{tag}-latency.svg"),
            &svg::lines(
                &format!("PINoF Fig. 6 ({bname}): mean latency, random writes QD 8"),
                "block size",
                "mean latency (µs)",
                &xs,
                &series(1),
                None,
            ),
        )?;
        let _ = writeln!(
            md,
            "Plots: `pinof-fig6-{tag}-iops.svg`, `pinof-fig6-{tag}-latency.svg`.\n"
        );
    }
    let _ = writeln!(md, "Load average after: {}.", loadavg());
    write(out, "pinof-fig6.md", &md)
}

// ------------------------------------------------------------ Coalescing Figs. 6-8

fn coalescing(out: &Path, runtime: f64) -> Result<()> {
    let load0 = loadavg();
    let modes = [
        CoalesceMode::Off,
        CoalesceMode::Static,
        CoalesceMode::Adaptive,
        CoalesceMode::Calibrated,
    ];
    let mut md = String::new();
    header(
        &mut md,
        "Latency-aware coalescing Figs. 6-8: 4 KiB random reads, host wake-up coalescing",
        &format!("sluice experiment coalescing --runtime {runtime}"),
        runtime,
        &load0,
    );
    let _ = writeln!(
        md,
        "Coalescing runs in the host's queue thread (`ConnectOptions::coalescing`, `sluice bench --coalescing`): a notification is one batch of task wake-ups, the analogue of an interrupt. Target: `immediate`, no coalescing, RAM namespace. threshold 16, static timeout 20 µs (nvme20), correction a = 0.1. `calibrated` without hints behaves as `adaptive`; hints used: `urgent` on every I/O of the QD 1 job (row `calibrated+urgent`) and on the slow job of the bursty workload.\n"
    );
    // (label, jobs, urgent flags)
    struct Work {
        name: &'static str,
        jobs: Vec<String>,
    }
    let works = [
        Work {
            name: "QD 1 (sync)",
            jobs: vec!["sync,rw=randread,qd=1".into()],
        },
        Work {
            name: "QD 32 (async)",
            jobs: vec!["async,rw=randread,qd=32".into()],
        },
        Work {
            name: "bursty (QD 32 burst + QD 1 slow at 2000 IOPS)",
            jobs: vec![
                "burst,rw=randread,qd=32".into(),
                "slow,rw=randread,qd=1,rate-iops=2000,hostnqn=nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-000000000002".into(),
            ],
        },
    ];
    let _ = writeln!(
        md,
        "| workload | mode | IOPS | mean µs | p99 µs | notifications/I/O | host sends/I/O | held µs/notification | slow job mean µs | load |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    // [work][variant] -> (iops, mean, notif/io)
    let mut res: Vec<Vec<(String, f64, f64, f64)>> = Vec::new();
    for w in &works {
        let mut row = Vec::new();
        let mut variants: Vec<(String, CoalesceMode, bool)> = modes
            .iter()
            .map(|m| (m.name().to_string(), *m, false))
            .collect();
        if w.name.starts_with("QD 1") || w.name.starts_with("bursty") {
            variants.push(("calibrated+urgent".into(), CoalesceMode::Calibrated, true));
        }
        for (label, m, urgent) in variants {
            let mut a = bench_args(runtime);
            a.coalescing = m;
            a.jobs = w
                .jobs
                .iter()
                .map(|j| {
                    if urgent && (j.starts_with("sync") || j.starts_with("slow")) {
                        format!("{j},urgent=1")
                    } else {
                        j.clone()
                    }
                })
                .collect();
            let p = point(&TargetSetup::sched("immediate"), RAM, &a)?;
            let t = &p.bench.total;
            let slow = p
                .bench
                .jobs
                .iter()
                .find(|j| j.name == "slow")
                .map(|j: &JobReport| format!("{:.1}", j.latency_us_mean))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                md,
                "| {} | {label} | {:.0} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1} | {slow} | {} |",
                w.name,
                t.iops,
                t.latency_us_mean,
                t.latency_us_p99,
                t.host.notifications_per_io,
                t.host.send_syscalls_per_io,
                t.host.held_us_per_notification,
                loadavg()
            );
            eprintln!(
                "coalescing {} {label}: {:.0} IOPS mean {:.1} us {:.3} notif/IO",
                w.name, t.iops, t.latency_us_mean, t.host.notifications_per_io
            );
            row.push((
                label,
                t.iops,
                t.latency_us_mean,
                t.host.notifications_per_io,
            ));
        }
        res.push(row);
    }
    let _ = writeln!(
        md,
        "\nRatios (same run) against `off` of the same workload.\n"
    );
    let _ = writeln!(
        md,
        "| workload | mode | IOPS / off | mean lat / off | notifications/I/O / off |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (w, row) in works.iter().zip(&res) {
        let (_, oi, om, on) = row[0].clone();
        for (label, i, m, n) in row.iter().skip(1) {
            let _ = writeln!(
                md,
                "| {} | {label} | {} | {} | {} |",
                w.name,
                r(*i, oi),
                r(*m, om),
                r(*n, on)
            );
        }
    }
    let _ = writeln!(md);
    let xs: Vec<String> = ["QD1", "QD32", "bursty"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let labels: Vec<String> = res[0].iter().map(|x| x.0.clone()).collect();
    let series = |k: usize| -> Vec<(String, Vec<f64>)> {
        labels
            .iter()
            .map(|l| {
                (
                    l.clone(),
                    res.iter()
                        .map(|row| {
                            row.iter()
                                .find(|x| &x.0 == l)
                                .map(|x| match k {
                                    0 => x.1,
                                    1 => x.2,
                                    _ => x.3,
                                })
                                .unwrap_or(0.0)
                        })
                        .collect(),
                )
            })
            .collect()
    };
    for (k, file, title, ylabel) in [
        (0, "coalescing-iops.svg", "Coalescing: IOPS", "IOPS"),
        (
            1,
            "coalescing-latency.svg",
            "Coalescing: mean latency",
            "mean latency (µs)",
        ),
        (
            2,
            "coalescing-notifications.svg",
            "Coalescing: notifications per I/O",
            "notifications / I/O",
        ),
    ] {
        write(
            out,
            file,
            &svg::bars(title, "workload", ylabel, &xs, &series(k), None),
        )?;
    }
    let _ = writeln!(
        md,
        "Plots: `coalescing-iops.svg`, `coalescing-latency.svg`, `coalescing-notifications.svg`.\n\nLoad average after: {}.",
        loadavg()
    );
    write(out, "coalescing.md", &md)
}
