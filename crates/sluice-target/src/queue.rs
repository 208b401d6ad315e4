//! One NVMe/TCP queue pair on the target: a sans-IO state machine.
//!
//! The I/O layer feeds received bytes ([`QueueConnection::recv_buf`] +
//! [`QueueConnection::handle_received`]), submits the backend I/O it asks for
//! ([`QueueConnection::poll_backend`]), hands back completions
//! ([`QueueConnection::handle_backend_completion`]), writes out what the send
//! scheduler says is due ([`QueueConnection::due`] / [`QueueConnection::consume`])
//! and calls [`QueueConnection::handle_timeout`] at [`QueueConnection::poll_timeout`].
//! Time always comes in as `now`; nothing here touches a socket or a clock.
//!
//! Life of a command: CapsuleCmd → checks (state, queue depth, CID, SGL,
//! namespace and LBA range) → for host-to-controller data without in-capsule
//! data, an R2T and H2CData PDUs fill a buffer → backend request(s) → on
//! completion, C2HData PDUs (reads) and a CapsuleResp (or C2HData with the
//! SUCCESS flag when the host disabled SQ flow control).

use crate::controller::{AdminContext, AdminReply, Controller, AER_MAX};
use crate::send::{Immediate, PduClass, SendScheduler, SendStats};
use crate::subsystem::{Namespace, Registry, SubsystemKind};
use sluice_backend::{AlignedBuf, BackendError, IoCompletion, IoOp, IoRequest};
use sluice_proto::coalesce::Hint;
use sluice_proto::command::{admin, io, rw, sgl, Cqe, Sqe, FUSE_MASK, PSDT_MASK, PSDT_SGL};
use sluice_proto::fabrics::{
    connect_data_offset, connect_invalid_param_result, connect_offset, fctype, ConnectCommand,
    ConnectData, PropertyCommand, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{
    self, encode_pdu, encode_prefix, DataHeader, DecodeError, Direction, IcResp, PduHeader, R2t,
    TermReq, TxParams,
};
use sluice_proto::Status;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In-capsule data accepted on the admin queue (what Linux sends: 8 KiB).
pub const ADMIN_INLINE_BYTES: u32 = 8192;
/// A connection that has not completed ICReq + Connect by then is closed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a queue checks whether its controller has failed.
pub const CONTROLLER_CHECK_INTERVAL: Duration = Duration::from_millis(200);
/// Backend tag of the flushes a shutdown notification triggers (no command slot).
const SHUTDOWN_FLUSH_TAG: u64 = 0xffff_fffe;
/// Stop reading from a host whose unsent output exceeds this.
pub const TX_BACKLOG_BYTES_MAX: usize = 8 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    AwaitIcReq,
    AwaitConnect,
    Ready,
    /// Fatal error or disconnect: flush what is queued, read nothing more.
    Closing,
    Closed,
}

/// A backend request the I/O layer must submit; `req.tag`'s low 32 bits
/// identify the command within this connection.
#[derive(Debug)]
pub struct BackendSubmit {
    pub ns: Arc<Namespace>,
    pub req: IoRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataDir {
    None,
    HostToController,
    ControllerToHost,
}

#[derive(Debug)]
enum CmdKind {
    /// Fabrics or admin command whose data has arrived and is executed inline.
    Inline,
    Read {
        ns: Arc<Namespace>,
        offset_bytes: u64,
        len_bytes: u64,
    },
    Write {
        ns: Arc<Namespace>,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
    },
    /// Flush, Write Zeroes, DSM: one or more backend ops without data.
    NoData {
        ops: Vec<(Arc<Namespace>, IoOp, u64, u64)>,
        write: bool,
    },
    Dsm {
        ns: Arc<Namespace>,
        nr: u32,
        deallocate: bool,
    },
}

#[derive(Debug)]
struct Cmd {
    sqe: Sqe,
    kind: CmdKind,
    /// Host-to-controller data being received (R2T path).
    buf: Option<AlignedBuf>,
    h2c_expected: u32,
    h2c_received: u32,
    /// A data digest error was seen: fail the command once its data is in.
    digest_error: bool,
    ops_pending: u32,
    status: Status,
}

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub commands: u64,
    pub r2ts: u64,
    pub h2c_pdus: u64,
    pub c2h_pdus: u64,
}

/// One queue pair (one TCP connection) on the target.
#[derive(Debug)]
pub struct QueueConnection {
    reg: Arc<Registry>,
    /// Always present except while `process_input` runs.
    framer: Option<Framer>,
    tx: Box<dyn SendScheduler>,
    txp: TxParams,
    state: ConnState,
    local: Option<SocketAddr>,
    created: Instant,
    qid: u16,
    /// Queue depth (SQSIZE + 1).
    depth: u16,
    sq_flow_disabled: bool,
    sqhd: u16,
    ctrl: Option<Arc<Controller>>,
    cmds: Vec<Option<Cmd>>,
    free_slots: Vec<u16>,
    cid_slot: HashMap<u16, u16>,
    outstanding: u16,
    backend_out: VecDeque<BackendSubmit>,
    backend_in_flight: u32,
    held_aers: Vec<u16>,
    /// Flushes outstanding for a shutdown notification.
    shutdown_flushes: u32,
    maxr2t: u32,
    draining: bool,
    next_check: Instant,
    close_reason: Option<String>,
    stats: QueueStats,
    span: tracing::Span,
}

impl QueueConnection {
    pub fn new(
        reg: Arc<Registry>,
        peer: Option<SocketAddr>,
        local: Option<SocketAddr>,
        now: Instant,
    ) -> Self {
        let data_max = reg
            .settings
            .inline_data_bytes
            .max(reg.settings.max_h2c_data_bytes)
            .max(ADMIN_INLINE_BYTES);
        let span = tracing::info_span!(
            "queue",
            peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
            hostnqn = tracing::field::Empty,
            subnqn = tracing::field::Empty,
            cntlid = tracing::field::Empty,
            qid = tracing::field::Empty,
        );
        QueueConnection {
            reg,
            framer: Some(Framer::new(Direction::HostToController, data_max)),
            tx: Box::new(Immediate::new()),
            txp: TxParams::default(),
            state: ConnState::AwaitIcReq,
            local,
            created: now,
            qid: 0,
            depth: 0,
            sq_flow_disabled: false,
            sqhd: 0,
            ctrl: None,
            cmds: Vec::new(),
            free_slots: Vec::new(),
            cid_slot: HashMap::new(),
            outstanding: 0,
            backend_out: VecDeque::new(),
            backend_in_flight: 0,
            held_aers: Vec::new(),
            shutdown_flushes: 0,
            maxr2t: 0,
            draining: false,
            next_check: now + CONTROLLER_CHECK_INTERVAL,
            close_reason: None,
            stats: QueueStats::default(),
            span,
        }
    }

    // ---------------------------------------------------------------- I/O layer API

    /// Space to read socket bytes into.
    pub fn recv_buf(&mut self) -> &mut [u8] {
        self.framer
            .as_mut()
            .expect("framer present outside process_input")
            .read_buf()
    }

    /// Processes `n` bytes just read into [`Self::recv_buf`].
    pub fn handle_received(&mut self, n: usize, now: Instant) {
        self.framer
            .as_mut()
            .expect("framer present outside process_input")
            .advance(n);
        self.process_input(now);
    }

    /// Feeds bytes by copy (in-memory peers and tests).
    pub fn feed(&mut self, bytes: &[u8], now: Instant) {
        self.framer
            .as_mut()
            .expect("framer present outside process_input")
            .feed(bytes);
        self.process_input(now);
    }

    /// Whether the I/O layer should read more from the socket now.
    pub fn wants_read(&self) -> bool {
        matches!(
            self.state,
            ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Ready
        ) && !self.draining
            && self.tx.backlog_bytes() < TX_BACKLOG_BYTES_MAX
    }

    /// The next backend request to submit.
    pub fn poll_backend(&mut self) -> Option<BackendSubmit> {
        let s = self.backend_out.pop_front()?;
        self.backend_in_flight += 1;
        Some(s)
    }

    /// Backend requests submitted and not yet completed.
    pub fn backend_in_flight(&self) -> u32 {
        self.backend_in_flight
    }

    /// Bytes due for the socket.
    pub fn due(&self) -> &[u8] {
        self.tx.due()
    }

    /// Reports `n` due bytes written to the socket.
    pub fn consume(&mut self, n: usize, now: Instant) {
        self.tx.consume(n);
        self.tx.poll(now);
        self.maybe_finish_close();
    }

    /// When the send path must next be polled (a held PDU's deadline).
    pub fn send_deadline(&self) -> Option<Instant> {
        self.tx.next_deadline()
    }

    /// When [`Self::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == ConnState::Closed {
            return None;
        }
        let mut t = Some(self.next_check);
        if let Some(d) = self.tx.next_deadline() {
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        if let (Some(c), 0) = (&self.ctrl, self.qid) {
            if let Some(d) = c.keep_alive_deadline(self.reg.settings.kato_grace_ms) {
                t = Some(t.map_or(d, |x| x.min(d)));
            }
        }
        t
    }

    /// Runs timers: keep-alive, controller failure, connect timeout, send deadlines.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _g = self.span.clone().entered();
        self.tx.poll(now);
        if self.state == ConnState::Closed {
            return;
        }
        if matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect)
            && now >= self.created + CONNECT_TIMEOUT
        {
            self.close("no ICReq/Connect within the connect timeout");
            return;
        }
        if let Some(c) = self.ctrl.clone() {
            if self.qid == 0 {
                if let Some(d) = c.keep_alive_deadline(self.reg.settings.kato_grace_ms) {
                    if now >= d {
                        tracing::warn!(
                            cntlid = c.cntlid,
                            "keep alive timer expired; failing the controller"
                        );
                        c.fail();
                        self.close("keep alive timeout");
                        return;
                    }
                }
            }
            if c.is_failed() && self.state != ConnState::Closing {
                self.close("controller failed or association ended");
                return;
            }
        }
        if now >= self.next_check {
            self.next_check = now + CONTROLLER_CHECK_INTERVAL;
        }
    }

    /// Stops taking new commands; the connection closes once in-flight ones
    /// have completed and their responses are written (graceful shutdown).
    pub fn begin_drain(&mut self) {
        self.draining = true;
        self.maybe_finish_close();
    }

    pub fn is_closed(&self) -> bool {
        self.state == ConnState::Closed
    }

    /// Closing or closed: the I/O layer writes what is due, then closes the socket.
    pub fn is_closing(&self) -> bool {
        matches!(self.state, ConnState::Closing | ConnState::Closed)
    }

    pub fn close_reason(&self) -> Option<&str> {
        self.close_reason.as_deref()
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    pub fn hostnqn(&self) -> Option<&str> {
        self.ctrl.as_ref().map(|c| c.hostnqn.as_str())
    }

    pub fn controller(&self) -> Option<&Arc<Controller>> {
        self.ctrl.as_ref()
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Counters of the send path (flushes, reasons, waits, notifications).
    pub fn send_stats(&self) -> SendStats {
        self.tx.stats()
    }

    /// Swaps the send scheduler (at Connect, once the subsystem is known);
    /// bytes the old one still holds go first.
    fn replace_scheduler(&mut self, mut new: Box<dyn SendScheduler>, now: Instant) {
        let old = self.tx.due().to_vec();
        if !old.is_empty() {
            new.buffer(PduClass::Control).extend_from_slice(&old);
            new.commit(PduClass::Control, now);
        }
        self.tx = new;
    }

    /// The peer closed the socket or it failed: nothing more can be sent.
    pub fn handle_peer_closed(&mut self, why: &str) {
        let _g = self.span.clone().entered();
        if self.close_reason.is_none() {
            tracing::info!(reason = why, "connection closed by peer");
            self.close_reason = Some(why.to_string());
        }
        self.state = ConnState::Closed;
        let n = self.tx.due().len();
        self.tx.consume(n);
    }

    /// Releases controller state; call once when the socket is gone.
    pub fn finish(&mut self) {
        if self.state != ConnState::Closed {
            self.state = ConnState::Closed;
        }
        if let Some(c) = self.ctrl.take() {
            if self.qid == 0 {
                // The admin queue ends the association.
                c.fail();
                c.subsystem.remove_controller(c.cntlid);
                tracing::info!(parent: &self.span, cntlid = c.cntlid, "controller removed");
            } else {
                c.disconnect_io_queue(self.qid);
            }
        }
    }

    // ---------------------------------------------------------------- input

    fn process_input(&mut self, now: Instant) {
        let Some(mut framer) = self.framer.take() else {
            return;
        };
        let _g = self.span.clone().entered();
        self.process_with(&mut framer, now);
        self.framer = Some(framer);
    }

    fn process_with(&mut self, framer: &mut Framer, now: Instant) {
        loop {
            if !matches!(
                self.state,
                ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Ready
            ) || self.draining
            {
                return;
            }
            let pdu = match framer.next_pdu() {
                Ok(Some(p)) => p,
                Ok(None) => return,
                Err(e) => {
                    let quote = framer.current_header().to_vec();
                    self.fatal(&e, &quote, now);
                    return;
                }
            };
            match pdu.header {
                PduHeader::IcReq(r) => {
                    self.maxr2t = r.maxr2t;
                    let resp = IcResp {
                        pfv: 0,
                        cpda: 0,
                        hdgst: r.hdgst,
                        ddgst: r.ddgst,
                        maxh2cdata: self.reg.settings.max_h2c_data_bytes,
                    };
                    let st = &self.reg.settings;
                    let data_max = st
                        .inline_data_bytes
                        .max(st.max_h2c_data_bytes)
                        .max(ADMIN_INLINE_BYTES);
                    framer.set_initialized(r.hdgst, r.ddgst, 0, data_max);
                    self.txp = TxParams {
                        hdgst: r.hdgst,
                        ddgst: r.ddgst,
                        pda: r.hpda,
                    };
                    self.send_pdu(PduClass::Control, &PduHeader::IcResp(resp), &[], now);
                    self.state = ConnState::AwaitConnect;
                    tracing::debug!(
                        hdgst = r.hdgst,
                        ddgst = r.ddgst,
                        hpda = r.hpda,
                        "connection initialized"
                    );
                }
                PduHeader::CapsuleCmd(sqe) => {
                    self.handle_command(sqe, pdu.data, pdu.data_digest_ok, now);
                }
                PduHeader::H2CData(d) => {
                    if let Err(e) = self.handle_h2c_data(d, pdu.data, pdu.data_digest_ok, now) {
                        let quote = pdu.raw_header.to_vec();
                        self.fatal(&e, &quote, now);
                        return;
                    }
                }
                PduHeader::H2CTermReq(t) => {
                    tracing::warn!(
                        fes = t.fes,
                        fei = t.fei,
                        "host terminated the connection (H2CTermReq)"
                    );
                    self.close("host sent H2CTermReq");
                    return;
                }
                other => {
                    // The framer only yields host-to-controller PDUs.
                    let e =
                        DecodeError::Sequence(format!("unexpected PDU {:#04x}", other.pdu_type()));
                    let quote = pdu.raw_header.to_vec();
                    self.fatal(&e, &quote, now);
                    return;
                }
            }
        }
    }

    fn fatal(&mut self, e: &DecodeError, quote: &[u8], now: Instant) {
        tracing::warn!(error = %e, fes = e.fes(), "protocol error; sending C2HTermReq and closing");
        let t = pdu::term_req_for(e, quote);
        let data = t.data.clone();
        self.send_pdu(
            PduClass::Control,
            &PduHeader::C2HTermReq(TermReq {
                data: Vec::new(),
                ..t
            }),
            &data,
            now,
        );
        self.close(&format!("protocol error: {e}"));
    }

    fn close(&mut self, reason: &str) {
        if self.close_reason.is_none() {
            tracing::info!(reason, "closing queue");
            self.close_reason = Some(reason.to_string());
        }
        if self.state != ConnState::Closed {
            self.state = ConnState::Closing;
        }
        self.maybe_finish_close();
    }

    fn maybe_finish_close(&mut self) {
        let quiet = self.tx.backlog_bytes() == 0;
        match self.state {
            ConnState::Closing if quiet => self.state = ConnState::Closed,
            ConnState::Ready | ConnState::AwaitConnect | ConnState::AwaitIcReq
                if self.draining
                    && quiet
                    && self.outstanding as usize == self.held_aers.len()
                    && self.backend_out.is_empty()
                    && self.backend_in_flight == 0 =>
            {
                self.close_reason
                    .get_or_insert_with(|| "drained for shutdown".into());
                self.state = ConnState::Closed;
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------- commands

    fn handle_command(&mut self, sqe: Sqe, data: &[u8], digest_ok: bool, now: Instant) {
        self.stats.commands += 1;
        let cid = sqe.cid();
        if self.state == ConnState::Ready && !self.sq_flow_disabled {
            self.sqhd = (self.sqhd + 1) % self.depth.max(1);
        }
        let is_connect = sqe.opcode() == admin::FABRICS && sqe.fctype() == fctype::CONNECT;
        if self.state == ConnState::AwaitConnect && !is_connect {
            self.respond_now(cid, Status::COMMAND_SEQUENCE_ERROR, 0, now);
            return;
        }
        if self.state == ConnState::Ready && is_connect {
            self.respond_now(cid, Status::COMMAND_SEQUENCE_ERROR, 0, now);
            return;
        }
        let depth = if self.state == ConnState::AwaitConnect {
            1
        } else {
            self.depth
        };
        if self.outstanding >= depth {
            let e = DecodeError::Sequence(format!(
                "more than {depth} outstanding commands (queue depth exceeded)"
            ));
            let mut quote = vec![0u8; 8];
            quote.extend_from_slice(&sqe.0);
            self.fatal(&e, &quote, now);
            return;
        }
        if self.cid_slot.contains_key(&cid) {
            self.respond_now(cid, Status::CID_CONFLICT, 0, now);
            return;
        }
        if sqe.flags() & FUSE_MASK != 0 || sqe.flags() & PSDT_MASK != PSDT_SGL {
            self.respond_now(cid, Status::INVALID_FIELD, 0, now);
            return;
        }
        let dir = self.data_direction(&sqe);
        let (sgl_len, in_capsule) = match self.check_sgl(&sqe, dir, data.len()) {
            Ok(v) => v,
            Err(st) => {
                self.respond_now(cid, st, 0, now);
                return;
            }
        };
        let kind = if self.qid > 0 && sqe.opcode() != io::FABRICS {
            match self.plan_io(&sqe, sgl_len) {
                Ok(k) => k,
                Err(st) => {
                    self.respond_now(cid, st, 0, now);
                    return;
                }
            }
        } else {
            CmdKind::Inline
        };
        let slot = self.alloc_slot(
            cid,
            Cmd {
                sqe,
                kind,
                buf: None,
                h2c_expected: 0,
                h2c_received: 0,
                digest_error: !digest_ok,
                ops_pending: 0,
                status: Status::SUCCESS,
            },
        );
        if self.qid > 0 {
            let hint = match sqe.opcode() {
                io::READ | io::WRITE => Hint::from_cdw13(sqe.cdw(13)),
                _ => Hint::Normal,
            };
            self.tx.command_started(cid, hint);
        }
        if dir == DataDir::HostToController && !in_capsule && sgl_len > 0 {
            // Ask for the data: one R2T for the whole transfer (MAXR2T >= 1).
            let cmd = self.cmds[slot as usize]
                .as_mut()
                .expect("slot just allocated");
            cmd.buf = Some(AlignedBuf::new(sgl_len as usize));
            cmd.h2c_expected = sgl_len;
            self.stats.r2ts += 1;
            let r2t = R2t {
                cccid: cid,
                ttag: slot,
                offset: 0,
                len: sgl_len,
            };
            self.send_cmd_pdu(PduClass::R2t, cid, &PduHeader::R2t(r2t), now);
            return;
        }
        if !digest_ok {
            self.complete(slot, Status::TRANSIENT_TRANSPORT_ERROR, 0, 0, now);
            return;
        }
        self.execute(slot, data, now);
    }

    fn data_direction(&self, sqe: &Sqe) -> DataDir {
        if sqe.opcode() == admin::FABRICS {
            return match sqe.fctype() {
                fctype::CONNECT | fctype::AUTH_SEND => DataDir::HostToController,
                fctype::AUTH_RECEIVE => DataDir::ControllerToHost,
                _ => DataDir::None,
            };
        }
        match sqe.opcode() & 0x3 {
            1 => DataDir::HostToController,
            2 => DataDir::ControllerToHost,
            // Bidirectional transfers do not exist in the commands we serve;
            // treat as "none" and let the opcode check reject them.
            _ => DataDir::None,
        }
    }

    /// Checks the SGL against the data direction and capsule contents.
    /// Returns (transfer length, data is in the capsule).
    fn check_sgl(
        &self,
        sqe: &Sqe,
        dir: DataDir,
        capsule_data: usize,
    ) -> Result<(u32, bool), Status> {
        let d = sqe.sgl();
        // Commands without data carry a zero-length SGL (Linux: a 0x5A
        // descriptor of length 0).
        if dir == DataDir::None || (d.length == 0 && capsule_data == 0) {
            return if capsule_data == 0 {
                Ok((0, false))
            } else {
                Err(Status::INVALID_FIELD)
            };
        }
        match d.id {
            sgl::DATA_BLOCK_OFFSET => {
                if dir != DataDir::HostToController {
                    return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID);
                }
                if d.address != 0 {
                    return Err(Status::SGL_OFFSET_INVALID);
                }
                let limit = if self.qid == 0 {
                    ADMIN_INLINE_BYTES
                } else {
                    self.reg.settings.inline_data_bytes
                };
                if d.length as usize != capsule_data || d.length > limit {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                Ok((d.length, true))
            }
            sgl::TRANSPORT_DATA_BLOCK => {
                if capsule_data != 0 {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                if d.length > self.reg.settings.mdts_bytes {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                Ok((d.length, false))
            }
            _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        }
    }

    fn namespace(&self, nsid: u32) -> Result<Arc<Namespace>, Status> {
        let ctrl = self.ctrl.as_ref().ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
        ctrl.subsystem
            .namespaces
            .get(&nsid)
            .cloned()
            .ok_or(Status::INVALID_NAMESPACE)
    }

    /// Validates an I/O command completely before any data moves.
    fn plan_io(&self, sqe: &Sqe, sgl_len: u32) -> Result<CmdKind, Status> {
        let ctrl = self.ctrl.as_ref().ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
        if !ctrl.is_ready() {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        let force_fua = !ctrl.write_cache_enabled();
        match sqe.opcode() {
            io::READ | io::WRITE | io::WRITE_ZEROES => {
                let ns = self.namespace(sqe.nsid())?;
                let slba = sqe.slba();
                let nlb = sqe.nlb() as u64;
                match slba.checked_add(nlb) {
                    Some(end) if end <= ns.blocks() => {}
                    _ => return Err(Status::LBA_OUT_OF_RANGE),
                }
                let offset_bytes = slba << ns.lba_shift;
                let len_bytes = nlb << ns.lba_shift;
                let fua = sqe.cdw(12) & rw::FUA != 0 || force_fua;
                if sqe.opcode() == io::WRITE_ZEROES {
                    let deallocate = sqe.cdw(12) & rw::DEAC != 0;
                    return Ok(CmdKind::NoData {
                        ops: vec![(
                            ns,
                            IoOp::WriteZeroes { deallocate, fua },
                            offset_bytes,
                            len_bytes,
                        )],
                        write: true,
                    });
                }
                if len_bytes > self.reg.settings.mdts_bytes as u64 {
                    return Err(Status::INVALID_FIELD);
                }
                if sgl_len as u64 != len_bytes {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                Ok(if sqe.opcode() == io::READ {
                    CmdKind::Read {
                        ns,
                        offset_bytes,
                        len_bytes,
                    }
                } else {
                    CmdKind::Write {
                        ns,
                        offset_bytes,
                        len_bytes,
                        fua,
                    }
                })
            }
            io::FLUSH => {
                let nsid = sqe.nsid();
                let list: Vec<Arc<Namespace>> = if nsid == 0xffff_ffff {
                    ctrl.subsystem.namespaces.values().cloned().collect()
                } else {
                    vec![self.namespace(nsid)?]
                };
                let ops = list.into_iter().map(|ns| (ns, IoOp::Flush, 0, 0)).collect();
                Ok(CmdKind::NoData { ops, write: false })
            }
            io::DATASET_MANAGEMENT => {
                let ns = self.namespace(sqe.nsid())?;
                let nr = (sqe.cdw(10) & 0xff) + 1;
                if sgl_len != nr * 16 {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                Ok(CmdKind::Dsm {
                    ns,
                    nr,
                    deallocate: sqe.cdw(11) & 0x4 != 0,
                })
            }
            _ => Err(Status::INVALID_OPCODE),
        }
    }

    fn alloc_slot(&mut self, cid: u16, cmd: Cmd) -> u16 {
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.cmds[s as usize] = Some(cmd);
                s
            }
            None => {
                self.cmds.push(Some(cmd));
                (self.cmds.len() - 1) as u16
            }
        };
        self.cid_slot.insert(cid, slot);
        self.outstanding += 1;
        slot
    }

    fn free_slot(&mut self, slot: u16) -> Option<Cmd> {
        let cmd = self.cmds.get_mut(slot as usize)?.take()?;
        self.cid_slot.remove(&cmd.sqe.cid());
        self.free_slots.push(slot);
        self.outstanding -= 1;
        Some(cmd)
    }

    fn handle_h2c_data(
        &mut self,
        d: DataHeader,
        data: &[u8],
        digest_ok: bool,
        now: Instant,
    ) -> Result<(), DecodeError> {
        self.stats.h2c_pdus += 1;
        let slot = d.ttag;
        let cmd = match self.cmds.get_mut(slot as usize).and_then(|c| c.as_mut()) {
            Some(c) if c.sqe.cid() == d.cccid && c.buf.is_some() && c.h2c_expected > 0 => c,
            _ => {
                return Err(DecodeError::invalid(
                    "ttag",
                    10,
                    format!("no R2T outstanding for ttag {} / cccid {}", d.ttag, d.cccid),
                ))
            }
        };
        if d.offset != cmd.h2c_received {
            return Err(DecodeError::DataOutOfRange(format!(
                "H2CData offset {} but {} bytes of the R2T were received",
                d.offset, cmd.h2c_received
            )));
        }
        let end = d.offset as u64 + d.len as u64;
        if end > cmd.h2c_expected as u64 {
            return Err(DecodeError::DataOutOfRange(format!(
                "H2CData ends at {end}, beyond the R2T's {} bytes",
                cmd.h2c_expected
            )));
        }
        let last_needed = end == cmd.h2c_expected as u64;
        if d.last != last_needed {
            return Err(DecodeError::invalid(
                "flags",
                1,
                "LAST_PDU does not match the end of the R2T",
            ));
        }
        if let Some(buf) = cmd.buf.as_mut() {
            buf[d.offset as usize..end as usize].copy_from_slice(data);
        }
        cmd.h2c_received = end as u32;
        if !digest_ok {
            cmd.digest_error = true;
        }
        if last_needed {
            let failed = cmd.digest_error;
            let buf = cmd.buf.take();
            cmd.h2c_expected = 0;
            if failed {
                self.complete(slot, Status::TRANSIENT_TRANSPORT_ERROR, 0, 0, now);
            } else {
                self.execute_with_buf(slot, buf, now);
            }
        }
        Ok(())
    }

    fn execute(&mut self, slot: u16, data: &[u8], now: Instant) {
        let needs_buf = matches!(
            self.cmds[slot as usize].as_ref().map(|c| &c.kind),
            Some(CmdKind::Write { .. })
        );
        let buf = if needs_buf || !data.is_empty() {
            Some(AlignedBuf::from_slice(data))
        } else {
            None
        };
        self.execute_with_buf(slot, buf, now);
    }

    fn execute_with_buf(&mut self, slot: u16, buf: Option<AlignedBuf>, now: Instant) {
        let Some(cmd) = self.cmds[slot as usize].as_mut() else {
            return;
        };
        let sqe = cmd.sqe;
        let tag = slot as u64;
        match std::mem::replace(&mut cmd.kind, CmdKind::Inline) {
            CmdKind::Inline => {
                let data = buf.as_ref().map(|b| b.as_slice()).unwrap_or(&[]);
                let data = data.to_vec();
                self.execute_inline(slot, &sqe, &data, now);
            }
            CmdKind::Read {
                ns,
                offset_bytes,
                len_bytes,
            } => {
                cmd.ops_pending = 1;
                cmd.kind = CmdKind::Read {
                    ns: ns.clone(),
                    offset_bytes,
                    len_bytes,
                };
                let req = IoRequest {
                    tag,
                    op: IoOp::Read,
                    offset_bytes,
                    len_bytes,
                    buf: Some(AlignedBuf::new(len_bytes as usize)),
                };
                self.backend_out.push_back(BackendSubmit { ns, req });
            }
            CmdKind::Write {
                ns,
                offset_bytes,
                len_bytes,
                fua,
            } => {
                cmd.ops_pending = 1;
                cmd.kind = CmdKind::Write {
                    ns: ns.clone(),
                    offset_bytes,
                    len_bytes,
                    fua,
                };
                let req = IoRequest {
                    tag,
                    op: IoOp::Write { fua },
                    offset_bytes,
                    len_bytes,
                    buf,
                };
                self.backend_out.push_back(BackendSubmit { ns, req });
            }
            CmdKind::NoData { ops, write } => {
                cmd.ops_pending = ops.len() as u32;
                cmd.kind = CmdKind::NoData {
                    ops: Vec::new(),
                    write,
                };
                if ops.is_empty() {
                    self.complete(slot, Status::SUCCESS, 0, 0, now);
                    return;
                }
                for (ns, op, offset_bytes, len_bytes) in ops {
                    self.backend_out.push_back(BackendSubmit {
                        ns,
                        req: IoRequest {
                            tag,
                            op,
                            offset_bytes,
                            len_bytes,
                            buf: None,
                        },
                    });
                }
            }
            CmdKind::Dsm { ns, nr, deallocate } => {
                let data = buf.as_ref().map(|b| b.as_slice()).unwrap_or(&[]);
                let mut ops = Vec::new();
                let blocks = ns.blocks();
                for i in 0..nr as usize {
                    let r = &data[i * 16..i * 16 + 16];
                    let nlb = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as u64;
                    let slba =
                        u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
                    match slba.checked_add(nlb) {
                        Some(end) if end <= blocks => {}
                        _ => {
                            self.complete(slot, Status::LBA_OUT_OF_RANGE, 0, 0, now);
                            return;
                        }
                    }
                    if nlb > 0 && deallocate {
                        ops.push((slba << ns.lba_shift, nlb << ns.lba_shift));
                    }
                }
                let Some(cmd) = self.cmds[slot as usize].as_mut() else {
                    return;
                };
                cmd.ops_pending = ops.len() as u32;
                cmd.kind = CmdKind::NoData {
                    ops: Vec::new(),
                    write: true,
                };
                if ops.is_empty() {
                    self.complete(slot, Status::SUCCESS, 0, 0, now);
                    return;
                }
                for (offset_bytes, len_bytes) in ops {
                    self.backend_out.push_back(BackendSubmit {
                        ns: ns.clone(),
                        req: IoRequest {
                            tag,
                            op: IoOp::Deallocate,
                            offset_bytes,
                            len_bytes,
                            buf: None,
                        },
                    });
                }
            }
        }
    }

    /// Flushes every namespace of the controller's subsystem for a shutdown
    /// notification; SHST becomes "complete" when the last flush finishes.
    fn start_shutdown_flush(&mut self, ctrl: &Arc<Controller>) {
        let namespaces: Vec<Arc<Namespace>> = ctrl.subsystem.namespaces.values().cloned().collect();
        if namespaces.is_empty() {
            ctrl.shutdown_flushed();
            return;
        }
        self.shutdown_flushes += namespaces.len() as u32;
        for ns in namespaces {
            let req = IoRequest {
                tag: SHUTDOWN_FLUSH_TAG,
                op: IoOp::Flush,
                offset_bytes: 0,
                len_bytes: 0,
                buf: None,
            };
            self.backend_out.push_back(BackendSubmit { ns, req });
        }
    }

    /// Hands back a backend completion (low 32 bits of the tag).
    pub fn handle_backend_completion(&mut self, c: IoCompletion, now: Instant) {
        self.backend_in_flight = self.backend_in_flight.saturating_sub(1);
        if c.tag & 0xffff_ffff == SHUTDOWN_FLUSH_TAG {
            if let Err(e) = &c.result {
                tracing::error!(parent: &self.span, error = %e, "flush for the shutdown notification failed");
            }
            self.shutdown_flushes = self.shutdown_flushes.saturating_sub(1);
            if self.shutdown_flushes == 0 {
                if let Some(ctrl) = &self.ctrl {
                    ctrl.shutdown_flushed();
                }
            }
            self.maybe_finish_close();
            return;
        }
        let slot = (c.tag & 0xffff) as u16;
        let span = &self.span;
        let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(|c| c.as_mut()) else {
            self.maybe_finish_close();
            return;
        };
        if let Err(e) = &c.result {
            tracing::debug!(parent: span, error = %e, cid = cmd.sqe.cid(), "backend error");
            if cmd.status.is_success() {
                cmd.status = backend_status(e);
            }
        }
        cmd.ops_pending = cmd.ops_pending.saturating_sub(1);
        if cmd.ops_pending > 0 {
            return;
        }
        let status = cmd.status;
        let cid = cmd.sqe.cid();
        match &cmd.kind {
            CmdKind::Read { ns, len_bytes, .. } => {
                let ns = ns.clone();
                let len = *len_bytes;
                if status.is_success() {
                    ns.counters.record_read(len);
                    if let Some(c) = &self.ctrl {
                        c.host_counters.record_read(len);
                    }
                    let buf = c.buf;
                    let data = buf.as_ref().map(|b| b.as_slice()).unwrap_or(&[]);
                    self.send_c2h_data_and_complete(slot, cid, data, now);
                    return;
                }
                ns.counters.record_error();
            }
            CmdKind::Write { ns, len_bytes, .. } => {
                if status.is_success() {
                    ns.counters.record_write(*len_bytes);
                    if let Some(c) = &self.ctrl {
                        c.host_counters.record_write(*len_bytes);
                    }
                } else {
                    ns.counters.record_error();
                }
            }
            _ => {
                if let Some(c) = &self.ctrl {
                    c.host_counters.record_other();
                }
            }
        }
        if !status.is_success() {
            if let Some(c) = &self.ctrl {
                c.host_counters.record_error();
            }
        }
        self.complete(slot, status, 0, 0, now);
    }

    fn execute_inline(&mut self, slot: u16, sqe: &Sqe, data: &[u8], now: Instant) {
        if sqe.opcode() == admin::FABRICS {
            self.execute_fabrics(slot, sqe, data, now);
            return;
        }
        let Some(ctrl) = self.ctrl.clone() else {
            self.complete(slot, Status::COMMAND_SEQUENCE_ERROR, 0, 0, now);
            return;
        };
        if self.qid != 0 {
            // I/O opcodes were planned in plan_io; anything else is invalid here.
            self.complete(slot, Status::INVALID_OPCODE, 0, 0, now);
            return;
        }
        let ctx = AdminContext {
            local_addr: self.local,
            local_port: self.local.map(|a| a.port()).unwrap_or(0),
        };
        let reply: AdminReply = ctrl.admin(sqe, data, &self.reg, &ctx, now);
        if reply.hold {
            if self.held_aers.len() >= AER_MAX {
                self.complete(slot, Status::AER_LIMIT_EXCEEDED, 0, 0, now);
            } else {
                self.held_aers.push(sqe.cid());
            }
            return;
        }
        if reply.status.is_success() && !reply.data.is_empty() {
            let want = sqe.sgl().length as usize;
            let mut d = reply.data;
            d.resize(want.min(d.len().max(want)), 0);
            d.truncate(want);
            if d.is_empty() {
                self.complete(slot, reply.status, reply.result, reply.dw1, now);
            } else {
                let cid = sqe.cid();
                self.send_c2h_data_then(slot, cid, &d, reply.result, reply.dw1, now);
            }
            return;
        }
        self.complete(slot, reply.status, reply.result, reply.dw1, now);
    }

    fn execute_fabrics(&mut self, slot: u16, sqe: &Sqe, data: &[u8], now: Instant) {
        match sqe.fctype() {
            fctype::CONNECT => {
                let (status, result) = self.connect(sqe, data, now);
                self.complete(slot, status, result, 0, now);
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => {
                let Some(ctrl) = self.ctrl.clone() else {
                    self.complete(slot, Status::COMMAND_SEQUENCE_ERROR, 0, 0, now);
                    return;
                };
                if self.qid != 0 || !PropertyCommand::attrib_valid(sqe) {
                    self.complete(slot, Status::INVALID_FIELD, 0, 0, now);
                    return;
                }
                ctrl.keep_alive(now);
                let p = PropertyCommand::parse(sqe);
                if sqe.fctype() == fctype::PROPERTY_GET {
                    match ctrl.property_get(p.offset, p.size8, &self.reg) {
                        Ok(v) => {
                            self.complete(slot, Status::SUCCESS, v as u32, (v >> 32) as u32, now)
                        }
                        Err(s) => self.complete(slot, s, 0, 0, now),
                    }
                } else {
                    match ctrl.property_set(p.offset, p.size8, p.value) {
                        Ok(shutdown_started) => {
                            if shutdown_started {
                                self.start_shutdown_flush(&ctrl);
                            }
                            self.complete(slot, Status::SUCCESS, 0, 0, now);
                        }
                        Err(st) => self.complete(slot, st, 0, 0, now),
                    }
                }
            }
            fctype::DISCONNECT => {
                self.complete(slot, Status::SUCCESS, 0, 0, now);
                self.close("host disconnected the queue");
            }
            _ => self.complete(slot, Status::INVALID_FIELD, 0, 0, now),
        }
    }

    fn connect(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> (Status, u32) {
        let c = ConnectCommand::parse(sqe);
        let invalid = |in_data: bool, ipo: u16| {
            (
                Status::CONNECT_INVALID_PARAMETERS,
                connect_invalid_param_result(in_data, ipo),
            )
        };
        if c.recfmt != 0 {
            return (Status::CONNECT_INCOMPATIBLE_FORMAT, 0);
        }
        let cd = match ConnectData::parse(data) {
            Ok(cd) => cd,
            Err(e) => {
                tracing::warn!(error = %e, "rejecting Connect");
                return invalid(true, e.offset);
            }
        };
        self.span.record("hostnqn", cd.hostnqn.as_str());
        self.span.record("subnqn", cd.subnqn.as_str());
        let Some(sub) = self.reg.subsystem(&cd.subnqn) else {
            tracing::warn!(subnqn = %cd.subnqn, "Connect to an unknown subsystem");
            return invalid(true, connect_data_offset::SUBNQN);
        };
        if !sub.host_allowed(&cd.hostnqn) {
            tracing::warn!(hostnqn = %cd.hostnqn, subnqn = %sub.nqn, "host is not on the subsystem's allow-list; Connect refused");
            return (Status::CONNECT_INVALID_HOST, 0);
        }
        let mqes = self.reg.settings.queue_depth_max - 1;
        if c.sqsize == 0 || c.sqsize > mqes || (c.qid == 0 && c.sqsize < 31) {
            return invalid(false, connect_offset::SQSIZE);
        }
        let ctrl = if c.qid == 0 {
            if cd.cntlid != CNTLID_DYNAMIC {
                return invalid(true, connect_data_offset::CNTLID);
            }
            let counters = self.reg.hosts.counters_for(&cd.hostnqn);
            let kato = c.kato_ms;
            let made = sub.add_controller(|id| {
                Arc::new(Controller::new(
                    id,
                    sub.clone(),
                    cd.hostnqn.clone(),
                    cd.hostid,
                    kato,
                    counters,
                    now,
                ))
            });
            match made {
                Some(ctrl) => {
                    tracing::info!(cntlid = ctrl.cntlid, kato_ms = kato, "controller created");
                    ctrl
                }
                None => return (Status::CONNECT_CONTROLLER_BUSY, 0),
            }
        } else {
            if sub.kind == SubsystemKind::Discovery {
                return invalid(false, connect_offset::QID);
            }
            let Some(ctrl) = sub.controller(cd.cntlid) else {
                return invalid(true, connect_data_offset::CNTLID);
            };
            if ctrl.hostnqn != cd.hostnqn {
                return invalid(true, connect_data_offset::HOSTNQN);
            }
            if ctrl.hostid != cd.hostid {
                return invalid(true, connect_data_offset::HOSTID);
            }
            if let Err(st) = ctrl.connect_io_queue(c.qid, self.reg.settings.io_queues_max) {
                return if st == Status::CONNECT_INVALID_PARAMETERS {
                    invalid(false, connect_offset::QID)
                } else {
                    (st, 0)
                };
            }
            ctrl
        };
        self.span.record("cntlid", ctrl.cntlid);
        self.span.record("qid", c.qid);
        let st = &self.reg.settings;
        let send = st.subsystem_send.get(&cd.subnqn).unwrap_or(&st.send);
        self.replace_scheduler(send.build(c.qid > 0), now);
        self.qid = c.qid;
        self.depth = c.sqsize + 1;
        self.sq_flow_disabled = c.cattr & CATTR_DISABLE_SQ_FLOW != 0;
        self.sqhd = 0;
        let cntlid = ctrl.cntlid;
        self.ctrl = Some(ctrl);
        self.state = ConnState::Ready;
        tracing::debug!(
            sqsize = c.sqsize,
            sq_flow_disabled = self.sq_flow_disabled,
            "queue connected"
        );
        (Status::SUCCESS, cntlid as u32)
    }

    // ---------------------------------------------------------------- output

    fn send_pdu(&mut self, class: PduClass, h: &PduHeader, data: &[u8], now: Instant) {
        let buf = self.tx.buffer(class);
        encode_pdu(h, data, &self.txp, buf);
        self.tx.commit(class, now);
    }

    /// Encodes a PDU without data that belongs to command `cid`.
    fn send_cmd_pdu(&mut self, class: PduClass, cid: u16, h: &PduHeader, now: Instant) {
        let buf = self.tx.buffer(class);
        encode_pdu(h, &[], &self.txp, buf);
        self.tx.commit_cmd(class, cid, now);
    }

    fn respond_now(&mut self, cid: u16, status: Status, result: u32, now: Instant) {
        let cqe = self.cqe(cid, status, result, 0);
        self.send_cmd_pdu(PduClass::Response, cid, &PduHeader::CapsuleResp(cqe), now);
    }

    fn cqe(&self, cid: u16, status: Status, result: u32, dw1: u32) -> Cqe {
        Cqe {
            result,
            dw1,
            sqhd: if self.sq_flow_disabled {
                0xffff
            } else {
                self.sqhd
            },
            sqid: self.qid,
            cid,
            status: status.into(),
        }
    }

    /// Completes the command in `slot` with a CapsuleResp.
    fn complete(&mut self, slot: u16, status: Status, result: u32, dw1: u32, now: Instant) {
        let Some(cmd) = self.free_slot(slot) else {
            return;
        };
        if !status.is_success() {
            tracing::debug!(cid = cmd.sqe.cid(), opcode = cmd.sqe.opcode(), %status, "command failed");
        }
        let cqe = self.cqe(cmd.sqe.cid(), status, result, dw1);
        self.send_cmd_pdu(
            PduClass::Response,
            cmd.sqe.cid(),
            &PduHeader::CapsuleResp(cqe),
            now,
        );
        self.maybe_finish_close();
    }

    fn send_c2h_data_and_complete(&mut self, slot: u16, cid: u16, data: &[u8], now: Instant) {
        self.send_c2h_data_then(slot, cid, data, 0, 0, now);
    }

    /// Sends `data` as C2HData PDUs, then completes the command; with SQ flow
    /// control disabled and nothing else to report, the last PDU carries the
    /// SUCCESS flag instead of a CapsuleResp.
    fn send_c2h_data_then(
        &mut self,
        slot: u16,
        cid: u16,
        data: &[u8],
        result: u32,
        dw1: u32,
        now: Instant,
    ) {
        let chunk = self.reg.settings.max_c2h_data_bytes as usize;
        let success_flag = self.sq_flow_disabled && result == 0 && dw1 == 0;
        let mut off = 0usize;
        while off < data.len() {
            let n = chunk.min(data.len() - off);
            let last = off + n == data.len();
            let h = PduHeader::C2HData(DataHeader {
                cccid: cid,
                ttag: 0,
                offset: off as u32,
                len: n as u32,
                last,
                success: last && success_flag,
            });
            let piece = &data[off..off + n];
            let buf = self.tx.buffer(PduClass::Data);
            let dd = encode_prefix(&h, n, &self.txp, buf);
            buf.extend_from_slice(piece);
            if dd > 0 {
                buf.extend_from_slice(&sluice_proto::digest::crc32c(piece).to_le_bytes());
            }
            self.tx.commit_cmd(PduClass::Data, cid, now);
            self.stats.c2h_pdus += 1;
            off += n;
        }
        if success_flag && !data.is_empty() {
            self.free_slot(slot);
            self.maybe_finish_close();
        } else {
            self.complete(slot, Status::SUCCESS, result, dw1, now);
        }
    }
}

/// Maps a backend error to the NVMe status the host sees.
pub fn backend_status(e: &BackendError) -> Status {
    match e {
        BackendError::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE,
        BackendError::Misaligned { .. } | BackendError::TransferTooLarge { .. } => {
            Status::INVALID_FIELD
        }
        BackendError::WriteFault { .. } => Status::WRITE_FAULT,
        BackendError::ReadError { .. } => Status::UNRECOVERED_READ_ERROR,
        BackendError::ReadOnly => Status::new(0, 0x20).dnr(), // Namespace Is Write Protected
        BackendError::QueueFull { .. } => Status::NAMESPACE_NOT_READY,
        BackendError::Unsupported(_) => Status::INVALID_OPCODE,
        _ => Status::INTERNAL_ERROR,
    }
}
