//! `SpareBuffers`: the I/O buffers a run-to-completion path (an NBD
//! connection's, the FUSE ring's) keeps from completed I/Os for the next
//! ones, so an I/O neither allocates nor faults in fresh pages. At most
//! `BYTES_MAX` bytes are kept.
//!
//! A reused buffer keeps the bytes of its last use, which nobody sees: a
//! read fills it whole before it completes (`sluice_host`'s core refuses
//! a shorter transfer), and write data is copied over it whole.

/// Spare I/O buffers, at most `BYTES_MAX` bytes of capacity in all.
#[derive(Debug, Default)]
pub(crate) struct SpareBuffers<const BYTES_MAX: usize> {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl<const BYTES_MAX: usize> SpareBuffers<BYTES_MAX> {
    /// A buffer of `len` bytes to be overwritten whole (by a read, or by a
    /// write's data): a spare one, or a new one.
    pub(crate) fn take(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.bufs.pop().unwrap_or_default();
        self.bytes -= b.capacity();
        b.resize(len, 0);
        b
    }

    /// A buffer holding a copy of `data` (a write's): a spare one, or a
    /// new one; no zeroing before the copy.
    pub(crate) fn copy_of(&mut self, data: &[u8]) -> Vec<u8> {
        let mut b = self.bufs.pop().unwrap_or_default();
        self.bytes -= b.capacity();
        b.clear();
        b.extend_from_slice(data);
        b
    }

    /// Keeps `b` for a later I/O, unless that would pass the bound.
    pub(crate) fn recycle(&mut self, b: Vec<u8>) {
        if b.capacity() > 0 && self.bytes + b.capacity() <= BYTES_MAX {
            self.bytes += b.capacity();
            self.bufs.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recycled_buffer_is_taken_again_at_the_new_length() {
        let mut s = SpareBuffers::<{ 1 << 20 }>::default();
        let a = s.take(128 << 10);
        assert_eq!(a.len(), 128 << 10);
        let ptr = a.as_ptr();
        s.recycle(a);
        let b = s.take(4096);
        assert_eq!((b.len(), b.as_ptr()), (4096, ptr), "the same allocation");
        s.recycle(b);
        let c = s.take(256 << 10);
        assert_eq!(c.len(), 256 << 10);
        assert!(
            c[128 << 10..].iter().all(|&x| x == 0),
            "grown bytes are zero"
        );
        assert_eq!(s.bytes, 0);
    }

    #[test]
    fn a_copy_reuses_a_spare_buffer_and_holds_exactly_the_data() {
        let mut s = SpareBuffers::<{ 1 << 20 }>::default();
        let mut a = s.take(4096);
        a.fill(0xEE); // stale bytes of an earlier use
        let ptr = a.as_ptr();
        s.recycle(a);
        let b = s.copy_of(&[7u8; 100]);
        assert_eq!((b.as_slice(), b.as_ptr()), (&[7u8; 100][..], ptr));
        s.recycle(b);
        let c = s.copy_of(&[5u8; 8192]);
        assert_eq!(c, vec![5u8; 8192], "a grown copy holds only the data");
        assert_eq!(s.bytes, 0);
    }

    #[test]
    fn no_more_than_the_bound_is_kept() {
        let mut s = SpareBuffers::<{ 256 << 10 }>::default();
        for _ in 0..4 {
            s.recycle(vec![0; 128 << 10]);
        }
        assert_eq!(s.bufs.len(), 2);
        assert!(s.bytes <= 256 << 10);
        s.recycle(Vec::new());
        assert_eq!(s.bufs.len(), 2, "an empty buffer is not worth keeping");
        let _ = s.take(1);
        let _ = s.take(1);
        let _ = s.take(1);
        assert_eq!((s.bufs.len(), s.bytes), (0, 0));
    }
}
