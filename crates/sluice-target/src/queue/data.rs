//! Data stage: host-to-controller data that is not in the capsule. One R2T
//! asks for the whole transfer (its transfer tag is the command's slot);
//! H2CData PDUs must arrive in order within it and are copied into the
//! command's aligned buffer. Out-of-range or unexpected data is a fatal
//! [`DecodeError`]; a data digest error fails only the command, once its
//! data is in. The last PDU hands the command to execution.

use super::QueueConnection;
use crate::tolerated::Tolerated;
use sluice_backend::AlignedBuf;
use sluice_proto::pdu::{DataHeader, DecodeError, PduHeader, R2t};
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
        cmd.buf = Some(AlignedBuf::new(len as usize));
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
        let last_needed = end == cmd.h2c_expected;
        if d.last != last_needed {
            // nvmet and SPDK ignore LAST_PDU and end the transfer on its
            // length; so does Sluice.
            crate::tolerated::note(
                Tolerated::H2cLastPduMismatch,
                format_args!("LAST_PDU {} at {end} of {} bytes", d.last, cmd.h2c_expected),
            );
        }
        if let Some(buf) = cmd.buf.as_mut() {
            buf[d.offset as usize..end as usize].copy_from_slice(data);
        }
        cmd.h2c_received = end;
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
}
