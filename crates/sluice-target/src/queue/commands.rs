//! The in-flight command table the stages share: one slot per admitted
//! command, from admission to its completion. A slot's index is the R2T
//! transfer tag and the slot of its backend tag; the table also finds a
//! slot by CID (CID conflicts) and counts outstanding commands (queue
//! depth). The CIDs in use are a bitmap (8 KiB per queue): every command
//! checks its CID, and a bit costs less than hashing a key the host chose
//! (SipHash was 2-3 % of the target's core at 4 KiB QD 32), with no worst
//! case a hostile host can pick.

use crate::subsystem::Namespace;
use sluice_backend::{AlignedBuf, IoOp};
use sluice_proto::{Sqe, Status};
use std::sync::Arc;

/// What executing a command means, decided at admission.
#[derive(Debug)]
pub(super) enum CmdKind {
    /// Fabrics or admin command whose data has arrived and is executed inline.
    Inline,
    Read {
        ns: Arc<Namespace>,
        offset_bytes: u64,
        len_bytes: u64,
    },
    Write {
        ns: Arc<Namespace>,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
    },
    /// Flush, Write Zeroes, DSM: one or more backend ops without data.
    NoData {
        ops: Vec<(Arc<Namespace>, IoOp, u64, u64)>,
        write: bool,
    },
    /// Dataset Management: the ranges are decoded once the data is in.
    Dsm {
        ns: Arc<Namespace>,
        nr: u32,
        deallocate: bool,
    },
    /// Reservation Register, Acquire, Release or Report, executed inline
    /// against the namespace's reservations (`reservation.rs`).
    Reservation { ns: Arc<Namespace> },
}

/// One admitted command.
#[derive(Debug)]
pub(super) struct Cmd {
    pub(super) sqe: Sqe,
    pub(super) kind: CmdKind,
    /// Host-to-controller data being received (R2T path).
    pub(super) buf: Option<AlignedBuf>,
    pub(super) h2c_expected: u32,
    pub(super) h2c_received: u32,
    /// A data digest error was seen: fail the command once its data is in.
    pub(super) digest_error: bool,
    /// Backend requests issued and not yet completed.
    pub(super) ops_pending: u32,
    pub(super) status: Status,
    /// A write's place in its namespace's fence counts, held until the
    /// command is freed (after its backend requests completed).
    pub(super) fence: Option<crate::fence::FenceHold>,
    /// A write's place in its namespace's reservation drain, held until
    /// the command is freed (a Preempt and Abort waits for it).
    pub(super) write_hold: Option<crate::reservation::WriteHold>,
}

impl Cmd {
    pub(super) fn new(sqe: Sqe, kind: CmdKind, digest_ok: bool) -> Self {
        Cmd {
            sqe,
            kind,
            buf: None,
            h2c_expected: 0,
            h2c_received: 0,
            digest_error: !digest_ok,
            ops_pending: 0,
            status: Status::SUCCESS,
            fence: None,
            write_hold: None,
        }
    }
}

/// Admitted commands by slot.
#[derive(Debug, Default)]
pub(super) struct CommandTable {
    slots: Vec<Option<Cmd>>,
    free: Vec<u16>,
    /// One bit per CID in use (allocated at the first command).
    cids: Box<[u64]>,
    outstanding: u16,
}

/// Words of the CID bitmap: 65536 bits.
const CID_WORDS: usize = 1 << 10;

fn cid_bit(cid: u16) -> (usize, u64) {
    (usize::from(cid >> 6), 1u64 << (cid & 63))
}

impl CommandTable {
    /// Stores `cmd` in a free slot and returns the slot. The caller has
    /// checked the queue depth and that the CID is not in use.
    pub(super) fn alloc(&mut self, cmd: Cmd) -> u16 {
        let cid = cmd.sqe.cid();
        debug_assert!(!self.has_cid(cid), "CID {cid} in use");
        if self.cids.is_empty() {
            self.cids = vec![0u64; CID_WORDS].into_boxed_slice();
        }
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(cmd);
                s
            }
            None => {
                // The caller checked the queue depth (a u16): there are
                // fewer slots than that.
                debug_assert!(self.slots.len() < usize::from(u16::MAX));
                #[allow(clippy::cast_possible_truncation)]
                let s = self.slots.len() as u16;
                self.slots.push(Some(cmd));
                s
            }
        };
        let (w, bit) = cid_bit(cid);
        if let Some(word) = self.cids.get_mut(w) {
            *word |= bit;
        }
        self.outstanding += 1;
        slot
    }

    /// Takes the command out of `slot`; None when the slot is empty.
    pub(super) fn free(&mut self, slot: u16) -> Option<Cmd> {
        let cmd = self.slots.get_mut(slot as usize)?.take()?;
        let (w, bit) = cid_bit(cmd.sqe.cid());
        if let Some(word) = self.cids.get_mut(w) {
            *word &= !bit;
        }
        self.free.push(slot);
        debug_assert!(
            self.outstanding > 0,
            "a command was taken from an empty table"
        );
        self.outstanding -= 1;
        Some(cmd)
    }

    pub(super) fn get(&self, slot: u16) -> Option<&Cmd> {
        self.slots.get(slot as usize).and_then(|c| c.as_ref())
    }

    pub(super) fn get_mut(&mut self, slot: u16) -> Option<&mut Cmd> {
        self.slots.get_mut(slot as usize).and_then(|c| c.as_mut())
    }

    /// Whether a command with `cid` is outstanding.
    pub(super) fn has_cid(&self, cid: u16) -> bool {
        let (w, bit) = cid_bit(cid);
        self.cids.get(w).is_some_and(|word| word & bit != 0)
    }

    /// The slot of the outstanding command with `cid`.
    pub(super) fn slot_of(&self, cid: u16) -> Option<u16> {
        if !self.has_cid(cid) {
            return None;
        }
        // Rare (an admin queue's abandoned AER): a scan of the slots.
        self.slots
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.sqe.cid() == cid))
            .and_then(|i| u16::try_from(i).ok())
    }

    pub(super) fn outstanding(&self) -> u16 {
        self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(cid: u16) -> Cmd {
        Cmd::new(Sqe::new(0, cid, 0), CmdKind::Inline, true)
    }

    /// The CID bitmap against a map, at the edges of its words and of the
    /// CID range and over random CIDs a host could choose.
    #[test]
    fn cids_are_found_as_a_map_finds_them() {
        let mut t = CommandTable::default();
        assert!(!t.has_cid(0) && t.slot_of(0).is_none(), "empty table");
        let mut model = std::collections::HashMap::new();
        for cid in [0u16, 63, 64, 65535, 1000] {
            model.insert(cid, t.alloc(cmd(cid)));
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            #[allow(clippy::cast_possible_truncation)]
            let cid = if x & 1 == 0 {
                (x >> 16) as u16
            } else {
                (x >> 16) as u16 & 0x7f
            };
            assert_eq!(t.has_cid(cid), model.contains_key(&cid), "cid {cid}");
            assert_eq!(t.slot_of(cid), model.get(&cid).copied(), "cid {cid}");
            match model.remove(&cid) {
                Some(slot) => assert_eq!(t.free(slot).map(|c| c.sqe.cid()), Some(cid)),
                None if model.len() < 200 => {
                    model.insert(cid, t.alloc(cmd(cid)));
                }
                None => {}
            }
            assert_eq!(usize::from(t.outstanding()), model.len());
        }
    }

    #[test]
    fn slots_are_reused_and_counted() {
        let mut t = CommandTable::default();
        let a = t.alloc(cmd(10));
        let b = t.alloc(cmd(11));
        assert_ne!(a, b);
        assert_eq!(t.outstanding(), 2);
        assert!(t.has_cid(10) && t.has_cid(11));
        assert_eq!(t.get(a).map(|c| c.sqe.cid()), Some(10));
        let c = t.free(a).expect("slot in use");
        assert_eq!(c.sqe.cid(), 10);
        assert!(!t.has_cid(10));
        assert_eq!(t.outstanding(), 1);
        // A freed slot is freed once.
        assert!(t.free(a).is_none());
        assert_eq!(t.outstanding(), 1);
        // ... and handed out again.
        assert_eq!(t.alloc(cmd(12)), a);
        assert!(t.get_mut(b).is_some());
    }

    #[test]
    fn unknown_slots_are_none() {
        let mut t = CommandTable::default();
        assert!(t.get(0).is_none());
        assert!(t.get_mut(u16::MAX).is_none());
        assert!(t.free(7).is_none());
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn a_new_command_starts_clean() {
        let c = Cmd::new(Sqe::new(1, 3, 1), CmdKind::Inline, false);
        assert!(c.digest_error);
        assert_eq!(c.ops_pending, 0);
        assert!(c.status.is_success());
        assert!(c.buf.is_none());
    }
}
