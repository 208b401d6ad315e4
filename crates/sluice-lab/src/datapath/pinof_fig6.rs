//! `sluice-lab pinof-fig6`: PINoF Fig. 6, random writes at QD 8 from 4 KiB
//! to 128 KiB on the fast path: the isolated scheduler with and without
//! priorities (Nprio), and i10-style batching on both sides, with the
//! papers' containers; then both isolated settings again with freights that
//! flush when their queue goes idle (`send.flush_when_idle`, the default).

use super::{
    bench_args, cell, common_cells, common_figures, header, loadavg, med, pdus_per_flush,
    ratio_table, repeated, Figures, Point, Setting, IOPS, MEAN_US, P99_US,
};
use crate::configs::{self, nprio, ram, ssd};
use crate::plot;
use crate::report::{per, write};
use crate::DatapathArgs;
use anyhow::Result;
use sluice_proto::send::{FlushReason, SchedulerKind};
use std::fmt::Write as _;

const PRIO: usize = 0;
const NPRIO: usize = 1;
const I10: usize = 2;
const PRIO_IDLE: usize = 3;
const NPRIO_IDLE: usize = 4;
const LABELS: [&str; 5] = [
    "isolated (priorities)",
    "isolated Nprio",
    "i10 (both sides)",
    "isolated (priorities), idle flush",
    "isolated Nprio, idle flush",
];

/// Columns after the common ones.
const TARGET_PDUS_PER_FLUSH: usize = 5;
const PRIORITY_FLUSHES_PER_IO: usize = 6;
const HOST_SENDS_PER_IO: usize = 7;

fn figures(p: &Point) -> Figures {
    let mut f = common_figures(p);
    f.push(pdus_per_flush(&p.send));
    f.push(per(p.send.reason(FlushReason::Priority), p.target_ios));
    f.push(p.bench.total.host.send_syscalls_per_io);
    f
}

pub fn run(a: &DatapathArgs) -> Result<()> {
    let load0 = loadavg();
    let sizes = [4u64, 8, 16, 32, 64, 128];
    let mut md = String::new();
    header(
        &mut md,
        "PINoF Fig. 6: random writes, QD 8, 4 KiB to 128 KiB (in-capsule limit 8 KiB)",
        &a.command_on_backends("pinof-fig6"),
        a.runtime,
        a.repeats,
        &load0,
    );
    let _ = writeln!(
        md,
        "Nprio = `weight_r2t = weight_response = weight_data = 1`, latency freight 64 KiB / 16 (data freight is 64 KiB / 16 already). The isolated settings run on the target (host `immediate`); i10 = `unified` on both sides. The first three hold PDUs for their triggers (the papers' containers); the two `idle flush` settings also flush when the queue goes idle (`send.flush_when_idle`, the default). Writes above 8 KiB go by R2T.\n"
    );
    for (bname, backend) in a.backends(ram(), ssd()) {
        let mut res: Vec<Vec<Vec<Figures>>> = Vec::new();
        let _ = writeln!(md, "## {bname}\n");
        let _ = writeln!(
            md,
            "| block | setting | IOPS | MiB/s | mean µs | p99 µs | I/Os per CPU-s | target PDUs/flush | priority flushes/I/O | host sends/I/O |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        for kib in sizes {
            let idle = |mut s: sluice_proto::send::SendConfig| {
                s.flush_when_idle = true;
                s
            };
            let sends = [
                (
                    configs::send(SchedulerKind::Isolated),
                    SchedulerKind::Immediate,
                ),
                (nprio(), SchedulerKind::Immediate),
                (
                    configs::send(SchedulerKind::Unified),
                    SchedulerKind::Unified,
                ),
                (
                    idle(configs::send(SchedulerKind::Isolated)),
                    SchedulerKind::Immediate,
                ),
                (idle(nprio()), SchedulerKind::Immediate),
            ];
            let mut settings = Vec::new();
            for (label, (send, host)) in LABELS.iter().zip(sends) {
                let mut b = bench_args(a.runtime);
                b.rw = sluice_bench::RwMode::RandWrite;
                b.qd = 8;
                b.bs = format!("{kib}k").parse().map_err(anyhow::Error::msg)?;
                b.send_scheduler = host;
                // The host's i10 container keeps the papers' triggers.
                b.send_flush_when_idle = false;
                settings.push(Setting {
                    label: (*label).to_string(),
                    send,
                    bench: b,
                });
            }
            let r = repeated(
                &settings,
                &backend,
                a.repeats,
                &format!("fig6 {bname} {kib}k"),
                figures,
            )?;
            for (st, reps) in settings.iter().zip(&r) {
                let _ = writeln!(
                    md,
                    "| {kib} KiB | {} | {} | {} | {} | {} |",
                    st.label,
                    common_cells(reps),
                    cell(reps, TARGET_PDUS_PER_FLUSH, 2),
                    cell(reps, PRIORITY_FLUSHES_PER_IO, 3),
                    cell(reps, HOST_SENDS_PER_IO, 3),
                );
            }
            res.push(r);
        }
        let _ = writeln!(
            md,
            "\nRatios per repeat (median (min-max)): priorities against Nprio and against i10.\n"
        );
        let rows: Vec<String> = sizes.iter().map(|k| format!("{k} KiB")).collect();
        ratio_table(
            &mut md,
            "block",
            &rows,
            &res,
            &[
                ("IOPS prio/Nprio", PRIO, NPRIO, IOPS),
                ("mean lat prio/Nprio", PRIO, NPRIO, MEAN_US),
                ("IOPS prio/i10", PRIO, I10, IOPS),
                ("mean lat prio/i10", PRIO, I10, MEAN_US),
                ("p99 prio/i10", PRIO, I10, P99_US),
            ],
        );
        let _ = writeln!(
            md,
            "\nWith freights that also flush when the queue goes idle (the default): priorities against Nprio then, and each against its papers' container.\n"
        );
        ratio_table(
            &mut md,
            "block",
            &rows,
            &res,
            &[
                ("IOPS prio-idle/Nprio-idle", PRIO_IDLE, NPRIO_IDLE, IOPS),
                (
                    "mean lat prio-idle/Nprio-idle",
                    PRIO_IDLE,
                    NPRIO_IDLE,
                    MEAN_US,
                ),
                ("IOPS prio-idle/prio", PRIO_IDLE, PRIO, IOPS),
                ("mean lat prio-idle/prio", PRIO_IDLE, PRIO, MEAN_US),
                ("p99 prio-idle/prio", PRIO_IDLE, PRIO, P99_US),
                ("IOPS Nprio-idle/Nprio", NPRIO_IDLE, NPRIO, IOPS),
            ],
        );
        let _ = writeln!(md);
        let xs: Vec<String> = sizes.iter().map(|k| format!("{k}K")).collect();
        let tag = if bname == "RAM" { "ram" } else { "ssd" };
        let series = |k: usize| -> Vec<(String, Vec<f64>)> {
            LABELS
                .iter()
                .enumerate()
                .map(|(si, label)| {
                    (
                        (*label).to_string(),
                        res.iter().map(|r| med(&r[si], k)).collect(),
                    )
                })
                .collect()
        };
        write(
            &a.out,
            &format!("pinof-fig6-{tag}-iops.svg"),
            &plot::bars(
                &format!("PINoF Fig. 6 ({bname}): IOPS, random writes QD 8 (medians)"),
                "block size",
                "IOPS",
                &xs,
                &series(IOPS),
                None,
            )?,
        )?;
        write(
            &a.out,
            &format!("pinof-fig6-{tag}-latency.svg"),
            &plot::lines(
                &format!("PINoF Fig. 6 ({bname}): mean latency, random writes QD 8 (medians)"),
                "block size",
                "mean latency (µs)",
                &xs,
                &series(MEAN_US),
                None,
            )?,
        )?;
        let _ = writeln!(
            md,
            "Plots: `pinof-fig6-{tag}-iops.svg`, `pinof-fig6-{tag}-latency.svg`.\n"
        );
    }
    let _ = writeln!(md, "Load average after: {}.", loadavg());
    write(&a.out, "pinof-fig6.md", &md)
}
