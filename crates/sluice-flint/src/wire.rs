//! Framing of the view's fast channel, sans-IO.
//!
//! `ViewSync` over gRPC crosses HTTP/2 framing and several task hops on
//! each side: about 120 µs on loopback here, against a 7 µs TCP round trip.
//! The fast channel (`sluice control --view-listen`) carries the same
//! protobuf messages over a plain TCP stream, one request and one answer at
//! a time:
//!
//! ```text
//! frame = length: u32 big-endian (kind + body, 1..=FRAME_BYTES_MAX)
//!         kind:   u8
//!         body:   the kind's protobuf message (or UTF-8 text)
//! ```
//!
//! A connection opens with a `Hello` (the bearer token, or nothing), then
//! alternates a request (`Sync`, `Target`) and its answer (`SyncAck`,
//! `TargetAck`); an `Error` carries a message and ends the connection.
//! [`FrameDecoder`] takes bytes as they arrive and hands out whole frames;
//! anything malformed (a length of 0 or beyond the limit, an unknown kind)
//! is an error naming the field, after which the decoder yields nothing.

/// Largest `kind + body` (a full sample batch and bid is under 200 KiB).
pub const FRAME_BYTES_MAX: usize = 1 << 20;
/// Bytes of the length prefix.
pub const LENGTH_BYTES: usize = 4;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Client → server, first: the bearer token (UTF-8; empty for none).
    Hello,
    /// Server → client: the hello was accepted.
    Welcome,
    /// Client → server: a `ViewBatch` (samples and bid).
    Sync,
    /// Server → client: its `ViewAck`.
    SyncAck,
    /// Client → server: a `TargetReport`.
    Target,
    /// Server → client: its `TargetReportAck`.
    TargetAck,
    /// Either way: a UTF-8 message; the connection ends.
    Error,
}

impl Kind {
    pub fn code(self) -> u8 {
        match self {
            Kind::Hello => 1,
            Kind::Welcome => 2,
            Kind::Sync => 3,
            Kind::SyncAck => 4,
            Kind::Target => 5,
            Kind::TargetAck => 6,
            Kind::Error => 7,
        }
    }

    pub fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Sync,
            4 => Kind::SyncAck,
            5 => Kind::Target,
            6 => Kind::TargetAck,
            7 => Kind::Error,
            _ => return None,
        })
    }
}

/// A malformed stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("frame length: {0} must be 1..={FRAME_BYTES_MAX}")]
    Length(usize),
    #[error("frame kind: {0} is not a known kind")]
    Kind(u8),
}

/// One frame: its kind and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub body: Vec<u8>,
}

/// Encodes a frame. Refuses a body the decoder would refuse.
pub fn encode(kind: Kind, body: &[u8]) -> Result<Vec<u8>, WireError> {
    let len = body.len() + 1;
    if len > FRAME_BYTES_MAX {
        return Err(WireError::Length(len));
    }
    let mut out = Vec::with_capacity(LENGTH_BYTES + len);
    // len <= FRAME_BYTES_MAX < u32::MAX.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    out.push(kind.code());
    out.extend_from_slice(body);
    Ok(out)
}

/// Streaming decoder: feed bytes, take frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    failed: Option<WireError>,
}

impl FrameDecoder {
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// How many more bytes the frame being collected needs (at least 1
    /// when nothing is buffered), so that a reader never reads past it.
    pub fn wanted(&self) -> usize {
        let Some(head) = self.buf.first_chunk::<LENGTH_BYTES>() else {
            return LENGTH_BYTES - self.buf.len();
        };
        let len = u32::from_be_bytes(*head) as usize;
        (LENGTH_BYTES + len.min(FRAME_BYTES_MAX))
            .saturating_sub(self.buf.len())
            .max(1)
    }

    /// The next whole frame, if one is buffered. An error is sticky.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let Some(head) = self.buf.first_chunk::<LENGTH_BYTES>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*head) as usize;
        if len == 0 || len > FRAME_BYTES_MAX {
            return Err(self.fail(WireError::Length(len)));
        }
        if self.buf.len() < LENGTH_BYTES + len {
            return Ok(None);
        }
        let code = self.buf[LENGTH_BYTES];
        let Some(kind) = Kind::from_code(code) else {
            return Err(self.fail(WireError::Kind(code)));
        };
        let body = self.buf[LENGTH_BYTES + 1..LENGTH_BYTES + len].to_vec();
        self.buf.drain(..LENGTH_BYTES + len);
        Ok(Some(Frame { kind, body }))
    }

    fn fail(&mut self, e: WireError) -> WireError {
        self.buf = Vec::new();
        self.failed = Some(e.clone());
        e
    }

    /// Bytes buffered and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_split() {
        let mut stream = Vec::new();
        stream.extend(encode(Kind::Hello, b"token").expect("frame"));
        stream.extend(encode(Kind::Sync, &[7u8; 300]).expect("frame"));
        stream.extend(encode(Kind::Welcome, b"").expect("frame"));
        for chunk in [1, 2, 3, 5, 64, 1000] {
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                assert!(d.wanted() >= 1);
                d.feed(piece);
                while let Some(f) = d.next_frame().expect("valid") {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 3, "chunk {chunk}");
            assert_eq!(got[0].kind, Kind::Hello);
            assert_eq!(got[0].body, b"token");
            assert_eq!(got[1].body.len(), 300);
            assert_eq!(got[2].kind, Kind::Welcome);
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn a_bad_length_or_kind_is_named_and_sticks() {
        let mut d = FrameDecoder::new();
        d.feed(&0u32.to_be_bytes());
        assert_eq!(d.next_frame(), Err(WireError::Length(0)));
        d.feed(&encode(Kind::Hello, b"").expect("frame"));
        assert_eq!(d.next_frame(), Err(WireError::Length(0)), "sticky");
        let mut d = FrameDecoder::new();
        d.feed(&(u32::try_from(FRAME_BYTES_MAX + 1).expect("small")).to_be_bytes());
        assert!(d
            .next_frame()
            .expect_err("too long")
            .to_string()
            .contains("frame length"));
        let mut d = FrameDecoder::new();
        d.feed(&[0, 0, 0, 1, 99]);
        assert_eq!(d.next_frame(), Err(WireError::Kind(99)));
        assert!(encode(Kind::Sync, &vec![0u8; FRAME_BYTES_MAX]).is_err());
        // A length announcing a big frame asks for no more than the frame.
        let mut d = FrameDecoder::new();
        d.feed(&[0, 0, 1, 0]);
        assert_eq!(d.wanted(), 256);
    }

    proptest::proptest! {
        #[test]
        fn the_decoder_never_panics_and_frames_are_whole(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048), cut in 1usize..64) {
            let mut d = FrameDecoder::new();
            for piece in bytes.chunks(cut) {
                d.feed(piece);
                while let Ok(Some(f)) = d.next_frame() {
                    proptest::prop_assert!(f.body.len() < FRAME_BYTES_MAX);
                }
            }
        }
    }
}
