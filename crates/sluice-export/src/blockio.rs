//! Byte-addressed I/O over a block device.
//!
//! [`ByteDevice`] accepts any byte offset and length inside the export.
//! Writes that do not start or end on a block boundary are done by
//! read-modify-write of the edge blocks. Every write-like operation holds a
//! lock on the block range it touches ([`RangeLock`]), so an RMW can never
//! lose a concurrent write to the same block; reads take no lock (concurrent
//! overlapping reads and writes may see either data, as on any block device).

use crate::errno::{self, OpKind};
use sluice_host::{HostError, IoFlags, Namespace};
use sluice_runtime::cast::usize_from;
use sluice_runtime::sync::lock;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The block operations an export needs (implemented by
/// [`sluice_host::Namespace`] and by the in-memory [`MemDevice`]).
pub trait BlockDevice: Send + Sync + 'static {
    fn block_size_bytes(&self) -> u32;
    fn size_blocks(&self) -> u64;
    fn read_blocks(
        &self,
        lba: u64,
        len_bytes: usize,
    ) -> impl Future<Output = Result<Vec<u8>, HostError>> + Send;
    fn write_blocks(
        &self,
        lba: u64,
        data: Vec<u8>,
        fua: bool,
    ) -> impl Future<Output = Result<(), HostError>> + Send;
    fn flush(&self) -> impl Future<Output = Result<(), HostError>> + Send;
    fn write_zeroes(
        &self,
        lba: u64,
        blocks: u64,
    ) -> impl Future<Output = Result<(), HostError>> + Send;
    fn deallocate(
        &self,
        lba: u64,
        blocks: u64,
    ) -> impl Future<Output = Result<(), HostError>> + Send;
    /// The NVMe namespace behind the device, when it is exactly one (the
    /// NBD run-to-completion path drives its controller's direct queues).
    fn namespace(&self) -> Option<&Namespace> {
        None
    }
    /// Whether [`Self::allocation`] can report holes (ranges that read as
    /// zeros and hold nothing). When it cannot, readers skip asking.
    fn reports_holes(&self) -> bool {
        false
    }
    /// Which of `blocks` blocks from `lba` hold data: runs of (blocks,
    /// allocated) that tile the range in order. Only a device that knows
    /// a range reads as zeros and holds nothing (an elastic volume's
    /// unallocated extents) reports `false`; the default says every block
    /// holds data, which is always safe.
    fn allocation(
        &self,
        lba: u64,
        blocks: u64,
    ) -> impl Future<Output = Result<Vec<(u64, bool)>, HostError>> + Send {
        let _ = lba;
        std::future::ready(Ok(vec![(blocks, true)]))
    }
}

impl BlockDevice for Namespace {
    fn namespace(&self) -> Option<&Namespace> {
        Some(self)
    }
    fn block_size_bytes(&self) -> u32 {
        Namespace::block_size_bytes(self)
    }
    fn size_blocks(&self) -> u64 {
        Namespace::size_blocks(self)
    }
    async fn read_blocks(&self, lba: u64, len_bytes: usize) -> Result<Vec<u8>, HostError> {
        self.read(lba, len_bytes, IoFlags::default()).await
    }
    async fn write_blocks(&self, lba: u64, data: Vec<u8>, fua: bool) -> Result<(), HostError> {
        let flags = IoFlags {
            fua,
            ..IoFlags::default()
        };
        self.write_owned(lba, data, flags).await
    }
    async fn flush(&self) -> Result<(), HostError> {
        Namespace::flush(self).await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        Namespace::write_zeroes(self, lba, blocks).await
    }
    async fn deallocate(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        Namespace::deallocate(self, lba, blocks).await
    }
}

/// What an export serves: a namespace on one target, or an elastic volume
/// (`--volume`) whose pieces go straight to its drives.
#[derive(Debug, Clone)]
pub enum RemoteDevice {
    Namespace(Namespace),
    Volume(Arc<sluice_control::Volume>),
}

/// A volume error as the host error the export maps to an errno: a full
/// pool is Capacity Exceeded (`ENOSPC`), the rest transport-level (`EIO`)
/// unless a drive answered with a status.
fn volume_error(e: sluice_control::VolumeError) -> HostError {
    use sluice_control::VolumeError as V;
    match e {
        V::Drive { source, .. } => source,
        V::CapacityExceeded(_) => HostError::Nvme {
            opcode: sluice_proto::command::io::WRITE,
            status: sluice_proto::Status::CAPACITY_EXCEEDED,
            result: 0,
        },
        V::Range(r) => HostError::InvalidArgument(r.to_string()),
        V::DriveChanged { .. } => HostError::Incompatible(e.to_string()),
        other => HostError::Transport(other.to_string()),
    }
}

impl BlockDevice for RemoteDevice {
    fn namespace(&self) -> Option<&Namespace> {
        match self {
            RemoteDevice::Namespace(n) => Some(n),
            RemoteDevice::Volume(_) => None,
        }
    }
    fn reports_holes(&self) -> bool {
        matches!(self, RemoteDevice::Volume(_))
    }
    fn block_size_bytes(&self) -> u32 {
        match self {
            RemoteDevice::Namespace(n) => n.block_size_bytes(),
            RemoteDevice::Volume(v) => v.block_size_bytes(),
        }
    }
    fn size_blocks(&self) -> u64 {
        match self {
            RemoteDevice::Namespace(n) => n.size_blocks(),
            RemoteDevice::Volume(v) => v.size_blocks(),
        }
    }
    async fn read_blocks(&self, lba: u64, len_bytes: usize) -> Result<Vec<u8>, HostError> {
        match self {
            RemoteDevice::Namespace(n) => n.read_blocks(lba, len_bytes).await,
            RemoteDevice::Volume(v) => v
                .read(lba, len_bytes, IoFlags::default())
                .await
                .map_err(volume_error),
        }
    }
    async fn write_blocks(&self, lba: u64, data: Vec<u8>, fua: bool) -> Result<(), HostError> {
        match self {
            RemoteDevice::Namespace(n) => n.write_blocks(lba, data, fua).await,
            RemoteDevice::Volume(v) => {
                let flags = IoFlags {
                    fua,
                    ..IoFlags::default()
                };
                v.write(lba, &data, flags).await.map_err(volume_error)
            }
        }
    }
    async fn flush(&self) -> Result<(), HostError> {
        match self {
            RemoteDevice::Namespace(n) => BlockDevice::flush(n).await,
            RemoteDevice::Volume(v) => v.flush().await.map_err(volume_error),
        }
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        match self {
            RemoteDevice::Namespace(n) => BlockDevice::write_zeroes(n, lba, blocks).await,
            RemoteDevice::Volume(v) => {
                // Written as zeroes, 4 MiB at a time (allocating extents).
                let bs = u64::from(v.block_size_bytes());
                let chunk_blocks = ((4u64 << 20) / bs).max(1);
                let mut at = 0;
                while at < blocks {
                    let n = (blocks - at).min(chunk_blocks);
                    let zeros = vec![0u8; usize_from(n * bs)];
                    v.write(lba + at, &zeros, IoFlags::default())
                        .await
                        .map_err(volume_error)?;
                    at += n;
                }
                Ok(())
            }
        }
    }
    async fn deallocate(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        match self {
            RemoteDevice::Namespace(n) => BlockDevice::deallocate(n, lba, blocks).await,
            // Advisory (TRIM): a volume keeps its extents.
            RemoteDevice::Volume(_) => Ok(()),
        }
    }
    async fn allocation(&self, lba: u64, blocks: u64) -> Result<Vec<(u64, bool)>, HostError> {
        match self {
            RemoteDevice::Namespace(_) => Ok(vec![(blocks, true)]),
            RemoteDevice::Volume(v) => v.allocation(lba, blocks).await.map_err(volume_error),
        }
    }
}

/// A RAM block device for tests: yields between the steps of every
/// operation so that races in the layers above show up.
#[derive(Debug)]
pub struct MemDevice {
    block_size_bytes: u32,
    data: Mutex<Vec<u8>>,
    /// Operations counted per kind: (reads, writes, flushes, zeroes, deallocs).
    pub counts: Mutex<[u64; 5]>,
}

impl MemDevice {
    pub fn new(block_size_bytes: u32, size_blocks: u64) -> MemDevice {
        MemDevice {
            block_size_bytes,
            data: Mutex::new(vec![
                0;
                usize_from(u64::from(block_size_bytes) * size_blocks)
            ]),
            counts: Mutex::new([0; 5]),
        }
    }
    /// A copy of the whole contents.
    pub fn snapshot(&self) -> Vec<u8> {
        lock(&self.data).clone()
    }
    fn range(&self, lba: u64, len_bytes: u64) -> Result<std::ops::Range<usize>, HostError> {
        let bs = self.block_size_bytes as u64;
        let total = lock(&self.data).len() as u64;
        let start = lba.checked_mul(bs);
        match start.and_then(|s| s.checked_add(len_bytes).map(|e| (s, e))) {
            Some((s, e)) if e <= total && len_bytes.is_multiple_of(bs) => {
                Ok(usize_from(s)..usize_from(e))
            }
            _ => Err(HostError::InvalidArgument(format!(
                "LBA {lba} + {len_bytes} bytes beyond the device"
            ))),
        }
    }
    fn count(&self, i: usize) {
        lock(&self.counts)[i] += 1;
    }
}

impl BlockDevice for MemDevice {
    fn block_size_bytes(&self) -> u32 {
        self.block_size_bytes
    }
    fn size_blocks(&self) -> u64 {
        lock(&self.data).len() as u64 / self.block_size_bytes as u64
    }
    async fn read_blocks(&self, lba: u64, len_bytes: usize) -> Result<Vec<u8>, HostError> {
        let r = self.range(lba, len_bytes as u64)?;
        tokio::task::yield_now().await;
        self.count(0);
        Ok(lock(&self.data)[r].to_vec())
    }
    async fn write_blocks(&self, lba: u64, data: Vec<u8>, _fua: bool) -> Result<(), HostError> {
        let r = self.range(lba, data.len() as u64)?;
        tokio::task::yield_now().await;
        self.count(1);
        lock(&self.data)[r].copy_from_slice(&data);
        Ok(())
    }
    async fn flush(&self) -> Result<(), HostError> {
        self.count(2);
        Ok(())
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        let r = self.range(lba, blocks * self.block_size_bytes as u64)?;
        tokio::task::yield_now().await;
        self.count(3);
        lock(&self.data)[r].fill(0);
        Ok(())
    }
    async fn deallocate(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        let r = self.range(lba, blocks * self.block_size_bytes as u64)?;
        self.count(4);
        // Deallocated blocks read as zeroes here (DLFEAT 001b behaviour).
        lock(&self.data)[r].fill(0);
        Ok(())
    }
}

/// Errors of [`ByteDevice`] operations.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{len} bytes at offset {offset} do not fit the {size_bytes} byte export")]
    OutOfRange {
        offset: u64,
        len: u64,
        size_bytes: u64,
        op: OpKind,
    },
    #[error("{op:?} failed: {source}")]
    Device {
        op: OpKind,
        #[source]
        source: HostError,
    },
}

impl ExportError {
    /// The errno reported to the client (see [`crate::errno`]).
    pub fn errno(&self) -> u32 {
        match self {
            ExportError::OutOfRange { op, .. } => op.out_of_range_errno(),
            ExportError::Device { op, source } => errno::from_host_error(source, *op),
        }
    }
}

/// Block ranges currently locked by writers; waiters are woken on release.
#[derive(Debug, Default)]
pub struct RangeLock {
    held: Mutex<Vec<(u64, u64, u64)>>,
    next_id: std::sync::atomic::AtomicU64,
    released: Notify,
}

/// Releases its range on drop.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl RangeLock {
    /// Locks blocks `[start, end)`, waiting for overlapping holders.
    pub async fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut held = lock(&self.held);
                if !held.iter().any(|&(s, e, _)| s < end && start < e) {
                    held.push((start, end, id));
                    return RangeGuard { lock: self, id };
                }
            }
            notified.await;
        }
    }
    /// Locks `[start, end)` if nothing overlapping is held, without
    /// waiting: the lock's id, to give to [`Self::release`]. For callers
    /// that hold a range across a command they drive themselves (the NBD
    /// run-to-completion path).
    pub fn try_lock(&self, start: u64, end: u64) -> Option<u64> {
        let mut held = lock(&self.held);
        if held.iter().any(|&(s, e, _)| s < end && start < e) {
            return None;
        }
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        held.push((start, end, id));
        Some(id)
    }

    /// Releases a range locked by [`Self::try_lock`] and wakes waiters.
    pub fn release(&self, id: u64) {
        lock(&self.held).retain(|&(_, _, i)| i != id);
        self.released.notify_waiters();
    }

    /// Number of ranges held (for tests).
    pub fn held(&self) -> usize {
        lock(&self.held).len()
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.lock.release(self.id);
    }
}

/// How a byte range maps onto blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpan {
    /// First block touched.
    pub(crate) first_lba: u64,
    /// Blocks touched (0 for an empty range).
    pub(crate) blocks: u64,
    /// Byte offset of the range inside the first block.
    pub(crate) head_skip: u64,
    /// The first block is only partly covered.
    pub(crate) head_partial: bool,
    /// The last block is only partly covered.
    pub(crate) tail_partial: bool,
}

impl BlockSpan {
    /// The span of `len` bytes at `offset` with blocks of `bs` bytes
    /// (`offset + len` must not overflow; callers check the range first).
    pub fn new(offset: u64, len: u64, bs: u64) -> BlockSpan {
        let end = offset + len;
        let first_lba = offset / bs;
        let end_lba = end.div_ceil(bs);
        let head_skip = offset % bs;
        BlockSpan {
            first_lba,
            blocks: if len == 0 { 0 } else { end_lba - first_lba },
            head_skip,
            head_partial: len > 0 && (head_skip != 0 || (end - first_lba * bs) < bs),
            tail_partial: len > 0 && !end.is_multiple_of(bs),
        }
    }
    pub fn aligned(&self) -> bool {
        !self.head_partial && !self.tail_partial
    }
    /// Whole blocks strictly inside the range: `(lba, blocks)`.
    pub fn inner(offset: u64, len: u64, bs: u64) -> (u64, u64) {
        let s = offset.div_ceil(bs);
        let e = (offset + len) / bs;
        (s, e.saturating_sub(s))
    }
}

/// Byte-addressed reads and writes over a [`BlockDevice`].
#[derive(Debug)]
pub struct ByteDevice<D> {
    dev: D,
    bs: u64,
    /// The size at the making: the export never reports less.
    size_bytes_min: u64,
    locks: RangeLock,
}

impl<D: BlockDevice> ByteDevice<D> {
    pub fn new(dev: D) -> Arc<ByteDevice<D>> {
        let bs = dev.block_size_bytes().max(1) as u64;
        let size_bytes = dev.size_blocks().saturating_mul(bs);
        Arc::new(ByteDevice {
            dev,
            bs,
            size_bytes_min: size_bytes,
            locks: RangeLock::default(),
        })
    }
    pub fn device(&self) -> &D {
        &self.dev
    }
    /// The device's size now: a namespace the target grew online is
    /// larger once the host saw the event (`sluice_host::Namespace::size_blocks`);
    /// never less than at the making.
    pub fn size_bytes(&self) -> u64 {
        self.dev
            .size_blocks()
            .saturating_mul(self.bs)
            .max(self.size_bytes_min)
    }
    pub fn block_size_bytes(&self) -> u32 {
        // The device's u32 block size, widened in `new`.
        #[allow(clippy::cast_possible_truncation)]
        let bs = self.bs as u32;
        bs
    }
    pub fn locks(&self) -> &RangeLock {
        &self.locks
    }

    /// Checks that `len` bytes at `offset` lie inside the export.
    pub fn check(&self, offset: u64, len: u64, op: OpKind) -> Result<(), ExportError> {
        let size_bytes = self.size_bytes();
        match offset.checked_add(len) {
            Some(end) if end <= size_bytes => Ok(()),
            _ => Err(ExportError::OutOfRange {
                offset,
                len,
                size_bytes,
                op,
            }),
        }
    }

    fn dev_err(op: OpKind) -> impl FnOnce(HostError) -> ExportError {
        move |source| ExportError::Device { op, source }
    }

    /// Whether [`Self::allocation`] can report holes (see
    /// [`BlockDevice::reports_holes`]).
    pub fn reports_holes(&self) -> bool {
        self.dev.reports_holes()
    }

    /// Which bytes of `len` at `offset` hold data: runs of (bytes,
    /// allocated) that tile the range exactly (partial edge blocks take the
    /// state of their block).
    pub async fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, bool)>, ExportError> {
        self.check(offset, len, OpKind::Read)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let span = BlockSpan::new(offset, len, self.bs);
        let runs = self
            .dev
            .allocation(span.first_lba, span.blocks)
            .await
            .map_err(Self::dev_err(OpKind::Read))?;
        let end = offset + len;
        let mut at = span.first_lba * self.bs;
        let mut out: Vec<(u64, bool)> = Vec::with_capacity(runs.len());
        for (blocks, allocated) in runs {
            let (from, to) = (at.max(offset), at.saturating_add(blocks * self.bs).min(end));
            at = at.saturating_add(blocks * self.bs);
            if from >= to {
                continue;
            }
            match out.last_mut() {
                Some((n, a)) if *a == allocated => *n += to - from,
                _ => out.push((to - from, allocated)),
            }
        }
        let covered: u64 = out.iter().map(|r| r.0).sum();
        if covered < len {
            // A device that described less than asked: the rest holds data.
            match out.last_mut() {
                Some((n, true)) => *n += len - covered,
                _ => out.push((len - covered, true)),
            }
        }
        Ok(out)
    }

    /// Reads `len` bytes at `offset`.
    pub async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, ExportError> {
        self.check(offset, len as u64, OpKind::Read)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let span = BlockSpan::new(offset, len as u64, self.bs);
        let mut data = self
            .dev
            .read_blocks(span.first_lba, usize_from(span.blocks * self.bs))
            .await
            .map_err(Self::dev_err(OpKind::Read))?;
        if span.aligned() {
            return Ok(data);
        }
        let skip = usize_from(span.head_skip);
        data.truncate(skip + len);
        data.drain(..skip);
        Ok(data)
    }

    /// Writes `data` at `offset` (read-modify-write of partial edge blocks).
    pub async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), ExportError> {
        self.check(offset, data.len() as u64, OpKind::Write)?;
        if data.is_empty() {
            return Ok(());
        }
        let span = BlockSpan::new(offset, data.len() as u64, self.bs);
        let _g = self
            .locks
            .lock(span.first_lba, span.first_lba + span.blocks)
            .await;
        self.write_locked(offset, data, fua).await
    }

    /// The write itself; the caller holds the lock on the span's blocks.
    async fn write_locked(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), ExportError> {
        let span = BlockSpan::new(offset, data.len() as u64, self.bs);
        let err = Self::dev_err(OpKind::Write);
        if span.aligned() {
            return self
                .dev
                .write_blocks(span.first_lba, data, fua)
                .await
                .map_err(err);
        }
        let bs = usize_from(self.bs);
        let mut buf = vec![0u8; usize_from(span.blocks) * bs];
        let last_lba = span.first_lba + span.blocks - 1;
        if span.head_partial {
            let b = self
                .dev
                .read_blocks(span.first_lba, bs)
                .await
                .map_err(Self::dev_err(OpKind::Write))?;
            buf[..bs].copy_from_slice(&b);
        }
        if span.tail_partial && (last_lba != span.first_lba || !span.head_partial) {
            let b = self
                .dev
                .read_blocks(last_lba, bs)
                .await
                .map_err(Self::dev_err(OpKind::Write))?;
            let at = buf.len() - bs;
            buf[at..].copy_from_slice(&b);
        }
        let skip = usize_from(span.head_skip);
        buf[skip..skip + data.len()].copy_from_slice(&data);
        self.dev
            .write_blocks(span.first_lba, buf, fua)
            .await
            .map_err(err)
    }

    /// Zeroes `len` bytes at `offset`: NVMe Write Zeroes for whole blocks,
    /// read-modify-write for partial edges; `fua` adds a Flush.
    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.check(offset, len, OpKind::WriteZeroes)?;
        if len == 0 {
            return Ok(());
        }
        let span = BlockSpan::new(offset, len, self.bs);
        let _g = self
            .locks
            .lock(span.first_lba, span.first_lba + span.blocks)
            .await;
        let (lba, blocks) = BlockSpan::inner(offset, len, self.bs);
        if blocks == 0 {
            self.write_locked(offset, vec![0; usize_from(len)], false)
                .await?;
        } else {
            let inner_start = lba * self.bs;
            let inner_end = inner_start + blocks * self.bs;
            if inner_start > offset {
                self.write_locked(offset, vec![0; usize_from(inner_start - offset)], false)
                    .await?;
            }
            self.dev
                .write_zeroes(lba, blocks)
                .await
                .map_err(Self::dev_err(OpKind::WriteZeroes))?;
            if offset + len > inner_end {
                self.write_locked(
                    inner_end,
                    vec![0; usize_from(offset + len - inner_end)],
                    false,
                )
                .await?;
            }
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Deallocates the whole blocks inside the range (partial blocks are
    /// left alone: a trim is advisory); `fua` adds a Flush.
    pub async fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.check(offset, len, OpKind::Trim)?;
        let (lba, blocks) = BlockSpan::inner(offset, len, self.bs);
        if blocks > 0 {
            let _g = self.locks.lock(lba, lba + blocks).await;
            self.dev
                .deallocate(lba, blocks)
                .await
                .map_err(Self::dev_err(OpKind::Trim))?;
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    pub async fn flush(&self) -> Result<(), ExportError> {
        self.dev.flush().await.map_err(Self::dev_err(OpKind::Flush))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_cases() {
        let s = BlockSpan::new(0, 512, 512);
        assert_eq!((s.first_lba, s.blocks, s.aligned()), (0, 1, true));
        let s = BlockSpan::new(100, 10, 512);
        assert_eq!(
            (s.first_lba, s.blocks, s.head_partial, s.tail_partial),
            (0, 1, true, true)
        );
        let s = BlockSpan::new(0, 100, 512);
        assert!(s.head_partial && s.tail_partial);
        let s = BlockSpan::new(512, 1024, 512);
        assert_eq!((s.first_lba, s.blocks, s.aligned()), (1, 2, true));
        let s = BlockSpan::new(500, 1036, 512);
        assert_eq!(
            (s.first_lba, s.blocks, s.head_partial, s.tail_partial),
            (0, 3, true, false)
        );
        assert_eq!(BlockSpan::inner(500, 1036, 512), (1, 2));
        assert_eq!(BlockSpan::inner(100, 10, 512), (1, 0));
    }
}
