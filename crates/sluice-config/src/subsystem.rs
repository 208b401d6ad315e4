//! `[[subsystem]]` and `[[subsystem.namespace]]`: NQNs, host allow-lists,
//! namespaces and their backends.

use crate::{err, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// NQN of the subsystem in the embedded default configuration.
pub const DEFAULT_SUBSYSTEM_NQN: &str = "nqn.2026-11.io.sluice:ram0";

/// Which backend a namespace uses: `backend = "ram" | "file" | "emulated-ssd"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "backend", rename_all = "kebab-case", deny_unknown_fields)]
pub enum BackendConfig {
    Ram,
    /// A file or block device.
    File {
        path: PathBuf,
        /// O_DIRECT (falls back to buffered I/O where refused).
        direct: bool,
        engine: Engine,
        /// Create the file (and extend it to `size`) if missing.
        create: bool,
    },
    /// RAM plus a service model.
    EmulatedSsd(SsdConfig),
}

/// The words of `backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    Ram,
    File,
    EmulatedSsd,
}

impl BackendConfig {
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendConfig::Ram => BackendKind::Ram,
            BackendConfig::File { .. } => BackendKind::File,
            BackendConfig::EmulatedSsd(_) => BackendKind::EmulatedSsd,
        }
    }

    /// A file backend with the defaults (`direct = true`, `engine = "auto"`,
    /// `create = false`).
    pub fn file(path: impl Into<PathBuf>) -> Self {
        BackendConfig::File {
            path: path.into(),
            direct: true,
            engine: Engine::Auto,
            create: false,
        }
    }
}

/// I/O engine of a file backend: `engine = "auto" | "io-uring" | "sync"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// io_uring when the kernel allows it, else sync.
    #[default]
    Auto,
    IoUring,
    /// pread/pwrite.
    Sync,
}

/// Service model of an emulated SSD (`ssd = { ... }`). Absent fields take
/// the defaults of `sluice_backend::SsdModel::default()`, the one place they
/// are defined; zero values are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsdConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes_per_sec_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes_per_sec_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_read_latency_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_write_latency_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<u32>,
}

impl SsdConfig {
    pub fn with_read_iops_max(mut self, v: u64) -> Self {
        self.read_iops_max = Some(v);
        self
    }
    pub fn with_write_iops_max(mut self, v: u64) -> Self {
        self.write_iops_max = Some(v);
        self
    }
    pub fn with_read_bytes_per_sec_max(mut self, v: u64) -> Self {
        self.read_bytes_per_sec_max = Some(v);
        self
    }
    pub fn with_write_bytes_per_sec_max(mut self, v: u64) -> Self {
        self.write_bytes_per_sec_max = Some(v);
        self
    }
    pub fn with_base_read_latency_us(mut self, v: u64) -> Self {
        self.base_read_latency_us = Some(v);
        self
    }
    pub fn with_base_write_latency_us(mut self, v: u64) -> Self {
        self.base_write_latency_us = Some(v);
        self
    }
    pub fn with_parallelism(mut self, v: u32) -> Self {
        self.parallelism = Some(v);
        self
    }

    /// Zero rates or parallelism are refused, naming `key.field`.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        for (f, v) in [
            ("read_iops_max", self.read_iops_max),
            ("write_iops_max", self.write_iops_max),
            ("read_bytes_per_sec_max", self.read_bytes_per_sec_max),
            ("write_bytes_per_sec_max", self.write_bytes_per_sec_max),
            ("parallelism", self.parallelism.map(u64::from)),
        ] {
            if v == Some(0) {
                return Err(err(format!("{key}.{f}"), "must be greater than 0"));
            }
        }
        Ok(())
    }
}

/// One namespace. (De)serialized as its `[[subsystem.namespace]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    try_from = "crate::file::NamespaceFile",
    into = "crate::file::NamespaceFile"
)]
pub struct NamespaceConfig {
    pub nsid: u32,
    pub backend: BackendConfig,
    /// Size in bytes (RAM and emulated SSD; files may create/extend to it).
    pub size_bytes: Option<u64>,
    pub block_size_bytes: u32,
    /// Optional fixed NGUID/UUID; derived from the subsystem NQN and NSID otherwise.
    pub uuid: Option<[u8; 16]>,
}

/// Default of `block_size`.
pub const BLOCK_SIZE_DEFAULT: u32 = 512;

impl NamespaceConfig {
    fn new(nsid: u32, backend: BackendConfig, size_bytes: Option<u64>) -> Self {
        NamespaceConfig {
            nsid,
            backend,
            size_bytes,
            block_size_bytes: BLOCK_SIZE_DEFAULT,
            uuid: None,
        }
    }
    /// A RAM namespace of `size_bytes` with 512-byte blocks.
    pub fn ram(nsid: u32, size_bytes: u64) -> Self {
        Self::new(nsid, BackendConfig::Ram, Some(size_bytes))
    }
    /// An emulated SSD of `size_bytes` with 512-byte blocks.
    pub fn emulated_ssd(nsid: u32, size_bytes: u64, model: SsdConfig) -> Self {
        Self::new(nsid, BackendConfig::EmulatedSsd(model), Some(size_bytes))
    }
    /// A file or block device (see [`BackendConfig::file`] and the `with_*`
    /// setters for `direct`, `engine`, `create`).
    pub fn file(nsid: u32, path: impl Into<PathBuf>) -> Self {
        Self::new(nsid, BackendConfig::file(path), None)
    }
    pub fn with_size(mut self, bytes: u64) -> Self {
        self.size_bytes = Some(bytes);
        self
    }
    pub fn with_block_size(mut self, bytes: u32) -> Self {
        self.block_size_bytes = bytes;
        self
    }
    pub fn with_uuid(mut self, uuid: [u8; 16]) -> Self {
        self.uuid = Some(uuid);
        self
    }
    /// File backends: O_DIRECT on or off (no effect on other backends).
    pub fn with_direct(mut self, on: bool) -> Self {
        if let BackendConfig::File { direct, .. } = &mut self.backend {
            *direct = on;
        }
        self
    }
    /// File backends: the I/O engine (no effect on other backends).
    pub fn with_engine(mut self, e: Engine) -> Self {
        if let BackendConfig::File { engine, .. } = &mut self.backend {
            *engine = e;
        }
        self
    }
    /// File backends: create the file if missing (no effect on other backends).
    pub fn with_create(mut self, on: bool) -> Self {
        if let BackendConfig::File { create, .. } = &mut self.backend {
            *create = on;
        }
        self
    }
}

/// One subsystem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    pub nqn: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub serial: String,
    pub model: String,
    #[serde(rename = "namespace")]
    pub namespaces: Vec<NamespaceConfig>,
}

/// Default of `model`.
pub const MODEL_DEFAULT: &str = "Sluice";

impl SubsystemConfig {
    /// A subsystem with no hosts admitted yet, the derived serial, model
    /// `Sluice` and no namespaces.
    pub fn new(nqn: impl Into<String>) -> Self {
        let nqn = nqn.into();
        SubsystemConfig {
            serial: default_serial(&nqn),
            nqn,
            allow_any_host: false,
            hosts: vec![],
            model: MODEL_DEFAULT.into(),
            namespaces: vec![],
        }
    }
    /// Admits `host` (a host NQN).
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.hosts.push(host.into());
        self
    }
    /// Admits every host (the target logs a SECURITY warning).
    pub fn allow_any_host(mut self) -> Self {
        self.allow_any_host = true;
        self
    }
    pub fn with_serial(mut self, s: impl Into<String>) -> Self {
        self.serial = s.into();
        self
    }
    pub fn with_model(mut self, s: impl Into<String>) -> Self {
        self.model = s.into();
        self
    }
    pub fn with_namespace(mut self, ns: NamespaceConfig) -> Self {
        self.namespaces.push(ns);
        self
    }
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

/// A stable serial number derived from the NQN.
pub fn default_serial(nqn: &str) -> String {
    let h = sluice_proto::digest::crc32c(nqn.as_bytes());
    format!("SLC{h:08X}")
}

/// Parses a 128-bit hex UUID (dashes allowed).
pub fn parse_uuid(key: &str, s: &str) -> Result<[u8; 16], ConfigError> {
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

/// Writes a UUID as 32 hex digits (what [`parse_uuid`] reads).
pub fn format_uuid(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}
