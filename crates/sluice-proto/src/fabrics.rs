//! NVMe over Fabrics commands (Connect, Property Get/Set, Disconnect) and the
//! controller properties (CAP, VS, CC, CSTS) they reach.

use crate::command::{admin, sgl, SglDescriptor, Sqe};
use crate::wire::{get_str, put_nul_padded, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

/// Fabrics command types (SQE byte 4).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECEIVE: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Property offsets.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
    pub const NSSR: u32 = 0x20;
}

/// Connect command attributes (CATTR): SQ flow control disable.
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;
/// Size of the Connect data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// CNTLID a host sends to ask for any controller (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// The fields of a Connect command's SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCommand {
    pub cid: u16,
    pub recfmt: u16,
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (admin queue only).
    pub kato_ms: u32,
}

impl ConnectCommand {
    pub fn parse(sqe: &Sqe) -> Self {
        let b = &sqe.0;
        ConnectCommand {
            cid: sqe.cid(),
            recfmt: u16_at(b, 40),
            qid: u16_at(b, 42),
            sqsize: u16_at(b, 44),
            cattr: b[46],
            kato_ms: u32_at(b, 48),
        }
    }

    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(admin::FABRICS, self.cid, 0);
        s.0[4] = fctype::CONNECT;
        put_u16(&mut s.0, 40, self.recfmt);
        put_u16(&mut s.0, 42, self.qid);
        put_u16(&mut s.0, 44, self.sqsize);
        s.0[46] = self.cattr;
        put_u32(&mut s.0, 48, self.kato_ms);
        // CONNECT_DATA_LEN is 1024.
        #[allow(clippy::cast_possible_truncation)]
        let length = CONNECT_DATA_LEN as u32;
        s.set_sgl(SglDescriptor {
            address: 0,
            length,
            id: sgl::DATA_BLOCK_OFFSET,
        });
        s
    }
}

/// Byte offsets inside the Connect command, for Connect Invalid Parameters (IPO).
pub mod connect_offset {
    pub const QID: u16 = 42;
    pub const SQSIZE: u16 = 44;
    pub const CATTR: u16 = 46;
    pub const KATO: u16 = 48;
}

/// Byte offsets inside the Connect data, for Connect Invalid Parameters (IPO).
pub mod connect_data_offset {
    pub const HOSTID: u16 = 0;
    pub const CNTLID: u16 = 16;
    pub const SUBNQN: u16 = 256;
    pub const HOSTNQN: u16 = 512;
}

/// The 1024-byte data of a Connect command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

/// Why Connect data could not be used; `offset` is the IPO to report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Connect data field `{field}` (byte {offset}): {reason}")]
pub struct ConnectDataError {
    pub(crate) field: &'static str,
    pub offset: u16,
    pub(crate) reason: &'static str,
}

impl ConnectDataError {
    /// The field at fault (`hostnqn`, `subnqn`, `data`).
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why it was refused.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// Reads one NQN field. `allow_empty`: an all-zero field is the empty
/// string (HOSTNQN only; an empty SUBNQN names nothing).
fn parse_nqn(
    b: &[u8],
    off: u16,
    field: &'static str,
    allow_empty: bool,
) -> Result<String, ConnectDataError> {
    let at = usize::from(off);
    let raw = &b[at..at + 256];
    let Some(end) = raw.iter().position(|&c| c == 0) else {
        return Err(ConnectDataError {
            field,
            offset: off,
            reason: "not NUL terminated",
        });
    };
    if end == 0 && !allow_empty {
        return Err(ConnectDataError {
            field,
            offset: off,
            reason: "empty",
        });
    }
    if end > crate::NQN_LEN_MAX {
        return Err(ConnectDataError {
            field,
            offset: off,
            reason: "longer than 223 bytes",
        });
    }
    let s = std::str::from_utf8(&raw[..end]).map_err(|_| ConnectDataError {
        field,
        offset: off,
        reason: "not UTF-8",
    })?;
    if s.chars().any(|c| c.is_control()) {
        return Err(ConnectDataError {
            field,
            offset: off,
            reason: "contains control characters",
        });
    }
    Ok(s.to_string())
}

impl ConnectData {
    pub fn parse(b: &[u8]) -> Result<Self, ConnectDataError> {
        if b.len() < CONNECT_DATA_LEN {
            return Err(ConnectDataError {
                field: "data",
                offset: 0,
                reason: "shorter than 1024 bytes",
            });
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[0..16]);
        Ok(ConnectData {
            hostid,
            cntlid: u16_at(b, 16),
            subnqn: parse_nqn(b, 256, "subnqn", false)?,
            // An empty HOSTNQN is a host that gave none (SPDK's perf with
            // its default transport ID): Linux nvmet and SPDK's nvmf_tgt
            // both let the subsystem's access rules decide, so it parses.
            hostnqn: parse_nqn(b, 512, "hostnqn", true)?,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.hostid);
        put_u16(&mut b, 16, self.cntlid);
        put_nul_padded(&mut b, 256, 255, &self.subnqn);
        put_nul_padded(&mut b, 512, 255, &self.hostnqn);
        b
    }
}

/// Connect response DW0 for Connect Invalid Parameters: IATTR (bit 0 of byte
/// 2: 1 = the bad parameter is in the data) and IPO (bytes 1:0).
pub fn connect_invalid_param_result(in_data: bool, ipo: u16) -> u32 {
    ((in_data as u32) << 16) | ipo as u32
}

/// Property Get/Set fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCommand {
    /// 8-byte property when true, 4-byte otherwise.
    pub size8: bool,
    pub offset: u32,
    /// Value (Property Set only).
    pub value: u64,
}

impl PropertyCommand {
    pub fn parse(sqe: &Sqe) -> Self {
        PropertyCommand {
            size8: sqe.0[40] & 0x7 == 1,
            offset: u32_at(&sqe.0, 44),
            value: u64_at(&sqe.0, 48),
        }
    }
    /// The attribute byte is valid (only sizes 4 and 8 exist).
    pub fn attrib_valid(sqe: &Sqe) -> bool {
        sqe.0[40] & 0x7 <= 1
    }
    pub fn to_sqe(&self, cid: u16, fct: u8) -> Sqe {
        let mut s = Sqe::new(admin::FABRICS, cid, 0);
        s.0[4] = fct;
        s.0[40] = self.size8 as u8;
        put_u32(&mut s.0, 44, self.offset);
        if fct == fctype::PROPERTY_SET {
            put_u64(&mut s.0, 48, self.value);
        }
        s
    }
}

/// AUTH_Send (`send`) or AUTH_Receive of `len` bytes for DH-HMAC-CHAP:
/// SECP E9h, SPSP0 = SPSP1 = 01h in CDW10, TL or AL in CDW11 (the data
/// pointer is the host's to fill, as for any transfer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCommand {
    pub send: bool,
    pub len: u32,
}

/// SECP of DH-HMAC-CHAP.
pub const AUTH_SECP_DHCHAP: u8 = 0xe9;

/// ATR, Authentication Transaction Required: the bit of a Connect
/// response's DW0 (above the CNTLID) that tells the host to run
/// DH-HMAC-CHAP on the queue before anything else.
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;

impl AuthCommand {
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin::FABRICS, cid, 0);
        s.0[4] = if self.send {
            fctype::AUTH_SEND
        } else {
            fctype::AUTH_RECEIVE
        };
        s.0[41] = 0x01;
        s.0[42] = 0x01;
        s.0[43] = AUTH_SECP_DHCHAP;
        put_u32(&mut s.0, 44, self.len);
        s
    }
}

/// Controller Capabilities (CAP) fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// Maximum queue entries supported, 0's based.
    pub mqes: u16,
    /// Worst-case time to become ready, in 500 ms units.
    pub to_500ms: u8,
}

impl Cap {
    pub fn encode(&self) -> u64 {
        let mut v = self.mqes as u64;
        v |= 1 << 16; // CQR: contiguous queues required
        v |= (self.to_500ms as u64) << 24;
        v |= 1 << 37; // CSS: NVM command set
        v
    }
    pub fn decode(v: u64) -> Self {
        Cap {
            mqes: (v & 0xffff) as u16,
            to_500ms: ((v >> 24) & 0xff) as u8,
        }
    }
}

/// Controller Configuration (CC) bits.
pub mod cc {
    pub const EN: u32 = 1;
    pub const SHN_SHIFT: u32 = 14;
    pub const SHN_MASK: u32 = 0x3 << 14;
    pub const IOSQES_SHIFT: u32 = 16;
    pub const IOCQES_SHIFT: u32 = 20;
    pub const CSS_SHIFT: u32 = 4;
    pub const MPS_SHIFT: u32 = 7;
    pub const AMS_SHIFT: u32 = 11;
}

/// Controller Status (CSTS) bits.
pub mod csts {
    pub const RDY: u32 = 1;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_SHIFT: u32 = 2;
    pub const SHST_OCCURRING: u32 = 1 << 2;
    pub const SHST_COMPLETE: u32 = 2 << 2;
}

/// Version register value for NVMe 1.3.
pub const VS_1_3: u32 = 0x0001_0300;

/// A 128-bit UUID in hex (32 digits, dashes anywhere allowed): Host
/// Identifiers, namespace UUIDs. `None` for anything else.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut out = [0u8; 16];
    for (b, pair) in out.iter_mut().zip(hex.chunks(2)) {
        *b = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// A UUID as 32 hex digits (what [`parse_uuid`] reads).
pub fn format_uuid(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a string NQN out of a fixed 256-byte field (for log pages).
pub fn read_nqn(b: &[u8], off: usize) -> String {
    get_str(b, off, 256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn uuids_parse_with_or_without_dashes_and_nothing_else() {
        let text = "5c1a1ce0-0000-4000-8000-0000000000ab";
        let id = parse_uuid(text).unwrap();
        assert_eq!((id[0], id[1], id[15]), (0x5c, 0x1a, 0xab));
        assert_eq!(parse_uuid(&format_uuid(&id)), Some(id));
        assert_eq!(format_uuid(&id), text.replace('-', ""));
        for bad in [
            "",
            "5c1a",
            "5c1a1ce0-zz00-4000-8000-0000000000ab",
            &format!("{text}0"),
            "é1a1ce0000040008000000000000000ab",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad}");
        }
    }

    #[test]
    fn connect_round_trip() {
        let c = ConnectCommand {
            cid: 3,
            recfmt: 0,
            qid: 2,
            sqsize: 127,
            cattr: CATTR_DISABLE_SQ_FLOW,
            kato_ms: 0,
        };
        let s = c.to_sqe();
        assert_eq!(s.opcode(), admin::FABRICS);
        assert_eq!(s.fctype(), fctype::CONNECT);
        assert_eq!(ConnectCommand::parse(&s), c);
    }

    #[test]
    fn connect_data_errors_name_field() {
        let mut d = ConnectData {
            hostid: [1; 16],
            cntlid: 0xffff,
            subnqn: "nqn.a".into(),
            hostnqn: "nqn.h".into(),
        }
        .encode();
        d[512..768].fill(b'x');
        let e = ConnectData::parse(&d).unwrap_err();
        assert_eq!((e.field, e.offset), ("hostnqn", 512));
        d[256] = 0;
        assert_eq!(ConnectData::parse(&d).unwrap_err().field, "subnqn");
        assert!(ConnectData::parse(&d[..100]).is_err());
    }

    #[test]
    fn connect_data_empty_hostnqn_and_hostid_parse() {
        let d = ConnectData {
            hostid: [0; 16],
            cntlid: 0xffff,
            subnqn: "nqn.a".into(),
            hostnqn: String::new(),
        };
        let b = d.encode();
        assert!(b[512..768].iter().all(|&c| c == 0));
        assert_eq!(ConnectData::parse(&b).unwrap(), d);
        // An empty SUBNQN is still refused, naming the field.
        let mut b = b;
        b[256..512].fill(0);
        let e = ConnectData::parse(&b).unwrap_err();
        assert_eq!((e.field, e.offset, e.reason), ("subnqn", 256, "empty"));
    }

    proptest! {
        #[test]
        fn connect_data_round_trip(hostid: [u8; 16], cntlid: u16, sub in "[a-z0-9.:-]{1,223}", host in "[a-z0-9.:-]{1,223}") {
            let d = ConnectData { hostid, cntlid, subnqn: sub, hostnqn: host };
            prop_assert_eq!(ConnectData::parse(&d.encode()).unwrap(), d);
        }

        #[test]
        fn property_round_trip(size8: bool, offset in 0u32..0x100, value: u64, set: bool) {
            let fct = if set { fctype::PROPERTY_SET } else { fctype::PROPERTY_GET };
            let p = PropertyCommand { size8, offset, value: if set { value } else { 0 } };
            prop_assert_eq!(PropertyCommand::parse(&p.to_sqe(1, fct)), p);
        }
    }
}
