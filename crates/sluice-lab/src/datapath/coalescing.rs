//! `sluice-lab coalescing`: latency-aware coalescing Figs. 6-8 on the fast
//! path: the target coalesces CapsuleResps (a fire = one flush of
//! responses = one wake-up of the host's polling thread, the analogue of an
//! interrupt), `sluice bench`'s direct engine carries the hints in CDW13.
//! Workloads: 4 KiB random reads at QD 1 and QD 32, a bursty mix, and
//! batches that end with a Barrier.

use super::{
    bench_args, cell, col, common_figures, header, loadavg, med, repeated, Figures, Point, Setting,
    IOPS, IOS_PER_CPU_S, MEAN_US, P99_US,
};
use crate::configs::{self, ram};
use crate::plot;
use crate::report::{per, ratio_spread, write};
use crate::DatapathArgs;
use anyhow::Result;
use sluice_proto::coalesce::CoalesceMode;
use sluice_proto::send::{SchedulerKind, SendConfig};
use std::fmt::Write as _;
use std::time::Duration;

/// The slow job of the bursty workload (its own host NQN, so its own queue).
const SLOW_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-000000000002";

/// Fixed Δ of `calibrated-fixed`: the correction formula's Δ for an empty
/// batch (e^(0.1·16) − 1 = 3.95 µs), so the two differ only in Δ shrinking
/// as the batch fills.
const FIXED_DELTA_US: u64 = 4;

/// Columns after the common ones.
const NOTIFICATIONS_PER_IO: usize = 5;
const HELD_US_PER_NOTIFICATION: usize = 6;
const HOST_READS_PER_IO: usize = 7;
const SLOW_MEAN_US: usize = 8;

fn figures(p: &Point) -> Figures {
    let mut f = common_figures(p);
    f.push(per(p.send.notifications, p.target_ios));
    f.push(per(p.send.coalesce_held_ns, p.send.notifications) / 1000.0);
    f.push(p.bench.total.host.read_syscalls_per_io);
    f.push(
        p.bench
            .jobs
            .iter()
            .find(|j| j.name == "slow")
            .map_or(f64::NAN, |j| j.latency_us_mean),
    );
    f
}

/// A coalescing setting of the target: (label, mode, static timeout or
/// fixed Δ in µs).
fn modes() -> Vec<(&'static str, CoalesceMode, u64)> {
    vec![
        ("off", CoalesceMode::Off, 20),
        ("static nvme100", CoalesceMode::Static, 100),
        ("static nvme20", CoalesceMode::Static, 20),
        ("adaptive", CoalesceMode::Adaptive, 20),
        ("calibrated", CoalesceMode::Calibrated, 20),
        (
            "calibrated-fixed",
            CoalesceMode::CalibratedFixed,
            FIXED_DELTA_US,
        ),
    ]
}

fn send(mode: CoalesceMode, timeout_us: u64) -> SendConfig {
    let mut s = configs::send(SchedulerKind::Immediate);
    s.coalescing.mode = mode;
    s.coalescing.threshold = 16;
    s.coalescing.correction = 0.1;
    s.coalescing.timeout = Duration::from_micros(timeout_us);
    s
}

struct Work {
    name: &'static str,
    short: &'static str,
    jobs: Vec<String>,
    /// Job whose I/O is marked urgent in the `+urgent` setting.
    urgent_job: Option<&'static str>,
}

pub fn run(a: &DatapathArgs) -> Result<()> {
    let load0 = loadavg();
    let mut md = String::new();
    header(
        &mut md,
        "Latency-aware coalescing Figs. 6-8: 4 KiB random reads, the target's response coalescing",
        &a.command("coalescing"),
        a.runtime,
        a.repeats,
        &load0,
    );
    let _ = writeln!(
        md,
        "The target coalesces CapsuleResps per queue (`[target.coalescing]`): a notification is one release of held responses into the send path, which the host's polling thread sees as one wake-up (its socket reads per I/O are in the table). Target scheduler `immediate`, RAM namespace, threshold 16, correction a = 0.1; static timeouts 100 µs (nvme100) and 20 µs (nvme20); `calibrated-fixed` re-arms a fixed Δ = {FIXED_DELTA_US} µs (the formula's Δ for an empty batch) instead of the correction formula. Hints travel in CDW13 from `sluice bench` (`urgent=1`, `batch=1`); `adaptive` and `static` ignore them. Every job has its own queue: the bursty mix's slow job does not share the burst's coalescer.\n"
    );
    let works = [
        Work {
            name: "QD 1 (sync)",
            short: "QD1",
            jobs: vec!["sync,rw=randread,qd=1".into()],
            urgent_job: Some("sync"),
        },
        Work {
            name: "QD 32 (async)",
            short: "QD32",
            jobs: vec!["async,rw=randread,qd=32".into()],
            urgent_job: None,
        },
        Work {
            name: "bursty (QD 32 burst + QD 1 slow at 2000 IOPS)",
            short: "bursty",
            jobs: vec![
                "burst,rw=randread,qd=32".into(),
                format!("slow,rw=randread,qd=1,rate-iops=2000,hostnqn={SLOW_HOSTNQN}"),
            ],
            urgent_job: Some("slow"),
        },
        Work {
            name: "batches of 32, the last with Barrier",
            short: "barrier",
            jobs: vec!["batch,rw=randread,qd=32,batch=1".into()],
            urgent_job: None,
        },
    ];
    let _ = writeln!(
        md,
        "| workload | mode | IOPS | mean µs | p99 µs | I/Os per CPU-s | notifications/I/O | held µs/notification | host reads/I/O | slow job mean µs |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    // [work] -> (labels, [setting][repeat])
    let mut res: Vec<(Vec<String>, Vec<Vec<Figures>>)> = Vec::new();
    for w in &works {
        let mut settings: Vec<Setting> = Vec::new();
        let mut variants: Vec<(String, CoalesceMode, u64, bool)> = modes()
            .into_iter()
            .map(|(l, m, t)| (l.to_string(), m, t, false))
            .collect();
        if w.urgent_job.is_some() {
            variants.push((
                "calibrated+urgent".into(),
                CoalesceMode::Calibrated,
                20,
                true,
            ));
        }
        for (label, m, t, urgent) in variants {
            let mut b = bench_args(a.runtime);
            b.jobs = w
                .jobs
                .iter()
                .map(|j| {
                    if urgent && w.urgent_job.is_some_and(|u| j.starts_with(u)) {
                        format!("{j},urgent=1")
                    } else {
                        j.clone()
                    }
                })
                .collect();
            settings.push(Setting {
                label,
                send: send(m, t),
                bench: b,
            });
        }
        let r = repeated(
            &settings,
            &ram(),
            a.repeats,
            &format!("coalescing {}", w.short),
            figures,
        )?;
        for (st, reps) in settings.iter().zip(&r) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                w.name,
                st.label,
                cell(reps, IOPS, 0),
                cell(reps, MEAN_US, 1),
                cell(reps, P99_US, 1),
                cell(reps, IOS_PER_CPU_S, 0),
                cell(reps, NOTIFICATIONS_PER_IO, 3),
                cell(reps, HELD_US_PER_NOTIFICATION, 1),
                cell(reps, HOST_READS_PER_IO, 3),
                if w.urgent_job == Some("slow") {
                    cell(reps, SLOW_MEAN_US, 1)
                } else {
                    "-".into()
                },
            );
        }
        res.push((settings.iter().map(|s| s.label.clone()).collect(), r));
    }
    let _ = writeln!(
        md,
        "\nRatios per repeat (median (min-max)) against `off` of the same workload.\n"
    );
    let _ = writeln!(
        md,
        "| workload | mode | IOPS / off | mean lat / off | p99 / off | I/Os per CPU-s / off | notifications/I/O / off |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for (w, (labels, r)) in works.iter().zip(&res) {
        for (i, label) in labels.iter().enumerate().skip(1) {
            let rs = |k: usize| ratio_spread(&col(&r[i], k), &col(&r[0], k));
            let _ = writeln!(
                md,
                "| {} | {label} | {} | {} | {} | {} | {} |",
                w.name,
                rs(IOPS),
                rs(MEAN_US),
                rs(P99_US),
                rs(IOS_PER_CPU_S),
                rs(NOTIFICATIONS_PER_IO),
            );
        }
    }
    let _ = writeln!(md);
    let xs: Vec<String> = works.iter().map(|w| w.short.to_string()).collect();
    let labels: Vec<String> = modes().iter().map(|m| m.0.to_string()).collect();
    let series = |k: usize| -> Vec<(String, Vec<f64>)> {
        labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), res.iter().map(|(_, r)| med(&r[i], k)).collect()))
            .collect()
    };
    for (k, file, title, ylabel) in [
        (
            IOPS,
            "coalescing-iops.svg",
            "Coalescing: IOPS (medians)",
            "IOPS",
        ),
        (
            MEAN_US,
            "coalescing-latency.svg",
            "Coalescing: mean latency (medians)",
            "mean latency (µs)",
        ),
        (
            NOTIFICATIONS_PER_IO,
            "coalescing-notifications.svg",
            "Coalescing: notifications per I/O (medians)",
            "notifications / I/O",
        ),
    ] {
        write(
            &a.out,
            file,
            &plot::bars(title, "workload", ylabel, &xs, &series(k), None)?,
        )?;
    }
    let _ = writeln!(
        md,
        "Plots: `coalescing-iops.svg`, `coalescing-latency.svg`, `coalescing-notifications.svg`.\n\nLoad average after: {}.",
        loadavg()
    );
    write(&a.out, "coalescing.md", &md)
}
