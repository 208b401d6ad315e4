//! File and block-device backend. Requests are validated by [`FileQueue`];
//! Read/Write/Flush go to a per-queue [`FileEngine`] (io_uring or sync,
//! Firecracker-style), while WriteZeroes and Deallocate run synchronously in
//! the queue (`fallocate` for files, `BLKZEROOUT` / `BLKDISCARD` for block
//! devices). `O_DIRECT` is used when possible and falls back to buffered I/O
//! with a warning where the filesystem refuses it.

mod sync_engine;
mod sys;
mod uring;

use rustix::fs::FallocateFlags;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::io::{fail, valid_block_size, validate_request};
use crate::{
    AlignedBuf, Backend, BackendError, BackendQueue, Geometry, IoCompletion, IoOp, IoRequest,
};
use sync_engine::SyncEngine;
use uring::UringEngine;

pub use uring::{BACKLOG_MAX, RING_ENTRIES};

/// Block size of regular files on filesystems with blocks this large or
/// larger, when none is requested (the largest LBA size offered).
pub const FILE_DEFAULT_BLOCK_SIZE_BYTES: u32 = 4096;

/// Which I/O engine file queues use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// io_uring when available, otherwise sync (with a warning).
    #[default]
    Auto,
    IoUring,
    Sync,
}

/// Options for [`FileBackend::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOptions {
    /// Try `O_DIRECT` (falls back to buffered where unsupported). Default true.
    pub direct: bool,
    /// Exported block size (512 or 4096). Regular files default to their
    /// filesystem's block size ([`FILE_DEFAULT_BLOCK_SIZE_BYTES`] where that
    /// is as large, else 512), block devices to their logical block size.
    pub block_size_bytes: Option<u32>,
    /// Create the file if missing and extend it to at least this size.
    pub create_size_bytes: Option<u64>,
    pub engine: EngineKind,
    /// Open read-only; writes fail with [`BackendError::ReadOnly`].
    pub read_only: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            direct: true,
            block_size_bytes: None,
            create_size_bytes: None,
            engine: EngineKind::Auto,
            read_only: false,
        }
    }
}

/// Per-queue I/O engine for Read, Write and Flush on one file descriptor.
pub(crate) trait FileEngine: Send + std::fmt::Debug {
    fn kind(&self) -> EngineKind;
    /// Accepts a validated Read, Write or Flush.
    fn submit(&mut self, req: IoRequest);
    fn poll(&mut self, out: &mut Vec<IoCompletion>);
    fn notify_fd(&self) -> Option<RawFd>;
    /// Makes `notify_fd` readable (completions produced outside the engine).
    fn signal(&self);
    fn in_flight(&self) -> usize;
}

/// A regular file or block device exported as a namespace.
#[derive(Debug)]
pub struct FileBackend {
    path: PathBuf,
    file: Arc<File>,
    /// The geometry at open; the size may grow since (`size_bytes`).
    geometry: Geometry,
    /// Capacity now, shared with every queue (bounds checks): starts at
    /// `geometry.size_bytes` and grows when [`Backend::revalidate`] finds
    /// the file or device larger. Never shrinks.
    size_bytes: Arc<AtomicU64>,
    is_block_device: bool,
    direct: bool,
    read_only: bool,
    engine: EngineKind,
}

fn open_file(path: &Path, options: &FileOptions, direct: bool) -> io::Result<File> {
    let mut open = OpenOptions::new();
    open.read(true).write(!options.read_only);
    if options.create_size_bytes.is_some() && !options.read_only {
        open.create(true);
    }
    open.custom_flags(if direct { libc::O_DIRECT } else { 0 });
    open.open(path)
}

/// The LBA size of a regular file: the one asked for, else the file's
/// filesystem block size (`st_blksize`) where that is 4096 or more (Linux
/// nvmet does the same), else 512. See [`warn_sub_block_direct`].
fn file_block_size(asked: Option<u32>, fs_block_bytes: u64) -> u32 {
    asked.unwrap_or(
        if fs_block_bytes >= u64::from(FILE_DEFAULT_BLOCK_SIZE_BYTES) {
            FILE_DEFAULT_BLOCK_SIZE_BYTES
        } else {
            512
        },
    )
}

/// A direct write that covers part of a filesystem block is serialized by
/// the filesystem: ext4 and XFS take the file's lock exclusively for it and
/// wait until no other direct I/O to the file is in flight, so one such
/// write stops every queue's I/O to the file. An explicit block size that
/// allows them is kept, with this warning (docs/target.md, *File
/// namespaces*).
fn warn_sub_block_direct(path: &Path, block_size_bytes: u32, fs_block_bytes: u64) {
    if u64::from(block_size_bytes) < fs_block_bytes.min(u64::from(FILE_DEFAULT_BLOCK_SIZE_BYTES)) {
        tracing::warn!(
            path = %path.display(),
            block_size = block_size_bytes,
            fs_block_bytes,
            "block_size is smaller than the filesystem's block: each direct write of part of a \
             filesystem block waits until no other direct I/O to the file is in flight; leave \
             block_size out (the file's own) or set direct = false"
        );
    }
}

/// Checks that an `O_DIRECT` read of one block works (some filesystems accept
/// the flag at open but fail I/O with EINVAL).
fn direct_io_works(file: &File, block_size_bytes: u32, size_bytes: u64) -> bool {
    use std::os::unix::fs::FileExt;
    if size_bytes < u64::from(block_size_bytes) {
        return true;
    }
    let mut buf = AlignedBuf::new(block_size_bytes as usize);
    !matches!(file.read_at(buf.as_mut_slice(), 0), Err(e) if e.raw_os_error() == Some(libc::EINVAL))
}

impl FileBackend {
    /// Opens (or creates) a file or block device. See [`FileOptions`].
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> Result<Self, BackendError> {
        let path = path.as_ref();
        if options.read_only && options.create_size_bytes.is_some() {
            return Err(BackendError::config(
                "create_size_bytes",
                "cannot create a read-only backend",
            ));
        }
        if let Some(bs) = options.block_size_bytes {
            if !valid_block_size(bs) {
                return Err(BackendError::config(
                    "block_size_bytes",
                    format!("{bs} is not 512 or 4096"),
                ));
            }
        }
        let mut direct = options.direct;
        let mut file = match open_file(path, &options, direct) {
            Err(err) if direct && err.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %path.display(), "O_DIRECT not supported; falling back to buffered I/O");
                direct = false;
                open_file(path, &options, false)?
            }
            other => other?,
        };
        let meta = file.metadata()?;
        let is_block_device = meta.file_type().is_block_device();
        let (raw_size_bytes, block_size_bytes) = if is_block_device {
            let logical = sys::blk_logical_block_bytes(&file)?;
            let bs = options.block_size_bytes.unwrap_or(logical.max(512));
            if !valid_block_size(bs) || bs < logical || !bs.is_multiple_of(logical) {
                return Err(BackendError::config(
                    "block_size_bytes",
                    format!("{bs} incompatible with device logical block size {logical}"),
                ));
            }
            (sys::blk_size_bytes(&file)?, bs)
        } else if meta.file_type().is_file() {
            let mut size = meta.len();
            if let Some(want) = options.create_size_bytes {
                if size < want {
                    file.set_len(want)?;
                    size = want;
                }
            }
            (
                size,
                file_block_size(options.block_size_bytes, meta.blksize()),
            )
        } else {
            return Err(BackendError::config(
                "path",
                format!("{} is neither a file nor a block device", path.display()),
            ));
        };
        let size_bytes = raw_size_bytes - raw_size_bytes % u64::from(block_size_bytes);
        if size_bytes != raw_size_bytes {
            tracing::warn!(
                raw_size_bytes,
                size_bytes,
                "size not a multiple of the block size; tail ignored"
            );
        }
        if size_bytes == 0 {
            return Err(BackendError::config(
                "path",
                format!("{} is smaller than one block", path.display()),
            ));
        }
        if direct && !direct_io_works(&file, block_size_bytes, size_bytes) {
            tracing::warn!(path = %path.display(), "O_DIRECT I/O failed with EINVAL; falling back to buffered I/O");
            direct = false;
            file = open_file(path, &options, false)?;
        }
        if direct && !is_block_device {
            warn_sub_block_direct(path, block_size_bytes, meta.blksize());
        }
        if options.block_size_bytes.is_none() {
            // Said at every start: a namespace formatted under another block
            // size (512 was the config's default until 2026-12-07) needs it
            // set to read as before.
            tracing::info!(
                path = %path.display(),
                block_size = block_size_bytes,
                "block_size not set: exporting the file's own block size"
            );
        }
        let engine = match options.engine {
            EngineKind::Sync => EngineKind::Sync,
            EngineKind::IoUring => {
                uring::probe()?;
                EngineKind::IoUring
            }
            EngineKind::Auto => match uring::probe() {
                Ok(()) => EngineKind::IoUring,
                Err(err) => {
                    tracing::warn!(%err, "io_uring unavailable; using the sync file engine");
                    EngineKind::Sync
                }
            },
        };
        let geometry = Geometry {
            size_bytes,
            block_size_bytes,
            volatile_write_cache: true,
            supports_deallocate: !is_block_device || sys::blk_supports_discard(meta.rdev()),
            deallocated_reads_zero: !is_block_device,
        };
        Ok(Self {
            path: path.to_path_buf(),
            file: Arc::new(file),
            geometry,
            size_bytes: Arc::new(AtomicU64::new(size_bytes)),
            is_block_device,
            direct,
            read_only: options.read_only,
            engine,
        })
    }

    /// Whether `O_DIRECT` is in effect (false after a fallback).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The engine queues use (never `Auto`).
    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Backend for FileBackend {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Reads the file's length or the device's size again and takes in
    /// growth, in whole blocks. A file or device found smaller than the
    /// namespace keeps the namespace's size (I/O past its end fails) and is
    /// logged.
    fn revalidate(&self) -> Result<u64, BackendError> {
        let raw_size_bytes = if self.is_block_device {
            sys::blk_size_bytes(&self.file)?
        } else {
            self.file.metadata()?.len()
        };
        let found = raw_size_bytes - raw_size_bytes % u64::from(self.geometry.block_size_bytes);
        let before = self.size_bytes.fetch_max(found, Ordering::AcqRel);
        if found < before {
            tracing::warn!(
                path = %self.path.display(),
                size_bytes = before,
                found_bytes = found,
                "the file or device is smaller than its namespace; the namespace keeps its size and I/O past the end fails"
            );
        }
        Ok(found.max(before))
    }

    /// Extends a regular file (never a device, never shrinking it).
    fn extend(&self, size_bytes: u64) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::ReadOnly);
        }
        if self.is_block_device {
            return Err(BackendError::config(
                "create_size_bytes",
                "a block device's size is the device's",
            ));
        }
        if self.file.metadata()?.len() < size_bytes {
            self.file.set_len(size_bytes)?;
        }
        Ok(())
    }

    fn kind(&self) -> &'static str {
        if self.is_block_device {
            "block"
        } else {
            "file"
        }
    }

    /// Yes: `read_exact_at` and the io_uring engine (which resubmits short
    /// reads) fill the buffer or fail.
    fn fills_reads(&self) -> bool {
        true
    }

    fn open_queue(&self) -> Result<Box<dyn BackendQueue>, BackendError> {
        let engine: Box<dyn FileEngine> = match self.engine {
            EngineKind::IoUring => Box::new(UringEngine::new(Arc::clone(&self.file))?),
            EngineKind::Sync | EngineKind::Auto => {
                Box::new(SyncEngine::new(Arc::clone(&self.file)))
            }
        };
        Ok(Box::new(FileQueue {
            file: Arc::clone(&self.file),
            geometry: self.geometry,
            size_bytes: Arc::clone(&self.size_bytes),
            is_block_device: self.is_block_device,
            read_only: self.read_only,
            engine,
            ready: VecDeque::new(),
        }))
    }
}

/// Queue on a [`FileBackend`].
#[derive(Debug)]
pub struct FileQueue {
    file: Arc<File>,
    /// The backend's geometry at open; `size_bytes` is the size now.
    geometry: Geometry,
    size_bytes: Arc<AtomicU64>,
    is_block_device: bool,
    read_only: bool,
    engine: Box<dyn FileEngine>,
    /// Completions produced by the queue itself (errors, range ops).
    ready: VecDeque<IoCompletion>,
}

impl FileQueue {
    /// Which engine this queue runs on.
    pub fn engine_kind(&self) -> EngineKind {
        self.engine.kind()
    }

    fn zero_range(&self, offset_bytes: u64, len_bytes: u64, deallocate: bool) -> io::Result<()> {
        let file = &*self.file;
        if self.is_block_device {
            return match sys::blk_zeroout(file, offset_bytes, len_bytes) {
                Err(e) if sys::is_unsupported(&e) => {
                    sys::write_zeroes(file, offset_bytes, len_bytes)
                }
                other => other,
            };
        }
        let keep = FallocateFlags::KEEP_SIZE;
        if deallocate {
            match sys::fallocate(
                file,
                FallocateFlags::PUNCH_HOLE | keep,
                offset_bytes,
                len_bytes,
            ) {
                Err(e) if sys::is_unsupported(&e) => {}
                other => return other,
            }
        }
        match sys::fallocate(
            file,
            FallocateFlags::ZERO_RANGE | keep,
            offset_bytes,
            len_bytes,
        ) {
            Err(e) if sys::is_unsupported(&e) => sys::write_zeroes(file, offset_bytes, len_bytes),
            other => other,
        }
    }

    fn range_op(&self, op: IoOp, offset_bytes: u64, len_bytes: u64) -> Result<(), BackendError> {
        if len_bytes == 0 {
            return Ok(());
        }
        let to_fault = |source| BackendError::WriteFault {
            offset_bytes,
            source,
        };
        match op {
            IoOp::WriteZeroes { deallocate, fua } => {
                self.zero_range(offset_bytes, len_bytes, deallocate)
                    .map_err(to_fault)?;
                if fua {
                    self.file.sync_data().map_err(to_fault)?;
                }
                Ok(())
            }
            IoOp::Deallocate if self.is_block_device => {
                match sys::blk_discard(&self.file, offset_bytes, len_bytes) {
                    // Deallocate is advisory on devices (deallocated_reads_zero = false).
                    Err(e) if sys::is_unsupported(&e) => Ok(()),
                    other => other.map_err(BackendError::Io),
                }
            }
            IoOp::Deallocate => self
                .zero_range(offset_bytes, len_bytes, true)
                .map_err(to_fault),
            IoOp::Read | IoOp::Write { .. } | IoOp::Flush => {
                Err(BackendError::Unsupported("not a range op"))
            }
        }
    }

    fn complete_here(&mut self, completion: IoCompletion) {
        self.ready.push_back(completion);
        self.engine.signal();
    }
}

impl BackendQueue for FileQueue {
    fn submit(&mut self, req: IoRequest, _now: Instant) {
        let geometry = Geometry {
            size_bytes: self.size_bytes.load(Ordering::Acquire),
            ..self.geometry
        };
        if let Err(err) = validate_request(&geometry, &req) {
            return self.complete_here(fail(req, err));
        }
        let writes = !matches!(req.op, IoOp::Read | IoOp::Flush);
        if writes && self.read_only {
            return self.complete_here(fail(req, BackendError::ReadOnly));
        }
        match req.op {
            IoOp::Read | IoOp::Write { .. } | IoOp::Flush => self.engine.submit(req),
            IoOp::WriteZeroes { .. } | IoOp::Deallocate => {
                let result = self.range_op(req.op, req.offset_bytes, req.len_bytes);
                self.complete_here(IoCompletion::new(req.tag, result, req.buf));
            }
        }
    }

    fn poll_completions(&mut self, _now: Instant, out: &mut Vec<IoCompletion>) {
        out.extend(self.ready.drain(..));
        self.engine.poll(out);
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn notify_fd(&self) -> Option<RawFd> {
        self.engine.notify_fd()
    }

    fn in_flight(&self) -> usize {
        self.ready.len() + self.engine.in_flight()
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
pub(crate) mod tests;
