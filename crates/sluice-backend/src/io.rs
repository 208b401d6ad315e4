//! Request/completion types shared by all backends, the `Backend` /
//! `BackendQueue` traits, and the common request validation.

use std::os::fd::RawFd;
use std::time::Instant;

use crate::{AlignedBuf, BackendError};
use sluice_bytes::SharedRange;

/// Largest single Read/Write transfer accepted, in bytes (far above any
/// sensible NVMe MDTS; keeps io_uring lengths within `u32`).
pub const TRANSFER_BYTES_MAX: u64 = 64 << 20;

/// Operation carried by an [`IoRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Fill `buf` with `len_bytes` bytes starting at `offset_bytes`.
    Read,
    /// Write `buf`; with `fua` the completion implies the data is durable.
    Write { fua: bool },
    /// Make every previously completed write durable. Range is ignored.
    Flush,
    /// Zero the range (optionally letting the backend deallocate it).
    WriteZeroes { deallocate: bool, fua: bool },
    /// Hint that the range is unused; reads afterwards return zeroes only if
    /// [`Geometry::deallocated_reads_zero`].
    Deallocate,
}

/// One I/O submitted to a [`BackendQueue`].
#[derive(Debug)]
pub struct IoRequest {
    /// Caller's identifier, echoed in the completion.
    pub tag: u64,
    pub op: IoOp,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// Read: buffer of `len_bytes` to fill; Write: the data; otherwise `None`.
    pub buf: Option<AlignedBuf>,
}

/// Result of one [`IoRequest`].
pub struct IoCompletion {
    pub tag: u64,
    pub result: Result<(), BackendError>,
    /// The request's buffer handed back (filled for successful reads,
    /// unless `shared` holds the data; then `None`).
    pub buf: Option<AlignedBuf>,
    /// A successful read's data, when the queue shares reads
    /// ([`BackendQueue::share_reads`]) and could share this one.
    pub shared: Option<SharedRange>,
}

impl std::fmt::Debug for IoCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoCompletion")
            .field("tag", &self.tag)
            .field("result", &self.result)
            .field("buf", &self.buf)
            .field("shared_bytes", &self.shared.as_ref().map(SharedRange::len))
            .finish()
    }
}

impl IoCompletion {
    /// A completion handing `buf` back, with no shared data.
    pub fn new(tag: u64, result: Result<(), BackendError>, buf: Option<AlignedBuf>) -> Self {
        IoCompletion {
            tag,
            result,
            buf,
            shared: None,
        }
    }

    /// A successful read's bytes: the shared data, or the buffer.
    pub fn read_data(&self) -> Option<&[u8]> {
        match &self.shared {
            Some(s) => Some(s.as_slice()),
            None => self.buf.as_ref().map(AlignedBuf::as_slice),
        }
    }
}

/// Static shape and capabilities of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Capacity; a multiple of `block_size_bytes`.
    pub size_bytes: u64,
    /// 512 or 4096.
    pub block_size_bytes: u32,
    /// Completed writes may be lost on power failure until a Flush (or FUA).
    pub volatile_write_cache: bool,
    /// Deallocate does something useful (frees space).
    pub(crate) supports_deallocate: bool,
    /// Reads of deallocated ranges return zeroes.
    pub deallocated_reads_zero: bool,
}

impl Geometry {
    /// The geometry of a backend outside this crate (an elastic volume):
    /// no write cache, Deallocate unsupported.
    pub fn external(size_bytes: u64, block_size_bytes: u32) -> Geometry {
        Geometry {
            size_bytes,
            block_size_bytes,
            volatile_write_cache: false,
            supports_deallocate: false,
            deallocated_reads_zero: false,
        }
    }
}

/// A block storage backend, exported by the target as one namespace.
pub trait Backend: Send + Sync + std::fmt::Debug {
    fn geometry(&self) -> Geometry;
    /// Capacity now. It starts at `geometry().size_bytes` and may grow
    /// online (an elastic volume resized by its control plane), never
    /// shrink; the target polls it and tells its hosts.
    fn size_bytes(&self) -> u64 {
        self.geometry().size_bytes
    }
    /// Looks again at the size of what backs it and returns the capacity
    /// now (never smaller than before). A configuration reload calls it
    /// for every namespace it keeps, as nvmet's `revalidate_size`: a file
    /// or block device grown underneath grows its namespace. Backends whose
    /// size only their own code changes (RAM, the emulated SSD, an elastic
    /// volume, which grows by its control plane) look at nothing.
    fn revalidate(&self) -> Result<u64, BackendError> {
        Ok(self.size_bytes())
    }
    /// Makes what backs it at least `size_bytes` large (a regular file
    /// created by the target, whose configured size a reload raised), for
    /// a later [`Backend::revalidate`] to take in. Never shrinks anything.
    /// Refused by backends that cannot change size online.
    fn extend(&self, size_bytes: u64) -> Result<(), BackendError> {
        let _ = size_bytes;
        Err(BackendError::Unsupported("changing its size online"))
    }
    /// `"ram"`, `"file"`, `"block"` or `"emulated-ssd"`.
    fn kind(&self) -> &'static str;
    /// Whether a successful read writes every byte of its buffer (holes
    /// as zeros), so that the target may hand it a buffer that was not
    /// zeroed first ([`crate::AlignedBuf::for_overwrite`]). False unless
    /// a backend guarantees it: a partly filled buffer would carry an
    /// earlier transfer's bytes, perhaps another tenant's.
    fn fills_reads(&self) -> bool {
        false
    }
    /// Per-worker-thread submission/completion queue.
    fn open_queue(&self) -> Result<Box<dyn BackendQueue>, BackendError>;
}

/// A submission/completion queue owned by one worker thread.
pub trait BackendQueue: Send + std::fmt::Debug {
    /// Never blocks for long. Requests are bounds-checked (offset+len within
    /// size, multiple of block size) and invalid ones fail via a completion
    /// (`OutOfRange`, `Misaligned`, `InvalidBuffer`…), never a panic.
    fn submit(&mut self, req: IoRequest, now: Instant);
    /// Appends finished requests to `out` (non-blocking).
    fn poll_completions(&mut self, now: Instant, out: &mut Vec<IoCompletion>);
    /// Earliest time at which a pending completion becomes ready when that is
    /// time-driven (emulated SSD); `None` otherwise.
    fn next_deadline(&self) -> Option<Instant>;
    /// An fd that becomes readable when completions are ready, for
    /// interrupt-driven event loops; `None` when completions are synchronous
    /// or time-driven.
    fn notify_fd(&self) -> Option<RawFd>;
    /// Submitted requests whose completion has not yet been returned by
    /// `poll_completions`.
    fn in_flight(&self) -> usize;
    /// Lets the queue complete reads of at least `min_bytes` with their
    /// data in [`IoCompletion::shared`] (and no buffer) instead of a copy
    /// in the request's buffer, where it can (RAM: a read within one
    /// written chunk). For callers that send the data on and never
    /// write to it. Off by default; other backends ignore it.
    fn share_reads(&mut self, _min_bytes: usize) {}
}

/// Returns `true` for the block sizes backends support (512 and 4096).
pub fn valid_block_size(block_size_bytes: u32) -> bool {
    matches!(block_size_bytes, 512 | 4096)
}

/// Checks a request against a geometry. On success the request is safe to
/// execute: range in bounds and block-aligned, buffer present with the right
/// length for Read/Write, transfer within [`TRANSFER_BYTES_MAX`].
pub fn validate_request(geometry: &Geometry, req: &IoRequest) -> Result<(), BackendError> {
    assert!(valid_block_size(geometry.block_size_bytes));
    assert_eq!(
        geometry.size_bytes % u64::from(geometry.block_size_bytes),
        0
    );
    if req.op == IoOp::Flush {
        return Ok(());
    }
    let block = u64::from(geometry.block_size_bytes);
    if !req.offset_bytes.is_multiple_of(block) || !req.len_bytes.is_multiple_of(block) {
        return Err(BackendError::Misaligned {
            offset_bytes: req.offset_bytes,
            len_bytes: req.len_bytes,
            block_size_bytes: geometry.block_size_bytes,
        });
    }
    let in_range = req
        .offset_bytes
        .checked_add(req.len_bytes)
        .is_some_and(|end| end <= geometry.size_bytes);
    if !in_range {
        return Err(BackendError::OutOfRange {
            offset_bytes: req.offset_bytes,
            len_bytes: req.len_bytes,
            size_bytes: geometry.size_bytes,
        });
    }
    if matches!(req.op, IoOp::Read | IoOp::Write { .. }) {
        if req.len_bytes > TRANSFER_BYTES_MAX {
            return Err(BackendError::TransferTooLarge {
                len_bytes: req.len_bytes,
                max_bytes: TRANSFER_BYTES_MAX,
            });
        }
        let actual = req.buf.as_ref().map(AlignedBuf::len);
        if actual.map(|n| n as u64) != Some(req.len_bytes) {
            return Err(BackendError::InvalidBuffer {
                expected_bytes: req.len_bytes,
                actual_bytes: actual,
            });
        }
    }
    Ok(())
}

/// Builds the completion for a request that failed before execution.
pub(crate) fn fail(req: IoRequest, err: BackendError) -> IoCompletion {
    IoCompletion::new(req.tag, Err(err), req.buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            size_bytes: 1 << 20,
            block_size_bytes: 512,
            volatile_write_cache: false,
            supports_deallocate: true,
            deallocated_reads_zero: true,
        }
    }

    fn req(op: IoOp, offset_bytes: u64, len_bytes: u64, buf_len: Option<usize>) -> IoRequest {
        IoRequest {
            tag: 1,
            op,
            offset_bytes,
            len_bytes,
            buf: buf_len.map(AlignedBuf::new),
        }
    }

    #[test]
    fn accepts_valid() {
        let g = geo();
        assert!(validate_request(&g, &req(IoOp::Read, 0, 512, Some(512))).is_ok());
        assert!(validate_request(&g, &req(IoOp::Read, (1 << 20) - 512, 512, Some(512))).is_ok());
        assert!(validate_request(&g, &req(IoOp::Deallocate, 0, 1 << 20, None)).is_ok());
        assert!(validate_request(&g, &req(IoOp::Flush, 7, 3, None)).is_ok());
    }

    #[test]
    fn rejects_out_of_range_and_overflow() {
        let g = geo();
        let r = validate_request(&g, &req(IoOp::Read, 1 << 20, 512, Some(512)));
        assert!(matches!(r, Err(BackendError::OutOfRange { .. })));
        let r = validate_request(&g, &req(IoOp::Deallocate, u64::MAX - 511, 1024, None));
        assert!(matches!(r, Err(BackendError::OutOfRange { .. })));
    }

    #[test]
    fn rejects_misaligned_and_bad_buffers() {
        let g = geo();
        let r = validate_request(&g, &req(IoOp::Read, 1, 512, Some(512)));
        assert!(matches!(r, Err(BackendError::Misaligned { .. })));
        let r = validate_request(&g, &req(IoOp::Write { fua: false }, 0, 100, Some(100)));
        assert!(matches!(r, Err(BackendError::Misaligned { .. })));
        let r = validate_request(&g, &req(IoOp::Write { fua: false }, 0, 512, None));
        assert!(matches!(r, Err(BackendError::InvalidBuffer { .. })));
        let r = validate_request(&g, &req(IoOp::Read, 0, 1024, Some(512)));
        assert!(matches!(r, Err(BackendError::InvalidBuffer { .. })));
    }
}
