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
    /// Buffers up to [`POOL_CLASS_BYTES_MAX`] come from a per-thread free
    /// list by power-of-two size class, so the I/O path does not pay for
    /// `mmap`/`munmap` and page faults on every large transfer.
    /// Aborts via `handle_alloc_error` if memory is exhausted, like `Vec`.
    pub fn new(len_bytes: usize) -> Self {
        Self::alloc(len_bytes, true)
    }

    /// A buffer of `len_bytes` whose contents are unspecified (zeros, or
    /// the bytes of an earlier use of the same pooled allocation): no
    /// zeroing. Only for data written whole before anything reads it,
    /// such as a transfer received in full, or a read by a backend whose
    /// `fills_reads` is true. Never hand such a buffer out partly filled.
    pub fn for_overwrite(len_bytes: usize) -> Self {
        Self::alloc(len_bytes, false)
    }

    /// Allocates a buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::alloc(data.len(), false);
        buf.as_mut_slice().copy_from_slice(data);
        buf
    }

    /// `zero = false` only when the caller overwrites all `len_bytes` at once.
    fn alloc(len_bytes: usize, zero: bool) -> Self {
        let min = len_bytes.max(1);
        if min <= POOL_CLASS_BYTES_MAX {
            let capacity_bytes = min.next_power_of_two().max(BUF_ALIGN_BYTES);
            if let Some(ptr) = pool::take(capacity_bytes) {
                if zero {
                    // SAFETY: the pooled allocation holds capacity_bytes >= len_bytes bytes.
                    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len_bytes) };
                }
                return Self {
                    ptr,
                    len_bytes,
                    capacity_bytes,
                };
            }
            return Self::fresh(len_bytes, capacity_bytes);
        }
        let capacity_bytes = min
            .checked_next_multiple_of(BUF_ALIGN_BYTES)
            .unwrap_or(usize::MAX - BUF_ALIGN_BYTES + 1);
        Self::fresh(len_bytes, capacity_bytes)
    }

    fn fresh(len_bytes: usize, capacity_bytes: usize) -> Self {
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
        if pool::give(self.ptr, self.capacity_bytes) {
            return;
        }
        // SAFETY: allocated in `fresh` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity_bytes)) }
    }
}

/// Largest buffer kept in the per-thread pool.
pub const POOL_CLASS_BYTES_MAX: usize = 8 << 20;
/// Bytes a thread's pool may hold.
pub const POOL_BYTES_MAX: usize = 64 << 20;

/// Per-thread free lists of aligned allocations, by power-of-two capacity.
mod pool {
    use super::{AlignedBuf, BUF_ALIGN_BYTES, POOL_BYTES_MAX, POOL_CLASS_BYTES_MAX};
    use std::cell::RefCell;
    use std::ptr::NonNull;

    const CLASSES: usize = (POOL_CLASS_BYTES_MAX / BUF_ALIGN_BYTES).trailing_zeros() as usize + 1;

    struct Pool {
        free: [Vec<NonNull<u8>>; CLASSES],
        bytes: usize,
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            for (c, list) in self.free.iter_mut().enumerate() {
                for p in list.drain(..) {
                    // SAFETY: every pooled pointer came from `AlignedBuf::fresh`
                    // with this class's capacity and layout.
                    unsafe {
                        std::alloc::dealloc(p.as_ptr(), AlignedBuf::layout(BUF_ALIGN_BYTES << c))
                    }
                }
            }
        }
    }

    thread_local! {
        static POOL: RefCell<Pool> = RefCell::new(Pool { free: Default::default(), bytes: 0 });
    }

    fn class(capacity_bytes: usize) -> Option<usize> {
        if !capacity_bytes.is_power_of_two()
            || !(BUF_ALIGN_BYTES..=POOL_CLASS_BYTES_MAX).contains(&capacity_bytes)
        {
            return None;
        }
        Some((capacity_bytes / BUF_ALIGN_BYTES).trailing_zeros() as usize)
    }

    pub(super) fn take(capacity_bytes: usize) -> Option<NonNull<u8>> {
        let c = class(capacity_bytes)?;
        POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            let ptr = p.free[c].pop()?;
            p.bytes -= capacity_bytes;
            Some(ptr)
        })
        .ok()
        .flatten()
    }

    /// Keeps the allocation for reuse; false when the caller must free it.
    pub(super) fn give(ptr: NonNull<u8>, capacity_bytes: usize) -> bool {
        let Some(c) = class(capacity_bytes) else {
            return false;
        };
        POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.bytes + capacity_bytes > POOL_BYTES_MAX {
                return false;
            }
            p.bytes += capacity_bytes;
            p.free[c].push(ptr);
            true
        })
        .unwrap_or(false)
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self.as_slice())
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
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
    fn pooled_buffers_are_reused_and_zeroed() {
        let mut a = AlignedBuf::new(100_000);
        let p = a.as_slice().as_ptr();
        a.as_mut_slice().fill(0xaa);
        drop(a);
        let b = AlignedBuf::new(120_000); // same 128 KiB class
        assert_eq!(b.as_slice().as_ptr(), p, "the allocation was reused");
        assert!(b.iter().all(|&x| x == 0), "a reused buffer is zeroed");
        assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        let c = AlignedBuf::from_slice(&[7u8; 5000]);
        assert_eq!(c.len(), 5000);
        assert!(c.iter().all(|&x| x == 7));
        // Beyond the pooled classes: plain allocations.
        let big = AlignedBuf::new(POOL_CLASS_BYTES_MAX + 1);
        assert!(big.iter().all(|&x| x == 0));
    }

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
