//! `[target]`: listeners, workers, the polling policy, PDU and queue limits,
//! and the target's send path.

use serde::{Deserialize, Serialize};
use sluice_proto::send::SendConfig;
use std::collections::HashMap;
use std::net::SocketAddr;

pub use sluice_runtime::polling::ADAPTIVE_SPIN_US_DEFAULT;
use sluice_runtime::PollingPolicy;

/// Settings of the whole target.
///
/// (De)serialized as the `[target]` table; the per-subsystem send
/// overrides (`subsystem_send`) are written with their subsystems by
/// [`crate::Config`] and are not part of this table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "crate::file::TargetFile", into = "crate::file::TargetFile")]
pub struct TargetSettings {
    pub listen: SocketAddr,
    pub discovery_listen: Option<SocketAddr>,
    pub advertise_addr: Option<String>,
    pub advertise_port: Option<u16>,
    pub workers: usize,
    pub polling: PollingPolicy,
    /// In-capsule data accepted on I/O queues (IOCCSZ = 4 + this / 16).
    pub inline_data_bytes: u32,
    /// Largest H2CData payload (MAXH2CDATA).
    pub max_h2c_data_bytes: u32,
    /// Largest C2HData payload we send in one PDU.
    pub max_c2h_data_bytes: u32,
    /// Maximum data transfer size; a power of two multiple of 4 KiB.
    pub mdts_bytes: u32,
    /// Largest queue depth a Connect may ask for (CAP.MQES + 1).
    pub queue_depth_max: u16,
    pub io_queues_max: u16,
    /// Extra time past KATO before a controller is failed.
    pub kato_grace_ms: u32,
    /// How long graceful shutdown waits for in-flight commands.
    pub shutdown_drain_ms: u64,
    /// Send path of every queue (`send_scheduler`, `[target.send]`,
    /// `[target.coalescing]`); see docs/isolation.md.
    pub send: SendConfig,
    /// Per-subsystem overrides of `send`, by NQN.
    pub subsystem_send: HashMap<String, SendConfig>,
}

impl Default for TargetSettings {
    fn default() -> Self {
        TargetSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], sluice_proto::DEFAULT_PORT)),
            discovery_listen: Some(SocketAddr::from((
                [127, 0, 0, 1],
                sluice_proto::DISCOVERY_PORT,
            ))),
            advertise_addr: None,
            advertise_port: None,
            workers: 1,
            polling: PollingPolicy::Adaptive {
                spin_us: ADAPTIVE_SPIN_US_DEFAULT,
            },
            inline_data_bytes: 8192,
            max_h2c_data_bytes: 128 * 1024,
            max_c2h_data_bytes: 128 * 1024,
            mdts_bytes: 1024 * 1024,
            queue_depth_max: 128,
            io_queues_max: 8,
            kato_grace_ms: 500,
            shutdown_drain_ms: 5000,
            send: SendConfig::default(),
            subsystem_send: HashMap::new(),
        }
    }
}

/// Builder-style setters (validated by [`crate::Config::validated`]).
impl TargetSettings {
    pub fn with_listen(mut self, a: SocketAddr) -> Self {
        self.listen = a;
        self
    }
    /// `None` disables the discovery port.
    pub fn with_discovery_listen(mut self, a: Option<SocketAddr>) -> Self {
        self.discovery_listen = a;
        self
    }
    pub fn with_advertise(mut self, addr: Option<String>, port: Option<u16>) -> Self {
        self.advertise_addr = addr;
        self.advertise_port = port;
        self
    }
    pub fn with_workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }
    pub fn with_polling(mut self, p: PollingPolicy) -> Self {
        self.polling = p;
        self
    }
    pub fn with_inline_data_bytes(mut self, n: u32) -> Self {
        self.inline_data_bytes = n;
        self
    }
    pub fn with_max_h2c_data_bytes(mut self, n: u32) -> Self {
        self.max_h2c_data_bytes = n;
        self
    }
    pub fn with_max_c2h_data_bytes(mut self, n: u32) -> Self {
        self.max_c2h_data_bytes = n;
        self
    }
    pub fn with_mdts_bytes(mut self, n: u32) -> Self {
        self.mdts_bytes = n;
        self
    }
    pub fn with_queue_depth_max(mut self, n: u16) -> Self {
        self.queue_depth_max = n;
        self
    }
    pub fn with_io_queues_max(mut self, n: u16) -> Self {
        self.io_queues_max = n;
        self
    }
    pub fn with_kato_grace_ms(mut self, n: u32) -> Self {
        self.kato_grace_ms = n;
        self
    }
    pub fn with_shutdown_drain_ms(mut self, n: u64) -> Self {
        self.shutdown_drain_ms = n;
        self
    }
    pub fn with_send(mut self, s: SendConfig) -> Self {
        self.send = s;
        self
    }
    /// The send path of subsystem `nqn` (overrides [`Self::with_send`]).
    pub fn with_subsystem_send(mut self, nqn: impl Into<String>, s: SendConfig) -> Self {
        self.subsystem_send.insert(nqn.into(), s);
        self
    }
}
