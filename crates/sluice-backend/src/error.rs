//! `BackendError`: every way a backend operation or construction can fail.
//! Variants are chosen so the target can map each to a distinct NVMe status.

/// Errors reported by backends, either from constructors or through
/// [`IoCompletion::result`](crate::IoCompletion).
///
/// Suggested NVMe mapping: `OutOfRange` → LBA Out of Range; `Misaligned`,
/// `InvalidBuffer`, `TransferTooLarge` → Invalid Field / Data SGL Length
/// Invalid; `Unsupported` → Invalid Opcode; `ReadOnly` → Attempted Write to
/// Read Only Range; `WriteFault` → Write Fault; `ReadError` → Unrecovered Read
/// Error; `QueueFull` → Namespace Not Ready (retryable); `Io` → Internal Error.
#[derive(thiserror::Error, Debug)]
pub enum BackendError {
    /// No room to allocate what the write needs (an elastic volume's pool
    /// is full): NVMe Capacity Exceeded.
    #[error("capacity exceeded: {0}")]
    CapacityExceeded(String),
    /// The storage behind the backend could not be reached (an elastic
    /// volume's drives or control plane): NVMe Namespace Not Ready, which
    /// hosts retry.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The byte range `[offset_bytes, offset_bytes + len_bytes)` does not fit
    /// inside the backend.
    #[error("range out of bounds: offset {offset_bytes} + len {len_bytes} exceeds size {size_bytes} bytes")]
    OutOfRange {
        offset_bytes: u64,
        len_bytes: u64,
        size_bytes: u64,
    },
    /// Offset or length is not a multiple of the block size.
    #[error("misaligned request: offset {offset_bytes}, len {len_bytes} not multiples of block size {block_size_bytes}")]
    Misaligned {
        offset_bytes: u64,
        len_bytes: u64,
        block_size_bytes: u32,
    },
    /// Read/Write without a buffer, or with a buffer whose length differs from
    /// `len_bytes`.
    #[error("invalid buffer: expected {expected_bytes} bytes, got {actual_bytes:?}")]
    InvalidBuffer {
        expected_bytes: u64,
        actual_bytes: Option<usize>,
    },
    /// Single read/write larger than [`TRANSFER_BYTES_MAX`](crate::TRANSFER_BYTES_MAX).
    #[error("transfer of {len_bytes} bytes exceeds the limit of {max_bytes} bytes")]
    TransferTooLarge { len_bytes: u64, max_bytes: u64 },
    /// Operating-system error outside a data transfer (open, flush, ioctl…).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The operation is not supported by this backend.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// Write or write-zeroes attempted on a read-only backend.
    #[error("backend is read-only")]
    ReadOnly,
    /// The media failed to persist a write.
    #[error("write fault at offset {offset_bytes}: {source}")]
    WriteFault {
        offset_bytes: u64,
        #[source]
        source: std::io::Error,
    },
    /// The media failed to return data for a read.
    #[error("read error at offset {offset_bytes}: {source}")]
    ReadError {
        offset_bytes: u64,
        #[source]
        source: std::io::Error,
    },
    /// The per-queue backlog limit was reached; the request was not executed
    /// and may be retried.
    #[error("queue full: {in_flight} requests in flight")]
    QueueFull { in_flight: usize },
    /// A constructor argument is invalid; `field` names it.
    #[error("invalid configuration `{field}`: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
}

impl BackendError {
    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}
