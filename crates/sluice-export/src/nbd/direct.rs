//! The NBD run-to-completion path: after the handshake, one thread serves
//! one NBD connection and drives one [`DirectQueue`] of the export's
//! controller itself, as `sluice bench`'s direct engine does. A request
//! costs no task spawn, no channel and no thread crossing: the thread reads
//! a burst of requests from the client socket, submits them to the NVMe/TCP
//! queue pair (written in one `write`), reads the completions and sends the
//! replies back in one `writev`, then waits in poll(2) on both sockets.
//!
//! Only the common requests take this path: aligned READ and WRITE of at
//! most one NVMe command, and FLUSH. Everything else (unaligned I/O, which
//! needs read-modify-write, TRIM, WRITE_ZEROES, BLOCK_STATUS, refusals) is
//! handed to the task path (`server.rs`) on the tokio runtime, and its reply
//! comes back through a channel and an eventfd. A fast WRITE holds the same
//! block-range lock as the task path's writes ([`crate::blockio::RangeLock`])
//! without waiting: if the range is taken (an RMW is running over it), the
//! write goes to the task path, which waits for the lock.
//!
//! Limits are the task path's: [`REQUESTS_IN_FLIGHT_MAX`] requests and
//! [`IN_FLIGHT_BYTES_MAX`] payload bytes per connection, counted until the
//! reply is written, so a client that stops reading its replies stops
//! being read. A throttled export (i-NVMe) is not read from either.
//!
//! If the direct queue fails (the target went away), the reads and flushes
//! it held are re-issued on the task path, whose controller reconnects;
//! writes it held fail with `EIO` (never acknowledged, so nothing written is
//! lost), and the connection uses the task path until a task gets it a new
//! direct queue (once the controller has reconnected).

use super::proto::{
    encode_error_chunk, encode_read_chunk_header, encode_simple_reply, validate_in, Command,
    ExportInfo, Incoming, RequestDecoder, Session, TransmissionError, CMD_DISC,
};
use super::reply::{Reply, IN_FLIGHT_BYTES_MAX, REQUESTS_IN_FLIGHT_MAX};
use crate::account::ExportAccount;
use crate::blockio::RangeLock;
use crate::errno::{from_host_error, OpKind, EINVAL};
use crate::spare::SpareBuffers;
use rustix::event::{PollFd, PollFlags};
use sluice_host::core::Completion;
use sluice_host::{DirectQueue, HostError, IoFlags, RwBuilder};
use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Bytes read from the client per call.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Slices per `writev` (Linux's UIO_MAXIOV is 1024).
const IOV_MAX: usize = 1024;
/// Longest sleep in poll(2) even with nothing due (a safety net: every
/// wake-up source is polled).
const WAIT_MAX: Duration = Duration::from_millis(100);

/// What a direct connection needs from its server (`server.rs`
/// implements it): the task path for the requests it does not run itself,
/// and the export's account, description and write locks.
pub(crate) trait TaskPath: Send + Sync + 'static {
    /// Executes a request on the task path and encodes its reply.
    fn run_task(
        self: Arc<Self>,
        idx: usize,
        req: Incoming,
        session: Session,
    ) -> impl std::future::Future<Output = Reply> + Send + 'static;
    fn account(&self, idx: usize) -> Option<Arc<ExportAccount>>;
    fn export_info(&self, idx: usize) -> &ExportInfo;
    fn locks(&self, idx: usize) -> &RangeLock;
    /// A new direct queue for a connection whose queue failed, once the
    /// controller can give one (`None`: not now).
    fn replacement_queue(
        self: Arc<Self>,
        idx: usize,
    ) -> impl std::future::Future<Output = Option<DirectQueue>> + Send + 'static;
}

/// An NBD client's socket, in non-blocking mode.
#[derive(Debug)]
pub enum ClientSocket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl ClientSocket {
    fn shutdown(&self) {
        let _ = match self {
            ClientSocket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            ClientSocket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for ClientSocket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            ClientSocket::Tcp(s) => s.read(buf),
            ClientSocket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for ClientSocket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            ClientSocket::Tcp(s) => s.write(buf),
            ClientSocket::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            ClientSocket::Tcp(s) => s.write_vectored(bufs),
            ClientSocket::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AsFd for ClientSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            ClientSocket::Tcp(s) => s.as_fd(),
            ClientSocket::Unix(s) => s.as_fd(),
        }
    }
}

/// Streams whose connection can be served by the run-to-completion path:
/// real sockets. Others (in-memory pipes in tests) keep the task path.
pub trait IntoClientSocket: Sized {
    /// `Err(self)`: not a socket. `Ok(Err(e))`: the conversion failed (the
    /// stream is gone).
    fn into_client_socket(self) -> Result<std::io::Result<ClientSocket>, Self> {
        Err(self)
    }
}

impl IntoClientSocket for tokio::net::TcpStream {
    fn into_client_socket(self) -> Result<std::io::Result<ClientSocket>, Self> {
        Ok(self.into_std().map(ClientSocket::Tcp))
    }
}

impl IntoClientSocket for tokio::net::UnixStream {
    fn into_client_socket(self) -> Result<std::io::Result<ClientSocket>, Self> {
        Ok(self.into_std().map(ClientSocket::Unix))
    }
}

impl IntoClientSocket for tokio::io::DuplexStream {}

/// Most bytes of written replies' read buffers one connection keeps for
/// its next reads.
const SPARE_BYTES_MAX: usize = 4 << 20;

/// Replies waiting to be written, each with the in-flight charge (payload
/// bytes) it releases once written.
#[derive(Debug, Default)]
pub(crate) struct ReplyQueue {
    q: VecDeque<(Reply, u64)>,
    /// Bytes of the front reply already written.
    off: usize,
    /// Read buffers of written replies, for the next reads to fill (no
    /// allocation and no zeroing per read); at most [`SPARE_BYTES_MAX`].
    spare: SpareBuffers<SPARE_BYTES_MAX>,
}

impl ReplyQueue {
    /// A buffer of `len` bytes for a read to fill: a written reply's, or
    /// a new one.
    pub(crate) fn take_buffer(&mut self, len: usize) -> Vec<u8> {
        self.spare.take(len)
    }

    fn recycle(&mut self, b: Vec<u8>) {
        self.spare.recycle(b);
    }

    pub(crate) fn push(&mut self, r: Reply, charge: u64) {
        // Every reply has a header: an empty one would never be written.
        debug_assert!(r.len() > 0, "empty NBD reply");
        self.q.push_back((r, charge));
    }
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Writes as much as `w` takes without blocking, in `writev`s of many
    /// replies. Returns the charge of the replies fully written; stops at
    /// `WouldBlock`.
    pub(crate) fn write_to<W: Write>(&mut self, w: &mut W) -> std::io::Result<(usize, u64)> {
        let (mut written, mut released) = (0usize, 0u64);
        while !self.q.is_empty() {
            let n = {
                let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * self.q.len().min(64));
                let mut skip = self.off;
                for (r, _) in &self.q {
                    for part in [r.head.as_slice(), r.data.as_slice()] {
                        if skip >= part.len() {
                            skip -= part.len();
                            continue;
                        }
                        slices.push(IoSlice::new(&part[skip..]));
                        skip = 0;
                    }
                    if slices.len() + 2 > IOV_MAX {
                        break;
                    }
                }
                match w.write_vectored(&slices) {
                    Ok(0) => return Err(ErrorKind::WriteZero.into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            written += n;
            let mut n = n;
            while n > 0 {
                let Some((front, charge)) = self.q.front() else {
                    break;
                };
                let left = front.len() - self.off;
                if n < left {
                    self.off += n;
                    n = 0;
                } else {
                    n -= left;
                    released += charge;
                    self.off = 0;
                    if let Some((r, _)) = self.q.pop_front() {
                        self.recycle(r.data);
                    }
                }
            }
        }
        Ok((written, released))
    }
}

/// What a command on the direct queue was for.
#[derive(Debug)]
enum Pending {
    Read {
        cookie: u64,
        offset: u64,
        length: u32,
    },
    Write {
        cookie: u64,
        length: u32,
        lock_id: u64,
    },
    Flush {
        cookie: u64,
    },
}

/// A task path reply and its in-flight charge.
type SlowReply = (Reply, u64);

/// Wakes the connection's thread from a tokio task.
#[derive(Debug)]
struct Wake(OwnedFd);

impl Wake {
    fn new() -> std::io::Result<Wake> {
        use rustix::event::{eventfd, EventfdFlags};
        Ok(Wake(eventfd(
            0,
            EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC,
        )?))
    }
    fn wake(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }
    fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.0, &mut b);
    }
}

/// Everything one direct connection needs; [`DirectConn::run`] serves it
/// to its end on the calling thread.
pub(crate) struct DirectConn<T: TaskPath> {
    pub(crate) server: Arc<T>,
    pub(crate) idx: usize,
    pub(crate) session: Session,
    pub(crate) sock: ClientSocket,
    pub(crate) dq: DirectQueue,
    pub(crate) rw: RwBuilder,
    pub(crate) rt: tokio::runtime::Handle,
    /// Request bytes read during the handshake.
    pub(crate) leftover: Vec<u8>,
    /// The tenant's cgroup (`ConnectOptions::cgroup`, and whether a v2
    /// domain cgroup may take the process): the thread joins it, as the
    /// controller's queue threads do.
    pub(crate) cgroup: Option<(std::path::PathBuf, bool)>,
}

/// How a direct connection ended: the queue, if it can serve another
/// connection, and the error that ended it, if any.
pub(crate) struct DirectEnd {
    pub(crate) queue: Option<DirectQueue>,
    pub(crate) result: std::io::Result<()>,
}

struct State<T: TaskPath> {
    c: DirectConn<T>,
    dec: RequestDecoder,
    chunk: Vec<u8>,
    /// Commands on the direct queue, by token.
    slots: Vec<Option<Pending>>,
    free: Vec<usize>,
    /// Requests handed to the task path whose reply has not come back.
    slow: usize,
    slow_tx: mpsc::Sender<SlowReply>,
    slow_rx: mpsc::Receiver<SlowReply>,
    wake: Arc<Wake>,
    replies: ReplyQueue,
    /// Payload bytes of requests not yet answered (reply not yet written).
    charged: u64,
    /// Requests not yet answered.
    open: usize,
    /// Still reading requests (no EOF, DISC or protocol error yet).
    reading: bool,
    /// The client can still be written to.
    client_ok: bool,
    /// The direct queue still works.
    dq_ok: bool,
    /// After a failure: where the task looking for a new queue sends it.
    new_dq: Option<mpsc::Receiver<DirectQueue>>,
    /// Direct queues that replaced a failed one.
    replaced: u64,
    done: Vec<(u64, Result<Completion, HostError>)>,
    error: Option<std::io::Error>,
    account: Option<Arc<ExportAccount>>,
}

impl<T: TaskPath> DirectConn<T> {
    /// Serves the connection until the client disconnects and every
    /// request is answered.
    pub(crate) fn run(self) -> DirectEnd {
        if let Some((cg, procs)) = &self.cgroup {
            if let Err(e) = sluice_cpu::join_cgroup(cg, *procs) {
                warn!(cgroup = %cg.display(), "the connection's thread stays out of the tenant's cgroup: {e}");
            }
        }
        let wake = match Wake::new() {
            Ok(w) => Arc::new(w),
            Err(e) => {
                return DirectEnd {
                    queue: Some(self.dq),
                    result: Err(e),
                }
            }
        };
        let (slow_tx, slow_rx) = mpsc::channel();
        let mut dec = RequestDecoder::new();
        dec.feed(&self.leftover);
        let slots_max = usize::from(self.dq.depth()).min(REQUESTS_IN_FLIGHT_MAX as usize);
        let account = self.server.account(self.idx);
        let mut s = State {
            account: account.clone(),
            c: self,
            dec,
            chunk: vec![0u8; READ_CHUNK_BYTES],
            slots: (0..slots_max).map(|_| None).collect(),
            free: (0..slots_max).rev().collect(),
            slow: 0,
            slow_tx,
            slow_rx,
            wake,
            replies: ReplyQueue::default(),
            charged: 0,
            open: 0,
            reading: true,
            client_ok: true,
            dq_ok: true,
            new_dq: None,
            replaced: 0,
            done: Vec::new(),
            error: None,
        };
        if let Some(a) = &account {
            a.add_current_thread();
        }
        s.serve(account.as_deref());
        if let Some(a) = &account {
            a.remove_current_thread();
        }
        s.c.sock.shutdown();
        let reusable = s.dq_ok && !s.c.dq.is_closed() && s.c.dq.outstanding() == 0;
        DirectEnd {
            queue: reusable.then_some(s.c.dq),
            result: s.error.map_or(Ok(()), Err),
        }
    }
}

impl<T: TaskPath> State<T> {
    fn serve(&mut self, account: Option<&ExportAccount>) {
        loop {
            let throttled = account.and_then(|a| a.throttled_until());
            let mut progress = false;
            if throttled.is_none() {
                progress |= self.dispatch();
            }
            progress |= self.take_new_queue();
            progress |= self.drive_queue();
            progress |= self.take_slow_replies();
            progress |= self.write_replies();
            if throttled.is_none() && self.can_take() {
                progress |= self.read_client();
            }
            if !self.reading && self.open == 0 {
                return;
            }
            if !self.client_ok && (!self.dq_ok || self.c.dq.outstanding() == 0) {
                // Nobody to answer: the queue is clean (or dead), leave the
                // task path's requests to finish on their own.
                return;
            }
            if !progress {
                self.wait(throttled);
            }
        }
    }

    /// Whether another request may be taken (limits counted until the
    /// reply is written).
    fn can_take(&self) -> bool {
        self.reading
            && self.open < REQUESTS_IN_FLIGHT_MAX as usize
            && self.charged < IN_FLIGHT_BYTES_MAX
            && (!self.dq_ok || !self.free.is_empty())
    }

    /// Decodes and starts the requests already read, within the limits.
    fn dispatch(&mut self) -> bool {
        let mut any = false;
        while self.can_take() {
            match self.dec.next_request() {
                Ok(Some(req)) => {
                    any = true;
                    if req.header.kind == CMD_DISC {
                        debug!("NBD_CMD_DISC");
                        self.reading = false;
                        break;
                    }
                    self.start(req);
                }
                Ok(None) => break,
                Err(TransmissionError::WriteTooLarge { cookie, length }) => {
                    warn!(length, "write over the request limit; closing");
                    self.open += 1;
                    self.replies
                        .push(encode_simple_reply(cookie, EINVAL).to_vec().into(), 0);
                    self.reading = false;
                    any = true;
                }
                Err(e) => {
                    self.error = Some(std::io::Error::new(ErrorKind::InvalidData, e));
                    self.reading = false;
                    any = true;
                }
            }
        }
        any
    }

    /// Starts one request: on the direct queue when it can, else on the
    /// task path.
    fn start(&mut self, req: Incoming) {
        let charge = u64::from(req.header.length);
        self.open += 1;
        self.charged += charge;
        // A queue that cannot take a command now (closed, or every CID
        // held, e.g. by a timed-out command) sends the request to the task
        // path before its payload is given to the queue.
        let usable = self.dq_ok && !self.c.dq.is_closed() && self.c.dq.can_submit();
        let Some(slot) = usable.then(|| self.free.pop()).flatten() else {
            return self.hand_off(req, charge);
        };
        let e = self.c.server.export_info(self.c.idx);
        let bs = u64::from(self.c.rw.block_size_bytes());
        let max_bytes = self.c.rw.max_command_bytes();
        let fits = |offset: u64, length: u32| {
            length > 0
                && offset.is_multiple_of(bs)
                && u64::from(length).is_multiple_of(bs)
                && u64::from(length) <= max_bytes
        };
        let cookie = req.header.cookie;
        let submitted = match validate_in(&req.header, e, self.c.session) {
            Ok(Command::Read { offset, length }) if fits(offset, length) => {
                let buf = self.replies.take_buffer(length as usize);
                let r = self.c.dq.submit_read_into(
                    &self.c.rw,
                    offset / bs,
                    buf,
                    IoFlags::default(),
                    slot as u64,
                );
                r.map(|()| Pending::Read {
                    cookie,
                    offset,
                    length,
                })
                .map_err(|_| req)
            }
            Ok(Command::Write { offset, fua }) if fits(offset, req.header.length) => {
                let lba = offset / bs;
                let blocks = u64::from(req.header.length) / bs;
                match self.c.server.locks(self.c.idx).try_lock(lba, lba + blocks) {
                    None => Err(req),
                    Some(lock_id) => {
                        let length = req.header.length;
                        let flags = IoFlags {
                            fua,
                            ..IoFlags::default()
                        };
                        match self.c.dq.submit_write(
                            &self.c.rw,
                            lba,
                            req.payload,
                            flags,
                            slot as u64,
                        ) {
                            Ok(()) => Ok(Pending::Write {
                                cookie,
                                length,
                                lock_id,
                            }),
                            Err(err) => {
                                // The payload went with the refused command.
                                self.c.server.locks(self.c.idx).release(lock_id);
                                self.free.push(slot);
                                let errno = from_host_error(&err, OpKind::Write);
                                self.replies.push(
                                    encode_simple_reply(cookie, errno).to_vec().into(),
                                    charge,
                                );
                                return;
                            }
                        }
                    }
                }
            }
            Ok(Command::Flush) => {
                let (sqe, payload) = self.c.rw.flush();
                self.c
                    .dq
                    .submit(sqe, payload, slot as u64)
                    .map(|()| Pending::Flush { cookie })
                    .map_err(|_| req)
            }
            _ => Err(req),
        };
        match submitted {
            Ok(p) => {
                self.slots[slot] = Some(p);
                if let Some(a) = &self.account {
                    a.record_path(true);
                }
            }
            Err(req) => {
                self.free.push(slot);
                self.hand_off(req, charge);
            }
        }
    }

    /// Hands a request to the task path; its reply comes back through the
    /// channel.
    fn hand_off(&mut self, req: Incoming, charge: u64) {
        self.slow += 1;
        if let Some(a) = &self.account {
            a.record_path(false);
        }
        let server = self.c.server.clone();
        let (idx, session) = (self.c.idx, self.c.session);
        let tx = self.slow_tx.clone();
        let wake = self.wake.clone();
        let span = tracing::Span::current();
        self.c.rt.spawn(tracing::Instrument::instrument(
            async move {
                let reply = server.run_task(idx, req, session).await;
                let _ = tx.send((reply, charge));
                wake.wake();
            },
            span,
        ));
    }

    /// Drives the direct queue and turns its completions into replies.
    fn drive_queue(&mut self) -> bool {
        if !self.dq_ok {
            return false;
        }
        let mut done = std::mem::take(&mut self.done);
        let r = self.c.dq.poll(&mut done, None);
        let any = !done.is_empty();
        for (token, result) in done.drain(..) {
            self.complete(token, result);
        }
        self.done = done;
        if let Err(e) = r {
            warn!(
                "direct queue {} closed ({e}); the connection goes on through the task path until a new one connects",
                self.c.dq.qid()
            );
            self.dq_ok = false;
            self.ask_for_new_queue();
            return true;
        }
        any
    }

    /// Starts a task that asks the server for a new direct queue until it
    /// has one or the connection is gone (`crate::replace`).
    fn ask_for_new_queue(&mut self) {
        let server = self.c.server.clone();
        let idx = self.c.idx;
        self.new_dq = Some(crate::replace::spawn(
            &self.c.rt,
            Arc::downgrade(&self.wake),
            Wake::wake,
            move || server.clone().replacement_queue(idx),
        ));
    }

    /// Takes up a new direct queue the task found. The failed queue has
    /// reported every command it held, so no slot refers to it.
    fn take_new_queue(&mut self) -> bool {
        if self.dq_ok {
            return false;
        }
        let Some(rx) = &self.new_dq else {
            return false;
        };
        match rx.try_recv() {
            Ok(q) => {
                debug_assert!(self.slots.iter().all(Option::is_none));
                tracing::info!(qid = q.qid(), "the connection has a direct queue again");
                self.c.dq = q;
                self.dq_ok = true;
                self.new_dq = None;
                self.replaced += 1;
                if let Some(a) = &self.account {
                    a.record_queue_replaced();
                }
                true
            }
            Err(mpsc::TryRecvError::Empty) => false,
            Err(mpsc::TryRecvError::Disconnected) => {
                self.new_dq = None;
                false
            }
        }
    }

    fn complete(&mut self, token: u64, result: Result<Completion, HostError>) {
        let Some(p) = usize::try_from(token)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
            .and_then(Option::take)
        else {
            warn!(token, "completion for no request");
            return;
        };
        #[allow(clippy::cast_possible_truncation)]
        self.free.push(token as usize);
        let structured = self.c.session.structured;
        let queue_gone = self.c.dq.is_closed();
        let account = self.account.as_deref();
        match p {
            Pending::Read {
                cookie,
                offset,
                length,
            } => match result {
                Ok(c) => {
                    let head = if structured {
                        encode_read_chunk_header(cookie, offset, c.data.len())
                    } else {
                        encode_simple_reply(cookie, 0).to_vec()
                    };
                    if let Some(a) = account {
                        a.record(c.data.len() as u64);
                    }
                    self.replies
                        .push(Reply { head, data: c.data }, u64::from(length));
                }
                Err(_) if queue_gone => {
                    // Read again through the task path (it reconnects).
                    self.retry(super::proto::CMD_READ, cookie, offset, length);
                }
                Err(err) => {
                    let errno = from_host_error(&err, OpKind::Read);
                    warn!(cookie, errno, "request failed: {err}");
                    let head = if structured {
                        encode_error_chunk(cookie, errno, &err.to_string())
                    } else {
                        encode_simple_reply(cookie, errno).to_vec()
                    };
                    self.replies.push(head.into(), u64::from(length));
                }
            },
            Pending::Write {
                cookie,
                length,
                lock_id,
            } => {
                self.c.server.locks(self.c.idx).release(lock_id);
                let errno = match result {
                    Ok(_) => {
                        if let Some(a) = account {
                            a.record(u64::from(length));
                        }
                        0
                    }
                    Err(err) => {
                        let errno = from_host_error(&err, OpKind::Write);
                        warn!(cookie, errno, "request failed: {err}");
                        errno
                    }
                };
                self.replies.push(
                    encode_simple_reply(cookie, errno).to_vec().into(),
                    u64::from(length),
                );
            }
            Pending::Flush { cookie } => match result {
                Err(_) if queue_gone => self.retry(super::proto::CMD_FLUSH, cookie, 0, 0),
                r => {
                    if let Some(a) = account {
                        a.record(0);
                    }
                    let errno = r.map_or_else(|err| from_host_error(&err, OpKind::Flush), |_| 0);
                    self.replies
                        .push(encode_simple_reply(cookie, errno).to_vec().into(), 0);
                }
            },
        }
    }

    /// Re-issues a read or flush on the task path (its request is still
    /// open and charged).
    fn retry(&mut self, kind: u16, cookie: u64, offset: u64, length: u32) {
        let req = Incoming {
            header: super::proto::RequestHeader {
                flags: 0,
                kind,
                cookie,
                offset,
                length,
            },
            payload: Vec::new(),
        };
        self.hand_off(req, u64::from(length));
    }

    fn take_slow_replies(&mut self) -> bool {
        let mut any = false;
        while let Ok((r, charge)) = self.slow_rx.try_recv() {
            self.slow = self.slow.saturating_sub(1);
            self.replies.push(r, charge);
            any = true;
        }
        any
    }

    fn write_replies(&mut self) -> bool {
        if self.replies.is_empty() {
            return false;
        }
        let before = self.replies.len();
        let mut released = 0;
        if self.client_ok {
            match self.replies.write_to(&mut self.c.sock) {
                Ok((_, r)) => released += r,
                Err(e) => {
                    debug!("client write failed: {e}");
                    self.client_ok = false;
                    self.reading = false;
                    if self.error.is_none() {
                        self.error = Some(e);
                    }
                }
            }
        }
        if !self.client_ok {
            // The client is gone: drop what it cannot receive.
            if let Ok((_, r)) = self.replies.write_to(&mut std::io::sink()) {
                released += r;
            }
        }
        let answered = before - self.replies.len();
        self.open -= answered;
        self.charged = self.charged.saturating_sub(released);
        answered > 0
    }

    /// Reads one chunk of requests from the client.
    fn read_client(&mut self) -> bool {
        match self.c.sock.read(&mut self.chunk) {
            Ok(0) => {
                self.reading = false;
                true
            }
            Ok(n) => {
                self.dec.feed(&self.chunk[..n]);
                true
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(e) if e.kind() == ErrorKind::Interrupted => true,
            Err(e) => {
                self.reading = false;
                self.client_ok = false;
                self.error = Some(e);
                true
            }
        }
    }

    /// Sleeps in poll(2) until a socket, the task path or a timer needs us.
    fn wait(&mut self, throttled: Option<Instant>) {
        let now = Instant::now();
        let mut deadline = now + WAIT_MAX;
        if self.dq_ok {
            if let Some(d) = self.c.dq.next_deadline() {
                deadline = deadline.min(d);
            }
        }
        if let Some(t) = throttled {
            deadline = deadline.min(t);
        }
        let mut client_ev = PollFlags::empty();
        if throttled.is_none() && self.can_take() {
            client_ev |= PollFlags::IN;
        }
        if self.client_ok && !self.replies.is_empty() {
            client_ev |= PollFlags::OUT;
        }
        let mut dq_ev = PollFlags::empty();
        if self.dq_ok {
            dq_ev |= PollFlags::IN;
            if self.c.dq.wants_write() {
                dq_ev |= PollFlags::OUT;
            }
        }
        let dq_fd: RawFd = self.c.dq.as_raw_fd();
        // SAFETY: the queue owns the descriptor and outlives this call.
        let dq_bfd = unsafe { BorrowedFd::borrow_raw(dq_fd) };
        let mut fds = [
            PollFd::from_borrowed_fd(self.wake.0.as_fd(), PollFlags::IN),
            PollFd::from_borrowed_fd(self.c.sock.as_fd(), client_ev),
            PollFd::from_borrowed_fd(dq_bfd, dq_ev),
        ];
        let t = deadline.saturating_duration_since(now);
        let ts = rustix::time::Timespec {
            tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(t.subsec_nanos()),
        };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
        if !fds[0].revents().is_empty() {
            self.wake.drain();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `step` bytes per call and refuses every other call
    /// with `WouldBlock`, as a full non-blocking socket does.
    struct Choppy {
        got: Vec<u8>,
        step: usize,
        calls: usize,
    }

    impl Write for Choppy {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(2) {
                return Err(ErrorKind::WouldBlock.into());
            }
            Ok(crate::nbd::reply::take_at_most(
                &mut self.got,
                self.step,
                bufs,
            ))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn replies_go_out_whole_and_in_order_across_partial_writes() {
        for step in [1, 3, 16, 17, 100, 1 << 20] {
            let mut q = ReplyQueue::default();
            let mut whole = Vec::new();
            for i in 0..20u8 {
                let head: Vec<u8> = (0..16).map(|j| j ^ i).collect();
                let data: Vec<u8> = (0..u8::try_from(usize::from(i) * 7).unwrap()).collect();
                whole.extend_from_slice(&head);
                whole.extend_from_slice(&data);
                q.push(Reply { head, data }, u64::from(i));
            }
            let mut w = Choppy {
                got: Vec::new(),
                step,
                calls: 0,
            };
            let (mut released, mut rounds) = (0u64, 0);
            while !q.is_empty() {
                let (_, r) = q.write_to(&mut w).unwrap();
                released += r;
                rounds += 1;
                assert!(rounds < 100_000, "no progress at step {step}");
            }
            assert_eq!(w.got, whole, "step {step}");
            // Every reply's charge is released once: 0 + 1 + ... + 19.
            assert_eq!(released, 190, "step {step}");
        }
    }

    #[test]
    fn a_closed_client_is_an_error_not_a_spin() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Ok(0)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut q = ReplyQueue::default();
        q.push(Reply::from(vec![1, 2, 3]), 7);
        assert_eq!(
            q.write_to(&mut Closed).unwrap_err().kind(),
            ErrorKind::WriteZero
        );
        assert_eq!(q.len(), 1);
    }
}
