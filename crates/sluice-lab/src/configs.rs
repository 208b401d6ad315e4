//! Every target configuration the experiments start, and nothing else.
//!
//! The experiments describe targets as TOML text parsed by
//! `sluice_config::Config::from_toml`: the two document templates
//! ([`tenant_target`], [`datapath_target`]) and the fragments they are filled
//! with (scheduler settings, tenant sections, limits, backends) all live
//! here, so that they can be replaced by typed builders in one place. The
//! experiment modules only pick fragments by name and print them in their
//! tables.

use anyhow::{Context, Result};
use sluice_config::Config;
use sluice_proto::coalesce::CoalesceMode;
use std::fmt::Write as _;
use std::path::PathBuf;

// ------------------------------------------------------------ tenant experiments

/// Subsystem of the tenant and CPU experiments.
pub const TENANT_SUBNQN: &str = "nqn.2026-11.io.sluice:exp";

/// Host NQN of tenant `n` (one per bench job).
pub fn host(n: &str) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:exp-{n}")
}

/// Emulated SSD scaled down so the device, not this 2-core machine's CPU,
/// is the bottleneck of the bandwidth experiments. Same numbers as
/// [`scaled_model`].
pub const SCALED_SSD: &str = "read_iops_max = 20000, write_iops_max = 10000, read_bytes_per_sec_max = 400000000, write_bytes_per_sec_max = 200000000, base_read_latency_us = 80, base_write_latency_us = 20, parallelism = 8";

/// [`SCALED_SSD`] as a model, for the device cost of a job.
pub fn scaled_model() -> sluice_backend::SsdModel {
    sluice_backend::SsdModel {
        read_iops_max: 20000,
        write_iops_max: 10000,
        read_bytes_per_sec_max: 400_000_000,
        write_bytes_per_sec_max: 200_000_000,
        base_read_latency_us: 80,
        base_write_latency_us: 20,
        parallelism: 8,
    }
}

/// The noisy-neighbour experiment's SSD (the default model).
pub const NOISY_SSD: &str = "read_iops_max = 100000, read_bytes_per_sec_max = 1000000000, base_read_latency_us = 80, parallelism = 8";

/// Namespace lines for a 1 GiB emulated SSD with `model` (inline table body).
pub fn ssd_backend(model: &str) -> String {
    format!("backend = \"emulated-ssd\"\nsize = \"1GiB\"\nssd = {{ {model} }}")
}

/// Namespace of the CPU experiments.
pub const CPU_RAM: &str = "backend = \"ram\"\nsize = \"256MiB\"";

/// `[tenants]` with `settings`, then one `[[tenant]]` per (name, weight,
/// extra lines), each with the host NQN [`host`]`(name)`.
pub fn tenants(settings: &str, tenants: &[(&str, u32, &str)]) -> String {
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

/// A target on an ephemeral loopback port with `workers` workers, the
/// `tenants` sections and one namespace of `backend` in [`TENANT_SUBNQN`].
pub fn tenant_target(tenants: &str, backend: &str, workers: u32) -> Result<Config> {
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
    Config::from_toml(&toml).with_context(|| format!("experiment config:\n{toml}"))
}

/// Fairness: scheduler settings compared on every W pair (label, settings).
pub const FAIRNESS_MODES: [(&str, &str); 6] = [
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

/// Fairness, weights 1:2:4: (label, settings, target workers).
pub const WEIGHT_MODES: [(&str, &str, u32); 3] = [
    ("off", "scheduler = \"none\"", 1),
    ("fair", "scheduler = \"fair\"", 1),
    ("fair, 2 workers", "scheduler = \"fair\"", 2),
];

/// Fairness, limits: settings, and tenant A's limit per workload.
pub const LIMITS_SETTINGS: &str = "scheduler = \"fair\"";
pub const LIMIT_IOPS_3000: &str = "limit = { iops = 3000 }";
pub const LIMIT_READ_50MIB: &str = "limit = { read_bytes_per_sec = \"50MiB\" }";

/// One noisy-neighbour run: label, `[tenants]` settings, whether the heavy
/// tenant runs, and the heavy tenant's extra lines.
#[derive(Debug, Clone, Copy)]
pub struct NoisyRun {
    pub name: &'static str,
    pub settings: &'static str,
    pub with_heavy: bool,
    pub heavy_extra: &'static str,
}

const fn noisy(
    name: &'static str,
    settings: &'static str,
    with_heavy: bool,
    heavy_extra: &'static str,
) -> NoisyRun {
    NoisyRun {
        name,
        settings,
        with_heavy,
        heavy_extra,
    }
}

/// The noisy-neighbour runs, in plot order (x position = index).
pub const NOISY_RUNS: [NoisyRun; 10] = [
    noisy("alone", "scheduler = \"none\"", false, ""),
    noisy("+ heavy, no isolation", "scheduler = \"none\"", true, ""),
    noisy(
        "+ heavy, fair depth 8",
        "scheduler = \"fair\"\ndispatch_depth = 8",
        true,
        "",
    ),
    noisy(
        "+ heavy, fair depth 2",
        "scheduler = \"fair\"\ndispatch_depth = 2",
        true,
        "",
    ),
    noisy(
        "+ heavy, fair depth 8, heavy limited 400MiB/s",
        "scheduler = \"fair\"\ndispatch_depth = 8",
        true,
        "limit = { read_bytes_per_sec = \"400MiB\" }",
    ),
    noisy(
        "+ heavy, fair depth 32, budget 300 µs",
        "scheduler = \"fair\"\ndispatch_depth = 32\ndispatch_budget_us = 300",
        true,
        "",
    ),
    noisy(
        "+ heavy, fair depth 1",
        "scheduler = \"fair\"\ndispatch_depth = 1",
        true,
        "",
    ),
    noisy(
        "+ heavy, fair depth 2, heavy CPU share 0.25 (i-NVMe)",
        "scheduler = \"fair\"\ndispatch_depth = 2\ncpu_isolation = true",
        true,
        "cpu_share = 0.25",
    ),
    noisy(
        "+ heavy, fair depth 2, split 32 KiB",
        "scheduler = \"fair\"\ndispatch_depth = 2\nsplit_bytes = \"32KiB\"",
        true,
        "",
    ),
    noisy(
        "+ heavy, fair depth 4, split 32 KiB",
        "scheduler = \"fair\"\ndispatch_depth = 4\nsplit_bytes = \"32KiB\"",
        true,
        "",
    ),
];

/// CPU experiments: `[tenants]` settings (no I/O scheduler; i-NVMe
/// isolation on or off, k, the victims' cgroups watched for adaptive T).
pub fn cpu_settings(isolation: bool, k: u32, victim_cgroups: &[PathBuf]) -> String {
    let vc: Vec<String> = victim_cgroups
        .iter()
        .map(|p| format!("\"{}\"", p.display()))
        .collect();
    format!(
        "scheduler = \"none\"\ncpu_isolation = {isolation}\ncpu_k = {k}\nvictim_cgroups = [{}]",
        vc.join(", ")
    )
}

/// CPU experiments: the interferer tenant's extra lines.
pub fn cpu_share(share: f64) -> String {
    format!("cpu_share = {share}")
}

// ------------------------------------------------------------ data path experiments

/// Subsystem of the isolated data path experiments.
pub const DATAPATH_SUBNQN: &str = "nqn.2026-11.io.sluice:iso";

pub const RAM: &str = "backend = \"ram\"\nsize = \"1GiB\"";
/// The emulated SSD with its default model (a modest datacenter drive).
pub const SSD: &str = "backend = \"emulated-ssd\"\nsize = \"1GiB\"";

/// PINoF_Nprio: weights 1/1/1 and both freights 64 KiB / 16 (PINoF §5).
pub const NPRIO: &str = "weight_r2t = 1\nweight_response = 1\nweight_data = 1\nlatency_size = \"64KiB\"\nlatency_degree = 16";

/// A one-worker target on an ephemeral loopback port with send scheduler
/// `scheduler`, `[target.send]` lines `send`, response coalescing
/// `coalescing` and one namespace of `backend` in [`DATAPATH_SUBNQN`].
pub fn datapath_target(
    scheduler: &str,
    send: &str,
    coalescing: CoalesceMode,
    backend: &str,
) -> Result<Config> {
    let toml = format!(
        r#"
[target]
listen = "127.0.0.1:0"
discovery_listen = ""
polling = "interrupt"
workers = 1
shutdown_drain_ms = 2000
send_scheduler = "{scheduler}"
[target.send]
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
    Config::from_toml(&toml).with_context(|| format!("experiment config:\n{toml}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every configuration an experiment can start parses and validates.
    #[test]
    fn every_config_is_valid() {
        let ssd = ssd_backend(SCALED_SSD);
        for (_, s) in FAIRNESS_MODES {
            tenant_target(&tenants(s, &[("a", 1, ""), ("b", 1, "")]), &ssd, 1).unwrap();
        }
        for (_, s, w) in WEIGHT_MODES {
            tenant_target(&tenants(s, &[("w1", 1, ""), ("w2", 2, "")]), &ssd, w).unwrap();
        }
        for l in [LIMIT_IOPS_3000, LIMIT_READ_50MIB] {
            tenant_target(
                &tenants(LIMITS_SETTINGS, &[("a", 1, l), ("b", 1, "")]),
                &ssd,
                1,
            )
            .unwrap();
        }
        for r in NOISY_RUNS {
            tenant_target(
                &tenants(r.settings, &[("v", 1, ""), ("h", 1, r.heavy_extra)]),
                &ssd_backend(NOISY_SSD),
                1,
            )
            .unwrap();
        }
        // Victim cgroups must exist (the config checks them): none here.
        for iso in [false, true] {
            let s = cpu_settings(iso, 8, &[]);
            tenant_target(&tenants(&s, &[("i", 1, &cpu_share(0.5))]), CPU_RAM, 1).unwrap();
        }
        for sched in ["immediate", "unified", "isolated"] {
            for backend in [RAM, SSD] {
                datapath_target(sched, "", CoalesceMode::Off, backend).unwrap();
            }
        }
        datapath_target("isolated", NPRIO, CoalesceMode::Off, RAM).unwrap();
    }

    #[test]
    fn cpu_settings_list_the_victims() {
        let s = cpu_settings(true, 4, &["/cg/v0".into(), "/cg/v1".into()]);
        assert!(s.contains("cpu_isolation = true\ncpu_k = 4\n"), "{s}");
        assert!(
            s.ends_with("victim_cgroups = [\"/cg/v0\", \"/cg/v1\"]"),
            "{s}"
        );
    }

    #[test]
    fn scaled_model_matches_its_toml() {
        let c = tenant_target("", &ssd_backend(SCALED_SSD), 1).unwrap();
        let text = format!("{c:?}");
        let m = scaled_model();
        for v in [m.read_iops_max, m.write_iops_max, m.read_bytes_per_sec_max] {
            assert!(text.contains(&v.to_string()), "{v} not in {text}");
        }
    }
}
