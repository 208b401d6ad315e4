//! The I/O layer: listeners, worker threads and their event loops.
//!
//! An acceptor thread accepts connections on the I/O and discovery ports and
//! hands each to a worker, round robin. Each worker owns its connections
//! (mio, edge-triggered), one backend queue per namespace it touches, and
//! drives the sans-IO [`QueueConnection`](crate::queue::QueueConnection)s:
//! read → process → submit backend I/O → poll completions → run timers →
//! write. The clock is read once per loop iteration and passed down.
//!
//! Polling policy (config `target.polling`): `interrupt` sleeps in epoll
//! until a socket, a completion fd or a timer is due; `busy-poll` never
//! sleeps; `adaptive` polls for `adaptive_spin_us` after the last work, then
//! sleeps. Each worker reports the CPU time its thread used.
//!
//! * this file: [`Target`], [`TargetHandle`] (the public API: addresses,
//!   tenants, graceful shutdown) and the reports;
//! * `start`: start-up (registry, tenants, listeners, worker and acceptor
//!   threads);
//! * `acceptor`: the acceptor thread (admission against the connection
//!   limits of [`crate::admission`]);
//! * `worker`: a worker's mio loop (polling policy, placement of I/O
//!   queues, backend submissions and completions, drain and final flush);
//! * `conn`: one connection's socket reads and writes;
//! * `cpu_sampling`: when a worker reads its thread CPU clock (i-NVMe
//!   accounting), and what part of a reading is idle spin;
//!
//! Waiting (the polling policy and the timerfd that makes sub-millisecond
//! sleeps precise) and the CPU clocks come from `sluice-runtime`, shared with
//! the host side.

mod acceptor;
mod conn;
mod cpu_sampling;
mod start;
mod worker;

use sluice_runtime::clock::process_cpu;

use crate::registry::{Registry, RegistryError};
use crate::tenant::admin::AdminServer;
use crate::tenant::TenantRuntime;
use mio::{Token, Waker};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Errors starting the target.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: io::Error },
    #[error("cannot start worker threads: {0}")]
    Thread(io::Error),
    #[error("target.tcp_congestion: cannot use `{name}` on {addr}: {source}; this kernel offers: {available}")]
    TcpCongestion {
        name: String,
        addr: SocketAddr,
        available: String,
        source: io::Error,
    },
}

/// CPU and activity of one worker thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkerReport {
    pub worker: usize,
    pub cpu: Duration,
    pub wall: Duration,
    pub loops: u64,
    pub connections: u64,
}

/// What the target did, reported at shutdown.
#[derive(Debug, Clone, Default)]
pub struct ShutdownReport {
    pub workers: Vec<WorkerReport>,
    /// CPU (user + system) of the whole process.
    pub process_cpu: Duration,
    /// Send path and coalescing totals of every queue (PDUs, write calls,
    /// flushes by reason, container waits, response deliveries).
    pub send: sluice_proto::send::SendStats,
    /// Read and Write commands served (for per-I/O ratios).
    pub io_commands: u64,
}

/// Starts targets.
#[derive(Debug)]
pub struct Target;

/// A running target.
#[derive(Debug)]
pub struct TargetHandle {
    reg: Arc<Registry>,
    shutdown: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
    workers: Vec<JoinHandle<WorkerReport>>,
    acceptor: Option<JoinHandle<()>>,
    acceptor_waker: Arc<Waker>,
    local_addr: SocketAddr,
    discovery_addr: Option<SocketAddr>,
    started: Instant,
    tenants: Arc<TenantRuntime>,
    admin: Option<AdminServer>,
    /// What the admin endpoint's `POST /v1/reload` runs, once installed.
    reload_action: crate::tenant::admin::ReloadSlot,
    charging: Option<crate::tenant::cpu::ChargeAgents>,
    io_queues: Arc<Vec<AtomicUsize>>,
}

/// Every poll's waker (acceptor and workers).
const WAKER: Token = Token(0);
/// Connections per worker.
pub const CONNECTIONS_PER_WORKER_MAX: usize = 4096;

/// One namespace's cumulative data I/O at this target (all hosts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceCounters {
    pub nqn: String,
    pub nsid: u32,
    pub ios: u64,
    pub write_ios: u64,
    pub bytes: u64,
    /// Arrival at the target to completion, summed.
    pub latency_us_sum: u64,
}

impl TargetHandle {
    /// Every namespace's reads and writes since start (cheap: atomics),
    /// for a view agent.
    pub fn namespace_counters(&self) -> Vec<NamespaceCounters> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = Vec::new();
        for (nqn, sub) in self.reg.subsystems().iter() {
            for (nsid, ns) in sub.namespaces.snapshot().iter() {
                let Some(st) = self.tenants.ns_stats.get(ns.index) else {
                    continue;
                };
                out.push(NamespaceCounters {
                    nqn: nqn.clone(),
                    nsid: *nsid,
                    ios: st.ios.load(Relaxed),
                    write_ios: st.write_ios.load(Relaxed),
                    bytes: st.bytes.load(Relaxed),
                    latency_us_sum: st.latency_us_sum.load(Relaxed),
                });
            }
        }
        out
    }

    /// Address the I/O port is bound to (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
    pub fn discovery_addr(&self) -> Option<SocketAddr> {
        self.discovery_addr
    }
    pub fn registry(&self) -> &Arc<Registry> {
        &self.reg
    }
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
    /// Applies a new configuration's subsystems (added, removed), their
    /// access (hosts, `allow_any_host`, DH-HMAC-CHAP) and tenants; refuses
    /// a file that changes anything else (`reload.rs`). An added `volume`
    /// namespace cannot be opened (see [`TargetHandle::reload_with`]).
    pub fn reload(
        &self,
        config: &sluice_config::Config,
    ) -> Result<crate::reload::ReloadReport, crate::reload::ReloadError> {
        self.reload_with(config, &crate::registry::NoVolumes)
    }

    /// [`TargetHandle::reload`], opening the `volume` namespaces of added
    /// subsystems through `volumes`.
    pub fn reload_with(
        &self,
        config: &sluice_config::Config,
        volumes: &dyn crate::registry::VolumeOpener,
    ) -> Result<crate::reload::ReloadReport, crate::reload::ReloadError> {
        crate::reload::reload_with(&self.reg, &self.tenants, config, volumes)
    }
    /// Installs what the admin endpoint's `POST /v1/reload` runs (the
    /// owner of the configuration file re-reads it and calls
    /// [`crate::reload::reload_with`]); only the first call counts.
    pub fn set_reload_action(&self, action: crate::tenant::admin::ReloadAction) {
        if self.reload_action.set(action).is_err() {
            tracing::warn!("reload action installed twice; keeping the first");
        }
    }

    /// Tenant table, counters and run-time updates.
    pub fn tenants(&self) -> &Arc<TenantRuntime> {
        &self.tenants
    }
    /// Live I/O queues on each worker (placed after their Connect).
    pub fn io_queues_per_worker(&self) -> Vec<usize> {
        self.io_queues
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Open connections now (in total, in the handshake, per source).
    pub fn connections(&self) -> crate::admission::ConnectionCounts {
        self.reg.admission.counts()
    }

    /// Address of the admin endpoint, when configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr())
    }

    /// Graceful shutdown: stop accepting, let in-flight commands finish and
    /// their responses reach the hosts (bounded by `shutdown_drain_ms`),
    /// flush every backend, join the threads.
    pub fn shutdown(mut self) -> ShutdownReport {
        self.shutdown.store(true, Ordering::Release);
        let _ = self.acceptor_waker.wake();
        for w in &self.wakers {
            let _ = w.wake();
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let mut report = ShutdownReport::default();
        for h in self.workers.drain(..) {
            if let Ok(r) = h.join() {
                report.workers.push(r);
            }
        }
        if let Some(c) = self.charging.take() {
            c.stop();
        }
        report.process_cpu = process_cpu();
        report.send = self.reg.send.snapshot();
        report.io_commands = self.io_commands();
        report
    }

    /// Send path and coalescing totals so far (live queues as of their
    /// worker's last publish, see [`crate::metrics::SendTotals`]).
    pub fn send_totals(&self) -> sluice_proto::send::SendStats {
        self.reg.send.snapshot()
    }

    /// Writes to hosts' sockets that sent only what the congestion window
    /// admitted (`target.send_within_cwnd`).
    pub fn window_capped_writes(&self) -> u64 {
        self.reg.send.window_capped_writes()
    }

    /// Read and Write commands served so far, all hosts.
    pub fn io_commands(&self) -> u64 {
        self.reg
            .hosts
            .snapshot()
            .iter()
            .map(|(_, s)| s.read_commands + s.write_commands)
            .sum()
    }
}
