//! `sluice bench` against a Sluice target whose emulated SSD has a known
//! service rate: the bench's reported IOPS, I/O count and latency must agree
//! with what the target saw and with queueing theory (Little's law).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_bench::{BenchArgs, RwMode};
use sluice_config::{
    Config, NamespaceConfig, PollingPolicy, SsdConfig, SubsystemConfig, TargetSettings,
};
use sluice_target::Target;

const NQN: &str = "nqn.2026-11.io.sluice:rated";
const IOPS_MAX: u64 = 1000;

#[test]
fn bench_reports_what_a_rate_limited_target_serves() {
    let cfg = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen("127.0.0.1:0".parse().unwrap())
                .with_discovery_listen(None)
                .with_polling(PollingPolicy::Interrupt),
        )
        .with_subsystem(
            SubsystemConfig::new(NQN).allow_any_host().with_namespace(
                NamespaceConfig::emulated_ssd(
                    1,
                    256 << 20,
                    SsdConfig::default()
                        .with_read_iops_max(IOPS_MAX)
                        .with_base_read_latency_us(50)
                        .with_parallelism(4),
                ),
            ),
        )
        .validated()
        .unwrap();
    let t = Target::start(&cfg).unwrap();
    let ns = t.registry().subsystems[NQN].namespaces[&1].clone();
    let before = ns.counters.snapshot().read_commands;

    let mut a = BenchArgs::new(t.local_addr().to_string(), NQN);
    a.rw = RwMode::RandRead;
    a.qd = 8;
    a.runtime = Some(3.0);
    let report = sluice_bench::run(a).unwrap();
    let j = &report.jobs[0];
    let served = ns.counters.snapshot().read_commands - before;
    t.shutdown();

    assert_eq!(j.errors, 0);
    // Every I/O the bench counted was served by the target (the target may
    // also have served I/Os still in flight when the bench stopped counting).
    assert!(
        served >= j.ios && served <= j.ios + 8,
        "target served {served}, bench counted {}",
        j.ios
    );
    // The bench never reports more than the device can serve, and its rate
    // agrees with the target's own count over the same window. (How close
    // it gets to the device's rate depends on the machine's load: that is
    // speed, which benchmarks measure, not this test.)
    assert!(
        j.iops <= IOPS_MAX as f64 * 1.05,
        "bench reports {:.0} IOPS from a {IOPS_MAX} IOPS device",
        j.iops
    );
    let served_rate = served as f64 / j.elapsed_s;
    assert!(
        (served_rate - j.iops).abs() / j.iops < 0.05,
        "target served {served_rate:.0}/s, bench reports {:.0}",
        j.iops
    );
    assert!(
        (j.iops - j.ios as f64 / j.elapsed_s).abs() / j.iops < 0.01,
        "IOPS = I/Os / elapsed"
    );
    // Little's law: mean latency = QD / throughput.
    let expect_us = 8.0 / j.iops * 1e6;
    let lat_ratio = j.latency_us_mean / expect_us;
    assert!(
        (0.8..=1.25).contains(&lat_ratio),
        "mean latency {:.0} us, Little's law says {expect_us:.0} us",
        j.latency_us_mean
    );
    assert!(j.latency_us_p50 <= j.latency_us_p99 && j.latency_us_p99 <= j.latency_us_max);
}
