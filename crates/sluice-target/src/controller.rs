//! A controller: the state one host association shares across its admin and
//! I/O queues — CC/CSTS state machine, keep alive, granted queues, features.
//! The admin commands that read and change it are in `admin.rs`.
//!
//! Everything here is sans-IO: time is passed in.
//!
//! The two facts every I/O command reads (ready, write cache enabled) are
//! also published in an atomic each time the state's lock is released, so
//! the I/O path reads them without the lock.

use crate::events::AsyncEvents;
use crate::metrics::IoCounters;
use crate::subsystem::{Subsystem, SubsystemKind};
use sluice_config::TargetSettings;
use sluice_proto::fabrics::{cc, csts, Cap, VS_1_3};
use sluice_proto::Status;
use sluice_runtime::sync::lock;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Feature identifiers.
pub mod fid {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    pub const HOST_IDENTIFIER: u8 = 0x81;
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

/// Mutable controller state, behind the controller's lock.
#[derive(Debug)]
struct State {
    cc: u32,
    csts: u32,
    kato_ms: u32,
    last_keep_alive: Instant,
    /// I/O queues granted by Set Features Number of Queues (count, 1-based).
    io_queues_granted: u16,
    io_queues_set: bool,
    connected_qids: HashSet<u16>,
    async_event_config: u32,
    write_cache_enabled: bool,
    temperature_threshold: u32,
    /// Notices owed to the host (a namespace grew online).
    events: AsyncEvents,
}

/// One controller of a subsystem.
#[derive(Debug)]
pub struct Controller {
    pub(crate) cntlid: u16,
    pub(crate) subsystem: Arc<Subsystem>,
    pub(crate) hostnqn: String,
    pub(crate) hostid: [u8; 16],
    pub(crate) host_counters: Arc<IoCounters>,
    /// Set when the association ends (keep-alive expiry, shutdown, disconnect
    /// of the admin queue); every queue of the controller then closes.
    failed: AtomicBool,
    state: Mutex<State>,
    /// What the I/O path and the worker's timers read without the lock.
    published: Published,
}

/// Facts about [`State`] as of the last release of its lock
/// ([`StateGuard`]), for readers that run on every I/O or every worker
/// turn and must not take the lock.
#[derive(Debug)]
struct Published {
    /// [`IO_READY`] and [`IO_WRITE_CACHE`].
    io_flags: AtomicU8,
    /// When the keep-alive timer expires (without the grace), in ns after
    /// `epoch`; `u64::MAX` when it does not run.
    keep_alive_due_ns: AtomicU64,
    epoch: Instant,
}

impl Published {
    fn new(state: &State, epoch: Instant) -> Self {
        let p = Published {
            io_flags: AtomicU8::new(0),
            keep_alive_due_ns: AtomicU64::new(u64::MAX),
            epoch,
        };
        p.store(state);
        p
    }

    fn store(&self, state: &State) {
        self.io_flags.store(state.io_flags(), Ordering::Release);
        let due = if state.kato_ms == 0 {
            u64::MAX
        } else {
            let at = state.last_keep_alive + Duration::from_millis(u64::from(state.kato_ms));
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos())
                .unwrap_or(u64::MAX - 1)
                .min(u64::MAX - 1)
        };
        self.keep_alive_due_ns.store(due, Ordering::Release);
    }
}

/// Enabled and ready, no shutdown notified (see [`Controller::is_ready`]).
const IO_READY: u8 = 1;
/// The volatile write cache is enabled.
const IO_WRITE_CACHE: u8 = 2;

impl State {
    fn io_flags(&self) -> u8 {
        let mut f = 0;
        if self.csts & csts::RDY != 0 && self.cc & cc::SHN_MASK == 0 {
            f |= IO_READY;
        }
        if self.write_cache_enabled {
            f |= IO_WRITE_CACHE;
        }
        f
    }
}

/// The state's lock; on release it publishes what the I/O path reads.
struct StateGuard<'a> {
    state: std::sync::MutexGuard<'a, State>,
    published: &'a Published,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        // Before the lock itself is released (fields drop after this).
        self.published.store(&self.state);
    }
}

impl Controller {
    pub fn new(
        cntlid: u16,
        subsystem: Arc<Subsystem>,
        hostnqn: String,
        hostid: [u8; 16],
        kato_ms: u32,
        host_counters: Arc<IoCounters>,
        now: Instant,
    ) -> Self {
        let namespaces = subsystem.namespaces.snapshot();
        let mut events = AsyncEvents::new(namespaces.iter().map(|(id, ns)| (*id, ns.blocks())));
        events.start_reservations(
            namespaces
                .iter()
                .map(|(id, ns)| (*id, ns.reservations.notice_seq())),
        );
        let state = State {
            cc: 0,
            csts: 0,
            kato_ms,
            last_keep_alive: now,
            io_queues_granted: 0,
            io_queues_set: false,
            connected_qids: HashSet::new(),
            async_event_config: 0,
            write_cache_enabled: true,
            temperature_threshold: 343,
            events,
        };
        Controller {
            cntlid,
            subsystem,
            hostnqn,
            hostid,
            host_counters,
            failed: AtomicBool::new(false),
            published: Published::new(&state, now),
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> StateGuard<'_> {
        StateGuard {
            state: lock(&self.state),
            published: &self.published,
        }
    }

    /// Asks every namespace's backend whether it grew and records the
    /// changes this controller has not seen, namespaces a reload added or
    /// removed included (its admin queue calls this at each periodic
    /// check).
    pub(crate) fn observe_namespaces(&self) {
        let namespaces = self.subsystem.namespaces.snapshot();
        for ns in namespaces.values() {
            ns.refresh_size();
        }
        let sizes = namespaces.iter().map(|(id, ns)| (*id, ns.blocks()));
        let mut s = self.lock();
        let aec = s.async_event_config;
        s.events.observe(sizes, aec);
        // Reservation notices for this host (lock order: the controller's,
        // then a namespace's reservations; never the other way).
        s.events
            .retain_reservations(|nsid| namespaces.contains_key(&nsid));
        for (nsid, ns) in namespaces.iter() {
            let seen = s.events.reservation_seen(*nsid);
            let (due, last) = ns.reservations.notices_after(seen, &self.hostid);
            if last != seen {
                s.events.observe_reservations(*nsid, due, last);
            }
        }
    }

    /// The Reservation Notification log page (its oldest notice, taken).
    pub(crate) fn reservation_log(&self, retain: bool) -> Vec<u8> {
        self.observe_namespaces();
        self.lock().events.read_reservation_log(retain)
    }

    /// Reservation Notification Mask (feature 82h) of namespace `nsid`.
    pub(crate) fn reservation_mask(&self, nsid: u32) -> u32 {
        self.lock().events.reservation_mask(nsid)
    }

    /// Sets the Reservation Notification Mask of `nsid`, or of every
    /// namespace (`None`); false for reserved bits.
    pub(crate) fn set_reservation_mask(&self, nsid: Option<u32>, mask: u32) -> bool {
        self.lock().events.set_reservation_mask(nsid, mask)
    }

    /// Starts its discovery events from the discovery log as the host may
    /// read it now: generation `genctr`, listing `listed`.
    #[must_use]
    pub fn seeing_discovery_log(self, genctr: u64, listed: Vec<String>) -> Self {
        lock(&self.state).events.start_discovery(genctr, listed);
        self
    }

    /// Records the discovery log's generation counter; `listed` gives the
    /// subsystems it lists for this host when it moved (a discovery
    /// controller's admin queue calls this at each periodic check).
    pub(crate) fn observe_discovery(&self, genctr: u64, listed: impl FnOnce() -> Vec<String>) {
        let mut s = self.lock();
        let aec = s.async_event_config;
        s.events.observe_discovery(genctr, listed, aec);
    }

    /// The host read the discovery log page of generation `genctr`,
    /// listing `listed` (`retain`: with RAE).
    pub(crate) fn discovery_log_read(&self, retain: bool, genctr: u64, listed: Vec<String>) {
        self.lock()
            .events
            .read_discovery_log(retain, genctr, listed);
    }

    /// The completion DW0 for a held Asynchronous Event Request, when a
    /// notice is due.
    pub(crate) fn take_async_event(&self) -> Option<u32> {
        self.lock().events.take_due()
    }

    /// The Changed Namespace List log page (cleared unless `retain`).
    pub(crate) fn changed_ns_log(&self, retain: bool) -> Vec<u8> {
        self.observe_namespaces();
        self.lock().events.read_changed_ns_log(retain)
    }

    pub fn is_discovery(&self) -> bool {
        self.subsystem.kind == SubsystemKind::Discovery
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Ends the association: every queue of this controller will close.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        let mut s = self.lock();
        s.csts |= csts::CFS;
    }

    /// Enabled and ready (CC.EN = 1, CSTS.RDY = 1, not shut down).
    pub fn is_ready(&self) -> bool {
        self.published.io_flags.load(Ordering::Acquire) & IO_READY != 0
    }

    /// Whether the host asked to disable the volatile write cache, in which
    /// case every write is made durable before it completes.
    pub fn write_cache_enabled(&self) -> bool {
        self.published.io_flags.load(Ordering::Acquire) & IO_WRITE_CACHE != 0
    }

    /// Records a keep alive (any admin command counts).
    pub fn keep_alive(&self, now: Instant) {
        self.lock().last_keep_alive = now;
    }

    /// When the keep-alive timer expires, if it runs.
    /// (Read from what the lock published: the admin queue's worker asks
    /// on every turn of its loop.)
    pub fn keep_alive_deadline(&self, grace_ms: u32) -> Option<Instant> {
        let due_ns = self.published.keep_alive_due_ns.load(Ordering::Acquire);
        if due_ns == u64::MAX {
            return None;
        }
        Some(
            self.published.epoch
                + Duration::from_nanos(due_ns)
                + Duration::from_millis(u64::from(grace_ms)),
        )
    }

    /// Registers an I/O queue Connect. Errors are the statuses to return.
    pub fn connect_io_queue(&self, qid: u16, io_queues_max: u16) -> Result<(), Status> {
        let mut s = self.lock();
        if s.csts & csts::RDY == 0 {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        let limit = if s.io_queues_set {
            s.io_queues_granted
        } else {
            io_queues_max
        };
        if qid == 0 || qid > limit || !s.connected_qids.insert(qid) {
            return Err(Status::CONNECT_INVALID_PARAMETERS);
        }
        Ok(())
    }

    pub fn disconnect_io_queue(&self, qid: u16) {
        self.lock().connected_qids.remove(&qid);
    }

    /// Property Get. `None` for an offset that names no property.
    pub fn property_get(
        &self,
        offset: u32,
        size8: bool,
        settings: &TargetSettings,
    ) -> Result<u64, Status> {
        use sluice_proto::fabrics::prop;
        let s = self.lock();
        let v = match (offset, size8) {
            (prop::CAP, true) => Cap {
                mqes: settings.queue_depth_max - 1,
                to_500ms: 30,
            }
            .encode(),
            (prop::VS, false) => VS_1_3 as u64,
            (prop::CC, false) => s.cc as u64,
            (prop::CSTS, false) => s.csts as u64,
            (prop::NSSR, false) => 0,
            _ => return Err(Status::INVALID_FIELD),
        };
        Ok(v)
    }

    /// Property Set: only CC is writable. Runs the enable/shutdown state
    /// machine. Returns whether a shutdown notification started, in which case
    /// the caller flushes every namespace and then calls `shutdown_flushed`.
    pub fn property_set(&self, offset: u32, size8: bool, value: u64) -> Result<bool, Status> {
        use sluice_proto::fabrics::prop;
        if offset != prop::CC || size8 {
            return Err(Status::INVALID_FIELD);
        }
        // CC is a 4-byte property: the low dword is its value.
        let new = (value & 0xffff_ffff) as u32;
        let mut s = self.lock();
        let old = s.cc;
        if new & cc::EN != 0 && old & cc::EN == 0 {
            // Enabling: I/O entry sizes must be 2^6 (SQE) and 2^4 (CQE);
            // only the NVM command set and round-robin arbitration exist.
            let iosqes = (new >> cc::IOSQES_SHIFT) & 0xf;
            let iocqes = (new >> cc::IOCQES_SHIFT) & 0xf;
            let css = (new >> cc::CSS_SHIFT) & 0x7;
            let ams = (new >> cc::AMS_SHIFT) & 0x7;
            let mps = (new >> cc::MPS_SHIFT) & 0xf;
            let sizes_ok = (iosqes == 6 && iocqes == 4)
                || ((iosqes == 0 || iocqes == 0) && self.is_discovery());
            if !sizes_ok || css != 0 || ams != 0 || mps != 0 {
                s.csts |= csts::CFS;
                s.cc = new;
                return Ok(false);
            }
            s.csts = (s.csts & !csts::SHST_COMPLETE & !csts::SHST_OCCURRING) | csts::RDY;
        } else if new & cc::EN == 0 && old & cc::EN != 0 {
            // Reset: the controller stops; queues other than admin are torn down
            // by the host. Ready clears.
            s.csts &= !csts::RDY;
        }
        let mut shutdown_started = false;
        if new & cc::SHN_MASK != 0 && old & cc::SHN_MASK == 0 {
            // Shutdown notification: SHST reads "occurring" until the queue
            // that received it has flushed every namespace (see
            // `shutdown_flushed`).
            s.csts = (s.csts & !csts::SHST_COMPLETE) | csts::SHST_OCCURRING;
            shutdown_started = true;
        } else if new & cc::SHN_MASK == 0 {
            s.csts &= !(csts::SHST_COMPLETE | csts::SHST_OCCURRING);
        }
        s.cc = new;
        Ok(shutdown_started)
    }

    /// Every namespace was flushed after a shutdown notification: SHST = complete.
    pub fn shutdown_flushed(&self) {
        let mut s = self.lock();
        if s.csts & csts::SHST_OCCURRING != 0 {
            s.csts = (s.csts & !csts::SHST_OCCURRING) | csts::SHST_COMPLETE;
        }
    }

    /// Set Features on this controller's state: `f` = FID, `v` = CDW11.
    /// Returns the completion's DW0 (Number of Queues: what was granted,
    /// at most `io_queues_max`) or the status to return.
    pub fn set_feature(&self, f: u8, v: u32, io_queues_max: u16) -> Result<u32, Status> {
        let mut s = self.lock();
        match f {
            fid::NUMBER_OF_QUEUES => {
                let nsqr = (v & 0xffff) as u16;
                let ncqr = (v >> 16) as u16;
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Err(Status::INVALID_FIELD);
                }
                if !s.connected_qids.is_empty() {
                    return Err(Status::COMMAND_SEQUENCE_ERROR);
                }
                let want = nsqr.min(ncqr) + 1;
                let granted = want.min(io_queues_max);
                s.io_queues_granted = granted;
                s.io_queues_set = true;
                let g = u32::from(granted - 1);
                Ok(g << 16 | g)
            }
            fid::ASYNC_EVENT_CONFIG => {
                s.async_event_config = v;
                Ok(0)
            }
            fid::KEEP_ALIVE_TIMER => {
                s.kato_ms = v;
                Ok(0)
            }
            // Without a volatile write cache there is nothing to set (nvmet,
            // SPDK).
            fid::VOLATILE_WRITE_CACHE if !self.subsystem.volatile_write_cache() => {
                Err(Status::INVALID_FIELD)
            }
            fid::VOLATILE_WRITE_CACHE => {
                s.write_cache_enabled = v & 1 != 0;
                Ok(0)
            }
            fid::TEMPERATURE_THRESHOLD => {
                // TMPSEL 9-14 and THSEL 10b/11b are reserved (SPDK refuses
                // them; nvmet refuses the feature).
                let (tmpsel, thsel) = ((v >> 16) & 0xf, (v >> 20) & 0x3);
                if (9..=14).contains(&tmpsel) || thsel > 1 {
                    return Err(Status::INVALID_FIELD);
                }
                s.temperature_threshold = v & 0xffff;
                Ok(0)
            }
            // On Fabrics the Host Identifier comes from Connect.
            fid::HOST_IDENTIFIER => Err(Status::COMMAND_SEQUENCE_ERROR),
            fid::ARBITRATION
            | fid::POWER_MANAGEMENT
            | fid::ERROR_RECOVERY
            | fid::INTERRUPT_COALESCING
            | fid::WRITE_ATOMICITY
            | fid::INTERRUPT_VECTOR_CONFIG => Err(Status::FEATURE_NOT_CHANGEABLE),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// A feature's current value (Get Features DW0); None for a FID this
    /// controller does not report.
    pub fn feature(&self, f: u8) -> Option<u32> {
        let s = self.lock();
        Some(match f {
            fid::KEEP_ALIVE_TIMER => s.kato_ms,
            fid::ASYNC_EVENT_CONFIG => s.async_event_config,
            fid::NUMBER_OF_QUEUES => {
                let g = s.io_queues_granted.max(1) as u32 - 1;
                g << 16 | g
            }
            fid::VOLATILE_WRITE_CACHE => s.write_cache_enabled as u32,
            fid::TEMPERATURE_THRESHOLD => s.temperature_threshold,
            fid::ARBITRATION
            | fid::POWER_MANAGEMENT
            | fid::ERROR_RECOVERY
            | fid::INTERRUPT_COALESCING
            | fid::WRITE_ATOMICITY => 0,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use sluice_config::{Config, NamespaceConfig, SubsystemConfig};
    use sluice_proto::fabrics::prop;

    fn controller() -> Controller {
        let c = Config::default()
            .with_subsystem(
                SubsystemConfig::new("nqn.2026-11.io.sluice:ctrl")
                    .allow_any_host()
                    .with_namespace(NamespaceConfig::ram(1, 1 << 20)),
            )
            .validated()
            .expect("valid");
        let reg = Registry::build(&c).expect("registry");
        let sub = reg
            .subsystem("nqn.2026-11.io.sluice:ctrl")
            .expect("subsystem");
        Controller::new(
            1,
            sub,
            "nqn.x:h".into(),
            [0; 16],
            0,
            Arc::default(),
            Instant::now(),
        )
    }

    /// What the I/O path reads without the lock follows every change made
    /// under it: enable, write cache off and on, shutdown, reset.
    #[test]
    fn the_io_path_sees_each_state_change() {
        let c = controller();
        assert!(!c.is_ready(), "not enabled yet");
        assert!(c.write_cache_enabled(), "the write cache starts enabled");
        let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        assert_eq!(c.property_set(prop::CC, false, u64::from(en)), Ok(false));
        assert!(c.is_ready());
        // (RAM has no volatile cache to switch with Set Features; what
        // that feature sets is this field, published when the lock goes.)
        c.lock().write_cache_enabled = false;
        assert!(!c.write_cache_enabled());
        c.lock().write_cache_enabled = true;
        assert!(c.write_cache_enabled());
        let shn = en | 1 << 14;
        assert_eq!(c.property_set(prop::CC, false, u64::from(shn)), Ok(true));
        assert!(!c.is_ready(), "a shutdown was notified");
        assert_eq!(c.property_set(prop::CC, false, u64::from(en)), Ok(false));
        assert!(c.is_ready(), "the notification was withdrawn");
        assert_eq!(c.property_set(prop::CC, false, 0), Ok(false));
        assert!(!c.is_ready(), "reset");
    }

    /// The keep-alive deadline is read without the lock: it follows each
    /// keep alive and each Set Features of the timer, grace added, and a
    /// timer of 0 does not run.
    #[test]
    fn the_keep_alive_deadline_follows_each_keep_alive() {
        let c = controller();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(c.set_feature(fid::KEEP_ALIVE_TIMER, 5000, 4), Ok(0));
        c.keep_alive(t0 + ms(7));
        assert_eq!(c.keep_alive_deadline(0), Some(t0 + ms(5007)));
        assert_eq!(c.keep_alive_deadline(250), Some(t0 + ms(5257)));
        c.keep_alive(t0 + ms(1000) + Duration::from_nanos(3));
        assert_eq!(
            c.keep_alive_deadline(0),
            Some(t0 + ms(6000) + Duration::from_nanos(3)),
            "to the nanosecond"
        );
        assert_eq!(c.set_feature(fid::KEEP_ALIVE_TIMER, 120, 4), Ok(0));
        assert_eq!(
            c.keep_alive_deadline(0),
            Some(t0 + ms(1120) + Duration::from_nanos(3))
        );
        assert_eq!(c.set_feature(fid::KEEP_ALIVE_TIMER, 0, 4), Ok(0));
        assert_eq!(c.keep_alive_deadline(0), None, "a timer of 0 does not run");
    }
}
