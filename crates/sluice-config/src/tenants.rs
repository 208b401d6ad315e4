//! `[tenants]` and `[[tenant]]`: tenants (host NQNs → weight, reservations,
//! limits, CPU share), the fair scheduler's settings and CPU isolation; and
//! the run-time tenant update request ([`RawTenant`] in JSON: fields absent
//! are kept). See docs/tenants.md.

use crate::{err, ranged_as, validate_nqn, ConfigError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most tenants (including `default`) over the life of a target.
pub const TENANTS_MAX: usize = 256;
/// Name of the implicit tenant of hosts listed nowhere.
pub const DEFAULT_TENANT: &str = "default";
pub const WEIGHT_MAX: u32 = 10_000;
/// Smallest byte rate accepted: one 4 KiB I/O per second.
pub const BYTES_PER_SEC_MIN: u64 = 4096;
/// Bounds of `[tenants] split_bytes` (pieces stay block- and
/// O_DIRECT-aligned: a multiple of 4 KiB).
pub const SPLIT_BYTES_MIN: u64 = 4096;
pub const SPLIT_BYTES_MAX: u64 = 16 << 20;

/// Optional rates: operations/s and bytes/s (read, write, total).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes_per_sec: Option<u64>,
}

impl RateSpec {
    pub fn is_empty(&self) -> bool {
        *self == RateSpec::default()
    }
    pub fn with_iops(mut self, v: u64) -> Self {
        self.iops = Some(v);
        self
    }
    pub fn with_read_iops(mut self, v: u64) -> Self {
        self.read_iops = Some(v);
        self
    }
    pub fn with_write_iops(mut self, v: u64) -> Self {
        self.write_iops = Some(v);
        self
    }
    pub fn with_bytes_per_sec(mut self, v: u64) -> Self {
        self.bytes_per_sec = Some(v);
        self
    }
    pub fn with_read_bytes_per_sec(mut self, v: u64) -> Self {
        self.read_bytes_per_sec = Some(v);
        self
    }
    pub fn with_write_bytes_per_sec(mut self, v: u64) -> Self {
        self.write_bytes_per_sec = Some(v);
        self
    }
}

/// One tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// (i-NVMe Algorithms 1-2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_cgroup: Option<PathBuf>,
}

impl TenantSpec {
    /// Tenant `name` with weight 1, no hosts, no rates, no CPU share.
    pub fn new(name: impl Into<String>) -> Self {
        TenantSpec {
            name: name.into(),
            hosts: vec![],
            weight: 1,
            reservation: RateSpec::default(),
            limit: RateSpec::default(),
            cpu_share: None,
            charge_cgroup: None,
        }
    }
    /// The implicit `default` tenant of hosts listed nowhere.
    pub fn implicit_default() -> Self {
        Self::new(DEFAULT_TENANT)
    }
    pub fn with_host(mut self, h: impl Into<String>) -> Self {
        self.hosts.push(h.into());
        self
    }
    pub fn with_weight(mut self, w: u32) -> Self {
        self.weight = w;
        self
    }
    pub fn with_reservation(mut self, r: RateSpec) -> Self {
        self.reservation = r;
        self
    }
    pub fn with_limit(mut self, r: RateSpec) -> Self {
        self.limit = r;
        self
    }
    pub fn with_cpu_share(mut self, s: f64) -> Self {
        self.cpu_share = Some(s);
        self
    }
    pub fn with_charge_cgroup(mut self, p: impl Into<PathBuf>) -> Self {
        self.charge_cgroup = Some(p.into());
        self
    }
}

/// Whether I/O goes through the fair scheduler: `scheduler = "fair" | "none"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerMode {
    /// Stock behaviour: submit to the backend at once (no limits).
    #[serde(alias = "off")]
    None,
    Fair,
}

/// Cost model choice: `cost = "device" | "bytes"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CostKind {
    /// Device time from the emulated SSD's model (bytes for other backends).
    Device,
    Bytes,
}

/// The i-NVMe throttle's parameters (`cpu_period_ms`, `cpu_k`,
/// `cpu_alpha_us`, `cpu_min_t_fraction`). Absent values take the defaults
/// of `sluice_cpu::ThrottleParams`, the one place they are defined.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Duration>,
    /// Number of sub-throttles per T (k).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u32>,
    /// Adaptive increase of T after k throttles (α).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<Duration>,
    /// Fraction of the quota used as min T.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_t_fraction: Option<f64>,
}

/// Global tenant settings (`[tenants]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantsSettings {
    pub scheduler: SchedulerMode,
    pub cost: CostKind,
    /// Most I/Os outstanding at one backend (all workers together).
    pub dispatch_depth: u32,
    /// Optional cap on the summed cost of outstanding I/Os per backend
    /// (all workers): µs of device time (device cost) or thousands of bytes (bytes cost).
    pub dispatch_budget_us: Option<u64>,
    /// Reads and writes larger than this go to the backend as separately
    /// scheduled pieces of at most this size (None: whole).
    pub split_bytes: Option<u64>,
    pub admin_listen: Option<SocketAddr>,
    /// File holding the admin endpoint's bearer token (none: no auth).
    pub admin_token_file: Option<PathBuf>,
    /// CPU accounting (thread CPU per loop batch) on/off.
    pub cpu_accounting: bool,
    /// i-NVMe throttling on/off (needs accounting).
    pub cpu_isolation: bool,
    pub throttle: ThrottleConfig,
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
            throttle: ThrottleConfig::default(),
            victim_cgroups: vec![],
        }
    }
}

/// Builder-style setters (validated by [`crate::Config::validated`]).
impl TenantsSettings {
    pub fn with_scheduler(mut self, m: SchedulerMode) -> Self {
        self.scheduler = m;
        self
    }
    pub fn with_cost(mut self, c: CostKind) -> Self {
        self.cost = c;
        self
    }
    pub fn with_dispatch_depth(mut self, n: u32) -> Self {
        self.dispatch_depth = n;
        self
    }
    pub fn with_dispatch_budget_us(mut self, us: u64) -> Self {
        self.dispatch_budget_us = Some(us);
        self
    }
    pub fn with_split_bytes(mut self, bytes: u64) -> Self {
        self.split_bytes = Some(bytes);
        self
    }
    pub fn with_admin_listen(mut self, a: SocketAddr) -> Self {
        self.admin_listen = Some(a);
        self
    }
    pub fn with_admin_token_file(mut self, p: impl Into<PathBuf>) -> Self {
        self.admin_token_file = Some(p.into());
        self
    }
    pub fn with_cpu_accounting(mut self, on: bool) -> Self {
        self.cpu_accounting = on;
        self
    }
    /// i-NVMe throttling (turns CPU accounting on too).
    pub fn with_cpu_isolation(mut self, on: bool) -> Self {
        self.cpu_isolation = on;
        self.cpu_accounting |= on;
        self
    }
    pub fn with_throttle(mut self, t: ThrottleConfig) -> Self {
        self.throttle = t;
        self
    }
    pub fn with_victim_cgroup(mut self, p: impl Into<PathBuf>) -> Self {
        self.victim_cgroups.push(p.into());
        self
    }
}

impl ThrottleConfig {
    pub fn with_period(mut self, d: Duration) -> Self {
        self.period = Some(d);
        self
    }
    pub fn with_k(mut self, k: u32) -> Self {
        self.k = Some(k);
        self
    }
    pub fn with_alpha(mut self, d: Duration) -> Self {
        self.alpha = Some(d);
        self
    }
    pub fn with_min_t_fraction(mut self, f: f64) -> Self {
        self.min_t_fraction = Some(f);
        self
    }
}

/// The validated `[tenants]` + `[[tenant]]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

impl TenantsConfig {
    /// Tenants on: the fair scheduler with default settings and no tenants
    /// yet (what an empty `[tenants]` table means).
    pub fn fair() -> Self {
        TenantsConfig {
            settings: TenantsSettings::default(),
            ..Default::default()
        }
    }
    pub fn with_settings(mut self, s: TenantsSettings) -> Self {
        self.settings = s;
        self
    }
    pub fn with_tenant(mut self, t: TenantSpec) -> Self {
        self.tenants.push(t);
        self
    }
    pub fn with_default_tenant(mut self, name: impl Into<String>) -> Self {
        self.default_tenant = name.into();
        self
    }
}

// ---- shapes as written (TOML, and JSON for run-time updates) ----

/// A count or a size with units ("100MiB").
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
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
            RawNum::Float(f) if f.fract() == 0.0 && f.abs() < 9e15 => {
                // A whole number below 2^53 in magnitude: exact as an i64.
                #[allow(clippy::cast_possible_truncation)]
                let i = *f as i64;
                Ok(i)
            }
            RawNum::Float(f) => Err(err(key, format!("{f} is not a whole number"))),
            RawNum::Str(s) => {
                let v = crate::parse_size(s).map_err(|r| err(key, r.to_string()))?;
                i64::try_from(v).map_err(|_| err(key, format!("`{s}` is too large")))
            }
        }
    }
}

impl From<u64> for RawNum {
    fn from(v: u64) -> Self {
        i64::try_from(v).map_or_else(|_| RawNum::Str(v.to_string()), RawNum::Int)
    }
}

/// `reservation = { ... }` / `limit = { ... }` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) iops: Option<RawNum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) read_iops: Option<RawNum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write_iops: Option<RawNum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) bytes_per_sec: Option<RawNum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) read_bytes_per_sec: Option<RawNum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write_bytes_per_sec: Option<RawNum>,
}

impl From<&RateSpec> for RawRate {
    fn from(r: &RateSpec) -> Self {
        RawRate {
            iops: r.iops.map(RawNum::from),
            read_iops: r.read_iops.map(RawNum::from),
            write_iops: r.write_iops.map(RawNum::from),
            bytes_per_sec: r.bytes_per_sec.map(RawNum::from),
            read_bytes_per_sec: r.read_bytes_per_sec.map(RawNum::from),
            write_bytes_per_sec: r.write_bytes_per_sec.map(RawNum::from),
        }
    }
}

/// `[[tenant]]` (TOML) or a tenant update (JSON; fields absent are kept).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hosts: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight: Option<RawNum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reservation: Option<RawRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) limit: Option<RawRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_cgroup: Option<PathBuf>,
}

impl From<&TenantSpec> for RawTenant {
    fn from(t: &TenantSpec) -> Self {
        RawTenant {
            name: Some(t.name.clone()),
            hosts: Some(t.hosts.clone()),
            weight: Some(RawNum::from(u64::from(t.weight))),
            reservation: (!t.reservation.is_empty()).then(|| RawRate::from(&t.reservation)),
            limit: (!t.limit.is_empty()).then(|| RawRate::from(&t.limit)),
            cpu_share: t.cpu_share,
            charge_cgroup: t.charge_cgroup.clone(),
        }
    }
}

/// `[tenants]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenants {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) scheduler: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cost: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dispatch_depth: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dispatch_budget_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) split_bytes: Option<RawNum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) admin_listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) admin_token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) default: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_accounting: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_isolation: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_period_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_alpha_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_min_t_fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) victim_cgroups: Option<Vec<PathBuf>>,
}

fn rate(key: &str, r: &RawRate) -> Result<RateSpec, ConfigError> {
    let ops = |k: &str, v: &Option<RawNum>| -> Result<Option<u64>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let k = format!("{key}.{k}");
        let n = v.value(&k)?;
        match u64::try_from(n) {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(err(k, format!("{n} is below one I/O per second"))),
        }
    };
    let bytes = |k: &str, v: &Option<RawNum>| -> Result<Option<u64>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let k = format!("{key}.{k}");
        let n = v.value(&k)?;
        match u64::try_from(n) {
            Ok(n) if n >= BYTES_PER_SEC_MIN => Ok(Some(n)),
            _ => Err(err(
                k,
                format!("{n} bytes/s is below one I/O ({BYTES_PER_SEC_MIN} bytes) per second"),
            )),
        }
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
            match u32::try_from(v) {
                Ok(w) if (1..=WEIGHT_MAX).contains(&w) => w,
                _ => return Err(err(k, format!("{v} must be from 1 to {WEIGHT_MAX}"))),
            }
        }
        None => base.map_or(1, |b| b.weight),
    };
    let reservation = match &raw.reservation {
        Some(r) => rate(&format!("{key}.reservation"), r)?,
        None => base.map(|b| b.reservation).unwrap_or_default(),
    };
    let limit = match &raw.limit {
        Some(r) => rate(&format!("{key}.limit"), r)?,
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
            check_charge_cgroup(p).map_err(|r| err(format!("{key}.charge_cgroup"), r))?;
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

/// A `charge_cgroup` must be a cgroup v1 `cpu` directory with a CFS quota
/// (the base the charged CPU is taken out of). Only checked here; the
/// target opens it with `sluice_cpu::CpuCgroup` when it starts.
pub fn check_charge_cgroup(p: &Path) -> Result<(), String> {
    let read = |f: &str| -> Result<i64, String> {
        let path = p.join(f);
        let s = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
        s.trim()
            .parse()
            .map_err(|_| format!("`{}`: `{}` is not a number", path.display(), s.trim()))
    };
    if !p.join("cpu.cfs_quota_us").exists() {
        return Err(format!(
            "cgroup `{}` does not exist (is the cgroup `cpu` controller mounted there?)",
            p.display()
        ));
    }
    let quota = read("cpu.cfs_quota_us")?;
    let period = read("cpu.cfs_period_us")?;
    if quota <= 0 || period <= 0 {
        return Err(format!(
            "`{}` has no CPU quota (cpu.cfs_quota_us = -1); set the tenant's quota first",
            p.display()
        ));
    }
    Ok(())
}

/// Cross-tenant checks: unique names, a host in one tenant only, the
/// default tenant exists.
pub fn validate_set(tenants: &[TenantSpec], default: &str, key: &str) -> Result<(), ConfigError> {
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
    /// From the `[tenants]` table and the `[[tenant]]` array as written.
    pub fn from_raw(
        settings: Option<RawTenants>,
        tenants: Vec<RawTenant>,
    ) -> Result<TenantsConfig, ConfigError> {
        let explicit = settings.is_some() || !tenants.is_empty();
        let r = settings.unwrap_or_default();
        let mut s = TenantsSettings::default();
        if !explicit {
            return Ok(TenantsConfig::default());
        }
        if let Some(v) = &r.scheduler {
            s.scheduler = crate::parse_word(v).map_err(|e| err("tenants.scheduler", e))?;
        }
        if let Some(v) = &r.cost {
            s.cost = crate::parse_word(v).map_err(|e| err("tenants.cost", e))?;
        }
        if let Some(v) = r.dispatch_depth {
            s.dispatch_depth = ranged_as("tenants.dispatch_depth", v, 1, 1024)?;
        }
        if let Some(v) = r.dispatch_budget_us {
            s.dispatch_budget_us = Some(ranged_as("tenants.dispatch_budget_us", v, 1, 10_000_000)?);
        }
        if let Some(v) = &r.split_bytes {
            let key = "tenants.split_bytes";
            let v = v.value(key)?;
            let Some(b) = u64::try_from(v)
                .ok()
                .filter(|b| (SPLIT_BYTES_MIN..=SPLIT_BYTES_MAX).contains(b))
                .filter(|b| b % SPLIT_BYTES_MIN == 0)
            else {
                return Err(err(
                    key,
                    format!(
                        "{v} must be a multiple of {SPLIT_BYTES_MIN} from {SPLIT_BYTES_MIN} to {SPLIT_BYTES_MAX}"
                    ),
                ));
            };
            s.split_bytes = Some(b);
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
        if let Some(a) = s.admin_listen {
            if !a.ip().is_loopback() && s.admin_token_file.is_none() {
                return Err(err(
                    "tenants.admin_token_file",
                    format!(
                        "the admin endpoint would listen on {a}, beyond loopback, without a token: \
                         anyone who reaches it could read and change tenants; set \
                         tenants.admin_token_file, or listen on 127.0.0.1"
                    ),
                ));
            }
        }
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
            let v = ranged_as("tenants.cpu_period_ms", v, 1, 10_000)?;
            s.throttle.period = Some(Duration::from_millis(v));
        }
        if let Some(v) = r.cpu_k {
            s.throttle.k = Some(ranged_as("tenants.cpu_k", v, 1, 64)?);
        }
        if let Some(v) = r.cpu_alpha_us {
            let v = ranged_as("tenants.cpu_alpha_us", v, 0, 1_000_000)?;
            s.throttle.alpha = Some(Duration::from_micros(v));
        }
        if let Some(v) = r.cpu_min_t_fraction {
            if !(v > 0.0 && v <= 1.0) {
                return Err(err(
                    "tenants.cpu_min_t_fraction",
                    format!("{v} must be in (0, 1]"),
                ));
            }
            s.throttle.min_t_fraction = Some(v);
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
            specs.push(validate_tenant(&format!("tenant[{i}]"), t, None)?);
        }
        let default_tenant = r.default.clone().unwrap_or_else(|| DEFAULT_TENANT.into());
        validate_set(&specs, &default_tenant, "tenant")?;
        Ok(TenantsConfig {
            settings: s,
            tenants: specs,
            default_tenant,
        })
    }

    /// The `[tenants]` table and `[[tenant]]` array that
    /// [`TenantsConfig::from_raw`] reads back to `self` (nothing when
    /// tenants are off and no tenant is defined).
    pub fn to_raw(&self) -> (Option<RawTenants>, Vec<RawTenant>) {
        if *self == TenantsConfig::default() {
            return (None, vec![]);
        }
        let s = &self.settings;
        let t = &s.throttle;
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let us = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let raw = RawTenants {
            scheduler: Some(crate::word_of(&s.scheduler)),
            cost: Some(crate::word_of(&s.cost)),
            dispatch_depth: Some(i64::from(s.dispatch_depth)),
            dispatch_budget_us: s
                .dispatch_budget_us
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
            split_bytes: s.split_bytes.map(RawNum::from),
            admin_listen: s.admin_listen.map(|a| a.to_string()),
            admin_token_file: s.admin_token_file.clone(),
            default: Some(self.default_tenant.clone()),
            cpu_accounting: Some(s.cpu_accounting),
            cpu_isolation: Some(s.cpu_isolation),
            cpu_period_ms: t.period.map(ms),
            cpu_k: t.k.map(i64::from),
            cpu_alpha_us: t.alpha.map(us),
            cpu_min_t_fraction: t.min_t_fraction,
            victim_cgroups: (!s.victim_cgroups.is_empty()).then(|| s.victim_cgroups.clone()),
        };
        (
            Some(raw),
            self.tenants.iter().map(RawTenant::from).collect(),
        )
    }
}
