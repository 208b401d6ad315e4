//! Drives, volumes and extents as transactions on a [`MetaStore`].
//!
//! Every change reads what it depends on, computes the new records, and
//! commits them in one [`Txn`] that compares the revisions it read: the
//! change applies whole or not at all, and a concurrent writer (another
//! control-plane process that believes it leads) makes it retry on fresh
//! state instead of overwriting. A crash between any two steps therefore
//! leaves the old state or the new one; `check::check_catalog` proves no slot
//! is leaked or owned twice.
//!
//! Deleting a volume frees its extents in several transactions (etcd caps a
//! transaction at 128 operations): the volume is first marked `Deleting`,
//! then its extents are freed in batches, each batch returning its slots in
//! the same transaction that deletes the extent keys, then the volume goes.
//! [`Catalog::resume_deletes`] finishes what a crash interrupted.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use sluice_volume::placement::{self, DriveCandidate, PlacementError, PlacementWeights};
use sluice_volume::record::{
    check_replicas, check_size, check_volume_name, DRIVES_MAX, NAME_BYTES_MAX, VOLUMES_MAX,
};
use sluice_volume::{
    DriveId, DriveRecord, DriveSpec, DriveState, ExtentRecord, Replica, TenantRecord, VolumeId,
    VolumeRecord, VolumeState, EXTENT_BYTES,
};

use crate::keys::{self, Ids, Reserved};
use crate::store::{Committed, MetaStore, StoreError, Txn, Versioned, TXN_OPS_MAX};

/// Attempts at one change before giving up on a contended key.
pub const CONFLICT_RETRIES_MAX: u32 = 32;

/// Where a crash can be injected (tests kill the process at these points).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// The transaction is built and about to be committed.
    BeforeCommit(&'static str),
    /// The transaction committed; the caller has not been told.
    AfterCommit(&'static str),
}

type CrashHook = Arc<dyn Fn(CrashPoint) + Send + Sync>;

/// A catalog failure. Each names what the user got wrong, or the store's
/// failure.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no volume named {0:?}")]
    UnknownVolume(String),
    #[error("a volume named {0:?} already exists")]
    DuplicateVolume(String),
    #[error("volume {name:?} was deleted and re-created (expected {expected}, found {found}); reopen it")]
    VolumeRecreated {
        name: String,
        expected: VolumeId,
        found: VolumeId,
    },
    #[error("volume {0:?} is being deleted")]
    Deleting(String),
    #[error(
        "volume {name:?} is {size_bytes} bytes; it can grow but not shrink to {requested_bytes}"
    )]
    Shrink {
        name: String,
        size_bytes: u64,
        requested_bytes: u64,
    },
    #[error("extent {index} is beyond volume {name:?}'s {extents} extents")]
    ExtentOutOfRange {
        name: String,
        index: u64,
        extents: u64,
    },
    #[error("no drive {0}")]
    UnknownDrive(DriveId),
    #[error("drive {0} is already in the pool")]
    DuplicateDrive(String),
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("capacity exceeded: {0}")]
    PoolFull(String),
    #[error("cannot prepare the new extent: {0}")]
    Prepare(String),
    #[error("metadata is inconsistent: {0}")]
    Inconsistent(String),
    #[error("gave up after repeated conflicting attempts at {0}")]
    Contended(&'static str),
}

/// What a new volume looks like.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeSpec {
    pub name: String,
    pub size_bytes: u64,
    pub block_size_bytes: u32,
    pub replicas: u8,
    pub tenant: Option<String>,
    pub prefer: Vec<String>,
}

impl VolumeSpec {
    /// A spec with one replica and 4 KiB blocks.
    pub fn new(name: impl Into<String>, size_bytes: u64) -> VolumeSpec {
        VolumeSpec {
            name: name.into(),
            size_bytes,
            block_size_bytes: 4096,
            replicas: 1,
            tenant: None,
            prefer: vec![],
        }
    }

    pub fn with_replicas(mut self, replicas: u8) -> VolumeSpec {
        self.replicas = replicas;
        self
    }
}

/// A volume marked `Deleting`, as the step that fences its slots before
/// they are freed sees it ([`Catalog::delete_volume_with`]).
#[derive(Debug, Clone)]
pub struct Deleting {
    pub volume: VolumeRecord,
    /// Every replica (chain and rebuilding) the volume owns, with its drive.
    pub replicas: Vec<(DriveRecord, Replica)>,
    /// Above every chain epoch of the volume, and below every epoch a
    /// later owner of its slots gets: the epoch to fence its granules at.
    pub fence_epoch: u64,
}

/// Slots of one drive to zero, at an epoch above any fence on them (the
/// revision of the transaction that claimed them): what the control plane
/// does with NVMe Write Zeroes.
#[derive(Debug, Clone)]
pub struct ZeroJob {
    pub drive: DriveRecord,
    pub slots: Vec<u64>,
    pub epoch: u64,
}

/// Slots of one drive to fence at `epoch` (refusing writes carrying a lower
/// epoch) and drain (waiting for the writes in flight there to end).
#[derive(Debug, Clone)]
pub struct FenceJob {
    pub drive: DriveRecord,
    pub slots: Vec<u64>,
    pub epoch: u64,
}

/// How a [`FenceJob`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced {
    /// Every slot fenced and drained.
    Yes,
    /// The drive answered that it cannot fence (not a Sluice target).
    Unsupported,
    /// Not now: unreachable, or writes still in flight. Try again later.
    NotNow(String),
}

/// Slots claimed, zeroed and declared clean per transaction of
/// [`Catalog::zero_ahead`].
pub const ZERO_BATCH_MAX: usize = 64;

/// Plans of one allocation that may find no clean slot on a chosen drive
/// (and zero some there) before it gives up. Each round leaves clean slots
/// on the drives it zeroed, but the next plan may choose other drives (the
/// placement terms move as slots are claimed), so this bounds the rounds,
/// not the drives.
const ZERO_ROUNDS_MAX: u32 = 64;

/// Longest pause between two of those rounds, when a round found every
/// free slot of a chosen drive already being zeroed (about 3 s in all).
const ZERO_WAIT_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(50);

/// The default ride window: a zeroer step rides when an extent fault
/// committed this recently, and waits this long for one to carry it before
/// it commits alone ([`Catalog::with_ride_window`]).
pub const RIDE_WINDOW: std::time::Duration = std::time::Duration::from_millis(5);

/// Zeroer steps one fault carries at most: each adds a drive record (a
/// compare and a put) to its transaction, which etcd caps at 128
/// operations.
const RIDES_PER_FAULT_MAX: usize = 4;

/// A zeroer step waiting to ride on the next extent fault's transaction:
/// declare a zeroed batch of one drive clean and claim the next. On a
/// store with one writer (redb), a step committed alone would make a fault
/// that arrives meanwhile wait a whole commit; riding, it costs the fault
/// one more drive record in a commit it makes anyway.
struct Ride {
    finished: Vec<u64>,
    claim: usize,
    done: tokio::sync::oneshot::Sender<Rode>,
}

/// A [`Ride`] a fault took, with what it does to its drive.
struct Boarded {
    drive: DriveId,
    ride: Ride,
    finished: Vec<u64>,
    claimed: Vec<u64>,
}

/// What the fault that carried a [`Ride`] committed for it.
struct Rode {
    drive: DriveRecord,
    finished: Vec<u64>,
    claimed: Vec<u64>,
    /// The revision of the fault's transaction: the epoch to zero at.
    epoch: u64,
}

/// A planned allocation (one per attempt, on the stack for a moment: not
/// worth a box).
#[allow(clippy::large_enum_variant)]
enum Plan {
    Ready(Txn, Allocation),
    /// These chosen drives have no clean slot.
    NeedsZeroing(Vec<DriveId>),
}

/// One attempt at an allocation.
#[allow(clippy::large_enum_variant)]
enum Attempt {
    Done(Allocation),
    /// These chosen drives have no clean slot.
    NeedsZeroing(Vec<DriveId>),
}

/// An allocated extent with its volume and the drives of its chain.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    pub extent: ExtentRecord,
    pub volume: VolumeRecord,
    pub drives: Vec<DriveRecord>,
}

/// A volume's full map as the control plane hands it to a client.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeLayout {
    pub volume: VolumeRecord,
    pub extents: Vec<ExtentRecord>,
    /// Every drive the extents use.
    pub drives: Vec<DriveRecord>,
}

/// The catalog over a store.
pub struct Catalog<S> {
    store: S,
    weights: PlacementWeights,
    /// Busy degree per drive from telemetry (placement's γ term).
    busy: Mutex<HashMap<DriveId, f64>>,
    crash_hook: Option<CrashHook>,
    /// The volumes and drives the last allocations committed (the fast path
    /// of [`Catalog::allocate`]).
    alloc_cache: Mutex<Option<AllocCache>>,
    /// Held by every operation that changes a drive's slots, from its plan
    /// to its commit (never across I/O to a drive). Correctness does not
    /// rest on it (each transaction compares the drive records it read),
    /// but without it this process's allocations and its zeroer would
    /// conflict with each other on the same drive records and retry.
    slot_takers: tokio::sync::Mutex<()>,
    /// This process's name on its zeroing claims (random per process).
    claimant: u64,
    /// Slots this process is zeroing right now: a claim in the metadata
    /// that is not here is stale (its claimant died, was deposed, or its
    /// zeroing failed) and must be fenced before it is zeroed again.
    zeroing_now: Mutex<HashSet<(DriveId, u64)>>,
    /// Zeroer steps waiting for a fault's transaction, by drive.
    rides: Mutex<HashMap<DriveId, Ride>>,
    /// When an extent fault last committed (the zeroer rides only then).
    fault_committed_at: Mutex<Option<tokio::time::Instant>>,
    /// Zeroer steps carried by faults' transactions since start.
    rides_taken: std::sync::atomic::AtomicU64,
    /// See [`RIDE_WINDOW`].
    ride_window: std::time::Duration,
}

/// Volumes remembered by the allocation fast path, at most.
const ALLOC_CACHE_VOLUMES_MAX: usize = 1024;

/// Fast-path allocations between two fresh reads: a drive brought back into
/// service elsewhere is seen within this many allocations.
const ALLOC_CACHE_USES_MAX: u32 = 64;

#[derive(Debug, Default)]
struct AllocCache {
    volumes: HashMap<String, (VolumeRecord, u64)>,
    drives: Vec<(DriveRecord, u64)>,
    ids_rev: u64,
    uses: u32,
}

impl<S> std::fmt::Debug for Catalog<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("weights", &self.weights)
            .finish_non_exhaustive()
    }
}

fn invalid(field: &'static str) -> impl FnOnce(String) -> CatalogError {
    move |reason| CatalogError::Invalid { field, reason }
}

impl<S: MetaStore> Catalog<S> {
    pub fn new(store: S, weights: PlacementWeights) -> Catalog<S> {
        Catalog {
            store,
            weights,
            busy: Mutex::new(HashMap::new()),
            crash_hook: None,
            alloc_cache: Mutex::new(None),
            slot_takers: tokio::sync::Mutex::new(()),
            claimant: std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
            zeroing_now: Mutex::new(HashSet::new()),
            rides: Mutex::new(HashMap::new()),
            fault_committed_at: Mutex::new(None),
            rides_taken: std::sync::atomic::AtomicU64::new(0),
            ride_window: RIDE_WINDOW,
        }
    }

    /// Sets the ride window (default [`RIDE_WINDOW`]): a store whose commits
    /// take longer than 5 ms apart under a stream of faults needs a longer
    /// one for the zeroer's steps to ride, and tests use one long enough to
    /// make a ride certain.
    pub fn with_ride_window(mut self, window: std::time::Duration) -> Catalog<S> {
        self.ride_window = window;
        self
    }

    /// Zeroer steps that rode on extent faults' transactions instead of
    /// committing alone, since this catalog was opened.
    pub fn zeroer_steps_ridden(&self) -> u64 {
        self.rides_taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This process's name on its zeroing claims.
    pub fn claimant(&self) -> u64 {
        self.claimant
    }

    /// Calls `hook` at every [`CrashPoint`] (crash tests).
    pub fn with_crash_hook(
        mut self,
        hook: impl Fn(CrashPoint) + Send + Sync + 'static,
    ) -> Catalog<S> {
        self.crash_hook = Some(Arc::new(hook));
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub(crate) fn weights(&self) -> &PlacementWeights {
        &self.weights
    }

    /// Records a drive's recent busy degree (0..=1) for placement.
    pub fn report_busy(&self, drive: DriveId, degree: f64) {
        let degree = if degree.is_finite() {
            degree.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(drive, degree);
    }

    /// Waits for the slot lock (see `slot_takers`): rebuilds take slots too.
    pub(crate) async fn lock_slot_takers(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.slot_takers.lock().await
    }

    /// Drops the allocation fast path's copies (after any other change).
    pub(crate) fn forget(&self) {
        *self
            .alloc_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    pub(crate) async fn commit(
        &self,
        op: &'static str,
        txn: Txn,
    ) -> Result<Option<u64>, CatalogError> {
        if let Some(h) = &self.crash_hook {
            h(CrashPoint::BeforeCommit(op));
        }
        match self.store.commit(txn).await? {
            Committed::Applied { revision } => {
                if let Some(h) = &self.crash_hook {
                    h(CrashPoint::AfterCommit(op));
                }
                Ok(Some(revision))
            }
            Committed::Conflict => {
                tracing::debug!(op, "metadata conflict; retrying on fresh state");
                Ok(None)
            }
        }
    }

    pub(crate) async fn get<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<(T, u64)>, CatalogError> {
        match self.store.get(key).await? {
            Some(v) => Ok(Some((keys::decode(key, &v)?, v.mod_revision))),
            None => Ok(None),
        }
    }

    /// A drive's record says that a slot the extent at `ekey` holds (as
    /// read at revision `erev`) is already free. The extent and the drive
    /// are read one after the other, not at one moment: if the extent has
    /// changed since (or is gone), a transaction between the two reads moved
    /// it off the slot and freed the slot (two reports of one failed drive,
    /// or a failure beside a rebuild's end), and the caller retries on fresh
    /// state (`Ok`). If the extent is as read, the metadata is inconsistent.
    pub(crate) async fn freed_under_a_stale_read(
        &self,
        ekey: &str,
        erev: u64,
        what: impl FnOnce() -> String,
    ) -> Result<(), CatalogError> {
        match self.store.get(ekey).await? {
            Some(v) if v.mod_revision == erev => Err(CatalogError::Inconsistent(what())),
            _ => {
                tracing::debug!(
                    extent = ekey,
                    "a slot was freed between two reads; retrying on fresh state"
                );
                Ok(())
            }
        }
    }

    pub(crate) async fn list<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(T, u64)>, CatalogError> {
        let (_, kvs) = self.store.list(prefix).await?;
        kvs.iter()
            .map(|(k, v): &(String, Versioned)| Ok((keys::decode(k, v)?, v.mod_revision)))
            .collect()
    }

    // ------------------------------------------------------------------ drives

    /// Every drive, by id.
    pub async fn drives(&self) -> Result<Vec<DriveRecord>, CatalogError> {
        let drives: Vec<(DriveRecord, u64)> = self.list(keys::DRIVES).await?;
        drives
            .into_iter()
            .map(|(d, _)| {
                d.check().map_err(|r| {
                    CatalogError::Inconsistent(format!("{}: {r}", keys::drive(d.id)))
                })?;
                Ok(d)
            })
            .collect()
    }

    /// Adds a namespace of `size_bytes` with `block_size_bytes` blocks to the
    /// pool.
    pub async fn add_drive(
        &self,
        spec: DriveSpec,
        block_size_bytes: u32,
        size_bytes: u64,
        nguid: Option<String>,
    ) -> Result<DriveRecord, CatalogError> {
        for (field, v) in [("address", &spec.addr), ("nqn", &spec.nqn)] {
            if v.is_empty() || v.len() > NAME_BYTES_MAX {
                return Err(CatalogError::Invalid {
                    field,
                    reason: format!("must be 1-{NAME_BYTES_MAX} bytes"),
                });
            }
        }
        let slots_total = size_bytes / EXTENT_BYTES;
        if slots_total == 0 {
            return Err(CatalogError::Invalid {
                field: "drive size",
                reason: format!("{spec} has {size_bytes} bytes, less than one 2 MiB extent"),
            });
        }
        for _ in 0..CONFLICT_RETRIES_MAX {
            let drives = self.drives().await?;
            if drives.iter().any(|d| d.spec == spec) {
                return Err(CatalogError::DuplicateDrive(spec.to_string()));
            }
            if drives.len() >= DRIVES_MAX {
                return Err(CatalogError::PoolFull(format!(
                    "the pool already has {DRIVES_MAX} drives"
                )));
            }
            let (ids, ids_rev) = self.get::<Ids>(keys::IDS).await?.unwrap_or_default();
            let record = DriveRecord {
                id: DriveId(ids.next_drive),
                spec: spec.clone(),
                state: DriveState::Up,
                block_size_bytes,
                slots_total,
                next_slot: 0,
                free: vec![],
                clean: vec![],
                zeroing: vec![],
                quarantined: vec![],
                nguid: nguid.clone(),
            };
            record.check().map_err(invalid("drive"))?;
            let next = Ids {
                next_drive: ids.next_drive + 1,
                ..ids
            };
            let txn = guard(Txn::default(), keys::IDS, ids_rev)
                .put(keys::IDS, keys::encode(&next))
                .absent(keys::drive(record.id))
                .put(keys::drive(record.id), keys::encode(&record));
            if self.commit("add_drive", txn).await?.is_some() {
                return Ok(record);
            }
        }
        Err(CatalogError::Contended("add_drive"))
    }

    /// Takes a drive in or out of service.
    pub async fn set_drive_state(
        &self,
        id: DriveId,
        state: DriveState,
    ) -> Result<DriveRecord, CatalogError> {
        self.forget();
        for _ in 0..CONFLICT_RETRIES_MAX {
            let (mut d, rev) = self
                .get::<DriveRecord>(&keys::drive(id))
                .await?
                .ok_or(CatalogError::UnknownDrive(id))?;
            if d.state == state {
                return Ok(d);
            }
            d.state = state;
            let txn = Txn::default()
                .unchanged(keys::drive(id), rev)
                .put(keys::drive(id), keys::encode(&d));
            if self.commit("set_drive_state", txn).await?.is_some() {
                return Ok(d);
            }
        }
        Err(CatalogError::Contended("set_drive_state"))
    }

    /// Takes a failed drive out of every chain: the drive goes `Down` (no new
    /// extents), and each chain that has another replica loses its replica
    /// on the drive, so writes complete on the survivors; the volume's epoch
    /// goes up so clients refetch. The drive's slots are given back (their
    /// contents are stale). A chain whose only replica is on the drive keeps
    /// it: that data is unavailable until the drive returns, not lost.
    /// Returns the number of chains shortened.
    ///
    /// Safe without fencing clients: every old chain contains every new one,
    /// so a client writing on an old map still writes to every surviving
    /// replica (and fails on the dead one, and refetches).
    pub async fn fail_drive(&self, id: DriveId) -> Result<u64, CatalogError> {
        self.forget();
        self.set_drive_state(id, DriveState::Down).await?;
        let mut shortened = 0;
        for v in self.volumes().await? {
            if !v.extents_per_drive.contains_key(&id) {
                continue;
            }
            let mut conflicts = 0;
            'fresh: loop {
                if conflicts >= CONFLICT_RETRIES_MAX {
                    return Err(CatalogError::Contended("fail_drive"));
                }
                let (mut vol, vrev) = match self.volume_rev(&v.name).await {
                    Ok(x) => x,
                    Err(CatalogError::UnknownVolume(_)) => break,
                    Err(e) => return Err(e),
                };
                if vol.id != v.id {
                    break;
                }
                let extents: Vec<(ExtentRecord, u64)> =
                    self.list(&keys::extents_of(vol.id)).await?;
                let affected: Vec<&(ExtentRecord, u64)> = extents
                    .iter()
                    .filter(|(e, _)| {
                        (e.chain.len() > 1 && e.chain.iter().any(|r| r.drive == id))
                            || e.rebuilding.is_some_and(|r| r.drive == id)
                    })
                    .collect();
                if affected.is_empty() {
                    break;
                }
                let (mut drive, drev) = self
                    .get::<DriveRecord>(&keys::drive(id))
                    .await?
                    .ok_or(CatalogError::UnknownDrive(id))?;
                // Per extent: compare + put; plus the drive's and the
                // volume's compare + put.
                let batch = affected.len().min((TXN_OPS_MAX - 4) / 2);
                let mut txn = Txn::default();
                for (e, erev) in &affected[..batch] {
                    let mut e = e.clone();
                    let degraded_before = e.is_degraded(&vol);
                    let gone = if let Some(r) = e.rebuilding.filter(|r| r.drive == id) {
                        // The replica being rebuilt is lost: a rebuild will
                        // start again elsewhere; a remap is given up, and
                        // its chain moves above the fence it may have
                        // raised on the replica it was retiring.
                        e.rebuilding = None;
                        if e.retiring.take().is_some() {
                            e.epoch = vrev.max(*erev) + 1;
                        }
                        r
                    } else {
                        let pos = e.chain.iter().position(|r| r.drive == id).unwrap_or(0);
                        let gone = e.chain.remove(pos);
                        if e.retiring == Some(gone) {
                            // The remap's copy replaces a lost replica now.
                            e.retiring = None;
                        }
                        gone
                    };
                    let degraded_after = e.is_degraded(&vol);
                    if degraded_before && !degraded_after {
                        vol.degraded_extents = vol.degraded_extents.saturating_sub(1);
                    } else if !degraded_before && degraded_after {
                        vol.degraded_extents += 1;
                    }
                    if !drive.give_slot(gone.slot) {
                        let k = keys::extent(vol.id, e.index);
                        self.freed_under_a_stale_read(&k, *erev, || {
                            format!("{k}: slot {} of {id} is already free", gone.slot)
                        })
                        .await?;
                        conflicts += 1;
                        continue 'fresh;
                    }
                    if let Some(n) = vol.extents_per_drive.get_mut(&id) {
                        *n = n.saturating_sub(1);
                    }
                    let k = keys::extent(vol.id, e.index);
                    txn = txn.unchanged(k.clone(), *erev).put(k, keys::encode(&e));
                }
                vol.extents_per_drive.retain(|_, n| *n > 0);
                vol.epoch += 1;
                txn = txn
                    .unchanged(keys::volume(&vol.name), vrev)
                    .put(keys::volume(&vol.name), keys::encode(&vol))
                    .unchanged(keys::drive(id), drev)
                    .put(keys::drive(id), keys::encode(&drive));
                if self.commit("fail_drive", txn).await?.is_some() {
                    shortened += batch as u64;
                } else {
                    conflicts += 1;
                }
            }
        }
        Ok(shortened)
    }

    // ------------------------------------------------------------------ tenants

    /// Every tenant with an SLO class, by name.
    pub async fn tenants(&self) -> Result<Vec<TenantRecord>, CatalogError> {
        let tenants: Vec<(TenantRecord, u64)> = self.list(keys::TENANTS).await?;
        tenants
            .into_iter()
            .map(|(t, _)| {
                t.check().map_err(|r| {
                    CatalogError::Inconsistent(format!("{}: {r}", keys::tenant(&t.name)))
                })?;
                Ok(t)
            })
            .collect()
    }

    /// Puts `name` in SLO class `slo_class` (one transaction; the last
    /// writer wins, as for any setting).
    pub async fn set_tenant(
        &self,
        name: &str,
        slo_class: &str,
    ) -> Result<TenantRecord, CatalogError> {
        let record = TenantRecord {
            name: name.to_owned(),
            slo_class: slo_class.to_owned(),
        };
        sluice_volume::record::check_tenant_name(name).map_err(invalid("tenant"))?;
        sluice_volume::record::check_slo_class(slo_class).map_err(invalid("SLO class"))?;
        let key = keys::tenant(name);
        for _ in 0..CONFLICT_RETRIES_MAX {
            let current = self.store.get(&key).await?;
            let txn = match &current {
                Some(v) => Txn::default().unchanged(key.clone(), v.mod_revision),
                None => Txn::default().absent(key.clone()),
            }
            .put(key.clone(), keys::encode(&record));
            if self.commit("set_tenant", txn).await?.is_some() {
                return Ok(record);
            }
        }
        Err(CatalogError::Contended("set_tenant"))
    }

    // ------------------------------------------------------------------ volumes

    /// Every volume, by name.
    pub async fn volumes(&self) -> Result<Vec<VolumeRecord>, CatalogError> {
        Ok(self
            .list::<VolumeRecord>(keys::VOLUMES)
            .await?
            .into_iter()
            .map(|(v, _)| v)
            .collect())
    }

    /// One volume.
    pub async fn volume(&self, name: &str) -> Result<VolumeRecord, CatalogError> {
        Ok(self.volume_rev(name).await?.0)
    }

    pub(crate) async fn volume_rev(&self, name: &str) -> Result<(VolumeRecord, u64), CatalogError> {
        check_volume_name(name).map_err(invalid("volume name"))?;
        self.get::<VolumeRecord>(&keys::volume(name))
            .await?
            .ok_or_else(|| CatalogError::UnknownVolume(name.to_owned()))
    }

    /// Slots in service and slots reserved.
    pub async fn capacity(&self) -> Result<(u64, u64), CatalogError> {
        let total = self
            .drives()
            .await?
            .iter()
            .filter(|d| d.state == DriveState::Up)
            .map(DriveRecord::slots_reservable)
            .sum();
        let reserved = self
            .get::<Reserved>(keys::RESERVED)
            .await?
            .map_or(0, |(r, _)| r.slots);
        Ok((total, reserved))
    }

    /// Creates a volume. Its capacity (size × replicas) is reserved now, so
    /// its writes never find the pool full; its extents are allocated on
    /// first write.
    pub async fn create_volume(&self, spec: VolumeSpec) -> Result<VolumeRecord, CatalogError> {
        check_volume_name(&spec.name).map_err(invalid("volume name"))?;
        check_size(spec.size_bytes, spec.block_size_bytes).map_err(invalid("size"))?;
        check_replicas(spec.replicas).map_err(invalid("replicas"))?;
        for _ in 0..CONFLICT_RETRIES_MAX {
            if self
                .get::<VolumeRecord>(&keys::volume(&spec.name))
                .await?
                .is_some()
            {
                return Err(CatalogError::DuplicateVolume(spec.name));
            }
            let drives = self.drives().await?;
            let up: Vec<&DriveRecord> = drives
                .iter()
                .filter(|d| {
                    d.state == DriveState::Up
                        && spec.block_size_bytes.is_multiple_of(d.block_size_bytes)
                })
                .collect();
            if up.len() < usize::from(spec.replicas) {
                return Err(CatalogError::PoolFull(format!(
                    "{} replicas need {} drives in service with blocks of at most {} bytes; the pool has {}",
                    spec.replicas,
                    spec.replicas,
                    spec.block_size_bytes,
                    up.len()
                )));
            }
            let total: u64 = up.iter().map(|d| d.slots_reservable()).sum();
            let (reserved, reserved_rev) = self
                .get::<Reserved>(keys::RESERVED)
                .await?
                .unwrap_or_default();
            let (ids, ids_rev) = self.get::<Ids>(keys::IDS).await?.unwrap_or_default();
            if usize::try_from(ids.next_volume).unwrap_or(usize::MAX) >= VOLUMES_MAX
                && self.volumes().await?.len() >= VOLUMES_MAX
            {
                return Err(CatalogError::PoolFull(format!(
                    "the pool already has {VOLUMES_MAX} volumes"
                )));
            }
            let record = VolumeRecord {
                id: VolumeId(ids.next_volume),
                name: spec.name.clone(),
                state: VolumeState::Ready,
                size_bytes: spec.size_bytes,
                block_size_bytes: spec.block_size_bytes,
                replicas: spec.replicas,
                tenant: spec.tenant.clone(),
                prefer: spec.prefer.clone(),
                epoch: 1,
                extents_per_drive: BTreeMap::new(),
                degraded_extents: 0,
            };
            record.check().map_err(invalid("volume"))?;
            let need = record.slots_reserved();
            if reserved.slots + need > total {
                return Err(CatalogError::PoolFull(format!(
                    "volume {:?} needs {need} extents ({} bytes × {} replicas); the pool has {} of {total} unreserved",
                    spec.name,
                    spec.size_bytes,
                    spec.replicas,
                    total.saturating_sub(reserved.slots)
                )));
            }
            let txn = guard(
                guard(Txn::default(), keys::IDS, ids_rev),
                keys::RESERVED,
                reserved_rev,
            )
            .absent(keys::volume(&spec.name))
            .put(keys::volume(&spec.name), keys::encode(&record))
            .put(
                keys::IDS,
                keys::encode(&Ids {
                    next_volume: ids.next_volume + 1,
                    ..ids
                }),
            )
            .put(
                keys::RESERVED,
                keys::encode(&Reserved {
                    slots: reserved.slots + need,
                }),
            );
            if self.commit("create_volume", txn).await?.is_some() {
                return Ok(record);
            }
        }
        Err(CatalogError::Contended("create_volume"))
    }

    /// Grows a volume online. Shrinking is refused (data would be lost).
    pub async fn resize_volume(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<VolumeRecord, CatalogError> {
        self.forget();
        for _ in 0..CONFLICT_RETRIES_MAX {
            let (mut v, rev) = self.volume_rev(name).await?;
            if v.state != VolumeState::Ready {
                return Err(CatalogError::Deleting(name.to_owned()));
            }
            if size_bytes < v.size_bytes {
                return Err(CatalogError::Shrink {
                    name: name.to_owned(),
                    size_bytes: v.size_bytes,
                    requested_bytes: size_bytes,
                });
            }
            if size_bytes == v.size_bytes {
                return Ok(v);
            }
            check_size(size_bytes, v.block_size_bytes).map_err(invalid("size"))?;
            let before = v.slots_reserved();
            v.size_bytes = size_bytes;
            let more = v.slots_reserved() - before;
            let (total, _) = self.capacity().await?;
            let (reserved, reserved_rev) = self
                .get::<Reserved>(keys::RESERVED)
                .await?
                .unwrap_or_default();
            if reserved.slots + more > total {
                return Err(CatalogError::PoolFull(format!(
                    "growing {name:?} to {size_bytes} bytes needs {more} more extents; the pool has {} unreserved",
                    total.saturating_sub(reserved.slots)
                )));
            }
            let txn = guard(Txn::default(), keys::RESERVED, reserved_rev)
                .unchanged(keys::volume(name), rev)
                .put(keys::volume(name), keys::encode(&v))
                .put(
                    keys::RESERVED,
                    keys::encode(&Reserved {
                        slots: reserved.slots + more,
                    }),
                );
            if self.commit("resize_volume", txn).await?.is_some() {
                return Ok(v);
            }
        }
        Err(CatalogError::Contended("resize_volume"))
    }

    /// A volume with its allocated extents and the drives they use.
    pub async fn layout(&self, name: &str) -> Result<VolumeLayout, CatalogError> {
        let volume = self.volume(name).await?;
        let extents: Vec<ExtentRecord> = self
            .list::<ExtentRecord>(&keys::extents_of(volume.id))
            .await?
            .into_iter()
            .map(|(e, _)| e)
            .collect();
        for e in &extents {
            e.check(&volume).map_err(|r| {
                CatalogError::Inconsistent(format!("{}: {r}", keys::extent(volume.id, e.index)))
            })?;
        }
        let all = self.drives().await?;
        let drives = all
            .into_iter()
            .filter(|d| {
                extents
                    .iter()
                    .any(|e| e.chain.iter().any(|r| r.drive == d.id))
            })
            .collect();
        Ok(VolumeLayout {
            volume,
            extents,
            drives,
        })
    }

    /// Allocates extent `index` of volume `name` (whose id the client knows
    /// as `id`) on first write, or returns the chain another writer
    /// allocated first. Idempotent.
    pub async fn allocate_extent(
        &self,
        name: &str,
        id: VolumeId,
        index: u64,
    ) -> Result<ExtentRecord, CatalogError> {
        Ok(self.allocate(name, id, index).await?.extent)
    }

    /// [`Catalog::allocate_extent`], also returning the volume and the
    /// chain's drives as the transaction saw them (what a client needs,
    /// without reading them again). Slots are "zeroed" by doing nothing:
    /// for callers that keep no data on the drives (tests, tools).
    pub async fn allocate(
        &self,
        name: &str,
        id: VolumeId,
        index: u64,
    ) -> Result<Allocation, CatalogError> {
        self.allocate_with(name, id, index, |_| std::future::ready(Ok(())))
            .await
    }

    /// [`Catalog::allocate`], calling `zero` when a chosen drive has no
    /// clean slot. A new extent only ever gets clean slots: a slot may hold
    /// a deleted volume's data (or whatever the namespace held before it
    /// joined the pool), and once the extent is committed any client may
    /// read it. Slots are made clean in three steps, each safe to crash
    /// in: a transaction claims them, `zero` zeroes them at the claim's
    /// revision, a transaction declares them clean. Usually the control
    /// plane's zeroer has done that ahead of time ([`Catalog::zero_ahead`])
    /// and the fault is one transaction.
    pub async fn allocate_with<Z, Fut>(
        &self,
        name: &str,
        id: VolumeId,
        index: u64,
        zero: Z,
    ) -> Result<Allocation, CatalogError>
    where
        Z: Fn(ZeroJob) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        // Slots this fault claimed and zeroed itself, not yet committed.
        let mut mine: Vec<(DriveId, u64)> = Vec::new();
        // Drives on which this fault found every free slot claimed by
        // another zeroer (or one that died with its claims): the next plans
        // choose among the others while enough of them have room.
        let mut stalled: BTreeSet<DriveId> = BTreeSet::new();
        let mut pause = std::time::Duration::from_millis(1);
        let mut result = Err(CatalogError::Contended("allocate_extent: clean slots"));
        'rounds: for _ in 0..ZERO_ROUNDS_MAX {
            match self.try_allocate(name, id, index, &mine, &stalled).await {
                Ok(Attempt::Done(a)) => {
                    mine.retain(|m| !a.extent.chain.iter().any(|r| (r.drive, r.slot) == *m));
                    result = Ok(a);
                    break;
                }
                Ok(Attempt::NeedsZeroing(ids)) => {
                    tracing::debug!(volume = name, extent = index, drives = ?ids,
                        "extent fault found no clean slot; zeroing one inline");
                    let mut made = 0;
                    for d in ids {
                        match self.claim_and_zero(d, 1, &zero).await {
                            Ok(slots) => {
                                if slots.is_empty() {
                                    stalled.insert(d);
                                }
                                made += slots.len();
                                mine.extend(slots.into_iter().map(|s| (d, s)));
                            }
                            Err(e) => {
                                result = Err(e);
                                break 'rounds;
                            }
                        }
                    }
                    if made == 0 {
                        // Every free slot there is being zeroed by the
                        // zeroer (or another fault): wait for it.
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(ZERO_WAIT_PAUSE_MAX);
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // Zeroed slots the extent did not take (it chose other drives, or
        // failed) are clean for the next fault.
        let mut left: BTreeMap<DriveId, Vec<u64>> = BTreeMap::new();
        for (d, s) in &mine {
            left.entry(*d).or_default().push(*s);
        }
        for (d, slots) in left {
            if let Err(e) = self.finish_zeroing(d, &slots).await {
                tracing::warn!(drive = %d, error = %e, "zeroed slots left claimed; the zeroer takes them over");
            }
            self.now_zeroing(d, &slots, false);
        }
        result
    }

    async fn try_allocate(
        &self,
        name: &str,
        id: VolumeId,
        index: u64,
        mine: &[(DriveId, u64)],
        stalled: &BTreeSet<DriveId>,
    ) -> Result<Attempt, CatalogError> {
        let _one_taker = self.slot_takers.lock().await;
        // Fast path: the volume and drives as this catalog last wrote them.
        // The transaction compares their revisions and the extent's
        // absence, so a stale cache costs a conflict, never a wrong write.
        let cached = {
            let c = self
                .alloc_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            c.as_ref()
                .filter(|c| c.uses < ALLOC_CACHE_USES_MAX)
                .and_then(|c| {
                    c.volumes
                        .get(name)
                        .map(|v| (v.clone(), c.drives.clone(), c.ids_rev))
                })
        };
        if let Some(((v, vrev), mut drives, ids_rev)) = cached {
            if v.id == id && v.state == VolumeState::Ready && index < v.extents() {
                let mut riders = self.board(&mut drives);
                if let Ok(Plan::Ready(txn, alloc)) =
                    self.plan_allocation(name, index, v, vrev, &drives, mine, stalled)
                {
                    // A drive added since (by any control plane) bumps
                    // pool/ids: the conflict sends this to the fresh path.
                    let txn = guard(txn, keys::IDS, ids_rev);
                    let (op, txn) = Self::carry(txn, &alloc, &drives, &riders);
                    if let Some(rev) = self.commit(op, txn).await? {
                        self.arrive(&mut riders, &alloc, &mut drives, rev);
                        self.remember(name, &alloc, rev, drives, ids_rev, false);
                        return Ok(Attempt::Done(alloc));
                    }
                }
            }
            *self
                .alloc_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
        for _ in 0..CONFLICT_RETRIES_MAX {
            let (v, vrev) = self.volume_rev(name).await?;
            if v.id != id {
                return Err(CatalogError::VolumeRecreated {
                    name: name.to_owned(),
                    expected: id,
                    found: v.id,
                });
            }
            if v.state != VolumeState::Ready {
                return Err(CatalogError::Deleting(name.to_owned()));
            }
            if index >= v.extents() {
                return Err(CatalogError::ExtentOutOfRange {
                    name: name.to_owned(),
                    index,
                    extents: v.extents(),
                });
            }
            let existing = self.get::<ExtentRecord>(&keys::extent(v.id, index)).await?;
            let ids_rev = self.get::<Ids>(keys::IDS).await?.map_or(0, |(_, r)| r);
            let mut drives: Vec<(DriveRecord, u64)> = self.list(keys::DRIVES).await?;
            if let Some((extent, _)) = existing {
                let drives = drives
                    .into_iter()
                    .map(|(d, _)| d)
                    .filter(|d| extent.chain.iter().any(|r| r.drive == d.id))
                    .collect();
                return Ok(Attempt::Done(Allocation {
                    extent,
                    volume: v,
                    drives,
                }));
            }
            let mut riders = self.board(&mut drives);
            let (txn, alloc) =
                match self.plan_allocation(name, index, v, vrev, &drives, mine, stalled)? {
                    Plan::Ready(txn, alloc) => (txn, alloc),
                    Plan::NeedsZeroing(ids) => return Ok(Attempt::NeedsZeroing(ids)),
                };
            let (op, txn) = Self::carry(txn, &alloc, &drives, &riders);
            if let Some(rev) = self.commit(op, txn).await? {
                self.arrive(&mut riders, &alloc, &mut drives, rev);
                self.remember(name, &alloc, rev, drives, ids_rev, true);
                return Ok(Attempt::Done(alloc));
            }
        }
        Err(CatalogError::Contended("allocate_extent"))
    }

    // ----------------------------------------------------- zeroing and fences

    /// Makes up to `n` dirty slots of drive `id` clean: claims a batch of
    /// at most [`ZERO_BATCH_MAX`] (one transaction at revision R), zeroes
    /// it at epoch R with `zero`, then declares it clean in the transaction
    /// that claims the next batch: one transaction per batch. Returns how
    /// many became clean. Each transaction holds the slot lock; the
    /// zeroing does not. While extent faults are committing, a step rides
    /// on the next fault's transaction instead of committing alone
    /// (`Catalog::ride`, private).
    pub async fn zero_ahead<Z, Fut>(
        &self,
        id: DriveId,
        n: usize,
        zero: &Z,
    ) -> Result<usize, CatalogError>
    where
        Z: Fn(ZeroJob) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let mut zeroed: Vec<u64> = Vec::new();
        let mut remaining = n;
        let mut made = 0;
        loop {
            let batch = remaining.min(ZERO_BATCH_MAX);
            let mut step = self
                .ride(id, &zeroed, batch)
                .await
                .map(|r| (r.drive, r.finished, r.claimed, r.epoch));
            for _ in 0..CONFLICT_RETRIES_MAX {
                if step.is_some() {
                    break;
                }
                let _one_taker = self.slot_takers.lock().await;
                let (mut d, drev) = self.drive_rev(id).await?;
                let done = d.finish_zeroing(&zeroed, self.claimant);
                let claimed = d.claim_for_zeroing(batch, self.claimant);
                if done.is_empty() && claimed.is_empty() {
                    step = Some((d, done, claimed, 0));
                    break;
                }
                if let Some(rev) = self.put_drive("zero_ahead", &d, drev).await? {
                    self.now_zeroing(id, &claimed, true);
                    step = Some((d, done, claimed, rev));
                    break;
                }
            }
            let Some((drive, done, claimed, epoch)) = step else {
                self.now_zeroing(id, &zeroed, false);
                return Err(CatalogError::Contended("zero_ahead"));
            };
            made += done.len();
            self.now_zeroing(id, &zeroed, false);
            if claimed.is_empty() {
                return Ok(made);
            }
            remaining -= claimed.len();
            if let Err(e) = zero(ZeroJob {
                drive,
                slots: claimed.clone(),
                epoch,
            })
            .await
            {
                // Left claimed: stale now, so fenced before it is zeroed
                // again (a Write Zeroes that failed may still land).
                self.now_zeroing(id, &claimed, false);
                return Err(CatalogError::Prepare(e));
            }
            zeroed = claimed;
        }
    }

    /// Hands a zeroer step (declare `finished` clean, claim `claim` more on
    /// drive `id`) to the next extent fault's transaction, when faults are
    /// committing; None when none carried it within the ride window (or it
    /// failed), and the caller commits the step alone.
    async fn ride(&self, id: DriveId, finished: &[u64], claim: usize) -> Option<Rode> {
        let recent = self
            .fault_committed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|t| t.elapsed() < self.ride_window);
        if !recent {
            return None;
        }
        let (done, mut rode) = tokio::sync::oneshot::channel();
        let ride = Ride {
            finished: finished.to_vec(),
            claim,
            done,
        };
        self.rides
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, ride);
        match tokio::time::timeout(self.ride_window, &mut rode).await {
            Ok(r) => r.ok(),
            Err(_) => {
                // A fault boards rides under the slot lock and answers
                // before it lets go: once this holds the lock, the ride is
                // either still waiting (withdraw it) or answered.
                let _one_taker = self.slot_takers.lock().await;
                let withdrawn = self
                    .rides
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id)
                    .is_some();
                if withdrawn {
                    None
                } else {
                    rode.try_recv().ok()
                }
            }
        }
    }

    /// Applies the waiting zeroer steps to `drives` (the records a fault
    /// plans on, so that it may take a slot just declared clean). Returns
    /// them with what each finished and claimed; the fault's transaction
    /// carries them ([`Self::carry`]) and answers them ([`Self::arrive`]).
    /// A ride dropped unanswered (the fault failed) falls back to its own
    /// commit. Callers hold the slot lock.
    fn board(&self, drives: &mut [(DriveRecord, u64)]) -> Vec<Boarded> {
        let rides: Vec<(DriveId, Ride)> = {
            let mut waiting = self.rides.lock().unwrap_or_else(PoisonError::into_inner);
            let ids: Vec<DriveId> = waiting.keys().copied().take(RIDES_PER_FAULT_MAX).collect();
            ids.into_iter()
                .filter_map(|id| waiting.remove(&id).map(|r| (id, r)))
                .collect()
        };
        let mut riders = Vec::with_capacity(rides.len());
        for (id, ride) in rides {
            let Some((d, _)) = drives.iter_mut().find(|(d, _)| d.id == id) else {
                continue; // Not in the pool any more: dropped, so it falls back.
            };
            let finished = d.finish_zeroing(&ride.finished, self.claimant);
            let claimed = d.claim_for_zeroing(ride.claim, self.claimant);
            riders.push(Boarded {
                drive: id,
                ride,
                finished,
                claimed,
            });
        }
        riders
    }

    /// Adds to a fault's transaction the drives that carry a ride and that
    /// the fault did not choose (those it chose it writes already, rides
    /// included). Returns the commit's name: `allocate_extent.ride` when it
    /// carries a zeroer step (its own crash points), else `allocate_extent`.
    fn carry(
        mut txn: Txn,
        alloc: &Allocation,
        drives: &[(DriveRecord, u64)],
        riders: &[Boarded],
    ) -> (&'static str, Txn) {
        let mut op = "allocate_extent";
        for b in riders {
            if b.finished.is_empty() && b.claimed.is_empty() {
                continue;
            }
            op = "allocate_extent.ride";
            if alloc.drives.iter().any(|a| a.id == b.drive) {
                continue;
            }
            if let Some((d, drev)) = drives.iter().find(|(d, _)| d.id == b.drive) {
                txn = txn
                    .unchanged(keys::drive(d.id), *drev)
                    .put(keys::drive(d.id), keys::encode(d));
            }
        }
        (op, txn)
    }

    /// Answers the rides a fault's transaction committed at `rev`, and
    /// brings `drives` (the fast path's next copy) up to what it wrote.
    fn arrive(
        &self,
        riders: &mut Vec<Boarded>,
        alloc: &Allocation,
        drives: &mut [(DriveRecord, u64)],
        rev: u64,
    ) {
        *self
            .fault_committed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(tokio::time::Instant::now());
        for b in riders.drain(..) {
            let written = alloc.drives.iter().find(|a| a.id == b.drive).cloned();
            let Some((d, r)) = drives.iter_mut().find(|(d, _)| d.id == b.drive) else {
                continue;
            };
            let changed = !(b.finished.is_empty() && b.claimed.is_empty());
            if written.is_none() && changed {
                *r = rev;
            }
            let drive = written.unwrap_or_else(|| d.clone());
            self.now_zeroing(b.drive, &b.claimed, true);
            self.rides_taken
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let rode = Rode {
                drive,
                finished: b.finished,
                claimed: b.claimed,
                epoch: rev,
            };
            if let Err(rode) = b.ride.done.send(rode) {
                // The zeroer gave up waiting and is gone: its claims are
                // stale now, and are fenced before they are zeroed again.
                self.now_zeroing(rode.drive.id, &rode.claimed, false);
            }
        }
    }

    /// Claims up to `n` dirty slots of drive `id` for this process (one
    /// transaction at revision R) and zeroes them at epoch R. Returns them,
    /// still claimed and marked as being zeroed here: the caller declares
    /// them clean, or commits them to an extent, then unmarks them.
    async fn claim_and_zero<Z, Fut>(
        &self,
        id: DriveId,
        n: usize,
        zero: &Z,
    ) -> Result<Vec<u64>, CatalogError>
    where
        Z: Fn(ZeroJob) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let claimant = self.claimant;
        let Some((drive, slots, epoch)) = self
            .claim_slots("zero_ahead.claim", id, |d| d.claim_for_zeroing(n, claimant))
            .await?
        else {
            return Ok(Vec::new());
        };
        match zero(ZeroJob {
            drive,
            slots: slots.clone(),
            epoch,
        })
        .await
        {
            Ok(()) => Ok(slots),
            Err(e) => {
                // Left claimed: stale now, so fenced before it is zeroed
                // again (a Write Zeroes that failed may still land).
                self.now_zeroing(id, &slots, false);
                Err(CatalogError::Prepare(e))
            }
        }
    }

    /// Declares clean those of `slots` this process still claims; returns
    /// how many.
    async fn finish_zeroing(&self, id: DriveId, slots: &[u64]) -> Result<usize, CatalogError> {
        let mut done = 0;
        self.change_drive("zero_ahead.finish", id, |d| {
            done = d.finish_zeroing(slots, self.claimant).len();
            done > 0
        })
        .await?;
        Ok(done)
    }

    /// Zeroing claims on drive `d` that no zeroing of this process holds:
    /// their claimant died, was deposed, or failed to zero.
    pub fn stale_claims(&self, d: &DriveRecord) -> Vec<u64> {
        let now = self
            .zeroing_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        d.zeroing
            .iter()
            .map(|c| c.slot)
            .filter(|s| !now.contains(&(d.id, *s)))
            .collect()
    }

    /// Takes over the stale claims `slots` of drive `id` and makes them
    /// clean safely: claims them for this process (a transaction, whose
    /// revision R is above every epoch their old claimant zeroed at),
    /// `fence`s them at R, so that the old claimant's Write Zeroes still
    /// on its way is refused and those in flight have ended, then zeroes
    /// at R and declares them clean. A drive that cannot fence gets the
    /// slots quarantined instead (nothing can exclude the late zeroing); a
    /// drive not reachable now keeps them claimed for a later try.
    pub async fn recover_claims<F, FFut, Z, ZFut>(
        &self,
        id: DriveId,
        slots: &[u64],
        fence: &F,
        zero: &Z,
    ) -> Result<Fenced, CatalogError>
    where
        F: Fn(FenceJob) -> FFut,
        FFut: std::future::Future<Output = Fenced>,
        Z: Fn(ZeroJob) -> ZFut,
        ZFut: std::future::Future<Output = Result<(), String>>,
    {
        let (claimant, now) = (self.claimant, &self.zeroing_now);
        let Some((drive, mine, epoch)) = self
            .claim_slots("recover_claims.take", id, |d| {
                let stale: Vec<u64> = {
                    let now = now.lock().unwrap_or_else(PoisonError::into_inner);
                    slots
                        .iter()
                        .copied()
                        .filter(|s| !now.contains(&(id, *s)))
                        .collect()
                };
                d.reclaim(&stale, claimant)
            })
            .await?
        else {
            return Ok(Fenced::Yes);
        };
        let outcome = fence(FenceJob {
            drive: drive.clone(),
            slots: mine.clone(),
            epoch,
        })
        .await;
        let done = match &outcome {
            Fenced::Yes => match zero(ZeroJob {
                drive,
                slots: mine.clone(),
                epoch,
            })
            .await
            {
                Ok(()) => self.finish_zeroing(id, &mine).await.map(|_| Fenced::Yes),
                Err(e) => Ok(Fenced::NotNow(e)),
            },
            Fenced::Unsupported => self
                .change_drive("recover_claims.quarantine", id, |d| {
                    !d.quarantine_claims(&mine).is_empty()
                })
                .await
                .map(|_| Fenced::Unsupported),
            Fenced::NotNow(_) => Ok(outcome.clone()),
        };
        self.now_zeroing(id, &mine, false);
        done
    }

    /// Fences drive `id`'s quarantined slots at the drive record's revision
    /// (above every epoch their deleted owner wrote at, below every epoch
    /// a later owner gets) and releases them into `free` when the fence
    /// holds. Returns the outcome and the number released.
    pub async fn release_fenced_quarantine<F, FFut>(
        &self,
        id: DriveId,
        fence: &F,
    ) -> Result<(Fenced, usize), CatalogError>
    where
        F: Fn(FenceJob) -> FFut,
        FFut: std::future::Future<Output = Fenced>,
    {
        let (d, drev) = self.drive_rev(id).await?;
        if d.quarantined.is_empty() {
            return Ok((Fenced::Yes, 0));
        }
        let slots = d.quarantined.clone();
        let outcome = fence(FenceJob {
            drive: d,
            slots: slots.clone(),
            epoch: drev,
        })
        .await;
        if outcome != Fenced::Yes {
            return Ok((outcome, 0));
        }
        let mut released = 0;
        self.change_drive("release_quarantine", id, |d| {
            released = d.release_quarantined(&slots).len();
            released > 0
        })
        .await?;
        Ok((Fenced::Yes, released))
    }

    /// Releases every quarantined slot of drive `id` without a fence: the
    /// operator states that no client still holds a deleted volume there
    /// and no deposed control plane is zeroing (drives that cannot fence).
    pub async fn release_quarantine(&self, id: DriveId) -> Result<usize, CatalogError> {
        let mut released = 0;
        self.change_drive("release_quarantine", id, |d| {
            let all = d.quarantined.clone();
            released = d.release_quarantined(&all).len();
            released > 0
        })
        .await?;
        Ok(released)
    }

    /// Applies `change` to drive `id`'s record and commits it when it
    /// returns true, retrying on conflicts.
    async fn change_drive(
        &self,
        op: &'static str,
        id: DriveId,
        mut change: impl FnMut(&mut DriveRecord) -> bool,
    ) -> Result<Option<u64>, CatalogError> {
        for _ in 0..CONFLICT_RETRIES_MAX {
            let _one_taker = self.slot_takers.lock().await;
            let (mut d, drev) = self.drive_rev(id).await?;
            if !change(&mut d) {
                return Ok(None);
            }
            if let Some(rev) = self.put_drive(op, &d, drev).await? {
                return Ok(Some(rev));
            }
        }
        Err(CatalogError::Contended(op))
    }

    /// Claims for this process the slots `claim` picks on drive `id` (one
    /// transaction, retried on conflicts) and marks them as being zeroed
    /// here. Returns the drive as written, the slots and the revision (the
    /// epoch to zeroe at), or None when `claim` picked nothing.
    async fn claim_slots(
        &self,
        op: &'static str,
        id: DriveId,
        claim: impl Fn(&mut DriveRecord) -> Vec<u64>,
    ) -> Result<Option<(DriveRecord, Vec<u64>, u64)>, CatalogError> {
        for _ in 0..CONFLICT_RETRIES_MAX {
            let _one_taker = self.slot_takers.lock().await;
            let (mut d, drev) = self.drive_rev(id).await?;
            let slots = claim(&mut d);
            if slots.is_empty() {
                return Ok(None);
            }
            if let Some(rev) = self.put_drive(op, &d, drev).await? {
                self.now_zeroing(id, &slots, true);
                return Ok(Some((d, slots, rev)));
            }
        }
        Err(CatalogError::Contended(op))
    }

    async fn drive_rev(&self, id: DriveId) -> Result<(DriveRecord, u64), CatalogError> {
        self.get::<DriveRecord>(&keys::drive(id))
            .await?
            .ok_or(CatalogError::UnknownDrive(id))
    }

    /// Commits drive `d` read at `drev`; on success the allocation fast
    /// path's copy follows (callers hold the slot lock).
    async fn put_drive(
        &self,
        op: &'static str,
        d: &DriveRecord,
        drev: u64,
    ) -> Result<Option<u64>, CatalogError> {
        let txn = Txn::default()
            .unchanged(keys::drive(d.id), drev)
            .put(keys::drive(d.id), keys::encode(d));
        let rev = self.commit(op, txn).await?;
        if let Some(rev) = rev {
            let mut c = self
                .alloc_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(c) = c.as_mut() {
                for (cd, r) in c.drives.iter_mut().filter(|(cd, _)| cd.id == d.id) {
                    *cd = d.clone();
                    *r = rev;
                }
            }
        }
        Ok(rev)
    }

    fn now_zeroing(&self, id: DriveId, slots: &[u64], on: bool) {
        let mut now = self
            .zeroing_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for s in slots {
            if on {
                now.insert((id, *s));
            } else {
                now.remove(&(id, *s));
            }
        }
    }

    /// The drives that may take an extent of `v`, with their placement
    /// terms: up, and with a block size that divides the volume's.
    pub(crate) fn candidates(
        &self,
        v: &VolumeRecord,
        drives: &[(DriveRecord, u64)],
    ) -> Vec<DriveCandidate> {
        let busy = self
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        drives
            .iter()
            .filter(|(d, _)| {
                d.state == DriveState::Up && v.block_size_bytes.is_multiple_of(d.block_size_bytes)
            })
            .map(|(d, _)| DriveCandidate {
                drive: d.id,
                target: d.spec.target().to_owned(),
                slots_free: d.slots_free(),
                volume_extents: v.extents_per_drive.get(&d.id).copied().unwrap_or(0),
                used_fraction: d.used_fraction(),
                busy_degree: busy.get(&d.id).copied().unwrap_or(0.0),
                fragment_degree: d.fragment_degree(),
                preferred: v
                    .prefer
                    .iter()
                    .any(|p| *p == d.spec.addr || *p == d.spec.nqn),
            })
            .collect()
    }

    /// Chooses the chain of a new extent and builds its transaction; drives
    /// in `stalled` only when the others are too few.
    #[allow(clippy::too_many_arguments)]
    fn plan_allocation(
        &self,
        name: &str,
        index: u64,
        mut v: VolumeRecord,
        vrev: u64,
        drives: &[(DriveRecord, u64)],
        mine: &[(DriveId, u64)],
        stalled: &BTreeSet<DriveId>,
    ) -> Result<Plan, CatalogError> {
        let ekey = keys::extent(v.id, index);
        let candidates = self.candidates(&v, drives);
        let allocated: u64 = v.extents_per_drive.values().sum();
        let choose = |c: &[DriveCandidate]| {
            placement::choose(
                c,
                usize::from(v.replicas),
                allocated,
                v.id.0.wrapping_add(index),
                &self.weights,
            )
        };
        let others: Vec<DriveCandidate> = candidates
            .iter()
            .filter(|c| !stalled.contains(&c.drive))
            .cloned()
            .collect();
        let chosen = if others.len() < candidates.len() {
            choose(&others).or_else(|_| choose(&candidates))
        } else {
            choose(&candidates)
        };
        let chosen = chosen
                .map_err(|PlacementError::PoolFull { replicas, available }| {
                    CatalogError::PoolFull(format!(
                        "extent {index} of {name:?} needs {replicas} drives with a free extent; {available} have one"
                    ))
                })?;
        let mut txn = Txn::default()
            .absent(ekey.clone())
            .unchanged(keys::volume(name), vrev);
        let mut chain = Vec::with_capacity(chosen.len());
        let mut used = Vec::with_capacity(chosen.len());
        // Above every revision read, so above any fence a slot's previous
        // owner raised (freeing the slot rewrote its drive's record later).
        let mut epoch = vrev;
        let mut needs = Vec::new();
        for id in &chosen {
            let (d, drev) = drives
                .iter()
                .find(|(d, _)| d.id == *id)
                .ok_or(CatalogError::UnknownDrive(*id))?;
            epoch = epoch.max(*drev);
            let mut d = d.clone();
            // A slot this fault zeroed under its own claim, else a clean one.
            let did = d.id;
            let zeroed = mine
                .iter()
                .filter(|(m, _)| *m == did)
                .find_map(|(_, s)| d.take_claimed(*s, self.claimant).then_some(*s));
            let Some(slot) = zeroed.or_else(|| d.take_clean_slot()) else {
                needs.push(d.id);
                continue;
            };
            chain.push(Replica { drive: d.id, slot });
            *v.extents_per_drive.entry(d.id).or_default() += 1;
            txn = txn
                .unchanged(keys::drive(d.id), *drev)
                .put(keys::drive(d.id), keys::encode(&d));
            used.push(d);
        }
        if !needs.is_empty() {
            return Ok(Plan::NeedsZeroing(needs));
        }
        // Above the revision that declared each slot clean, so above the
        // epoch it was zeroed at.
        let extent = ExtentRecord {
            volume: v.id,
            index,
            chain,
            epoch: epoch + 1,
            rebuilding: None,
            retiring: None,
        };
        txn = txn
            .put(ekey, keys::encode(&extent))
            .put(keys::volume(name), keys::encode(&v));
        Ok(Plan::Ready(
            txn,
            Allocation {
                extent,
                volume: v,
                drives: used,
            },
        ))
    }

    /// Keeps what an allocation committed at `rev` for the next one.
    fn remember(
        &self,
        name: &str,
        alloc: &Allocation,
        rev: u64,
        mut drives: Vec<(DriveRecord, u64)>,
        ids_rev: u64,
        fresh_read: bool,
    ) {
        for (d, r) in drives.iter_mut() {
            if let Some(n) = alloc.drives.iter().find(|n| n.id == d.id) {
                *d = n.clone();
                *r = rev;
            }
        }
        let mut c = self
            .alloc_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let fresh = fresh_read || c.as_ref().is_none_or(|c| c.ids_rev != ids_rev);
        let c = c.get_or_insert_with(AllocCache::default);
        if fresh {
            c.uses = 0;
        }
        c.uses += 1;
        c.ids_rev = ids_rev;
        c.drives = drives;
        if c.volumes.len() >= ALLOC_CACHE_VOLUMES_MAX {
            c.volumes.clear();
        }
        c.volumes
            .insert(name.to_owned(), (alloc.volume.clone(), rev));
    }

    /// Deletes a volume and frees its extents (no client can hold it: the
    /// slots are freed without fences).
    pub async fn delete_volume(&self, name: &str) -> Result<(), CatalogError> {
        self.delete_volume_with(name, |_| async { Vec::new() })
            .await
    }

    /// Deletes a volume: marks it `Deleting` (one transaction), hands
    /// `fence` what it owns, then frees its extents. The control plane
    /// fences the volume's slots there, so that a client that still has
    /// the volume open cannot write into a slot after it is freed (and
    /// perhaps given to another volume). `fence` returns the drives it
    /// could not fence (unreachable, or not Sluice targets): their slots
    /// go to quarantine instead of `free`, until a later fence or the
    /// operator releases them.
    pub async fn delete_volume_with<F, Fut>(&self, name: &str, fence: F) -> Result<(), CatalogError>
    where
        F: Fn(Deleting) -> Fut,
        Fut: std::future::Future<Output = Vec<DriveId>>,
    {
        self.forget();
        let mut marked = false;
        for _ in 0..CONFLICT_RETRIES_MAX {
            let (mut v, rev) = self.volume_rev(name).await?;
            if v.state == VolumeState::Deleting {
                marked = true;
                break;
            }
            v.state = VolumeState::Deleting;
            let txn = Txn::default()
                .unchanged(keys::volume(name), rev)
                .put(keys::volume(name), keys::encode(&v));
            if self.commit("delete_volume.mark", txn).await?.is_some() {
                marked = true;
                break;
            }
        }
        if !marked {
            return Err(CatalogError::Contended("delete_volume.mark"));
        }
        let unfenced = match self.deleting(name).await? {
            Some(d) => fence(d).await,
            None => Vec::new(),
        };
        self.finish_delete(name, &unfenced).await
    }

    /// Finishes every delete a crash interrupted; returns the names.
    pub async fn resume_deletes(&self) -> Result<Vec<String>, CatalogError> {
        self.resume_deletes_with(|_| async { Vec::new() }).await
    }

    /// [`Self::resume_deletes`], fencing as [`Self::delete_volume_with`]
    /// does before the slots are freed.
    pub async fn resume_deletes_with<F, Fut>(&self, fence: F) -> Result<Vec<String>, CatalogError>
    where
        F: Fn(Deleting) -> Fut,
        Fut: std::future::Future<Output = Vec<DriveId>>,
    {
        let mut done = Vec::new();
        for v in self.volumes().await? {
            if v.state == VolumeState::Deleting {
                let unfenced = match self.deleting(&v.name).await? {
                    Some(d) => fence(d).await,
                    None => Vec::new(),
                };
                self.finish_delete(&v.name, &unfenced).await?;
                done.push(v.name);
            }
        }
        Ok(done)
    }

    /// What a volume marked `Deleting` still owns (None: it is gone).
    async fn deleting(&self, name: &str) -> Result<Option<Deleting>, CatalogError> {
        let (volume, vrev) = match self.volume_rev(name).await {
            Ok(x) => x,
            Err(CatalogError::UnknownVolume(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let extents: Vec<(ExtentRecord, u64)> = self.list(&keys::extents_of(volume.id)).await?;
        let drives: HashMap<DriveId, DriveRecord> = self
            .list::<DriveRecord>(keys::DRIVES)
            .await?
            .into_iter()
            .map(|(d, _)| (d.id, d))
            .collect();
        let mut replicas = Vec::new();
        for (e, _) in &extents {
            for r in e.owned() {
                let d = drives
                    .get(&r.drive)
                    .ok_or(CatalogError::UnknownDrive(r.drive))?;
                replicas.push((d.clone(), *r));
            }
        }
        Ok(Some(Deleting {
            volume,
            replicas,
            // The mark (or a later batch of the delete) wrote the volume
            // record at `vrev`: every chain epoch of the volume came from
            // an earlier transaction, so is at most `vrev`; a later owner
            // of a slot gets an epoch above the revision that freed it,
            // which is above `vrev` + 1.
            fence_epoch: vrev + 1,
        }))
    }

    async fn finish_delete(&self, name: &str, unfenced: &[DriveId]) -> Result<(), CatalogError> {
        let mut conflicts = 0;
        'fresh: loop {
            if conflicts >= CONFLICT_RETRIES_MAX {
                return Err(CatalogError::Contended("delete_volume"));
            }
            let (mut v, vrev) = match self.volume_rev(name).await {
                Ok(x) => x,
                // Finished by someone else.
                Err(CatalogError::UnknownVolume(_)) => return Ok(()),
                Err(e) => return Err(e),
            };
            if v.state != VolumeState::Deleting {
                return Err(CatalogError::Inconsistent(format!(
                    "volume {name:?} is not being deleted"
                )));
            }
            let extents: Vec<(ExtentRecord, u64)> = self.list(&keys::extents_of(v.id)).await?;
            if extents.is_empty() {
                let (reserved, reserved_rev) = self
                    .get::<Reserved>(keys::RESERVED)
                    .await?
                    .unwrap_or_default();
                let txn = guard(Txn::default(), keys::RESERVED, reserved_rev)
                    .unchanged(keys::volume(name), vrev)
                    .delete(keys::volume(name))
                    .put(
                        keys::RESERVED,
                        keys::encode(&Reserved {
                            slots: reserved.slots.saturating_sub(v.slots_reserved()),
                        }),
                    );
                if self.commit("delete_volume.finish", txn).await?.is_some() {
                    return Ok(());
                }
                conflicts += 1;
                continue;
            }
            // One batch: as many extents as fit in a transaction.
            let drives: HashMap<DriveId, (DriveRecord, u64)> = self
                .list::<DriveRecord>(keys::DRIVES)
                .await?
                .into_iter()
                .map(|(d, r)| (d.id, (d, r)))
                .collect();
            let mut touched: BTreeMap<DriveId, DriveRecord> = BTreeMap::new();
            let mut batch = Vec::new();
            for (e, erev) in &extents {
                let new_drives = e
                    .owned()
                    .filter(|r| !touched.contains_key(&r.drive))
                    .count();
                // Compares and deletes per extent, compare + put per drive,
                // plus the volume's compare and put.
                let ops = 2 * (batch.len() + 1) + 2 * (touched.len() + new_drives) + 2;
                if ops > TXN_OPS_MAX && !batch.is_empty() {
                    break;
                }
                for r in e.owned() {
                    let d = match touched.get_mut(&r.drive) {
                        Some(d) => d,
                        None => {
                            let (d, _) = drives
                                .get(&r.drive)
                                .ok_or(CatalogError::UnknownDrive(r.drive))?;
                            touched.entry(r.drive).or_insert_with(|| d.clone())
                        }
                    };
                    let given = if unfenced.contains(&r.drive) {
                        d.quarantine_slot(r.slot)
                    } else {
                        d.give_slot(r.slot)
                    };
                    if !given {
                        let k = keys::extent(v.id, e.index);
                        self.freed_under_a_stale_read(&k, *erev, || {
                            format!("{k}: slot {} of {} is already free", r.slot, r.drive)
                        })
                        .await?;
                        conflicts += 1;
                        continue 'fresh;
                    }
                    if let Some(n) = v.extents_per_drive.get_mut(&r.drive) {
                        *n = n.saturating_sub(1);
                    }
                }
                if e.is_degraded(&v) {
                    v.degraded_extents = v.degraded_extents.saturating_sub(1);
                }
                batch.push((e.index, *erev));
            }
            v.extents_per_drive.retain(|_, n| *n > 0);
            let mut txn = Txn::default()
                .unchanged(keys::volume(name), vrev)
                .put(keys::volume(name), keys::encode(&v));
            for (index, erev) in &batch {
                txn = txn
                    .unchanged(keys::extent(v.id, *index), *erev)
                    .delete(keys::extent(v.id, *index));
            }
            for (id, d) in &touched {
                let (_, drev) = drives.get(id).ok_or(CatalogError::UnknownDrive(*id))?;
                txn = txn
                    .unchanged(keys::drive(*id), *drev)
                    .put(keys::drive(*id), keys::encode(d));
            }
            if self.commit("delete_volume.batch", txn).await?.is_none() {
                conflicts += 1;
            }
        }
    }
}

/// Guards `key` at `rev`, where revision 0 means "absent".
fn guard(txn: Txn, key: &str, rev: u64) -> Txn {
    if rev == 0 {
        txn.absent(key)
    } else {
        txn.unchanged(key, rev)
    }
}
