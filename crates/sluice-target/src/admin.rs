//! The admin command set on a controller: Identify, Get Log Page (with the
//! discovery log), Set/Get Features, Keep Alive, Asynchronous Event Request
//! and Abort. Fabrics commands (Connect, Property Get/Set) are the queue's
//! (`queue/handshake.rs`, `queue/execute.rs`).
//!
//! Sans-IO: commands come in as SQE + data, results go out as
//! [`AdminReply`], and time is passed in.

use crate::controller::{fid, Controller};
use crate::registry::Registry;
use sluice_proto::command::{admin, Sqe};
use sluice_proto::fabrics::VS_1_3;
use sluice_proto::fence;
use sluice_proto::identify::{
    self, cns, cntrltype, oncs, IdentifyController, IdentifyControllerNvm, IdentifyNamespace,
};
use sluice_proto::log::{self, effects, lid, DiscoveryEntry, GetLogPage, SmartLog};
use sluice_proto::reservation;
use sluice_proto::Status;
use sluice_runtime::cast::usize_from;
use std::net::SocketAddr;
use std::time::Instant;

/// Asynchronous Event Request limit (AERL + 1).
pub const AER_MAX: usize = 4;
/// Firmware revision reported in Identify and the firmware slot log.
pub const FIRMWARE_REVISION: &str = concat!("S", env!("CARGO_PKG_VERSION"));
/// IEEE OUI-less vendor id; 0 means "not PCI".
const VENDOR_ID: u16 = 0;
/// The Changed Namespace List log's size (`log::encode_changed_ns_list`).
const CHANGED_NS_LIST_BYTES: u64 = 4096;

/// What an admin command produced.
#[derive(Debug, Default)]
pub struct AdminReply {
    pub(crate) status: Status,
    pub(crate) result: u32,
    pub(crate) dw1: u32,
    /// Controller-to-host data.
    pub(crate) data: Vec<u8>,
    /// AER: hold the command instead of completing it.
    pub(crate) hold: bool,
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
    pub(crate) local_addr: Option<SocketAddr>,
    /// Port the host reached us on.
    pub(crate) local_port: u16,
}

/// Executes an admin command (not Fabrics, not I/O) on `ctrl`.
pub fn execute(
    ctrl: &Controller,
    sqe: &Sqe,
    data_in: &[u8],
    reg: &Registry,
    ctx: &AdminContext,
    now: Instant,
) -> AdminReply {
    ctrl.keep_alive(now);
    if !ctrl.is_ready() && sqe.opcode() != admin::KEEP_ALIVE {
        return AdminReply::status(Status::COMMAND_SEQUENCE_ERROR);
    }
    let disc = ctrl.is_discovery();
    match sqe.opcode() {
        admin::IDENTIFY => identify(ctrl, sqe, reg),
        admin::GET_LOG_PAGE => get_log_page(ctrl, sqe, reg, ctx),
        admin::SET_FEATURES
            if !disc
                || matches!(
                    (sqe.cdw(10) & 0xff) as u8,
                    fid::KEEP_ALIVE_TIMER | fid::ASYNC_EVENT_CONFIG
                ) =>
        {
            set_features(ctrl, sqe, reg)
        }
        // A discovery controller has only those two features: any other FID
        // is an invalid field (nvmet, SPDK), as in Get Features.
        admin::SET_FEATURES => AdminReply::status(Status::INVALID_FIELD),
        admin::GET_FEATURES => get_features(ctrl, sqe),
        admin::KEEP_ALIVE => AdminReply::default(),
        admin::ASYNC_EVENT_REQUEST => AdminReply {
            hold: true,
            ..Default::default()
        },
        // Abort: best effort is allowed to abort nothing (DW0 bit 0 = 1).
        admin::ABORT if !disc => AdminReply::result(1),
        fence::FENCE_OPCODE if !disc => fence_command(ctrl, sqe),
        _ => {
            let _ = data_in;
            AdminReply::status(Status::INVALID_OPCODE)
        }
    }
}

/// Sluice's vendor-specific Fence command (`sluice_proto::fence`): raises
/// or reads a namespace's chain-epoch fences; DW0 = writes in flight there.
fn fence_command(ctrl: &Controller, sqe: &Sqe) -> AdminReply {
    let f = match fence::Fence::parse(sqe) {
        Ok(f) => f,
        Err(st) => return AdminReply::status(st),
    };
    let Some(ns) = ctrl.subsystem.namespaces.get(f.nsid) else {
        return AdminReply::status(Status::INVALID_NAMESPACE);
    };
    match ns
        .fences
        .fence(f.first_granule, f.granules, f.epoch, f.raise)
    {
        Ok(writes) => {
            if f.raise {
                tracing::info!(
                    nsid = f.nsid,
                    first = f.first_granule,
                    granules = f.granules,
                    epoch = f.epoch,
                    writes,
                    "chain-epoch fence raised"
                );
            }
            AdminReply {
                result: writes,
                dw1: fence::GRANULE_SHIFT,
                ..Default::default()
            }
        }
        Err(st) => AdminReply::status(st),
    }
}

/// Identify's AERL: the number of outstanding AERs, zero-based.
// AER_MAX is 4.
#[allow(clippy::cast_possible_truncation)]
const AERL: u8 = (AER_MAX - 1) as u8;

/// Identify's MDTS: the largest transfer as a power of two of 4 KiB pages.
fn mdts_field(mdts_bytes: u32) -> u8 {
    // A u32 has at most 32 trailing zeros.
    #[allow(clippy::cast_possible_truncation)]
    let log2 = (mdts_bytes / 4096).trailing_zeros() as u8;
    log2
}

/// The NVM command set's Identify Controller: WZSL from
/// `target.write_zeroes_bytes_max`, in 4 KiB pages (CAP.MPSMIN is 0).
fn identify_controller_nvm(reg: &Registry) -> IdentifyControllerNvm {
    let wzsl = reg.settings.write_zeroes_bytes_max.map_or(0, |b| {
        // A power of two from 8 KiB (validated; 1 page would read as
        // WZSL 0, no limit): 1 to 63.
        #[allow(clippy::cast_possible_truncation)]
        let log2 = (b / 4096).trailing_zeros() as u8;
        log2
    });
    IdentifyControllerNvm {
        wzsl,
        ..Default::default()
    }
}

fn identify_controller(ctrl: &Controller, reg: &Registry) -> IdentifyController {
    let sub = &ctrl.subsystem;
    let st = &reg.settings;
    let disc = ctrl.is_discovery();
    let vwc = sub.volatile_write_cache();
    IdentifyController {
        vid: VENDOR_ID,
        ssvid: VENDOR_ID,
        serial: sub.serial.clone(),
        model: sub.model.clone(),
        firmware: FIRMWARE_REVISION.to_string(),
        cmic: if disc { 0 } else { 0x3 },
        mdts: mdts_field(st.mdts_bytes),
        cntlid: ctrl.cntlid,
        ver: VS_1_3,
        // Host Identifiers are the 128-bit ones of Connect: a host reads
        // reservation reports in the extended form.
        ctratt: identify::ctratt::HOST_ID_128,
        // Namespace Attribute Notices (a namespace grown online, added or
        // removed); Discovery Log Page Change Notices on a discovery
        // controller.
        oaes: if disc {
            crate::events::AEN_DISCOVERY_CHANGE
        } else {
            crate::events::AEN_NS_ATTRIBUTE
        },
        cntrltype: if disc {
            cntrltype::DISCOVERY
        } else {
            cntrltype::IO
        },
        oacs: 0,
        acl: 3,
        aerl: AERL,
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
            oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS
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

fn identify(ctrl: &Controller, sqe: &Sqe, reg: &Registry) -> AdminReply {
    let cns_v = (sqe.cdw(10) & 0xff) as u8;
    let csi = (sqe.cdw(11) >> 24) as u8;
    let nsid = sqe.nsid();
    let sub = &ctrl.subsystem;
    // The data (4 KiB) must fit the host's buffer (nvmet, SPDK refuse too).
    if usize_from(u64::from(sqe.sgl().length)) < identify::IDENTIFY_LEN {
        return AdminReply::status(Status::DATA_SGL_LENGTH_INVALID);
    }
    if ctrl.is_discovery() && cns_v != cns::CONTROLLER {
        return AdminReply::status(Status::INVALID_FIELD);
    }
    match cns_v {
        cns::CONTROLLER => AdminReply::data(identify_controller(ctrl, reg).encode()),
        cns::NAMESPACE => {
            if nsid == 0 || nsid == 0xffff_ffff {
                return AdminReply::status(Status::INVALID_NAMESPACE);
            }
            match sub.namespaces.get(nsid) {
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
                        rescap: reservation::RESCAP_ALL_TYPES_IEKEY,
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
            let ids: Vec<u32> = sub.namespaces.snapshot().keys().copied().collect();
            AdminReply::data(identify::encode_active_ns_list(&ids, nsid))
        }
        cns::NS_DESCRIPTORS => match sub.namespaces.get(nsid) {
            Some(ns) => AdminReply::data(identify::encode_ns_descriptors(&ns.nguid, &ns.nguid)),
            None => AdminReply::status(Status::INVALID_NAMESPACE),
        },
        // I/O command set specific Identify Controller for the NVM set:
        // the Write Zeroes limit when one is set; zero is "no limit".
        cns::CS_CONTROLLER if csi == identify::csi::NVM => {
            AdminReply::data(identify_controller_nvm(reg).encode())
        }
        _ => AdminReply::status(Status::INVALID_FIELD),
    }
}

fn get_log_page(ctrl: &Controller, sqe: &Sqe, reg: &Registry, ctx: &AdminContext) -> AdminReply {
    let g = GetLogPage::parse(sqe);
    let disc = ctrl.is_discovery();
    // The command's own fields first: a log that a read clears (Changed
    // Namespace List) is cleared only by a read that succeeds.
    if !g.offset_bytes.is_multiple_of(4) || g.len_bytes > 1 << 20 {
        return AdminReply::status(Status::INVALID_FIELD);
    }
    if u64::from(sqe.sgl().length) < g.len_bytes {
        return AdminReply::status(Status::DATA_SGL_LENGTH_INVALID);
    }
    let page = match g.lid {
        lid::DISCOVERY if disc => {
            // Read before the entries: a change after this is noticed.
            let genctr = reg.genctr();
            let entries = discovery_entries(ctrl, reg, ctx);
            let listed = entries
                .iter()
                .filter(|e| e.subtype == log::subtype::NVME)
                .map(|e| e.subnqn.clone())
                .collect();
            ctrl.discovery_log_read(g.rae, genctr, listed);
            log::encode_discovery_log(genctr, &entries)
        }
        lid::ERROR if !disc => vec![0u8; 64],
        lid::SMART if !disc => {
            let nsid = sqe.nsid();
            let snap = if nsid == 0 || nsid == 0xffff_ffff {
                ctrl.host_counters.snapshot()
            } else {
                match ctrl.subsystem.namespaces.get(nsid) {
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
        lid::CHANGED_NS_LIST if !disc => {
            if g.offset_bytes > CHANGED_NS_LIST_BYTES {
                return AdminReply::status(Status::INVALID_FIELD);
            }
            ctrl.changed_ns_log(g.rae)
        }
        lid::RESERVATION_NOTIFICATION if !disc => ctrl.reservation_log(g.rae),
        lid::COMMANDS_SUPPORTED => {
            let a = |op| (op, effects::CSUPP);
            let mut admin_ops: Vec<(u8, u32)> = vec![
                a(admin::IDENTIFY),
                a(admin::GET_LOG_PAGE),
                a(admin::SET_FEATURES),
                a(admin::GET_FEATURES),
                a(admin::ASYNC_EVENT_REQUEST),
                a(admin::KEEP_ALIVE),
            ];
            if !disc {
                // A discovery controller has no I/O queues to abort on.
                admin_ops.push(a(admin::ABORT));
            }
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
                    (reservation::opcode::REGISTER, effects::CSUPP),
                    (reservation::opcode::REPORT, effects::CSUPP),
                    (reservation::opcode::ACQUIRE, effects::CSUPP),
                    (reservation::opcode::RELEASE, effects::CSUPP),
                ]
            };
            log::encode_commands_supported(&admin_ops, &io_ops)
        }
        _ => return AdminReply::status(Status::INVALID_LOG_PAGE),
    };
    // Return exactly the requested window, zero-padded past the end.
    let off = g.offset_bytes;
    if off > page.len() as u64 {
        return AdminReply::status(Status::INVALID_FIELD);
    }
    let mut out = vec![0u8; usize_from(g.len_bytes)];
    let avail = &page[usize_from(off)..];
    let n = avail.len().min(out.len());
    out[..n].copy_from_slice(&avail[..n]);
    AdminReply::data(out)
}

fn set_features(ctrl: &Controller, sqe: &Sqe, reg: &Registry) -> AdminReply {
    let cdw10 = sqe.cdw(10);
    let f = (cdw10 & 0xff) as u8;
    let save = cdw10 & (1 << 31) != 0;
    if save {
        return AdminReply::status(Status::FEATURE_NOT_SAVEABLE);
    }
    match f {
        fid::RESERVATION_NOTIFICATION_MASK => {
            let nsid = match sqe.nsid() {
                0xffff_ffff => None,
                n if ctrl.subsystem.namespaces.get(n).is_some() => Some(n),
                _ => return AdminReply::status(Status::INVALID_NAMESPACE),
            };
            return if ctrl.set_reservation_mask(nsid, sqe.cdw(11)) {
                AdminReply::result(sqe.cdw(11))
            } else {
                AdminReply::status(Status::INVALID_FIELD)
            };
        }
        fid::RESERVATION_PERSISTENCE => {
            // Reservations do not persist through a restart (RESCAP bit 0
            // is clear): PTPL 0 is the only value.
            if ctrl.subsystem.namespaces.get(sqe.nsid()).is_none() {
                return AdminReply::status(Status::INVALID_NAMESPACE);
            }
            return if sqe.cdw(11) & 1 == 0 {
                AdminReply::result(0)
            } else {
                AdminReply::status(Status::INVALID_FIELD)
            };
        }
        _ => {}
    }
    match ctrl.set_feature(f, sqe.cdw(11), reg.settings.io_queues_max) {
        Ok(result) => AdminReply::result(result),
        Err(st) => AdminReply::status(st),
    }
}

fn get_features(ctrl: &Controller, sqe: &Sqe) -> AdminReply {
    let cdw10 = sqe.cdw(10);
    let f = (cdw10 & 0xff) as u8;
    let mut sel = (cdw10 >> 8) & 0x7;
    if sel > 3 {
        // Reserved; nvmet and SPDK ignore SEL and report the current value.
        crate::tolerated::note(
            crate::tolerated::Tolerated::FeatureSelReserved,
            format_args!("SEL {sel}, FID {f:#04x}"),
        );
        sel = 0;
    }
    // A discovery controller reports only keep alive and async event config.
    let readable =
        !ctrl.is_discovery() || matches!(f, fid::KEEP_ALIVE_TIMER | fid::ASYNC_EVENT_CONFIG);
    // The reservation features are a namespace's (of an active NSID).
    if readable
        && matches!(
            f,
            fid::RESERVATION_NOTIFICATION_MASK | fid::RESERVATION_PERSISTENCE
        )
    {
        if ctrl.subsystem.namespaces.get(sqe.nsid()).is_none() {
            return AdminReply::status(Status::INVALID_NAMESPACE);
        }
        let notification_mask = f == fid::RESERVATION_NOTIFICATION_MASK;
        return AdminReply::result(match (sel, notification_mask) {
            // Namespace specific (bit 1); the mask is changeable (bit 2).
            (3, true) => 0x6,
            (3, false) => 0x2,
            (_, true) => ctrl.reservation_mask(sqe.nsid()),
            (_, false) => 0,
        });
    }
    let current = match ctrl.feature(f) {
        Some(r) if readable => r,
        // An FID we do not report is invalid whatever SEL asks (nvmet, SPDK).
        _ => return AdminReply::status(Status::INVALID_FIELD),
    };
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
    AdminReply::result(current)
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
    for sub in reg.subsystems_listed_for(&ctrl.hostnqn) {
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
