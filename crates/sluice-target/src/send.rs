//! The send path of one queue: a scheduler, not a `write` call.
//!
//! The queue encodes each outgoing PDU straight into a buffer the scheduler
//! hands out for that PDU's [`PduClass`], then commits it. The scheduler
//! decides when committed bytes become due for the socket. [`Immediate`] makes
//! every PDU due at once (stock NVMe/TCP behaviour); batching and isolating
//! schedulers (PINoF freights, i10-style containers) plug in behind the same
//! trait, with `next_deadline` bounding how long any PDU may wait.

use std::time::Instant;

/// What kind of PDU is being sent, for schedulers that treat them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PduClass {
    /// ICResp, TermReq: connection management.
    Control,
    /// R2T: unblocks a host's write data.
    R2t,
    /// CapsuleResp: completes a command.
    Response,
    /// C2HData: bulk read data.
    Data,
}

/// Counters every scheduler keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    pub pdus: u64,
    pub bytes: u64,
    pub flushes: u64,
}

/// A per-queue send scheduler.
pub trait SendScheduler: Send + std::fmt::Debug {
    /// A buffer to append one encoded PDU of `class` to.
    fn buffer(&mut self, class: PduClass) -> &mut Vec<u8>;
    /// Marks the bytes appended since the last commit as one PDU.
    fn commit(&mut self, class: PduClass, now: Instant);
    /// Bytes due for the socket, oldest first.
    fn due(&self) -> &[u8];
    /// Reports that the first `n` due bytes were written.
    fn consume(&mut self, n: usize);
    /// Moves PDUs whose trigger fired into the due bytes.
    fn poll(&mut self, now: Instant);
    /// When `poll` must next run even without new PDUs.
    fn next_deadline(&self) -> Option<Instant>;
    /// Bytes committed but not yet written (back-pressure input).
    fn backlog_bytes(&self) -> usize;
    fn stats(&self) -> SendStats;
}

/// Writes every PDU as soon as it exists.
#[derive(Debug, Default)]
pub struct Immediate {
    out: Vec<u8>,
    /// Written prefix of `out`.
    start: usize,
    committed: usize,
    stats: SendStats,
}

impl Immediate {
    pub fn new() -> Self {
        Immediate::default()
    }
}

impl SendScheduler for Immediate {
    fn buffer(&mut self, _class: PduClass) -> &mut Vec<u8> {
        &mut self.out
    }

    fn commit(&mut self, _class: PduClass, _now: Instant) {
        debug_assert!(self.out.len() >= self.committed);
        self.stats.pdus += 1;
        self.stats.bytes += (self.out.len() - self.committed) as u64;
        self.committed = self.out.len();
    }

    fn due(&self) -> &[u8] {
        &self.out[self.start..self.committed]
    }

    fn consume(&mut self, n: usize) {
        assert!(
            self.start + n <= self.committed,
            "consumed more than was due"
        );
        self.start += n;
        if n > 0 {
            self.stats.flushes += 1;
        }
        if self.start == self.committed {
            // Keep any uncommitted tail (none in practice) and reuse the allocation.
            self.out.drain(..self.start);
            self.committed -= self.start;
            self.start = 0;
        } else if self.start > 1 << 20 {
            self.out.drain(..self.start);
            self.committed -= self.start;
            self.start = 0;
        }
    }

    fn poll(&mut self, _now: Instant) {}

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn backlog_bytes(&self) -> usize {
        self.committed - self.start
    }

    fn stats(&self) -> SendStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_keeps_order_and_partial_writes() {
        let now = Instant::now();
        let mut s = Immediate::new();
        s.buffer(PduClass::Response).extend_from_slice(b"aaaa");
        s.commit(PduClass::Response, now);
        s.buffer(PduClass::Data).extend_from_slice(b"bb");
        s.commit(PduClass::Data, now);
        assert_eq!(s.due(), b"aaaabb");
        s.consume(3);
        assert_eq!(s.due(), b"abb");
        assert_eq!(s.backlog_bytes(), 3);
        s.consume(3);
        assert_eq!(s.due(), b"");
        assert_eq!(s.stats().pdus, 2);
        assert_eq!(s.stats().bytes, 6);
        assert_eq!(s.next_deadline(), None);
    }
}
