//! `sluice-lab coalescing`: latency-aware coalescing Figs. 6-8, 4 KiB
//! random reads with the host's wake-up coalescing in every mode.

use super::{bench_args, header, loadavg, point, TargetSetup};
use crate::configs::ram;
use crate::plot;
use crate::report::{ratio as r, write};
use anyhow::Result;
use sluice_bench::JobReport;
use sluice_proto::coalesce::CoalesceMode;
use sluice_proto::send::SchedulerKind;
use std::fmt::Write as _;
use std::path::Path;

pub fn run(out: &Path, runtime: f64) -> Result<()> {
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
        &format!("sluice-lab coalescing --runtime {runtime}"),
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
            let p = point(&TargetSetup::sched(SchedulerKind::Immediate), &ram(), &a)?;
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
            &plot::bars(title, "workload", ylabel, &xs, &series(k), None)?,
        )?;
    }
    let _ = writeln!(
        md,
        "Plots: `coalescing-iops.svg`, `coalescing-latency.svg`, `coalescing-notifications.svg`.\n\nLoad average after: {}.",
        loadavg()
    );
    write(out, "coalescing.md", &md)
}
