//! Counters per namespace and per host (tenant): commands, bytes, errors.
//!
//! Counters are atomics looked up once at connect time, so the I/O path does
//! only relaxed increments. Later issues extend these into per-tenant
//! telemetry (latency histograms, CPU charged).

use sluice_runtime::sync::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use sluice_proto::send::SendStats;

/// I/O counters.
#[derive(Debug, Default)]
pub struct IoCounters {
    pub(crate) read_commands: AtomicU64,
    pub(crate) write_commands: AtomicU64,
    pub(crate) other_commands: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
    pub(crate) errors: AtomicU64,
}

/// A point-in-time copy of [`IoCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoSnapshot {
    pub read_commands: u64,
    pub write_commands: u64,
    pub other_commands: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
}

impl IoCounters {
    pub fn record_read(&self, bytes: u64) {
        self.read_commands.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(bytes, Relaxed);
    }
    pub fn record_write(&self, bytes: u64) {
        self.write_commands.fetch_add(1, Relaxed);
        self.write_bytes.fetch_add(bytes, Relaxed);
    }
    pub fn record_other(&self) {
        self.other_commands.fetch_add(1, Relaxed);
    }
    pub fn record_error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }
    pub fn snapshot(&self) -> IoSnapshot {
        IoSnapshot {
            read_commands: self.read_commands.load(Relaxed),
            write_commands: self.write_commands.load(Relaxed),
            other_commands: self.other_commands.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
        }
    }
}

/// Per-host counters, created on first connect of a host NQN.
#[derive(Debug, Default)]
pub struct HostRegistry {
    hosts: Mutex<BTreeMap<String, Arc<IoCounters>>>,
}

/// Most distinct host NQNs tracked; beyond it hosts share one overflow entry.
pub const TRACKED_HOSTS_MAX: usize = 4096;

/// The per-host label of hosts that connected with an empty host NQN.
pub const ANONYMOUS_HOST: &str = "(anonymous)";

impl HostRegistry {
    /// The counters of `hostnqn`; an empty NQN counts as [`ANONYMOUS_HOST`].
    pub fn counters_for(&self, hostnqn: &str) -> Arc<IoCounters> {
        let hostnqn = if hostnqn.is_empty() {
            ANONYMOUS_HOST
        } else {
            hostnqn
        };
        let mut m = lock(&self.hosts);
        if let Some(c) = m.get(hostnqn) {
            return c.clone();
        }
        let key = if m.len() >= TRACKED_HOSTS_MAX {
            "(other hosts)".to_string()
        } else {
            hostnqn.to_string()
        };
        m.entry(key).or_default().clone()
    }

    pub fn snapshot(&self) -> Vec<(String, IoSnapshot)> {
        let m = lock(&self.hosts);
        m.iter().map(|(k, v)| (k.clone(), v.snapshot())).collect()
    }
}

/// Target-wide send path and coalescing totals: the sum of every
/// queue's [`SendStats`]. Workers add a connection's counters when it is
/// removed and publish the running sum of their live connections every
/// [`SEND_PUBLISH_INTERVAL`], so [`SendTotals::snapshot`] lags live queues by
/// at most that interval and is exact once the connections are gone.
#[derive(Debug, Default)]
pub struct SendTotals {
    closed: Mutex<SendStats>,
    /// Per worker: the counters of its live connections at the last publish.
    live: Mutex<BTreeMap<usize, SendStats>>,
    /// Writes that sent only what the congestion window admitted
    /// (`target.send_within_cwnd`), all connections.
    window_capped_writes: std::sync::atomic::AtomicU64,
}

/// How often a worker publishes its live connections' send counters.
pub const SEND_PUBLISH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

impl SendTotals {
    /// Counts a write the congestion window capped.
    pub fn add_window_capped_write(&self) {
        self.window_capped_writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    /// Writes the congestion window capped so far.
    pub fn window_capped_writes(&self) -> u64 {
        self.window_capped_writes
            .load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Adds the final counters of a removed connection.
    pub fn add_closed(&self, s: &SendStats) {
        lock(&self.closed).add(s);
    }
    /// Replaces `worker`'s live sum.
    pub fn publish_live(&self, worker: usize, s: SendStats) {
        lock(&self.live).insert(worker, s);
    }
    /// Closed connections plus the last published live sums.
    pub fn snapshot(&self) -> SendStats {
        let mut t = *lock(&self.closed);
        for s in lock(&self.live).values() {
            t.add(s);
        }
        t
    }
}

/// Target-wide receive totals: bytes read from hosts' sockets, and the
/// part of them the socket wrote straight into commands' buffers past
/// the framer (the rest of large H2CData PDUs and of Writes' large
/// in-capsule data). Workers add after each socket's reads.
#[derive(Debug, Default)]
pub struct ReceiveTotals {
    bytes: AtomicU64,
    in_place_bytes: AtomicU64,
}

impl ReceiveTotals {
    /// Counts `bytes` read, `in_place_bytes` of them in place.
    pub fn add(&self, bytes: u64, in_place_bytes: u64) {
        debug_assert!(in_place_bytes <= bytes, "more bytes in place than read");
        if bytes > 0 {
            self.bytes.fetch_add(bytes, Relaxed);
        }
        if in_place_bytes > 0 {
            self.in_place_bytes.fetch_add(in_place_bytes, Relaxed);
        }
    }
    /// Bytes read from hosts' sockets so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }
    /// Of [`Self::bytes`], those written straight into commands' buffers.
    pub fn in_place_bytes(&self) -> u64 {
        self.in_place_bytes.load(Relaxed)
    }
}

/// Human summary of send totals; `ios` = Read/Write commands served.
pub fn send_summary(s: &SendStats, ios: u64) -> String {
    use sluice_proto::send::FLUSH_REASON_NAMES;
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let mut out = format!(
        "send path: {} PDUs, {} flushes ({:.2} PDUs/flush), {} sends ({:.3}/I/O), {} notifications ({:.3}/I/O), {} I/Os",
        s.pdus,
        s.flushes,
        per(s.flush_pdus, s.flushes),
        s.sends,
        per(s.sends, ios),
        s.notifications,
        per(s.notifications, ios),
        ios
    );
    out.push_str("\n  flush reasons:");
    for (i, n) in s.reasons.iter().enumerate() {
        if *n > 0 {
            out.push_str(&format!(" {}={n}", FLUSH_REASON_NAMES[i]));
        }
    }
    out.push_str(&format!(
        "\n  freight wait: latency {:.2} us mean over {} PDUs, data {:.2} us mean over {} PDUs; coalescer held {:.2} us per notification",
        per(s.wait_ns_latency, s.waited_latency) / 1000.0,
        s.waited_latency,
        per(s.wait_ns_data, s.waited_data) / 1000.0,
        s.waited_data,
        per(s.coalesce_held_ns, s.notifications) / 1000.0
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_share_counters_by_nqn() {
        let r = HostRegistry::default();
        r.counters_for("nqn.a").record_read(4096);
        r.counters_for("nqn.a").record_write(512);
        r.counters_for("nqn.b").record_error();
        let s = r.snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].1.read_bytes, 4096);
        assert_eq!(s[0].1.write_commands, 1);
        assert_eq!(s[1].1.errors, 1);
    }

    #[test]
    fn send_totals_sum_closed_and_live() {
        let t = SendTotals::default();
        let a = SendStats {
            pdus: 3,
            sends: 1,
            flushes: 1,
            flush_pdus: 3,
            ..Default::default()
        };
        t.add_closed(&a);
        t.publish_live(0, a);
        t.publish_live(1, a);
        t.publish_live(0, SendStats::default());
        let s = t.snapshot();
        assert_eq!(s.pdus, 6);
        assert_eq!(s.flush_pdus, 6);
        assert!(send_summary(&s, 2).contains("2 sends (1.000/I/O)"));
    }
}

/// DH-HMAC-CHAP outcomes, target-wide. No host label: before a host has
/// authenticated, its NQN is a claim, and a label per claimed NQN would let
/// a stranger grow the metric without bound.
#[derive(Debug, Default)]
pub struct AuthCounters {
    successes: AtomicU64,
    /// By explanation code (`sluice_auth::message::reason`, 1..=7); 0
    /// counts codes outside that range.
    failures: [AtomicU64; AUTH_REASONS],
}

/// Explanation codes counted apart (0 = any other).
pub const AUTH_REASONS: usize = 8;

/// Configuration reloads (`reload.rs`): files applied, and files refused
/// (unparsable, or changing what needs a restart), for an alert on the
/// latter.
#[derive(Debug, Default)]
pub struct ReloadCounters {
    applied: AtomicU64,
    refused: AtomicU64,
}

impl ReloadCounters {
    pub fn record(&self, applied: bool) {
        let c = if applied {
            &self.applied
        } else {
            &self.refused
        };
        c.fetch_add(1, Relaxed);
    }

    /// (applied, refused).
    pub fn counts(&self) -> (u64, u64) {
        (self.applied.load(Relaxed), self.refused.load(Relaxed))
    }
}

impl AuthCounters {
    pub fn record_success(&self) {
        self.successes.fetch_add(1, Relaxed);
    }

    pub fn record_failure(&self, explanation: u8) {
        let i = usize::from(explanation);
        let i = if i < AUTH_REASONS { i } else { 0 };
        self.failures[i].fetch_add(1, Relaxed);
    }

    pub fn successes(&self) -> u64 {
        self.successes.load(Relaxed)
    }

    /// Failures by explanation code (index 0: codes outside 1..=7).
    pub fn failures(&self) -> [u64; AUTH_REASONS] {
        std::array::from_fn(|i| self.failures[i].load(Relaxed))
    }
}

#[cfg(test)]
mod auth_counter_tests {
    use super::*;

    #[test]
    fn failures_count_by_reason_and_out_of_range_codes_fold_to_zero() {
        let c = AuthCounters::default();
        c.record_success();
        c.record_failure(1);
        c.record_failure(1);
        c.record_failure(6);
        c.record_failure(200);
        assert_eq!(c.successes(), 1);
        assert_eq!(c.failures(), [1, 2, 0, 0, 0, 0, 1, 0]);
    }
}
