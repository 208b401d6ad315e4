//! Completion stage: backend completions come back by tag and update the
//! namespace and host counters; commands end with a CapsuleResp (SQHD, CID,
//! status), reads and admin data first as C2HData PDUs (split at
//! `max_c2h_data_bytes`, padded to HPDA, with a data digest if
//! negotiated), or with the SUCCESS flag on the last C2HData when the host
//! disabled SQ flow control. [`Responder`] owns the send scheduler, the
//! negotiated encoding and the SQ head.

use super::commands::CmdKind;
use super::QueueConnection;
use crate::tag::BackendTag;
use sluice_backend::{BackendError, IoCompletion, SharedRange};
use sluice_proto::outbuf::Attachment;
use sluice_proto::pdu::{encode_pdu, encode_prefix, DataHeader, PduHeader, TxParams};
use sluice_proto::send::{Immediate, PduClass, SendScheduler, SendStats};
use sluice_proto::{Cqe, Status};
use std::sync::Arc;
use std::time::Instant;

/// A read's own buffer (an owned read buffer, not the backend's bytes) is
/// sent from itself (its C2HData pieces attached, written with `writev`)
/// when its pieces are at least this long; shorter ones are copied into
/// the send buffer, which is cheaper than an `Arc` and an iovec each for
/// bytes that are already hot.
pub(crate) const C2H_ATTACH_BYTES_MIN: usize = 16 * 1024;

/// Reads at least this long may come back from the backend with its own
/// bytes shared ([`sluice_backend::BackendQueue::share_reads`]) when
/// `target.ram_reads_in_place` is on: RAM namespaces then send them from
/// the chunk, each C2HData piece of at least this size attached, so the
/// kernel's send copy is the only copy. At 4 KiB that is two copies fewer
/// (out of the chunk into a read buffer, out of that into the send
/// buffer): 1.15-1.25x IOPS on 4 KiB random reads at QD 32 (docs/target.md).
/// Shorter reads are copied.
pub const READ_SHARE_BYTES_MIN: usize = 4 * 1024;

/// Opens a worker's queue on `backend` as the target's settings ask: RAM
/// reads in place when `ram_reads_in_place` is on. For every event loop
/// that drives queue connections (the target's workers, the in-memory pair).
pub fn open_backend_queue(
    backend: &dyn sluice_backend::Backend,
    settings: &sluice_config::TargetSettings,
) -> Result<Box<dyn sluice_backend::BackendQueue>, BackendError> {
    let mut q = backend.open_queue()?;
    if settings.ram_reads_in_place {
        q.share_reads(READ_SHARE_BYTES_MIN);
    }
    Ok(q)
}

/// The send side of the queue.
#[derive(Debug)]
pub(super) struct Responder {
    pub(super) tx: Box<dyn SendScheduler>,
    /// Digests and alignment negotiated by ICReq.
    pub(super) txp: TxParams,
    sq_flow_disabled: bool,
    /// A successful read completes with the SUCCESS flag on its last
    /// C2HData, no CapsuleResp (see [`Self::connected`]).
    success_flag: bool,
    /// SQ head pointer reported in CQEs.
    sqhd: u16,
}

impl Responder {
    pub(super) fn new() -> Self {
        Responder {
            tx: Box::new(Immediate::new()),
            txp: TxParams::default(),
            sq_flow_disabled: false,
            success_flag: false,
            sqhd: 0,
        }
    }

    /// Connect accepted: SQ flow control as the host asked, SQ head at 0.
    /// With SQ flow control disabled a successful read completes with the
    /// SUCCESS flag on its last C2HData, unless the queue's responses are
    /// coalesced: the coalescer batches CapsuleResps (and fires on a
    /// Barrier's), so those reads keep theirs.
    pub(super) fn connected(&mut self, sq_flow_disabled: bool, coalesced: bool) {
        self.sq_flow_disabled = sq_flow_disabled;
        self.success_flag = sq_flow_disabled && !coalesced;
        self.sqhd = 0;
    }

    /// One SQE consumed on a queue of `depth` entries (unless SQ flow
    /// control is disabled).
    pub(super) fn advance_sqhd(&mut self, depth: u16) {
        if self.sq_flow_disabled {
            return;
        }
        // A Ready queue has depth = SQSIZE + 1 >= 2.
        debug_assert!(depth > 0, "SQ head advanced before Connect set the depth");
        self.sqhd = (self.sqhd + 1) % depth;
    }

    /// Swaps the send scheduler (at Connect, once the subsystem is known);
    /// bytes the old one still holds go first.
    pub(super) fn replace_scheduler(&mut self, mut new: Box<dyn SendScheduler>, now: Instant) {
        let old = self.tx.due_copy();
        if !old.is_empty() {
            new.buffer(PduClass::Control).extend_from_slice(&old);
            new.commit(PduClass::Control, now);
        }
        self.tx = new;
    }

    /// Ends the stream with a C2HTermReq: the bytes already due go first,
    /// then the TermReq, then nothing. PDUs the scheduler still held and
    /// every later send (a backend completion landing after the fatal
    /// error) are dropped: the specification lets nothing follow a
    /// TermReq.
    pub(super) fn terminate(&mut self, term: &PduHeader, data: &[u8]) {
        let mut due = self.tx.due_copy();
        encode_pdu(term, data, &self.txp, &mut due);
        let mut stats = self.tx.stats();
        stats.pdus += 1;
        self.tx = Box::new(Terminated {
            due,
            start: 0,
            dropped: Vec::new(),
            stats,
        });
    }

    pub(super) fn send_pdu(&mut self, class: PduClass, h: &PduHeader, data: &[u8], now: Instant) {
        let buf = self.tx.buffer(class);
        encode_pdu(h, data, &self.txp, buf);
        self.tx.commit(class, now);
    }

    /// Encodes a PDU without data that belongs to command `cid`.
    pub(super) fn send_cmd_pdu(&mut self, class: PduClass, cid: u16, h: &PduHeader, now: Instant) {
        let buf = self.tx.buffer(class);
        encode_pdu(h, &[], &self.txp, buf);
        self.tx.commit_cmd(class, cid, now);
    }

    fn cqe(&self, qid: u16, cid: u16, status: Status, result: u32, dw1: u32) -> Cqe {
        Cqe {
            result,
            dw1,
            sqhd: if self.sq_flow_disabled {
                0xffff
            } else {
                self.sqhd
            },
            sqid: qid,
            cid,
            status: status.into(),
        }
    }
}

/// The send path once a C2HTermReq is queued (see [`Responder::terminate`]).
#[derive(Debug)]
struct Terminated {
    /// What was due at the fatal error, then the TermReq.
    due: Vec<u8>,
    /// Written prefix of `due`.
    start: usize,
    /// Where later PDUs are encoded, to be dropped at their commit.
    dropped: Vec<u8>,
    stats: SendStats,
}

impl SendScheduler for Terminated {
    fn buffer(&mut self, _class: PduClass) -> &mut Vec<u8> {
        &mut self.dropped
    }

    fn commit(&mut self, _class: PduClass, _now: Instant) {
        self.dropped.clear();
    }

    fn due(&self) -> &[u8] {
        &self.due[self.start..]
    }

    fn consume(&mut self, n: usize) {
        assert!(
            self.start + n <= self.due.len(),
            "consumed more than was due"
        );
        self.start += n;
    }

    fn poll(&mut self, _now: Instant) {}

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn backlog_bytes(&self) -> usize {
        self.due.len() - self.start
    }

    fn stats(&self) -> SendStats {
        self.stats
    }
}

impl QueueConnection {
    /// A backend completion (local tag: slot or shutdown flush).
    pub(super) fn backend_completion(&mut self, c: IoCompletion, now: Instant) {
        self.exec.completed();
        let tag = BackendTag::from_raw(c.tag);
        if tag.is_shutdown_flush() {
            if let Err(e) = &c.result {
                tracing::error!(parent: &self.span, error = %e, "flush for the shutdown notification failed");
            }
            if self.exec.shutdown_flush_done() {
                if let Some(ctrl) = &self.session.ctrl {
                    ctrl.shutdown_flushed();
                }
            }
            self.maybe_finish_close();
            return;
        }
        let slot = tag.slot_index();
        let span = &self.span;
        let Some(cmd) = self.cmds.get_mut(slot) else {
            self.maybe_finish_close();
            return;
        };
        if let Err(e) = &c.result {
            tracing::debug!(parent: span, error = %e, cid = cmd.sqe.cid(), "backend error");
            if cmd.status.is_success() {
                cmd.status = backend_status(e);
            }
        }
        debug_assert!(
            cmd.ops_pending > 0,
            "completion for slot {slot} with no backend request pending"
        );
        cmd.ops_pending -= 1;
        if cmd.ops_pending > 0 {
            return;
        }
        let status = cmd.status;
        let cid = cmd.sqe.cid();
        let ctrl = &self.session.ctrl;
        match &cmd.kind {
            CmdKind::Read { ns, len_bytes, .. } => {
                let ns = ns.clone();
                let len = *len_bytes;
                if status.is_success() {
                    ns.counters.record_read(len);
                    if let Some(c) = ctrl {
                        c.host_counters.record_read(len);
                    }
                    let pdu_max = self.reg.settings.max_c2h_data_bytes as usize;
                    let shared = match (c.shared, c.buf) {
                        // The backend's own bytes (a RAM chunk): large
                        // pieces are attached, small ones copied once.
                        (Some(shared), _) => shared,
                        // Large reads go out from their own buffer, when
                        // their C2HData pieces are large enough to attach.
                        (None, Some(buf)) if buf.len().min(pdu_max) >= C2H_ATTACH_BYTES_MIN => {
                            SharedRange::whole(Arc::new(buf))
                        }
                        (None, buf) => {
                            let data = buf.as_ref().map(|b| b.as_slice()).unwrap_or(&[]);
                            self.send_c2h_data_then(slot, cid, data, 0, 0, now);
                            return;
                        }
                    };
                    self.send_c2h_pdus(slot, cid, C2hData::Shared(&shared), 0, 0, now);
                    return;
                }
                ns.counters.record_error();
            }
            CmdKind::Write { ns, len_bytes, .. } => {
                if status.is_success() {
                    ns.counters.record_write(*len_bytes);
                    if let Some(c) = ctrl {
                        c.host_counters.record_write(*len_bytes);
                    }
                } else {
                    ns.counters.record_error();
                }
            }
            _ => {
                if let Some(c) = ctrl {
                    c.host_counters.record_other();
                }
            }
        }
        if !status.is_success() {
            if let Some(c) = ctrl {
                c.host_counters.record_error();
            }
        }
        self.complete(slot, status, 0, 0, now);
    }

    /// Answers a command that was never admitted (no slot).
    pub(super) fn respond_now(&mut self, cid: u16, status: Status, result: u32, now: Instant) {
        let cqe = self.out.cqe(self.session.qid, cid, status, result, 0);
        self.out
            .send_cmd_pdu(PduClass::Response, cid, &PduHeader::CapsuleResp(cqe), now);
    }

    /// Completes the command in `slot` with a CapsuleResp.
    pub(super) fn complete(
        &mut self,
        slot: u16,
        status: Status,
        result: u32,
        dw1: u32,
        now: Instant,
    ) {
        let Some(cmd) = self.cmds.free(slot) else {
            return;
        };
        if !status.is_success() {
            tracing::debug!(cid = cmd.sqe.cid(), opcode = cmd.sqe.opcode(), %status, "command failed");
        }
        let cid = cmd.sqe.cid();
        let cqe = self.out.cqe(self.session.qid, cid, status, result, dw1);
        self.out
            .send_cmd_pdu(PduClass::Response, cid, &PduHeader::CapsuleResp(cqe), now);
        self.maybe_finish_close();
    }

    /// Sends `data` as C2HData PDUs, then completes the command; with SQ flow
    /// control disabled and nothing else to report, the last PDU carries the
    /// SUCCESS flag instead of a CapsuleResp.
    pub(super) fn send_c2h_data_then(
        &mut self,
        slot: u16,
        cid: u16,
        data: &[u8],
        result: u32,
        dw1: u32,
        now: Instant,
    ) {
        self.send_c2h_pdus(slot, cid, C2hData::Copied(data), result, dw1, now);
    }

    /// The C2HData PDUs of `data` (pieces of shared data of at least
    /// [`READ_SHARE_BYTES_MIN`] are attached, not copied), then the
    /// completion.
    fn send_c2h_pdus(
        &mut self,
        slot: u16,
        cid: u16,
        data: C2hData<'_>,
        result: u32,
        dw1: u32,
        now: Instant,
    ) {
        let (data, shared) = match data {
            C2hData::Copied(bytes) => (bytes, None),
            C2hData::Shared(range) => (range.as_slice(), Some(range)),
        };
        let chunk = self.reg.settings.max_c2h_data_bytes as usize;
        let success_flag = self.out.success_flag && result == 0 && dw1 == 0;
        let mut off = 0usize;
        while off < data.len() {
            let n = chunk.min(data.len() - off);
            let last = off + n == data.len();
            // One command's data: at most MDTS bytes, which is a u32.
            debug_assert!(u32::try_from(data.len()).is_ok(), "C2H data beyond u32");
            #[allow(clippy::cast_possible_truncation)]
            let (offset, len) = (off as u32, n as u32);
            let h = PduHeader::C2HData(DataHeader {
                cccid: cid,
                ttag: 0,
                offset,
                len,
                last,
                success: last && success_flag,
            });
            let piece = &data[off..off + n];
            let buf = self.out.tx.buffer(PduClass::Data);
            let dd = encode_prefix(&h, n, &self.out.txp, buf);
            let attachment = shared
                .filter(|_| n >= READ_SHARE_BYTES_MIN)
                .and_then(|s| s.slice(off..off + n))
                .and_then(Attachment::from_range);
            match attachment {
                Some(a) => {
                    self.stats.c2h_attached_bytes += n as u64;
                    self.out.tx.attach(PduClass::Data, a);
                }
                None => buf.extend_from_slice(piece),
            }
            if dd > 0 {
                let digest = sluice_proto::digest::crc32c(piece).to_le_bytes();
                self.out
                    .tx
                    .buffer(PduClass::Data)
                    .extend_from_slice(&digest);
            }
            self.out.tx.commit_cmd(PduClass::Data, cid, now);
            self.stats.c2h_pdus += 1;
            off += n;
        }
        if success_flag && !data.is_empty() {
            self.cmds.free(slot);
            self.maybe_finish_close();
        } else {
            self.complete(slot, Status::SUCCESS, result, dw1, now);
        }
    }
}

/// A read's data as it goes out in C2HData PDUs.
#[derive(Debug, Clone, Copy)]
enum C2hData<'a> {
    /// Bytes to copy into the PDUs.
    Copied(&'a [u8]),
    /// The backend's shared bytes (or the read's own buffer, shared):
    /// large pieces are attached.
    Shared(&'a SharedRange),
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
        BackendError::QueueFull { .. } | BackendError::Unavailable(_) => {
            Status::NAMESPACE_NOT_READY
        }
        BackendError::Unsupported(_) => Status::INVALID_OPCODE,
        BackendError::CapacityExceeded(_) => Status::CAPACITY_EXCEEDED,
        _ => Status::INTERNAL_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sq_head_wraps_at_the_queue_depth() {
        let mut r = Responder::new();
        r.connected(false, false);
        for _ in 0..3 {
            r.advance_sqhd(4);
        }
        assert_eq!(r.cqe(1, 9, Status::SUCCESS, 0, 0).sqhd, 3);
        r.advance_sqhd(4);
        let c = r.cqe(1, 9, Status::SUCCESS, 7, 8);
        assert_eq!((c.sqhd, c.sqid, c.cid, c.result, c.dw1), (0, 1, 9, 7, 8));
    }

    #[test]
    fn sq_flow_disabled_reports_ffff_and_never_advances() {
        let mut r = Responder::new();
        r.connected(true, false);
        r.advance_sqhd(0);
        r.advance_sqhd(4);
        assert_eq!(r.sqhd, 0);
        assert_eq!(r.cqe(2, 1, Status::SUCCESS, 0, 0).sqhd, 0xffff);
        // A new Connect resets both.
        r.connected(false, false);
        assert_eq!(r.cqe(2, 1, Status::SUCCESS, 0, 0).sqhd, 0);
    }

    #[test]
    fn backend_errors_map_to_nvme_statuses() {
        assert_eq!(
            backend_status(&BackendError::ReadOnly),
            Status::new(0, 0x20).dnr()
        );
        assert_eq!(
            backend_status(&BackendError::QueueFull { in_flight: 3 }),
            Status::NAMESPACE_NOT_READY
        );
        assert_eq!(
            backend_status(&BackendError::Unsupported("x")),
            Status::INVALID_OPCODE
        );
        assert_eq!(
            backend_status(&BackendError::CapacityExceeded("pool full".into())),
            Status::CAPACITY_EXCEEDED
        );
        assert_eq!(
            backend_status(&BackendError::Unavailable("drive gone".into())),
            Status::NAMESPACE_NOT_READY
        );
        assert_eq!(
            backend_status(&BackendError::OutOfRange {
                offset_bytes: 0,
                len_bytes: 1,
                size_bytes: 0
            }),
            Status::LBA_OUT_OF_RANGE
        );
    }
}
