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
//!
//! One file per stage, each owning its state:
//!
//! * this file: the [`QueueConnection`] and its public `handle_*`/`poll_*`
//!   API, the PDU dispatch loop and the connection's life (draining,
//!   closing, timers);
//! * `handshake`: ICReq/ICResp and Connect (`Session`: queue id,
//!   depth, controller);
//! * `admit`: the checks every CapsuleCmd passes before any data moves;
//! * `data`: R2T and H2CData collection;
//! * `execute`: fabrics and admin commands inline, I/O commands turned into
//!   backend requests (`Execution`);
//! * `complete`: backend completions, CapsuleResp and C2HData encoding into
//!   the send scheduler (`Responder`);
//! * `commands`: the in-flight command table the stages share.

mod admit;
mod commands;
mod complete;
mod data;
mod execute;
mod handshake;

pub use complete::backend_status;
pub use complete::{open_backend_queue, READ_SHARE_BYTES_MIN};

use crate::controller::Controller;
use crate::registry::Registry;
use crate::subsystem::Namespace;
use commands::CommandTable;
use complete::Responder;
use execute::Execution;
use handshake::Session;
use sluice_backend::{IoCompletion, IoRequest};
use sluice_proto::framer::{copy_into_two, Framer};
use sluice_proto::pdu::{self, DecodeError, PduHeader, TermReq};
use sluice_proto::send::SendStats;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In-capsule data accepted on the admin queue (what Linux sends: 8 KiB).
pub const ADMIN_INLINE_BYTES: u32 = 8192;
/// Smallest socket read offered until the queue is connected: an ICReq
/// (128 bytes) and then a Connect capsule (its PDU grows the buffer to its
/// own size, about 1.1 KiB), so a socket that never gets that far holds
/// twice this, not a full-size receive buffer (see `handshake`).
pub const HANDSHAKE_READ_CHUNK_BYTES: usize = 256;
/// How often a queue checks whether its controller has failed.
pub const CONTROLLER_CHECK_INTERVAL: Duration = Duration::from_millis(200);
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

/// A backend request the I/O layer must submit; `req.tag` is a local
/// `BackendTag` (connection index 0) that
/// identifies the command within this connection.
#[derive(Debug)]
pub struct BackendSubmit {
    pub ns: Arc<Namespace>,
    pub req: IoRequest,
}

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub(crate) commands: u64,
    pub(crate) r2ts: u64,
    pub(crate) h2c_pdus: u64,
    /// Bytes the socket wrote straight into command buffers (the rest of
    /// large H2CData PDUs and of Writes' large in-capsule data).
    pub(crate) rx_direct_bytes: u64,
    pub(crate) c2h_pdus: u64,
    /// C2HData bytes handed to the send path by reference (sent from the
    /// read's own buffer, not copied into the send buffer).
    pub(crate) c2h_attached_bytes: u64,
}

impl QueueStats {
    /// Bytes the socket wrote straight into command buffers (the rest of
    /// large H2CData PDUs and of Writes' large in-capsule data, past the
    /// framer).
    pub fn rx_direct_bytes(&self) -> u64 {
        self.rx_direct_bytes
    }

    /// C2HData bytes sent from the reads' own buffers (vectored), not
    /// copied into the send buffer.
    pub fn c2h_attached_bytes(&self) -> u64 {
        self.c2h_attached_bytes
    }
}

/// One queue pair (one TCP connection) on the target.
#[derive(Debug)]
pub struct QueueConnection {
    reg: Arc<Registry>,
    span: tracing::Span,
    /// The host's address (the I/O layer knows it; in-memory peers pass
    /// None), named in the log line of a refused Connect.
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    /// Always present except while `process_input` runs.
    framer: Option<Framer>,
    state: ConnState,
    draining: bool,
    close_reason: Option<String>,
    next_check: Instant,
    /// The grid the controller checks fall on (see [`Self::align_checks_to`]).
    check_origin: Option<Instant>,
    /// Handshake: queue id, depth, controller.
    session: Session,
    /// Admitted commands not yet completed.
    cmds: CommandTable,
    /// Backend requests and held AERs.
    exec: Execution,
    /// The send path and the SQ head.
    out: Responder,
    stats: QueueStats,
    /// An H2CData PDU or in-capsule data being read straight into its
    /// command's buffer (see [`Self::recv_bufs`]).
    direct_rx: Option<data::DirectRx>,
}

impl QueueConnection {
    pub fn new(
        reg: Arc<Registry>,
        peer: Option<SocketAddr>,
        local: Option<SocketAddr>,
        now: Instant,
    ) -> Self {
        let span = tracing::info_span!(
            "queue",
            peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
            hostnqn = tracing::field::Empty,
            subnqn = tracing::field::Empty,
            cntlid = tracing::field::Empty,
            qid = tracing::field::Empty,
            tenant = tracing::field::Empty,
        );
        QueueConnection {
            reg,
            span,
            peer,
            local,
            framer: Some(handshake::handshake_framer()),
            state: ConnState::AwaitIcReq,
            draining: false,
            close_reason: None,
            next_check: now + CONTROLLER_CHECK_INTERVAL,
            check_origin: None,
            session: Session::new(now),
            cmds: CommandTable::default(),
            exec: Execution::default(),
            out: Responder::new(),
            stats: QueueStats::default(),
            direct_rx: None,
        }
    }

    // ---------------------------------------------------------------- I/O layer API

    /// Space to read socket bytes into, in order (one `readv`). The first
    /// is empty unless a large H2CData PDU or a Write's large in-capsule
    /// data is under way: then it is the rest of that data in its
    /// command's own buffer, so the bulk of a large write is copied once
    /// (by the kernel). The second is the framer's (at most one read
    /// chunk, and a small tail after in-place data).
    pub fn recv_bufs(&mut self) -> (&mut [u8], &mut [u8]) {
        let framer = self
            .framer
            .as_mut()
            .expect("framer present outside process_input");
        if let Some(d) = self.direct_rx.as_mut().filter(|d| d.rest.left > 0) {
            let range = d.rest.range();
            let buf = match &mut d.dest {
                data::DirectDest::H2c { slot, .. } | data::DirectDest::Capsule { slot } => {
                    self.cmds.get_mut(*slot).and_then(|c| c.buf.as_mut())
                }
                data::DirectDest::Discard { buf } => Some(buf),
            };
            if let Some(buf) = buf {
                let tail = framer.read_buf();
                let n = tail.len().min(data::DIRECT_RX_TAIL_BYTES);
                return (&mut buf[range], &mut tail[..n]);
            }
        }
        let chunk = framer.read_chunk();
        let b = framer.read_buf();
        let n = b.len().min(chunk);
        (&mut [], &mut b[..n])
    }

    /// Processes `n` bytes just read into [`Self::recv_bufs`] (the first
    /// buffer fills before the second). Returns how many of them went in
    /// place (into the first buffer).
    pub fn handle_received(&mut self, n: usize, now: Instant) -> usize {
        let past = self.direct_rx.as_mut().map_or(n, |d| d.rest.take(n));
        let in_place = n - past;
        self.stats.rx_direct_bytes += in_place as u64;
        self.framer
            .as_mut()
            .expect("framer present outside process_input")
            .advance(past);
        self.process_input(now);
        in_place
    }

    /// Feeds bytes by copy (in-memory peers and tests), through
    /// [`Self::recv_bufs`] as a socket would.
    pub fn feed(&mut self, mut bytes: &[u8], now: Instant) {
        while !bytes.is_empty() {
            if !self.wants_input() {
                return;
            }
            let (a, b) = self.recv_bufs();
            let n = copy_into_two(bytes, a, b);
            self.handle_received(n, now);
            bytes = &bytes[n..];
        }
    }

    /// Whether received bytes are still processed (not closed or draining).
    fn wants_input(&self) -> bool {
        matches!(
            self.state,
            ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Ready
        ) && !self.draining
    }

    /// Whether the I/O layer should read more from the socket now.
    pub fn wants_read(&self) -> bool {
        matches!(
            self.state,
            ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Ready
        ) && !self.draining
            && self.out.tx.backlog_bytes() < TX_BACKLOG_BYTES_MAX
    }

    /// The next backend request to submit.
    pub fn poll_backend(&mut self) -> Option<BackendSubmit> {
        self.exec.poll()
    }

    /// Backend requests submitted and not yet completed.
    pub fn backend_in_flight(&self) -> u32 {
        self.exec.in_flight()
    }

    /// Hands back a backend completion; its tag is the local tag the request
    /// was issued with (connection index stripped).
    pub fn handle_backend_completion(&mut self, c: IoCompletion, now: Instant) {
        self.backend_completion(c, now);
    }

    /// The first run of bytes due for the socket; empty only when nothing
    /// is due. Large reads' data are runs of their own (see
    /// [`QueueConnection::due_vectored`]).
    pub fn due(&self) -> &[u8] {
        self.out.tx.due()
    }

    /// A copy of every byte due for the socket, all runs together (for
    /// in-memory drivers and tests; the server writes the runs as they are).
    pub fn due_copy(&self) -> Vec<u8> {
        self.out.tx.due_copy()
    }

    /// The runs of bytes due for the socket, in order, into `out` (for one
    /// `writev`); returns how many it filled.
    pub fn due_vectored<'a>(&'a self, out: &mut [std::io::IoSlice<'a>]) -> usize {
        self.out.tx.due_vectored(out)
    }

    /// Reports `n` due bytes written to the socket.
    pub fn consume(&mut self, n: usize, now: Instant) {
        self.out.tx.consume(n);
        self.out.tx.poll(now);
        self.maybe_finish_close();
    }

    /// The I/O layer reads no more of this queue's input this turn (all
    /// of it is read, or reading waits on back-pressure or a throttle): a
    /// send path that flushes when idle (`send.flush_when_idle`) makes
    /// what its containers hold due.
    pub fn handle_idle(&mut self, now: Instant) {
        self.out.tx.idle(now);
    }

    /// When the send path must next be polled (a held PDU's deadline).
    pub fn send_deadline(&self) -> Option<Instant> {
        self.out.tx.next_deadline()
    }

    /// When [`Self::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == ConnState::Closed {
            return None;
        }
        let mut t = Some(self.next_check);
        if let Some(d) = self.exec.preempt_aborts.iter().map(|p| p.poll_at).min() {
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        if let Some(d) = self.out.tx.next_deadline() {
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        if let Some(d) = self.session.keep_alive_deadline(&self.reg) {
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        t
    }

    /// Runs timers: keep-alive, controller failure, handshake timeout
    /// (`target.handshake_timeout_ms`), send deadlines.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _g = self.span.clone().entered();
        self.out.tx.poll(now);
        if self.state == ConnState::Closed {
            return;
        }
        if matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect)
            && now >= self.session.handshake_deadline(&self.reg)
        {
            self.reg.admission.record_handshake_timeout();
            self.close("no ICReq and Connect within target.handshake_timeout_ms");
            return;
        }
        if self.state == ConnState::Ready
            && self
                .session
                .auth
                .as_ref()
                .is_some_and(|a| !a.is_authenticated())
            && now >= self.session.auth_deadline(&self.reg)
        {
            tracing::warn!("host connected but did not authenticate in time");
            self.close("no DH-HMAC-CHAP within target.handshake_timeout_ms + 60 s");
            return;
        }
        if let Some(c) = self.session.ctrl.clone() {
            if let Some(d) = self.session.keep_alive_deadline(&self.reg) {
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
            if c.is_failed() && self.state != ConnState::Closing {
                self.close("controller failed or association ended");
                return;
            }
        }
        if !self.exec.preempt_aborts.is_empty() {
            self.poll_preempt_aborts(now);
        }
        if now >= self.next_check {
            self.next_check = self.check_after(now);
            self.session.refresh_namespaces();
            if self.session.qid == 0 && self.state == ConnState::Ready {
                if let Some(c) = self.session.ctrl.clone() {
                    if c.is_discovery() {
                        let reg = &self.reg;
                        c.observe_discovery(reg.genctr(), || reg.nqns_listed_for(&c.hostnqn));
                    } else {
                        c.observe_namespaces();
                    }
                    self.deliver_async_events(now);
                }
            }
        }
    }

    /// Puts this connection's periodic checks on a grid of
    /// [`CONTROLLER_CHECK_INTERVAL`] from `origin`, which the I/O layer
    /// shares between all its connections: then thousands of idle
    /// connections wake their worker once per interval, together, instead
    /// of each at its own moment.
    pub fn align_checks_to(&mut self, origin: Instant) {
        self.check_origin = Some(origin);
        self.next_check = self.check_after(self.next_check - CONTROLLER_CHECK_INTERVAL);
    }

    /// The first check time after `now`: on the grid when there is one.
    fn check_after(&self, now: Instant) -> Instant {
        let Some(origin) = self.check_origin else {
            return now + CONTROLLER_CHECK_INTERVAL;
        };
        let since = now.saturating_duration_since(origin).as_nanos();
        let step = CONTROLLER_CHECK_INTERVAL.as_nanos();
        let ticks = u32::try_from(since / step + 1).unwrap_or(u32::MAX);
        origin + CONTROLLER_CHECK_INTERVAL * ticks
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
        self.session.qid
    }

    /// The host NQN of the association once connected (`""` for a host
    /// that gave none; it belongs to the default tenant).
    pub fn hostnqn(&self) -> Option<&str> {
        self.session.ctrl.as_ref().map(|c| c.hostnqn.as_str())
    }

    /// Records the tenant the I/O layer resolved for this queue in its
    /// tracing span (once per tenant table generation, not per I/O).
    pub fn record_tenant(&self, name: &str) {
        self.span.record("tenant", name);
    }

    pub fn controller(&self) -> Option<&Arc<Controller>> {
        self.session.ctrl.as_ref()
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Counters of the send path (flushes, reasons, waits, notifications).
    pub fn send_stats(&self) -> SendStats {
        self.out.tx.stats()
    }

    /// The peer closed the socket or it failed: nothing more can be sent.
    pub fn handle_peer_closed(&mut self, why: &str) {
        let _g = self.span.clone().entered();
        if self.close_reason.is_none() {
            tracing::info!(reason = why, "connection closed by peer");
            self.close_reason = Some(why.to_string());
        }
        self.state = ConnState::Closed;
        let n = self.out.tx.due_len();
        self.out.tx.consume(n);
    }

    /// Releases controller state; call once when the socket is gone.
    pub fn finish(&mut self) {
        if self.state != ConnState::Closed {
            self.state = ConnState::Closed;
        }
        self.session.release(&self.reg, &self.span);
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

    /// Routes each whole PDU to its stage.
    fn process_with(&mut self, framer: &mut Framer, now: Instant) {
        loop {
            if !self.wants_input() {
                return;
            }
            if self.direct_rx.is_some() {
                if !self.finish_direct_rx(framer, now) {
                    return;
                }
                continue;
            }
            let pdu = match framer.next_pdu() {
                Ok(Some(p)) => p,
                Ok(None) => {
                    if self.state == ConnState::Ready && self.split_direct_rx(framer, now) {
                        continue;
                    }
                    return;
                }
                Err(e) => {
                    let quote = framer.current_header().to_vec();
                    self.fatal(&e, &quote);
                    return;
                }
            };
            note_ignored_fields(pdu.raw_header, pdu.data.len());
            match pdu.header {
                PduHeader::IcReq(r) => self.handle_ic_req(framer, r, now),
                PduHeader::CapsuleCmd(sqe) => {
                    let connecting = self.state == ConnState::AwaitConnect;
                    let data = admit::CapsuleData::Whole(pdu.data);
                    self.handle_command(sqe, pdu.raw_header, data, pdu.data_digest_ok, now);
                    if connecting && self.state == ConnState::Ready {
                        handshake::open_framer(framer, &self.reg);
                    }
                }
                PduHeader::H2CData(d) => {
                    if let Err(e) = self.handle_h2c_data(d, pdu.data, pdu.data_digest_ok, now) {
                        let quote = pdu.raw_header.to_vec();
                        self.fatal(&e, &quote);
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
                    self.fatal(&e, &quote);
                    return;
                }
            }
        }
    }

    // ---------------------------------------------------------------- life

    /// A protocol error: C2HTermReq quoting the offending header, then close.
    fn fatal(&mut self, e: &DecodeError, quote: &[u8]) {
        tracing::warn!(error = %e, fes = e.fes(), "protocol error; sending C2HTermReq and closing");
        let t = pdu::term_req_for(e, quote);
        let data = t.data.clone();
        self.out.terminate(
            &PduHeader::C2HTermReq(TermReq {
                data: Vec::new(),
                ..t
            }),
            &data,
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
        let quiet = self.out.tx.backlog_bytes() == 0;
        match self.state {
            ConnState::Closing if quiet => self.state = ConnState::Closed,
            ConnState::Ready | ConnState::AwaitConnect | ConnState::AwaitIcReq
                if self.draining
                    && quiet
                    && self.cmds.outstanding() as usize == self.exec.held_aers.len()
                    && self.exec.is_idle() =>
            {
                self.close_reason
                    .get_or_insert_with(|| "drained for shutdown".into());
                self.state = ConnState::Closed;
            }
            _ => {}
        }
    }
}

/// Records the header fields the framer ignored in a received PDU (see
/// `sluice_proto::pdu::validate_common_header`).
fn note_ignored_fields(raw_header: &[u8], data_len: usize) {
    use crate::tolerated::{note, Tolerated};
    use pdu::IgnoredField;
    let t = raw_header.first().copied().unwrap_or(0);
    for f in pdu::ignored_header_fields(raw_header, data_len) {
        let case = match f {
            IgnoredField::ReservedFlags => Tolerated::PduReservedFlags,
            IgnoredField::OffsetWithoutData => Tolerated::PduOffsetWithoutData,
            IgnoredField::ReservedBytes => Tolerated::PduReservedBytes,
            IgnoredField::DdgstfWithoutData => Tolerated::CapsuleDdgstfWithoutData,
        };
        note(
            case,
            format_args!("PDU type {t:#04x}, header {raw_header:02x?}"),
        );
    }
}
