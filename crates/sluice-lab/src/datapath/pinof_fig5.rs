//! `sluice-lab pinof-fig5`: PINoF Fig. 5, 4 KiB random I/O at QD 8 with a
//! varying write ratio, under each send scheduler (RAM and emulated SSD).

use super::{bench_args, header, loadavg, pdus_per_flush, point, TargetSetup};
use crate::configs::{ram, ssd};
use crate::plot;
use crate::report::{per, ratio as r, write};
use anyhow::Result;
use sluice_proto::send::SchedulerKind;
use std::fmt::Write as _;
use std::path::Path;

pub fn run(out: &Path, runtime: f64) -> Result<()> {
    let load0 = loadavg();
    // The last setting runs the isolated scheduler on both sides (host:
    // `sluice bench --send-scheduler isolated`); the others only on the target.
    let scheds = ["immediate", "unified", "isolated", "isolated+host"];
    let writes = [0u8, 25, 50, 75, 100];
    let mut md = String::new();
    header(
        &mut md,
        "PINoF Fig. 5: 4 KiB random I/O, QD 8, varying write ratio",
        &format!("sluice-lab pinof-fig5 --runtime {runtime}"),
        runtime,
        &load0,
    );
    for (bname, backend) in [("RAM", ram()), ("emulated SSD", ssd())] {
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
                    a.send_scheduler = SchedulerKind::Isolated;
                    TargetSetup::sched(SchedulerKind::Isolated)
                } else {
                    TargetSetup::sched(s.parse().map_err(anyhow::Error::msg)?)
                };
                let p = point(&ts, &backend, &a)?;
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
            &plot::lines(
                &format!("PINoF Fig. 5 ({bname}): mean latency, 4 KiB QD 8"),
                "write ratio",
                "mean latency (µs)",
                &xs,
                &series(&|x| x.0),
                None,
            )?,
        )?;
        write(
            out,
            &format!("pinof-fig5-{tag}-p99.svg"),
            &plot::lines(
                &format!("PINoF Fig. 5 ({bname}): p99 latency, 4 KiB QD 8"),
                "write ratio",
                "p99 latency (µs)",
                &xs,
                &series(&|x| x.1),
                None,
            )?,
        )?;
        write(
            out,
            &format!("pinof-fig5-{tag}-bandwidth.svg"),
            &plot::bars(
                &format!("PINoF Fig. 5 ({bname}): bandwidth, 4 KiB QD 8"),
                "write ratio",
                "MiB/s",
                &xs,
                &series(&|x| x.2),
                None,
            )?,
        )?;
        let _ = writeln!(
            md,
            "Plots: `pinof-fig5-{tag}-latency.svg`, `pinof-fig5-{tag}-p99.svg`, `pinof-fig5-{tag}-bandwidth.svg`.\n"
        );
    }
    let _ = writeln!(md, "Load average after: {}.", loadavg());
    write(out, "pinof-fig5.md", &md)
}
