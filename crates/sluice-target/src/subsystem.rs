//! Subsystems and namespaces: what the target exports.
//!
//! A subsystem has an NQN, a host allow-list and namespaces. Its live
//! controllers are kept by the registry (`registry.rs`), which builds the
//! subsystems from the configuration. Who it admits ([`Access`]) and its
//! namespaces ([`Namespaces`]) may be replaced while it runs, and a
//! configuration reload may add or remove whole subsystems (`reload.rs`).

use crate::metrics::IoCounters;
use sluice_backend::{Backend, Geometry, SsdModel};
use sluice_config::SsdConfig;
use sluice_runtime::sync::{read, write};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// An exported namespace.
#[derive(Debug)]
pub struct Namespace {
    pub(crate) nsid: u32,
    /// Index unique across the target, used by workers to key backend queues.
    pub index: usize,
    pub backend: Arc<dyn Backend>,
    /// The geometry at start; the size may grow since (`size_bytes`).
    pub(crate) geometry: Geometry,
    /// Capacity now: starts at `geometry.size_bytes` and follows the
    /// backend when it grows online ([`Namespace::refresh_size`]).
    size_bytes: AtomicU64,
    /// log2 of the block size.
    pub(crate) lba_shift: u8,
    pub(crate) nguid: [u8; 16],
    pub(crate) eui64: [u8; 8],
    pub counters: IoCounters,
    /// Chain-epoch fences (elastic volumes' drives; `fence.rs`).
    pub fences: Arc<crate::fence::Fences>,
    /// Hosts' registrations and reservation (`reservation.rs`).
    pub reservations: Arc<crate::reservation::Reservations>,
    /// A reload removed it (or its subsystem): workers drop their queues
    /// of it once no one holds it (`server/worker.rs`).
    retired: std::sync::atomic::AtomicBool,
}

/// What [`Namespace::new`] needs besides the backend.
#[derive(Debug)]
pub(crate) struct NamespaceIds {
    pub(crate) nsid: u32,
    pub(crate) index: usize,
    pub(crate) nguid: [u8; 16],
    pub(crate) eui64: [u8; 8],
}

impl Namespace {
    pub(crate) fn new(ids: NamespaceIds, backend: Arc<dyn Backend>) -> Namespace {
        let geometry = backend.geometry();
        assert!(sluice_backend::valid_block_size(geometry.block_size_bytes));
        Namespace {
            nsid: ids.nsid,
            index: ids.index,
            backend,
            geometry,
            size_bytes: AtomicU64::new(geometry.size_bytes),
            // A u32 has at most 32 trailing zeros.
            #[allow(clippy::cast_possible_truncation)]
            lba_shift: geometry.block_size_bytes.trailing_zeros() as u8,
            nguid: ids.nguid,
            eui64: ids.eui64,
            counters: IoCounters::default(),
            fences: Arc::new(crate::fence::Fences::new(geometry.size_bytes)),
            reservations: Arc::default(),
            retired: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Marks it as leaving: a reload removed it or its subsystem.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Whether a reload removed it or its subsystem.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Capacity now, in blocks.
    pub fn blocks(&self) -> u64 {
        self.size_bytes() >> self.lba_shift
    }

    /// Capacity now, in bytes (whole blocks).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Whether blocks `[0, end_block)` exist, asking the backend whether it
    /// grew before saying no.
    pub(crate) fn holds(&self, end_block: u64) -> bool {
        end_block <= self.blocks() || {
            self.refresh_size();
            end_block <= self.blocks()
        }
    }

    /// Takes in growth of the backend (an elastic volume resized online),
    /// rounded down to whole blocks; the size never shrinks. Controllers
    /// notice the new size at their next check and send their hosts a
    /// Namespace Attribute Changed event (`events.rs`). True when this call
    /// grew it.
    pub(crate) fn refresh_size(&self) -> bool {
        let Some(before) = self.take_in_size() else {
            return false;
        };
        tracing::info!(
            nsid = self.nsid,
            size_bytes_before = before,
            size_bytes = self.size_bytes(),
            "namespace grew online"
        );
        true
    }

    /// [`Self::refresh_size`] without its log line: the size before when
    /// this call grew it (a reload logs growth its own way).
    pub(crate) fn take_in_size(&self) -> Option<u64> {
        let block_mask = !((1u64 << self.lba_shift) - 1);
        let now = self.backend.size_bytes() & block_mask;
        let before = self.size_bytes.fetch_max(now, Ordering::AcqRel);
        (now > before).then_some(before)
    }
}

/// A subsystem's namespaces by NSID.
pub type NamespaceMap = BTreeMap<u32, Arc<Namespace>>;

/// A subsystem's namespaces: a snapshot a reload replaces whole (namespaces
/// added and removed in place). Queues keep a snapshot and take the new
/// one when [`Namespaces::generation`] moves (`queue/handshake.rs`), so an
/// I/O reads one atomic here, not a lock.
#[derive(Debug, Default)]
pub struct Namespaces {
    map: RwLock<Arc<NamespaceMap>>,
    /// Moves after every replacement.
    generation: AtomicU64,
}

impl Namespaces {
    pub(crate) fn new(map: NamespaceMap) -> Namespaces {
        Namespaces {
            map: RwLock::new(Arc::new(map)),
            generation: AtomicU64::new(0),
        }
    }

    /// The namespaces now.
    pub fn snapshot(&self) -> Arc<NamespaceMap> {
        read(&self.map).clone()
    }

    /// Namespace `nsid` now.
    pub fn get(&self, nsid: u32) -> Option<Arc<Namespace>> {
        read(&self.map).get(&nsid).cloned()
    }

    /// How many there are now.
    pub fn len(&self) -> usize {
        read(&self.map).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves whenever the set is replaced: a snapshot taken at generation
    /// `g` is current while this reads `g`.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Replaces the set (a reload); the generation moves after the new map
    /// is in place.
    pub(crate) fn replace(&self, map: NamespaceMap) {
        *write(&self.map) = Arc::new(map);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// Subsystem type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    Nvm,
    Discovery,
}

/// Who a subsystem admits, and how they authenticate: replaced whole by a
/// reload, read once per Connect.
#[derive(Debug, Default)]
pub struct Access {
    pub(crate) allow_any_host: bool,
    pub(crate) hosts: HashSet<String>,
    /// DH-HMAC-CHAP settings of the hosts that must authenticate.
    pub(crate) auth: HashMap<String, Arc<sluice_auth::ControllerConfig>>,
    /// Hosts without DH-HMAC-CHAP settings are refused.
    pub(crate) require_auth: bool,
}

impl Access {
    /// The access a subsystem's configuration gives.
    pub(crate) fn from_config(sc: &sluice_config::SubsystemConfig) -> Access {
        Access {
            allow_any_host: sc.allow_any_host,
            hosts: sc.hosts.iter().cloned().collect(),
            auth: sc
                .dhchap
                .iter()
                .map(|a| {
                    let c = sluice_auth::ControllerConfig {
                        hostnqn: a.host.clone(),
                        subnqn: sc.nqn.clone(),
                        host_secret: a.secret.clone(),
                        ctrl_secret: a.ctrl_secret.clone(),
                        hash: a.hash,
                        dhgroup: a.dhgroup,
                    };
                    (a.host.clone(), Arc::new(c))
                })
                .collect(),
            require_auth: sc.require_auth,
        }
    }

    /// Every host, no authentication (the discovery subsystem).
    pub(crate) fn open() -> Access {
        Access {
            allow_any_host: true,
            ..Access::default()
        }
    }

    pub(crate) fn admits(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.contains(hostnqn)
    }

    /// Whether a Connect from `hostnqn` would pass the host checks: listed
    /// (or any host), and with a secret where one is required.
    pub(crate) fn would_admit(&self, hostnqn: &str) -> bool {
        let has_secret = self.auth.contains_key(hostnqn);
        self.admits(hostnqn) && (has_secret || !self.require_auth)
    }
}

/// A subsystem: namespaces, allowed hosts, how many controllers are live.
#[derive(Debug)]
pub struct Subsystem {
    pub(crate) nqn: String,
    pub(crate) kind: SubsystemKind,
    pub(crate) serial: String,
    pub(crate) model: String,
    /// Who it admits now (a reload swaps it; a Connect reads it once).
    access: RwLock<Arc<Access>>,
    pub namespaces: Namespaces,
    /// Unique in the process: the registry keeps its live controllers
    /// under it (a subsystem removed and added again under the same NQN
    /// is another one).
    pub(crate) id: u64,
    /// Live controllers, kept by the registry's controller table.
    pub(crate) live_controllers: AtomicUsize,
    /// A reload removed it.
    removed: std::sync::atomic::AtomicBool,
}

/// Source of [`Subsystem::id`].
static NEXT_SUBSYSTEM_ID: AtomicU64 = AtomicU64::new(1);

impl Subsystem {
    pub(crate) fn new(
        nqn: String,
        kind: SubsystemKind,
        serial: String,
        model: String,
        access: Access,
        namespaces: NamespaceMap,
    ) -> Subsystem {
        Subsystem {
            nqn,
            kind,
            serial,
            model,
            access: RwLock::new(Arc::new(access)),
            namespaces: Namespaces::new(namespaces),
            id: NEXT_SUBSYSTEM_ID.fetch_add(1, Ordering::Relaxed),
            live_controllers: AtomicUsize::new(0),
            removed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Marks it as removed by a reload.
    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
    }

    /// Whether a reload removed it.
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Who it admits now.
    pub fn access(&self) -> Arc<Access> {
        read(&self.access).clone()
    }

    /// Replaces who it admits.
    pub(crate) fn set_access(&self, access: Access) {
        *write(&self.access) = Arc::new(access);
    }

    /// Whether `hostnqn` is on the list (the discovery subsystem's access
    /// is [`Access::open`]: every host).
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.access().admits(hostnqn)
    }

    /// Identify Controller NN, the highest NSID it may have: any NSID the
    /// configuration allows, since a reload may add namespaces (as nvmet
    /// reports its own limit); none for the discovery subsystem.
    pub fn nn(&self) -> u32 {
        match self.kind {
            SubsystemKind::Nvm => sluice_config::NAMESPACES_PER_SUBSYSTEM_MAX,
            SubsystemKind::Discovery => 0,
        }
    }

    pub fn volatile_write_cache(&self) -> bool {
        self.namespaces
            .snapshot()
            .values()
            .any(|n| n.geometry.volatile_write_cache)
    }

    /// How many controllers of this subsystem are live.
    pub fn controller_count(&self) -> usize {
        self.live_controllers.load(Ordering::Acquire)
    }
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
