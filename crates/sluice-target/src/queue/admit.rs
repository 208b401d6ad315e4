//! Admission stage: every CapsuleCmd is checked completely before any data
//! moves — connection state, queue depth, CID, fused/PSDT flags, the SGL
//! against the data direction and capsule, and for I/O commands the
//! namespace, LBA range and MDTS (`plan_io`). An admitted command gets a
//! slot and goes to the data stage (R2T) or straight to execution.

use super::commands::{Cmd, CmdKind};
use super::{ConnState, QueueConnection, ADMIN_INLINE_BYTES};
use crate::subsystem::Namespace;
use crate::tolerated::Tolerated;
use sluice_backend::IoOp;
use sluice_proto::coalesce::Hint;
use sluice_proto::command::{admin, io, rw, sgl, FUSE_MASK, PSDT_MASK, PSDT_SGL};
use sluice_proto::dsm::DsmCommand;
use sluice_proto::fabrics::{fctype, CONNECT_DATA_LEN};
use sluice_proto::pdu::DecodeError;
use sluice_proto::reservation;
use sluice_proto::{Sqe, Status};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataDir {
    None,
    HostToController,
    ControllerToHost,
}

/// The data direction of a command, from its opcode (or fabrics type).
fn data_direction(sqe: &Sqe) -> DataDir {
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

/// A CapsuleCmd's in-capsule data as it reaches admission.
#[derive(Debug, Clone, Copy)]
pub(super) enum CapsuleData<'a> {
    /// All of it, in the framer's buffer.
    Whole(&'a [u8]),
    /// Split off the framer (`split_direct_rx`): `head` is in, `rest` more
    /// bytes (and a digest when `ddgst`) follow, read in place.
    Split {
        head: &'a [u8],
        rest: usize,
        ddgst: bool,
    },
}

impl<'a> CapsuleData<'a> {
    /// Bytes of in-capsule data, received or not.
    fn len(&self) -> usize {
        match self {
            CapsuleData::Whole(d) => d.len(),
            CapsuleData::Split { head, rest, .. } => head.len() + rest,
        }
    }

    /// The bytes received so far.
    fn head(&self) -> &'a [u8] {
        match self {
            CapsuleData::Whole(d) | CapsuleData::Split { head: d, .. } => d,
        }
    }
}

impl QueueConnection {
    /// One CapsuleCmd; `header` is its received header (common header and
    /// SQE), quoted by a TermReq.
    pub(super) fn handle_command(
        &mut self,
        sqe: Sqe,
        header: &[u8],
        data: CapsuleData<'_>,
        digest_ok: bool,
        now: Instant,
    ) {
        self.stats.commands += 1;
        let cid = sqe.cid();
        let inline_max_bytes = self.inline_max_bytes();
        if data.len() > inline_max_bytes as usize {
            // As SPDK (and as the framer does beyond its own limit): more
            // in-capsule data than advertised is fatal, whatever the config.
            let e = DecodeError::DataLimitExceeded(format!(
                "{} bytes of in-capsule data, limit {inline_max_bytes}",
                data.len()
            ));
            self.fatal(&e, header);
            return;
        }
        if self.state == ConnState::Ready {
            self.out.advance_sqhd(self.session.depth);
        }
        let is_connect = sqe.opcode() == admin::FABRICS && sqe.fctype() == fctype::CONNECT;
        if self.state == ConnState::AwaitConnect && !is_connect {
            self.respond_now(cid, Status::COMMAND_SEQUENCE_ERROR, 0, now);
            return;
        }
        if self.state == ConnState::Ready && is_connect {
            let c = sluice_proto::fabrics::ConnectCommand::parse(&sqe);
            // nvmet and SPDK take it as a Fabrics type this queue does not
            // serve: Invalid Opcode.
            let answer = (Status::INVALID_OPCODE, 0);
            self.refuse(&c, data.head(), "qid", "queue already connected", answer);
            self.respond_now(cid, answer.0, 0, now);
            return;
        }
        self.drop_abandoned_aer(cid);
        let depth = if self.state == ConnState::AwaitConnect {
            1
        } else {
            self.session.depth
        };
        if self.cmds.outstanding() >= depth {
            let e = DecodeError::Sequence(format!(
                "more than {depth} outstanding commands (queue depth exceeded)"
            ));
            self.fatal(&e, header);
            return;
        }
        if self.cmds.has_cid(cid) {
            self.respond_now(cid, Status::CID_CONFLICT, 0, now);
            return;
        }
        if sqe.flags() & FUSE_MASK != 0 || sqe.flags() & PSDT_MASK != PSDT_SGL {
            self.respond_now(cid, Status::INVALID_FIELD, 0, now);
            return;
        }
        if sqe.opcode() != admin::FABRICS
            && self
                .session
                .auth
                .as_ref()
                .is_some_and(|a| !a.is_authenticated())
        {
            // DH-HMAC-CHAP first (only Fabrics commands before it, as nvmet).
            self.respond_now(cid, Status::AUTH_REQUIRED, 0, now);
            return;
        }
        let dir = data_direction(&sqe);
        let (sgl_len, in_capsule) = match self.check_sgl(&sqe, dir, data.len()) {
            Ok(v) => v,
            Err(st) => {
                self.respond_now(cid, st, 0, now);
                return;
            }
        };
        if is_connect && sgl_len as usize > CONNECT_DATA_LEN {
            // Before a Connect is accepted nothing larger than the Connect
            // data is buffered (no R2T up to MDTS); nvmet answers any other
            // Connect data length with Data SGL Length Invalid.
            self.respond_now(cid, Status::DATA_SGL_LENGTH_INVALID, 0, now);
            return;
        }
        let kind = if self.session.qid > 0 && sqe.opcode() != io::FABRICS {
            self.session.refresh_namespaces();
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
        let slot = self.cmds.alloc(Cmd::new(sqe, kind, digest_ok));
        if self.session.qid > 0 {
            let hint = match sqe.opcode() {
                io::READ | io::WRITE => Hint::from_cdw13(sqe.cdw(13)),
                _ => Hint::Normal,
            };
            self.out.tx.command_started(cid, hint);
        }
        if dir == DataDir::HostToController && !in_capsule && sgl_len > 0 {
            self.request_data(slot, cid, sgl_len, now);
            return;
        }
        if !digest_ok {
            self.complete(slot, Status::TRANSIENT_TRANSPORT_ERROR, 0, 0, now);
            return;
        }
        match data {
            CapsuleData::Whole(d) => self.execute(slot, d, now),
            CapsuleData::Split { head, rest, ddgst } => {
                self.receive_capsule_rest(slot, head, rest, ddgst);
            }
        }
    }

    /// A host that reuses the CID of an Asynchronous Event Request it left
    /// outstanding has given that request up: SPDK's host does so at
    /// shutdown, aborting its AERs locally and then reading CC with one of
    /// their CIDs. nvmet and nvmf_tgt never check CIDs, so they accept the
    /// new command; Sluice does too, and drops the AER without a completion
    /// (its completion would name the new command). Any other CID still in
    /// use is a conflict.
    fn drop_abandoned_aer(&mut self, cid: u16) {
        // I/O queues never hold AERs: no CID lookup on their hot path.
        if self.exec.held_aers.is_empty() {
            return;
        }
        let Some(slot) = self.cmds.slot_of(cid) else {
            return;
        };
        let Some(at) = self.exec.held_aers.iter().position(|s| *s == slot) else {
            return;
        };
        self.exec.held_aers.remove(at);
        self.cmds.free(slot);
        crate::tolerated::note(Tolerated::AerCidReused, format_args!("cid {cid}"));
    }

    /// In-capsule data this queue accepts (IOCCSZ on I/O queues).
    fn inline_max_bytes(&self) -> u32 {
        if self.session.qid == 0 {
            ADMIN_INLINE_BYTES
        } else {
            self.reg.settings.inline_data_bytes
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
                    // nvmet's answer (`nvmet_tcp_map_data`).
                    return Err(Status::INVALID_FIELD);
                }
                if d.address != 0 {
                    return Err(Status::SGL_OFFSET_INVALID);
                }
                if d.length as usize != capsule_data {
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

    /// Namespace `nsid` of the queue's snapshot (taken anew before each
    /// command, see `handle_command`).
    fn namespace(&self, nsid: u32) -> Result<Arc<Namespace>, Status> {
        if self.session.ctrl.is_none() {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        self.session
            .namespaces
            .get(&nsid)
            .cloned()
            .ok_or(Status::INVALID_NAMESPACE)
    }

    /// Validates an I/O command completely before any data moves.
    fn plan_io(&self, sqe: &Sqe, sgl_len: u32) -> Result<CmdKind, Status> {
        let ctrl = self
            .session
            .ctrl
            .as_ref()
            .ok_or(Status::COMMAND_SEQUENCE_ERROR)?;
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
                    Some(end) if ns.holds(end) => {}
                    _ => return Err(Status::LBA_OUT_OF_RANGE),
                }
                let offset_bytes = slba << ns.lba_shift;
                let len_bytes = nlb << ns.lba_shift;
                let fua = sqe.cdw(12) & rw::FUA != 0 || force_fua;
                if sqe.opcode() == io::WRITE_ZEROES {
                    // Past WZSL: Invalid Field in Command (as past MDTS
                    // for a command without data).
                    if self
                        .reg
                        .settings
                        .write_zeroes_bytes_max
                        .is_some_and(|max| len_bytes > max)
                    {
                        return Err(Status::INVALID_FIELD);
                    }
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
                // The SGL length first (nvmet, SPDK): with it checked against
                // MDTS in `check_sgl`, the MDTS check below is defensive.
                if sgl_len as u64 != len_bytes {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                if len_bytes > self.reg.settings.mdts_bytes as u64 {
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
                    self.session.namespaces.values().cloned().collect()
                } else {
                    vec![self.namespace(nsid)?]
                };
                let ops = list.into_iter().map(|ns| (ns, IoOp::Flush, 0, 0)).collect();
                Ok(CmdKind::NoData { ops, write: false })
            }
            io::DATASET_MANAGEMENT => {
                let ns = self.namespace(sqe.nsid())?;
                let dsm = DsmCommand::parse(sqe);
                if sgl_len != dsm.data_len() {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                Ok(CmdKind::Dsm {
                    ns,
                    nr: dsm.ranges,
                    deallocate: dsm.deallocate,
                })
            }
            reservation::opcode::REGISTER
            | reservation::opcode::ACQUIRE
            | reservation::opcode::RELEASE
            | reservation::opcode::REPORT => {
                let ns = self.namespace(sqe.nsid())?;
                let want = match sqe.opcode() {
                    reservation::opcode::RELEASE => u64::from(reservation::RELEASE_DATA_BYTES),
                    reservation::opcode::REPORT => reservation::ReportCommand::parse(sqe).len_bytes,
                    _ => u64::from(reservation::KEYS_DATA_BYTES),
                };
                if u64::from(sgl_len) != want {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                Ok(CmdKind::Reservation { ns })
            }
            _ => Err(Status::INVALID_OPCODE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_direction_follows_the_opcode() {
        let dir = |op: u8| data_direction(&Sqe::new(op, 1, 1));
        assert_eq!(dir(io::WRITE), DataDir::HostToController);
        assert_eq!(dir(io::READ), DataDir::ControllerToHost);
        assert_eq!(dir(io::FLUSH), DataDir::None);
        assert_eq!(dir(io::DATASET_MANAGEMENT), DataDir::HostToController);
        assert_eq!(dir(io::WRITE_ZEROES), DataDir::None);
        assert_eq!(dir(admin::IDENTIFY), DataDir::ControllerToHost);
        // Bidirectional opcodes are treated as no data.
        assert_eq!(dir(0x03), DataDir::None);
    }

    #[test]
    fn fabrics_direction_follows_the_fctype() {
        let fab = |t: u8| {
            let mut s = Sqe::new(admin::FABRICS, 1, 0);
            s.0[4] = t;
            data_direction(&s)
        };
        assert_eq!(fab(fctype::CONNECT), DataDir::HostToController);
        assert_eq!(fab(fctype::AUTH_SEND), DataDir::HostToController);
        assert_eq!(fab(fctype::AUTH_RECEIVE), DataDir::ControllerToHost);
        assert_eq!(fab(fctype::PROPERTY_GET), DataDir::None);
    }
}
