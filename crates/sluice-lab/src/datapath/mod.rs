//! The isolated data path experiments of docs/isolation.md: PINoF Figs. 5
//! and 6 and latency-aware coalescing, on the fast path (`sluice bench`'s
//! direct engine against a target polling adaptively).
//!
//! Each point starts a target in this process with its worker pinned to CPU
//! 0, runs `sluice-bench` with its threads pinned to CPU 1 (the affinity of
//! the calling thread is inherited by the threads it starts, which is what
//! `taskset` does for a process), stops the target and keeps both sides'
//! counters. At each x value the settings being compared run back to back,
//! and that is repeated `--repeats` times ([`repeated`]): cells are medians
//! with their range, and ratios are taken per repeat (one run each) before
//! their median. Nothing is tuned to the papers' claims.

pub mod coalescing;
pub mod pinof_fig5;
pub mod pinof_fig6;
pub mod sockets;

use crate::affinity::{cpus, get_mask, pin, set_mask};
use crate::configs::{self, DATAPATH_SUBNQN};
use crate::report::per;
use crate::report::spread;
use anyhow::Result;
use sluice_bench::{BenchArgs, BenchReport};
use sluice_config::NamespaceConfig;
use sluice_proto::send::SendConfig;
use sluice_proto::send::SendStats;
use sluice_target::Target;
use std::fmt::Write as _;

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Result of one point: the bench report and the target's send totals.
pub(super) struct Point {
    pub(super) bench: BenchReport,
    pub(super) send: SendStats,
    pub(super) target_ios: u64,
}

/// One point on the fast path: a target with send path `send` polling
/// adaptively, `sluice bench` with its default (direct) engine.
fn fast_point(send: SendConfig, backend: &NamespaceConfig, b: &BenchArgs) -> Result<Point> {
    let c = configs::fast_datapath_target(send, backend.clone())?;
    let pinned = cpus() >= 2;
    let saved = get_mask()?;
    if pinned {
        pin(0, 0)?;
    }
    let t = Target::start(&c);
    if pinned {
        pin(0, 1)?;
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
    a.nqn = DATAPATH_SUBNQN.into();
    let r = sluice_bench::run(a);
    set_mask(&saved)?;
    let rep = t.shutdown();
    Ok(Point {
        bench: r?,
        send: rep.send,
        target_ios: rep.io_commands,
    })
}

/// One setting compared at an x value: its label, the target's send path
/// and the bench's arguments.
pub(super) struct Setting {
    pub(super) label: String,
    pub(super) send: SendConfig,
    pub(super) bench: BenchArgs,
}

/// A point's figures, one per column of the experiment's table.
pub(super) type Figures = Vec<f64>;

/// Runs the settings back to back on the fast path, `repeats` times;
/// returns `[setting][repeat]` figures as `figures` takes them from each
/// point. `what` prefixes the progress lines on stderr.
pub(super) fn repeated(
    settings: &[Setting],
    backend: &NamespaceConfig,
    repeats: u32,
    what: &str,
    figures: impl Fn(&Point) -> Figures,
) -> anyhow::Result<Vec<Vec<Figures>>> {
    let mut out: Vec<Vec<Figures>> = settings.iter().map(|_| Vec::new()).collect();
    for rep in 0..repeats {
        for (i, st) in settings.iter().enumerate() {
            let p = fast_point(st.send, backend, &st.bench)?;
            let t = &p.bench.total;
            if t.errors > 0 {
                anyhow::bail!(
                    "{what} {}: {} I/O errors, e.g. {:?}",
                    st.label,
                    t.errors,
                    t.error_samples
                );
            }
            eprintln!(
                "{what} {} (repeat {}/{repeats}): {:.0} IOPS, mean {:.1} µs, p99 {:.1} µs",
                st.label,
                rep + 1,
                t.iops,
                t.latency_us_mean,
                t.latency_us_p99
            );
            out[i].push(figures(&p));
        }
    }
    Ok(out)
}

/// Column `k` of every repeat.
pub(super) fn col(reps: &[Figures], k: usize) -> Vec<f64> {
    reps.iter()
        .map(|f| f.get(k).copied().unwrap_or(f64::NAN))
        .collect()
}

/// The median of column `k`.
pub(super) fn med(reps: &[Figures], k: usize) -> f64 {
    crate::report::median(&col(reps, k))
}

/// Column `k` as `median (min-max)`.
pub(super) fn cell(reps: &[Figures], k: usize, decimals: usize) -> String {
    spread(&col(reps, k), decimals)
}

/// One column of a ratio table: its heading, then (setting, baseline,
/// figure): the setting's figure over the baseline's, per repeat.
pub(super) type RatioColumn<'a> = (&'a str, usize, usize, usize);

/// A table of per-repeat ratios (median (min-max)) into `md`: one row per
/// point (`rows[i]` names `res[i]`, which is `[setting][repeat]`), one
/// column per [`RatioColumn`], under a first column headed `first`.
pub(super) fn ratio_table(
    md: &mut String,
    first: &str,
    rows: &[String],
    res: &[Vec<Vec<Figures>>],
    columns: &[RatioColumn],
) {
    let _ = write!(md, "| {first} |");
    for (heading, ..) in columns {
        let _ = write!(md, " {heading} |");
    }
    let _ = writeln!(md, "\n|---|{}", "---|".repeat(columns.len()));
    for (row, r) in rows.iter().zip(res) {
        let _ = write!(md, "| {row} |");
        for &(_, s, b, k) in columns {
            let _ = write!(
                md,
                " {} |",
                crate::report::ratio_spread(&col(&r[s], k), &col(&r[b], k))
            );
        }
        let _ = writeln!(md);
    }
}

/// The common cells of a PINoF row, in [`common_figures`]' order:
/// `IOPS | MiB/s | mean µs | p99 µs | I/Os per CPU-s`.
pub(super) fn common_cells(reps: &[Figures]) -> String {
    format!(
        "{} | {} | {} | {} | {}",
        cell(reps, IOPS, 0),
        cell(reps, MIB_S, 1),
        cell(reps, MEAN_US, 1),
        cell(reps, P99_US, 1),
        cell(reps, IOS_PER_CPU_S, 0)
    )
}

/// The figures every fast-path table starts with: IOPS, MiB/s, mean µs,
/// p99 µs, and IOPS per CPU-second of target and host together (both run
/// in this process).
pub(super) fn common_figures(p: &Point) -> Figures {
    let t = &p.bench.total;
    let cpu = p.bench.cpu_user_s + p.bench.cpu_sys_s;
    let ios_per_cpu_s = if cpu > 0.0 { t.ios as f64 / cpu } else { 0.0 };
    vec![
        t.iops,
        t.bandwidth_mib_s,
        t.latency_us_mean,
        t.latency_us_p99,
        ios_per_cpu_s,
    ]
}

/// Columns of [`common_figures`].
pub(super) const IOPS: usize = 0;
pub(super) const MIB_S: usize = 1;
pub(super) const MEAN_US: usize = 2;
pub(super) const P99_US: usize = 3;
pub(super) const IOS_PER_CPU_S: usize = 4;

pub(super) fn bench_args(runtime: f64) -> BenchArgs {
    let mut a = BenchArgs::new("", DATAPATH_SUBNQN);
    a.runtime = Some(runtime);
    a.span = Some("256m".into());
    a
}

pub(super) fn pdus_per_flush(s: &SendStats) -> f64 {
    per(s.flush_pdus, s.flushes)
}

pub(super) fn header(
    md: &mut String,
    title: &str,
    cmd: &str,
    runtime: f64,
    repeats: u32,
    load0: &str,
) {
    let _ = writeln!(md, "# {title}\n");
    let _ = writeln!(md, "Command: `{cmd}`\n");
    let _ = writeln!(
        md,
        "Release build; {runtime} s per point, {repeats} repeats (cells: median (min-max); ratios taken per repeat, then their median (min-max)); the fast path: `sluice bench`'s direct engine (run to completion, adaptive polling) against a target polling adaptively; target worker pinned to CPU 0, bench thread to CPU 1 ({} CPUs online); loopback TCP; load average (1/5/15 min) before: {load0}.\n",
        cpus()
    );
}
