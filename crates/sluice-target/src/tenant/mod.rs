//! Tenants: per-tenant QoS and CPU isolation.
//!
//! A tenant is a set of host NQNs (config `[[tenant]]`); hosts on no tenant
//! belong to the implicit `default` tenant. Per tenant: a weight, optional
//! reservations and limits (IOPS and bytes/s, read/write/total) and a CPU
//! share of the worker pool. All of it is target-wide, whatever worker
//! thread a tenant's connections land on.
//!
//! * [`rate`]: token buckets with injected time.
//! * [`fair`]: the work-conserving weighted fair scheduler (SFQ over a cost
//!   model) with reservations and limits.
//! * [`shared`]: one scheduler per backend shared by all workers (decisions
//!   global, requests local) and one CPU throttle per tenant for the pool.
//! * [`cpu`]: i-NVMe CPU accounting and k-split throttling; cgroup v1 `cpu`.
//! * [`worker`]: the glue a worker thread uses.
//! * [`admin`]: the admin HTTP endpoint (`GET /metrics`, tenant updates).
//!
//! The running table is an `Arc` swapped under a lock; workers notice a new
//! generation once per loop iteration. Updates are validated as a whole
//! before the swap, so a rejected update leaves the running table intact.

pub mod admin;
pub mod cpu;
pub mod fair;
pub mod rate;
pub mod shared;
pub mod worker;

use crate::config::{validate_nqn, ConfigError};
use crate::subsystem::Registry;
use fair::CostModel;
use rate::{RateSpec, BYTES_PER_SEC_MIN};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Dense tenant index, stable for the life of the target.
pub type TenantId = u32;
/// Most tenants (including `default`) over the life of a target.
pub const TENANTS_MAX: usize = 256;
/// Name of the implicit tenant of hosts listed nowhere.
pub const DEFAULT_TENANT: &str = "default";
pub const WEIGHT_MAX: u32 = 10_000;

fn err(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        reason: reason.into(),
    }
}

/// One tenant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantSpec {
    pub name: String,
    pub hosts: Vec<String>,
    pub weight: u32,
    pub reservation: RateSpec,
    pub limit: RateSpec,
    /// Fraction of the worker pool's CPU (`workers` CPUs; None: unlimited).
    pub cpu_share: Option<f64>,
    /// The tenant's own cgroup v1 `cpu` directory: the worker CPU charged
    /// to the tenant is taken out of its CFS quota, period by period
    /// (i-NVMe Algorithms 1-2, [`cpu::QuotaAgent`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge_cgroup: Option<PathBuf>,
}

impl TenantSpec {
    fn implicit_default() -> Self {
        TenantSpec {
            name: DEFAULT_TENANT.into(),
            hosts: vec![],
            weight: 1,
            reservation: RateSpec::default(),
            limit: RateSpec::default(),
            cpu_share: None,
            charge_cgroup: None,
        }
    }
}

/// Whether I/O goes through the fair scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerMode {
    /// Stock behaviour: submit to the backend at once (no limits).
    None,
    Fair,
}

/// Cost model choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostKind {
    /// Device time from the emulated SSD's model (bytes for other backends).
    Device,
    Bytes,
}

/// Bounds of `[tenants] split_bytes` (pieces stay block- and
/// O_DIRECT-aligned: a multiple of 4 KiB).
pub const SPLIT_BYTES_MIN: u64 = 4096;
pub const SPLIT_BYTES_MAX: u64 = 16 << 20;

/// Global tenant settings (`[tenants]`).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantsSettings {
    pub scheduler: SchedulerMode,
    pub cost: CostKind,
    /// Most I/Os outstanding at one backend (all workers together).
    pub dispatch_depth: u32,
    /// Optional cap on the summed cost of outstanding I/Os per backend
    /// (all workers): µs of device time (device cost) or thousands of bytes (bytes cost).
    pub dispatch_budget_us: Option<u64>,
    /// Reads and writes larger than this go to the backend as separately
    /// scheduled pieces of at most this size (None: whole), so a large
    /// transfer cannot hold the device for long ahead of a small one.
    pub split_bytes: Option<u64>,
    pub admin_listen: Option<SocketAddr>,
    /// File holding the admin endpoint's bearer token (none: no auth).
    pub admin_token_file: Option<PathBuf>,
    /// CPU accounting (thread CPU per loop batch) on/off.
    pub cpu_accounting: bool,
    /// i-NVMe throttling on/off (needs accounting).
    pub cpu_isolation: bool,
    pub throttle: cpu::ThrottleParams,
    pub victim_cgroups: Vec<PathBuf>,
}

impl Default for TenantsSettings {
    fn default() -> Self {
        TenantsSettings {
            scheduler: SchedulerMode::Fair,
            cost: CostKind::Device,
            dispatch_depth: 8,
            dispatch_budget_us: None,
            split_bytes: None,
            admin_listen: None,
            admin_token_file: None,
            cpu_accounting: true,
            cpu_isolation: false,
            throttle: cpu::ThrottleParams::default(),
            victim_cgroups: vec![],
        }
    }
}

/// The validated `[tenants]` + `[[tenant]]` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantsConfig {
    pub settings: TenantsSettings,
    pub tenants: Vec<TenantSpec>,
    /// Tenant of unlisted hosts.
    pub default_tenant: String,
}

impl Default for TenantsConfig {
    /// No `[[tenant]]`: everything is the `default` tenant and I/O goes
    /// straight to the backend (stock behaviour).
    fn default() -> Self {
        TenantsConfig {
            settings: TenantsSettings {
                scheduler: SchedulerMode::None,
                ..Default::default()
            },
            tenants: vec![],
            default_tenant: DEFAULT_TENANT.into(),
        }
    }
}

// ---- raw shapes (TOML and JSON) ----

/// A count or a size with units ("100MiB").
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawNum {
    Int(i64),
    Float(f64),
    Str(String),
}

impl RawNum {
    fn value(&self, key: &str) -> Result<i64, ConfigError> {
        match self {
            RawNum::Int(i) => Ok(*i),
            RawNum::Float(f) if f.fract() == 0.0 && f.abs() < 9e15 => Ok(*f as i64),
            RawNum::Float(f) => Err(err(key, format!("{f} is not a whole number"))),
            RawNum::Str(s) => crate::config::parse_size(s)
                .map(|v| v as i64)
                .map_err(|r| err(key, r)),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRate {
    iops: Option<RawNum>,
    read_iops: Option<RawNum>,
    write_iops: Option<RawNum>,
    bytes_per_sec: Option<RawNum>,
    read_bytes_per_sec: Option<RawNum>,
    write_bytes_per_sec: Option<RawNum>,
}

/// `[[tenant]]` (TOML) or a tenant update (JSON; fields absent are kept).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    pub name: Option<String>,
    pub hosts: Option<Vec<String>>,
    pub weight: Option<RawNum>,
    pub reservation: Option<RawRate>,
    pub limit: Option<RawRate>,
    pub cpu_share: Option<f64>,
    pub charge_cgroup: Option<PathBuf>,
}

/// `[tenants]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenants {
    scheduler: Option<String>,
    cost: Option<String>,
    dispatch_depth: Option<i64>,
    dispatch_budget_us: Option<i64>,
    split_bytes: Option<RawNum>,
    admin_listen: Option<String>,
    admin_token_file: Option<PathBuf>,
    default: Option<String>,
    cpu_accounting: Option<bool>,
    cpu_isolation: Option<bool>,
    cpu_period_ms: Option<i64>,
    cpu_k: Option<i64>,
    cpu_alpha_us: Option<i64>,
    cpu_min_t_fraction: Option<f64>,
    victim_cgroups: Option<Vec<PathBuf>>,
}

fn rate(key: &str, r: &RawRate, mdts: u64) -> Result<RateSpec, ConfigError> {
    let ops = |k: &str, v: &Option<RawNum>| -> Result<Option<u64>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let k = format!("{key}.{k}");
        let n = v.value(&k)?;
        if n < 1 {
            return Err(err(k, format!("{n} is below one I/O per second")));
        }
        Ok(Some(n as u64))
    };
    let bytes = |k: &str, v: &Option<RawNum>| -> Result<Option<u64>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let k = format!("{key}.{k}");
        let n = v.value(&k)?;
        if n < BYTES_PER_SEC_MIN as i64 {
            return Err(err(
                k,
                format!("{n} bytes/s is below one I/O ({BYTES_PER_SEC_MIN} bytes) per second"),
            ));
        }
        let _ = mdts;
        Ok(Some(n as u64))
    };
    Ok(RateSpec {
        iops: ops("iops", &r.iops)?,
        read_iops: ops("read_iops", &r.read_iops)?,
        write_iops: ops("write_iops", &r.write_iops)?,
        bytes_per_sec: bytes("bytes_per_sec", &r.bytes_per_sec)?,
        read_bytes_per_sec: bytes("read_bytes_per_sec", &r.read_bytes_per_sec)?,
        write_bytes_per_sec: bytes("write_bytes_per_sec", &r.write_bytes_per_sec)?,
    })
}

fn pairs(r: &RateSpec) -> [(&'static str, Option<u64>); 6] {
    [
        ("iops", r.iops),
        ("read_iops", r.read_iops),
        ("write_iops", r.write_iops),
        ("bytes_per_sec", r.bytes_per_sec),
        ("read_bytes_per_sec", r.read_bytes_per_sec),
        ("write_bytes_per_sec", r.write_bytes_per_sec),
    ]
}

fn valid_name(key: &str, n: &str) -> Result<(), ConfigError> {
    if n.is_empty()
        || n.len() > 64
        || !n
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(err(
            key,
            format!("`{n}` must be 1 to 64 characters of A-Z a-z 0-9 _ - ."),
        ));
    }
    Ok(())
}

/// Validates one tenant; fields absent in `raw` come from `base`.
pub fn validate_tenant(
    key: &str,
    raw: &RawTenant,
    base: Option<&TenantSpec>,
    mdts: u64,
) -> Result<TenantSpec, ConfigError> {
    let name = match (&raw.name, base) {
        (Some(n), _) => n.clone(),
        (None, Some(b)) => b.name.clone(),
        (None, None) => return Err(err(format!("{key}.name"), "is required")),
    };
    valid_name(&format!("{key}.name"), &name)?;
    let hosts = match &raw.hosts {
        Some(h) => h.clone(),
        None => base.map(|b| b.hosts.clone()).unwrap_or_default(),
    };
    for (j, h) in hosts.iter().enumerate() {
        validate_nqn(&format!("{key}.hosts[{j}]"), h)?;
    }
    let weight = match &raw.weight {
        Some(w) => {
            let k = format!("{key}.weight");
            let v = w.value(&k)?;
            if v < 1 || v > i64::from(WEIGHT_MAX) {
                return Err(err(k, format!("{v} must be from 1 to {WEIGHT_MAX}")));
            }
            v as u32
        }
        None => base.map_or(1, |b| b.weight),
    };
    let reservation = match &raw.reservation {
        Some(r) => rate(&format!("{key}.reservation"), r, mdts)?,
        None => base.map(|b| b.reservation).unwrap_or_default(),
    };
    let limit = match &raw.limit {
        Some(r) => rate(&format!("{key}.limit"), r, mdts)?,
        None => base.map(|b| b.limit).unwrap_or_default(),
    };
    for ((k, r), (_, l)) in pairs(&reservation).into_iter().zip(pairs(&limit)) {
        if let (Some(r), Some(l)) = (r, l) {
            if r > l {
                return Err(err(
                    format!("{key}.reservation.{k}"),
                    format!("{r} is above the limit {l}"),
                ));
            }
        }
    }
    let cpu_share = match raw.cpu_share {
        Some(s) => {
            if !(s > 0.0 && s <= 1.0) {
                return Err(err(
                    format!("{key}.cpu_share"),
                    format!("{s} must be a fraction of a worker thread in (0, 1]"),
                ));
            }
            Some(s)
        }
        None => base.and_then(|b| b.cpu_share),
    };
    let charge_cgroup = match &raw.charge_cgroup {
        Some(p) => {
            cgroup_base_quota(p).map_err(|r| err(format!("{key}.charge_cgroup"), r))?;
            Some(p.clone())
        }
        None => base.and_then(|b| b.charge_cgroup.clone()),
    };
    Ok(TenantSpec {
        name,
        hosts,
        weight,
        reservation,
        limit,
        cpu_share,
        charge_cgroup,
    })
}

/// A tenant's `charge_cgroup`, with the CFS quota and period it has now
/// (the base the charged CPU is taken out of). Errors say what is wrong.
pub fn cgroup_base_quota(
    p: &std::path::Path,
) -> Result<(cpu::CpuCgroup, Duration, Duration), String> {
    let cg = cpu::CpuCgroup::open(p).map_err(|e| e.to_string())?;
    match cg.quota().map_err(|e| e.to_string())? {
        (Some(quota), period) if !period.is_zero() => Ok((cg, quota, period)),
        _ => Err(format!(
            "`{}` has no CPU quota (cpu.cfs_quota_us = -1); set the tenant's quota first",
            p.display()
        )),
    }
}

/// Cross-tenant checks: unique names, a host in one tenant only, the
/// default tenant exists.
fn validate_set(tenants: &[TenantSpec], default: &str, key: &str) -> Result<(), ConfigError> {
    let mut names = HashMap::new();
    let mut hosts: HashMap<&str, &str> = HashMap::new();
    if tenants.len() >= TENANTS_MAX {
        return Err(err(key, format!("more than {} tenants", TENANTS_MAX - 1)));
    }
    for (i, t) in tenants.iter().enumerate() {
        if names.insert(t.name.as_str(), i).is_some() {
            return Err(err(
                format!("{key}[{i}].name"),
                format!("`{}` is defined twice", t.name),
            ));
        }
        for (j, h) in t.hosts.iter().enumerate() {
            if let Some(other) = hosts.insert(h.as_str(), t.name.as_str()) {
                return Err(err(
                    format!("{key}[{i}].hosts[{j}]"),
                    format!("`{h}` already belongs to tenant `{other}`"),
                ));
            }
        }
    }
    if default != DEFAULT_TENANT && !names.contains_key(default) {
        return Err(err(
            "tenants.default",
            format!("unknown tenant `{default}` (define it with [[tenant]])"),
        ));
    }
    Ok(())
}

impl TenantsConfig {
    /// From the raw `[tenants]` table and `[[tenant]]` array.
    pub fn from_raw(
        settings: Option<RawTenants>,
        tenants: Vec<RawTenant>,
        mdts: u64,
    ) -> Result<TenantsConfig, ConfigError> {
        let explicit = settings.is_some() || !tenants.is_empty();
        let r = settings.unwrap_or_default();
        let mut s = TenantsSettings::default();
        if !explicit {
            return Ok(TenantsConfig::default());
        }
        if let Some(v) = &r.scheduler {
            s.scheduler = match v.as_str() {
                "fair" => SchedulerMode::Fair,
                "none" | "off" => SchedulerMode::None,
                o => {
                    return Err(err(
                        "tenants.scheduler",
                        format!("`{o}` is not one of fair, none"),
                    ))
                }
            };
        }
        if let Some(v) = &r.cost {
            s.cost = match v.as_str() {
                "device" => CostKind::Device,
                "bytes" => CostKind::Bytes,
                o => {
                    return Err(err(
                        "tenants.cost",
                        format!("`{o}` is not one of device, bytes"),
                    ))
                }
            };
        }
        if let Some(v) = r.dispatch_depth {
            if !(1..=1024).contains(&v) {
                return Err(err(
                    "tenants.dispatch_depth",
                    format!("{v} is outside 1..=1024"),
                ));
            }
            s.dispatch_depth = v as u32;
        }
        if let Some(v) = r.dispatch_budget_us {
            if !(1..=10_000_000).contains(&v) {
                return Err(err(
                    "tenants.dispatch_budget_us",
                    format!("{v} is outside 1..=10000000"),
                ));
            }
            s.dispatch_budget_us = Some(v as u64);
        }
        if let Some(v) = &r.split_bytes {
            let key = "tenants.split_bytes";
            let v = v.value(key)?;
            if !(SPLIT_BYTES_MIN as i64..=SPLIT_BYTES_MAX as i64).contains(&v)
                || v % SPLIT_BYTES_MIN as i64 != 0
            {
                return Err(err(
                    key,
                    format!(
                        "{v} must be a multiple of {SPLIT_BYTES_MIN} from {SPLIT_BYTES_MIN} to {SPLIT_BYTES_MAX}"
                    ),
                ));
            }
            s.split_bytes = Some(v as u64);
        }
        if let Some(a) = &r.admin_listen {
            s.admin_listen = Some(a.parse().map_err(|_| {
                err(
                    "tenants.admin_listen",
                    format!("`{a}` is not an address:port"),
                )
            })?);
        }
        s.admin_token_file = r.admin_token_file.clone();
        if let Some(b) = r.cpu_accounting {
            s.cpu_accounting = b;
        }
        if let Some(b) = r.cpu_isolation {
            s.cpu_isolation = b;
            if b && r.cpu_accounting == Some(false) {
                return Err(err("tenants.cpu_isolation", "needs cpu_accounting = true"));
            }
            s.cpu_accounting |= b;
        }
        if let Some(v) = r.cpu_period_ms {
            if !(1..=10_000).contains(&v) {
                return Err(err(
                    "tenants.cpu_period_ms",
                    format!("{v} is outside 1..=10000"),
                ));
            }
            s.throttle.period = Duration::from_millis(v as u64);
        }
        if let Some(v) = r.cpu_k {
            if !(1..=64).contains(&v) {
                return Err(err("tenants.cpu_k", format!("{v} is outside 1..=64")));
            }
            s.throttle.k = v as u32;
        }
        if let Some(v) = r.cpu_alpha_us {
            if !(0..=1_000_000).contains(&v) {
                return Err(err(
                    "tenants.cpu_alpha_us",
                    format!("{v} is outside 0..=1000000"),
                ));
            }
            s.throttle.alpha = Duration::from_micros(v as u64);
        }
        if let Some(v) = r.cpu_min_t_fraction {
            if !(v > 0.0 && v <= 1.0) {
                return Err(err(
                    "tenants.cpu_min_t_fraction",
                    format!("{v} must be in (0, 1]"),
                ));
            }
            s.throttle.min_t_fraction = v;
        }
        if let Some(v) = &r.victim_cgroups {
            for (i, p) in v.iter().enumerate() {
                if !p.join("cpu.stat").exists() {
                    return Err(err(
                        format!("tenants.victim_cgroups[{i}]"),
                        format!(
                            "`{}` is not a cgroup v1 cpu cgroup (no cpu.stat)",
                            p.display()
                        ),
                    ));
                }
            }
            s.victim_cgroups = v.clone();
        }
        let mut specs = Vec::new();
        for (i, t) in tenants.iter().enumerate() {
            specs.push(validate_tenant(&format!("tenant[{i}]"), t, None, mdts)?);
        }
        let default_tenant = r.default.clone().unwrap_or_else(|| DEFAULT_TENANT.into());
        validate_set(&specs, &default_tenant, "tenant")?;
        Ok(TenantsConfig {
            settings: s,
            tenants: specs,
            default_tenant,
        })
    }
}

// ---- the running table ----

/// Tenants by id, host and name (one immutable version).
#[derive(Debug, Clone)]
pub struct TenantTable {
    pub generation: u64,
    /// Index = TenantId.
    pub tenants: Vec<Option<TenantSpec>>,
    by_host: HashMap<String, TenantId>,
    by_name: BTreeMap<String, TenantId>,
    default_id: TenantId,
}

impl TenantTable {
    fn build(tenants: Vec<Option<TenantSpec>>, default: &str, generation: u64) -> Self {
        let mut by_host = HashMap::new();
        let mut by_name = BTreeMap::new();
        for (i, t) in tenants.iter().enumerate() {
            if let Some(t) = t {
                by_name.insert(t.name.clone(), i as TenantId);
                for h in &t.hosts {
                    by_host.insert(h.clone(), i as TenantId);
                }
            }
        }
        let default_id = by_name.get(default).copied().unwrap_or(0);
        TenantTable {
            generation,
            tenants,
            by_host,
            by_name,
            default_id,
        }
    }

    /// The tenant of a host NQN (None before Connect: the default tenant).
    pub fn tenant_of(&self, hostnqn: Option<&str>) -> TenantId {
        hostnqn
            .and_then(|h| self.by_host.get(h).copied())
            .unwrap_or(self.default_id)
    }

    pub fn id(&self, name: &str) -> Option<TenantId> {
        self.by_name.get(name).copied()
    }

    pub fn spec(&self, id: TenantId) -> Option<&TenantSpec> {
        self.tenants.get(id as usize).and_then(|t| t.as_ref())
    }

    pub fn iter(&self) -> impl Iterator<Item = (TenantId, &TenantSpec)> {
        self.tenants
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.as_ref().map(|t| (i as TenantId, t)))
    }
}

/// Latency histogram buckets: upper bounds 2^i µs, i = 0..LAT_BUCKETS.
pub const LAT_BUCKETS: usize = 26;

/// Live counters of one tenant (all workers add to them).
#[derive(Debug, Default)]
pub struct TenantStats {
    pub read_ios: AtomicU64,
    pub write_ios: AtomicU64,
    pub other_ios: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Latency from arrival at the scheduler to backend completion.
    pub lat_buckets: [AtomicU64; LAT_BUCKETS],
    pub lat_sum_ns: AtomicU64,
    pub sched_wait_ns: AtomicU64,
    pub cpu_ns: AtomicU64,
    pub throttle_events: AtomicU64,
    pub throttle_ns: AtomicU64,
    /// Queued in the scheduler plus outstanding at the backend.
    pub queue_depth: AtomicI64,
}

impl TenantStats {
    pub fn record_latency(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let b = (64 - us.leading_zeros() as usize).min(LAT_BUCKETS - 1);
        self.lat_buckets[b].fetch_add(1, Relaxed);
        self.lat_sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }
}

/// Tenant state shared by the workers and the admin endpoint.
pub struct TenantRuntime {
    pub settings: TenantsSettings,
    table: RwLock<Arc<TenantTable>>,
    default_name: String,
    stats: Vec<TenantStats>,
    /// Worker CPU in batches with no tenant work.
    pub unattributed_cpu_ns: AtomicU64,
    /// Cost model per namespace index.
    pub cost_models: Vec<CostModel>,
    /// The scheduler of each namespace (by index), shared by all workers.
    pub arbiters: Vec<shared::BackendArbiter>,
    /// The CPU throttles of the worker pool.
    pub cpu: shared::CpuGovernor,
    /// Number of worker threads.
    pub workers: usize,
    /// Wakes worker `i` (set by the server once the workers exist).
    waker: std::sync::OnceLock<WakeWorker>,
    mdts: u64,
}

/// Wakes one worker thread by index.
pub type WakeWorker = Box<dyn Fn(usize) + Send + Sync>;

impl std::fmt::Debug for TenantRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantRuntime")
            .field("settings", &self.settings)
            .field("generation", &self.generation())
            .field("workers", &self.workers)
            .field("arbiters", &self.arbiters.len())
            .field("cpu", &self.cpu)
            .finish()
    }
}

/// A rejected update; the running table is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error("unknown tenant `{0}`")]
    Unknown(String),
    #[error("{0}")]
    Json(String),
}

impl TenantRuntime {
    pub fn new(cfg: &crate::Config, reg: &Registry) -> Self {
        let tc = &cfg.tenants;
        let mut tenants: Vec<Option<TenantSpec>> = Vec::new();
        if !tc.tenants.iter().any(|t| t.name == DEFAULT_TENANT) {
            tenants.push(Some(TenantSpec::implicit_default()));
        }
        tenants.extend(tc.tenants.iter().cloned().map(Some));
        let table = TenantTable::build(tenants, &tc.default_tenant, 1);
        let mut cost_models = vec![CostModel::bytes(); reg.namespaces.len()];
        for s in &cfg.subsystems {
            for n in &s.namespaces {
                if let crate::config::BackendConfig::EmulatedSsd(m) = &n.backend {
                    let idx = reg
                        .subsystem(&s.nqn)
                        .and_then(|sub| sub.namespaces.get(&n.nsid).map(|ns| ns.index));
                    if let (Some(i), CostKind::Device) = (idx, tc.settings.cost) {
                        if let Some(slot) = cost_models.get_mut(i) {
                            *slot = CostModel::device(&sluice_backend::SsdModel {
                                read_iops_max: m.read_iops_max,
                                write_iops_max: m.write_iops_max,
                                read_bytes_per_sec_max: m.read_bytes_per_sec_max,
                                write_bytes_per_sec_max: m.write_bytes_per_sec_max,
                                base_read_latency_us: m.base_read_latency_us,
                                base_write_latency_us: m.base_write_latency_us,
                                parallelism: m.parallelism,
                            });
                        }
                    }
                }
            }
        }
        let workers = cfg.target.workers.clamp(1, shared::WORKERS_MAX);
        let st = &tc.settings;
        let arbiters = cost_models
            .iter()
            .map(|&c| {
                shared::BackendArbiter::new(
                    c,
                    st.dispatch_depth,
                    st.dispatch_budget_us.map(|us| us * 1000),
                    workers,
                )
            })
            .collect();
        let victims = if st.cpu_isolation && !st.victim_cgroups.is_empty() {
            match cpu::VictimWatch::new(&st.victim_cgroups) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(error = %e, "victim cgroups unreadable; adaptive T disabled");
                    None
                }
            }
        } else {
            None
        };
        let rt = TenantRuntime {
            settings: tc.settings.clone(),
            table: RwLock::new(Arc::new(table)),
            default_name: tc.default_tenant.clone(),
            stats: (0..TENANTS_MAX).map(|_| TenantStats::default()).collect(),
            unattributed_cpu_ns: AtomicU64::new(0),
            cost_models,
            arbiters,
            cpu: shared::CpuGovernor::new(st.throttle, workers, st.cpu_isolation, victims),
            workers,
            waker: std::sync::OnceLock::new(),
            mdts: u64::from(cfg.target.mdts_bytes),
        };
        rt.apply_table(&rt.table(), Instant::now());
        rt
    }

    /// Pushes a table's weights, rates and CPU shares into the shared
    /// schedulers and throttles (buckets keep their fill when unchanged).
    fn apply_table(&self, table: &TenantTable, now: Instant) {
        for (id, spec) in table.iter() {
            let params = fair::TenantParams {
                weight: spec.weight,
                reservation: spec.reservation,
                limit: spec.limit,
            };
            for a in &self.arbiters {
                a.set_params(id, params.clone(), now);
            }
            self.cpu.set_share(id, spec.cpu_share);
        }
    }

    /// Installs the function that wakes a worker (once).
    pub fn set_waker(&self, wake: WakeWorker) {
        if self.waker.set(wake).is_err() {
            tracing::warn!("worker waker installed twice; keeping the first");
        }
    }

    /// Wakes worker `i` (a grant is waiting for it).
    pub fn wake(&self, i: usize) {
        if let Some(w) = self.waker.get() {
            w(i);
        }
    }

    /// The current table.
    pub fn table(&self) -> Arc<TenantTable> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn generation(&self) -> u64 {
        self.table().generation
    }

    pub fn stats(&self, id: TenantId) -> &TenantStats {
        &self.stats[(id as usize).min(TENANTS_MAX - 1)]
    }

    /// Creates or updates tenant `name` from a JSON object (fields absent
    /// are kept). Validated against the whole table before it is swapped in.
    pub fn update_json(&self, name: &str, json: &str) -> Result<TenantSpec, UpdateError> {
        let raw: RawTenant = serde_json::from_str(json)
            .map_err(|e| UpdateError::Json(format!("bad tenant JSON: {e}")))?;
        if let Some(n) = &raw.name {
            if n != name {
                return Err(ConfigError {
                    key: format!("tenant[{name}].name"),
                    reason: format!(
                        "`{n}` differs from the tenant in the path; renaming is not supported"
                    ),
                }
                .into());
            }
        }
        self.update(name, &raw, true)
    }

    /// Applies an update; `create` allows a new tenant.
    pub fn update(
        &self,
        name: &str,
        raw: &RawTenant,
        create: bool,
    ) -> Result<TenantSpec, UpdateError> {
        let mut guard = self.table.write().unwrap_or_else(|p| p.into_inner());
        let cur = guard.clone();
        let key = format!("tenant[{name}]");
        let id = cur.id(name);
        if id.is_none() && !create {
            return Err(UpdateError::Unknown(name.into()));
        }
        if raw.charge_cgroup.is_some() {
            return Err(ConfigError {
                key: format!("{key}.charge_cgroup"),
                reason: "is set in the config file; it cannot be changed at run time".into(),
            }
            .into());
        }
        let mut raw = raw.clone();
        raw.name = Some(name.to_string());
        let spec = validate_tenant(&key, &raw, id.and_then(|i| cur.spec(i)), self.mdts)?;
        let mut tenants = cur.tenants.clone();
        match id {
            Some(i) => tenants[i as usize] = Some(spec.clone()),
            None => {
                if tenants.len() >= TENANTS_MAX {
                    return Err(ConfigError {
                        key,
                        reason: format!("no room: {TENANTS_MAX} tenants is the most"),
                    }
                    .into());
                }
                tenants.push(Some(spec.clone()));
            }
        }
        let all: Vec<TenantSpec> = tenants.iter().flatten().cloned().collect();
        validate_set(&all, &self.default_name, "tenant")?;
        let table = Arc::new(TenantTable::build(
            tenants,
            &self.default_name,
            cur.generation + 1,
        ));
        self.apply_table(&table, Instant::now());
        *guard = table;
        tracing::info!(tenant = name, ?spec, "tenant updated");
        Ok(spec)
    }

    /// The tenants as JSON.
    pub fn tenants_json(&self) -> String {
        let t = self.table();
        let v: Vec<&TenantSpec> = t.iter().map(|(_, s)| s).collect();
        serde_json::to_string_pretty(&v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Result<crate::Config, ConfigError> {
        crate::Config::from_toml(&format!(
            r#"
[[subsystem]]
nqn = "nqn.2026-11.io.sluice:t"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "1MiB"
{extra}
"#
        ))
    }

    fn must_fail(extra: &str, key: &str, words: &str) {
        let e = cfg(extra).expect_err("config should be refused");
        assert_eq!(e.key, key, "{e}");
        assert!(e.reason.contains(words), "{e}");
    }

    #[test]
    fn tenants_parse() {
        let c = cfg(r#"
[tenants]
scheduler = "fair"
cost = "bytes"
dispatch_depth = 4
admin_listen = "127.0.0.1:0"
cpu_isolation = true
cpu_k = 16
[[tenant]]
name = "gold"
hosts = ["nqn.2014-08.org.nvmexpress:uuid:a"]
weight = 4
reservation = { iops = 1000 }
limit = { iops = 50000, read_bytes_per_sec = "200MiB" }
cpu_share = 0.5
[[tenant]]
name = "bronze"
hosts = ["nqn.2014-08.org.nvmexpress:uuid:b"]
"#)
        .expect("valid");
        let t = &c.tenants;
        assert_eq!(t.tenants.len(), 2);
        assert_eq!(t.tenants[0].weight, 4);
        assert_eq!(t.tenants[0].limit.read_bytes_per_sec, Some(200 << 20));
        assert_eq!(t.tenants[1].weight, 1);
        assert_eq!(t.settings.throttle.k, 16);
        assert_eq!(t.settings.cost, CostKind::Bytes);
        assert!(t.settings.cpu_isolation);
        // No tenants at all: stock behaviour.
        assert_eq!(
            cfg("").expect("valid").tenants.settings.scheduler,
            SchedulerMode::None
        );
    }

    #[test]
    fn bad_tenants_name_the_key() {
        must_fail(
            "[[tenant]]\nname = \"a\"\nweight = 0",
            "tenant[0].weight",
            "from 1",
        );
        must_fail(
            "[[tenant]]\nname = \"a\"\nweight = -3",
            "tenant[0].weight",
            "from 1",
        );
        must_fail(
            "[[tenant]]\nname = \"a\"\nlimit = { iops = 0 }",
            "tenant[0].limit.iops",
            "below one I/O",
        );
        must_fail(
            "[[tenant]]\nname = \"a\"\nlimit = { bytes_per_sec = 100 }",
            "tenant[0].limit.bytes_per_sec",
            "below one I/O",
        );
        must_fail(
            "[[tenant]]\nname = \"a\"\nreservation = { iops = 10 }\nlimit = { iops = 5 }",
            "tenant[0].reservation.iops",
            "above the limit",
        );
        must_fail(
            "[[tenant]]\nname = \"a\"\ncpu_share = 1.5",
            "tenant[0].cpu_share",
            "(0, 1]",
        );
        must_fail(
            "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"",
            "tenant[1].name",
            "twice",
        );
        must_fail("[[tenant]]\nname = \"a\"\nhosts = [\"nqn.x:h\"]\n[[tenant]]\nname = \"b\"\nhosts = [\"nqn.x:h\"]", "tenant[1].hosts[0]", "already belongs");
        must_fail(
            "[tenants]\nsplit_bytes = 5000",
            "tenants.split_bytes",
            "multiple of 4096",
        );
        must_fail(
            "[tenants]\nsplit_bytes = \"1GiB\"",
            "tenants.split_bytes",
            "multiple of 4096",
        );
        must_fail(
            "[tenants]\ndefault = \"nope\"",
            "tenants.default",
            "unknown tenant `nope`",
        );
        must_fail(
            "[tenants]\nscheduler = \"wfq\"",
            "tenants.scheduler",
            "not one of",
        );
        must_fail(
            "[tenants]\nvictim_cgroups = [\"/nonexistent\"]",
            "tenants.victim_cgroups[0]",
            "not a cgroup",
        );
        must_fail("[[tenant]]\nname = \"a b\"", "tenant[0].name", "must be");
        must_fail(
            "[[tenant]]\nname = \"a\"\nhosts = [\"host\"]",
            "tenant[0].hosts[0]",
            "nqn.",
        );
        let e = cfg("[[tenant]]\nname = \"a\"\nwheight = 2").expect_err("unknown key");
        assert!(e.reason.contains("wheight"), "{e}");
    }

    #[test]
    fn updates_are_validated_and_atomic() {
        let c = cfg("[[tenant]]\nname = \"a\"\nhosts = [\"nqn.x:a\"]\n[[tenant]]\nname = \"b\"\nhosts = [\"nqn.x:b\"]").expect("valid");
        let reg = Registry::build(&c).expect("registry");
        let rt = TenantRuntime::new(&c, &reg);
        let g0 = rt.generation();
        let a = rt
            .update_json("a", r#"{"weight": 3, "limit": {"iops": 100}}"#)
            .expect("ok");
        assert_eq!((a.weight, a.limit.iops, a.hosts.len()), (3, Some(100), 1));
        assert_eq!(rt.generation(), g0 + 1);
        for (json, words) in [
            (r#"{"weight": 0}"#, "tenant[a].weight"),
            (r#"{"weight": -1}"#, "tenant[a].weight"),
            (r#"{"limit": {"bytes_per_sec": 10}}"#, "below one I/O"),
            (r#"{"hosts": ["nqn.x:b"]}"#, "already belongs"),
            (r#"{"colour": "red"}"#, "unknown field"),
            (r#"{"weight": 2"#, "bad tenant JSON"),
        ] {
            let e = rt.update_json("a", json).expect_err(json).to_string();
            assert!(e.contains(words), "{json}: {e}");
        }
        assert_eq!(rt.generation(), g0 + 1, "rejected updates leave the table");
        assert_eq!(
            rt.table()
                .spec(rt.table().id("a").expect("a"))
                .expect("a")
                .weight,
            3
        );
        let c2 = rt
            .update_json("c", r#"{"hosts": ["nqn.x:c"], "weight": 2}"#)
            .expect("create");
        assert_eq!(c2.weight, 2);
        let t = rt.table();
        assert_eq!(t.tenant_of(Some("nqn.x:c")), t.id("c").expect("c"));
        assert_eq!(
            t.tenant_of(Some("nqn.x:zzz")),
            t.id(DEFAULT_TENANT).expect("default")
        );
        let m = admin::stats_report(&rt);
        assert!(m.tenants.iter().any(|t| t.name == "c" && t.weight == 2));
    }
}
