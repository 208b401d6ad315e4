//! Conformance rows CONN-, PROP-, SEQ- and RES- of the target's check
//! inventory: Fabrics Connect and the other Fabrics command types, Property
//! Get/Set, connection state and life, and reserved fields. One test per
//! row, named after it; each asserts the status (SCT/SC, DNR), DW0, FES/FEI
//! and whether the queue closes or carries on.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::*;
use sluice_config::{Config, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_proto::command::{admin, io, sgl, Cqe, SglDescriptor, Sqe};
use sluice_proto::fabrics::{
    cc, connect_invalid_param_result, csts, fctype, prop, ConnectCommand, ConnectData,
    PropertyCommand, CNTLID_DYNAMIC, CONNECT_DATA_LEN,
};
use sluice_proto::pdu::{encode_pdu, DataHeader, IcReq, PduHeader, TxParams};
use sluice_proto::send::SendConfig;
use sluice_proto::Status;
use sluice_target::registry::CONTROLLERS_PER_SUBSYSTEM_MAX;
use sluice_target::tolerated::{self, Tolerated};
use sluice_target::{Target, TargetHandle};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPEN_NQN: &str = "nqn.2026-11.io.sluice:open";

// ------------------------------------------------------------------ helpers

fn reg() -> Arc<sluice_target::registry::Registry> {
    registry(&config_in("immediate", default_ns()))
}

/// A registry with [`SUBNQN`] (allow-list: [`HOSTNQN`]) and [`OPEN_NQN`]
/// (any host), built from `target`.
fn reg_with(target: TargetSettings) -> Arc<sluice_target::registry::Registry> {
    let c = Config::default()
        .with_target(target)
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(default_ns()),
        )
        .with_subsystem(SubsystemConfig::new(OPEN_NQN).allow_any_host())
        .validated()
        .expect("config");
    registry(&c)
}

/// A Pair after ICReq.
fn fresh(reg: &Arc<sluice_target::registry::Registry>) -> Pair {
    let mut p = Pair::new(reg.clone());
    p.icreq(false, false);
    p
}

/// The Connect data with `subnqn` / `hostnqn` written as raw bytes (no
/// checks), HOSTID [`HOSTID`].
fn raw_data(cntlid: u16, subnqn: &[u8], hostnqn: &[u8]) -> Vec<u8> {
    let mut d = ConnectData {
        hostid: HOSTID,
        cntlid,
        subnqn: String::new(),
        hostnqn: String::new(),
    }
    .encode();
    d[256..256 + subnqn.len()].copy_from_slice(subnqn);
    d[512..512 + hostnqn.len()].copy_from_slice(hostnqn);
    d
}

fn data(cntlid: u16, subnqn: &str, hostnqn: &str) -> Vec<u8> {
    raw_data(cntlid, subnqn.as_bytes(), hostnqn.as_bytes())
}

fn connect_cmd(p: &mut Pair, qid: u16, sqsize: u16) -> ConnectCommand {
    ConnectCommand {
        cid: p.cid(),
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        kato_ms: 0,
    }
}

/// Sends a Connect carrying `data` in the capsule.
fn connect_with(p: &mut Pair, cmd: ConnectCommand, data: &[u8]) -> Cqe {
    let mut s = cmd.to_sqe();
    s.set_sgl(SglDescriptor {
        address: 0,
        length: data.len() as u32,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    p.command(s, data).0
}

fn admin_connect(p: &mut Pair, data: &[u8]) -> Cqe {
    let c = connect_cmd(p, 0, 31);
    connect_with(p, c, data)
}

fn assert_status(c: &Cqe, st: Status, dw0: u32) {
    let got = c.status();
    assert_eq!(
        (got.sct, got.sc, got.dnr, c.result),
        (st.sct, st.sc, st.dnr, dw0),
        "status {got} dw0 {:#x}",
        c.result
    );
}

fn cip(in_data: bool, ipo: u16) -> u32 {
    connect_invalid_param_result(in_data, ipo)
}

/// A Fabrics command of type `fct` with no data.
fn fabrics(p: &mut Pair, fct: u8) -> Cqe {
    let cid = p.cid();
    let mut s = Sqe::new(admin::FABRICS, cid, 0);
    s.0[4] = fct;
    p.command(s, &[]).0
}

/// Property Get/Set with a raw ATTRIB byte.
fn property(p: &mut Pair, fct: u8, attrib: u8, offset: u32, value: u64) -> Cqe {
    let cid = p.cid();
    let mut s = PropertyCommand {
        size8: false,
        offset,
        value,
    }
    .to_sqe(cid, fct);
    s.0[40] = attrib;
    p.command(s, &[]).0
}

fn enable_value() -> u64 {
    u64::from(cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT)
}

/// No TermReq was sent.
fn no_term(p: &Pair) {
    assert_eq!(p.term, None, "no C2HTermReq");
}

// ------------------------------------------------------------------ CONN

#[test]
fn conn_01_recfmt_nonzero_is_incompatible_format() {
    let reg = reg();
    let mut p = fresh(&reg);
    let mut c = connect_cmd(&mut p, 0, 31);
    c.recfmt = 1;
    let cqe = connect_with(&mut p, c, &data(CNTLID_DYNAMIC, SUBNQN, HOSTNQN));
    assert_status(&cqe, Status::CONNECT_INCOMPATIBLE_FORMAT, 0);
    assert!(!p.conn.is_closing());
}

#[test]
fn conn_02_connect_data_shorter_than_1024() {
    let reg = reg();
    // In the capsule.
    let mut p = fresh(&reg);
    let d = data(CNTLID_DYNAMIC, SUBNQN, HOSTNQN);
    let cqe = admin_connect(&mut p, &d[..100]);
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 0));
    // Through an R2T of 512 bytes.
    let cmd = connect_cmd(&mut p, 0, 31);
    let cid = cmd.cid;
    let mut s = cmd.to_sqe();
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 512,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    p.send(&PduHeader::CapsuleCmd(s), &[]);
    let got = p.take();
    let ttag = match got.as_slice() {
        [Got {
            header: PduHeader::R2t(r),
            ..
        }] if r.len == 512 => r.ttag,
        other => panic!("expected an R2T, got {other:?}"),
    };
    p.h2c_all(cid, ttag, &d[..512], 512);
    let (cqe, _) = p.collect_response(cid);
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 0));
    // The queue is still waiting for a Connect.
    let c = p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
    assert_eq!(c.status(), Status::SUCCESS);
}

/// Fixed: a Connect whose transport SGL asks for more than the 1024 bytes of
/// Connect data is refused before any R2T or buffer (nvmet: 0h/0Fh).
#[test]
fn conn_02b_connect_sgl_beyond_1024_is_refused_before_r2t() {
    let reg = reg();
    let mut p = fresh(&reg);
    for len in [CONNECT_DATA_LEN as u32 + 1, 1 << 20] {
        let cmd = connect_cmd(&mut p, 0, 31);
        let mut s = cmd.to_sqe();
        s.set_sgl(SglDescriptor {
            address: 0,
            length: len,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        // collect_response panics on an R2T.
        let (cqe, _) = p.command(s, &[]);
        assert_status(&cqe, Status::DATA_SGL_LENGTH_INVALID, 0);
    }
    // Exactly 1024 through an R2T still works.
    let cmd = connect_cmd(&mut p, 0, 31);
    let cid = cmd.cid;
    let mut s = cmd.to_sqe();
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 1024,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    p.send(&PduHeader::CapsuleCmd(s), &[]);
    let ttag = match p.take().as_slice() {
        [Got {
            header: PduHeader::R2t(r),
            ..
        }] => r.ttag,
        other => panic!("expected an R2T, got {other:?}"),
    };
    p.h2c_all(cid, ttag, &data(CNTLID_DYNAMIC, SUBNQN, HOSTNQN), 1024);
    assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
}

#[test]
fn conn_03_subnqn_without_nul() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &raw_data(CNTLID_DYNAMIC, &[b'a'; 256], HOSTNQN.as_bytes()),
    );
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 256));
}

#[test]
fn conn_04_subnqn_empty() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(&mut p, &data(CNTLID_DYNAMIC, "", HOSTNQN));
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 256));
}

#[test]
fn conn_05_subnqn_longer_than_223() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &raw_data(CNTLID_DYNAMIC, &[b'a'; 224], HOSTNQN.as_bytes()),
    );
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 256));
}

#[test]
fn conn_06_subnqn_not_utf8() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &raw_data(CNTLID_DYNAMIC, b"nqn.\xff\xfe", HOSTNQN.as_bytes()),
    );
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 256));
}

#[test]
fn conn_07_subnqn_control_character() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &raw_data(CNTLID_DYNAMIC, b"nqn.a\x07b", HOSTNQN.as_bytes()),
    );
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 256));
}

#[test]
fn conn_08_hostnqn_without_nul() {
    let reg = reg_with(target_settings(SendConfig::default()));
    for sub in [SUBNQN, OPEN_NQN] {
        let mut p = fresh(&reg);
        let cqe = admin_connect(
            &mut p,
            &raw_data(CNTLID_DYNAMIC, sub.as_bytes(), &[b'h'; 256]),
        );
        assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 512));
    }
}

/// Deviation: nvmet and SPDK admit a non-UTF-8 or control-character host
/// NQN on an open subsystem; Sluice refuses it naming HOSTNQN.
#[test]
fn conn_09_hostnqn_too_long_not_utf8_or_control() {
    let reg = reg_with(target_settings(SendConfig::default()));
    let long = [b'h'; 224];
    let bad: [&[u8]; 3] = [&long, b"nqn.\xff", b"nqn.a\x01b"];
    for sub in [SUBNQN, OPEN_NQN] {
        for h in bad {
            let mut p = fresh(&reg);
            let cqe = admin_connect(&mut p, &raw_data(CNTLID_DYNAMIC, sub.as_bytes(), h));
            assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 512));
        }
    }
    // 223 bytes is fine where any host is admitted.
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &raw_data(CNTLID_DYNAMIC, OPEN_NQN.as_bytes(), &[b'h'; 223]),
    );
    assert_eq!(cqe.status(), Status::SUCCESS);
}

#[test]
fn conn_10_unknown_subnqn() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &data(CNTLID_DYNAMIC, "nqn.2026-11.io.sluice:nope", HOSTNQN),
    );
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 256));
}

#[test]
fn conn_11_host_not_on_allow_list() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &data(CNTLID_DYNAMIC, SUBNQN, "nqn.2014-08.org.x:other"),
    );
    assert_status(&cqe, Status::CONNECT_INVALID_HOST, cip(true, 512));
    // The discovery subsystem admits everyone, the empty NQN included.
    for h in ["nqn.2014-08.org.x:other", ""] {
        let mut p = fresh(&reg);
        let cqe = admin_connect(
            &mut p,
            &data(CNTLID_DYNAMIC, sluice_proto::DISCOVERY_NQN, h),
        );
        assert_eq!(cqe.status(), Status::SUCCESS);
    }
}

#[test]
fn conn_12_require_auth_without_secret() {
    let c = Config::default()
        .with_target(target_settings(SendConfig::default()))
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .allow_any_host()
                .require_auth()
                // The only secret is another host's.
                .with_dhchap(sluice_config::auth::HostAuthConfig::new(
                    "nqn.2014-08.org.x:someone-else",
                    sluice_auth::Secret::new((0..32).collect(), None).unwrap(),
                ))
                .with_namespace(default_ns()),
        )
        .validated()
        .expect("config");
    let reg = registry(&c);
    let mut p = fresh(&reg);
    let cqe = admin_connect(&mut p, &data(CNTLID_DYNAMIC, SUBNQN, HOSTNQN));
    assert_status(&cqe, Status::CONNECT_INVALID_HOST, cip(true, 512));
    // Not applied to discovery.
    let mut p = fresh(&reg);
    let cqe = admin_connect(
        &mut p,
        &data(CNTLID_DYNAMIC, sluice_proto::DISCOVERY_NQN, HOSTNQN),
    );
    assert_eq!(cqe.status(), Status::SUCCESS);
}

#[test]
fn conn_13_sqsize_zero() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    for (qid, cntl) in [(0, CNTLID_DYNAMIC), (1, cntlid)] {
        let mut p = fresh(&reg);
        let c = connect_cmd(&mut p, qid, 0);
        let cqe = connect_with(&mut p, c, &data(cntl, SUBNQN, HOSTNQN));
        assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(false, 44));
    }
}

#[test]
fn conn_14_sqsize_above_mqes() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    for (qid, cntl) in [(0, CNTLID_DYNAMIC), (1, cntlid)] {
        let mut p = fresh(&reg);
        let c = connect_cmd(&mut p, qid, 128);
        let cqe = connect_with(&mut p, c, &data(cntl, SUBNQN, HOSTNQN));
        assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(false, 44));
        // MQES itself (127) is accepted.
        let c = connect_cmd(&mut p, qid, 127);
        let cqe = connect_with(&mut p, c, &data(cntl, SUBNQN, HOSTNQN));
        assert_eq!(cqe.status(), Status::SUCCESS);
    }
}

#[test]
fn conn_15_admin_sqsize_below_31() {
    let reg = reg();
    let mut p = fresh(&reg);
    let c = connect_cmd(&mut p, 0, 30);
    let cqe = connect_with(&mut p, c, &data(CNTLID_DYNAMIC, SUBNQN, HOSTNQN));
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(false, 44));
    let c = connect_cmd(&mut p, 0, 31);
    let cqe = connect_with(&mut p, c, &data(CNTLID_DYNAMIC, SUBNQN, HOSTNQN));
    assert_eq!(cqe.status(), Status::SUCCESS);
}

#[test]
fn conn_16_admin_cntlid_not_dynamic() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(&mut p, &data(1, SUBNQN, HOSTNQN));
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 16));
}

#[test]
fn conn_17_no_controller_id_free() {
    let reg = reg();
    let mut live = Vec::new();
    for _ in 0..CONTROLLERS_PER_SUBSYSTEM_MAX {
        let mut p = fresh(&reg);
        assert_eq!(
            p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0).status(),
            Status::SUCCESS
        );
        live.push(p);
    }
    let mut p = fresh(&reg);
    let cqe = p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
    assert_status(&cqe, Status::CONNECT_CONTROLLER_BUSY, 0);
    assert!(!cqe.status().dnr, "busy may be retried");
    // One association ends: its ID is free again.
    let mut gone = live.pop().unwrap();
    gone.conn.finish();
    assert_eq!(
        p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0).status(),
        Status::SUCCESS
    );
}

#[test]
fn conn_18_io_connect_to_discovery() {
    let reg = reg();
    let mut a = fresh(&reg);
    let c = a.connect_to(sluice_proto::DISCOVERY_NQN, 0, CNTLID_DYNAMIC, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let mut p = fresh(&reg);
    let cqe = p.connect_to(sluice_proto::DISCOVERY_NQN, 1, c.result as u16, 0);
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(false, 42));
}

#[test]
fn conn_19_io_connect_unknown_cntlid() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    for bad in [cntlid + 1, CNTLID_DYNAMIC] {
        let mut p = fresh(&reg);
        let cqe = p.connect(1, bad, HOSTNQN, 0);
        assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 16));
    }
}

#[test]
fn conn_20_io_connect_other_hostnqn() {
    let other = "nqn.2014-08.org.x:other";
    let c = Config::default()
        .with_target(target_settings(SendConfig::default()))
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_host(other)
                .with_namespace(default_ns()),
        )
        .validated()
        .expect("config");
    let reg = registry(&c);
    let (_a, cntlid) = admin_pair(&reg);
    let mut p = fresh(&reg);
    let cqe = p.connect(1, cntlid, other, 0);
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 512));
    assert_eq!(p.connect(1, cntlid, HOSTNQN, 0).status(), Status::SUCCESS);
}

/// Fixed (tolerated): nvmet and SPDK never compare HOSTIDs; the queue joins.
#[test]
fn conn_21_io_connect_other_hostid_is_tolerated() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    let before = tolerated::count(Tolerated::IoConnectHostIdDiffers);
    let mut p = fresh(&reg);
    let mut d = data(cntlid, SUBNQN, HOSTNQN);
    d[..16].copy_from_slice(&[9; 16]);
    let c = connect_cmd(&mut p, 1, 63);
    let cqe = connect_with(&mut p, c, &d);
    assert_status(&cqe, Status::SUCCESS, u32::from(cntlid));
    assert!(tolerated::count(Tolerated::IoConnectHostIdDiffers) > before);
    assert_eq!(p.read(0, 8).0, Status::SUCCESS);
}

#[test]
fn conn_22_io_connect_before_ready() {
    let reg = reg();
    let mut a = fresh(&reg);
    let c = a.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
    let cntlid = c.result as u16;
    let mut p = fresh(&reg);
    assert_status(
        &p.connect(1, cntlid, HOSTNQN, 0),
        Status::COMMAND_SEQUENCE_ERROR,
        0,
    );
    // Enabled, then disabled again.
    assert_eq!(a.prop_set(prop::CC, enable_value()), Status::SUCCESS);
    assert_eq!(a.prop_set(prop::CC, 0), Status::SUCCESS);
    assert_status(
        &p.connect(1, cntlid, HOSTNQN, 0),
        Status::COMMAND_SEQUENCE_ERROR,
        0,
    );
}

#[test]
fn conn_23_io_qid_above_limit() {
    let reg = reg();
    let (mut a, cntlid) = admin_pair(&reg);
    // io_queues_max (8).
    for qid in [9, 0xffff] {
        let mut p = fresh(&reg);
        let cqe = p.connect(qid, cntlid, HOSTNQN, 0);
        assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(false, 42));
    }
    let mut p = fresh(&reg);
    assert_eq!(p.connect(8, cntlid, HOSTNQN, 0).status(), Status::SUCCESS);
    // Number of Queues grants 2 on a new controller.
    let (mut b, cntlid_b) = admin_pair(&reg);
    let (c, _) = b.admin_cmd(admin::SET_FEATURES, 0, 0x07, 0x0001_0001, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let mut p = fresh(&reg);
    let cqe = p.connect(3, cntlid_b, HOSTNQN, 0);
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(false, 42));
    assert_eq!(p.connect(2, cntlid_b, HOSTNQN, 0).status(), Status::SUCCESS);
    let _ = a.prop_get(prop::CSTS, false);
}

#[test]
fn conn_24_io_qid_already_connected() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    let _q = io_pair(&reg, cntlid, false, false);
    let mut p = fresh(&reg);
    let cqe = p.connect(1, cntlid, HOSTNQN, 0);
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(false, 42));
    assert_eq!(p.connect(2, cntlid, HOSTNQN, 0).status(), Status::SUCCESS);
}

#[test]
fn conn_25_connect_accepted_returns_cntlid() {
    let reg = reg();
    let mut a = fresh(&reg);
    let c = a.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let cntlid = c.result as u16;
    assert!((1..=0xffef).contains(&cntlid));
    assert_eq!(c.result >> 16, 0, "no ATR without a secret");
    assert_eq!(a.prop_set(prop::CC, enable_value()), Status::SUCCESS);
    let mut p = fresh(&reg);
    let c = p.connect(1, cntlid, HOSTNQN, 0);
    assert_status(&c, Status::SUCCESS, u32::from(cntlid));
}

#[test]
fn conn_26_cattr_bit2_disables_sq_flow() {
    let reg = reg();
    let mut p = fresh(&reg);
    assert_eq!(
        p.connect_to(SUBNQN, 0, CNTLID_DYNAMIC, 0x04).status(),
        Status::SUCCESS
    );
    let cid = p.cid();
    let (c, _) = p.command(
        PropertyCommand {
            size8: false,
            offset: prop::CSTS,
            value: 0,
        }
        .to_sqe(cid, fctype::PROPERTY_GET),
        &[],
    );
    assert_eq!(c.sqhd, 0xffff);
    // Every other bit is ignored: SQ flow control stays on.
    let mut p = fresh(&reg);
    assert_eq!(
        p.connect_to(SUBNQN, 0, CNTLID_DYNAMIC, 0xfb).status(),
        Status::SUCCESS
    );
    let cid = p.cid();
    let (c, _) = p.command(
        PropertyCommand {
            size8: false,
            offset: prop::CSTS,
            value: 0,
        }
        .to_sqe(cid, fctype::PROPERTY_GET),
        &[],
    );
    assert_ne!(c.sqhd, 0xffff);
}

#[test]
fn conn_27_kato_zero_disables_keep_alive() {
    let reg = reg();
    let mut a = fresh(&reg);
    let c = a.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
    let cntlid = c.result as u16;
    assert_eq!(a.prop_set(prop::CC, enable_value()), Status::SUCCESS);
    // KATO on an I/O Connect is ignored.
    let mut q = fresh(&reg);
    assert_eq!(q.connect(1, cntlid, HOSTNQN, 1).status(), Status::SUCCESS);
    for _ in 0..12 {
        a.advance(Duration::from_secs(300));
        q.advance(Duration::from_secs(300));
    }
    assert!(!a.conn.is_closing() && !q.conn.is_closing());
    assert_eq!(q.read(0, 8).0, Status::SUCCESS);
}

/// Fixed: Invalid Opcode (nvmet and SPDK), not Invalid Field.
#[test]
fn conn_28_unknown_fctype_is_invalid_opcode() {
    let reg = reg();
    let (mut a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    for fct in [0x02, 0x03, 0x07, 0x09, 0x7f, 0xff] {
        assert_status(&fabrics(&mut a, fct), Status::INVALID_OPCODE, 0);
        assert_status(&fabrics(&mut q, fct), Status::INVALID_OPCODE, 0);
    }
    assert!(!a.conn.is_closing() && !q.conn.is_closing());
    assert_eq!(a.prop_get(prop::CSTS, false) & 1, 1);
    assert_eq!(q.read(0, 8).0, Status::SUCCESS);
}

/// Disconnect deletes an I/O queue (SUCCESS, close, QID free again); on
/// the admin queue it is refused (fixed: Invalid Opcode as nvmet and SPDK,
/// which implement no Disconnect) and the association carries on.
#[test]
fn conn_29_disconnect_io_queue_closes_admin_is_refused() {
    let reg = reg();
    let (mut a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    assert_status(&fabrics(&mut q, fctype::DISCONNECT), Status::SUCCESS, 0);
    assert!(q.conn.is_closing());
    q.conn.finish();
    let mut q2 = fresh(&reg);
    assert_eq!(q2.connect(1, cntlid, HOSTNQN, 0).status(), Status::SUCCESS);

    assert_status(
        &fabrics(&mut a, fctype::DISCONNECT),
        Status::INVALID_OPCODE,
        0,
    );
    assert!(!a.conn.is_closing());
    assert_eq!(a.prop_get(prop::CSTS, false) & 1, 1);
    assert_eq!(q2.read(0, 8).0, Status::SUCCESS);
}

// ------------------------------------------------------------------ PROP

/// Fixed: Invalid Opcode (nvmet and SPDK), not Invalid Field.
#[test]
fn prop_01_property_on_io_queue_is_invalid_opcode() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    let c = property(&mut q, fctype::PROPERTY_GET, 0, prop::CSTS, 0);
    assert_status(&c, Status::INVALID_OPCODE, 0);
    let c = property(&mut q, fctype::PROPERTY_SET, 0, prop::CC, enable_value());
    assert_status(&c, Status::INVALID_OPCODE, 0);
    assert_eq!(q.read(0, 8).0, Status::SUCCESS);
}

#[test]
fn prop_02_attrib_size_reserved() {
    let reg = reg();
    let (mut a, _) = admin_pair(&reg);
    for attrib in 2..=7u8 {
        let c = property(&mut a, fctype::PROPERTY_GET, attrib, prop::CSTS, 0);
        assert_status(&c, Status::INVALID_FIELD, 0);
        let c = property(
            &mut a,
            fctype::PROPERTY_SET,
            attrib,
            prop::CC,
            enable_value(),
        );
        assert_status(&c, Status::INVALID_FIELD, 0);
    }
    // Bits 7:3 are ignored.
    let c = property(&mut a, fctype::PROPERTY_GET, 0xf8, prop::CSTS, 0);
    assert_eq!((c.status(), c.result & 1), (Status::SUCCESS, 1));
    let c = property(&mut a, fctype::PROPERTY_GET, 0xf9, prop::CAP, 0);
    assert_eq!(c.status(), Status::SUCCESS);
}

#[test]
fn prop_03_get_unknown_offset_or_size() {
    let reg = reg();
    let (mut a, _) = admin_pair(&reg);
    let bad: [(u8, u32); 7] = [
        (0, prop::CAP),
        (1, prop::CC),
        (1, prop::VS),
        (0, 0x04),
        (0, 0x0c),
        (0, 0x24),
        (0, 0x68),
    ];
    for (attrib, ofst) in bad {
        let c = property(&mut a, fctype::PROPERTY_GET, attrib, ofst, 0);
        assert_status(&c, Status::INVALID_FIELD, 0);
    }
    let c = property(&mut a, fctype::PROPERTY_GET, 0, prop::NSSR, 0);
    assert_eq!((c.status(), c.result), (Status::SUCCESS, 0));
}

#[test]
fn prop_04_set_other_than_cc() {
    let reg = reg();
    let (mut a, _) = admin_pair(&reg);
    for ofst in [prop::CAP, prop::VS, prop::CSTS, prop::NSSR, 0x24] {
        let c = property(&mut a, fctype::PROPERTY_SET, 0, ofst, 0);
        assert_status(&c, Status::INVALID_FIELD, 0);
    }
    let c = property(&mut a, fctype::PROPERTY_SET, 1, prop::CC, enable_value());
    assert_status(&c, Status::INVALID_FIELD, 0);
    assert_eq!(a.prop_get(prop::CSTS, false) & 1, 1);
}

#[test]
fn prop_05_enable_with_bad_cc_fields_sets_cfs() {
    let reg = reg();
    let good = enable_value() as u32;
    let iosqes = cc::EN | 7 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    for v in [
        iosqes,
        good | 1 << cc::CSS_SHIFT,
        good | 1 << cc::AMS_SHIFT,
        good | 1 << cc::MPS_SHIFT,
    ] {
        let mut p = fresh(&reg);
        assert_eq!(
            p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0).status(),
            Status::SUCCESS
        );
        assert_eq!(p.prop_set(prop::CC, u64::from(v)), Status::SUCCESS);
        let st = p.prop_get(prop::CSTS, false) as u32;
        assert_eq!(st & (csts::CFS | csts::RDY), csts::CFS, "CC {v:#x}");
        let (s, _) = p.identify(1, 0);
        assert_eq!(s, Status::COMMAND_SEQUENCE_ERROR);
    }
}

#[test]
fn prop_06_disable_clears_rdy() {
    let reg = reg();
    let (mut a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    assert_eq!(a.prop_set(prop::CC, 0), Status::SUCCESS);
    assert_eq!(a.prop_get(prop::CSTS, false) & 1, 0);
    // Nothing else is reset: the I/O queue stays (its commands wait for RDY).
    q.advance(Duration::from_millis(300));
    assert!(!q.conn.is_closing());
    assert_eq!(q.read(0, 8).0, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(a.prop_set(prop::CC, enable_value()), Status::SUCCESS);
    assert_eq!(q.read(0, 8).0, Status::SUCCESS);
}

#[test]
fn prop_07_shutdown_notification() {
    let reg = reg();
    let (mut a, _) = admin_pair(&reg);
    let shn = enable_value() | u64::from(1u32 << cc::SHN_SHIFT);
    assert_eq!(a.prop_set(prop::CC, shn), Status::SUCCESS);
    let st = a.prop_get(prop::CSTS, false) as u32;
    assert_eq!(st & (3 << csts::SHST_SHIFT), csts::SHST_COMPLETE);
    assert_eq!(a.identify(1, 0).0, Status::COMMAND_SEQUENCE_ERROR);
    let (c, _) = a.admin_cmd(admin::KEEP_ALIVE, 0, 0, 0, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    // SHN back to 0 clears SHST.
    assert_eq!(a.prop_set(prop::CC, enable_value()), Status::SUCCESS);
    let st = a.prop_get(prop::CSTS, false) as u32;
    assert_eq!(st & (3 << csts::SHST_SHIFT), 0);
}

#[test]
fn prop_08_cc_write_while_enabled_is_stored() {
    let reg = reg();
    let (mut a, _) = admin_pair(&reg);
    let v = cc::EN | 7 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT | 1 << cc::CSS_SHIFT;
    assert_eq!(a.prop_set(prop::CC, u64::from(v)), Status::SUCCESS);
    assert_eq!(a.prop_get(prop::CC, false) as u32, v);
    assert_eq!(
        a.prop_get(prop::CSTS, false) as u32 & (csts::RDY | csts::CFS),
        csts::RDY
    );
}

#[test]
fn prop_09_set_upper_value_bits_ignored() {
    let reg = reg();
    let mut p = fresh(&reg);
    assert_eq!(
        p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0).status(),
        Status::SUCCESS
    );
    let v = enable_value() | 0xdead_beef << 32;
    assert_eq!(p.prop_set(prop::CC, v), Status::SUCCESS);
    assert_eq!(p.prop_get(prop::CC, false), enable_value());
    assert_eq!(p.prop_get(prop::CSTS, false) & 1, 1);
}

#[test]
fn prop_10_property_before_enable_refreshes_keep_alive() {
    let reg = reg();
    let mut p = fresh(&reg);
    assert_eq!(
        p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 5000).status(),
        Status::SUCCESS
    );
    for _ in 0..4 {
        p.advance(Duration::from_secs(4));
        let c = property(&mut p, fctype::PROPERTY_GET, 0, prop::CSTS, 0);
        assert_eq!((c.status(), c.result & 1), (Status::SUCCESS, 0));
    }
    assert!(!p.conn.is_closing(), "16 s with KATO 5 s, kept alive");
    p.advance(Duration::from_secs(6));
    assert!(p.conn.is_closing());
}

// ------------------------------------------------------------------ SEQ

#[test]
fn seq_01_commands_before_connect_are_sequence_errors() {
    let reg = reg();
    let mut p = fresh(&reg);
    let mut cmds = Vec::new();
    cmds.push(Sqe::new(admin::IDENTIFY, 0, 0));
    cmds.push(Sqe::rw(io::READ, 0, 1, 0, 8, false));
    for f in [
        fctype::PROPERTY_GET,
        fctype::PROPERTY_SET,
        fctype::AUTH_SEND,
        fctype::AUTH_RECEIVE,
        fctype::DISCONNECT,
        0x09,
    ] {
        let mut s = Sqe::new(admin::FABRICS, 0, 0);
        s.0[4] = f;
        cmds.push(s);
    }
    // A write asking for data: no R2T.
    let mut w = Sqe::rw(io::WRITE, 0, 1, 0, 8, false);
    w.set_sgl(SglDescriptor {
        address: 0,
        length: 4096,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    cmds.push(w);
    for mut s in cmds {
        // The same CID each time: no CID checks before Connect.
        s.set_cid(5);
        let (c, _) = p.command(s, &[]);
        assert_status(&c, Status::COMMAND_SEQUENCE_ERROR, 0);
        assert_eq!(c.sqid, 0);
    }
    // In-capsule data is discarded.
    let mut w = Sqe::rw(io::WRITE, 6, 1, 0, 1, false);
    w.set_sgl(SglDescriptor {
        address: 0,
        length: 512,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    let (c, _) = p.command(w, &[1; 512]);
    assert_status(&c, Status::COMMAND_SEQUENCE_ERROR, 0);
    assert_eq!(
        p.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0).status(),
        Status::SUCCESS
    );
}

/// Fixed: Invalid Opcode (nvmet and SPDK), not Command Sequence Error.
#[test]
fn seq_02_second_connect_is_invalid_opcode() {
    let reg = reg();
    let (mut a, cntlid) = admin_pair(&reg);
    let cqe = a.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
    assert_status(&cqe, Status::INVALID_OPCODE, 0);
    let mut q = io_pair(&reg, cntlid, false, false);
    let cqe = q.connect(1, cntlid, HOSTNQN, 0);
    assert_status(&cqe, Status::INVALID_OPCODE, 0);
    assert!(!a.conn.is_closing() && !q.conn.is_closing());
    assert_eq!(a.prop_get(prop::CSTS, false) & 1, 1);
    assert_eq!(q.read(0, 8).0, Status::SUCCESS);
}

#[test]
fn seq_03_connect_after_refusal_is_processed() {
    let reg = reg();
    let mut p = fresh(&reg);
    let cqe = admin_connect(&mut p, &data(CNTLID_DYNAMIC, "nqn.x:none", HOSTNQN));
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_PARAMETERS);
    let cqe = admin_connect(&mut p, &data(CNTLID_DYNAMIC, SUBNQN, "nqn.x:stranger"));
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_HOST);
    let cqe = admin_connect(&mut p, &data(CNTLID_DYNAMIC, SUBNQN, HOSTNQN));
    assert_eq!(cqe.status(), Status::SUCCESS);
    assert_eq!(p.conn.qid(), 0);
}

#[test]
fn seq_04_handshake_timeout_closes_silently() {
    let reg = reg();
    let before = reg.admission.handshake_timeouts();
    // No ICReq at all, and an ICReq with no Connect.
    let mut idle = Pair::new(reg.clone());
    let mut half = fresh(&reg);
    idle.advance(Duration::from_millis(9_990));
    half.advance(Duration::from_millis(9_990));
    assert!(!idle.conn.is_closing() && !half.conn.is_closing());
    idle.advance(Duration::from_millis(20));
    half.advance(Duration::from_millis(20));
    assert!(idle.conn.is_closed() && half.conn.is_closed());
    no_term(&idle);
    no_term(&half);
    assert!(idle.take().is_empty() && half.take().is_empty());
    assert_eq!(reg.admission.handshake_timeouts(), before + 2);
}

#[test]
fn seq_05_keep_alive_expiry_fails_controller() {
    let reg = reg();
    let (mut a, cntlid) = admin_pair(&reg); // KATO 5000 ms
    let mut q = io_pair(&reg, cntlid, false, false);
    a.advance(Duration::from_millis(5_400));
    assert!(!a.conn.is_closing());
    a.advance(Duration::from_millis(200));
    assert!(a.conn.is_closing());
    no_term(&a);
    assert!(a.take().is_empty(), "no AEN, no CQE");
    assert!(a.conn.controller().unwrap().is_failed());
    q.advance(Duration::from_millis(200));
    assert!(q.conn.is_closing());
    no_term(&q);
}

#[test]
fn seq_06_association_end_closes_io_queues() {
    let reg = reg();
    let (mut a, cntlid) = admin_pair(&reg);
    let mut q1 = io_pair(&reg, cntlid, false, false);
    let mut q2 = fresh(&reg);
    assert_eq!(q2.connect(2, cntlid, HOSTNQN, 0).status(), Status::SUCCESS);
    // The admin socket goes away.
    a.conn.handle_peer_closed("test");
    a.conn.finish();
    q1.advance(Duration::from_millis(200));
    q2.advance(Duration::from_millis(200));
    assert!(q1.conn.is_closing() && q2.conn.is_closing());
    // The controller is gone: its ID names nothing.
    let mut p = fresh(&reg);
    let cqe = p.connect(3, cntlid, HOSTNQN, 0);
    assert_status(&cqe, Status::CONNECT_INVALID_PARAMETERS, cip(true, 16));
}

/// A loopback target with one worker and the given connection limits.
fn start_limits(
    connections: u32,
    per_source: u32,
    handshaking: u32,
    handshaking_per_source: u32,
) -> TargetHandle {
    let c = Config::default()
        .with_target(
            TargetSettings::default()
                .with_workers(1)
                .with_polling(PollingPolicy::Interrupt)
                .with_listen(SocketAddr::from(([127, 0, 0, 1], 0)))
                .with_discovery_listen(None)
                .with_shutdown_drain_ms(500)
                .with_handshake_timeout_ms(600_000)
                .with_connections_max(connections)
                .with_connections_per_source_max(per_source)
                .with_connections_handshaking_max(handshaking)
                .with_connections_handshaking_per_source_max(handshaking_per_source),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(default_ns()),
        )
        .validated()
        .unwrap();
    Target::start(&c).unwrap()
}

fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

/// Whether the target closes `s` (end of file or reset) within `within`,
/// having sent nothing.
fn closed_silently(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(n) => panic!("the target sent {n} bytes"),
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

fn wait_open(t: &TargetHandle, open: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while t.connections().open != open && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(t.connections().open, open, "{:?}", t.connections());
}

#[test]
fn seq_08_handshaking_per_source_limit() {
    let t = start_limits(64, 64, 64, 2);
    let addr = t.local_addr();
    let _held: Vec<TcpStream> = (0..2).map(|_| connect_from([127, 0, 0, 5], addr)).collect();
    wait_open(&t, 2);
    let mut extra = connect_from([127, 0, 0, 5], addr);
    assert!(closed_silently(&mut extra, Duration::from_secs(5)));
    // Another source still gets in.
    let mut other = connect_from([127, 0, 0, 6], addr);
    assert!(!closed_silently(&mut other, Duration::from_millis(200)));
    wait_open(&t, 3);
    t.shutdown();
}

#[test]
fn seq_10_connections_max_limit() {
    let t = start_limits(3, 64, 64, 64);
    let addr = t.local_addr();
    let _held: Vec<TcpStream> = (0..3)
        .map(|i| connect_from([127, 0, 0, 10 + i], addr))
        .collect();
    wait_open(&t, 3);
    let mut extra = connect_from([127, 0, 0, 20], addr);
    assert!(closed_silently(&mut extra, Duration::from_secs(5)));
    assert_eq!(t.connections().open, 3);
    t.shutdown();
}

#[test]
fn seq_12_drain_completes_in_flight_then_closes() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    assert_eq!(q.write(0, &pattern(4096, 1), 8192), Status::SUCCESS);
    let mut r = Sqe::rw(io::READ, 100, 1, 0, 8, false);
    r.set_sgl(SglDescriptor {
        address: 0,
        length: 4096,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    // Taken, not yet run by the backend.
    let mut wire = Vec::new();
    encode_pdu(
        &PduHeader::CapsuleCmd(r),
        &[],
        &TxParams::default(),
        &mut wire,
    );
    q.conn.feed(&wire, q.now);
    q.conn.begin_drain();
    assert!(!q.conn.wants_read());
    let mut r2 = r;
    r2.set_cid(101);
    let mut wire2 = Vec::new();
    encode_pdu(
        &PduHeader::CapsuleCmd(r2),
        &[],
        &TxParams::default(),
        &mut wire2,
    );
    q.conn.feed(&wire2, q.now);
    q.pump();
    let (c, d) = q.collect_response(100);
    assert_eq!((c.status(), d), (Status::SUCCESS, pattern(4096, 1)));
    assert!(q.conn.is_closed(), "closed once drained");
    assert!(
        q.take().is_empty(),
        "the command after the drain is not taken"
    );
}

#[test]
fn seq_13_tx_backlog_stops_reading() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    // 12 reads of 1 MiB; the host reads nothing.
    let mut wire = Vec::new();
    for i in 0..12u16 {
        let mut r = Sqe::rw(io::READ, 200 + i, 1, 0, 2048, false);
        r.set_sgl(SglDescriptor {
            address: 0,
            length: 1 << 20,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        encode_pdu(
            &PduHeader::CapsuleCmd(r),
            &[],
            &TxParams::default(),
            &mut wire,
        );
    }
    q.conn.feed(&wire, q.now);
    drive_backend(&mut q);
    assert!(!q.conn.wants_read(), "no reading with 8 MiB unsent");
    assert!(!q.conn.is_closing(), "back-pressure, not an error");
    // Once the host reads, reading resumes.
    q.pump();
    assert!(q.conn.wants_read());
    let got = q.take();
    let cqes = got
        .iter()
        .filter(|g| matches!(g.header, PduHeader::CapsuleResp(_)))
        .count();
    let done = got
        .iter()
        .filter(|g| matches!(g.header, PduHeader::C2HData(d) if d.success))
        .count();
    assert_eq!(cqes + done, 12);
}

/// Runs a Pair's backend requests to completion without taking the
/// target's output.
fn drive_backend(p: &mut Pair) {
    for _ in 0..100_000 {
        let mut progress = false;
        while let Some(sub) = p.conn.poll_backend() {
            progress = true;
            let q = p
                .queues
                .entry(sub.ns.index)
                .or_insert_with(|| sub.ns.backend.open_queue().expect("queue"));
            q.submit(sub.req, p.now);
        }
        let mut out: Vec<sluice_backend::IoCompletion> = Vec::new();
        for q in p.queues.values_mut() {
            q.poll_completions(p.now, &mut out);
        }
        for c in out {
            progress = true;
            p.conn.handle_backend_completion(c, p.now);
        }
        if !progress {
            if p.conn.backend_in_flight() == 0 {
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    panic!("backend did not settle");
}

// ------------------------------------------------------------------ RES

fn icreq_bytes() -> Vec<u8> {
    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }),
        &[],
        &TxParams::default(),
        &mut w,
    );
    w
}

/// Tolerated: nvmet and SPDK ignore ICReq reserved bytes, and so does
/// Sluice (logged once); the queue comes up.
#[test]
fn res_01_icreq_reserved_bytes() {
    let reg = reg();
    for at in [16usize, 100, 127] {
        let before = tolerated::count(Tolerated::PduReservedBytes);
        let mut p = Pair::new(reg.clone());
        let mut w = icreq_bytes();
        w[at] = 1;
        p.send_raw(&w);
        assert_eq!(p.term, None, "byte {at}");
        assert!(
            matches!(
                p.take().as_slice(),
                [Got {
                    header: PduHeader::IcResp(_),
                    ..
                }]
            ),
            "byte {at}: no ICResp"
        );
        assert!(tolerated::count(Tolerated::PduReservedBytes) > before);
        let c = p.connect(0, sluice_proto::fabrics::CNTLID_DYNAMIC, HOSTNQN, 0);
        assert_eq!(c.status(), Status::SUCCESS);
    }
}

/// Tolerated: as RES-01, for DGST bits 7:2 (the digest bits still count).
#[test]
fn res_02_icreq_dgst_reserved_bits() {
    let reg = reg();
    let before = tolerated::count(Tolerated::PduReservedBytes);
    let mut p = Pair::new(reg.clone());
    let mut w = icreq_bytes();
    w[11] = 0x04 | 0x01;
    p.send_raw(&w);
    assert_eq!(p.term, None);
    match p.take().as_slice() {
        [Got {
            header: PduHeader::IcResp(r),
            ..
        }] => assert!(r.hdgst && !r.ddgst),
        other => panic!("expected an ICResp, got {other:?}"),
    }
    assert!(tolerated::count(Tolerated::PduReservedBytes) > before);
}

/// Tolerated: as RES-01, for H2CData bytes 20-23; the write completes.
#[test]
fn res_03_h2c_data_reserved_bytes() {
    let reg = reg();
    let (_a, cntlid) = admin_pair(&reg);
    for at in [20usize, 23] {
        let mut q = io_pair(&reg, cntlid, false, false);
        let cid = 300;
        let mut s = Sqe::rw(io::WRITE, cid, 1, 0, 8, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 4096,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        q.send(&PduHeader::CapsuleCmd(s), &[]);
        let ttag = match q.take().as_slice() {
            [Got {
                header: PduHeader::R2t(r),
                ..
            }] => r.ttag,
            other => panic!("expected an R2T, got {other:?}"),
        };
        let mut w = Vec::new();
        encode_pdu(
            &PduHeader::H2CData(DataHeader {
                cccid: cid,
                ttag,
                offset: 0,
                len: 4096,
                last: true,
                success: false,
            }),
            &[0; 4096],
            &TxParams::default(),
            &mut w,
        );
        w[at] = 1;
        let before = tolerated::count(Tolerated::PduReservedBytes);
        q.send_raw(&w);
        assert_eq!(q.term, None, "byte {at}");
        let (c, _) = q.collect_response(cid);
        assert_eq!(c.status(), Status::SUCCESS, "byte {at}");
        assert!(tolerated::count(Tolerated::PduReservedBytes) > before);
        q.conn.finish();
    }
}
