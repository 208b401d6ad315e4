//! `sluice-lab ksplit`: k-split throttling, i-NVMe Fig. 3 (interferer
//! latency and IOPS and victim DF for k from 2 to 32). Needs root and
//! cgroup v1 `cpu` at `--cgroup-root`.

use super::cpu_setup::{calibrate, cpu_point, cpu_target, Mode, Point, Victims, SETUP};
use crate::affinity::pin;
use crate::report::{median, write};
use crate::{plot, CpuArgs};
use anyhow::Result;
use std::fmt::Write as _;

pub fn run(a: &CpuArgs) -> Result<()> {
    pin(0, 1)?;
    let iters = calibrate(0.4)?;
    let v = Victims::new(&a.cgroup_root, 1, iters)?;
    let mut md = format!("# k-split throttling (i-NVMe Fig. 3)\n\nCommand: `cargo run --release -p sluice-lab -- ksplit --repeat {}`\n\n{SETUP}\n\nHere: n = 2, interferer unlimited, mode i-NVMe, k from 2 to 32; medians of {} run(s) per k.\n\n| k | victim baseline s | interferer IOPS | p99 µs | p99.9 µs | victim DF |\n|---|---|---|---|---|---|\n", a.repeat, a.repeat);
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
        &plot::lines(
            "Interferer tail latency vs k",
            "k",
            "µs",
            &xs,
            &[("p99".into(), p99), ("p99.9".into(), p999)],
            None,
        )?,
    )?;
    write(
        &a.out,
        "ksplit-iops.svg",
        &plot::lines(
            "Interferer IOPS vs k",
            "k",
            "IOPS",
            &xs,
            &[("IOPS".into(), iops)],
            None,
        )?,
    )?;
    write(
        &a.out,
        "ksplit-df.svg",
        &plot::lines(
            "Victim DF vs k",
            "k",
            "DF",
            &xs,
            &[("DF".into(), df)],
            Some(1.07),
        )?,
    )?;
    write(&a.out, "ksplit.md", &md)
}
