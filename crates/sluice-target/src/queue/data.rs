//! Data stage: host-to-controller data that is not in the capsule. One R2T
//! asks for the whole transfer (its transfer tag is the command's slot);
//! H2CData PDUs must arrive in order within it and are copied into the
//! command's aligned buffer. Out-of-range or unexpected data is a fatal
//! [`DecodeError`]; a data digest error fails only the command, once its
//! data is in. The last PDU hands the command to execution.
//!
//! Large data is received in place: an H2CData PDU, or a Write's in-capsule
//! data, with at least [`DIRECT_RX_REST_MIN_BYTES`] still to come is split
//! off the framer, and the rest is read straight into the command's buffer
//! (`DirectRx`).

use super::admit::CapsuleData;
use super::{note_ignored_fields, QueueConnection};
use crate::tolerated::Tolerated;
use sluice_backend::AlignedBuf;
use sluice_proto::command::io;
use sluice_proto::digest::crc32c;
use sluice_proto::framer::{Framer, InPlace, SplitPdu};
use sluice_proto::pdu::{DataHeader, DecodeError, PduHeader, R2t, DIGEST_LEN};
use sluice_proto::send::PduClass;
use sluice_proto::Sqe;
use sluice_proto::Status;
use std::time::Instant;

impl QueueConnection {
    /// Asks for the command's `len` bytes of data: one R2T for the whole
    /// transfer (MAXR2T >= 1).
    pub(super) fn request_data(&mut self, slot: u16, cid: u16, len: u32, now: Instant) {
        let Some(cmd) = self.cmds.get_mut(slot) else {
            debug_assert!(false, "slot {slot} was just allocated");
            return;
        };
        // Not zeroed: the command executes only once all `len` bytes
        // arrived, and a command whose data never does is dropped unused.
        cmd.buf = Some(AlignedBuf::for_overwrite(len as usize));
        cmd.h2c_expected = len;
        self.stats.r2ts += 1;
        let r2t = R2t {
            cccid: cid,
            ttag: slot,
            offset: 0,
            len,
        };
        self.out
            .send_cmd_pdu(PduClass::R2t, cid, &PduHeader::R2t(r2t), now);
    }

    /// One H2CData PDU. An error is fatal for the connection.
    pub(super) fn handle_h2c_data(
        &mut self,
        d: DataHeader,
        data: &[u8],
        digest_ok: bool,
        now: Instant,
    ) -> Result<(), DecodeError> {
        let (slot, end) = self.h2c_check(&d)?;
        if let Some(buf) = self.cmds.get_mut(slot).and_then(|c| c.buf.as_mut()) {
            buf[d.offset as usize..end as usize].copy_from_slice(data);
        }
        self.h2c_done(slot, end, digest_ok, now);
        Ok(())
    }

    /// Checks an H2CData header against its R2T; returns the command's
    /// slot and where the PDU's data ends in its buffer.
    fn h2c_check(&mut self, d: &DataHeader) -> Result<(u16, u32), DecodeError> {
        self.stats.h2c_pdus += 1;
        let maxh2cdata_bytes = self.reg.settings.max_h2c_data_bytes;
        if d.len > maxh2cdata_bytes {
            // The framer's limit can be higher (in-capsule size); MAXH2CDATA
            // is what ICResp advertised. FES 05h, as SPDK.
            return Err(DecodeError::DataLimitExceeded(format!(
                "{} bytes in one H2CData PDU, MAXH2CDATA {maxh2cdata_bytes}",
                d.len
            )));
        }
        let slot = d.ttag;
        let cmd = match self.cmds.get_mut(slot) {
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
        let end = u64::from(d.offset) + u64::from(d.len);
        // Within the R2T's u32 length, or refused.
        let Some(end) = u32::try_from(end).ok().filter(|e| *e <= cmd.h2c_expected) else {
            return Err(DecodeError::DataOutOfRange(format!(
                "H2CData ends at {end}, beyond the R2T's {} bytes",
                cmd.h2c_expected
            )));
        };
        if d.last != (end == cmd.h2c_expected) {
            // nvmet and SPDK ignore LAST_PDU and end the transfer on its
            // length; so does Sluice.
            crate::tolerated::note(
                Tolerated::H2cLastPduMismatch,
                format_args!("LAST_PDU {} at {end} of {} bytes", d.last, cmd.h2c_expected),
            );
        }
        Ok((slot, end))
    }

    /// Accounts an H2CData PDU whose data is in the command's buffer up to
    /// `end`; the last one hands the command to execution.
    fn h2c_done(&mut self, slot: u16, end: u32, digest_ok: bool, now: Instant) {
        let Some(cmd) = self.cmds.get_mut(slot) else {
            debug_assert!(false, "slot {slot} checked by h2c_check");
            return;
        };
        cmd.h2c_received = end;
        if !digest_ok {
            cmd.digest_error = true;
        }
        if end == cmd.h2c_expected {
            let failed = cmd.digest_error;
            let buf = cmd.buf.take();
            cmd.h2c_expected = 0;
            if failed {
                self.complete(slot, Status::TRANSIENT_TRANSPORT_ERROR, 0, 0, now);
            } else {
                self.execute_with_buf(slot, buf, now);
            }
        }
    }

    /// Splits a large H2CData PDU, or a Write's large in-capsule data, off
    /// the framer so that the rest of its data is read into its command's
    /// buffer ([`QueueConnection::recv_bufs`]). True when it did; a PDU
    /// that breaks the rules closes the connection as a whole one would.
    pub(super) fn split_direct_rx(&mut self, framer: &mut Framer, now: Instant) -> bool {
        // In-capsule data of I/O queue Writes only: other commands' data is
        // small (Connect, DSM ranges) and handled whole.
        let capsules = self.session.qid > 0;
        let accept = |h: &PduHeader| match h {
            PduHeader::H2CData(_) => true,
            PduHeader::CapsuleCmd(sqe) => capsules && sqe.opcode() == io::WRITE,
            _ => false,
        };
        let sp = match framer.split_pdu(DIRECT_RX_REST_MIN_BYTES, accept) {
            Ok(None) => return false,
            Ok(Some(sp)) => sp,
            Err(e) => {
                let quote = framer.current_header().to_vec();
                self.fatal(&e, &quote);
                return false;
            }
        };
        if let PduHeader::CapsuleCmd(sqe) = sp.header {
            return self.split_capsule(sqe, &sp, now);
        }
        let raw_header = sp.header_quote();
        let PduHeader::H2CData(header) = sp.header else {
            // `accept` takes H2CData and CapsuleCmd PDUs only.
            let e = DecodeError::Sequence("data PDU of the wrong direction".into());
            self.fatal(&e, &raw_header);
            return false;
        };
        let head = sp.data_head;
        let (slot, _) = match self.h2c_check(&header) {
            Ok(v) => v,
            Err(e) => {
                self.fatal(&e, &raw_header);
                return false;
            }
        };
        let at = header.offset as usize;
        if let Some(buf) = self.cmds.get_mut(slot).and_then(|c| c.buf.as_mut()) {
            buf[at..at + head.len()].copy_from_slice(head);
        }
        self.direct_rx = Some(DirectRx {
            dest: DirectDest::H2c { slot, header },
            rest: InPlace {
                at: at + head.len(),
                left: sp.data_rest,
            },
            ddgst: sp.ddgst,
        });
        true
    }

    /// A Write whose in-capsule data is split off the framer: admitted on
    /// its header, then the rest of its data goes straight into its
    /// buffer ([`Self::receive_capsule_rest`]). A command answered at
    /// admission (an error status) still has its data read, and dropped,
    /// so that the stream stays in step.
    fn split_capsule(&mut self, sqe: Sqe, sp: &SplitPdu<'_>, now: Instant) -> bool {
        note_ignored_fields(sp.raw_header, sp.data_head.len() + sp.data_rest);
        let data = CapsuleData::Split {
            head: sp.data_head,
            rest: sp.data_rest,
            ddgst: sp.ddgst,
        };
        self.handle_command(sqe, sp.raw_header, data, true, now);
        if self.direct_rx.is_none() && self.wants_input() {
            self.direct_rx = Some(DirectRx {
                dest: DirectDest::Discard {
                    buf: AlignedBuf::for_overwrite(sp.data_rest),
                },
                rest: InPlace {
                    at: 0,
                    left: sp.data_rest,
                },
                ddgst: sp.ddgst,
            });
        }
        self.direct_rx.is_some()
    }

    /// An admitted Write whose in-capsule data was split off the framer:
    /// `head` goes into its buffer now, and the `rest` bytes that follow
    /// are read in place; [`Self::finish_direct_rx`] executes it.
    pub(super) fn receive_capsule_rest(
        &mut self,
        slot: u16,
        head: &[u8],
        rest: usize,
        ddgst: bool,
    ) {
        let Some(cmd) = self.cmds.get_mut(slot) else {
            debug_assert!(false, "slot {slot} was just allocated");
            return;
        };
        // Not zeroed: the command executes only once all its data arrived.
        let mut buf = AlignedBuf::for_overwrite(head.len() + rest);
        buf[..head.len()].copy_from_slice(head);
        cmd.buf = Some(buf);
        self.direct_rx = Some(DirectRx {
            dest: DirectDest::Capsule { slot },
            rest: InPlace {
                at: head.len(),
                left: rest,
            },
            ddgst,
        });
    }

    /// Completes the split PDU once its data (and digest) is in. False:
    /// more bytes are needed.
    pub(super) fn finish_direct_rx(&mut self, framer: &mut Framer, now: Instant) -> bool {
        let Some(d) = self.direct_rx.as_ref() else {
            return true;
        };
        if d.rest.left > 0 {
            return false;
        }
        let received_digest = if d.ddgst {
            let Some(b) = framer.take_bytes(DIGEST_LEN) else {
                return false;
            };
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        } else {
            None
        };
        let Some(d) = self.direct_rx.take() else {
            return true;
        };
        let digest_ok = |buf: Option<&AlignedBuf>, from: usize, len: usize| match received_digest {
            Some(r) => buf.is_none_or(|b| crc32c(&b[from..from + len]) == r),
            None => true,
        };
        match d.dest {
            DirectDest::H2c { slot, header } => {
                let (from, len) = (header.offset as usize, header.len as usize);
                let buf = self.cmds.get(slot).and_then(|c| c.buf.as_ref());
                let ok = digest_ok(buf, from, len);
                self.h2c_done(slot, u32::try_from(from + len).unwrap_or(u32::MAX), ok, now);
            }
            DirectDest::Capsule { slot } => {
                let Some(cmd) = self.cmds.get_mut(slot) else {
                    return true;
                };
                let buf = cmd.buf.take();
                let ok = digest_ok(buf.as_ref(), 0, d.rest.at);
                if ok {
                    self.execute_with_buf(slot, buf, now);
                } else {
                    // As for a whole capsule: the command fails, the
                    // connection carries on.
                    self.complete(slot, Status::TRANSIENT_TRANSPORT_ERROR, 0, 0, now);
                }
            }
            DirectDest::Discard { .. } => {}
        }
        true
    }
}

/// An H2CData PDU with at least this much data still to come has the rest
/// read straight into its command's buffer.
const DIRECT_RX_REST_MIN_BYTES: usize = 16 * 1024;
/// While data goes straight into a command's buffer, the same read gives
/// the framer at most this much (the digest, the next PDUs' headers).
pub(super) const DIRECT_RX_TAIL_BYTES: usize = 8 * 1024;

/// A PDU whose data is being read straight into its destination, past
/// the framer.
#[derive(Debug)]
pub(super) struct DirectRx {
    pub(super) dest: DirectDest,
    /// The rest of its data, in the destination buffer.
    pub(super) rest: InPlace,
    /// A data digest follows the data.
    ddgst: bool,
}

/// Where a split PDU's data goes.
#[derive(Debug)]
pub(super) enum DirectDest {
    /// An H2CData PDU's data, into its command's buffer at its offset.
    H2c { slot: u16, header: DataHeader },
    /// A Write's in-capsule data, into its command's buffer (all of it).
    Capsule { slot: u16 },
    /// In-capsule data of a command answered at admission: read, dropped.
    Discard { buf: AlignedBuf },
}
