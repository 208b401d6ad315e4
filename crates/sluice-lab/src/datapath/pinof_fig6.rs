//! `sluice-lab pinof-fig6`: PINoF Fig. 6, random writes at QD 8 from 4 KiB
//! to 128 KiB, isolated scheduler with and without priorities.

use super::{bench_args, header, loadavg, pdus_per_flush, point, TargetSetup};
use crate::configs::{self, nprio, ram, ssd};
use crate::plot;
use crate::report::{ratio as r, write};
use anyhow::Result;
use sluice_proto::send::SchedulerKind;
use std::fmt::Write as _;
use std::path::Path;

pub fn run(out: &Path, runtime: f64) -> Result<()> {
    let load0 = loadavg();
    let sizes = [4u64, 8, 16, 32, 64, 128];
    let setups = [
        (
            "isolated (priorities)",
            configs::send(SchedulerKind::Isolated),
        ),
        ("isolated Nprio", nprio()),
    ];
    let mut md = String::new();
    header(
        &mut md,
        "PINoF Fig. 6: random writes, QD 8, 4 KiB to 128 KiB (in-capsule limit 8 KiB)",
        &format!("sluice-lab pinof-fig6 --runtime {runtime}"),
        runtime,
        &load0,
    );
    let _ = writeln!(
        md,
        "Nprio = `weight_r2t = weight_response = weight_data = 1`, latency freight 64 KiB / 16 (data freight is 64 KiB / 16 already).\n"
    );
    for (bname, backend) in [("RAM", ram()), ("emulated SSD", ssd())] {
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
                let ts = TargetSetup { send: *send };
                let p = point(&ts, &backend, &a)?;
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
                    p.send.reason(sluice_proto::send::FlushReason::Priority),
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
            &plot::bars(
                &format!("PINoF Fig. 6 ({bname}): IOPS, random writes QD 8"),
                "block size",
                "IOPS",
                &xs,
                &series(0),
                None,
            )?,
        )?;
        write(
            out,
            &format!("pinof-fig6-{tag}-latency.svg"),
            &plot::lines(
                &format!("PINoF Fig. 6 ({bname}): mean latency, random writes QD 8"),
                "block size",
                "mean latency (µs)",
                &xs,
                &series(1),
                None,
            )?,
        )?;
        let _ = writeln!(
            md,
            "Plots: `pinof-fig6-{tag}-iops.svg`, `pinof-fig6-{tag}-latency.svg`.\n"
        );
    }
    let _ = writeln!(md, "Load average after: {}.", loadavg());
    write(out, "pinof-fig6.md", &md)
}
