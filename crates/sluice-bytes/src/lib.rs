//! Shared byte ranges for Sluice's zero-copy paths.
//!
//! A [`SharedRange`] is a range of an immutable buffer held by reference
//! count: the backend lends a read's data this way (a RAM chunk, or the
//! read's own buffer), and the send schedulers of `sluice-proto` send a
//! PDU's data from it with a vectored write instead of copying it. Taking a
//! range, or a piece of one, costs a reference count, never an allocation
//! or a copy.
//!
//! This crate is a leaf: the protocol crate (sans-IO) and the backend
//! (storage) both depend on it, and on nothing else of each other.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// An owner of bytes that can be lent out: any shared buffer that does not
/// change while anyone holds it (a RAM chunk copies itself on write while
/// it is shared; a read buffer is never written again).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// `range` of an owner's bytes, immutable while anyone holds the owner.
#[derive(Clone)]
pub struct SharedRange {
    owner: SharedBytes,
    /// Within the owner's bytes (checked at construction).
    range: Range<usize>,
}

impl SharedRange {
    /// `range` of `owner`'s bytes; `None` when it is reversed or reaches
    /// past them. An empty range is allowed.
    pub fn new(owner: SharedBytes, range: Range<usize>) -> Option<Self> {
        let len = (*owner).as_ref().len();
        (range.start <= range.end && range.end <= len).then_some(SharedRange { owner, range })
    }

    /// All of `owner`'s bytes.
    pub fn whole(owner: SharedBytes) -> Self {
        let len = (*owner).as_ref().len();
        SharedRange {
            owner,
            range: 0..len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// Bytes `sub` of this range (positions relative to its start), from
    /// the same owner; `None` when `sub` is reversed or reaches past it.
    pub fn slice(&self, sub: Range<usize>) -> Option<SharedRange> {
        if sub.start > sub.end || sub.end > self.len() {
            return None;
        }
        let at = self.range.start;
        Some(SharedRange {
            owner: Arc::clone(&self.owner),
            range: at + sub.start..at + sub.end,
        })
    }
}

/// Prints the range, never the bytes.
impl fmt::Debug for SharedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedRange({:?})", self.range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn owner(len: usize) -> SharedBytes {
        Arc::new(sluice_testdata::pattern(len, 3))
    }

    #[test]
    fn a_range_shows_its_owners_bytes_and_nothing_past_them() {
        let o = owner(100);
        let r = SharedRange::new(Arc::clone(&o), 10..30).expect("in range");
        assert_eq!(r.as_slice(), &(*o).as_ref()[10..30]);
        assert_eq!(r.len(), 20);
        assert!(SharedRange::new(Arc::clone(&o), 90..101).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 30..10;
        assert!(SharedRange::new(Arc::clone(&o), reversed).is_none());
        let empty = SharedRange::new(Arc::clone(&o), 100..100).expect("empty at the end");
        assert!(empty.is_empty());
        assert_eq!(SharedRange::whole(o).len(), 100);
    }

    #[test]
    fn a_slice_is_placed_relative_to_the_range_not_the_owner() {
        let o = owner(100);
        let r = SharedRange::new(Arc::clone(&o), 40..80).expect("in range");
        let s = r.slice(5..15).expect("inside");
        // The pattern never repeats, so equal bytes mean the right place.
        assert_eq!(s.as_slice(), &(*o).as_ref()[45..55]);
        assert!(
            r.slice(30..41).is_none(),
            "past the range, though inside the owner"
        );
        assert_eq!(Arc::strong_count(&o), 3, "ranges share the owner");
        drop((r, s));
        assert_eq!(Arc::strong_count(&o), 1);
    }

    #[test]
    fn debug_prints_the_range_not_the_bytes() {
        let r = SharedRange::new(owner(8), 2..6).expect("in range");
        assert_eq!(format!("{r:?}"), "SharedRange(2..6)");
    }

    proptest! {
        /// Slicing twice is slicing once at the summed offsets.
        #[test]
        fn slices_compose(len in 0usize..512, a in 0usize..512, b in 0usize..512,
                          c in 0usize..512, d in 0usize..512) {
            let o = owner(len);
            let (a, b) = (a.min(b), a.max(b));
            let Some(r) = SharedRange::new(Arc::clone(&o), a..b) else {
                prop_assert!(b > len);
                return Ok(());
            };
            let (c, d) = (c.min(d), c.max(d));
            match r.slice(c..d) {
                Some(s) => {
                    prop_assert!(d <= b - a);
                    prop_assert_eq!(s.as_slice(), &(*o).as_ref()[a + c..a + d]);
                }
                None => prop_assert!(d > b - a),
            }
        }
    }
}
