//! Execution stage: an admitted command whose data is in runs. Fabrics
//! (Connect, Property Get/Set, Disconnect) and admin commands execute
//! inline against the controller; I/O commands become backend requests
//! (Read, Write, Flush, Write Zeroes, Dataset Management ranges) queued in
//! [`Execution`] for the I/O layer, tagged with the command's slot, once
//! the namespace's reservation allows the host (`reservation.rs`; the
//! reservation commands themselves execute inline, a Preempt and Abort
//! completing when the writes before it have). A shutdown notification
//! flushes every namespace of the subsystem.

use super::commands::CmdKind;
use super::{BackendSubmit, QueueConnection};
use crate::admin::{AdminContext, AdminReply, AER_MAX};
use crate::controller::Controller;
use crate::fence::FenceHold;
use crate::reservation::{Access, HostId, WriteHold};
use crate::subsystem::Namespace;
use crate::tag::BackendTag;
use sluice_backend::{AlignedBuf, IoOp, IoRequest};
use sluice_proto::command::admin;
use sluice_proto::dsm;
use sluice_proto::fabrics::{fctype, PropertyCommand};
use sluice_proto::fence;
use sluice_proto::reservation;
use sluice_proto::{Sqe, Status};
use sluice_runtime::cast::usize_from;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Backend requests of this connection and the AERs it holds.
#[derive(Debug, Default)]
pub(super) struct Execution {
    /// Requests waiting for the I/O layer ([`QueueConnection::poll_backend`]).
    out: VecDeque<BackendSubmit>,
    /// Requests handed to the I/O layer and not yet completed.
    in_flight: u32,
    /// Flushes outstanding for a shutdown notification.
    shutdown_flushes: u32,
    /// Command slots of Asynchronous Event Requests held for a future
    /// event, oldest first.
    pub(super) held_aers: Vec<u16>,
    /// Preempt and Abort commands waiting for writes to drain.
    pub(super) preempt_aborts: Vec<PreemptAbort>,
}

/// A Preempt and Abort that has changed the reservation and waits for the
/// writes that passed their check before it.
#[derive(Debug)]
pub(super) struct PreemptAbort {
    slot: u16,
    ns: Arc<Namespace>,
    ticket: u64,
    /// When to look again.
    pub(super) poll_at: Instant,
}

/// How often a waiting Preempt and Abort looks at its drain.
pub(super) const PREEMPT_ABORT_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// What the reservations of the namespaces a command touches allow host
/// `hostid`: the write group (Write, Write Zeroes, Dataset Management,
/// Flush) and the read group (Read) as the specification lists them. A
/// write's hold counts it for Preempt and Abort.
fn reservation_access(kind: &CmdKind, hostid: &HostId) -> Result<Option<WriteHold>, Status> {
    match kind {
        CmdKind::Read { ns, .. } => ns.reservations.check(hostid, Access::Read).map(|()| None),
        CmdKind::Write { ns, .. } | CmdKind::Dsm { ns, .. } => {
            ns.reservations.admit_write(hostid).map(Some)
        }
        CmdKind::NoData { ops, .. } => {
            let mut hold = None;
            for (ns, op, ..) in ops {
                if *op == IoOp::Flush || hold.is_some() {
                    ns.reservations.check(hostid, Access::Write)?;
                } else {
                    hold = Some(ns.reservations.admit_write(hostid)?);
                }
            }
            Ok(hold)
        }
        CmdKind::Inline | CmdKind::Reservation { .. } => Ok(None),
    }
}

impl Execution {
    fn push(&mut self, ns: Arc<Namespace>, req: IoRequest) {
        self.out.push_back(BackendSubmit { ns, req });
    }

    /// The next request for the I/O layer, counted in flight.
    pub(super) fn poll(&mut self) -> Option<BackendSubmit> {
        let s = self.out.pop_front()?;
        self.in_flight += 1;
        Some(s)
    }

    pub(super) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// One request handed out by [`Self::poll`] has completed.
    pub(super) fn completed(&mut self) {
        debug_assert!(
            self.in_flight > 0,
            "a backend completion without a request in flight"
        );
        self.in_flight -= 1;
    }

    /// One shutdown flush has completed; true when it was the last.
    pub(super) fn shutdown_flush_done(&mut self) -> bool {
        debug_assert!(
            self.shutdown_flushes > 0,
            "a shutdown flush completed that was never issued"
        );
        self.shutdown_flushes -= 1;
        self.shutdown_flushes == 0
    }

    /// Nothing queued for or in the backend.
    pub(super) fn is_idle(&self) -> bool {
        self.out.is_empty() && self.in_flight == 0
    }
}

impl QueueConnection {
    /// Executes the command in `slot` with in-capsule `data` (if any).
    pub(super) fn execute(&mut self, slot: u16, data: &[u8], now: Instant) {
        let needs_buf = matches!(
            self.cmds.get(slot).map(|c| &c.kind),
            Some(CmdKind::Write { .. })
        );
        let buf = if needs_buf || !data.is_empty() {
            Some(AlignedBuf::from_slice(data))
        } else {
            None
        };
        self.execute_with_buf(slot, buf, now);
    }

    /// Executes the command in `slot` whose data (if any) is in `buf`.
    pub(super) fn execute_with_buf(&mut self, slot: u16, buf: Option<AlignedBuf>, now: Instant) {
        let Some(cmd) = self.cmds.get_mut(slot) else {
            return;
        };
        let sqe = cmd.sqe;
        let tag = BackendTag::slot(slot).raw();
        // What the namespace's reservation allows this host (one atomic
        // load while none is held); a write is counted for Preempt and
        // Abort until the command is freed.
        if let Some(ctrl) = self.session.ctrl.as_ref() {
            match reservation_access(&cmd.kind, &ctrl.hostid) {
                Ok(hold) => cmd.write_hold = hold,
                Err(status) => {
                    self.complete(slot, status, 0, 0, now);
                    return;
                }
            }
        }
        // Writes pass their granules' chain-epoch fences (fence.rs) and are
        // counted in flight until the command is freed.
        let written = match &cmd.kind {
            CmdKind::Write {
                ns,
                offset_bytes,
                len_bytes,
                ..
            } => Some((ns, *offset_bytes, *len_bytes)),
            CmdKind::NoData { ops, .. } => ops
                .iter()
                .find(|(_, op, ..)| matches!(op, IoOp::WriteZeroes { .. } | IoOp::Deallocate))
                .map(|(ns, _, o, l)| (ns, *o, *l)),
            _ => None,
        };
        if let Some((ns, offset_bytes, len_bytes)) = written {
            match FenceHold::admit(&ns.fences, offset_bytes, len_bytes, fence::io_epoch(&sqe)) {
                Ok(hold) => cmd.fence = hold,
                Err(status) => {
                    self.complete(slot, status, 0, 0, now);
                    return;
                }
            }
        }
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
                // A read carrying a chain epoch passes the fences too (a
                // replica retired by a remap answers stale readers so).
                if let Err(status) =
                    ns.fences
                        .check_read(offset_bytes, len_bytes, fence::io_epoch(&sqe))
                {
                    self.complete(slot, status, 0, 0, now);
                    return;
                }
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
                    buf: Some(if ns.backend.fills_reads() {
                        AlignedBuf::for_overwrite(usize_from(len_bytes))
                    } else {
                        AlignedBuf::new(usize_from(len_bytes))
                    }),
                };
                self.exec.push(ns, req);
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
                self.exec.push(ns, req);
            }
            CmdKind::NoData { ops, write } => {
                cmd.ops_pending = count(ops.len());
                cmd.kind = CmdKind::NoData {
                    ops: Vec::new(),
                    write,
                };
                if ops.is_empty() {
                    self.complete(slot, Status::SUCCESS, 0, 0, now);
                    return;
                }
                for (ns, op, offset_bytes, len_bytes) in ops {
                    let req = IoRequest {
                        tag,
                        op,
                        offset_bytes,
                        len_bytes,
                        buf: None,
                    };
                    self.exec.push(ns, req);
                }
            }
            CmdKind::Dsm { ns, nr, deallocate } => {
                self.execute_dsm(slot, ns, nr, deallocate, buf, now);
            }
            CmdKind::Reservation { ns } => {
                let data = buf.as_ref().map(|b| b.as_slice()).unwrap_or(&[]);
                self.execute_reservation(slot, &sqe, &ns, data, now);
            }
        }
    }

    /// Reservation Register, Acquire, Release and Report on `ns` for this
    /// controller's host (`reservation.rs`). A Preempt and Abort completes
    /// once the writes it must outlast have drained
    /// ([`Self::poll_preempt_aborts`]).
    fn execute_reservation(
        &mut self,
        slot: u16,
        sqe: &Sqe,
        ns: &Arc<Namespace>,
        data: &[u8],
        now: Instant,
    ) {
        let Some(ctrl) = self.session.ctrl.clone() else {
            self.complete(slot, Status::COMMAND_SEQUENCE_ERROR, 0, 0, now);
            return;
        };
        let host = &ctrl.hostid;
        let r = &ns.reservations;
        let keys = || reservation::two_keys(data).ok_or(Status::DATA_SGL_LENGTH_INVALID);
        let (what, outcome) = match sqe.opcode() {
            reservation::opcode::REGISTER => (
                "register",
                reservation::RegisterCommand::parse(sqe).and_then(|c| {
                    let (crkey, nrkey) = keys()?;
                    r.register(host, c, crkey, nrkey).map(|()| None)
                }),
            ),
            reservation::opcode::ACQUIRE => (
                "acquire",
                reservation::AcquireCommand::parse(sqe).and_then(|c| {
                    let (crkey, prkey) = keys()?;
                    r.acquire(host, c, crkey, prkey)
                }),
            ),
            reservation::opcode::RELEASE => (
                "release",
                reservation::ReleaseCommand::parse(sqe).and_then(|c| {
                    let crkey =
                        reservation::one_key(data).ok_or(Status::DATA_SGL_LENGTH_INVALID)?;
                    r.release(host, c, crkey).map(|()| None)
                }),
            ),
            _ => {
                let report = reservation::ReportCommand::parse(sqe);
                // NVMe over Fabrics Host Identifiers are 128 bits: only the
                // extended data structure holds them (nvmet answers so).
                let status = if !report.extended {
                    Status::HOST_ID_INCONSISTENT
                } else if report.len_bytes < reservation::EXTENDED_HEADER_BYTES as u64 {
                    Status::INVALID_FIELD
                } else {
                    // Admission checked the length against the SGL (≤ MDTS).
                    let d = r.report().encode_extended(usize_from(report.len_bytes));
                    self.send_c2h_data_then(slot, sqe.cid(), &d, 0, 0, now);
                    return;
                };
                self.complete(slot, status, 0, 0, now);
                return;
            }
        };
        let cdw10 = sqe.cdw(10);
        match outcome {
            Ok(ticket) => {
                tracing::info!(
                    nsid = ns.nsid,
                    hostnqn = ctrl.hostnqn.as_str(),
                    action = cdw10 & 0x7,
                    rtype = (cdw10 >> 8) & 0xff,
                    "reservation {what}"
                );
                match ticket {
                    None => self.complete(slot, Status::SUCCESS, 0, 0, now),
                    Some(ticket) => {
                        self.exec.preempt_aborts.push(PreemptAbort {
                            slot,
                            ns: ns.clone(),
                            ticket,
                            poll_at: now,
                        });
                        self.poll_preempt_aborts(now);
                    }
                }
            }
            Err(status) => {
                tracing::debug!(
                    nsid = ns.nsid,
                    hostnqn = ctrl.hostnqn.as_str(),
                    %status,
                    "reservation {what} refused"
                );
                self.complete(slot, status, 0, 0, now);
            }
        }
    }

    /// Completes the Preempt and Abort commands whose writes drained; the
    /// others are looked at again after [`PREEMPT_ABORT_POLL`].
    pub(super) fn poll_preempt_aborts(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.exec.preempt_aborts.len() {
            let p = &mut self.exec.preempt_aborts[i];
            if now < p.poll_at {
                i += 1;
                continue;
            }
            if p.ns.reservations.drained(p.ticket) {
                let slot = p.slot;
                self.exec.preempt_aborts.swap_remove(i);
                self.complete(slot, Status::SUCCESS, 0, 0, now);
            } else {
                p.poll_at = now + PREEMPT_ABORT_POLL;
                i += 1;
            }
        }
    }

    /// Dataset Management: checks every range, then one Deallocate per
    /// non-empty range when the AD attribute is set.
    fn execute_dsm(
        &mut self,
        slot: u16,
        ns: Arc<Namespace>,
        nr: u32,
        deallocate: bool,
        buf: Option<AlignedBuf>,
        now: Instant,
    ) {
        let data = buf.as_ref().map(|b| b.as_slice()).unwrap_or(&[]);
        let ranges = match dsm::ranges(data, nr) {
            Ok(r) => r,
            Err(e) => {
                // Admission checked SGL length = ranges × 16; defensive.
                tracing::debug!(error = %e, "bad Dataset Management range list");
                self.complete(slot, Status::DATA_SGL_LENGTH_INVALID, 0, 0, now);
                return;
            }
        };
        let mut ops = Vec::new();
        let (mut lo, mut hi) = (u64::MAX, 0);
        for r in ranges {
            match r.end() {
                Some(end) if ns.holds(end) => {}
                _ => {
                    self.complete(slot, Status::LBA_OUT_OF_RANGE, 0, 0, now);
                    return;
                }
            }
            if r.nlb > 0 && deallocate {
                let (o, l) = (r.slba << ns.lba_shift, u64::from(r.nlb) << ns.lba_shift);
                ops.push((o, l));
                lo = lo.min(o);
                hi = hi.max(o + l);
            }
        }
        let Some(cmd) = self.cmds.get_mut(slot) else {
            return;
        };
        if !ops.is_empty() {
            // One hold over the ranges' span (counting more granules than
            // written only makes a fence's drain wait a little longer).
            match FenceHold::admit(&ns.fences, lo, hi - lo, fence::io_epoch(&cmd.sqe)) {
                Ok(hold) => cmd.fence = hold,
                Err(status) => {
                    self.complete(slot, status, 0, 0, now);
                    return;
                }
            }
        }
        cmd.ops_pending = count(ops.len());
        cmd.kind = CmdKind::NoData {
            ops: Vec::new(),
            write: true,
        };
        if ops.is_empty() {
            self.complete(slot, Status::SUCCESS, 0, 0, now);
            return;
        }
        let tag = BackendTag::slot(slot).raw();
        for (offset_bytes, len_bytes) in ops {
            let req = IoRequest {
                tag,
                op: IoOp::Deallocate,
                offset_bytes,
                len_bytes,
                buf: None,
            };
            self.exec.push(ns.clone(), req);
        }
    }

    fn execute_inline(&mut self, slot: u16, sqe: &Sqe, data: &[u8], now: Instant) {
        if sqe.opcode() == admin::FABRICS {
            self.execute_fabrics(slot, sqe, data, now);
            return;
        }
        let Some(ctrl) = self.session.ctrl.clone() else {
            self.complete(slot, Status::COMMAND_SEQUENCE_ERROR, 0, 0, now);
            return;
        };
        if self.session.qid != 0 {
            // I/O opcodes were planned in plan_io; anything else is invalid here.
            self.complete(slot, Status::INVALID_OPCODE, 0, 0, now);
            return;
        }
        let ctx = AdminContext {
            local_addr: self.local,
            local_port: self.local.map(|a| a.port()).unwrap_or(0),
        };
        let reply: AdminReply = crate::admin::execute(&ctrl, sqe, data, &self.reg, &ctx, now);
        if reply.hold {
            if self.exec.held_aers.len() >= AER_MAX {
                self.complete(slot, Status::AER_LIMIT_EXCEEDED, 0, 0, now);
            } else {
                self.exec.held_aers.push(slot);
                self.deliver_async_events(now);
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

    /// Completes held Asynchronous Event Requests with the notices their
    /// controller has due, oldest request first.
    pub(super) fn deliver_async_events(&mut self, now: Instant) {
        let Some(ctrl) = self.session.ctrl.clone() else {
            return;
        };
        while !self.exec.held_aers.is_empty() {
            let Some(dw0) = ctrl.take_async_event() else {
                return;
            };
            let slot = self.exec.held_aers.remove(0);
            tracing::info!(
                cntlid = ctrl.cntlid,
                dw0 = format_args!("{dw0:#x}"),
                "asynchronous event sent: {}",
                if dw0 == crate::events::DISCOVERY_CHANGE_DW0 {
                    "discovery log page changed"
                } else {
                    "namespace attribute changed"
                }
            );
            self.complete(slot, Status::SUCCESS, dw0, 0, now);
        }
    }

    fn execute_fabrics(&mut self, slot: u16, sqe: &Sqe, data: &[u8], now: Instant) {
        match sqe.fctype() {
            fctype::CONNECT => {
                let (status, result) = self.connect(sqe, data, now);
                self.complete(slot, status, result, 0, now);
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => {
                let Some(ctrl) = self.session.ctrl.clone() else {
                    self.complete(slot, Status::COMMAND_SEQUENCE_ERROR, 0, 0, now);
                    return;
                };
                // Properties live on the admin queue: nvmet and SPDK answer
                // Invalid Opcode on an I/O queue.
                if self.session.qid != 0 {
                    self.complete(slot, Status::INVALID_OPCODE, 0, 0, now);
                    return;
                }
                if !PropertyCommand::attrib_valid(sqe) {
                    self.complete(slot, Status::INVALID_FIELD, 0, 0, now);
                    return;
                }
                ctrl.keep_alive(now);
                let p = PropertyCommand::parse(sqe);
                if sqe.fctype() == fctype::PROPERTY_GET {
                    match ctrl.property_get(p.offset, p.size8, &self.reg.settings) {
                        Ok(v) => {
                            let (lo, hi) = ((v & 0xffff_ffff) as u32, (v >> 32) as u32);
                            self.complete(slot, Status::SUCCESS, lo, hi, now)
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
            fctype::AUTH_SEND | fctype::AUTH_RECEIVE => self.execute_auth(slot, sqe, data, now),
            // Disconnect deletes an I/O queue; the admin queue ends the
            // association by closing. nvmet and SPDK implement no Disconnect
            // and answer Invalid Opcode, so the admin queue's answer is theirs.
            fctype::DISCONNECT if self.session.qid == 0 => {
                self.complete(slot, Status::INVALID_OPCODE, 0, 0, now);
            }
            fctype::DISCONNECT => {
                self.complete(slot, Status::SUCCESS, 0, 0, now);
                self.close("host disconnected the queue");
            }
            // Unknown FCTYPE: Invalid Opcode, as nvmet and SPDK.
            _ => self.complete(slot, Status::INVALID_OPCODE, 0, 0, now),
        }
    }

    /// AUTH_Send and AUTH_Receive: one DH-HMAC-CHAP message each way
    /// (`sluice_auth::ControllerAuth` runs the transaction). Field checks as
    /// nvmet: SECP E9h, SPSP0 and SPSP1 01h, a non-zero length equal to the
    /// SGL's. A failed transaction is logged once with the peer and host
    /// NQN (never a secret); after `AUTH_FAILURES_MAX` the queue closes.
    fn execute_auth(&mut self, slot: u16, sqe: &Sqe, data: &[u8], now: Instant) {
        let cdw10 = sqe.cdw(10);
        let (spsp0, spsp1, secp) = ((cdw10 >> 8) & 0xff, (cdw10 >> 16) & 0xff, cdw10 >> 24);
        let len = sqe.cdw(11);
        if secp != u32::from(sluice_auth::message::SECP_DHCHAP)
            || spsp0 != 1
            || spsp1 != 1
            || len == 0
        {
            self.complete(slot, Status::INVALID_FIELD, 0, 0, now);
            return;
        }
        if len != sqe.sgl().length || len as usize > AUTH_MESSAGE_BYTES_MAX {
            self.complete(slot, Status::DATA_SGL_LENGTH_INVALID, 0, 0, now);
            return;
        }
        let Some(auth) = self.session.auth.as_mut() else {
            tracing::debug!("AUTH_Send/AUTH_Receive from a host without DH-HMAC-CHAP settings");
            self.complete(slot, Status::COMMAND_SEQUENCE_ERROR, 0, 0, now);
            return;
        };
        if sqe.fctype() == fctype::AUTH_SEND {
            auth.handle_send(data);
            self.log_auth_outcome();
            self.complete(slot, Status::SUCCESS, 0, 0, now);
            return;
        }
        let mut random_ok = true;
        let mut msg = auth.poll_receive(&mut |b: &mut [u8]| {
            random_ok &= sluice_auth::os_random(b);
        });
        if !random_ok {
            tracing::error!(
                "no random bytes from the operating system: authentication cannot proceed"
            );
            self.complete(slot, Status::INTERNAL_ERROR, 0, 0, now);
            self.close("no randomness for DH-HMAC-CHAP");
            return;
        }
        msg.resize(len as usize, 0);
        let cid = sqe.cid();
        self.send_c2h_data_then(slot, cid, &msg, 0, 0, now);
        self.log_auth_outcome();
    }

    /// Logs how a DH-HMAC-CHAP transaction ended (once), and closes the
    /// queue after too many failures.
    fn log_auth_outcome(&mut self) {
        let Some(outcome) = self.session.auth.as_mut().and_then(|a| a.take_outcome()) else {
            return;
        };
        let peer = self.peer.map(|p| p.to_string());
        let peer = peer.as_deref().unwrap_or("(unknown)");
        let hostnqn = self
            .session
            .ctrl
            .as_ref()
            .map_or("", |c| c.hostnqn.as_str());
        match outcome {
            sluice_auth::Outcome::Authenticated {
                hash,
                dhgroup,
                bidirectional,
            } => {
                self.reg.auth.record_success();
                tracing::info!(peer, hostnqn, %hash, %dhgroup, bidirectional, "host authenticated (DH-HMAC-CHAP)");
            }
            sluice_auth::Outcome::Failed {
                explanation,
                detail,
            } => {
                self.session.auth_failures += 1;
                self.reg.auth.record_failure(explanation);
                tracing::warn!(
                    peer,
                    hostnqn,
                    reason = sluice_auth::message::reason::describe(explanation),
                    detail = detail.as_str(),
                    failures = self.session.auth_failures,
                    "DH-HMAC-CHAP authentication failed"
                );
                if self.session.auth_failures >= super::handshake::AUTH_FAILURES_MAX {
                    self.close("too many failed DH-HMAC-CHAP attempts");
                }
            }
        }
    }

    /// Flushes every namespace of the controller's subsystem for a shutdown
    /// notification; SHST becomes "complete" when the last flush finishes.
    fn start_shutdown_flush(&mut self, ctrl: &Arc<Controller>) {
        let namespaces: Vec<Arc<Namespace>> = ctrl
            .subsystem
            .namespaces
            .snapshot()
            .values()
            .cloned()
            .collect();
        if namespaces.is_empty() {
            ctrl.shutdown_flushed();
            return;
        }
        self.exec.shutdown_flushes += count(namespaces.len());
        for ns in namespaces {
            let req = IoRequest {
                tag: BackendTag::SHUTDOWN_FLUSH.raw(),
                op: IoOp::Flush,
                offset_bytes: 0,
                len_bytes: 0,
                buf: None,
            };
            self.exec.push(ns, req);
        }
    }
}

/// The longest AUTH_Send/AUTH_Receive transfer accepted: the Linux host
/// asks for 4 KiB; the largest message (a Reply with an ffdhe8192 value) is
/// about 1.2 KiB.
const AUTH_MESSAGE_BYTES_MAX: usize = 2 * sluice_auth::message::MESSAGE_BYTES_MAX;

/// A count of a command's backend operations (one flush, or at most 256 DSM
/// ranges) or of a subsystem's namespaces (at most 1024): far below
/// `u32::MAX`.
fn count(n: usize) -> u32 {
    debug_assert!(u32::try_from(n).is_ok());
    #[allow(clippy::cast_possible_truncation)]
    let c = n as u32;
    c
}
