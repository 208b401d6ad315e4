//! Every experiment's target, built with the builders, against the
//! configuration its TOML template (the experiments' only description of
//! their targets until the builders; kept here, verbatim, as the
//! reference) parsed to: no experiment's target changed.
#![allow(clippy::unwrap_used)]

use super::*;
use sluice_proto::coalesce::CoalesceMode;
use std::fmt::Write as _;

// ---- the TOML templates and fragments as they were ----

const OLD_SCALED_SSD: &str = "read_iops_max = 20000, write_iops_max = 10000, read_bytes_per_sec_max = 400000000, write_bytes_per_sec_max = 200000000, base_read_latency_us = 80, base_write_latency_us = 20, parallelism = 8";
const OLD_NOISY_SSD: &str = "read_iops_max = 100000, read_bytes_per_sec_max = 1000000000, base_read_latency_us = 80, parallelism = 8";
const OLD_CPU_RAM: &str = "backend = \"ram\"\nsize = \"256MiB\"";
const OLD_RAM: &str = "backend = \"ram\"\nsize = \"1GiB\"";
const OLD_SSD: &str = "backend = \"emulated-ssd\"\nsize = \"1GiB\"";
const OLD_NPRIO: &str = "weight_r2t = 1\nweight_response = 1\nweight_data = 1\nlatency_size = \"64KiB\"\nlatency_degree = 16";

fn old_ssd_backend(model: &str) -> String {
    format!("backend = \"emulated-ssd\"\nsize = \"1GiB\"\nssd = {{ {model} }}")
}

fn old_tenants(settings: &str, tenants: &[(&str, u32, &str)]) -> String {
    let mut s = format!("[tenants]\n{settings}\n");
    for (n, w, extra) in tenants {
        let _ = writeln!(
            s,
            "[[tenant]]\nname = \"{n}\"\nhosts = [\"{}\"]\nweight = {w}\n{extra}",
            host(n)
        );
    }
    s
}

fn old_tenant_target(tenants: &str, backend: &str, workers: u32) -> Config {
    let toml = format!(
        r#"
[target]
listen = "127.0.0.1:0"
discovery_listen = ""
polling = "interrupt"
workers = {workers}
shutdown_drain_ms = 2000
{tenants}
[[subsystem]]
nqn = "{TENANT_SUBNQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
{backend}
"#
    );
    Config::from_toml(&toml).unwrap()
}

const OLD_FAIRNESS_MODES: [(&str, &str); 6] = [
    ("off", "scheduler = \"none\""),
    (
        "fair (device cost)",
        "scheduler = \"fair\"\ncost = \"device\"",
    ),
    (
        "fair (bytes cost)",
        "scheduler = \"fair\"\ncost = \"bytes\"",
    ),
    (
        "fair (bytes, depth 32, budget 400)",
        "scheduler = \"fair\"\ncost = \"bytes\"\ndispatch_depth = 32\ndispatch_budget_us = 400",
    ),
    (
        "fair (bytes, split 32 KiB)",
        "scheduler = \"fair\"\ncost = \"bytes\"\nsplit_bytes = \"32KiB\"",
    ),
    (
        "fair (device, split 32 KiB)",
        "scheduler = \"fair\"\ncost = \"device\"\nsplit_bytes = \"32KiB\"",
    ),
];

const OLD_WEIGHT_MODES: [(&str, &str, u32); 3] = [
    ("off", "scheduler = \"none\"", 1),
    ("fair", "scheduler = \"fair\"", 1),
    ("fair, 2 workers", "scheduler = \"fair\"", 2),
];

const OLD_LIMITS_SETTINGS: &str = "scheduler = \"fair\"";
const OLD_LIMIT_IOPS_3000: &str = "limit = { iops = 3000 }";
const OLD_LIMIT_READ_50MIB: &str = "limit = { read_bytes_per_sec = \"50MiB\" }";

/// (name, settings, with_heavy, heavy_extra)
const OLD_NOISY_RUNS: [(&str, &str, bool, &str); 10] = [
    ("alone", "scheduler = \"none\"", false, ""),
    ("+ heavy, no isolation", "scheduler = \"none\"", true, ""),
    (
        "+ heavy, fair depth 8",
        "scheduler = \"fair\"\ndispatch_depth = 8",
        true,
        "",
    ),
    (
        "+ heavy, fair depth 2",
        "scheduler = \"fair\"\ndispatch_depth = 2",
        true,
        "",
    ),
    (
        "+ heavy, fair depth 8, heavy limited 400MiB/s",
        "scheduler = \"fair\"\ndispatch_depth = 8",
        true,
        "limit = { read_bytes_per_sec = \"400MiB\" }",
    ),
    (
        "+ heavy, fair depth 32, budget 300 µs",
        "scheduler = \"fair\"\ndispatch_depth = 32\ndispatch_budget_us = 300",
        true,
        "",
    ),
    (
        "+ heavy, fair depth 1",
        "scheduler = \"fair\"\ndispatch_depth = 1",
        true,
        "",
    ),
    (
        "+ heavy, fair depth 2, heavy CPU share 0.25 (i-NVMe)",
        "scheduler = \"fair\"\ndispatch_depth = 2\ncpu_isolation = true",
        true,
        "cpu_share = 0.25",
    ),
    (
        "+ heavy, fair depth 2, split 32 KiB",
        "scheduler = \"fair\"\ndispatch_depth = 2\nsplit_bytes = \"32KiB\"",
        true,
        "",
    ),
    (
        "+ heavy, fair depth 4, split 32 KiB",
        "scheduler = \"fair\"\ndispatch_depth = 4\nsplit_bytes = \"32KiB\"",
        true,
        "",
    ),
];

fn old_cpu_settings(isolation: bool, k: u32, victim_cgroups: &[PathBuf]) -> String {
    let vc: Vec<String> = victim_cgroups
        .iter()
        .map(|p| format!("\"{}\"", p.display()))
        .collect();
    format!(
        "scheduler = \"none\"\ncpu_isolation = {isolation}\ncpu_k = {k}\nvictim_cgroups = [{}]",
        vc.join(", ")
    )
}

fn old_cpu_share(share: f64) -> String {
    format!("cpu_share = {share}")
}

fn old_datapath_target(
    scheduler: &str,
    send: &str,
    coalescing: CoalesceMode,
    backend: &str,
) -> Config {
    let toml = format!(
        r#"
[target]
listen = "127.0.0.1:0"
discovery_listen = ""
polling = "adaptive"
workers = 1
shutdown_drain_ms = 2000
send_scheduler = "{scheduler}"
[target.send]
# Containers did not flush when idle before the key existed.
flush_when_idle = false
{send}
[target.coalescing]
mode = "{}"
[[subsystem]]
nqn = "{DATAPATH_SUBNQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
{backend}
"#,
        coalescing.name()
    );
    Config::from_toml(&toml).unwrap()
}

// ---- the comparisons ----

#[test]
fn fairness_targets_are_unchanged() {
    let modes = fairness_modes();
    assert_eq!(modes.len(), OLD_FAIRNESS_MODES.len());
    for ((label, s), (old_label, old)) in modes.into_iter().zip(OLD_FAIRNESS_MODES) {
        assert_eq!(label, old_label);
        assert_eq!(
            fairness_target(s).unwrap(),
            old_tenant_target(
                &old_tenants(old, &[("a", 1, ""), ("b", 1, "")]),
                &old_ssd_backend(OLD_SCALED_SSD),
                1
            ),
            "{label}"
        );
    }
}

#[test]
fn weights_targets_are_unchanged() {
    for ((label, s, w), (old_label, old, old_w)) in weight_modes().into_iter().zip(OLD_WEIGHT_MODES)
    {
        assert_eq!((label, w), (old_label, old_w as usize));
        assert_eq!(
            weights_target(s, w).unwrap(),
            old_tenant_target(
                &old_tenants(old, &[("w1", 1, ""), ("w2", 2, ""), ("w4", 4, "")]),
                &old_ssd_backend(OLD_SCALED_SSD),
                old_w
            ),
            "{label}"
        );
    }
}

#[test]
fn limits_targets_are_unchanged() {
    let old = [OLD_LIMIT_IOPS_3000, OLD_LIMIT_READ_50MIB];
    for ((label, limit), old) in limits().into_iter().zip(old) {
        assert_eq!(label, old, "the table shows the limit as the file said it");
        assert_eq!(
            limits_target(limit).unwrap(),
            old_tenant_target(
                &old_tenants(OLD_LIMITS_SETTINGS, &[("a", 1, old), ("b", 1, "")]),
                &old_ssd_backend(OLD_SCALED_SSD),
                1
            ),
            "{label}"
        );
    }
}

#[test]
fn noisy_targets_are_unchanged() {
    let runs = noisy_runs();
    assert_eq!(runs.len(), OLD_NOISY_RUNS.len());
    for (r, (name, settings, with_heavy, heavy_extra)) in runs.iter().zip(OLD_NOISY_RUNS) {
        assert_eq!((r.name, r.with_heavy), (name, with_heavy));
        assert_eq!(
            noisy_target(r).unwrap(),
            old_tenant_target(
                &old_tenants(settings, &[("v", 1, ""), ("h", 1, heavy_extra)]),
                &old_ssd_backend(OLD_NOISY_SSD),
                1
            ),
            "{name}"
        );
    }
}

#[test]
fn cpu_targets_are_unchanged() {
    // Victim cgroups must exist (the config checks for their cpu.stat).
    let dir = std::env::temp_dir().join(format!("sluice-lab-configs-{}", std::process::id()));
    let victims: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("v{i}"))).collect();
    for v in &victims {
        std::fs::create_dir_all(v).unwrap();
        std::fs::write(v.join("cpu.stat"), "nr_periods 0\n").unwrap();
    }
    for iso in [false, true] {
        for k in [1, 2, 8, 32] {
            for vs in [&[][..], &victims[..]] {
                for share in [0.5, 1.0 / 3.0, 0.25, 1.0] {
                    assert_eq!(
                        cpu_target(iso, k, vs, share).unwrap(),
                        old_tenant_target(
                            &old_tenants(
                                &old_cpu_settings(iso, k, vs),
                                &[("i", 1, &old_cpu_share(share))]
                            ),
                            OLD_CPU_RAM,
                            1
                        ),
                        "isolation {iso}, k {k}, victims {vs:?}, share {share}"
                    );
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn datapath_targets_are_unchanged() {
    let backends = [(ram(), OLD_RAM), (ssd(), OLD_SSD)];
    for (kind, word) in [
        (SchedulerKind::Immediate, "immediate"),
        (SchedulerKind::Unified, "unified"),
        (SchedulerKind::Isolated, "isolated"),
    ] {
        for (b, old_b) in &backends {
            assert_eq!(
                fast_datapath_target(send(kind), b.clone()).unwrap(),
                old_datapath_target(word, "", CoalesceMode::Off, old_b),
                "{word} {old_b}"
            );
        }
    }
    for (b, old_b) in &backends {
        assert_eq!(
            fast_datapath_target(nprio(), b.clone()).unwrap(),
            old_datapath_target("isolated", OLD_NPRIO, CoalesceMode::Off, old_b),
            "Nprio {old_b}"
        );
    }
}

#[test]
fn ssd_texts_in_the_tables_are_unchanged() {
    assert_eq!(ssd_text(&scaled_ssd()), OLD_SCALED_SSD);
    assert_eq!(ssd_text(&noisy_ssd()), OLD_NOISY_SSD);
}

/// The scaled model (what the device cost of a job is computed with) has
/// the numbers the old hand-written copy had.
#[test]
fn scaled_model_is_the_old_copy() {
    assert_eq!(
        scaled_model(),
        SsdModel {
            read_iops_max: 20000,
            write_iops_max: 10000,
            read_bytes_per_sec_max: 400_000_000,
            write_bytes_per_sec_max: 200_000_000,
            base_read_latency_us: 80,
            base_write_latency_us: 20,
            parallelism: 8,
        }
    );
}

#[test]
fn cpu_settings_list_the_victims() {
    let s = cpu_settings(true, 4, &["/cg/v0".into(), "/cg/v1".into()]);
    assert!(s.cpu_isolation && s.cpu_accounting, "{s:?}");
    assert_eq!(s.throttle.k, Some(4));
    assert_eq!(
        s.victim_cgroups,
        vec![PathBuf::from("/cg/v0"), PathBuf::from("/cg/v1")]
    );
}
