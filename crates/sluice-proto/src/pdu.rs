//! NVMe/TCP PDU headers: layouts, strict decoding, encoding.
//!
//! Every PDU starts with an 8-byte common header (type, flags, HLEN, PDO,
//! PLEN) followed by a PDU-specific header, an optional header digest, padding
//! up to PDO, data, and an optional data digest. [`decode_header`] validates a
//! complete header against the negotiated connection parameters and returns
//! a [`DecodeError`] that names the offending field and knows which fatal
//! error status (FES) the peer must be told in a TermReq.

use crate::command::{Cqe, Sqe};
use crate::digest::crc32c;
use crate::wire::{put_u16, put_u32, u16_at, u32_at};

/// PDU type codes.
pub mod pdu_type {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common-header flag bits.
pub mod flags {
    pub const HDGSTF: u8 = 0x01;
    pub const DDGSTF: u8 = 0x02;
    /// H2CData/C2HData: last PDU of the transfer.
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData: the command completed successfully; no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// Fatal error status codes carried in H2CTermReq/C2HTermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Length of the common header.
pub const CH_LEN: usize = 8;
/// Length of a digest.
pub const DIGEST_LEN: usize = 4;
/// ICReq and ICResp are always 128 bytes.
pub const IC_LEN: usize = 128;
/// Header length of CapsuleCmd (common header + 64-byte SQE).
pub const CAPSULE_CMD_HLEN: usize = 72;
/// Header length of CapsuleResp, H2CData, C2HData, R2T and TermReqs.
pub const SHORT_HLEN: usize = 24;
/// TermReqs carry at most this many bytes of the offending PDU header.
pub const TERM_REQ_DATA_MAX: usize = 128;
/// Largest header length of any PDU.
pub const HLEN_MAX: usize = IC_LEN;
/// Largest PDO we accept or produce: header, header digest and 31 dwords of padding.
pub const PDO_MAX: usize = 255;

/// ICReq PDU-specific fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment: C2H data starts at a multiple of (hpda+1)*4.
    pub hpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// ICResp PDU-specific fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment for H2C data.
    pub cpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Largest H2CData payload the controller accepts.
    pub maxh2cdata: u32,
}

/// H2CTermReq / C2HTermReq fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    pub fei: u32,
    /// Copy of the offending PDU header (at most [`TERM_REQ_DATA_MAX`] bytes).
    pub data: Vec<u8>,
}

/// H2CData / C2HData header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    pub cccid: u16,
    /// Transfer tag (H2CData only; reserved in C2HData).
    pub ttag: u16,
    pub offset: u32,
    pub len: u32,
    pub last: bool,
    /// C2HData only: command succeeded, no CapsuleResp follows.
    pub success: bool,
}

/// R2T fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    pub cccid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub len: u32,
}

/// A decoded PDU header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PduHeader {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTermReq(TermReq),
    C2HTermReq(TermReq),
    CapsuleCmd(Sqe),
    CapsuleResp(Cqe),
    H2CData(DataHeader),
    C2HData(DataHeader),
    R2t(R2t),
}

impl PduHeader {
    pub fn pdu_type(&self) -> u8 {
        match self {
            PduHeader::IcReq(_) => pdu_type::IC_REQ,
            PduHeader::IcResp(_) => pdu_type::IC_RESP,
            PduHeader::H2CTermReq(_) => pdu_type::H2C_TERM_REQ,
            PduHeader::C2HTermReq(_) => pdu_type::C2H_TERM_REQ,
            PduHeader::CapsuleCmd(_) => pdu_type::CAPSULE_CMD,
            PduHeader::CapsuleResp(_) => pdu_type::CAPSULE_RESP,
            PduHeader::H2CData(_) => pdu_type::H2C_DATA,
            PduHeader::C2HData(_) => pdu_type::C2H_DATA,
            PduHeader::R2t(_) => pdu_type::R2T,
        }
    }

    /// The direction a PDU type travels in.
    pub fn direction(pdu_type: u8) -> Option<Direction> {
        match pdu_type {
            pdu_type::IC_REQ
            | pdu_type::H2C_TERM_REQ
            | pdu_type::CAPSULE_CMD
            | pdu_type::H2C_DATA => Some(Direction::HostToController),
            pdu_type::IC_RESP
            | pdu_type::C2H_TERM_REQ
            | pdu_type::CAPSULE_RESP
            | pdu_type::C2H_DATA
            | pdu_type::R2T => Some(Direction::ControllerToHost),
            _ => None,
        }
    }
}

/// Which way a PDU travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    HostToController,
    ControllerToHost,
}

/// A reason to terminate the connection, with the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("invalid PDU header field `{field}` (byte {offset}): {reason}")]
    InvalidField {
        field: &'static str,
        offset: u32,
        reason: String,
    },
    #[error("PDU sequence error: {0}")]
    Sequence(String),
    #[error("header digest mismatch: received {received:#010x}, computed {computed:#010x}")]
    HeaderDigest { received: u32, computed: u32 },
    #[error("data transfer out of range: {0}")]
    DataOutOfRange(String),
    #[error("data transfer limit exceeded: {0}")]
    DataLimitExceeded(String),
    #[error("unsupported parameter `{field}` (byte {offset}): {reason}")]
    Unsupported {
        field: &'static str,
        offset: u32,
        reason: String,
    },
}

impl DecodeError {
    pub fn invalid(field: &'static str, offset: usize, reason: impl Into<String>) -> Self {
        DecodeError::InvalidField {
            field,
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            reason: reason.into(),
        }
    }

    /// The fatal error status to put in the TermReq.
    pub fn fes(&self) -> u16 {
        match self {
            DecodeError::InvalidField { .. } => fes::INVALID_HEADER_FIELD,
            DecodeError::Sequence(_) => fes::PDU_SEQUENCE_ERROR,
            DecodeError::HeaderDigest { .. } => fes::HEADER_DIGEST_ERROR,
            DecodeError::DataOutOfRange(_) => fes::DATA_OUT_OF_RANGE,
            DecodeError::DataLimitExceeded(_) => fes::DATA_LIMIT_EXCEEDED,
            DecodeError::Unsupported { .. } => fes::UNSUPPORTED_PARAMETER,
        }
    }

    /// The fatal error information field: the byte offset of the bad field,
    /// or the received digest for a header digest error.
    pub fn fei(&self) -> u32 {
        match self {
            DecodeError::InvalidField { offset, .. } | DecodeError::Unsupported { offset, .. } => {
                *offset
            }
            DecodeError::HeaderDigest { received, .. } => *received,
            _ => 0,
        }
    }
}

/// The common header, as read off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub(crate) pdu_type: u8,
    pub(crate) flags: u8,
    pub(crate) hlen: u8,
    pub(crate) pdo: u8,
    pub(crate) plen: u32,
}

impl CommonHeader {
    pub fn parse(b: &[u8; CH_LEN]) -> Self {
        CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32_at(b, 4),
        }
    }
}

/// Per-connection parameters the receiver validates against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxParams {
    /// Which PDUs we expect to receive.
    pub(crate) direction: Direction,
    /// Whether the connection was initialized (ICReq/ICResp exchanged).
    pub(crate) initialized: bool,
    pub(crate) hdgst: bool,
    pub(crate) ddgst: bool,
    /// The data alignment (0's based dwords) the sender must honour.
    pub(crate) pda: u8,
    /// Largest data payload accepted in one PDU.
    pub(crate) data_len_max: u32,
}

/// Layout of a validated PDU: where its pieces sit inside PLEN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PduLayout {
    pub(crate) ch: CommonHeader,
    pub(crate) hdgst: bool,
    pub(crate) ddgst: bool,
    /// Offset of the data (PDO, or HLEN for TermReqs).
    pub(crate) data_offset: usize,
    pub(crate) data_len: usize,
}

fn expected_hlen(t: u8) -> Option<usize> {
    match t {
        pdu_type::IC_REQ | pdu_type::IC_RESP => Some(IC_LEN),
        pdu_type::CAPSULE_CMD => Some(CAPSULE_CMD_HLEN),
        pdu_type::H2C_TERM_REQ
        | pdu_type::C2H_TERM_REQ
        | pdu_type::CAPSULE_RESP
        | pdu_type::H2C_DATA
        | pdu_type::C2H_DATA
        | pdu_type::R2T => Some(SHORT_HLEN),
        _ => None,
    }
}

fn allowed_flags(t: u8) -> u8 {
    use flags::*;
    match t {
        pdu_type::CAPSULE_CMD => HDGSTF | DDGSTF,
        pdu_type::CAPSULE_RESP | pdu_type::R2T => HDGSTF,
        pdu_type::H2C_DATA => HDGSTF | DDGSTF | LAST_PDU,
        pdu_type::C2H_DATA => HDGSTF | DDGSTF | LAST_PDU | SUCCESS,
        _ => 0,
    }
}

fn may_carry_data(t: u8) -> bool {
    matches!(
        t,
        pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA | pdu_type::C2H_DATA
    )
}

fn is_term_req(t: u8) -> bool {
    matches!(t, pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ)
}

/// Validates the common header against the connection state and computes
/// where header digest, data and data digest lie. Needs only the 8 bytes of
/// the common header, so the receiver knows how much more to read.
///
/// A controller (receiving host-to-controller PDUs) ignores what Linux
/// nvmet and SPDK's nvmf_tgt both ignore and the NVMe/TCP specification
/// leaves to the receiver: reserved FLAGS bits (cleared in the layout),
/// PDO in a PDU without data, and DDGSTF on a CapsuleCmd without data.
/// [`ignored_header_fields`] names them for the controller's log.
pub fn validate_common_header(ch: &CommonHeader, p: &RxParams) -> Result<PduLayout, DecodeError> {
    let lenient = p.direction == Direction::HostToController;
    let mut ch = *ch;
    if lenient {
        ch.flags &= allowed_flags(ch.pdu_type);
    }
    let ch = &ch;
    let t = ch.pdu_type;
    let dir = PduHeader::direction(t)
        .ok_or_else(|| DecodeError::invalid("pdu-type", 0, format!("unknown PDU type {t:#04x}")))?;
    if dir != p.direction {
        return Err(DecodeError::invalid(
            "pdu-type",
            0,
            format!("PDU type {t:#04x} travels the other way"),
        ));
    }
    let is_ic = matches!(t, pdu_type::IC_REQ | pdu_type::IC_RESP);
    if !p.initialized && !is_ic && !is_term_req(t) {
        return Err(DecodeError::Sequence(format!(
            "PDU type {t:#04x} before connection initialization"
        )));
    }
    if p.initialized && is_ic {
        return Err(DecodeError::Sequence(
            "second initialize connection PDU".into(),
        ));
    }
    let hlen = expected_hlen(t).unwrap_or(0);
    if ch.hlen as usize != hlen {
        return Err(DecodeError::invalid(
            "hlen",
            2,
            format!("{} for PDU type {t:#04x}, expected {hlen}", ch.hlen),
        ));
    }
    if ch.flags & !allowed_flags(t) != 0 {
        return Err(DecodeError::invalid(
            "flags",
            1,
            format!("{:#04x} not valid for PDU type {t:#04x}", ch.flags),
        ));
    }
    let plen = ch.plen as usize;
    if is_ic {
        if ch.pdo != 0 && !lenient {
            return Err(DecodeError::invalid("pdo", 3, "must be 0 in ICReq/ICResp"));
        }
        if plen != IC_LEN {
            return Err(DecodeError::invalid(
                "plen",
                4,
                format!("{plen}, ICReq/ICResp are {IC_LEN} bytes"),
            ));
        }
        return Ok(PduLayout {
            ch: *ch,
            hdgst: false,
            ddgst: false,
            data_offset: IC_LEN,
            data_len: 0,
        });
    }
    if is_term_req(t) {
        if ch.pdo != 0 && !lenient {
            return Err(DecodeError::invalid("pdo", 3, "must be 0 in a TermReq"));
        }
        if !(SHORT_HLEN..=SHORT_HLEN + TERM_REQ_DATA_MAX).contains(&plen) {
            return Err(DecodeError::invalid(
                "plen",
                4,
                format!("{plen} out of range for a TermReq"),
            ));
        }
        return Ok(PduLayout {
            ch: *ch,
            hdgst: false,
            ddgst: false,
            data_offset: SHORT_HLEN,
            data_len: plen - SHORT_HLEN,
        });
    }
    let hdgst = ch.flags & flags::HDGSTF != 0;
    if hdgst != p.hdgst {
        return Err(DecodeError::invalid(
            "flags",
            1,
            format!(
                "HDGSTF is {} but header digests were negotiated {}",
                hdgst,
                if p.hdgst { "on" } else { "off" }
            ),
        ));
    }
    let hdgst_len = if hdgst { DIGEST_LEN } else { 0 };
    let header_end = hlen + hdgst_len;
    if plen < header_end {
        return Err(DecodeError::invalid(
            "plen",
            4,
            format!("{plen} shorter than the header ({header_end})"),
        ));
    }
    let ddgst = ch.flags & flags::DDGSTF != 0;
    if !may_carry_data(t) {
        if ch.pdo != 0 {
            return Err(DecodeError::invalid(
                "pdo",
                3,
                format!("{} in a PDU without data", ch.pdo),
            ));
        }
        if plen != header_end {
            return Err(DecodeError::invalid(
                "plen",
                4,
                format!("{plen}, expected {header_end}"),
            ));
        }
        return Ok(PduLayout {
            ch: *ch,
            hdgst,
            ddgst: false,
            data_offset: header_end,
            data_len: 0,
        });
    }
    if plen == header_end {
        // No data (a CapsuleCmd without in-capsule data).
        if t != pdu_type::CAPSULE_CMD {
            return Err(DecodeError::invalid("plen", 4, "data PDU without data"));
        }
        if ch.pdo != 0 && !lenient {
            return Err(DecodeError::invalid(
                "pdo",
                3,
                format!("{} in a capsule without data", ch.pdo),
            ));
        }
        if ddgst && !lenient {
            return Err(DecodeError::invalid(
                "flags",
                1,
                "DDGSTF set on a capsule without data",
            ));
        }
        return Ok(PduLayout {
            ch: *ch,
            hdgst,
            ddgst: false,
            data_offset: header_end,
            data_len: 0,
        });
    }
    if ddgst != p.ddgst {
        return Err(DecodeError::invalid(
            "flags",
            1,
            format!(
                "DDGSTF is {} but data digests were negotiated {}",
                ddgst,
                if p.ddgst { "on" } else { "off" }
            ),
        ));
    }
    let pdo = ch.pdo as usize;
    let align = (p.pda as usize + 1) * 4;
    if pdo < header_end || !pdo.is_multiple_of(align) {
        return Err(DecodeError::invalid(
            "pdo",
            3,
            format!("{pdo}: data must start at a multiple of {align} at or after the header end ({header_end})"),
        ));
    }
    let ddgst_len = if ddgst { DIGEST_LEN } else { 0 };
    if plen < pdo + ddgst_len + 1 {
        return Err(DecodeError::invalid(
            "plen",
            4,
            format!("{plen} leaves no data after PDO {pdo}"),
        ));
    }
    let data_len = plen - pdo - ddgst_len;
    if data_len > p.data_len_max as usize {
        let msg = format!("{data_len} data bytes in one PDU, limit {}", p.data_len_max);
        // Host-to-controller data beyond what the controller advertised
        // (MAXH2CDATA, in-capsule size) is FES 05h, as in SPDK.
        return Err(if matches!(t, pdu_type::H2C_DATA | pdu_type::CAPSULE_CMD) {
            DecodeError::DataLimitExceeded(msg)
        } else {
            DecodeError::invalid("plen", 4, msg)
        });
    }
    Ok(PduLayout {
        ch: *ch,
        hdgst,
        ddgst,
        data_offset: pdo,
        data_len,
    })
}

/// A header field that [`validate_common_header`] and the header decode
/// ignore in a host-to-controller PDU (as Linux nvmet and SPDK do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoredField {
    /// Non-zero reserved bits or bytes of an ICReq (DGST bits 7:2, bytes
    /// 16-127) or an H2CData (bytes 20-23).
    ReservedBytes,
    /// Reserved FLAGS bits.
    ReservedFlags,
    /// PDO in a PDU without data.
    OffsetWithoutData,
    /// DDGSTF on a capsule without data.
    DdgstfWithoutData,
}

/// The fields of host-to-controller PDU header `raw` (at least the common
/// header), carrying `data_len` bytes of data, that were ignored.
pub fn ignored_header_fields(raw: &[u8], data_len: usize) -> impl Iterator<Item = IgnoredField> {
    let (t, f, pdo) = match *raw {
        [t, f, _, pdo, ..] => (t, f, pdo),
        _ => (pdu_type::IC_REQ, 0, 0),
    };
    let no_data = data_len == 0 || is_term_req(t);
    let capsule_ddgstf = t == pdu_type::CAPSULE_CMD && data_len == 0 && f & flags::DDGSTF != 0;
    let nonzero = |from: usize, to: usize| {
        raw.get(from..to.min(raw.len()))
            .is_some_and(|b| b.iter().any(|x| *x != 0))
    };
    let reserved = match t {
        pdu_type::IC_REQ => raw.get(11).is_some_and(|d| d & !0x3 != 0) || nonzero(16, IC_LEN),
        pdu_type::H2C_DATA => nonzero(20, 24),
        _ => false,
    };
    [
        (IgnoredField::ReservedBytes, reserved),
        (IgnoredField::ReservedFlags, f & !allowed_flags(t) != 0),
        (IgnoredField::OffsetWithoutData, pdo != 0 && no_data),
        (IgnoredField::DdgstfWithoutData, capsule_ddgstf),
    ]
    .into_iter()
    .filter_map(|(n, on)| on.then_some(n))
}

fn check_reserved(h: &[u8], from: usize, to: usize) -> Result<(), DecodeError> {
    match h[from..to].iter().position(|&b| b != 0) {
        Some(i) => Err(DecodeError::invalid(
            "reserved",
            from + i,
            "reserved byte not zero",
        )),
        None => Ok(()),
    }
}

/// Decodes the PDU-specific header. `h` is the header (HLEN bytes), `data`
/// the PDU's data (needed only for TermReqs, whose data is part of the message).
pub fn decode_specific(
    layout: &PduLayout,
    h: &[u8],
    data: &[u8],
) -> Result<PduHeader, DecodeError> {
    let t = layout.ch.pdu_type;
    debug_assert!(h.len() >= layout.ch.hlen as usize);
    Ok(match t {
        pdu_type::IC_REQ | pdu_type::IC_RESP => {
            let pfv = u16_at(h, 8);
            if pfv != 0 {
                return Err(DecodeError::Unsupported {
                    field: "pfv",
                    offset: 8,
                    reason: format!("PDU format version {pfv}, only 0 (1.0) is supported"),
                });
            }
            let pda = h[10];
            if pda > 31 {
                return Err(DecodeError::invalid(
                    if t == pdu_type::IC_REQ {
                        "hpda"
                    } else {
                        "cpda"
                    },
                    10,
                    format!("{pda} > 31"),
                ));
            }
            let dgst = h[11];
            // Reserved bits and bytes of an ICReq are the controller's to
            // ignore (as nvmet and nvmf_tgt do; see `ignored_header_fields`).
            let lenient = t == pdu_type::IC_REQ;
            if dgst & !0x3 != 0 && !lenient {
                return Err(DecodeError::invalid(
                    "dgst",
                    11,
                    format!("{dgst:#04x} has reserved bits"),
                ));
            }
            let v = u32_at(h, 12);
            if !lenient {
                check_reserved(h, 16, IC_LEN)?;
            }
            if t == pdu_type::IC_REQ {
                PduHeader::IcReq(IcReq {
                    pfv,
                    hpda: pda,
                    hdgst: dgst & 1 != 0,
                    ddgst: dgst & 2 != 0,
                    maxr2t: v,
                })
            } else {
                if v < 4096 || !v.is_multiple_of(4) {
                    return Err(DecodeError::invalid(
                        "maxh2cdata",
                        12,
                        format!("{v} is below 4096 or not dword aligned"),
                    ));
                }
                PduHeader::IcResp(IcResp {
                    pfv,
                    cpda: pda,
                    hdgst: dgst & 1 != 0,
                    ddgst: dgst & 2 != 0,
                    maxh2cdata: v,
                })
            }
        }
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => {
            let tr = TermReq {
                fes: u16_at(h, 8),
                fei: u32_at(h, 10),
                data: data.to_vec(),
            };
            if t == pdu_type::H2C_TERM_REQ {
                PduHeader::H2CTermReq(tr)
            } else {
                PduHeader::C2HTermReq(tr)
            }
        }
        pdu_type::CAPSULE_CMD => {
            let mut sqe = [0u8; 64];
            sqe.copy_from_slice(&h[8..72]);
            PduHeader::CapsuleCmd(Sqe(sqe))
        }
        pdu_type::CAPSULE_RESP => {
            let mut cqe = [0u8; 16];
            cqe.copy_from_slice(&h[8..24]);
            PduHeader::CapsuleResp(Cqe::decode(&cqe))
        }
        pdu_type::H2C_DATA | pdu_type::C2H_DATA => {
            let len = u32_at(h, 16);
            if len as usize != layout.data_len {
                return Err(DecodeError::invalid(
                    "datal",
                    16,
                    format!("{len}, but the PDU carries {} bytes", layout.data_len),
                ));
            }
            if t == pdu_type::C2H_DATA {
                check_reserved(h, 10, 12)?;
                check_reserved(h, 20, 24)?;
            }
            let f = layout.ch.flags;
            let success = f & flags::SUCCESS != 0;
            if success && f & flags::LAST_PDU == 0 {
                return Err(DecodeError::invalid("flags", 1, "SUCCESS without LAST_PDU"));
            }
            let dh = DataHeader {
                cccid: u16_at(h, 8),
                ttag: if t == pdu_type::H2C_DATA {
                    u16_at(h, 10)
                } else {
                    0
                },
                offset: u32_at(h, 12),
                len,
                last: f & flags::LAST_PDU != 0,
                success,
            };
            if t == pdu_type::H2C_DATA {
                PduHeader::H2CData(dh)
            } else {
                PduHeader::C2HData(dh)
            }
        }
        pdu_type::R2T => {
            check_reserved(h, 20, 24)?;
            let r = R2t {
                cccid: u16_at(h, 8),
                ttag: u16_at(h, 10),
                offset: u32_at(h, 12),
                len: u32_at(h, 16),
            };
            if r.len == 0 {
                return Err(DecodeError::invalid("r2tl", 16, "R2T for zero bytes"));
            }
            PduHeader::R2t(r)
        }
        _ => {
            return Err(DecodeError::invalid(
                "pdu-type",
                0,
                format!("unknown PDU type {t:#04x}"),
            ))
        }
    })
}

/// Parameters for encoding PDUs on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxParams {
    pub hdgst: bool,
    pub ddgst: bool,
    /// Data alignment the receiver asked for (0's based dwords).
    pub pda: u8,
}

/// Encodes the header part of a PDU (common header, PDU-specific header,
/// header digest and padding) for a PDU carrying `data_len` bytes of data, and
/// returns the number of bytes a data digest adds after the data (0 or 4).
/// The caller sends the data and then, if that number is 4, the digest of it.
pub fn encode_prefix(h: &PduHeader, data_len: usize, p: &TxParams, out: &mut Vec<u8>) -> usize {
    let t = h.pdu_type();
    let hlen = expected_hlen(t).unwrap_or(SHORT_HLEN);
    let start = out.len();
    out.resize(start + hlen, 0);
    let mut flags_v = 0u8;
    let (hdgst, ddgst, pdo, plen);
    match h {
        PduHeader::IcReq(_)
        | PduHeader::IcResp(_)
        | PduHeader::H2CTermReq(_)
        | PduHeader::C2HTermReq(_) => {
            hdgst = false;
            ddgst = false;
            pdo = 0;
            plen = hlen + data_len;
        }
        _ => {
            hdgst = p.hdgst;
            let header_end = hlen + if hdgst { DIGEST_LEN } else { 0 };
            ddgst = p.ddgst && data_len > 0;
            if data_len > 0 {
                let align = (p.pda as usize + 1) * 4;
                pdo = header_end.next_multiple_of(align);
            } else {
                pdo = 0;
            }
            plen = if data_len > 0 {
                pdo + data_len + if ddgst { DIGEST_LEN } else { 0 }
            } else {
                header_end
            };
        }
    }
    if hdgst {
        flags_v |= flags::HDGSTF;
    }
    if ddgst {
        flags_v |= flags::DDGSTF;
    }
    // HLEN is at most 128 and PDO at most 128 (headers with their digest end
    // by byte 76, rounded up to an alignment of at most 128 bytes since the
    // decoder refuses a PDA above 31). The data
    // length is the caller's contract: one PDU carries less than 4 GiB
    // (MAXH2CDATA, MDTS and the C2H chunk size are all u32).
    debug_assert!(hlen <= 255 && pdo <= 255, "hlen {hlen} pdo {pdo}");
    debug_assert!(u32::try_from(plen).is_ok(), "PDU of {plen} bytes");
    #[allow(clippy::cast_possible_truncation)]
    let (hlen8, pdo8, plen32, datal) = (hlen as u8, pdo as u8, plen as u32, data_len as u32);
    let b = &mut out[start..];
    match h {
        PduHeader::IcReq(r) => {
            put_u16(b, 8, r.pfv);
            b[10] = r.hpda;
            b[11] = r.hdgst as u8 | ((r.ddgst as u8) << 1);
            put_u32(b, 12, r.maxr2t);
        }
        PduHeader::IcResp(r) => {
            put_u16(b, 8, r.pfv);
            b[10] = r.cpda;
            b[11] = r.hdgst as u8 | ((r.ddgst as u8) << 1);
            put_u32(b, 12, r.maxh2cdata);
        }
        PduHeader::H2CTermReq(r) | PduHeader::C2HTermReq(r) => {
            put_u16(b, 8, r.fes);
            put_u32(b, 10, r.fei);
        }
        PduHeader::CapsuleCmd(sqe) => b[8..72].copy_from_slice(&sqe.0),
        PduHeader::CapsuleResp(cqe) => b[8..24].copy_from_slice(&cqe.encode()),
        PduHeader::H2CData(d) | PduHeader::C2HData(d) => {
            put_u16(b, 8, d.cccid);
            if t == pdu_type::H2C_DATA {
                put_u16(b, 10, d.ttag);
            }
            put_u32(b, 12, d.offset);
            put_u32(b, 16, datal);
            if d.last {
                flags_v |= flags::LAST_PDU;
            }
            if d.success && t == pdu_type::C2H_DATA {
                flags_v |= flags::SUCCESS | flags::LAST_PDU;
            }
        }
        PduHeader::R2t(r) => {
            put_u16(b, 8, r.cccid);
            put_u16(b, 10, r.ttag);
            put_u32(b, 12, r.offset);
            put_u32(b, 16, r.len);
        }
    }
    b[0] = t;
    b[1] = flags_v;
    b[2] = hlen8;
    b[3] = pdo8;
    put_u32(b, 4, plen32);
    if hdgst {
        let d = crc32c(&out[start..start + hlen]);
        out.extend_from_slice(&d.to_le_bytes());
    }
    if pdo > 0 {
        out.resize(start + pdo, 0);
    }
    if ddgst {
        DIGEST_LEN
    } else {
        0
    }
}

/// Encodes a whole PDU with its data into `out`.
pub fn encode_pdu(h: &PduHeader, data: &[u8], p: &TxParams, out: &mut Vec<u8>) {
    let dd = encode_prefix(h, data.len(), p, out);
    out.extend_from_slice(data);
    if dd > 0 {
        out.extend_from_slice(&crc32c(data).to_le_bytes());
    }
}

/// Builds the TermReq that reports `err`, quoting the offending header.
pub fn term_req_for(err: &DecodeError, offending_header: &[u8]) -> TermReq {
    let n = offending_header.len().min(TERM_REQ_DATA_MAX);
    TermReq {
        fes: err.fes(),
        fei: err.fei(),
        data: offending_header[..n].to_vec(),
    }
}
