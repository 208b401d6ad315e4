//! The bench engine against the in-memory target on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_bench::{run, BenchArgs, BenchReport, BlockSizes, RwMode};
use sluice_host::testing::{MemTarget, MemTargetConfig};

fn target() -> (MemTarget, BenchArgs) {
    let cfg = MemTargetConfig {
        size_blocks: 65536,
        ..Default::default()
    };
    let t = MemTarget::start(cfg.clone()).expect("target");
    let a = BenchArgs::new(t.addr().to_string(), cfg.subnqn);
    (t, a)
}

fn check_consistent(r: &BenchReport) {
    for j in r.jobs.iter().chain(std::iter::once(&r.total)) {
        assert!(j.ios > 0, "{j:?}");
        let expect = j.ios as f64 / j.elapsed_s;
        assert!(
            (j.iops - expect).abs() <= expect * 0.001,
            "iops {} vs {}",
            j.iops,
            expect
        );
        let p = [
            j.latency_us_min,
            j.latency_us_p50,
            j.latency_us_p90,
            j.latency_us_p99,
            j.latency_us_p999,
            j.latency_us_p9999,
            j.latency_us_max,
        ];
        assert!(
            p.windows(2).all(|w| w[0] <= w[1] * 1.001),
            "percentiles not ordered: {p:?}"
        );
        assert!(j.latency_us_mean >= j.latency_us_min && j.latency_us_mean <= j.latency_us_max);
        assert_eq!(j.reads + j.writes + j.errors, j.ios);
    }
}

#[test]
fn ios_count_iops_and_verify() {
    let (_t, mut a) = target();
    a.ios = Some(3000);
    a.qd = 8;
    a.queues = 2;
    a.rw = RwMode::RandRw;
    a.bs = "4k:70,64k:30".parse::<BlockSizes>().expect("bs");
    a.verify = true;
    let r = run(a).expect("bench");
    check_consistent(&r);
    assert_eq!(r.total.ios, 3000);
    assert_eq!(r.total.errors, 0, "{:?}", r.total.error_samples);
    assert_eq!(r.total.verify_errors, 0);
    assert!(r.total.reads > 0 && r.total.writes > 0);
    assert!(r.cpu_user_s + r.cpu_sys_s > 0.0);
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).expect("json");
    assert_eq!(json["total"]["ios"], 3000);
    assert!(r.table().contains("IOPS"));
}

#[test]
fn rate_limit_is_honoured() {
    let (_t, mut a) = target();
    a.runtime = Some(2.0);
    a.qd = 4;
    a.rate_iops = Some(500);
    a.rw = RwMode::RandRead;
    let r = run(a).expect("bench");
    check_consistent(&r);
    let iops = r.total.iops;
    assert!((450.0..=550.0).contains(&iops), "rate-limited IOPS {iops}");
}

#[test]
fn several_tenant_jobs() {
    let (_t, mut a) = target();
    a.ios = Some(500);
    a.jobs = vec![
        "t1,hostnqn=nqn.2024-01.io.sluice:t1,rw=randread,bs=4k,qd=4".into(),
        "t2,hostnqn=nqn.2024-01.io.sluice:t2,rw=write,bs=16k,qd=2".into(),
    ];
    let r = run(a).expect("bench");
    check_consistent(&r);
    assert_eq!(r.jobs.len(), 2);
    assert_eq!(r.jobs[0].ios, 500);
    assert_eq!(r.jobs[1].writes, 500);
    assert_eq!(r.jobs[1].bytes, 500 * 16384);
    assert_eq!(r.total.ios, 1000);
}

#[test]
fn floor_is_measured() {
    let (_t, mut a) = target();
    a.ios = Some(200);
    a.floor = true;
    let r = run(a).expect("bench");
    let f = r.floor.as_ref().expect("floor");
    assert!(
        f.pingpong_latency_us_p50 > 0.0 && f.pipelined_iops > 0.0 && f.bulk_mib_per_s > 0.0,
        "{f:?}"
    );
    assert!(r.table().contains("wire floor"));
}
