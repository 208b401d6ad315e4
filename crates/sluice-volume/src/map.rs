//! A client's copy of one volume's extent map, and the request planner.
//!
//! [`VolumeMap::plan`] turns a byte range of the volume into [`Piece`]s: runs
//! of the request that go to one replica chain. A request is split where it
//! crosses an extent edge, and neighbouring extents whose every replica sits
//! in consecutive slots of the same drive are merged back into one piece (so
//! a volume laid out contiguously costs no more commands than a plain
//! namespace). Planning allocates nothing and is a few comparisons per
//! extent: this is the fast path's whole cost of elasticity.

use std::fmt;

use crate::record::{Chain, ExtentRecord, Replica, VolumeId, VolumeRecord, EXTENT_BYTES};

/// The cached map of one volume.
#[derive(Clone, Debug)]
pub struct VolumeMap {
    volume: VolumeRecord,
    /// Indexed by extent; `None` until allocated.
    extents: Vec<Option<MappedExtent>>,
}

/// An allocated extent as a client needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedExtent {
    pub chain: Chain,
    /// The chain epoch its writes carry.
    pub epoch: u64,
    /// A replica is being rebuilt: writes wait until the rebuild is done.
    pub rebuilding: bool,
    /// A remap in progress: the chain replica about to leave (reads go
    /// elsewhere when they can).
    pub retiring: Option<crate::record::Replica>,
}

/// The extent a write needs allocated before it can proceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentFault {
    pub volume: VolumeId,
    pub index: u64,
}

impl fmt::Display for ExtentFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "extent {} of {} is not allocated",
            self.index, self.volume
        )
    }
}

/// Where one piece of a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceTarget {
    /// Not allocated: reads see zeros, writes need an extent fault first.
    Unallocated,
    /// On the chain of extent `extent`; on replica `k`, the piece starts at
    /// byte `chain[k].slot * EXTENT_BYTES + offset_in_extent` of its drive
    /// and runs on contiguously (merged pieces span consecutive slots).
    Mapped { extent: u64 },
}

/// One run of a request that goes to one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Where in the request's buffer the piece starts.
    pub buf_offset: u64,
    /// The piece's length.
    pub len_bytes: u64,
    /// The first extent the piece covers.
    pub extent: u64,
    /// Where in that first extent it starts.
    pub offset_in_extent: u64,
    pub target: PieceTarget,
}

impl Piece {
    /// The byte offset on the drive of `replica` where this piece starts.
    pub fn drive_offset(&self, replica: &Replica) -> u64 {
        replica.slot * EXTENT_BYTES + self.offset_in_extent
    }
}

impl VolumeMap {
    /// An empty map for `volume` (nothing allocated).
    pub fn new(volume: VolumeRecord) -> VolumeMap {
        let n = usize::try_from(volume.extents()).unwrap_or(usize::MAX);
        VolumeMap {
            extents: vec![None; n],
            volume,
        }
    }

    /// A map from a volume and its extent records; records outside the
    /// volume or belonging to another are refused.
    pub fn from_records(
        volume: VolumeRecord,
        records: impl IntoIterator<Item = ExtentRecord>,
    ) -> Result<VolumeMap, String> {
        let mut map = VolumeMap::new(volume);
        for r in records {
            map.insert(r)?;
        }
        Ok(map)
    }

    /// The volume this map describes.
    pub fn volume(&self) -> &VolumeRecord {
        &self.volume
    }

    /// The map's epoch (the volume's chain epoch when it was fetched).
    pub fn epoch(&self) -> u64 {
        self.volume.epoch
    }

    /// Adds or replaces an extent's chain (after an extent fault or a
    /// refetch).
    pub fn insert(&mut self, record: ExtentRecord) -> Result<(), String> {
        record.check(&self.volume)?;
        let slot = usize::try_from(record.index)
            .ok()
            .and_then(|i| self.extents.get_mut(i))
            .ok_or_else(|| format!("extent {} outside the map", record.index))?;
        *slot = Some(MappedExtent {
            chain: record.chain,
            epoch: record.epoch,
            rebuilding: record.rebuilding.is_some(),
            retiring: record.retiring,
        });
        Ok(())
    }

    /// Grows (or, for a fresher record, replaces) the volume after an online
    /// resize. Extents already known are kept.
    pub fn update_volume(&mut self, volume: VolumeRecord) {
        let n = usize::try_from(volume.extents()).unwrap_or(usize::MAX);
        self.extents.resize(n, None);
        self.volume = volume;
    }

    /// Takes in a refetched map of the same volume without ever going back
    /// in time. Refetches race (two tasks of one client refetch at once, and
    /// the one that asked first may answer last), and a map that went back
    /// would hide an extent allocated since: reads of it would see zeros
    /// where acknowledged data lies. So an extent known here stays known
    /// (extents are freed only with their volume); a chain is replaced by a
    /// higher chain epoch, or at the same chain epoch by a map whose volume
    /// epoch is not lower (a failed drive shortens chains and raises only
    /// the volume's epoch); and the volume record is the one with the
    /// higher (epoch, size).
    pub fn absorb(&mut self, fetched: VolumeMap) {
        debug_assert_eq!(fetched.volume.id, self.volume.id, "maps of one volume");
        let fetched_newer = (fetched.volume.epoch, fetched.volume.size_bytes)
            >= (self.volume.epoch, self.volume.size_bytes);
        let same_or_newer_epoch = fetched.volume.epoch >= self.volume.epoch;
        if self.extents.len() < fetched.extents.len() {
            self.extents.resize(fetched.extents.len(), None);
        }
        for (mine, theirs) in self.extents.iter_mut().zip(fetched.extents) {
            let Some(theirs) = theirs else { continue };
            let take = match mine {
                None => true,
                Some(m) => {
                    theirs.epoch > m.epoch || (theirs.epoch == m.epoch && same_or_newer_epoch)
                }
            };
            if take {
                *mine = Some(theirs);
            }
        }
        if fetched_newer {
            self.volume = fetched.volume;
        }
    }

    /// The chain of extent `index`, if allocated.
    pub fn chain(&self, index: u64) -> Option<&Chain> {
        self.extent(index).map(|m| &m.chain)
    }

    /// Extent `index`, if allocated.
    pub fn extent(&self, index: u64) -> Option<&MappedExtent> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.extents.get(i))
            .and_then(Option::as_ref)
    }

    /// Whether any chain uses `drive`.
    pub fn uses_drive(&self, drive: crate::record::DriveId) -> bool {
        self.extents
            .iter()
            .flatten()
            .any(|m| m.chain.iter().any(|r| r.drive == drive))
    }

    /// Allocated extents.
    pub fn allocated(&self) -> usize {
        self.extents.iter().filter(|e| e.is_some()).count()
    }

    /// The first unallocated extent in `offset..offset + len`, if any.
    pub fn first_fault(&self, offset_bytes: u64, len_bytes: u64) -> Option<ExtentFault> {
        let (first, last) = extent_span(offset_bytes, len_bytes)?;
        (first..=last)
            .find(|&i| self.chain(i).is_none())
            .map(|index| ExtentFault {
                volume: self.volume.id,
                index,
            })
    }

    /// Plans `len_bytes` at `offset_bytes`: pieces in order, each at most
    /// `piece_bytes_max` long. Fails when the range is empty, unaligned to
    /// the volume's block or beyond its end.
    pub fn plan(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        piece_bytes_max: u64,
    ) -> Result<Plan<'_>, RangeError> {
        let bs = u64::from(self.volume.block_size_bytes);
        if len_bytes == 0 || !offset_bytes.is_multiple_of(bs) || !len_bytes.is_multiple_of(bs) {
            return Err(RangeError::Unaligned {
                offset_bytes,
                len_bytes,
                block_size_bytes: bs,
            });
        }
        let end = offset_bytes
            .checked_add(len_bytes)
            .ok_or(RangeError::Beyond {
                offset_bytes,
                len_bytes,
                size_bytes: self.volume.size_bytes,
            })?;
        if end > self.volume.size_bytes {
            return Err(RangeError::Beyond {
                offset_bytes,
                len_bytes,
                size_bytes: self.volume.size_bytes,
            });
        }
        // A piece never ends mid-block, so the cap is rounded down to blocks.
        let cap = (piece_bytes_max / bs).max(1) * bs;
        Ok(Plan {
            map: self,
            pos: offset_bytes,
            end,
            start: offset_bytes,
            cap,
        })
    }

    /// Whether extent `b` continues extent `a` on every replica: same drives
    /// in the same order, each in the next slot, at the same chain epoch (a
    /// piece carries one epoch), neither being rebuilt.
    fn contiguous(a: &MappedExtent, b: &MappedExtent) -> bool {
        a.chain.len() == b.chain.len()
            && a.epoch == b.epoch
            && !a.rebuilding
            && !b.rebuilding
            && a.chain
                .iter()
                .zip(&b.chain)
                .all(|(x, y)| x.drive == y.drive && x.slot.checked_add(1) == Some(y.slot))
    }
}

/// The extents `offset..offset+len` touches, first and last.
fn extent_span(offset_bytes: u64, len_bytes: u64) -> Option<(u64, u64)> {
    if len_bytes == 0 {
        return None;
    }
    let last_byte = offset_bytes.checked_add(len_bytes - 1)?;
    Some((offset_bytes / EXTENT_BYTES, last_byte / EXTENT_BYTES))
}

/// A request outside the volume or not made of whole blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("{len_bytes} bytes at {offset_bytes} is not whole {block_size_bytes}-byte blocks")]
    Unaligned {
        offset_bytes: u64,
        len_bytes: u64,
        block_size_bytes: u64,
    },
    #[error("{len_bytes} bytes at {offset_bytes} runs beyond the volume's {size_bytes} bytes")]
    Beyond {
        offset_bytes: u64,
        len_bytes: u64,
        size_bytes: u64,
    },
}

/// The pieces of one request, produced lazily (see [`VolumeMap::plan`]).
#[derive(Debug)]
pub struct Plan<'a> {
    map: &'a VolumeMap,
    pos: u64,
    end: u64,
    start: u64,
    cap: u64,
}

impl Iterator for Plan<'_> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if self.pos >= self.end {
            return None;
        }
        let extent = self.pos / EXTENT_BYTES;
        let offset_in_extent = self.pos % EXTENT_BYTES;
        let first = self.map.extent(extent);
        let limit = self.end.min(self.pos.saturating_add(self.cap));
        // Extend across extent edges while the next extent continues this one
        // (both unallocated, or physically contiguous on every replica).
        let mut piece_end = ((extent + 1) * EXTENT_BYTES).min(limit);
        let mut prev = first;
        let mut next_extent = extent + 1;
        while piece_end < limit {
            let next = self.map.extent(next_extent);
            let continues = match (prev, next) {
                (None, None) => true,
                (Some(a), Some(b)) => VolumeMap::contiguous(a, b),
                _ => false,
            };
            if !continues {
                break;
            }
            piece_end = ((next_extent + 1) * EXTENT_BYTES).min(limit);
            prev = next;
            next_extent += 1;
        }
        let piece = Piece {
            buf_offset: self.pos - self.start,
            len_bytes: piece_end - self.pos,
            extent,
            offset_in_extent,
            target: if first.is_some() {
                PieceTarget::Mapped { extent }
            } else {
                PieceTarget::Unallocated
            },
        };
        self.pos = piece_end;
        Some(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{DriveId, VolumeState};
    use proptest::prelude::*;

    fn volume(extents: u64, replicas: u8) -> VolumeRecord {
        VolumeRecord {
            id: VolumeId(7),
            name: "v".into(),
            state: VolumeState::Ready,
            size_bytes: extents * EXTENT_BYTES,
            block_size_bytes: 4096,
            replicas,
            tenant: None,
            prefer: vec![],
            epoch: 3,
            extents_per_drive: Default::default(),
            degraded_extents: 0,
        }
    }

    fn rec(index: u64, chain: &[(u32, u64)]) -> ExtentRecord {
        ExtentRecord {
            volume: VolumeId(7),
            index,
            chain: chain
                .iter()
                .map(|&(d, s)| Replica {
                    drive: DriveId(d),
                    slot: s,
                })
                .collect(),
            epoch: 0,
            rebuilding: None,
            retiring: None,
        }
    }

    const MIB: u64 = 1 << 20;

    fn at(mut r: ExtentRecord, epoch: u64) -> ExtentRecord {
        r.epoch = epoch;
        r
    }

    fn with_epoch(mut v: VolumeRecord, epoch: u64) -> VolumeRecord {
        v.epoch = epoch;
        v
    }

    /// The race that made reads of acknowledged data return zeros: a
    /// refetch that asked before extent 1 was allocated answers after the
    /// fault put extent 1 in the map.
    #[test]
    fn an_older_refetch_never_hides_an_allocated_extent() {
        let mut map = VolumeMap::from_records(volume(4, 2), [rec(0, &[(0, 0), (1, 0)])]).unwrap();
        let older = map.clone();
        map.insert(rec(1, &[(0, 1), (1, 1)])).unwrap();
        map.absorb(older);
        assert_eq!(map.allocated(), 2);
        assert_eq!(map.chain(1).map(|c| c[0].slot), Some(1));
    }

    #[test]
    fn chains_follow_the_higher_epoch_in_either_order() {
        let v = volume(4, 2);
        let before =
            VolumeMap::from_records(v.clone(), [at(rec(0, &[(0, 0), (1, 0)]), 5)]).unwrap();
        // A rebuild raised the extent's epoch and moved a replica.
        let rebuilt =
            VolumeMap::from_records(v.clone(), [at(rec(0, &[(0, 0), (2, 7)]), 9)]).unwrap();
        // A failed drive shortened the chain: same extent epoch, higher
        // volume epoch.
        let shortened =
            VolumeMap::from_records(with_epoch(v, 4), [at(rec(0, &[(0, 0)]), 5)]).unwrap();

        let mut m = before.clone();
        m.absorb(rebuilt.clone());
        m.absorb(before.clone());
        assert_eq!(m.extent(0).map(|e| e.epoch), Some(9));
        assert_eq!(m.chain(0).map(|c| c[1].drive), Some(DriveId(2)));

        let mut m = before.clone();
        m.absorb(shortened.clone());
        assert_eq!(m.chain(0).map(Vec::len), Some(1));
        assert_eq!(m.epoch(), 4);
        m.absorb(before);
        assert_eq!(m.chain(0).map(Vec::len), Some(1), "an older map came back");
        assert_eq!(m.epoch(), 4);
    }

    #[test]
    fn a_refetch_after_a_resize_grows_the_map() {
        let mut map = VolumeMap::new(volume(2, 1));
        let mut grown = volume(4, 1);
        grown.epoch = map.epoch();
        let grown = VolumeMap::from_records(grown, [rec(3, &[(0, 3)])]).unwrap();
        let small = map.clone();
        map.absorb(grown);
        map.absorb(small);
        assert_eq!(map.volume().extents(), 4);
        assert!(map.chain(3).is_some());
    }

    #[test]
    fn a_request_inside_one_extent_is_one_piece() {
        let map = VolumeMap::from_records(volume(4, 1), [rec(1, &[(0, 9)])]).unwrap();
        let p: Vec<_> = map
            .plan(EXTENT_BYTES + 8192, 4096, u64::MAX)
            .unwrap()
            .collect();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].target, PieceTarget::Mapped { extent: 1 });
        assert_eq!(p[0].offset_in_extent, 8192);
        assert_eq!(
            p[0].drive_offset(&map.chain(1).unwrap()[0]),
            9 * EXTENT_BYTES + 8192
        );
    }

    #[test]
    fn requests_split_at_extent_edges_and_merge_when_contiguous() {
        // 0 and 1 contiguous on drive 0; 2 on drive 1; 3 unallocated.
        let map = VolumeMap::from_records(
            volume(4, 1),
            [rec(0, &[(0, 4)]), rec(1, &[(0, 5)]), rec(2, &[(1, 0)])],
        )
        .unwrap();
        let p: Vec<_> = map.plan(MIB, 3 * EXTENT_BYTES, u64::MAX).unwrap().collect();
        let shape: Vec<_> = p
            .iter()
            .map(|p| (p.buf_offset, p.len_bytes, p.target))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, 3 * MIB, PieceTarget::Mapped { extent: 0 }),
                (3 * MIB, 2 * MIB, PieceTarget::Mapped { extent: 2 }),
                (5 * MIB, MIB, PieceTarget::Unallocated),
            ]
        );
        assert_eq!(
            map.first_fault(0, 4 * EXTENT_BYTES),
            Some(ExtentFault {
                volume: VolumeId(7),
                index: 3
            })
        );
        assert_eq!(map.first_fault(0, 3 * EXTENT_BYTES), None);
    }

    #[test]
    fn replicated_extents_merge_only_when_every_replica_is_contiguous() {
        let map = VolumeMap::from_records(
            volume(3, 2),
            [
                rec(0, &[(0, 1), (1, 1)]),
                rec(1, &[(0, 2), (1, 2)]),
                rec(2, &[(0, 3), (1, 9)]),
            ],
        )
        .unwrap();
        let lens: Vec<_> = map
            .plan(0, 3 * EXTENT_BYTES, u64::MAX)
            .unwrap()
            .map(|p| p.len_bytes)
            .collect();
        assert_eq!(lens, vec![2 * EXTENT_BYTES, EXTENT_BYTES]);
    }

    /// A piece carries one chain epoch, and writes to an extent being
    /// rebuilt wait: neither merges with its neighbours.
    #[test]
    fn extents_at_other_epochs_or_being_rebuilt_do_not_merge() {
        let mut newer = rec(1, &[(0, 2), (1, 2)]);
        newer.epoch = 40;
        let mut rebuilding = rec(3, &[(0, 4)]);
        rebuilding.rebuilding = Some(Replica {
            drive: DriveId(1),
            slot: 4,
        });
        let map = VolumeMap::from_records(
            volume(4, 2),
            [
                rec(0, &[(0, 1), (1, 1)]),
                newer,
                rec(2, &[(0, 3)]),
                rebuilding,
            ],
        )
        .unwrap();
        let lens: Vec<_> = map
            .plan(0, 4 * EXTENT_BYTES, u64::MAX)
            .unwrap()
            .map(|p| p.len_bytes)
            .collect();
        assert_eq!(lens, vec![EXTENT_BYTES; 4]);
        assert_eq!(map.extent(1).map(|m| m.epoch), Some(40));
        assert_eq!(map.extent(3).map(|m| m.rebuilding), Some(true));
    }

    #[test]
    fn pieces_respect_the_transfer_cap() {
        let map = VolumeMap::new(volume(2, 1));
        let lens: Vec<_> = map
            .plan(0, 4 * MIB, 1_500_000)
            .unwrap()
            .map(|p| p.len_bytes)
            .collect();
        // The cap rounds down to 4 KiB blocks: 1,499,136 bytes.
        assert!(
            lens.iter().all(|&l| l <= 1_499_136 && l % 4096 == 0),
            "{lens:?}"
        );
        assert_eq!(lens.iter().sum::<u64>(), 4 * MIB);
    }

    #[test]
    fn bad_ranges_are_refused() {
        let map = VolumeMap::new(volume(1, 1));
        assert!(matches!(
            map.plan(0, 0, 1 << 20),
            Err(RangeError::Unaligned { .. })
        ));
        assert!(matches!(
            map.plan(512, 4096, 1 << 20),
            Err(RangeError::Unaligned { .. })
        ));
        assert!(matches!(
            map.plan(EXTENT_BYTES - 4096, 8192, 1 << 20),
            Err(RangeError::Beyond { .. })
        ));
        assert!(matches!(
            map.plan(u64::MAX - 4095, 4096, 1 << 20),
            Err(RangeError::Unaligned { .. }) | Err(RangeError::Beyond { .. })
        ));
    }

    #[test]
    fn foreign_or_out_of_range_records_are_refused() {
        let mut map = VolumeMap::new(volume(2, 1));
        assert!(map.insert(rec(2, &[(0, 0)])).is_err());
        let mut r = rec(0, &[(0, 0)]);
        r.volume = VolumeId(8);
        assert!(map.insert(r).is_err());
        assert!(
            map.insert(rec(0, &[(0, 0), (0, 1)])).is_err(),
            "two replicas on one drive"
        );
    }

    #[test]
    fn resize_keeps_known_extents() {
        let mut map = VolumeMap::from_records(volume(2, 1), [rec(1, &[(0, 0)])]).unwrap();
        map.update_volume(volume(5, 1));
        assert!(map.chain(1).is_some());
        assert!(map.chain(4).is_none());
        assert!(map.plan(4 * EXTENT_BYTES, 4096, 1 << 20).is_ok());
    }

    proptest! {
        /// However a client's refetches interleave, it ends at the newest
        /// map: snapshots of one volume's history (allocations, rebuilds
        /// that raise an extent's epoch, failures that shorten a chain and
        /// raise the volume's) absorbed in any order give the last one.
        #[test]
        fn refetches_absorbed_in_any_order_end_at_the_newest_map(
            steps in proptest::collection::vec((0u8..3, 0u64..4), 1..12),
            order in proptest::collection::vec(any::<proptest::sample::Index>(), 1..12),
        ) {
            let mut now = VolumeMap::new(volume(4, 2));
            let mut epoch = 10;
            let mut history = vec![now.clone()];
            for (kind, index) in steps {
                epoch += 1;
                match (kind, now.extent(index).cloned()) {
                    (_, None) => now.insert(at(rec(index, &[(0, index), (1, index)]), epoch)).unwrap(),
                    (0, Some(e)) => {
                        let mut r = rec(index, &[(0, index), (2, epoch)]);
                        r.chain.truncate(e.chain.len().max(1));
                        now.insert(at(r, epoch)).unwrap();
                    }
                    (_, Some(e)) => {
                        let mut v = now.volume().clone();
                        v.epoch = epoch;
                        now.update_volume(v);
                        let mut r = rec(index, &[]);
                        r.chain = e.chain[..1].to_vec();
                        now.insert(at(r, e.epoch)).unwrap();
                    }
                }
                history.push(now.clone());
            }
            let mut client = history[0].clone();
            for i in &order {
                client.absorb(i.get(&history).clone());
            }
            client.absorb(now.clone());
            for i in &order {
                client.absorb(i.get(&history).clone());
            }
            prop_assert_eq!(&client.extents, &now.extents);
            prop_assert_eq!(client.epoch(), now.epoch());
        }

        /// Pieces tile the request exactly, each lies in allocated or
        /// unallocated space only, and every byte maps to the replica offset
        /// that its own extent's chain gives.
        #[test]
        fn plans_tile_the_request_and_map_every_byte_right(
            layout in proptest::collection::vec(proptest::option::of((0u32..3, 0u64..6)), 6),
            start_blocks in 0u64..(6 * 512),
            len_blocks in 1u64..1600,
            cap_blocks in 1u64..700,
        ) {
            let mut map = VolumeMap::new(volume(6, 1));
            for (i, l) in layout.iter().enumerate() {
                if let Some((d, s)) = l {
                    map.insert(rec(i as u64, &[(*d, *s)])).unwrap();
                }
            }
            let offset = start_blocks * 4096;
            let len = (len_blocks * 4096).min(6 * EXTENT_BYTES - offset);
            prop_assume!(len > 0);
            let mut expect_buf = 0;
            for p in map.plan(offset, len, cap_blocks * 4096).unwrap() {
                prop_assert_eq!(p.buf_offset, expect_buf);
                prop_assert!(p.len_bytes > 0 && p.len_bytes <= cap_blocks * 4096);
                // Check the first and last byte of the piece map where the
                // per-extent chain says.
                for probe in [0, p.len_bytes - 1] {
                    let vol_byte = offset + p.buf_offset + probe;
                    let ext = vol_byte / EXTENT_BYTES;
                    match (p.target, map.chain(ext)) {
                        (PieceTarget::Unallocated, None) => {}
                        (PieceTarget::Mapped { extent }, Some(chain)) => {
                            let first = map.chain(extent).unwrap();
                            prop_assert_eq!(first[0].drive, chain[0].drive);
                            prop_assert_eq!(p.drive_offset(&first[0]) + probe,
                                chain[0].slot * EXTENT_BYTES + vol_byte % EXTENT_BYTES);
                        }
                        (t, c) => prop_assert!(false, "piece {:?} over extent {:?}", t, c),
                    }
                }
                expect_buf += p.len_bytes;
            }
            prop_assert_eq!(expect_buf, len);
        }
    }
}
