//! Data stage: host-to-controller data that is not in the capsule. One R2T
//! asks for the whole transfer (its transfer tag is the command's slot);
//! H2CData PDUs must arrive in order within it and are copied into the
//! command's aligned buffer. Out-of-range or unexpected data is a fatal
//! [`DecodeError`]; a data digest error fails only the command, once its
//! data is in. The last PDU hands the command to execution.

use super::QueueConnection;
use crate::tolerated::Tolerated;
use sluice_backend::AlignedBuf;
use sluice_proto::digest::crc32c;
use sluice_proto::framer::{Framer, InPlace};
use sluice_proto::pdu::{DataHeader, DecodeError, PduHeader, R2t, DIGEST_LEN};
use sluice_proto::send::PduClass;
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

    /// Splits a large H2CData PDU off the framer so that the rest of its
    /// data is read into its command's buffer ([`QueueConnection::recv_bufs`]).
    /// True when it did; a PDU that breaks the rules closes the connection
    /// as a whole one would.
    pub(super) fn split_direct_rx(&mut self, framer: &mut Framer) -> bool {
        let sp = match framer.split_data(DIRECT_RX_REST_MIN_BYTES) {
            Ok(None) => return false,
            Ok(Some(sp)) => sp,
            Err(e) => {
                let quote = framer.current_header().to_vec();
                self.fatal(&e, &quote);
                return false;
            }
        };
        let raw_header = sp.header_quote();
        let PduHeader::H2CData(header) = sp.header else {
            // The framer splits data PDUs only, and yields no C2HData here.
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
            slot,
            rest: InPlace {
                at: at + head.len(),
                left: sp.data_rest,
            },
            ddgst: sp.ddgst,
            header,
        });
        true
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
        let (slot, from, len) = (d.slot, d.header.offset as usize, d.header.len as usize);
        let digest_ok = if d.ddgst {
            let Some(b) = framer.take_bytes(DIGEST_LEN) else {
                return false;
            };
            let received = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            self.cmds
                .get_mut(slot)
                .and_then(|c| c.buf.as_ref())
                .map(|buf| crc32c(&buf[from..from + len]) == received)
                .unwrap_or(true)
        } else {
            true
        };
        self.direct_rx = None;
        self.h2c_done(
            slot,
            u32::try_from(from + len).unwrap_or(u32::MAX),
            digest_ok,
            now,
        );
        true
    }
}

/// An H2CData PDU with at least this much data still to come has the rest
/// read straight into its command's buffer.
const DIRECT_RX_REST_MIN_BYTES: usize = 16 * 1024;
/// While data goes straight into a command's buffer, the same read gives
/// the framer at most this much (the digest, the next PDUs' headers).
pub(super) const DIRECT_RX_TAIL_BYTES: usize = 8 * 1024;

/// An H2CData PDU whose data is being read straight into its command's
/// buffer, past the framer.
#[derive(Debug)]
pub(super) struct DirectRx {
    pub(super) slot: u16,
    header: DataHeader,
    /// The rest of its data, in the command's buffer.
    pub(super) rest: InPlace,
    /// A data digest follows the data.
    ddgst: bool,
}
