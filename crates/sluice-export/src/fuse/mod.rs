//! The namespace as one regular file in a FUSE filesystem, served by one
//! of two sessions: fuser's (this file; mounted through `fusermount3`),
//! or our own over the kernel's FUSE-over-io_uring ([`uring`]; root). Both
//! answer with the same rules ([`ops`]); [`abi`] is the kernel ABI our
//! session decodes and encodes.
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

pub mod abi;
pub mod ops;
pub mod uring;

pub use fuser::BackgroundSession;

use crate::account::{CpuAccountant, ExportAccount};
use crate::blockio::{BlockDevice, ByteDevice};
use crate::errno::EIO;
use fuser::consts::FOPEN_DIRECT_IO;
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow,
};
use ops::{FileRules, FILE_INO, ROOT_INO};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::{debug, warn};

const ATTR_TTL: Duration = Duration::from_secs(ops::ATTR_TTL_S);
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
    rules: FileRules,
    started: SystemTime,
}

/// errno values as fuser wants them.
fn neg(errno: u32) -> i32 {
    // errno values are small positive numbers (below 4096).
    i32::try_from(errno).unwrap_or(libc::EIO)
}

impl<D: BlockDevice> SluiceFs<D> {
    pub fn new(dev: Arc<ByteDevice<D>>, rt: tokio::runtime::Handle, cfg: FuseConfig) -> Self {
        let started = SystemTime::now();
        let rules = rules_for(&dev, &cfg, started);
        SluiceFs {
            dev,
            rt,
            cfg,
            acct: None,
            rules,
            started,
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
        let a = self.rules.attr(ino);
        let kind = if ino == ROOT_INO {
            FileType::Directory
        } else {
            FileType::RegularFile
        };
        FileAttr {
            ino,
            size: a.size,
            blocks: a.blocks,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            // The permission bits only (the mode's low 12 bits fit u16).
            perm: u16::try_from(a.mode & 0o7777).unwrap_or(0),
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: 0,
            blksize: a.blksize,
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
        // Mode, owner and times are not stored; the attributes stay fixed.
        match self.rules.setattr(ino, size) {
            Ok(()) => reply.attr(&ATTR_TTL, &self.attr(ino)),
            Err(e) => reply.error(neg(e)),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        match self.rules.open(ino, flags) {
            Ok(()) => reply.opened(0, FOPEN_DIRECT_IO),
            Err(e) => reply.error(neg(e)),
        }
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
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let len = match self.rules.read_range(ino, offset, size) {
            Ok((_, 0)) => return reply.data(&[]),
            Ok((_, len)) => len,
            Err(e) => return reply.error(neg(e)),
        };
        self.wait_unthrottled();
        let dev = self.dev.clone();
        let export = self.export();
        self.rt.spawn(async move {
            let r = dev.read(offset, len).await;
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
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let n = match self.rules.write_len(ino, offset, data.len()) {
            Ok(n) => n,
            Err(e) => return reply.error(neg(e)),
        };
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
        let (Ok(offset), Ok(length)) = (u64::try_from(offset), u64::try_from(length)) else {
            return reply.error(libc::EINVAL);
        };
        let (offset, len) = match self.rules.fallocate(ino, offset, length, mode) {
            Ok(Some(range)) => range,
            Ok(None) => return reply.ok(),
            Err(e) => return reply.error(neg(e)),
        };
        self.wait_unthrottled();
        let dev = self.dev.clone();
        let export = self.export();
        self.rt.spawn(async move {
            let r = dev.write_zeroes(offset, len, false).await;
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
        // The offset of an entry is the index of the next one (1-based).
        let offset = u64::try_from(offset).unwrap_or(0);
        for (ino, next, _, name) in self.rules.dir_entries(offset) {
            let kind = if ino == ROOT_INO {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            let next = i64::try_from(next).unwrap_or(i64::MAX);
            if reply.add(ino, next, kind, OsStr::from_bytes(name)) {
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

/// The file's rules for `dev` as `cfg` exports it.
fn rules_for<D: BlockDevice>(
    dev: &Arc<ByteDevice<D>>,
    cfg: &FuseConfig,
    started: SystemTime,
) -> FileRules {
    FileRules {
        file_name: cfg.file_name.clone(),
        read_only: cfg.read_only,
        size_source: {
            let dev = Arc::clone(dev);
            Arc::new(move || dev.size_bytes())
        },
        block_size_bytes: dev.block_size_bytes(),
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
        time_s: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
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
