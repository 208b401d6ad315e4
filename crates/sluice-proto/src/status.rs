//! NVMe completion status: Status Code Type (SCT), Status Code (SC), More and
//! Do Not Retry, with readable names for logs and errors.

use std::fmt;

/// Status code types.
pub mod sct {
    pub const GENERIC: u8 = 0x0;
    pub const COMMAND_SPECIFIC: u8 = 0x1;
    pub const MEDIA: u8 = 0x2;
    pub const PATH: u8 = 0x3;
    pub const VENDOR: u8 = 0x7;
}

/// An NVMe completion status (the upper 15 bits of CQE DW3's status field).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
    /// More information in the error log.
    pub more: bool,
}

impl Status {
    pub const fn new(sct: u8, sc: u8) -> Self {
        Status {
            sct,
            sc,
            dnr: false,
            more: false,
        }
    }
    /// The same status with Do Not Retry set.
    pub const fn dnr(self) -> Self {
        Status { dnr: true, ..self }
    }

    pub const SUCCESS: Status = Status::new(sct::GENERIC, 0x00);
    pub const INVALID_OPCODE: Status = Status::new(sct::GENERIC, 0x01).dnr();
    pub const INVALID_FIELD: Status = Status::new(sct::GENERIC, 0x02).dnr();
    pub const CID_CONFLICT: Status = Status::new(sct::GENERIC, 0x03).dnr();
    pub const DATA_TRANSFER_ERROR: Status = Status::new(sct::GENERIC, 0x04);
    pub const INTERNAL_ERROR: Status = Status::new(sct::GENERIC, 0x06);
    pub const ABORT_REQUESTED: Status = Status::new(sct::GENERIC, 0x07);
    pub const ABORTED_SQ_DELETION: Status = Status::new(sct::GENERIC, 0x08);
    pub const INVALID_NAMESPACE: Status = Status::new(sct::GENERIC, 0x0b).dnr();
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::new(sct::GENERIC, 0x0c).dnr();
    pub const INVALID_SGL_DESCRIPTOR: Status = Status::new(sct::GENERIC, 0x0d).dnr();
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::new(sct::GENERIC, 0x0f).dnr();
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::new(sct::GENERIC, 0x11).dnr();
    pub const SGL_OFFSET_INVALID: Status = Status::new(sct::GENERIC, 0x16).dnr();
    pub const HOST_ID_INCONSISTENT: Status = Status::new(sct::GENERIC, 0x18).dnr();
    pub const KEEP_ALIVE_EXPIRED: Status = Status::new(sct::GENERIC, 0x19);
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status::new(sct::GENERIC, 0x22);
    pub const LBA_OUT_OF_RANGE: Status = Status::new(sct::GENERIC, 0x80).dnr();
    pub const CAPACITY_EXCEEDED: Status = Status::new(sct::GENERIC, 0x81).dnr();
    pub const NAMESPACE_NOT_READY: Status = Status::new(sct::GENERIC, 0x82);
    pub const RESERVATION_CONFLICT: Status = Status::new(sct::GENERIC, 0x83).dnr();

    pub const INVALID_QUEUE_ID: Status = Status::new(sct::COMMAND_SPECIFIC, 0x01).dnr();
    pub const INVALID_QUEUE_SIZE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x02).dnr();
    pub const AER_LIMIT_EXCEEDED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x05).dnr();
    pub const INVALID_LOG_PAGE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x09).dnr();
    pub const FEATURE_NOT_SAVEABLE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0d).dnr();
    pub const FEATURE_NOT_CHANGEABLE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0e).dnr();
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::new(sct::COMMAND_SPECIFIC, 0x80).dnr();
    pub const CONNECT_CONTROLLER_BUSY: Status = Status::new(sct::COMMAND_SPECIFIC, 0x81);
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::new(sct::COMMAND_SPECIFIC, 0x82).dnr();
    pub const CONNECT_RESTART_DISCOVERY: Status = Status::new(sct::COMMAND_SPECIFIC, 0x83).dnr();
    pub const CONNECT_INVALID_HOST: Status = Status::new(sct::COMMAND_SPECIFIC, 0x84).dnr();
    pub const INVALID_QUEUE_TYPE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x85).dnr();
    /// Authentication Required: the queue has not finished DH-HMAC-CHAP.
    pub const AUTH_REQUIRED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x91).dnr();

    /// A write below its granule's chain-epoch fence (`fence.rs`).
    pub const STALE_EPOCH: Status = Status::new(sct::VENDOR, 0x01).dnr();

    pub const WRITE_FAULT: Status = Status::new(sct::MEDIA, 0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::new(sct::MEDIA, 0x81);

    /// Whether `self` is `other`'s status code (SCT and SC), whatever
    /// either's DNR and More bits.
    pub fn same_code(self, other: Status) -> bool {
        (self.sct, self.sc) == (other.sct, other.sc)
    }

    /// A write refused by a chain-epoch fence.
    pub fn is_stale_epoch(self) -> bool {
        self.same_code(Self::STALE_EPOCH)
    }

    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 15-bit status field as placed in CQE bits 31:17 (without phase).
    pub fn to_field(self) -> u16 {
        ((self.sc as u16) << 1)
            | (((self.sct & 0x7) as u16) << 9)
            | ((self.more as u16) << 14)
            | ((self.dnr as u16) << 15)
    }

    /// Parses the CQE status field (bit 0, the phase tag, is ignored).
    pub fn from_field(f: u16) -> Self {
        Status {
            sc: ((f >> 1) & 0xff) as u8,
            sct: ((f >> 9) & 0x7) as u8,
            more: f & (1 << 14) != 0,
            dnr: f & (1 << 15) != 0,
        }
    }

    /// A readable name, e.g. "LBA Out of Range".
    pub fn name(self) -> &'static str {
        match (self.sct, self.sc) {
            (0, 0x00) => "Successful Completion",
            (0, 0x01) => "Invalid Command Opcode",
            (0, 0x02) => "Invalid Field in Command",
            (0, 0x03) => "Command ID Conflict",
            (0, 0x04) => "Data Transfer Error",
            (0, 0x05) => "Commands Aborted due to Power Loss Notification",
            (0, 0x06) => "Internal Error",
            (0, 0x07) => "Command Abort Requested",
            (0, 0x08) => "Command Aborted due to SQ Deletion",
            (0, 0x0b) => "Invalid Namespace or Format",
            (0, 0x0c) => "Command Sequence Error",
            (0, 0x0d) => "Invalid SGL Segment Descriptor",
            (0, 0x0f) => "Data SGL Length Invalid",
            (0, 0x11) => "SGL Descriptor Type Invalid",
            (0, 0x16) => "SGL Offset Invalid",
            (0, 0x18) => "Host Identifier Inconsistent Format",
            (0, 0x19) => "Keep Alive Timer Expired",
            (0, 0x22) => "Transient Transport Error",
            (0, 0x80) => "LBA Out of Range",
            (0, 0x81) => "Capacity Exceeded",
            (0, 0x82) => "Namespace Not Ready",
            (0, 0x83) => "Reservation Conflict",
            (1, 0x01) => "Invalid Queue Identifier",
            (1, 0x02) => "Invalid Queue Size",
            (1, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (1, 0x09) => "Invalid Log Page",
            (1, 0x0d) => "Feature Identifier Not Saveable",
            (1, 0x0e) => "Feature Not Changeable",
            (1, 0x80) => "Connect Incompatible Format",
            (1, 0x81) => "Connect Controller Busy",
            (1, 0x82) => "Connect Invalid Parameters",
            (1, 0x83) => "Connect Restart Discovery",
            (1, 0x84) => "Connect Invalid Host",
            (1, 0x85) => "Invalid Queue Type",
            (2, 0x80) => "Write Fault",
            (2, 0x81) => "Unrecovered Read Error",
            (7, 0x01) => "Stale Chain Epoch (Sluice)",
            _ => "Unknown Status",
        }
    }
}

impl Default for Status {
    fn default() -> Self {
        Status::SUCCESS
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (sct {:#x} sc {:#04x}{})",
            self.name(),
            self.sct,
            self.sc,
            if self.dnr { " dnr" } else { "" }
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn connect_invalid_host_is_0x184() {
        let s = Status::CONNECT_INVALID_HOST;
        assert_eq!((s.sct, s.sc), (1, 0x84));
        assert_eq!(s.name(), "Connect Invalid Host");
        // SC in bits 8:1, SCT in bits 11:9, DNR bit 15.
        assert_eq!(s.to_field(), (0x84 << 1) | (1 << 9) | (1 << 15));
    }

    #[test]
    fn same_code_ignores_dnr_and_more() {
        let wire = Status::from_field(Status::INVALID_FIELD.to_field() & !(1 << 15));
        assert!(!wire.dnr);
        assert!(wire.same_code(Status::INVALID_FIELD));
        assert!(Status {
            more: true,
            ..Status::INVALID_FIELD
        }
        .same_code(Status::INVALID_FIELD));
        assert!(!Status::INVALID_FIELD.same_code(Status::INVALID_OPCODE));
        // Same SC, another SCT.
        assert!(!Status::NAMESPACE_NOT_READY.same_code(Status::CONNECT_INVALID_PARAMETERS));
    }

    proptest! {
        #[test]
        fn field_round_trip(sct in 0u8..8, sc: u8, dnr: bool, more: bool) {
            let s = Status { sct, sc, dnr, more };
            prop_assert_eq!(Status::from_field(s.to_field()), s);
            prop_assert_eq!(Status::from_field(s.to_field() | 1), s);
        }
    }
}
