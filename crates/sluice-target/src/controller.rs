//! A controller: the state one host association shares across its admin and
//! I/O queues — CC/CSTS state machine, keep alive, granted queues, features —
//! and the admin commands that act on it.
//!
//! Everything here is sans-IO: commands come in as SQE + data, results go
//! out as [`AdminReply`], and time is passed in.

use crate::metrics::IoCounters;
use crate::subsystem::{Registry, Subsystem, SubsystemKind};
use sluice_proto::command::{admin, Sqe};
use sluice_proto::fabrics::{cc, csts, Cap, VS_1_3};
use sluice_proto::identify::{self, cns, cntrltype, oncs, IdentifyController, IdentifyNamespace};
use sluice_proto::log::{self, effects, lid, DiscoveryEntry, GetLogPage, SmartLog};
use sluice_proto::Status;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
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
}

/// Asynchronous Event Request limit (AERL + 1).
pub const AER_MAX: usize = 4;
/// Firmware revision reported in Identify and the firmware slot log.
pub const FIRMWARE_REVISION: &str = concat!("S", env!("CARGO_PKG_VERSION"));
/// IEEE OUI-less vendor id; 0 means "not PCI".
const VENDOR_ID: u16 = 0;

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
}

/// One controller of a subsystem.
#[derive(Debug)]
pub struct Controller {
    pub cntlid: u16,
    pub subsystem: Arc<Subsystem>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub host_counters: Arc<IoCounters>,
    /// Set when the association ends (keep-alive expiry, shutdown, disconnect
    /// of the admin queue); every queue of the controller then closes.
    failed: AtomicBool,
    state: Mutex<State>,
}

/// What an admin command produced.
#[derive(Debug, Default)]
pub struct AdminReply {
    pub status: Status,
    pub result: u32,
    pub dw1: u32,
    /// Controller-to-host data.
    pub data: Vec<u8>,
    /// AER: hold the command instead of completing it.
    pub hold: bool,
}

impl AdminReply {
    pub fn status(status: Status) -> Self {
        AdminReply {
            status,
            ..Default::default()
        }
    }
    pub fn data(data: Vec<u8>) -> Self {
        AdminReply {
            data,
            ..Default::default()
        }
    }
    pub fn result(result: u32) -> Self {
        AdminReply {
            result,
            ..Default::default()
        }
    }
}

/// Context an admin command may need from its connection.
#[derive(Debug, Clone, Copy)]
pub struct AdminContext {
    /// Local address of the connection, for discovery entries when no
    /// advertised address is configured.
    pub local_addr: Option<SocketAddr>,
    /// Port the host reached us on.
    pub local_port: u16,
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
        Controller {
            cntlid,
            subsystem,
            hostnqn,
            hostid,
            host_counters,
            failed: AtomicBool::new(false),
            state: Mutex::new(State {
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
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        let s = self.lock();
        s.csts & csts::RDY != 0 && s.cc & cc::SHN_MASK == 0
    }

    /// Whether the host asked to disable the volatile write cache, in which
    /// case every write is made durable before it completes.
    pub fn write_cache_enabled(&self) -> bool {
        self.lock().write_cache_enabled
    }

    /// Records a keep alive (any admin command counts).
    pub fn keep_alive(&self, now: Instant) {
        self.lock().last_keep_alive = now;
    }

    /// When the keep-alive timer expires, if it runs.
    pub fn keep_alive_deadline(&self, grace_ms: u32) -> Option<Instant> {
        let s = self.lock();
        if s.kato_ms == 0 {
            return None;
        }
        Some(s.last_keep_alive + Duration::from_millis(s.kato_ms as u64 + grace_ms as u64))
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
    pub fn property_get(&self, offset: u32, size8: bool, reg: &Registry) -> Result<u64, Status> {
        use sluice_proto::fabrics::prop;
        let s = self.lock();
        let v = match (offset, size8) {
            (prop::CAP, true) => Cap {
                mqes: reg.settings.queue_depth_max - 1,
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
        let new = value as u32;
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

    /// Executes an admin command (not Fabrics, not I/O).
    pub fn admin(
        &self,
        sqe: &Sqe,
        data_in: &[u8],
        reg: &Registry,
        ctx: &AdminContext,
        now: Instant,
    ) -> AdminReply {
        self.keep_alive(now);
        if !self.is_ready() && sqe.opcode() != admin::KEEP_ALIVE {
            return AdminReply::status(Status::COMMAND_SEQUENCE_ERROR);
        }
        let disc = self.is_discovery();
        match sqe.opcode() {
            admin::IDENTIFY => self.identify(sqe, reg),
            admin::GET_LOG_PAGE => self.get_log_page(sqe, reg, ctx),
            admin::SET_FEATURES
                if !disc
                    || matches!(
                        (sqe.cdw(10) & 0xff) as u8,
                        fid::KEEP_ALIVE_TIMER | fid::ASYNC_EVENT_CONFIG
                    ) =>
            {
                self.set_features(sqe, reg)
            }
            admin::GET_FEATURES => self.get_features(sqe),
            admin::KEEP_ALIVE => AdminReply::default(),
            admin::ASYNC_EVENT_REQUEST => AdminReply {
                hold: true,
                ..Default::default()
            },
            // Abort: best effort is allowed to abort nothing (DW0 bit 0 = 1).
            admin::ABORT if !disc => AdminReply::result(1),
            _ => {
                let _ = data_in;
                AdminReply::status(Status::INVALID_OPCODE)
            }
        }
    }

    fn identify_controller(&self, reg: &Registry) -> IdentifyController {
        let sub = &self.subsystem;
        let st = &reg.settings;
        let disc = self.is_discovery();
        let vwc = sub.volatile_write_cache();
        IdentifyController {
            vid: VENDOR_ID,
            ssvid: VENDOR_ID,
            serial: sub.serial.clone(),
            model: sub.model.clone(),
            firmware: FIRMWARE_REVISION.to_string(),
            cmic: if disc { 0 } else { 0x3 },
            mdts: (st.mdts_bytes / 4096).trailing_zeros() as u8,
            cntlid: self.cntlid,
            ver: VS_1_3,
            oaes: 0,
            cntrltype: if disc {
                cntrltype::DISCOVERY
            } else {
                cntrltype::IO
            },
            oacs: 0,
            acl: 3,
            aerl: (AER_MAX - 1) as u8,
            frmw: 0x3,                         // slot 1 read-only, one slot
            lpa: if disc { 0x4 } else { 0x6 }, // commands supported & effects, extended data
            elpe: 0,
            kas: 10,
            sqes: if disc { 0 } else { 0x66 },
            cqes: if disc { 0 } else { 0x44 },
            maxcmd: st.queue_depth_max,
            nn: sub.nn(),
            oncs: if disc {
                0
            } else {
                oncs::DSM | oncs::WRITE_ZEROES
            },
            fuses: 0,
            fna: 0,
            // Bit 0: volatile write cache present; bits 2:1 = 11b: Flush with
            // NSID FFFFFFFFh supported.
            vwc: if vwc { 0x7 } else { 0x6 },
            sgls: if disc { 0x1 } else { 0x1 | (1 << 20) },
            subnqn: sub.nqn.clone(),
            ioccsz: (64 + st.inline_data_bytes) / 16,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
        }
    }

    fn identify(&self, sqe: &Sqe, reg: &Registry) -> AdminReply {
        let cns_v = (sqe.cdw(10) & 0xff) as u8;
        let csi = (sqe.cdw(11) >> 24) as u8;
        let nsid = sqe.nsid();
        let sub = &self.subsystem;
        if self.is_discovery() && cns_v != cns::CONTROLLER {
            return AdminReply::status(Status::INVALID_FIELD);
        }
        match cns_v {
            cns::CONTROLLER => AdminReply::data(self.identify_controller(reg).encode()),
            cns::NAMESPACE => {
                if nsid == 0 || nsid == 0xffff_ffff {
                    return AdminReply::status(Status::INVALID_NAMESPACE);
                }
                match sub.namespaces.get(&nsid) {
                    Some(ns) => {
                        let blocks = ns.blocks();
                        let g = ns.geometry;
                        let id = IdentifyNamespace {
                            nsze: blocks,
                            ncap: blocks,
                            nuse: blocks,
                            nsfeat: 0,
                            lbads: ns.lba_shift,
                            dlfeat: if g.deallocated_reads_zero { 0x9 } else { 0 },
                            nmic: 1,
                            nguid: ns.nguid,
                            eui64: ns.eui64,
                        };
                        AdminReply::data(id.encode())
                    }
                    // An NSID that is valid but not active: all zeroes.
                    None if nsid <= config_nsid_max() => {
                        AdminReply::data(vec![0; identify::IDENTIFY_LEN])
                    }
                    None => AdminReply::status(Status::INVALID_NAMESPACE),
                }
            }
            cns::ACTIVE_NS_LIST => {
                if nsid >= 0xffff_fffe {
                    return AdminReply::status(Status::INVALID_NAMESPACE);
                }
                let ids: Vec<u32> = sub.namespaces.keys().copied().collect();
                AdminReply::data(identify::encode_active_ns_list(&ids, nsid))
            }
            cns::NS_DESCRIPTORS => match sub.namespaces.get(&nsid) {
                Some(ns) => AdminReply::data(identify::encode_ns_descriptors(&ns.nguid, &ns.nguid)),
                None => AdminReply::status(Status::INVALID_NAMESPACE),
            },
            // I/O command set specific Identify Controller for the NVM set:
            // all limits zero means "no limit beyond MDTS".
            0x06 if csi == 0 => AdminReply::data(vec![0; identify::IDENTIFY_LEN]),
            _ => AdminReply::status(Status::INVALID_FIELD),
        }
    }

    fn get_log_page(&self, sqe: &Sqe, reg: &Registry, ctx: &AdminContext) -> AdminReply {
        let g = GetLogPage::parse(sqe);
        let disc = self.is_discovery();
        let page = match g.lid {
            lid::DISCOVERY if disc => {
                log::encode_discovery_log(reg.genctr(), &discovery_entries(self, reg, ctx))
            }
            lid::ERROR if !disc => vec![0u8; 64],
            lid::SMART if !disc => {
                let nsid = sqe.nsid();
                let snap = if nsid == 0 || nsid == 0xffff_ffff {
                    self.host_counters.snapshot()
                } else {
                    match self.subsystem.namespaces.get(&nsid) {
                        Some(ns) => ns.counters.snapshot(),
                        None => return AdminReply::status(Status::INVALID_NAMESPACE),
                    }
                };
                SmartLog {
                    temperature_kelvin: 300,
                    available_spare_pct: 100,
                    data_units_read: SmartLog::data_units(snap.read_bytes),
                    data_units_written: SmartLog::data_units(snap.write_bytes),
                    host_read_commands: snap.read_commands,
                    host_write_commands: snap.write_commands,
                    power_on_hours: 0,
                    media_errors: 0,
                }
                .encode()
            }
            lid::FIRMWARE_SLOT if !disc => log::encode_firmware_slot(FIRMWARE_REVISION),
            lid::CHANGED_NS_LIST if !disc => log::encode_changed_ns_list(&[]),
            lid::COMMANDS_SUPPORTED => {
                let a = |op| (op, effects::CSUPP);
                let admin_ops: Vec<(u8, u32)> = if disc {
                    vec![
                        a(admin::IDENTIFY),
                        a(admin::GET_LOG_PAGE),
                        a(admin::SET_FEATURES),
                        a(admin::GET_FEATURES),
                        a(admin::ASYNC_EVENT_REQUEST),
                        a(admin::KEEP_ALIVE),
                    ]
                } else {
                    vec![
                        a(admin::IDENTIFY),
                        a(admin::GET_LOG_PAGE),
                        a(admin::SET_FEATURES),
                        a(admin::GET_FEATURES),
                        a(admin::ASYNC_EVENT_REQUEST),
                        a(admin::KEEP_ALIVE),
                        a(admin::ABORT),
                    ]
                };
                use sluice_proto::command::io;
                let io_ops: Vec<(u8, u32)> = if disc {
                    vec![]
                } else {
                    vec![
                        (io::FLUSH, effects::CSUPP),
                        (io::WRITE, effects::CSUPP | effects::LBCC),
                        (io::READ, effects::CSUPP),
                        (io::WRITE_ZEROES, effects::CSUPP | effects::LBCC),
                        (io::DATASET_MANAGEMENT, effects::CSUPP | effects::LBCC),
                    ]
                };
                log::encode_commands_supported(&admin_ops, &io_ops)
            }
            _ => return AdminReply::status(Status::INVALID_LOG_PAGE),
        };
        // Return exactly the requested window, zero-padded past the end.
        let off = g.offset_bytes;
        if !off.is_multiple_of(4) || off > page.len() as u64 {
            return AdminReply::status(Status::INVALID_FIELD);
        }
        if g.len_bytes > 1 << 20 {
            return AdminReply::status(Status::INVALID_FIELD);
        }
        let mut out = vec![0u8; g.len_bytes as usize];
        let avail = &page[off as usize..];
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        AdminReply::data(out)
    }

    fn set_features(&self, sqe: &Sqe, reg: &Registry) -> AdminReply {
        let cdw10 = sqe.cdw(10);
        let f = (cdw10 & 0xff) as u8;
        let save = cdw10 & (1 << 31) != 0;
        let v = sqe.cdw(11);
        if save {
            return AdminReply::status(Status::FEATURE_NOT_SAVEABLE);
        }
        let mut s = self.lock();
        match f {
            fid::NUMBER_OF_QUEUES => {
                let nsqr = v & 0xffff;
                let ncqr = v >> 16;
                if nsqr == 0xffff || ncqr == 0xffff {
                    return AdminReply::status(Status::INVALID_FIELD);
                }
                if !s.connected_qids.is_empty() {
                    return AdminReply::status(Status::COMMAND_SEQUENCE_ERROR);
                }
                let want = (nsqr.min(ncqr) + 1) as u16;
                let granted = want.min(reg.settings.io_queues_max);
                s.io_queues_granted = granted;
                s.io_queues_set = true;
                let g = (granted - 1) as u32;
                AdminReply::result(g << 16 | g)
            }
            fid::ASYNC_EVENT_CONFIG => {
                s.async_event_config = v;
                AdminReply::default()
            }
            fid::KEEP_ALIVE_TIMER => {
                s.kato_ms = v;
                AdminReply::default()
            }
            fid::VOLATILE_WRITE_CACHE => {
                s.write_cache_enabled = v & 1 != 0;
                AdminReply::default()
            }
            fid::TEMPERATURE_THRESHOLD => {
                s.temperature_threshold = v & 0xffff;
                AdminReply::default()
            }
            fid::ARBITRATION
            | fid::POWER_MANAGEMENT
            | fid::ERROR_RECOVERY
            | fid::INTERRUPT_COALESCING
            | fid::WRITE_ATOMICITY
            | fid::INTERRUPT_VECTOR_CONFIG => AdminReply::status(Status::FEATURE_NOT_CHANGEABLE),
            _ => AdminReply::status(Status::INVALID_FIELD),
        }
    }

    fn get_features(&self, sqe: &Sqe) -> AdminReply {
        let cdw10 = sqe.cdw(10);
        let f = (cdw10 & 0xff) as u8;
        let sel = (cdw10 >> 8) & 0x7;
        if sel == 3 {
            // Supported capabilities: nothing is saveable or namespace specific;
            // the changeable ones are marked changeable (bit 2).
            let changeable = matches!(
                f,
                fid::NUMBER_OF_QUEUES
                    | fid::ASYNC_EVENT_CONFIG
                    | fid::KEEP_ALIVE_TIMER
                    | fid::VOLATILE_WRITE_CACHE
                    | fid::TEMPERATURE_THRESHOLD
            );
            return AdminReply::result(if changeable { 0x4 } else { 0 });
        }
        if sel > 3 {
            return AdminReply::status(Status::INVALID_FIELD);
        }
        let s = self.lock();
        let disc = self.is_discovery();
        let r = match f {
            fid::KEEP_ALIVE_TIMER => s.kato_ms,
            fid::ASYNC_EVENT_CONFIG => s.async_event_config,
            _ if disc => return AdminReply::status(Status::INVALID_FIELD),
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
            _ => return AdminReply::status(Status::INVALID_FIELD),
        };
        AdminReply::result(r)
    }
}

fn config_nsid_max() -> u32 {
    sluice_config::NAMESPACES_PER_SUBSYSTEM_MAX
}

/// Discovery log entries visible to this (discovery) controller's host:
/// every subsystem that admits it, and the discovery subsystem itself.
pub fn discovery_entries(
    ctrl: &Controller,
    reg: &Registry,
    ctx: &AdminContext,
) -> Vec<DiscoveryEntry> {
    let st = &reg.settings;
    let addr = st
        .advertise_addr
        .clone()
        .unwrap_or_else(|| match ctx.local_addr {
            Some(a) => a.ip().to_string(),
            None => st.listen.ip().to_string(),
        });
    let adrfam = if addr.contains(':') {
        log::adrfam::IPV6
    } else {
        log::adrfam::IPV4
    };
    let io_port = st.advertise_port.unwrap_or(st.listen.port());
    let mut out = Vec::new();
    for sub in reg.subsystems.values() {
        if !sub.host_allowed(&ctrl.hostnqn) {
            continue;
        }
        out.push(DiscoveryEntry {
            trtype: log::TRTYPE_TCP,
            adrfam,
            subtype: log::subtype::NVME,
            treq: log::TREQ_SQFLOW_DISABLE_SUPPORTED,
            portid: 1,
            cntlid: sluice_proto::fabrics::CNTLID_DYNAMIC,
            asqsz: 32,
            eflags: 0,
            trsvcid: io_port.to_string(),
            subnqn: sub.nqn.clone(),
            traddr: addr.clone(),
            sectype: 0,
        });
    }
    out.push(DiscoveryEntry {
        trtype: log::TRTYPE_TCP,
        adrfam,
        subtype: log::subtype::CURRENT_DISCOVERY,
        treq: log::TREQ_SQFLOW_DISABLE_SUPPORTED,
        portid: 1,
        cntlid: sluice_proto::fabrics::CNTLID_DYNAMIC,
        asqsz: 32,
        eflags: 0,
        trsvcid: ctx.local_port.to_string(),
        subnqn: sluice_proto::DISCOVERY_NQN.to_string(),
        traddr: addr,
        sectype: 0,
    });
    out
}
