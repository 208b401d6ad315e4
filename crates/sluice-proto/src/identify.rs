//! Identify data structures: Controller (CNS 01h), Namespace (CNS 00h),
//! active namespace ID list (CNS 02h), namespace identification descriptor
//! list (CNS 03h), and the NVM command set's own Identify Controller
//! (CNS 06h, CSI 00h: the Write Zeroes and Dataset Management limits).
//! Each is 4096 bytes on the wire.

use crate::wire::{
    get_str, put_nul_padded, put_padded, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at,
};

pub const IDENTIFY_LEN: usize = 4096;

/// CNS values.
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_DESCRIPTORS: u8 = 0x03;
    /// I/O command set specific Identify Controller (CSI in CDW11 31:24).
    pub const CS_CONTROLLER: u8 = 0x06;
}

/// Command set identifiers (CSI).
pub mod csi {
    /// The NVM command set.
    pub const NVM: u8 = 0x00;
}

/// Controller types (CNTRLTYPE).
pub mod cntrltype {
    pub const IO: u8 = 1;
    pub const DISCOVERY: u8 = 2;
}

/// Optional NVM command support (ONCS) bits.
pub mod oncs {
    pub const DSM: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
    pub const RESERVATIONS: u16 = 1 << 5;
}

/// Controller attributes (CTRATT) bits.
pub mod ctratt {
    /// 128-bit Host Identifiers (every NVMe over Fabrics controller).
    pub const HOST_ID_128: u32 = 1 << 0;
}

/// The Identify Controller fields Sluice sets or a host reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyController {
    pub vid: u16,
    pub ssvid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Controller multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size as a power of two of the minimum page size (0 = no limit).
    pub mdts: u8,
    pub cntlid: u16,
    pub ver: u32,
    /// Controller attributes ([`ctratt`]).
    pub ctratt: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    pub cntrltype: u8,
    /// Optional admin command support.
    pub oacs: u16,
    /// Abort command limit, 0's based.
    pub acl: u8,
    /// Asynchronous event request limit, 0's based.
    pub aerl: u8,
    /// Firmware updates.
    pub frmw: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries, 0's based.
    pub elpe: u8,
    /// Keep alive support granularity in 100 ms units (0 = not supported).
    pub kas: u16,
    pub sqes: u8,
    pub cqes: u8,
    pub maxcmd: u16,
    /// Number of namespaces (highest NSID).
    pub nn: u32,
    pub oncs: u16,
    pub fuses: u16,
    pub fna: u8,
    /// Volatile write cache present (bit 0).
    pub vwc: u8,
    pub sgls: u32,
    pub subnqn: String,
    /// I/O queue command capsule supported size, in 16-byte units.
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, in 16-byte units.
    pub iorcsz: u32,
    pub icdoff: u16,
    pub fcatt: u8,
    pub msdbd: u8,
}

impl IdentifyController {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u16(&mut b, 0, self.vid);
        put_u16(&mut b, 2, self.ssvid);
        put_padded(&mut b, 4, 20, &self.serial);
        put_padded(&mut b, 24, 40, &self.model);
        put_padded(&mut b, 64, 8, &self.firmware);
        b[72] = 6; // RAB: recommended arbitration burst
        b[76] = self.cmic;
        b[77] = self.mdts;
        put_u16(&mut b, 78, self.cntlid);
        put_u32(&mut b, 80, self.ver);
        put_u32(&mut b, 96, self.ctratt);
        put_u32(&mut b, 92, self.oaes);
        b[111] = self.cntrltype;
        put_u16(&mut b, 256, self.oacs);
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        // WCTEMP/CCTEMP: warning and critical composite temperature (Kelvin).
        put_u16(&mut b, 266, 343);
        put_u16(&mut b, 268, 373);
        put_u16(&mut b, 320, self.kas);
        b[512] = self.sqes;
        b[513] = self.cqes;
        put_u16(&mut b, 514, self.maxcmd);
        put_u32(&mut b, 516, self.nn);
        put_u16(&mut b, 520, self.oncs);
        put_u16(&mut b, 522, self.fuses);
        b[524] = self.fna;
        b[525] = self.vwc;
        put_u32(&mut b, 536, self.sgls);
        put_nul_padded(&mut b, 768, 256, &self.subnqn);
        put_u32(&mut b, 1792, self.ioccsz);
        put_u32(&mut b, 1796, self.iorcsz);
        put_u16(&mut b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        // Power state 0: max power 25 W (in 0.01 W units).
        put_u16(&mut b, 2048, 2500);
        b
    }

    /// Decodes the fields above; `b` must be at least 4096 bytes.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        Some(IdentifyController {
            vid: u16_at(b, 0),
            ssvid: u16_at(b, 2),
            serial: get_str(b, 4, 20),
            model: get_str(b, 24, 40),
            firmware: get_str(b, 64, 8),
            cmic: b[76],
            mdts: b[77],
            cntlid: u16_at(b, 78),
            ver: u32_at(b, 80),
            ctratt: u32_at(b, 96),
            oaes: u32_at(b, 92),
            cntrltype: b[111],
            oacs: u16_at(b, 256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            kas: u16_at(b, 320),
            sqes: b[512],
            cqes: b[513],
            maxcmd: u16_at(b, 514),
            nn: u32_at(b, 516),
            oncs: u16_at(b, 520),
            fuses: u16_at(b, 522),
            fna: b[524],
            vwc: b[525],
            sgls: u32_at(b, 536),
            subnqn: get_str(b, 768, 256),
            ioccsz: u32_at(b, 1792),
            iorcsz: u32_at(b, 1796),
            icdoff: u16_at(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
        })
    }
}

/// The Identify Namespace fields Sluice sets or a host reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    /// Size in logical blocks.
    pub nsze: u64,
    pub ncap: u64,
    pub nuse: u64,
    /// Namespace features (bit 2: deallocated/unwritten error support...).
    pub nsfeat: u8,
    /// log2 of the logical block size of the one LBA format.
    pub lbads: u8,
    /// Deallocate logical block features: bits 2:0 = 1 reads back zeroes;
    /// bit 3: Write Zeroes may deallocate.
    pub dlfeat: u8,
    /// Namespace multi-path I/O and sharing capabilities.
    pub nmic: u8,
    /// Reservation capabilities (the types supported; 0: none).
    pub rescap: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
}

impl IdentifyNamespace {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u64(&mut b, 0, self.nsze);
        put_u64(&mut b, 8, self.ncap);
        put_u64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        b[25] = 0; // NLBAF: one format
        b[26] = 0; // FLBAS: format 0, no metadata
        b[30] = self.nmic;
        b[31] = self.rescap;
        b[33] = self.dlfeat;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        // LBA format 0: MS = 0, LBADS, RP = 0 (best).
        b[130] = self.lbads;
        b
    }

    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        let flbas = (b[26] & 0xf) as usize;
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        Some(IdentifyNamespace {
            nsze: u64_at(b, 0),
            ncap: u64_at(b, 8),
            nuse: u64_at(b, 16),
            nsfeat: b[24],
            lbads: b[128 + flbas * 4 + 2],
            dlfeat: b[33],
            nmic: b[30],
            rescap: b[31],
            nguid,
            eui64,
        })
    }

    pub fn block_size_bytes(&self) -> u64 {
        1u64 << self.lbads.min(31)
    }
}

/// The NVM command set's Identify Controller (CNS 06h, CSI 00h): limits
/// on commands that move no data. Zero in any field means "no limit".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdentifyControllerNvm {
    /// Verify Size Limit, a power of two of the minimum page size.
    pub vsl: u8,
    /// Write Zeroes Size Limit, a power of two of the minimum page size.
    pub wzsl: u8,
    /// Write Uncorrectable Size Limit, a power of two of the minimum page size.
    pub wusl: u8,
    /// Dataset Management Ranges Limit: most ranges in one command.
    pub dmrl: u8,
    /// Dataset Management Range Size Limit: most blocks in one range.
    pub dmrsl: u32,
    /// Dataset Management Size Limit: most blocks in one command.
    pub dmsl: u64,
}

impl IdentifyControllerNvm {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0] = self.vsl;
        b[1] = self.wzsl;
        b[2] = self.wusl;
        b[3] = self.dmrl;
        put_u32(&mut b, 4, self.dmrsl);
        put_u64(&mut b, 8, self.dmsl);
        b
    }

    /// Decodes the fields above; `b` must be at least 16 bytes (a controller
    /// sends 4096).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < 16 {
            return None;
        }
        Some(IdentifyControllerNvm {
            vsl: b[0],
            wzsl: b[1],
            wusl: b[2],
            dmrl: b[3],
            dmrsl: u32_at(b, 4),
            dmsl: u64_at(b, 8),
        })
    }

    /// The largest Write Zeroes in bytes, given the controller's minimum
    /// page size (CAP.MPSMIN), or `None` without a limit. A limit past
    /// 2^63 bytes saturates.
    pub fn write_zeroes_bytes_max(&self, page_bytes_min: u64) -> Option<u64> {
        if self.wzsl == 0 {
            return None;
        }
        Some(
            1u64.checked_shl(u32::from(self.wzsl))
                .and_then(|pages| pages.checked_mul(page_bytes_min))
                .unwrap_or(1 << 63),
        )
    }
}

/// Active namespace ID list: the NSIDs greater than `after`, ascending, at most 1024.
pub fn encode_active_ns_list(nsids: &[u32], after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut ids: Vec<u32> = nsids.iter().copied().filter(|&n| n > after).collect();
    ids.sort_unstable();
    for (i, id) in ids.iter().take(IDENTIFY_LEN / 4).enumerate() {
        put_u32(&mut b, i * 4, *id);
    }
    b
}

pub fn decode_active_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .collect()
}

/// Namespace identification descriptor types.
pub mod nidt {
    pub const EUI64: u8 = 1;
    pub const NGUID: u8 = 2;
    pub const UUID: u8 = 3;
    pub const CSI: u8 = 4;
}

/// Namespace identification descriptor list: NGUID, UUID and CSI (NVM).
pub fn encode_ns_descriptors(nguid: &[u8; 16], uuid: &[u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    for (t, v) in [
        (nidt::NGUID, &nguid[..]),
        (nidt::UUID, &uuid[..]),
        (nidt::CSI, &[0u8][..]),
    ] {
        b[at] = t;
        // NIDL: 16 (NGUID, UUID) or 1 (CSI).
        #[allow(clippy::cast_possible_truncation)]
        let nidl = v.len() as u8;
        b[at + 1] = nidl;
        b[at + 4..at + 4 + v.len()].copy_from_slice(v);
        at += 4 + v.len();
    }
    b
}

/// Parses a descriptor list into (type, value) pairs; stops at a zero type or
/// a descriptor that would run past the end.
pub fn decode_ns_descriptors(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() {
        let (t, l) = (b[at], b[at + 1] as usize);
        if t == 0 || at + 4 + l > b.len() {
            break;
        }
        out.push((t, b[at + 4..at + 4 + l].to_vec()));
        at += 4 + l;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ns_list_filters_and_sorts() {
        let b = encode_active_ns_list(&[5, 1, 3], 1);
        assert_eq!(decode_active_ns_list(&b), vec![3, 5]);
    }

    #[test]
    fn write_zeroes_limit_counts_pages_of_the_minimum_size() {
        let c = IdentifyControllerNvm {
            wzsl: 4,
            ..Default::default()
        };
        // 2^4 pages of 4 KiB, or of 8 KiB when CAP.MPSMIN says so.
        assert_eq!(c.write_zeroes_bytes_max(4096), Some(64 << 10));
        assert_eq!(c.write_zeroes_bytes_max(8192), Some(128 << 10));
        assert_eq!(
            IdentifyControllerNvm::default().write_zeroes_bytes_max(4096),
            None
        );
        let huge = IdentifyControllerNvm {
            wzsl: 255,
            ..Default::default()
        };
        assert_eq!(huge.write_zeroes_bytes_max(4096), Some(1 << 63));
        assert_eq!(IdentifyControllerNvm::decode(&[0; 15]), None);
    }

    #[test]
    fn ns_descriptors_round_trip() {
        let d = decode_ns_descriptors(&encode_ns_descriptors(&[7; 16], &[9; 16]));
        assert_eq!(
            d,
            vec![
                (nidt::NGUID, vec![7; 16]),
                (nidt::UUID, vec![9; 16]),
                (nidt::CSI, vec![0])
            ]
        );
    }

    proptest! {
        #[test]
        fn controller_round_trip(cntlid: u16, ctratt: u32, mdts: u8, maxcmd: u16, nn: u32, kas: u16, ioccsz: u32, sgls: u32,
                                 serial in "[A-Za-z0-9]{0,20}", model in "[A-Za-z0-9 ]{0,39}[A-Za-z0-9]", sub in "[a-z0-9.:]{1,200}") {
            let c = IdentifyController { cntlid, ctratt, mdts, maxcmd, nn, kas, ioccsz, sgls, serial, model, subnqn: sub,
                firmware: "0.1".into(), ver: 0x10300, cntrltype: 1, sqes: 0x66, cqes: 0x44, iorcsz: 1, ..Default::default() };
            prop_assert_eq!(IdentifyController::decode(&c.encode()).unwrap(), c);
        }

        #[test]
        fn controller_nvm_round_trip(vsl: u8, wzsl: u8, wusl: u8, dmrl: u8, dmrsl: u32, dmsl: u64) {
            let c = IdentifyControllerNvm { vsl, wzsl, wusl, dmrl, dmrsl, dmsl };
            prop_assert_eq!(IdentifyControllerNvm::decode(&c.encode()).unwrap(), c);
            match c.write_zeroes_bytes_max(4096) {
                None => prop_assert_eq!(wzsl, 0),
                Some(b) => prop_assert!(b >= 8192 && b.is_power_of_two()),
            }
        }

        #[test]
        fn namespace_round_trip(nsze: u64, lbads in prop::sample::select(vec![9u8, 12]), nguid: [u8; 16], eui64: [u8; 8], dlfeat: u8) {
            let n = IdentifyNamespace { nsze, ncap: nsze, nuse: nsze, lbads, nguid, eui64, dlfeat, nsfeat: 0, nmic: 0, rescap: 0xfe };
            let d = IdentifyNamespace::decode(&n.encode()).unwrap();
            prop_assert_eq!(d.block_size_bytes(), 1u64 << lbads);
            prop_assert_eq!(d, n);
        }
    }
}
