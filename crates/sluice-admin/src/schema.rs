//! JSON documents of the admin API (server side and `sluice top`).
//!
//! Field names are the API: add fields (with `#[serde(default)]` so older
//! servers still decode), do not rename them.

use serde::{Deserialize, Serialize};

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Status {
    /// `sluice-target`, `sluice-nbd`, `sluice-fuse`.
    pub service: String,
    pub version: String,
    pub uptime_seconds: f64,
    /// Target: worker threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Target: generation of the running tenant table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_table_generation: Option<u64>,
    /// Target: number of tenants; exporter: number of exports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exports: Option<usize>,
}

/// One latency bucket: `count` I/Os took at most `le_seconds` (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub le_seconds: f64,
    pub count: u64,
}

/// A latency distribution since start: totals, quantiles, and cumulative
/// buckets at fixed bounds (the implicit last bucket, +Inf, holds `count`),
/// so a client can compute quantiles of an interval from two samples with
/// [`interval_quantile`]. The target fills it from hdrhistogram: the
/// quantiles are exact to 3 significant digits, the buckets are at the
/// `le` bounds of `sluice_tenant_latency_seconds` (`docs/tenants.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Latency {
    pub count: u64,
    pub sum_seconds: f64,
    #[serde(default)]
    pub p50_seconds: Option<f64>,
    #[serde(default)]
    pub p90_seconds: Option<f64>,
    #[serde(default)]
    pub p99_seconds: Option<f64>,
    #[serde(default)]
    pub p999_seconds: Option<f64>,
    #[serde(default)]
    pub max_seconds: Option<f64>,
    #[serde(default)]
    pub buckets: Vec<Bucket>,
}

/// Counters of one tenant (cumulative since the target started).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TenantStats {
    pub name: String,
    pub weight: u32,
    pub read_ios: u64,
    pub write_ios: u64,
    pub other_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    pub cpu_seconds: f64,
    pub throttle_events: u64,
    pub throttle_seconds: f64,
    pub sched_wait_seconds: f64,
    /// Queued in the scheduler plus outstanding at the backend (now).
    pub queue_depth: u64,
    pub latency: Latency,
}

impl TenantStats {
    pub fn ios(&self) -> u64 {
        self.read_ios + self.write_ios + self.other_ios
    }
    pub fn bytes(&self) -> u64 {
        self.read_bytes + self.write_bytes
    }
}

/// `GET /v1/stats` of a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TenantStatsReport {
    pub generation: u64,
    pub unattributed_cpu_seconds: f64,
    pub tenants: Vec<TenantStats>,
}

/// Counters of one export (cumulative).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ExportStats {
    pub name: String,
    pub hostnqn: String,
    #[serde(default)]
    pub cpu_share: Option<f64>,
    pub ios: u64,
    pub bytes: u64,
    pub cpu_seconds: f64,
    pub queue_cpu_seconds: f64,
    pub throttle_events: u64,
    pub throttle_seconds: f64,
    /// NBD connections per path, and the requests of run-to-completion
    /// connections by where they ran (0 for FUSE).
    #[serde(default)]
    pub nbd_direct_connections: u64,
    #[serde(default)]
    pub nbd_task_connections: u64,
    #[serde(default)]
    pub nbd_direct_requests: u64,
    #[serde(default)]
    pub nbd_handed_off_requests: u64,
    /// A FUSE session of our own (`--transport uring`): requests over the
    /// ring and over `/dev/fuse`, block I/Os on the ring's own queue (0
    /// for NBD and for the fuser session).
    #[serde(default)]
    pub fuse_ring_requests: u64,
    #[serde(default)]
    pub fuse_dev_requests: u64,
    #[serde(default)]
    pub fuse_direct_ios: u64,
    /// Of those, reads received straight into the ring's reply buffer.
    #[serde(default)]
    pub fuse_reads_in_place: u64,
}

/// `GET /v1/exports` of an exporter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ExportsReport {
    pub unattributed_cpu_seconds: f64,
    pub exports: Vec<ExportStats>,
}

/// Upper bound of quantile `q` of the I/Os recorded between two samples of
/// one distribution (`prev` may be empty: since start): the first bucket
/// bound under which at least `q` of the interval's I/Os fall. `None`
/// without I/Os in between; `f64::INFINITY` if the quantile is beyond the
/// last finite bucket.
pub fn interval_quantile(prev: &Latency, cur: &Latency, q: f64) -> Option<f64> {
    let total = cur.count.checked_sub(prev.count).filter(|t| *t > 0)?;
    // At least 1; a float to integer cast saturates (q > 1 asks for more
    // I/Os than there are: no bucket reaches it).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let want = (q * total as f64).ceil().max(1.0) as u64;
    for b in &cur.buckets {
        let before = prev
            .buckets
            .iter()
            .find(|p| p.le_seconds == b.le_seconds)
            .map_or(0, |p| p.count);
        if b.count.saturating_sub(before) >= want {
            return Some(b.le_seconds);
        }
    }
    Some(f64::INFINITY)
}
