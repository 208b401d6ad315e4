//! Counters per namespace and per host (tenant): commands, bytes, errors.
//!
//! Counters are atomics looked up once at connect time, so the I/O path does
//! only relaxed increments. Later issues extend these into per-tenant
//! telemetry (latency histograms, CPU charged).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// I/O counters.
#[derive(Debug, Default)]
pub struct IoCounters {
    pub read_commands: AtomicU64,
    pub write_commands: AtomicU64,
    pub other_commands: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub errors: AtomicU64,
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

impl HostRegistry {
    pub fn counters_for(&self, hostnqn: &str) -> Arc<IoCounters> {
        let mut m = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
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
        let m = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (k.clone(), v.snapshot())).collect()
    }
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
}
