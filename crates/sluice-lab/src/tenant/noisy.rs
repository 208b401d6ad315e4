//! `sluice-lab noisy`: a QD 1 4 KiB reader next to a 128 KiB QD 32 reader,
//! without and with the tenant scheduler's isolation (docs/tenants.md).

use super::{bench, job, target};
use crate::configs::{self, host, noisy_runs, noisy_ssd, ssd_text};
use crate::report::write;
use crate::{plot, RunArgs};
use anyhow::Result;
use std::fmt::Write as _;

pub fn run(a: &RunArgs) -> Result<()> {
    let default_ssd = ssd_text(&noisy_ssd());
    let victim = format!("v,hostnqn={},rw=randread,bs=4k,qd=1", host("v"));
    let heavy = format!("h,hostnqn={},rw=randread,bs=128k,qd=32", host("h"));
    let runs = noisy_runs();
    let mut md = format!("# Noisy neighbour\n\nCommand: `cargo run --release -p sluice-lab -- noisy --runtime {}`\n\nEmulated SSD with the default model (`{default_ssd}`), one worker. Victim: 4 KiB random reads at QD 1. Heavy: 128 KiB random reads at QD 32 (another host NQN).\n\n| run | victim IOPS | p50 µs | p99 µs | p99.9 µs | p99 / solo p99 | heavy MiB/s |\n|---|---|---|---|---|---|---|\n", a.runtime);
    let mut solo_p99 = 0.0;
    let mut xs = Vec::new();
    let (mut p50, mut p99, mut p999) = (vec![], vec![], vec![]);
    for (i, run) in runs.iter().enumerate() {
        let (name, with_heavy) = (run.name, run.with_heavy);
        let t = target(&configs::noisy_target(run)?)?;
        let mut jobs = vec![victim.clone()];
        if with_heavy {
            jobs.push(heavy.clone());
        }
        let r = bench(&t, &jobs, a.runtime)?;
        t.shutdown();
        let v = job(&r, "v");
        if i == 0 {
            solo_p99 = v.latency_us_p99;
        }
        let hb = if with_heavy {
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
            .map(|(i, r)| format!("{i} = {}", r.name))
            .collect::<Vec<_>>()
            .join(", ")
    );
    write(
        &a.out,
        "noisy-neighbour.svg",
        &plot::bars(
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
        )?,
    )?;
    write(&a.out, "noisy-neighbour.md", &md)
}
