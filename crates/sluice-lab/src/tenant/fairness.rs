//! `sluice-lab fairness`: bandwidth fairness (Flint W1-W5), weights 1:2:4
//! and limits on the scaled emulated SSD (docs/tenants.md).

use super::{bench, job, target};
use crate::configs::{
    self, fairness_modes, host, limits, scaled_model, scaled_ssd, ssd_text, weight_modes,
};
use crate::report::{jain, write};
use crate::{plot, RunArgs};
use anyhow::Result;
use sluice_bench::JobReport;
use sluice_target::tenant::fair::CostModel;
use sluice_target::tenant::rate::Dir;
use std::fmt::Write as _;

/// Device time of a job under the scaled SSD's cost model (ns).
fn device_time(j: &JobReport, bs: u64) -> f64 {
    let m = CostModel::device(&scaled_model());
    j.reads as f64 * m.cost(Dir::Read, bs) as f64 + j.writes as f64 * m.cost(Dir::Write, bs) as f64
}

pub fn run(a: &RunArgs) -> Result<()> {
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
    let modes = fairness_modes();
    let scaled = ssd_text(&scaled_ssd());
    let mut md = String::new();
    let _ = writeln!(md, "# Bandwidth fairness (Flint W1-W5) on the emulated SSD\n\nCommand: `cargo run --release -p sluice-lab -- fairness --runtime {}`\n\nEmulated SSD (scaled so the device is the bottleneck on this 2-core machine): `{scaled}`. One target worker, `dispatch_depth` 8 unless stated (`budget 400` = `dispatch_budget_us = 400`, i.e. at most 400 000 bytes of cost outstanding), equal weights. Tenant A and B are two host NQNs. `Jain(bytes)` is over the two tenants' bandwidth, `Jain(dev)` over their device time (the device cost model's estimate of how long the SSD spent on each).\n", a.runtime);
    let _ = writeln!(md, "| pair | A | B | mode | A MiB/s | B MiB/s | A IOPS | B IOPS | B/A bytes | Jain(bytes) | Jain(dev) |\n|---|---|---|---|---|---|---|---|---|---|---|");
    let mut jb: Vec<Vec<f64>> = vec![vec![]; modes.len()];
    let mut jd: Vec<Vec<f64>> = vec![vec![]; modes.len()];
    for (w, ja, bsa, jbs, bsb) in pairs {
        for (mi, (mode, settings)) in modes.iter().enumerate() {
            let t = target(&configs::fairness_target(settings.clone())?)?;
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
        &plot::bars(
            "Jain's index over bandwidth (1.0 = equal)",
            "W pair",
            "Jain",
            &xs,
            &s1,
            Some(0.95),
        )?,
    )?;
    write(
        &a.out,
        "fairness-jain-device.svg",
        &plot::bars(
            "Jain's index over device time",
            "W pair",
            "Jain",
            &xs,
            &s2,
            Some(0.95),
        )?,
    )?;

    // Weights 1:2:4 and limits.
    let _ = writeln!(md, "\n## Weights 1:2:4 (three tenants, 4 KiB random reads, QD 16 each)\n\n`fair, 2 workers`: two target worker threads and two I/O queues per tenant (connections are dealt round robin, so every tenant has queues on both workers; the scheduler is shared).\n\n| scheduler | tenant | weight | IOPS | share | expected share | error |\n|---|---|---|---|---|---|---|");
    let mut wshares = Vec::new();
    for (mode, settings, workers) in weight_modes() {
        let t = target(&configs::weights_target(settings, workers)?)?;
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
        &plot::bars(
            "Share of IOPS, weights 1:2:4",
            "tenant",
            "share",
            &["w1".into(), "w2".into(), "w4".into()],
            &wshares,
            None,
        )?,
    )?;

    let _ = writeln!(md, "\n## Limits (fair scheduler)\n\n| tenant A workload | A limit | A measured | B (unlimited) measured |\n|---|---|---|---|");
    let [iops_3000, read_50mib] = limits();
    for (ja, (limit, rate), unit, bsa) in [
        ("rw=randread,bs=4k,qd=16", iops_3000, "IOPS", 4096u64),
        ("rw=randread,bs=128k,qd=8", read_50mib, "MiB/s", 131072),
    ] {
        let t = target(&configs::limits_target(rate)?)?;
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
