//! `sluice-lab cpu`: CPU isolation, i-NVMe Figs. 1, 4 and 7 (victim
//! degrading factor against an interferer's I/O; off / i-NVMe / cgroup).
//! Needs root and cgroup v1 `cpu` at `--cgroup-root`.

use super::cpu_setup::{calibrate, cpu_point, cpu_target, Mode, Point, Victims, SETUP};
use crate::affinity::pin;
use crate::report::{median, range, write};
use crate::{plot, CpuArgs};
use anyhow::Result;
use std::fmt::Write as _;

pub fn run(a: &CpuArgs) -> Result<()> {
    pin(0, 1)?;
    let iters = calibrate(0.4)?;
    let mut md = format!("# CPU isolation (i-NVMe Figs. 1, 4, 7)\n\nCommand: `cargo run --release -p sluice-lab -- cpu --repeat {}` (as root: needs cgroup v1 `cpu` at `{}`)\n\n{SETUP}\n\n", a.repeat, a.cgroup_root.display());

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
        &plot::lines(
            "Victim degrading factor vs interferer target IOPS (n = 2)",
            "interferer target IOPS",
            "degrading factor",
            &xs,
            &series,
            Some(1.07),
        )?,
    )?;
    write(
        &a.out,
        "cpu-fig1-4-iops.svg",
        &plot::lines(
            "Interferer IOPS achieved (n = 2)",
            "interferer target IOPS",
            "IOPS",
            &xs,
            &iops_series,
            None,
        )?,
    )?;

    // Fig. 7: several victims, one unlimited interferer.
    let _ = writeln!(md, "\n## Fig. 7: n − 1 victims and one unlimited interferer, quota 1/n each\n\n| victims | mode | mean DF | max DF | mean DF range | interferer IOPS |\n|---|---|---|---|---|---|");
    let mut f7: Vec<(String, Vec<f64>)> = modes
        .iter()
        .map(|m| (m.name().to_string(), vec![]))
        .collect();
    for n in 1..=3usize {
        let frac = 1.0 / (n as f64 + 1.0);
        // Positive and far below u64::MAX (a float cast saturates anyway).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let victim_iters = (iters as f64 * frac / 0.5) as u64;
        let v = Victims::new(&a.cgroup_root, n, victim_iters)?;
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
        &plot::lines(
            "Mean victim DF, one unlimited interferer",
            "victims",
            "degrading factor",
            &["1".into(), "2".into(), "3".into()],
            &f7,
            Some(1.07),
        )?,
    )?;
    write(&a.out, "cpu-isolation.md", &md)
}
