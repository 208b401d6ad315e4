//! Reservations of one namespace (NVMe Base Specification 2.0,
//! "Reservations"; the wire format is `sluice_proto::reservation`): hosts
//! register keys, one acquires a reservation of a type that limits who
//! reads and writes, others may preempt it, and the I/O path refuses what
//! the reservation forbids with Reservation Conflict.
//!
//! A host is its Host Identifier (Connect data): every controller of one
//! host shares its registration, and a registration outlives the host's
//! controllers (it is the host's, not the association's). Registrations do
//! not persist through a restart of the target (no Persist Through Power
//! Loss: RESCAP bit 0 is clear and Report says PTPLS 0); a reload keeps
//! them with the namespace.
//!
//! The I/O path reads one atomic ([`Reservations::check`]) while no
//! reservation is held. Writes are counted from their check until their
//! backend request completes ([`WriteHold`]), so that Preempt and Abort
//! completes only once every write of the hosts it preempted that passed
//! its check is done ([`Reservations::drained`]): after it, none lands.
//!
//! Notices (Registration Preempted, Reservation Released, Reservation
//! Preempted) go into a bounded ring per namespace, addressed by Host
//! Identifier; each controller takes its host's at its periodic check
//! (`controller.rs`), queues them for the Reservation Notification log page
//! and raises an Asynchronous Event.

use sluice_proto::reservation::{
    notice, AcquireAction, AcquireCommand, RegisterAction, RegisterCommand, Registrant,
    ReleaseAction, ReleaseCommand, ReservationStatus, ReservationType,
};
use sluice_proto::Status;
use sluice_runtime::sync::lock;
use std::collections::VecDeque;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::{Arc, Mutex};

/// Hosts registered with one namespace at most: Host Identifiers are the
/// hosts' to choose, so a host cycling through them must not grow this
/// without bound.
pub const REGISTRANTS_MAX: usize = 1024;
/// Notices a namespace keeps for controllers to take; a controller that
/// falls further behind loses the oldest (the log page's count jumps).
pub const NOTICES_MAX: usize = 256;

/// What an I/O command does to the namespace, as reservations see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read (the read command group).
    Read,
    /// Write, Write Zeroes, Dataset Management, Flush (the write group).
    Write,
}

/// A host's Host Identifier.
pub type HostId = [u8; 16];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registration {
    hostid: HostId,
    key: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    rtype: ReservationType,
    /// The holder; for the All Registrants types every registrant holds
    /// it, and this is the one that acquired it.
    holder: HostId,
}

/// A notice for the controllers of host `hostid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    /// Position in the namespace's ring (from 1).
    pub seq: u64,
    pub hostid: HostId,
    /// One of `sluice_proto::reservation::notice`.
    pub kind: u8,
}

#[derive(Debug, Default)]
struct State {
    generation: u32,
    /// In registration order.
    registrants: Vec<Registration>,
    held: Option<Held>,
    notices: VecDeque<Notice>,
    /// The last notice's `seq`.
    notice_seq: u64,
}

/// The reservations of one namespace.
#[derive(Debug, Default)]
pub struct Reservations {
    /// A reservation is held (the I/O path's only read while none is).
    held: AtomicBool,
    state: Mutex<State>,
    drain: WriteDrain,
    /// Commands refused with Reservation Conflict (a metric).
    refused: AtomicU64,
    /// The last notice's `seq` (controllers look without the lock).
    notice_seq: AtomicU64,
}

impl State {
    fn registration(&self, hostid: &HostId) -> Option<&Registration> {
        self.registrants.iter().find(|r| r.hostid == *hostid)
    }

    fn holds(&self, hostid: &HostId) -> bool {
        match self.held {
            None => false,
            Some(h) if h.rtype.all_registrants() => self.registration(hostid).is_some(),
            Some(h) => h.holder == *hostid,
        }
    }

    fn notify(&mut self, hostid: HostId, kind: u8) {
        self.notice_seq += 1;
        if self.notices.len() == NOTICES_MAX {
            self.notices.pop_front();
        }
        self.notices.push_back(Notice {
            seq: self.notice_seq,
            hostid,
            kind,
        });
    }

    /// Tells every registrant but `by` that the reservation was released
    /// (the Registrants Only and All Registrants types: their registrants
    /// had access through it).
    fn released(&mut self, rtype: ReservationType, by: &HostId) {
        if !rtype.registrants_write() {
            return;
        }
        let others: Vec<HostId> = self
            .registrants
            .iter()
            .map(|r| r.hostid)
            .filter(|h| h != by)
            .collect();
        for h in others {
            self.notify(h, notice::RESERVATION_RELEASED);
        }
    }

    /// Removes `hostid`'s registration: a holder's reservation goes with
    /// it unless the type is All Registrants and others remain.
    fn unregister(&mut self, hostid: &HostId) {
        self.registrants.retain(|r| r.hostid != *hostid);
        let Some(h) = self.held else {
            return;
        };
        if h.rtype.all_registrants() {
            if let Some(next) = self.registrants.first() {
                self.held = Some(Held {
                    rtype: h.rtype,
                    holder: next.hostid,
                });
            } else {
                self.held = None;
            }
        } else if h.holder == *hostid {
            self.held = None;
            self.released(h.rtype, hostid);
        }
    }

    /// Unregisters every host but `except` whose key is `key`, telling
    /// each; false if there was none (nor `except` with that key).
    fn preempt_key(&mut self, key: u64, by: &HostId, include_self: bool) -> Vec<HostId> {
        let hit: Vec<HostId> = self
            .registrants
            .iter()
            .filter(|r| r.key == key && (include_self || r.hostid != *by))
            .map(|r| r.hostid)
            .collect();
        for h in &hit {
            self.unregister(h);
            if h != by {
                self.notify(*h, notice::REGISTRATION_PREEMPTED);
            }
        }
        hit
    }
}

impl Reservations {
    /// Whether `hostid` may do `access` now; Reservation Conflict if the
    /// reservation forbids it.
    pub fn check(&self, hostid: &HostId, access: Access) -> Result<(), Status> {
        if !self.held.load(SeqCst) {
            return Ok(());
        }
        let s = lock(&self.state);
        let Some(h) = s.held else {
            return Ok(());
        };
        if s.holds(hostid) {
            return Ok(());
        }
        let registered = s.registration(hostid).is_some();
        let allowed = match access {
            Access::Read => {
                !h.rtype.excludes_reads() || (h.rtype.registrants_write() && registered)
            }
            Access::Write => h.rtype.registrants_write() && registered,
        };
        if allowed {
            Ok(())
        } else {
            self.refused.fetch_add(1, SeqCst);
            Err(Status::RESERVATION_CONFLICT)
        }
    }

    /// [`Self::check`] for a write, counted until the hold drops (after
    /// its backend request completed).
    pub fn admit_write(self: &Arc<Self>, hostid: &HostId) -> Result<WriteHold, Status> {
        let hold = WriteHold {
            reservations: self.clone(),
            at: self.drain.enter(),
        };
        // Counted before the check: a Preempt and Abort that changes the
        // state after this check reads the count after its change.
        self.check(hostid, Access::Write)?;
        Ok(hold)
    }

    /// The reservation's type (0: none) and how many hosts are registered
    /// (for the metrics).
    pub fn summary(&self) -> (u8, usize) {
        let s = lock(&self.state);
        (s.held.map_or(0, |h| h.rtype.as_u8()), s.registrants.len())
    }

    /// Commands refused with Reservation Conflict so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(SeqCst)
    }

    /// Runs a change under the lock and publishes whether a reservation
    /// is held and the last notice.
    fn change<T>(&self, f: impl FnOnce(&mut State) -> Result<T, Status>) -> Result<T, Status> {
        let mut s = lock(&self.state);
        let r = f(&mut s);
        self.held.store(s.held.is_some(), SeqCst);
        self.notice_seq.store(s.notice_seq, SeqCst);
        r
    }

    /// Reservation Register with its data's keys (CRKEY, NRKEY).
    pub fn register(
        &self,
        hostid: &HostId,
        cmd: RegisterCommand,
        crkey: u64,
        nrkey: u64,
    ) -> Result<(), Status> {
        // CPTPL: nothing persists (RESCAP says so); like nvmet, a request
        // to persist is accepted and Report keeps saying PTPLS 0 (the
        // Linux host asks for it on every register through its pr_ops).
        self.change(|s| {
            let found = s.registration(hostid).copied();
            let key_ok = |r: &Registration| cmd.ignore_existing_key || r.key == crkey;
            match (cmd.action, found) {
                (RegisterAction::Register, Some(r)) => {
                    if r.key != nrkey {
                        return Err(Status::RESERVATION_CONFLICT);
                    }
                }
                (RegisterAction::Register, None) => {
                    if s.registrants.len() >= REGISTRANTS_MAX {
                        tracing::warn!(
                            registrants_max = REGISTRANTS_MAX,
                            "reservation register refused: the namespace has the most registrants it keeps"
                        );
                        return Err(Status::INTERNAL_ERROR.dnr());
                    }
                    s.registrants.push(Registration {
                        hostid: *hostid,
                        key: nrkey,
                    });
                }
                (RegisterAction::Unregister, Some(r)) if key_ok(&r) => s.unregister(hostid),
                (RegisterAction::Replace, Some(r)) if key_ok(&r) => {
                    if let Some(r) = s.registrants.iter_mut().find(|r| r.hostid == *hostid) {
                        r.key = nrkey;
                    }
                }
                (RegisterAction::Unregister | RegisterAction::Replace, _) => {
                    return Err(Status::RESERVATION_CONFLICT)
                }
            }
            s.generation = s.generation.wrapping_add(1);
            Ok(())
        })
    }

    /// Reservation Acquire with its data's keys (CRKEY, PRKEY). A Preempt
    /// and Abort returns the drain ticket to wait on
    /// ([`Self::drained`]) before completing.
    pub fn acquire(
        &self,
        hostid: &HostId,
        cmd: AcquireCommand,
        crkey: u64,
        prkey: u64,
    ) -> Result<Option<u64>, Status> {
        if cmd.ignore_existing_key {
            // nvmet and the 2.0 specification: IEKEY is reserved here.
            return Err(Status::INVALID_FIELD);
        }
        let rtype = cmd.rtype;
        self.change(|s| {
            match s.registration(hostid) {
                Some(r) if r.key == crkey => {}
                _ => return Err(Status::RESERVATION_CONFLICT),
            }
            if cmd.action == AcquireAction::Acquire {
                return match s.held {
                    None => {
                        s.held = Some(Held {
                            rtype,
                            holder: *hostid,
                        });
                        Ok(())
                    }
                    Some(h) if h.rtype == rtype && s.holds(hostid) => Ok(()),
                    Some(_) => Err(Status::RESERVATION_CONFLICT),
                };
            }
            match s.held {
                // No reservation: the registrants with key PRKEY go.
                None => {
                    if s.preempt_key(prkey, hostid, true).is_empty() {
                        return Err(Status::RESERVATION_CONFLICT);
                    }
                }
                Some(h) if h.rtype.all_registrants() => {
                    if prkey == 0 {
                        // Every other registrant goes; the preempter holds
                        // a reservation of the new type.
                        s.held = Some(Held {
                            rtype,
                            holder: *hostid,
                        });
                        let others: Vec<HostId> = s
                            .registrants
                            .iter()
                            .map(|r| r.hostid)
                            .filter(|h| h != hostid)
                            .collect();
                        s.registrants.retain(|r| r.hostid == *hostid);
                        for h in others {
                            s.notify(h, notice::REGISTRATION_PREEMPTED);
                        }
                    } else if s.preempt_key(prkey, hostid, true).is_empty() {
                        return Err(Status::RESERVATION_CONFLICT);
                    }
                }
                // The holder preempting itself: the type changes.
                Some(h) if h.holder == *hostid => {
                    s.held = Some(Held {
                        rtype,
                        holder: *hostid,
                    });
                    if h.rtype != rtype {
                        s.released(h.rtype, hostid);
                    }
                }
                Some(h) => {
                    let holder_key = s.registration(&h.holder).map(|r| r.key);
                    if holder_key == Some(prkey) {
                        // The holder is preempted: the preempter holds a
                        // reservation of the new type, and every other
                        // registrant with that key goes.
                        s.held = Some(Held {
                            rtype,
                            holder: *hostid,
                        });
                        let _ = s.preempt_key(prkey, hostid, false);
                        if h.rtype != rtype {
                            s.released(h.rtype, hostid);
                        }
                    } else if prkey == 0 {
                        return Err(Status::INVALID_FIELD);
                    } else if s.preempt_key(prkey, hostid, true).is_empty() {
                        return Err(Status::RESERVATION_CONFLICT);
                    }
                }
            }
            s.generation = s.generation.wrapping_add(1);
            Ok(())
        })?;
        Ok((cmd.action == AcquireAction::PreemptAndAbort).then(|| self.drain.ticket()))
    }

    /// Reservation Release with its data's key (CRKEY).
    pub fn release(&self, hostid: &HostId, cmd: ReleaseCommand, crkey: u64) -> Result<(), Status> {
        if cmd.ignore_existing_key {
            return Err(Status::INVALID_FIELD);
        }
        self.change(|s| {
            match s.registration(hostid) {
                Some(r) if r.key == crkey => {}
                _ => return Err(Status::RESERVATION_CONFLICT),
            }
            match cmd.action {
                ReleaseAction::Release => {
                    let Some(h) = s.held else {
                        return Ok(());
                    };
                    if !s.holds(hostid) {
                        return Ok(()); // Not the holder: nothing to release.
                    }
                    if h.rtype.as_u8() != cmd.rtype {
                        return Err(Status::INVALID_FIELD);
                    }
                    s.held = None;
                    s.released(h.rtype, hostid);
                }
                ReleaseAction::Clear => {
                    s.held = None;
                    let others: Vec<HostId> = s
                        .registrants
                        .iter()
                        .map(|r| r.hostid)
                        .filter(|h| h != hostid)
                        .collect();
                    s.registrants.clear();
                    for h in others {
                        s.notify(h, notice::RESERVATION_PREEMPTED);
                    }
                    s.generation = s.generation.wrapping_add(1);
                }
            }
            Ok(())
        })
    }

    /// The Reservation Status data structure now.
    pub fn report(&self) -> ReservationStatus {
        let s = lock(&self.state);
        let registrants: Vec<Registrant> = s
            .registrants
            .iter()
            .map(|r| Registrant {
                cntlid: 0xffff,
                holds: s.holds(&r.hostid),
                hostid: r.hostid,
                key: r.key,
            })
            .collect();
        ReservationStatus {
            generation: s.generation,
            rtype: s.held.map_or(0, |h| h.rtype.as_u8()),
            ptpl: false,
            // At most REGISTRANTS_MAX (1024).
            registrant_count: u16::try_from(registrants.len()).unwrap_or(u16::MAX),
            registrants,
        }
    }

    /// The notices for `hostid` after `seq`, and the last `seq` now (a
    /// controller keeps it for its next look). Notices that fell out of
    /// the ring are counted as lost by the gap in `seq`.
    pub fn notices_after(&self, seq: u64, hostid: &HostId) -> (Vec<Notice>, u64) {
        if self.notice_seq.load(SeqCst) == seq {
            return (Vec::new(), seq);
        }
        let s = lock(&self.state);
        let due = s
            .notices
            .iter()
            .filter(|n| n.seq > seq && n.hostid == *hostid)
            .copied()
            .collect();
        (due, s.notice_seq)
    }

    /// The last notice's `seq` (where a new controller starts).
    pub fn notice_seq(&self) -> u64 {
        self.notice_seq.load(SeqCst)
    }

    /// Whether every write counted before `ticket` was taken has completed
    /// (see [`WriteDrain`]); a Preempt and Abort polls this.
    pub fn drained(&self, ticket: u64) -> bool {
        self.drain.drained(ticket)
    }
}

/// Writes in flight in two phases, so a Preempt and Abort can wait for
/// those that passed their check before it without waiting for the ones
/// after it (which a busy holder never stops sending).
///
/// A writer adds itself to the phase `flips & 1` and checks that no flip
/// came in between. A waiter takes `ticket = flips` after its change; the
/// phases flip only into an empty slot, so `flips` reaching `ticket + 1`
/// means the phase before `ticket` drained, and the waiter is done when the
/// phase `ticket` drains too (or `flips` reached `ticket + 2`, which needed
/// that).
///
/// The counts are sharded by thread (each shard on its own cache line), so
/// workers writing to one namespace do not pass a line back and forth on
/// every write; a waiter sums the shards. A slot nobody may enter any more
/// only decreases (an entry that raced a flip is undone at once), so a sum
/// read shard by shard that comes to zero is exact.
#[derive(Debug, Default)]
struct WriteDrain {
    flips: AtomicU64,
    shards: [DrainShard; DRAIN_SHARDS],
}

/// Shards of a [`WriteDrain`]: more than the workers a target runs on
/// most machines; threads beyond share.
const DRAIN_SHARDS: usize = 16;

#[derive(Debug, Default)]
#[repr(align(64))]
struct DrainShard([AtomicU32; 2]);

/// This thread's shard.
fn drain_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Relaxed) % DRAIN_SHARDS;
    }
    SHARD.with(|s| *s)
}

impl WriteDrain {
    fn enter(&self) -> (usize, usize) {
        let at = drain_shard();
        let shard = &self.shards[at];
        loop {
            let f = self.flips.load(SeqCst);
            let slot = usize::from(f & 1 == 1);
            shard.0[slot].fetch_add(1, SeqCst);
            if self.flips.load(SeqCst) == f {
                return (at, slot);
            }
            shard.0[slot].fetch_sub(1, SeqCst);
        }
    }

    fn exit(&self, (shard, slot): (usize, usize)) {
        let before = self.shards[shard].0[slot].fetch_sub(1, SeqCst);
        debug_assert!(before > 0, "a write left a drain phase it was not in");
    }

    fn ticket(&self) -> u64 {
        self.flips.load(SeqCst)
    }

    /// Writes in `slot`, summed over the shards.
    fn count(&self, slot: usize) -> u64 {
        self.shards
            .iter()
            .map(|s| u64::from(s.0[slot].load(SeqCst)))
            .sum()
    }

    fn drained(&self, ticket: u64) -> bool {
        let slot_of = |f: u64| usize::from(f & 1 == 1);
        let f = self.flips.load(SeqCst);
        if f == ticket {
            if self.count(slot_of(ticket + 1)) != 0 {
                return false;
            }
            let _ = self
                .flips
                .compare_exchange(ticket, ticket + 1, SeqCst, SeqCst);
        }
        self.flips.load(SeqCst) >= ticket + 2 || self.count(slot_of(ticket)) == 0
    }
}

/// A write's place in its namespace's drain count, held until the command
/// that holds it is dropped (after its backend request completed).
#[derive(Debug)]
pub struct WriteHold {
    reservations: Arc<Reservations>,
    /// (shard, slot) in the drain.
    at: (usize, usize),
}

impl Drop for WriteHold {
    fn drop(&mut self) {
        self.reservations.drain.exit(self.at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::reservation::Cptpl;
    use sluice_proto::reservation::ReservationType::*;

    const A: HostId = [0xa; 16];
    const B: HostId = [0xb; 16];
    const C: HostId = [0xc; 16];

    fn reg(r: &Reservations, h: &HostId, key: u64) -> Result<(), Status> {
        let cmd = RegisterCommand {
            action: RegisterAction::Register,
            ignore_existing_key: false,
            cptpl: Cptpl::NoChange,
        };
        r.register(h, cmd, 0, key)
    }

    fn reg_action(
        r: &Reservations,
        h: &HostId,
        action: RegisterAction,
        iekey: bool,
        crkey: u64,
        nrkey: u64,
    ) -> Result<(), Status> {
        let cmd = RegisterCommand {
            action,
            ignore_existing_key: iekey,
            cptpl: Cptpl::NoChange,
        };
        r.register(h, cmd, crkey, nrkey)
    }

    fn acq(
        r: &Reservations,
        h: &HostId,
        action: AcquireAction,
        rtype: ReservationType,
        crkey: u64,
        prkey: u64,
    ) -> Result<Option<u64>, Status> {
        let cmd = AcquireCommand {
            action,
            ignore_existing_key: false,
            rtype,
        };
        r.acquire(h, cmd, crkey, prkey)
    }

    fn rel(
        r: &Reservations,
        h: &HostId,
        action: ReleaseAction,
        rtype: u8,
        crkey: u64,
    ) -> Result<(), Status> {
        let cmd = ReleaseCommand {
            action,
            ignore_existing_key: false,
            rtype,
        };
        r.release(h, cmd, crkey)
    }

    fn may(r: &Reservations, h: &HostId) -> (bool, bool) {
        (
            r.check(h, Access::Read).is_ok(),
            r.check(h, Access::Write).is_ok(),
        )
    }

    /// A (key 1) and B (key 2) registered; A holds a reservation of `rtype`.
    fn held_by_a(rtype: ReservationType) -> Arc<Reservations> {
        let r = Arc::new(Reservations::default());
        reg(&r, &A, 1).unwrap();
        reg(&r, &B, 2).unwrap();
        acq(&r, &A, AcquireAction::Acquire, rtype, 1, 0).unwrap();
        r
    }

    const CONFLICT: Result<(), Status> = Err(Status::RESERVATION_CONFLICT);

    #[test]
    fn each_type_lets_the_right_hosts_read_and_write() {
        // (type, registrant's access, non-registrant's access)
        let table = [
            (WriteExclusive, (true, false), (true, false)),
            (ExclusiveAccess, (false, false), (false, false)),
            (WriteExclusiveRegistrantsOnly, (true, true), (true, false)),
            (ExclusiveAccessRegistrantsOnly, (true, true), (false, false)),
            (WriteExclusiveAllRegistrants, (true, true), (true, false)),
            (ExclusiveAccessAllRegistrants, (true, true), (false, false)),
        ];
        for (rtype, registrant, stranger) in table {
            let r = Reservations::default();
            assert_eq!(may(&r, &C), (true, true), "no reservation: anyone");
            reg(&r, &A, 1).unwrap();
            reg(&r, &B, 2).unwrap();
            acq(&r, &A, AcquireAction::Acquire, rtype, 1, 0).unwrap();
            assert_eq!(may(&r, &A), (true, true), "{rtype:?}: the holder");
            assert_eq!(may(&r, &B), registrant, "{rtype:?}: a registrant");
            assert_eq!(may(&r, &C), stranger, "{rtype:?}: a stranger");
            let report = r.report();
            assert_eq!(report.rtype, rtype.as_u8());
            assert_eq!(report.registrant_count, 2);
            let holds: Vec<bool> = report.registrants.iter().map(|x| x.holds).collect();
            assert_eq!(holds, vec![true, rtype.all_registrants()]);
            rel(&r, &A, ReleaseAction::Release, rtype.as_u8(), 1).unwrap();
            assert_eq!(may(&r, &C), (true, true), "{rtype:?} released");
        }
        let r = Reservations::default();
        reg(&r, &A, 1).unwrap();
        acq(&r, &A, AcquireAction::Acquire, ExclusiveAccess, 1, 0).unwrap();
        let _ = r.check(&C, Access::Write);
        assert_eq!(r.refused(), 1);
    }

    #[test]
    fn register_unregister_and_replace_follow_the_keys() {
        let r = Reservations::default();
        reg(&r, &A, 5).unwrap();
        assert_eq!(reg(&r, &A, 5), Ok(()), "the same key again");
        assert_eq!(reg(&r, &A, 6), CONFLICT, "another key");
        assert_eq!(
            reg_action(&r, &A, RegisterAction::Replace, false, 4, 9),
            CONFLICT
        );
        reg_action(&r, &A, RegisterAction::Replace, false, 5, 9).unwrap();
        reg_action(&r, &A, RegisterAction::Replace, true, 0, 10).unwrap();
        assert_eq!(
            reg_action(&r, &B, RegisterAction::Replace, true, 0, 10),
            CONFLICT,
            "not registered"
        );
        assert_eq!(
            reg_action(&r, &A, RegisterAction::Unregister, false, 9, 0),
            CONFLICT
        );
        assert_eq!(r.report().generation, 4);
        reg_action(&r, &A, RegisterAction::Unregister, false, 10, 0).unwrap();
        assert_eq!(r.report().registrant_count, 0);
        assert_eq!(r.report().generation, 5);
        assert_eq!(
            reg_action(&r, &A, RegisterAction::Unregister, true, 0, 0),
            CONFLICT
        );
    }

    #[test]
    fn acquire_needs_the_key_and_conflicts_with_another_holder() {
        let r = Reservations::default();
        assert_eq!(
            acq(&r, &A, AcquireAction::Acquire, WriteExclusive, 1, 0),
            Err(Status::RESERVATION_CONFLICT)
        );
        reg(&r, &A, 1).unwrap();
        reg(&r, &B, 2).unwrap();
        assert_eq!(
            acq(&r, &A, AcquireAction::Acquire, WriteExclusive, 7, 0),
            Err(Status::RESERVATION_CONFLICT)
        );
        acq(&r, &A, AcquireAction::Acquire, WriteExclusive, 1, 0).unwrap();
        assert_eq!(
            acq(&r, &A, AcquireAction::Acquire, WriteExclusive, 1, 0),
            Ok(None)
        );
        assert_eq!(
            acq(&r, &A, AcquireAction::Acquire, ExclusiveAccess, 1, 0),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            acq(&r, &B, AcquireAction::Acquire, WriteExclusive, 2, 0),
            Err(Status::RESERVATION_CONFLICT)
        );
        // A release by a registrant that does not hold it changes nothing;
        // the holder's release with another type is Invalid Field.
        assert_eq!(rel(&r, &B, ReleaseAction::Release, 1, 2), Ok(()));
        assert_eq!(
            rel(&r, &A, ReleaseAction::Release, 2, 1),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(r.report().rtype, 1);
        let iekey = AcquireCommand {
            action: AcquireAction::Acquire,
            ignore_existing_key: true,
            rtype: WriteExclusive,
        };
        assert_eq!(r.acquire(&A, iekey, 1, 0), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn all_registrants_share_the_reservation_until_the_last_leaves() {
        let r = held_by_a(ExclusiveAccessAllRegistrants);
        assert_eq!(
            acq(
                &r,
                &B,
                AcquireAction::Acquire,
                ExclusiveAccessAllRegistrants,
                2,
                0
            ),
            Ok(None)
        );
        reg_action(&r, &A, RegisterAction::Unregister, false, 1, 0).unwrap();
        assert_eq!(r.report().rtype, 6, "B still holds it");
        assert_eq!(may(&r, &A), (false, false));
        reg_action(&r, &B, RegisterAction::Unregister, false, 2, 0).unwrap();
        assert_eq!(r.report().rtype, 0);
        assert_eq!(may(&r, &A), (true, true));
    }

    #[test]
    fn preempting_the_holder_moves_the_reservation_and_unregisters_it() {
        let r = Reservations::default();
        reg(&r, &A, 1).unwrap();
        reg(&r, &B, 2).unwrap();
        reg(&r, &C, 1).unwrap();
        acq(&r, &A, AcquireAction::Acquire, WriteExclusive, 1, 0).unwrap();
        let seq = r.notice_seq();
        // B preempts A's key: A and C (same key) go, B holds it as EA.
        acq(&r, &B, AcquireAction::Preempt, ExclusiveAccess, 2, 1).unwrap();
        let report = r.report();
        assert_eq!((report.rtype, report.registrant_count), (2, 1));
        assert_eq!(report.registrants[0].hostid, B);
        assert_eq!(may(&r, &A), (false, false));
        assert_eq!(may(&r, &B), (true, true));
        let (to_a, _) = r.notices_after(seq, &A);
        assert_eq!(
            to_a.iter().map(|n| n.kind).collect::<Vec<_>>(),
            vec![notice::REGISTRATION_PREEMPTED]
        );
        assert_eq!(r.notices_after(seq, &C).0.len(), 1);
        assert!(r.notices_after(seq, &B).0.is_empty());
        // A PRKEY nobody has: conflict; 0 against a holder: Invalid Field.
        reg(&r, &A, 3).unwrap();
        assert_eq!(
            acq(&r, &A, AcquireAction::Preempt, WriteExclusive, 3, 77),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            acq(&r, &A, AcquireAction::Preempt, WriteExclusive, 3, 0),
            Err(Status::INVALID_FIELD)
        );
        // A registrant's key that is not the holder's: that registration
        // goes, the reservation stays.
        reg(&r, &C, 4).unwrap();
        acq(&r, &A, AcquireAction::Preempt, WriteExclusive, 3, 4).unwrap();
        let report = r.report();
        assert_eq!((report.rtype, report.registrant_count), (2, 2));
    }

    #[test]
    fn preempt_without_a_reservation_removes_registrations_only() {
        let r = Reservations::default();
        reg(&r, &A, 1).unwrap();
        reg(&r, &B, 2).unwrap();
        acq(&r, &A, AcquireAction::Preempt, WriteExclusive, 1, 2).unwrap();
        let report = r.report();
        assert_eq!((report.rtype, report.registrant_count), (0, 1));
        assert_eq!(
            acq(&r, &A, AcquireAction::Preempt, WriteExclusive, 1, 2),
            Err(Status::RESERVATION_CONFLICT)
        );
    }

    #[test]
    fn preempting_all_registrants_with_key_zero_takes_it_alone() {
        let r = Reservations::default();
        reg(&r, &A, 1).unwrap();
        reg(&r, &B, 2).unwrap();
        reg(&r, &C, 3).unwrap();
        acq(
            &r,
            &A,
            AcquireAction::Acquire,
            WriteExclusiveAllRegistrants,
            1,
            0,
        )
        .unwrap();
        acq(&r, &B, AcquireAction::Preempt, WriteExclusive, 2, 0).unwrap();
        let report = r.report();
        assert_eq!((report.rtype, report.registrant_count), (1, 1));
        assert_eq!(may(&r, &A), (true, false));
        assert_eq!(may(&r, &B), (true, true));
    }

    #[test]
    fn the_holder_unregistering_releases_and_tells_registrants_only_types() {
        let r = held_by_a(WriteExclusiveRegistrantsOnly);
        let seq = r.notice_seq();
        reg_action(&r, &A, RegisterAction::Unregister, false, 1, 0).unwrap();
        assert_eq!(r.report().rtype, 0);
        let (to_b, last) = r.notices_after(seq, &B);
        assert_eq!(to_b.len(), 1);
        assert_eq!(to_b[0].kind, notice::RESERVATION_RELEASED);
        assert_eq!(last, seq + 1);
        // A plain Write Exclusive holder leaving tells no one.
        acq(&r, &B, AcquireAction::Acquire, WriteExclusive, 2, 0).unwrap();
        reg_action(&r, &B, RegisterAction::Unregister, false, 2, 0).unwrap();
        assert_eq!(r.notice_seq(), last);
    }

    #[test]
    fn clear_drops_everything_and_tells_the_others() {
        let r = held_by_a(ExclusiveAccess);
        assert_eq!(
            rel(&r, &C, ReleaseAction::Clear, 0, 0),
            CONFLICT,
            "not registered"
        );
        rel(&r, &B, ReleaseAction::Clear, 0, 2).unwrap();
        let report = r.report();
        assert_eq!((report.rtype, report.registrant_count), (0, 0));
        assert_eq!(
            r.notices_after(0, &A).0[0].kind,
            notice::RESERVATION_PREEMPTED
        );
        assert!(r.notices_after(0, &B).0.is_empty());
        assert_eq!(may(&r, &C), (true, true));
    }

    #[test]
    fn registrations_are_bounded_and_notices_kept_in_a_ring() {
        let r = Reservations::default();
        for i in 0..REGISTRANTS_MAX {
            let mut h = [0u8; 16];
            h[..8].copy_from_slice(&(i as u64).to_le_bytes());
            reg(&r, &h, 1).unwrap();
        }
        let err = reg(&r, &[0xff; 16], 1).unwrap_err();
        assert!(err.same_code(Status::INTERNAL_ERROR) && err.dnr);
        // Clearing tells every other registrant: more than the ring keeps.
        let mut first = [0u8; 16];
        first[..8].copy_from_slice(&0u64.to_le_bytes());
        rel(&r, &first, ReleaseAction::Clear, 0, 1).unwrap();
        assert_eq!(r.notice_seq(), (REGISTRANTS_MAX - 1) as u64);
        let mut last = [0u8; 16];
        last[..8].copy_from_slice(&((REGISTRANTS_MAX - 1) as u64).to_le_bytes());
        assert_eq!(r.notices_after(0, &last).0.len(), 1);
        let mut early = [0u8; 16];
        early[..8].copy_from_slice(&1u64.to_le_bytes());
        assert!(
            r.notices_after(0, &early).0.is_empty(),
            "fell out of the ring"
        );
    }

    #[test]
    fn preempt_and_abort_waits_for_the_writes_that_passed_before_it() {
        let r = held_by_a(WriteExclusive);
        let a_write = r.admit_write(&A).unwrap();
        assert_eq!(r.admit_write(&B).unwrap_err(), Status::RESERVATION_CONFLICT);
        let ticket = acq(&r, &B, AcquireAction::PreemptAndAbort, WriteExclusive, 2, 1)
            .unwrap()
            .expect("a ticket");
        assert!(!r.drained(ticket), "A's write is still in flight");
        // The new holder's writes keep coming and do not hold it up.
        let b_write = r.admit_write(&B).unwrap();
        assert!(!r.drained(ticket));
        drop(a_write);
        assert!(r.drained(ticket));
        assert!(r.drained(ticket), "stays drained");
        assert_eq!(r.admit_write(&A).unwrap_err(), Status::RESERVATION_CONFLICT);
        drop(b_write);
        // A plain Preempt has no ticket.
        reg(&r, &C, 3).unwrap();
        assert_eq!(
            acq(&r, &C, AcquireAction::Preempt, WriteExclusive, 3, 2),
            Ok(None)
        );
    }

    #[test]
    fn a_write_held_on_another_thread_is_waited_for() {
        let r = held_by_a(WriteExclusive);
        let (hold_tx, hold_rx) = std::sync::mpsc::channel();
        let (drop_tx, drop_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let r = r.clone();
            std::thread::spawn(move || {
                let hold = r.admit_write(&A).expect("A holds it");
                hold_tx.send(hold.at.0).unwrap();
                drop_rx.recv().unwrap();
                drop(hold);
            })
        };
        let shard = hold_rx.recv().unwrap();
        let mine = r.admit_write(&A).unwrap();
        assert_ne!(shard, mine.at.0, "each thread counts in its own shard");
        drop(mine);
        let ticket = acq(&r, &B, AcquireAction::PreemptAndAbort, WriteExclusive, 2, 1)
            .unwrap()
            .expect("a ticket");
        assert!(!r.drained(ticket), "the other thread's write is in flight");
        drop_tx.send(()).unwrap();
        writer.join().unwrap();
        assert!(r.drained(ticket));
    }

    #[test]
    fn drains_in_a_row_each_wait_for_their_own_writes() {
        let d = WriteDrain::default();
        let old = d.enter();
        let t0 = d.ticket();
        assert!(!d.drained(t0), "the write before t0 is in flight");
        let new = d.enter(); // after t0's flip: the other phase
        assert_ne!(old.1, new.1);
        let t1 = d.ticket();
        assert_ne!(t0, t1);
        assert!(!d.drained(t1), "both writes came before t1");
        d.exit(old);
        assert!(d.drained(t0), "t0 waits only for the write before it");
        assert!(!d.drained(t1));
        let newer = d.enter(); // after t1's flip
        d.exit(new);
        assert!(d.drained(t1), "t1 does not wait for the write after it");
        assert!(d.drained(t0));
        d.exit(newer);
        assert_eq!(d.count(0) + d.count(1), 0);
    }
}
