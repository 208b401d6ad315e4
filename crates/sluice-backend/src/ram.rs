//! Sparse in-memory backend. Storage is split into 2 MiB chunks, each behind
//! its own `RwLock`, allocated on first write and freed when a Deallocate or
//! WriteZeroes covers it entirely. Chunks are grouped so that the per-chunk
//! lock table is itself allocated lazily (a 16 TiB device costs only a small
//! directory until written). Everything completes by the next poll: a read
//! is copied there rather than at submit, after the CPU was asked to
//! prefetch its lines at submit, so the cache misses of a batch of random
//! reads overlap (4 KiB random reads at QD 32 through the target: +1-14 %
//! with spdk_nvme_perf, +3-7 % with `sluice bench`).
//!
//! A whole chunk is one 2 MiB-aligned anonymous mapping marked
//! `MADV_HUGEPAGE`, so where transparent huge pages are enabled (`always` or
//! `madvise`) it is backed by one huge page: random 4 KiB copies in and out
//! of a large namespace then miss the TLB far less (measured here: 0.53 µs
//! per cold 4 KiB copy with 4 KiB pages, 0.36 µs with huge pages), and the
//! kernel hands out the chunk already zeroed.
//!
//! Finding (and perhaps compacting memory for) a 2 MiB page takes the kernel
//! milliseconds, so a first write never waits for it: huge chunks come from
//! a process-wide reserve of [`RAM_HUGE_RESERVE_CHUNKS`] chunks populated
//! ahead by a background thread (`sluice-ram-reserve`). When a burst empties
//! the reserve, a first write takes one of [`RAM_HUGE_SPARE_CHUNKS`] chunks
//! the thread mapped but did not populate, faults it on small pages (a 4 KiB
//! fault, no `mmap` of its own) and the thread then marks it
//! `MADV_HUGEPAGE`. Once first writes have paused for
//! [`RAM_HUGE_COLLAPSE_QUIET`], the thread collapses such chunks onto huge
//! pages itself (`MADV_COLLAPSE`, Linux 6.1) rather than leaving them to
//! `khugepaged`, which collapses 16 MiB every 10 s by default: minutes for
//! a namespace written in a burst.
//!
//! A chunk's memory is an `Arc`. A queue asked to share reads
//! ([`BackendQueue::share_reads`]) completes a long enough read that lies
//! in one written chunk with a [`SharedRange`] of it (the chunk's `Arc` and a
//! range: no allocation) instead of a copy, and a write into a chunk a
//! view still holds copies the chunk first ([`writable`]), so a view's
//! bytes never change. Writes run at the poll, before that poll's reads
//! take their views, so the views of one turn are normally sent and let
//! go before the next turn's writes come.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use sluice_runtime::cast::usize_from;
use sluice_runtime::sync;
use std::time::Instant;

use crate::io::{fail, valid_block_size, validate_request};
use crate::{
    Backend, BackendError, BackendQueue, Geometry, IoCompletion, IoOp, IoRequest, SharedRange,
};

/// Bytes per lazily allocated chunk.
pub const RAM_CHUNK_BYTES: usize = 128 << 10;
/// Bytes per chunk of a store on huge pages: one x86-64 huge page.
pub const RAM_HUGE_CHUNK_BYTES: usize = 2 << 20;
/// Chunks per lazily allocated group of chunk locks.
const GROUP_CHUNKS: usize = 4096;
/// Largest RAM backend accepted.
pub const RAM_SIZE_BYTES_MAX: u64 = 16 << 40;

/// A chunk's memory is shared (an `Arc`) with the reads that send straight
/// from it ([`SharedRange`]); a write into a chunk they still hold copies it
/// first ([`writable`]), so what they send never changes.
type Chunk = RwLock<Option<Arc<ChunkMem>>>;

/// The memory of one chunk: a zeroed, [`RAM_HUGE_CHUNK_BYTES`]-aligned anonymous
/// mapping (huge-page eligible), or heap memory for a short last chunk or
/// when the mapping fails.
enum ChunkMem {
    Mapped(std::ptr::NonNull<u8>),
    Heap(Box<[u8]>),
}

// SAFETY: `Mapped` exclusively owns its mapping, like a `Box<[u8]>`; access
// goes through `&`/`&mut` of the `ChunkMem` (behind the chunk's lock).
unsafe impl Send for ChunkMem {}
// SAFETY: see above; `&ChunkMem` only permits reads.
unsafe impl Sync for ChunkMem {}

impl ChunkMem {
    /// A zeroed chunk of `len` bytes (huge-page backed if `huge_pages`):
    /// see [`HugeReserve::take`].
    fn new(len: usize, huge_pages: bool) -> Self {
        if huge_pages && len == RAM_HUGE_CHUNK_BYTES {
            let reserve = HugeReserve::get();
            if let Some(c) = reserve.and_then(HugeReserve::take) {
                return c;
            }
            HUGE_CHUNKS_INLINE.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = map_aligned_chunk(HugeAdvice::AfterFirstFault) {
                if let Some(r) = reserve {
                    r.collapse_later(p.as_ptr() as usize);
                }
                return ChunkMem::Mapped(p);
            }
        }
        ChunkMem::Heap(vec![0u8; len].into_boxed_slice())
    }
}

/// Populated huge chunks the reserve keeps ready (16 MiB): a burst of
/// first writes into this many fresh chunks costs the workers no fault.
pub const RAM_HUGE_RESERVE_CHUNKS: usize = 8;
/// Chunks mapped but not populated the reserve keeps for bursts that empty
/// it (address space only, no memory): a first write into one faults a
/// small page, and needs no `mmap` (which would wait for the reserve
/// thread's population to release the address-space lock).
pub const RAM_HUGE_SPARE_CHUNKS: usize = 256;

/// How long first writes must pause before the reserve's thread collapses
/// chunks they faulted on small pages: a collapse holds the process's
/// address-space lock while it copies up to 2 MiB, which would stall the
/// small-page faults of a burst still going on.
pub const RAM_HUGE_COLLAPSE_QUIET: std::time::Duration = std::time::Duration::from_millis(100);

static HUGE_CHUNKS_FROM_RESERVE: AtomicU64 = AtomicU64::new(0);
static HUGE_CHUNKS_FROM_SPARES: AtomicU64 = AtomicU64::new(0);
static HUGE_CHUNKS_INLINE: AtomicU64 = AtomicU64::new(0);
static HUGE_CHUNKS_COLLAPSED: AtomicU64 = AtomicU64::new(0);
static HUGE_COLLAPSES_FAILED: AtomicU64 = AtomicU64::new(0);

/// What RAM namespaces on huge pages did with their 2 MiB chunks so far in
/// this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RamHugeChunks {
    /// Taken populated (on a huge page) from the reserve.
    pub from_reserve: u64,
    /// Taken from the reserve's mapped spares, faulted on small pages.
    pub from_spares: u64,
    /// Mapped by the writer itself (the reserve was empty or not running),
    /// on small pages.
    pub inline: u64,
    /// Small-page chunks the reserve's thread collapsed onto a huge page.
    pub collapsed: u64,
    /// Collapses the kernel refused (no memory for a huge page, THP off,
    /// or no `MADV_COLLAPSE`); khugepaged may still collapse those.
    pub collapse_failed: u64,
    /// Small-page chunks queued for the thread to advise and collapse, or
    /// in its hands (at most the live chunks on small pages: a freed
    /// chunk leaves the queue).
    pub collapse_pending: u64,
}

/// The counts behind [`RamHugeChunks`].
pub fn ram_huge_chunks() -> RamHugeChunks {
    RamHugeChunks {
        from_reserve: HUGE_CHUNKS_FROM_RESERVE.load(Ordering::Relaxed),
        from_spares: HUGE_CHUNKS_FROM_SPARES.load(Ordering::Relaxed),
        inline: HUGE_CHUNKS_INLINE.load(Ordering::Relaxed),
        collapsed: HUGE_CHUNKS_COLLAPSED.load(Ordering::Relaxed),
        collapse_failed: HUGE_COLLAPSES_FAILED.load(Ordering::Relaxed),
        collapse_pending: HugeReserve::running().map_or(0, |r| {
            let st = sync::lock(&r.state);
            // The chunk the thread is advising or collapsing is still
            // pending: it left its queue when the job began.
            (st.to_advise.len() + st.to_collapse.len() + usize::from(st.busy.is_some())) as u64
        }),
    }
}

#[derive(Default)]
struct ReserveState {
    /// Populated chunks on huge pages.
    ready: Vec<ChunkMem>,
    /// Mapped chunks, never faulted, not advised.
    spares: Vec<ChunkMem>,
    /// Addresses of spares handed out, to be advised onto huge pages
    /// (`MADV_HUGEPAGE`) by the thread.
    to_advise: Vec<usize>,
    /// Addresses of chunks on small pages (advised spares, inline
    /// mappings), to be collapsed by the thread once first writes pause.
    to_collapse: VecDeque<usize>,
    /// The address the thread is advising or collapsing outside the lock:
    /// a chunk being freed waits for it ([`HugeReserve::forget`]), so the
    /// thread never touches an address after its chunk is unmapped (and
    /// perhaps mapped again for something else).
    busy: Option<usize>,
    /// Chunks taken so far.
    takes: u64,
    /// `takes` at the end of the last [`RAM_HUGE_COLLAPSE_QUIET`] in which
    /// no chunk was taken: the thread collapses while `takes` still equals
    /// it, so a new burst of first writes stops the collapses until the
    /// next quiet period.
    quiet_at_takes: Option<u64>,
    /// `MADV_COLLAPSE` is not known to this kernel: leave it to khugepaged.
    no_collapse: bool,
}

/// What the reserve's thread does next, outside the lock.
enum ReserveJob {
    Advise(usize),
    MapSpare,
    Populate,
    Collapse(usize),
}

/// The process-wide reserve of huge chunks and the thread that refills it.
/// Chunks are interchangeable (zeroed, aligned, 2 MiB), so one reserve
/// serves every store; it starts with the first store on huge pages.
struct HugeReserve {
    state: std::sync::Mutex<ReserveState>,
    /// Signalled when a chunk is taken.
    taken: std::sync::Condvar,
    /// Signalled when the thread is done with its `busy` address.
    settled: std::sync::Condvar,
}

static RESERVE: OnceLock<Option<&'static HugeReserve>> = OnceLock::new();

impl HugeReserve {
    /// The reserve, its thread started on first use (`None` if the thread
    /// cannot be spawned: chunks are then mapped inline).
    fn get() -> Option<&'static HugeReserve> {
        *RESERVE.get_or_init(|| {
            let r: &'static HugeReserve = Box::leak(Box::new(HugeReserve {
                state: std::sync::Mutex::new(ReserveState::default()),
                taken: std::sync::Condvar::new(),
                settled: std::sync::Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("sluice-ram-reserve".into())
                .spawn(move || r.refill_forever())
                .ok()
                .map(|_| r)
        })
    }

    /// The reserve if its thread runs, without starting it.
    fn running() -> Option<&'static HugeReserve> {
        RESERVE.get().copied().flatten()
    }

    /// Queues a chunk mapped inline (on small pages) for collapse.
    fn collapse_later(&self, at: usize) {
        sync::lock(&self.state).to_collapse.push_back(at);
        self.taken.notify_one();
    }

    /// Called before a chunk at `at` is unmapped: the thread must not
    /// advise or collapse that address any more. Waits while the thread is
    /// on it, then drops it from the queues (an advice it was finishing
    /// has just queued it for collapse).
    fn forget(&self, at: usize) {
        let mut st = sync::lock(&self.state);
        while st.busy == Some(at) {
            st = self
                .settled
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        st.to_advise.retain(|&a| a != at);
        st.to_collapse.retain(|&a| a != at);
    }

    /// A populated chunk, else a mapped spare; `None` when both ran out.
    fn take(&self) -> Option<ChunkMem> {
        let mut st = sync::lock(&self.state);
        st.takes += 1;
        let c = if let Some(c) = st.ready.pop() {
            HUGE_CHUNKS_FROM_RESERVE.fetch_add(1, Ordering::Relaxed);
            c
        } else {
            let c = st.spares.pop()?;
            drop(st);
            if let ChunkMem::Mapped(p) = &c {
                // Fault the first small page before the thread may advise
                // the chunk: a fault after the advice would take a huge
                // page, and wait for it, on this (the worker's) thread.
                // SAFETY: `p` starts a mapping this value owns alone.
                unsafe { p.as_ptr().write_volatile(0) };
                sync::lock(&self.state).to_advise.push(p.as_ptr() as usize);
            }
            HUGE_CHUNKS_FROM_SPARES.fetch_add(1, Ordering::Relaxed);
            c
        };
        self.taken.notify_one();
        Some(c)
    }

    /// The next job: advice first (cheap), then spares (quick, and what a
    /// burst falls back on), then populated chunks (slow), then collapses
    /// once first writes have paused; waits while there is none.
    fn next_job(&self) -> ReserveJob {
        let mut st = sync::lock(&self.state);
        loop {
            if let Some(at) = st.to_advise.pop() {
                st.busy = Some(at);
                return ReserveJob::Advise(at);
            }
            if st.spares.len() < RAM_HUGE_SPARE_CHUNKS {
                return ReserveJob::MapSpare;
            }
            if st.ready.len() < RAM_HUGE_RESERVE_CHUNKS {
                return ReserveJob::Populate;
            }
            if st.no_collapse || st.to_collapse.is_empty() {
                st = self
                    .taken
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            if st.quiet_at_takes == Some(st.takes) {
                if let Some(at) = st.to_collapse.pop_front() {
                    st.busy = Some(at);
                    return ReserveJob::Collapse(at);
                }
            }
            let takes = st.takes;
            let (next, waited) = self
                .taken
                .wait_timeout(st, RAM_HUGE_COLLAPSE_QUIET)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st = next;
            if waited.timed_out() && st.takes == takes {
                st.quiet_at_takes = Some(takes);
            }
        }
    }

    /// Ends the job on the `busy` address; `collapse` queues it next.
    fn settle(&self, collapse: Option<usize>) {
        let mut st = sync::lock(&self.state);
        st.busy = None;
        if let Some(at) = collapse {
            st.to_collapse.push_back(at);
        }
        self.settled.notify_all();
    }

    fn refill_forever(&self) {
        loop {
            match self.next_job() {
                ReserveJob::Advise(at) => {
                    // SAFETY: advice on a chunk's range, which stays mapped
                    // while it is `busy` (see `forget`).
                    unsafe {
                        libc::madvise(
                            at as *mut libc::c_void,
                            RAM_HUGE_CHUNK_BYTES,
                            libc::MADV_HUGEPAGE,
                        )
                    };
                    self.settle(Some(at));
                }
                ReserveJob::Collapse(at) => {
                    // SAFETY: as above; a collapse moves the chunk's pages
                    // onto one huge page and keeps every byte.
                    let rc = unsafe {
                        libc::madvise(
                            at as *mut libc::c_void,
                            RAM_HUGE_CHUNK_BYTES,
                            libc::MADV_COLLAPSE,
                        )
                    };
                    let failed = (rc != 0).then(std::io::Error::last_os_error);
                    match failed {
                        None => {
                            HUGE_CHUNKS_COLLAPSED.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(e) => {
                            HUGE_COLLAPSES_FAILED.fetch_add(1, Ordering::Relaxed);
                            if e.raw_os_error() == Some(libc::EINVAL) {
                                // Before Linux 6.1, or THP off: khugepaged
                                // collapses the advised chunks in its own time.
                                tracing::info!(error = %e, "MADV_COLLAPSE refused; RAM chunks on small pages are left to khugepaged");
                                let mut st = sync::lock(&self.state);
                                st.no_collapse = true;
                                st.to_collapse.clear();
                            }
                        }
                    }
                    self.settle(None);
                }
                ReserveJob::MapSpare => match map_aligned_chunk(HugeAdvice::Never) {
                    Some(p) => sync::lock(&self.state).spares.push(ChunkMem::Mapped(p)),
                    None => std::thread::sleep(std::time::Duration::from_millis(100)),
                },
                ReserveJob::Populate => {
                    // Outside the lock: this is the slow part.
                    let Some(p) = map_aligned_chunk(HugeAdvice::Now) else {
                        // Out of address space or memory: try again later.
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        continue;
                    };
                    populate(p);
                    sync::lock(&self.state).ready.push(ChunkMem::Mapped(p));
                }
            }
        }
    }
}

/// Faults in a fresh chunk's memory (a huge page where THP allows):
/// `MADV_POPULATE_WRITE` (Linux 5.14), else a write to each 4 KiB page.
fn populate(p: std::ptr::NonNull<u8>) {
    // SAFETY: `p` starts a RAM_HUGE_CHUNK_BYTES private mapping owned by
    // the caller and not yet shared; populating it changes no contents.
    let rc = unsafe {
        libc::madvise(
            p.as_ptr().cast(),
            RAM_HUGE_CHUNK_BYTES,
            libc::MADV_POPULATE_WRITE,
        )
    };
    if rc != 0 {
        for at in (0..RAM_HUGE_CHUNK_BYTES).step_by(4096) {
            // SAFETY: inside the mapping (see above); writing zero to fresh
            // anonymous memory keeps it zeroed.
            unsafe { p.as_ptr().add(at).write_volatile(0) };
        }
    }
}

impl std::ops::Deref for ChunkMem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: the mapping is RAM_HUGE_CHUNK_BYTES long, readable and
            // writable, and lives as long as `self`.
            ChunkMem::Mapped(p) => unsafe {
                std::slice::from_raw_parts(p.as_ptr(), RAM_HUGE_CHUNK_BYTES)
            },
            ChunkMem::Heap(b) => b,
        }
    }
}

impl std::ops::DerefMut for ChunkMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
            ChunkMem::Mapped(p) => unsafe {
                std::slice::from_raw_parts_mut(p.as_ptr(), RAM_HUGE_CHUNK_BYTES)
            },
            ChunkMem::Heap(b) => b,
        }
    }
}

impl Drop for ChunkMem {
    fn drop(&mut self) {
        if let ChunkMem::Mapped(p) = self {
            if let Some(r) = HugeReserve::running() {
                r.forget(p.as_ptr() as usize);
            }
            // SAFETY: `p` is the start of a RAM_HUGE_CHUNK_BYTES mapping made by
            // `map_aligned_chunk` and owned by this value alone.
            let rc = unsafe { libc::munmap(p.as_ptr().cast(), RAM_HUGE_CHUNK_BYTES) };
            debug_assert_eq!(rc, 0, "munmap of a RAM chunk failed");
        }
    }
}

/// Copies `src` into `dst` (same length). On x86-64, whole 64-byte lines
/// into a 16-byte-aligned destination (every block-aligned write) use
/// non-temporal stores: data written to a RAM namespace is rarely read by
/// this CPU soon after, and ordinary stores first read each destination
/// line from memory and then evict the worker's hot lines for it. Measured
/// here, random 4 KiB writes into a 512 MiB store: 0.45 µs per copy with
/// `memcpy`, 0.36 µs streaming; in the target's profile of 4 KiB random
/// writes the copy and the fence it caused were 40 % of the worker's
/// samples.
fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        if dst.len() >= 64
            && dst.len().is_multiple_of(64)
            && (dst.as_ptr() as usize).is_multiple_of(16)
        {
            // SAFETY: SSE2 is part of x86-64. Every load reads 16 bytes
            // inside `src` and every store writes 16 bytes inside `dst`
            // (offsets `i..i + 64` with `i + 64 <= len`); stores are to
            // 16-byte-aligned addresses as `_mm_stream_si128` requires,
            // since `dst` is aligned and `i` is a multiple of 64. The
            // fence orders the streaming stores before the chunk's lock is
            // released.
            unsafe {
                use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
                let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
                let mut i = 0;
                while i < dst.len() {
                    for k in (0..64).step_by(16) {
                        let v = _mm_loadu_si128(s.add(i + k).cast::<__m128i>());
                        _mm_stream_si128(d.add(i + k).cast::<__m128i>(), v);
                    }
                    i += 64;
                }
                _mm_sfence();
            }
            return;
        }
    }
    dst.copy_from_slice(src);
}

/// Maps `RAM_HUGE_CHUNK_BYTES` of zeroed anonymous memory aligned to its
/// own size and asks for a huge page; `None` if the kernel refuses the
/// mapping.
fn map_aligned_chunk(advice: HugeAdvice) -> Option<std::ptr::NonNull<u8>> {
    let len = RAM_HUGE_CHUNK_BYTES;
    // Over-map by one chunk, then trim to an aligned window.
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let base = raw as usize;
    let start = base.next_multiple_of(len);
    let head = start - base;
    let tail = len - head;
    // SAFETY: both ranges lie inside the mapping just made and outside the
    // window kept; unmapping them cannot affect other memory.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
        if advice == HugeAdvice::AfterFirstFault {
            // A first fault without the advice maps one small page and
            // the page table under it, so later faults in the chunk are
            // small too; with the advice, khugepaged may collapse it.
            (start as *mut u8).write_volatile(0);
        }
        if advice != HugeAdvice::Never {
            // Advice only: without THP the chunk simply uses small pages.
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    std::ptr::NonNull::new(start as *mut u8)
}

/// When a mapped chunk is advised onto huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HugeAdvice {
    /// Before any fault: the first fault takes a huge page (and may wait
    /// for compaction). For the reserve's thread.
    Now,
    /// After a first small fault: no wait now, a later collapse by
    /// khugepaged. For a first write that found the reserve empty.
    AfterFirstFault,
    /// Not by this call: a spare, advised by the reserve's thread once a
    /// first write has faulted it on small pages.
    Never,
}

impl std::fmt::Debug for ChunkMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            ChunkMem::Mapped(_) => "mapped",
            ChunkMem::Heap(_) => "heap",
        };
        write!(f, "ChunkMem({kind}, {} B)", self.len())
    }
}

/// Shared sparse byte store used by [`RamBackend`] and the emulated SSD.
#[derive(Debug)]
pub(crate) struct RamStore {
    size_bytes: u64,
    /// Chunks on huge pages (see [`RamBackend::with_huge_pages`]).
    huge_pages: bool,
    /// [`RAM_HUGE_CHUNK_BYTES`] on huge pages, else [`RAM_CHUNK_BYTES`].
    chunk_bytes: usize,
    groups: Box<[OnceLock<Box<[Chunk]>>]>,
}

impl RamStore {
    pub(crate) fn new(size_bytes: u64, huge_pages: bool) -> Self {
        assert!(size_bytes <= RAM_SIZE_BYTES_MAX);
        let chunk_bytes = if huge_pages {
            RAM_HUGE_CHUNK_BYTES
        } else {
            RAM_CHUNK_BYTES
        };
        if huge_pages {
            // Warm before the first write.
            let _ = HugeReserve::get();
        }
        let chunk_count = size_bytes.div_ceil(chunk_bytes as u64);
        let group_count = chunk_count.div_ceil(GROUP_CHUNKS as u64);
        let groups = (0..group_count).map(|_| OnceLock::new()).collect();
        Self {
            size_bytes,
            huge_pages,
            chunk_bytes,
            groups,
        }
    }

    fn chunk(&self, index: u64, create: bool) -> Option<&Chunk> {
        let group = usize::try_from(index / GROUP_CHUNKS as u64).ok()?;
        let slot = usize_from(index % GROUP_CHUNKS as u64);
        let lock = self.groups.get(group)?;
        let chunks = if create {
            lock.get_or_init(|| (0..GROUP_CHUNKS).map(|_| RwLock::new(None)).collect())
        } else {
            lock.get()?
        };
        chunks.get(slot)
    }

    /// Length of chunk `index`: the chunk size, or less for the last chunk
    /// of a device whose size is not a multiple of it.
    fn chunk_len(&self, index: u64) -> usize {
        let chunk = self.chunk_bytes as u64;
        usize_from((self.size_bytes - index * chunk).min(chunk))
    }

    /// Calls `f(chunk_index, offset_in_chunk, range_in_buffer)` for each chunk
    /// overlapping `[offset, offset + len)`.
    fn for_each_span(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>),
    ) {
        assert!(offset_bytes
            .checked_add(len_bytes)
            .is_some_and(|end| end <= self.size_bytes));
        let chunk = self.chunk_bytes as u64;
        let mut done = 0u64;
        while done < len_bytes {
            let pos = offset_bytes + done;
            let in_chunk = pos % chunk;
            let n = (chunk - in_chunk).min(len_bytes - done);
            f(
                pos / chunk,
                usize_from(in_chunk),
                usize_from(done)..usize_from(done + n),
            );
            done += n;
        }
    }

    pub(crate) fn read(&self, offset_bytes: u64, out: &mut [u8]) {
        self.for_each_span(offset_bytes, out.len() as u64, |index, at, range| {
            let dst = &mut out[range];
            match self.chunk(index, false) {
                None => dst.fill(0),
                Some(lock) => {
                    let guard = sync::read(lock);
                    match guard.as_deref() {
                        None => dst.fill(0),
                        Some(data) => dst.copy_from_slice(&data[at..at + dst.len()]),
                    }
                }
            }
        });
    }

    pub(crate) fn write(&self, offset_bytes: u64, src: &[u8]) {
        self.for_each_span(offset_bytes, src.len() as u64, |index, at, range| {
            let Some(lock) = self.chunk(index, true) else {
                unreachable!("chunk index within size");
            };
            let mut guard = sync::write(lock);
            let data = writable(&mut guard, self.chunk_len(index), self.huge_pages);
            copy_streaming(&mut data[at..at + range.len()], &src[range]);
        });
    }

    /// The bytes of `[offset, offset + len)` shared, not copied, when they
    /// lie in one chunk that was written: `None` otherwise (the caller
    /// then copies with [`RamStore::read`]).
    pub(crate) fn share(&self, offset_bytes: u64, len_bytes: u64) -> Option<SharedRange> {
        let chunk = self.chunk_bytes as u64;
        let index = offset_bytes / chunk;
        let at = usize_from(offset_bytes % chunk);
        let end = at.checked_add(usize::try_from(len_bytes).ok()?)?;
        if end > self.chunk_len(index) {
            return None;
        }
        let lock = self.chunk(index, false)?;
        let mem = sync::read(lock).as_ref().map(Arc::clone)?;
        let shared = SharedRange::new(mem, at..end)?;
        RAM_READS_SHARED.fetch_add(1, Ordering::Relaxed);
        Some(shared)
    }

    /// Asks the CPU to start loading `[offset, offset + len)` into its
    /// cache (a hint: nothing is read, nothing can fault).
    pub(crate) fn prefetch(&self, offset_bytes: u64, len_bytes: u64) {
        self.for_each_span(offset_bytes, len_bytes, |index, at, range| {
            let Some(lock) = self.chunk(index, false) else {
                return;
            };
            if let Some(mem) = sync::read(lock).as_deref() {
                prefetch_lines(&mem[at..at + range.len()]);
            }
        });
    }

    /// Zeroes the range, freeing chunks it covers entirely.
    pub(crate) fn zero(&self, offset_bytes: u64, len_bytes: u64) {
        self.for_each_span(offset_bytes, len_bytes, |index, at, range| {
            let Some(lock) = self.chunk(index, false) else {
                return; // Never written: already zero.
            };
            let mut guard = sync::write(lock);
            if range.len() == self.chunk_len(index) {
                *guard = None;
            } else if guard.is_some() {
                let data = writable(&mut guard, self.chunk_len(index), self.huge_pages);
                data[at..at + range.len()].fill(0);
            }
        });
    }

    /// Bytes of chunk memory currently holding data (for tests and metrics).
    pub(crate) fn allocated_bytes(&self) -> u64 {
        self.groups
            .iter()
            .filter_map(OnceLock::get)
            .flat_map(|g| g.iter())
            .map(|c| sync::read(c).as_deref().map_or(0, |d| d.len() as u64))
            .sum()
    }

    /// Executes an already validated request synchronously.
    pub(crate) fn execute(&self, req: &mut IoRequest) {
        match req.op {
            IoOp::Read => {
                if let Some(buf) = req.buf.as_mut() {
                    self.read(req.offset_bytes, buf.as_mut_slice());
                }
            }
            IoOp::Write { .. } => {
                if let Some(buf) = req.buf.as_ref() {
                    self.write(req.offset_bytes, buf.as_slice());
                }
            }
            IoOp::Flush => {}
            IoOp::WriteZeroes { .. } | IoOp::Deallocate => {
                self.zero(req.offset_bytes, req.len_bytes)
            }
        }
    }
}

/// How much of a read its queue prefetches at submit: the random part of
/// a long read is its start; the CPU's own prefetcher streams the rest
/// once the copy is under way, and hints for more would only crowd it.
const READ_PREFETCH_BYTES_MAX: u64 = 16 << 10;

/// Prefetch hints for every 64-byte line of `bytes`.
fn prefetch_lines(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint with no architectural effect; it
        // never faults, and the address is inside `bytes` anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                line.as_ptr().cast::<i8>(),
                std::arch::x86_64::_MM_HINT_T0,
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The chunk in `slot` ready for writing: a fresh zeroed one of `len`
/// bytes if there is none, and a private copy of it while reads still
/// share it ([`RamStore::share`]): they keep the bytes they were given.
fn writable(slot: &mut Option<Arc<ChunkMem>>, len: usize, huge_pages: bool) -> &mut ChunkMem {
    let mem = slot.get_or_insert_with(|| Arc::new(ChunkMem::new(len, huge_pages)));
    if Arc::get_mut(mem).is_none() {
        let mut copy = ChunkMem::new(len, huge_pages);
        copy.copy_from_slice(mem);
        RAM_SHARED_CHUNKS_COPIED.fetch_add(1, Ordering::Relaxed);
        *mem = Arc::new(copy);
    }
    match Arc::get_mut(mem) {
        Some(m) => m,
        None => unreachable!("a chunk just copied is held only by its slot"),
    }
}

/// A chunk lent to shared reads ([`RamStore::share`]): the chunk is copied
/// before any write changes it while a read holds it.
impl AsRef<[u8]> for ChunkMem {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

static RAM_READS_SHARED: AtomicU64 = AtomicU64::new(0);
static RAM_SHARED_CHUNKS_COPIED: AtomicU64 = AtomicU64::new(0);

/// What RAM namespaces did with reads they share instead of copying
/// ([`BackendQueue::share_reads`]) so far in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RamSharedReads {
    /// Reads completed with their chunk's bytes shared, not copied.
    pub shared: u64,
    /// Chunks copied because a write came while a shared read still held
    /// them.
    pub chunks_copied: u64,
}

/// Process-wide counts of shared reads (for metrics and tests).
pub fn ram_shared_reads() -> RamSharedReads {
    RamSharedReads {
        shared: RAM_READS_SHARED.load(Ordering::Relaxed),
        chunks_copied: RAM_SHARED_CHUNKS_COPIED.load(Ordering::Relaxed),
    }
}

/// Validates `size_bytes` / `block_size_bytes` for in-memory backends.
pub(crate) fn check_ram_geometry(
    size_bytes: u64,
    block_size_bytes: u32,
) -> Result<(), BackendError> {
    if !valid_block_size(block_size_bytes) {
        return Err(BackendError::config(
            "block_size_bytes",
            format!("{block_size_bytes} is not 512 or 4096"),
        ));
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(u64::from(block_size_bytes)) {
        return Err(BackendError::config(
            "size_bytes",
            format!("{size_bytes} is not a non-zero multiple of the block size {block_size_bytes}"),
        ));
    }
    if size_bytes > RAM_SIZE_BYTES_MAX {
        return Err(BackendError::config(
            "size_bytes",
            format!("{size_bytes} exceeds the maximum of {RAM_SIZE_BYTES_MAX}"),
        ));
    }
    Ok(())
}

/// Sparse RAM-backed namespace; data is lost when the process exits.
#[derive(Debug, Clone)]
pub struct RamBackend {
    store: Arc<RamStore>,
    block_size_bytes: u32,
}

impl RamBackend {
    /// Creates a zero-filled backend. `size_bytes` must be a non-zero
    /// multiple of `block_size_bytes` (512 or 4096) and at most
    /// [`RAM_SIZE_BYTES_MAX`].
    pub fn new(size_bytes: u64, block_size_bytes: u32) -> Result<Self, BackendError> {
        Self::with_huge_pages(size_bytes, block_size_bytes, false)
    }

    /// Like [`RamBackend::new`], with each 2 MiB chunk on a huge page when
    /// `huge_pages` (transparent huge pages permitting). Random 4 KiB I/O
    /// then misses the TLB far less (through the target, with
    /// spdk_nvme_perf: 4 KiB reads +21-24 %, writes +15 %). First writes
    /// take chunks the reserve populated ahead (module docs), not a 5-16 ms
    /// fault on the worker thread. Memory is taken 2 MiB at a time. Off,
    /// the store uses 128 KiB heap chunks.
    pub fn with_huge_pages(
        size_bytes: u64,
        block_size_bytes: u32,
        huge_pages: bool,
    ) -> Result<Self, BackendError> {
        check_ram_geometry(size_bytes, block_size_bytes)?;
        Ok(Self {
            store: Arc::new(RamStore::new(size_bytes, huge_pages)),
            block_size_bytes,
        })
    }

    /// Bytes of chunk memory currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.store.allocated_bytes()
    }
}

impl Backend for RamBackend {
    fn geometry(&self) -> Geometry {
        Geometry {
            size_bytes: self.store.size_bytes,
            block_size_bytes: self.block_size_bytes,
            volatile_write_cache: false,
            supports_deallocate: true,
            deallocated_reads_zero: true,
        }
    }

    fn kind(&self) -> &'static str {
        "ram"
    }

    /// Yes: every span is copied, or zero-filled where nothing was written.
    fn fills_reads(&self) -> bool {
        true
    }

    fn open_queue(&self) -> Result<Box<dyn BackendQueue>, BackendError> {
        Ok(Box::new(RamQueue {
            geometry: self.geometry(),
            store: Arc::clone(&self.store),
            ready: VecDeque::new(),
            share_min_bytes: None,
            deferred_writes: VecDeque::new(),
            deferred_reads: VecDeque::new(),
        }))
    }
}

/// Queue on a [`RamBackend`]: executes what was submitted at the next poll,
/// writes, zeroes and deallocations first (in submission order), then reads
/// (prefetched at submit unless they may be shared), and completes it all
/// there.
#[derive(Debug)]
pub struct RamQueue {
    geometry: Geometry,
    store: Arc<RamStore>,
    ready: VecDeque<IoCompletion>,
    /// Reads at least this long are shared where they can be
    /// ([`BackendQueue::share_reads`]).
    share_min_bytes: Option<u64>,
    /// Writes, zeroes and deallocations, run at the next poll in the
    /// order they were submitted, before any read of that poll.
    deferred_writes: VecDeque<IoRequest>,
    /// Reads served at the next poll, after its writes: their lines are
    /// prefetched when they are submitted, so a batch's cache misses
    /// overlap instead of stalling one copy after another. A shared read
    /// holds its chunk from then until its bytes are sent, normally within
    /// the caller's turn, and the writes of the next poll find the chunk
    /// free again; had they run at submit, a write submitted while the
    /// last poll's reads were still being sent would have had to copy the
    /// chunk ([`writable`]).
    deferred_reads: VecDeque<IoRequest>,
}

impl RamQueue {
    /// Serves a read: with the chunk's own bytes when the queue shares
    /// reads this long and the store can share this one, else a copy.
    fn serve_read(&self, mut req: IoRequest) -> IoCompletion {
        let shared = match self.share_min_bytes {
            Some(min) if req.len_bytes >= min => self.store.share(req.offset_bytes, req.len_bytes),
            _ => None,
        };
        match shared {
            Some(data) => IoCompletion {
                tag: req.tag,
                result: Ok(()),
                buf: None,
                shared: Some(data),
            },
            None => {
                self.store.execute(&mut req);
                IoCompletion::new(req.tag, Ok(()), req.buf)
            }
        }
    }
}

impl BackendQueue for RamQueue {
    fn submit(&mut self, req: IoRequest, _now: Instant) {
        match validate_request(&self.geometry, &req) {
            Err(err) => self.ready.push_back(fail(req, err)),
            Ok(()) if req.op == IoOp::Read => {
                // A read that may be shared is copied by the kernel's send,
                // not here: no prefetch for it.
                if self.share_min_bytes.is_none_or(|m| req.len_bytes < m) {
                    let head = req.len_bytes.min(READ_PREFETCH_BYTES_MAX);
                    self.store.prefetch(req.offset_bytes, head);
                }
                self.deferred_reads.push_back(req);
            }
            Ok(()) => self.deferred_writes.push_back(req),
        }
    }

    fn share_reads(&mut self, min_bytes: usize) {
        self.share_min_bytes = Some(min_bytes as u64);
    }

    fn poll_completions(&mut self, _now: Instant, out: &mut Vec<IoCompletion>) {
        while let Some(mut req) = self.deferred_writes.pop_front() {
            self.store.execute(&mut req);
            self.ready
                .push_back(IoCompletion::new(req.tag, Ok(()), req.buf));
        }
        while let Some(req) = self.deferred_reads.pop_front() {
            let c = self.serve_read(req);
            self.ready.push_back(c);
        }
        out.extend(self.ready.drain(..));
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn notify_fd(&self) -> Option<RawFd> {
        None
    }

    fn in_flight(&self) -> usize {
        self.ready.len() + self.deferred_writes.len() + self.deferred_reads.len()
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
pub(crate) mod tests {
    use super::*;
    use crate::AlignedBuf;

    fn run(q: &mut dyn BackendQueue, req: IoRequest) -> IoCompletion {
        q.submit(req, Instant::now());
        let mut out = Vec::new();
        q.poll_completions(Instant::now(), &mut out);
        assert_eq!(out.len(), 1);
        out.pop().expect("one completion")
    }

    /// Waits (bounded) until the reserve holds `n` chunks.
    fn reserve_reaches(n: usize) -> bool {
        let r = HugeReserve::get().expect("reserve thread");
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while Instant::now() < deadline {
            if sync::lock(&r.state).ready.len() >= n {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    }

    /// Held by every test that takes huge chunks: they share the
    /// process-wide reserve and its counters, which
    /// `first_writes_on_huge_pages_read_back_past_the_reserve` checks by
    /// difference.
    pub(crate) fn huge_chunk_tests() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LOCK.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn io(op: IoOp, offset_bytes: u64, len_bytes: u64, fill: Option<u8>) -> IoRequest {
        let buf = match (op, fill) {
            (IoOp::Read, _) => Some(AlignedBuf::for_overwrite(len_bytes as usize)),
            (_, Some(b)) => Some(AlignedBuf::from_slice(&vec![b; len_bytes as usize])),
            (_, None) => None,
        };
        IoRequest {
            tag: offset_bytes,
            op,
            offset_bytes,
            len_bytes,
            buf,
        }
    }

    /// A write submitted while an earlier read still holds its chunk (the
    /// caller has not sent its bytes yet) runs at the next poll, after
    /// that read was let go: it writes the chunk in place instead of
    /// copying it. A read submitted with the write is served after it.
    #[test]
    fn writes_run_at_the_poll_so_a_read_sent_meanwhile_costs_no_copy() {
        const K: u64 = 1024;
        let ram = RamBackend::new(1 << 20, 4096).expect("ram");
        let mut q = ram.open_queue().expect("queue");
        q.share_reads(4 * 1024);
        let c = run(
            q.as_mut(),
            io(IoOp::Write { fua: false }, 0, 128 * K, Some(0xAA)),
        );
        assert!(c.result.is_ok());
        let chunk_base = |c: &IoCompletion, off: u64| {
            let data = c
                .shared
                .as_ref()
                .expect("a 4 KiB read in a written chunk is shared");
            data.as_slice().as_ptr() as usize - off as usize
        };
        let first = run(q.as_mut(), io(IoOp::Read, 4 * K, 4 * K, None));
        let base = chunk_base(&first, 4 * K);

        // The write comes in while `first` is still held; `first` is sent
        // (dropped) before the next poll.
        q.submit(
            io(IoOp::Write { fua: false }, 8 * K, 4 * K, Some(0xBB)),
            Instant::now(),
        );
        q.submit(io(IoOp::Read, 8 * K, 4 * K, None), Instant::now());
        assert!(first.read_data().expect("data").iter().all(|&b| b == 0xAA));
        drop(first);
        let mut out = Vec::new();
        q.poll_completions(Instant::now(), &mut out);
        assert_eq!(out.len(), 2);
        assert!(
            out[0].result.is_ok() && out[0].shared.is_none(),
            "the write first"
        );
        let read = &out[1];
        let data = read.read_data().expect("data");
        assert!(
            data.iter().all(|&b| b == 0xBB),
            "the read sees the write beside it"
        );
        assert_eq!(
            chunk_base(read, 8 * K),
            base,
            "the chunk was copied: the write ran while the first read held it"
        );
    }

    #[test]
    fn a_shared_read_keeps_its_bytes_through_writes_and_deallocation() {
        const K: u64 = 1024;
        let ram = RamBackend::new(1 << 20, 4096).expect("ram");
        let mut q = ram.open_queue().expect("queue");
        q.share_reads(16 * 1024);
        let write = |q: &mut dyn BackendQueue, off, len, b| {
            let c = run(q, io(IoOp::Write { fua: false }, off, len, Some(b)));
            assert!(c.result.is_ok());
        };
        write(q.as_mut(), 0, 128 * K, 0xAA);
        let before = ram_shared_reads();
        let c = run(q.as_mut(), io(IoOp::Read, 0, 128 * K, None));
        assert!(c.result.is_ok());
        assert!(c.buf.is_none(), "a shared read hands no buffer back");
        let held = c.shared.expect("a 128 KiB read within one chunk is shared");
        assert!(held.as_slice().iter().all(|&b| b == 0xAA));
        assert!(ram_shared_reads().shared > before.shared);

        // Short reads, reads across chunks and reads of unwritten chunks
        // are copied into their buffer as before.
        let c = run(q.as_mut(), io(IoOp::Read, 4 * K, 4 * K, None));
        assert!(c.shared.is_none());
        assert!(c.buf.expect("buffer").iter().all(|&b| b == 0xAA));
        let c = run(q.as_mut(), io(IoOp::Read, 64 * K, 128 * K, None));
        assert!(c.shared.is_none(), "a read across two chunks is copied");
        let buf = c.buf.expect("buffer");
        assert!(buf[..64 * K as usize].iter().all(|&b| b == 0xAA));
        assert!(buf[64 * K as usize..].iter().all(|&b| b == 0));
        let c = run(q.as_mut(), io(IoOp::Read, 512 * K, 128 * K, None));
        assert!(
            c.shared.is_none(),
            "an unwritten chunk has nothing to share"
        );
        assert!(c.buf.expect("buffer").iter().all(|&b| b == 0));

        // A write into the held chunk copies it: the held read keeps its
        // bytes, later reads see the write.
        write(q.as_mut(), 8 * K, 4 * K, 0xBB);
        assert!(ram_shared_reads().chunks_copied > before.chunks_copied);
        assert!(
            held.as_slice().iter().all(|&b| b == 0xAA),
            "a held read changed under a write"
        );
        let c = run(q.as_mut(), io(IoOp::Read, 0, 16 * K, None));
        let again = c.read_data().expect("data");
        assert!(again[..8 * K as usize].iter().all(|&b| b == 0xAA));
        assert!(again[8 * K as usize..12 * K as usize]
            .iter()
            .all(|&b| b == 0xBB));

        // Zeroing part of it, then deallocating all of it, leaves the held
        // read whole; the range then reads as zeros.
        let c = run(
            q.as_mut(),
            io(
                IoOp::WriteZeroes {
                    deallocate: false,
                    fua: false,
                },
                0,
                4 * K,
                None,
            ),
        );
        assert!(c.result.is_ok());
        let c = run(q.as_mut(), io(IoOp::Deallocate, 0, 128 * K, None));
        assert!(c.result.is_ok());
        assert!(held.as_slice().iter().all(|&b| b == 0xAA));
        let c = run(q.as_mut(), io(IoOp::Read, 0, 128 * K, None));
        assert!(c.read_data().expect("data").iter().all(|&b| b == 0));
        drop(held);
        assert_eq!(
            ram.allocated_bytes(),
            0,
            "a deallocated chunk outlived its last read"
        );
    }

    #[test]
    fn a_batch_of_reads_is_copied_at_the_poll() {
        let ram = RamBackend::new(1 << 20, 4096).expect("ram");
        let mut q = ram.open_queue().expect("queue");
        for (i, b) in [1u8, 2, 3].into_iter().enumerate() {
            let c = run(
                q.as_mut(),
                io(IoOp::Write { fua: false }, i as u64 * 8192, 4096, Some(b)),
            );
            assert!(c.result.is_ok());
        }
        // Four reads in one batch (one of a range never written), and one
        // out of range: the bad one fails at once, the others wait for the
        // poll, counted in flight.
        let now = Instant::now();
        for i in 0..4u64 {
            q.submit(io(IoOp::Read, i * 8192, 4096, None), now);
        }
        q.submit(io(IoOp::Read, 1 << 20, 4096, None), now);
        assert_eq!(q.in_flight(), 5);
        let mut out = Vec::new();
        q.poll_completions(now, &mut out);
        assert_eq!(out.len(), 5);
        assert_eq!(q.in_flight(), 0);
        for c in &out {
            if c.tag == 1 << 20 {
                assert!(matches!(c.result, Err(BackendError::OutOfRange { .. })));
                continue;
            }
            assert!(c.result.is_ok());
            let want = [1u8, 2, 3, 0][(c.tag / 8192) as usize];
            let data = c.read_data().expect("data");
            assert!(data.iter().all(|&b| b == want), "read at {} wrong", c.tag);
        }
    }

    #[test]
    fn a_queue_shares_nothing_unless_asked() {
        let _huge = huge_chunk_tests();
        let ram =
            RamBackend::with_huge_pages(RAM_HUGE_CHUNK_BYTES as u64, 4096, true).expect("ram");
        let mut q = ram.open_queue().expect("queue");
        let c = run(
            q.as_mut(),
            io(IoOp::Write { fua: false }, 0, 1 << 20, Some(7)),
        );
        assert!(c.result.is_ok());
        let c = run(q.as_mut(), io(IoOp::Read, 0, 1 << 20, None));
        assert!(c.shared.is_none());
        assert!(c.buf.expect("buffer").iter().all(|&b| b == 7));
        q.share_reads(1 << 20);
        let c = run(q.as_mut(), io(IoOp::Read, 4096, (1 << 20) - 4096, None));
        assert!(c.shared.is_none(), "shorter than asked");
        let c = run(q.as_mut(), io(IoOp::Read, 4096, 1 << 20, None));
        let held = c.shared.expect("a huge chunk's read is shared");
        assert_eq!(held.as_slice().len(), 1 << 20);
        assert!(held.as_slice()[..(1 << 20) - 4096].iter().all(|&b| b == 7));
        assert!(held.as_slice()[(1 << 20) - 4096..].iter().all(|&b| b == 0));
        // The copy a write makes of a held huge chunk is whole.
        let c = run(q.as_mut(), io(IoOp::Write { fua: false }, 0, 4096, Some(9)));
        assert!(c.result.is_ok());
        let c = run(q.as_mut(), io(IoOp::Read, 0, 2 << 20, None));
        let data = c.read_data().expect("data");
        assert!(data[..4096].iter().all(|&b| b == 9));
        assert!(data[4096..1 << 20].iter().all(|&b| b == 7));
        assert!(data[1 << 20..].iter().all(|&b| b == 0));
        assert!(held.as_slice()[..4096].iter().all(|&b| b == 7));
    }

    #[test]
    fn the_huge_reserve_hands_out_zeroed_chunks_and_refills() {
        let _huge = huge_chunk_tests();
        let r = HugeReserve::get().expect("reserve thread");
        assert!(
            reserve_reaches(RAM_HUGE_RESERVE_CHUNKS),
            "reserve never filled"
        );
        let before = ram_huge_chunks().from_reserve;
        let mut got = Vec::new();
        for _ in 0..3 {
            // Other tests may take chunks too; take until we hold three.
            if let Some(c) = r.take() {
                got.push(c);
            }
        }
        assert!(!got.is_empty());
        assert!(ram_huge_chunks().from_reserve >= before + got.len() as u64);
        for mut c in got {
            assert!(matches!(c, ChunkMem::Mapped(_)), "{c:?}");
            assert_eq!(c.len(), RAM_HUGE_CHUNK_BYTES);
            assert!(c.iter().all(|&b| b == 0), "a reserve chunk is not zeroed");
            c[12345] = 7;
            assert_eq!(c[12345], 7);
        }
        assert!(
            reserve_reaches(RAM_HUGE_RESERVE_CHUNKS),
            "reserve did not refill"
        );
        // The fallback when the reserve is empty: mapped on small pages,
        // zeroed and writable all the same.
        let p = map_aligned_chunk(HugeAdvice::AfterFirstFault).expect("map");
        let mut c = ChunkMem::Mapped(p);
        assert_eq!(p.as_ptr() as usize % RAM_HUGE_CHUNK_BYTES, 0);
        assert!(c.iter().all(|&b| b == 0));
        c[RAM_HUGE_CHUNK_BYTES - 1] = 9;
        assert_eq!(c[RAM_HUGE_CHUNK_BYTES - 1], 9);
    }

    /// `AnonHugePages` of the mapping that holds `addr`, from
    /// `/proc/self/smaps` (kB; `None` if no mapping holds it).
    fn anon_huge_kb_at(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("AnonHugePages:") {
                    return v.trim().trim_end_matches("kB").trim().parse().ok();
                }
            }
        }
        None
    }

    /// Where chunk `index` of `ram` lives, if it is a mapping.
    fn chunk_addr(ram: &RamBackend, index: u64) -> Option<usize> {
        let lock = ram.store.chunk(index, false)?;
        match sync::read(lock).as_deref() {
            Some(ChunkMem::Mapped(p)) => Some(p.as_ptr() as usize),
            _ => None,
        }
    }

    /// Writes into more fresh chunks than the reserve holds: every one is
    /// counted (from the reserve, its spares or inline) and reads back;
    /// once the writes pause, the reserve's thread collapses the chunks
    /// faulted on small pages, and every byte reads back the same.
    #[test]
    fn first_writes_on_huge_pages_read_back_past_the_reserve() {
        let _huge = huge_chunk_tests();
        let chunks = 2 * RAM_HUGE_RESERVE_CHUNKS as u64;
        let chunk = RAM_HUGE_CHUNK_BYTES as u64;
        let ram = RamBackend::with_huge_pages(chunks * chunk, 4096, true).expect("ram");
        assert!(reserve_reaches(RAM_HUGE_RESERVE_CHUNKS));
        let h0 = ram_huge_chunks();
        let mut q = ram.open_queue().expect("queue");
        for i in 0..chunks {
            let c = run(
                q.as_mut(),
                IoRequest {
                    tag: i,
                    op: IoOp::Write { fua: false },
                    offset_bytes: i * chunk + 4096,
                    len_bytes: 4096,
                    buf: Some(AlignedBuf::from_slice(&[i as u8 + 1; 4096])),
                },
            );
            assert!(c.result.is_ok(), "{:?}", c.result);
        }
        let h1 = ram_huge_chunks();
        let small = h1.from_spares - h0.from_spares + h1.inline - h0.inline;
        assert!(
            h1.from_reserve - h0.from_reserve + small >= chunks,
            "chunks not counted"
        );
        assert!(
            h1.from_reserve > h0.from_reserve,
            "no chunk came from the reserve"
        );
        // Queued, and not collapsed before the writes have paused.
        assert!(
            h1.collapse_pending >= small,
            "{h1:?} after {h0:?}: {small} taken on small pages"
        );
        let read_back = |q: &mut dyn BackendQueue, round: u64| {
            for i in 0..chunks {
                let c = run(
                    q,
                    IoRequest {
                        tag: round * 100 + i,
                        op: IoOp::Read,
                        offset_bytes: i * chunk,
                        len_bytes: 8192,
                        buf: Some(AlignedBuf::new(8192)),
                    },
                );
                assert!(c.result.is_ok(), "{:?}", c.result);
                let d = c.buf.expect("buf back");
                assert!(d[..4096].iter().all(|&b| b == 0), "chunk {i} head");
                assert!(
                    d[4096..].iter().all(|&b| b == i as u8 + 1),
                    "chunk {i} data"
                );
            }
        };
        read_back(q.as_mut(), 1);
        // The writes have paused: the thread collapses what they faulted
        // on small pages (other tests' chunks may be counted too).
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        let settled = |h: RamHugeChunks| {
            h.collapsed + h.collapse_failed >= h1.collapsed + h1.collapse_failed + small
        };
        while !settled(ram_huge_chunks()) && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let h2 = ram_huge_chunks();
        assert!(
            settled(h2),
            "small-page chunks were not collapsed: {h1:?} then {h2:?}"
        );
        read_back(q.as_mut(), 2);
        if h2.collapsed > h1.collapsed {
            // Where the kernel collapsed, the chunk's mapping now holds a
            // huge page. Chunks of this store past the reserve's share
            // came from spares or were mapped inline.
            let huge = (0..chunks)
                .filter_map(|i| chunk_addr(&ram, i))
                .filter(|&a| anon_huge_kb_at(a).is_some_and(|kb| kb >= 2048))
                .count() as u64;
            assert!(huge > 0, "no chunk of the store is on a huge page");
        }
    }

    /// A chunk freed while the thread advises it waits for the advice,
    /// and is not left queued for collapse by it.
    #[test]
    fn a_chunk_freed_during_its_advice_is_not_left_queued() {
        // A reserve of its own, with no thread: this test plays the thread.
        let r = HugeReserve {
            state: std::sync::Mutex::new(ReserveState::default()),
            taken: std::sync::Condvar::new(),
            settled: std::sync::Condvar::new(),
        };
        let p = map_aligned_chunk(HugeAdvice::AfterFirstFault).expect("map");
        let at = p.as_ptr() as usize;
        sync::lock(&r.state).to_advise.push(at);
        assert!(matches!(r.next_job(), ReserveJob::Advise(a) if a == at));
        let freed = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                r.forget(at);
                freed.store(true, Ordering::Release);
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(
                !freed.load(Ordering::Acquire),
                "the free did not wait for the advice"
            );
            // The thread's advice ends: it queues the chunk for collapse.
            r.settle(Some(at));
        });
        assert!(freed.load(Ordering::Acquire));
        let st = sync::lock(&r.state);
        assert!(!st.to_collapse.contains(&at), "freed chunk left queued");
        assert_eq!(st.busy, None);
        drop(st);
        drop(ChunkMem::Mapped(p));
    }

    /// A chunk freed while queued for collapse leaves the queue before its
    /// memory is unmapped, so the thread never collapses (or advises) an
    /// address that may by then belong to another mapping.
    #[test]
    fn a_freed_chunk_leaves_the_collapse_queue() {
        let _huge = huge_chunk_tests();
        let r = HugeReserve::get().expect("reserve thread");
        for _ in 0..20 {
            let p = map_aligned_chunk(HugeAdvice::AfterFirstFault).expect("map");
            let at = p.as_ptr() as usize;
            r.collapse_later(at);
            sync::lock(&r.state).to_advise.push(at);
            drop(ChunkMem::Mapped(p));
            let st = sync::lock(&r.state);
            assert!(!st.to_collapse.contains(&at), "freed chunk still queued");
            assert!(!st.to_advise.contains(&at), "freed chunk still to advise");
            assert_ne!(st.busy, Some(at), "freed chunk still being collapsed");
        }
    }

    #[test]
    fn rejects_bad_geometry() {
        assert!(matches!(
            RamBackend::new(1000, 512),
            Err(BackendError::InvalidConfig {
                field: "size_bytes",
                ..
            })
        ));
        assert!(matches!(
            RamBackend::new(4096, 1024),
            Err(BackendError::InvalidConfig {
                field: "block_size_bytes",
                ..
            })
        ));
        assert!(matches!(
            RamBackend::new(0, 512),
            Err(BackendError::InvalidConfig {
                field: "size_bytes",
                ..
            })
        ));
        assert!(RamBackend::new(RAM_SIZE_BYTES_MAX + 4096, 4096).is_err());
        // The maximum itself is accepted and cheap (lazy directory).
        let big = RamBackend::new(RAM_SIZE_BYTES_MAX, 4096).expect("16 TiB");
        assert_eq!(big.allocated_bytes(), 0);
    }

    #[test]
    fn sparse_alloc_and_free() {
        let ram = RamBackend::new(4 << 20, 512).expect("ram");
        let mut q = ram.open_queue().expect("queue");
        let chunk = RAM_CHUNK_BYTES as u64;
        let data = AlignedBuf::from_slice(&vec![0xAB; 1024]);
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 9,
                op: IoOp::Write { fua: false },
                offset_bytes: chunk - 512,
                len_bytes: 1024,
                buf: Some(data),
            },
        );
        assert_eq!(c.tag, 9);
        assert!(c.result.is_ok());
        assert_eq!(ram.allocated_bytes(), 2 * chunk);
        // Partial zero keeps the chunk, full-cover zero frees it.
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 1,
                op: IoOp::Deallocate,
                offset_bytes: 0,
                len_bytes: chunk,
                buf: None,
            },
        );
        assert!(c.result.is_ok());
        assert_eq!(ram.allocated_bytes(), chunk);
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 2,
                op: IoOp::Read,
                offset_bytes: chunk - 512,
                len_bytes: 1024,
                buf: Some(AlignedBuf::new(1024)),
            },
        );
        let buf = c.buf.expect("buf back");
        assert!(buf[..512].iter().all(|&b| b == 0));
        assert!(buf[512..].iter().all(|&b| b == 0xAB));
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 3,
                op: IoOp::WriteZeroes {
                    deallocate: false,
                    fua: true,
                },
                offset_bytes: chunk,
                len_bytes: 512,
                buf: None,
            },
        );
        assert!(c.result.is_ok());
        assert_eq!(ram.allocated_bytes(), chunk);
    }

    #[test]
    fn streaming_copies_match_plain_ones_at_every_shape() {
        // Bytes that never repeat in 8 KiB: a line stored 256 bytes off
        // would not match.
        let src: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3 + i / 256) as u8).collect();
        let mut back = vec![0u8; 8192 + 64];
        // Aligned whole lines (streamed), odd lengths and unaligned
        // destinations (plain copies): the bytes land the same either way.
        for (off, len) in [(0, 64), (0, 4096), (16, 512), (1, 4096), (0, 100), (8, 128)] {
            back.fill(0xEE);
            let base = back.as_ptr() as usize;
            let skew = (16 - base % 16) % 16;
            let at = skew + off;
            copy_streaming(&mut back[at..at + len], &src[..len]);
            assert!(back[at..at + len] == src[..len], "off {off} len {len}");
            assert!(back[..at].iter().all(|&b| b == 0xEE), "before, off {off}");
            assert!(
                back[at + len..].iter().all(|&b| b == 0xEE),
                "after, off {off}"
            );
        }
    }

    #[test]
    fn a_short_last_chunk_is_written_read_and_freed_whole() {
        let _huge = huge_chunk_tests();
        // On huge pages, 3 MiB: one full (mapped) 2 MiB chunk and a 1 MiB
        // last chunk (heap).
        let size = 3u64 << 20;
        let ram = RamBackend::with_huge_pages(size, 4096, true).expect("ram");
        let mut q = ram.open_queue().expect("queue");
        let chunk = RAM_HUGE_CHUNK_BYTES as u64;
        // A write across the boundary fills the end of chunk 0 and the
        // start of chunk 1; one at the very end fills the last block.
        for (tag, off, fill) in [(1, chunk - 4096, 0x11u8), (2, size - 4096, 0x22)] {
            let c = run(
                q.as_mut(),
                IoRequest {
                    tag,
                    op: IoOp::Write { fua: false },
                    offset_bytes: off,
                    len_bytes: 8192.min(size - off),
                    buf: Some(AlignedBuf::from_slice(&vec![
                        fill;
                        usize_from(
                            8192.min(size - off)
                        )
                    ])),
                },
            );
            assert!(c.result.is_ok(), "{:?}", c.result);
        }
        assert_eq!(ram.allocated_bytes(), size);
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 3,
                op: IoOp::Read,
                offset_bytes: chunk - 4096,
                len_bytes: 8192,
                buf: Some(AlignedBuf::new(8192)),
            },
        );
        let buf = c.buf.expect("buf back");
        assert!(
            buf.iter().all(|&b| b == 0x11),
            "data across the chunk boundary"
        );
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 4,
                op: IoOp::Read,
                offset_bytes: size - 8192,
                len_bytes: 8192,
                buf: Some(AlignedBuf::new(8192)),
            },
        );
        let buf = c.buf.expect("buf back");
        assert!(buf[..4096].iter().all(|&b| b == 0), "never written");
        assert!(buf[4096..].iter().all(|&b| b == 0x22), "last block");
        // Deallocating the whole short chunk frees it; chunk 0 stays.
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 5,
                op: IoOp::Deallocate,
                offset_bytes: chunk,
                len_bytes: size - chunk,
                buf: None,
            },
        );
        assert!(c.result.is_ok());
        assert_eq!(ram.allocated_bytes(), chunk);
    }

    #[test]
    fn invalid_requests_complete_with_errors() {
        let ram = RamBackend::new(1 << 20, 4096).expect("ram");
        let mut q = ram.open_queue().expect("queue");
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 5,
                op: IoOp::Read,
                offset_bytes: 1 << 20,
                len_bytes: 4096,
                buf: Some(AlignedBuf::new(4096)),
            },
        );
        assert!(matches!(c.result, Err(BackendError::OutOfRange { .. })));
        assert!(c.buf.is_some(), "buffer handed back on error");
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 6,
                op: IoOp::Write { fua: false },
                offset_bytes: 512,
                len_bytes: 4096,
                buf: Some(AlignedBuf::new(4096)),
            },
        );
        assert!(matches!(c.result, Err(BackendError::Misaligned { .. })));
        assert_eq!(q.in_flight(), 0);
        assert_eq!(ram.allocated_bytes(), 0);
    }

    #[test]
    fn two_threads_disjoint_ranges_consistent() {
        let ram = Arc::new(RamBackend::new(8 << 20, 512).expect("ram"));
        let half = 4u64 << 20;
        let handles: Vec<_> = (0..2u8)
            .map(|t| {
                let ram = Arc::clone(&ram);
                std::thread::spawn(move || {
                    let mut q = ram.open_queue().expect("queue");
                    let base = u64::from(t) * half;
                    let mut model = vec![0u8; half as usize];
                    let mut out = Vec::new();
                    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(t);
                    for i in 0..3000u64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Ranges straddle chunk boundaries; chunks near the
                        // midpoint are not shared (the midpoint is chunk-aligned).
                        let blocks = 1 + (x % 64);
                        let len = blocks * 512;
                        let off = ((x >> 8) % ((half - len) / 512)) * 512;
                        let fill = (i as u8).wrapping_add(t * 100) | 1;
                        let (op, buf) = if x.is_multiple_of(7) {
                            model[off as usize..(off + len) as usize].fill(0);
                            (IoOp::Deallocate, None)
                        } else {
                            model[off as usize..(off + len) as usize].fill(fill);
                            (
                                IoOp::Write { fua: false },
                                Some(AlignedBuf::from_slice(&vec![fill; len as usize])),
                            )
                        };
                        q.submit(
                            IoRequest {
                                tag: i,
                                op,
                                offset_bytes: base + off,
                                len_bytes: len,
                                buf,
                            },
                            Instant::now(),
                        );
                        out.clear();
                        q.poll_completions(Instant::now(), &mut out);
                        assert!(out.iter().all(|c| c.result.is_ok()));
                    }
                    q.submit(
                        IoRequest {
                            tag: 0,
                            op: IoOp::Read,
                            offset_bytes: base,
                            len_bytes: half,
                            buf: Some(AlignedBuf::new(half as usize)),
                        },
                        Instant::now(),
                    );
                    out.clear();
                    q.poll_completions(Instant::now(), &mut out);
                    let buf = out.pop().and_then(|c| c.buf).expect("read back");
                    assert!(
                        buf.as_slice() == model.as_slice(),
                        "thread {t} data mismatch"
                    );
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
    }
}
