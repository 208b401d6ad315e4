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
//! * [`latency`]: per-tenant latency histograms (hdrhistogram), recorded
//!   per worker and merged periodically.
//! * [`admin`]: the admin HTTP endpoint (`GET /metrics`, tenant updates).
//!
//! The running table is an `Arc` swapped under a lock; workers notice a new
//! generation once per loop iteration. Updates are validated as a whole
//! before the swap, so a rejected update leaves the running table intact.

pub mod admin;
pub mod cpu;
pub mod fair;
pub mod latency;
pub mod rate;
pub mod shared;
pub mod worker;

use crate::registry::Registry;
use crate::slots::Slots;
use crate::subsystem::{Namespace, Subsystem};
use fair::CostModel;
use sluice_config::tenants::{
    validate_set, validate_tenant, CostKind, RawTenant, TenantSpec, TenantsSettings,
    ThrottleConfig, DEFAULT_TENANT, TENANTS_MAX,
};
use sluice_config::{
    BackendConfig, ConfigError, NamespaceConfig, SubsystemConfig, NAMESPACES_TOTAL_MAX,
};
use sluice_runtime::sync::{read, write};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Dense tenant index, stable for the life of the target.
pub type TenantId = u32;

/// The throttle's parameters: the configured values over
/// `sluice_cpu::ThrottleParams::default()` (the one place the defaults are).
pub fn throttle_params(c: &ThrottleConfig) -> sluice_cpu::ThrottleParams {
    let d = sluice_cpu::ThrottleParams::default();
    sluice_cpu::ThrottleParams {
        period: c.period.unwrap_or(d.period),
        k: c.k.unwrap_or(d.k),
        alpha: c.alpha.unwrap_or(d.alpha),
        min_t_fraction: c.min_t_fraction.unwrap_or(d.min_t_fraction),
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
        // `tenants` is indexed by TenantId.
        for (i, t) in (0..).zip(tenants.iter()) {
            if let Some(t) = t {
                by_name.insert(t.name.clone(), i);
                for h in &t.hosts {
                    by_host.insert(h.clone(), i);
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

    /// The tenant of a host NQN (None before Connect, and the empty NQN of
    /// a host that gave none, which no tenant can list: the default tenant).
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
            .zip(0..)
            .filter_map(|(t, i)| t.as_ref().map(|t| (i, t)))
    }
}

/// Live counters of one tenant (all workers add to them).
#[derive(Debug, Default)]
pub struct TenantStats {
    pub read_ios: AtomicU64,
    pub write_ios: AtomicU64,
    pub other_ios: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Latency from arrival at the scheduler to backend completion, as
    /// merged from the workers' histograms (None until the first merge;
    /// locked only by a worker's periodic merge and by scrapes).
    latency: Mutex<Option<latency::Latency>>,
    pub sched_wait_ns: AtomicU64,
    pub cpu_ns: AtomicU64,
    pub throttle_events: AtomicU64,
    pub throttle_ns: AtomicU64,
    /// Queued in the scheduler plus outstanding at the backend.
    pub queue_depth: AtomicI64,
}

impl TenantStats {
    /// Adds a worker's histogram into the tenant's and empties it (the
    /// worker's periodic merge, never per I/O).
    pub fn merge_latency(&self, local: &mut latency::Latency) {
        if local.is_empty() {
            return;
        }
        let mut g = sluice_runtime::sync::lock(&self.latency);
        local.merge_into(g.get_or_insert_with(latency::Latency::new));
    }

    /// Reads the merged latency histogram (None before any I/O) under its
    /// lock.
    pub fn with_latency<R>(&self, f: impl FnOnce(Option<&latency::Latency>) -> R) -> R {
        let g = sluice_runtime::sync::lock(&self.latency);
        f(g.as_ref())
    }
}

/// Tenant state shared by the workers and the admin endpoint.
pub struct TenantRuntime {
    pub settings: TenantsSettings,
    table: RwLock<Arc<TenantTable>>,
    /// `table`'s generation, stored after each swap: a worker checks it on
    /// every turn of its loop and takes the table only when it changed.
    table_generation: AtomicU64,
    default_name: String,
    stats: Vec<TenantStats>,
    /// Worker CPU in batches with no tenant work.
    pub unattributed_cpu_ns: AtomicU64,
    /// Cost model per namespace index.
    pub cost_models: Slots<CostModel>,
    /// Data I/O per namespace index, every tenant's (a view agent reads
    /// them: `TargetHandle::namespace_counters`).
    pub ns_stats: Slots<NamespaceStats>,
    /// The scheduler of each namespace (by index), shared by all workers.
    pub arbiters: Slots<shared::BackendArbiter>,
    /// The CPU throttles of the worker pool.
    pub cpu: shared::CpuGovernor,
    /// Backend I/Os this slow are counted and logged (`target.slow_io_ms`).
    pub slow_io: Duration,
    /// Number of worker threads.
    pub workers: usize,
    /// Wakes worker `i` (set by the server once the workers exist).
    waker: std::sync::OnceLock<WakeWorker>,
}

/// Cumulative reads and writes of one namespace, all tenants: what the
/// shadow view's agent in a target reports (docs/isolation-volumes.md).
#[derive(Debug, Default)]
pub struct NamespaceStats {
    pub ios: AtomicU64,
    pub write_ios: AtomicU64,
    pub bytes: AtomicU64,
    /// Arrival at the target to completion, summed.
    pub latency_us_sum: AtomicU64,
    /// Backend I/Os (reads, writes, flushes and the rest; each piece of a
    /// split request) that took `target.slow_io_ms` or longer from the
    /// backend queue to their completion.
    pub slow_ios: AtomicU64,
    /// The namespace's subsystem NQN and NSID, for log lines.
    pub nqn: String,
    pub nsid: u32,
}

/// Wakes one worker thread by index.
pub type WakeWorker = Box<dyn Fn(usize) + Send + Sync>;

impl std::fmt::Debug for TenantRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantRuntime")
            .field("settings", &self.settings)
            .field("generation", &self.generation())
            .field("workers", &self.workers)
            .field("arbiters", &self.arbiters.iter().count())
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

/// A namespace's cost model: an emulated SSD's device model when tenants
/// are charged by device cost, bytes otherwise.
fn cost_model_of(kind: CostKind, backend: &BackendConfig) -> CostModel {
    match (backend, kind) {
        (BackendConfig::EmulatedSsd(m), CostKind::Device) => {
            CostModel::device(&crate::subsystem::ssd_model(m))
        }
        _ => CostModel::bytes(),
    }
}

fn params_of(spec: &TenantSpec) -> fair::TenantParams {
    fair::TenantParams {
        weight: spec.weight,
        reservation: spec.reservation,
        limit: spec.limit,
    }
}

impl TenantRuntime {
    pub fn new(cfg: &sluice_config::Config, reg: &Registry) -> Self {
        let tc = &cfg.tenants;
        let mut tenants: Vec<Option<TenantSpec>> = Vec::new();
        if !tc.tenants.iter().any(|t| t.name == DEFAULT_TENANT) {
            tenants.push(Some(TenantSpec::implicit_default()));
        }
        tenants.extend(tc.tenants.iter().cloned().map(Some));
        let table = TenantTable::build(tenants, &tc.default_tenant, 1);
        let workers = cfg
            .target
            .workers
            .clamp(1, sluice_runtime::limits::WORKERS_MAX);
        let st = &tc.settings;
        let victims = if st.cpu_isolation && !st.victim_cgroups.is_empty() {
            match sluice_cpu::VictimWatch::new(&st.victim_cgroups) {
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
            table_generation: AtomicU64::new(table.generation),
            table: RwLock::new(Arc::new(table)),
            default_name: tc.default_tenant.clone(),
            stats: (0..TENANTS_MAX).map(|_| TenantStats::default()).collect(),
            unattributed_cpu_ns: AtomicU64::new(0),
            ns_stats: Slots::new(NAMESPACES_TOTAL_MAX),
            slow_io: Duration::from_millis(u64::from(cfg.target.slow_io_ms)),
            cost_models: Slots::new(NAMESPACES_TOTAL_MAX),
            arbiters: Slots::new(NAMESPACES_TOTAL_MAX),
            cpu: shared::CpuGovernor::new(
                throttle_params(&st.throttle),
                workers,
                st.cpu_isolation,
                victims,
            ),
            workers,
            waker: std::sync::OnceLock::new(),
        };
        for sc in &cfg.subsystems {
            if let Some(sub) = reg.subsystem(&sc.nqn) {
                rt.add_namespaces(&sc.nqn, &configured_namespaces(&sub, sc));
            }
        }
        rt.apply_table(&rt.table(), Instant::now());
        rt
    }

    /// Creates the per-namespace state of `namespaces` (each with its
    /// configuration) of subsystem `nqn`: cost model, counters, and a
    /// scheduler set up for the tenant table in force. At start, and when
    /// a reload adds a subsystem or namespaces (before they take I/O).
    /// Holds the table's lock, so no tenant update runs between reading the
    /// table and the new scheduler being where the next update reaches it.
    pub(crate) fn add_namespaces(
        &self,
        nqn: &str,
        namespaces: &[(&NamespaceConfig, Arc<Namespace>)],
    ) {
        let table = write(&self.table);
        let now = Instant::now();
        for (nc, ns) in namespaces {
            let cost = cost_model_of(self.settings.cost, &nc.backend);
            let arbiter = shared::BackendArbiter::new(
                cost,
                self.settings.dispatch_depth,
                self.settings.dispatch_budget_us.map(|us| us * 1000),
                self.workers,
            );
            for (id, spec) in table.iter() {
                arbiter.set_params(id, params_of(spec), now);
            }
            let stats = NamespaceStats {
                nqn: nqn.to_string(),
                nsid: nc.nsid,
                ..NamespaceStats::default()
            };
            // Indices are never handed out twice (`Registry`), so every
            // slot is empty here.
            let fresh = self.cost_models.set(ns.index, cost).is_ok()
                & self.ns_stats.set(ns.index, stats).is_ok()
                & self.arbiters.set(ns.index, arbiter).is_ok();
            debug_assert!(fresh, "namespace index {} set twice", ns.index);
        }
    }

    /// Pushes a table's weights, rates and CPU shares into the shared
    /// schedulers and throttles (buckets keep their fill when unchanged).
    fn apply_table(&self, table: &TenantTable, now: Instant) {
        for (id, spec) in table.iter() {
            let params = params_of(spec);
            for (_, a) in self.arbiters.iter() {
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
        read(&self.table).clone()
    }

    /// The current table's generation (without taking the table).
    pub fn generation(&self) -> u64 {
        self.table_generation
            .load(std::sync::atomic::Ordering::Acquire)
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
        let mut guard = write(&self.table);
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
        let spec = validate_tenant(&key, &raw, id.and_then(|i| cur.spec(i)))?;
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
        self.install(&mut guard, tenants)?;
        tracing::info!(tenant = name, ?spec, "tenant updated");
        Ok(spec)
    }

    /// Checks `tenants` as a whole and makes them the table in force, one
    /// generation after the one the caller holds the lock of.
    fn install(
        &self,
        guard: &mut std::sync::RwLockWriteGuard<'_, Arc<TenantTable>>,
        tenants: Vec<Option<TenantSpec>>,
    ) -> Result<(), UpdateError> {
        let all: Vec<TenantSpec> = tenants.iter().flatten().cloned().collect();
        validate_set(&all, &self.default_name, "tenant")?;
        let table = Arc::new(TenantTable::build(
            tenants,
            &self.default_name,
            guard.generation + 1,
        ));
        self.apply_table(&table, Instant::now());
        let generation = table.generation;
        **guard = table;
        self.table_generation
            .store(generation, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Makes each of `specs` the tenant of its name, creating those that do
    /// not exist, and deletes the tenants named in `remove`, in one new
    /// table (a configuration reload): checked as a whole, so a host may
    /// move from one tenant to another. A deleted tenant's hosts belong to
    /// the default tenant (live connections take the new table at their
    /// next command); its id is not reused until a restart, so its counters
    /// and scheduler state never pass to another tenant; the `default`
    /// tenant, removed, reverts to the implicit one. Names of the tenants
    /// that changed, and of those deleted.
    pub fn replace_tenants(
        &self,
        specs: &[TenantSpec],
        remove: &[String],
    ) -> Result<(Vec<String>, Vec<String>), UpdateError> {
        let mut guard = write(&self.table);
        let cur = guard.clone();
        let mut tenants = cur.tenants.clone();
        let mut changed = Vec::new();
        let mut removed = Vec::new();
        for name in remove {
            let Some(i) = cur.id(name) else { continue };
            tenants[i as usize] = if name == DEFAULT_TENANT {
                Some(TenantSpec::implicit_default())
            } else {
                None
            };
            removed.push(name.clone());
        }
        for spec in specs {
            match cur.id(&spec.name) {
                Some(i) if cur.spec(i) == Some(spec) => continue,
                Some(i) => tenants[i as usize] = Some(spec.clone()),
                None if tenants.len() >= TENANTS_MAX => {
                    return Err(ConfigError {
                        key: format!("tenant[{}]", spec.name),
                        reason: format!("no room: {TENANTS_MAX} tenants is the most"),
                    }
                    .into());
                }
                None => tenants.push(Some(spec.clone())),
            }
            changed.push(spec.name.clone());
        }
        if changed.is_empty() && removed.is_empty() {
            return Ok((changed, removed));
        }
        self.install(&mut guard, tenants)?;
        tracing::info!(tenants = ?changed, removed = ?removed, "tenant table replaced");
        Ok((changed, removed))
    }

    /// Deletes tenant `name` (the admin API's `DELETE`), as a reload that
    /// no longer lists it does ([`Self::replace_tenants`]). The default
    /// tenant cannot be deleted, nor one with a `charge_cgroup` (its CPU
    /// charging holds its id until a restart).
    pub fn delete(&self, name: &str) -> Result<(), UpdateError> {
        let t = self.table();
        let id = t
            .id(name)
            .ok_or_else(|| UpdateError::Unknown(name.into()))?;
        let key = format!("tenant[{name}]");
        if name == self.default_name || name == DEFAULT_TENANT {
            return Err(ConfigError {
                key,
                reason: "is the default tenant, which cannot be deleted".into(),
            }
            .into());
        }
        if t.spec(id).is_some_and(|s| s.charge_cgroup.is_some()) {
            return Err(ConfigError {
                key: format!("{key}.charge_cgroup"),
                reason: "is set: a tenant charged to a cgroup is deleted by a restart".into(),
            }
            .into());
        }
        let (_, removed) = self.replace_tenants(&[], &[name.to_string()])?;
        if removed.is_empty() {
            // Deleted by another request since the table was read.
            return Err(UpdateError::Unknown(name.into()));
        }
        tracing::info!(tenant = name, "tenant deleted");
        Ok(())
    }

    /// The tenants as JSON.
    pub fn tenants_json(&self) -> String {
        let t = self.table();
        let v: Vec<&TenantSpec> = t.iter().map(|(_, s)| s).collect();
        serde_json::to_string_pretty(&v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// `sub`'s namespaces, each with its configuration in `sc`.
pub(crate) fn configured_namespaces<'a>(
    sub: &Subsystem,
    sc: &'a SubsystemConfig,
) -> Vec<(&'a NamespaceConfig, Arc<Namespace>)> {
    sc.namespaces
        .iter()
        .filter_map(|nc| Some((nc, sub.namespaces.get(nc.nsid)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::tenants::TenantsConfig;
    use sluice_config::{Config, NamespaceConfig, SubsystemConfig};

    /// A runtime over one open subsystem and tenant `a` (host `nqn.x:a`)
    /// beside `other`; `validate` checks the file's rules first (a
    /// `charge_cgroup` must exist then).
    fn runtime_with(other: TenantSpec, validate: bool) -> TenantRuntime {
        let c = Config::default()
            .with_subsystem(
                SubsystemConfig::new("nqn.2026-11.io.sluice:t")
                    .allow_any_host()
                    .with_namespace(NamespaceConfig::ram(1, 1 << 20)),
            )
            .with_tenants(
                TenantsConfig::fair()
                    .with_tenant(TenantSpec::new("a").with_host("nqn.x:a"))
                    .with_tenant(other),
            );
        let c = if validate {
            c.validated().expect("valid")
        } else {
            c
        };
        let reg = Registry::build(&c).expect("registry");
        TenantRuntime::new(&c, &reg)
    }

    #[test]
    fn deletion_spares_the_default_and_charged_tenants() {
        let rt = runtime_with(
            TenantSpec::new("cg").with_charge_cgroup("/sys/fs/cgroup/cpu/x"),
            false,
        );
        let g0 = rt.generation();
        for (name, words) in [
            ("default", "cannot be deleted"),
            ("cg", "charge_cgroup"),
            ("zz", "unknown tenant `zz`"),
        ] {
            let e = rt.delete(name).expect_err(name).to_string();
            assert!(e.contains(words), "{name}: {e}");
        }
        assert_eq!(rt.generation(), g0, "refusals change nothing");
        let a = rt.table().id("a").expect("a");
        rt.delete("a").expect("deleted");
        let t = rt.table();
        assert_eq!((t.id("a"), t.spec(a)), (None, None));
        assert_eq!(
            t.tenant_of(Some("nqn.x:a")),
            t.id("default").expect("default")
        );
        assert!(matches!(rt.delete("a"), Err(UpdateError::Unknown(_))));
        // A new tenant of the same name takes a new id.
        rt.update_json("a", "{}").expect("created");
        assert_ne!(rt.table().id("a"), Some(a));
    }

    #[test]
    fn updates_are_validated_and_atomic() {
        let rt = runtime_with(TenantSpec::new("b").with_host("nqn.x:b"), true);
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

    #[test]
    fn throttle_defaults_come_from_sluice_cpu() {
        assert_eq!(
            throttle_params(&ThrottleConfig::default()),
            sluice_cpu::ThrottleParams::default()
        );
        let p = throttle_params(&ThrottleConfig {
            k: Some(16),
            ..Default::default()
        });
        assert_eq!(p.k, 16);
    }
}
