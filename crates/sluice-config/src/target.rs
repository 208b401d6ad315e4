//! `[target]`: listeners, workers, the polling policy, PDU and queue limits,
//! connection admission limits and the handshake timeout, and the target's
//! send path; the table as written ([`TargetFile`]) and its
//! validation into [`TargetSettings`] (every error names the key, e.g.
//! `target.mdts_bytes`), and back.

use crate::send::{self, RawCoalescing, RawSend};
use crate::size::SizeValue;
use crate::{
    bytes, err, ranged_as, ConfigError, CONNECTIONS_MAX, HANDSHAKE_TIMEOUT_MS_MAX,
    INLINE_DATA_BYTES_MAX, IO_QUEUES_MAX, MDTS_BYTES_MAX, QUEUE_DEPTH_MAX, SLOW_IO_MS_MAX,
    WORKERS_MAX, WRITE_ZEROES_BYTES_MAX,
};
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
#[serde(try_from = "TargetFile", into = "TargetFile")]
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
    /// Largest Write Zeroes (WZSL in the NVM Identify Controller), a power
    /// of two from 8 KiB (WZSL counts 2^n 4 KiB pages, and 0 means no
    /// limit); `None`: only NLB's 65536 blocks bound it.
    /// Longer ones are refused with Invalid Field. A cap bounds how long one
    /// command holds a slow backend.
    pub write_zeroes_bytes_max: Option<u64>,
    /// Largest queue depth a Connect may ask for (CAP.MQES + 1).
    pub queue_depth_max: u16,
    pub io_queues_max: u16,
    /// Extra time past KATO before a controller is failed.
    pub kato_grace_ms: u32,
    /// How long graceful shutdown waits for in-flight commands.
    pub shutdown_drain_ms: u64,
    /// Connections open at once, all sources (default
    /// [`CONNECTIONS_MAX_DEFAULT`]). A socket over a limit is closed by
    /// the acceptor before anything is allocated for it.
    pub connections_max: u32,
    /// Connections open at once from one source IP address (default
    /// [`CONNECTIONS_PER_SOURCE_MAX_DEFAULT`]).
    pub connections_per_source_max: u32,
    /// Connections accepted and not yet past their Connect command, all
    /// sources (default [`CONNECTIONS_HANDSHAKING_MAX_DEFAULT`]).
    pub connections_handshaking_max: u32,
    /// Connections from one source IP address still in their handshake
    /// (default [`CONNECTIONS_HANDSHAKING_PER_SOURCE_MAX_DEFAULT`]), so one
    /// address cannot hold every handshake slot.
    pub connections_handshaking_per_source_max: u32,
    /// A connection that has not completed ICReq and Connect this long
    /// after it was accepted is closed (default
    /// [`HANDSHAKE_TIMEOUT_MS_DEFAULT`]).
    pub handshake_timeout_ms: u32,
    /// A backend I/O (read, write or flush handed to a namespace's backend)
    /// that takes this long or longer is counted in
    /// `sluice_namespace_slow_ios_total` and logged (one WARN line per
    /// namespace per worker per 10 s) (default [`SLOW_IO_MS_DEFAULT`]).
    pub slow_io_ms: u32,
    /// RAM namespaces send reads of 4 KiB or more straight from their
    /// memory, with no copy into a read buffer (default true); a write
    /// into memory such a read still holds copies its chunk first. See
    /// docs/target.md for where each setting is faster.
    pub ram_reads_in_place: bool,
    /// A write of more than 256 KiB to a host's socket sends at most what
    /// the congestion window admits (64 KiB at least) and leaves the rest
    /// to the worker's next turns, rather than to the acknowledgements'
    /// processing, often on the host's CPU (default true; docs/target.md,
    /// *Sends within the congestion window*).
    pub send_within_cwnd: bool,
    /// TCP congestion control of every socket the target accepts (set on
    /// its listeners, which pass it on); `None`: the system's default. Its
    /// name is checked here; whether the kernel has it, at start. See
    /// docs/target.md (*Congestion control*).
    pub tcp_congestion: Option<String>,
    /// Send path of every queue (`send_scheduler`, `[target.send]`,
    /// `[target.coalescing]`); see docs/isolation.md.
    pub send: SendConfig,
    /// Per-subsystem overrides of `send`, by NQN.
    pub subsystem_send: HashMap<String, SendConfig>,
}

/// Default of `target.connections_max`.
pub const CONNECTIONS_MAX_DEFAULT: u32 = 4096;
/// Default of `target.connections_per_source_max`: one host with a few
/// controllers of many I/O queues each, or a few hosts behind one NAT.
pub const CONNECTIONS_PER_SOURCE_MAX_DEFAULT: u32 = 512;
/// Default of `target.connections_handshaking_max`: a Linux host opens
/// (and sends ICReq on) all its I/O queues before it connects them one by
/// one, so this must hold a few hosts' queues at once.
pub const CONNECTIONS_HANDSHAKING_MAX_DEFAULT: u32 = 256;
/// Default of `target.connections_handshaking_per_source_max`: a Linux host
/// with 64 I/O queues opens 65 sockets before it connects them; a quarter of
/// the default handshake slots.
pub const CONNECTIONS_HANDSHAKING_PER_SOURCE_MAX_DEFAULT: u32 = 72;
/// Default of `target.handshake_timeout_ms`.
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u32 = 10_000;
/// Default of `target.slow_io_ms`: 1 s, hundreds of times what a healthy
/// SSD or file takes, short of what a host's I/O timeout (30 s on Linux)
/// would turn into a reset.
pub const SLOW_IO_MS_DEFAULT: u32 = 1_000;

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
            write_zeroes_bytes_max: None,
            queue_depth_max: 128,
            io_queues_max: 8,
            kato_grace_ms: 500,
            shutdown_drain_ms: 5000,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_source_max: CONNECTIONS_PER_SOURCE_MAX_DEFAULT,
            connections_handshaking_max: CONNECTIONS_HANDSHAKING_MAX_DEFAULT,
            connections_handshaking_per_source_max: CONNECTIONS_HANDSHAKING_PER_SOURCE_MAX_DEFAULT,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT,
            slow_io_ms: SLOW_IO_MS_DEFAULT,
            ram_reads_in_place: true,
            send_within_cwnd: true,
            tcp_congestion: None,
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
    pub fn with_write_zeroes_bytes_max(mut self, n: Option<u64>) -> Self {
        self.write_zeroes_bytes_max = n;
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
    pub fn with_connections_max(mut self, n: u32) -> Self {
        self.connections_max = n;
        self
    }
    pub fn with_connections_per_source_max(mut self, n: u32) -> Self {
        self.connections_per_source_max = n;
        self
    }
    pub fn with_connections_handshaking_max(mut self, n: u32) -> Self {
        self.connections_handshaking_max = n;
        self
    }
    pub fn with_connections_handshaking_per_source_max(mut self, n: u32) -> Self {
        self.connections_handshaking_per_source_max = n;
        self
    }
    pub fn with_handshake_timeout_ms(mut self, n: u32) -> Self {
        self.handshake_timeout_ms = n;
        self
    }
    pub fn with_slow_io_ms(mut self, n: u32) -> Self {
        self.slow_io_ms = n;
        self
    }
    pub fn with_ram_reads_in_place(mut self, on: bool) -> Self {
        self.ram_reads_in_place = on;
        self
    }
    pub fn with_send_within_cwnd(mut self, on: bool) -> Self {
        self.send_within_cwnd = on;
        self
    }
    pub fn with_tcp_congestion(mut self, name: Option<&str>) -> Self {
        self.tcp_congestion = name.map(str::to_owned);
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

/// `[target]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discovery_listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) advertise_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) advertise_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) workers: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) polling: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) adaptive_spin_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) inline_data_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_h2c_data_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_c2h_data_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mdts_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write_zeroes_bytes_max: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) queue_depth_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) io_queues_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kato_grace_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shutdown_drain_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) connections_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) connections_per_source_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) connections_handshaking_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) connections_handshaking_per_source_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) handshake_timeout_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) slow_io_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ram_reads_in_place: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send_within_cwnd: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tcp_congestion: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send_scheduler: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send: Option<RawSend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) coalescing: Option<RawCoalescing>,
}

fn parse_addr(key: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| {
        err(
            key,
            format!("`{s}` is not an address:port such as 127.0.0.1:4420"),
        )
    })
}

/// `[target]`; the subsystems' send overrides (`subsystem_send`) are
/// validated with their subsystems.
fn target_settings(r: &TargetFile) -> Result<TargetSettings, ConfigError> {
    let mut t = TargetSettings::default();
    if let Some(s) = &r.listen {
        t.listen = parse_addr("target.listen", s)?;
    }
    if let Some(s) = &r.discovery_listen {
        t.discovery_listen = if s.is_empty() {
            None
        } else {
            Some(parse_addr("target.discovery_listen", s)?)
        };
    }
    t.advertise_addr = r.advertise_addr.clone();
    if let Some(a) = &t.advertise_addr {
        if a.is_empty() || a.len() > 255 {
            return Err(err("target.advertise_addr", "must be 1 to 255 bytes"));
        }
    }
    if let Some(p) = r.advertise_port {
        if p == 0 {
            return Err(err("target.advertise_port", "0 is not a port"));
        }
        t.advertise_port = Some(p);
    }
    if let Some(w) = r.workers {
        t.workers = ranged_as("target.workers", w, 1, WORKERS_MAX)?;
    }
    let spin = match r.adaptive_spin_us {
        Some(v) => ranged_as("target.adaptive_spin_us", v, 1, 1_000_000)?,
        None => ADAPTIVE_SPIN_US_DEFAULT,
    };
    t.polling = match &r.polling {
        Some(p) => PollingPolicy::parse(p, spin).map_err(|e| err("target.polling", e))?,
        None => PollingPolicy::Adaptive { spin_us: spin },
    };
    if let Some(s) = &r.inline_data_bytes {
        let v = bytes("target.inline_data_bytes", s)?;
        let Some(v) = u32::try_from(v)
            .ok()
            .filter(|v| *v <= INLINE_DATA_BYTES_MAX && v % 16 == 0)
        else {
            return Err(err(
                "target.inline_data_bytes",
                format!("{v} must be a multiple of 16 up to {INLINE_DATA_BYTES_MAX}"),
            ));
        };
        t.inline_data_bytes = v;
    }
    if let Some(s) = &r.max_h2c_data_bytes {
        let v = bytes("target.max_h2c_data_bytes", s)?;
        let Some(v) = u32::try_from(v)
            .ok()
            .filter(|v| (4096..=(16 << 20)).contains(v) && v % 4 == 0)
        else {
            return Err(err(
                "target.max_h2c_data_bytes",
                format!("{v} must be a multiple of 4 from 4096 to 16MiB"),
            ));
        };
        t.max_h2c_data_bytes = v;
    }
    if let Some(s) = &r.max_c2h_data_bytes {
        let v = bytes("target.max_c2h_data_bytes", s)?;
        let Some(v) = u32::try_from(v)
            .ok()
            .filter(|v| (512..=(16 << 20)).contains(v))
        else {
            return Err(err(
                "target.max_c2h_data_bytes",
                format!("{v} must be from 512 to 16MiB"),
            ));
        };
        t.max_c2h_data_bytes = v;
    }
    if let Some(s) = &r.mdts_bytes {
        let v = bytes("target.mdts_bytes", s)?;
        let Some(v) = u32::try_from(v)
            .ok()
            .filter(|v| (4096..=MDTS_BYTES_MAX).contains(v) && v.is_power_of_two())
        else {
            return Err(err(
                "target.mdts_bytes",
                format!("{v} must be a power of two from 4KiB to {MDTS_BYTES_MAX}"),
            ));
        };
        t.mdts_bytes = v;
    }
    if let Some(s) = &r.write_zeroes_bytes_max {
        let v = bytes("target.write_zeroes_bytes_max", s)?;
        if !((8192..=WRITE_ZEROES_BYTES_MAX).contains(&v) && v.is_power_of_two()) {
            return Err(err(
                "target.write_zeroes_bytes_max",
                format!("{v} must be a power of two from 8KiB to {WRITE_ZEROES_BYTES_MAX}"),
            ));
        }
        t.write_zeroes_bytes_max = Some(v);
    }
    if let Some(v) = r.queue_depth_max {
        t.queue_depth_max = ranged_as("target.queue_depth_max", v, 32, QUEUE_DEPTH_MAX)?;
    }
    if let Some(v) = r.io_queues_max {
        t.io_queues_max = ranged_as("target.io_queues_max", v, 1, IO_QUEUES_MAX)?;
    }
    if let Some(v) = r.kato_grace_ms {
        t.kato_grace_ms = ranged_as("target.kato_grace_ms", v, 0, 60_000)?;
    }
    if let Some(v) = r.shutdown_drain_ms {
        t.shutdown_drain_ms = ranged_as("target.shutdown_drain_ms", v, 0, 600_000)?;
    }
    if let Some(v) = r.connections_max {
        t.connections_max = ranged_as("target.connections_max", v, 1, CONNECTIONS_MAX)?;
    }
    if let Some(v) = r.connections_per_source_max {
        t.connections_per_source_max =
            ranged_as("target.connections_per_source_max", v, 1, CONNECTIONS_MAX)?;
    }
    if let Some(v) = r.connections_handshaking_max {
        t.connections_handshaking_max =
            ranged_as("target.connections_handshaking_max", v, 1, CONNECTIONS_MAX)?;
    }
    if let Some(v) = r.connections_handshaking_per_source_max {
        t.connections_handshaking_per_source_max = ranged_as(
            "target.connections_handshaking_per_source_max",
            v,
            1,
            CONNECTIONS_MAX,
        )?;
    }
    if let Some(v) = r.handshake_timeout_ms {
        t.handshake_timeout_ms = ranged_as(
            "target.handshake_timeout_ms",
            v,
            100,
            HANDSHAKE_TIMEOUT_MS_MAX,
        )?;
    }
    if let Some(v) = r.slow_io_ms {
        t.slow_io_ms = ranged_as("target.slow_io_ms", v, 1, SLOW_IO_MS_MAX)?;
    }
    if let Some(on) = r.ram_reads_in_place {
        t.ram_reads_in_place = on;
    }
    if let Some(on) = r.send_within_cwnd {
        t.send_within_cwnd = on;
    }
    if let Some(name) = &r.tcp_congestion {
        sluice_runtime::net::check_tcp_congestion_name(name)
            .map_err(|m| err("target.tcp_congestion", m))?;
        t.tcp_congestion = Some(name.clone());
    }
    t.send = send::resolve(
        &t.send,
        "target",
        r.send_scheduler.as_deref(),
        r.send.as_ref(),
        r.coalescing.as_ref(),
    )?;
    Ok(t)
}

impl TryFrom<TargetFile> for TargetSettings {
    type Error = ConfigError;
    fn try_from(r: TargetFile) -> Result<Self, ConfigError> {
        target_settings(&r)
    }
}

impl From<TargetSettings> for TargetFile {
    fn from(t: TargetSettings) -> Self {
        let (sched, send, co) = send::to_raw(&t.send);
        let size = |n: u32| Some(SizeValue::from(u64::from(n)));
        let spin = match t.polling {
            PollingPolicy::Adaptive { spin_us } => spin_us,
            _ => ADAPTIVE_SPIN_US_DEFAULT,
        };
        TargetFile {
            listen: Some(t.listen.to_string()),
            discovery_listen: Some(t.discovery_listen.map_or(String::new(), |a| a.to_string())),
            advertise_addr: t.advertise_addr,
            advertise_port: t.advertise_port,
            workers: Some(i64::try_from(t.workers).unwrap_or(i64::MAX)),
            polling: Some(t.polling.name().to_string()),
            adaptive_spin_us: Some(i64::from(spin)),
            inline_data_bytes: size(t.inline_data_bytes),
            max_h2c_data_bytes: size(t.max_h2c_data_bytes),
            max_c2h_data_bytes: size(t.max_c2h_data_bytes),
            mdts_bytes: size(t.mdts_bytes),
            write_zeroes_bytes_max: t.write_zeroes_bytes_max.map(SizeValue::from),
            queue_depth_max: Some(i64::from(t.queue_depth_max)),
            io_queues_max: Some(i64::from(t.io_queues_max)),
            kato_grace_ms: Some(i64::from(t.kato_grace_ms)),
            shutdown_drain_ms: Some(i64::try_from(t.shutdown_drain_ms).unwrap_or(i64::MAX)),
            connections_max: Some(i64::from(t.connections_max)),
            connections_per_source_max: Some(i64::from(t.connections_per_source_max)),
            connections_handshaking_max: Some(i64::from(t.connections_handshaking_max)),
            connections_handshaking_per_source_max: Some(i64::from(
                t.connections_handshaking_per_source_max,
            )),
            handshake_timeout_ms: Some(i64::from(t.handshake_timeout_ms)),
            slow_io_ms: Some(i64::from(t.slow_io_ms)),
            ram_reads_in_place: Some(t.ram_reads_in_place),
            send_within_cwnd: Some(t.send_within_cwnd),
            tcp_congestion: t.tcp_congestion,
            send_scheduler: Some(sched),
            send: Some(send),
            coalescing: Some(co),
        }
    }
}
