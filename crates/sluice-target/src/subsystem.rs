//! Subsystems, namespaces and the target-wide registry the queues consult.
//!
//! A subsystem has an NQN, a host allow-list and namespaces; controllers are
//! created by admin-queue Connects and live until their association ends.
//! The registry is built once from the configuration and shared by every
//! worker thread.

use crate::controller::Controller;
use crate::metrics::{HostRegistry, IoCounters};
use sluice_backend::{
    Backend, EmulatedSsd, EngineKind, FileBackend, FileOptions, Geometry, RamBackend, SsdModel,
};
use sluice_config::{
    BackendConfig, Config, Engine, NamespaceConfig, SsdConfig, SubsystemConfig, TargetSettings,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Errors building the registry (opening backends).
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("subsystem `{nqn}` namespace {nsid}: {source}")]
    Backend {
        nqn: String,
        nsid: u32,
        source: sluice_backend::BackendError,
    },
    #[error("subsystem `{nqn}` namespace {nsid}: {reason}")]
    Namespace {
        nqn: String,
        nsid: u32,
        reason: String,
    },
}

/// An exported namespace.
#[derive(Debug)]
pub struct Namespace {
    pub nsid: u32,
    /// Index unique across the target, used by workers to key backend queues.
    pub index: usize,
    pub backend: Arc<dyn Backend>,
    pub geometry: Geometry,
    /// log2 of the block size.
    pub lba_shift: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub counters: IoCounters,
}

impl Namespace {
    pub fn blocks(&self) -> u64 {
        self.geometry.size_bytes >> self.lba_shift
    }
}

/// Subsystem type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    Nvm,
    Discovery,
}

/// A subsystem: namespaces, allowed hosts, live controllers.
#[derive(Debug)]
pub struct Subsystem {
    pub nqn: String,
    pub kind: SubsystemKind,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: HashSet<String>,
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
}

/// Controller IDs handed out are 1..=CNTLID_MAX (0xFFF0 and up are reserved).
pub const CNTLID_MAX: u16 = 0xffef;
/// Live controllers per subsystem.
pub const CONTROLLERS_PER_SUBSYSTEM_MAX: usize = 1024;

impl Subsystem {
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.kind == SubsystemKind::Discovery || self.allow_any_host || self.hosts.contains(hostnqn)
    }

    /// Highest NSID (Identify Controller NN).
    pub fn nn(&self) -> u32 {
        self.namespaces.keys().next_back().copied().unwrap_or(0)
    }

    pub fn volatile_write_cache(&self) -> bool {
        self.namespaces
            .values()
            .any(|n| n.geometry.volatile_write_cache)
    }

    /// Registers a controller under a fresh CNTLID; None when all are in use.
    pub fn add_controller(
        &self,
        make: impl FnOnce(u16) -> Arc<Controller>,
    ) -> Option<Arc<Controller>> {
        let mut ctrls = self.controllers.lock().unwrap_or_else(|p| p.into_inner());
        if ctrls.len() >= CONTROLLERS_PER_SUBSYSTEM_MAX {
            return None;
        }
        let mut next = self.next_cntlid.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..CNTLID_MAX {
            let id = *next;
            *next = if *next >= CNTLID_MAX { 1 } else { *next + 1 };
            if let std::collections::hash_map::Entry::Vacant(e) = ctrls.entry(id) {
                let c = make(id);
                e.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&cntlid)
            .cloned()
    }

    pub fn remove_controller(&self, cntlid: u16) {
        self.controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&cntlid);
    }

    pub fn controller_count(&self) -> usize {
        self.controllers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// Everything the queues share: settings, subsystems, counters.
#[derive(Debug)]
pub struct Registry {
    pub settings: TargetSettings,
    pub subsystems: BTreeMap<String, Arc<Subsystem>>,
    pub discovery: Arc<Subsystem>,
    pub hosts: HostRegistry,
    /// Target-wide send path and coalescing counters (issue 4).
    pub send: crate::metrics::SendTotals,
    /// Discovery log generation counter.
    pub discovery_genctr: AtomicU64,
    /// Namespaces by target-wide index.
    pub namespaces: Vec<Arc<Namespace>>,
}

fn derive_ids(nqn: &str, nsid: u32, uuid: Option<[u8; 16]>) -> ([u8; 16], [u8; 8]) {
    let nguid = uuid.unwrap_or_else(|| {
        let mut g = [0u8; 16];
        let a = sluice_proto::digest::crc32c(nqn.as_bytes());
        let b = sluice_proto::digest::crc32c(&nsid.to_le_bytes());
        let c = sluice_proto::digest::crc32c_append(a, &nsid.to_be_bytes());
        let d = sluice_proto::digest::crc32c_append(b, nqn.as_bytes());
        g[0..4].copy_from_slice(&a.to_be_bytes());
        g[4..8].copy_from_slice(&b.to_be_bytes());
        g[8..12].copy_from_slice(&c.to_be_bytes());
        g[12..16].copy_from_slice(&d.to_be_bytes());
        // RFC 4122 version 4 / variant bits, so the value is also a valid UUID.
        g[6] = (g[6] & 0x0f) | 0x40;
        g[8] = (g[8] & 0x3f) | 0x80;
        g
    });
    let mut eui = [0u8; 8];
    eui.copy_from_slice(&nguid[8..16]);
    (nguid, eui)
}

fn open_backend(
    sc: &SubsystemConfig,
    nc: &NamespaceConfig,
) -> Result<Arc<dyn Backend>, RegistryError> {
    let wrap = |source| RegistryError::Backend {
        nqn: sc.nqn.clone(),
        nsid: nc.nsid,
        source,
    };
    let size = nc.size_bytes.unwrap_or(0);
    Ok(match &nc.backend {
        BackendConfig::Ram => Arc::new(RamBackend::new(size, nc.block_size_bytes).map_err(wrap)?),
        BackendConfig::EmulatedSsd(m) => {
            Arc::new(EmulatedSsd::new(size, nc.block_size_bytes, ssd_model(m)).map_err(wrap)?)
        }
        BackendConfig::File {
            path,
            direct,
            engine,
            create,
        } => {
            let engine = match engine {
                Engine::IoUring => EngineKind::IoUring,
                Engine::Sync => EngineKind::Sync,
                Engine::Auto => EngineKind::Auto,
            };
            let opts = FileOptions {
                direct: *direct,
                block_size_bytes: Some(nc.block_size_bytes),
                create_size_bytes: if *create { nc.size_bytes } else { None },
                engine,
                read_only: false,
            };
            Arc::new(FileBackend::open(path, opts).map_err(wrap)?)
        }
    })
}

/// The emulated SSD's service model: the configured values over
/// `SsdModel::default()` (the one place the defaults are defined).
pub fn ssd_model(c: &SsdConfig) -> SsdModel {
    let d = SsdModel::default();
    SsdModel {
        read_iops_max: c.read_iops_max.unwrap_or(d.read_iops_max),
        write_iops_max: c.write_iops_max.unwrap_or(d.write_iops_max),
        read_bytes_per_sec_max: c.read_bytes_per_sec_max.unwrap_or(d.read_bytes_per_sec_max),
        write_bytes_per_sec_max: c
            .write_bytes_per_sec_max
            .unwrap_or(d.write_bytes_per_sec_max),
        base_read_latency_us: c.base_read_latency_us.unwrap_or(d.base_read_latency_us),
        base_write_latency_us: c.base_write_latency_us.unwrap_or(d.base_write_latency_us),
        parallelism: c.parallelism.unwrap_or(d.parallelism),
    }
}

impl Registry {
    /// Opens every backend and builds the registry.
    pub fn build(config: &Config) -> Result<Registry, RegistryError> {
        let mut subsystems = BTreeMap::new();
        let mut all_ns = Vec::new();
        for sc in &config.subsystems {
            let mut namespaces = BTreeMap::new();
            for nc in &sc.namespaces {
                let backend = open_backend(sc, nc)?;
                let geometry = backend.geometry();
                if geometry.block_size_bytes != 512 && geometry.block_size_bytes != 4096 {
                    return Err(RegistryError::Namespace {
                        nqn: sc.nqn.clone(),
                        nsid: nc.nsid,
                        reason: format!(
                            "block size {} is not 512 or 4096",
                            geometry.block_size_bytes
                        ),
                    });
                }
                if geometry.size_bytes < geometry.block_size_bytes as u64 {
                    return Err(RegistryError::Namespace {
                        nqn: sc.nqn.clone(),
                        nsid: nc.nsid,
                        reason: "backend is smaller than one block".into(),
                    });
                }
                let (nguid, eui64) = derive_ids(&sc.nqn, nc.nsid, nc.uuid);
                let ns = Arc::new(Namespace {
                    nsid: nc.nsid,
                    index: all_ns.len(),
                    backend,
                    geometry,
                    lba_shift: geometry.block_size_bytes.trailing_zeros() as u8,
                    nguid,
                    eui64,
                    counters: IoCounters::default(),
                });
                all_ns.push(ns.clone());
                namespaces.insert(nc.nsid, ns);
            }
            if !sc.allow_any_host {
                tracing::info!(subsystem = %sc.nqn, hosts = sc.hosts.len(), "subsystem admits only its listed hosts");
            } else {
                tracing::warn!(
                    subsystem = %sc.nqn,
                    "SECURITY: subsystem admits ANY host (allow_any_host = true); list host NQNs to restrict it"
                );
            }
            subsystems.insert(
                sc.nqn.clone(),
                Arc::new(Subsystem {
                    nqn: sc.nqn.clone(),
                    kind: SubsystemKind::Nvm,
                    serial: sc.serial.clone(),
                    model: sc.model.clone(),
                    allow_any_host: sc.allow_any_host,
                    hosts: sc.hosts.iter().cloned().collect(),
                    namespaces,
                    controllers: Mutex::new(HashMap::new()),
                    next_cntlid: Mutex::new(1),
                }),
            );
        }
        let discovery = Arc::new(Subsystem {
            nqn: sluice_proto::DISCOVERY_NQN.to_string(),
            kind: SubsystemKind::Discovery,
            serial: sluice_config::default_serial(sluice_proto::DISCOVERY_NQN),
            model: "Sluice Discovery".into(),
            allow_any_host: true,
            hosts: HashSet::new(),
            namespaces: BTreeMap::new(),
            controllers: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(1),
        });
        Ok(Registry {
            settings: config.target.clone(),
            subsystems,
            discovery,
            hosts: HostRegistry::default(),
            send: crate::metrics::SendTotals::default(),
            discovery_genctr: AtomicU64::new(1),
            namespaces: all_ns,
        })
    }

    /// Finds the subsystem an NQN names (including discovery).
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == sluice_proto::DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        self.subsystems.get(nqn).cloned()
    }

    pub fn genctr(&self) -> u64 {
        self.discovery_genctr.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod ssd_defaults {
    use super::*;

    /// An `emulated-ssd` namespace without `ssd` keys gets the model
    /// documented in docs/configuration.md, from `SsdModel::default()`.
    #[test]
    fn config_without_ssd_keys_gets_the_documented_model() {
        let m = ssd_model(&SsdConfig::default());
        assert_eq!(m, SsdModel::default());
        assert_eq!(
            (m.read_iops_max, m.write_iops_max, m.parallelism),
            (100_000, 50_000, 8)
        );
        assert_eq!(
            (m.read_bytes_per_sec_max, m.write_bytes_per_sec_max),
            (1_000_000_000, 500_000_000)
        );
        assert_eq!((m.base_read_latency_us, m.base_write_latency_us), (80, 20));
        let m = ssd_model(&SsdConfig::default().with_read_iops_max(7));
        assert_eq!((m.read_iops_max, m.write_iops_max), (7, 50_000));
    }
}
