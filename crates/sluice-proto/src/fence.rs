//! Chain-epoch fencing: Sluice's vendor extension that lets a control plane
//! refuse writes carrying a stale chain epoch (elastic volumes, docs/volumes.md).
//!
//! A namespace is cut into **granules** of [`GRANULE_BYTES`] (one volume
//! extent). Each granule has a fence, an epoch that starts at 0 and only
//! rises. A write (Write, Write Zeroes, Dataset Management) carries its
//! writer's chain epoch in CDW2 (low) and CDW3 (high); 0 means none. A write
//! to a granule whose fence is above its epoch completes with
//! [`Status::STALE_EPOCH`] (vendor specific, SCT 7h SC 01h, Do Not Retry:
//! the writer must fetch its chain anew) and changes nothing. Hosts that know nothing of
//! fences write with CDW2/3 = 0, which passes every granule never fenced.
//!
//! The **Fence** admin command ([`FENCE_OPCODE`], vendor specific, no data):
//!
//! | field  | meaning |
//! |--------|---------|
//! | NSID   | the namespace |
//! | CDW10-11 | first granule (u64) |
//! | CDW12  | granule count, 1..=[`FENCE_GRANULES_MAX`] |
//! | CDW13-14 | epoch (u64) |
//! | CDW15 bit 0 | 1: raise the fences to the epoch (never lowers); 0: only ask |
//!
//! Completion DW0 is the number of writes admitted to those granules that
//! have not completed yet (saturating); DW1 is log2 of the granule size. A
//! caller raises the fences, then asks again until DW0 is 0: from then on
//! every write the granules will ever complete carries an epoch at least the
//! fence. Targets other than Sluice answer Invalid Command Opcode.
//!
//! A Read may carry an epoch the same way: when a granule's fence is above
//! it the read completes with Stale Chain Epoch too (it is never counted in
//! flight). Volume clients do, so that a replica an extent was remapped away
//! from, fenced before its slot is freed, never serves a reader on an old map.

use crate::command::Sqe;
use crate::status::Status;

/// Vendor-specific admin opcode of the Fence command (C0h: no data).
pub const FENCE_OPCODE: u8 = 0xc0;
/// log2 of [`GRANULE_BYTES`].
pub const GRANULE_SHIFT: u32 = 21;
/// A fence granule: 2 MiB, one volume extent.
pub const GRANULE_BYTES: u64 = 1 << GRANULE_SHIFT;
/// Granules one Fence command may name.
pub const FENCE_GRANULES_MAX: u32 = 65_536;

/// The Fence command's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub nsid: u32,
    pub first_granule: u64,
    pub granules: u32,
    pub epoch: u64,
    /// Raise the fences (else only report writes in flight).
    pub raise: bool,
}

impl Fence {
    /// The command as an SQE (CID 0: the queue assigns it).
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(FENCE_OPCODE, 0, self.nsid);
        let (lo, hi) = split(self.first_granule);
        s.set_cdw(10, lo);
        s.set_cdw(11, hi);
        s.set_cdw(12, self.granules);
        let (lo, hi) = split(self.epoch);
        s.set_cdw(13, lo);
        s.set_cdw(14, hi);
        s.set_cdw(15, u32::from(self.raise));
        s
    }

    /// Parses a Fence SQE; the count must be 1..=[`FENCE_GRANULES_MAX`].
    pub fn parse(s: &Sqe) -> Result<Fence, Status> {
        let granules = s.cdw(12);
        if granules == 0 || granules > FENCE_GRANULES_MAX {
            return Err(Status::INVALID_FIELD);
        }
        Ok(Fence {
            nsid: s.nsid(),
            first_granule: join(s.cdw(10), s.cdw(11)),
            granules,
            epoch: join(s.cdw(13), s.cdw(14)),
            raise: s.cdw(15) & 1 != 0,
        })
    }
}

/// The chain epoch a read or write carries (CDW2-3), 0 when none.
pub fn io_epoch(s: &Sqe) -> u64 {
    join(s.cdw(2), s.cdw(3))
}

/// Puts a chain epoch on a read or write.
pub fn set_io_epoch(s: &mut Sqe, epoch: u64) {
    let (lo, hi) = split(epoch);
    s.set_cdw(2, lo);
    s.set_cdw(3, hi);
}

fn split(v: u64) -> (u32, u32) {
    // Halves of a u64.
    #[allow(clippy::cast_possible_truncation)]
    let lo = v as u32;
    #[allow(clippy::cast_possible_truncation)]
    let hi = (v >> 32) as u32;
    (lo, hi)
}

fn join(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn fence_round_trips(nsid in 1u32.., first in any::<u64>(), n in 1..=FENCE_GRANULES_MAX, epoch in any::<u64>(), raise in any::<bool>()) {
            let f = Fence { nsid, first_granule: first, granules: n, epoch, raise };
            prop_assert_eq!(Fence::parse(&f.to_sqe()), Ok(f));
        }

        #[test]
        fn io_epoch_round_trips(epoch in any::<u64>()) {
            let mut s = Sqe::rw(crate::command::io::WRITE, 7, 1, 100, 8, false);
            set_io_epoch(&mut s, epoch);
            prop_assert_eq!(io_epoch(&s), epoch);
            prop_assert_eq!(s.cdw(10), 100, "SLBA untouched");
        }
    }

    #[test]
    fn a_fence_naming_no_granule_or_too_many_is_refused() {
        let mut f = Fence {
            nsid: 1,
            first_granule: 0,
            granules: 1,
            epoch: 9,
            raise: true,
        }
        .to_sqe();
        f.set_cdw(12, 0);
        assert_eq!(Fence::parse(&f), Err(Status::INVALID_FIELD));
        f.set_cdw(12, FENCE_GRANULES_MAX + 1);
        assert_eq!(Fence::parse(&f), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn stale_epoch_is_vendor_specific_and_final() {
        let s = Status::STALE_EPOCH;
        assert!(s.is_stale_epoch() && s.dnr);
        assert_eq!(Status::from_field(s.to_field()), s);
        assert_eq!(s.name(), "Stale Chain Epoch (Sluice)");
    }
}
