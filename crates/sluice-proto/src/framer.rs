//! Streaming PDU receiver: bytes in, validated PDUs out.
//!
//! The I/O layer reads from its socket straight into [`Framer::read_buf`],
//! calls [`Framer::advance`], then drains [`Framer::next_pdu`] until it returns
//! `Ok(None)`. The framer checks the common header as soon as its 8 bytes are
//! in, so a hostile PLEN is rejected before any memory is committed to it, and
//! verifies header digests (fatal on mismatch) and data digests (reported per
//! PDU, since a data digest error fails only the command).
//!
//! After an error the framer is poisoned: it returns the same error forever,
//! and the caller sends a TermReq and closes the connection.
//!
//! Memory: the framer allocates nothing until the first
//! [`Framer::read_buf`], and then only what its read chunk asks for
//! (twice [`Framer::read_chunk`], [`READ_CHUNK_BYTES`] unless changed) or
//! the PDU being collected needs (bounded by `data_len_max`). A target
//! keeps the chunk small and `data_len_max` at the Connect size until the
//! queue is connected ([`Framer::set_read_chunk`],
//! [`Framer::set_data_len_max`]), so a socket that never gets that far
//! costs a few hundred bytes, not a full-size buffer.

use crate::digest::crc32c;
use crate::pdu::{
    decode_specific, pdu_type, validate_common_header, CommonHeader, DecodeError, Direction,
    PduHeader, PduLayout, RxParams, CH_LEN, DIGEST_LEN, HLEN_MAX, SHORT_HLEN,
};
use crate::wire::u32_at;

/// A received PDU. `data` borrows the framer's buffer until the next call.
#[derive(Debug)]
pub struct RxPdu<'a> {
    pub header: PduHeader,
    pub data: &'a [u8],
    /// False when data digests are on and the received DDGST did not match.
    pub data_digest_ok: bool,
    /// The raw header bytes (for quoting in a TermReq).
    pub raw_header: &'a [u8],
}

/// A PDU whose header is in but whose data is not all there yet: a data
/// PDU (H2CData or C2HData, [`Framer::split_data`]) or a CapsuleCmd with
/// in-capsule data ([`Framer::split_pdu`]), split off so that the caller
/// reads the rest of its data straight into the command's buffer instead
/// of through the framer's.
#[derive(Debug)]
pub struct SplitPdu<'a> {
    pub header: PduHeader,
    /// The raw header bytes (for quoting in a TermReq).
    pub raw_header: &'a [u8],
    /// The data bytes already received (the framer's buffer held them).
    pub data_head: &'a [u8],
    /// Data bytes still to come: the caller receives them itself.
    pub data_rest: usize,
    /// A 4-byte data digest follows the data; the caller takes it with
    /// [`Framer::take_bytes`] once the data is in.
    pub ddgst: bool,
}

impl SplitPdu<'_> {
    /// A data PDU's header, kept for quoting in a TermReq after the framer
    /// moved on (data PDUs' headers are [`SHORT_HLEN`] bytes; a
    /// CapsuleCmd's is longer: quote `raw_header` while it is at hand).
    pub fn header_quote(&self) -> [u8; SHORT_HLEN] {
        let mut q = [0u8; SHORT_HLEN];
        let n = self.raw_header.len().min(SHORT_HLEN);
        q[..n].copy_from_slice(&self.raw_header[..n]);
        q
    }
}

/// The rest of a split PDU's data on its way into its destination buffer
/// (the first of the two buffers a receiver offers one `readv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlace {
    /// Where the next byte goes in the destination.
    pub at: usize,
    /// Bytes still to come.
    pub left: usize,
}

impl InPlace {
    /// The part of the destination the next read fills.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.at..self.at + self.left
    }

    /// Accounts `n` bytes just read, this buffer first; returns how many
    /// of them went past it (into the framer's buffer).
    pub fn take(&mut self, n: usize) -> usize {
        let k = n.min(self.left);
        self.at += k;
        self.left -= k;
        n - k
    }
}

/// Copies the head of `src` into `first`, then into `second`, as one
/// `readv` into the two fills them; returns the bytes copied. For feeding
/// a receiver's two buffers (in place, then the framer's) from memory.
pub fn copy_into_two(src: &[u8], first: &mut [u8], second: &mut [u8]) -> usize {
    let k = first.len().min(src.len());
    first[..k].copy_from_slice(&src[..k]);
    let m = second.len().min(src.len() - k);
    second[..m].copy_from_slice(&src[k..k + m]);
    k + m
}

/// The receive side of one NVMe/TCP connection.
#[derive(Debug)]
pub struct Framer {
    params: RxParams,
    buf: Vec<u8>,
    /// Smallest free space [`Self::read_buf`] offers.
    read_chunk: usize,
    start: usize,
    end: usize,
    poisoned: Option<DecodeError>,
    /// Header of the PDU that poisoned the framer, for the TermReq.
    error_quote: Vec<u8>,
    /// Layout of the PDU at `start`, once its common header was validated.
    pending: Option<PduLayout>,
}

/// Smallest free space offered to a socket read, unless
/// [`Framer::set_read_chunk`] says otherwise; the buffer starts at twice this.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

impl Framer {
    /// A framer for the side that receives PDUs travelling in `direction`,
    /// before connection initialization.
    pub fn new(direction: Direction, data_len_max: u32) -> Self {
        Framer {
            params: RxParams {
                direction,
                initialized: false,
                hdgst: false,
                ddgst: false,
                pda: 0,
                data_len_max,
            },
            buf: Vec::new(),
            read_chunk: READ_CHUNK_BYTES,
            start: 0,
            end: 0,
            poisoned: None,
            error_quote: Vec::new(),
            pending: None,
        }
    }

    /// Applies the parameters negotiated by ICReq/ICResp.
    pub fn set_initialized(&mut self, hdgst: bool, ddgst: bool, pda: u8, data_len_max: u32) {
        self.params.initialized = true;
        self.params.hdgst = hdgst;
        self.params.ddgst = ddgst;
        self.params.pda = pda;
        self.params.data_len_max = data_len_max;
    }

    /// Changes the largest PDU data accepted from the next PDU on (a PDU
    /// whose header was already validated keeps its limit).
    pub fn set_data_len_max(&mut self, data_len_max: u32) {
        self.params.data_len_max = data_len_max;
    }

    /// Changes the smallest free space [`Self::read_buf`] offers (at least
    /// one common header; the buffer grows to twice this on the next read
    /// that needs room, and never shrinks).
    pub fn set_read_chunk(&mut self, bytes: usize) {
        self.read_chunk = bytes.max(CH_LEN);
    }

    /// The smallest free space [`Self::read_buf`] offers.
    pub fn read_chunk(&self) -> usize {
        self.read_chunk
    }

    /// Bytes the receive buffer holds allocated (its length).
    pub fn capacity_bytes(&self) -> usize {
        self.buf.len()
    }

    pub fn params(&self) -> &RxParams {
        &self.params
    }

    /// Bytes received but not yet consumed as PDUs.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Free space to read into (at least [`Self::read_chunk`] bytes).
    pub fn read_buf(&mut self) -> &mut [u8] {
        let chunk = self.read_chunk;
        let want = self
            .pending
            .map(|l| l.ch.plen as usize)
            .unwrap_or(0)
            .max(chunk);
        if self.start > 0 && (self.start == self.end || self.buf.len() - self.end < want) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < chunk {
            let new_len = (self.end + want).max(self.buf.len() * 2).max(chunk * 2);
            self.buf.resize(new_len, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Marks `n` bytes of [`Self::read_buf`] as filled.
    pub fn advance(&mut self, n: usize) {
        assert!(
            self.end + n <= self.buf.len(),
            "advance past the read buffer"
        );
        self.end += n;
    }

    /// Copies `data` in (tests and in-memory peers).
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let b = self.read_buf();
            let n = b.len().min(data.len());
            b[..n].copy_from_slice(&data[..n]);
            self.advance(n);
            data = &data[n..];
        }
    }

    /// The next complete PDU, `Ok(None)` if more bytes are needed.
    pub fn next_pdu(&mut self) -> Result<Option<RxPdu<'_>>, DecodeError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        match self.next_inner() {
            Ok(Some((layout, start))) => {
                let hlen = layout.ch.hlen as usize;
                let b = &self.buf[start..start + layout.ch.plen as usize];
                let data = &b[layout.data_offset..layout.data_offset + layout.data_len];
                let header = match decode_specific(&layout, &b[..hlen], data) {
                    Ok(h) => h,
                    Err(e) => {
                        self.error_quote = b[..hlen.min(HLEN_MAX)].to_vec();
                        self.poisoned = Some(e.clone());
                        return Err(e);
                    }
                };
                let data_digest_ok = if layout.ddgst {
                    let at = layout.data_offset + layout.data_len;
                    u32_at(b, at) == crc32c(data)
                } else {
                    true
                };
                Ok(Some(RxPdu {
                    header,
                    data,
                    data_digest_ok,
                    raw_header: &b[..hlen],
                }))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.error_quote = self.header_at_start().to_vec();
                self.poisoned = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Splits off the data PDU being received when at least `rest_min`
    /// bytes of its data have yet to arrive: [`Self::split_pdu`] for
    /// H2CData and C2HData PDUs.
    pub fn split_data(&mut self, rest_min: usize) -> Result<Option<SplitPdu<'_>>, DecodeError> {
        self.split_pdu(rest_min, |h| {
            matches!(h, PduHeader::H2CData(_) | PduHeader::C2HData(_))
        })
    }

    /// Splits off the PDU being received — a data PDU, or a CapsuleCmd
    /// with in-capsule data — when `accept` takes its decoded header and
    /// at least `rest_min` bytes of its data have yet to arrive (and its
    /// header, with the header digest checked, is in). Everything the
    /// framer holds belongs to that PDU and is handed out as `data_head`;
    /// the framer then stands at the end of the PDU's data. The caller must
    /// receive the `data_rest` bytes that follow outside the framer (into
    /// [`Self::read_buf`] no byte of them may go), then the data digest
    /// with [`Self::take_bytes`] when `ddgst`, and only then call
    /// [`Self::next_pdu`] again.
    ///
    /// `Ok(None)`: nothing split (no such PDU pending, its header is not
    /// complete, too little of its data is missing, or `accept` refused it);
    /// the framer is as before. `Err`: the header is invalid (or its
    /// digest wrong) and the framer is poisoned, as [`Self::next_pdu`]
    /// would have found, whatever `accept` would have said.
    pub fn split_pdu(
        &mut self,
        rest_min: usize,
        accept: impl FnOnce(&PduHeader) -> bool,
    ) -> Result<Option<SplitPdu<'_>>, DecodeError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let Some(layout) = self.pending else {
            return Ok(None);
        };
        if !matches!(
            layout.ch.pdu_type,
            pdu_type::H2C_DATA | pdu_type::C2H_DATA | pdu_type::CAPSULE_CMD
        ) {
            return Ok(None);
        }
        let avail = self.end - self.start;
        let data_end = layout.data_offset + layout.data_len;
        if avail < layout.data_offset || avail >= data_end {
            return Ok(None);
        }
        let rest = data_end - avail;
        if rest < rest_min.max(1) {
            return Ok(None);
        }
        let start = self.start;
        let hlen = layout.ch.hlen as usize;
        let decoded = if layout.hdgst {
            let received = u32_at(&self.buf, start + hlen);
            let computed = crc32c(&self.buf[start..start + hlen]);
            if received == computed {
                decode_specific(&layout, &self.buf[start..start + hlen], &[])
            } else {
                Err(DecodeError::HeaderDigest { received, computed })
            }
        } else {
            decode_specific(&layout, &self.buf[start..start + hlen], &[])
        };
        let header = match decoded {
            Ok(h) => h,
            Err(e) => {
                self.error_quote = self.buf[start..start + hlen.min(HLEN_MAX)].to_vec();
                self.poisoned = Some(e.clone());
                return Err(e);
            }
        };
        if !accept(&header) {
            return Ok(None);
        }
        let end = self.end;
        self.start = 0;
        self.end = 0;
        self.pending = None;
        let b = &self.buf[start..end];
        Ok(Some(SplitPdu {
            header,
            raw_header: &b[..hlen],
            data_head: &b[layout.data_offset..],
            data_rest: rest,
            ddgst: layout.ddgst,
        }))
    }

    /// Takes the next `n` raw bytes when they are all in (`None`: not
    /// yet). Only between PDUs: for the data digest of a split PDU.
    pub fn take_bytes(&mut self, n: usize) -> Option<&[u8]> {
        debug_assert!(self.pending.is_none(), "take_bytes inside a PDU");
        if self.poisoned.is_some() || self.pending.is_some() || self.end - self.start < n {
            return None;
        }
        let at = self.start;
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Some(&self.buf[at..at + n])
    }

    /// The header of the PDU that caused the last error (for a TermReq
    /// quote): HLEN bytes as far as they arrived, at most [`HLEN_MAX`].
    pub fn current_header(&self) -> &[u8] {
        if self.poisoned.is_some() {
            return &self.error_quote;
        }
        self.header_at_start()
    }

    fn header_at_start(&self) -> &[u8] {
        let avail = self.end - self.start;
        let hlen = if avail > 2 {
            (self.buf[self.start + 2] as usize).clamp(CH_LEN, HLEN_MAX)
        } else {
            CH_LEN
        };
        let n = avail.min(hlen);
        &self.buf[self.start..self.start + n]
    }

    fn next_inner(&mut self) -> Result<Option<(PduLayout, usize)>, DecodeError> {
        let avail = self.end - self.start;
        let layout = match self.pending {
            Some(l) => l,
            None => {
                if avail < CH_LEN {
                    return Ok(None);
                }
                let mut ch = [0u8; CH_LEN];
                ch.copy_from_slice(&self.buf[self.start..self.start + CH_LEN]);
                let l = validate_common_header(&CommonHeader::parse(&ch), &self.params)?;
                self.pending = Some(l);
                l
            }
        };
        let plen = layout.ch.plen as usize;
        let hlen = layout.ch.hlen as usize;
        if layout.hdgst && avail >= hlen + DIGEST_LEN {
            // Check the header digest as soon as it is in, before waiting for data.
            let h = &self.buf[self.start..self.start + hlen];
            let received = u32_at(&self.buf, self.start + hlen);
            let computed = crc32c(h);
            if received != computed {
                return Err(DecodeError::HeaderDigest { received, computed });
            }
        }
        if avail < plen {
            return Ok(None);
        }
        let start = self.start;
        self.start += plen;
        self.pending = None;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            // The PDU's bytes stay valid until the next read_buf/advance.
            return Ok(Some((layout, start)));
        }
        Ok(Some((layout, start)))
    }
}
