//! The NBD I/O layer on tokio: Unix and TCP listeners, one task per
//! connection for the handshake; then either the run-to-completion path
//! (`direct.rs`: a thread and a pooled direct queue of the export's
//! controller) or the task path here: several requests in flight per
//! connection, one task each (replies are sent as each completes, possibly
//! out of order), bounded by [`REQUESTS_IN_FLIGHT_MAX`] and
//! [`IN_FLIGHT_BYTES_MAX`].

use super::direct::{DirectConn, DirectEnd, IntoClientSocket, TaskPath};
use super::proto::{
    encode_block_status, encode_error_chunk, encode_read_chunk_header, encode_simple_reply,
    encode_sparse_read, validate_in, Command, ExportInfo, HandshakeStatus, Incoming,
    RequestDecoder, ServerHandshake, Session, TransmissionError, STATE_HOLE, STATE_ZERO,
};
use super::reply::Reply;
pub use super::reply::{IN_FLIGHT_BYTES_MAX, REQUESTS_IN_FLIGHT_MAX};
use crate::account::ExportAccount;
use crate::blockio::{BlockDevice, ByteDevice, RangeLock};
use crate::errno::EINVAL;
use sluice_host::{DirectQueue, HostError, Namespace, RwBuilder};
use sluice_runtime::sync::lock;
use socket2::SockRef;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, info, info_span, warn, Instrument};

/// Unit of the byte budget semaphore.
const BUDGET_UNIT_BYTES: u64 = 4096;
/// Time a client has to finish the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes read from the socket per call.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Replies gathered into one socket write, at most: bytes (more when one
/// reply is larger) and replies.
const REPLY_BATCH_BYTES_MAX: usize = 1 << 20;
const REPLY_BATCH_MAX: usize = 64;
/// Slices per `writev` (Linux's UIO_MAXIOV is 1024).
const IOV_MAX: usize = 1024;
/// Send buffer asked for on every accepted Unix-socket client: room for the
/// replies of a queue of large reads (QD 8 of 128 KiB takes 1 MiB), so the
/// export writes them and sleeps instead of waking at each read the client
/// makes. The kernel grants at most `net.core.wmem_max` (doubled for its
/// bookkeeping). A Unix socket's default (`net.core.wmem_default`, 208 KiB
/// here) held fewer than two such replies; TCP clients keep the kernel's
/// autotuning, which measured the same with and without a fixed buffer.
pub const UNIX_CLIENT_SEND_BUFFER_BYTES: usize = 4 << 20;

/// Asks for [`UNIX_CLIENT_SEND_BUFFER_BYTES`] of send buffer on `sock`; a
/// refusal costs only speed, so it is logged and the connection goes on.
pub fn widen_unix_send_buffer(sock: &impl AsFd) {
    if let Err(e) = SockRef::from(sock).set_send_buffer_size(UNIX_CLIENT_SEND_BUFFER_BYTES) {
        debug!("cannot set SO_SNDBUF to {UNIX_CLIENT_SEND_BUFFER_BYTES} bytes: {e}");
    }
}

/// Writes every byte of `bufs`, in as few `writev` calls as the socket
/// takes.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    wr: &mut W,
    bufs: &[&[u8]],
) -> std::io::Result<()> {
    // (buffer, offset) of the first byte not yet written.
    let (mut i, mut off) = (0usize, 0usize);
    while i < bufs.len() {
        if off == bufs[i].len() {
            i += 1;
            off = 0;
            continue;
        }
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&bufs[i][off..])
            .chain(bufs[i + 1..].iter().copied())
            .take(IOV_MAX)
            .map(std::io::IoSlice::new)
            .collect();
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < bufs.len() {
            let left = bufs[i].len() - off;
            if n < left {
                off += n;
                n = 0;
            } else {
                n -= left;
                i += 1;
                off = 0;
            }
        }
    }
    Ok(())
}

/// Export settings.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    pub export_name: String,
    pub description: String,
    pub read_only: bool,
    /// Host NQN used towards the target (recorded in tracing spans).
    pub hostnqn: String,
}

/// One export of a (possibly shared) server: a device, what clients see of
/// it, and optionally its tenant account (CPU charging and throttling).
#[derive(Debug)]
pub struct ExportEntry<D> {
    pub dev: Arc<ByteDevice<D>>,
    pub cfg: NbdConfig,
    pub account: Option<Arc<ExportAccount>>,
}

#[derive(Debug)]
struct Entry<D> {
    dev: Arc<ByteDevice<D>>,
    export: ExportInfo,
    hostnqn: String,
    account: Option<Arc<ExportAccount>>,
    /// The run-to-completion path's queues, when the device is one
    /// namespace (`direct.rs`).
    direct: Option<DirectPool>,
}

/// Direct queues of one export's controller that no connection is using.
/// Connections take one (opening a new one while the controller grants
/// queue IDs) and give it back when they end, so queue IDs are reused.
#[derive(Debug)]
struct DirectPool {
    ns: Namespace,
    idle: Mutex<Vec<DirectQueue>>,
    /// The controller refused a new queue for a reason that lasts (no
    /// queue ID left, authentication): stop asking.
    exhausted: AtomicBool,
}

/// Serves one or several [`ByteDevice`]s over NBD (chosen by export name in
/// the handshake; the empty name is the first).
#[derive(Debug)]
pub struct NbdServer<D> {
    entries: Vec<Entry<D>>,
    /// Acknowledge NBD_OPT_STRUCTURED_REPLY (the default).
    structured_replies: bool,
}

impl<D: BlockDevice> NbdServer<D> {
    pub fn new(dev: Arc<ByteDevice<D>>, cfg: NbdConfig) -> Arc<NbdServer<D>> {
        Self::with_exports(vec![ExportEntry {
            dev,
            cfg,
            account: None,
        }])
    }

    /// A server of several exports (a shared exporter serving several
    /// tenants). Panics if `exports` is empty.
    pub fn with_exports(exports: Vec<ExportEntry<D>>) -> Arc<NbdServer<D>> {
        Self::with_exports_offering(exports, true)
    }

    /// [`Self::with_exports`], choosing whether clients may negotiate
    /// structured replies (server-wide: a client asks before it picks an
    /// export). Without them there is no block status and reads of holes
    /// send zeros, but libnbd-based clients spend less CPU per read
    /// (`ServerHandshake::offering_structured_replies`).
    pub fn with_exports_offering(
        exports: Vec<ExportEntry<D>>,
        structured_replies: bool,
    ) -> Arc<NbdServer<D>> {
        assert!(!exports.is_empty(), "an NBD server needs an export");
        let entries = exports
            .into_iter()
            .map(|e| Entry {
                export: ExportInfo {
                    name: e.cfg.export_name,
                    description: e.cfg.description,
                    size_bytes: e.dev.size_bytes(),
                    read_only: e.cfg.read_only,
                    preferred_block_bytes: e.dev.block_size_bytes().max(4096),
                },
                direct: e.dev.device().namespace().map(|ns| DirectPool {
                    ns: ns.clone(),
                    idle: Mutex::new(Vec::new()),
                    exhausted: AtomicBool::new(false),
                }),
                dev: e.dev,
                hostnqn: e.cfg.hostnqn,
                account: e.account,
            })
            .collect();
        Arc::new(NbdServer {
            entries,
            structured_replies,
        })
    }

    /// A direct queue for a connection to export `idx` (an idle one, or a
    /// new one while the controller grants queue IDs) and the namespace's
    /// command builder. `None`: the connection takes the task path.
    async fn take_direct(&self, idx: usize) -> Option<(DirectQueue, RwBuilder)> {
        let d = self.entries[idx].direct.as_ref()?;
        self.open_direct(d).await.map(|q| (q, d.ns.rw_builder()))
    }

    async fn open_direct(&self, d: &DirectPool) -> Option<DirectQueue> {
        loop {
            let q = lock(&d.idle).pop();
            let Some(mut q) = q else { break };
            // Notice a queue the target closed while it sat idle.
            let mut none = Vec::new();
            let _ = q.poll(&mut none, None);
            if !q.is_closed() && q.outstanding() == 0 {
                return Some(q);
            }
        }
        if d.exhausted.load(Ordering::Relaxed) {
            return None;
        }
        match d.ns.controller().connect_direct_queue().await {
            Ok(q) => Some(q),
            Err(e) => {
                let lasting = matches!(e, HostError::InvalidArgument(_));
                if lasting {
                    d.exhausted.store(true, Ordering::Relaxed);
                }
                info!("NBD connections beyond the direct queues take the task path: {e}");
                None
            }
        }
    }

    fn give_back(&self, idx: usize, q: DirectQueue) {
        if let Some(d) = &self.entries[idx].direct {
            lock(&d.idle).push(q);
        }
    }

    /// The first (default) export.
    pub fn export(&self) -> &ExportInfo {
        &self.entries[0].export
    }

    fn span_hostnqn(&self) -> &str {
        if self.entries.len() == 1 {
            &self.entries[0].hostnqn
        } else {
            "(per export)"
        }
    }

    /// Accepts connections on a Unix socket until the future is dropped.
    pub async fn serve_unix(self: Arc<Self>, listener: UnixListener) -> std::io::Result<()> {
        let mut n = 0u64;
        loop {
            let (s, _) = listener.accept().await?;
            widen_unix_send_buffer(&s);
            n += 1;
            let span = info_span!("nbd", hostnqn = %self.span_hostnqn(), conn = n, peer = "unix");
            let me = self.clone();
            tokio::spawn(async move { me.serve_conn(s).await }.instrument(span));
        }
    }

    /// Accepts connections on a TCP listener until the future is dropped.
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        let mut n = 0u64;
        loop {
            let (s, peer) = listener.accept().await?;
            let _ = s.set_nodelay(true);
            n += 1;
            let span = info_span!("nbd", hostnqn = %self.span_hostnqn(), conn = n, peer = %peer);
            let me = self.clone();
            tokio::spawn(async move { me.serve_conn(s).await }.instrument(span));
        }
    }

    /// Runs one connection to its end and logs how it ended.
    pub async fn serve_conn<S>(self: Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + IntoClientSocket + 'static,
    {
        match self.run_conn(stream).await {
            Ok(()) => debug!("connection closed"),
            Err(e) => warn!("connection ended: {e}"),
        }
    }

    async fn run_conn<S>(self: Arc<Self>, mut stream: S) -> std::io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + IntoClientSocket + 'static,
    {
        // Each export's size now: a namespace grown online (the host
        // library follows its events) is larger for clients from then on;
        // a connection keeps the size it was told (`Session::size_bytes`).
        let exports = self
            .entries
            .iter()
            .map(|e| ExportInfo {
                size_bytes: e.dev.size_bytes(),
                ..e.export.clone()
            })
            .collect();
        let mut hs = ServerHandshake::with_exports(exports)
            .offering_structured_replies(self.structured_replies);
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        let leftover = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            loop {
                let out = hs.take_output();
                if !out.is_empty() {
                    stream.write_all(&out).await?;
                }
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(None);
                }
                hs.feed(&chunk[..n]);
                let st = hs.process();
                let out = hs.take_output();
                if !out.is_empty() {
                    stream.write_all(&out).await?;
                }
                match st {
                    Ok(HandshakeStatus::NeedMore) => {}
                    Ok(HandshakeStatus::Done { leftover }) => return Ok(Some(leftover)),
                    Ok(HandshakeStatus::Aborted) => return Ok(None),
                    Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
                }
            }
        })
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake timed out"))??;
        let Some(leftover) = leftover else {
            debug!("client left during the handshake");
            return Ok(());
        };
        stream.flush().await?;
        let idx = hs.selected();
        let session = hs.session();
        let entry = &self.entries[idx];
        info!(
            export = %entry.export.name,
            hostnqn = %entry.hostnqn,
            size_bytes = session.size_bytes.unwrap_or(entry.export.size_bytes),
            structured_replies = session.structured,
            base_allocation = session.base_allocation,
            "transmission phase"
        );
        let stream = match self.take_direct(idx).await {
            None => stream,
            Some((dq, rw)) => match stream.into_client_socket() {
                Err(stream) => {
                    self.give_back(idx, dq);
                    stream
                }
                Ok(Err(e)) => {
                    self.give_back(idx, dq);
                    return Err(e);
                }
                Ok(Ok(sock)) => return self.run_direct(idx, session, sock, dq, rw, leftover).await,
            },
        };
        if let Some(a) = &entry.account {
            a.record_connection(false);
        }
        self.run_tasks(idx, session, stream, leftover).await
    }

    /// Serves a connection on its own thread (`direct.rs`) and waits for
    /// it to end.
    async fn run_direct(
        self: &Arc<Self>,
        idx: usize,
        session: Session,
        sock: super::direct::ClientSocket,
        dq: DirectQueue,
        rw: RwBuilder,
        leftover: Vec<u8>,
    ) -> std::io::Result<()> {
        if let Some(a) = &self.entries[idx].account {
            a.record_connection(true);
        }
        info!(qid = dq.qid(), "served by the run-to-completion path");
        let conn = DirectConn {
            server: self.clone(),
            idx,
            session,
            sock,
            dq,
            rw,
            rt: tokio::runtime::Handle::current(),
            leftover,
            cgroup: self.entries[idx].direct.as_ref().and_then(|d| {
                let o = d.ns.controller().options();
                o.cgroup.clone().map(|c| (c, o.cgroup_procs))
            }),
        };
        let span = tracing::Span::current();
        let (tx, rx) = tokio::sync::oneshot::channel::<DirectEnd>();
        std::thread::Builder::new()
            .name("sluice-nbd-conn".into())
            .spawn(move || {
                let _g = span.enter();
                let _ = tx.send(conn.run());
            })?;
        let end = rx
            .await
            .map_err(|_| std::io::Error::other("the connection's thread panicked"))?;
        if let Some(q) = end.queue {
            self.give_back(idx, q);
        }
        end.result
    }

    /// Serves a connection with one task per request.
    async fn run_tasks<S>(
        self: &Arc<Self>,
        idx: usize,
        session: Session,
        stream: S,
        leftover: Vec<u8>,
    ) -> std::io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        let account = self.entries[idx].account.clone();

        // Replies from request tasks go through one writer task.
        let (tx, mut rx) = mpsc::channel::<Reply>(REQUESTS_IN_FLIGHT_MAX as usize);
        // Every reply already waiting goes out in the same (vectored)
        // write: one syscall for a burst of completions, and no copy.
        let writer = tokio::spawn(async move {
            let mut batch: Vec<Reply> = Vec::new();
            while let Some(reply) = rx.recv().await {
                let mut bytes = reply.len();
                batch.push(reply);
                while bytes < REPLY_BATCH_BYTES_MAX && batch.len() < REPLY_BATCH_MAX {
                    match rx.try_recv() {
                        Ok(more) => {
                            bytes += more.len();
                            batch.push(more);
                        }
                        Err(_) => break,
                    }
                }
                let parts: Vec<&[u8]> = batch
                    .iter()
                    .flat_map(|r| [r.head.as_slice(), r.data.as_slice()])
                    .filter(|p| !p.is_empty())
                    .collect();
                write_all_vectored(&mut wr, &parts).await?;
                batch.clear();
            }
            wr.flush().await?;
            wr.shutdown().await
        });
        let count = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX as usize));
        // 128 MiB in 4 KiB units: 32768.
        #[allow(clippy::cast_possible_truncation)]
        let budget_units = (IN_FLIGHT_BYTES_MAX / BUDGET_UNIT_BYTES) as u32;
        let budget = Arc::new(Semaphore::new(budget_units as usize));
        let mut dec = RequestDecoder::new();
        dec.feed(&leftover);
        let result: std::io::Result<()> = 'read: loop {
            loop {
                match dec.next_request() {
                    Ok(Some(req)) => {
                        if req.header.kind == super::proto::CMD_DISC {
                            debug!("NBD_CMD_DISC");
                            break 'read Ok(());
                        }
                        let bytes = req.header.length as u64;
                        let units = bytes
                            .div_ceil(BUDGET_UNIT_BYTES)
                            .clamp(1, u64::from(budget_units));
                        let units = u32::try_from(units).unwrap_or(budget_units);
                        if let Some(a) = &account {
                            a.wait_unthrottled().await;
                        }
                        let Ok(c) = count.clone().acquire_owned().await else {
                            break 'read Ok(());
                        };
                        let Ok(b) = budget.clone().acquire_many_owned(units).await else {
                            break 'read Ok(());
                        };
                        let me = self.clone();
                        let tx = tx.clone();
                        tokio::spawn(
                            async move {
                                let reply = me.execute(idx, req, session).await;
                                let _ = tx.send(reply).await;
                                drop((c, b));
                            }
                            .in_current_span(),
                        );
                    }
                    Ok(None) => break,
                    Err(TransmissionError::WriteTooLarge { cookie, length }) => {
                        warn!(length, "write over the request limit; closing");
                        let _ = tx
                            .send(encode_simple_reply(cookie, EINVAL).to_vec().into())
                            .await;
                        break 'read Ok(());
                    }
                    Err(e) => {
                        break 'read Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
                    }
                }
            }
            // A throttled tenant's sockets are not read: TCP back-pressure.
            if let Some(a) = &account {
                a.wait_unthrottled().await;
            }
            match rd.read(&mut chunk).await {
                Ok(0) => break Ok(()),
                Ok(n) => dec.feed(&chunk[..n]),
                Err(e) => break Err(e),
            }
        };
        // Let in-flight requests finish and their replies go out.
        drop(tx);
        match writer.await {
            Ok(r) => r?,
            Err(e) => return Err(std::io::Error::other(format!("writer task: {e}"))),
        }
        result
    }

    /// Executes one request and encodes its reply.
    async fn execute(&self, idx: usize, req: Incoming, session: Session) -> Reply {
        let e = &self.entries[idx];
        let written = req.payload.len();
        let (reply, read) = self.execute_on(e, req, session).await;
        if let Some(a) = &e.account {
            // Payload moved: write data in, read data out.
            a.record((written + read) as u64);
        }
        reply
    }

    /// Executes one request. With structured replies negotiated, reads and
    /// block status answer in one final chunk (data, block status or
    /// error); everything else gets a simple reply, which the protocol
    /// allows. Returns the reply and the bytes of read data in it.
    async fn execute_on(&self, e: &Entry<D>, req: Incoming, session: Session) -> (Reply, usize) {
        // Reads of a device with holes, over structured replies: the holes
        // go as hole chunks. (Asked first: every other request is
        // validated once, in `execute_plain`.)
        if session.structured && e.dev.reports_holes() {
            if let Ok(Command::Read { offset, length }) =
                validate_in(&req.header, &e.export, session)
            {
                if let Some(r) = read_with_holes(e, req.header.cookie, offset, length).await {
                    return r;
                }
            }
        }
        self.execute_plain(e, req, session).await
    }

    async fn execute_plain(&self, e: &Entry<D>, req: Incoming, session: Session) -> (Reply, usize) {
        let cookie = req.header.cookie;
        let structured = session.structured;
        let cmd = match validate_in(&req.header, &e.export, session) {
            Ok(c) => c,
            Err(r) => {
                debug!(
                    cookie,
                    errno = r.errno,
                    reason = r.reason,
                    "request refused"
                );
                let chunked = structured
                    && matches!(
                        req.header.kind,
                        super::proto::CMD_READ | super::proto::CMD_BLOCK_STATUS
                    );
                if chunked {
                    return (encode_error_chunk(cookie, r.errno, r.reason).into(), 0);
                }
                return (encode_simple_reply(cookie, r.errno).to_vec().into(), 0);
            }
        };
        let r = match cmd {
            Command::Read { offset, length } => match e.dev.read(offset, length as usize).await {
                Ok(data) => {
                    let head = if structured {
                        encode_read_chunk_header(cookie, offset, data.len())
                    } else {
                        encode_simple_reply(cookie, 0).to_vec()
                    };
                    let n = data.len();
                    return (Reply { head, data }, n);
                }
                Err(err) if structured => {
                    warn!(cookie, errno = err.errno(), "request failed: {err}");
                    return (
                        encode_error_chunk(cookie, err.errno(), &err.to_string()).into(),
                        0,
                    );
                }
                Err(e) => Err(e),
            },
            Command::BlockStatus {
                offset,
                length,
                one,
            } => match e.dev.allocation(offset, u64::from(length)).await {
                Ok(runs) => {
                    let mut extents: Vec<(u32, u32)> = runs
                        .iter()
                        .map(|&(n, allocated)| {
                            // Runs tile a request of at most u32::MAX bytes.
                            let n = u32::try_from(n).unwrap_or(u32::MAX);
                            (
                                n,
                                if allocated {
                                    0
                                } else {
                                    STATE_HOLE | STATE_ZERO
                                },
                            )
                        })
                        .collect();
                    if one {
                        extents.truncate(1);
                    }
                    return (encode_block_status(cookie, &extents).into(), 0);
                }
                Err(err) => {
                    warn!(cookie, errno = err.errno(), "block status failed: {err}");
                    return (
                        encode_error_chunk(cookie, err.errno(), &err.to_string()).into(),
                        0,
                    );
                }
            },
            Command::Write { offset, fua } => e.dev.write(offset, req.payload, fua).await,
            Command::Flush => e.dev.flush().await,
            Command::Trim {
                offset,
                length,
                fua,
            } => e.dev.trim(offset, length as u64, fua).await,
            Command::WriteZeroes {
                offset,
                length,
                fua,
            } => e.dev.write_zeroes(offset, length as u64, fua).await,
            Command::Disconnect => Ok(()),
        };
        let reply = match r {
            Ok(()) => encode_simple_reply(cookie, 0).to_vec(),
            Err(err) => {
                warn!(cookie, errno = err.errno(), "request failed: {err}");
                encode_simple_reply(cookie, err.errno()).to_vec()
            }
        };
        (reply.into(), 0)
    }
}

impl<D: BlockDevice> TaskPath for NbdServer<D> {
    async fn run_task(self: Arc<Self>, idx: usize, req: Incoming, session: Session) -> Reply {
        self.execute(idx, req, session).await
    }
    fn account(&self, idx: usize) -> Option<Arc<ExportAccount>> {
        self.entries[idx].account.clone()
    }
    fn export_info(&self, idx: usize) -> &ExportInfo {
        &self.entries[idx].export
    }
    fn locks(&self, idx: usize) -> &RangeLock {
        self.entries[idx].dev.locks()
    }
    async fn replacement_queue(self: Arc<Self>, idx: usize) -> Option<DirectQueue> {
        // Straight to the controller: the pool's idle queues belong to the
        // association that failed, and "no queue ID left" now says nothing
        // about the association the controller reconnects to.
        let d = self.entries[idx].direct.as_ref()?;
        match d.ns.controller().connect_direct_queue().await {
            Ok(q) => Some(q),
            Err(e) => {
                debug!("no new direct queue yet: {e}");
                None
            }
        }
    }
}

/// A Unix socket listener that removes its path when dropped.
#[derive(Debug)]
pub struct UnixSocketPath(PathBuf);

impl UnixSocketPath {
    /// Binds `path` (a stale socket file left by a dead server is replaced).
    pub fn bind(path: &Path) -> std::io::Result<(UnixListener, UnixSocketPath)> {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.file_type().is_socket() && std::os::unix::net::UnixStream::connect(path).is_err() {
                std::fs::remove_file(path)?;
            }
        }
        let l = UnixListener::bind(path)?;
        Ok((l, UnixSocketPath(path.to_path_buf())))
    }
}

impl Drop for UnixSocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A structured read of a range with holes: the allocated runs read and
/// sent as data chunks, the holes as hole chunks (no zeros on the wire).
/// `None` when the range has no hole or its allocation is unknown (the
/// plain read answers, errors included). Returns the reply and the bytes
/// of data in it.
async fn read_with_holes<D: BlockDevice>(
    e: &Entry<D>,
    cookie: u64,
    offset: u64,
    length: u32,
) -> Option<(Reply, usize)> {
    let runs = e.dev.allocation(offset, u64::from(length)).await.ok()?;
    if runs.iter().all(|&(_, allocated)| allocated) {
        return None;
    }
    let mut parts: Vec<(u64, Result<Vec<u8>, u32>)> = Vec::with_capacity(runs.len());
    let mut at = offset;
    for (n, allocated) in runs {
        if allocated {
            // n <= length, a u32.
            match e
                .dev
                .read(at, usize::try_from(n).unwrap_or(usize::MAX))
                .await
            {
                Ok(d) => parts.push((at, Ok(d))),
                Err(err) => {
                    warn!(cookie, errno = err.errno(), "request failed: {err}");
                    let chunk = encode_error_chunk(cookie, err.errno(), &err.to_string());
                    return Some((chunk.into(), 0));
                }
            }
        } else {
            parts.push((at, Err(u32::try_from(n).unwrap_or(u32::MAX))));
        }
        at += n;
    }
    let data_bytes = parts
        .iter()
        .map(|(_, r)| r.as_ref().map_or(0, Vec::len))
        .sum();
    let refs: Vec<(u64, Result<&[u8], u32>)> = parts
        .iter()
        .map(|(o, r)| (*o, r.as_ref().map(Vec::as_slice).map_err(|&n| n)))
        .collect();
    Some((encode_sparse_read(cookie, &refs).into(), data_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A writer that takes at most `step` bytes per call, across slices.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let step = self.step;
            Poll::Ready(Ok(crate::nbd::reply::take_at_most(
                &mut self.got,
                step,
                bufs,
            )))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn vectored_writes_survive_partial_writes_at_every_boundary() {
        let parts: Vec<Vec<u8>> = (0..9u8)
            .map(|i| {
                (0..u8::try_from(usize::from(i) * 5 + 1).unwrap())
                    .map(|j| j ^ i)
                    .collect()
            })
            .collect();
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let whole: Vec<u8> = parts.concat();
        for step in [1, 2, 3, 7, 16, 1000] {
            let mut w = Trickle {
                got: Vec::new(),
                step,
            };
            write_all_vectored(&mut w, &slices).await.unwrap();
            assert_eq!(w.got, whole, "step {step}");
        }
        let mut w = Trickle {
            got: Vec::new(),
            step: 4,
        };
        write_all_vectored(&mut w, &[]).await.unwrap();
        assert!(w.got.is_empty());
    }
}
