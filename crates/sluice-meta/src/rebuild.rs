//! Rebuilding a lost replica, the catalog's side: three transactions around
//! the copy the control plane makes (`sluice-control/src/rebuild.rs`).
//!
//! 1. [`Catalog::begin_rebuild`] (or [`Catalog::begin_move`], a remap off a
//!    congested drive, which also marks the replica to retire): a degraded extent (its chain shorter than
//!    the volume's replica count, after a drive failed) gets a new replica on
//!    the best other drive, on another target when one has room. The slot is
//!    the extent's from now on (`ExtentRecord::rebuilding`), and the extent's
//!    epoch rises above every revision read. Clients that see `rebuilding`
//!    hold their writes to the extent; the control plane then fences the
//!    chain at the new epoch, so writers on an older map are refused.
//! 2. The control plane copies the extent from the chain's tail.
//! 3. [`Catalog::finish_rebuild`]: the new replica joins the chain's tail
//!    (a remap's retiring replica leaves it and its slot is freed), at a
//!    still higher epoch that writers carry from then on; or
//!    [`Catalog::abort_rebuild`] gives its slot back.
//!
//! Each is one transaction comparing what it read, so a crash leaves the
//! extent before, during (resumed by the next control plane: begin returns
//! the rebuild in progress) or after the rebuild.

use sluice_volume::placement;
use sluice_volume::{DriveId, DriveRecord, ExtentRecord, Replica, VolumeRecord, VolumeState};

use crate::catalog::{Catalog, CatalogError, CONFLICT_RETRIES_MAX};
use crate::keys;
use crate::store::{MetaStore, Txn};

/// A rebuild in progress: the extent as begun, with the drives it needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Rebuild {
    pub volume: VolumeRecord,
    /// The extent with `rebuilding` set and its new epoch.
    pub extent: ExtentRecord,
    /// The drives of the chain and of the new replica.
    pub drives: Vec<DriveRecord>,
}

impl Rebuild {
    /// The replica being filled.
    pub fn target(&self) -> Option<Replica> {
        self.extent.rebuilding
    }

    /// The drive record of `id`.
    pub fn drive(&self, id: DriveId) -> Option<&DriveRecord> {
        self.drives.iter().find(|d| d.id == id)
    }
}

impl<S: MetaStore> Catalog<S> {
    /// Volumes with degraded extents, by name.
    pub async fn degraded_volumes(&self) -> Result<Vec<VolumeRecord>, CatalogError> {
        Ok(self
            .volumes()
            .await?
            .into_iter()
            .filter(|v| v.degraded_extents > 0 && v.state == VolumeState::Ready)
            .collect())
    }

    /// Up to `limit` degraded extents of `volume`, those being rebuilt first
    /// (a crash interrupted them).
    pub async fn degraded_extents(
        &self,
        volume: &VolumeRecord,
        limit: usize,
    ) -> Result<Vec<ExtentRecord>, CatalogError> {
        let mut out: Vec<ExtentRecord> = self
            .list::<ExtentRecord>(&keys::extents_of(volume.id))
            .await?
            .into_iter()
            .map(|(e, _)| e)
            .filter(|e| e.is_degraded(volume))
            .collect();
        out.sort_by_key(|e| (e.rebuilding.is_none(), e.index));
        out.truncate(limit);
        Ok(out)
    }

    /// Starts rebuilding extent `index` of volume `name`: reserves a new
    /// replica and raises the extent's epoch. Returns the rebuild already in
    /// progress if there is one (a rebuild or a remap), and `None` when the
    /// extent is not degraded (any more) or gone.
    pub async fn begin_rebuild(
        &self,
        name: &str,
        index: u64,
    ) -> Result<Option<Rebuild>, CatalogError> {
        self.begin(name, index, None).await
    }

    /// Starts remapping extent `index` of volume `name` off drive `from`
    /// (Flint §5.5: a drive the view reports congested): reserves a new
    /// replica on the best drive outside the chain and `avoid`, and marks
    /// `from`'s replica to retire when the copy joins. The rebuilder then
    /// fences, copies and finishes it as a rebuild. `None` when the extent
    /// has no replica on `from`, is gone, or is already being rebuilt or
    /// remapped (a degraded extent is rebuilt first).
    pub async fn begin_move(
        &self,
        name: &str,
        index: u64,
        from: DriveId,
        avoid: &[DriveId],
    ) -> Result<Option<Rebuild>, CatalogError> {
        self.begin(name, index, Some((from, avoid))).await
    }

    async fn begin(
        &self,
        name: &str,
        index: u64,
        moving: Option<(DriveId, &[DriveId])>,
    ) -> Result<Option<Rebuild>, CatalogError> {
        let op = if moving.is_some() {
            "begin_move"
        } else {
            "begin_rebuild"
        };
        let _one_taker = self.lock_slot_takers().await;
        for _ in 0..CONFLICT_RETRIES_MAX {
            let (mut v, vrev) = self.volume_rev(name).await?;
            if v.state != VolumeState::Ready {
                return Ok(None);
            }
            let ekey = keys::extent(v.id, index);
            let Some((mut e, erev)) = self.get::<ExtentRecord>(&ekey).await? else {
                return Ok(None);
            };
            let drives: Vec<(DriveRecord, u64)> = self.list(keys::DRIVES).await?;
            let records = |e: &ExtentRecord| -> Vec<DriveRecord> {
                drives
                    .iter()
                    .filter(|(d, _)| e.owned().any(|r| r.drive == d.id))
                    .map(|(d, _)| d.clone())
                    .collect()
            };
            let (retiring, avoid) = match moving {
                None => {
                    if e.rebuilding.is_some() {
                        let drives = records(&e);
                        return Ok(Some(Rebuild {
                            volume: v,
                            extent: e,
                            drives,
                        }));
                    }
                    if !e.is_degraded(&v) {
                        return Ok(None);
                    }
                    (None, &[][..])
                }
                Some((from, avoid)) => {
                    if e.rebuilding.is_some() || e.is_degraded(&v) {
                        return Ok(None);
                    }
                    let Some(r) = e.chain.iter().find(|r| r.drive == from).copied() else {
                        return Ok(None);
                    };
                    (Some(r), avoid)
                }
            };
            // Another drive, on a target the chain does not use when one
            // has room (Flint: replicas on distinct failure domains). A
            // remap keeps the retiring replica's target out of that count.
            let chain_targets: Vec<String> = e
                .chain
                .iter()
                .filter(|r| Some(**r) != retiring)
                .filter_map(|r| drives.iter().find(|(d, _)| d.id == r.drive))
                .map(|(d, _)| d.spec.target().to_owned())
                .collect();
            let all: Vec<_> = self
                .candidates(&v, &drives)
                .into_iter()
                .filter(|c| {
                    c.slots_free > 0
                        && !e.chain.iter().any(|r| r.drive == c.drive)
                        && !avoid.contains(&c.drive)
                })
                .collect();
            let elsewhere: Vec<_> = all
                .iter()
                .filter(|c| !chain_targets.contains(&c.target))
                .cloned()
                .collect();
            let pool = if elsewhere.is_empty() {
                &all
            } else {
                &elsewhere
            };
            let allocated: u64 = v.extents_per_drive.values().sum();
            let chosen = placement::choose(
                pool,
                1,
                allocated,
                v.id.0.wrapping_add(index),
                self.weights(),
            )
            .map_err(|_| {
                CatalogError::PoolFull(format!(
                    "extent {index} of {name:?} needs a drive outside its chain with a free extent to {} onto; none has one",
                    if retiring.is_some() { "move" } else { "rebuild" }
                ))
            })?;
            let id = *chosen
                .first()
                .ok_or_else(|| CatalogError::Inconsistent("placement chose no drive".into()))?;
            let (d, drev) = drives
                .iter()
                .find(|(d, _)| d.id == id)
                .ok_or(CatalogError::UnknownDrive(id))?;
            let mut d = d.clone();
            let slot = d
                .take_slot()
                .ok_or_else(|| CatalogError::Inconsistent(format!("{id} has no free slot")))?;
            // Above every revision read: above the epoch of every map a
            // client may hold, and above any fence the slot's previous
            // owner raised.
            let epoch = vrev.max(erev).max(*drev) + 1;
            let degraded_before = e.is_degraded(&v);
            e.rebuilding = Some(Replica { drive: id, slot });
            e.retiring = retiring;
            e.epoch = epoch;
            if !degraded_before && e.is_degraded(&v) {
                v.degraded_extents += 1;
            }
            *v.extents_per_drive.entry(id).or_default() += 1;
            let txn = Txn::default()
                .unchanged(ekey.clone(), erev)
                .put(ekey, keys::encode(&e))
                .unchanged(keys::volume(name), vrev)
                .put(keys::volume(name), keys::encode(&v))
                .unchanged(keys::drive(id), *drev)
                .put(keys::drive(id), keys::encode(&d));
            self.forget();
            if self.commit(op, txn).await?.is_some() {
                let mut drives = records(&e);
                drives.retain(|x| x.id != id);
                drives.push(d);
                drives.sort_by_key(|d| d.id);
                return Ok(Some(Rebuild {
                    volume: v,
                    extent: e,
                    drives,
                }));
            }
        }
        Err(CatalogError::Contended(op))
    }

    /// The copy is done: the new replica joins the chain's tail, at a new
    /// epoch. Returns the extent as it now is; `None` when the rebuild is
    /// no longer the one in the metadata (a drive failed meanwhile, or the
    /// volume was deleted): nothing changes then.
    pub async fn finish_rebuild(&self, r: &Rebuild) -> Result<Option<ExtentRecord>, CatalogError> {
        self.end_rebuild(r, true).await
    }

    /// Gives a rebuild's new replica back (its drive failed, or the chain
    /// could not be fenced or read); the extent stays degraded, at its epoch.
    pub async fn abort_rebuild(&self, r: &Rebuild) -> Result<Option<ExtentRecord>, CatalogError> {
        self.end_rebuild(r, false).await
    }

    async fn end_rebuild(
        &self,
        r: &Rebuild,
        joined: bool,
    ) -> Result<Option<ExtentRecord>, CatalogError> {
        let op = if joined {
            "finish_rebuild"
        } else {
            "abort_rebuild"
        };
        let Some(target) = r.extent.rebuilding else {
            return Ok(None);
        };
        for _ in 0..CONFLICT_RETRIES_MAX {
            let (mut v, vrev) = match self.volume_rev(&r.volume.name).await {
                Ok(x) => x,
                Err(CatalogError::UnknownVolume(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
            if v.id != r.volume.id || v.state != VolumeState::Ready {
                return Ok(None);
            }
            let ekey = keys::extent(v.id, r.extent.index);
            let Some((mut e, erev)) = self.get::<ExtentRecord>(&ekey).await? else {
                return Ok(None);
            };
            if e.rebuilding != Some(target) || e.epoch != r.extent.epoch {
                return Ok(None);
            }
            let degraded_before = e.is_degraded(&v);
            let retiring = e.retiring.take();
            e.rebuilding = None;
            let mut txn = Txn::default()
                .unchanged(ekey.clone(), erev)
                .unchanged(keys::volume(&v.name), vrev);
            // The slot a remap retires (joined), or the one the rebuild had
            // reserved (aborted), goes back to its drive.
            let freed = if joined {
                e.chain.push(target);
                if let Some(old) = retiring {
                    e.chain.retain(|r| *r != old);
                }
                retiring
            } else {
                Some(target)
            };
            // A remap fenced the retiring replica above its epoch; an
            // aborted one leaves that replica in the chain, so the chain
            // moves above that fence too.
            if joined || retiring.is_some() {
                e.epoch = vrev.max(erev) + 1;
            }
            if let Some(gone) = freed {
                let (mut d, drev) = self
                    .get::<DriveRecord>(&keys::drive(gone.drive))
                    .await?
                    .ok_or(CatalogError::UnknownDrive(gone.drive))?;
                if !d.give_slot(gone.slot) {
                    self.freed_under_a_stale_read(&ekey, erev, || {
                        format!(
                            "{ekey}: slot {} of {} is already free",
                            gone.slot, gone.drive
                        )
                    })
                    .await?;
                    continue;
                }
                if let Some(n) = v.extents_per_drive.get_mut(&gone.drive) {
                    *n = n.saturating_sub(1);
                }
                v.extents_per_drive.retain(|_, n| *n > 0);
                txn = txn
                    .unchanged(keys::drive(gone.drive), drev)
                    .put(keys::drive(gone.drive), keys::encode(&d));
            }
            let degraded_after = e.is_degraded(&v);
            if degraded_before && !degraded_after {
                v.degraded_extents = v.degraded_extents.saturating_sub(1);
            } else if !degraded_before && degraded_after {
                v.degraded_extents += 1;
            }
            v.epoch += 1;
            txn = txn
                .put(ekey, keys::encode(&e))
                .put(keys::volume(&v.name), keys::encode(&v));
            self.forget();
            if self.commit(op, txn).await?.is_some() {
                return Ok(Some(e));
            }
        }
        Err(CatalogError::Contended(op))
    }
}
