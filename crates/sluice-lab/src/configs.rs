//! Every target configuration the experiments start, and nothing else.
//!
//! The experiments' targets are built here with `sluice_config`'s builders
//! and validated (`Config::validated`, the checks a file goes through): one
//! function per experiment's target ([`fairness_target`], [`weights_target`],
//! [`limits_target`], [`noisy_target`], [`cpu_target`],
//! [`fast_datapath_target`])
//! and the pieces they share (SSD models, namespaces, tenants). The
//! experiment modules pick them by name and print their labels in their
//! tables. The tests check every one against the TOML it was written as
//! before the builders, so no experiment's target changed.

use anyhow::{Context, Result};
use sluice_backend::SsdModel;
use sluice_config::tenants::{
    CostKind, RateSpec, SchedulerMode, TenantSpec, TenantsConfig, TenantsSettings,
};
use sluice_config::{
    Config, NamespaceConfig, PollingPolicy, SsdConfig, SubsystemConfig, TargetSettings,
};
use sluice_proto::send::{SchedulerKind, SendConfig};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Every experiment's target listens on an ephemeral loopback port.
fn ephemeral() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// `workers` workers on an ephemeral loopback port, no discovery port,
/// interrupt polling, 2 s to drain at shutdown.
fn experiment_settings(workers: usize) -> TargetSettings {
    TargetSettings::default()
        .with_listen(ephemeral())
        .with_discovery_listen(None)
        .with_polling(PollingPolicy::Interrupt)
        .with_workers(workers)
        .with_shutdown_drain_ms(2000)
}

const GIB: u64 = 1 << 30;

// ------------------------------------------------------------ tenant experiments

/// Subsystem of the tenant and CPU experiments.
pub const TENANT_SUBNQN: &str = "nqn.2026-11.io.sluice:exp";

/// Host NQN of tenant `n` (one per bench job).
pub fn host(n: &str) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:exp-{n}")
}

/// Emulated SSD scaled down so the device, not this 2-core machine's CPU,
/// is the bottleneck of the bandwidth experiments.
pub fn scaled_ssd() -> SsdConfig {
    SsdConfig::default()
        .with_read_iops_max(20_000)
        .with_write_iops_max(10_000)
        .with_read_bytes_per_sec_max(400_000_000)
        .with_write_bytes_per_sec_max(200_000_000)
        .with_base_read_latency_us(80)
        .with_base_write_latency_us(20)
        .with_parallelism(8)
}

/// [`scaled_ssd`] as the model the target runs (absent keys would take
/// `SsdModel::default()`'s values), for the device cost of a job.
pub fn scaled_model() -> SsdModel {
    sluice_target::subsystem::ssd_model(&scaled_ssd())
}

/// The noisy-neighbour experiment's SSD (the default model's numbers).
pub fn noisy_ssd() -> SsdConfig {
    SsdConfig::default()
        .with_read_iops_max(100_000)
        .with_read_bytes_per_sec_max(1_000_000_000)
        .with_base_read_latency_us(80)
        .with_parallelism(8)
}

/// The keys `m` sets, as a config file's `ssd = { ... }` says them
/// (`read_iops_max = 20000, ...`), for the tables.
pub fn ssd_text(m: &SsdConfig) -> String {
    [
        ("read_iops_max", m.read_iops_max),
        ("write_iops_max", m.write_iops_max),
        ("read_bytes_per_sec_max", m.read_bytes_per_sec_max),
        ("write_bytes_per_sec_max", m.write_bytes_per_sec_max),
        ("base_read_latency_us", m.base_read_latency_us),
        ("base_write_latency_us", m.base_write_latency_us),
        ("parallelism", m.parallelism.map(u64::from)),
    ]
    .iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k} = {v}")))
    .collect::<Vec<_>>()
    .join(", ")
}

/// Namespace 1: a 1 GiB emulated SSD with `model`.
pub fn ssd_backend(model: SsdConfig) -> NamespaceConfig {
    NamespaceConfig::emulated_ssd(1, GIB, model)
}

/// Namespace of the CPU experiments: 256 MiB of RAM.
pub fn cpu_ram() -> NamespaceConfig {
    NamespaceConfig::ram(1, 256 << 20)
}

/// Tenant `name` with weight `weight` and the host NQN [`host`]`(name)`.
pub fn tenant(name: &str, weight: u32) -> TenantSpec {
    TenantSpec::new(name)
        .with_host(host(name))
        .with_weight(weight)
}

/// `[tenants]` `settings` and the `tenants`.
pub fn tenants(
    settings: TenantsSettings,
    tenants: impl IntoIterator<Item = TenantSpec>,
) -> TenantsConfig {
    tenants
        .into_iter()
        .fold(TenantsConfig::fair().with_settings(settings), |c, t| {
            c.with_tenant(t)
        })
}

/// A target on an ephemeral loopback port with `workers` workers,
/// `tenants` and namespace `backend` in [`TENANT_SUBNQN`] (any host).
pub fn tenant_target(
    tenants: TenantsConfig,
    backend: NamespaceConfig,
    workers: usize,
) -> Result<Config> {
    let c = Config::default()
        .with_target(experiment_settings(workers))
        .with_tenants(tenants)
        .with_subsystem(
            SubsystemConfig::new(TENANT_SUBNQN)
                .allow_any_host()
                .with_namespace(backend),
        );
    let shown = format!("{c:?}");
    c.validated()
        .with_context(|| format!("experiment config: {shown}"))
}

/// No I/O scheduler: I/O goes straight to the backend.
pub fn no_scheduler() -> TenantsSettings {
    TenantsSettings::default().with_scheduler(SchedulerMode::None)
}

/// The fair scheduler with its default settings.
pub fn fair() -> TenantsSettings {
    TenantsSettings::default().with_scheduler(SchedulerMode::Fair)
}

/// Fairness: scheduler settings compared on every W pair (label, settings).
pub fn fairness_modes() -> [(&'static str, TenantsSettings); 6] {
    [
        ("off", no_scheduler()),
        ("fair (device cost)", fair().with_cost(CostKind::Device)),
        ("fair (bytes cost)", fair().with_cost(CostKind::Bytes)),
        (
            "fair (bytes, depth 32, budget 400)",
            fair()
                .with_cost(CostKind::Bytes)
                .with_dispatch_depth(32)
                .with_dispatch_budget_us(400),
        ),
        (
            "fair (bytes, split 32 KiB)",
            fair().with_cost(CostKind::Bytes).with_split_bytes(32 << 10),
        ),
        (
            "fair (device, split 32 KiB)",
            fair()
                .with_cost(CostKind::Device)
                .with_split_bytes(32 << 10),
        ),
    ]
}

/// Fairness: tenants A and B with equal weights on the scaled SSD, one
/// worker, under `settings`.
pub fn fairness_target(settings: TenantsSettings) -> Result<Config> {
    tenant_target(
        tenants(settings, [tenant("a", 1), tenant("b", 1)]),
        ssd_backend(scaled_ssd()),
        1,
    )
}

/// Fairness, weights 1:2:4: (label, settings, target workers).
pub fn weight_modes() -> [(&'static str, TenantsSettings, usize); 3] {
    [
        ("off", no_scheduler(), 1),
        ("fair", fair(), 1),
        ("fair, 2 workers", fair(), 2),
    ]
}

/// Fairness, weights: tenants w1, w2, w4 (weights 1, 2, 4) on the scaled
/// SSD under `settings` with `workers` workers.
pub fn weights_target(settings: TenantsSettings, workers: usize) -> Result<Config> {
    tenant_target(
        tenants(
            settings,
            [tenant("w1", 1), tenant("w2", 2), tenant("w4", 4)],
        ),
        ssd_backend(scaled_ssd()),
        workers,
    )
}

/// Fairness, limits: tenant A's limit per workload, with the label the
/// table shows.
pub fn limits() -> [(&'static str, RateSpec); 2] {
    [
        (
            "limit = { iops = 3000 }",
            RateSpec::default().with_iops(3000),
        ),
        (
            "limit = { read_bytes_per_sec = \"50MiB\" }",
            RateSpec::default().with_read_bytes_per_sec(50 << 20),
        ),
    ]
}

/// Fairness, limits: the fair scheduler, tenant A limited to `limit`,
/// tenant B unlimited, on the scaled SSD.
pub fn limits_target(limit: RateSpec) -> Result<Config> {
    tenant_target(
        tenants(fair(), [tenant("a", 1).with_limit(limit), tenant("b", 1)]),
        ssd_backend(scaled_ssd()),
        1,
    )
}

/// One noisy-neighbour run: label, `[tenants]` settings, whether the heavy
/// tenant runs, and the heavy tenant `h`.
#[derive(Debug, Clone)]
pub struct NoisyRun {
    pub name: &'static str,
    pub settings: TenantsSettings,
    pub with_heavy: bool,
    pub heavy: TenantSpec,
}

fn noisy(name: &'static str, settings: TenantsSettings, with_heavy: bool) -> NoisyRun {
    NoisyRun {
        name,
        settings,
        with_heavy,
        heavy: tenant("h", 1),
    }
}

/// The noisy-neighbour runs, in plot order (x position = index).
pub fn noisy_runs() -> [NoisyRun; 10] {
    let depth = |n| fair().with_dispatch_depth(n);
    [
        noisy("alone", no_scheduler(), false),
        noisy("+ heavy, no isolation", no_scheduler(), true),
        noisy("+ heavy, fair depth 8", depth(8), true),
        noisy("+ heavy, fair depth 2", depth(2), true),
        NoisyRun {
            heavy: tenant("h", 1)
                .with_limit(RateSpec::default().with_read_bytes_per_sec(400 << 20)),
            ..noisy(
                "+ heavy, fair depth 8, heavy limited 400MiB/s",
                depth(8),
                true,
            )
        },
        noisy(
            "+ heavy, fair depth 32, budget 300 µs",
            depth(32).with_dispatch_budget_us(300),
            true,
        ),
        noisy("+ heavy, fair depth 1", depth(1), true),
        NoisyRun {
            heavy: tenant("h", 1).with_cpu_share(0.25),
            ..noisy(
                "+ heavy, fair depth 2, heavy CPU share 0.25 (i-NVMe)",
                depth(2).with_cpu_isolation(true),
                true,
            )
        },
        noisy(
            "+ heavy, fair depth 2, split 32 KiB",
            depth(2).with_split_bytes(32 << 10),
            true,
        ),
        noisy(
            "+ heavy, fair depth 4, split 32 KiB",
            depth(4).with_split_bytes(32 << 10),
            true,
        ),
    ]
}

/// A noisy-neighbour run's target: victim `v` and the heavy tenant on the
/// [`noisy_ssd`], one worker.
pub fn noisy_target(run: &NoisyRun) -> Result<Config> {
    tenant_target(
        tenants(run.settings.clone(), [tenant("v", 1), run.heavy.clone()]),
        ssd_backend(noisy_ssd()),
        1,
    )
}

/// CPU experiments: `[tenants]` settings (no I/O scheduler; i-NVMe
/// isolation on or off, k, the victims' cgroups watched for adaptive T).
pub fn cpu_settings(isolation: bool, k: u32, victim_cgroups: &[PathBuf]) -> TenantsSettings {
    let mut s = no_scheduler()
        .with_cpu_isolation(isolation)
        .with_throttle(sluice_config::tenants::ThrottleConfig::default().with_k(k));
    for p in victim_cgroups {
        s = s.with_victim_cgroup(p);
    }
    s
}

/// CPU experiments: the interferer tenant `i` with CPU share `share` under
/// [`cpu_settings`], on [`cpu_ram`], one worker.
pub fn cpu_target(
    isolation: bool,
    k: u32,
    victim_cgroups: &[PathBuf],
    share: f64,
) -> Result<Config> {
    tenant_target(
        tenants(
            cpu_settings(isolation, k, victim_cgroups),
            [tenant("i", 1).with_cpu_share(share)],
        ),
        cpu_ram(),
        1,
    )
}

// ------------------------------------------------------------ data path experiments

/// Subsystem of the isolated data path experiments.
pub const DATAPATH_SUBNQN: &str = "nqn.2026-11.io.sluice:iso";

/// Namespace 1: 1 GiB of RAM.
pub fn ram() -> NamespaceConfig {
    NamespaceConfig::ram(1, GIB)
}

/// Namespace 1: a 1 GiB emulated SSD with its default model (a modest
/// datacenter drive).
pub fn ssd() -> NamespaceConfig {
    ssd_backend(SsdConfig::default())
}

/// The send path with scheduler `scheduler` and every other setting at
/// its default (no response coalescing).
pub fn send(scheduler: SchedulerKind) -> SendConfig {
    SendConfig {
        scheduler,
        // The papers' containers: they flush on their triggers only.
        flush_when_idle: false,
        ..SendConfig::default()
    }
}

/// PINoF_Nprio: the isolated scheduler with weights 1/1/1 and both freights
/// 64 KiB / 16 (PINoF §5).
pub fn nprio() -> SendConfig {
    let mut s = send(SchedulerKind::Isolated);
    s.weights.r2t = 1;
    s.weights.response = 1;
    s.weights.data = 1;
    s.latency.size_bytes = 64 << 10;
    s.latency.degree = 16;
    s
}

/// A one-worker target on an ephemeral loopback port with send path
/// `send` and namespace `backend` in [`DATAPATH_SUBNQN`] (any host),
/// polling adaptively (default spin): the target of the fast path that
/// `sluice bench`'s direct engine drives (docs/benchmarks.md).
pub fn fast_datapath_target(send: SendConfig, backend: NamespaceConfig) -> Result<Config> {
    let polling = PollingPolicy::Adaptive {
        spin_us: sluice_runtime::polling::ADAPTIVE_SPIN_US_DEFAULT,
    };
    let c = Config::default()
        .with_target(experiment_settings(1).with_send(send).with_polling(polling))
        .with_subsystem(
            SubsystemConfig::new(DATAPATH_SUBNQN)
                .allow_any_host()
                .with_namespace(backend),
        );
    let shown = format!("{c:?}");
    c.validated()
        .with_context(|| format!("experiment config: {shown}"))
}

#[cfg(test)]
mod tests;
