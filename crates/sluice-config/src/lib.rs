//! Sluice target configuration, as a leaf crate: the whole schema (target
//! settings, listeners, polling, subsystems, namespaces and their backends,
//! the send path, tenants), its validation with errors that name the
//! offending key (e.g. `subsystem[1].namespace[0].path`), builders so that
//! tests and tools write configurations in Rust, and the one size parser
//! ([`size::parse_size`]) of the project.
//!
//! It depends on `serde`, `toml`, `thiserror` and, for protocol constants
//! and the send-path value types, `sluice-proto`; nothing in it knows about
//! sockets, threads or backends.
//!
//! * [`file`]: the whole file's TOML shape, composed of the sections'
//!   shapes; `Config` is (de)serialized through it, so `Config` ⇄ TOML
//!   round-trips and deserializing always validates.
//! * [`target`]: `[target]`: listeners, workers, polling, PDU and queue
//!   limits; its TOML shape and validation.
//! * [`subsystem`]: `[[subsystem]]` and `[[subsystem.namespace]]`, backends
//!   and engines as enums, the emulated SSD's model parameters; their TOML
//!   shapes and validation.
//! * [`send`]: `send_scheduler`, `[*.send]`, `[*.coalescing]`.
//! * [`tenants`]: `[tenants]` and `[[tenant]]`, and the run-time tenant
//!   update request (the same shape in JSON).
//! * [`size`]: sizes such as `"4KiB"`, `"1.5G"`.
//!
//! ```toml
//! [target]
//! listen = "127.0.0.1:4420"
//! discovery_listen = "127.0.0.1:8009"   # "" disables the discovery port
//! advertise_addr = "10.0.2.2"           # address put in discovery log entries (NAT)
//! workers = 1
//! polling = "adaptive"                  # interrupt | busy-poll | adaptive
//! connections_max = 4096                # open at once, all sources
//! connections_per_source_max = 512     # open at once from one IP address
//! connections_handshaking_max = 256    # accepted, not yet past Connect
//! connections_handshaking_per_source_max = 72  # of those, from one IP address
//! handshake_timeout_ms = 10000          # ICReq + Connect within this
//! slow_io_ms = 1000                     # backend I/Os this slow are counted and logged
//! ram_reads_in_place = true             # RAM reads of 4 KiB+ sent from the namespace's memory
//! send_within_cwnd = true               # large writes send what the congestion window admits
//! # tcp_congestion = "cubic"            # per-socket TCP congestion control (unset: the system's)
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
//!
//! The same in Rust:
//!
//! ```
//! use sluice_config::{Config, NamespaceConfig, SubsystemConfig};
//! let c = Config::default()
//!     .with_subsystem(
//!         SubsystemConfig::new("nqn.2026-11.io.sluice:ram0")
//!             .with_host("nqn.2014-08.org.nvmexpress:uuid:1")
//!             .with_namespace(NamespaceConfig::ram(1, 1 << 30)),
//!     )
//!     .validated()
//!     .expect("valid");
//! assert_eq!(Config::from_toml(&c.to_toml().expect("toml")), Ok(c));
//! ```

pub mod auth;
mod file;
mod send;
mod size;
mod subsystem;
mod target;
pub mod tenants;

pub use size::{format_size, parse_size, SizeError};
pub use sluice_runtime::PollingPolicy;
pub use subsystem::{
    default_serial, validate_nqn, BackendConfig, Engine, NamespaceConfig, SsdConfig,
    SubsystemConfig, BLOCK_SIZE_DEFAULT, CONTROL_DEFAULT, DEFAULT_SUBSYSTEM_NQN,
};
pub use target::{
    TargetSettings, CONNECTIONS_HANDSHAKING_MAX_DEFAULT,
    CONNECTIONS_HANDSHAKING_PER_SOURCE_MAX_DEFAULT, CONNECTIONS_MAX_DEFAULT,
    CONNECTIONS_PER_SOURCE_MAX_DEFAULT, HANDSHAKE_TIMEOUT_MS_DEFAULT, SLOW_IO_MS_DEFAULT,
};
pub use tenants::{TenantSpec, TenantsConfig, TenantsSettings};

use serde::{Deserialize, Serialize};

/// Limits on the whole target (TIGER_STYLE: a limit on everything). The
/// worker limit is the runtime's, shared by every event-loop pool.
pub use sluice_runtime::limits::WORKERS_MAX;
pub const SUBSYSTEMS_MAX: usize = 1024;
pub const NAMESPACES_PER_SUBSYSTEM_MAX: u32 = 1024;
/// Namespaces of all subsystems together, over the target's life: those a
/// reload adds count too, and a removed subsystem's are not handed out
/// again until a restart (each has per-namespace state in every worker).
pub const NAMESPACES_TOTAL_MAX: usize = 4096;
pub const HOSTS_PER_SUBSYSTEM_MAX: usize = 4096;
pub const QUEUE_DEPTH_MAX: u16 = 1024;
pub const IO_QUEUES_MAX: u16 = 128;
pub const INLINE_DATA_BYTES_MAX: u32 = 128 * 1024;
pub const MDTS_BYTES_MAX: u32 = 8 * 1024 * 1024;
/// The largest `target.write_zeroes_bytes_max`: 65536 blocks of 4 KiB,
/// what one command can name anyway.
pub const WRITE_ZEROES_BYTES_MAX: u64 = 256 * 1024 * 1024;
/// The largest value of each connection limit (`target.connections_max`,
/// `connections_per_source_max`, `connections_handshaking_max`).
pub const CONNECTIONS_MAX: u32 = 1 << 20;
/// The longest `target.handshake_timeout_ms` (10 minutes).
pub const HANDSHAKE_TIMEOUT_MS_MAX: u32 = 600_000;
/// The largest `target.slow_io_ms` (10 minutes).
pub const SLOW_IO_MS_MAX: u32 = 600_000;

/// A configuration problem, naming the key and saying what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

pub(crate) fn err(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        reason: reason.into(),
    }
}

/// `v` if it is within `min..=max`, else an error naming `key`.
pub(crate) fn ranged(key: &str, v: i64, min: i64, max: i64) -> Result<i64, ConfigError> {
    if v < min || v > max {
        return Err(err(key, format!("{v} is outside {min}..={max}")));
    }
    Ok(v)
}

/// `v` as a `T` if it is within `min..=max`, else an error naming `key`
/// (the same words as [`ranged`], whichever integer type the field has).
pub(crate) fn ranged_as<T>(key: &str, v: i64, min: T, max: T) -> Result<T, ConfigError>
where
    T: TryFrom<i64> + PartialOrd + std::fmt::Display,
{
    match T::try_from(v) {
        Ok(t) if min <= t && t <= max => Ok(t),
        _ => Err(err(key, format!("{v} is outside {min}..={max}"))),
    }
}

/// A size value in bytes, or an error naming `key`.
pub(crate) fn bytes(key: &str, v: &size::SizeValue) -> Result<u64, ConfigError> {
    v.bytes().map_err(|e| err(key, e.to_string()))
}

/// Reads a config word (`"busy-poll"`, `"emulated-ssd"`...) into one of the
/// unit variants of a serde enum; unknown words give
/// "`word` is not one of a, b, c".
pub fn parse_word<T: serde::de::DeserializeOwned>(word: &str) -> Result<T, String> {
    use serde::de::IntoDeserializer;
    let d: serde::de::value::StrDeserializer<'_, WordError> = word.into_deserializer();
    T::deserialize(d).map_err(|e| e.0)
}

/// The error of [`parse_word`]: a message.
#[derive(Debug)]
struct WordError(String);

impl std::fmt::Display for WordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WordError {}

impl serde::de::Error for WordError {
    fn custom<M: std::fmt::Display>(m: M) -> Self {
        WordError(m.to_string())
    }
    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        WordError(format!("`{variant}` is not one of {}", expected.join(", ")))
    }
}

/// The word a unit variant of a serde enum is written as.
pub fn word_of<T: Serialize>(v: &T) -> String {
    toml::Value::try_from(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The validated configuration.
///
/// (De)serialized as the TOML file: deserializing validates everything
/// (errors name the key), serializing writes a file that reads back to
/// the same `Config`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "file::ConfigFile", into = "file::ConfigFile")]
pub struct Config {
    pub target: TargetSettings,
    pub subsystems: Vec<SubsystemConfig>,
    /// Tenants, QoS and CPU isolation (`[tenants]`, `[[tenant]]`).
    pub tenants: TenantsConfig,
}

/// Where byte `offset` of `text` is, for a parse error: its line number
/// and that line (so the key is named even when the parser's message, say
/// a wrong type, does not), at most [`ERROR_LINE_CHARS_MAX`] characters.
fn where_in(text: &str, offset: usize) -> String {
    let Some(before) = text.get(..offset) else {
        return format!(" at byte {offset}");
    };
    let line_no = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let line: String = text[start..]
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .chars()
        .take(ERROR_LINE_CHARS_MAX)
        .collect();
    format!(" at line {line_no}: `{line}`")
}

/// The most of a configuration line an error quotes.
const ERROR_LINE_CHARS_MAX: usize = 120;

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw: file::ConfigFile = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| where_in(text, s.start))
                .unwrap_or_default();
            err("(file)", format!("{}{}", e.message(), at))
        })?;
        Config::try_from(raw)
    }

    /// The configuration as a TOML document that [`Config::from_toml`]
    /// reads back to the same value.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| err("(file)", e.to_string()))
    }

    /// Runs the validation a file goes through (limits, defaults filled,
    /// cross checks) on a configuration built in Rust.
    pub fn validated(self) -> Result<Config, ConfigError> {
        Config::try_from(file::ConfigFile::from(self))
    }

    /// The embedded default: one 1 GiB RAM namespace on loopback, open to any host.
    pub fn embedded_default() -> Config {
        Config::default().with_subsystem(
            SubsystemConfig::new(DEFAULT_SUBSYSTEM_NQN)
                .allow_any_host()
                .with_namespace(NamespaceConfig::ram(1, 1 << 30)),
        )
    }

    pub fn with_target(mut self, target: TargetSettings) -> Self {
        self.target = target;
        self
    }

    pub fn with_subsystem(mut self, subsystem: SubsystemConfig) -> Self {
        self.subsystems.push(subsystem);
        self
    }

    pub fn with_tenants(mut self, tenants: TenantsConfig) -> Self {
        self.tenants = tenants;
        self
    }
}

#[cfg(test)]
mod tests;
