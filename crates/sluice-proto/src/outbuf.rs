//! `OutBuf`: the bytes of a send scheduler's containers and due stream,
//! where a PDU's bulk data may be an [`Attachment`] (sent from its own
//! buffer by a vectored write) instead of a copy.
//!
//! The encoded bytes (headers, digests, small data) are one `Vec<u8>`;
//! each attachment sits at a position of it (its bytes come before the
//! inline byte at that position). An attachment is added right after its
//! PDU's header, so at a PDU boundary `b` every attachment at `pos <= b`
//! belongs to the PDUs before it: the next PDU's header is never empty.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::Range;

pub use sluice_bytes::{SharedBytes, SharedRange};

/// A PDU's data carried by reference: a non-empty [`SharedRange`], sent
/// from its owner's buffer (vectored) and released once written.
#[derive(Clone, Debug)]
pub struct Attachment(SharedRange);

impl Attachment {
    /// `range` of `data`; `None` when the range is empty or outside it.
    pub fn new(data: SharedBytes, range: Range<usize>) -> Option<Self> {
        SharedRange::new(data, range).and_then(Attachment::from_range)
    }

    /// `data` as an attachment; `None` when it is empty.
    pub fn from_range(data: SharedRange) -> Option<Self> {
        (!data.is_empty()).then_some(Attachment(data))
    }

    pub fn as_slice(&self) -> &[u8] {
        self.0.as_slice()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: empty attachments are refused at construction.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Encoded bytes plus attachments, consumed from the front.
#[derive(Debug, Default)]
pub(crate) struct OutBuf {
    bytes: Vec<u8>,
    /// Consumed prefix of `bytes`.
    start: usize,
    /// `(position in bytes, attachment)`, positions non-decreasing.
    atts: VecDeque<(usize, Attachment)>,
    /// Consumed bytes of the front attachment (only while its position is
    /// `start`).
    front_off: usize,
    /// Bytes of the attachments still held (the front one whole, however
    /// much of it `front_off` says was consumed).
    att_bytes: usize,
}

impl OutBuf {
    /// The encoded bytes, for encoders to append to.
    pub(crate) fn inline(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// End of the encoded bytes (a PDU boundary once a PDU is complete).
    pub(crate) fn inline_end(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes held and not yet consumed, attachments included.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len() - self.start + self.att_bytes - self.front_off
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Attaches `a` after the bytes encoded so far.
    pub(crate) fn attach(&mut self, a: Attachment) {
        debug_assert!(!a.is_empty());
        self.att_bytes += a.len();
        self.atts.push_back((self.bytes.len(), a));
    }

    /// Unconsumed bytes up to inline position `end` (attachments at
    /// positions `<= end` included).
    pub(crate) fn len_upto(&self, end: usize) -> usize {
        let atts: usize = self
            .atts
            .iter()
            .take_while(|(p, _)| *p <= end)
            .map(|(_, a)| a.len())
            .sum();
        end - self.start + atts - self.front_off
    }

    /// The first contiguous run of unconsumed bytes up to `end`: empty
    /// only when nothing is due up to there.
    pub(crate) fn first_upto(&self, end: usize) -> &[u8] {
        self.runs_upto(end).next().unwrap_or(&[])
    }

    /// The unconsumed runs up to `end`, in order (none of them empty).
    fn runs_upto(&self, end: usize) -> impl Iterator<Item = &[u8]> + '_ {
        let mut pos = self.start;
        let mut atts = self
            .atts
            .iter()
            .enumerate()
            .take_while(move |(_, (p, _))| *p <= end);
        let mut pending: Option<&[u8]> = None;
        std::iter::from_fn(move || {
            if let Some(x) = pending.take() {
                return Some(x);
            }
            let Some((i, (p, a))) = atts.next() else {
                // The inline tail, once.
                let tail = (pos < end).then(|| &self.bytes[pos..end]);
                pos = end;
                return tail;
            };
            let off = if i == 0 { self.front_off } else { 0 };
            let att = &a.as_slice()[off..];
            if *p > pos {
                let run = &self.bytes[pos..*p];
                pos = *p;
                pending = Some(att);
                return Some(run);
            }
            Some(att)
        })
    }

    /// Fills `out` with the unconsumed runs up to `end`, in order; returns
    /// how many it filled (stops when `out` is full).
    pub(crate) fn slices_upto<'a>(&'a self, end: usize, out: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (o, run) in out.iter_mut().zip(self.runs_upto(end)) {
            *o = IoSlice::new(run);
            n += 1;
        }
        n
    }

    /// Consumes the first `n` unconsumed bytes (at most `len_upto(end)`).
    pub(crate) fn consume(&mut self, mut n: usize, end: usize) {
        assert!(n <= self.len(), "consumed more than was held");
        debug_assert!(n <= self.len_upto(end), "consumed more than was due");
        while n > 0 {
            match self.atts.front() {
                Some((p, a)) if *p == self.start => {
                    let k = n.min(a.len() - self.front_off);
                    self.front_off += k;
                    n -= k;
                    if self.front_off == a.len() {
                        self.att_bytes -= a.len();
                        self.front_off = 0;
                        self.atts.pop_front();
                    }
                }
                Some((p, _)) => {
                    let k = n.min(*p - self.start);
                    self.start += k;
                    n -= k;
                }
                None => {
                    self.start += n;
                    n = 0;
                }
            }
        }
        self.compact();
    }

    /// Drops the consumed prefix once it is all consumed or large.
    fn compact(&mut self) {
        if self.start == self.bytes.len() && self.atts.is_empty() {
            self.bytes.clear();
            self.start = 0;
        } else if self.start > 1 << 20 {
            self.bytes.drain(..self.start);
            for (p, _) in &mut self.atts {
                *p -= self.start;
            }
            self.start = 0;
        }
    }

    /// Moves the first `upto` encoded bytes, with the attachments at
    /// positions `<= upto`, to the end of `dst`. `self` must have nothing
    /// consumed (a container, never written from directly).
    pub(crate) fn move_prefix_into(&mut self, dst: &mut OutBuf, upto: usize) {
        debug_assert!(self.start == 0 && self.front_off == 0);
        if dst.is_empty() && upto == self.bytes.len() {
            dst.bytes.clear();
            dst.start = 0;
            dst.front_off = 0;
            std::mem::swap(self, dst);
            return;
        }
        let base = dst.bytes.len();
        dst.bytes.extend_from_slice(&self.bytes[..upto]);
        while self.atts.front().is_some_and(|(p, _)| *p <= upto) {
            if let Some((p, a)) = self.atts.pop_front() {
                self.att_bytes -= a.len();
                dst.att_bytes += a.len();
                dst.atts.push_back((base + p, a));
            }
        }
        self.bytes.drain(..upto);
        for (p, _) in &mut self.atts {
            *p -= upto;
        }
    }

    /// Appends a copy of the unconsumed bytes up to `end` to `out`.
    pub(crate) fn copy_upto(&self, end: usize, out: &mut Vec<u8>) {
        for run in self.runs_upto(end) {
            out.extend_from_slice(run);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn att(bytes: &[u8], range: Range<usize>) -> Attachment {
        let shared: SharedBytes = Arc::new(bytes.to_vec());
        Attachment::new(shared, range).expect("range")
    }

    fn all(b: &OutBuf) -> Vec<u8> {
        let mut v = Vec::new();
        b.copy_upto(b.inline_end(), &mut v);
        v
    }

    #[test]
    fn attachments_refuse_empty_and_out_of_range() {
        let shared: SharedBytes = Arc::new(vec![1u8; 8]);
        assert!(Attachment::new(shared.clone(), 3..3).is_none());
        assert!(Attachment::new(shared.clone(), 4..9).is_none());
        assert_eq!(Attachment::new(shared, 2..8).map(|a| a.len()), Some(6));
    }

    #[test]
    fn runs_and_consumption_cross_attachments() {
        let mut b = OutBuf::default();
        b.inline().extend_from_slice(b"hh");
        b.attach(att(b"xxDATAxx", 2..6));
        b.inline().extend_from_slice(b"dd");
        b.attach(att(b"MORE", 0..4));
        assert_eq!(all(&b), b"hhDATAddMORE");
        assert_eq!(b.len(), 12);
        let mut s = [IoSlice::new(&[]); 8];
        assert_eq!(b.slices_upto(b.inline_end(), &mut s), 4);
        // A window of two runs only.
        let mut two = [IoSlice::new(&[]); 2];
        assert_eq!(b.slices_upto(b.inline_end(), &mut two), 2);
        assert_eq!((&*two[0], &*two[1]), (&b"hh"[..], &b"DATA"[..]));
        // Consume into the middle of the first attachment.
        b.consume(3, b.inline_end());
        assert_eq!(b.first_upto(b.inline_end()), b"ATA");
        assert_eq!(all(&b), b"ATAddMORE");
        assert_eq!(b.len(), 9);
        b.consume(6, b.inline_end());
        assert_eq!(b.first_upto(b.inline_end()), b"ORE");
        b.consume(3, b.inline_end());
        assert!(b.is_empty());
        assert_eq!(b.first_upto(b.inline_end()), b"");
        assert_eq!(b.inline_end(), 0, "an emptied buffer starts over");
    }

    #[test]
    fn an_end_bound_hides_uncommitted_bytes_and_attachments() {
        let mut b = OutBuf::default();
        b.inline().extend_from_slice(b"one");
        let end = b.inline_end();
        b.inline().extend_from_slice(b"tw");
        b.attach(att(b"o", 0..1));
        assert_eq!(b.len_upto(end), 3);
        assert_eq!(b.first_upto(end), b"one");
        b.consume(3, end);
        assert_eq!(b.len_upto(end), 0);
        assert_eq!(b.first_upto(end), b"");
        assert_eq!(all(&b), b"two");
    }

    #[test]
    fn a_prefix_moves_with_the_attachments_inside_it() {
        let mut f = OutBuf::default();
        f.inline().extend_from_slice(b"H1");
        f.attach(att(b"AA", 0..2));
        let boundary = f.inline_end();
        f.inline().extend_from_slice(b"H2");
        f.attach(att(b"BB", 0..2));
        f.inline().extend_from_slice(b"D2");
        let mut due = OutBuf::default();
        due.inline().extend_from_slice(b"old");
        f.move_prefix_into(&mut due, boundary);
        assert_eq!(all(&due), b"oldH1AA");
        assert_eq!(all(&f), b"H2BBD2");
        // The whole rest into an empty buffer: swapped, not copied.
        let mut empty = OutBuf::default();
        let end = f.inline_end();
        f.move_prefix_into(&mut empty, end);
        assert_eq!(all(&empty), b"H2BBD2");
        assert!(f.is_empty());
    }

    #[test]
    fn a_large_consumed_prefix_is_dropped_and_positions_follow() {
        let mut b = OutBuf::default();
        b.inline().resize(1 << 21, 7);
        b.attach(att(b"tail", 0..4));
        b.inline().push(9);
        b.consume((1 << 21) - 1, b.inline_end());
        assert_eq!(b.inline_end(), 2, "prefix dropped");
        assert_eq!(all(&b), b"\x07tail\x09");
    }
}
