//! Asynchronous events a controller owes its host. Two notices:
//! * Namespace Attribute Changed, sent when a namespace grows online (an
//!   elastic volume resized by its control plane) or a reload adds or
//!   removes one, with its Changed Namespace List log page (LID 04h);
//! * Discovery Log Page Change, sent by a discovery controller when the
//!   subsystems the discovery log lists for its host change (a reload
//!   added or removed one, or changed who one admits), so a persistent discovery
//!   controller (Linux `nvme connect-all --persistent`, whose udev rule
//!   then connects what is new) learns of it without polling.
//!
//! * Reservation Log Page Available, when a reservation change concerns
//!   the host (its registration preempted, a reservation it had access
//!   through released or cleared: `reservation.rs`), with the Reservation
//!   Notification log page (LID 80h), one notice per read.
//!
//! Sans-IO: the admin queue shows [`AsyncEvents::observe`] the active
//! namespaces and their sizes, or [`AsyncEvents::observe_discovery`] the
//! generation counter, at its periodic check, and takes what is due
//! ([`AsyncEvents::take_due`]) when it holds an Asynchronous Event Request.
//! As the specification asks, a notice once sent is masked until the host
//! reads its log page without Retain Asynchronous Event.

use crate::reservation::Notice as ReservationNotice;
use sluice_proto::log::{self, lid};
use sluice_proto::reservation::{mask, NotificationLog};
use std::collections::{BTreeMap, VecDeque};

/// Asynchronous Event Configuration (and Identify OAES) bit: Namespace
/// Attribute Notices.
pub const AEN_NS_ATTRIBUTE: u32 = 1 << 8;
/// Asynchronous Event Configuration (and Identify OAES) bit: Discovery
/// Log Page Change Notices.
pub const AEN_DISCOVERY_CHANGE: u32 = 1 << 31;
/// Entries the Changed Namespace List holds; past this it reports
/// overflow (first entry FFFFFFFFh), as the specification defines.
pub const CHANGED_NS_LIST_MAX: usize = 1024;

/// Asynchronous Event Type "Notice" (AER completion DW0 bits 2:0).
const AER_TYPE_NOTICE: u32 = 0x2;
/// Asynchronous Event Information "Namespace Attribute Changed" (bits 15:8).
const AER_INFO_NS_ATTRIBUTE_CHANGED: u32 = 0x00;

/// Asynchronous Event Information "Discovery Log Page Change" (bits 15:8).
const AER_INFO_DISCOVERY_CHANGE: u32 = 0xf0;

/// The AER completion DW0 of a Namespace Attribute Changed notice.
pub const NS_ATTRIBUTE_CHANGED_DW0: u32 =
    AER_TYPE_NOTICE | AER_INFO_NS_ATTRIBUTE_CHANGED << 8 | (lid::CHANGED_NS_LIST as u32) << 16;
/// Asynchronous Event Type "I/O Command specific status" (bits 2:0); its
/// information 00h is Reservation Log Page Available.
const AER_TYPE_IO_COMMAND_SPECIFIC: u32 = 0x6;
/// The AER completion DW0 of a Reservation Log Page Available notice.
pub const RESERVATION_LOG_DW0: u32 =
    AER_TYPE_IO_COMMAND_SPECIFIC | (lid::RESERVATION_NOTIFICATION as u32) << 16;
/// Reservation notices a controller queues for its host's log page; past
/// this the oldest go (the Log Page Count jumps over them).
pub const RESERVATION_LOG_QUEUED_MAX: usize = 64;

/// The AER completion DW0 of a Discovery Log Page Change notice.
pub const DISCOVERY_CHANGE_DW0: u32 =
    AER_TYPE_NOTICE | AER_INFO_DISCOVERY_CHANGE << 8 | (lid::DISCOVERY as u32) << 16;

/// One notice's state: due (waits for an AER), or sent and masked until
/// the host reads its log page.
#[derive(Debug, Default)]
struct Notice {
    due: bool,
    masked: bool,
}

impl Notice {
    /// Something changed: due unless disabled or outstanding.
    fn raise(&mut self, enabled: bool) {
        if enabled && !self.masked {
            self.due = true;
        }
    }

    /// Sent: masked until the log is read.
    fn take(&mut self) -> bool {
        let due = std::mem::take(&mut self.due);
        self.masked |= due;
        due
    }

    /// The host read the log page (without RAE).
    fn clear(&mut self) {
        self.due = false;
        self.masked = false;
    }
}

/// One controller's event state.
#[derive(Debug)]
pub(crate) struct AsyncEvents {
    /// Namespace sizes in blocks as this controller last saw them.
    seen_blocks: BTreeMap<u32, u64>,
    /// NSIDs changed since the host last read the log, ascending, at most
    /// [`CHANGED_NS_LIST_MAX`] + 1 (one more means overflow).
    changed: Vec<u32>,
    /// Namespace Attribute Changed.
    ns_notice: Notice,
    /// The discovery log as the host last saw it: its generation counter
    /// and the subsystems it listed for the host.
    genctr_seen: u64,
    listed_seen: Vec<String>,
    /// Discovery Log Page Change.
    discovery_notice: Notice,
    /// Per namespace, the last reservation notice taken (its `seq`).
    reservation_seen: BTreeMap<u32, u64>,
    /// Reservation notices for the log page, oldest first.
    reservation_log: VecDeque<NotificationLog>,
    /// The last Log Page Count given.
    reservation_count: u64,
    /// Reservation Notification Mask (feature 82h): for every namespace,
    /// and per namespace where set.
    reservation_mask_all: u32,
    reservation_mask: BTreeMap<u32, u32>,
    /// Reservation Log Page Available.
    reservation_notice: Notice,
}

impl AsyncEvents {
    /// Starts from the namespaces as they are (nsid, blocks), and from
    /// generation 0 of the discovery log ([`Self::start_discovery`]).
    pub(crate) fn new(namespaces: impl IntoIterator<Item = (u32, u64)>) -> AsyncEvents {
        AsyncEvents {
            seen_blocks: namespaces.into_iter().collect(),
            changed: Vec::new(),
            ns_notice: Notice::default(),
            genctr_seen: 0,
            listed_seen: Vec::new(),
            discovery_notice: Notice::default(),
            reservation_seen: BTreeMap::new(),
            reservation_log: VecDeque::new(),
            reservation_count: 0,
            reservation_mask_all: 0,
            reservation_mask: BTreeMap::new(),
            reservation_notice: Notice::default(),
        }
    }

    /// Where this controller starts in each namespace's reservation
    /// notices (`nsid`, last `seq`): what came before is not its host's
    /// news. A namespace met later (a reload added it) starts at 0.
    pub(crate) fn start_reservations(&mut self, seen: impl IntoIterator<Item = (u32, u64)>) {
        self.reservation_seen = seen.into_iter().collect();
    }

    /// The last reservation notice this controller took from `nsid`.
    pub(crate) fn reservation_seen(&self, nsid: u32) -> u64 {
        self.reservation_seen.get(&nsid).copied().unwrap_or(0)
    }

    /// Takes namespace `nsid`'s new reservation notices for this host
    /// (`last`: the namespace's last `seq` now): the ones its mask does
    /// not hide go into the log page and raise a notice.
    pub(crate) fn observe_reservations(
        &mut self,
        nsid: u32,
        notices: Vec<ReservationNotice>,
        last: u64,
    ) {
        self.reservation_seen.insert(nsid, last);
        let masked = self.reservation_mask(nsid);
        for n in notices {
            if masked & (1 << n.kind) != 0 {
                continue;
            }
            self.reservation_count = self.reservation_count.checked_add(1).unwrap_or(1);
            if self.reservation_log.len() == RESERVATION_LOG_QUEUED_MAX {
                self.reservation_log.pop_front();
            }
            self.reservation_log.push_back(NotificationLog {
                count: self.reservation_count,
                kind: n.kind,
                available: 0,
                nsid,
            });
            self.reservation_notice.raise(true);
        }
    }

    /// Forgets the namespaces that are gone (a reload removed them):
    /// `active` says which are not.
    pub(crate) fn retain_reservations(&mut self, active: impl Fn(u32) -> bool) {
        self.reservation_seen.retain(|nsid, _| active(*nsid));
        self.reservation_mask.retain(|nsid, _| active(*nsid));
    }

    /// The Reservation Notification log page: the oldest notice, which the
    /// read takes (an empty page when there is none); unless `retain`
    /// (RAE), the notice is unmasked, and raised again if more wait.
    pub(crate) fn read_reservation_log(&mut self, retain: bool) -> Vec<u8> {
        let page = match self.reservation_log.pop_front() {
            Some(mut n) => {
                n.available = u8::try_from(self.reservation_log.len()).unwrap_or(u8::MAX);
                n.encode()
            }
            None => NotificationLog::default().encode(),
        };
        if !retain {
            self.reservation_notice.clear();
            if !self.reservation_log.is_empty() {
                self.reservation_notice.raise(true);
            }
        }
        page
    }

    /// Reservation Notification Mask of `nsid`.
    pub(crate) fn reservation_mask(&self, nsid: u32) -> u32 {
        self.reservation_mask
            .get(&nsid)
            .copied()
            .unwrap_or(self.reservation_mask_all)
    }

    /// Sets the Reservation Notification Mask of `nsid`, or of every
    /// namespace (`None`); bits other than the three notices are Invalid
    /// Field.
    pub(crate) fn set_reservation_mask(&mut self, nsid: Option<u32>, m: u32) -> bool {
        if m & !mask::ALL != 0 {
            return false;
        }
        match nsid {
            Some(nsid) => {
                self.reservation_mask.insert(nsid, m);
            }
            None => {
                self.reservation_mask_all = m;
                self.reservation_mask.clear();
            }
        }
        true
    }

    /// Starts from the discovery log as it is now: generation `genctr`,
    /// listing the subsystems `listed` for the host.
    pub(crate) fn start_discovery(&mut self, genctr: u64, listed: Vec<String>) {
        self.genctr_seen = genctr;
        self.listed_seen = listed;
    }

    /// Records the discovery log's generation counter; when it moved,
    /// `listed` tells which subsystems the log lists for the host now, and
    /// a Discovery Log Page Change notice becomes due if they differ from
    /// what the host last saw (a change to subsystems it is not admitted
    /// to tells it nothing), `aec` enables the notices and none is
    /// outstanding.
    pub(crate) fn observe_discovery(
        &mut self,
        genctr: u64,
        listed: impl FnOnce() -> Vec<String>,
        aec: u32,
    ) {
        if genctr == self.genctr_seen {
            return;
        }
        self.genctr_seen = genctr;
        let listed = listed();
        if listed != self.listed_seen {
            self.listed_seen = listed;
            self.discovery_notice.raise(aec & AEN_DISCOVERY_CHANGE != 0);
        }
    }

    /// The host read the discovery log page at generation `genctr`,
    /// listing `listed`, which it now knows (no notice for them); unless
    /// `retain` (RAE), the notice is unmasked.
    pub(crate) fn read_discovery_log(&mut self, retain: bool, genctr: u64, listed: Vec<String>) {
        self.genctr_seen = genctr;
        self.listed_seen = listed;
        if !retain {
            self.discovery_notice.clear();
        }
    }

    /// Records namespaces that changed since the last look: grown, or
    /// added or removed by a reload (the NSIDs in `namespaces` are the
    /// active ones now). A notice becomes due when `aec` (Asynchronous
    /// Event Configuration) enables Namespace Attribute Notices and none is
    /// outstanding.
    pub(crate) fn observe(&mut self, namespaces: impl IntoIterator<Item = (u32, u64)>, aec: u32) {
        let now: BTreeMap<u32, u64> = namespaces.into_iter().collect();
        let mut changed: Vec<u32> = now
            .iter()
            .filter(|(nsid, blocks)| self.seen_blocks.get(nsid) != Some(blocks))
            .map(|(nsid, _)| *nsid)
            .collect();
        changed.extend(self.seen_blocks.keys().filter(|n| !now.contains_key(n)));
        if changed.is_empty() {
            return;
        }
        self.seen_blocks = now;
        for nsid in changed {
            if let Err(at) = self.changed.binary_search(&nsid) {
                if self.changed.len() <= CHANGED_NS_LIST_MAX {
                    self.changed.insert(at, nsid);
                }
            }
        }
        self.ns_notice.raise(aec & AEN_NS_ATTRIBUTE != 0);
    }

    /// The completion DW0 of a notice due now, if any; it is then masked
    /// until the host reads its log.
    pub(crate) fn take_due(&mut self) -> Option<u32> {
        if self.ns_notice.take() {
            return Some(NS_ATTRIBUTE_CHANGED_DW0);
        }
        if self.discovery_notice.take() {
            return Some(DISCOVERY_CHANGE_DW0);
        }
        self.reservation_notice
            .take()
            .then_some(RESERVATION_LOG_DW0)
    }

    /// The Changed Namespace List log page. Unless `retain` (RAE), reading
    /// it clears the list and unmasks the notice.
    pub(crate) fn read_changed_ns_log(&mut self, retain: bool) -> Vec<u8> {
        let page = log::encode_changed_ns_list(&self.changed);
        if !retain {
            self.changed.clear();
            self.ns_notice.clear();
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(page: &[u8]) -> Vec<u32> {
        page.chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take_while(|v| *v != 0)
            .collect()
    }

    #[test]
    fn growth_makes_one_notice_masked_until_the_log_is_read() {
        let mut ev = AsyncEvents::new([(1, 100), (2, 100)]);
        ev.observe([(1, 100), (2, 100)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), None, "nothing changed");
        ev.observe([(1, 100), (2, 200)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), Some(NS_ATTRIBUTE_CHANGED_DW0));
        assert_eq!(ev.take_due(), None, "one notice per change");
        // A second change while masked goes into the log but sends nothing.
        ev.observe([(1, 300), (2, 200)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), None, "masked until the log is read");
        // RAE keeps the list and the mask.
        assert_eq!(entries(&ev.read_changed_ns_log(true)), vec![1, 2]);
        ev.observe([(1, 400), (2, 200)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), None);
        assert_eq!(entries(&ev.read_changed_ns_log(false)), vec![1, 2]);
        assert_eq!(entries(&ev.read_changed_ns_log(false)), Vec::<u32>::new());
        ev.observe([(1, 400), (2, 201)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), Some(NS_ATTRIBUTE_CHANGED_DW0), "unmasked");
    }

    #[test]
    fn namespaces_added_and_removed_are_changes() {
        let mut ev = AsyncEvents::new([(1, 100), (3, 100)]);
        // NSID 2 appears, 3 goes: both listed, one notice.
        ev.observe([(1, 100), (2, 50)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), Some(NS_ATTRIBUTE_CHANGED_DW0));
        assert_eq!(entries(&ev.read_changed_ns_log(false)), vec![2, 3]);
        ev.observe([(1, 100), (2, 50)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), None, "the same set is no change");
        // 2 removed, then added back at the same size: each a change.
        ev.observe([(1, 100)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), Some(NS_ATTRIBUTE_CHANGED_DW0));
        assert_eq!(entries(&ev.read_changed_ns_log(false)), vec![2]);
        ev.observe([(1, 100), (2, 50)], AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), Some(NS_ATTRIBUTE_CHANGED_DW0));
        assert_eq!(entries(&ev.read_changed_ns_log(false)), vec![2]);
    }

    #[test]
    fn a_changed_listing_is_one_discovery_notice_until_the_log_is_read() {
        let l = |n: &[&str]| -> Vec<String> { n.iter().map(|s| s.to_string()).collect() };
        let on = AEN_DISCOVERY_CHANGE;
        let mut ev = AsyncEvents::new([]);
        ev.start_discovery(5, l(&["a"]));
        ev.observe_discovery(5, || l(&["a", "b"]), on);
        assert_eq!(ev.take_due(), None, "the generation did not move");
        ev.observe_discovery(6, || l(&["a"]), on);
        assert_eq!(
            ev.take_due(),
            None,
            "moved, but this host's listing is the same"
        );
        ev.observe_discovery(7, || l(&["a", "b"]), on);
        assert_eq!(ev.take_due(), Some(DISCOVERY_CHANGE_DW0));
        assert_eq!(ev.take_due(), None, "one notice per change");
        ev.observe_discovery(8, || l(&["b"]), on);
        assert_eq!(ev.take_due(), None, "masked until the log is read");
        ev.read_discovery_log(true, 8, l(&["b"]));
        ev.observe_discovery(9, || l(&[]), on);
        assert_eq!(ev.take_due(), None, "RAE keeps the mask");
        ev.read_discovery_log(false, 9, l(&[]));
        ev.observe_discovery(9, || l(&["c"]), on);
        assert_eq!(ev.take_due(), None, "the host has read generation 9");
        ev.observe_discovery(10, || l(&["c"]), on);
        assert_eq!(ev.take_due(), Some(DISCOVERY_CHANGE_DW0), "unmasked");
        ev.read_discovery_log(false, 10, l(&["c"]));
        ev.observe_discovery(11, || l(&[]), AEN_NS_ATTRIBUTE);
        assert_eq!(ev.take_due(), None, "not enabled");
        assert_eq!(
            DISCOVERY_CHANGE_DW0, 0x0070_f002,
            "Linux's NVME_AEN=0x70f002"
        );
    }

    #[test]
    fn disabled_notices_still_fill_the_log() {
        let mut ev = AsyncEvents::new([(1, 100)]);
        ev.observe([(1, 101)], 0);
        assert_eq!(ev.take_due(), None);
        assert_eq!(entries(&ev.read_changed_ns_log(false)), vec![1]);
    }

    #[test]
    fn dw0_is_a_notice_for_the_changed_namespace_list() {
        assert_eq!(NS_ATTRIBUTE_CHANGED_DW0 & 0x7, 2, "type Notice");
        assert_eq!(
            (NS_ATTRIBUTE_CHANGED_DW0 >> 8) & 0xff,
            0,
            "Namespace Attribute Changed"
        );
        assert_eq!(
            (NS_ATTRIBUTE_CHANGED_DW0 >> 16) & 0xff,
            0x04,
            "log page 04h"
        );
    }

    #[test]
    fn more_than_1024_changes_overflow_the_list() {
        let n = u32::try_from(CHANGED_NS_LIST_MAX).unwrap() + 5;
        let mut ev = AsyncEvents::new((1..=n).map(|id| (id, 1)));
        ev.observe((1..=n).map(|id| (id, 2)), AEN_NS_ATTRIBUTE);
        let page = ev.read_changed_ns_log(false);
        assert_eq!(page.len(), 4096);
        assert_eq!(entries(&page), vec![0xffff_ffff]);
    }
}
