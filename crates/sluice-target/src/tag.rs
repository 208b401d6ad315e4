//! The backend request tag: which command (or sentinel) a backend request
//! belongs to, packed into `IoRequest::tag` / `IoCompletion::tag` (`u64`).
//!
//! ```text
//!  63  62                       32 31                          0
//! ┌───┬───────────────────────────┬─────────────────────────────┐
//! │ 0 │ connection index (31 bits)│ local: command slot 0..=FFFF │  connection request
//! │   │                           │  or SHUTDOWN_FLUSH FFFF_FFFE │
//! ├───┼───┬───────────────────────┴─────────────────────────────┤
//! │ 1 │ 0 │ piece counter (62 bits)                              │  piece of a split request
//! ├───┴───┴─────────────────────────────────────────────────────┤
//! │ all ones (u64::MAX)                                         │  worker's final flush
//! └─────────────────────────────────────────────────────────────┘
//! ```
//!
//! A `QueueConnection` only knows its own
//! commands: it emits *local* tags (connection index 0). The worker stamps
//! the connection index on submission ([`BackendTag::with_conn`]) and
//! strips it on completion ([`BackendTag::local`]). Tenant scheduling may
//! split a request into pieces with tags of their own; the final flush at
//! worker exit uses [`BackendTag::FINAL_FLUSH`]. The three kinds can never
//! be confused: bit 63 separates connection tags from the rest, bit 62
//! separates pieces from the final flush.

/// A backend request tag (see the module doc for the layout).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackendTag(u64);

const LOCAL_BITS: u32 = 32;
const LOCAL_MASK: u64 = (1 << LOCAL_BITS) - 1;
const SLOT_MASK: u64 = 0xffff;
const SHUTDOWN_FLUSH_LOCAL: u64 = 0xffff_fffe;
const PIECE_BIT: u64 = 1 << 63;
/// Bit 62 is never set in a piece tag, so no piece equals `FINAL_FLUSH`.
const PIECE_COUNTER_MASK: u64 = (1 << 62) - 1;

impl BackendTag {
    /// Largest connection index a tag can carry.
    pub const CONN_MAX: usize = (1 << 31) - 1;
    /// The flushes a controller shutdown notification triggers (no slot).
    pub const SHUTDOWN_FLUSH: BackendTag = BackendTag(SHUTDOWN_FLUSH_LOCAL);
    /// The worker's last flush of each backend queue before it exits.
    pub const FINAL_FLUSH: BackendTag = BackendTag(u64::MAX);

    /// The request of command slot `slot` (local: connection index 0).
    #[inline]
    pub const fn slot(slot: u16) -> BackendTag {
        BackendTag(slot as u64)
    }

    /// Piece number `n` of a split request (the counter wraps at 2^62).
    #[inline]
    pub const fn piece(n: u64) -> BackendTag {
        BackendTag(PIECE_BIT | (n & PIECE_COUNTER_MASK))
    }

    /// The counter after `n` for [`Self::piece`], wrapping within its bits.
    #[inline]
    pub const fn next_piece(n: u64) -> u64 {
        n.wrapping_add(1) & PIECE_COUNTER_MASK
    }

    /// The raw value, as `IoRequest::tag` carries it.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// A tag read back from `IoCompletion::tag`.
    #[inline]
    pub const fn from_raw(raw: u64) -> BackendTag {
        BackendTag(raw)
    }

    /// This local tag stamped with connection index `conn`.
    #[inline]
    pub fn with_conn(self, conn: usize) -> BackendTag {
        debug_assert!(self.is_conn(), "only connection tags carry an index");
        debug_assert!(conn <= Self::CONN_MAX, "connection index {conn} too large");
        BackendTag(((conn as u64) << LOCAL_BITS) | (self.0 & LOCAL_MASK))
    }

    /// Whether this is a connection's request (not a piece or final flush).
    #[inline]
    pub const fn is_conn(self) -> bool {
        self.0 & PIECE_BIT == 0
    }

    /// Whether this is a piece of a split request.
    #[inline]
    pub const fn is_piece(self) -> bool {
        self.0 != Self::FINAL_FLUSH.0 && self.0 & PIECE_BIT != 0
    }

    /// The connection index of a connection tag.
    #[inline]
    pub const fn conn(self) -> usize {
        (self.0 >> LOCAL_BITS) as usize
    }

    /// The tag without its connection index, as the connection issued it.
    #[inline]
    pub const fn local(self) -> BackendTag {
        BackendTag(self.0 & LOCAL_MASK)
    }

    /// Whether this is a shutdown-notification flush (any connection index).
    #[inline]
    pub const fn is_shutdown_flush(self) -> bool {
        self.is_conn() && self.0 & LOCAL_MASK == SHUTDOWN_FLUSH_LOCAL
    }

    /// The command slot of a connection tag that is not a shutdown flush.
    #[inline]
    pub const fn slot_index(self) -> u16 {
        (self.0 & SLOT_MASK) as u16
    }
}

impl std::fmt::Debug for BackendTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == Self::FINAL_FLUSH {
            write!(f, "BackendTag::FINAL_FLUSH")
        } else if self.is_piece() {
            write!(f, "BackendTag::piece({})", self.0 & PIECE_COUNTER_MASK)
        } else if self.is_shutdown_flush() {
            write!(f, "BackendTag(conn {}, SHUTDOWN_FLUSH)", self.conn())
        } else {
            write!(
                f,
                "BackendTag(conn {}, slot {})",
                self.conn(),
                self.slot_index()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sentinels_are_distinct() {
        let f = BackendTag::FINAL_FLUSH;
        let s = BackendTag::SHUTDOWN_FLUSH;
        assert_ne!(f, s);
        assert!(!f.is_conn() && !f.is_piece() && !f.is_shutdown_flush());
        assert!(s.is_conn() && !s.is_piece() && s.is_shutdown_flush());
        for slot in [0u16, 1, 0x7fff, 0xffff] {
            let t = BackendTag::slot(slot);
            assert!(!t.is_shutdown_flush() && t.is_conn() && !t.is_piece());
            assert_ne!(t, s);
            assert_ne!(t, f);
        }
        for n in [0u64, 1, PIECE_COUNTER_MASK, u64::MAX] {
            let p = BackendTag::piece(n);
            assert!(p.is_piece() && !p.is_conn() && !p.is_shutdown_flush());
            assert_ne!(p, f);
        }
        // The shutdown flush stays one after a connection index is stamped.
        let sc = s.with_conn(BackendTag::CONN_MAX);
        assert!(sc.is_shutdown_flush());
        assert_eq!(sc.local(), s);
        assert_ne!(sc, f);
    }

    #[test]
    fn piece_counter_wraps_inside_its_bits() {
        assert_eq!(BackendTag::next_piece(PIECE_COUNTER_MASK), 0);
        assert_eq!(BackendTag::next_piece(5), 6);
        assert_ne!(
            BackendTag::piece(PIECE_COUNTER_MASK),
            BackendTag::FINAL_FLUSH
        );
    }

    #[test]
    fn layout_is_the_documented_one() {
        let t = BackendTag::slot(0x1234).with_conn(7);
        assert_eq!(t.raw(), (7 << 32) | 0x1234);
        assert_eq!(BackendTag::SHUTDOWN_FLUSH.raw(), 0xffff_fffe);
        assert_eq!(BackendTag::FINAL_FLUSH.raw(), u64::MAX);
        assert_eq!(BackendTag::piece(3).raw(), (1 << 63) | 3);
    }

    proptest! {
        #[test]
        fn round_trip(slot: u16, conn in 0..=BackendTag::CONN_MAX) {
            let local = BackendTag::slot(slot);
            let t = BackendTag::from_raw(local.with_conn(conn).raw());
            prop_assert!(t.is_conn());
            prop_assert!(!t.is_piece());
            prop_assert!(!t.is_shutdown_flush());
            prop_assert_eq!(t.conn(), conn);
            prop_assert_eq!(t.local(), local);
            prop_assert_eq!(t.slot_index(), slot);
            prop_assert_ne!(t, BackendTag::FINAL_FLUSH);
        }

        #[test]
        fn pieces_never_look_like_connection_tags(n: u64) {
            let p = BackendTag::piece(n);
            prop_assert!(p.is_piece());
            prop_assert!(!p.is_conn());
            prop_assert_ne!(p, BackendTag::FINAL_FLUSH);
        }
    }
}
