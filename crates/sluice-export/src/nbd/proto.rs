//! The NBD protocol, sans-IO: the fixed newstyle handshake
//! ([`ServerHandshake`]: options, structured replies, the `base:allocation`
//! meta context), request decoding and validation ([`RequestDecoder`],
//! [`validate_in`]), and simple and structured reply encoding.
//!
//! Nothing here touches a socket: the I/O layer feeds received bytes in and
//! writes the bytes [`ServerHandshake::take_output`] hands out. Malformed
//! input yields an error value, never a panic.

use crate::errno::{EINVAL, ENOSPC, EPERM};
use sluice_runtime::cast::usize_from;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags (server → client).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) | 9;

/// Information types of NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// BLOCK_STATUS: one descriptor is enough.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

/// Structured replies.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// The one meta context served: which ranges hold data.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
/// Its context id in this server's replies.
pub const META_BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` flags of a block status descriptor.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
/// Queries accepted in one LIST/SET_META_CONTEXT.
pub const META_QUERIES_MAX: u32 = 128;

/// Option payloads larger than this are answered with NBD_REP_ERR_TOO_BIG
/// and skipped (names are at most 4096 bytes by the spec).
pub const OPTION_PAYLOAD_BYTES_MAX: u32 = 16 * 1024;
/// Options accepted before the handshake is abandoned (a client looping on
/// NBD_OPT_LIST forever is cut off).
pub const OPTIONS_MAX: u32 = 1024;
/// Largest read/write/trim/write-zeroes payload accepted per request.
pub const REQUEST_BYTES_MAX: u32 = 32 << 20;
pub const REQUEST_HEADER_BYTES: usize = 28;
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;

/// What a client sees of the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub read_only: bool,
    /// Block size advertised as the preferred size (the namespace's).
    pub preferred_block_bytes: u32,
}

impl ExportInfo {
    /// Transmission flags for this export.
    pub fn transmission_flags(&self) -> u16 {
        let mut f = TFLAG_HAS_FLAGS
            | TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            | TFLAG_SEND_TRIM
            | TFLAG_SEND_WRITE_ZEROES
            | TFLAG_CAN_MULTI_CONN;
        if self.read_only {
            f |= TFLAG_READ_ONLY;
        }
        f
    }
    /// `name` selects this export ("" is the default export).
    pub fn matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

/// Handshake failures; each ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("client flags {0:#x} include unknown bits")]
    BadClientFlags(u32),
    #[error("client did not set NBD_FLAG_C_FIXED_NEWSTYLE")]
    NotFixedNewstyle,
    #[error("option magic {0:#x} is not IHAVEOPT")]
    BadOptionMagic(u64),
    #[error("NBD_OPT_EXPORT_NAME for unknown export `{0}`")]
    UnknownExport(String),
    #[error("more than {OPTIONS_MAX} options")]
    TooManyOptions,
}

/// Where the handshake stands after [`ServerHandshake::process`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeStatus {
    /// More input is needed.
    NeedMore,
    /// Transmission phase starts; bytes after the last option are returned.
    Done { leftover: Vec<u8> },
    /// The client sent NBD_OPT_ABORT (the ACK is in the output).
    Aborted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ClientFlags,
    Options,
    /// Skipping the rest of an oversized option.
    Discard(u64),
    Finished,
}

/// The server side of the fixed newstyle handshake.
#[derive(Debug)]
pub struct ServerHandshake {
    /// Every export served; the empty name selects the first.
    exports: Vec<ExportInfo>,
    /// Index of the export chosen by GO / EXPORT_NAME.
    selected: usize,
    input: Vec<u8>,
    output: Vec<u8>,
    phase: Phase,
    no_zeroes: bool,
    options_seen: u32,
    /// NBD_OPT_STRUCTURED_REPLY was acknowledged.
    structured: bool,
    /// Whether NBD_OPT_STRUCTURED_REPLY is acknowledged at all (see
    /// [`ServerHandshake::offering_structured_replies`]).
    offer_structured: bool,
    /// The export whose `base:allocation` context NBD_OPT_SET_META_CONTEXT
    /// selected (it applies only if NBD_OPT_GO picks the same export).
    allocation_context_for: Option<usize>,
}

/// What a connection negotiated in its handshake, which decides the
/// commands it may send and how replies are framed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session {
    /// Structured replies (reads and block status are answered in chunks).
    pub structured: bool,
    /// The `base:allocation` meta context is selected: BLOCK_STATUS works.
    pub base_allocation: bool,
    /// The export's size as the handshake told the client (an export whose
    /// namespace grew since the server started tells later clients more);
    /// `None`: the [`ExportInfo`]'s.
    pub size_bytes: Option<u64>,
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// The export `name` selects (`""`: the first).
fn find_export(exports: &[ExportInfo], name: &[u8]) -> Option<usize> {
    if name.is_empty() {
        return Some(0);
    }
    exports.iter().position(|e| e.matches(name))
}

/// Encodes an option reply.
///
/// Option replies are small (export names and descriptions, info blocks):
/// `data` is under 4 GiB.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    debug_assert!(u32::try_from(data.len()).is_ok());
    #[allow(clippy::cast_possible_truncation)]
    let len = data.len() as u32;
    out.extend_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
}

impl ServerHandshake {
    /// Starts a handshake; the greeting is queued as output.
    pub fn new(export: ExportInfo) -> ServerHandshake {
        Self::with_exports(vec![export])
    }

    /// A handshake offering several exports (chosen by name; `""` is the
    /// first). `exports` must not be empty.
    pub fn with_exports(exports: Vec<ExportInfo>) -> ServerHandshake {
        assert!(!exports.is_empty(), "an NBD server needs an export");
        let mut output = Vec::with_capacity(18);
        output.extend_from_slice(&NBDMAGIC.to_be_bytes());
        output.extend_from_slice(&IHAVEOPT.to_be_bytes());
        output.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        ServerHandshake {
            exports,
            selected: 0,
            input: Vec::new(),
            output,
            phase: Phase::ClientFlags,
            no_zeroes: false,
            options_seen: 0,
            structured: false,
            offer_structured: true,
            allocation_context_for: None,
        }
    }

    /// Whether to acknowledge NBD_OPT_STRUCTURED_REPLY (the default) or
    /// refuse it with NBD_REP_ERR_POLICY. Refused, every reply is simple:
    /// no block status, no holes, no error messages, but libnbd reads a
    /// simple read reply in one fewer `recv` (docs/exports.md measures what
    /// that buys). Set before the first option is processed.
    pub fn offering_structured_replies(mut self, offer: bool) -> ServerHandshake {
        self.offer_structured = offer;
        self
    }

    /// Index (in the list given to [`Self::with_exports`]) of the export the
    /// client chose; meaningful once the handshake is `Done`.
    pub fn selected(&self) -> usize {
        self.selected
    }

    /// What the finished handshake negotiated for the selected export.
    pub fn session(&self) -> Session {
        Session {
            structured: self.structured,
            base_allocation: self.structured && self.allocation_context_for == Some(self.selected),
            size_bytes: self.exports.get(self.selected).map(|e| e.size_bytes),
        }
    }

    /// Appends received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        self.input.extend_from_slice(data);
    }

    /// Bytes to send to the client.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Consumes as many complete messages as are buffered.
    pub fn process(&mut self) -> Result<HandshakeStatus, HandshakeError> {
        let mut pos = 0;
        let r = loop {
            let avail = &self.input[pos..];
            match self.phase {
                Phase::Finished => break Ok(HandshakeStatus::NeedMore),
                Phase::ClientFlags => {
                    if avail.len() < 4 {
                        break Ok(HandshakeStatus::NeedMore);
                    }
                    let f = be_u32(avail, 0);
                    pos += 4;
                    if f & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        break Err(HandshakeError::BadClientFlags(f));
                    }
                    if f & FLAG_C_FIXED_NEWSTYLE == 0 {
                        break Err(HandshakeError::NotFixedNewstyle);
                    }
                    self.no_zeroes = f & FLAG_C_NO_ZEROES != 0;
                    self.phase = Phase::Options;
                }
                Phase::Discard(n) => {
                    let k = (avail.len() as u64).min(n);
                    pos += usize_from(k);
                    if k == n {
                        self.phase = Phase::Options;
                    } else {
                        self.phase = Phase::Discard(n - k);
                        break Ok(HandshakeStatus::NeedMore);
                    }
                }
                Phase::Options => {
                    if avail.len() < 16 {
                        break Ok(HandshakeStatus::NeedMore);
                    }
                    let magic = be_u64(avail, 0);
                    if magic != IHAVEOPT {
                        break Err(HandshakeError::BadOptionMagic(magic));
                    }
                    self.options_seen += 1;
                    if self.options_seen > OPTIONS_MAX {
                        break Err(HandshakeError::TooManyOptions);
                    }
                    let option = be_u32(avail, 8);
                    let len = be_u32(avail, 12);
                    if len > OPTION_PAYLOAD_BYTES_MAX {
                        pos += 16;
                        encode_option_reply(
                            &mut self.output,
                            option,
                            REP_ERR_TOO_BIG,
                            b"option too large",
                        );
                        self.phase = Phase::Discard(len as u64);
                        continue;
                    }
                    if avail.len() < 16 + len as usize {
                        break Ok(HandshakeStatus::NeedMore);
                    }
                    let data = avail[16..16 + len as usize].to_vec();
                    pos += 16 + len as usize;
                    match self.option(option, &data) {
                        Ok(None) => {}
                        Ok(Some(HandshakeStatus::Done { .. })) => {
                            self.phase = Phase::Finished;
                            break Ok(HandshakeStatus::Done {
                                leftover: self.input[pos..].to_vec(),
                            });
                        }
                        Ok(Some(s)) => {
                            self.phase = Phase::Finished;
                            break Ok(s);
                        }
                        Err(e) => break Err(e),
                    }
                }
            }
        };
        self.input.drain(..pos.min(self.input.len()));
        if r.is_err() {
            self.phase = Phase::Finished;
        }
        r
    }

    fn info_export(&self, i: usize) -> Vec<u8> {
        let e = &self.exports[i];
        let mut d = Vec::with_capacity(12);
        d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        d.extend_from_slice(&e.size_bytes.to_be_bytes());
        d.extend_from_slice(&e.transmission_flags().to_be_bytes());
        d
    }

    fn option(
        &mut self,
        option: u32,
        data: &[u8],
    ) -> Result<Option<HandshakeStatus>, HandshakeError> {
        let out = &mut self.output;
        match option {
            OPT_EXPORT_NAME => {
                let Some(i) = find_export(&self.exports, data) else {
                    return Err(HandshakeError::UnknownExport(
                        String::from_utf8_lossy(data).into_owned(),
                    ));
                };
                self.selected = i;
                let e = &self.exports[i];
                out.extend_from_slice(&e.size_bytes.to_be_bytes());
                out.extend_from_slice(&e.transmission_flags().to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                Ok(Some(HandshakeStatus::Done { leftover: vec![] }))
            }
            OPT_ABORT => {
                encode_option_reply(out, option, REP_ACK, &[]);
                Ok(Some(HandshakeStatus::Aborted))
            }
            OPT_LIST => {
                if !data.is_empty() {
                    encode_option_reply(
                        out,
                        option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_LIST takes no data",
                    );
                    return Ok(None);
                }
                for e in &self.exports {
                    let name = e.name.as_bytes();
                    let mut d = Vec::with_capacity(4 + name.len());
                    // Export names come from our own configuration and are
                    // short (NBD limits them to 4096 bytes).
                    debug_assert!(name.len() <= 4096);
                    #[allow(clippy::cast_possible_truncation)]
                    let name_len = name.len() as u32;
                    d.extend_from_slice(&name_len.to_be_bytes());
                    d.extend_from_slice(name);
                    d.extend_from_slice(e.description.as_bytes());
                    encode_option_reply(out, option, REP_SERVER, &d);
                }
                encode_option_reply(out, option, REP_ACK, &[]);
                Ok(None)
            }
            OPT_INFO | OPT_GO => {
                let Some((name, requests)) = parse_info_request(data) else {
                    encode_option_reply(out, option, REP_ERR_INVALID, b"malformed NBD_OPT_INFO/GO");
                    return Ok(None);
                };
                let Some(i) = find_export(&self.exports, name) else {
                    encode_option_reply(out, option, REP_ERR_UNKNOWN, b"no such export");
                    return Ok(None);
                };
                let export = self.info_export(i);
                let e = self.exports[i].clone();
                encode_option_reply(&mut self.output, option, REP_INFO, &export);
                // Always sent: minimum 1 (sub-block I/O is done by
                // read-modify-write), preferred = the namespace block size.
                let mut bsz = Vec::with_capacity(14);
                bsz.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                bsz.extend_from_slice(&1u32.to_be_bytes());
                bsz.extend_from_slice(&e.preferred_block_bytes.max(512).to_be_bytes());
                bsz.extend_from_slice(&REQUEST_BYTES_MAX.to_be_bytes());
                encode_option_reply(&mut self.output, option, REP_INFO, &bsz);
                if requests.contains(&INFO_NAME) {
                    let mut d = INFO_NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(e.name.as_bytes());
                    encode_option_reply(&mut self.output, option, REP_INFO, &d);
                }
                if requests.contains(&INFO_DESCRIPTION) && !e.description.is_empty() {
                    let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
                    d.extend_from_slice(e.description.as_bytes());
                    encode_option_reply(&mut self.output, option, REP_INFO, &d);
                }
                encode_option_reply(&mut self.output, option, REP_ACK, &[]);
                if option == OPT_GO {
                    self.selected = i;
                    Ok(Some(HandshakeStatus::Done { leftover: vec![] }))
                } else {
                    Ok(None)
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !self.offer_structured {
                    encode_option_reply(
                        out,
                        option,
                        REP_ERR_POLICY,
                        b"structured replies are switched off on this server",
                    );
                } else if data.is_empty() {
                    self.structured = true;
                    encode_option_reply(out, option, REP_ACK, &[]);
                } else {
                    encode_option_reply(
                        out,
                        option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                }
                Ok(None)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data);
                Ok(None)
            }
            OPT_STARTTLS => {
                encode_option_reply(out, option, REP_ERR_UNSUP, b"not supported");
                Ok(None)
            }
            _ => {
                encode_option_reply(out, option, REP_ERR_UNSUP, b"unknown option");
                Ok(None)
            }
        }
    }
}

/// Parses NBD_OPT_INFO/GO data: name and information requests; `None` if
/// the lengths do not add up exactly.
impl ServerHandshake {
    /// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT: the only
    /// context is `base:allocation`. LIST with no query, or the query
    /// `base:`, lists it; SET selects it when asked by its full name, and
    /// needs structured replies first. Queries for other contexts match
    /// nothing (no reply for them), as the protocol asks.
    fn meta_context(&mut self, option: u32, data: &[u8]) {
        let out = &mut self.output;
        let Some((name, queries)) = parse_meta_request(data) else {
            encode_option_reply(
                out,
                option,
                REP_ERR_INVALID,
                b"malformed meta context request",
            );
            return;
        };
        let Some(i) = find_export(&self.exports, name) else {
            encode_option_reply(out, option, REP_ERR_UNKNOWN, b"no such export");
            return;
        };
        let set = option == OPT_SET_META_CONTEXT;
        if set && !self.structured {
            encode_option_reply(
                out,
                option,
                REP_ERR_INVALID,
                b"NBD_OPT_SET_META_CONTEXT needs structured replies first",
            );
            return;
        }
        let full = META_BASE_ALLOCATION.as_bytes();
        let matches = if set {
            queries.contains(&full)
        } else {
            queries.is_empty() || queries.iter().any(|q| *q == b"base:" || *q == full)
        };
        if set {
            // Each SET replaces the previous selection.
            self.allocation_context_for = matches.then_some(i);
        }
        if matches {
            let id = if set { META_BASE_ALLOCATION_ID } else { 0 };
            let mut d = id.to_be_bytes().to_vec();
            d.extend_from_slice(full);
            encode_option_reply(out, option, REP_META_CONTEXT, &d);
        }
        encode_option_reply(out, option, REP_ACK, &[]);
    }
}

/// A LIST/SET_META_CONTEXT payload: export name, then queries.
fn parse_meta_request(d: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    let nlen = usize_from(u64::from(be_u32(d.get(..4)?, 0)));
    let rest = d.get(4..)?;
    let name = rest.get(..nlen)?;
    let mut rest = rest.get(nlen..)?;
    let n = be_u32(rest.get(..4)?, 0);
    if n > META_QUERIES_MAX {
        return None;
    }
    rest = rest.get(4..)?;
    let mut queries = Vec::with_capacity(usize_from(u64::from(n)));
    for _ in 0..n {
        let qlen = usize_from(u64::from(be_u32(rest.get(..4)?, 0)));
        let end = qlen.checked_add(4)?;
        queries.push(rest.get(4..end)?);
        rest = rest.get(end..)?;
    }
    rest.is_empty().then_some((name, queries))
}

fn parse_info_request(d: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    if d.len() < 4 {
        return None;
    }
    let nlen = be_u32(d, 0) as usize;
    let rest = d.get(4..)?;
    let name = rest.get(..nlen)?;
    let rest = rest.get(nlen..)?;
    if rest.len() < 2 {
        return None;
    }
    let n = be_u16(rest, 0) as usize;
    let reqs = rest.get(2..)?;
    if reqs.len() != n * 2 {
        return None;
    }
    Some((name, reqs.chunks_exact(2).map(|c| be_u16(c, 0)).collect()))
}

/// A request header as sent by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
    /// Bytes of payload that follow this header on the wire.
    pub fn payload_bytes(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.length
        } else {
            0
        }
    }
}

/// Transmission errors after which the stream cannot be resynchronised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransmissionError {
    #[error("request magic {0:#x} is wrong")]
    BadMagic(u32),
    /// A write whose payload exceeds the limit: EINVAL is sent for `cookie`,
    /// then the connection is closed rather than reading the payload.
    #[error("write of {length} bytes exceeds the {REQUEST_BYTES_MAX} byte limit")]
    WriteTooLarge { cookie: u64, length: u32 },
}

/// One decoded request: the header and, for writes, the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    pub header: RequestHeader,
    pub payload: Vec<u8>,
}

/// Streaming request decoder.
#[derive(Debug, Default)]
pub struct RequestDecoder {
    buf: Vec<u8>,
    pos: usize,
    failed: bool,
}

impl RequestDecoder {
    pub fn new() -> RequestDecoder {
        RequestDecoder::default()
    }
    pub fn feed(&mut self, data: &[u8]) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }
    /// Buffered bytes not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// The next complete request, `None` if more bytes are needed. Errors
    /// are sticky.
    pub fn next_request(&mut self) -> Result<Option<Incoming>, TransmissionError> {
        if self.failed {
            return Err(TransmissionError::BadMagic(0));
        }
        let avail = &self.buf[self.pos..];
        if avail.len() < REQUEST_HEADER_BYTES {
            return Ok(None);
        }
        let magic = be_u32(avail, 0);
        let header = RequestHeader {
            flags: be_u16(avail, 4),
            kind: be_u16(avail, 6),
            cookie: be_u64(avail, 8),
            offset: be_u64(avail, 16),
            length: be_u32(avail, 24),
        };
        if magic != REQUEST_MAGIC {
            self.failed = true;
            return Err(TransmissionError::BadMagic(magic));
        }
        let plen = header.payload_bytes();
        if plen > REQUEST_BYTES_MAX {
            self.failed = true;
            return Err(TransmissionError::WriteTooLarge {
                cookie: header.cookie,
                length: plen,
            });
        }
        let need = REQUEST_HEADER_BYTES + plen as usize;
        if avail.len() < need {
            return Ok(None);
        }
        let payload = avail[REQUEST_HEADER_BYTES..need].to_vec();
        self.pos += need;
        Ok(Some(Incoming { header, payload }))
    }
}

/// A validated command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
    },
    /// Which ranges hold data (`base:allocation`); `one`: a single
    /// descriptor is enough (NBD_CMD_FLAG_REQ_ONE).
    BlockStatus {
        offset: u64,
        length: u32,
        one: bool,
    },
    Disconnect,
}

/// A request refused before any I/O, with the errno for the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub errno: u32,
    pub(crate) reason: &'static str,
}

fn refuse(errno: u32, reason: &'static str) -> Refusal {
    Refusal { errno, reason }
}

/// Checks a request against the export:
///
/// * unknown command or flag, FUA/NO_HOLE where not allowed, a non-zero
///   offset or length on FLUSH/DISC, zero length, or length over
///   [`REQUEST_BYTES_MAX`]: `EINVAL`;
/// * WRITE/TRIM/WRITE_ZEROES on a read-only export: `EPERM`;
/// * a range past the end: `ENOSPC` for WRITE/WRITE_ZEROES, `EINVAL` for
///   READ/TRIM.
///
/// This is a connection that negotiated only simple replies; see
/// [`validate_in`].
pub fn validate(h: &RequestHeader, export: &ExportInfo) -> Result<Command, Refusal> {
    validate_in(h, export, Session::default())
}

/// [`validate`] for a connection that negotiated `session`: BLOCK_STATUS
/// needs the `base:allocation` context (else `EINVAL`) and may carry
/// REQ_ONE; its range is checked like a read's.
pub fn validate_in(
    h: &RequestHeader,
    export: &ExportInfo,
    session: Session,
) -> Result<Command, Refusal> {
    let known_flags = match h.kind {
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM => CMD_FLAG_FUA,
        CMD_BLOCK_STATUS if session.base_allocation => CMD_FLAG_REQ_ONE,
        CMD_BLOCK_STATUS => return Err(refuse(EINVAL, "no meta context was selected")),
        CMD_DISC => 0,
        _ => return Err(refuse(EINVAL, "unknown command")),
    };
    if h.flags & !known_flags != 0 {
        return Err(refuse(EINVAL, "unsupported command flags"));
    }
    let fua = h.flags & CMD_FLAG_FUA != 0;
    match h.kind {
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH => {
            if h.offset != 0 || h.length != 0 {
                return Err(refuse(EINVAL, "flush with offset or length"));
            }
            return Ok(Command::Flush);
        }
        _ => {}
    }
    let writes = matches!(h.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && export.read_only {
        return Err(refuse(EPERM, "export is read-only"));
    }
    if h.length == 0 {
        return Err(refuse(EINVAL, "zero length"));
    }
    // Trim and write-zeroes carry no payload, but the same cap keeps one
    // request's work bounded. Block status is a question about a range, not
    // a transfer: clients ask about the whole export (up to 4 GiB at once).
    if h.length > REQUEST_BYTES_MAX && h.kind != CMD_BLOCK_STATUS {
        return Err(refuse(EINVAL, "length over the request limit"));
    }
    let fits = h
        .offset
        .checked_add(h.length as u64)
        .is_some_and(|e| e <= session.size_bytes.unwrap_or(export.size_bytes));
    if !fits {
        return Err(match h.kind {
            CMD_WRITE | CMD_WRITE_ZEROES => refuse(ENOSPC, "beyond the end of the export"),
            _ => refuse(EINVAL, "beyond the end of the export"),
        });
    }
    Ok(match h.kind {
        CMD_READ => Command::Read {
            offset: h.offset,
            length: h.length,
        },
        CMD_WRITE => Command::Write {
            offset: h.offset,
            fua,
        },
        CMD_TRIM => Command::Trim {
            offset: h.offset,
            length: h.length,
            fua,
        },
        CMD_BLOCK_STATUS => Command::BlockStatus {
            offset: h.offset,
            length: h.length,
            one: h.flags & CMD_FLAG_REQ_ONE != 0,
        },
        _ => Command::WriteZeroes {
            offset: h.offset,
            length: h.length,
            fua,
        },
    })
}

/// Encodes a simple reply header (data follows for a successful read).
pub fn encode_simple_reply(cookie: u64, errno: u32) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
    let mut b = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&errno.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk's header.
fn structured_header(out: &mut Vec<u8>, cookie: u64, flags: u16, kind: u16, len: usize) {
    debug_assert!(
        u32::try_from(len).is_ok(),
        "chunks are bounded by the request limit"
    );
    #[allow(clippy::cast_possible_truncation)]
    let len = len as u32;
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// A read's data as one final NBD_REPLY_TYPE_OFFSET_DATA chunk.
pub fn encode_read_chunk(cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut out = encode_read_chunk_header(cookie, offset, data.len());
    out.extend_from_slice(data);
    out
}

/// What precedes `len` bytes of read data in a final
/// NBD_REPLY_TYPE_OFFSET_DATA chunk (the data can then be sent from its own
/// buffer, without a copy).
pub fn encode_read_chunk_header(cookie: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + 8);
    structured_header(
        &mut out,
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        8 + len,
    );
    out.extend_from_slice(&offset.to_be_bytes());
    out
}

/// A read of a range with holes, in non-final chunks: each hole an
/// NBD_REPLY_TYPE_OFFSET_HOLE chunk (no data on the wire), each data run an
/// NBD_REPLY_TYPE_OFFSET_DATA chunk; then a final NBD_REPLY_TYPE_NONE
/// chunk. `runs` are (offset, Ok(data) | Err(hole length)) in order and
/// tile the request.
pub fn encode_sparse_read(cookie: u64, runs: &[(u64, Result<&[u8], u32>)]) -> Vec<u8> {
    let bytes: usize = runs
        .iter()
        .map(|(_, r)| STRUCTURED_REPLY_HEADER_BYTES + 8 + r.as_ref().map_or(4, |d| d.len()))
        .sum();
    let mut out = Vec::with_capacity(bytes + STRUCTURED_REPLY_HEADER_BYTES);
    for (offset, r) in runs {
        match r {
            Ok(data) => {
                structured_header(&mut out, cookie, 0, REPLY_TYPE_OFFSET_DATA, 8 + data.len());
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(data);
            }
            Err(len) => {
                structured_header(&mut out, cookie, 0, REPLY_TYPE_OFFSET_HOLE, 12);
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
        }
    }
    structured_header(&mut out, cookie, REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0);
    out
}

/// A failed request as one final NBD_REPLY_TYPE_ERROR chunk (the message
/// is cut at 4096 bytes).
pub fn encode_error_chunk(cookie: u64, errno: u32, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + 6 + msg.len());
    structured_header(
        &mut out,
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        6 + msg.len(),
    );
    out.extend_from_slice(&errno.to_be_bytes());
    #[allow(clippy::cast_possible_truncation)] // at most 4096
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// `base:allocation` descriptors (length, flags) as one final
/// NBD_REPLY_TYPE_BLOCK_STATUS chunk.
pub fn encode_block_status(cookie: u64, extents: &[(u32, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + 4 + 8 * extents.len());
    let len = 4 + 8 * extents.len();
    structured_header(
        &mut out,
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        len,
    );
    out.extend_from_slice(&META_BASE_ALLOCATION_ID.to_be_bytes());
    for (len, flags) in extents {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
    out
}

/// Decodes a simple reply header: `(errno, cookie)`; `None` on bad magic.
pub fn decode_simple_reply(b: &[u8; SIMPLE_REPLY_HEADER_BYTES]) -> Option<(u32, u64)> {
    (be_u32(b, 0) == SIMPLE_REPLY_MAGIC).then(|| (be_u32(b, 4), be_u64(b, 8)))
}
