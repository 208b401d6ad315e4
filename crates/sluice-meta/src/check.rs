//! Whole-catalog invariants: the metadata's fsck.
//!
//! * every record decodes and passes its own check (else: the key);
//! * every replica's slot is below its drive's `next_slot`, in none of its
//!   free/clean/zeroing/quarantined lists, and owned by no other replica
//!   (nothing owned twice);
//! * every drive's handed-out slots are owned or in one list (nothing
//!   leaked);
//! * every extent belongs to an existing volume;
//! * each volume's `extents_per_drive` matches its extents;
//! * `pool/reserved` is the sum of the volumes' reservations;
//! * `pool/ids` is beyond every id in use.
//!
//! `sluice control` runs it at start-up; the crash and model tests run it
//! after every step.

use std::collections::{BTreeMap, HashMap};

use sluice_volume::{DriveId, DriveRecord, ExtentRecord, VolumeId, VolumeRecord};

use crate::keys::{self, Ids, Reserved};
use crate::store::{MetaStore, StoreError};

/// What a clean catalog holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub drives: usize,
    pub volumes: usize,
    pub extents: usize,
    pub slots_used: u64,
    pub revision: u64,
}

/// A check's outcome: a summary, or every problem found.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("metadata inconsistent: {}", .0.join("; "))]
    Problems(Vec<String>),
}

/// Checks every invariant over one listing of the whole store.
pub async fn check_catalog<S: MetaStore>(store: &S) -> Result<Summary, CheckError> {
    let (revision, all) = store.list("").await?;
    let mut problems = Vec::new();
    let mut drives: BTreeMap<DriveId, DriveRecord> = BTreeMap::new();
    let mut volumes: HashMap<VolumeId, VolumeRecord> = HashMap::new();
    let mut extents: Vec<(String, ExtentRecord)> = Vec::new();
    let mut ids = Ids::default();
    let mut reserved = Reserved::default();
    for (k, v) in &all {
        // A record that does not decode stops the check: it names the key.
        if k == keys::IDS {
            ids = keys::decode(k, v)?;
        } else if k == keys::RESERVED {
            reserved = keys::decode(k, v)?;
        } else if k.starts_with(keys::DRIVES) {
            let d: DriveRecord = keys::decode(k, v)?;
            if let Err(r) = d.check() {
                problems.push(format!("{k}: {r}"));
            }
            if *k != keys::drive(d.id) {
                problems.push(format!("{k}: holds drive {}", d.id));
            }
            drives.insert(d.id, d);
        } else if k.starts_with(keys::VOLUMES) {
            let vol: VolumeRecord = keys::decode(k, v)?;
            if let Err(r) = vol.check() {
                problems.push(format!("{k}: {r}"));
            }
            if *k != keys::volume(&vol.name) {
                problems.push(format!("{k}: holds volume {:?}", vol.name));
            }
            volumes.insert(vol.id, vol);
        } else if k.starts_with(keys::EXTENTS) {
            extents.push((k.clone(), keys::decode(k, v)?));
        } else if k.starts_with(keys::TENANTS) {
            let t: sluice_volume::TenantRecord = keys::decode(k, v)?;
            if let Err(r) = t.check() {
                problems.push(format!("{k}: {r}"));
            }
            if *k != keys::tenant(&t.name) {
                problems.push(format!("{k}: holds tenant {:?}", t.name));
            }
        } else if k.starts_with(keys::LEADER) {
            // The election's candidates: not catalog records.
        } else {
            problems.push(format!("{k}: unknown key"));
        }
    }
    let mut owner: HashMap<(DriveId, u64), String> = HashMap::new();
    let mut per_volume: HashMap<VolumeId, BTreeMap<DriveId, u64>> = HashMap::new();
    let mut degraded: HashMap<VolumeId, u64> = HashMap::new();
    for (k, e) in &extents {
        if *k != keys::extent(e.volume, e.index) {
            problems.push(format!("{k}: holds extent {} of {}", e.index, e.volume));
        }
        match volumes.get(&e.volume) {
            Some(v) => {
                if let Err(r) = e.check(v) {
                    problems.push(format!("{k}: {r}"));
                }
                if e.is_degraded(v) {
                    *degraded.entry(v.id).or_default() += 1;
                }
            }
            None => problems.push(format!(
                "{k}: its volume {} does not exist (leaked)",
                e.volume
            )),
        }
        for r in e.owned() {
            *per_volume
                .entry(e.volume)
                .or_default()
                .entry(r.drive)
                .or_default() += 1;
            match drives.get(&r.drive) {
                None => problems.push(format!("{k}: replica on unknown drive {}", r.drive)),
                Some(d) => {
                    if r.slot >= d.next_slot {
                        problems.push(format!(
                            "{k}: slot {} of {} was never handed out",
                            r.slot, r.drive
                        ));
                    } else if let Some(list) = d.list_of(r.slot) {
                        problems.push(format!(
                            "{k}: slot {} of {} is also {list}",
                            r.slot, r.drive
                        ));
                    }
                }
            }
            if let Some(prev) = owner.insert((r.drive, r.slot), k.clone()) {
                problems.push(format!(
                    "{k}: slot {} of {} also owned by {prev}",
                    r.slot, r.drive
                ));
            }
        }
    }
    for d in drives.values() {
        let owned = owner.keys().filter(|(id, _)| *id == d.id).count() as u64;
        if owned + d.slots_unowned() != d.next_slot {
            problems.push(format!(
                "{}: {} slots handed out but {owned} owned and {} free, clean, zeroing or quarantined (leaked)",
                keys::drive(d.id),
                d.next_slot,
                d.slots_unowned()
            ));
        }
        if d.id.0 >= ids.next_drive {
            problems.push(format!(
                "{}: id not below pool/ids next_drive {}",
                keys::drive(d.id),
                ids.next_drive
            ));
        }
    }
    let mut want_reserved = 0;
    for v in volumes.values() {
        want_reserved += v.slots_reserved();
        let counted = per_volume.remove(&v.id).unwrap_or_default();
        if counted != v.extents_per_drive {
            problems.push(format!(
                "{}: extents_per_drive {:?} but its extents give {counted:?}",
                keys::volume(&v.name),
                v.extents_per_drive
            ));
        }
        let d = degraded.get(&v.id).copied().unwrap_or(0);
        if d != v.degraded_extents {
            problems.push(format!(
                "{}: degraded_extents {} but {d} extents have fewer than {} replicas",
                keys::volume(&v.name),
                v.degraded_extents,
                v.replicas
            ));
        }
        if v.id.0 >= ids.next_volume {
            problems.push(format!(
                "{}: id not below pool/ids next_volume {}",
                keys::volume(&v.name),
                ids.next_volume
            ));
        }
    }
    if want_reserved != reserved.slots {
        problems.push(format!(
            "{}: {} slots but the volumes reserve {want_reserved}",
            keys::RESERVED,
            reserved.slots
        ));
    }
    if !problems.is_empty() {
        return Err(CheckError::Problems(problems));
    }
    Ok(Summary {
        drives: drives.len(),
        volumes: volumes.len(),
        extents: extents.len(),
        slots_used: owner.len() as u64,
        revision,
    })
}
