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
    let ns = t.registry().subsystems()[NQN].namespaces.get(1).unwrap();
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

/// `sluice bench --floor --json` carries the floor shaped after the job
/// (here 8 KiB writes at QD 4) with the new fields, and the old ones.
#[test]
fn bench_floor_json_has_the_floor_fields() {
    let toml = format!(
        r#"
[target]
listen = "127.0.0.1:0"
discovery_listen = ""
polling = "interrupt"
[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "32MiB"
block_size = 512
"#
    );
    let t = Target::start(&Config::from_toml(&toml).unwrap()).unwrap();
    let cpu = allowed_cpu();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "--target",
            &t.local_addr().to_string(),
            "--nqn",
            NQN,
            "--rw",
            "randwrite",
            "--bs",
            "8k",
            "--qd",
            "4",
            "--runtime",
            "0.2",
            "--floor",
            "--floor-server-cpu",
            &cpu.to_string(),
            "--json",
        ])
        .output()
        .unwrap();
    t.shutdown();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &v["floor"];
    for k in [
        // The old echo loop and bulk, kept.
        "pingpong_latency_us_p50",
        "pipelined_iops",
        "bulk_mib_per_s",
        // The floor.
        "batched_iops",
        "batched_busy_iops",
        "batched_blocking_iops",
        "batched_latency_us_p50",
        "batched_client_requests_per_write",
        "batched_server_replies_per_write",
        "bulk_iops_ceiling",
        "bulk_busy_mib_per_s",
        "bulk_blocking_mib_per_s",
        "busy_pingpong_latency_us_p50",
        "busy_pingpong_latency_us_p99",
        "busy_pingpong_latency_us_mean",
        "floor_iops",
        "floor_mib_per_s",
        "floor_latency_us_p50",
    ] {
        assert!(
            f[k].as_f64().is_some_and(|x| x > 0.0),
            "floor.{k} missing or not positive: {f}"
        );
    }
    assert_eq!(f["block_size_bytes"], 8192);
    assert_eq!(f["write"], true);
    assert_eq!(f["request_bytes"], 72 + 8192);
    assert_eq!(f["reply_bytes"], 24);
    assert_eq!(f["batched_qd"], 4);
    assert_eq!(f["server_cpu"], cpu);
    assert!(f["batched_polling"] == "busy" || f["batched_polling"] == "blocking");
    assert!(
        ["batched", "echo_pipelined", "bulk"].contains(&f["floor_basis"].as_str().unwrap()),
        "{f}"
    );
}

/// A CPU this process may run on (the last one), for the floor's server.
fn allowed_cpu() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let last = list.rsplit([',', '-']).next().unwrap();
    last.parse().unwrap()
}
