//! Reservations (NVM command set; NVMe Base Specification 2.0, "Reservations"):
//! the four commands' fields and data, the Reservation Status data
//! structure a Reservation Report returns (the extended form: NVMe over
//! Fabrics hosts have 128-bit Host Identifiers), and the Reservation
//! Notification log page (LID 80h).
//!
//! Everything here parses bytes from the network: decoders return `None`
//! or a [`Status`], never panic.

use crate::command::Sqe;
use crate::wire::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use crate::Status;

/// Opcodes of the reservation commands (NVM command set).
pub mod opcode {
    pub const REGISTER: u8 = 0x0d;
    pub const REPORT: u8 = 0x0e;
    pub const ACQUIRE: u8 = 0x11;
    pub const RELEASE: u8 = 0x15;
}

/// Identify Namespace RESCAP (byte 31): every reservation type and Ignore
/// Existing Key as revision 1.3 defines it; bit 0 (Persist Through Power
/// Loss) is not among them.
pub const RESCAP_ALL_TYPES_IEKEY: u8 = 0xfe;

/// Bytes of Register and Acquire data (CRKEY, then NRKEY or PRKEY).
pub const KEYS_DATA_BYTES: u32 = 16;
/// Bytes of Release data (CRKEY).
pub const RELEASE_DATA_BYTES: u32 = 8;
/// Bytes of the extended Reservation Status header, and of each
/// extended Registrant entry.
pub const EXTENDED_HEADER_BYTES: usize = 64;
pub const EXTENDED_ENTRY_BYTES: usize = 64;
/// Bytes of the Reservation Notification log page.
pub const NOTIFICATION_LOG_BYTES: usize = 64;

/// A reservation's type (RTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReservationType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl ReservationType {
    pub const ALL: [ReservationType; 6] = [
        ReservationType::WriteExclusive,
        ReservationType::ExclusiveAccess,
        ReservationType::WriteExclusiveRegistrantsOnly,
        ReservationType::ExclusiveAccessRegistrantsOnly,
        ReservationType::WriteExclusiveAllRegistrants,
        ReservationType::ExclusiveAccessAllRegistrants,
    ];

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_u8() == v)
    }

    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Every registrant holds the reservation (types 5 and 6).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants other than the holder may write (types 3 to 6).
    pub fn registrants_write(self) -> bool {
        !matches!(self, Self::WriteExclusive | Self::ExclusiveAccess)
    }

    /// Non-registrants may not read either (the Exclusive Access types).
    pub fn excludes_reads(self) -> bool {
        matches!(
            self,
            Self::ExclusiveAccess
                | Self::ExclusiveAccessRegistrantsOnly
                | Self::ExclusiveAccessAllRegistrants
        )
    }
}

/// Reservation Register action (RREGA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    Register = 0,
    Unregister = 1,
    Replace = 2,
}

/// Reservation Acquire action (RACQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    Acquire = 0,
    Preempt = 1,
    PreemptAndAbort = 2,
}

/// Reservation Release action (RRELA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    Release = 0,
    Clear = 1,
}

/// Change Persist Through Power Loss State (CPTPL) of a Register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cptpl {
    NoChange = 0,
    Clear = 2,
    Set = 3,
}

/// Ignore Existing Key (CDW10 bit 3).
const IEKEY: u32 = 1 << 3;

/// A Reservation Register command's fields (CDW10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterCommand {
    pub action: RegisterAction,
    pub ignore_existing_key: bool,
    pub cptpl: Cptpl,
}

impl RegisterCommand {
    /// Reads CDW10: a reserved action or CPTPL value is Invalid Field.
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        let cdw10 = sqe.cdw(10);
        let action = match cdw10 & 0x7 {
            0 => RegisterAction::Register,
            1 => RegisterAction::Unregister,
            2 => RegisterAction::Replace,
            _ => return Err(Status::INVALID_FIELD),
        };
        let cptpl = match cdw10 >> 30 {
            0 => Cptpl::NoChange,
            2 => Cptpl::Clear,
            3 => Cptpl::Set,
            _ => return Err(Status::INVALID_FIELD),
        };
        Ok(RegisterCommand {
            action,
            ignore_existing_key: cdw10 & IEKEY != 0,
            cptpl,
        })
    }

    pub fn write_to(&self, sqe: &mut Sqe) {
        let iekey = if self.ignore_existing_key { IEKEY } else { 0 };
        sqe.set_cdw(10, self.action as u32 | iekey | (self.cptpl as u32) << 30);
    }
}

/// A Reservation Acquire command's fields (CDW10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireCommand {
    pub action: AcquireAction,
    pub ignore_existing_key: bool,
    pub rtype: ReservationType,
}

impl AcquireCommand {
    /// Reads CDW10: a reserved action or type is Invalid Field.
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        let cdw10 = sqe.cdw(10);
        let action = match cdw10 & 0x7 {
            0 => AcquireAction::Acquire,
            1 => AcquireAction::Preempt,
            2 => AcquireAction::PreemptAndAbort,
            _ => return Err(Status::INVALID_FIELD),
        };
        let rtype =
            ReservationType::from_u8(((cdw10 >> 8) & 0xff) as u8).ok_or(Status::INVALID_FIELD)?;
        Ok(AcquireCommand {
            action,
            ignore_existing_key: cdw10 & IEKEY != 0,
            rtype,
        })
    }

    pub fn write_to(&self, sqe: &mut Sqe) {
        let iekey = if self.ignore_existing_key { IEKEY } else { 0 };
        sqe.set_cdw(
            10,
            self.action as u32 | iekey | u32::from(self.rtype.as_u8()) << 8,
        );
    }
}

/// A Reservation Release command's fields (CDW10). The type is kept raw:
/// a Clear ignores it, and a Release of a type that does not match the
/// reservation is answered by the reservation's state, not by parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseCommand {
    pub action: ReleaseAction,
    pub ignore_existing_key: bool,
    pub rtype: u8,
}

impl ReleaseCommand {
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        let cdw10 = sqe.cdw(10);
        let action = match cdw10 & 0x7 {
            0 => ReleaseAction::Release,
            1 => ReleaseAction::Clear,
            _ => return Err(Status::INVALID_FIELD),
        };
        Ok(ReleaseCommand {
            action,
            ignore_existing_key: cdw10 & IEKEY != 0,
            rtype: ((cdw10 >> 8) & 0xff) as u8,
        })
    }

    pub fn write_to(&self, sqe: &mut Sqe) {
        let iekey = if self.ignore_existing_key { IEKEY } else { 0 };
        sqe.set_cdw(10, self.action as u32 | iekey | u32::from(self.rtype) << 8);
    }
}

/// A Reservation Report command's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportCommand {
    /// Bytes to return: (NUMD + 1) × 4.
    pub len_bytes: u64,
    /// Extended Data Structure (CDW11 bit 0): 128-bit Host Identifiers.
    pub extended: bool,
}

impl ReportCommand {
    pub fn parse(sqe: &Sqe) -> Self {
        ReportCommand {
            len_bytes: (u64::from(sqe.cdw(10)) + 1) * 4,
            extended: sqe.cdw(11) & 1 != 0,
        }
    }

    /// `len_bytes` rounded up to whole dwords (at least one).
    pub fn write_to(&self, sqe: &mut Sqe) {
        let dwords = self.len_bytes.div_ceil(4).clamp(1, 1 << 32);
        sqe.set_cdw(10, u32::try_from(dwords - 1).unwrap_or(u32::MAX));
        sqe.set_cdw(11, u32::from(self.extended));
    }
}

/// The two keys of Register (CRKEY, NRKEY) or Acquire (CRKEY, PRKEY)
/// data; `None` if `data` is shorter than 16 bytes.
pub fn two_keys(data: &[u8]) -> Option<(u64, u64)> {
    (data.len() >= 16).then(|| (u64_at(data, 0), u64_at(data, 8)))
}

/// Register or Acquire data.
pub fn encode_two_keys(current: u64, other: u64) -> Vec<u8> {
    let mut b = vec![0; 16];
    put_u64(&mut b, 0, current);
    put_u64(&mut b, 8, other);
    b
}

/// The key of Release data (CRKEY); `None` if shorter than 8 bytes.
pub fn one_key(data: &[u8]) -> Option<u64> {
    (data.len() >= 8).then(|| u64_at(data, 0))
}

/// One registrant in a Reservation Report (extended entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    /// Controller ID; FFFFh (a dynamic controller, or the host's
    /// registration rather than one controller's).
    pub cntlid: u16,
    /// Holds the reservation (RCSTS bit 0).
    pub holds: bool,
    pub hostid: [u8; 16],
    pub key: u64,
}

/// The Reservation Status data structure (extended form).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReservationStatus {
    /// Persistent Reservation Generation.
    pub generation: u32,
    /// The reservation's type, 0 when there is none.
    pub rtype: u8,
    /// Persist Through Power Loss State.
    pub ptpl: bool,
    /// Registrants in total (REGCTL), even those `len` left out.
    pub registrant_count: u16,
    /// The registrants the data holds.
    pub registrants: Vec<Registrant>,
}

impl ReservationStatus {
    /// The extended structure, cut or zero-padded to `len` bytes (what
    /// the host asked for; entries that do not fit whole are left out).
    pub fn encode_extended(&self, len: usize) -> Vec<u8> {
        let whole = EXTENDED_HEADER_BYTES + self.registrants.len() * EXTENDED_ENTRY_BYTES;
        let mut b = vec![0u8; whole.max(len)];
        put_u32(&mut b, 0, self.generation);
        b[4] = self.rtype;
        put_u16(&mut b, 5, self.registrant_count);
        b[9] = u8::from(self.ptpl);
        for (i, r) in self.registrants.iter().enumerate() {
            let at = EXTENDED_HEADER_BYTES + i * EXTENDED_ENTRY_BYTES;
            if at + EXTENDED_ENTRY_BYTES > len {
                break;
            }
            put_u16(&mut b, at, r.cntlid);
            b[at + 2] = u8::from(r.holds);
            put_u64(&mut b, at + 8, r.key);
            b[at + 16..at + 32].copy_from_slice(&r.hostid);
        }
        b.truncate(len);
        b
    }

    /// Reads the extended structure: the header and the entries `data`
    /// holds whole (at most REGCTL of them); `None` if shorter than the
    /// header.
    pub fn decode_extended(data: &[u8]) -> Option<Self> {
        if data.len() < EXTENDED_HEADER_BYTES {
            return None;
        }
        let registrant_count = u16_at(data, 5);
        let fit = (data.len() - EXTENDED_HEADER_BYTES) / EXTENDED_ENTRY_BYTES;
        let registrants = (0..fit.min(usize::from(registrant_count)))
            .map(|i| {
                let at = EXTENDED_HEADER_BYTES + i * EXTENDED_ENTRY_BYTES;
                let mut hostid = [0u8; 16];
                hostid.copy_from_slice(&data[at + 16..at + 32]);
                Registrant {
                    cntlid: u16_at(data, at),
                    holds: data[at + 2] & 1 != 0,
                    hostid,
                    key: u64_at(data, at + 8),
                }
            })
            .collect();
        Some(ReservationStatus {
            generation: u32_at(data, 0),
            rtype: data[4],
            ptpl: data[9] & 1 != 0,
            registrant_count,
            registrants,
        })
    }

    /// The reservation's type, if one is held.
    pub fn reservation(&self) -> Option<ReservationType> {
        ReservationType::from_u8(self.rtype)
    }
}

/// Reservation Notification log page types.
pub mod notice {
    /// The page is empty.
    pub const EMPTY: u8 = 0;
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    pub const RESERVATION_RELEASED: u8 = 2;
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

/// Reservation Notification Mask (feature 82h) bits: a set bit masks the
/// notice.
pub mod mask {
    pub const REGISTRATION_PREEMPTED: u32 = 1 << 1;
    pub const RESERVATION_RELEASED: u32 = 1 << 2;
    pub const RESERVATION_PREEMPTED: u32 = 1 << 3;
    pub const ALL: u32 = REGISTRATION_PREEMPTED | RESERVATION_RELEASED | RESERVATION_PREEMPTED;
}

/// The Reservation Notification log page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotificationLog {
    /// Log Page Count: moves by one per notice (0 when the page is empty;
    /// a jump tells the host how many notices were lost).
    pub count: u64,
    /// One of [`notice`].
    pub kind: u8,
    /// Notices still waiting after this one (at most 255).
    pub available: u8,
    pub nsid: u32,
}

impl NotificationLog {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; NOTIFICATION_LOG_BYTES];
        put_u64(&mut b, 0, self.count);
        b[8] = self.kind;
        b[9] = self.available;
        put_u32(&mut b, 12, self.nsid);
        b
    }

    pub fn decode(data: &[u8]) -> Option<Self> {
        (data.len() >= 16).then(|| NotificationLog {
            count: u64_at(data, 0),
            kind: data[8],
            available: data[9],
            nsid: u32_at(data, 12),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn commands_round_trip_through_cdw10() {
        let mut sqe = Sqe::new(opcode::REGISTER, 1, 1);
        let reg = RegisterCommand {
            action: RegisterAction::Replace,
            ignore_existing_key: true,
            cptpl: Cptpl::Set,
        };
        reg.write_to(&mut sqe);
        assert_eq!(sqe.cdw(10), 2 | 1 << 3 | 3 << 30);
        assert_eq!(RegisterCommand::parse(&sqe), Ok(reg));
        let acq = AcquireCommand {
            action: AcquireAction::PreemptAndAbort,
            ignore_existing_key: false,
            rtype: ReservationType::ExclusiveAccessAllRegistrants,
        };
        acq.write_to(&mut sqe);
        assert_eq!(sqe.cdw(10), 2 | 6 << 8);
        assert_eq!(AcquireCommand::parse(&sqe), Ok(acq));
        let rel = ReleaseCommand {
            action: ReleaseAction::Clear,
            ignore_existing_key: false,
            rtype: 0,
        };
        rel.write_to(&mut sqe);
        assert_eq!(ReleaseCommand::parse(&sqe), Ok(rel));
        let rep = ReportCommand {
            len_bytes: 4096,
            extended: true,
        };
        rep.write_to(&mut sqe);
        assert_eq!((sqe.cdw(10), sqe.cdw(11)), (1023, 1));
        assert_eq!(ReportCommand::parse(&sqe), rep);
    }

    #[test]
    fn reserved_actions_types_and_cptpl_are_invalid_fields() {
        let with = |cdw10: u32| {
            let mut s = Sqe::new(opcode::REGISTER, 1, 1);
            s.set_cdw(10, cdw10);
            s
        };
        assert_eq!(RegisterCommand::parse(&with(3)), Err(Status::INVALID_FIELD));
        assert_eq!(
            RegisterCommand::parse(&with(1 << 30)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            AcquireCommand::parse(&with(3 | 1 << 8)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(AcquireCommand::parse(&with(0)), Err(Status::INVALID_FIELD));
        assert_eq!(
            AcquireCommand::parse(&with(7 << 8)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(ReleaseCommand::parse(&with(2)), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn types_say_who_may_read_and_write() {
        use ReservationType::*;
        assert!(!WriteExclusive.excludes_reads() && ExclusiveAccess.excludes_reads());
        assert!(
            !WriteExclusive.registrants_write()
                && WriteExclusiveRegistrantsOnly.registrants_write()
        );
        assert!(ExclusiveAccessAllRegistrants.all_registrants());
        assert!(!ExclusiveAccessRegistrantsOnly.all_registrants());
        for t in ReservationType::ALL {
            assert_eq!(ReservationType::from_u8(t.as_u8()), Some(t));
        }
        assert_eq!(ReservationType::from_u8(0), None);
    }

    #[test]
    fn a_report_cut_short_keeps_the_count_and_whole_entries() {
        let r = |i: u8| Registrant {
            cntlid: 0xffff,
            holds: i == 0,
            hostid: [i; 16],
            key: u64::from(i) + 7,
        };
        let status = ReservationStatus {
            generation: 9,
            rtype: 1,
            ptpl: false,
            registrant_count: 3,
            registrants: vec![r(0), r(1), r(2)],
        };
        let whole = status.encode_extended(64 * 4);
        assert_eq!(
            ReservationStatus::decode_extended(&whole).as_ref(),
            Some(&status)
        );
        // Room for one entry and a half: one entry, REGCTL still 3.
        let cut = status.encode_extended(64 + 96);
        assert_eq!(cut.len(), 160);
        let back = ReservationStatus::decode_extended(&cut).unwrap();
        assert_eq!((back.registrant_count, back.registrants.len()), (3, 1));
        assert_eq!(back.registrants[0], r(0));
        assert_eq!(back.reservation(), Some(ReservationType::WriteExclusive));
        assert_eq!(ReservationStatus::decode_extended(&whole[..63]), None);
    }

    proptest! {
        #[test]
        fn decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = ReservationStatus::decode_extended(&data);
            let _ = NotificationLog::decode(&data);
            let _ = two_keys(&data);
            let _ = one_key(&data);
        }

        #[test]
        fn notification_log_round_trips(count in any::<u64>(), kind in 0u8..4, available in any::<u8>(), nsid in any::<u32>()) {
            let log = NotificationLog { count, kind, available, nsid };
            prop_assert_eq!(NotificationLog::decode(&log.encode()), Some(log));
        }
    }
}
