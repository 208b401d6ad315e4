//! `AlignedBuf`: a zero-initialised heap buffer aligned to 4096 bytes, safe
//! to hand to `O_DIRECT` reads and writes (including through io_uring).

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`] allocation, in bytes.
pub const BUF_ALIGN_BYTES: usize = 4096;

/// Heap buffer aligned to [`BUF_ALIGN_BYTES`] (O_DIRECT-safe); zero-initialised
/// on allocation.
///
/// The capacity is rounded up to a multiple of the alignment (at least one
/// page), so `resize` can grow the visible length up to `capacity_bytes()`
/// without reallocating. The heap address never changes while the buffer is
/// alive, which is what lets the io_uring engine keep raw pointers into it.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
    capacity_bytes: usize,
}

// SAFETY: `AlignedBuf` exclusively owns its allocation (like `Box<[u8]>`);
// shared references only permit reads.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` exposes only `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates a zeroed buffer of `len_bytes` bytes.
    ///
    /// Aborts via `handle_alloc_error` if memory is exhausted, like `Vec`.
    pub fn new(len_bytes: usize) -> Self {
        let capacity_bytes = len_bytes
            .max(1)
            .checked_next_multiple_of(BUF_ALIGN_BYTES)
            .unwrap_or(usize::MAX - BUF_ALIGN_BYTES + 1);
        let layout = Self::layout(capacity_bytes);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        assert!(capacity_bytes >= len_bytes);
        assert_eq!(ptr.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        Self {
            ptr,
            len_bytes,
            capacity_bytes,
        }
    }

    /// Allocates a buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::new(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        buf
    }

    fn layout(capacity_bytes: usize) -> Layout {
        match Layout::from_size_align(capacity_bytes, BUF_ALIGN_BYTES) {
            Ok(layout) => layout,
            // Only reachable for capacities near isize::MAX, which no
            // allocator can satisfy anyway.
            Err(_) => alloc::handle_alloc_error(Layout::new::<[u8; BUF_ALIGN_BYTES]>()),
        }
    }

    /// Visible length in bytes.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// True when the visible length is zero.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// Allocated capacity in bytes (a multiple of [`BUF_ALIGN_BYTES`]).
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// The visible bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity_bytes >= len_bytes initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The visible bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// Raw pointer to the first byte (for the io_uring engine).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Shortens the visible length; no-op if `len_bytes >= len()`.
    pub fn truncate(&mut self, len_bytes: usize) {
        self.len_bytes = self.len_bytes.min(len_bytes);
    }

    /// Sets the visible length within capacity, zero-filling any newly
    /// visible bytes. Returns `false` (and changes nothing) beyond capacity.
    pub fn resize(&mut self, len_bytes: usize) -> bool {
        if len_bytes > self.capacity_bytes {
            return false;
        }
        if len_bytes > self.len_bytes {
            // SAFETY: range [len_bytes_old, len_bytes) lies within the allocation.
            unsafe {
                std::ptr::write_bytes(
                    self.ptr.as_ptr().add(self.len_bytes),
                    0,
                    len_bytes - self.len_bytes,
                );
            }
        }
        self.len_bytes = len_bytes;
        true
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity_bytes)) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self.as_slice())
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len_bytes", &self.len_bytes)
            .field("capacity_bytes", &self.capacity_bytes)
            .finish_non_exhaustive()
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for AlignedBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0usize, 1, 511, 4096, 4097, 1 << 20] {
            let buf = AlignedBuf::new(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.is_empty(), len == 0);
            assert_eq!(buf.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
            assert!(buf.capacity_bytes() >= len.max(1));
            assert_eq!(buf.capacity_bytes() % BUF_ALIGN_BYTES, 0);
            assert!(buf.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn clone_copies_and_is_independent() {
        let mut a = AlignedBuf::new(8192);
        a[5] = 7;
        let mut b = a.clone();
        assert_eq!(a, b);
        b[5] = 9;
        assert_eq!(a[5], 7);
        assert_eq!(b.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
    }

    #[test]
    fn resize_within_capacity_zero_fills() {
        let mut buf = AlignedBuf::new(100);
        buf.as_mut_slice().fill(0xAA);
        buf.truncate(10);
        assert_eq!(buf.len(), 10);
        assert!(buf.resize(200));
        assert!(buf[..10].iter().all(|&b| b == 0xAA));
        assert!(buf[10..].iter().all(|&b| b == 0));
        assert!(!buf.resize(buf.capacity_bytes() + 1));
        assert_eq!(buf.len(), 200);
    }

    #[test]
    fn send_sync() {
        fn check<T: Send + Sync>() {}
        check::<AlignedBuf>();
    }
}
