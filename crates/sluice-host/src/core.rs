//! Sans-IO core of one NVMe/TCP queue pair (one TCP connection).
//!
//! [`QueuePairCore`] never touches a socket or a clock. The I/O layer feeds
//! it received bytes ([`QueuePairCore::read_bufs`] + [`QueuePairCore::handle_read`],
//! or [`QueuePairCore::handle_bytes`]), submits commands
//! ([`QueuePairCore::submit`]), passes the current time in, and drains
//! [`QueuePairCore::poll_transmit`] (bytes to write) and
//! [`QueuePairCore::poll_event`] (completions, timeouts, connection loss).
//! [`QueuePairCore::poll_timeout`] tells when [`QueuePairCore::handle_timeout`]
//! must be called next.
//!
//! The core owns the command slots (found by CID: the slot's index and its
//! generation, so a CID names one command, not one slot), answers R2Ts with
//! H2CData PDUs split at MAXH2CDATA, reassembles C2HData, and checks every
//! received PDU against the command it claims to belong to. A controller that
//! breaks the protocol gets an H2CTermReq with the matching FES and the
//! connection is closed; all its commands fail.

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::command::{admin, sgl, Cqe, SglDescriptor, Sqe};
use sluice_proto::digest::crc32c;
use sluice_proto::framer::{copy_into_two, Framer, InPlace, RxPdu};
use sluice_proto::outbuf::{Attachment, SharedBytes};
use sluice_proto::pdu::{
    encode_pdu, encode_prefix, term_req_for, DataHeader, DecodeError, Direction, IcReq, PduHeader,
    R2t, TxParams, DIGEST_LEN, SHORT_HLEN,
};
use sluice_proto::send::{Immediate, PduClass, SendScheduler, SendStats};
use sluice_proto::Status;

use crate::error::{HostError, Result};

/// Most command slots one queue pair may have.
pub const QUEUE_DEPTH_MAX: u16 = 1024;
/// A CID is its slot's index in the low [`CID_SLOT_BITS`] bits and the
/// slot's generation above them, advanced each time the slot is taken
/// (as Linux's host does): a PDU for a command that already completed
/// names a CID no command holds, even once its slot serves another
/// command (until the slot has taken [`CID_GENERATIONS`] more commands
/// and the generation wraps), so a late or repeated C2HData, R2T or
/// CapsuleResp is refused
/// instead of being taken for the new command's, and H2CData that a
/// controller solicited for a command it then completed early cannot be
/// taken for the new one either.
const CID_SLOT_BITS: u32 = 12;
const CID_SLOT_MASK: u16 = (1 << CID_SLOT_BITS) - 1;
/// Generations per slot (4 bits: the highest CID is 0xF3FF, never 0xFFFF).
const CID_GENERATIONS: u8 = 16;
const _: () = assert!(QUEUE_DEPTH_MAX - 1 <= CID_SLOT_MASK);
/// SQE flags byte: PSDT = 01b (SGL for data), as NVMe over Fabrics requires.
const SQE_FLAGS_SGL: u8 = 0x40;
/// The shortest PDU a controller sends for a command: a CapsuleResp (8-byte
/// header, 16-byte CQE), or a C2HData header (24 bytes) before its data.
const RX_PDU_MIN_BYTES: usize = 24;
/// A C2HData PDU with at least this much data still to come has the rest
/// read straight into its command's buffer (see [`QueuePairCore::read_bufs`]).
const DIRECT_RX_REST_MIN_BYTES: usize = 16 * 1024;
/// While data goes straight into a command's buffer, the same read gives
/// the framer at most this much: room for what follows (the data digest,
/// a response, the next PDU's header). More would let the head of a
/// following large PDU in, to be copied out again.
const DIRECT_RX_TAIL_BYTES: usize = 8 * 1024;

/// Static parameters of one queue pair.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Queue ID (0 = admin), for logs and synthesized CQEs.
    pub qid: u16,
    /// Number of command slots (CIDs 0..depth), at most [`QUEUE_DEPTH_MAX`].
    pub depth: u16,
    /// Ask for header digests.
    pub hdr_digest: bool,
    /// Ask for data digests.
    pub data_digest: bool,
    /// Largest write sent in-capsule (0 = never in-capsule).
    pub in_capsule_max_bytes: u32,
    /// Per-command timeout (also bounds the ICReq/ICResp exchange).
    pub command_timeout: Duration,
    /// Largest C2HData payload accepted in one PDU (and largest read).
    pub c2h_data_max_bytes: u32,
}

/// What a command transfers.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload {
    None,
    /// Controller-to-host transfer of this many bytes (into a new,
    /// zeroed buffer).
    Read(u32),
    /// Controller-to-host transfer into this buffer: its length is the
    /// transfer's, its contents are overwritten, and it comes back as the
    /// completion's data. Lets a caller recycle read buffers instead of
    /// allocating and zeroing one per read.
    ReadInto(Vec<u8>),
    /// Controller-to-host transfer into memory the caller lends for the
    /// command's life (its length is the transfer's): the data lands
    /// there with no copy on this side, and the completion's data is
    /// empty. See [`LentBuf`].
    ReadLent(LentBuf),
    /// Host-to-controller transfer (in-capsule or solicited by R2T).
    Write(Vec<u8>),
}

impl Payload {
    /// A second payload like this one, for sending the command again (a
    /// retry after a reconnection); `None` for a [`Payload::ReadLent`],
    /// whose memory only one command may hold.
    pub fn duplicate(&self) -> Option<Payload> {
        match self {
            Payload::None => Some(Payload::None),
            Payload::Read(n) => Some(Payload::Read(*n)),
            Payload::ReadInto(b) => Some(Payload::ReadInto(b.clone())),
            Payload::ReadLent(_) => None,
            Payload::Write(d) => Some(Payload::Write(d.clone())),
        }
    }
}

/// Memory outside the queue that a read's data lands in, lent by the
/// caller for the command's life: the buffer the kernel takes a FUSE
/// reply from, for example, so that the data is not copied there from a
/// buffer of the queue's. The queue writes into it, never reads it for
/// the caller, and never frees it.
#[derive(Debug, PartialEq, Eq)]
pub struct LentBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: a `LentBuf` is the only way to its bytes while it lives (the
// contract of `LentBuf::new`); sending it to another thread moves that
// access with it.
unsafe impl Send for LentBuf {}

impl LentBuf {
    /// Lends the `len_bytes` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// The bytes must stay allocated and valid for writes, and nothing
    /// else may read, write or free them, until the queue is done with
    /// them: it handed out the command's completion (data, error or
    /// timeout: a read that times out stops writing here at once), or
    /// refused the command at submission, or was dropped.
    pub unsafe fn new(ptr: NonNull<u8>, len_bytes: usize) -> Self {
        Self { ptr, len_bytes }
    }

    /// How many bytes are lent.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the lender promised (`new`) that the bytes are valid
        // for writes and reached only through this value, which
        // `&mut self` borrows exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }
}

/// Where a read's data lands: a buffer of the queue's (handed out as the
/// completion's data) or one the caller lent.
#[derive(Debug)]
enum ReadBuf {
    Owned(Vec<u8>),
    Lent(LentBuf),
}

impl ReadBuf {
    fn len(&self) -> usize {
        match self {
            ReadBuf::Owned(v) => v.len(),
            ReadBuf::Lent(l) => l.len_bytes(),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            ReadBuf::Owned(v) => v,
            ReadBuf::Lent(l) => l.as_mut_slice(),
        }
    }

    /// The completion's data: the queue's buffer, or nothing for a lent one.
    fn into_data(self) -> Vec<u8> {
        match self {
            ReadBuf::Owned(v) => v,
            ReadBuf::Lent(_) => Vec::new(),
        }
    }
}

/// A successfully completed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub cqe: Cqe,
    /// The data of a read; for a write, the buffer it sent, handed back so
    /// the caller can reuse it (empty for commands without data, and for a
    /// read into a [`LentBuf`], whose data is in the lender's memory).
    pub data: Vec<u8>,
}

/// Outputs of the core other than bytes to send.
#[derive(Debug)]
pub enum Event {
    /// A command finished (or failed); `token` is the caller's.
    Complete {
        token: u64,
        result: Result<Completion>,
    },
    /// A command timed out: the caller may send an Abort for `cid` on the
    /// admin queue. Its slot stays reserved until a late completion arrives.
    TimedOut { qid: u16, cid: u16, opcode: u8 },
    /// The connection became unusable; every command was failed.
    Closed(HostError),
}

#[derive(Debug)]
enum Data {
    None,
    Read {
        buf: ReadBuf,
        received: u32,
    },
    /// In-capsule write: nothing more to send; the buffer goes back with
    /// the completion. Shared with the send scheduler while its bytes are
    /// attached to the capsule and not yet written.
    InCapsule {
        buf: Arc<Vec<u8>>,
    },
    /// Write waiting for R2Ts; `sent` bytes were sent so far. Shared with
    /// the send scheduler like an in-capsule write's buffer.
    Solicited {
        buf: Arc<Vec<u8>>,
        sent: u32,
    },
}

#[derive(Debug)]
struct Slot {
    /// Its CID on the wire (generation and slot index).
    cid: u16,
    token: u64,
    opcode: u8,
    deadline: Instant,
    data: Data,
    /// The caller was already told (timeout); only waiting to free the CID.
    timed_out: bool,
    /// An Asynchronous Event Request: the controller holds it until it has
    /// an event, so it has no deadline and a queue shutting down does not
    /// wait for it.
    held: bool,
    /// C2HData with LAST_PDU was seen.
    data_done: bool,
    /// An error to report at completion (e.g. data digest mismatch).
    error: Option<HostError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// ICReq sent, waiting for ICResp.
    Init,
    Ready,
    Closed,
}

/// The negotiated connection parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Controller PDU data alignment (0's based dwords) for H2C data.
    pub cpda: u8,
    /// Largest H2CData payload the controller accepts.
    pub maxh2cdata_bytes: u32,
}

#[derive(Debug)]
struct State {
    cfg: CoreConfig,
    phase: Phase,
    init_deadline: Instant,
    tx_params: TxParams,
    negotiated: Option<Negotiated>,
    /// Commands by slot index (a CID's low bits).
    slots: Vec<Option<Slot>>,
    /// The generation each slot's next command gets.
    generations: Vec<u8>,
    /// Free slot indexes.
    free: Vec<u16>,
    /// The send path: a scheduler (immediate by default; unified or isolated
    /// freights per `ConnectOptions::send`, see docs/isolation.md).
    tx: Box<dyn SendScheduler>,
    events: VecDeque<Event>,
    in_flight: usize,
    /// Of `in_flight`, the held Asynchronous Event Requests.
    held: usize,
}

/// A C2HData PDU whose data is being read straight into its command's
/// buffer, past the framer.
#[derive(Debug)]
struct DirectRx {
    header: DataHeader,
    /// Its raw header, for quoting in a TermReq.
    raw_header: [u8; SHORT_HLEN],
    /// The rest of its data, in the command's read buffer.
    rest: InPlace,
    /// A data digest follows the data.
    ddgst: bool,
}

/// The sans-IO state machine of one queue pair.
#[derive(Debug)]
pub struct QueuePairCore {
    framer: Framer,
    st: State,
    direct_rx: Option<DirectRx>,
    /// Data bytes read straight into command buffers (past the framer).
    rx_direct_bytes: u64,
}

impl QueuePairCore {
    /// A new connection: the ICReq is queued for transmission at once.
    pub fn new(cfg: CoreConfig, now: Instant) -> Self {
        Self::with_scheduler(cfg, now, Box::new(Immediate::new()))
    }

    /// Like [`Self::new`], with `tx` as the send path (read commands go to
    /// its latency freight, writes with in-capsule data and H2CData to its
    /// data freight).
    pub fn with_scheduler(
        mut cfg: CoreConfig,
        now: Instant,
        mut tx: Box<dyn SendScheduler>,
    ) -> Self {
        cfg.depth = cfg.depth.clamp(1, QUEUE_DEPTH_MAX);
        let icreq = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: cfg.hdr_digest,
            ddgst: cfg.data_digest,
            maxr2t: 0,
        };
        encode_pdu(
            &PduHeader::IcReq(icreq),
            &[],
            &TxParams::default(),
            tx.buffer(PduClass::Control),
        );
        tx.commit(PduClass::Control, now);
        let framer = Framer::new(Direction::ControllerToHost, cfg.c2h_data_max_bytes);
        QueuePairCore {
            framer,
            st: State {
                slots: (0..cfg.depth).map(|_| None).collect(),
                generations: vec![0; usize::from(cfg.depth)],
                free: (0..cfg.depth).rev().collect(),
                init_deadline: now + cfg.command_timeout,
                cfg,
                phase: Phase::Init,
                tx_params: TxParams::default(),
                negotiated: None,
                tx,
                events: VecDeque::new(),
                in_flight: 0,
                held: 0,
            },
            direct_rx: None,
            rx_direct_bytes: 0,
        }
    }

    pub fn qid(&self) -> u16 {
        self.st.cfg.qid
    }
    /// ICResp was received and accepted.
    pub fn is_ready(&self) -> bool {
        self.st.phase == Phase::Ready
    }
    pub fn is_closed(&self) -> bool {
        self.st.phase == Phase::Closed
    }
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.st.negotiated
    }
    /// Commands whose slot is taken (timed-out ones included), not counting
    /// held Asynchronous Event Requests (which complete only when the
    /// controller has an event).
    pub fn in_flight(&self) -> usize {
        self.st.in_flight - self.st.held
    }
    /// C2HData bytes the socket wrote straight into command buffers (the
    /// rest of large PDUs; see [`Self::read_bufs`]).
    pub fn rx_direct_bytes(&self) -> u64 {
        self.rx_direct_bytes
    }

    /// A lower bound on the bytes the controller still sends for the
    /// commands outstanding, if none fails: each one's read data not
    /// received yet and one PDU header more (its CapsuleResp, or the
    /// C2HData carrying the rest), less what already arrived of a PDU
    /// under way. Timed-out commands count nothing. A host that sleeps
    /// until part of this has arrived (`SO_RCVLOWAT`) waits for bytes that
    /// do come; a command that fails early sends less, so such a sleep
    /// still needs a deadline.
    pub fn rx_due_min_bytes(&self) -> usize {
        let mut due = 0usize;
        for s in self.st.slots.iter().flatten() {
            if s.timed_out {
                continue;
            }
            due += RX_PDU_MIN_BYTES;
            if let Data::Read { buf, received } = &s.data {
                due += buf.len().saturating_sub(*received as usize);
            }
        }
        // A C2HData PDU under way straight into its command's buffer: its
        // header and its data so far have arrived (`received` counts the
        // data only once the PDU is whole, and the header stood for the
        // command's one PDU more). Bytes of the next PDU may wait in the
        // framer.
        let under_way = self.direct_rx.as_ref().map_or(0, |d| {
            RX_PDU_MIN_BYTES + (d.header.len as usize).saturating_sub(d.rest.left)
        });
        due.saturating_sub(under_way + self.framer.buffered())
    }
    /// Whether [`Self::submit`] would accept a command now.
    pub fn can_submit(&self) -> bool {
        self.st.phase == Phase::Ready && !self.st.free.is_empty()
    }
    /// Changes the in-capsule limit (known only after Identify Controller).
    pub fn set_in_capsule_max_bytes(&mut self, n: u32) {
        self.st.cfg.in_capsule_max_bytes = n;
    }

    /// Queues a command. The CID and SGL of `sqe` are filled in here.
    /// Returns the CID.
    pub fn submit(
        &mut self,
        now: Instant,
        mut sqe: Sqe,
        payload: Payload,
        token: u64,
    ) -> Result<u16> {
        let st = &mut self.st;
        if st.phase != Phase::Ready {
            return Err(HostError::ConnectionLost(format!(
                "queue {} is not ready",
                st.cfg.qid
            )));
        }
        let len = match &payload {
            Payload::None => 0,
            Payload::Read(n) => read_len(u64::from(*n), st.cfg.c2h_data_max_bytes)?,
            Payload::ReadInto(b) => read_len(b.len() as u64, st.cfg.c2h_data_max_bytes)?,
            Payload::ReadLent(b) => read_len(b.len_bytes() as u64, st.cfg.c2h_data_max_bytes)?,
            Payload::Write(d) => u32::try_from(d.len()).map_err(|_| {
                HostError::InvalidArgument(format!("write of {} bytes is too large", d.len()))
            })?,
        };
        let Some(index) = st.free.pop() else {
            return Err(HostError::InvalidArgument(format!(
                "queue {} full ({} commands)",
                st.cfg.qid, st.cfg.depth
            )));
        };
        let generation = &mut st.generations[usize::from(index)];
        let cid = (u16::from(*generation) << CID_SLOT_BITS) | index;
        *generation = (*generation + 1) % CID_GENERATIONS;
        sqe.set_cid(cid);
        sqe.0[1] = (sqe.0[1] & 0x3f) | SQE_FLAGS_SGL;
        let opcode = sqe.opcode();
        let data = match payload {
            Payload::None => {
                sqe.set_sgl(SglDescriptor {
                    address: 0,
                    length: 0,
                    id: sgl::TRANSPORT_DATA_BLOCK,
                });
                Data::None
            }
            Payload::Read(_) | Payload::ReadInto(_) | Payload::ReadLent(_) => {
                sqe.set_sgl(SglDescriptor {
                    address: 0,
                    length: len,
                    id: sgl::TRANSPORT_DATA_BLOCK,
                });
                let buf = match payload {
                    Payload::ReadInto(b) => ReadBuf::Owned(b),
                    Payload::ReadLent(b) => ReadBuf::Lent(b),
                    _ => ReadBuf::Owned(vec![0; len as usize]),
                };
                Data::Read { buf, received: 0 }
            }
            Payload::Write(buf) => {
                if len <= st.cfg.in_capsule_max_bytes {
                    sqe.set_sgl(SglDescriptor {
                        address: 0,
                        length: len,
                        id: sgl::DATA_BLOCK_OFFSET,
                    });
                    Data::InCapsule { buf: Arc::new(buf) }
                } else {
                    sqe.set_sgl(SglDescriptor {
                        address: 0,
                        length: len,
                        id: sgl::TRANSPORT_DATA_BLOCK,
                    });
                    Data::Solicited {
                        buf: Arc::new(buf),
                        sent: 0,
                    }
                }
            }
        };
        // Isolated path: writes carrying data are bulk, every other command
        // capsule (reads, admin, writes solicited by R2T) is latency-bound.
        let class = match &data {
            Data::InCapsule { buf } => {
                encode_with_data(
                    &PduHeader::CapsuleCmd(sqe),
                    buf,
                    0..buf.len(),
                    &st.tx_params,
                    st.tx.as_mut(),
                    PduClass::Data,
                );
                PduClass::Data
            }
            _ => {
                encode_pdu(
                    &PduHeader::CapsuleCmd(sqe),
                    &[],
                    &st.tx_params,
                    st.tx.buffer(PduClass::Command),
                );
                PduClass::Command
            }
        };
        st.tx.commit_cmd(class, cid, now);
        let held = st.cfg.qid == 0 && opcode == admin::ASYNC_EVENT_REQUEST;
        st.slots[usize::from(index)] = Some(Slot {
            cid,
            token,
            opcode,
            deadline: now + st.cfg.command_timeout,
            data,
            timed_out: false,
            held,
            data_done: false,
            error: None,
        });
        st.in_flight += 1;
        st.held += usize::from(held);
        tracing::trace!(qid = st.cfg.qid, cid, opcode, len, "submit");
        Ok(cid)
    }

    /// Bytes to write to the socket, all that the send scheduler made due,
    /// in order. Held PDUs become due at [`Self::send_deadline`].
    /// Whole PDUs: attached write data is copied in with its headers.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        if self.st.tx.due_len() == 0 {
            return None;
        }
        let v = self.st.tx.due_copy();
        self.st.tx.consume(v.len());
        Some(v)
    }

    /// The first run of bytes due for the socket, for an I/O layer that
    /// writes them itself and then calls [`Self::transmit_consume`] with
    /// what the socket took: no copy out of the send scheduler
    /// ([`Self::poll_transmit`] copies). Empty when nothing is due.
    pub fn transmit_due(&self) -> &[u8] {
        self.st.tx.due()
    }

    /// One vectored write of the due bytes (up to [`TRANSMIT_RUNS_MAX`]
    /// runs; write data of at least [`WRITE_ATTACH_BYTES_MIN`] is a run of
    /// its own, sent from the caller's buffer) to `w`, consuming what it
    /// took: `Ok(None)` when nothing was
    /// due, `Ok(Some(n))` for `n` bytes written (0: the peer takes no more).
    pub fn transmit_to(&mut self, w: &mut impl Write) -> std::io::Result<Option<usize>> {
        let mut runs = [IoSlice::new(&[]); TRANSMIT_RUNS_MAX];
        let k = self.st.tx.due_vectored(&mut runs);
        let n = match k {
            0 => return Ok(None),
            1 => w.write(&runs[0])?,
            _ => w.write_vectored(&runs[..k])?,
        };
        self.transmit_consume(n);
        Ok(Some(n))
    }

    /// Marks the first `n` bytes of [`Self::transmit_due`] as written.
    pub fn transmit_consume(&mut self, n: usize) {
        debug_assert!(n <= self.st.tx.due_len(), "consumed more than was due");
        self.st.tx.consume(n);
    }

    /// Whether anything is due or held by the send scheduler.
    pub fn has_transmit(&self) -> bool {
        self.st.tx.backlog_bytes() > 0
    }

    /// Runs the send scheduler's timers (flushes freights whose timer is due).
    pub fn poll_send(&mut self, now: Instant) {
        self.st.tx.poll(now);
    }

    /// The caller has handed in its batch (or the I/O layer has read all
    /// there was): a send path that flushes when idle
    /// (`SendConfig::flush_when_idle`) makes what it holds due.
    pub fn handle_idle(&mut self, now: Instant) {
        self.st.tx.idle(now);
    }

    /// When [`Self::poll_send`] must next run (a freight holds PDUs).
    pub fn send_deadline(&self) -> Option<Instant> {
        self.st.tx.next_deadline()
    }

    /// Counters of the send scheduler (flushes, reasons, freight waits).
    pub fn send_stats(&self) -> SendStats {
        self.st.tx.stats()
    }

    /// The next output event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.st.events.pop_front()
    }

    /// Buffers for the socket to read into, in order (one `readv`); follow
    /// with [`Self::handle_read`]. The first is empty unless a large
    /// C2HData PDU is under way: then it is the rest of that PDU's data,
    /// in its command's own buffer, so the bulk of a large read is copied
    /// once (by the kernel) instead of twice. The second is the framer's.
    pub fn read_bufs(&mut self) -> (&mut [u8], &mut [u8]) {
        let Self {
            framer,
            st,
            direct_rx,
            ..
        } = self;
        if let Some(d) = direct_rx.as_ref().filter(|d| d.rest.left > 0) {
            if let Some(dest) = st.read_buf_of(d.header.cccid) {
                let tail = framer.read_buf();
                let n = tail.len().min(DIRECT_RX_TAIL_BYTES);
                return (&mut dest[d.rest.range()], &mut tail[..n]);
            }
        }
        // One read chunk at most: a read that took in the whole of a large
        // PDU would leave nothing to receive in place.
        let chunk = framer.read_chunk();
        let b = framer.read_buf();
        let n = b.len().min(chunk);
        (&mut [], &mut b[..n])
    }

    /// `n` bytes were read into [`Self::read_bufs`] (the first buffer
    /// fills before the second).
    pub fn handle_read(&mut self, now: Instant, n: usize) {
        if self.st.phase == Phase::Closed {
            return;
        }
        let past = self.direct_rx.as_mut().map_or(n, |d| d.rest.take(n));
        self.rx_direct_bytes += (n - past) as u64;
        self.framer.advance(past);
        self.process(now);
    }

    /// Received bytes (copying variant, for tests and in-memory peers).
    pub fn handle_bytes(&mut self, now: Instant, mut data: &[u8]) {
        while !data.is_empty() {
            if self.st.phase == Phase::Closed {
                return;
            }
            let (a, b) = self.read_bufs();
            let n = copy_into_two(data, a, b);
            self.handle_read(now, n);
            data = &data[n..];
        }
    }

    /// Reads from `src` once into [`Self::read_bufs`] and handles what
    /// came (`Ok(0)`: end of stream). For I/O layers over a byte stream.
    pub fn read_from(&mut self, now: Instant, src: &mut impl Read) -> std::io::Result<usize> {
        self.read_draining(now, src).map(|(n, _)| n)
    }

    /// [`Self::read_from`], also saying whether the read *drained* the
    /// source: it returned bytes, but fewer than there was room for, so a
    /// stream socket held no more at that moment. An edge-triggered caller
    /// may then wait for the next readiness event instead of paying one more
    /// `recv` to see `EWOULDBLOCK` (bytes arriving later raise a new edge).
    pub fn read_draining(
        &mut self,
        now: Instant,
        src: &mut impl Read,
    ) -> std::io::Result<(usize, bool)> {
        let (a, b) = self.read_bufs();
        let room = a.len() + b.len();
        let n = if a.is_empty() {
            src.read(b)?
        } else {
            src.read_vectored(&mut [IoSliceMut::new(a), IoSliceMut::new(b)])?
        };
        if n > 0 {
            self.handle_read(now, n);
        }
        Ok((n, n > 0 && n < room))
    }

    /// The peer closed the connection or the socket failed.
    pub fn handle_connection_lost(&mut self, reason: &str) {
        self.st.close(HostError::ConnectionLost(reason.to_string()));
    }

    /// Closes the queue pair locally, failing outstanding commands.
    pub fn close(&mut self, reason: &str) {
        self.handle_connection_lost(reason);
    }

    /// When [`Self::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.st.phase {
            Phase::Init => Some(self.st.init_deadline),
            Phase::Closed => None,
            Phase::Ready => self
                .st
                .slots
                .iter()
                .flatten()
                .filter(|s| !s.held)
                .map(|s| s.deadline)
                .min(),
        }
    }

    /// Expires commands whose deadline passed. A timed-out command fails at
    /// once; if it still has not completed after a second timeout period the
    /// controller is considered unresponsive and the connection closes.
    pub fn handle_timeout(&mut self, now: Instant) {
        let st = &mut self.st;
        match st.phase {
            Phase::Closed => {}
            Phase::Init => {
                if now >= st.init_deadline {
                    st.close(HostError::Timeout {
                        opcode: 0,
                        cid: 0,
                        timeout_ms: millis(st.cfg.command_timeout),
                    });
                }
            }
            Phase::Ready => {
                let timeout = st.cfg.command_timeout;
                let mut unresponsive = false;
                for slot in st.slots.iter_mut() {
                    let Some(slot) = slot.as_mut() else {
                        continue;
                    };
                    let cid = slot.cid;
                    if slot.held || slot.deadline > now {
                        continue;
                    }
                    if slot.timed_out {
                        unresponsive = true;
                        continue;
                    }
                    slot.timed_out = true;
                    slot.deadline = now + timeout;
                    if let Data::Read { buf, .. } = &mut slot.data {
                        if let ReadBuf::Lent(l) = buf {
                            // The lender gets its memory back with the
                            // timeout: late data lands in a scratch buffer.
                            *buf = ReadBuf::Owned(vec![0; l.len_bytes()]);
                        }
                    }
                    let err = HostError::Timeout {
                        opcode: slot.opcode,
                        cid,
                        timeout_ms: millis(timeout),
                    };
                    tracing::warn!(
                        qid = st.cfg.qid,
                        cid,
                        opcode = slot.opcode,
                        "command timed out"
                    );
                    st.events.push_back(Event::Complete {
                        token: slot.token,
                        result: Err(err),
                    });
                    st.events.push_back(Event::TimedOut {
                        qid: st.cfg.qid,
                        cid,
                        opcode: slot.opcode,
                    });
                }
                if unresponsive {
                    st.close(HostError::ConnectionLost(
                        "controller did not answer a timed-out command".into(),
                    ));
                }
            }
        }
    }

    fn process(&mut self, now: Instant) {
        loop {
            if self.st.phase == Phase::Closed {
                return;
            }
            if self.direct_rx.is_some() {
                if !self.finish_direct_rx(now) {
                    return;
                }
                continue;
            }
            let r = self.framer.next_pdu();
            match r {
                Ok(None) => {
                    if !self.split_direct_rx(now) {
                        return;
                    }
                }
                Ok(Some(pdu)) => {
                    let (res, set_init) = self.st.on_pdu(now, &pdu);
                    if let Err(e) = res {
                        let raw = pdu.raw_header.to_vec();
                        self.st.fatal(e, &raw, now);
                        return;
                    }
                    if let Some(n) = set_init {
                        self.framer.set_initialized(
                            n.hdr_digest,
                            n.data_digest,
                            0,
                            self.st.cfg.c2h_data_max_bytes,
                        );
                    }
                }
                Err(e) => {
                    let raw = self.framer.current_header().to_vec();
                    self.st.fatal(e.into(), &raw, now);
                    return;
                }
            }
        }
    }

    /// Splits a large C2HData PDU off the framer so that the rest of its
    /// data is read into its command's buffer. True when it did (the
    /// PDU's head is checked and copied; nothing else to process yet).
    fn split_direct_rx(&mut self, now: Instant) -> bool {
        if self.st.phase != Phase::Ready {
            return false;
        }
        let sp = match self.framer.split_data(DIRECT_RX_REST_MIN_BYTES) {
            Ok(None) => return false,
            Ok(Some(sp)) => sp,
            Err(e) => {
                let raw = self.framer.current_header().to_vec();
                self.st.fatal(e.into(), &raw, now);
                return false;
            }
        };
        let raw_header = sp.header_quote();
        let PduHeader::C2HData(header) = sp.header else {
            // The framer splits data PDUs only, and receives no H2CData here.
            let e = DecodeError::Sequence("data PDU of the wrong direction".into());
            self.st.fatal(e.into(), &raw_header, now);
            return false;
        };
        let head = sp.data_head;
        match self.st.c2h_dest(&header) {
            Ok(dest) => dest[..head.len()].copy_from_slice(head),
            Err(e) => {
                self.st.fatal(e, &raw_header, now);
                return false;
            }
        }
        self.direct_rx = Some(DirectRx {
            rest: InPlace {
                at: header.offset as usize + head.len(),
                left: sp.data_rest,
            },
            ddgst: sp.ddgst,
            header,
            raw_header,
        });
        true
    }

    /// Completes the split PDU once its data (and digest) is in. False:
    /// more bytes are needed, or the connection closed.
    fn finish_direct_rx(&mut self, now: Instant) -> bool {
        let Some(d) = self.direct_rx.as_ref() else {
            return true;
        };
        if d.rest.left > 0 {
            return false;
        }
        let digest_ok = if d.ddgst {
            let Some(b) = self.framer.take_bytes(DIGEST_LEN) else {
                return false;
            };
            let received = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let (from, len) = (d.header.offset as usize, d.header.len as usize);
            self.st
                .read_buf_of(d.header.cccid)
                .map(|buf| crc32c(&buf[from..from + len]) == received)
                .unwrap_or(true)
        } else {
            true
        };
        let Some(d) = self.direct_rx.take() else {
            return true;
        };
        if let Err(e) = self.st.c2h_done(&d.header, digest_ok) {
            self.st.fatal(e, &d.raw_header, now);
            return false;
        }
        true
    }
}

/// What went wrong with a PDU: fatal to the connection.
enum PduError {
    /// Report to the controller with an H2CTermReq.
    Decode(DecodeError),
    /// The controller terminated; no TermReq back.
    Terminated(HostError),
}

impl From<DecodeError> for PduError {
    fn from(e: DecodeError) -> Self {
        PduError::Decode(e)
    }
}

impl State {
    fn close(&mut self, err: HostError) {
        if self.phase == Phase::Closed {
            return;
        }
        tracing::debug!(qid = self.cfg.qid, error = %err, "queue pair closed");
        self.phase = Phase::Closed;
        for slot in self.slots.iter_mut() {
            if let Some(s) = slot.take() {
                if !s.timed_out {
                    self.events.push_back(Event::Complete {
                        token: s.token,
                        result: Err(err.clone()),
                    });
                }
            }
        }
        self.free.clear();
        self.in_flight = 0;
        self.held = 0;
        self.events.push_back(Event::Closed(err));
    }

    /// Drops every PDU not yet handed to the socket (due or held); what
    /// follows goes out at once.
    fn drop_unsent(&mut self) {
        self.tx = Box::new(Immediate::new());
    }

    fn fatal(&mut self, e: PduError, raw_header: &[u8], now: Instant) {
        match e {
            PduError::Decode(e) => {
                tracing::warn!(qid = self.cfg.qid, error = %e, "protocol violation, terminating connection");
                // Whole PDUs not yet handed to the socket are dropped: nothing
                // more but the TermReq goes out on this connection.
                self.drop_unsent();
                let tr = term_req_for(&e, raw_header);
                encode_pdu(
                    &PduHeader::H2CTermReq(tr.clone()),
                    &tr.data,
                    &TxParams::default(),
                    self.tx.buffer(PduClass::Control),
                );
                self.tx.commit(PduClass::Control, now);
                self.close(HostError::Protocol(e));
            }
            PduError::Terminated(err) => {
                self.drop_unsent();
                self.close(err);
            }
        }
    }

    /// The slot of the outstanding command `cid` (its generation too).
    fn slot_of(&mut self, cid: u16) -> Option<&mut Option<Slot>> {
        slot_entry(&mut self.slots, cid)
    }

    fn complete(&mut self, cid: u16, cqe: Cqe) {
        let Some(slot) = self.slot_of(cid).and_then(Option::take) else {
            return;
        };
        self.free.push(cid & CID_SLOT_MASK);
        self.in_flight -= 1;
        self.held -= usize::from(slot.held);
        if slot.timed_out {
            tracing::debug!(
                qid = self.cfg.qid,
                cid,
                "late completion of a timed-out command"
            );
            return;
        }
        let status = cqe.status();
        let result = if let Some(e) = slot.error {
            Err(e)
        } else if !status.is_success() {
            Err(HostError::Nvme {
                opcode: slot.opcode,
                status,
                result: cqe.result,
            })
        } else {
            match slot.data {
                Data::Read { buf, received } => {
                    if received as usize != buf.len() {
                        Err(HostError::Transport(format!(
                            "read completed with {received} of {} bytes transferred",
                            buf.len()
                        )))
                    } else {
                        Ok(Completion {
                            cqe,
                            data: buf.into_data(),
                        })
                    }
                }
                Data::Solicited { buf, sent } if sent as usize != buf.len() => {
                    Err(HostError::Transport(format!(
                        "write completed with {sent} of {} bytes transferred",
                        buf.len()
                    )))
                }
                Data::Solicited { buf, .. } | Data::InCapsule { buf } => Ok(Completion {
                    cqe,
                    data: take_written(buf),
                }),
                _ => Ok(Completion {
                    cqe,
                    data: Vec::new(),
                }),
            }
        };
        self.events.push_back(Event::Complete {
            token: slot.token,
            result,
        });
    }

    /// Handles one PDU. Returns the negotiated parameters when it was the ICResp.
    fn on_pdu(
        &mut self,
        now: Instant,
        pdu: &RxPdu<'_>,
    ) -> (std::result::Result<(), PduError>, Option<Negotiated>) {
        match &pdu.header {
            PduHeader::IcResp(r) => {
                if self.phase != Phase::Init {
                    return (
                        Err(DecodeError::Sequence("ICResp after initialization".into()).into()),
                        None,
                    );
                }
                if (r.hdgst && !self.cfg.hdr_digest) || (r.ddgst && !self.cfg.data_digest) {
                    return (
                        Err(DecodeError::invalid(
                            "dgst",
                            11,
                            "controller enabled a digest the host did not ask for",
                        )
                        .into()),
                        None,
                    );
                }
                let n = Negotiated {
                    hdr_digest: r.hdgst,
                    data_digest: r.ddgst,
                    cpda: r.cpda,
                    maxh2cdata_bytes: r.maxh2cdata,
                };
                self.tx_params = TxParams {
                    hdgst: r.hdgst,
                    ddgst: r.ddgst,
                    pda: r.cpda,
                };
                self.negotiated = Some(n);
                self.phase = Phase::Ready;
                tracing::debug!(qid = self.cfg.qid, ?n, "connection initialized");
                (Ok(()), Some(n))
            }
            PduHeader::C2HTermReq(t) => (
                Err(PduError::Terminated(HostError::TerminatedByController {
                    fes: t.fes,
                    fei: t.fei,
                })),
                None,
            ),
            PduHeader::CapsuleResp(cqe) => (self.on_capsule_resp(cqe), None),
            PduHeader::C2HData(d) => (self.on_c2h_data(d, pdu.data, pdu.data_digest_ok), None),
            PduHeader::R2t(r) => (self.on_r2t(r, now), None),
            other => (
                Err(DecodeError::Sequence(format!(
                    "unexpected PDU type {:#04x} at the host",
                    other.pdu_type()
                ))
                .into()),
                None,
            ),
        }
    }

    fn slot_mut(
        &mut self,
        cid: u16,
        field: &'static str,
        at: usize,
    ) -> Result<&mut Slot, DecodeError> {
        outstanding(&mut self.slots, cid, field, at)
    }

    fn on_capsule_resp(&mut self, cqe: &Cqe) -> std::result::Result<(), PduError> {
        // CQE CID sits at PDU byte 8 + 12.
        let slot = self.slot_mut(cqe.cid, "cid", 20)?;
        // All the bytes without LAST_PDU count as the data (as the Linux
        // and SPDK hosts take it); the length check in `complete` stays.
        if let Data::Read { buf, received } = &slot.data {
            if !slot.data_done
                && (*received as usize) < buf.len()
                && cqe.status().is_success()
                && !slot.timed_out
            {
                slot.error = Some(HostError::Transport(format!(
                    "successful read completion before its data (cid {})",
                    cqe.cid
                )));
            }
        }
        self.complete(cqe.cid, *cqe);
        Ok(())
    }

    fn on_c2h_data(
        &mut self,
        d: &DataHeader,
        data: &[u8],
        digest_ok: bool,
    ) -> std::result::Result<(), PduError> {
        self.c2h_dest(d)?.copy_from_slice(data);
        self.c2h_done(d, digest_ok)
    }

    /// The read buffer of the outstanding command `cid`, if it reads.
    fn read_buf_of(&mut self, cid: u16) -> Option<&mut [u8]> {
        match self.slot_of(cid)?.as_mut()?.data {
            Data::Read { ref mut buf, .. } => Some(buf.bytes_mut()),
            _ => None,
        }
    }

    /// Checks a C2HData header against its command; returns where its
    /// data goes.
    fn c2h_dest(&mut self, d: &DataHeader) -> std::result::Result<&mut [u8], PduError> {
        let slot = self.slot_mut(d.cccid, "cccid", 8)?;
        if slot.data_done {
            return Err(DecodeError::Sequence(format!(
                "C2HData for CID {} after its last PDU",
                d.cccid
            ))
            .into());
        }
        let Data::Read { buf, received } = &mut slot.data else {
            return Err(DecodeError::Sequence(format!(
                "C2HData for CID {} which reads no data",
                d.cccid
            ))
            .into());
        };
        let end = next_data_end(
            "C2HData",
            "datao",
            d.cccid,
            d.offset,
            d.len,
            buf.len(),
            *received,
        )?;
        Ok(&mut buf.bytes_mut()[d.offset as usize..end as usize])
    }

    /// Accounts a C2HData PDU whose data [`Self::c2h_dest`] accepted and
    /// which is now all in.
    fn c2h_done(&mut self, d: &DataHeader, digest_ok: bool) -> std::result::Result<(), PduError> {
        let qid = self.cfg.qid;
        let slot = self.slot_mut(d.cccid, "cccid", 8)?;
        let Data::Read { buf, received } = &mut slot.data else {
            return Err(DecodeError::Sequence(format!(
                "C2HData for CID {} which reads no data",
                d.cccid
            ))
            .into());
        };
        let end = d.offset + d.len;
        *received = end;
        let complete_len = *received as usize == buf.len();
        let buf_len = buf.len();
        if !digest_ok && slot.error.is_none() {
            slot.error = Some(HostError::DataDigest { cid: d.cccid });
        }
        if d.last {
            slot.data_done = true;
        }
        if d.success {
            if !complete_len {
                return Err(DecodeError::Sequence(format!(
                    "C2HData SUCCESS for CID {} with {} of {} bytes",
                    d.cccid, end, buf_len
                ))
                .into());
            }
            let mut cqe = Cqe::new(d.cccid, Status::SUCCESS);
            cqe.sqid = qid;
            self.complete(d.cccid, cqe);
        }
        Ok(())
    }

    fn on_r2t(&mut self, r: &R2t, now: Instant) -> std::result::Result<(), PduError> {
        let maxh2c = self
            .negotiated
            .map(|n| n.maxh2cdata_bytes)
            .unwrap_or(4096)
            .max(4);
        let tx_params = self.tx_params;
        // Borrows `self.slots` only: `self.tx` is borrowed below.
        let slot = outstanding(&mut self.slots, r.cccid, "cccid", 8)?;
        let Data::Solicited { buf, sent } = &mut slot.data else {
            return Err(DecodeError::Sequence(format!(
                "R2T for CID {} which has no solicited data",
                r.cccid
            ))
            .into());
        };
        let end = next_data_end("R2T", "r2to", r.cccid, r.offset, r.len, buf.len(), *sent)?;
        let mut off = r.offset;
        while off < end {
            let n = (end - off).min(maxh2c);
            let h = DataHeader {
                cccid: r.cccid,
                ttag: r.ttag,
                offset: off,
                len: n,
                last: off + n == end,
                success: false,
            };
            encode_with_data(
                &PduHeader::H2CData(h),
                buf,
                off as usize..(off + n) as usize,
                &tx_params,
                self.tx.as_mut(),
                PduClass::Data,
            );
            self.tx.commit_cmd(PduClass::Data, r.cccid, now);
            off += n;
        }
        *sent = end;
        Ok(())
    }
}

/// The slot of the outstanding command `cid` in `slots`: the one at its
/// index, if the command there has that CID (that generation).
fn slot_entry(slots: &mut [Option<Slot>], cid: u16) -> Option<&mut Option<Slot>> {
    slots
        .get_mut(usize::from(cid & CID_SLOT_MASK))
        .filter(|s| s.as_ref().is_some_and(|s| s.cid == cid))
}

/// The outstanding command `cid`, or the error naming the received PDU's
/// `field` (at byte `at`) that claimed it.
fn outstanding<'a>(
    slots: &'a mut [Option<Slot>],
    cid: u16,
    field: &'static str,
    at: usize,
) -> std::result::Result<&'a mut Slot, DecodeError> {
    slot_entry(slots, cid)
        .and_then(|s| s.as_mut())
        .ok_or_else(|| {
            DecodeError::invalid(field, at, format!("no outstanding command with CID {cid}"))
        })
}

/// The end of the data range a C2HData or R2T PDU (`pdu`) names for
/// command `cid`: `offset + len` within the command's `buf_len` bytes, with
/// `offset` (the PDU's `field`, byte 12) the next byte the command
/// expects. Errors: DataOutOfRange past the buffer, an invalid field out of
/// order.
fn next_data_end(
    pdu: &str,
    field: &'static str,
    cid: u16,
    offset: u32,
    len: u32,
    buf_len: usize,
    expected: u32,
) -> std::result::Result<u32, DecodeError> {
    // A sum past u32::MAX is past the buffer too (its length is a u32).
    let Some(end) = offset.checked_add(len).filter(|&e| e as usize <= buf_len) else {
        return Err(DecodeError::DataOutOfRange(format!(
            "{pdu} offset {offset} + length {len} beyond the {buf_len} bytes of CID {cid}"
        )));
    };
    if offset != expected {
        return Err(DecodeError::invalid(
            field,
            12,
            format!("{pdu} offset {offset} for CID {cid}, expected {expected}"),
        ));
    }
    Ok(end)
}

/// Runs of due bytes handed to one vectored write by
/// [`QueuePairCore::transmit_to`]: a batch of 32 attached writes is 64
/// runs (header, data).
pub const TRANSMIT_RUNS_MAX: usize = 64;

/// Write data at least this long is attached to its PDU (sent from the
/// caller's buffer by the vectored write) instead of copied into the send
/// buffer; shorter data is copied, cheaper than a run of its own.
pub const WRITE_ATTACH_BYTES_MIN: usize = 4096;

/// Encodes one PDU carrying `buf[range]` into the scheduler's `class`
/// buffer: attached when long enough, copied otherwise, with its data
/// digest (when negotiated) after it. The caller commits it.
fn encode_with_data(
    h: &PduHeader,
    buf: &Arc<Vec<u8>>,
    range: std::ops::Range<usize>,
    p: &TxParams,
    tx: &mut dyn SendScheduler,
    class: PduClass,
) {
    let piece = &buf[range.clone()];
    let dd = encode_prefix(h, piece.len(), p, tx.buffer(class));
    let attachment = (piece.len() >= WRITE_ATTACH_BYTES_MIN)
        .then(|| Attachment::new(Arc::clone(buf) as SharedBytes, range))
        .flatten();
    match attachment {
        Some(a) => tx.attach(class, a),
        None => tx.buffer(class).extend_from_slice(piece),
    }
    if dd > 0 {
        tx.buffer(class)
            .extend_from_slice(&crc32c(piece).to_le_bytes());
    }
}

/// A written buffer back from the send scheduler, for the completion. The
/// scheduler releases its attachments once written, and a completion only
/// follows the whole write, so the buffer is normally the caller's own
/// again; when a target completes a command early (an error before the
/// data went out) the attachment may still be queued, and a copy goes back.
fn take_written(buf: Arc<Vec<u8>>) -> Vec<u8> {
    Arc::try_unwrap(buf).unwrap_or_else(|shared| shared.as_ref().clone())
}

/// The length of a read of `n` bytes, refused over `max`.
fn read_len(n: u64, max: u32) -> Result<u32> {
    match u32::try_from(n) {
        Ok(n) if n <= max => Ok(n),
        _ => Err(HostError::InvalidArgument(format!(
            "read of {n} bytes exceeds the {max} byte limit"
        ))),
    }
}

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
