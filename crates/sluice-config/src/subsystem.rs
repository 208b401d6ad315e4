//! `[[subsystem]]` and `[[subsystem.namespace]]`: NQNs, host allow-lists,
//! namespaces and their backends; the tables as written ([`SubsystemFile`],
//! [`NamespaceFile`]) and their validation into [`SubsystemConfig`] and
//! [`NamespaceConfig`] (every error names the key, e.g.
//! `subsystem[1].namespace[0].size`), and back.

use crate::send::{self, RawCoalescing, RawSend};
use crate::size::SizeValue;
use crate::{
    bytes, err, parse_word, ranged, ranged_as, word_of, ConfigError, HOSTS_PER_SUBSYSTEM_MAX,
    NAMESPACES_PER_SUBSYSTEM_MAX,
};
use serde::{Deserialize, Serialize};
use sluice_proto::send::SendConfig;
use std::collections::HashSet;
use std::path::PathBuf;

/// NQN of the subsystem in the embedded default configuration.
pub const DEFAULT_SUBSYSTEM_NQN: &str = "nqn.2026-11.io.sluice:ram0";

/// Which backend a namespace uses: `backend = "ram" | "file" | "emulated-ssd" | "volume"`.
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
    /// An elastic volume of the control plane at `control`: its pieces go
    /// straight to the drives holding its extents (docs/volumes.md). Size
    /// and block size come from the volume.
    Volume {
        name: String,
        /// The control plane's `HOST:PORT`.
        control: String,
        /// The control plane's bearer token.
        token_file: Option<PathBuf>,
    },
}

/// Default control-plane address of a `volume` namespace.
pub const CONTROL_DEFAULT: &str = "127.0.0.1:9500";

/// The words of `backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    Ram,
    File,
    EmulatedSsd,
    Volume,
}

impl BackendConfig {
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendConfig::Ram => BackendKind::Ram,
            BackendConfig::File { .. } => BackendKind::File,
            BackendConfig::EmulatedSsd(_) => BackendKind::EmulatedSsd,
            BackendConfig::Volume { .. } => BackendKind::Volume,
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
#[serde(try_from = "NamespaceFile", into = "NamespaceFile")]
pub struct NamespaceConfig {
    pub nsid: u32,
    pub backend: BackendConfig,
    /// Size in bytes (RAM and emulated SSD; files may create/extend to it).
    pub size_bytes: Option<u64>,
    /// The LBA size (512 or 4096). The config file leaves it `None` only
    /// for `file`: the backend takes a block device's logical block size,
    /// or a regular file's filesystem block size (4096 at most), so that no
    /// direct write covers part of a filesystem block
    /// (docs/configuration.md). Set `None` elsewhere: a volume's own, 512
    /// for RAM and the emulated SSD.
    pub block_size_bytes: Option<u32>,
    /// Optional fixed NGUID/UUID; derived from the subsystem NQN and NSID otherwise.
    pub uuid: Option<[u8; 16]>,
    /// RAM backend: each 2 MiB chunk on a huge page (faster random I/O; a
    /// first write into a chunk may stall for milliseconds). Off by default.
    pub huge_pages: bool,
}

/// Default of `block_size` for `ram` and `emulated-ssd`.
pub const BLOCK_SIZE_DEFAULT: u32 = 512;

impl NamespaceConfig {
    fn new(nsid: u32, backend: BackendConfig, size_bytes: Option<u64>) -> Self {
        // A file's comes from the file (see the field).
        let block_size_bytes = match backend {
            BackendConfig::File { .. } => None,
            _ => Some(BLOCK_SIZE_DEFAULT),
        };
        NamespaceConfig {
            nsid,
            backend,
            size_bytes,
            block_size_bytes,
            uuid: None,
            huge_pages: false,
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
    /// An elastic volume served by the control plane at `control`.
    pub fn volume(nsid: u32, name: impl Into<String>, control: impl Into<String>) -> Self {
        let backend = BackendConfig::Volume {
            name: name.into(),
            control: control.into(),
            token_file: None,
        };
        let mut n = Self::new(nsid, backend, None);
        n.block_size_bytes = Some(4096);
        n
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
        self.block_size_bytes = Some(bytes);
        self
    }
    /// RAM backend: chunks on huge pages (see [`NamespaceConfig::huge_pages`]).
    pub fn with_huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
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
    /// DH-HMAC-CHAP secrets per host: a host with one must authenticate.
    #[serde(default)]
    pub dhchap: Vec<crate::auth::HostAuthConfig>,
    /// Every host must authenticate: hosts without a secret are refused.
    #[serde(default)]
    pub require_auth: bool,
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
            dhchap: vec![],
            require_auth: false,
            model: MODEL_DEFAULT.into(),
            namespaces: vec![],
        }
    }
    /// Admits `host` (a host NQN).
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.hosts.push(host.into());
        self
    }
    /// Makes `auth.host` authenticate with DH-HMAC-CHAP.
    pub fn with_dhchap(mut self, auth: crate::auth::HostAuthConfig) -> Self {
        self.dhchap.push(auth);
        self
    }
    /// Refuses hosts that have no DH-HMAC-CHAP secret.
    pub fn require_auth(mut self) -> Self {
        self.require_auth = true;
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
    sluice_proto::fabrics::parse_uuid(s)
        .ok_or_else(|| err(key, format!("`{s}` is not a 128-bit hex UUID")))
}

/// Writes a UUID as 32 hex digits (what [`parse_uuid`] reads).
pub fn format_uuid(u: &[u8; 16]) -> String {
    sluice_proto::fabrics::format_uuid(u)
}

/// `[[subsystem]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemFile {
    pub(crate) nqn: String,
    #[serde(default)]
    pub(crate) allow_any_host: bool,
    #[serde(default)]
    pub(crate) hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) dhchap: Vec<crate::auth::HostAuthFile>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) require_auth: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send_scheduler: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send: Option<RawSend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) coalescing: Option<RawCoalescing>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) namespace: Vec<NamespaceFile>,
}

/// `[[subsystem.namespace]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceFile {
    pub(crate) nsid: i64,
    /// `ram`, `file` or `emulated-ssd`.
    pub(crate) backend: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) size: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) block_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) direct: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) create: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ssd: Option<SsdConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) huge_pages: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) control: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token_file: Option<PathBuf>,
}

/// Validates one namespace; `nk` is its key (`subsystem[i].namespace[j]`).
pub fn namespace(nk: &str, n: NamespaceFile) -> Result<NamespaceConfig, ConfigError> {
    let nsid = ranged_as(
        &format!("{nk}.nsid"),
        n.nsid,
        1,
        NAMESPACES_PER_SUBSYSTEM_MAX,
    )?;
    let kind: BackendKind = parse_word(&n.backend).map_err(|e| err(format!("{nk}.backend"), e))?;
    let block_size_bytes = match (n.block_size, kind) {
        // A volume's block size is the volume's (4096 unless created with
        // 512); the target checks they agree when it opens the volume.
        (None, BackendKind::Volume) => Some(4096),
        // The file's own (see `NamespaceConfig::block_size_bytes`).
        (None, BackendKind::File) => None,
        (None, BackendKind::Ram | BackendKind::EmulatedSsd) => Some(BLOCK_SIZE_DEFAULT),
        (Some(512), _) => Some(512),
        (Some(4096), _) => Some(4096),
        (Some(v), _) => {
            return Err(err(
                format!("{nk}.block_size"),
                format!("{v} must be 512 or 4096"),
            ))
        }
    };
    let size_bytes = n
        .size
        .as_ref()
        .map(|s| bytes(&format!("{nk}.size"), s))
        .transpose()?;
    if let Some(sz) = size_bytes {
        // A file's own block size is known when it is opened (a tail past
        // the last whole block is then ignored, with a warning).
        let bs = block_size_bytes.unwrap_or(512);
        if sz == 0 || sz % u64::from(bs) != 0 {
            return Err(err(
                format!("{nk}.size"),
                format!("{sz} must be a non-zero multiple of the block size {bs}"),
            ));
        }
    }
    let backend = match kind {
        BackendKind::Ram | BackendKind::EmulatedSsd => {
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
            if kind == BackendKind::Ram {
                if n.ssd.is_some() {
                    return Err(err(format!("{nk}.ssd"), "only for backend `emulated-ssd`"));
                }
                BackendConfig::Ram
            } else {
                let m = n.ssd.unwrap_or_default();
                m.validate(&format!("{nk}.ssd"))?;
                BackendConfig::EmulatedSsd(m)
            }
        }
        BackendKind::Volume => {
            let name = n.volume.ok_or_else(|| {
                err(
                    format!("{nk}.volume"),
                    "required for backend `volume` (the volume's name)",
                )
            })?;
            if name.is_empty() {
                return Err(err(format!("{nk}.volume"), "must not be empty"));
            }
            if size_bytes.is_some() {
                return Err(err(
                    format!("{nk}.size"),
                    "not used by backend `volume` (the volume has its size)",
                ));
            }
            for (k, set) in [("path", n.path.is_some()), ("ssd", n.ssd.is_some())] {
                if set {
                    return Err(err(format!("{nk}.{k}"), "not used by backend `volume`"));
                }
            }
            let control = n.control.unwrap_or_else(|| CONTROL_DEFAULT.to_owned());
            let host_port = |a: &str| {
                a.trim()
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
            };
            if !control.split(',').all(host_port) {
                return Err(err(
                    format!("{nk}.control"),
                    format!("{control:?} is not HOST:PORT (or several, comma-separated)"),
                ));
            }
            BackendConfig::Volume {
                name,
                control,
                token_file: n.token_file,
            }
        }
        BackendKind::File => {
            let path = n
                .path
                .ok_or_else(|| err(format!("{nk}.path"), "required for backend `file`"))?;
            let engine = match &n.engine {
                Some(e) => parse_word(e).map_err(|r| err(format!("{nk}.engine"), r))?,
                None => Engine::Auto,
            };
            BackendConfig::File {
                path,
                direct: n.direct.unwrap_or(true),
                engine,
                create: n.create.unwrap_or(false),
            }
        }
    };
    let uuid = n
        .uuid
        .as_deref()
        .map(|u| parse_uuid(&format!("{nk}.uuid"), u))
        .transpose()?;
    let huge_pages = n.huge_pages.unwrap_or(false);
    if huge_pages && backend.kind() != BackendKind::Ram {
        return Err(err(format!("{nk}.huge_pages"), "only for backend `ram`"));
    }
    Ok(NamespaceConfig {
        nsid,
        backend,
        size_bytes,
        block_size_bytes,
        uuid,
        huge_pages,
    })
}

impl TryFrom<NamespaceFile> for NamespaceConfig {
    type Error = ConfigError;
    fn try_from(n: NamespaceFile) -> Result<Self, ConfigError> {
        namespace("namespace", n)
    }
}

impl From<NamespaceConfig> for NamespaceFile {
    fn from(n: NamespaceConfig) -> Self {
        let mut f = NamespaceFile {
            nsid: i64::from(n.nsid),
            backend: word_of(&n.backend.kind()),
            size: n.size_bytes.map(SizeValue::from),
            block_size: n.block_size_bytes.map(i64::from),
            path: None,
            direct: None,
            engine: None,
            create: None,
            uuid: n.uuid.as_ref().map(format_uuid),
            ssd: None,
            huge_pages: n.huge_pages.then_some(true),
            volume: None,
            control: None,
            token_file: None,
        };
        match n.backend {
            BackendConfig::Ram => {}
            BackendConfig::File {
                path,
                direct,
                engine,
                create,
            } => {
                f.path = Some(path);
                f.direct = Some(direct);
                f.engine = Some(word_of(&engine));
                f.create = Some(create);
            }
            BackendConfig::EmulatedSsd(m) => f.ssd = Some(m),
            BackendConfig::Volume {
                name,
                control,
                token_file,
            } => {
                f.volume = Some(name);
                f.control = Some(control);
                f.token_file = token_file;
            }
        }
        f
    }
}

/// Validates one subsystem; `k` is its key (`subsystem[i]`), `target_send`
/// the target's send path its overrides start from, `seen` the NQNs of the
/// subsystems before it. Returns the subsystem and its send path override.
pub fn subsystem(
    k: &str,
    s: SubsystemFile,
    target_send: &SendConfig,
    seen: &mut HashSet<String>,
) -> Result<(SubsystemConfig, Option<SendConfig>), ConfigError> {
    let send = if s.send_scheduler.is_some() || s.send.is_some() || s.coalescing.is_some() {
        Some(send::resolve(
            target_send,
            k,
            s.send_scheduler.as_deref(),
            s.send.as_ref(),
            s.coalescing.as_ref(),
        )?)
    } else {
        None
    };
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
    if s.dhchap.len() > HOSTS_PER_SUBSYSTEM_MAX {
        return Err(err(
            format!("{k}.dhchap"),
            format!("more than {HOSTS_PER_SUBSYSTEM_MAX} entries"),
        ));
    }
    let mut dhchap = Vec::with_capacity(s.dhchap.len());
    let mut keyed = HashSet::new();
    for (j, f) in s.dhchap.into_iter().enumerate() {
        let dk = format!("{k}.dhchap[{j}]");
        let a = crate::auth::parse(f, &dk)?;
        validate_nqn(&format!("{dk}.host"), &a.host)?;
        if !s.allow_any_host && !s.hosts.contains(&a.host) {
            return Err(err(
                format!("{dk}.host"),
                format!("`{}` is not in `hosts`: add it there too (a secret does not admit a host by itself)", a.host),
            ));
        }
        if !keyed.insert(a.host.clone()) {
            return Err(err(
                format!("{dk}.host"),
                format!("`{}` has two entries", a.host),
            ));
        }
        dhchap.push(a);
    }
    if s.require_auth && dhchap.is_empty() {
        return Err(err(
            format!("{k}.require_auth"),
            "no host could connect: give hosts secrets in [[subsystem.dhchap]]",
        ));
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
    let model = s.model.unwrap_or_else(|| MODEL_DEFAULT.to_string());
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
        )?;
        if !nsids.insert(nsid) {
            return Err(err(
                format!("{nk}.nsid"),
                format!("nsid {nsid} is used twice"),
            ));
        }
        namespaces.push(namespace(&nk, n)?);
    }
    let sc = SubsystemConfig {
        nqn: s.nqn,
        allow_any_host: s.allow_any_host,
        hosts: s.hosts,
        dhchap,
        require_auth: s.require_auth,
        serial,
        model,
        namespaces,
    };
    Ok((sc, send))
}

impl SubsystemFile {
    /// The table of `s`, with its send path override `send` if it has one.
    pub fn from_config(s: SubsystemConfig, send: Option<&SendConfig>) -> Self {
        let (send_scheduler, send, coalescing) = match send {
            Some(sc) => {
                let (a, b, c) = send::to_raw(sc);
                (Some(a), Some(b), Some(c))
            }
            None => (None, None, None),
        };
        SubsystemFile {
            nqn: s.nqn,
            allow_any_host: s.allow_any_host,
            hosts: s.hosts,
            dhchap: s.dhchap.into_iter().map(crate::auth::raw).collect(),
            require_auth: s.require_auth,
            serial: Some(s.serial),
            model: Some(s.model),
            send_scheduler,
            send,
            coalescing,
            namespace: s.namespaces.into_iter().map(NamespaceFile::from).collect(),
        }
    }
}
