//! Reservations through the real `QueueConnection` (byte-level hosts,
//! virtual clock): two hosts (two Host Identifiers) with an admin and an
//! I/O queue each register, acquire, preempt and release, and each one's
//! reads and writes get what the reservation allows, with the exact
//! statuses; Identify says what is supported; the Reservation Report and
//! the Reservation Notification log page carry what happened, announced by
//! an Asynchronous Event; a Preempt and Abort completes only after the
//! preempted host's write in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::cast_possible_truncation)]

mod common;

use common::*;
use sluice_config::{Config, NamespaceConfig, SubsystemConfig};
use sluice_proto::command::{admin, sgl, SglDescriptor, Sqe};
use sluice_proto::identify::{ctratt, oncs, IdentifyController, IdentifyNamespace};
use sluice_proto::log::lid;
use sluice_proto::reservation::{
    self, mask, notice, opcode, AcquireAction, AcquireCommand, Cptpl, NotificationLog,
    RegisterAction, RegisterCommand, ReleaseAction, ReleaseCommand, ReportCommand,
    ReservationStatus, ReservationType,
};
use sluice_proto::Status;
use sluice_target::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
const ID_A: [u8; 16] = [0xa; 16];
const ID_B: [u8; 16] = [0xb; 16];
const FID_RESERVATION_MASK: u8 = 0x82;
const FID_RESERVATION_PERSISTENCE: u8 = 0x83;

fn reg() -> Arc<Registry> {
    let c = Config::default()
        .with_target(target_settings(send_config("immediate")))
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_host(HOST_B)
                .with_namespace(default_ns())
                .with_namespace(NamespaceConfig::ram(2, 1 << 20).with_block_size(512)),
        )
        .validated()
        .expect("valid");
    registry(&c)
}

/// One host: its admin queue and one I/O queue.
struct Host {
    admin: Pair,
    io: Pair,
}

fn host(r: &Arc<Registry>, hostnqn: &str, hostid: [u8; 16]) -> Host {
    let mut admin = Pair::new(r.clone());
    admin.hostid = hostid;
    let cntlid = admin.admin_up_as(hostnqn);
    let mut io = Pair::new(r.clone());
    io.hostid = hostid;
    io.icreq(false, false);
    let c = io.connect(1, cntlid, hostnqn, 0);
    assert!(c.status().is_success(), "{:?}", c.status());
    Host { admin, io }
}

fn in_capsule(len: usize) -> SglDescriptor {
    SglDescriptor {
        address: 0,
        length: len as u32,
        id: sgl::DATA_BLOCK_OFFSET,
    }
}

fn register(h: &mut Host, action: RegisterAction, iekey: bool, crkey: u64, nrkey: u64) -> Status {
    let cid = h.io.cid();
    let mut s = Sqe::new(opcode::REGISTER, cid, 1);
    RegisterCommand {
        action,
        ignore_existing_key: iekey,
        cptpl: Cptpl::NoChange,
    }
    .write_to(&mut s);
    let data = reservation::encode_two_keys(crkey, nrkey);
    s.set_sgl(in_capsule(data.len()));
    h.io.command(s, &data).0.status()
}

/// A registers key 1, B key 2.
fn register_both(a: &mut Host, b: &mut Host) {
    assert_eq!(register(a, RegisterAction::Register, false, 0, 1), OK);
    assert_eq!(register(b, RegisterAction::Register, false, 0, 2), OK);
}

fn acquire_sqe(h: &mut Host, action: AcquireAction, rtype: ReservationType) -> Sqe {
    let cid = h.io.cid();
    let mut s = Sqe::new(opcode::ACQUIRE, cid, 1);
    AcquireCommand {
        action,
        ignore_existing_key: false,
        rtype,
    }
    .write_to(&mut s);
    s.set_sgl(in_capsule(16));
    s
}

fn acquire(
    h: &mut Host,
    action: AcquireAction,
    rtype: ReservationType,
    crkey: u64,
    prkey: u64,
) -> Status {
    let s = acquire_sqe(h, action, rtype);
    h.io.command(s, &reservation::encode_two_keys(crkey, prkey))
        .0
        .status()
}

fn release(h: &mut Host, action: ReleaseAction, rtype: u8, crkey: u64) -> Status {
    let cid = h.io.cid();
    let mut s = Sqe::new(opcode::RELEASE, cid, 1);
    ReleaseCommand {
        action,
        ignore_existing_key: false,
        rtype,
    }
    .write_to(&mut s);
    s.set_sgl(in_capsule(8));
    h.io.command(s, &crkey.to_le_bytes()).0.status()
}

fn report_raw(h: &mut Host, len: u64, extended: bool, sgl_len: u32) -> (Status, Vec<u8>) {
    let cid = h.io.cid();
    let mut s = Sqe::new(opcode::REPORT, cid, 1);
    ReportCommand {
        len_bytes: len,
        extended,
    }
    .write_to(&mut s);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: sgl_len,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    let (c, d) = h.io.command(s, &[]);
    (c.status(), d)
}

fn report(h: &mut Host) -> ReservationStatus {
    let (st, d) = report_raw(h, 4096, true, 4096);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(d.len(), 4096);
    ReservationStatus::decode_extended(&d).expect("a report")
}

/// (read, write) statuses of namespace 1 for `h`.
fn access(h: &mut Host) -> (Status, Status) {
    let w = h.io.write(8, &pattern(512, 3), 8192);
    let (r, _) = h.io.read(8, 1);
    (r, w)
}

const OK: Status = Status::SUCCESS;
const CONFLICT: Status = Status::RESERVATION_CONFLICT;

#[test]
fn identify_offers_every_reservation_type_and_128_bit_host_ids() {
    let r = reg();
    let mut a = host(&r, HOSTNQN, ID_A);
    let (st, d) = a.admin.identify(0x01, 0);
    assert_eq!(st, OK);
    let c = IdentifyController::decode(&d).unwrap();
    assert_ne!(c.oncs & oncs::RESERVATIONS, 0);
    assert_eq!(c.ctratt & ctratt::HOST_ID_128, ctratt::HOST_ID_128);
    let (st, d) = a.admin.identify(0x00, 1);
    assert_eq!(st, OK);
    let n = IdentifyNamespace::decode(&d).unwrap();
    assert_eq!(n.rescap, 0xfe, "types 1-6 and IEKEY, no PTPL");
    assert_eq!(n.nmic & 1, 1, "shared");
}

#[test]
fn a_write_exclusive_reservation_limits_the_other_host_to_reads() {
    let r = reg();
    let mut a = host(&r, HOSTNQN, ID_A);
    let mut b = host(&r, HOST_B, ID_B);
    assert_eq!(access(&mut b), (OK, OK), "no reservation");
    assert_eq!(
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ReservationType::WriteExclusive,
            1,
            0
        ),
        CONFLICT,
        "not registered"
    );
    assert_eq!(
        register(&mut a, RegisterAction::Register, false, 0, 0xaa),
        OK
    );
    assert_eq!(
        register(&mut b, RegisterAction::Register, false, 0, 0xbb),
        OK
    );
    assert_eq!(
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ReservationType::WriteExclusive,
            0xab,
            0
        ),
        CONFLICT,
        "wrong key"
    );
    assert_eq!(
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ReservationType::WriteExclusive,
            0xaa,
            0
        ),
        OK
    );
    assert_eq!(access(&mut a), (OK, OK), "the holder");
    assert_eq!(access(&mut b), (OK, CONFLICT), "a registrant: reads only");
    // Write Zeroes, Dataset Management and Flush are writes too.
    let wz = Sqe::rw(0x08, b.io.cid(), 1, 0, 1, false);
    assert_eq!(b.io.command(wz, &[]).0.status(), CONFLICT);
    let fl = Sqe::new(0x00, b.io.cid(), 1);
    assert_eq!(b.io.command(fl, &[]).0.status(), CONFLICT);
    // Namespace 2 has no reservation.
    assert_eq!(b.io.write_ns(2, 0, &pattern(512, 1), 8192), OK);
    // The conflict carries DNR, so a host does not retry it.
    let st = access(&mut b).1;
    assert!(st.dnr && (st.sct, st.sc) == (0, 0x83), "{st:?}");
    // What the metrics read: the type, the registrants, the conflicts.
    let ns = r.subsystem(SUBNQN).unwrap().namespaces.get(1).unwrap();
    assert_eq!(ns.reservations.summary(), (1, 2));
    assert_eq!(
        ns.reservations.refused(),
        4,
        "write, write zeroes, flush, write"
    );
    let rep = report(&mut a);
    assert_eq!(rep.reservation(), Some(ReservationType::WriteExclusive));
    assert_eq!(rep.registrant_count, 2);
    assert_eq!(rep.generation, 2, "two registrations");
    assert!(!rep.ptpl);
    let holders: Vec<([u8; 16], u64, bool)> = rep
        .registrants
        .iter()
        .map(|x| (x.hostid, x.key, x.holds))
        .collect();
    assert_eq!(holders, vec![(ID_A, 0xaa, true), (ID_B, 0xbb, false)]);
    assert_eq!(rep.registrants[0].cntlid, 0xffff);
    assert_eq!(
        release(
            &mut a,
            ReleaseAction::Release,
            ReservationType::WriteExclusive.as_u8(),
            0xaa
        ),
        OK
    );
    assert_eq!(access(&mut b), (OK, OK), "released");
}

#[test]
fn exclusive_access_registrants_only_shuts_out_strangers() {
    let r = reg();
    let mut a = host(&r, HOSTNQN, ID_A);
    let mut b = host(&r, HOST_B, ID_B);
    assert_eq!(register(&mut a, RegisterAction::Register, false, 0, 1), OK);
    assert_eq!(
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ReservationType::ExclusiveAccessRegistrantsOnly,
            1,
            0
        ),
        OK
    );
    assert_eq!(access(&mut b), (CONFLICT, CONFLICT), "not registered");
    assert_eq!(register(&mut b, RegisterAction::Register, false, 0, 2), OK);
    assert_eq!(access(&mut b), (OK, OK), "registered");
    // Unregistering with the wrong key fails; with IEKEY it needs none.
    assert_eq!(
        register(&mut b, RegisterAction::Unregister, false, 9, 0),
        CONFLICT
    );
    assert_eq!(register(&mut b, RegisterAction::Unregister, true, 0, 0), OK);
    assert_eq!(access(&mut b), (CONFLICT, CONFLICT));
}

#[test]
fn preempt_moves_the_reservation_and_the_preempted_host_is_told() {
    let r = reg();
    let mut a = host(&r, HOSTNQN, ID_A);
    let mut b = host(&r, HOST_B, ID_B);
    register_both(&mut a, &mut b);
    assert_eq!(
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ReservationType::ExclusiveAccess,
            1,
            0
        ),
        OK
    );
    a.admin.post_aer(900);
    assert_eq!(
        acquire(
            &mut b,
            AcquireAction::Preempt,
            ReservationType::WriteExclusive,
            2,
            1
        ),
        OK
    );
    assert_eq!(access(&mut a), (OK, CONFLICT), "A lost its registration");
    assert_eq!(access(&mut b), (OK, OK));
    let rep = report(&mut b);
    assert_eq!((rep.rtype, rep.registrant_count), (1, 1));
    // A's controller takes the notice at its next check and completes its
    // AER: Reservation Log Page Available.
    a.admin.advance(Duration::from_millis(1100));
    let got = a.admin.take();
    let dw0 = got
        .iter()
        .find_map(|g| match &g.header {
            sluice_proto::pdu::PduHeader::CapsuleResp(c) if c.cid == 900 => Some(c.result),
            _ => None,
        })
        .expect("the AER completes");
    assert_eq!(dw0, 0x6 | 0x80 << 16);
    let (c, page) = a.admin.admin_cmd(
        admin::GET_LOG_PAGE,
        0xffff_ffff,
        u32::from(lid::RESERVATION_NOTIFICATION) | 15 << 16,
        0,
        64,
    );
    assert_eq!(c.status(), OK);
    let log = NotificationLog::decode(&page).unwrap();
    assert_eq!(
        (log.count, log.kind, log.available, log.nsid),
        (1, notice::REGISTRATION_PREEMPTED, 0, 1)
    );
    let (_, page) = a.admin.admin_cmd(
        admin::GET_LOG_PAGE,
        0xffff_ffff,
        u32::from(lid::RESERVATION_NOTIFICATION) | 15 << 16,
        0,
        64,
    );
    assert_eq!(
        NotificationLog::decode(&page).unwrap(),
        NotificationLog::default(),
        "read: empty"
    );
    // B, who preempted, was told nothing.
    b.admin.post_aer(901);
    b.admin.advance(Duration::from_millis(1100));
    assert!(b.admin.take().is_empty());
}

#[test]
fn the_notification_mask_hides_a_notice() {
    let r = reg();
    let mut a = host(&r, HOSTNQN, ID_A);
    let mut b = host(&r, HOST_B, ID_B);
    let (c, _) = a.admin.admin_cmd(
        admin::SET_FEATURES,
        1,
        u32::from(FID_RESERVATION_MASK),
        mask::RESERVATION_PREEMPTED,
        0,
    );
    assert_eq!(c.status(), OK);
    let (c, _) = a.admin.admin_cmd(
        admin::GET_FEATURES,
        1,
        u32::from(FID_RESERVATION_MASK),
        0,
        0,
    );
    assert_eq!((c.status(), c.result), (OK, mask::RESERVATION_PREEMPTED));
    let (c, _) = a.admin.admin_cmd(
        admin::SET_FEATURES,
        1,
        u32::from(FID_RESERVATION_MASK),
        1,
        0,
    );
    assert_eq!(c.status(), Status::INVALID_FIELD, "bit 0 is reserved");
    let (c, _) = a.admin.admin_cmd(
        admin::GET_FEATURES,
        7,
        u32::from(FID_RESERVATION_MASK),
        0,
        0,
    );
    assert_eq!(c.status(), Status::INVALID_NAMESPACE);
    // Persistence: PTPL 0 only.
    let (c, _) = a.admin.admin_cmd(
        admin::GET_FEATURES,
        1,
        u32::from(FID_RESERVATION_PERSISTENCE),
        0,
        0,
    );
    assert_eq!((c.status(), c.result), (OK, 0));
    let (c, _) = a.admin.admin_cmd(
        admin::SET_FEATURES,
        1,
        u32::from(FID_RESERVATION_PERSISTENCE),
        1,
        0,
    );
    assert_eq!(c.status(), Status::INVALID_FIELD);
    register_both(&mut a, &mut b);
    a.admin.post_aer(900);
    // B clears: A is told "Reservation Preempted", which A masked.
    assert_eq!(release(&mut b, ReleaseAction::Clear, 0, 2), OK);
    a.admin.advance(Duration::from_millis(1100));
    assert!(a.admin.take().is_empty(), "masked: no event");
    assert_eq!(report(&mut a).registrant_count, 0);
}

#[test]
fn preempt_and_abort_completes_after_the_preempted_hosts_write() {
    let r = reg();
    let mut a = host(&r, HOSTNQN, ID_A);
    let mut b = host(&r, HOST_B, ID_B);
    register_both(&mut a, &mut b);
    assert_eq!(
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ReservationType::WriteExclusive,
            1,
            0
        ),
        OK
    );
    // A write of A's that passed its check and is still being performed.
    let ns = r.subsystem(SUBNQN).unwrap().namespaces.get(1).unwrap();
    let in_flight = ns.reservations.admit_write(&ID_A).expect("A holds it");
    let s = acquire_sqe(
        &mut b,
        AcquireAction::PreemptAndAbort,
        ReservationType::WriteExclusive,
    );
    let cid = s.cid();
    b.io.send(
        &sluice_proto::pdu::PduHeader::CapsuleCmd(s),
        &reservation::encode_two_keys(2, 1),
    );
    assert!(b.io.take().is_empty(), "waits for A's write");
    assert_eq!(
        access(&mut a).1,
        CONFLICT,
        "A's next write is refused already"
    );
    b.io.advance(Duration::from_millis(5));
    assert!(b.io.take().is_empty(), "still waiting");
    drop(in_flight);
    b.io.advance(Duration::from_millis(1));
    let (c, _) = b.io.collect_response(cid);
    assert_eq!(c.status(), OK);
    assert_eq!(report(&mut b).registrants.len(), 1);
}

#[test]
fn bad_reports_and_data_lengths_get_the_right_status() {
    let r = reg();
    let mut a = host(&r, HOSTNQN, ID_A);
    assert_eq!(
        report_raw(&mut a, 4096, false, 4096).0,
        Status::HOST_ID_INCONSISTENT,
        "128-bit Host Identifiers need the extended structure"
    );
    assert_eq!(
        report_raw(&mut a, 32, true, 32).0,
        Status::INVALID_FIELD,
        "shorter than the header"
    );
    assert_eq!(
        report_raw(&mut a, 4096, true, 512).0,
        Status::DATA_SGL_LENGTH_INVALID
    );
    // A report cut short keeps REGCTL.
    assert_eq!(register(&mut a, RegisterAction::Register, false, 0, 5), OK);
    let (st, d) = report_raw(&mut a, 64, true, 64);
    assert_eq!(st, OK);
    let rep = ReservationStatus::decode_extended(&d).unwrap();
    assert_eq!((rep.registrant_count, rep.registrants.len()), (1, 0));
    // Register data that is not 16 bytes.
    let cid = a.io.cid();
    let mut s = Sqe::new(opcode::REGISTER, cid, 1);
    s.set_sgl(in_capsule(8));
    assert_eq!(
        a.io.command(s, &[0; 8]).0.status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    // A reserved action, an unknown namespace.
    let cid = a.io.cid();
    let mut s = Sqe::new(opcode::REGISTER, cid, 1);
    s.set_cdw(10, 5);
    s.set_sgl(in_capsule(16));
    assert_eq!(a.io.command(s, &[0; 16]).0.status(), Status::INVALID_FIELD);
    let cid = a.io.cid();
    let mut s = Sqe::new(opcode::REGISTER, cid, 9);
    s.set_sgl(in_capsule(16));
    assert_eq!(
        a.io.command(s, &[0; 16]).0.status(),
        Status::INVALID_NAMESPACE
    );
    // The queue carries on.
    assert_eq!(access(&mut a), (OK, OK));
}
