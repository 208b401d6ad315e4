//! The wire floor: what raw TCP on this host carries with NVMe-sized
//! messages, against a built-in echo/sink server on loopback, so bench
//! results are stated as ratios to what the machine can carry rather than to
//! a deliberately slow loop.
//!
//! Messages follow the job's workload ([`FloorSpec`]): a read is a 72-byte
//! request (common header + SQE) answered by `16 + block_size` bytes (a
//! C2HData header and the data); a write is a `72 + block_size` request (the
//! capsule carrying the data) answered by a 24-byte CapsuleResp.
//!
//! Measurements, each on its own connection:
//!
//! * **batched pipelined** ([`batched`]): the client keeps `qd` requests
//!   outstanding and puts every request it may send into one `write` (up to
//!   `qd` requests per syscall); the server reads everything available and
//!   answers all the requests it read with one `write`; the client reads
//!   replies with 256 KiB reads and counts whole replies. It runs twice,
//!   once with both ends busy-polling non-blocking sockets and once with
//!   blocking sockets, and the report keeps the one that carried more
//!   (`batched_polling` says which; both figures are reported).
//! * **bulk**: one connection streaming 1 MiB writes into a sink, blocking
//!   and busy-polled (the better is `bulk_mib_per_s`); divided by the block
//!   size it is the IOPS ceiling of the wire for that block size
//!   (`bulk_iops_ceiling`).
//! * **busy-polled ping-pong**: the batched loop at QD 1 with both ends
//!   spinning on non-blocking reads (no epoll, no sleep): the round trip of
//!   one request and one reply.
//! * **blocking echo loop** (history; the floor before): a 72 B request and a
//!   4112 B reply per blocking `write`/`read_exact`, at QD 1 (`pingpong_*`)
//!   and with `qd` outstanding (`pipelined_*`). Kept so old figures compare.
//!
//! **The floor** ([`FloorReport::floor_iops`], `floor_basis`) is the
//! strongest of these for the workload:
//!
//! * QD 1: the round trip, the lower p50 of the busy-polled and the blocking
//!   ping-pong (normally the busy one): `floor_latency_us_p50`;
//! * QD > 1, blocks below [`LARGE_BLOCK_BYTES`]: the most the pipelined
//!   loops carried (the batched one, or the echo loop when its message
//!   shape is the workload's), never above the bulk ceiling;
//! * blocks of [`LARGE_BLOCK_BYTES`] or more: the bulk ceiling, where per
//!   message costs vanish and bandwidth is the limit (or the batched loop,
//!   should it have carried more: the floor is never below a measured rate).
//!
//! The busy-polled runs normally carry the most on a machine where each end
//! has its own core (here: batched 4 KiB reads at QD 32 near 1M/s busy, bulk
//! 7-9 GiB/s busy against ~4-5 GiB/s blocking); blocking runs are kept so a
//! layout where both ends share a core, where spinning starves the peer,
//! still gets an honest figure.
//!
//! With `server_cpu` the server threads pin themselves to that CPU (the
//! client runs wherever the caller runs, normally `taskset` on the bench),
//! so the floor has the same two-core layout as target and bench.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;
use sluice_runtime::cast::nanos;

/// Request size of a read: the common header plus a 64-byte SQE.
pub const REQUEST_BYTES: usize = 72;
/// Reply header of a read: a C2HData header (16 bytes counted as in the brief).
pub const REPLY_HEADER_BYTES: usize = 16;
/// Reply of a write: a CapsuleResp (8-byte common header + 16-byte CQE).
pub const WRITE_REPLY_BYTES: usize = 24;
/// Reply size of the echo loop (history): a C2HData header plus 4 KiB.
pub const REPLY_BYTES: usize = REPLY_HEADER_BYTES + 4096;
/// From this block size on, the floor is the bulk bandwidth ceiling.
pub const LARGE_BLOCK_BYTES: u64 = 64 * 1024;
/// The client's read buffer in the batched loop.
pub const CLIENT_READ_BYTES: usize = 256 * 1024;
const BULK_CHUNK_BYTES: usize = 1 << 20;
/// The server's read buffer in the batched loop.
const SERVER_READ_BYTES: usize = 256 * 1024;
/// Largest single reply write of the server (more is written in pieces).
const SERVER_WRITE_MAX_BYTES: usize = 4 << 20;

/// The workload the floor is shaped after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorSpec {
    /// Requests outstanding in the pipelined loops.
    pub qd: u32,
    /// Data bytes per I/O.
    pub block_size: u64,
    /// Writes carry the data in the request, reads in the reply.
    pub write: bool,
    /// Pin the floor's server threads to this CPU.
    pub server_cpu: Option<usize>,
}

impl FloorSpec {
    /// 4 KiB reads at `qd`, server unpinned.
    #[cfg(test)]
    pub fn reads_4k(qd: u32) -> Self {
        FloorSpec {
            qd,
            block_size: 4096,
            write: false,
            server_cpu: None,
        }
    }

    /// (request bytes, reply bytes) of one I/O.
    pub fn message_bytes(&self) -> (usize, usize) {
        let bs = sluice_runtime::cast::usize_from(self.block_size);
        if self.write {
            (REQUEST_BYTES + bs, WRITE_REPLY_BYTES)
        } else {
            (REQUEST_BYTES, REPLY_HEADER_BYTES + bs)
        }
    }
}

/// How the batched loop's sockets wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Polling {
    /// Non-blocking sockets, both ends spin on `read`/`write`.
    Busy,
    /// Blocking sockets.
    Blocking,
}

/// What the floor of a workload is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FloorBasis {
    /// QD 1: the busy-polled ping-pong round trip.
    BusyRtt,
    /// QD 1: the blocking ping-pong round trip (when it was the faster).
    BlockingRtt,
    /// The batched pipelined loop.
    Batched,
    /// The blocking echo loop (its shape is the workload's and it carried more).
    EchoPipelined,
    /// The bulk bandwidth divided by the block size.
    Bulk,
}

/// Results of the floor measurement. The first nine fields are the blocking
/// echo loop and bulk of the old floor, unchanged; the rest is the floor.
#[derive(Debug, Clone, Serialize)]
pub struct FloorReport {
    /// Blocking echo loop at QD 1 (72 B / 4112 B, one message per syscall).
    pub pingpong_latency_us_p50: f64,
    pub pingpong_latency_us_p99: f64,
    pub pingpong_latency_us_mean: f64,
    pub pingpong_rtt_per_s: f64,
    /// Blocking echo loop with `pipelined_qd` outstanding.
    pub pipelined_qd: u32,
    pub pipelined_iops: f64,
    pub pipelined_latency_us_p50: f64,
    pub pipelined_latency_us_p99: f64,
    /// One connection streaming 1 MiB writes into a sink: the better of the
    /// blocking and the busy-polled run (the old floor had the blocking one).
    pub bulk_mib_per_s: f64,

    /// The workload shape of the floor.
    pub block_size_bytes: u64,
    pub write: bool,
    pub request_bytes: usize,
    pub reply_bytes: usize,
    /// CPU the server threads were pinned to, if any.
    pub server_cpu: Option<usize>,
    /// Bulk bandwidth / block size.
    pub bulk_iops_ceiling: f64,
    /// Both bulk runs.
    pub bulk_busy_mib_per_s: f64,
    pub bulk_blocking_mib_per_s: f64,
    /// Batched pipelined loop at `batched_qd` (the better polling mode).
    pub batched_qd: u32,
    pub batched_polling: Polling,
    pub batched_iops: f64,
    pub batched_mib_per_s: f64,
    pub batched_latency_us_p50: f64,
    pub batched_latency_us_p99: f64,
    /// Both polling modes' rates.
    pub batched_busy_iops: f64,
    pub batched_blocking_iops: f64,
    /// Syscall batching of the chosen run: requests per client write,
    /// replies per client read, requests per server read, replies per
    /// server write.
    pub batched_client_requests_per_write: f64,
    pub batched_client_replies_per_read: f64,
    pub batched_server_requests_per_read: f64,
    pub batched_server_replies_per_write: f64,
    /// Busy-polled ping-pong (QD 1) of the workload's messages.
    pub busy_pingpong_latency_us_p50: f64,
    pub busy_pingpong_latency_us_p99: f64,
    pub busy_pingpong_latency_us_mean: f64,
    pub busy_pingpong_rtt_per_s: f64,
    /// The floor for the workload (see the module doc).
    pub floor_basis: FloorBasis,
    pub floor_iops: f64,
    pub floor_mib_per_s: f64,
    /// QD 1: the round trip p50 the latency is compared with; QD > 1: the
    /// batched loop's p50.
    pub floor_latency_us_p50: f64,
}

// ---------------------------------------------------------------------------
// Sans-IO framing.

/// Counts whole fixed-size messages in a byte stream read in arbitrary
/// pieces: a message is counted only once its last byte has arrived.
#[derive(Debug, Clone)]
pub struct MessageCounter {
    msg_bytes: usize,
    partial: usize,
    total: u64,
}

impl MessageCounter {
    pub fn new(msg_bytes: usize) -> Self {
        assert!(msg_bytes > 0, "empty messages");
        MessageCounter {
            msg_bytes,
            partial: 0,
            total: 0,
        }
    }

    /// `n` more bytes arrived; returns the messages they completed.
    pub fn feed(&mut self, n: usize) -> u64 {
        let bytes = self.partial + n;
        let done = (bytes / self.msg_bytes) as u64;
        self.partial = bytes % self.msg_bytes;
        self.total += done;
        done
    }

    /// Bytes of a message begun but not complete.
    #[cfg(test)]
    pub fn partial_bytes(&self) -> usize {
        self.partial
    }

    /// Whole messages so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// The client side of the batched loop: `qd` slots, requests queued in
/// batches into one pending byte run, replies counted whole.
#[derive(Debug, Clone)]
pub struct Requester {
    qd: u32,
    request_bytes: usize,
    /// Requests queued (sent or not) whose reply has not arrived.
    inflight: u32,
    /// Request bytes queued but not yet written.
    tx_pending: usize,
    replies: MessageCounter,
    queued: u64,
}

impl Requester {
    pub fn new(qd: u32, request_bytes: usize, reply_bytes: usize) -> Self {
        Requester {
            qd: qd.max(1),
            request_bytes,
            inflight: 0,
            tx_pending: 0,
            replies: MessageCounter::new(reply_bytes),
            queued: 0,
        }
    }

    /// Queues a request in every free slot; returns how many.
    pub fn refill(&mut self) -> u32 {
        let k = self.qd - self.inflight;
        self.inflight += k;
        self.tx_pending += k as usize * self.request_bytes;
        self.queued += k as u64;
        k
    }

    /// Bytes to hand to the next `write` (all pending request bytes).
    pub fn tx_pending(&self) -> usize {
        self.tx_pending
    }

    /// `n` request bytes were written.
    pub fn wrote(&mut self, n: usize) {
        assert!(n <= self.tx_pending, "wrote more than was queued");
        self.tx_pending -= n;
    }

    /// `n` reply bytes were read; returns the replies they completed.
    pub fn read(&mut self, n: usize) -> u64 {
        let done = self.replies.feed(n);
        assert!(
            done <= self.inflight as u64,
            "more replies than requests outstanding"
        );
        // `done <= inflight`, a u32 (asserted above).
        self.inflight -= u32::try_from(done).unwrap_or(self.inflight);
        done
    }

    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    pub fn replies(&self) -> u64 {
        self.replies.total()
    }

    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// Bytes of a reply begun but not complete.
    #[cfg(test)]
    pub fn partial_reply_bytes(&self) -> usize {
        self.replies.partial_bytes()
    }
}

/// The server side of the batched loop: whole requests read become reply
/// bytes owed, written in as few writes as the socket allows.
#[derive(Debug, Clone)]
pub struct Answerer {
    requests: MessageCounter,
    reply_bytes: usize,
    owed: usize,
}

impl Answerer {
    pub fn new(request_bytes: usize, reply_bytes: usize) -> Self {
        Answerer {
            requests: MessageCounter::new(request_bytes),
            reply_bytes,
            owed: 0,
        }
    }

    /// `n` request bytes were read; returns the requests they completed
    /// (each now owed a reply).
    pub fn read(&mut self, n: usize) -> u64 {
        let done = self.requests.feed(n);
        self.owed += sluice_runtime::cast::usize_from(done) * self.reply_bytes;
        done
    }

    /// Reply bytes owed and not yet written.
    pub fn owed(&self) -> usize {
        self.owed
    }

    /// `n` reply bytes were written.
    pub fn wrote(&mut self, n: usize) {
        assert!(n <= self.owed, "wrote more than was owed");
        self.owed -= n;
    }

    /// Requests answered (read whole) so far.
    pub fn answered(&self) -> u64 {
        self.requests.total()
    }
}

// ---------------------------------------------------------------------------
// The server.

const MODE_ECHO: u8 = b'E';
const MODE_SINK: u8 = b'S';
const MODE_BUSY_SINK: u8 = b'P';
const MODE_BATCHED: u8 = b'B';
/// The batched loop's hello: mode, polling, 2 pad bytes, request and reply
/// sizes (u32 LE).
const HELLO_BYTES: usize = 12;

/// What one batched connection's server saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeStats {
    pub requests_answered: u64,
    pub reads: u64,
    pub writes: u64,
    pub reply_bytes_written: u64,
}

/// The echo/sink server: the first byte of a connection picks the mode
/// (echo loop, sink, batched loop).
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    last: Arc<Mutex<Option<ServeStats>>>,
}

impl Server {
    /// Starts the server on loopback; connection threads pin themselves to
    /// `cpu` when given.
    pub fn start(cpu: Option<usize>) -> anyhow::Result<Server> {
        let l = TcpListener::bind("127.0.0.1:0").context("bind floor server")?;
        let addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(None));
        if let Some(c) = cpu {
            // Fail here, not silently in the connection thread.
            std::thread::spawn(move || sluice_runtime::affinity::pin_current_thread(c))
                .join()
                .map_err(|_| anyhow::anyhow!("affinity probe thread panicked"))?
                .with_context(|| format!("--floor-server-cpu {c}"))?;
        }
        let (st, ls) = (stop.clone(), last.clone());
        std::thread::Builder::new()
            .name("floor-accept".into())
            .spawn(move || {
                for s in l.incoming() {
                    if st.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    let ls = ls.clone();
                    let _ =
                        std::thread::Builder::new()
                            .name("floor-conn".into())
                            .spawn(move || {
                                if let Some(c) = cpu {
                                    let _ = sluice_runtime::affinity::pin_current_thread(c);
                                }
                                let _ = serve(s, &ls);
                            });
                }
            })?;
        Ok(Server { addr, stop, last })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The stats of the last batched connection, once its server is done
    /// (it records them before it closes the socket).
    pub fn take_last(&self) -> Option<ServeStats> {
        self.last.lock().ok()?.take()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

fn serve(mut s: TcpStream, last: &Mutex<Option<ServeStats>>) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut mode = [0u8; 1];
    s.read_exact(&mut mode)?;
    match mode[0] {
        MODE_SINK => {
            let mut buf = vec![0u8; BULK_CHUNK_BYTES];
            while s.read(&mut buf)? != 0 {}
            Ok(())
        }
        MODE_BUSY_SINK => {
            s.set_nonblocking(true)?;
            let mut buf = vec![0u8; BULK_CHUNK_BYTES];
            loop {
                match try_read(&mut s, &mut buf)? {
                    Some(0) => return Ok(()),
                    Some(_) => {}
                    None => std::hint::spin_loop(),
                }
            }
        }
        MODE_BATCHED => {
            let mut h = [0u8; HELLO_BYTES - 1];
            s.read_exact(&mut h)?;
            let polling = if h[0] == 1 {
                Polling::Busy
            } else {
                Polling::Blocking
            };
            let req = u32::from_le_bytes([h[3], h[4], h[5], h[6]]) as usize;
            let rep = u32::from_le_bytes([h[7], h[8], h[9], h[10]]) as usize;
            if req == 0 || rep == 0 {
                return Err(std::io::Error::new(ErrorKind::InvalidData, "empty message"));
            }
            s.set_nonblocking(polling == Polling::Busy)?;
            let st = serve_batched(&mut s, polling, req, rep)?;
            if let Ok(mut l) = last.lock() {
                *l = Some(st);
            }
            Ok(()) // the socket closes after the stats are recorded
        }
        _ => serve_echo(s),
    }
}

fn serve_echo(mut s: TcpStream) -> std::io::Result<()> {
    let reply = vec![0xa5u8; REPLY_BYTES];
    let mut req = [0u8; REQUEST_BYTES];
    loop {
        if let Err(e) = s.read_exact(&mut req) {
            return if e.kind() == ErrorKind::UnexpectedEof {
                Ok(())
            } else {
                Err(e)
            };
        }
        s.write_all(&reply)?;
    }
}

/// One `read`: `Ok(None)` when a non-blocking socket has nothing.
fn try_read(s: &mut impl Read, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    match s.read(buf) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// One `write`: `Ok(0)` when a non-blocking socket is full.
fn try_write(s: &mut impl Write, buf: &[u8]) -> std::io::Result<usize> {
    match s.write(buf) {
        Ok(0) => Err(ErrorKind::WriteZero.into()),
        Ok(n) => Ok(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// The server of the batched loop: reads all that is there, answers every
/// whole request read with one write of all their replies. Ends at the
/// client's end of stream, once every reply owed is written.
pub fn serve_batched<S: Read + Write>(
    s: &mut S,
    polling: Polling,
    request_bytes: usize,
    reply_bytes: usize,
) -> std::io::Result<ServeStats> {
    let mut a = Answerer::new(request_bytes, reply_bytes);
    let mut rbuf = vec![0u8; SERVER_READ_BYTES.max(request_bytes)];
    let wbuf = vec![
        0xa5u8;
        SERVER_WRITE_MAX_BYTES
            .min(reply_bytes * 64)
            .max(reply_bytes)
    ];
    let mut st = ServeStats::default();
    let mut eof = false;
    loop {
        // Write what is owed first: in blocking mode all of it, in busy
        // mode as much as the socket takes now.
        while a.owed() > 0 {
            let n = try_write(s, &wbuf[..a.owed().min(wbuf.len())])?;
            if n == 0 {
                break;
            }
            st.writes += 1;
            st.reply_bytes_written += n as u64;
            a.wrote(n);
            if polling == Polling::Busy && a.owed() > 0 && !eof {
                break; // go read meanwhile
            }
        }
        if eof {
            if a.owed() == 0 {
                break;
            }
            continue;
        }
        match try_read(s, &mut rbuf)? {
            Some(0) => eof = true,
            Some(n) => {
                st.reads += 1;
                a.read(n);
            }
            None => std::hint::spin_loop(),
        }
    }
    st.requests_answered = a.answered();
    Ok(st)
}

// ---------------------------------------------------------------------------
// The client loops.

/// Latencies up to 60 s, as the jobs' histograms: under load (a QEMU
/// beside the tests) floor requests took over 60 ms, which the old 60 ms
/// bound refused as an error.
fn hist() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("histogram")
}

/// What the client of a batched run saw.
#[derive(Debug)]
pub struct BatchedRun {
    /// Latency per request, ns (from queueing the batch to its reply).
    pub latency_ns: Histogram<u64>,
    /// Replies counted within the measured window.
    pub replies_in_window: u64,
    pub window_s: f64,
    /// All replies (the window's plus the drain's) and all requests sent.
    pub replies_total: u64,
    pub requests_total: u64,
    pub writes: u64,
    pub reads: u64,
    /// Bytes of replies read (always replies_total × reply bytes; checked by
    /// the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub reply_bytes_read: u64,
}

/// The client of the batched loop on a connected stream (the hello already
/// sent): keeps `qd` requests outstanding for `dur`, then stops queueing,
/// shuts its write side and reads until the server closes. `read_buf` is
/// the read size (tests make it small to split replies).
pub fn batched_client(
    s: &mut TcpStream,
    polling: Polling,
    qd: u32,
    request_bytes: usize,
    reply_bytes: usize,
    read_buf: usize,
    dur: Duration,
) -> anyhow::Result<BatchedRun> {
    s.set_nonblocking(polling == Polling::Busy)?;
    let mut r = Requester::new(qd, request_bytes, reply_bytes);
    let wbuf = vec![0x5au8; qd.max(1) as usize * request_bytes];
    let mut rbuf = vec![0u8; read_buf.max(1)];
    let mut h = hist()?;
    // (requests, queued at) per batch, oldest first: replies come in order.
    let mut batches: VecDeque<(u32, Instant)> = VecDeque::new();
    let (mut writes, mut reads, mut bytes_read) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let end = start + dur;
    let mut in_window = 0u64;
    let mut window_s = 0.0;
    let mut open = true;
    let k = r.refill();
    batches.push_back((k, start));
    loop {
        while r.tx_pending() > 0 {
            let n = try_write(s, &wbuf[..r.tx_pending()])?;
            if n == 0 {
                break;
            }
            writes += 1;
            r.wrote(n);
        }
        if !open && r.tx_pending() == 0 && r.inflight() == 0 {
            break;
        }
        let Some(n) = try_read(s, &mut rbuf)? else {
            std::hint::spin_loop();
            continue;
        };
        if n == 0 {
            bail!(
                "floor server closed with {} replies outstanding",
                r.inflight()
            );
        }
        reads += 1;
        bytes_read += n as u64;
        let mut done = r.read(n);
        if done == 0 {
            continue;
        }
        let now = Instant::now();
        while done > 0 {
            let Some(front) = batches.front_mut() else {
                bail!("a reply for no request");
            };
            // At most `front.0`, a u32.
            let take = u32::try_from(u64::from(front.0).min(done)).unwrap_or(front.0);
            let ns = sluice_runtime::cast::nanos(now - front.1).max(1);
            h.record_n(ns, take as u64)?;
            front.0 -= take;
            done -= take as u64;
            if front.0 == 0 {
                batches.pop_front();
            }
        }
        if open {
            if now < end {
                let k = r.refill();
                if k > 0 {
                    batches.push_back((k, now));
                }
            } else {
                open = false;
                in_window = r.replies();
                window_s = (now - start).as_secs_f64();
            }
        }
    }
    s.set_nonblocking(false)?;
    s.shutdown(std::net::Shutdown::Write)?;
    // The server records its stats, then closes: wait for that.
    let mut b = [0u8; 64];
    let n = s.read(&mut b)?;
    if n != 0 {
        bail!("{n} bytes after the last reply");
    }
    Ok(BatchedRun {
        latency_ns: h,
        replies_in_window: in_window,
        window_s,
        replies_total: r.replies(),
        requests_total: r.queued(),
        writes,
        reads,
        reply_bytes_read: bytes_read,
    })
}

/// Connects to `srv` and runs [`batched_client`] with the server's answer.
pub fn batched(
    srv: &Server,
    polling: Polling,
    qd: u32,
    request_bytes: usize,
    reply_bytes: usize,
    read_buf: usize,
    dur: Duration,
) -> anyhow::Result<(BatchedRun, ServeStats)> {
    let mut s = TcpStream::connect(srv.addr()).context("connect floor server")?;
    s.set_nodelay(true)?;
    let mut hello = [0u8; HELLO_BYTES];
    hello[0] = MODE_BATCHED;
    hello[1] = u8::from(polling == Polling::Busy);
    let field = |n: usize| u32::try_from(n).context("floor message size over 4 GiB");
    hello[4..8].copy_from_slice(&field(request_bytes)?.to_le_bytes());
    hello[8..12].copy_from_slice(&field(reply_bytes)?.to_le_bytes());
    s.write_all(&hello)?;
    let _ = srv.take_last();
    let run = batched_client(
        &mut s,
        polling,
        qd,
        request_bytes,
        reply_bytes,
        read_buf,
        dur,
    )?;
    let st = srv
        .take_last()
        .context("floor server recorded no stats before closing")?;
    Ok((run, st))
}

/// The blocking echo loop (history): round trips with `qd` requests
/// outstanding for `dur`, one request or reply per syscall; latency in ns.
fn pingpong(
    addr: SocketAddr,
    qd: u32,
    dur: Duration,
) -> anyhow::Result<(Histogram<u64>, u64, f64)> {
    let mut s = TcpStream::connect(addr).context("connect floor server")?;
    s.set_nodelay(true)?;
    s.write_all(&[MODE_ECHO])?;
    let req = [0x5au8; REQUEST_BYTES];
    let mut reply = vec![0u8; REPLY_BYTES];
    let mut h = hist()?;
    let mut sent = VecDeque::with_capacity(qd as usize);
    let start = Instant::now();
    let end = start + dur;
    for _ in 0..qd.max(1) {
        sent.push_back(Instant::now());
        s.write_all(&req)?;
    }
    let mut n = 0u64;
    while let Some(t0) = sent.pop_front() {
        s.read_exact(&mut reply)?;
        let now = Instant::now();
        h.record(nanos(now - t0).max(1))?;
        n += 1;
        if now < end {
            sent.push_back(Instant::now());
            s.write_all(&req)?;
        }
    }
    Ok((h, n, start.elapsed().as_secs_f64()))
}

/// One connection streaming 1 MiB writes into a sink for `dur`, blocking or
/// with both ends spinning on non-blocking sockets; MiB/s.
fn bulk(addr: SocketAddr, polling: Polling, dur: Duration) -> anyhow::Result<f64> {
    let mut s = TcpStream::connect(addr).context("connect floor server")?;
    let busy = polling == Polling::Busy;
    s.write_all(&[if busy { MODE_BUSY_SINK } else { MODE_SINK }])?;
    s.set_nonblocking(busy)?;
    let buf = vec![0x11u8; BULK_CHUNK_BYTES];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < dur {
        let n = try_write(&mut s, &buf)?;
        if n == 0 {
            std::hint::spin_loop();
        }
        bytes += n as u64;
    }
    s.set_nonblocking(false)?;
    s.shutdown(std::net::Shutdown::Write)?;
    // Wait for the sink to drain so the bytes are really through.
    let mut b = [0u8; 1];
    let _ = s.read(&mut b);
    Ok(bytes as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64())
}

fn per(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Measures the floor for `spec`. The busy ping-pong runs for `dur_each`;
/// the two bulk runs, the two batched runs (busy, blocking) and the two echo
/// loops for half of it each: four `dur_each` in all.
pub fn measure(spec: FloorSpec, dur_each: Duration) -> anyhow::Result<FloorReport> {
    let srv = Server::start(spec.server_cpu)?;
    let us = |ns: u64| ns as f64 / 1000.0;
    let half = dur_each / 2;
    let qd = spec.qd.max(1);
    let (req, rep) = spec.message_bytes();
    let bs = spec.block_size.max(1);

    let (h1, n1, t1) = pingpong(srv.addr, 1, half)?;
    let (hq, nq, tq) = pingpong(srv.addr, qd, half)?;
    let bw_blocking = bulk(srv.addr, Polling::Blocking, half)?;
    let bw_busy = bulk(srv.addr, Polling::Busy, half)?;
    let bw = bw_blocking.max(bw_busy);
    let busy = batched(&srv, Polling::Busy, qd, req, rep, CLIENT_READ_BYTES, half)?;
    let blocking = batched(
        &srv,
        Polling::Blocking,
        qd,
        req,
        rep,
        CLIENT_READ_BYTES,
        half,
    )?;
    let (pp, _) = batched(
        &srv,
        Polling::Busy,
        1,
        req,
        rep,
        CLIENT_READ_BYTES,
        dur_each,
    )?;

    let rate = |r: &BatchedRun| r.replies_in_window as f64 / r.window_s.max(1e-9);
    let (busy_iops, blocking_iops) = (rate(&busy.0), rate(&blocking.0));
    let ((b, bst), batched_polling) = if busy_iops >= blocking_iops {
        (busy, Polling::Busy)
    } else {
        (blocking, Polling::Blocking)
    };
    let batched_iops = rate(&b);
    let bulk_iops_ceiling = bw * (1 << 20) as f64 / bs as f64;
    let pipelined_iops = nq as f64 / tq;
    let pingpong_p50 = us(h1.value_at_quantile(0.5));
    let busy_p50 = us(pp.latency_ns.value_at_quantile(0.5));
    let batched_p50 = us(b.latency_ns.value_at_quantile(0.5));
    let echo_shape = !spec.write && spec.block_size == 4096;

    let (floor_basis, floor_iops, floor_latency_us_p50) = if qd == 1 {
        if busy_p50 <= pingpong_p50 || !echo_shape {
            (FloorBasis::BusyRtt, rate(&pp), busy_p50)
        } else {
            (FloorBasis::BlockingRtt, n1 as f64 / t1, pingpong_p50)
        }
    } else if spec.block_size >= LARGE_BLOCK_BYTES {
        // The ceiling, unless the workload-shaped loop carried more (then
        // the bulk runs were disturbed, and the larger figure is the floor).
        if batched_iops > bulk_iops_ceiling {
            (FloorBasis::Batched, batched_iops, batched_p50)
        } else {
            (FloorBasis::Bulk, bulk_iops_ceiling, batched_p50)
        }
    } else {
        let (basis, best) = if echo_shape && pipelined_iops > batched_iops {
            (FloorBasis::EchoPipelined, pipelined_iops)
        } else {
            (FloorBasis::Batched, batched_iops)
        };
        if best > bulk_iops_ceiling {
            (FloorBasis::Bulk, bulk_iops_ceiling, batched_p50)
        } else {
            (basis, best, batched_p50)
        }
    };
    let mib = |iops: f64| iops * bs as f64 / (1 << 20) as f64;
    Ok(FloorReport {
        pingpong_latency_us_p50: pingpong_p50,
        pingpong_latency_us_p99: us(h1.value_at_quantile(0.99)),
        pingpong_latency_us_mean: h1.mean() / 1000.0,
        pingpong_rtt_per_s: n1 as f64 / t1,
        pipelined_qd: qd,
        pipelined_iops,
        pipelined_latency_us_p50: us(hq.value_at_quantile(0.5)),
        pipelined_latency_us_p99: us(hq.value_at_quantile(0.99)),
        bulk_mib_per_s: bw,
        block_size_bytes: spec.block_size,
        write: spec.write,
        request_bytes: req,
        reply_bytes: rep,
        server_cpu: spec.server_cpu,
        bulk_iops_ceiling,
        bulk_busy_mib_per_s: bw_busy,
        bulk_blocking_mib_per_s: bw_blocking,
        batched_qd: qd,
        batched_polling,
        batched_iops,
        batched_mib_per_s: mib(batched_iops),
        batched_latency_us_p50: batched_p50,
        batched_latency_us_p99: us(b.latency_ns.value_at_quantile(0.99)),
        batched_busy_iops: busy_iops,
        batched_blocking_iops: blocking_iops,
        batched_client_requests_per_write: per(b.requests_total, b.writes),
        batched_client_replies_per_read: per(b.replies_total, b.reads),
        batched_server_requests_per_read: per(bst.requests_answered, bst.reads),
        batched_server_replies_per_write: per(bst.requests_answered, bst.writes),
        busy_pingpong_latency_us_p50: busy_p50,
        busy_pingpong_latency_us_p99: us(pp.latency_ns.value_at_quantile(0.99)),
        busy_pingpong_latency_us_mean: pp.latency_ns.mean() / 1000.0,
        busy_pingpong_rtt_per_s: rate(&pp),
        floor_basis,
        floor_iops,
        floor_mib_per_s: mib(floor_iops),
        floor_latency_us_p50,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod tests {
    use super::*;

    /// A small deterministic generator of piece sizes.
    fn pieces(seed: u64, max: usize) -> impl Iterator<Item = usize> {
        let mut x = seed | 1;
        std::iter::from_fn(move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Some((x % max as u64) as usize)
        })
    }

    #[test]
    fn counter_counts_only_whole_messages() {
        let mut c = MessageCounter::new(4112);
        assert_eq!(c.feed(4111), 0);
        assert_eq!(c.partial_bytes(), 4111);
        assert_eq!(c.feed(1), 1);
        assert_eq!(c.feed(3 * 4112 + 5), 3);
        assert_eq!(c.partial_bytes(), 5);
        assert_eq!(c.feed(0), 0);
        assert_eq!(c.total(), 4);
    }

    #[test]
    fn counter_is_independent_of_how_the_stream_is_cut() {
        for (msg, seed) in [(24, 1), (72, 2), (4112, 3), (131_088, 4)] {
            let mut c = MessageCounter::new(msg);
            let mut bytes = 0usize;
            for n in pieces(seed, 3 * msg + 7).take(2000) {
                let before = c.total();
                let done = c.feed(n);
                bytes += n;
                assert_eq!(c.total(), before + done);
                assert_eq!(c.total() as usize, bytes / msg, "msg {msg}");
                assert_eq!(c.partial_bytes(), bytes % msg);
            }
        }
    }

    /// Client and server state machines joined by two byte pipes cut at
    /// random: every request is answered once, replies are never counted
    /// before they are whole, and at most qd are outstanding.
    #[test]
    fn requester_and_answerer_agree_over_random_cuts() {
        for (qd, write, seed) in [(1, false, 5), (32, false, 6), (8, true, 7), (3, true, 8)] {
            let spec = FloorSpec {
                qd,
                block_size: 4096,
                write,
                server_cpu: None,
            };
            let (req, rep) = spec.message_bytes();
            let mut r = Requester::new(qd, req, rep);
            let mut a = Answerer::new(req, rep);
            let (mut up, mut down) = (0usize, 0usize); // bytes in flight per direction
            let mut cuts = pieces(seed, 2 * qd as usize * req.max(rep) + 1);
            let mut batches = 0;
            for _ in 0..5000 {
                if r.inflight() < qd {
                    let k = r.refill();
                    assert!(k >= 1);
                    batches += 1;
                }
                assert_eq!(r.inflight(), qd);
                let w = cuts.next().unwrap().min(r.tx_pending());
                r.wrote(w);
                up += w;
                let n = cuts.next().unwrap().min(up);
                up -= n;
                a.read(n);
                let w = cuts.next().unwrap().min(a.owed());
                a.wrote(w);
                down += w;
                let n = cuts.next().unwrap().min(down);
                down -= n;
                let before = r.replies();
                r.read(n);
                // Replies counted = whole replies delivered so far.
                let delivered = (r.replies() - before) as usize * rep + r.partial_reply_bytes();
                assert!(delivered >= n && delivered - n < rep);
                assert!(r.replies() <= a.answered());
                assert!(a.answered() <= r.queued());
            }
            // Drain: everything queued is answered and received, once.
            while r.tx_pending() + up + a.owed() + down > 0 {
                let w = r.tx_pending();
                r.wrote(w);
                a.read(up + w);
                up = 0;
                let w = a.owed();
                a.wrote(w);
                r.read(down + w);
                down = 0;
            }
            assert_eq!(r.inflight(), 0);
            assert_eq!(r.replies(), r.queued());
            assert_eq!(a.answered(), r.queued());
            assert_eq!(r.partial_reply_bytes(), 0);
            assert!(batches < r.queued() || qd == 1, "refills are batched");
        }
    }

    fn check_run(run: &BatchedRun, st: &ServeStats, qd: u32, rep: usize) {
        assert!(run.replies_total > 0);
        assert_eq!(
            run.replies_total, run.requests_total,
            "every request answered"
        );
        assert_eq!(
            st.requests_answered, run.requests_total,
            "server answered each once"
        );
        assert_eq!(
            run.reply_bytes_read,
            run.replies_total * rep as u64,
            "no partial reply"
        );
        assert_eq!(st.reply_bytes_written, run.reply_bytes_read);
        assert!(run.replies_in_window <= run.replies_total);
        assert!(run.replies_total - run.replies_in_window <= qd as u64);
        assert_eq!(run.latency_ns.len(), run.replies_total);
        assert!(run.writes <= run.requests_total && run.reads <= run.replies_total * rep as u64);
    }

    #[test]
    fn batched_loop_over_loopback_counts_every_reply_once() {
        let srv = Server::start(None).unwrap();
        for polling in [Polling::Busy, Polling::Blocking] {
            for (qd, bs, write) in [(32, 4096, false), (1, 4096, false), (4, 131_072, true)] {
                let spec = FloorSpec {
                    qd,
                    block_size: bs,
                    write,
                    server_cpu: None,
                };
                let (req, rep) = spec.message_bytes();
                // A read buffer that cuts replies (and is not a multiple of them).
                for read_buf in [1000, CLIENT_READ_BYTES] {
                    let (run, st) = batched(
                        &srv,
                        polling,
                        qd,
                        req,
                        rep,
                        read_buf,
                        Duration::from_millis(20),
                    )
                    .unwrap();
                    check_run(&run, &st, qd, rep);
                }
            }
        }
    }

    #[test]
    fn server_answers_requests_split_across_reads() {
        // A blocking server on one end of a loopback pair, requests written
        // in odd pieces by hand.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let srv = std::thread::spawn(move || serve_batched(&mut s, Polling::Blocking, 72, 100));
        let reqs = vec![0u8; 10 * 72 + 30];
        for chunk in reqs.chunks(37) {
            c.write_all(chunk).unwrap();
        }
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        let st = srv.join().unwrap().unwrap();
        // The 30 trailing bytes are no request: they get no reply.
        assert_eq!(st.requests_answered, 10);
        assert_eq!(got.len(), 10 * 100);
        assert_eq!(st.reply_bytes_written, 1000);
    }

    #[test]
    fn message_shapes_follow_the_workload() {
        let mut s = FloorSpec::reads_4k(32);
        assert_eq!(s.message_bytes(), (72, 4112));
        s.block_size = 131_072;
        assert_eq!(s.message_bytes(), (72, 16 + 131_072));
        s.write = true;
        assert_eq!(s.message_bytes(), (72 + 131_072, 24));
    }

    #[test]
    fn measure_reports_a_consistent_floor() {
        for spec in [
            FloorSpec::reads_4k(1),
            FloorSpec::reads_4k(8),
            FloorSpec {
                qd: 4,
                block_size: 131_072,
                write: false,
                server_cpu: None,
            },
        ] {
            let f = measure(spec, Duration::from_millis(40)).unwrap();
            assert!(f.batched_iops > 0.0 && f.bulk_iops_ceiling > 0.0, "{f:?}");
            assert!(f.busy_pingpong_latency_us_p50 > 0.0, "{f:?}");
            assert!(f.batched_iops == f.batched_busy_iops.max(f.batched_blocking_iops));
            let expect = if spec.qd == 1 {
                vec![FloorBasis::BusyRtt, FloorBasis::BlockingRtt]
            } else if spec.block_size >= LARGE_BLOCK_BYTES {
                vec![FloorBasis::Bulk, FloorBasis::Batched]
            } else {
                vec![
                    FloorBasis::Batched,
                    FloorBasis::EchoPipelined,
                    FloorBasis::Bulk,
                ]
            };
            assert!(expect.contains(&f.floor_basis), "{f:?}");
            if spec.qd > 1 && spec.block_size < LARGE_BLOCK_BYTES {
                assert!(f.floor_iops <= f.bulk_iops_ceiling + 1e-6, "{f:?}");
            }
            if spec.qd > 1 && spec.block_size >= LARGE_BLOCK_BYTES {
                assert!(
                    f.floor_iops >= f.bulk_iops_ceiling.max(f.batched_iops),
                    "{f:?}"
                );
            }
            assert!(f.bulk_mib_per_s == f.bulk_busy_mib_per_s.max(f.bulk_blocking_mib_per_s));
            assert!(f.batched_client_requests_per_write >= 1.0, "{f:?}");
        }
    }
}
