//! Chain-epoch fences of one namespace (the protocol is in
//! `sluice_proto::fence`): a fence and a count of writes in flight per 2 MiB
//! granule.
//!
//! Every write is counted from the moment it passes its fence check until
//! its backend request completes (the [`FenceHold`] a command keeps). The
//! check and the raise are ordered so that a raise's answer counts every
//! write that passed the old fence: a writer increments its granule's count
//! and then reads the fence; a raiser writes the fence and then reads the
//! count (all `SeqCst`). If the writer read the old fence, its increment
//! came before the raise and the raiser sees it.
//!
//! Writes spanning more than [`WIDE_GRANULES`] granules (Write Zeroes or
//! Deallocate over a large range) are counted once, namespace-wide, and
//! checked against the highest fence of the namespace: never a loop over a
//! million granules per command.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use sluice_proto::fence::{GRANULE_BYTES, GRANULE_SHIFT};
use sluice_proto::Status;
use sluice_runtime::cast::usize_from;

/// Granules a namespace may have and still be fenceable: 8 TiB, a 64 MiB
/// table. Larger namespaces answer the Fence command with Invalid Field.
pub const GRANULES_MAX: u64 = 1 << 22;
/// Writes spanning more granules than this are counted namespace-wide.
pub const WIDE_GRANULES: u64 = 64;

#[derive(Debug, Default)]
struct Granule {
    fence: AtomicU64,
    writes: AtomicU32,
}

/// The fences of one namespace.
#[derive(Debug)]
pub struct Fences {
    granules: Box<[Granule]>,
    /// The highest fence of any granule (wide writes check this one).
    fence_max: AtomicU64,
    /// Wide writes in flight.
    wide_writes: AtomicU32,
    /// Writes refused for a stale epoch (a metric: stale clients, or hosts
    /// writing to a volume's drive behind the control plane's back).
    refused: AtomicU64,
    /// Reads refused for a stale epoch (readers on a map from before a
    /// remap).
    refused_reads: AtomicU64,
}

/// Which granules a write holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    Granules { first: usize, last: usize },
    Wide,
}

impl Fences {
    /// Fences for a namespace of `size_bytes`, all at 0 (no fence).
    pub fn new(size_bytes: u64) -> Fences {
        let n = size_bytes.div_ceil(GRANULE_BYTES);
        let n = if n > GRANULES_MAX { 0 } else { usize_from(n) };
        Fences {
            granules: (0..n).map(|_| Granule::default()).collect(),
            fence_max: AtomicU64::new(0),
            wide_writes: AtomicU32::new(0),
            refused: AtomicU64::new(0),
            refused_reads: AtomicU64::new(0),
        }
    }

    fn span(&self, offset_bytes: u64, len_bytes: u64) -> Option<Span> {
        if len_bytes == 0 || self.granules.is_empty() {
            return None;
        }
        let first = offset_bytes >> GRANULE_SHIFT;
        let last = (offset_bytes.saturating_add(len_bytes - 1) >> GRANULE_SHIFT)
            .min(self.granules.len() as u64 - 1);
        if first > last {
            return None;
        }
        if last - first + 1 > WIDE_GRANULES {
            return Some(Span::Wide);
        }
        Some(Span::Granules {
            first: usize_from(first),
            last: usize_from(last),
        })
    }

    /// Admits a write of `len_bytes` at `offset_bytes` carrying `epoch`:
    /// counted in flight until the returned span is released, or refused
    /// with Stale Chain Epoch when a granule's fence is above `epoch`.
    fn admit(&self, offset_bytes: u64, len_bytes: u64, epoch: u64) -> Result<Option<Span>, Status> {
        let Some(span) = self.span(offset_bytes, len_bytes) else {
            return Ok(None);
        };
        match span {
            Span::Wide => {
                self.wide_writes.fetch_add(1, SeqCst);
                if epoch < self.fence_max.load(SeqCst) {
                    return Err(self.refuse(span));
                }
            }
            Span::Granules { first, last } => {
                let gs = &self.granules[first..=last];
                for g in gs {
                    g.writes.fetch_add(1, SeqCst);
                }
                if gs.iter().any(|g| epoch < g.fence.load(SeqCst)) {
                    return Err(self.refuse(span));
                }
            }
        }
        Ok(Some(span))
    }

    /// Checks a read of `len_bytes` at `offset_bytes` carrying `epoch`: a
    /// read from a replica whose chain moved on (an extent remapped off
    /// this drive, its slot fenced) is refused with Stale Chain Epoch, so
    /// a reader on an old map refetches instead of reading a retired copy.
    /// Reads carrying no epoch (0: hosts that know nothing of fences) and
    /// reads are never counted in flight.
    pub(crate) fn check_read(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        epoch: u64,
    ) -> Result<(), Status> {
        if epoch == 0 {
            return Ok(());
        }
        let stale = match self.span(offset_bytes, len_bytes) {
            None => false,
            Some(Span::Wide) => epoch < self.fence_max.load(SeqCst),
            Some(Span::Granules { first, last }) => self.granules[first..=last]
                .iter()
                .any(|g| epoch < g.fence.load(SeqCst)),
        };
        if stale {
            self.refused_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(Status::STALE_EPOCH);
        }
        Ok(())
    }

    /// Refuses an admitted write: releases its span and counts it.
    fn refuse(&self, span: Span) -> Status {
        self.release(span);
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Status::STALE_EPOCH
    }

    /// Reads refused for a stale epoch so far.
    pub fn refused_reads(&self) -> u64 {
        self.refused_reads
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes refused for a stale epoch so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn release(&self, span: Span) {
        match span {
            Span::Wide => {
                let before = self.wide_writes.fetch_sub(1, SeqCst);
                debug_assert!(before > 0, "a wide write released twice");
            }
            Span::Granules { first, last } => {
                for g in &self.granules[first..=last] {
                    let before = g.writes.fetch_sub(1, SeqCst);
                    debug_assert!(before > 0, "a write released twice");
                }
            }
        }
    }

    /// The Fence command: raises (when `raise`) the fences of `count`
    /// granules from `first` to `epoch`, and returns the writes admitted to
    /// them and not yet completed.
    pub fn fence(&self, first: u64, count: u32, epoch: u64, raise: bool) -> Result<u32, Status> {
        let end = first
            .checked_add(u64::from(count))
            .filter(|e| *e <= self.granules.len() as u64)
            .ok_or(Status::INVALID_FIELD)?;
        let gs = &self.granules[usize_from(first)..usize_from(end)];
        if raise {
            for g in gs {
                g.fence.fetch_max(epoch, SeqCst);
            }
            self.fence_max.fetch_max(epoch, SeqCst);
        }
        let writes = gs
            .iter()
            .map(|g| g.writes.load(SeqCst))
            .fold(self.wide_writes.load(SeqCst), u32::saturating_add);
        Ok(writes)
    }

    /// The fence of the granule holding `offset_bytes` (tests, tools).
    pub fn fence_at(&self, offset_bytes: u64) -> u64 {
        self.granules
            .get(usize_from(offset_bytes >> GRANULE_SHIFT))
            .map_or(0, |g| g.fence.load(SeqCst))
    }
}

/// A write's place in its namespace's fence counts, released when the
/// command that holds it is dropped (after its backend request completed).
#[derive(Debug)]
pub(crate) struct FenceHold {
    fences: Arc<Fences>,
    span: Span,
}

impl FenceHold {
    /// Admits a write to a namespace with `fences` (see [`Fences::admit`]);
    /// `None` when it touches no granule.
    pub(crate) fn admit(
        fences: &Arc<Fences>,
        offset_bytes: u64,
        len_bytes: u64,
        epoch: u64,
    ) -> Result<Option<FenceHold>, Status> {
        Ok(fences
            .admit(offset_bytes, len_bytes, epoch)?
            .map(|span| FenceHold {
                fences: fences.clone(),
                span,
            }))
    }
}

impl Drop for FenceHold {
    fn drop(&mut self) {
        self.fences.release(self.span);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn reads_carrying_an_epoch_below_the_fence_are_refused() {
        let f = Fences::new(64 * MIB);
        assert_eq!(f.fence(1, 1, 7, true), Ok(0));
        // No epoch: a host that knows nothing of fences reads freely.
        assert_eq!(f.check_read(2 * MIB, 4096, 0), Ok(()));
        assert_eq!(f.check_read(2 * MIB, 4096, 6), Err(Status::STALE_EPOCH));
        assert_eq!(
            f.check_read(2 * MIB - 4096, 8192, 6),
            Err(Status::STALE_EPOCH)
        );
        assert_eq!(f.check_read(2 * MIB, 4096, 7), Ok(()));
        assert_eq!(f.check_read(0, 4096, 1), Ok(()), "a neighbour granule");
        // Reads are not counted in flight: a fence's drain never waits
        // for them. Refusals are counted apart from writes'.
        assert_eq!(f.fence(1, 1, 0, false), Ok(0));
        assert_eq!((f.refused_reads(), f.refused()), (2, 0));
    }

    #[test]
    fn writes_below_a_raised_fence_are_refused_and_others_pass() {
        let f = Fences::new(64 * MIB);
        assert_eq!(
            f.admit(0, 4096, 0),
            Ok(Some(Span::Granules { first: 0, last: 0 }))
        );
        f.release(Span::Granules { first: 0, last: 0 });
        assert_eq!(f.fence(1, 1, 10, true), Ok(0));
        assert_eq!(f.admit(2 * MIB, 4096, 9), Err(Status::STALE_EPOCH));
        assert_eq!(
            f.admit(2 * MIB, 4096, 0),
            Err(Status::STALE_EPOCH),
            "no epoch is the oldest"
        );
        let held = f.admit(2 * MIB, 4096, 10).unwrap().unwrap();
        assert_eq!(
            f.fence(1, 1, 0, false),
            Ok(1),
            "the admitted write is counted"
        );
        f.release(held);
        assert_eq!(f.fence(1, 1, 0, false), Ok(0));
        assert_eq!(f.refused(), 2);
        // Neighbours are untouched; fences never go down.
        assert!(f.admit(0, 4096, 0).unwrap().is_some());
        assert_eq!(f.fence(1, 1, 3, true), Ok(0));
        assert_eq!(f.fence_at(2 * MIB), 10);
    }

    #[test]
    fn a_write_across_a_granule_edge_checks_and_counts_both() {
        let f = Fences::new(8 * MIB);
        f.fence(1, 1, 5, true).unwrap();
        assert_eq!(f.admit(2 * MIB - 4096, 8192, 4), Err(Status::STALE_EPOCH));
        assert_eq!(
            f.fence(0, 2, 0, false),
            Ok(0),
            "a refused write holds nothing"
        );
        let s = f.admit(2 * MIB - 4096, 8192, 5).unwrap().unwrap();
        assert_eq!(f.fence(0, 1, 0, false), Ok(1));
        assert_eq!(f.fence(1, 1, 0, false), Ok(1));
        f.release(s);
    }

    #[test]
    fn wide_writes_are_counted_once_and_checked_against_the_highest_fence() {
        let f = Fences::new(1024 * MIB);
        let s = f.admit(0, 1024 * MIB, 0).unwrap().unwrap();
        assert_eq!(s, Span::Wide);
        assert_eq!(
            f.fence(100, 1, 7, true),
            Ok(1),
            "a wide write in flight counts everywhere"
        );
        f.release(s);
        assert_eq!(f.admit(0, 1024 * MIB, 6), Err(Status::STALE_EPOCH));
        assert!(f.admit(0, 1024 * MIB, 7).unwrap().is_some());
    }

    #[test]
    fn fences_outside_the_namespace_are_invalid() {
        let f = Fences::new(4 * MIB + 1);
        assert_eq!(
            f.fence(2, 1, 1, true),
            Ok(0),
            "a partial last granule exists"
        );
        assert_eq!(f.fence(3, 1, 1, true), Err(Status::INVALID_FIELD));
        assert_eq!(f.fence(u64::MAX, 2, 1, true), Err(Status::INVALID_FIELD));
        let huge = Fences::new((GRANULES_MAX + 1) * GRANULE_BYTES);
        assert_eq!(
            huge.fence(0, 1, 1, true),
            Err(Status::INVALID_FIELD),
            "too large to fence"
        );
        assert_eq!(
            huge.admit(0, 4096, 0),
            Ok(None),
            "and writes pass unchecked"
        );
    }

    /// The ordering argument in the module doc, exercised: a raiser that
    /// sees 0 writes in flight never races a write that passed the old
    /// fence and is still running.
    #[test]
    fn a_drained_raise_never_misses_a_write_that_passed_the_old_fence() {
        use std::sync::atomic::AtomicBool;
        let f = Arc::new(Fences::new(4 * MIB));
        // The epoch + 1 of the write running now, 0 when none runs.
        let running = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (f, running, stop) = (f.clone(), running.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut epoch = 0;
                while !stop.load(SeqCst) {
                    match f.admit(0, 4096, epoch) {
                        Ok(Some(s)) => {
                            running.store(epoch + 1, SeqCst);
                            std::hint::spin_loop();
                            running.store(0, SeqCst);
                            f.release(s);
                        }
                        Ok(None) => panic!("the write touches granule 0"),
                        Err(_) => epoch = f.fence_at(0),
                    }
                }
            })
        };
        for e in 1..2000u64 {
            f.fence(0, 1, e, true).unwrap();
            while f.fence(0, 1, e, false).unwrap() != 0 {
                std::hint::spin_loop();
            }
            // Drained: a write running now was admitted at epoch >= e.
            let r = running.load(SeqCst);
            assert!(
                r == 0 || r > e,
                "a write at epoch {} runs after the drain of {e}",
                r - 1
            );
        }
        stop.store(true, SeqCst);
        writer.join().unwrap();
    }
}
