//! The target-wide registry the queues consult: settings, subsystems,
//! namespace indices, host counters, connection admission, and the live
//! controllers of each subsystem (by CNTLID). Built from the configuration
//! and shared by every worker thread; a configuration reload adds and
//! removes subsystems (`reload.rs`); controllers are added by admin-queue
//! Connects and live until their association ends.

use crate::controller::Controller;
use crate::metrics::HostRegistry;
use crate::subsystem::{
    ssd_model, Access, Namespace, NamespaceIds, NamespaceMap, Subsystem, SubsystemKind,
};
use sluice_backend::{
    Backend, BackendError, EmulatedSsd, EngineKind, FileBackend, FileOptions, RamBackend,
};
use sluice_config::{
    BackendConfig, Config, Engine, NamespaceConfig, SubsystemConfig, TargetSettings,
};
use sluice_runtime::sync::{lock, read, write};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Errors building the registry (opening backends).
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("subsystem `{nqn}` namespace {nsid}: {source}")]
    Backend {
        nqn: String,
        nsid: u32,
        source: BackendError,
    },
    #[error("subsystem `{nqn}` namespace {nsid}: {reason}")]
    Namespace {
        nqn: String,
        nsid: u32,
        reason: String,
    },
}

/// Opens backends the target cannot build by itself: elastic volumes, whose
/// client lives in `sluice-control` (the CLI passes one in; the target does
/// not depend on the control plane).
pub trait VolumeOpener: Send + Sync {
    /// Opens volume `name` of the control plane at `control`.
    fn open_volume(
        &self,
        name: &str,
        control: &str,
        token_file: Option<&std::path::Path>,
    ) -> Result<Arc<dyn Backend>, String>;
}

/// The opener of a target started without a control-plane client.
#[derive(Debug)]
pub struct NoVolumes;

impl VolumeOpener for NoVolumes {
    fn open_volume(
        &self,
        name: &str,
        _: &str,
        _: Option<&std::path::Path>,
    ) -> Result<Arc<dyn Backend>, String> {
        Err(format!("backend `volume` ({name:?}) needs the control-plane client: start the target with `sluice target`"))
    }
}

/// Controller IDs handed out are 1..=CNTLID_MAX (0xFFF0 and up are reserved).
pub const CNTLID_MAX: u16 = 0xffef;
/// Live controllers per subsystem.
pub const CONTROLLERS_PER_SUBSYSTEM_MAX: usize = 1024;

/// One subsystem's live controllers.
#[derive(Debug)]
struct ControllerTable {
    live: HashMap<u16, Arc<Controller>>,
    next_cntlid: u16,
}

impl ControllerTable {
    fn new() -> Self {
        ControllerTable {
            live: HashMap::new(),
            next_cntlid: 1,
        }
    }
}

/// Everything the queues share: settings, subsystems, counters.
#[derive(Debug)]
pub struct Registry {
    pub(crate) settings: TargetSettings,
    /// The NVM subsystems by NQN, replaced whole when a reload adds or
    /// removes some ([`Registry::subsystems`]).
    subsystems: RwLock<Arc<BTreeMap<String, Arc<Subsystem>>>>,
    pub(crate) discovery: Arc<Subsystem>,
    pub hosts: HostRegistry,
    /// Target-wide send path and coalescing counters: every queue's
    /// `SendStats`, summed.
    pub(crate) send: crate::metrics::SendTotals,
    /// Target-wide receive counters: bytes read, and read in place.
    pub(crate) receive: crate::metrics::ReceiveTotals,
    /// Connection limits and counts (the acceptor admits, connections
    /// hold permits).
    pub admission: Arc<crate::admission::Admission>,
    /// DH-HMAC-CHAP successes and failures (by reason).
    pub auth: crate::metrics::AuthCounters,
    /// Configuration reloads applied and refused.
    pub reloads: crate::metrics::ReloadCounters,
    /// Discovery log generation counter.
    pub(crate) discovery_genctr: AtomicU64,
    /// Namespace indices handed out so far (never reused: workers and
    /// tenants key per-namespace state by index).
    namespaces_built: AtomicUsize,
    /// Bumped by each reload that removes subsystems: workers then look
    /// for backend queues of retired namespaces to drop.
    pub(crate) removals: AtomicU64,
    /// Live controllers by subsystem ([`Subsystem::id`]; the discovery
    /// subsystem included), created with a subsystem's first controller.
    controllers: Mutex<HashMap<u64, ControllerTable>>,
    /// The configuration in force: what it was built with, with the
    /// subsystems' access as the last reload left it (`reload.rs`).
    pub(crate) running: Mutex<Config>,
}

/// A namespace's identity beyond its NQN and NSID, folded into its NGUID:
/// a file's path, so two targets exporting different files differ; a
/// volume's name, so a volume keeps its NGUID across restarts; and for
/// volatile backends (RAM, emulated SSD) a value drawn at start-up, so a
/// restarted target, whose RAM namespaces come back empty, reports new
/// NGUIDs: a host (Linux multipath, Sluice's volume client) then sees a new
/// namespace instead of trusting the old one's contents.
fn namespace_identity(backend: &sluice_config::BackendConfig, instance: &[u8; 16]) -> Vec<u8> {
    match backend {
        sluice_config::BackendConfig::File { path, .. } => {
            let p = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            p.as_os_str().as_encoded_bytes().to_vec()
        }
        // A volume outlives the target: the same volume keeps its NGUID.
        sluice_config::BackendConfig::Volume { name, .. } => name.as_bytes().to_vec(),
        sluice_config::BackendConfig::Ram | sluice_config::BackendConfig::EmulatedSsd(_) => {
            instance.to_vec()
        }
    }
}

/// 16 bytes that differ between target start-ups.
fn instance_nonce() -> [u8; 16] {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `len` bytes into the buffer it is given.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n).ok() != Some(b.len()) {
        // No getrandom: the clock and the PID still differ between starts.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b.copy_from_slice(&(t ^ u128::from(std::process::id()) << 64).to_le_bytes());
    }
    b
}

fn derive_ids(
    nqn: &str,
    nsid: u32,
    uuid: Option<[u8; 16]>,
    identity: &[u8],
) -> ([u8; 16], [u8; 8]) {
    let nguid = uuid.unwrap_or_else(|| {
        let mut g = [0u8; 16];
        let a = sluice_proto::digest::crc32c_append(
            sluice_proto::digest::crc32c(nqn.as_bytes()),
            identity,
        );
        let b = sluice_proto::digest::crc32c_append(
            sluice_proto::digest::crc32c(&nsid.to_le_bytes()),
            identity,
        );
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

/// A backend names the constructor argument it refuses; the operator wrote
/// a config key, so the error names that key.
pub(crate) fn in_config_terms(e: BackendError) -> BackendError {
    match e {
        BackendError::InvalidConfig { field, reason } => BackendError::InvalidConfig {
            field: match field {
                "block_size_bytes" => "block_size",
                "size_bytes" | "create_size_bytes" => "size",
                other => other,
            },
            reason,
        },
        other => other,
    }
}

fn open_backend(
    sc: &SubsystemConfig,
    nc: &NamespaceConfig,
    volumes: &dyn VolumeOpener,
) -> Result<Arc<dyn Backend>, RegistryError> {
    let wrap = |source| RegistryError::Backend {
        nqn: sc.nqn.clone(),
        nsid: nc.nsid,
        source: in_config_terms(source),
    };
    let size = nc.size_bytes.unwrap_or(0);
    // Left out: a file's own (the backend decides), a volume's own, and
    // 512 for RAM and the emulated SSD (the config file always sets theirs).
    let bs = nc
        .block_size_bytes
        .unwrap_or(sluice_config::BLOCK_SIZE_DEFAULT);
    Ok(match &nc.backend {
        BackendConfig::Ram => {
            Arc::new(RamBackend::with_huge_pages(size, bs, nc.huge_pages).map_err(wrap)?)
        }
        BackendConfig::EmulatedSsd(m) => {
            Arc::new(EmulatedSsd::new(size, bs, ssd_model(m)).map_err(wrap)?)
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
                block_size_bytes: nc.block_size_bytes,
                create_size_bytes: if *create { nc.size_bytes } else { None },
                engine,
                read_only: false,
            };
            Arc::new(FileBackend::open(path, opts).map_err(wrap)?)
        }
        BackendConfig::Volume {
            name,
            control,
            token_file,
        } => {
            let b = volumes
                .open_volume(name, control, token_file.as_deref())
                .map_err(|reason| RegistryError::Namespace {
                    nqn: sc.nqn.clone(),
                    nsid: nc.nsid,
                    reason,
                })?;
            let has = b.geometry().block_size_bytes;
            if let Some(want) = nc.block_size_bytes.filter(|&want| want != has) {
                return Err(RegistryError::Namespace {
                    nqn: sc.nqn.clone(),
                    nsid: nc.nsid,
                    reason: format!(
                        "volume {name:?} has {has}-byte blocks but block_size is {want}"
                    ),
                });
            }
            b
        }
    })
}

/// Builds namespace `nc` of subsystem `sc` under target-wide index
/// `index`, opening its backend.
fn build_namespace(
    sc: &SubsystemConfig,
    nc: &NamespaceConfig,
    volumes: &dyn VolumeOpener,
    instance: &[u8; 16],
    index: usize,
) -> Result<Arc<Namespace>, RegistryError> {
    let backend = open_backend(sc, nc, volumes)?;
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
    let identity = namespace_identity(&nc.backend, instance);
    let (nguid, eui64) = derive_ids(&sc.nqn, nc.nsid, nc.uuid, &identity);
    Ok(Arc::new(Namespace::new(
        NamespaceIds {
            nsid: nc.nsid,
            index,
            nguid,
            eui64,
        },
        backend,
    )))
}

/// Builds subsystem `sc` with its namespaces, numbered from `first_index`
/// (target-wide namespace indices, never reused), opening their backends.
fn build_subsystem(
    sc: &SubsystemConfig,
    volumes: &dyn VolumeOpener,
    instance: &[u8; 16],
    first_index: usize,
) -> Result<Subsystem, RegistryError> {
    let mut namespaces = BTreeMap::new();
    for (i, nc) in sc.namespaces.iter().enumerate() {
        let ns = build_namespace(sc, nc, volumes, instance, first_index + i)?;
        namespaces.insert(nc.nsid, ns);
    }
    Ok(Subsystem::new(
        sc.nqn.clone(),
        SubsystemKind::Nvm,
        sc.serial.clone(),
        sc.model.clone(),
        Access::from_config(sc),
        namespaces,
    ))
}

/// Logs who subsystem `sc` admits, loudly when it is any host: at start,
/// and when a reload has added it.
pub(crate) fn log_access(sc: &SubsystemConfig) {
    if !sc.dhchap.is_empty() {
        tracing::info!(
            subsystem = %sc.nqn,
            hosts = sc.dhchap.len(),
            require_auth = sc.require_auth,
            "DH-HMAC-CHAP: hosts with a secret must authenticate"
        );
    }
    if !sc.allow_any_host {
        tracing::info!(subsystem = %sc.nqn, hosts = sc.hosts.len(), "subsystem admits only its listed hosts");
    } else {
        tracing::warn!(
            subsystem = %sc.nqn,
            "SECURITY: subsystem admits ANY host (allow_any_host = true); list host NQNs to restrict it"
        );
    }
}

/// What a reload adds, built and not yet registered
/// ([`Registry::build_added`]).
#[derive(Debug, Default)]
pub(crate) struct Built {
    pub(crate) subsystems: Vec<Arc<Subsystem>>,
    /// Namespaces for kept subsystems, one list per subsystem asked for.
    pub(crate) namespaces: Vec<Vec<Arc<Namespace>>>,
}

impl Registry {
    /// Opens every backend and builds the registry.
    pub fn build(config: &Config) -> Result<Registry, RegistryError> {
        Self::build_with(config, &NoVolumes)
    }

    /// Builds the registry, opening `volume` namespaces through `volumes`.
    pub fn build_with(
        config: &Config,
        volumes: &dyn VolumeOpener,
    ) -> Result<Registry, RegistryError> {
        let mut subsystems = BTreeMap::new();
        let instance = instance_nonce();
        let mut next_index = 0;
        for sc in &config.subsystems {
            let sub = build_subsystem(sc, volumes, &instance, next_index)?;
            log_access(sc);
            next_index += sc.namespaces.len();
            subsystems.insert(sc.nqn.clone(), Arc::new(sub));
        }
        let discovery = Arc::new(Subsystem::new(
            sluice_proto::DISCOVERY_NQN.to_string(),
            SubsystemKind::Discovery,
            sluice_config::default_serial(sluice_proto::DISCOVERY_NQN),
            "Sluice Discovery".into(),
            Access::open(),
            BTreeMap::new(),
        ));
        Ok(Registry {
            settings: config.target.clone(),
            subsystems: RwLock::new(Arc::new(subsystems)),
            discovery,
            hosts: HostRegistry::default(),
            send: crate::metrics::SendTotals::default(),
            receive: crate::metrics::ReceiveTotals::default(),
            admission: Arc::new(crate::admission::Admission::new(&config.target)),
            auth: crate::metrics::AuthCounters::default(),
            reloads: crate::metrics::ReloadCounters::default(),
            discovery_genctr: AtomicU64::new(1),
            namespaces_built: AtomicUsize::new(next_index),
            removals: AtomicU64::new(0),
            controllers: Mutex::new(HashMap::new()),
            running: Mutex::new(config.clone()),
        })
    }

    /// Builds what a reload adds: the subsystems `added`, and in kept
    /// subsystems the namespaces `namespaces` (each list with its
    /// subsystem's configuration), numbering the namespaces after every
    /// index handed out so far; nothing is registered (see
    /// [`Registry::swap_subsystems`] and [`Registry::replace_namespaces`]).
    /// The caller holds `running`, so no other build hands out the same
    /// indices. Volatile namespaces get NGUIDs of their own, as after a
    /// restart: one removed and added again comes back empty, and a host
    /// must not take it for the one it knew.
    pub(crate) fn build_added(
        &self,
        added: &[&SubsystemConfig],
        namespaces: &[(&SubsystemConfig, Vec<&NamespaceConfig>)],
        volumes: &dyn VolumeOpener,
    ) -> Result<Built, RegistryError> {
        let mut next_index = self.namespaces_built.load(Ordering::Acquire);
        let instance = instance_nonce();
        let reserve = |sc: &SubsystemConfig, nsid: u32, n: usize, next_index: usize| {
            if next_index + n > sluice_config::NAMESPACES_TOTAL_MAX {
                return Err(RegistryError::Namespace {
                    nqn: sc.nqn.clone(),
                    nsid,
                    reason: format!(
                        "the target has handed out {next_index} namespace indices (removed namespaces' included, until a restart); {n} more exceed the limit of {}",
                        sluice_config::NAMESPACES_TOTAL_MAX
                    ),
                });
            }
            Ok(next_index + n)
        };
        let mut built = Built::default();
        for sc in added {
            let nsid = sc.namespaces.first().map_or(0, |n| n.nsid);
            let end = reserve(sc, nsid, sc.namespaces.len(), next_index)?;
            built.subsystems.push(Arc::new(build_subsystem(
                sc, volumes, &instance, next_index,
            )?));
            next_index = end;
        }
        for (sc, ncs) in namespaces {
            let mut list = Vec::with_capacity(ncs.len());
            for nc in ncs {
                next_index = reserve(sc, nc.nsid, 1, next_index)?;
                list.push(build_namespace(sc, nc, volumes, &instance, next_index - 1)?);
            }
            built.namespaces.push(list);
        }
        Ok(built)
    }

    /// Puts namespaces built by [`Registry::build_added`] into kept
    /// subsystem `sub` (their indices are taken for good) and takes those
    /// numbered in `removed` out, returning them; the next command of each
    /// queue, and the next Identify, see the new set.
    pub(crate) fn replace_namespaces(
        &self,
        sub: &Subsystem,
        added: &[Arc<Namespace>],
        removed: &[u32],
    ) -> Vec<Arc<Namespace>> {
        let mut map = NamespaceMap::clone(&sub.namespaces.snapshot());
        let gone = removed.iter().filter_map(|nsid| map.remove(nsid)).collect();
        for ns in added {
            self.namespaces_built
                .fetch_max(ns.index + 1, Ordering::AcqRel);
            map.insert(ns.nsid, ns.clone());
        }
        sub.namespaces.replace(map);
        gone
    }

    /// Registers subsystems built by [`Registry::build_added`] (their
    /// namespace indices are taken for good) and removes those named in
    /// `removed`, which are returned; Connects see the new set at once.
    pub(crate) fn swap_subsystems(
        &self,
        added: &[Arc<Subsystem>],
        removed: &[String],
    ) -> Vec<Arc<Subsystem>> {
        let mut guard = write(&self.subsystems);
        let mut map = BTreeMap::clone(&guard);
        let gone = removed.iter().filter_map(|nqn| map.remove(nqn)).collect();
        for sub in added {
            if let Some(end) = sub
                .namespaces
                .snapshot()
                .values()
                .map(|n| n.index + 1)
                .max()
            {
                self.namespaces_built.fetch_max(end, Ordering::AcqRel);
            }
            map.insert(sub.nqn.clone(), sub.clone());
        }
        *guard = Arc::new(map);
        gone
    }

    /// The NVM subsystems exported now, by NQN (a reload may add and
    /// remove some; this is a snapshot).
    pub fn subsystems(&self) -> Arc<BTreeMap<String, Arc<Subsystem>>> {
        read(&self.subsystems).clone()
    }

    /// The NVM subsystems whose allow-list admits `hostnqn`, in NQN
    /// order: what the discovery log lists for that host.
    pub fn subsystems_listed_for(&self, hostnqn: &str) -> Vec<Arc<Subsystem>> {
        self.subsystems()
            .values()
            .filter(|s| s.host_allowed(hostnqn))
            .cloned()
            .collect()
    }

    /// The NQNs of [`Registry::subsystems_listed_for`].
    pub(crate) fn nqns_listed_for(&self, hostnqn: &str) -> Vec<String> {
        self.subsystems_listed_for(hostnqn)
            .iter()
            .map(|s| s.nqn.clone())
            .collect()
    }

    /// The `[target]` settings it was built with.
    pub fn settings(&self) -> &TargetSettings {
        &self.settings
    }

    /// Finds the subsystem an NQN names (including discovery).
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == sluice_proto::DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        read(&self.subsystems).get(nqn).cloned()
    }

    pub fn genctr(&self) -> u64 {
        self.discovery_genctr.load(Ordering::Relaxed)
    }

    /// Registers a controller of `sub` under a fresh CNTLID; None when all
    /// are in use.
    pub fn add_controller(
        &self,
        sub: &Subsystem,
        make: impl FnOnce(u16) -> Arc<Controller>,
    ) -> Option<Arc<Controller>> {
        let mut tables = lock(&self.controllers);
        let t = tables.entry(sub.id).or_insert_with(ControllerTable::new);
        if t.live.len() >= CONTROLLERS_PER_SUBSYSTEM_MAX {
            return None;
        }
        for _ in 0..CNTLID_MAX {
            let id = t.next_cntlid;
            t.next_cntlid = if id >= CNTLID_MAX { 1 } else { id + 1 };
            if let std::collections::hash_map::Entry::Vacant(e) = t.live.entry(id) {
                let c = make(id);
                e.insert(c.clone());
                sub.live_controllers.store(t.live.len(), Ordering::Release);
                return Some(c);
            }
        }
        None
    }

    /// The live controller `cntlid` of `sub`.
    pub fn controller(&self, sub: &Subsystem, cntlid: u16) -> Option<Arc<Controller>> {
        lock(&self.controllers)
            .get(&sub.id)?
            .live
            .get(&cntlid)
            .cloned()
    }

    /// The live controllers of `sub`.
    pub(crate) fn live_controllers(&self, sub: &Subsystem) -> Vec<Arc<Controller>> {
        lock(&self.controllers)
            .get(&sub.id)
            .map(|t| t.live.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets the controller `cntlid` of `sub` (its association ended);
    /// the table of a subsystem a reload removed goes with its last
    /// controller.
    pub fn remove_controller(&self, sub: &Subsystem, cntlid: u16) {
        let mut tables = lock(&self.controllers);
        if let Some(t) = tables.get_mut(&sub.id) {
            t.live.remove(&cntlid);
            sub.live_controllers.store(t.live.len(), Ordering::Release);
            if t.live.is_empty() && sub.is_removed() {
                tables.remove(&sub.id);
            }
        }
    }

    /// Fails every live controller of `sub`, which a reload removed (no
    /// one is admitted to it any more, see the handshake); its table goes
    /// now if it is empty, else with its last controller.
    pub(crate) fn fail_controllers_of_removed(&self, sub: &Subsystem) -> Vec<(u16, String)> {
        sub.mark_removed();
        let mut failed = Vec::new();
        let mut tables = lock(&self.controllers);
        if let Some(t) = tables.get(&sub.id) {
            for c in t.live.values() {
                c.fail();
                failed.push((c.cntlid, c.hostnqn.clone()));
            }
            if t.live.is_empty() {
                tables.remove(&sub.id);
            }
        }
        failed.sort_unstable();
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload that would hand out more namespace indices than the
    /// target's limit is refused before anything is built, naming the
    /// limit, whether it adds a subsystem or namespaces to a kept one.
    #[test]
    fn reload_builds_stop_at_the_namespace_limit() {
        let sc = SubsystemConfig::new("nqn.2026-12.io.sluice:limit")
            .allow_any_host()
            .with_namespace(NamespaceConfig::ram(1, 1 << 20))
            .with_namespace(NamespaceConfig::ram(2, 1 << 20));
        let reg = Registry::build(
            &Config::default()
                .with_subsystem(sc.clone())
                .validated()
                .unwrap(),
        )
        .unwrap();
        let max = sluice_config::NAMESPACES_TOTAL_MAX;
        reg.namespaces_built.store(max - 1, Ordering::Release);
        let refused = |r: Result<Built, RegistryError>| match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("built past the limit"),
        };
        let why = refused(reg.build_added(&[&sc], &[], &NoVolumes));
        assert!(why.contains(&format!("limit of {max}")), "{why}");
        let two = vec![&sc.namespaces[0], &sc.namespaces[1]];
        let why = refused(reg.build_added(&[], &[(&sc, two)], &NoVolumes));
        assert!(
            why.contains("namespace 2") && why.contains(&format!("limit of {max}")),
            "{why}"
        );
        let one = reg
            .build_added(&[], &[(&sc, vec![&sc.namespaces[0]])], &NoVolumes)
            .expect("the last index fits");
        assert_eq!(one.namespaces[0][0].index, max - 1);
    }
}
