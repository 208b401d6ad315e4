//! The target's admin endpoint, served by `sluice-admin` (axum on its own
//! tokio thread `sluice-admin`; the mio workers are untouched).
//!
//! * `GET /metrics`: OpenMetrics text of the per-tenant, per-namespace and
//!   per-host counters and of the connection limits (open, handshaking,
//!   sources, refusals by limit, handshake timeouts; [`TargetCollector`]
//!   reads the existing atomics, the admission counts and the tenants'
//!   merged latency histograms at scrape time; nothing is added to the I/O
//!   path). `sluice_tenant_latency_seconds` has the fixed `le`
//!   bounds [`LE_BOUNDS_US`] (see [`super::latency`]).
//! * `GET /v1/status`: service, version, uptime, workers, table generation.
//! * `GET /v1/stats`: per-tenant counters and latency (what `sluice top`
//!   reads), [`sluice_admin::schema::TenantStatsReport`].
//! * `GET /v1/tenants` (and `/tenants`): the running tenant table;
//!   `GET /v1/tenants/NAME`: one tenant.
//! * `POST /v1/reload`: re-reads the configuration file and applies it as
//!   SIGHUP does (`reload.rs`), answering `200` with what it changed
//!   (subsystems added and removed, access changes, tenants replaced and
//!   deleted) or `409` with why the file was refused (nothing applied);
//!   `409` too when the target was started without a file. The action is
//!   installed by whoever knows the file ([`ReloadAction`]).
//! * `PUT /v1/tenants/NAME` (and `/tenants/NAME`): create or update a
//!   tenant from a JSON object with any of `hosts`, `weight`,
//!   `reservation`, `limit`, `cpu_share`; `POST`: update an existing one
//!   (404 if unknown). A bad update gets `400` with the error naming the
//!   key and leaves the running table unchanged. `DELETE`: deletes a
//!   tenant (`204`; `404` if unknown; `400` for the default tenant and for
//!   one with a `charge_cgroup`); its hosts fall to the default tenant.
//!
//! Limits: 64 KiB bodies (413), 16 KiB request heads (431), 5 s to send
//! the head, 10 s per request (408), 64 connections at once. With
//! `[tenants] admin_token_file` every request needs
//! `Authorization: Bearer TOKEN` (401 otherwise).

use super::latency::LE_BOUNDS_US;
use super::{TenantRuntime, TenantStats, UpdateError};
use crate::admission::{Admission, Limit};
use crate::registry::Registry;
use sluice_admin::metrics::{counter, counters, gauge, gauges, histograms, Esc, HistogramSample};
use sluice_admin::prometheus_client::collector::Collector;
use sluice_admin::prometheus_client::encoding::DescriptorEncoder;
use sluice_admin::prometheus_client::registry::{Registry as MetricsRegistry, Unit};
use sluice_admin::routes::{self, TenantApi, TenantUpdateError};
use sluice_admin::schema::{self, Bucket, Latency, TenantStatsReport};
use sluice_admin::{AdminConfig, BearerToken};
use sluice_config::tenants::RawTenant;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// A running admin server (stopped when dropped).
#[derive(Debug)]
pub struct AdminServer {
    inner: sluice_admin::AdminServer,
}

/// What `POST /v1/reload` runs: re-reads the configuration file and
/// applies it; the JSON of what changed, or why nothing did.
pub type ReloadAction = Box<dyn Fn() -> Result<serde_json::Value, String> + Send + Sync>;

/// Where the reload action is installed once the target runs (empty:
/// `POST /v1/reload` answers `409`).
#[derive(Clone, Default)]
pub struct ReloadSlot(Arc<std::sync::OnceLock<ReloadAction>>);

impl ReloadSlot {
    /// Installs the action; gives it back if one is installed already.
    pub fn set(&self, action: ReloadAction) -> Result<(), ReloadAction> {
        self.0.set(action)
    }

    /// Runs the action installed, if any.
    fn run(&self) -> Result<serde_json::Value, String> {
        match self.0.get() {
            Some(action) => action(),
            None => Err(
                "this target has no configuration file to reload (started without --config)".into(),
            ),
        }
    }
}

impl std::fmt::Debug for ReloadSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadSlot")
            .field("installed", &self.0.get().is_some())
            .finish()
    }
}

impl AdminServer {
    /// Starts the endpoint on `addr` for the target's tenants and
    /// namespaces (token from `[tenants] admin_token_file`, if set).
    pub fn start(
        addr: SocketAddr,
        rt: Arc<TenantRuntime>,
        reg: Arc<Registry>,
        reload: ReloadSlot,
    ) -> io::Result<AdminServer> {
        let mut cfg = AdminConfig::new(addr);
        if let Some(p) = &rt.settings.admin_token_file {
            cfg.token = Some(BearerToken::from_file(p).map_err(io::Error::other)?);
        }
        let rt_has_token = cfg.token.is_some();
        let app = sluice_admin::compose(&cfg, parts(rt, reg, reload));
        let inner = sluice_admin::AdminServer::start(cfg, app).map_err(|e| match e {
            sluice_admin::AdminError::Listen { source, .. } => source,
            e => io::Error::other(e),
        })?;
        tracing::info!(
            addr = %inner.local_addr(),
            bearer_token = rt_has_token,
            "target admin endpoint: /metrics /v1/status /v1/stats /v1/tenants /v1/reload"
        );
        Ok(AdminServer { inner })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
}

/// The target's parts of the admin API (for [`sluice_admin::compose`]).
pub fn parts(
    rt: Arc<TenantRuntime>,
    reg: Arc<Registry>,
    reload: ReloadSlot,
) -> Vec<sluice_admin::Router> {
    let started = Instant::now();
    let mut metrics = MetricsRegistry::default();
    metrics.register_collector(Box::new(TargetCollector {
        rt: rt.clone(),
        reg,
    }));
    let status_rt = rt.clone();
    let stats_rt = rt.clone();
    vec![
        routes::metrics(Arc::new(metrics)),
        routes::get_json("/v1/status", move || {
            let t = status_rt.table();
            schema::Status {
                service: "sluice-target".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                uptime_seconds: started.elapsed().as_secs_f64(),
                workers: Some(status_rt.workers),
                tenant_table_generation: Some(t.generation),
                tenants: Some(t.iter().count()),
                exports: None,
            }
        }),
        routes::get_json("/v1/stats", move || stats_report(&stats_rt)),
        routes::post_action("/v1/reload", move || reload.run()),
        routes::tenants(Arc::new(Tenants(rt))),
    ]
}

/// The tenant table API over the running table.
#[derive(Debug)]
struct Tenants(Arc<TenantRuntime>);

impl TenantApi for Tenants {
    fn list(&self) -> serde_json::Value {
        let t = self.0.table();
        let v: Vec<_> = t.iter().map(|(_, s)| s).collect();
        serde_json::to_value(v).unwrap_or_default()
    }

    fn get(&self, name: &str) -> Option<serde_json::Value> {
        let t = self.0.table();
        let s = t.spec(t.id(name)?)?;
        serde_json::to_value(s).ok()
    }

    fn update(
        &self,
        name: &str,
        body: &str,
        create: bool,
    ) -> Result<serde_json::Value, TenantUpdateError> {
        let res = if create {
            self.0.update_json(name, body)
        } else {
            serde_json::from_str::<RawTenant>(body)
                .map_err(|e| UpdateError::Json(format!("bad tenant JSON: {e}")))
                .and_then(|raw| self.0.update(name, &raw, false))
        };
        match res {
            Ok(spec) => serde_json::to_value(spec)
                .map_err(|e| TenantUpdateError::Invalid(format!("cannot encode the tenant: {e}"))),
            Err(UpdateError::Unknown(n)) => Err(TenantUpdateError::Unknown(n)),
            Err(e) => Err(TenantUpdateError::Invalid(e.to_string())),
        }
    }

    fn delete(&self, name: &str) -> Result<(), TenantUpdateError> {
        match self.0.delete(name) {
            Ok(()) => Ok(()),
            Err(UpdateError::Unknown(n)) => Err(TenantUpdateError::Unknown(n)),
            Err(e) => Err(TenantUpdateError::Invalid(e.to_string())),
        }
    }
}

fn secs(ns: &AtomicU64) -> f64 {
    ns.load(Relaxed) as f64 / 1e9
}

/// Seconds of a bound of [`LE_BOUNDS_US`].
fn le_seconds(us: u64) -> f64 {
    us as f64 / 1e6
}

/// The latency of a tenant since start, from its merged histogram:
/// quantiles at hdrhistogram's precision and cumulative buckets at
/// [`LE_BOUNDS_US`] (so a client gets an interval's quantiles from two
/// samples: `sluice_admin::schema::interval_quantile`).
fn latency(st: &TenantStats) -> Latency {
    st.with_latency(|h| {
        let Some(h) = h else {
            return Latency {
                buckets: LE_BOUNDS_US
                    .iter()
                    .map(|&b| Bucket {
                        le_seconds: le_seconds(b),
                        count: 0,
                    })
                    .collect(),
                ..Default::default()
            };
        };
        let (counts, _) = h.bucket_counts();
        let mut cum = 0u64;
        let buckets = LE_BOUNDS_US
            .iter()
            .zip(counts)
            .map(|(&b, c)| {
                cum += c;
                Bucket {
                    le_seconds: le_seconds(b),
                    count: cum,
                }
            })
            .collect();
        Latency {
            count: h.count(),
            sum_seconds: h.sum_seconds(),
            p50_seconds: h.quantile_seconds(0.5),
            p90_seconds: h.quantile_seconds(0.9),
            p99_seconds: h.quantile_seconds(0.99),
            p999_seconds: h.quantile_seconds(0.999),
            max_seconds: h.max_seconds(),
            buckets,
        }
    })
}

/// The Prometheus sample of a tenant's latency (empty before any I/O).
fn latency_sample(st: &TenantStats) -> HistogramSample {
    st.with_latency(|h| {
        let (counts, over, count, sum) = match h {
            Some(h) => {
                let (c, o) = h.bucket_counts();
                (c, o, h.count(), h.sum_seconds())
            }
            None => ([0; LE_BOUNDS_US.len()], 0, 0, 0.0),
        };
        let mut buckets: Vec<(f64, u64)> = LE_BOUNDS_US
            .iter()
            .zip(counts)
            .map(|(&b, c)| (le_seconds(b), c))
            .collect();
        buckets.push((f64::MAX, over));
        HistogramSample {
            sum,
            count,
            buckets,
        }
    })
}

/// `GET /v1/stats`.
pub fn stats_report(rt: &TenantRuntime) -> TenantStatsReport {
    let t = rt.table();
    TenantStatsReport {
        generation: t.generation,
        unattributed_cpu_seconds: secs(&rt.unattributed_cpu_ns),
        tenants: t
            .iter()
            .map(|(id, sp)| {
                let st = rt.stats(id);
                let l = |a: &AtomicU64| a.load(Relaxed);
                schema::TenantStats {
                    name: sp.name.clone(),
                    weight: sp.weight,
                    read_ios: l(&st.read_ios),
                    write_ios: l(&st.write_ios),
                    other_ios: l(&st.other_ios),
                    read_bytes: l(&st.read_bytes),
                    write_bytes: l(&st.write_bytes),
                    errors: l(&st.errors),
                    cpu_seconds: secs(&st.cpu_ns),
                    throttle_events: l(&st.throttle_events),
                    throttle_seconds: secs(&st.throttle_ns),
                    sched_wait_seconds: secs(&st.sched_wait_ns),
                    queue_depth: u64::try_from(st.queue_depth.load(Relaxed)).unwrap_or(0),
                    latency: latency(st),
                }
            })
            .collect(),
    }
}

/// Reads the tenants' and namespaces' atomic counters at scrape time.
#[derive(Debug)]
pub struct TargetCollector {
    rt: Arc<TenantRuntime>,
    reg: Arc<Registry>,
}

impl Collector for TargetCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let rt = &self.rt;
        let t = rt.table();
        let tenants: Vec<(&str, &TenantStats, u32)> = t
            .iter()
            .map(|(id, sp)| (sp.name.as_str(), rt.stats(id), sp.weight))
            .collect();
        let l = |a: &AtomicU64| a.load(Relaxed);
        let e = &mut enc;
        counters(
            e,
            "sluice_tenant_ios",
            "I/O commands completed by the backend.",
            None,
            tenants.iter().flat_map(|(n, st, _)| {
                [
                    ("read", l(&st.read_ios)),
                    ("write", l(&st.write_ios)),
                    ("other", l(&st.other_ios)),
                ]
                .map(|(op, v)| ([("tenant", Esc(n)), ("op", Esc(op))], v))
            }),
        )?;
        counters(
            e,
            "sluice_tenant_bytes",
            "Bytes read and written.",
            None,
            tenants.iter().flat_map(|(n, st, _)| {
                [("read", l(&st.read_bytes)), ("write", l(&st.write_bytes))]
                    .map(|(op, v)| ([("tenant", Esc(n)), ("op", Esc(op))], v))
            }),
        )?;
        counters(
            e,
            "sluice_tenant_errors",
            "I/O commands completed with an error.",
            None,
            tenants
                .iter()
                .map(|(n, st, _)| ([("tenant", Esc(n))], l(&st.errors))),
        )?;
        histograms(
            e,
            "sluice_tenant_latency",
            "Scheduler arrival to backend completion.",
            Some(&Unit::Seconds),
            tenants
                .iter()
                .map(|(n, st, _)| ([("tenant", Esc(n))], latency_sample(st))),
        )?;
        for (name, help, f) in [
            (
                "sluice_tenant_cpu",
                "Worker CPU charged to the tenant.",
                (|st: &TenantStats| secs(&st.cpu_ns)) as fn(&TenantStats) -> f64,
            ),
            (
                "sluice_tenant_throttle",
                "Time the tenant's sockets were not read (CPU throttle).",
                |st: &TenantStats| secs(&st.throttle_ns),
            ),
            (
                "sluice_tenant_sched_wait",
                "Time I/Os waited in the fair scheduler.",
                |st: &TenantStats| secs(&st.sched_wait_ns),
            ),
        ] {
            counters(
                e,
                name,
                help,
                Some(&Unit::Seconds),
                tenants
                    .iter()
                    .map(|(n, st, _)| ([("tenant", Esc(n))], f(st))),
            )?;
        }
        counters(
            e,
            "sluice_tenant_throttle_events",
            "CPU throttle events.",
            None,
            tenants
                .iter()
                .map(|(n, st, _)| ([("tenant", Esc(n))], l(&st.throttle_events))),
        )?;
        gauges(
            e,
            "sluice_tenant_queue_depth",
            "I/Os queued in the scheduler plus outstanding at the backend.",
            None,
            tenants
                .iter()
                .map(|(n, st, _)| ([("tenant", Esc(n))], st.queue_depth.load(Relaxed).max(0))),
        )?;
        gauges(
            e,
            "sluice_tenant_weight",
            "Scheduler weight.",
            None,
            tenants
                .iter()
                .map(|(n, _, w)| ([("tenant", Esc(n))], i64::from(*w))),
        )?;
        counter(
            e,
            "sluice_target_unattributed_cpu",
            "Worker CPU in batches with no tenant work.",
            Some(&Unit::Seconds),
            secs(&rt.unattributed_cpu_ns),
        )?;
        gauge(
            e,
            "sluice_tenant_table_generation",
            "Generation of the running tenant table.",
            None,
            i64::try_from(t.generation).unwrap_or(i64::MAX),
        )?;
        connection_metrics(e, &self.reg.admission)?;
        auth_and_tolerance_metrics(e, &self.reg)?;
        // Per namespace (all hosts) and per host NQN.
        let mut ns = Vec::new();
        let mut sizes = Vec::new();
        let mut reservations = Vec::new();
        let subsystems = self.reg.subsystems();
        for (nqn, sub) in subsystems.iter() {
            for (nsid, n) in sub.namespaces.snapshot().iter() {
                sizes.push((
                    nqn.as_str(),
                    nsid.to_string(),
                    i64::try_from(n.size_bytes()).unwrap_or(i64::MAX),
                ));
                ns.push((
                    nqn.as_str(),
                    nsid.to_string(),
                    n.counters.snapshot(),
                    (
                        n.fences.refused(),
                        n.fences.refused_reads(),
                        rt.ns_stats.get(n.index).map_or(0, |st| l(&st.slow_ios)),
                    ),
                ));
                let (rtype, registrants) = n.reservations.summary();
                reservations.push((
                    nqn.as_str(),
                    nsid.to_string(),
                    i64::from(rtype),
                    i64::try_from(registrants).unwrap_or(i64::MAX),
                    n.reservations.refused(),
                ));
            }
        }
        gauges(
            e,
            "sluice_namespace_size_bytes",
            "Capacity now, per namespace (it grows online: a volume resized, a file namespace a reload grew).",
            None,
            sizes.iter().map(|(nqn, nsid, v)| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], *v)
            }),
        )?;
        counters(
            e,
            "sluice_namespace_ios",
            "I/O commands completed, per namespace.",
            None,
            ns.iter().flat_map(|(nqn, nsid, s, _)| {
                [
                    ("read", s.read_commands),
                    ("write", s.write_commands),
                    ("other", s.other_commands),
                ]
                .map(|(op, v)| {
                    (
                        [
                            ("subsystem", Esc(nqn)),
                            ("nsid", Esc(nsid)),
                            ("op", Esc(op)),
                        ],
                        v,
                    )
                })
            }),
        )?;
        counters(
            e,
            "sluice_namespace_bytes",
            "Bytes read and written, per namespace.",
            None,
            ns.iter().flat_map(|(nqn, nsid, s, _)| {
                [("read", s.read_bytes), ("write", s.write_bytes)].map(|(op, v)| {
                    (
                        [
                            ("subsystem", Esc(nqn)),
                            ("nsid", Esc(nsid)),
                            ("op", Esc(op)),
                        ],
                        v,
                    )
                })
            }),
        )?;
        counters(
            e,
            "sluice_namespace_errors",
            "I/O commands completed with an error, per namespace.",
            None,
            ns.iter().map(|(nqn, nsid, s, _)| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], s.errors)
            }),
        )?;
        counters(
            e,
            "sluice_namespace_stale_epoch_writes",
            "Writes refused below their granule's chain-epoch fence (Stale Chain Epoch), per namespace.",
            None,
            ns.iter().map(|(nqn, nsid, _, (writes, _, _))| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], *writes)
            }),
        )?;
        counters(
            e,
            "sluice_namespace_stale_epoch_reads",
            "Reads refused below their granule's chain-epoch fence (a reader on a map from before a remap), per namespace.",
            None,
            ns.iter().map(|(nqn, nsid, _, (_, reads, _))| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], *reads)
            }),
        )?;
        counters(
            e,
            "sluice_namespace_slow_ios",
            "Backend I/Os that took target.slow_io_ms or longer from the backend queue to completion (each piece of a split request), per namespace.",
            None,
            ns.iter().map(|(nqn, nsid, _, (_, _, slow))| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], *slow)
            }),
        )?;
        gauges(
            e,
            "sluice_namespace_reservation_type",
            "The reservation held on the namespace: its type (1 Write Exclusive ... 6 Exclusive Access - All Registrants), 0 when none.",
            None,
            reservations.iter().map(|(nqn, nsid, rtype, _, _)| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], *rtype)
            }),
        )?;
        gauges(
            e,
            "sluice_namespace_reservation_registrants",
            "Hosts registered with the namespace's reservations.",
            None,
            reservations.iter().map(|(nqn, nsid, _, regs, _)| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], *regs)
            }),
        )?;
        counters(
            e,
            "sluice_namespace_reservation_conflicts",
            "I/O commands refused with Reservation Conflict (the namespace's reservation does not let their host read or write), per namespace.",
            None,
            reservations.iter().map(|(nqn, nsid, _, _, refused)| {
                ([("subsystem", Esc(nqn)), ("nsid", Esc(nsid))], *refused)
            }),
        )?;
        let hosts = self.reg.hosts.snapshot();
        counters(
            e,
            "sluice_host_ios",
            "I/O commands completed, per host NQN.",
            None,
            hosts.iter().flat_map(|(h, s)| {
                [
                    ("read", s.read_commands),
                    ("write", s.write_commands),
                    ("other", s.other_commands),
                ]
                .map(|(op, v)| ([("hostnqn", Esc(h)), ("op", Esc(op))], v))
            }),
        )?;
        counters(
            e,
            "sluice_host_bytes",
            "Bytes read and written, per host NQN.",
            None,
            hosts.iter().flat_map(|(h, s)| {
                [("read", s.read_bytes), ("write", s.write_bytes)]
                    .map(|(op, v)| ([("hostnqn", Esc(h)), ("op", Esc(op))], v))
            }),
        )?;
        counters(
            e,
            "sluice_host_errors",
            "I/O commands completed with an error, per host NQN.",
            None,
            hosts.iter().map(|(h, s)| ([("hostnqn", Esc(h))], s.errors)),
        )?;
        // Process-wide: RAM namespaces on huge pages take their chunks from
        // the reserve's populated chunks, else from its mapped spares (a
        // small-page fault), else map one inline (the reserve is not up);
        // the reserve's thread later collapses the small-page ones.
        let h = sluice_backend::ram_huge_chunks();
        counters(
            e,
            "sluice_ram_huge_chunks",
            "2 MiB chunks RAM namespaces on huge pages took, by where they came from (reserve: populated ahead; spare: mapped ahead, faulted on small pages; inline).",
            None,
            [
                ("reserve", h.from_reserve),
                ("spare", h.from_spares),
                ("inline", h.inline),
            ]
            .map(|(from, v)| ([("from", Esc(from))], v)),
        )?;
        counters(
            e,
            "sluice_ram_huge_collapses",
            "Small-page 2 MiB chunks of RAM namespaces the reserve's thread tried to collapse onto a huge page once first writes paused, by result (failed: the kernel refused; khugepaged may still collapse them).",
            None,
            [("collapsed", h.collapsed), ("failed", h.collapse_failed)]
                .map(|(result, v)| ([("result", Esc(result))], v)),
        )?;
        gauge(
            e,
            "sluice_ram_huge_collapses_pending",
            "Small-page 2 MiB chunks of RAM namespaces queued for the reserve's thread to advise and collapse once first writes pause, or in its hands.",
            None,
            h.collapse_pending,
        )?;
        // Process-wide: reads sent straight from RAM chunks
        // (`target.ram_reads_in_place`), and the chunks a write had to copy
        // because such a read still held them.
        let r = sluice_backend::ram_shared_reads();
        counter(
            e,
            "sluice_ram_reads_in_place",
            "Reads of RAM namespaces sent straight from the namespace's memory, with no copy into a read buffer (target.ram_reads_in_place).",
            None,
            r.shared,
        )?;
        counter(
            e,
            "sluice_ram_chunks_copied_for_reads",
            "RAM chunks a write copied before changing them, because a read being sent from them still held them.",
            None,
            r.chunks_copied,
        )
    }
}

/// The writes the congestion window capped, the bytes received (and
/// received in place), the responses sent after their batch's data,
/// DH-HMAC-CHAP outcomes
/// (failures by reason; no host label, see
/// [`crate::metrics::AuthCounters`]) and the inputs accepted under
/// [`crate::tolerated`], by case.
fn auth_and_tolerance_metrics(e: &mut DescriptorEncoder, reg: &Registry) -> std::fmt::Result {
    counter(
        e,
        "sluice_target_window_capped_writes",
        "Writes to hosts' sockets that sent only what the TCP congestion window admitted and left the rest to the worker's next turns (target.send_within_cwnd).",
        None,
        reg.send.window_capped_writes(),
    )?;
    counter(
        e,
        "sluice_target_received_bytes",
        "Bytes read from hosts' sockets (PDUs and their data).",
        None,
        reg.receive.bytes(),
    )?;
    counter(
        e,
        "sluice_target_received_in_place_bytes",
        "Of the bytes read from hosts' sockets, those written straight into commands' buffers past the framer: the rest of H2CData PDUs and of Writes' in-capsule data with at least 16 KiB still to come.",
        None,
        reg.receive.in_place_bytes(),
    )?;
    counter(
        e,
        "sluice_target_responses_after_data",
        "CapsuleResps of large reads held until the data due ahead of them was written, so that a batch of reads completes together (target.send.responses_after_data).",
        None,
        reg.send
            .snapshot()
            .reason(sluice_proto::send::FlushReason::AfterData),
    )?;
    counter(
        e,
        "sluice_auth_successes",
        "DH-HMAC-CHAP transactions a host completed (every queue authenticates, and again on re-authentication).",
        None,
        reg.auth.successes(),
    )?;
    let failures = reg.auth.failures();
    counters(
        e,
        "sluice_auth_failures",
        "DH-HMAC-CHAP transactions that failed, by the reason sent to the host.",
        None,
        (0..failures.len()).map(|i| {
            let code = u8::try_from(i).unwrap_or(0);
            let reason = if i == 0 {
                "other"
            } else {
                sluice_auth::message::reason::describe(code)
            };
            ([("reason", Esc(reason))], failures[i])
        }),
    )?;
    let (applied, refused) = reg.reloads.counts();
    counters(
        e,
        "sluice_target_config_reloads",
        "Configuration files re-read on SIGHUP, by result: applied, or refused whole (unparsable, or changing what needs a restart; the log names why).",
        None,
        [
            ([("result", Esc("applied"))], applied),
            ([("result", Esc("refused"))], refused),
        ],
    )?;
    counters(
        e,
        "sluice_tolerated_inputs",
        "Inputs accepted because Linux nvmet and SPDK accept them (docs/conformance.md), by case.",
        None,
        crate::tolerated::Tolerated::ALL
            .map(|t| ([("case", Esc(t.name()))], crate::tolerated::count(t))),
    )
}

/// The connection limits: live counts, the configured limits, refusals
/// by limit and handshake timeouts (see [`crate::admission`]), and the
/// process's resident memory they bound.
fn connection_metrics(e: &mut DescriptorEncoder, adm: &Admission) -> std::fmt::Result {
    let c = adm.counts();
    gauge(
        e,
        "sluice_connections",
        "Connections open (admitted and not yet closed).",
        None,
        i64::from(c.open),
    )?;
    gauge(
        e,
        "sluice_connections_handshaking",
        "Connections accepted and not yet past their Connect command.",
        None,
        i64::from(c.handshaking),
    )?;
    gauge(
        e,
        "sluice_connection_sources",
        "Source addresses (IPv6: /64 prefixes) with an open connection.",
        None,
        i64::from(c.sources),
    )?;
    gauge(
        e,
        "sluice_connections_busiest_source",
        "Open connections of the source address with the most.",
        None,
        i64::from(c.busiest_source),
    )?;
    gauges(
        e,
        "sluice_connections_limit",
        "Configured connection limits, by config key in [target].",
        None,
        Limit::ALL.map(|l| ([("limit", Esc(l.key()))], i64::from(adm.limit(l)))),
    )?;
    counters(
        e,
        "sluice_connections_refused",
        "Sockets closed at accept because a connection limit was reached, by limit.",
        None,
        Limit::ALL.map(|l| ([("limit", Esc(l.key()))], adm.refused(l))),
    )?;
    counter(
        e,
        "sluice_handshake_timeouts",
        "Connections closed for not completing ICReq and Connect within target.handshake_timeout_ms.",
        None,
        adm.handshake_timeouts(),
    )?;
    match sluice_runtime::memory::resident_bytes() {
        Some(b) => gauge(
            e,
            "sluice_process_resident_memory",
            "Resident set size of the target process (VmRSS).",
            Some(&Unit::Bytes),
            i64::try_from(b).unwrap_or(i64::MAX),
        ),
        None => Ok(()),
    }
}

/// Renders the target's metrics as text (for logs and tests).
pub fn metrics_text(rt: Arc<TenantRuntime>, reg: Arc<Registry>) -> String {
    let mut m = MetricsRegistry::default();
    m.register_collector(Box::new(TargetCollector { rt, reg }));
    sluice_admin::metrics::encode(&m).unwrap_or_default()
}

/// A minimal blocking HTTP client for the admin endpoint (tests, tools):
/// `(status, body)`.
pub fn http_request(addr: &str, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
    let r = sluice_admin::client::request(addr, method, path, body, None)?;
    Ok((r.status, r.body))
}
