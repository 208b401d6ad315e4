//! Conformance of the target's command checks: one test per ADM-, IO- and
//! AUTH- row of the inventory (`/work/conformance/sluice-target-checks.md`)
//! and the AER CID reuse tolerance. Each test sends the row's input through
//! the real `QueueConnection` (byte-level host, virtual clock) and asserts
//! the exact status (SCT/SC and DNR), DW0 where the row has one, and that
//! the queue carries on afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::*;
use sluice_auth::message::{reason, Challenge, Message};
use sluice_auth::{DhGroup, HashId, HostAuth, HostConfig, Secret};
use sluice_backend::Backend;
use sluice_config::auth::HostAuthConfig;
use sluice_config::{Config, NamespaceConfig, SubsystemConfig, TargetSettings};
use sluice_pair::GrowableRam;
use sluice_proto::command::{admin, io, sgl, Cqe, SglDescriptor, Sqe};
use sluice_proto::dsm::{DsmCommand, DsmRange};
use sluice_proto::fabrics::{cc, fctype, prop, AuthCommand, PropertyCommand, CNTLID_DYNAMIC};
use sluice_proto::fence::{self, Fence};
use sluice_proto::log::lid;
use sluice_proto::pdu::PduHeader;
use sluice_proto::Status;
use sluice_target::registry::{Registry, VolumeOpener};
use sluice_target::tolerated::{self, Tolerated};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const FID_ARBITRATION: u8 = 0x01;
const FID_TEMPERATURE_THRESHOLD: u8 = 0x04;
const FID_VOLATILE_WRITE_CACHE: u8 = 0x06;
const FID_NUMBER_OF_QUEUES: u8 = 0x07;
const FID_ASYNC_EVENT_CONFIG: u8 = 0x0b;
const FID_KEEP_ALIVE_TIMER: u8 = 0x0f;
/// Namespace 1's blocks (4 MiB of 512-byte blocks).
const BLOCKS: u64 = 4 * 1024 * 1024 / 512;

fn reg() -> Arc<Registry> {
    registry(&config_in("immediate", default_ns()))
}

/// An enabled admin queue on the NVM subsystem.
fn admin_q() -> (Arc<Registry>, Pair, u16) {
    let r = reg();
    let (p, cntlid) = admin_pair(&r);
    (r, p, cntlid)
}

/// An enabled admin queue on the discovery subsystem.
fn discovery_q() -> Pair {
    let mut p = Pair::new(reg());
    p.icreq(false, false);
    let c = p.connect_to(sluice_proto::DISCOVERY_NQN, 0, CNTLID_DYNAMIC, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(p.prop_set(prop::CC, u64::from(cc::EN)), Status::SUCCESS);
    p
}

/// An admin command with a C2H SGL of `len` bytes (none when 0): status,
/// DW0 and data.
fn adm(p: &mut Pair, op: u8, nsid: u32, cdw10: u32, cdw11: u32, len: u32) -> (Status, u32) {
    let (c, _) = p.admin_cmd(op, nsid, cdw10, cdw11, len);
    (c.status(), c.result)
}

fn set_feature(p: &mut Pair, fid: u8, v: u32) -> (Status, u32) {
    adm(p, admin::SET_FEATURES, 0, u32::from(fid), v, 0)
}

fn get_feature(p: &mut Pair, fid: u8, sel: u32) -> (Status, u32) {
    adm(p, admin::GET_FEATURES, 0, u32::from(fid) | sel << 8, 0, 0)
}

/// Get Log Page `lid` of `len` bytes at `offset`, SGL length `sgl_len`.
fn log_page(p: &mut Pair, lid: u8, nsid: u32, len: u64, offset: u64, sgl_len: u32) -> Cqe {
    let numd = len / 4 - 1;
    let cid = p.cid();
    let mut s = Sqe::new(admin::GET_LOG_PAGE, cid, nsid);
    s.set_cdw(10, u32::from(lid) | ((numd & 0xffff) as u32) << 16);
    s.set_cdw(11, (numd >> 16) as u32);
    s.set_cdw(12, offset as u32);
    s.set_cdw(13, (offset >> 32) as u32);
    if sgl_len > 0 {
        s.set_sgl(c2h(sgl_len));
    }
    p.command(s, &[]).0
}

fn c2h(len: u32) -> SglDescriptor {
    SglDescriptor {
        address: 0,
        length: len,
        id: sgl::TRANSPORT_DATA_BLOCK,
    }
}

fn in_capsule(len: u32) -> SglDescriptor {
    SglDescriptor {
        address: 0,
        length: len,
        id: sgl::DATA_BLOCK_OFFSET,
    }
}

/// Read `nlb` blocks of `nsid` at `slba` with a C2H SGL of `sgl_len` bytes.
fn read_sgl(p: &mut Pair, nsid: u32, slba: u64, nlb: u32, sgl_len: u32) -> Status {
    let cid = p.cid();
    let mut s = Sqe::rw(io::READ, cid, nsid, slba, nlb, false);
    if sgl_len > 0 {
        s.set_sgl(c2h(sgl_len));
    }
    p.command(s, &[]).0.status()
}

/// A command with no data on the queue.
fn no_data(p: &mut Pair, mut s: Sqe) -> Status {
    s.0[2..4].copy_from_slice(&p.cid().to_le_bytes());
    p.command(s, &[]).0.status()
}

fn write_zeroes(p: &mut Pair, nsid: u32, slba: u64, nlb: u32) -> Status {
    no_data(p, Sqe::rw(io::WRITE_ZEROES, 0, nsid, slba, nlb, false))
}

/// Dataset Management of `ranges` (in the capsule) with NR = `nr` - 1.
fn dsm(p: &mut Pair, nsid: u32, nr: u32, deallocate: bool, ranges: &[DsmRange]) -> Status {
    let cid = p.cid();
    let mut s = Sqe::new(io::DATASET_MANAGEMENT, cid, nsid);
    DsmCommand {
        ranges: nr,
        deallocate,
    }
    .write_to(&mut s);
    let data: Vec<u8> = ranges.iter().flat_map(|r| r.encode()).collect();
    s.set_sgl(in_capsule(data.len() as u32));
    p.command(s, &data).0.status()
}

/// A full round trip still works on the I/O queue.
fn io_still_works(p: &mut Pair) {
    assert_eq!(p.read(0, 1).0, Status::SUCCESS);
    assert!(p.term.is_none());
}

/// The admin queue still answers.
fn admin_still_works(p: &mut Pair) {
    assert_eq!(p.identify(1, 0).0, Status::SUCCESS);
    assert!(p.term.is_none());
}

// ---------------------------------------------------------------- ADM

#[test]
fn adm_01_admin_command_before_ready_is_command_sequence_error() {
    let mut p = Pair::new(reg());
    p.icreq(false, false);
    assert!(p
        .connect(0, CNTLID_DYNAMIC, HOSTNQN, 5000)
        .status()
        .is_success());
    // CC.EN = 0: everything but Keep Alive (and Fabrics commands) is CSE.
    assert_eq!(p.identify(1, 0).0, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(
        get_feature(&mut p, FID_KEEP_ALIVE_TIMER, 0).0,
        Status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        adm(&mut p, admin::KEEP_ALIVE, 0, 0, 0, 0).0,
        Status::SUCCESS
    );
    // Enabled, then shut down: CSE again.
    let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    assert_eq!(p.prop_set(prop::CC, u64::from(en)), Status::SUCCESS);
    admin_still_works(&mut p);
    let shn = en | 1 << cc::SHN_SHIFT;
    assert_eq!(p.prop_set(prop::CC, u64::from(shn)), Status::SUCCESS);
    assert_eq!(p.identify(1, 0).0, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(
        adm(&mut p, admin::KEEP_ALIVE, 0, 0, 0, 0).0,
        Status::SUCCESS
    );
    assert!(p.term.is_none());
}

#[test]
fn adm_02_unimplemented_admin_opcode_is_invalid_opcode() {
    let (_r, mut p, _) = admin_q();
    for op in [
        0x00, 0x01, 0x03, 0x04, 0x05, 0x10, 0x11, 0x14, 0x7e, 0x80, 0xbf, 0xc1, 0xff,
    ] {
        assert_eq!(
            adm(&mut p, op, 0, 0, 0, 0).0,
            Status::INVALID_OPCODE,
            "opcode {op:#04x}"
        );
    }
    admin_still_works(&mut p);
}

#[test]
fn adm_03_discovery_abort_and_fence_are_invalid_opcode() {
    let mut p = discovery_q();
    assert_eq!(
        adm(&mut p, admin::ABORT, 0, 0, 0, 0).0,
        Status::INVALID_OPCODE
    );
    let f = Fence {
        nsid: 1,
        first_granule: 0,
        granules: 1,
        epoch: 1,
        raise: true,
    };
    assert_eq!(no_data(&mut p, f.to_sqe()), Status::INVALID_OPCODE);
    admin_still_works(&mut p);
}

#[test]
fn adm_04_discovery_set_features_unsupported_fid_is_invalid_field() {
    let mut p = discovery_q();
    for fid in [FID_ARBITRATION, FID_NUMBER_OF_QUEUES, 0x55, 0x81] {
        assert_eq!(
            set_feature(&mut p, fid, 0).0,
            Status::INVALID_FIELD,
            "FID {fid:#04x}"
        );
    }
    // The two it has are still settable.
    assert_eq!(
        set_feature(&mut p, FID_KEEP_ALIVE_TIMER, 30_000).0,
        Status::SUCCESS
    );
    assert_eq!(
        set_feature(&mut p, FID_ASYNC_EVENT_CONFIG, 0).0,
        Status::SUCCESS
    );
    admin_still_works(&mut p);
}

#[test]
fn adm_05_discovery_identify_other_cns_is_invalid_field() {
    let mut p = discovery_q();
    for cns in [0u8, 2, 3, 6] {
        assert_eq!(p.identify(cns, 1).0, Status::INVALID_FIELD, "CNS {cns}");
    }
    admin_still_works(&mut p);
}

#[test]
fn adm_06_identify_namespace_nsid_0_or_broadcast_is_invalid_namespace() {
    let (_r, mut p, _) = admin_q();
    assert_eq!(p.identify(0, 0).0, Status::INVALID_NAMESPACE);
    assert_eq!(p.identify(0, 0xffff_ffff).0, Status::INVALID_NAMESPACE);
    admin_still_works(&mut p);
}

#[test]
fn adm_07_identify_inactive_nsid_in_range_is_zeroes() {
    let (_r, mut p, _) = admin_q();
    for nsid in [2, 1024] {
        let (st, d) = p.identify(0, nsid);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(d, vec![0u8; 4096], "NSID {nsid}");
    }
}

#[test]
fn adm_08_identify_inactive_nsid_beyond_max_is_invalid_namespace() {
    let (_r, mut p, _) = admin_q();
    for nsid in [1025, 9999, 0xffff_fffe] {
        assert_eq!(p.identify(0, nsid).0, Status::INVALID_NAMESPACE, "{nsid}");
    }
    admin_still_works(&mut p);
}

#[test]
fn adm_09_active_ns_list_from_fffffffe_is_invalid_namespace() {
    let (_r, mut p, _) = admin_q();
    assert_eq!(p.identify(2, 0xffff_fffe).0, Status::INVALID_NAMESPACE);
    assert_eq!(p.identify(2, 0xffff_ffff).0, Status::INVALID_NAMESPACE);
    let (st, d) = p.identify(2, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(&d[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn adm_10_ns_descriptors_of_inactive_nsid_is_invalid_namespace() {
    let (_r, mut p, _) = admin_q();
    for nsid in [0, 2, 1024, 0xffff_ffff] {
        assert_eq!(p.identify(3, nsid).0, Status::INVALID_NAMESPACE, "{nsid}");
    }
    assert_eq!(p.identify(3, 1).0, Status::SUCCESS);
}

#[test]
fn adm_11_identify_cns_6_with_csi_other_than_nvm_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    let (c, d) = p.admin_cmd(admin::IDENTIFY, 0, 6, 0, 4096);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(d, vec![0u8; 4096]);
    for csi in [1u32, 2, 0xff] {
        let (c, _) = p.admin_cmd(admin::IDENTIFY, 0, 6, csi << 24, 4096);
        assert_eq!(c.status(), Status::INVALID_FIELD, "CSI {csi}");
    }
}

#[test]
fn adm_12_identify_other_cns_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    for cns in [0x04u8, 0x05, 0x07, 0x08, 0x1f, 0xff] {
        assert_eq!(p.identify(cns, 1).0, Status::INVALID_FIELD, "CNS {cns:#x}");
    }
    admin_still_works(&mut p);
}

#[test]
fn adm_13_log_page_the_controller_does_not_offer_is_invalid_log_page() {
    let (_r, mut p, _) = admin_q();
    for l in [0x00u8, 0x06, 0x42, lid::DISCOVERY, 0x81] {
        assert_eq!(
            log_page(&mut p, l, 0, 512, 0, 512).status(),
            Status::INVALID_LOG_PAGE,
            "NVM LID {l:#x}"
        );
    }
    for l in [
        lid::ERROR,
        lid::SMART,
        lid::FIRMWARE_SLOT,
        lid::COMMANDS_SUPPORTED,
    ] {
        assert_eq!(log_page(&mut p, l, 0, 64, 0, 64).status(), Status::SUCCESS);
    }
    let mut d = discovery_q();
    for l in [
        lid::ERROR,
        lid::SMART,
        lid::FIRMWARE_SLOT,
        lid::CHANGED_NS_LIST,
    ] {
        assert_eq!(
            log_page(&mut d, l, 0, 512, 0, 512).status(),
            Status::INVALID_LOG_PAGE,
            "discovery LID {l:#x}"
        );
    }
    for l in [lid::DISCOVERY, lid::COMMANDS_SUPPORTED] {
        assert_eq!(log_page(&mut d, l, 0, 64, 0, 64).status(), Status::SUCCESS);
    }
}

#[test]
fn adm_14_smart_log_of_inactive_nsid_is_invalid_namespace() {
    let (_r, mut p, _) = admin_q();
    for nsid in [2, 1024, 0xffff_fffe] {
        assert_eq!(
            log_page(&mut p, lid::SMART, nsid, 512, 0, 512).status(),
            Status::INVALID_NAMESPACE
        );
    }
    for nsid in [0, 1, 0xffff_ffff] {
        assert_eq!(
            log_page(&mut p, lid::SMART, nsid, 512, 0, 512).status(),
            Status::SUCCESS
        );
    }
}

struct GrowableOpener(Arc<AtomicU64>);

impl VolumeOpener for GrowableOpener {
    fn open_volume(
        &self,
        _name: &str,
        _control: &str,
        _token_file: Option<&std::path::Path>,
    ) -> Result<Arc<dyn Backend>, String> {
        let ram =
            GrowableRam::new(8 << 20, 512, 4 << 20, self.0.clone()).map_err(|e| e.to_string())?;
        Ok(Arc::new(ram))
    }
}

#[test]
fn adm_15_log_page_offset_unaligned_or_past_the_log_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    // SMART is 512 bytes.
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, 64, 2, 64).status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, 64, 516, 64).status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, 64, 1 << 40, 64).status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, 64, 512, 64).status(),
        Status::SUCCESS,
        "the end of the log is a valid (empty) window"
    );
    // The Changed Namespace List is cleared only by a read that succeeds.
    let size = Arc::new(AtomicU64::new(4 << 20));
    let c = config_in(
        "immediate",
        NamespaceConfig::volume(1, "growable", "127.0.0.1:1").with_block_size(512),
    );
    let r = Arc::new(Registry::build_with(&c, &GrowableOpener(size.clone())).unwrap());
    let (mut p, _) = admin_pair(&r);
    size.store(6 << 20, Ordering::Release);
    let changed = |p: &mut Pair, offset: u64| -> (Status, Vec<u32>) {
        let numd = 4096 / 4 - 1;
        let mut s = Sqe::new(admin::GET_LOG_PAGE, p.cid(), 0xffff_ffff);
        s.set_cdw(10, u32::from(lid::CHANGED_NS_LIST) | numd << 16);
        s.set_cdw(12, offset as u32);
        s.set_sgl(c2h(4096));
        let (c, d) = p.command(s, &[]);
        let ids = d
            .chunks(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .take_while(|v| *v != 0)
            .collect();
        (c.status(), ids)
    };
    assert_eq!(changed(&mut p, 6).0, Status::INVALID_FIELD);
    assert_eq!(changed(&mut p, 4100).0, Status::INVALID_FIELD);
    assert_eq!(
        changed(&mut p, 0),
        (Status::SUCCESS, vec![1]),
        "not cleared"
    );
    assert_eq!(changed(&mut p, 0), (Status::SUCCESS, vec![]), "cleared");
}

#[test]
fn adm_16_log_page_numd_above_1_mib_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    let len = (1u64 << 20) + 4;
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, len, 0, 4096).status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, 5 << 20, 0, 1 << 20).status(),
        Status::INVALID_FIELD
    );
    admin_still_works(&mut p);
}

#[test]
fn adm_17_set_features_save_is_feature_not_saveable() {
    let (_r, mut p, _) = admin_q();
    for fid in [FID_KEEP_ALIVE_TIMER, 0x55] {
        let (st, _) = adm(
            &mut p,
            admin::SET_FEATURES,
            0,
            1 << 31 | u32::from(fid),
            0,
            0,
        );
        assert_eq!(st, Status::FEATURE_NOT_SAVEABLE, "FID {fid:#x}");
        assert_eq!((st.sct, st.sc, st.dnr), (1, 0x0d, true));
    }
    admin_still_works(&mut p);
}

#[test]
fn adm_18_number_of_queues_ffffh_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    for v in [0xffff, 0xffff << 16, 0xffff_ffff] {
        assert_eq!(
            set_feature(&mut p, FID_NUMBER_OF_QUEUES, v).0,
            Status::INVALID_FIELD
        );
    }
    assert_eq!(
        set_feature(&mut p, FID_NUMBER_OF_QUEUES, 0).0,
        Status::SUCCESS
    );
}

#[test]
fn adm_19_number_of_queues_with_an_io_queue_connected_is_sequence_error() {
    let (r, mut p, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    assert_eq!(
        set_feature(&mut p, FID_NUMBER_OF_QUEUES, 3 << 16 | 3).0,
        Status::COMMAND_SEQUENCE_ERROR
    );
    io_still_works(&mut q);
    admin_still_works(&mut p);
}

#[test]
fn adm_20_number_of_queues_grants_the_smaller_request_capped() {
    let (r, mut p, _) = admin_q();
    let (st, dw0) = set_feature(&mut p, FID_NUMBER_OF_QUEUES, 7 << 16 | 2);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(dw0, 2 << 16 | 2, "min(NSQR, NCQR) + 1 = 3 queues, 0-based");
    assert_eq!(get_feature(&mut p, FID_NUMBER_OF_QUEUES, 0), (st, dw0));
    let _ = r;
    let max = u32::from(TargetSettings::default().io_queues_max) - 1;
    let (st, dw0) = set_feature(&mut p, FID_NUMBER_OF_QUEUES, 0xfffe << 16 | 0xfffe);
    assert_eq!((st, dw0), (Status::SUCCESS, max << 16 | max));
}

#[test]
fn adm_21_set_features_of_fixed_features_is_not_changeable() {
    let (_r, mut p, _) = admin_q();
    for fid in [0x01u8, 0x02, 0x05, 0x08, 0x09, 0x0a] {
        let (st, _) = set_feature(&mut p, fid, 0);
        assert_eq!(st, Status::FEATURE_NOT_CHANGEABLE, "FID {fid:#x}");
        assert_eq!((st.sct, st.sc, st.dnr), (1, 0x0e, true));
    }
    admin_still_works(&mut p);
}

#[test]
fn adm_22_set_features_unknown_fid_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    for fid in [0x00u8, 0x03, 0x0c, 0x0d, 0x0e, 0x10, 0x55, 0x80, 0x84, 0xff] {
        assert_eq!(
            set_feature(&mut p, fid, 0).0,
            Status::INVALID_FIELD,
            "FID {fid:#x}"
        );
    }
    // Host Identifier: on Fabrics it comes from Connect (nvmet, SPDK).
    assert_eq!(
        set_feature(&mut p, 0x81, 0).0,
        Status::COMMAND_SEQUENCE_ERROR
    );
    admin_still_works(&mut p);
}

#[test]
fn adm_23_set_features_stored_features() {
    let (_r, mut p, _) = admin_q();
    // AEC: reserved bits are stored as given.
    assert_eq!(
        set_feature(&mut p, FID_ASYNC_EVENT_CONFIG, 0xffff_ffff).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feature(&mut p, FID_ASYNC_EVENT_CONFIG, 0),
        (Status::SUCCESS, 0xffff_ffff)
    );
    // KATO 0 disables the timer.
    assert_eq!(
        set_feature(&mut p, FID_KEEP_ALIVE_TIMER, 0).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feature(&mut p, FID_KEEP_ALIVE_TIMER, 0),
        (Status::SUCCESS, 0)
    );
    p.advance(Duration::from_secs(60));
    admin_still_works(&mut p);
    // VWC with no volatile cache anywhere (RAM): nothing to set.
    assert_eq!(
        set_feature(&mut p, FID_VOLATILE_WRITE_CACHE, 1).0,
        Status::INVALID_FIELD
    );
    // Temperature threshold: bits 15:0 kept; reserved TMPSEL/THSEL refused.
    assert_eq!(
        set_feature(&mut p, FID_TEMPERATURE_THRESHOLD, 0x0150).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feature(&mut p, FID_TEMPERATURE_THRESHOLD, 0),
        (Status::SUCCESS, 0x0150)
    );
    assert_eq!(
        set_feature(
            &mut p,
            FID_TEMPERATURE_THRESHOLD,
            15 << 16 | 1 << 20 | 0x0140
        )
        .0,
        Status::SUCCESS
    );
    for bad in [9u32 << 16, 14 << 16, 2 << 20, 3 << 20] {
        assert_eq!(
            set_feature(&mut p, FID_TEMPERATURE_THRESHOLD, bad | 0x0120).0,
            Status::INVALID_FIELD,
            "{bad:#x}"
        );
    }
    assert_eq!(
        get_feature(&mut p, FID_TEMPERATURE_THRESHOLD, 0),
        (Status::SUCCESS, 0x0140)
    );
}

#[test]
fn adm_24_get_features_reserved_sel_is_tolerated_as_current() {
    let (_r, mut p, _) = admin_q();
    let before = tolerated::count(Tolerated::FeatureSelReserved);
    let current = get_feature(&mut p, FID_KEEP_ALIVE_TIMER, 0);
    assert_eq!(current, (Status::SUCCESS, 5000));
    for sel in 4..8 {
        assert_eq!(get_feature(&mut p, FID_KEEP_ALIVE_TIMER, sel), current);
    }
    // An unknown FID is still refused.
    assert_eq!(get_feature(&mut p, 0x55, 5).0, Status::INVALID_FIELD);
    assert!(tolerated::count(Tolerated::FeatureSelReserved) >= before + 5);
}

#[test]
fn adm_25_get_features_supported_capabilities() {
    let (_r, mut p, _) = admin_q();
    for fid in [0x04u8, 0x06, 0x07, 0x0b, 0x0f] {
        assert_eq!(
            get_feature(&mut p, fid, 3),
            (Status::SUCCESS, 4),
            "{fid:#x}"
        );
    }
    for fid in [0x01u8, 0x02, 0x05, 0x08, 0x0a] {
        assert_eq!(
            get_feature(&mut p, fid, 3),
            (Status::SUCCESS, 0),
            "{fid:#x}"
        );
    }
    // An FID the controller does not report is invalid with SEL 3 too.
    for fid in [0x00u8, 0x09, 0x55, 0xff] {
        assert_eq!(
            get_feature(&mut p, fid, 3).0,
            Status::INVALID_FIELD,
            "{fid:#x}"
        );
    }
    let mut d = discovery_q();
    assert_eq!(
        get_feature(&mut d, FID_KEEP_ALIVE_TIMER, 3),
        (Status::SUCCESS, 4)
    );
    assert_eq!(
        get_feature(&mut d, FID_NUMBER_OF_QUEUES, 3).0,
        Status::INVALID_FIELD
    );
}

#[test]
fn adm_26_get_features_unreported_fid_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    for fid in [0x00u8, 0x03, 0x09, 0x0c, 0x55, 0x81, 0xff] {
        assert_eq!(
            get_feature(&mut p, fid, 0).0,
            Status::INVALID_FIELD,
            "{fid:#x}"
        );
    }
    for fid in [0x01u8, 0x02, 0x04, 0x05, 0x06, 0x07, 0x08, 0x0a, 0x0b, 0x0f] {
        assert_eq!(get_feature(&mut p, fid, 0).0, Status::SUCCESS, "{fid:#x}");
    }
}

#[test]
fn adm_27_discovery_get_features_other_fid_is_invalid_field() {
    let mut p = discovery_q();
    for fid in [0x01u8, 0x04, 0x06, 0x07, 0x55] {
        assert_eq!(
            get_feature(&mut p, fid, 0).0,
            Status::INVALID_FIELD,
            "{fid:#x}"
        );
    }
    assert_eq!(
        get_feature(&mut p, FID_KEEP_ALIVE_TIMER, 0).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feature(&mut p, FID_ASYNC_EVENT_CONFIG, 0).0,
        Status::SUCCESS
    );
}

#[test]
fn adm_28_fifth_aer_is_limit_exceeded() {
    let (_r, mut p, _) = admin_q();
    for cid in 100..104 {
        p.post_aer(cid);
    }
    let (c, _) = p.command(Sqe::new(admin::ASYNC_EVENT_REQUEST, 104, 0), &[]);
    assert_eq!(c.status(), Status::AER_LIMIT_EXCEEDED);
    assert_eq!(
        (c.status().sct, c.status().sc, c.status().dnr),
        (1, 0x05, true)
    );
    admin_still_works(&mut p);
}

#[test]
fn adm_29_abort_succeeds_aborting_nothing() {
    let (_r, mut p, _) = admin_q();
    for cdw10 in [0u32, 1 | 7 << 16, 0xffff_ffff] {
        assert_eq!(
            adm(&mut p, admin::ABORT, 0, cdw10, 0, 0),
            (Status::SUCCESS, 1),
            "{cdw10:#x}"
        );
    }
}

#[test]
fn adm_30_keep_alive_succeeds_in_any_state_and_resets_the_timer() {
    let mut p = Pair::new(reg());
    p.icreq(false, false);
    assert!(p
        .connect(0, CNTLID_DYNAMIC, HOSTNQN, 5000)
        .status()
        .is_success());
    assert_eq!(
        adm(&mut p, admin::KEEP_ALIVE, 0, 0, 0, 0).0,
        Status::SUCCESS
    );
    let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    assert_eq!(p.prop_set(prop::CC, u64::from(en)), Status::SUCCESS);
    // KATO 5 s: keep alives every 4 s keep the association for 20 s.
    for _ in 0..5 {
        p.advance(Duration::from_secs(4));
        assert_eq!(
            adm(&mut p, admin::KEEP_ALIVE, 0, 0, 0, 0).0,
            Status::SUCCESS
        );
    }
    admin_still_works(&mut p);
}

fn fence_cmd(p: &mut Pair, f: Fence) -> Status {
    no_data(p, f.to_sqe())
}

#[test]
fn adm_31_fence_of_no_or_too_many_granules_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    let f = |granules| Fence {
        nsid: 1,
        first_granule: 0,
        granules,
        epoch: 1,
        raise: false,
    };
    assert_eq!(fence_cmd(&mut p, f(0)), Status::INVALID_FIELD);
    assert_eq!(
        fence_cmd(&mut p, f(fence::FENCE_GRANULES_MAX + 1)),
        Status::INVALID_FIELD
    );
    assert_eq!(fence_cmd(&mut p, f(1)), Status::SUCCESS);
}

#[test]
fn adm_32_fence_of_inactive_namespace_is_invalid_namespace() {
    let (_r, mut p, _) = admin_q();
    for nsid in [0, 2, 0xffff_ffff] {
        let f = Fence {
            nsid,
            first_granule: 0,
            granules: 1,
            epoch: 1,
            raise: true,
        };
        assert_eq!(fence_cmd(&mut p, f), Status::INVALID_NAMESPACE, "{nsid}");
    }
}

#[test]
fn adm_33_fence_past_the_namespace_is_invalid_field() {
    let (_r, mut p, _) = admin_q();
    // 4 MiB = 2 granules of 2 MiB.
    for (first_granule, granules) in [(0, 3), (2, 1), (u64::MAX, 2)] {
        let f = Fence {
            nsid: 1,
            first_granule,
            granules,
            epoch: 1,
            raise: true,
        };
        assert_eq!(
            fence_cmd(&mut p, f),
            Status::INVALID_FIELD,
            "{first_granule}"
        );
    }
    let f = Fence {
        nsid: 1,
        first_granule: 1,
        granules: 1,
        epoch: 1,
        raise: true,
    };
    assert_eq!(fence_cmd(&mut p, f), Status::SUCCESS);
}

#[test]
fn adm_34_admin_data_shorter_than_the_sgl_needs_is_sgl_length_invalid() {
    let (_r, mut p, _) = admin_q();
    // Identify: 4096 bytes.
    for len in [512, 4092] {
        let (c, _) = p.admin_cmd(admin::IDENTIFY, 0, 1, 0, len);
        assert_eq!(c.status(), Status::DATA_SGL_LENGTH_INVALID, "{len}");
    }
    let (c, _) = p.admin_cmd(admin::IDENTIFY, 0, 1, 0, 0);
    assert_eq!(c.status(), Status::DATA_SGL_LENGTH_INVALID, "no SGL");
    // Longer: zero-padded to the SGL length.
    let (c, d) = p.admin_cmd(admin::IDENTIFY, 0, 1, 0, 8192);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(d.len(), 8192);
    assert!(d[4096..].iter().all(|b| *b == 0));
    // Get Log Page: NUMD × 4 bytes.
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, 512, 0, 256).status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        log_page(&mut p, lid::SMART, 0, 512, 0, 0).status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    let numd = 512 / 4 - 1;
    let (c, d) = p.admin_cmd(
        admin::GET_LOG_PAGE,
        0,
        u32::from(lid::SMART) | numd << 16,
        0,
        1024,
    );
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(d.len(), 1024);
    assert!(d[512..].iter().all(|b| *b == 0));
}

#[test]
fn adm_35_command_reusing_an_outstanding_aer_cid_drops_the_aer() {
    let (_r, mut p, _) = admin_q();
    let before = tolerated::count(Tolerated::AerCidReused);
    p.post_aer(100);
    // SPDK's host at shutdown: Property Get CC with the AER's CID.
    let s = PropertyCommand {
        size8: false,
        offset: prop::CC,
        value: 0,
    }
    .to_sqe(100, fctype::PROPERTY_GET);
    p.send(&PduHeader::CapsuleCmd(s), &[]);
    let got = p.take();
    let [Got {
        header: PduHeader::CapsuleResp(c),
        ..
    }] = got.as_slice()
    else {
        panic!("one response, the Property Get's: {got:?}")
    };
    assert_eq!((c.cid, c.status()), (100, Status::SUCCESS));
    assert_eq!(c.result & cc::EN, cc::EN, "the CC value, not an AER's DW0");
    assert!(tolerated::count(Tolerated::AerCidReused) > before);
    // The AER is gone: four more fit under the limit.
    for cid in 101..105 {
        p.post_aer(cid);
    }
    let (c, _) = p.command(Sqe::new(admin::ASYNC_EVENT_REQUEST, 105, 0), &[]);
    assert_eq!(c.status(), Status::AER_LIMIT_EXCEEDED);
    // Any other outstanding command's CID is still a conflict: a Set
    // Features waiting for its data (R2T).
    let mut s = Sqe::new(admin::SET_FEATURES, 200, 0);
    s.set_cdw(10, u32::from(FID_ARBITRATION));
    s.set_sgl(c2h(16));
    p.send(&PduHeader::CapsuleCmd(s), &[]);
    assert!(matches!(
        p.take().as_slice(),
        [Got {
            header: PduHeader::R2t(_),
            ..
        }]
    ));
    let (c, _) = p.command(Sqe::new(admin::KEEP_ALIVE, 200, 0), &[]);
    assert_eq!(c.status(), Status::CID_CONFLICT);
    assert_eq!(
        (c.status().sct, c.status().sc, c.status().dnr),
        (0, 0x03, true)
    );
    assert!(p.term.is_none());
}

// ----------------------------------------------------------------- IO

#[test]
fn io_01_io_while_not_ready_is_command_sequence_error() {
    for shutdown in [false, true] {
        let (r, mut a, cntlid) = admin_q();
        let mut q = io_pair(&r, cntlid, false, false);
        io_still_works(&mut q);
        let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        let v = if shutdown { en | 1 << cc::SHN_SHIFT } else { 0 };
        assert_eq!(a.prop_set(prop::CC, u64::from(v)), Status::SUCCESS);
        assert_eq!(q.read(0, 1).0, Status::COMMAND_SEQUENCE_ERROR);
        assert_eq!(
            write_zeroes(&mut q, 1, 0, 1),
            Status::COMMAND_SEQUENCE_ERROR
        );
        assert_eq!(
            no_data(&mut q, Sqe::new(io::FLUSH, 0, 1)),
            Status::COMMAND_SEQUENCE_ERROR
        );
        assert!(q.term.is_none());
    }
}

#[test]
fn io_02_inactive_namespace_is_invalid_namespace() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    for nsid in [0, 2, 0xffff_ffff] {
        assert_eq!(read_sgl(&mut q, nsid, 0, 1, 512), Status::INVALID_NAMESPACE);
        assert_eq!(write_zeroes(&mut q, nsid, 0, 1), Status::INVALID_NAMESPACE);
        let cid = q.cid();
        let mut s = Sqe::rw(io::WRITE, cid, nsid, 0, 1, false);
        s.set_sgl(in_capsule(512));
        assert_eq!(
            q.command(s, &[0; 512]).0.status(),
            Status::INVALID_NAMESPACE
        );
    }
    io_still_works(&mut q);
}

#[test]
fn io_03_lba_range_past_the_namespace_is_lba_out_of_range() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    assert_eq!(q.read(BLOCKS - 1, 2).0, Status::LBA_OUT_OF_RANGE);
    assert_eq!(q.read(u64::MAX, 1).0, Status::LBA_OUT_OF_RANGE);
    assert_eq!(q.write(BLOCKS, &[0; 512], 8192), Status::LBA_OUT_OF_RANGE);
    assert_eq!(
        write_zeroes(&mut q, 1, BLOCKS - 1, 2),
        Status::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        write_zeroes(&mut q, 1, u64::MAX - 1, 8),
        Status::LBA_OUT_OF_RANGE
    );
    assert_eq!(write_zeroes(&mut q, 1, BLOCKS - 1, 1), Status::SUCCESS);
    io_still_works(&mut q);
}

/// `target.write_zeroes_bytes_max` is advertised as WZSL in the NVM
/// command set's Identify Controller (CNS 06h), and a Write Zeroes past it
/// is refused with Invalid Field; one at the limit succeeds.
#[test]
fn io_03b_write_zeroes_past_wzsl_is_invalid_field() {
    let mut c = config_in("immediate", default_ns());
    c.target.write_zeroes_bytes_max = Some(64 << 10);
    let r = registry(&c);
    let (mut a, cntlid) = admin_pair(&r);
    let (c, d) = a.admin_cmd(admin::IDENTIFY, 0, 6, 0, 4096);
    assert_eq!(c.status(), Status::SUCCESS);
    let nvm = sluice_proto::identify::IdentifyControllerNvm::decode(&d).unwrap();
    // 2^4 pages of 4 KiB.
    assert_eq!(nvm.wzsl, 4);
    assert_eq!(nvm.write_zeroes_bytes_max(4096), Some(64 << 10));
    let mut q = io_pair(&r, cntlid, false, false);
    // 512-byte blocks: 128 is the limit.
    assert_eq!(write_zeroes(&mut q, 1, 0, 128), Status::SUCCESS);
    assert_eq!(write_zeroes(&mut q, 1, 0, 129), Status::INVALID_FIELD);
    io_still_works(&mut q);
    // Without the setting: no limit advertised, a 64 KiB + 512 B one passes.
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    assert_eq!(write_zeroes(&mut q, 1, 0, 129), Status::SUCCESS);
}

#[test]
fn io_04_nlb_beyond_mdts_with_a_smaller_sgl_is_sgl_length_invalid() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    let mdts = TargetSettings::default().mdts_bytes;
    let nlb = mdts / 512 * 2;
    for sgl_len in [512, mdts] {
        assert_eq!(
            read_sgl(&mut q, 1, 0, nlb, sgl_len),
            Status::DATA_SGL_LENGTH_INVALID,
            "{sgl_len}"
        );
    }
    io_still_works(&mut q);
}

#[test]
fn io_05_sgl_length_other_than_nlb_times_block_size_is_sgl_length_invalid() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    for sgl_len in [0, 512, 2048] {
        assert_eq!(
            read_sgl(&mut q, 1, 0, 2, sgl_len),
            Status::DATA_SGL_LENGTH_INVALID,
            "{sgl_len}"
        );
    }
    let cid = q.cid();
    let mut s = Sqe::rw(io::WRITE, cid, 1, 0, 2, false);
    s.set_sgl(in_capsule(512));
    assert_eq!(
        q.command(s, &[0; 512]).0.status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    io_still_works(&mut q);
}

#[test]
fn io_06_flush_of_inactive_namespace_is_invalid_namespace() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    for nsid in [0, 2, 0xffff_fffe] {
        assert_eq!(
            no_data(&mut q, Sqe::new(io::FLUSH, 0, nsid)),
            Status::INVALID_NAMESPACE
        );
    }
    for nsid in [1, 0xffff_ffff] {
        assert_eq!(
            no_data(&mut q, Sqe::new(io::FLUSH, 0, nsid)),
            Status::SUCCESS
        );
    }
}

fn range(slba: u64, nlb: u32) -> DsmRange {
    DsmRange {
        context_attributes: 0,
        nlb,
        slba,
    }
}

#[test]
fn io_07_dsm_of_inactive_namespace_is_invalid_namespace() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    for nsid in [0, 2, 0xffff_ffff] {
        assert_eq!(
            dsm(&mut q, nsid, 1, true, &[range(0, 1)]),
            Status::INVALID_NAMESPACE
        );
    }
    io_still_works(&mut q);
}

#[test]
fn io_08_dsm_data_length_other_than_the_ranges_is_sgl_length_invalid() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    assert_eq!(
        dsm(&mut q, 1, 1, true, &[range(0, 1), range(8, 1)]),
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        dsm(&mut q, 1, 2, true, &[range(0, 1)]),
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        dsm(&mut q, 1, 2, true, &[range(0, 1), range(8, 1)]),
        Status::SUCCESS
    );
}

#[test]
fn io_09_dsm_range_past_the_namespace_is_lba_out_of_range() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    let data = pattern(512, 9);
    assert_eq!(q.write(0, &data, 8192), Status::SUCCESS);
    for bad in [range(1 << 40, 1), range(BLOCKS - 1, 2), range(u64::MAX, 2)] {
        for deallocate in [true, false] {
            assert_eq!(
                dsm(&mut q, 1, 2, deallocate, &[range(0, 1), bad]),
                Status::LBA_OUT_OF_RANGE
            );
        }
    }
    let (st, d) = q.read(0, 1);
    assert_eq!((st, d), (Status::SUCCESS, data), "nothing deallocated");
}

/// Every range of a Dataset Management deallocation is deallocated (a RAM
/// namespace then reads it as zeros), and nothing between or after them;
/// without AD nothing changes. The Linux host's discard sends several
/// ranges in one command.
#[test]
fn dsm_deallocates_every_range_and_nothing_else() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    let data = pattern(32 * 512, 5);
    assert_eq!(q.write(0, &data, 8192), Status::SUCCESS);
    let spans = [(2usize, 3u32), (10, 1), (20, 4)];
    let ranges: Vec<DsmRange> = spans.iter().map(|&(s, n)| range(s as u64, n)).collect();
    assert_eq!(dsm(&mut q, 1, 3, false, &ranges), Status::SUCCESS);
    let (st, back) = q.read(0, 32);
    assert_eq!(st, Status::SUCCESS);
    assert!(back == data, "a DSM without AD changed the data");
    assert_eq!(dsm(&mut q, 1, 3, true, &ranges), Status::SUCCESS);
    let mut want = data;
    for (slba, nlb) in spans {
        want[slba * 512..(slba + nlb as usize) * 512].fill(0);
    }
    let (st, back) = q.read(0, 32);
    assert_eq!(st, Status::SUCCESS);
    for (block, (got, exp)) in back.chunks(512).zip(want.chunks(512)).enumerate() {
        assert!(got == exp, "block {block} after deallocating {spans:?}");
    }
}

#[test]
fn io_10_short_range_list_is_caught_at_admission() {
    // The execute-time check (`execute_dsm`) cannot be reached: a range list
    // shorter than NR ranges already fails the SGL length check.
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    assert_eq!(
        dsm(&mut q, 1, 4, true, &[range(0, 1)]),
        Status::DATA_SGL_LENGTH_INVALID
    );
    io_still_works(&mut q);
}

#[test]
fn io_11_other_io_opcode_is_invalid_opcode() {
    let (r, _a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    for op in [0x05u8, 0x06, 0x0c, 0x10, 0x12, 0x18, 0x7c, 0x80, 0xff] {
        assert_eq!(
            no_data(&mut q, Sqe::new(op, 0, 1)),
            Status::INVALID_OPCODE,
            "{op:#x}"
        );
    }
    io_still_works(&mut q);
}

#[test]
fn io_12_write_below_a_fence_is_stale_epoch() {
    let (r, mut a, cntlid) = admin_q();
    let mut q = io_pair(&r, cntlid, false, false);
    let f = Fence {
        nsid: 1,
        first_granule: 0,
        granules: 1,
        epoch: 5,
        raise: true,
    };
    let old = pattern(512, 1);
    assert_eq!(q.write(0, &old, 8192), Status::SUCCESS);
    assert_eq!(fence_cmd(&mut a, f), Status::SUCCESS);
    assert_eq!(q.write(0, &old, 8192), Status::STALE_EPOCH, "no epoch is 0");
    let write = |q: &mut Pair, epoch: u64, data: &[u8]| {
        let cid = q.cid();
        let mut s = Sqe::rw(io::WRITE, cid, 1, 0, 1, false);
        fence::set_io_epoch(&mut s, epoch);
        s.set_sgl(in_capsule(512));
        q.command(s, data).0.status()
    };
    let st = write(&mut q, 4, &pattern(512, 2));
    assert_eq!(st, Status::STALE_EPOCH);
    assert_eq!((st.sct, st.sc, st.dnr), (7, 0x01, true));
    let mut s = Sqe::rw(io::WRITE_ZEROES, 0, 1, 0, 1, false);
    fence::set_io_epoch(&mut s, 4);
    assert_eq!(no_data(&mut q, s), Status::STALE_EPOCH);
    assert_eq!(q.read(0, 1), (Status::SUCCESS, old), "nothing written");
    assert_eq!(write(&mut q, 5, &pattern(512, 3)), Status::SUCCESS);
    assert_eq!(q.read(0, 1), (Status::SUCCESS, pattern(512, 3)));
}

// --------------------------------------------------------------- AUTH

fn secret(seed: u8) -> Secret {
    Secret::new((0..32).map(|i| seed ^ i).collect(), None).unwrap()
}

fn rng(seed: u64) -> impl FnMut(&mut [u8]) {
    let mut s = seed;
    move |b: &mut [u8]| {
        for x in b {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *x = (s >> 33) as u8;
        }
    }
}

/// A target whose subsystem authenticates [`HOSTNQN`] with secret 1 (and
/// the controller with `ctrl` when the host asks), preferring `group`.
fn auth_reg(group: DhGroup, ctrl: Option<Secret>) -> Arc<Registry> {
    let mut a = HostAuthConfig::new(HOSTNQN, secret(1))
        .with_hash(HashId::Sha256)
        .with_dhgroup(group);
    if let Some(c) = ctrl {
        a = a.with_ctrl_secret(c);
    }
    let c = Config::default()
        .with_target(target_settings(send_config("immediate")))
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_dhchap(a)
                .with_namespace(default_ns()),
        )
        .validated()
        .unwrap();
    registry(&c)
}

/// An admin queue connected (ATR set) and enabled, not authenticated.
fn auth_admin(r: &Arc<Registry>) -> Pair {
    let mut p = Pair::new(r.clone());
    p.icreq(false, false);
    let c = p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_ne!(c.result & sluice_proto::fabrics::CONNECT_AUTHREQ_ATR, 0);
    let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    assert_eq!(p.prop_set(prop::CC, u64::from(en)), Status::SUCCESS);
    p
}

/// AUTH_Send of `msg` (in the capsule) with TL = `tl`.
fn auth_send_tl(p: &mut Pair, tl: u32, msg: &[u8]) -> Status {
    let cid = p.cid();
    let mut s = AuthCommand {
        send: true,
        len: tl,
    }
    .to_sqe(cid);
    if !msg.is_empty() {
        s.set_sgl(in_capsule(msg.len() as u32));
    }
    p.command(s, msg).0.status()
}

fn auth_send(p: &mut Pair, msg: &[u8]) {
    assert_eq!(auth_send_tl(p, msg.len() as u32, msg), Status::SUCCESS);
}

/// AUTH_Receive with AL = `al` and an SGL of `sgl_len` bytes.
fn auth_receive_al(p: &mut Pair, al: u32, sgl_len: u32) -> (Status, Vec<u8>) {
    let cid = p.cid();
    let mut s = AuthCommand {
        send: false,
        len: al,
    }
    .to_sqe(cid);
    if sgl_len > 0 {
        s.set_sgl(c2h(sgl_len));
    }
    let (c, d) = p.command(s, &[]);
    (c.status(), d)
}

fn auth_receive(p: &mut Pair) -> Vec<u8> {
    let (st, d) = auth_receive_al(p, 4096, 4096);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(d.len(), 4096, "padded to AL");
    d
}

/// The next AUTH_Receive is a Failure1 with `explanation`, and the queue is
/// (still) closed to other commands.
fn expect_failure1(p: &mut Pair, explanation: u8) {
    let m = Message::decode(&auth_receive(p)).unwrap();
    assert!(
        matches!(m, Message::Failure { first: true, explanation: x, .. } if x == explanation),
        "want Failure1 {explanation:#x}, got {m:?}"
    );
    assert_eq!(p.identify(1, 0).0, Status::AUTH_REQUIRED);
}

fn host_auth(t_id: u16, ctrl: Option<Secret>) -> HostAuth {
    HostAuth::new(
        HostConfig {
            hostnqn: HOSTNQN.into(),
            subnqn: SUBNQN.into(),
            secret: secret(1),
            ctrl_secret: ctrl,
        },
        t_id,
    )
}

/// Negotiate and Challenge done: the host's Reply to send.
fn reply_for(p: &mut Pair, h: &mut HostAuth) -> Vec<u8> {
    auth_send(p, &h.negotiate());
    let ch = auth_receive(p);
    h.handle_challenge(&ch, &mut rng(3), 9).unwrap()
}

#[test]
fn auth_01_command_before_authentication_is_auth_required() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    for (op, len) in [(admin::IDENTIFY, 4096), (admin::KEEP_ALIVE, 0)] {
        let (c, _) = p.admin_cmd(op, 0, 1, 0, len);
        assert_eq!(c.status(), Status::AUTH_REQUIRED);
        assert_eq!(
            (c.status().sct, c.status().sc, c.status().dnr),
            (1, 0x91, true)
        );
    }
    // Property Get is a Fabrics command: allowed.
    assert_eq!(p.prop_get(prop::CSTS, false) & 1, 1);
    // After a transaction that succeeds, commands run.
    let mut h = host_auth(1, None);
    let reply = reply_for(&mut p, &mut h);
    auth_send(&mut p, &reply);
    let s1 = auth_receive(&mut p);
    assert_eq!(h.handle_success1(&s1).unwrap(), None);
    admin_still_works(&mut p);
}

#[test]
fn auth_02_secp_other_than_e9h_is_invalid_field() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let neg = host_auth(1, None).negotiate();
    for secp in [0x00u8, 0xea, 0xff] {
        let cid = p.cid();
        let mut s = AuthCommand {
            send: true,
            len: neg.len() as u32,
        }
        .to_sqe(cid);
        s.0[43] = secp;
        s.set_sgl(in_capsule(neg.len() as u32));
        assert_eq!(p.command(s, &neg).0.status(), Status::INVALID_FIELD);
        let cid = p.cid();
        let mut s = AuthCommand {
            send: false,
            len: 4096,
        }
        .to_sqe(cid);
        s.0[43] = secp;
        s.set_sgl(c2h(4096));
        assert_eq!(p.command(s, &[]).0.status(), Status::INVALID_FIELD);
    }
    assert!(p.term.is_none());
}

#[test]
fn auth_03_spsp_other_than_01h_is_invalid_field() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let neg = host_auth(1, None).negotiate();
    for (at, v) in [(41, 0u8), (41, 2), (42, 0), (42, 0xff)] {
        for send in [true, false] {
            let cid = p.cid();
            let len = if send { neg.len() as u32 } else { 4096 };
            let mut s = AuthCommand { send, len }.to_sqe(cid);
            s.0[at] = v;
            let data: &[u8] = if send {
                s.set_sgl(in_capsule(len));
                &neg
            } else {
                s.set_sgl(c2h(len));
                &[]
            };
            assert_eq!(p.command(s, data).0.status(), Status::INVALID_FIELD);
        }
    }
    assert!(p.term.is_none());
}

#[test]
fn auth_04_zero_transfer_length_is_invalid_field() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    assert_eq!(auth_send_tl(&mut p, 0, &[]), Status::INVALID_FIELD);
    assert_eq!(auth_receive_al(&mut p, 0, 0).0, Status::INVALID_FIELD);
    assert!(p.term.is_none());
}

#[test]
fn auth_05_length_other_than_the_sgl_is_sgl_length_invalid() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let neg = host_auth(1, None).negotiate();
    assert_eq!(
        auth_send_tl(&mut p, neg.len() as u32 - 4, &neg),
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        auth_send_tl(&mut p, 8, &[]),
        Status::DATA_SGL_LENGTH_INVALID,
        "no data at all"
    );
    assert_eq!(
        auth_receive_al(&mut p, 4096, 1024).0,
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert!(p.term.is_none());
}

#[test]
fn auth_06_length_above_8_kib_is_sgl_length_invalid() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    assert_eq!(
        auth_receive_al(&mut p, 8196, 8196).0,
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        auth_receive_al(&mut p, 1 << 20, 1 << 20).0,
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(auth_receive_al(&mut p, 8192, 8192).0, Status::SUCCESS);
}

#[test]
fn auth_07_auth_without_dhchap_settings_is_command_sequence_error() {
    let neg = host_auth(1, None).negotiate();
    // A host with no secret on an ordinary subsystem.
    let (_r, mut p, _) = admin_q();
    assert_eq!(
        auth_send_tl(&mut p, neg.len() as u32, &neg),
        Status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        auth_receive_al(&mut p, 4096, 4096).0,
        Status::COMMAND_SEQUENCE_ERROR
    );
    admin_still_works(&mut p);
    // A discovery connection.
    let mut d = discovery_q();
    assert_eq!(
        auth_send_tl(&mut d, neg.len() as u32, &neg),
        Status::COMMAND_SEQUENCE_ERROR
    );
    admin_still_works(&mut d);
}

#[test]
fn auth_08_short_message_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, None);
    let neg = host_auth(1, None).negotiate();
    // Shorter than a header; a Negotiate cut inside its descriptor.
    for msg in [vec![0u8, 0, 0], neg[..40].to_vec()] {
        let mut p = auth_admin(&r);
        auth_send(&mut p, &msg);
        expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
    }
    // A Reply shorter than its HL says.
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, None);
    let reply = reply_for(&mut p, &mut h);
    auth_send(&mut p, &reply[..20]);
    expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
}

#[test]
fn auth_09_unknown_message_is_incorrect_message() {
    let r = auth_reg(DhGroup::Null, None);
    for msg in [
        vec![0xffu8; 12],
        vec![0x01, 0x07, 0, 0, 1, 0, 0, 0],
        vec![0x02, 0x00, 0, 0, 1, 0, 0, 0],
    ] {
        let mut p = auth_admin(&r);
        auth_send(&mut p, &msg);
        expect_failure1(&mut p, reason::INCORRECT_MESSAGE);
    }
}

#[test]
fn auth_10_negotiate_with_napd_0_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut n = host_auth(1, None).negotiate();
    n[7] = 0;
    auth_send(&mut p, &n[..8]);
    expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
}

#[test]
fn auth_11_negotiate_without_dhchap_descriptor_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut n = host_auth(1, None).negotiate();
    n[8] = 0x02;
    auth_send(&mut p, &n);
    expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
}

#[test]
fn auth_12_negotiate_with_more_than_30_ids_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, None);
    for at in [10, 11] {
        let mut p = auth_admin(&r);
        let mut n = host_auth(1, None).negotiate();
        n[at] = 31;
        auth_send(&mut p, &n);
        expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
    }
}

#[test]
fn auth_13_negotiate_with_secure_channel_concatenation_is_concat_mismatch() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut n = host_auth(1, None).negotiate();
    n[6] = 1;
    auth_send(&mut p, &n);
    expect_failure1(&mut p, reason::CONCAT_MISMATCH);
}

#[test]
fn auth_14_negotiate_with_no_known_hash_is_hash_unusable() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut n = host_auth(1, None).negotiate();
    let halen = usize::from(n[10]);
    n[12..12 + halen].fill(9);
    auth_send(&mut p, &n);
    expect_failure1(&mut p, reason::HASH_UNUSABLE);
    // Unknown IDs are skipped: one known hash among them is enough.
    let mut p = auth_admin(&r);
    let mut n = host_auth(1, None).negotiate();
    n[12] = 9;
    auth_send(&mut p, &n);
    let m = Message::decode(&auth_receive(&mut p)).unwrap();
    assert!(matches!(m, Message::Challenge(_)), "{m:?}");
}

#[test]
fn auth_15_negotiate_with_no_known_dh_group_is_dhgroup_unusable() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut n = host_auth(1, None).negotiate();
    let dhlen = usize::from(n[11]);
    n[12 + 30..12 + 30 + dhlen].fill(0x77);
    auth_send(&mut p, &n);
    expect_failure1(&mut p, reason::DHGROUP_UNUSABLE);
}

#[test]
fn auth_16_out_of_sequence_message_is_incorrect_message() {
    let r = auth_reg(DhGroup::Null, None);
    // A Reply with no Challenge outstanding (before any Negotiate).
    let mut other = auth_admin(&r);
    let mut h = host_auth(1, None);
    let reply = reply_for(&mut other, &mut h);
    let mut p = auth_admin(&r);
    auth_send(&mut p, &reply);
    expect_failure1(&mut p, reason::INCORRECT_MESSAGE);
    // Success2 when no C2 was sent (one-way, already authenticated).
    let mut p = auth_admin(&r);
    let mut h = host_auth(2, None);
    let reply = reply_for(&mut p, &mut h);
    auth_send(&mut p, &reply);
    auth_receive(&mut p);
    admin_still_works(&mut p);
    auth_send(&mut p, &Message::Success2 { t_id: 2 }.encode());
    expect_failure1(&mut p, reason::INCORRECT_MESSAGE);
    // Controller-to-host messages sent by the host.
    let ch = Message::Challenge(Challenge {
        t_id: 3,
        hash: 1,
        dhgroup: 0,
        seqnum: 1,
        challenge: vec![0; 32],
        dh_value: vec![],
    });
    let f1 = Message::Failure {
        first: true,
        t_id: 3,
        explanation: reason::FAILED,
    };
    for m in [ch, f1] {
        let mut p = auth_admin(&r);
        auth_send(&mut p, &m.encode());
        expect_failure1(&mut p, reason::INCORRECT_MESSAGE);
    }
}

#[test]
fn auth_17_reply_with_another_transaction_id_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, None);
    let mut reply = reply_for(&mut p, &mut h);
    reply[4] ^= 1;
    auth_send(&mut p, &reply);
    expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
}

#[test]
fn auth_18_reply_with_wrong_response_length_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, None);
    let mut reply = reply_for(&mut p, &mut h);
    reply[6] = 16;
    auth_send(&mut p, &reply);
    expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
}

#[test]
fn auth_19_reply_with_a_bad_dh_value_is_dhgroup_unusable() {
    let r = auth_reg(DhGroup::Ffdhe2048, None);
    let mut h = host_auth(1, None);
    let mut p = auth_admin(&r);
    let reply = reply_for(&mut p, &mut h);
    let hl = usize::from(reply[6]);
    let at = 16 + 2 * hl;
    let dhvlen = usize::from(u16::from_le_bytes([reply[10], reply[11]]));
    assert_eq!(dhvlen, 256, "ffdhe2048");
    // The value 1, then the right length but one byte short.
    let mut one = reply.clone();
    one[at..at + dhvlen].fill(0);
    one[at + dhvlen - 1] = 1;
    auth_send(&mut p, &one);
    expect_failure1(&mut p, reason::DHGROUP_UNUSABLE);
    let mut p = auth_admin(&r);
    let mut h = host_auth(2, None);
    let mut short = reply_for(&mut p, &mut h);
    short[10..12].copy_from_slice(&255u16.to_le_bytes());
    short.truncate(at + 255);
    auth_send(&mut p, &short);
    expect_failure1(&mut p, reason::DHGROUP_UNUSABLE);
}

#[test]
fn auth_20_reply_with_a_dh_value_on_the_null_group_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, None);
    let mut reply = reply_for(&mut p, &mut h);
    reply[10..12].copy_from_slice(&4u16.to_le_bytes());
    reply.extend_from_slice(&[2, 0, 0, 0]);
    auth_send(&mut p, &reply);
    expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
}

#[test]
fn auth_21_reply_with_a_wrong_response_is_failed() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, None);
    let mut reply = reply_for(&mut p, &mut h);
    reply[16] ^= 0xff;
    auth_send(&mut p, &reply);
    expect_failure1(&mut p, reason::FAILED);
}

#[test]
fn auth_22_bidirectional_request_without_controller_secret_is_failed() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, Some(secret(2)));
    let reply = reply_for(&mut p, &mut h);
    assert_ne!(reply[8], 0, "CVALID");
    auth_send(&mut p, &reply);
    expect_failure1(&mut p, reason::FAILED);
}

#[test]
fn auth_23_success2_with_another_transaction_id_is_incorrect_payload() {
    let r = auth_reg(DhGroup::Null, Some(secret(2)));
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, Some(secret(2)));
    let reply = reply_for(&mut p, &mut h);
    auth_send(&mut p, &reply);
    let s1 = auth_receive(&mut p);
    let s2 = h.handle_success1(&s1).unwrap().expect("Success2");
    assert_eq!(Message::decode(&s2).unwrap(), Message::Success2 { t_id: 1 });
    auth_send(&mut p, &Message::Success2 { t_id: 2 }.encode());
    expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
}

#[test]
fn auth_24_failure2_from_the_host_fails_the_transaction_silently() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let h = host_auth(1, None);
    auth_send(&mut p, &h.negotiate());
    auth_receive(&mut p);
    auth_send(&mut p, &h.failure2(reason::HASH_UNUSABLE));
    assert_eq!(p.identify(1, 0).0, Status::AUTH_REQUIRED);
    // No Failure1 follows: the next AUTH_Receive has nothing to send.
    let m = Message::decode(&auth_receive(&mut p)).unwrap();
    assert_eq!(
        m,
        Message::Failure {
            first: true,
            t_id: 1,
            explanation: reason::FAILED
        }
    );
}

#[test]
fn auth_25_receive_with_nothing_to_send_is_failure1_failed() {
    let r = auth_reg(DhGroup::Null, None);
    // Before any Negotiate.
    let mut p = auth_admin(&r);
    expect_failure1(&mut p, reason::FAILED);
    // While waiting for the Reply.
    let mut p = auth_admin(&r);
    let h = host_auth(1, None);
    auth_send(&mut p, &h.negotiate());
    auth_receive(&mut p);
    expect_failure1(&mut p, reason::FAILED);
    // After the transaction is done.
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, None);
    let reply = reply_for(&mut p, &mut h);
    auth_send(&mut p, &reply);
    auth_receive(&mut p);
    admin_still_works(&mut p);
    let m = Message::decode(&auth_receive(&mut p)).unwrap();
    assert!(
        matches!(
            m,
            Message::Failure {
                first: true,
                explanation: reason::FAILED,
                ..
            }
        ),
        "{m:?}"
    );
}

#[test]
fn auth_26_third_failed_transaction_closes_the_connection() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    for i in 0..3 {
        assert!(!p.conn.is_closed(), "open before failure {i}");
        auth_send(&mut p, &[0, 0, 0]);
        if i < 2 {
            expect_failure1(&mut p, reason::INCORRECT_PAYLOAD);
        }
    }
    assert!(p.conn.is_closed(), "closed after the third failure");
}

#[test]
fn auth_27_queue_that_never_authenticates_is_closed_after_the_grace() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let grace = Duration::from_millis(u64::from(TargetSettings::default().handshake_timeout_ms))
        + Duration::from_secs(60);
    p.advance(grace - Duration::from_secs(1));
    assert!(!p.conn.is_closed());
    p.advance(Duration::from_secs(2));
    assert!(p.conn.is_closed());
    assert!(p.term.is_none(), "closed without a TermReq");
}

#[test]
fn auth_28_negotiate_while_authenticated_starts_reauthentication() {
    let r = auth_reg(DhGroup::Null, None);
    let mut p = auth_admin(&r);
    let mut h = host_auth(1, None);
    let reply = reply_for(&mut p, &mut h);
    auth_send(&mut p, &reply);
    auth_receive(&mut p);
    admin_still_works(&mut p);
    // A new Negotiate: still authenticated while it runs.
    let mut h = host_auth(2, None);
    auth_send(&mut p, &h.negotiate());
    admin_still_works(&mut p);
    let ch = auth_receive(&mut p);
    let reply = h.handle_challenge(&ch, &mut rng(4), 10).unwrap();
    auth_send(&mut p, &reply);
    auth_receive(&mut p);
    admin_still_works(&mut p);
    // One that fails ends access.
    let mut h = host_auth(3, None);
    let mut bad = reply_for(&mut p, &mut h);
    admin_still_works(&mut p);
    bad[16] ^= 1;
    auth_send(&mut p, &bad);
    expect_failure1(&mut p, reason::FAILED);
}

/// A file namespace without `block_size` exports its file's block: a
/// regular file its filesystem's (4096 at most, as Linux nvmet), a block
/// device its logical block. Before, the config's default of 512 made a
/// 4 KiB-sector device refuse to start. The device half runs where this
/// runs as root with `losetup` (as the test suite does), and says so when
/// it cannot.
#[test]
fn a_file_namespace_exports_the_files_own_block_size() {
    let img = std::env::temp_dir().join(format!("sluice-target-bs-{}.img", std::process::id()));
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let fs_block = std::os::unix::fs::MetadataExt::blksize(&std::fs::metadata(&img).unwrap());
    // LBADS of the namespace's format (Identify Namespace byte 130).
    let lbads = |path: &std::path::Path| {
        let r = registry(&config_in("immediate", NamespaceConfig::file(1, path)));
        let (mut p, _) = admin_pair(&r);
        let (st, d) = p.identify(0, 1);
        assert_eq!(st, Status::SUCCESS);
        d[130]
    };
    assert_eq!(
        lbads(&img),
        if fs_block >= 4096 { 12 } else { 9 },
        "st_blksize {fs_block}"
    );
    let attach = std::process::Command::new("losetup")
        .args(["--sector-size", "4096", "--find", "--show"])
        .arg(&img)
        .output();
    match attach {
        Ok(o) if o.status.success() => {
            let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let got = lbads(std::path::Path::new(&dev));
            // 512 set on it is refused, naming the config key.
            let refused = Registry::build(&config_in(
                "immediate",
                NamespaceConfig::file(1, std::path::Path::new(&dev)).with_block_size(512),
            ))
            .map(|_| ())
            .map_err(|e| e.to_string());
            let _ = std::process::Command::new("losetup")
                .args(["-d", &dev])
                .status();
            assert_eq!(got, 12, "a 4 KiB-sector device exports 4 KiB blocks");
            let refused = refused.expect_err("512-byte blocks on a 4 KiB-sector device");
            assert!(
                refused.contains("namespace 1: invalid configuration `block_size`: 512")
                    && refused.contains("4096"),
                "{refused}"
            );
        }
        other => eprintln!("no 4 KiB-sector loop device here ({other:?}); device half skipped"),
    }
    let _ = std::fs::remove_file(&img);
}
