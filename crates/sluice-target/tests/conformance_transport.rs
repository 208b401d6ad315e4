//! Conformance of the target's NVMe/TCP transport checks: one test per
//! PDU-, IC-, CAP- and DATA- row of the conformance inventory
//! (`sluice-target-checks.md`), each asserting the exact FES/FEI or status
//! (with DNR), whether the connection closes, and that the queue carries on
//! where it should. A byte-level host drives the real `QueueConnection`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::*;
use sluice_config::{Config, SubsystemConfig};
use sluice_proto::command::{admin, io, sgl, SglDescriptor, Sqe};
use sluice_proto::fabrics::{ConnectCommand, ConnectData, CNTLID_DYNAMIC};
use sluice_proto::pdu::{encode_pdu, fes, DataHeader, IcReq, PduHeader, TermReq, TxParams};
use sluice_proto::Status;
use sluice_target::tolerated::{count, Tolerated};

fn reg() -> std::sync::Arc<sluice_target::registry::Registry> {
    registry(&config_in("immediate", default_ns()))
}

/// A registry whose target advertises `inline` bytes of in-capsule data
/// and MAXH2CDATA `maxh2c`.
fn reg_with(inline: u32, maxh2c: u32) -> std::sync::Arc<sluice_target::registry::Registry> {
    let c = Config::default()
        .with_target(
            target_settings(send_config("immediate"))
                .with_inline_data_bytes(inline)
                .with_max_h2c_data_bytes(maxh2c),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(default_ns()),
        )
        .validated()
        .expect("valid config");
    registry(&c)
}

/// An I/O queue of a new controller (the admin pair is returned to keep
/// the association alive).
fn io_queue(hdgst: bool, ddgst: bool) -> (Pair, Pair) {
    let r = reg();
    let (a, cntlid) = admin_pair(&r);
    (a, io_pair(&r, cntlid, hdgst, ddgst))
}

fn encode(h: &PduHeader, data: &[u8], txp: &TxParams) -> Vec<u8> {
    let mut w = Vec::new();
    encode_pdu(h, data, txp, &mut w);
    w
}

fn set_plen(w: &mut [u8], plen: u32) {
    w[4..8].copy_from_slice(&plen.to_le_bytes());
}

fn icreq_pdu(hpda: u8, hdgst: bool, ddgst: bool, maxr2t: u32) -> Vec<u8> {
    encode(
        &PduHeader::IcReq(IcReq {
            pfv: 0,
            hpda,
            hdgst,
            ddgst,
            maxr2t,
        }),
        &[],
        &TxParams::default(),
    )
}

fn h2c_term_req(fes_v: u16) -> Vec<u8> {
    encode(
        &PduHeader::H2CTermReq(TermReq {
            fes: fes_v,
            fei: 0,
            data: Vec::new(),
        }),
        &[0; 24],
        &TxParams::default(),
    )
}

/// Asserts the target sent exactly one C2HTermReq with (FES, FEI), nothing
/// after it, and closed; returns the quoted header.
#[track_caller]
fn assert_fatal(p: &mut Pair, fes_v: u16, fei: u32) -> Vec<u8> {
    assert_eq!(p.term, Some((fes_v, fei)));
    assert!(p.conn.is_closed(), "connection closed");
    let got = p.take();
    match got.as_slice() {
        [.., Got {
            header: PduHeader::C2HTermReq(t),
            data,
            ..
        }] => {
            assert_eq!((t.fes, t.fei), (fes_v, fei));
            data.clone()
        }
        other => panic!("expected a C2HTermReq last, got {other:?}"),
    }
}

/// Asserts the target closed without sending anything.
#[track_caller]
fn assert_closed_silently(p: &mut Pair) {
    assert!(p.take().is_empty(), "no reply");
    assert!(p.term.is_none());
    assert!(p.conn.is_closed());
}

fn read_sqe(cid: u16, slba: u64, nlb: u32) -> Sqe {
    let mut s = Sqe::rw(io::READ, cid, 1, slba, nlb, false);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: nlb * 512,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    s
}

fn write_sqe(cid: u16, slba: u64, nlb: u32, id: u8) -> Sqe {
    let mut s = Sqe::rw(io::WRITE, cid, 1, slba, nlb, false);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: nlb * 512,
        id,
    });
    s
}

/// Sends a write that asks for its data by R2T and returns the R2T's TTAG.
fn start_write(p: &mut Pair, cid: u16, slba: u64, nlb: u32) -> u16 {
    p.send(
        &PduHeader::CapsuleCmd(write_sqe(cid, slba, nlb, sgl::TRANSPORT_DATA_BLOCK)),
        &[],
    );
    match p.take().as_slice() {
        [Got {
            header: PduHeader::R2t(r),
            ..
        }] => {
            assert_eq!((r.cccid, r.offset, r.len), (cid, 0, nlb * 512));
            r.ttag
        }
        other => panic!("expected R2T, got {other:?}"),
    }
}

fn h2c(cid: u16, ttag: u16, offset: u32, len: u32, last: bool) -> PduHeader {
    PduHeader::H2CData(DataHeader {
        cccid: cid,
        ttag,
        offset,
        len,
        last,
        success: false,
    })
}

/// The queue still works: a read of block 0 succeeds.
#[track_caller]
fn assert_queue_works(p: &mut Pair) {
    assert_eq!(p.read(0, 1).0, Status::SUCCESS);
    assert!(p.term.is_none());
    assert!(!p.conn.is_closing());
}

// ------------------------------------------------------------------ PDU

#[test]
fn pdu_01_unknown_pdu_type() {
    for t in [0x08u8, 0x0a, 0x42, 0xff] {
        for init in [false, true] {
            let mut p = Pair::new(reg());
            if init {
                p.icreq(false, false);
            }
            let mut w = vec![t, 0, 24, 0, 24, 0, 0, 0];
            w.resize(24, 0);
            p.send_raw(&w);
            assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 0);
        }
    }
}

#[test]
fn pdu_02_controller_to_host_type() {
    for t in [0x01u8, 0x03, 0x05, 0x07, 0x09] {
        let mut p = Pair::new(reg());
        p.icreq(false, false);
        let hlen = if t == 0x01 { 128u8 } else { 24 };
        let mut w = vec![t, 0, hlen, 0, hlen, 0, 0, 0];
        w.resize(hlen as usize, 0);
        p.send_raw(&w);
        assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 0);
    }
}

#[test]
fn pdu_03_capsule_or_data_before_icreq() {
    let txp = TxParams::default();
    for w in [
        encode(&PduHeader::CapsuleCmd(read_sqe(1, 0, 1)), &[], &txp),
        encode(&h2c(1, 1, 0, 512, true), &[0; 512], &txp),
    ] {
        let mut p = Pair::new(reg());
        p.send_raw(&w);
        let quote = assert_fatal(&mut p, fes::PDU_SEQUENCE_ERROR, 0);
        assert_eq!(quote[..8], w[..8], "quotes the offending header");
    }
}

#[test]
fn pdu_04_second_icreq() {
    let mut p = Pair::new(reg());
    p.icreq(false, false);
    p.send_raw(&icreq_pdu(0, false, false, 0));
    assert_fatal(&mut p, fes::PDU_SEQUENCE_ERROR, 0);
    // Also after Connect.
    let (_a, mut q) = io_queue(false, false);
    q.send_raw(&icreq_pdu(0, false, false, 0));
    assert_fatal(&mut q, fes::PDU_SEQUENCE_ERROR, 0);
}

#[test]
fn pdu_05_wrong_hlen() {
    // ICReq with HLEN 127.
    let mut p = Pair::new(reg());
    let mut w = icreq_pdu(0, false, false, 0);
    w[2] = 127;
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 2);
    // CapsuleCmd with HLEN 24, H2CData with HLEN 72, H2CTermReq with HLEN 72.
    let txp = TxParams::default();
    for (mut w, hlen) in [
        (
            encode(&PduHeader::CapsuleCmd(read_sqe(1, 0, 1)), &[], &txp),
            24u8,
        ),
        (encode(&h2c(1, 1, 0, 512, true), &[0; 512], &txp), 72),
        (h2c_term_req(1), 72),
    ] {
        let mut p = Pair::new(reg());
        p.icreq(false, false);
        w[2] = hlen;
        p.send_raw(&w);
        assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 2);
    }
}

#[test]
fn pdu_06_reserved_flags_are_ignored() {
    let before = count(Tolerated::PduReservedFlags);
    // ICReq with flag bits.
    let mut p = Pair::new(reg());
    let mut w = icreq_pdu(0, false, false, 0);
    w[1] = 0x83;
    p.send_raw(&w);
    assert!(
        matches!(
            p.take().as_slice(),
            [Got {
                header: PduHeader::IcResp(_),
                ..
            }]
        ),
        "ICResp"
    );
    assert!(p.term.is_none());
    // CapsuleCmd with LAST_PDU, SUCCESS and 10h-80h.
    let (_a, mut p) = io_queue(false, false);
    let cid = p.cid();
    let mut w = encode(&PduHeader::CapsuleCmd(read_sqe(cid, 0, 1)), &[], &p.txp);
    w[1] |= 0xfc;
    p.send_raw(&w);
    let (c, d) = p.collect_response(cid);
    assert_eq!((c.status(), d.len()), (Status::SUCCESS, 512));
    // H2CData with 10h-80h.
    let cid = p.cid();
    let ttag = start_write(&mut p, cid, 0, 1);
    let mut w = encode(&h2c(cid, ttag, 0, 512, true), &[7; 512], &p.txp);
    w[1] |= 0xf0;
    p.send_raw(&w);
    assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
    assert_eq!(p.read(0, 1), (Status::SUCCESS, vec![7; 512]));
    // H2CTermReq with flag bits: still a termination.
    let mut w = h2c_term_req(1);
    w[1] = 0x01;
    p.send_raw(&w);
    assert_closed_silently(&mut p);
    assert!(count(Tolerated::PduReservedFlags) >= before + 4);
}

#[test]
fn pdu_07_icreq_pdo_is_ignored() {
    let before = count(Tolerated::PduOffsetWithoutData);
    let mut p = Pair::new(reg());
    let mut w = icreq_pdu(0, false, false, 0);
    w[3] = 8;
    p.send_raw(&w);
    assert!(matches!(
        p.take().as_slice(),
        [Got {
            header: PduHeader::IcResp(_),
            ..
        }]
    ));
    assert!(p.term.is_none());
    assert!(count(Tolerated::PduOffsetWithoutData) > before);
}

#[test]
fn pdu_08_icreq_plen_not_128() {
    for plen in [124u32, 132] {
        let mut p = Pair::new(reg());
        let mut w = icreq_pdu(0, false, false, 0);
        set_plen(&mut w, plen);
        w.resize(plen as usize, 0);
        p.send_raw(&w);
        assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 4);
    }
}

#[test]
fn pdu_09_h2c_term_req_pdo_is_ignored() {
    let before = count(Tolerated::PduOffsetWithoutData);
    let mut p = Pair::new(reg());
    p.icreq(false, false);
    let mut w = h2c_term_req(1);
    w[3] = 24;
    p.send_raw(&w);
    assert_closed_silently(&mut p);
    assert!(count(Tolerated::PduOffsetWithoutData) > before);
}

#[test]
fn pdu_10_h2c_term_req_plen_out_of_range() {
    for plen in [20u32, 153] {
        let mut p = Pair::new(reg());
        p.icreq(false, false);
        let mut w = h2c_term_req(1);
        set_plen(&mut w, plen);
        w.resize(plen.max(24) as usize, 0);
        p.send_raw(&w);
        assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 4);
    }
    // PLEN 24 (no quoted header) and 152 are accepted: the host terminates.
    for plen in [24usize, 152] {
        let mut p = Pair::new(reg());
        p.icreq(false, false);
        let mut w = h2c_term_req(1);
        set_plen(&mut w, plen as u32);
        w.resize(plen, 0);
        p.send_raw(&w);
        assert_closed_silently(&mut p);
    }
}

#[test]
fn pdu_11_hdgstf_differs_from_negotiated() {
    // Header digests on, flag clear.
    let (_a, mut p) = io_queue(true, false);
    let w = encode(
        &PduHeader::CapsuleCmd(read_sqe(9, 0, 1)),
        &[],
        &TxParams::default(),
    );
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 1);
    // Header digests off, flag set (with a digest).
    let (_a, mut p) = io_queue(false, false);
    let w = encode(
        &PduHeader::CapsuleCmd(read_sqe(9, 0, 1)),
        &[],
        &TxParams {
            hdgst: true,
            ..Default::default()
        },
    );
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 1);
}

#[test]
fn pdu_12_plen_shorter_than_header() {
    let (_a, mut p) = io_queue(false, false);
    let mut w = encode(&PduHeader::CapsuleCmd(read_sqe(9, 0, 1)), &[], &p.txp);
    set_plen(&mut w, 40);
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 4);
    // With header digests, PLEN = HLEN leaves out the digest.
    let (_a, mut p) = io_queue(true, false);
    let mut w = encode(&PduHeader::CapsuleCmd(read_sqe(9, 0, 1)), &[], &p.txp);
    set_plen(&mut w, 72);
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 4);
    // H2CData PLEN 20.
    let (_a, mut p) = io_queue(false, false);
    let mut w = encode(&h2c(1, 1, 0, 512, true), &[0; 512], &p.txp);
    set_plen(&mut w, 20);
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 4);
}

#[test]
fn pdu_13_no_data_type_is_caught_as_wrong_direction() {
    // The "PDU without data has PDO/PLEN" branch only sees
    // controller-to-host types, which PDU-02 refuses first (FEI 0, not 3).
    let mut p = Pair::new(reg());
    p.icreq(false, false);
    let mut w = vec![0x05, 0, 24, 8, 32, 0, 0, 0];
    w.resize(32, 0);
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 0);
}

#[test]
fn pdu_14_capsule_without_data_pdo_is_ignored() {
    let before = count(Tolerated::PduOffsetWithoutData);
    let (_a, mut p) = io_queue(false, false);
    let cid = p.cid();
    let mut w = encode(&PduHeader::CapsuleCmd(read_sqe(cid, 0, 1)), &[], &p.txp);
    w[3] = 72;
    p.send_raw(&w);
    assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
    assert!(count(Tolerated::PduOffsetWithoutData) > before);
    assert_queue_works(&mut p);
}

#[test]
fn pdu_15_capsule_without_data_ddgstf_is_ignored() {
    let before = count(Tolerated::CapsuleDdgstfWithoutData);
    for ddgst in [true, false] {
        let (_a, mut p) = io_queue(false, ddgst);
        let cid = p.cid();
        let mut w = encode(&PduHeader::CapsuleCmd(read_sqe(cid, 0, 1)), &[], &p.txp);
        w[1] |= 0x02;
        p.send_raw(&w);
        assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
        assert_queue_works(&mut p);
    }
    assert!(count(Tolerated::CapsuleDdgstfWithoutData) >= before + 2);
}

#[test]
fn pdu_16_ddgstf_differs_from_negotiated() {
    // Data digests on, in-capsule data without DDGSTF (and no digest).
    let (_a, mut p) = io_queue(false, true);
    let w = encode(
        &PduHeader::CapsuleCmd(write_sqe(9, 0, 1, sgl::DATA_BLOCK_OFFSET)),
        &[0; 512],
        &TxParams::default(),
    );
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 1);
    // Data digests off, H2CData with DDGSTF (and a digest).
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 9, 0, 1);
    let w = encode(
        &h2c(9, ttag, 0, 512, true),
        &[0; 512],
        &TxParams {
            ddgst: true,
            ..Default::default()
        },
    );
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 1);
}

#[test]
fn pdu_17_pdo_before_header_end_or_misaligned() {
    for pdo in [68u8, 74] {
        let (_a, mut p) = io_queue(false, false);
        let mut w = encode(
            &PduHeader::CapsuleCmd(write_sqe(9, 0, 1, sgl::DATA_BLOCK_OFFSET)),
            &[0; 512],
            &p.txp,
        );
        w[3] = pdo;
        p.send_raw(&w);
        assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 3);
    }
    // H2CData data starting inside the header.
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 9, 0, 1);
    let mut w = encode(&h2c(9, ttag, 0, 512, true), &[0; 512], &p.txp);
    w[3] = 20;
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 3);
}

#[test]
fn pdu_18_no_data_after_pdo() {
    let (_a, mut p) = io_queue(false, false);
    let mut w = encode(&PduHeader::CapsuleCmd(read_sqe(9, 0, 1)), &[], &p.txp);
    w[3] = 76;
    set_plen(&mut w, 76);
    w.resize(76, 0);
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 4);
}

#[test]
fn pdu_19_in_capsule_data_beyond_framer_limit() {
    // Connected I/O queue: framer limit 8 KiB in the test config.
    let (_a, mut p) = io_queue(false, false);
    let w = encode(
        &PduHeader::CapsuleCmd(write_sqe(3, 0, 32, sgl::DATA_BLOCK_OFFSET)),
        &[0; 16384],
        &p.txp,
    );
    p.send_raw(&w);
    let quote = assert_fatal(&mut p, fes::DATA_LIMIT_EXCEEDED, 0);
    assert_eq!(quote, w[..72], "quotes the capsule header");
    // Before Connect the limit is the Connect data (1 KiB).
    let mut p = Pair::new(reg());
    p.icreq(false, false);
    let cmd = ConnectCommand {
        cid: 1,
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let mut data = ConnectData {
        hostid: HOSTID,
        cntlid: CNTLID_DYNAMIC,
        subnqn: SUBNQN.into(),
        hostnqn: HOSTNQN.into(),
    }
    .encode()
    .to_vec();
    data.resize(2048, 0);
    let mut sqe = cmd.to_sqe();
    sqe.set_sgl(SglDescriptor {
        address: 0,
        length: 2048,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    p.send(&PduHeader::CapsuleCmd(sqe), &data);
    assert_fatal(&mut p, fes::DATA_LIMIT_EXCEEDED, 0);
}

#[test]
fn pdu_20_header_digest_mismatch() {
    let (_a, mut p) = io_queue(true, false);
    let mut w = encode(&PduHeader::CapsuleCmd(read_sqe(9, 0, 1)), &[], &p.txp);
    w[20] ^= 0x55;
    let received = u32::from_le_bytes([w[72], w[73], w[74], w[75]]);
    p.send_raw(&w);
    assert_fatal(&mut p, fes::HEADER_DIGEST_ERROR, received);
}

#[test]
fn pdu_21_data_digest_mismatch_fails_the_command() {
    let (_a, mut p) = io_queue(false, true);
    assert_eq!(p.write(0, &[1; 512], 8192), Status::SUCCESS);
    let cid = p.cid();
    let mut w = encode(
        &PduHeader::CapsuleCmd(write_sqe(cid, 0, 1, sgl::DATA_BLOCK_OFFSET)),
        &[9; 512],
        &p.txp,
    );
    let n = w.len();
    w[n - 1] ^= 0xff;
    p.send_raw(&w);
    let (c, _) = p.collect_response(cid);
    assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR);
    assert!(!c.status().dnr);
    assert_eq!(p.read(0, 1), (Status::SUCCESS, vec![1; 512]), "not written");
    assert!(p.term.is_none());
}

#[test]
fn pdu_22_h2c_term_req_closes_without_reply() {
    // Before ICReq, with an undefined FES; after Connect, with FES 01h.
    let mut p = Pair::new(reg());
    p.send_raw(&h2c_term_req(0x99));
    assert_closed_silently(&mut p);
    let (_a, mut p) = io_queue(false, false);
    p.send_raw(&h2c_term_req(fes::INVALID_HEADER_FIELD));
    assert_closed_silently(&mut p);
}

#[test]
fn pdu_23_bytes_after_a_fatal_error_are_ignored() {
    let mut p = Pair::new(reg());
    let mut w = vec![0xffu8, 0, 24, 0, 24, 0, 0, 0];
    w.resize(24, 0);
    w.extend_from_slice(&icreq_pdu(0, false, false, 0));
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 0);
    p.send_raw(&icreq_pdu(0, false, false, 0));
    assert!(p.take().is_empty(), "no ICResp after the TermReq");
    assert!(p.conn.is_closed());
}

// ------------------------------------------------------------------ IC

#[test]
fn ic_01_pfv_not_zero() {
    let mut p = Pair::new(reg());
    let mut w = icreq_pdu(0, false, false, 0);
    w[8] = 1;
    p.send_raw(&w);
    assert_fatal(&mut p, fes::UNSUPPORTED_PARAMETER, 8);
}

#[test]
fn ic_02_hpda_above_31() {
    for hpda in [32u8, 0xff] {
        let mut p = Pair::new(reg());
        p.send_raw(&icreq_pdu(hpda, false, false, 0));
        assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 10);
    }
}

#[test]
fn ic_03_hpda_pads_c2h_data() {
    let r = reg();
    let (_a, cntlid) = admin_pair(&r);
    let mut p = Pair::new(r);
    p.send_raw(&icreq_pdu(3, false, false, 0));
    assert!(matches!(
        p.take().as_slice(),
        [Got {
            header: PduHeader::IcResp(_),
            ..
        }]
    ));
    // The host's framer now insists on 16-byte aligned C2H data.
    p.host_rx.set_initialized(false, false, 3, 1 << 24);
    assert!(p.connect(1, cntlid, HOSTNQN, 0).status().is_success());
    assert_eq!(p.write(0, &[5; 1024], 8192), Status::SUCCESS);
    assert_eq!(p.read(0, 2), (Status::SUCCESS, vec![5; 1024]));
    assert!(p.term.is_none());
}

#[test]
fn ic_04_digests_are_granted() {
    for (hdgst, ddgst) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut p = Pair::new(reg());
        p.send_raw(&icreq_pdu(0, hdgst, ddgst, 0));
        match p.take().as_slice() {
            [Got {
                header: PduHeader::IcResp(r),
                ..
            }] => assert_eq!((r.hdgst, r.ddgst), (hdgst, ddgst)),
            other => panic!("{other:?}"),
        }
    }
    let (_a, mut p) = io_queue(true, true);
    assert_eq!(p.write(0, &[3; 16384], 8192), Status::SUCCESS);
    assert_eq!(p.read(0, 32), (Status::SUCCESS, vec![3; 16384]));
}

#[test]
fn ic_05_any_maxr2t() {
    for maxr2t in [0u32, 1, u32::MAX] {
        let r = reg();
        let (_a, cntlid) = admin_pair(&r);
        let mut p = Pair::new(r);
        p.send_raw(&icreq_pdu(0, false, false, maxr2t));
        assert_eq!(p.take().len(), 1, "ICResp");
        assert!(p.connect(1, cntlid, HOSTNQN, 0).status().is_success());
        // Two writes, each with its R2T outstanding at once.
        let t1 = start_write(&mut p, 100, 0, 32);
        let t2 = start_write(&mut p, 101, 32, 32);
        p.h2c_all(101, t2, &[2; 16384], 8192);
        assert_eq!(p.collect_response(101).0.status(), Status::SUCCESS);
        p.h2c_all(100, t1, &[1; 16384], 8192);
        assert_eq!(p.collect_response(100).0.status(), Status::SUCCESS);
    }
}

#[test]
fn ic_06_icresp_fields() {
    let mut p = Pair::new(reg_with(8192, 16384));
    p.send_raw(&icreq_pdu(2, true, false, 4));
    match p.take().as_slice() {
        [Got {
            header: PduHeader::IcResp(r),
            ..
        }] => {
            assert_eq!((r.pfv, r.cpda, r.hdgst, r.ddgst), (0, 0, true, false));
            assert_eq!(r.maxh2cdata, 16384);
        }
        other => panic!("{other:?}"),
    }
    p.txp = TxParams {
        hdgst: true,
        ddgst: false,
        pda: 0,
    };
    assert!(p
        .connect(0, CNTLID_DYNAMIC, HOSTNQN, 0)
        .status()
        .is_success());
}

// ------------------------------------------------------------------ CAP

#[test]
fn cap_01_queue_depth_exceeded_quotes_the_capsule() {
    // I/O queue of depth 64: 64 writes wait for data, a 65th arrives.
    let (_a, mut p) = io_queue(false, false);
    for i in 0..64u16 {
        start_write(&mut p, 100 + i, 0, 32);
    }
    let w = encode(&PduHeader::CapsuleCmd(read_sqe(500, 0, 1)), &[], &p.txp);
    p.send_raw(&w);
    let quote = assert_fatal(&mut p, fes::PDU_SEQUENCE_ERROR, 0);
    assert_eq!(quote, w[..72], "the received header, not zeros");
    // Before Connect the depth is 1: a Connect waiting for its data by R2T,
    // then another Connect (with header digests: the quote has none).
    let mut p = Pair::new(reg());
    p.icreq(true, false);
    let mut sqe = ConnectCommand {
        cid: 1,
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    }
    .to_sqe();
    sqe.set_sgl(SglDescriptor {
        address: 0,
        length: 1024,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    p.send(&PduHeader::CapsuleCmd(sqe), &[]);
    assert!(matches!(
        p.take().as_slice(),
        [Got {
            header: PduHeader::R2t(_),
            ..
        }]
    ));
    sqe.set_cid(2);
    let w = encode(&PduHeader::CapsuleCmd(sqe), &[], &p.txp);
    p.send_raw(&w);
    let quote = assert_fatal(&mut p, fes::PDU_SEQUENCE_ERROR, 0);
    assert_eq!(quote, w[..72]);
}

#[test]
fn cap_02_cid_conflict() {
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 42, 0, 32);
    let (c, _) = p.command(read_sqe(42, 0, 1), &[]);
    assert_eq!((c.cid, c.status()), (42, Status::CID_CONFLICT));
    // The first command carries on.
    p.h2c_all(42, ttag, &[4; 16384], 8192);
    assert_eq!(p.collect_response(42).0.status(), Status::SUCCESS);
    assert_eq!(p.read(0, 1), (Status::SUCCESS, vec![4; 512]));
}

#[test]
fn cap_03_fuse_not_zero() {
    let (mut a, mut p) = io_queue(false, false);
    for fuse in [1u8, 2, 3] {
        let cid = p.cid();
        let mut s = read_sqe(cid, 0, 1);
        s.0[1] |= fuse;
        assert_eq!(p.command(s, &[]).0.status(), Status::INVALID_FIELD);
        let cid = a.cid();
        let mut s = Sqe::new(admin::KEEP_ALIVE, cid, 0);
        s.0[1] |= fuse;
        assert_eq!(a.command(s, &[]).0.status(), Status::INVALID_FIELD);
    }
    assert_queue_works(&mut p);
}

#[test]
fn cap_04_psdt_not_sgl() {
    let (_a, mut p) = io_queue(false, false);
    for psdt in [0x00u8, 0x80, 0xc0] {
        let cid = p.cid();
        let mut s = read_sqe(cid, 0, 1);
        s.0[1] = psdt;
        assert_eq!(p.command(s, &[]).0.status(), Status::INVALID_FIELD);
    }
    assert_queue_works(&mut p);
}

#[test]
fn cap_05_in_capsule_data_on_a_command_without_data() {
    let (mut a, mut p) = io_queue(false, false);
    let cid = p.cid();
    let mut s = Sqe::new(io::FLUSH, cid, 1);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 512,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    assert_eq!(p.command(s, &[0; 512]).0.status(), Status::INVALID_FIELD);
    // A write whose SGL length is 0 but with capsule data.
    let cid = p.cid();
    let mut s = write_sqe(cid, 0, 1, sgl::DATA_BLOCK_OFFSET);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 0,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    assert_ne!(p.command(s, &[0; 512]).0.status(), Status::SUCCESS);
    // Keep Alive (admin, no data) with capsule data.
    let cid = a.cid();
    let mut s = Sqe::new(admin::KEEP_ALIVE, cid, 0);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 64,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    assert_eq!(a.command(s, &[0; 64]).0.status(), Status::INVALID_FIELD);
    assert_queue_works(&mut p);
}

#[test]
fn cap_06_in_capsule_sgl_on_controller_to_host_command() {
    let (mut a, mut p) = io_queue(false, false);
    let cid = p.cid();
    let mut s = read_sqe(cid, 0, 1);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 512,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    assert_eq!(p.command(s, &[]).0.status(), Status::INVALID_FIELD);
    let cid = p.cid();
    assert_eq!(
        p.command(with_cid(s, cid), &[0; 512]).0.status(),
        Status::INVALID_FIELD
    );
    // Identify with an in-capsule SGL.
    let cid = a.cid();
    let mut s = Sqe::new(admin::IDENTIFY, cid, 0);
    s.set_cdw(10, 1);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 4096,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    assert_eq!(a.command(s, &[]).0.status(), Status::INVALID_FIELD);
    assert_queue_works(&mut p);
}

#[test]
fn cap_07_in_capsule_sgl_with_offset() {
    let (_a, mut p) = io_queue(false, false);
    let cid = p.cid();
    let mut s = write_sqe(cid, 0, 1, sgl::DATA_BLOCK_OFFSET);
    s.set_sgl(SglDescriptor {
        address: 16,
        length: 512,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    assert_eq!(
        p.command(s, &[0; 512]).0.status(),
        Status::SGL_OFFSET_INVALID
    );
    assert_queue_works(&mut p);
}

#[test]
fn cap_08_in_capsule_sgl_length_differs_from_data() {
    let (_a, mut p) = io_queue(false, false);
    for (sgl_len, sent) in [(8192u32, 4096usize), (512, 1024)] {
        let cid = p.cid();
        let mut s = write_sqe(cid, 0, sgl_len / 512, sgl::DATA_BLOCK_OFFSET);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: sgl_len,
            id: sgl::DATA_BLOCK_OFFSET,
        });
        assert_eq!(
            p.command(s, &vec![0; sent]).0.status(),
            Status::DATA_SGL_LENGTH_INVALID
        );
    }
    assert_queue_works(&mut p);
}

#[test]
fn cap_09_in_capsule_data_beyond_ioccsz_is_fatal() {
    // IOCCSZ 4 KiB of data, framer limit 8 KiB: 8 KiB in-capsule on an I/O
    // queue is refused as beyond the framer limit is (FES 05h).
    let r = reg_with(4096, 8192);
    let (mut a, cntlid) = admin_pair(&r);
    let mut p = io_pair(&r, cntlid, false, false);
    assert_eq!(p.write(0, &[6; 4096], 4096), Status::SUCCESS);
    let w = encode(
        &PduHeader::CapsuleCmd(write_sqe(7, 0, 16, sgl::DATA_BLOCK_OFFSET)),
        &[0; 8192],
        &p.txp,
    );
    p.send_raw(&w);
    let quote = assert_fatal(&mut p, fes::DATA_LIMIT_EXCEEDED, 0);
    assert_eq!(quote, w[..72]);
    // The admin queue takes 8 KiB (what Linux sends), no more.
    let cid = a.cid();
    let mut s = Sqe::new(admin::SET_FEATURES, cid, 0);
    s.set_cdw(10, 0x0f);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 8192,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    assert!(a.term.is_none());
    let (c, _) = a.command(s, &[0; 8192]);
    assert_ne!(c.status(), Status::DATA_SGL_LENGTH_INVALID);
    let w = encode(
        &PduHeader::CapsuleCmd(with_cid(s, a.cid())),
        &[0; 8196],
        &a.txp,
    );
    a.send_raw(&w);
    assert_fatal(&mut a, fes::DATA_LIMIT_EXCEEDED, 0);
}

#[test]
fn cap_10_transport_sgl_with_in_capsule_data() {
    let (_a, mut p) = io_queue(false, false);
    let cid = p.cid();
    let s = write_sqe(cid, 0, 1, sgl::TRANSPORT_DATA_BLOCK);
    assert_eq!(
        p.command(s, &[0; 512]).0.status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_queue_works(&mut p);
}

#[test]
fn cap_11_transport_sgl_beyond_mdts() {
    let (mut a, mut p) = io_queue(false, false);
    let cid = p.cid();
    assert_eq!(
        p.command(read_sqe(cid, 0, 4096), &[]).0.status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    let cid = p.cid();
    let s = write_sqe(cid, 0, 4096, sgl::TRANSPORT_DATA_BLOCK);
    assert_eq!(
        p.command(s, &[]).0.status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    // Admin commands too.
    let (c, _) = a.admin_cmd(
        admin::GET_LOG_PAGE,
        0,
        0x02 | (0xffff << 16),
        0xffff,
        2 << 20,
    );
    assert_eq!(c.status(), Status::DATA_SGL_LENGTH_INVALID);
    assert_queue_works(&mut p);
}

#[test]
fn cap_12_other_sgl_identifiers() {
    let (_a, mut p) = io_queue(false, false);
    for id in [0x00u8, 0x02, 0x30, 0x40, 0x5b, 0xf0] {
        let cid = p.cid();
        let mut s = read_sqe(cid, 0, 1);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id,
        });
        assert_eq!(
            p.command(s, &[]).0.status(),
            Status::SGL_DESCRIPTOR_TYPE_INVALID,
            "id {id:#04x}"
        );
    }
    assert_queue_works(&mut p);
}

#[test]
fn cap_13_zero_length_sgl_means_no_data() {
    let (_a, mut p) = io_queue(false, false);
    let cid = p.cid();
    let mut s = Sqe::new(io::FLUSH, cid, 1);
    s.set_sgl(SglDescriptor {
        address: 0xdead_beef,
        length: 0,
        id: 0x30,
    });
    assert_eq!(p.command(s, &[]).0.status(), Status::SUCCESS);
    // A read without data fails its own length check.
    let cid = p.cid();
    let mut s = read_sqe(cid, 0, 1);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 0,
        id: 0x30,
    });
    assert_eq!(
        p.command(s, &[]).0.status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert_queue_works(&mut p);
}

#[test]
fn cap_14_in_capsule_data_digest_error() {
    let (_a, mut p) = io_queue(true, true);
    assert_eq!(p.write(0, &[1; 1024], 8192), Status::SUCCESS);
    let cid = p.cid();
    let mut w = encode(
        &PduHeader::CapsuleCmd(write_sqe(cid, 0, 2, sgl::DATA_BLOCK_OFFSET)),
        &[2; 1024],
        &p.txp,
    );
    let n = w.len();
    w[n - 2] ^= 0x10;
    p.send_raw(&w);
    let c = p.collect_response(cid).0;
    assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR);
    assert!(!c.status().dnr);
    assert_eq!(p.read(0, 2), (Status::SUCCESS, vec![1; 1024]));
}

// ------------------------------------------------------------------ DATA

#[test]
fn data_01_h2c_data_without_r2t() {
    // Unknown TTAG.
    let (_a, mut p) = io_queue(false, false);
    p.send(&h2c(5, 77, 0, 512, true), &[0; 512]);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 10);
    // A valid TTAG with another command's CID.
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 50, 0, 1);
    p.send(&h2c(51, ttag, 0, 512, true), &[0; 512]);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 10);
    // The same TTAG again after the transfer completed.
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 50, 0, 1);
    p.send(&h2c(50, ttag, 0, 512, true), &[0; 512]);
    assert_eq!(p.collect_response(50).0.status(), Status::SUCCESS);
    p.send(&h2c(50, ttag, 0, 512, true), &[0; 512]);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 10);
}

#[test]
fn data_02_h2c_data_offset_not_continuing() {
    for (first, second) in [(0u32, 1024u32), (0, 0), (512, 0)] {
        let (_a, mut p) = io_queue(false, false);
        let ttag = start_write(&mut p, 9, 0, 4);
        if first == 0 {
            p.send(&h2c(9, ttag, 0, 512, false), &[0; 512]);
            assert!(p.term.is_none());
            p.send(&h2c(9, ttag, second, 512, false), &[0; 512]);
        } else {
            p.send(&h2c(9, ttag, first, 512, false), &[0; 512]);
        }
        assert_fatal(&mut p, fes::DATA_OUT_OF_RANGE, 0);
    }
}

#[test]
fn data_03_h2c_data_beyond_r2t() {
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 9, 0, 8);
    p.send(&h2c(9, ttag, 0, 8192, true), &[0; 8192]);
    assert_fatal(&mut p, fes::DATA_OUT_OF_RANGE, 0);
}

#[test]
fn data_04_last_pdu_mismatch_is_ignored() {
    let before = count(Tolerated::H2cLastPduMismatch);
    let (_a, mut p) = io_queue(false, false);
    // LAST_PDU missing on the final PDU: the transfer still ends.
    let ttag = start_write(&mut p, 9, 0, 2);
    p.send(&h2c(9, ttag, 0, 512, false), &[1; 512]);
    p.send(&h2c(9, ttag, 512, 512, false), &[2; 512]);
    assert_eq!(p.collect_response(9).0.status(), Status::SUCCESS);
    // LAST_PDU set early: more data is still taken.
    let ttag = start_write(&mut p, 10, 2, 2);
    p.send(&h2c(10, ttag, 0, 512, true), &[3; 512]);
    assert!(p.take().is_empty() && p.term.is_none());
    p.send(&h2c(10, ttag, 512, 512, true), &[4; 512]);
    assert_eq!(p.collect_response(10).0.status(), Status::SUCCESS);
    let mut want = vec![1; 512];
    want.extend([2; 512]);
    want.extend([3; 512]);
    want.extend([4; 512]);
    assert_eq!(p.read(0, 4), (Status::SUCCESS, want));
    assert!(count(Tolerated::H2cLastPduMismatch) >= before + 2);
}

#[test]
fn data_05_datal_differs_from_payload() {
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 9, 0, 1);
    let mut w = encode(&h2c(9, ttag, 0, 512, true), &[0; 512], &p.txp);
    w[16..20].copy_from_slice(&256u32.to_le_bytes());
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 16);
}

#[test]
fn data_06_h2c_data_without_data() {
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 9, 0, 1);
    let mut w = encode(&h2c(9, ttag, 0, 512, true), &[0; 512], &p.txp);
    w[3] = 0;
    set_plen(&mut w, 24);
    w[16..20].copy_from_slice(&0u32.to_le_bytes());
    w.truncate(24);
    p.send_raw(&w);
    assert_fatal(&mut p, fes::INVALID_HEADER_FIELD, 4);
}

#[test]
fn data_07_h2c_data_beyond_maxh2cdata() {
    // MAXH2CDATA 4 KiB below the framer limit (8 KiB in-capsule).
    let r = reg_with(8192, 4096);
    let (_a, cntlid) = admin_pair(&r);
    let mut p = io_pair(&r, cntlid, false, false);
    let ttag = start_write(&mut p, 9, 0, 16);
    p.send(&h2c(9, ttag, 0, 4096, false), &[0; 4096]);
    assert!(p.term.is_none(), "MAXH2CDATA itself is fine");
    let w = encode(&h2c(9, ttag, 4096, 4100, false), &[0; 4100], &p.txp);
    p.send_raw(&w);
    let quote = assert_fatal(&mut p, fes::DATA_LIMIT_EXCEEDED, 0);
    assert_eq!(quote, w[..24]);
    // Beyond the framer limit too (test config: all 8 KiB).
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 9, 0, 32);
    p.send(&h2c(9, ttag, 0, 8196, false), &[0; 8196]);
    assert_fatal(&mut p, fes::DATA_LIMIT_EXCEEDED, 0);
}

#[test]
fn data_08_h2c_data_digest_error() {
    let (_a, mut p) = io_queue(false, true);
    assert_eq!(p.write(0, &[1; 16384], 8192), Status::SUCCESS);
    let ttag = start_write(&mut p, 9, 0, 32);
    let mut w = encode(&h2c(9, ttag, 0, 8192, false), &[2; 8192], &p.txp);
    let n = w.len();
    w[n - 1] ^= 1;
    p.send_raw(&w);
    assert!(
        p.take().is_empty() && p.term.is_none(),
        "waits for the rest"
    );
    p.send(&h2c(9, ttag, 8192, 8192, true), &[2; 8192]);
    let c = p.collect_response(9).0;
    assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR);
    assert!(!c.status().dnr);
    assert_eq!(p.read(0, 32), (Status::SUCCESS, vec![1; 16384]));
}

#[test]
fn data_09_h2c_data_success_flag_is_ignored() {
    let before = count(Tolerated::PduReservedFlags);
    let (_a, mut p) = io_queue(false, false);
    let ttag = start_write(&mut p, 9, 0, 2);
    for (off, last) in [(0u32, false), (512, true)] {
        let mut w = encode(&h2c(9, ttag, off, 512, last), &[8; 512], &p.txp);
        w[1] |= 0x08;
        p.send_raw(&w);
    }
    assert_eq!(p.collect_response(9).0.status(), Status::SUCCESS);
    assert_eq!(p.read(0, 2), (Status::SUCCESS, vec![8; 1024]));
    assert!(count(Tolerated::PduReservedFlags) >= before + 2);
}

fn with_cid(mut s: Sqe, cid: u16) -> Sqe {
    s.set_cid(cid);
    s
}
