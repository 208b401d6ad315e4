//! Target configuration: a TOML file, validated into typed settings with
//! errors that name the offending key.
//!
//! ```toml
//! [target]
//! listen = "127.0.0.1:4420"
//! discovery_listen = "127.0.0.1:8009"   # "" disables the discovery port
//! advertise_addr = "10.0.2.2"           # address put in discovery log entries (NAT)
//! workers = 1
//! polling = "adaptive"                  # interrupt | busy-poll | adaptive
//!
//! [[subsystem]]
//! nqn = "nqn.2026-11.io.sluice:ram0"
//! hosts = ["nqn.2014-08.org.nvmexpress:uuid:..."]
//! allow_any_host = false
//!
//! [[subsystem.namespace]]
//! nsid = 1
//! backend = "ram"                       # ram | file | emulated-ssd
//! size = "1GiB"
//! block_size = 512
//! ```

use serde::Deserialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A configuration problem, naming the key and saying what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

fn err(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        reason: reason.into(),
    }
}

/// How a worker thread waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollingMode {
    /// Sleep in epoll until a socket or completion is ready.
    Interrupt,
    /// Never sleep: poll with a zero timeout.
    BusyPoll,
    /// Poll for `spin_us` after the last work, then sleep.
    Adaptive { spin_us: u64 },
}

impl PollingMode {
    pub fn parse(s: &str, spin_us: u64) -> Result<Self, String> {
        match s {
            "interrupt" => Ok(PollingMode::Interrupt),
            "busy-poll" | "busy" => Ok(PollingMode::BusyPoll),
            "adaptive" => Ok(PollingMode::Adaptive { spin_us }),
            other => Err(format!(
                "`{other}` is not one of interrupt, busy-poll, adaptive"
            )),
        }
    }
}

/// Limits on the whole target (TIGER_STYLE: a limit on everything).
pub const WORKERS_MAX: usize = 64;
pub const SUBSYSTEMS_MAX: usize = 1024;
pub const NAMESPACES_PER_SUBSYSTEM_MAX: u32 = 1024;
pub const HOSTS_PER_SUBSYSTEM_MAX: usize = 4096;
pub const QUEUE_DEPTH_MAX: u16 = 1024;
pub const IO_QUEUES_MAX: u16 = 128;
pub const INLINE_DATA_BYTES_MAX: u32 = 128 * 1024;
pub const MDTS_BYTES_MAX: u32 = 8 * 1024 * 1024;

/// Settings of the whole target.
#[derive(Debug, Clone)]
pub struct TargetSettings {
    pub listen: SocketAddr,
    pub discovery_listen: Option<SocketAddr>,
    pub advertise_addr: Option<String>,
    pub advertise_port: Option<u16>,
    pub workers: usize,
    pub polling: PollingMode,
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
    pub send: crate::send::SendConfig,
    /// Per-subsystem overrides of `send`, by NQN.
    pub subsystem_send: std::collections::HashMap<String, crate::send::SendConfig>,
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
            polling: PollingMode::Adaptive { spin_us: 50 },
            inline_data_bytes: 8192,
            max_h2c_data_bytes: 128 * 1024,
            max_c2h_data_bytes: 128 * 1024,
            mdts_bytes: 1024 * 1024,
            queue_depth_max: 128,
            io_queues_max: 8,
            kato_grace_ms: 500,
            shutdown_drain_ms: 5000,
            send: crate::send::SendConfig::default(),
            subsystem_send: std::collections::HashMap::new(),
        }
    }
}

/// Which backend a namespace uses.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendConfig {
    Ram,
    File {
        path: PathBuf,
        direct: bool,
        engine: String,
        create: bool,
    },
    EmulatedSsd(SsdConfig),
}

/// Service model of the emulated SSD.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsdConfig {
    #[serde(default = "d_read_iops")]
    pub read_iops_max: u64,
    #[serde(default = "d_write_iops")]
    pub write_iops_max: u64,
    #[serde(default = "d_read_bw")]
    pub read_bytes_per_sec_max: u64,
    #[serde(default = "d_write_bw")]
    pub write_bytes_per_sec_max: u64,
    #[serde(default = "d_read_lat")]
    pub base_read_latency_us: u64,
    #[serde(default = "d_write_lat")]
    pub base_write_latency_us: u64,
    #[serde(default = "d_par")]
    pub parallelism: u32,
}
fn d_read_iops() -> u64 {
    100_000
}
fn d_write_iops() -> u64 {
    50_000
}
fn d_read_bw() -> u64 {
    1_000_000_000
}
fn d_write_bw() -> u64 {
    500_000_000
}
fn d_read_lat() -> u64 {
    80
}
fn d_write_lat() -> u64 {
    20
}
fn d_par() -> u32 {
    8
}

impl Default for SsdConfig {
    fn default() -> Self {
        SsdConfig {
            read_iops_max: d_read_iops(),
            write_iops_max: d_write_iops(),
            read_bytes_per_sec_max: d_read_bw(),
            write_bytes_per_sec_max: d_write_bw(),
            base_read_latency_us: d_read_lat(),
            base_write_latency_us: d_write_lat(),
            parallelism: d_par(),
        }
    }
}

/// One namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceConfig {
    pub nsid: u32,
    pub backend: BackendConfig,
    /// Size in bytes (RAM and emulated SSD; files may create/extend to it).
    pub size_bytes: Option<u64>,
    pub block_size_bytes: u32,
    /// Optional fixed NGUID/UUID (hex); derived from the subsystem NQN and NSID otherwise.
    pub uuid: Option<[u8; 16]>,
}

/// One subsystem.
#[derive(Debug, Clone, PartialEq)]
pub struct SubsystemConfig {
    pub nqn: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub serial: String,
    pub model: String,
    pub namespaces: Vec<NamespaceConfig>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub target: TargetSettings,
    pub subsystems: Vec<SubsystemConfig>,
    /// Tenants, QoS and CPU isolation (see `tenant`).
    pub tenants: crate::tenant::TenantsConfig,
}

// ---- raw TOML shapes ----

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    target: RawTarget,
    #[serde(default)]
    subsystem: Vec<RawSubsystem>,
    /// Tenant settings (`[tenants]`) and tenants (`[[tenant]]`).
    tenants: Option<crate::tenant::RawTenants>,
    #[serde(default)]
    tenant: Vec<crate::tenant::RawTenant>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    listen: Option<String>,
    discovery_listen: Option<String>,
    advertise_addr: Option<String>,
    advertise_port: Option<u16>,
    workers: Option<i64>,
    polling: Option<String>,
    adaptive_spin_us: Option<i64>,
    inline_data_bytes: Option<Size>,
    max_h2c_data_bytes: Option<Size>,
    max_c2h_data_bytes: Option<Size>,
    mdts_bytes: Option<Size>,
    queue_depth_max: Option<i64>,
    io_queues_max: Option<i64>,
    kato_grace_ms: Option<i64>,
    shutdown_drain_ms: Option<i64>,
    send_scheduler: Option<String>,
    send: Option<crate::send_config::RawSend>,
    coalescing: Option<crate::send_config::RawCoalescing>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubsystem {
    nqn: String,
    #[serde(default)]
    allow_any_host: bool,
    #[serde(default)]
    hosts: Vec<String>,
    serial: Option<String>,
    model: Option<String>,
    #[serde(default)]
    namespace: Vec<RawNamespace>,
    send_scheduler: Option<String>,
    send: Option<crate::send_config::RawSend>,
    coalescing: Option<crate::send_config::RawCoalescing>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNamespace {
    nsid: i64,
    backend: String,
    size: Option<Size>,
    block_size: Option<i64>,
    path: Option<PathBuf>,
    direct: Option<bool>,
    engine: Option<String>,
    create: Option<bool>,
    uuid: Option<String>,
    ssd: Option<SsdConfig>,
}

/// A size given as an integer or a string like "512MiB", "4k", "1G".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Size {
    Int(i64),
    Str(String),
}

impl Size {
    fn bytes(&self, key: &str) -> Result<u64, ConfigError> {
        match self {
            Size::Int(i) if *i >= 0 => Ok(*i as u64),
            Size::Int(i) => Err(err(key, format!("{i} is negative"))),
            Size::Str(s) => parse_size(s).map_err(|r| err(key, r)),
        }
    }
}

/// Parses "4096", "4k", "4KiB", "1.5G"... (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 4096, 64k, 1GiB)"))?;
    let mul: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit `{other}` in `{s}`")),
    };
    let v = n * mul as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 / 2.0 {
        return Err(format!("`{s}` is out of range"));
    }
    if v.fract() != 0.0 {
        return Err(format!("`{s}` is not a whole number of bytes"));
    }
    Ok(v as u64)
}

fn ranged(key: &str, v: i64, min: i64, max: i64) -> Result<i64, ConfigError> {
    if v < min || v > max {
        return Err(err(key, format!("{v} is outside {min}..={max}")));
    }
    Ok(v)
}

fn parse_addr(key: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| {
        err(
            key,
            format!("`{s}` is not an address:port such as 127.0.0.1:4420"),
        )
    })
}

fn parse_uuid(key: &str, s: &str) -> Result<[u8; 16], ConfigError> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(err(key, format!("`{s}` is not a 128-bit hex UUID")));
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).map_err(|_| err(key, "bad hex"))?;
    }
    Ok(out)
}

/// Checks that `nqn` is a plausible NVMe Qualified Name.
pub fn validate_nqn(key: &str, nqn: &str) -> Result<(), ConfigError> {
    if nqn.is_empty() || nqn.len() > sluice_proto::NQN_LEN_MAX {
        return Err(err(
            key,
            format!("`{nqn}` must be 1 to {} bytes", sluice_proto::NQN_LEN_MAX),
        ));
    }
    if !nqn.starts_with("nqn.") {
        return Err(err(key, format!("`{nqn}` does not start with `nqn.`")));
    }
    if nqn.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(err(
            key,
            format!("`{nqn}` contains whitespace or control characters"),
        ));
    }
    Ok(())
}

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let span = e
                .span()
                .map(|s| format!(" at byte {}", s.start))
                .unwrap_or_default();
            err("(file)", format!("{}{}", e.message(), span))
        })?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawFile) -> Result<Config, ConfigError> {
        let mut t = TargetSettings::default();
        let r = raw.target;
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
            t.workers = ranged("target.workers", w, 1, WORKERS_MAX as i64)? as usize;
        }
        let spin = match r.adaptive_spin_us {
            Some(v) => ranged("target.adaptive_spin_us", v, 1, 1_000_000)? as u64,
            None => 50,
        };
        if let Some(p) = &r.polling {
            t.polling = PollingMode::parse(p, spin).map_err(|e| err("target.polling", e))?;
        } else {
            t.polling = PollingMode::Adaptive { spin_us: spin };
        }
        if let Some(s) = &r.inline_data_bytes {
            let v = s.bytes("target.inline_data_bytes")?;
            if v > INLINE_DATA_BYTES_MAX as u64 || v % 16 != 0 {
                return Err(err(
                    "target.inline_data_bytes",
                    format!("{v} must be a multiple of 16 up to {INLINE_DATA_BYTES_MAX}"),
                ));
            }
            t.inline_data_bytes = v as u32;
        }
        if let Some(s) = &r.max_h2c_data_bytes {
            let v = s.bytes("target.max_h2c_data_bytes")?;
            if !(4096..=(16 << 20)).contains(&v) || v % 4 != 0 {
                return Err(err(
                    "target.max_h2c_data_bytes",
                    format!("{v} must be a multiple of 4 from 4096 to 16MiB"),
                ));
            }
            t.max_h2c_data_bytes = v as u32;
        }
        if let Some(s) = &r.max_c2h_data_bytes {
            let v = s.bytes("target.max_c2h_data_bytes")?;
            if !(512..=(16 << 20)).contains(&v) {
                return Err(err(
                    "target.max_c2h_data_bytes",
                    format!("{v} must be from 512 to 16MiB"),
                ));
            }
            t.max_c2h_data_bytes = v as u32;
        }
        if let Some(s) = &r.mdts_bytes {
            let v = s.bytes("target.mdts_bytes")?;
            if v < 4096 || v > MDTS_BYTES_MAX as u64 || !v.is_power_of_two() {
                return Err(err(
                    "target.mdts_bytes",
                    format!("{v} must be a power of two from 4KiB to {MDTS_BYTES_MAX}"),
                ));
            }
            t.mdts_bytes = v as u32;
        }
        if let Some(v) = r.queue_depth_max {
            t.queue_depth_max =
                ranged("target.queue_depth_max", v, 32, QUEUE_DEPTH_MAX as i64)? as u16;
        }
        if let Some(v) = r.io_queues_max {
            t.io_queues_max = ranged("target.io_queues_max", v, 1, IO_QUEUES_MAX as i64)? as u16;
        }
        if let Some(v) = r.kato_grace_ms {
            t.kato_grace_ms = ranged("target.kato_grace_ms", v, 0, 60_000)? as u32;
        }
        if let Some(v) = r.shutdown_drain_ms {
            t.shutdown_drain_ms = ranged("target.shutdown_drain_ms", v, 0, 600_000)? as u64;
        }
        t.send = crate::send_config::resolve(
            &t.send,
            "target",
            r.send_scheduler.as_deref(),
            r.send.as_ref(),
            r.coalescing.as_ref(),
        )?;

        if raw.subsystem.len() > SUBSYSTEMS_MAX {
            return Err(err(
                "subsystem",
                format!("{} subsystems, limit {SUBSYSTEMS_MAX}", raw.subsystem.len()),
            ));
        }
        let mut seen = HashSet::new();
        let mut subsystems = Vec::new();
        for (i, s) in raw.subsystem.into_iter().enumerate() {
            let k = format!("subsystem[{i}]");
            if s.send_scheduler.is_some() || s.send.is_some() || s.coalescing.is_some() {
                let sc = crate::send_config::resolve(
                    &t.send,
                    &k,
                    s.send_scheduler.as_deref(),
                    s.send.as_ref(),
                    s.coalescing.as_ref(),
                )?;
                t.subsystem_send.insert(s.nqn.clone(), sc);
            }
            validate_nqn(&format!("{k}.nqn"), &s.nqn)?;
            if s.nqn == sluice_proto::DISCOVERY_NQN {
                return Err(err(format!("{k}.nqn"), "the discovery NQN is reserved"));
            }
            if !seen.insert(s.nqn.clone()) {
                return Err(err(
                    format!("{k}.nqn"),
                    format!("`{}` is configured twice", s.nqn),
                ));
            }
            if s.hosts.len() > HOSTS_PER_SUBSYSTEM_MAX {
                return Err(err(
                    format!("{k}.hosts"),
                    format!("more than {HOSTS_PER_SUBSYSTEM_MAX} hosts"),
                ));
            }
            for (j, h) in s.hosts.iter().enumerate() {
                validate_nqn(&format!("{k}.hosts[{j}]"), h)?;
            }
            if !s.allow_any_host && s.hosts.is_empty() {
                return Err(err(
                    format!("{k}.hosts"),
                    "no host may connect: list host NQNs in `hosts`, or set `allow_any_host = true` to admit every host",
                ));
            }
            let serial = s.serial.unwrap_or_else(|| default_serial(&s.nqn));
            if serial.len() > 20 || !serial.is_ascii() {
                return Err(err(
                    format!("{k}.serial"),
                    "must be at most 20 ASCII characters",
                ));
            }
            let model = s.model.unwrap_or_else(|| "Sluice".to_string());
            if model.len() > 40 || !model.is_ascii() {
                return Err(err(
                    format!("{k}.model"),
                    "must be at most 40 ASCII characters",
                ));
            }
            if s.namespace.len() > NAMESPACES_PER_SUBSYSTEM_MAX as usize {
                return Err(err(format!("{k}.namespace"), "too many namespaces"));
            }
            let mut nsids = HashSet::new();
            let mut namespaces = Vec::new();
            for (j, n) in s.namespace.into_iter().enumerate() {
                let nk = format!("{k}.namespace[{j}]");
                let nsid = ranged(
                    &format!("{nk}.nsid"),
                    n.nsid,
                    1,
                    NAMESPACES_PER_SUBSYSTEM_MAX as i64,
                )? as u32;
                if !nsids.insert(nsid) {
                    return Err(err(
                        format!("{nk}.nsid"),
                        format!("nsid {nsid} is used twice"),
                    ));
                }
                let block_size_bytes = match n.block_size {
                    None => 512,
                    Some(512) => 512,
                    Some(4096) => 4096,
                    Some(v) => {
                        return Err(err(
                            format!("{nk}.block_size"),
                            format!("{v} must be 512 or 4096"),
                        ))
                    }
                };
                let size_bytes = n
                    .size
                    .as_ref()
                    .map(|s| s.bytes(&format!("{nk}.size")))
                    .transpose()?;
                if let Some(sz) = size_bytes {
                    if sz == 0 || sz % block_size_bytes as u64 != 0 {
                        return Err(err(format!("{nk}.size"), format!("{sz} must be a non-zero multiple of the block size {block_size_bytes}")));
                    }
                }
                let backend = match n.backend.as_str() {
                    "ram" | "emulated-ssd" => {
                        if size_bytes.is_none() {
                            return Err(err(
                                format!("{nk}.size"),
                                format!("required for backend `{}`", n.backend),
                            ));
                        }
                        if n.path.is_some() {
                            return Err(err(
                                format!("{nk}.path"),
                                format!("not used by backend `{}`", n.backend),
                            ));
                        }
                        if n.backend == "ram" {
                            if n.ssd.is_some() {
                                return Err(err(
                                    format!("{nk}.ssd"),
                                    "only for backend `emulated-ssd`",
                                ));
                            }
                            BackendConfig::Ram
                        } else {
                            let m = n.ssd.unwrap_or_default();
                            for (f, v) in [
                                ("read_iops_max", m.read_iops_max),
                                ("write_iops_max", m.write_iops_max),
                                ("read_bytes_per_sec_max", m.read_bytes_per_sec_max),
                                ("write_bytes_per_sec_max", m.write_bytes_per_sec_max),
                                ("parallelism", m.parallelism as u64),
                            ] {
                                if v == 0 {
                                    return Err(err(
                                        format!("{nk}.ssd.{f}"),
                                        "must be greater than 0",
                                    ));
                                }
                            }
                            BackendConfig::EmulatedSsd(m)
                        }
                    }
                    "file" => {
                        let path = n.path.ok_or_else(|| {
                            err(format!("{nk}.path"), "required for backend `file`")
                        })?;
                        let engine = n.engine.unwrap_or_else(|| "auto".into());
                        if !["auto", "io-uring", "sync"].contains(&engine.as_str()) {
                            return Err(err(
                                format!("{nk}.engine"),
                                format!("`{engine}` is not one of auto, io-uring, sync"),
                            ));
                        }
                        BackendConfig::File {
                            path,
                            direct: n.direct.unwrap_or(true),
                            engine,
                            create: n.create.unwrap_or(false),
                        }
                    }
                    other => {
                        return Err(err(
                            format!("{nk}.backend"),
                            format!("`{other}` is not one of ram, file, emulated-ssd"),
                        ))
                    }
                };
                let uuid = n
                    .uuid
                    .as_deref()
                    .map(|u| parse_uuid(&format!("{nk}.uuid"), u))
                    .transpose()?;
                namespaces.push(NamespaceConfig {
                    nsid,
                    backend,
                    size_bytes,
                    block_size_bytes,
                    uuid,
                });
            }
            subsystems.push(SubsystemConfig {
                nqn: s.nqn,
                allow_any_host: s.allow_any_host,
                hosts: s.hosts,
                serial,
                model,
                namespaces,
            });
        }
        let tenants = crate::tenant::TenantsConfig::from_raw(
            raw.tenants,
            raw.tenant,
            u64::from(t.mdts_bytes),
        )?;
        Ok(Config {
            target: t,
            subsystems,
            tenants,
        })
    }

    /// The embedded default: one 1 GiB RAM namespace on loopback, open to any host.
    pub fn embedded_default() -> Config {
        let nqn = DEFAULT_SUBSYSTEM_NQN.to_string();
        Config {
            target: TargetSettings::default(),
            subsystems: vec![SubsystemConfig {
                serial: default_serial(&nqn),
                nqn,
                allow_any_host: true,
                hosts: vec![],
                model: "Sluice".into(),
                namespaces: vec![NamespaceConfig {
                    nsid: 1,
                    backend: BackendConfig::Ram,
                    size_bytes: Some(1 << 30),
                    block_size_bytes: 512,
                    uuid: None,
                }],
            }],
            tenants: Default::default(),
        }
    }
}

/// NQN of the subsystem in the embedded default configuration.
pub const DEFAULT_SUBSYSTEM_NQN: &str = "nqn.2026-11.io.sluice:ram0";

/// A stable serial number derived from the NQN.
pub fn default_serial(nqn: &str) -> String {
    let h = sluice_proto::digest::crc32c(nqn.as_bytes());
    format!("SLC{h:08X}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn must_fail(toml: &str, key: &str) -> ConfigError {
        let e = Config::from_toml(toml).expect_err("config should be rejected");
        assert_eq!(e.key, key, "{e}");
        e
    }

    const HOSTS: &str = r#"hosts = ["nqn.2014-08.org.nvmexpress:uuid:1"]"#;

    #[test]
    fn full_config_parses() {
        let c = Config::from_toml(&format!(
            r#"
            [target]
            listen = "0.0.0.0:4420"
            discovery_listen = ""
            advertise_addr = "10.0.2.2"
            workers = 2
            polling = "busy-poll"
            inline_data_bytes = "16k"
            [[subsystem]]
            nqn = "nqn.2026-11.io.sluice:a"
            {HOSTS}
            [[subsystem.namespace]]
            nsid = 1
            backend = "ram"
            size = "64MiB"
            [[subsystem.namespace]]
            nsid = 2
            backend = "emulated-ssd"
            size = 1048576
            block_size = 4096
            ssd = {{ read_iops_max = 1000 }}
            [[subsystem.namespace]]
            nsid = 3
            backend = "file"
            path = "/tmp/x.img"
            "#
        ))
        .unwrap();
        assert_eq!(c.target.workers, 2);
        assert_eq!(c.target.polling, PollingMode::BusyPoll);
        assert_eq!(c.target.discovery_listen, None);
        assert_eq!(c.target.inline_data_bytes, 16384);
        assert_eq!(c.subsystems[0].namespaces.len(), 3);
        assert_eq!(c.subsystems[0].namespaces[0].size_bytes, Some(64 << 20));
        match &c.subsystems[0].namespaces[1].backend {
            BackendConfig::EmulatedSsd(m) => assert_eq!(m.read_iops_max, 1000),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_name_the_key() {
        must_fail("[target]\nworkers = 0", "target.workers");
        must_fail("[target]\npolling = \"sometimes\"", "target.polling");
        must_fail("[target]\nlisten = \"nowhere\"", "target.listen");
        must_fail("[target]\nmdts_bytes = \"3k\"", "target.mdts_bytes");
        must_fail("[target]\nbogus = 1", "(file)");
        must_fail(
            "[[subsystem]]\nnqn = \"bad\"\nallow_any_host = true",
            "subsystem[0].nqn",
        );
        must_fail("[[subsystem]]\nnqn = \"nqn.x:y\"", "subsystem[0].hosts");
        let e = must_fail(
            &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"1000\""),
            "subsystem[0].namespace[0].size",
        );
        assert!(e.reason.contains("multiple of the block size"));
        must_fail(
            &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"tape\""),
            "subsystem[0].namespace[0].backend",
        );
        must_fail(
            &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = 4096\nblock_size = 1024"),
            "subsystem[0].namespace[0].block_size",
        );
        must_fail(
            &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"emulated-ssd\"\nsize = 4096\nssd = {{ parallelism = 0 }}"),
            "subsystem[0].namespace[0].ssd.parallelism",
        );
        must_fail(
            &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}"),
            "subsystem[1].nqn",
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert!(parse_size("1.5").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("9999999999T").is_err());
    }
}
