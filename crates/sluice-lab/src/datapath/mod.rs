//! The isolated data path experiments of docs/isolation.md: PINoF Figs. 5
//! and 6 and latency-aware coalescing.
//!
//! Each point starts a target in this process with its worker pinned to CPU
//! 0, runs `sluice-bench` with its threads pinned to CPU 1 (the affinity of
//! the calling thread is inherited by the threads it starts, which is what
//! `taskset` does for a process), stops the target and keeps both sides'
//! counters. The settings being compared run back to back at each x value,
//! so every ratio comes from one run. Nothing is tuned to the papers' claims.

pub mod coalescing;
pub mod pinof_fig5;
pub mod pinof_fig6;

use crate::affinity::{cpus, get_mask, pin, set_mask};
use crate::configs::{self, DATAPATH_SUBNQN};
use crate::report::per;
use anyhow::Result;
use sluice_bench::{BenchArgs, BenchReport};
use sluice_config::NamespaceConfig;
use sluice_proto::send::SendStats;
use sluice_proto::send::{SchedulerKind, SendConfig};
use sluice_target::Target;
use std::fmt::Write as _;

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// One target setting: the target's send path (scheduler, freights,
/// response coalescing).
#[derive(Debug, Clone)]
pub(super) struct TargetSetup {
    pub(super) send: SendConfig,
}

impl TargetSetup {
    /// Scheduler `s`, everything else at its default (no coalescing).
    pub(super) fn sched(s: SchedulerKind) -> Self {
        TargetSetup {
            send: configs::send(s),
        }
    }
}

/// Result of one point: the bench report and the target's send totals.
pub(super) struct Point {
    pub(super) bench: BenchReport,
    pub(super) send: SendStats,
    pub(super) target_ios: u64,
}

pub(super) fn point(ts: &TargetSetup, backend: &NamespaceConfig, b: &BenchArgs) -> Result<Point> {
    let c = configs::datapath_target(ts.send, backend.clone())?;
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

pub(super) fn bench_args(runtime: f64) -> BenchArgs {
    let mut a = BenchArgs::new("", DATAPATH_SUBNQN);
    a.runtime = Some(runtime);
    a.span = Some("256m".into());
    a
}

pub(super) fn pdus_per_flush(s: &SendStats) -> f64 {
    per(s.flush_pdus, s.flushes)
}

pub(super) fn header(md: &mut String, title: &str, cmd: &str, runtime: f64, load0: &str) {
    let _ = writeln!(md, "# {title}\n");
    let _ = writeln!(md, "Command: `{cmd}`\n");
    let _ = writeln!(
        md,
        "Release build; {runtime} s per point; target worker pinned to CPU 0, bench threads to CPU 1 ({} CPUs online); loopback TCP; load average (1/5/15 min) before: {load0}.\n",
        cpus()
    );
}
