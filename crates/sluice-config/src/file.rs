//! The configuration as written in a TOML file, and its validation into
//! [`Config`] (every error names the key, e.g.
//! `subsystem[1].namespace[0].size`). Values that can be mistyped
//! (addresses, sizes, words) are read loosely here so that the error can
//! name the key; the typed values are the ones in [`Config`].

use crate::send::{RawCoalescing, RawSend};
use crate::size::SizeValue;
use crate::subsystem::{format_uuid, parse_uuid, BackendKind, BLOCK_SIZE_DEFAULT, MODEL_DEFAULT};
use crate::target::ADAPTIVE_SPIN_US_DEFAULT;
use crate::tenants::{RawTenant, RawTenants};
use crate::*;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub target: TargetFile,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsystem: Vec<SubsystemFile>,
    /// Tenant settings (`[tenants]`) and tenants (`[[tenant]]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<RawTenants>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenant: Vec<RawTenant>,
}

/// `[target]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polling: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_spin_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_data_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_h2c_data_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_c2h_data_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mdts_bytes: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_queues_max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kato_grace_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_drain_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_scheduler: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<RawSend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalescing: Option<RawCoalescing>,
}

/// `[[subsystem]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemFile {
    pub nqn: String,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_scheduler: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<RawSend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalescing: Option<RawCoalescing>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace: Vec<NamespaceFile>,
}

/// `[[subsystem.namespace]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceFile {
    pub nsid: i64,
    /// `ram`, `file` or `emulated-ssd`.
    pub backend: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<SizeValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssd: Option<SsdConfig>,
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

fn bytes(key: &str, v: &SizeValue) -> Result<u64, ConfigError> {
    v.bytes().map_err(|e| err(key, e.to_string()))
}

/// `[target]` without the send path (which `Config` validates with the
/// subsystems' overrides).
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
        t.workers = ranged("target.workers", w, 1, WORKERS_MAX as i64)? as usize;
    }
    let spin = match r.adaptive_spin_us {
        Some(v) => ranged("target.adaptive_spin_us", v, 1, 1_000_000)? as u32,
        None => ADAPTIVE_SPIN_US_DEFAULT,
    };
    t.polling = match &r.polling {
        Some(p) => PollingPolicy::parse(p, spin).map_err(|e| err("target.polling", e))?,
        None => PollingPolicy::Adaptive { spin_us: spin },
    };
    if let Some(s) = &r.inline_data_bytes {
        let v = bytes("target.inline_data_bytes", s)?;
        if v > INLINE_DATA_BYTES_MAX as u64 || v % 16 != 0 {
            return Err(err(
                "target.inline_data_bytes",
                format!("{v} must be a multiple of 16 up to {INLINE_DATA_BYTES_MAX}"),
            ));
        }
        t.inline_data_bytes = v as u32;
    }
    if let Some(s) = &r.max_h2c_data_bytes {
        let v = bytes("target.max_h2c_data_bytes", s)?;
        if !(4096..=(16 << 20)).contains(&v) || v % 4 != 0 {
            return Err(err(
                "target.max_h2c_data_bytes",
                format!("{v} must be a multiple of 4 from 4096 to 16MiB"),
            ));
        }
        t.max_h2c_data_bytes = v as u32;
    }
    if let Some(s) = &r.max_c2h_data_bytes {
        let v = bytes("target.max_c2h_data_bytes", s)?;
        if !(512..=(16 << 20)).contains(&v) {
            return Err(err(
                "target.max_c2h_data_bytes",
                format!("{v} must be from 512 to 16MiB"),
            ));
        }
        t.max_c2h_data_bytes = v as u32;
    }
    if let Some(s) = &r.mdts_bytes {
        let v = bytes("target.mdts_bytes", s)?;
        if v < 4096 || v > MDTS_BYTES_MAX as u64 || !v.is_power_of_two() {
            return Err(err(
                "target.mdts_bytes",
                format!("{v} must be a power of two from 4KiB to {MDTS_BYTES_MAX}"),
            ));
        }
        t.mdts_bytes = v as u32;
    }
    if let Some(v) = r.queue_depth_max {
        t.queue_depth_max = ranged("target.queue_depth_max", v, 32, QUEUE_DEPTH_MAX as i64)? as u16;
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
            workers: Some(t.workers as i64),
            polling: Some(t.polling.name().to_string()),
            adaptive_spin_us: Some(i64::from(spin)),
            inline_data_bytes: size(t.inline_data_bytes),
            max_h2c_data_bytes: size(t.max_h2c_data_bytes),
            max_c2h_data_bytes: size(t.max_c2h_data_bytes),
            mdts_bytes: size(t.mdts_bytes),
            queue_depth_max: Some(i64::from(t.queue_depth_max)),
            io_queues_max: Some(i64::from(t.io_queues_max)),
            kato_grace_ms: Some(i64::from(t.kato_grace_ms)),
            shutdown_drain_ms: Some(t.shutdown_drain_ms as i64),
            send_scheduler: Some(sched),
            send: Some(send),
            coalescing: Some(co),
        }
    }
}

/// Validates one namespace; `nk` is its key (`subsystem[i].namespace[j]`).
pub fn namespace(nk: &str, n: NamespaceFile) -> Result<NamespaceConfig, ConfigError> {
    let nsid = ranged(
        &format!("{nk}.nsid"),
        n.nsid,
        1,
        NAMESPACES_PER_SUBSYSTEM_MAX as i64,
    )? as u32;
    let block_size_bytes = match n.block_size {
        None => BLOCK_SIZE_DEFAULT,
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
        .map(|s| bytes(&format!("{nk}.size"), s))
        .transpose()?;
    if let Some(sz) = size_bytes {
        if sz == 0 || sz % block_size_bytes as u64 != 0 {
            return Err(err(
                format!("{nk}.size"),
                format!("{sz} must be a non-zero multiple of the block size {block_size_bytes}"),
            ));
        }
    }
    let kind: BackendKind = parse_word(&n.backend).map_err(|e| err(format!("{nk}.backend"), e))?;
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
    Ok(NamespaceConfig {
        nsid,
        backend,
        size_bytes,
        block_size_bytes,
        uuid,
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
            block_size: Some(i64::from(n.block_size_bytes)),
            path: None,
            direct: None,
            engine: None,
            create: None,
            uuid: n.uuid.as_ref().map(format_uuid),
            ssd: None,
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
        }
        f
    }
}

impl TryFrom<ConfigFile> for Config {
    type Error = ConfigError;
    fn try_from(raw: ConfigFile) -> Result<Config, ConfigError> {
        let mut t = target_settings(&raw.target)?;
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
                let sc = send::resolve(
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
            subsystems.push(SubsystemConfig {
                nqn: s.nqn,
                allow_any_host: s.allow_any_host,
                hosts: s.hosts,
                serial,
                model,
                namespaces,
            });
        }
        let tenants = TenantsConfig::from_raw(raw.tenants, raw.tenant)?;
        Ok(Config {
            target: t,
            subsystems,
            tenants,
        })
    }
}

impl From<Config> for ConfigFile {
    fn from(c: Config) -> Self {
        let subsystem_send = c.target.subsystem_send.clone();
        let (tenants, tenant) = c.tenants.to_raw();
        let subsystem = c
            .subsystems
            .into_iter()
            .map(|s| {
                let (send_scheduler, send, coalescing) = match subsystem_send.get(&s.nqn) {
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
                    serial: Some(s.serial),
                    model: Some(s.model),
                    send_scheduler,
                    send,
                    coalescing,
                    namespace: s.namespaces.into_iter().map(NamespaceFile::from).collect(),
                }
            })
            .collect();
        ConfigFile {
            target: TargetFile::from(c.target),
            subsystem,
            tenants,
            tenant,
        }
    }
}
