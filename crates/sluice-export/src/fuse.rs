//! The namespace as one regular file in a FUSE filesystem (`fuser`, mounted
//! through `fusermount3`).
//!
//! Inode 1 is the root directory, inode 2 the file. Files are opened with
//! `FOPEN_DIRECT_IO` (no page cache: every read/write reaches the
//! namespace). Requests are dispatched by fuser's session thread and run as
//! tokio tasks, so the kernel can keep several in flight; the reply is sent
//! from the task. Sub-block I/O goes through [`ByteDevice`]'s
//! read-modify-write. fsync and flush (close) issue an NVMe Flush;
//! fallocate PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE zero the range (Write
//! Zeroes for whole blocks). The size is fixed: truncation to another size
//! is refused with `EPERM`, a write starting at or past the end gets
//! `ENOSPC` and one crossing the end is shortened.
//!
//! With [`SluiceFs::with_accounting`] the export is a tenant of a
//! [`CpuAccountant`] (see [`crate::account`]): the session thread registers
//! as a shared thread when it serves `FUSE_INIT`, every request that reaches
//! the namespace is recorded, and while the export is throttled the session
//! thread blocks before dispatching a read, write or fallocate, so it stops
//! taking requests from `/dev/fuse` and the kernel's queue holds the
//! application.

use crate::account::{CpuAccountant, ExportAccount};
use crate::blockio::{BlockDevice, ByteDevice};
use crate::errno::EIO;
use fuser::consts::FOPEN_DIRECT_IO;
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow,
};
use sluice_runtime::cast::usize_from;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::{debug, warn};

const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
const ATTR_TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel is asked to send in one request.
pub const FUSE_MAX_WRITE_BYTES: u32 = 1 << 20;
/// Background requests (asynchronous direct I/O among them) the kernel
/// may keep in flight.
pub const FUSE_BACKGROUND_MAX: u16 = 128;

/// Settings of the FUSE export.
#[derive(Debug, Clone)]
pub struct FuseConfig {
    pub file_name: String,
    pub read_only: bool,
    pub hostnqn: String,
}

/// CPU accounting of the export: the accountant the session thread
/// registers with, and the export's account (counters, throttle).
#[derive(Debug, Clone)]
pub struct FuseAccounting {
    pub accountant: Arc<CpuAccountant>,
    pub export: Arc<ExportAccount>,
}

/// The filesystem.
#[derive(Debug)]
pub struct SluiceFs<D> {
    dev: Arc<ByteDevice<D>>,
    rt: tokio::runtime::Handle,
    cfg: FuseConfig,
    acct: Option<FuseAccounting>,
    uid: u32,
    gid: u32,
    started: SystemTime,
}

/// errno values as fuser wants them.
fn neg(errno: u32) -> i32 {
    // errno values are small positive numbers (below 4096).
    i32::try_from(errno).unwrap_or(libc::EIO)
}

impl<D: BlockDevice> SluiceFs<D> {
    pub fn new(dev: Arc<ByteDevice<D>>, rt: tokio::runtime::Handle, cfg: FuseConfig) -> Self {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        SluiceFs {
            dev,
            rt,
            cfg,
            acct: None,
            uid,
            gid,
            started: SystemTime::now(),
        }
    }

    /// Accounts the export's CPU and throttles it (see the module docs).
    pub fn with_accounting(mut self, acct: FuseAccounting) -> Self {
        self.acct = Some(acct);
        self
    }

    /// Waits while the export is throttled (called on the session thread
    /// before a read, write or fallocate is dispatched).
    fn wait_unthrottled(&self) {
        if let Some(a) = &self.acct {
            a.export.block_while_throttled();
        }
    }

    /// The account to record a completed request on.
    fn export(&self) -> Option<Arc<ExportAccount>> {
        self.acct.as_ref().map(|a| a.export.clone())
    }

    /// Mount options used by [`crate::fuse::mount`].
    pub fn mount_options(&self) -> Vec<MountOption> {
        let mut o = vec![
            MountOption::FSName("sluice".into()),
            MountOption::Subtype("sluice".into()),
            MountOption::DefaultPermissions,
            MountOption::NoAtime,
        ];
        if self.cfg.read_only {
            o.push(MountOption::RO);
        }
        o
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT_INO {
            (FileType::Directory, 0o755, 0, 2)
        } else {
            let perm = if self.cfg.read_only { 0o444 } else { 0o644 };
            (FileType::RegularFile, perm, self.dev.size_bytes(), 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.dev.block_size_bytes().max(4096),
            flags: 0,
        }
    }
}

impl<D: BlockDevice> Filesystem for SluiceFs<D> {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // FUSE_INIT is the first request the session thread serves.
        if let Some(a) = &self.acct {
            a.accountant.register_current_thread();
        }
        if let Err(n) = config.set_max_write(FUSE_MAX_WRITE_BYTES) {
            let _ = config.set_max_write(n);
        }
        // Asynchronous direct I/O: without it the kernel waits for each
        // O_DIRECT request before it sends the next one of the same
        // submitter, so an application's queue depth never reaches us.
        if config
            .add_capabilities(fuser::consts::FUSE_ASYNC_DIO)
            .is_err()
        {
            debug!("the kernel offers no asynchronous direct I/O");
        }
        // Requests the kernel keeps in flight in the background (async
        // direct I/O, readahead); 12 by default.
        let _ = config.set_max_background(FUSE_BACKGROUND_MAX);
        let _ = config.set_congestion_threshold(FUSE_BACKGROUND_MAX * 3 / 4);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT_INO && name == OsStr::new(&self.cfg.file_name) {
            reply.entry(&ATTR_TTL, &self.attr(FILE_INO), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match ino {
            ROOT_INO | FILE_INO => reply.attr(&ATTR_TTL, &self.attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if ino != ROOT_INO && ino != FILE_INO {
            return reply.error(libc::ENOENT);
        }
        if let Some(s) = size {
            if ino != FILE_INO || s != self.dev.size_bytes() {
                return reply.error(libc::EPERM);
            }
        }
        // Mode, owner and times are not stored; the attributes stay fixed.
        reply.attr(&ATTR_TTL, &self.attr(ino));
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        if self.cfg.read_only && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(libc::EROFS);
        }
        if flags & libc::O_TRUNC != 0 && self.dev.size_bytes() != 0 {
            return reply.error(libc::EPERM);
        }
        reply.opened(0, FOPEN_DIRECT_IO);
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let end = offset
            .saturating_add(size as u64)
            .min(self.dev.size_bytes());
        if offset >= end {
            return reply.data(&[]);
        }
        self.wait_unthrottled();
        let dev = self.dev.clone();
        let export = self.export();
        self.rt.spawn(async move {
            let r = dev.read(offset, usize_from(end - offset)).await;
            if let Some(a) = export {
                a.record(r.as_ref().map_or(0, |d| d.len() as u64));
            }
            match r {
                Ok(d) => reply.data(&d),
                Err(e) => {
                    warn!(offset, "fuse read failed: {e}");
                    reply.error(neg(e.errno()))
                }
            }
        });
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        if self.cfg.read_only {
            return reply.error(libc::EROFS);
        }
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let size = self.dev.size_bytes();
        if offset >= size && !data.is_empty() {
            return reply.error(libc::ENOSPC);
        }
        let n = data.len().min(usize_from(size - offset.min(size)));
        self.wait_unthrottled();
        let buf = data[..n].to_vec();
        let fua = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let dev = self.dev.clone();
        let export = self.export();
        self.rt.spawn(async move {
            let r = dev.write(offset, buf, fua).await;
            if let Some(a) = export {
                a.record(n as u64);
            }
            match r {
                // n <= data.len(), which the kernel bounds by max_write (u32).
                Ok(()) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
                Err(e) => {
                    warn!(offset, "fuse write failed: {e}");
                    reply.error(neg(e.errno()))
                }
            }
        });
    }

    fn flush(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        self.fsync_common(ino, reply);
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _ds: bool, reply: ReplyEmpty) {
        self.fsync_common(ino, reply);
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let (Ok(offset), Ok(length)) = (u64::try_from(offset), u64::try_from(length)) else {
            return reply.error(libc::EINVAL);
        };
        let size = self.dev.size_bytes();
        let end = offset.saturating_add(length);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let zero = libc::FALLOC_FL_ZERO_RANGE;
        if mode == 0 || mode == libc::FALLOC_FL_KEEP_SIZE {
            // Every byte of the namespace already exists.
            return if end <= size || mode == libc::FALLOC_FL_KEEP_SIZE {
                reply.ok()
            } else {
                reply.error(libc::EFBIG)
            };
        }
        if mode != punch && mode != zero && mode != zero | libc::FALLOC_FL_KEEP_SIZE {
            return reply.error(libc::EOPNOTSUPP);
        }
        if self.cfg.read_only {
            return reply.error(libc::EROFS);
        }
        let end = end.min(size);
        if offset >= end {
            return reply.ok();
        }
        self.wait_unthrottled();
        let dev = self.dev.clone();
        let export = self.export();
        self.rt.spawn(async move {
            let r = dev.write_zeroes(offset, end - offset, false).await;
            if let Some(a) = export {
                a.record(0);
            }
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(neg(e.errno())),
            }
        });
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT_INO {
            return reply.error(libc::ENOTDIR);
        }
        let entries = [
            (ROOT_INO, FileType::Directory, "."),
            (ROOT_INO, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, self.cfg.file_name.as_str()),
        ];
        // The offset of an entry is the index of the next one (1-based).
        let skip = usize::try_from(offset).unwrap_or(0);
        for (next, (ino, kind, name)) in (1i64..).zip(&entries).skip(skip) {
            if reply.add(*ino, next, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

impl<D: BlockDevice> SluiceFs<D> {
    fn fsync_common(&self, ino: u64, reply: ReplyEmpty) {
        if ino != FILE_INO || self.cfg.read_only {
            return reply.ok();
        }
        let dev = self.dev.clone();
        let export = self.export();
        self.rt.spawn(async move {
            let r = dev.flush().await;
            if let Some(a) = export {
                a.record(0);
            }
            match r {
                Ok(()) => reply.ok(),
                Err(e) => {
                    warn!("fuse flush failed: {e}");
                    reply.error(neg(if e.errno() == 0 { EIO } else { e.errno() }))
                }
            }
        });
    }
}

/// Mounts the filesystem at `mountpoint` in the background; dropping the
/// session unmounts it.
pub fn mount<D: BlockDevice>(
    fs: SluiceFs<D>,
    mountpoint: &std::path::Path,
) -> std::io::Result<fuser::BackgroundSession> {
    let opts = fs.mount_options();
    debug!(hostnqn = %fs.cfg.hostnqn, mountpoint = %mountpoint.display(), "mounting");
    fuser::spawn_mount2(fs, mountpoint, &opts)
}
