//! Log pages: error information, SMART / health, firmware slot, commands
//! supported and effects, changed namespace list, and the discovery log.

use crate::wire::{get_str, put_nul_padded, put_u16, put_u32, put_u64, u16_at, u64_at};

/// Log page identifiers.
pub mod lid {
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS_LIST: u8 = 0x04;
    pub const COMMANDS_SUPPORTED: u8 = 0x05;
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
    pub const DISCOVERY: u8 = 0x70;
}

/// Get Log Page fields decoded from CDW10-13.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: u8,
    pub lsp: u8,
    /// Retain asynchronous event.
    pub rae: bool,
    /// Number of bytes requested.
    pub len_bytes: u64,
    /// Byte offset into the log.
    pub offset_bytes: u64,
}

impl GetLogPage {
    pub fn parse(sqe: &crate::Sqe) -> Self {
        let cdw10 = sqe.cdw(10);
        let cdw11 = sqe.cdw(11);
        let numd = (((cdw11 & 0xffff) as u64) << 16 | (cdw10 >> 16) as u64) + 1;
        GetLogPage {
            lid: (cdw10 & 0xff) as u8,
            lsp: ((cdw10 >> 8) & 0x7f) as u8,
            rae: cdw10 & (1 << 15) != 0,
            len_bytes: numd * 4,
            offset_bytes: (sqe.cdw(13) as u64) << 32 | sqe.cdw(12) as u64,
        }
    }

    /// Builds the command (host side). `len_bytes` must be a non-zero multiple of 4.
    pub fn to_sqe(&self, cid: u16, nsid: u32) -> crate::Sqe {
        let mut s = crate::Sqe::new(crate::command::admin::GET_LOG_PAGE, cid, nsid);
        let numd = self.len_bytes / 4 - 1;
        s.set_cdw(
            10,
            self.lid as u32
                | (self.lsp as u32) << 8
                | (self.rae as u32) << 15
                | ((numd & 0xffff) as u32) << 16,
        );
        s.set_cdw(11, ((numd >> 16) & 0xffff) as u32);
        s.set_cdw(12, (self.offset_bytes & 0xffff_ffff) as u32);
        s.set_cdw(13, (self.offset_bytes >> 32) as u32);
        s
    }
}

/// SMART / Health Information (512 bytes). Counters are in the spec's units:
/// data units are thousands of 512-byte units, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmartLog {
    pub temperature_kelvin: u16,
    pub available_spare_pct: u8,
    pub data_units_read: u64,
    pub data_units_written: u64,
    pub host_read_commands: u64,
    pub host_write_commands: u64,
    pub power_on_hours: u64,
    pub media_errors: u64,
}

impl SmartLog {
    pub const LEN: usize = 512;
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::LEN];
        put_u16(&mut b, 1, self.temperature_kelvin);
        b[3] = self.available_spare_pct;
        b[4] = 10; // available spare threshold
        put_u64(&mut b, 32, self.data_units_read);
        put_u64(&mut b, 48, self.data_units_written);
        put_u64(&mut b, 64, self.host_read_commands);
        put_u64(&mut b, 80, self.host_write_commands);
        put_u64(&mut b, 128, self.power_on_hours);
        put_u64(&mut b, 160, self.media_errors);
        b
    }
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < Self::LEN {
            return None;
        }
        Some(SmartLog {
            temperature_kelvin: u16_at(b, 1),
            available_spare_pct: b[3],
            data_units_read: u64_at(b, 32),
            data_units_written: u64_at(b, 48),
            host_read_commands: u64_at(b, 64),
            host_write_commands: u64_at(b, 80),
            power_on_hours: u64_at(b, 128),
            media_errors: u64_at(b, 160),
        })
    }
    /// Converts bytes to SMART data units (1000 x 512 bytes, rounded up).
    pub fn data_units(bytes: u64) -> u64 {
        bytes.div_ceil(512 * 1000)
    }
}

/// Firmware slot information (512 bytes): slot 1 active, holding `revision`.
pub fn encode_firmware_slot(revision: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // AFI: slot 1 active
    let mut rev = [b' '; 8];
    let n = revision.len().min(8);
    rev[..n].copy_from_slice(&revision.as_bytes()[..n]);
    b[8..16].copy_from_slice(&rev);
    b
}

/// Commands Supported and Effects (4096 bytes): one dword per admin opcode
/// (256), then one per I/O opcode (256). Bit 0: supported; bit 1: LBCC
/// (logical block content change); bit 2: NCC; bit 3: NIC; bit 4: CCC.
pub fn encode_commands_supported(admin: &[(u8, u32)], io: &[(u8, u32)]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for &(op, e) in admin {
        put_u32(&mut b, op as usize * 4, e);
    }
    for &(op, e) in io {
        put_u32(&mut b, 1024 + op as usize * 4, e);
    }
    b
}

pub mod effects {
    pub const CSUPP: u32 = 1;
    pub const LBCC: u32 = 1 << 1;
    pub const NCC: u32 = 1 << 2;
    pub const NIC: u32 = 1 << 3;
    pub const CCC: u32 = 1 << 4;
}

/// Changed namespace list (4096 bytes: up to 1024 NSIDs, or 0xffffffff first
/// when more changed).
pub fn encode_changed_ns_list(nsids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    if nsids.len() > 1024 {
        put_u32(&mut b, 0, 0xffff_ffff);
    } else {
        for (i, id) in nsids.iter().enumerate() {
            put_u32(&mut b, i * 4, *id);
        }
    }
    b
}

/// Discovery log entry subtypes.
pub mod subtype {
    pub const REFERRAL: u8 = 1;
    pub const NVME: u8 = 2;
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Transport type TCP.
pub const TRTYPE_TCP: u8 = 3;
/// Address families.
pub mod adrfam {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
}
/// TREQ: SQ flow control disable supported (bit 2); secure channel not required (0).
pub const TREQ_SQFLOW_DISABLE_SUPPORTED: u8 = 1 << 2;

/// One discovery log page entry (1024 bytes on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    /// Admin max submission queue size.
    pub asqsz: u16,
    pub eflags: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// TCP: security type (0 = none).
    pub sectype: u8,
}

pub const DISCOVERY_HEADER_LEN: usize = 1024;
pub const DISCOVERY_ENTRY_LEN: usize = 1024;

impl DiscoveryEntry {
    pub fn encode_into(&self, b: &mut [u8]) {
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put_u16(b, 4, self.portid);
        put_u16(b, 6, self.cntlid);
        put_u16(b, 8, self.asqsz);
        put_u16(b, 10, self.eflags);
        put_nul_padded(b, 32, 32, &self.trsvcid);
        put_nul_padded(b, 256, 256, &self.subnqn);
        put_nul_padded(b, 512, 256, &self.traddr);
        b[768] = self.sectype;
    }
    pub fn decode(b: &[u8]) -> Self {
        DiscoveryEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: u16_at(b, 4),
            cntlid: u16_at(b, 6),
            asqsz: u16_at(b, 8),
            eflags: u16_at(b, 10),
            trsvcid: get_str(b, 32, 32),
            subnqn: get_str(b, 256, 256),
            traddr: get_str(b, 512, 256),
            sectype: b[768],
        }
    }
}

/// The whole discovery log page: header (GENCTR, NUMREC, RECFMT) and entries.
pub fn encode_discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISCOVERY_HEADER_LEN + entries.len() * DISCOVERY_ENTRY_LEN];
    put_u64(&mut b, 0, genctr);
    put_u64(&mut b, 8, entries.len() as u64);
    put_u16(&mut b, 16, 0);
    for (i, e) in entries.iter().enumerate() {
        let at = DISCOVERY_HEADER_LEN + i * DISCOVERY_ENTRY_LEN;
        e.encode_into(&mut b[at..at + DISCOVERY_ENTRY_LEN]);
    }
    b
}

/// Decoded discovery log header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryHeader {
    pub genctr: u64,
    pub numrec: u64,
    pub(crate) recfmt: u16,
}

pub fn decode_discovery_header(b: &[u8]) -> Option<DiscoveryHeader> {
    if b.len() < 18 {
        return None;
    }
    Some(DiscoveryHeader {
        genctr: u64_at(b, 0),
        numrec: u64_at(b, 8),
        recfmt: u16_at(b, 16),
    })
}

/// Decodes as many whole entries as `b` holds after the header (at most `numrec`).
pub fn decode_discovery_entries(b: &[u8], numrec: u64) -> Vec<DiscoveryEntry> {
    if b.len() < DISCOVERY_HEADER_LEN {
        return Vec::new();
    }
    b[DISCOVERY_HEADER_LEN..]
        .chunks_exact(DISCOVERY_ENTRY_LEN)
        .take(numrec.min(1 << 16) as usize)
        .map(DiscoveryEntry::decode)
        .collect()
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn get_log_page_numd_and_offset() {
        let g = GetLogPage {
            lid: lid::DISCOVERY,
            lsp: 0,
            rae: true,
            len_bytes: 0x40000 * 4 + 8,
            offset_bytes: 0x1_0000_0400,
        };
        let p = GetLogPage::parse(&g.to_sqe(1, 0));
        assert_eq!(p, g);
    }

    proptest! {
        #[test]
        fn discovery_round_trip(n in 0usize..4, genctr: u64, port in 1u16.., sub in "[a-z0-9.:]{1,100}", addr in "[0-9.]{7,15}") {
            let e: Vec<_> = (0..n).map(|i| DiscoveryEntry {
                trtype: TRTYPE_TCP, adrfam: adrfam::IPV4, subtype: subtype::NVME, treq: 0, portid: i as u16,
                cntlid: 0xffff, asqsz: 32, eflags: 0, trsvcid: port.to_string(), subnqn: sub.clone(), traddr: addr.clone(), sectype: 0,
            }).collect();
            let b = encode_discovery_log(genctr, &e);
            let h = decode_discovery_header(&b).unwrap();
            prop_assert_eq!(h.genctr, genctr);
            prop_assert_eq!(h.numrec, n as u64);
            prop_assert_eq!(decode_discovery_entries(&b, h.numrec), e);
        }

        #[test]
        fn smart_round_trip(r: u64, w: u64, rc: u64, wc: u64) {
            let s = SmartLog { temperature_kelvin: 300, available_spare_pct: 100, data_units_read: r, data_units_written: w,
                host_read_commands: rc, host_write_commands: wc, power_on_hours: 1, media_errors: 0 };
            prop_assert_eq!(SmartLog::decode(&s.encode()).unwrap(), s);
        }
    }
}
