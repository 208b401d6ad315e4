//! The 64-byte submission queue entry (SQE), the 16-byte completion queue
//! entry (CQE), opcodes and the SGL descriptor NVMe/TCP uses.

use crate::status::Status;
use crate::wire::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

/// Admin command opcodes.
pub mod admin {
    pub const DELETE_SQ: u8 = 0x00;
    pub const CREATE_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_CQ: u8 = 0x04;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const FABRICS: u8 = 0x7f;
}

/// NVM command set I/O opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const FABRICS: u8 = 0x7f;
}

/// Bits of CDW12 in Read/Write/Write Zeroes.
pub mod rw {
    pub const FUA: u32 = 1 << 30;
    pub const LIMITED_RETRY: u32 = 1 << 31;
    /// Write Zeroes: deallocate.
    pub const DEAC: u32 = 1 << 25;
}

/// SGL descriptor identifiers (type in bits 7:4, subtype in 3:0).
pub mod sgl {
    /// Data block, offset subtype: in-capsule data.
    pub const DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Transport data block, transport-specific subtype: data moved by
    /// H2CData/C2HData PDUs.
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5a;
}

/// PSDT = 01b in SQE byte 1: data described by SGLs (metadata by a buffer).
pub const PSDT_SGL: u8 = 0x40;
/// Mask of the PSDT bits.
pub const PSDT_MASK: u8 = 0xc0;
/// Mask of the FUSE bits.
pub const FUSE_MASK: u8 = 0x03;

/// An SGL data block descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SglDescriptor {
    pub address: u64,
    pub length: u32,
    pub id: u8,
}

/// A submission queue entry, kept as its raw 64 bytes with typed accessors,
/// so nothing the host sent is lost or normalised away.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; 64]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sqe {{ opc: {:#04x}, cid: {}, nsid: {}, cdw10: {:#x} }}",
            self.opcode(),
            self.cid(),
            self.nsid(),
            self.cdw(10)
        )
    }
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; 64])
    }
}

impl Sqe {
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// FUSE (bits 1:0) and PSDT (bits 7:6).
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    pub fn cid(&self) -> u16 {
        u16_at(&self.0, 2)
    }
    pub fn nsid(&self) -> u32 {
        u32_at(&self.0, 4)
    }
    /// Command dword `n` (0..16).
    pub fn cdw(&self, n: usize) -> u32 {
        u32_at(&self.0, n * 4)
    }
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        put_u32(&mut self.0, n * 4, v)
    }
    /// Fabrics command type (byte 4, where NSID sits in other commands).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor {
            address: u64_at(&self.0, 24),
            length: u32_at(&self.0, 32),
            id: self.0[39],
        }
    }
    pub fn set_sgl(&mut self, d: SglDescriptor) {
        put_u64(&mut self.0, 24, d.address);
        put_u32(&mut self.0, 32, d.length);
        self.0[36..39].fill(0);
        self.0[39] = d.id;
    }

    /// A new SQE with opcode, CID and NSID set, and PSDT = 01b (SGLs, as
    /// every NVMe over Fabrics command uses).
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Self {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        s.0[1] = PSDT_SGL;
        put_u16(&mut s.0, 2, cid);
        put_u32(&mut s.0, 4, nsid);
        s
    }
    pub fn set_cid(&mut self, cid: u16) {
        put_u16(&mut self.0, 2, cid);
    }
    pub fn set_nsid(&mut self, nsid: u32) {
        put_u32(&mut self.0, 4, nsid);
    }

    /// Starting LBA of Read/Write/Write Zeroes (CDW11:CDW10).
    pub fn slba(&self) -> u64 {
        u64_at(&self.0, 40)
    }
    /// Number of logical blocks of Read/Write/Write Zeroes (1-based).
    pub fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xffff) + 1
    }
    /// A Read/Write/Write Zeroes command.
    pub fn rw(opcode: u8, cid: u16, nsid: u32, slba: u64, nlb: u32, fua: bool) -> Self {
        debug_assert!((1..=65536).contains(&nlb));
        let mut s = Sqe::new(opcode, cid, nsid);
        put_u64(&mut s.0, 40, slba);
        s.set_cdw(12, (nlb - 1) | if fua { rw::FUA } else { 0 });
        s
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command-specific result (DW0).
    pub result: u32,
    /// DW1 (command specific; upper half of a 64-bit property value).
    pub dw1: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: StatusField,
}

/// The CQE status field with its phase bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusField(pub u16);

impl StatusField {
    pub fn status(self) -> Status {
        Status::from_field(self.0)
    }
}

impl From<Status> for StatusField {
    fn from(s: Status) -> Self {
        StatusField(s.to_field())
    }
}

impl Cqe {
    pub fn new(cid: u16, status: Status) -> Self {
        Cqe {
            cid,
            status: status.into(),
            ..Default::default()
        }
    }
    pub fn status(&self) -> Status {
        self.status.status()
    }
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        put_u32(&mut b, 0, self.result);
        put_u32(&mut b, 4, self.dw1);
        put_u16(&mut b, 8, self.sqhd);
        put_u16(&mut b, 10, self.sqid);
        put_u16(&mut b, 12, self.cid);
        put_u16(&mut b, 14, self.status.0);
        b
    }
    pub fn decode(b: &[u8; 16]) -> Self {
        Cqe {
            result: u32_at(b, 0),
            dw1: u32_at(b, 4),
            sqhd: u16_at(b, 8),
            sqid: u16_at(b, 10),
            cid: u16_at(b, 12),
            status: StatusField(u16_at(b, 14)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rw_fields() {
        let s = Sqe::rw(io::WRITE, 7, 1, 0x1_0000_0002, 8, true);
        assert_eq!(s.opcode(), io::WRITE);
        assert_eq!(s.cid(), 7);
        assert_eq!(s.nsid(), 1);
        assert_eq!(s.slba(), 0x1_0000_0002);
        assert_eq!(s.nlb(), 8);
        assert_ne!(s.cdw(12) & rw::FUA, 0);
    }

    proptest! {
        #[test]
        fn cqe_round_trip(result: u32, dw1: u32, sqhd: u16, sqid: u16, cid: u16, st: u16) {
            let c = Cqe { result, dw1, sqhd, sqid, cid, status: StatusField(st) };
            prop_assert_eq!(Cqe::decode(&c.encode()), c);
        }

        #[test]
        fn sgl_round_trip(address: u64, length: u32, id: u8) {
            let mut s = Sqe::default();
            let d = SglDescriptor { address, length, id };
            s.set_sgl(d);
            prop_assert_eq!(s.sgl(), d);
        }
    }
}
