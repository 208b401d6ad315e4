//! `sluice-lab pinof-fig5`: PINoF Fig. 5, 4 KiB random I/O at QD 8 with a
//! varying write ratio, on the fast path: i10-style batching on both sides
//! (the paper's baseline) against the isolated scheduler on the target and
//! on both sides, with no batching (`immediate`) for scale; then both
//! batching settings again with containers that also flush when the queue
//! goes idle (`send.flush_when_idle`), which this stack needs (docs/isolation.md).

use super::{
    bench_args, cell, common_cells, common_figures, header, loadavg, med, pdus_per_flush,
    ratio_table, repeated, Figures, Point, Setting, IOPS, MEAN_US, MIB_S, P99_US,
};
use crate::configs::{self, ram, ssd};
use crate::plot;
use crate::report::{per, write};
use crate::DatapathArgs;
use anyhow::Result;
use sluice_proto::send::SchedulerKind;
use std::fmt::Write as _;

/// Settings: (label, target scheduler, host scheduler, flush when idle).
const SETTINGS: [(&str, SchedulerKind, SchedulerKind, bool); 6] = [
    (
        "immediate",
        SchedulerKind::Immediate,
        SchedulerKind::Immediate,
        false,
    ),
    (
        "i10 (both sides)",
        SchedulerKind::Unified,
        SchedulerKind::Unified,
        false,
    ),
    (
        "isolated",
        SchedulerKind::Isolated,
        SchedulerKind::Immediate,
        false,
    ),
    (
        "isolated (both sides)",
        SchedulerKind::Isolated,
        SchedulerKind::Isolated,
        false,
    ),
    (
        "i10, idle flush (both sides)",
        SchedulerKind::Unified,
        SchedulerKind::Unified,
        true,
    ),
    (
        "isolated, idle flush (both sides)",
        SchedulerKind::Isolated,
        SchedulerKind::Isolated,
        true,
    ),
];
const IMMEDIATE: usize = 0;
const I10: usize = 1;
const ISOLATED: usize = 2;
const ISOLATED_BOTH: usize = 3;
const I10_IDLE: usize = 4;
const ISOLATED_IDLE: usize = 5;

/// Columns after the common ones.
const TARGET_PDUS_PER_FLUSH: usize = 5;
const TARGET_SENDS_PER_IO: usize = 6;
const HOST_SENDS_PER_IO: usize = 7;
const HOST_READS_PER_IO: usize = 8;

fn figures(p: &Point) -> Figures {
    let mut f = common_figures(p);
    let t = &p.bench.total;
    f.push(pdus_per_flush(&p.send));
    f.push(per(p.send.sends, p.target_ios));
    f.push(t.host.send_syscalls_per_io);
    f.push(t.host.read_syscalls_per_io);
    f
}

pub fn run(a: &DatapathArgs) -> Result<()> {
    let load0 = loadavg();
    let writes = [0u8, 25, 50, 75, 100];
    let mut md = String::new();
    header(
        &mut md,
        "PINoF Fig. 5: 4 KiB random I/O, QD 8, varying write ratio",
        &a.command_on_backends("pinof-fig5"),
        a.runtime,
        a.repeats,
        &load0,
    );
    let _ = writeln!(
        md,
        "Settings (target / host send scheduler): `immediate` (no batching) on both sides; **i10 (both sides)**: `unified`, one container per queue (64 KiB, 16 PDUs, 50 µs), the i10-style baseline of the paper; `isolated` (PINoF: latency and data freights, R2T > response > data) on the target only, and on both sides; i10 and isolated on both sides again with containers that also flush when their queue goes idle (`idle flush`: the target's worker has read all its input this turn, the host has submitted its batch). No response coalescing.\n"
    );
    for (bname, backend) in a.backends(ram(), ssd()) {
        // [write idx][setting][repeat]
        let mut res: Vec<Vec<Vec<Figures>>> = Vec::new();
        let _ = writeln!(md, "## {bname}\n");
        let _ = writeln!(
            md,
            "| writes | setting | IOPS | MiB/s | mean µs | p99 µs | I/Os per CPU-s | target PDUs/flush | target sends/I/O | host sends/I/O | host reads/I/O |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
        for w in writes {
            let settings: Vec<Setting> = SETTINGS
                .iter()
                .map(|(label, target, host, idle)| {
                    let mut b = bench_args(a.runtime);
                    b.rw = sluice_bench::RwMode::RandRw;
                    b.rwmixread = 100 - w;
                    b.qd = 8;
                    b.send_scheduler = *host;
                    b.send_flush_when_idle = *idle;
                    let mut send = configs::send(*target);
                    send.flush_when_idle = *idle;
                    Setting {
                        label: (*label).to_string(),
                        send,
                        bench: b,
                    }
                })
                .collect();
            let r = repeated(
                &settings,
                &backend,
                a.repeats,
                &format!("fig5 {bname} writes {w}%"),
                figures,
            )?;
            for (st, reps) in settings.iter().zip(&r) {
                let _ = writeln!(
                    md,
                    "| {w}% | {} | {} | {} | {} | {} | {} |",
                    st.label,
                    common_cells(reps),
                    cell(reps, TARGET_PDUS_PER_FLUSH, 2),
                    cell(reps, TARGET_SENDS_PER_IO, 3),
                    cell(reps, HOST_SENDS_PER_IO, 3),
                    cell(reps, HOST_READS_PER_IO, 3),
                );
            }
            res.push(r);
        }
        let _ = writeln!(
            md,
            "\nRatios per repeat (median (min-max)) against the i10-style baseline, and isolated against no batching.\n"
        );
        let rows: Vec<String> = writes.iter().map(|w| format!("{w}%")).collect();
        ratio_table(
            &mut md,
            "writes",
            &rows,
            &res,
            &[
                ("mean lat iso/i10", ISOLATED, I10, MEAN_US),
                ("p99 iso/i10", ISOLATED, I10, P99_US),
                ("IOPS iso/i10", ISOLATED, I10, IOPS),
                ("mean lat iso-both/i10", ISOLATED_BOTH, I10, MEAN_US),
                ("p99 iso-both/i10", ISOLATED_BOTH, I10, P99_US),
                ("IOPS iso-both/i10", ISOLATED_BOTH, I10, IOPS),
                ("mean lat iso/imm", ISOLATED, IMMEDIATE, MEAN_US),
                ("IOPS iso/imm", ISOLATED, IMMEDIATE, IOPS),
            ],
        );
        let _ = writeln!(
            md,
            "\nWith containers that also flush when their queue goes idle (`send.flush_when_idle`, both sides): the isolated path against i10 as the paper runs it, against i10 flushing when idle too (what separation itself buys), and against no batching.\n"
        );
        ratio_table(
            &mut md,
            "writes",
            &rows,
            &res,
            &[
                ("mean lat iso-idle/i10", ISOLATED_IDLE, I10, MEAN_US),
                ("p99 iso-idle/i10", ISOLATED_IDLE, I10, P99_US),
                ("IOPS iso-idle/i10", ISOLATED_IDLE, I10, IOPS),
                (
                    "mean lat iso-idle/i10-idle",
                    ISOLATED_IDLE,
                    I10_IDLE,
                    MEAN_US,
                ),
                ("p99 iso-idle/i10-idle", ISOLATED_IDLE, I10_IDLE, P99_US),
                ("mean lat iso-idle/imm", ISOLATED_IDLE, IMMEDIATE, MEAN_US),
                ("IOPS iso-idle/imm", ISOLATED_IDLE, IMMEDIATE, IOPS),
            ],
        );
        let _ = writeln!(md);
        let xs: Vec<String> = writes.iter().map(|w| format!("{w}%")).collect();
        let tag = if bname == "RAM" { "ram" } else { "ssd" };
        let series = |k: usize| -> Vec<(String, Vec<f64>)> {
            SETTINGS
                .iter()
                .enumerate()
                .map(|(si, (label, _, _, _))| {
                    (
                        (*label).to_string(),
                        res.iter().map(|r| med(&r[si], k)).collect(),
                    )
                })
                .collect()
        };
        for (file, title, ylabel, k, bars) in [
            (
                "latency",
                "mean latency",
                "mean latency (µs)",
                MEAN_US,
                false,
            ),
            ("p99", "p99 latency", "p99 latency (µs)", P99_US, false),
            ("bandwidth", "bandwidth", "MiB/s", MIB_S, true),
        ] {
            let title = format!("PINoF Fig. 5 ({bname}): {title}, 4 KiB QD 8 (medians)");
            let svg = if bars {
                plot::bars(&title, "write ratio", ylabel, &xs, &series(k), None)?
            } else {
                plot::lines(&title, "write ratio", ylabel, &xs, &series(k), None)?
            };
            write(&a.out, &format!("pinof-fig5-{tag}-{file}.svg"), &svg)?;
        }
        let _ = writeln!(
            md,
            "Plots: `pinof-fig5-{tag}-latency.svg`, `pinof-fig5-{tag}-p99.svg`, `pinof-fig5-{tag}-bandwidth.svg`.\n"
        );
    }
    let _ = writeln!(md, "Load average after: {}.", loadavg());
    write(&a.out, "pinof-fig5.md", &md)
}
