//! Block storage backends for Sluice namespaces, all behind one trait pair:
//! [`Backend`] (a device, shared by every worker thread) and [`BackendQueue`]
//! (a submission/completion queue owned by one worker thread).
//!
//! # Backends
//!
//! | type | `kind()` | completion | notes |
//! |------|----------|------------|-------|
//! | [`RamBackend`] | `"ram"` | next poll | sparse 128 KiB chunks (2 MiB huge pages on request), each behind its own lock; large reads shared, not copied, on request |
//! | [`FileBackend`] | `"file"` / `"block"` | io_uring CQ (eventfd) or next poll (sync engine) | `O_DIRECT` with buffered fallback |
//! | [`EmulatedSsd`] | `"emulated-ssd"` | when `now` reaches the modelled time | RAM data + [`ServiceModel`] |
//!
//! # Threading model
//!
//! A `Backend` is `Send + Sync` and is shared (typically in an `Arc`) by all
//! worker threads of the target's event loop. Each worker calls
//! [`Backend::open_queue`] once and then drives its own `BackendQueue`
//! without locks on the hot path, except: RAM chunks are protected by
//! per-chunk `RwLock`s (so threads on disjoint ranges never contend), and the
//! emulated SSD's service model is one `Mutex` per device (it models one
//! device shared by all queues). A file backend's queues share the file
//! descriptor; each io_uring queue owns its own ring and eventfd.
//!
//! Event-loop contract: call [`BackendQueue::submit`] (never blocks for long;
//! invalid requests produce an error completion rather than a panic), then
//! [`BackendQueue::poll_completions`] when either `notify_fd()` is readable
//! (io_uring), `next_deadline()` has passed (emulated SSD), or immediately
//! (RAM, sync engine: both return `None` from both methods and complete
//! everything by the next poll). Time is always injected as `now`; nothing
//! reads the clock. Every submitted request yields exactly one completion,
//! which hands the buffer back.
//!
//! Requests are not ordered relative to each other while in flight (as in
//! NVMe): issue dependent I/O only after the first one completed.
//!
//! # Durability guarantees
//!
//! * `Write { fua: false }`: on completion the data is visible to all later
//!   reads on any queue. If [`Geometry::volatile_write_cache`] is true (file
//!   and block backends: page cache / device cache) it may be lost on power
//!   failure until a Flush completes.
//! * `Write { fua: true }` and `WriteZeroes { fua: true }`: on completion the
//!   data is on stable storage (`RWF_DSYNC` in io_uring, `fdatasync` in the
//!   sync engine and for write-zeroes).
//! * `Flush`: on completion every write that completed before the Flush was
//!   submitted is on stable storage (`fdatasync` semantics,
//!   `IORING_OP_FSYNC` + `DATASYNC`).
//! * `WriteZeroes`: the range reads as zeroes (files: `FALLOC_FL_ZERO_RANGE`,
//!   or `PUNCH_HOLE` with `deallocate`, falling back to writing zeroes; block
//!   devices: `BLKZEROOUT`).
//! * `Deallocate`: advisory. RAM, emulated SSD and files guarantee zeroes on
//!   later reads (`deallocated_reads_zero`); block devices use `BLKDISCARD`
//!   and do not.
//! * RAM and the emulated SSD have no durability at all; they report
//!   `volatile_write_cache = false` because there is no cache to flush.
//!
//! # Limits
//!
//! Block size is 512 or 4096 bytes; a single read/write is at most
//! [`TRANSFER_BYTES_MAX`]; RAM-backed devices are at most
//! [`RAM_SIZE_BYTES_MAX`]; an io_uring queue has [`RING_ENTRIES`] in flight
//! plus a backlog of [`BACKLOG_MAX`] before failing with `QueueFull`.

mod buf;
mod error;
mod file;
mod io;
mod ram;
mod ssd;

pub use buf::{AlignedBuf, BUF_ALIGN_BYTES};
pub use error::BackendError;
pub use file::{
    EngineKind, FileBackend, FileOptions, FileQueue, BACKLOG_MAX, FILE_DEFAULT_BLOCK_SIZE_BYTES,
    RING_ENTRIES,
};
pub use io::{
    valid_block_size, validate_request, Backend, BackendQueue, Geometry, IoCompletion, IoOp,
    IoRequest, TRANSFER_BYTES_MAX,
};
pub use ram::{
    ram_huge_chunks, ram_shared_reads, RamBackend, RamHugeChunks, RamQueue, RamSharedReads,
    RAM_CHUNK_BYTES, RAM_HUGE_CHUNK_BYTES, RAM_HUGE_COLLAPSE_QUIET, RAM_HUGE_RESERVE_CHUNKS,
    RAM_HUGE_SPARE_CHUNKS, RAM_SIZE_BYTES_MAX,
};
pub use sluice_bytes::{SharedBytes, SharedRange};
pub use ssd::{
    EmulatedSsd, ServiceModel, ServiceOp, SsdModel, SsdQueue, BASE_LATENCY_US_MAX, PARALLELISM_MAX,
    SSD_QUEUE_DEPTH_MAX,
};

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod proptests;
