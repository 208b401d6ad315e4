//! A FUSE session of our own, served over the kernel's FUSE-over-io_uring
//! transport where the kernel offers it (Linux 6.14+, with the `fuse`
//! module's `enable_uring` parameter on), else over `/dev/fuse` reads.
//!
//! * **Mount**: `/dev/fuse` is opened and mounted with `mount(2)` (root
//!   only: fusermount3 cannot pass io_uring's setup through), and the
//!   `FUSE_INIT` request is answered here, asking for io_uring.
//! * **Ring thread**: one io_uring (128-byte SQEs) registers
//!   [`URING_QUEUE_DEPTH`] entries on every possible CPU's queue (the
//!   kernel routes a request to the queue of the CPU its caller runs on,
//!   and serves nothing until every queue has an entry). Each entry is a
//!   header buffer (`fuse_in_header`, the operation's fixed argument, the
//!   commit id) and a payload buffer (write data, names, reply bodies). A
//!   completion delivers one request into one entry; the reply is written
//!   back into the same buffers and committed with `COMMIT_AND_FETCH`,
//!   which also waits for the entry's next request. Block I/O runs as a
//!   tokio task; its result comes back to the ring thread through a
//!   channel and an eventfd the ring polls.
//! * **`/dev/fuse` thread**: FORGET and INTERRUPT never travel over the
//!   ring, and requests sent before the ring is ready arrive here too, so
//!   a thread keeps reading `/dev/fuse` for the whole session. Without
//!   io_uring it serves everything.
//!
//! Requests are decoded by [`super::abi`] and answered by
//! [`super::ops::FileRules`], the same rules as the fuser session.

use std::ffi::CString;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use futures_util::stream::{FuturesUnordered, StreamExt};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use sluice_runtime::notify::EventFd;
use tracing::{debug, info, warn};

use super::abi::{self, init, InHeader, InitReply, Request};
use super::ops::{BlockIo, FileRules, Outcome};
use super::{rules_for, FuseAccounting, FuseConfig, FUSE_BACKGROUND_MAX};
use crate::blockio::{BlockDevice, ByteDevice};
use crate::errno::{from_host_error, OpKind, EIO};
use crate::spare::SpareBuffers;
use sluice_host::core::{Completion, LentBuf};
use sluice_host::{DirectQueue, HostError, IoFlags, Namespace, RwBuilder};

/// Ring entries (requests in flight) per CPU queue. A request waits when
/// its CPU's queue has no free entry, so this bounds one application
/// thread's queue depth.
pub const URING_QUEUE_DEPTH: usize = 64;
/// Largest write (and read) the kernel sends in one request; each entry's
/// payload buffer is this big.
pub const URING_MAX_WRITE_BYTES: u32 = 256 << 10;
/// `struct fuse_uring_req_header`: in_out[128], op_in[128], ent_in_out[32].
const RING_HEADER_BYTES: usize = 288;
const OP_IN_AT: usize = 128;
const COMMIT_ID_AT: usize = 264;
const PAYLOAD_SZ_AT: usize = 272;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The ring's user_data for the eventfd poll (entries use their index).
const WAKE_TAG: u64 = u64::MAX;
/// The ring's user_data for the polls on the direct queue's socket: this
/// bit, the queue's generation shifted by one, and 1 for the write poll.
/// A poll left on a failed queue's socket completes with an old
/// generation and is ignored.
const DIRECT_TAG: u64 = 1 << 62;

/// How long dropping the session waits for its threads to end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// How the session's requests travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// FUSE-over-io_uring with this many queues (one per possible CPU).
    IoUring { queues: usize },
    /// `read`/`write` on `/dev/fuse` (the kernel did not offer io_uring).
    DevFuse,
}

/// What the session's I/O tasks share.
struct Shared<D> {
    dev: Arc<ByteDevice<D>>,
    rules: FileRules,
    rt: tokio::runtime::Handle,
    acct: Option<FuseAccounting>,
    fd: Arc<OwnedFd>,
    counts: Arc<RequestCounts>,
}

/// Requests served over each path: the export's own counters when the
/// session is accounted (so `/metrics` shows them), else the session's.
pub use crate::account::FuseRequestCounts as RequestCounts;

impl<D> Shared<D> {
    fn wait_unthrottled(&self) {
        if let Some(a) = &self.acct {
            a.export.block_while_throttled();
        }
    }
    fn register_thread(&self) {
        if let Some(a) = &self.acct {
            a.accountant.register_current_thread();
        }
    }
}

/// A mounted session; dropping it unmounts the filesystem.
#[derive(Debug)]
pub struct OwnSession {
    mountpoint: PathBuf,
    transport: Transport,
    counts: Arc<RequestCounts>,
    threads: Vec<std::thread::JoinHandle<()>>,
    mounted: bool,
}

impl OwnSession {
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Requests served so far over the ring and over `/dev/fuse`.
    pub fn requests(&self) -> (u64, u64) {
        (
            self.counts.ring.load(Ordering::Relaxed),
            self.counts.dev_fuse.load(Ordering::Relaxed),
        )
    }

    /// Block I/Os the ring thread ran on its own NVMe/TCP queue.
    pub fn direct_ios(&self) -> u64 {
        self.counts.direct.load(Ordering::Relaxed)
    }

    /// Of [`Self::direct_ios`], the reads received straight into the
    /// ring entry's payload buffer.
    pub fn reads_in_place(&self) -> u64 {
        self.counts.reads_in_place.load(Ordering::Relaxed)
    }

    /// Direct queues the ring got to replace a failed one.
    pub fn direct_queues_replaced(&self) -> u64 {
        self.counts.direct_replaced.load(Ordering::Relaxed)
    }

    /// Whether the session ended (unmounted from outside, or failed).
    pub fn is_finished(&self) -> bool {
        self.threads
            .iter()
            .any(std::thread::JoinHandle::is_finished)
    }
}

impl Drop for OwnSession {
    fn drop(&mut self) {
        if self.mounted {
            if let Err(e) = unmount(&self.mountpoint) {
                debug!(mountpoint = %self.mountpoint.display(), "unmount: {e}");
            }
        }
        // Unmounting ends the connection: the reader gets ENODEV and the
        // ring's entries complete with ENOTCONN.
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        while std::time::Instant::now() < deadline
            && !self
                .threads
                .iter()
                .all(std::thread::JoinHandle::is_finished)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for t in self.threads.drain(..) {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Mounts `dev` as one file at `mountpoint` with a session of our own,
/// over io_uring when `want_uring` and the kernel offers it. Called from
/// outside the runtime `rt` (it blocks on `rt` to open the ring's direct
/// queue).
pub fn mount<D: BlockDevice>(
    dev: Arc<ByteDevice<D>>,
    rt: tokio::runtime::Handle,
    cfg: &FuseConfig,
    acct: Option<FuseAccounting>,
    mountpoint: &Path,
    want_uring: bool,
) -> io::Result<OwnSession> {
    // The ring thread drives an NVMe/TCP queue of its own when the device
    // is one namespace and its controller grants a queue ID for it.
    let direct = match (want_uring, dev.device().namespace()) {
        (true, Some(ns)) => match rt.block_on(ns.controller().connect_direct_queue()) {
            Ok(q) => Some(Direct::new(q, ns)),
            Err(e) => {
                info!("the FUSE ring takes the task path for all I/O: {e}");
                None
            }
        },
        _ => None,
    };
    let rules = rules_for(&dev, cfg, SystemTime::now());
    let raw = rustix::fs::open(
        "/dev/fuse",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io::Error::other(format!("opening /dev/fuse: {e}")))?;
    let fd = Arc::new(raw);
    mount_fd(fd.as_raw_fd(), mountpoint, cfg.read_only)?;
    let counts = acct
        .as_ref()
        .map_or_else(Arc::default, |a| a.export.fuse.clone());
    let mut session = OwnSession {
        mountpoint: mountpoint.to_owned(),
        transport: Transport::DevFuse,
        counts: counts.clone(),
        threads: Vec::new(),
        mounted: true,
    };
    let shared = Arc::new(Shared {
        dev,
        rules,
        rt,
        acct,
        fd,
        counts,
    });
    let uring = answer_init(&shared.fd, want_uring)?;
    let s = shared.clone();
    session.threads.push(
        std::thread::Builder::new()
            .name("fuse-dev".into())
            .spawn(move || serve_dev_fuse(&s))?,
    );
    let mut uring_direct = false;
    if uring {
        let queues = possible_cpus()?;
        let has_direct = direct.is_some();
        let wake = Arc::new(Doorbell {
            efd: EventFd::new()?,
            rung: AtomicBool::new(false),
        });
        let ns = shared.dev.device().namespace().cloned();
        let mut ring = Ring::new(shared.clone(), queues, wake, direct, ns)?;
        // The ring thread registers the entries itself: the kernel
        // delivers a request into an entry in task work of the thread that
        // submitted the entry's SQE, so that must be the thread that keeps
        // waiting on the ring (were it this one, the first request from
        // this thread would wait for itself).
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        session.threads.push(
            std::thread::Builder::new()
                .name("fuse-uring".into())
                .spawn(move || {
                    let r = ring.register_all();
                    let ok = r.is_ok();
                    let _ = ready_tx.send(r);
                    if ok {
                        ring.run();
                    }
                })?,
        );
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("the FUSE ring thread ended before registering"))?
            .map_err(|e| io::Error::new(e.kind(), format!("registering FUSE ring entries: {e}")))?;
        session.transport = Transport::IoUring { queues };
        uring_direct = has_direct;
    }
    info!(mountpoint = %mountpoint.display(), transport = ?session.transport, direct_queue = uring_direct, "FUSE session of our own mounted");
    Ok(session)
}

fn cstring(s: &[u8], what: &str) -> io::Result<CString> {
    CString::new(s)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} contains NUL")))
}

fn mount_fd(fd: RawFd, mountpoint: &Path, read_only: bool) -> io::Result<()> {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let data = format!("fd={fd},rootmode=40000,user_id={uid},group_id={gid},default_permissions");
    let target = cstring(mountpoint.as_os_str().as_bytes(), "the mountpoint")?;
    let data = cstring(data.as_bytes(), "mount data")?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            c"sluice".as_ptr(),
            target.as_ptr(),
            c"fuse.sluice".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "mount(2) of a FUSE filesystem on {} (the io_uring session needs root): {e}",
                mountpoint.display()
            ),
        ));
    }
    Ok(())
}

fn unmount(mountpoint: &Path) -> io::Result<()> {
    let target = cstring(mountpoint.as_os_str().as_bytes(), "the mountpoint")?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPUs the kernel may ever run on (`num_possible_cpus`): the ring needs
/// a queue for each.
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(s.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/sys/devices/system/cpu/possible: cannot parse {s:?}"),
        )
    })
}

/// The highest CPU in a list such as `0-3,8` plus one.
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut max = None;
    for part in s.split(',') {
        let last = part.rsplit('-').next()?;
        let n: usize = last.trim().parse().ok()?;
        max = Some(max.map_or(n, |m: usize| m.max(n)));
    }
    max.map(|m| m + 1).filter(|&n| n <= 8192)
}

/// Reads `FUSE_INIT` and answers it; returns whether io_uring was agreed.
fn answer_init(fd: &OwnedFd, want_uring: bool) -> io::Result<bool> {
    let mut buf = vec![0u8; abi::MIN_READ_BUFFER_BYTES + URING_MAX_WRITE_BYTES as usize];
    let n = loop {
        match rustix::io::read(fd, &mut buf) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::other(format!("reading FUSE_INIT: {e}"))),
        }
    };
    let (h, r) = Request::parse_message(&buf[..n])
        .map_err(|e| io::Error::other(format!("FUSE_INIT: {e}")))?;
    let Request::Init {
        major,
        minor,
        max_readahead,
        flags,
    } = r
    else {
        return Err(io::Error::other(format!(
            "the first FUSE request is opcode {}, not INIT",
            h.opcode
        )));
    };
    if major != abi::KERNEL_VERSION {
        write_reply(fd, h.unique, -libc::EPROTO, &[]);
        return Err(io::Error::other(format!(
            "the kernel speaks FUSE {major}.{minor}; this session speaks 7.x"
        )));
    }
    let offered_uring = flags & init::OVER_IO_URING != 0;
    let uring = want_uring && offered_uring;
    if want_uring && !offered_uring {
        warn!(
            "the kernel does not offer FUSE-over-io_uring (FUSE 7.{minor}; it needs 7.42+ and /sys/module/fuse/parameters/enable_uring = Y): serving /dev/fuse"
        );
    }
    let mut ours = init::ASYNC_READ
        | init::BIG_WRITES
        | init::ASYNC_DIO
        | init::PARALLEL_DIROPS
        | init::MAX_PAGES
        | init::INIT_EXT;
    if uring {
        ours |= init::OVER_IO_URING;
    }
    let reply = InitReply {
        minor: minor.min(abi::KERNEL_MINOR_VERSION),
        max_readahead,
        flags: flags & ours,
        max_background: FUSE_BACKGROUND_MAX,
        congestion_threshold: FUSE_BACKGROUND_MAX * 3 / 4,
        max_write: URING_MAX_WRITE_BYTES,
        max_pages: u16::try_from(URING_MAX_WRITE_BYTES / 4096).unwrap_or(u16::MAX),
    };
    write_reply(fd, h.unique, 0, &abi::init_out(&reply));
    Ok(uring)
}

/// Writes one reply to `/dev/fuse`. The kernel rejects a reply to a
/// request it no longer waits for (ENOENT, after an interrupt or abort):
/// nothing to do then.
fn write_reply(fd: &OwnedFd, unique: u64, error: i32, body: &[u8]) {
    let h = abi::out_header(unique, error, body.len());
    let iov = [io::IoSlice::new(&h), io::IoSlice::new(body)];
    if let Err(e) = rustix::io::writev(fd, &iov) {
        debug!(unique, "FUSE reply not taken: {e}");
    }
}

fn neg(errno: u32) -> i32 {
    -i32::try_from(errno).unwrap_or(libc::EIO)
}

/// Runs `io` against the device: the reply body, or an errno.
async fn run_io<D: BlockDevice>(s: &Shared<D>, io: BlockIo) -> Result<Vec<u8>, u32> {
    let (bytes, r) = match io {
        BlockIo::Read { offset, len } => (len as u64, s.dev.read(offset, len).await),
        BlockIo::Write { offset, data, fua } => {
            let n = data.len();
            let r = s.dev.write(offset, data, fua).await;
            // n <= max_write, a u32.
            (
                n as u64,
                r.map(|()| abi::write_out(u32::try_from(n).unwrap_or(u32::MAX))),
            )
        }
        BlockIo::Flush => (0, s.dev.flush().await.map(|()| Vec::new())),
        BlockIo::Zero { offset, len } => (
            0,
            s.dev
                .write_zeroes(offset, len, false)
                .await
                .map(|()| Vec::new()),
        ),
    };
    if let Some(a) = &s.acct {
        a.export.record(if r.is_ok() { bytes } else { 0 });
    }
    r.map_err(|e| {
        warn!("FUSE block I/O failed: {e}");
        if e.errno() == 0 {
            EIO
        } else {
            e.errno()
        }
    })
}

/// The `/dev/fuse` reader: every request that does not travel over the
/// ring (all of them without io_uring).
fn serve_dev_fuse<D: BlockDevice>(s: &Arc<Shared<D>>) {
    s.register_thread();
    let mut buf = vec![0u8; abi::MIN_READ_BUFFER_BYTES + URING_MAX_WRITE_BYTES as usize];
    loop {
        let n = match rustix::io::read(&*s.fd, &mut buf) {
            Ok(n) => n,
            // A request interrupted before we read it, or a signal.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {
                continue
            }
            // Unmounted, or the connection was aborted.
            Err(rustix::io::Errno::NODEV) => return,
            Err(e) => {
                warn!("reading /dev/fuse: {e}; the session ends");
                return;
            }
        };
        let (h, r) = match Request::parse_message(&buf[..n]) {
            Ok(x) => x,
            Err(e) => {
                warn!("undecodable FUSE request: {e}");
                if let Ok(h) = InHeader::parse(&buf[..n]) {
                    write_reply(&s.fd, h.unique, -libc::EIO, &[]);
                }
                continue;
            }
        };
        s.counts.dev_fuse.fetch_add(1, Ordering::Relaxed);
        match s.rules.handle(h.nodeid, &r) {
            Outcome::Reply(body) => write_reply(&s.fd, h.unique, 0, &body),
            Outcome::Error(e) => write_reply(&s.fd, h.unique, neg(e), &[]),
            Outcome::Silent => {}
            Outcome::Io(io) => {
                s.wait_unthrottled();
                let s2 = s.clone();
                s.rt.spawn(async move {
                    match run_io(&s2, io).await {
                        Ok(body) => write_reply(&s2.fd, h.unique, 0, &body),
                        Err(e) => write_reply(&s2.fd, h.unique, neg(e), &[]),
                    }
                });
            }
        }
        if matches!(r, Request::Destroy) {
            return;
        }
    }
}

/// One ring entry: its buffers (fixed for the entry's life: the kernel
/// holds their addresses) and the request it holds.
struct Entry {
    qid: u16,
    header: Box<[u8; RING_HEADER_BYTES]>,
    payload: Vec<u8>,
    iov: Box<Iovecs>,
    /// The commit id of the request the entry holds (0: none).
    commit_id: u64,
    live: bool,
}

/// An entry's header and payload, as REGISTER hands them to the kernel.
struct Iovecs([libc::iovec; 2]);

// SAFETY: the pointers point into the same entry's own boxed buffers,
// which move with it (their heap addresses do not change).
unsafe impl Send for Iovecs {}

/// A request's block I/O, polled by the ring thread: the entry and the
/// reply body or errno.
type IoFuture = Pin<Box<dyn Future<Output = (usize, Result<Vec<u8>, u32>)> + Send>>;

struct Ring<D> {
    shared: Arc<Shared<D>>,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// The run-to-completion path, while it works. Declared before
    /// `entries` so that it is dropped first: its reads land in entries'
    /// payload buffers (lent, see `submit_direct`).
    direct: Option<Direct>,
    entries: Vec<Entry>,
    /// Entries not ended (the thread ends with the last).
    live_entries: usize,
    wake: Arc<Doorbell>,
    /// Block I/O in flight; woken through the doorbell.
    pending: FuturesUnordered<IoFuture>,
    /// Whether polls on the direct queue's socket are armed: for reading,
    /// and for writing (only while it has bytes the socket did not take).
    direct_armed: (bool, bool),
    /// Which direct queue this is (its polls' tags carry it).
    direct_gen: u64,
    /// The namespace the direct queue belongs to: after a failure, a task
    /// asks its controller for a new queue (once it has reconnected) and
    /// sends it here.
    ns: Option<Namespace>,
    replacement: Option<mpsc::Receiver<Direct>>,
}

/// What an entry waits for on the direct queue.
#[derive(Debug)]
enum DirectIo {
    /// A read (kept whole: re-run on the task path if the queue fails);
    /// `in_place`: its data lands straight in the entry's payload buffer.
    Read {
        io: BlockIo,
        in_place: bool,
    },
    Write {
        lock_id: u64,
        len: usize,
    },
    Flush,
}

/// An NVMe/TCP I/O queue the ring thread drives itself (as the NBD
/// run-to-completion path does): aligned reads and writes of one command
/// and flushes go straight to it, with no task and no thread crossing;
/// everything else (sub-block I/O, zeroing, a write whose blocks an RMW
/// holds) takes the task path.
struct Direct {
    dq: DirectQueue,
    /// The namespace (its size now, for `rw` after it grew).
    ns: Namespace,
    rw: RwBuilder,
    block_bytes: u64,
    waiting: Vec<Option<DirectIo>>,
    done: Vec<(u64, Result<Completion, HostError>)>,
    /// Buffers back from completed reads and writes, for the next reads
    /// to fill and writes to copy their data into: a fresh 128 KiB buffer
    /// per I/O cost the ring thread page faults (the allocator handed the
    /// memory back and took it again); at most [`DIRECT_SPARE_BYTES_MAX`].
    spare: SpareBuffers<DIRECT_SPARE_BYTES_MAX>,
}

/// Bytes of I/O buffers the ring keeps for reuse, at most.
const DIRECT_SPARE_BYTES_MAX: usize = 8 << 20;

impl Direct {
    fn new(dq: DirectQueue, ns: &Namespace) -> Direct {
        Direct {
            dq,
            ns: ns.clone(),
            rw: ns.rw_builder(),
            block_bytes: u64::from(ns.block_size_bytes().max(1)),
            waiting: Vec::new(),
            done: Vec::new(),
            spare: SpareBuffers::default(),
        }
    }

    /// Takes in the namespace's size when it grew since `rw` was built
    /// (one atomic load when it did not).
    fn follow_size(&mut self) {
        if self.ns.size_blocks() != self.rw.size_blocks() {
            self.rw = self.ns.rw_builder();
        }
    }

    fn fits(&self, offset: u64, len: usize) -> bool {
        let len = len as u64;
        offset.is_multiple_of(self.block_bytes)
            && len.is_multiple_of(self.block_bytes)
            && len > 0
            && len <= self.rw.max_command_bytes()
            && self.dq.can_submit()
    }
}

/// Wakes the ring thread when block I/O it polls can make progress (the
/// futures' waker): an eventfd the ring polls, written only by the first
/// wake since the ring last looked (under load most cost no syscall).
struct Doorbell {
    efd: EventFd,
    rung: AtomicBool,
}

impl std::task::Wake for Doorbell {
    fn wake(self: Arc<Self>) {
        self.ring();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.ring();
    }
}

impl Doorbell {
    fn ring(&self) {
        if !self.rung.swap(true, Ordering::AcqRel) {
            self.efd.signal();
        }
    }
    /// Called before the ring drains the channel: a completion sent after
    /// this rings again.
    fn answer(&self) {
        self.efd.drain();
        self.rung.store(false, Ordering::Release);
    }
}

/// The 80-byte command area of a FUSE ring SQE (`struct
/// fuse_uring_cmd_req`: flags, commit_id, qid).
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

impl<D: BlockDevice> Ring<D> {
    fn new(
        shared: Arc<Shared<D>>,
        queues: usize,
        wake: Arc<Doorbell>,
        direct: Option<Direct>,
        ns: Option<Namespace>,
    ) -> io::Result<Ring<D>> {
        let total = queues * URING_QUEUE_DEPTH;
        let sq = u32::try_from((total + 8).next_power_of_two())
            .unwrap_or(4096)
            .min(4096);
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(sq * 2)
            .build(sq)
            .map_err(|e| io::Error::new(e.kind(), format!("creating the FUSE io_uring: {e}")))?;
        let payload_bytes = URING_MAX_WRITE_BYTES as usize;
        let mut entries = Vec::with_capacity(total);
        for q in 0..queues {
            for _ in 0..URING_QUEUE_DEPTH {
                let mut header = Box::new([0u8; RING_HEADER_BYTES]);
                let mut payload = vec![0u8; payload_bytes];
                let iov = Box::new(Iovecs([
                    libc::iovec {
                        iov_base: header.as_mut_ptr().cast(),
                        iov_len: RING_HEADER_BYTES,
                    },
                    libc::iovec {
                        iov_base: payload.as_mut_ptr().cast(),
                        iov_len: payload_bytes,
                    },
                ]));
                entries.push(Entry {
                    qid: u16::try_from(q).unwrap_or(u16::MAX),
                    header,
                    payload,
                    iov,
                    commit_id: 0,
                    live: true,
                });
            }
        }
        Ok(Ring {
            shared,
            ring,
            live_entries: entries.len(),
            entries,
            wake,
            pending: FuturesUnordered::new(),
            direct: direct.map(|mut d| {
                d.waiting = (0..total).map(|_| None).collect();
                d
            }),
            direct_armed: (false, false),
            direct_gen: 0,
            ns,
            replacement: None,
        })
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an SQE points at (the entries' iovecs
            // and buffers) lives as long as the ring.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn register_sqe(&self, i: usize) -> squeue::Entry128 {
        let e = &self.entries[i];
        let sqe = opcode::UringCmd80::new(types::Fd(self.shared.fd.as_raw_fd()), CMD_REGISTER)
            .cmd(cmd_req(0, e.qid))
            .addr(Some(e.iov.0.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        with_len(sqe, 2)
    }

    fn register_all(&mut self) -> io::Result<()> {
        for i in 0..self.entries.len() {
            let sqe = self.register_sqe(i);
            self.push(sqe)?;
        }
        self.arm_wake()?;
        self.ring.submit()?;
        Ok(())
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let poll = opcode::PollAdd::new(types::Fd(self.wake.efd.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE_TAG);
        self.push(poll.into())
    }

    fn run(mut self) {
        self.shared.register_thread();
        // The I/O futures create timers and reach the host's queues: they
        // need the runtime's context, though this thread polls them.
        let rt = self.shared.rt.clone();
        let _context = rt.enter();
        let waker = std::task::Waker::from(self.wake.clone());
        let mut cqes: Vec<(u64, i32)> = Vec::new();
        loop {
            let wait = match self.arm_direct() {
                Ok(w) => w,
                Err(e) => {
                    warn!("FUSE io_uring: {e}; the ring thread ends");
                    return;
                }
            };
            let r = match wait {
                Some(w) => {
                    let ts = types::Timespec::from(w.max(Duration::from_micros(1)));
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                }
                None => self.ring.submit_and_wait(1),
            };
            match r {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ETIME)) => {}
                Err(e) => {
                    warn!("FUSE io_uring: {e}; the ring thread ends");
                    return;
                }
            }
            cqes.clear();
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(tag, res) in &cqes {
                let r = if tag == WAKE_TAG {
                    self.wake.answer();
                    self.arm_wake()
                } else if tag & DIRECT_TAG != 0 {
                    if (tag & !DIRECT_TAG) >> 1 == self.direct_gen {
                        if tag & 1 == 0 {
                            self.direct_armed.0 = false;
                        } else {
                            self.direct_armed.1 = false;
                        }
                    }
                    Ok(())
                } else {
                    self.completed(usize::try_from(tag).unwrap_or(usize::MAX), res)
                };
                if let Err(e) = r {
                    warn!("FUSE io_uring: {e}; the ring thread ends");
                    return;
                }
            }
            self.take_replacement();
            if let Err(e) = self.drive_direct() {
                warn!("FUSE io_uring: {e}; the ring thread ends");
                return;
            }
            // Poll the I/O woken since (and any just started); commit
            // what finished.
            let mut cx = std::task::Context::from_waker(&waker);
            while let Poll::Ready(Some((i, r))) = self.pending.poll_next_unpin(&mut cx) {
                let unique = InHeader::parse(&self.entries[i].header[..]).map_or(0, |h| h.unique);
                if let Err(e) = self.commit(i, unique, r.as_deref().map_err(|e| *e)) {
                    warn!("FUSE io_uring: {e}; the ring thread ends");
                    return;
                }
            }
            if self.live_entries == 0 {
                debug!("every FUSE ring entry ended; the ring thread ends");
                return;
            }
        }
    }

    /// A REGISTER or COMMIT_AND_FETCH completed: a request was delivered
    /// into entry `i`, or the entry ended.
    fn completed(&mut self, i: usize, res: i32) -> io::Result<()> {
        if i >= self.entries.len() {
            return Ok(());
        }
        if res < 0 {
            match -res {
                libc::EAGAIN | libc::EINTR => {
                    // Not ready yet (INIT in flight): register again.
                    let sqe = self.register_sqe(i);
                    return self.push(sqe);
                }
                libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {}
                e => warn!(entry = i, "FUSE ring entry failed: errno {e}"),
            }
            if std::mem::replace(&mut self.entries[i].live, false) {
                self.live_entries -= 1;
            }
            return Ok(());
        }
        let e = &self.entries[i];
        let commit_id = u64::from_le_bytes(
            e.header[COMMIT_ID_AT..COMMIT_ID_AT + 8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        let payload_sz = u32::from_le_bytes(
            e.header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4]
                .try_into()
                .unwrap_or([0; 4]),
        );
        let h = match InHeader::parse(&e.header[..]) {
            Ok(h) => h,
            Err(err) => {
                warn!("undecodable FUSE ring header: {err}");
                return Ok(());
            }
        };
        self.entries[i].commit_id = commit_id;
        self.shared.counts.ring.fetch_add(1, Ordering::Relaxed);
        let e = &self.entries[i];
        let fixed = abi::fixed_arg_bytes(h.opcode).min(RING_HEADER_BYTES - OP_IN_AT - 32);
        let arg = &e.header[OP_IN_AT..OP_IN_AT + fixed];
        let rest = &e.payload[..(payload_sz as usize).min(e.payload.len())];
        let mut spare = self.direct.as_mut().map(|d| &mut d.spare);
        let mut copy = |data: &[u8]| match spare.as_deref_mut() {
            Some(s) => s.copy_of(data),
            None => data.to_vec(),
        };
        let outcome = match Request::parse(h.opcode, arg, rest) {
            Ok(r) => self.shared.rules.handle_with(h.nodeid, &r, &mut copy),
            Err(err) => {
                warn!("undecodable FUSE request: {err}");
                Outcome::Error(EIO)
            }
        };
        match outcome {
            Outcome::Reply(body) => self.commit(i, h.unique, Ok(&body)),
            Outcome::Error(e) => self.commit(i, h.unique, Err(e)),
            // FORGET and INTERRUPT do not travel over the ring; anything
            // else without a reply still needs its entry back.
            Outcome::Silent => self.commit(i, h.unique, Err(libc::ENOSYS as u32)),
            Outcome::Io(io) => {
                self.shared.wait_unthrottled();
                if let Err(io) = self.submit_direct(i, io) {
                    self.run_on_task_path(i, io);
                }
                Ok(())
            }
        }
    }

    fn run_on_task_path(&mut self, i: usize, io: BlockIo) {
        let s = self.shared.clone();
        // The unique is read from the header again at commit.
        self.pending
            .push(Box::pin(async move { (i, run_io(&s, io).await) }));
    }

    /// Sends `io` for entry `i` on the direct queue, or gives it back.
    fn submit_direct(&mut self, i: usize, io: BlockIo) -> Result<(), BlockIo> {
        let Some(d) = self.direct.as_mut() else {
            return Err(io);
        };
        d.follow_size();
        let locks = self.shared.dev.locks();
        let token = i as u64;
        let waiting = match io {
            BlockIo::Read { offset, len } if d.fits(offset, len) => {
                let lba = offset / d.block_bytes;
                let payload = &mut self.entries[i].payload;
                let in_place = len <= payload.len();
                let submitted = match NonNull::new(payload.as_mut_ptr()) {
                    Some(at) if in_place => {
                        // SAFETY: the payload buffer stays allocated while
                        // the ring lives, and `direct` (declared before
                        // `entries`) is dropped first. Nothing else touches
                        // it until this read's completion: the kernel reads
                        // it at the entry's commit and writes it at its next
                        // fetch, and the ring commits entry `i` only once
                        // the direct queue has handed out the read's
                        // completion (`drive_direct`); it parses the
                        // payload only on a fetch's completion.
                        let buf = unsafe { LentBuf::new(at, len) };
                        d.dq.submit_read_lent(&d.rw, lba, buf, IoFlags::default(), token)
                    }
                    _ => {
                        let buf = d.spare.take(len);
                        d.dq.submit_read_into(&d.rw, lba, buf, IoFlags::default(), token)
                    }
                };
                if submitted.is_err() {
                    return Err(io);
                }
                DirectIo::Read { io, in_place }
            }
            BlockIo::Write { offset, data, fua } if d.fits(offset, data.len()) => {
                let (lba, len) = (offset / d.block_bytes, data.len());
                let end = lba + len as u64 / d.block_bytes;
                let Some(lock_id) = locks.try_lock(lba, end) else {
                    return Err(BlockIo::Write { offset, data, fua });
                };
                let flags = IoFlags {
                    fua,
                    ..IoFlags::default()
                };
                if let Err(e) = d.dq.submit_write(&d.rw, lba, data, flags, token) {
                    // The data went with the refused command: fail the
                    // write (nothing was acknowledged).
                    locks.release(lock_id);
                    let errno = from_host_error(&e, OpKind::Write);
                    let unique =
                        InHeader::parse(&self.entries[i].header[..]).map_or(0, |h| h.unique);
                    if let Err(e) = self.commit(i, unique, Err(errno)) {
                        warn!("FUSE io_uring commit: {e}");
                    }
                    return Ok(());
                }
                DirectIo::Write { lock_id, len }
            }
            BlockIo::Flush if d.dq.can_submit() => {
                let (sqe, payload) = d.rw.flush();
                if d.dq.submit(sqe, payload, token).is_err() {
                    return Err(io);
                }
                DirectIo::Flush
            }
            io => return Err(io),
        };
        if let Some(slot) = d.waiting.get_mut(i) {
            *slot = Some(waiting);
        }
        self.shared.counts.direct.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Drives the direct queue: sends what was submitted, reads the
    /// completions, commits their replies. A queue that fails sends its
    /// reads and flushes to the task path (whose controller reconnects)
    /// and fails its writes with EIO (never acknowledged: nothing written
    /// is lost); the ring then uses the task path only.
    fn drive_direct(&mut self) -> io::Result<()> {
        let Some(d) = self.direct.as_mut() else {
            return Ok(());
        };
        let mut done = std::mem::take(&mut d.done);
        let r = d.dq.poll(&mut done, None);
        let closed = d.dq.is_closed();
        let acct = if done.is_empty() {
            None
        } else {
            self.shared.acct.as_ref().map(|a| a.export.clone())
        };
        for (token, result) in done.drain(..) {
            let i = usize::try_from(token).unwrap_or(usize::MAX);
            let Some(w) = self
                .direct
                .as_mut()
                .and_then(|d| d.waiting.get_mut(i))
                .and_then(Option::take)
            else {
                warn!(token, "direct completion for no FUSE request");
                continue;
            };
            let unique = InHeader::parse(&self.entries[i].header[..]).map_or(0, |h| h.unique);
            let reply = match (w, result) {
                (DirectIo::Read { io, .. }, Err(_)) if closed => {
                    self.run_on_task_path(i, io);
                    continue;
                }
                (DirectIo::Flush, Err(_)) if closed => {
                    self.run_on_task_path(i, BlockIo::Flush);
                    continue;
                }
                (DirectIo::Read { io, in_place }, Ok(c)) => {
                    let len = match io {
                        BlockIo::Read { len, .. } if in_place => len,
                        _ => c.data.len(),
                    };
                    if let Some(a) = &acct {
                        a.record(len as u64);
                    }
                    if in_place {
                        self.shared
                            .counts
                            .reads_in_place
                            .fetch_add(1, Ordering::Relaxed);
                        // `submit_direct` lent only reads that fit.
                        debug_assert!(len <= self.entries[i].payload.len());
                        self.commit_header(i, unique, 0, len)?;
                        continue;
                    }
                    self.commit(i, unique, Ok(&c.data))?;
                    if let Some(d) = self.direct.as_mut() {
                        d.spare.recycle(c.data);
                    }
                    continue;
                }
                (DirectIo::Read { .. }, Err(e)) => Err(from_host_error(&e, OpKind::Read)),
                (DirectIo::Write { lock_id, len }, r) => {
                    self.shared.dev.locks().release(lock_id);
                    r.map(|c| {
                        if let Some(a) = &acct {
                            a.record(len as u64);
                        }
                        // The queue hands the sent buffer back: the next
                        // read or write takes it.
                        if let Some(d) = self.direct.as_mut() {
                            d.spare.recycle(c.data);
                        }
                        abi::write_out(u32::try_from(len).unwrap_or(u32::MAX))
                    })
                    .map_err(|e| from_host_error(&e, OpKind::Write))
                }
                (DirectIo::Flush, r) => r
                    .map(|_| Vec::new())
                    .map_err(|e| from_host_error(&e, OpKind::Flush)),
            };
            self.commit(i, unique, reply.as_deref().map_err(|e| *e))?;
        }
        if let Some(d) = self.direct.as_mut() {
            d.done = done;
        }
        if let Err(e) = r {
            warn!("the FUSE ring's direct queue closed ({e}); I/O goes through the task path until a new one connects");
            self.direct = None;
            self.direct_gen += 1;
            self.direct_armed = (false, false);
            self.ask_for_replacement();
        }
        Ok(())
    }

    /// Starts a task that gets a new direct queue from the namespace's
    /// controller until it has one or the ring is gone
    /// (`crate::replace`).
    fn ask_for_replacement(&mut self) {
        let Some(ns) = self.ns.clone() else {
            return;
        };
        self.replacement = Some(crate::replace::spawn(
            &self.shared.rt,
            Arc::downgrade(&self.wake),
            Doorbell::ring,
            move || {
                let ns = ns.clone();
                async move {
                    match ns.controller().connect_direct_queue().await {
                        Ok(q) => Some(Direct::new(q, &ns)),
                        Err(e) => {
                            debug!("no new direct queue for the FUSE ring yet: {e}");
                            None
                        }
                    }
                }
            },
        ));
    }

    /// Installs a new direct queue the replacement task sent.
    fn take_replacement(&mut self) {
        let Some(rx) = &self.replacement else {
            return;
        };
        match rx.try_recv() {
            Ok(mut d) => {
                d.waiting = (0..self.entries.len()).map(|_| None).collect();
                info!(qid = d.dq.qid(), "the FUSE ring has a direct queue again");
                self.direct = Some(d);
                self.replacement = None;
                self.shared
                    .counts
                    .direct_replaced
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => self.replacement = None,
        }
    }

    /// Before the ring sleeps: a poll on the direct queue's socket while
    /// it has commands out (or bytes to send), and how long the ring may
    /// sleep (the queue's next timer).
    fn arm_direct(&mut self) -> io::Result<Option<Duration>> {
        let Some(d) = self.direct.as_ref() else {
            return Ok(None);
        };
        if d.dq.outstanding() == 0 && !d.dq.wants_write() {
            return Ok(None);
        }
        let wait =
            d.dq.next_deadline()
                .map(|t| t.saturating_duration_since(std::time::Instant::now()));
        let fd = types::Fd(d.dq.as_raw_fd());
        let wants_write = d.dq.wants_write();
        if !self.direct_armed.0 {
            let poll = opcode::PollAdd::new(fd, libc::POLLIN as u32)
                .build()
                .user_data(DIRECT_TAG | self.direct_gen << 1);
            self.push(poll.into())?;
            self.direct_armed.0 = true;
        }
        if wants_write && !self.direct_armed.1 {
            let poll = opcode::PollAdd::new(fd, libc::POLLOUT as u32)
                .build()
                .user_data(DIRECT_TAG | self.direct_gen << 1 | 1);
            self.push(poll.into())?;
            self.direct_armed.1 = true;
        }
        Ok(wait)
    }

    /// Writes the reply into entry `i`'s buffers and commits it, which
    /// also asks for the entry's next request.
    fn commit(&mut self, i: usize, unique: u64, r: Result<&[u8], u32>) -> io::Result<()> {
        let e = &mut self.entries[i];
        let (error, len) = match r {
            Ok(body) if body.len() <= e.payload.len() => {
                e.payload[..body.len()].copy_from_slice(body);
                (0, body.len())
            }
            Ok(body) => {
                warn!(
                    len = body.len(),
                    "FUSE reply larger than the ring's payload buffer"
                );
                (-libc::EIO, 0)
            }
            Err(errno) => (neg(errno), 0),
        };
        self.commit_header(i, unique, error, len)
    }

    /// Writes entry `i`'s reply header (`error`, a body of `len` bytes in
    /// its payload buffer) and commits it.
    fn commit_header(&mut self, i: usize, unique: u64, error: i32, len: usize) -> io::Result<()> {
        let e = &mut self.entries[i];
        e.header[..abi::OUT_HEADER_BYTES].copy_from_slice(&abi::out_header(unique, error, len));
        // len <= the payload buffer, a u32.
        e.header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4]
            .copy_from_slice(&u32::try_from(len).unwrap_or(0).to_le_bytes());
        let sqe =
            opcode::UringCmd80::new(types::Fd(self.shared.fd.as_raw_fd()), CMD_COMMIT_AND_FETCH)
                .cmd(cmd_req(e.commit_id, e.qid))
                .build()
                .user_data(i as u64);
        self.push(sqe)
    }
}

/// Sets an SQE's `len` field (offset 24), which `UringCmd80` does not
/// expose: FUSE's REGISTER takes the iovec count there.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is `repr(C)`: a 64-byte `io_uring_sqe` followed by
    // the 64-byte command tail, 128 plain bytes with no invalid values.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above; any byte pattern is a valid SQE value.
    unsafe { std::mem::transmute(raw) }
}

/// Whether the running kernel offers FUSE-over-io_uring now (the `fuse`
/// module's `enable_uring` parameter).
pub fn kernel_offers_uring() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|s| s.trim() == "Y")
}

/// Whether this process runs as root: the io_uring session mounts with
/// mount(2), which needs it.
pub fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_the_number_of_possible_cpus() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("0-99999"), None);
    }

    #[test]
    fn an_sqe_takes_its_len_at_offset_24() {
        let sqe = with_len(
            opcode::UringCmd80::new(types::Fd(3), CMD_REGISTER).build(),
            2,
        );
        // SAFETY: as in `with_len`.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            CMD_REGISTER
        );
    }
}
