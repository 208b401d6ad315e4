//! Conformance of Sluice's host to what a controller sends: one test per
//! H- row of `/work/conformance/host-checks.md`. The PDU-level rows drive
//! the sans-IO queue-pair core with hand-built (and hand-broken) controller
//! PDUs; the Connect, keep alive and authentication rows drive the whole
//! `Controller` against a scripted controller on loopback that behaves like
//! Linux nvmet or SPDK nvmf_tgt where they matter (SQID 0, SQHD counting,
//! C2HData SUCCESS without CATTR) and can be told to misbehave.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_auth::{HashId, Secret};
use sluice_host::core::{Completion, CoreConfig, Event, Payload, QueuePairCore};
use sluice_host::{ConnectOptions, Controller, HostError, IoFlags, ReconnectPolicy};
use sluice_proto::command::{admin, io, Cqe, Sqe, StatusField};
use sluice_proto::fabrics::{
    connect_data_offset, connect_offset, csts, fctype, prop, Cap, ConnectCommand, ConnectData,
    PropertyCommand, CATTR_DISABLE_SQ_FLOW, CONNECT_AUTHREQ_ATR, VS_1_3,
};
use sluice_proto::framer::Framer;
use sluice_proto::identify::{cns, cntrltype, IdentifyController};
use sluice_proto::pdu::{
    encode_pdu, fes, flags, DataHeader, Direction, IcReq, IcResp, PduHeader, R2t, TermReq, TxParams,
};
use sluice_proto::Status;

// ---------------------------------------------------------------------------
// The sans-IO core and a byte-level controller.

const QID: u16 = 1;

fn cfg(hd: bool, dd: bool) -> CoreConfig {
    CoreConfig {
        qid: QID,
        depth: 32,
        hdr_digest: hd,
        data_digest: dd,
        in_capsule_max_bytes: 8192,
        command_timeout: Duration::from_secs(5),
        c2h_data_max_bytes: 1 << 20,
    }
}

/// The controller end: parses what the host sends, builds what it receives.
struct Ctrl {
    rx: Framer,
    tx: TxParams,
}

#[derive(Debug)]
struct Got {
    header: PduHeader,
    data: Vec<u8>,
}

impl Ctrl {
    /// Everything the host has to send, parsed.
    fn recv(&mut self, host: &mut QueuePairCore) -> Vec<Got> {
        while let Some(b) = host.poll_transmit() {
            self.rx.feed(&b);
        }
        let mut out = Vec::new();
        while let Some(p) = self.rx.next_pdu().expect("host sent a valid PDU") {
            assert!(p.data_digest_ok, "host data digest wrong");
            out.push(Got {
                header: p.header.clone(),
                data: p.data.to_vec(),
            });
        }
        out
    }
    fn pdu(&self, h: PduHeader, data: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        encode_pdu(&h, data, &self.tx, &mut b);
        b
    }
    fn resp(&self, cid: u16, status: Status) -> Vec<u8> {
        self.pdu(PduHeader::CapsuleResp(Cqe::new(cid, status)), &[])
    }
    fn cqe(&self, cqe: Cqe) -> Vec<u8> {
        self.pdu(PduHeader::CapsuleResp(cqe), &[])
    }
    fn c2h(&self, cid: u16, offset: u32, data: &[u8], last: bool, success: bool) -> Vec<u8> {
        self.pdu(
            PduHeader::C2HData(DataHeader {
                cccid: cid,
                ttag: 0,
                offset,
                len: data.len() as u32,
                last,
                success,
            }),
            data,
        )
    }
    fn r2t(&self, cid: u16, ttag: u16, offset: u32, len: u32) -> Vec<u8> {
        self.pdu(
            PduHeader::R2t(R2t {
                cccid: cid,
                ttag,
                offset,
                len,
            }),
            &[],
        )
    }
}

/// A C2HTermReq carrying `data`.
fn term(fes_v: u16, fei: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    encode_pdu(
        &PduHeader::C2HTermReq(TermReq {
            fes: fes_v,
            fei,
            data: Vec::new(),
        }),
        data,
        &TxParams::default(),
        &mut b,
    );
    b
}

fn ic_resp(cpda: u8, hd: bool, dd: bool, maxh2cdata: u32) -> Vec<u8> {
    let mut b = Vec::new();
    encode_pdu(
        &PduHeader::IcResp(IcResp {
            pfv: 0,
            cpda,
            hdgst: hd,
            ddgst: dd,
            maxh2cdata,
        }),
        &[],
        &TxParams::default(),
        &mut b,
    );
    b
}

/// A core that sent its ICReq and waits for the ICResp.
fn fresh(c: CoreConfig) -> (QueuePairCore, Ctrl, Instant) {
    let now = Instant::now();
    let mut host = QueuePairCore::new(c, now);
    let mut ctrl = Ctrl {
        rx: Framer::new(Direction::HostToController, 1 << 24),
        tx: TxParams::default(),
    };
    let got = ctrl.recv(&mut host);
    assert!(
        matches!(
            got.as_slice(),
            [Got {
                header: PduHeader::IcReq(_),
                ..
            }]
        ),
        "{got:?}"
    );
    (host, ctrl, now)
}

/// A ready core: the ICResp echoed the digests with this CPDA and MAXH2CDATA.
fn connect_with(c: CoreConfig, cpda: u8, maxh2cdata: u32) -> (QueuePairCore, Ctrl, Instant) {
    let (hd, dd) = (c.hdr_digest, c.data_digest);
    let (mut host, mut ctrl, now) = fresh(c);
    host.handle_bytes(now, &ic_resp(cpda, hd, dd, maxh2cdata));
    assert!(host.is_ready());
    ctrl.rx.set_initialized(hd, dd, cpda, 1 << 24);
    ctrl.tx = TxParams {
        hdgst: hd,
        ddgst: dd,
        pda: 0,
    };
    (host, ctrl, now)
}

fn connect() -> (QueuePairCore, Ctrl, Instant) {
    connect_with(cfg(false, false), 0, 8192)
}

fn events(host: &mut QueuePairCore) -> Vec<Event> {
    std::iter::from_fn(|| host.poll_event()).collect()
}

/// The one event must be a completion; returns its result.
fn completion(host: &mut QueuePairCore) -> Result<Completion, HostError> {
    let ev = events(host);
    assert_eq!(ev.len(), 1, "{ev:?}");
    match ev.into_iter().next() {
        Some(Event::Complete { result, .. }) => result,
        other => panic!("expected a completion, got {other:?}"),
    }
}

/// Never repeats within a transfer ([`sluice_testdata::pattern`]), so data
/// placed at the wrong offset differs.
fn pattern(n: usize) -> Vec<u8> {
    sluice_testdata::pattern(n, 7)
}

fn read(host: &mut QueuePairCore, now: Instant, len: u32) -> u16 {
    host.submit(
        now,
        Sqe::rw(io::READ, 0, 1, 0, len.div_ceil(512).max(1), false),
        Payload::Read(len),
        1,
    )
    .expect("submit read")
}

fn write(host: &mut QueuePairCore, now: Instant, len: usize) -> u16 {
    host.submit(
        now,
        Sqe::rw(io::WRITE, 0, 1, 0, (len as u32).div_ceil(512).max(1), false),
        Payload::Write(pattern(len)),
        2,
    )
    .expect("submit write")
}

fn flush(host: &mut QueuePairCore, now: Instant) -> u16 {
    host.submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 3)
        .expect("submit flush")
}

/// The queue still works: a Flush round trip.
fn carries_on(host: &mut QueuePairCore, ctrl: &mut Ctrl, now: Instant) {
    assert!(!host.is_closed());
    let cid = flush(host, now);
    ctrl.recv(host);
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    assert!(completion(host).is_ok());
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn u32le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Feeds `bad` and checks the host's answer to a fatal error: it closes,
/// every command fails with the same `HostError::Protocol`, exactly one
/// H2CTermReq (the last PDU) carries that error's FES and FEI and quotes
/// the start of `bad`; later input is ignored and submissions refused.
/// Returns (FES, FEI).
fn expect_fatal(host: &mut QueuePairCore, ctrl: &mut Ctrl, now: Instant, bad: &[u8]) -> (u16, u32) {
    host.handle_bytes(now, bad);
    assert!(host.is_closed(), "the host must close the connection");
    let ev = events(host);
    let Some(Event::Closed(HostError::Protocol(e))) = ev.last() else {
        panic!("expected Closed(Protocol), got {ev:?}")
    };
    for x in &ev[..ev.len() - 1] {
        match x {
            Event::Complete {
                result: Err(HostError::Protocol(c)),
                ..
            } => assert_eq!(c, e),
            other => panic!("expected failed commands before Closed, got {other:?}"),
        }
    }
    let (fes_v, fei_v) = (e.fes(), e.fei());
    let got = ctrl.recv(host);
    assert!(
        matches!(
            got.last().map(|g| &g.header),
            Some(PduHeader::H2CTermReq(_))
        ),
        "{got:?}"
    );
    let trs: Vec<&TermReq> = got
        .iter()
        .filter_map(|g| match &g.header {
            PduHeader::H2CTermReq(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(trs.len(), 1, "{got:?}");
    let t = trs[0];
    assert_eq!((t.fes, t.fei), (fes_v, fei_v));
    assert!(!t.data.is_empty() && t.data.len() <= 128, "{t:?}");
    assert!(
        bad.starts_with(&t.data),
        "the TermReq quotes the offending header"
    );
    host.handle_bytes(now, bad);
    assert!(events(host).is_empty(), "a closed queue ignores input");
    assert!(host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 999)
        .is_err());
    (fes_v, fei_v)
}

/// Feeds `bad` to a ready core (no digests) with one command outstanding.
fn fatal_after_init(bad: impl Fn(&Ctrl) -> Vec<u8>) -> (u16, u32) {
    let (mut host, mut ctrl, now) = connect();
    let _ = read(&mut host, now, 512);
    ctrl.recv(&mut host);
    let b = bad(&ctrl);
    expect_fatal(&mut host, &mut ctrl, now, &b)
}

/// Feeds `bad` in place of the ICResp.
fn fatal_before_init(c: CoreConfig, bad: &[u8]) -> (u16, u32) {
    let (mut host, mut ctrl, now) = fresh(c);
    expect_fatal(&mut host, &mut ctrl, now, bad)
}

/// All bytes the host has to send, raw.
fn raw_out(host: &mut QueuePairCore) -> Vec<u8> {
    let mut v = Vec::new();
    while let Some(b) = host.poll_transmit() {
        v.extend(b);
    }
    v
}

// ---------------------------------------------------------------------------
// H-PDU: common header, framing, TermReq

#[test]
fn h_pdu_01_unknown_pdu_type() {
    for t in [0x08u8, 0x0a, 0x0b, 0x7f, 0xff] {
        let r = fatal_after_init(|c| {
            let mut b = c.resp(0, Status::SUCCESS);
            b[0] = t;
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 0), "type {t:#04x}");
    }
}

#[test]
fn h_pdu_02_host_to_controller_type() {
    let sqe = Sqe::new(io::FLUSH, 0, 1);
    let h2c = [
        PduHeader::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }),
        PduHeader::H2CTermReq(TermReq {
            fes: 1,
            fei: 0,
            data: Vec::new(),
        }),
        PduHeader::CapsuleCmd(sqe),
        PduHeader::H2CData(DataHeader {
            cccid: 0,
            ttag: 0,
            offset: 0,
            len: 4,
            last: true,
            success: false,
        }),
    ];
    for h in h2c {
        let t = h.pdu_type();
        let data: &[u8] = if t == 0x06 { &[1, 2, 3, 4] } else { &[] };
        let r = fatal_after_init(|c| c.pdu(h.clone(), data));
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 0), "type {t:#04x}");
    }
}

#[test]
fn h_pdu_03_pdu_before_icresp_is_sequence_error() {
    let c = Ctrl {
        rx: Framer::new(Direction::HostToController, 1 << 20),
        tx: TxParams::default(),
    };
    for b in [
        c.resp(0, Status::SUCCESS),
        c.c2h(0, 0, &pattern(512), true, true),
        c.r2t(0, 0, 0, 512),
    ] {
        let r = fatal_before_init(cfg(false, false), &b);
        assert_eq!(r, (fes::PDU_SEQUENCE_ERROR, 0), "type {:#04x}", b[0]);
    }
}

#[test]
fn h_pdu_04_second_icresp_is_sequence_error() {
    let r = fatal_after_init(|_| ic_resp(0, false, false, 8192));
    assert_eq!(r, (fes::PDU_SEQUENCE_ERROR, 0));
}

#[test]
fn h_pdu_05_wrong_hlen() {
    // ICResp (before initialization).
    let mut b = ic_resp(0, false, false, 8192);
    b[2] = 127;
    assert_eq!(
        fatal_before_init(cfg(false, false), &b),
        (fes::INVALID_HEADER_FIELD, 2)
    );
    // CapsuleResp, C2HData, R2T, C2HTermReq.
    for (which, hlen) in [(0, 23u8), (0, 28), (1, 25), (2, 16), (3, 25)] {
        let r = fatal_after_init(|c| {
            let mut b = match which {
                0 => c.resp(0, Status::SUCCESS),
                1 => c.c2h(0, 0, &pattern(512), true, false),
                2 => c.r2t(0, 0, 0, 512),
                _ => term(1, 0, &[]),
            };
            b[2] = hlen;
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 2), "pdu {which} hlen {hlen}");
    }
}

#[test]
fn h_pdu_06_flag_not_allowed_for_type() {
    for (which, f) in [
        (0, flags::LAST_PDU),
        (0, flags::DDGSTF),
        (0, flags::SUCCESS),
        (1, 0x10u8),
        (1, 0x80),
        (2, flags::DDGSTF),
        (2, flags::LAST_PDU),
    ] {
        let r = fatal_after_init(|c| {
            let mut b = match which {
                0 => c.resp(0, Status::SUCCESS),
                1 => c.c2h(0, 0, &pattern(512), true, false),
                _ => c.r2t(0, 0, 0, 512),
            };
            b[1] |= f;
            b
        });
        assert_eq!(
            r,
            (fes::INVALID_HEADER_FIELD, 1),
            "pdu {which} flag {f:#04x}"
        );
    }
    // ICResp: no flag at all.
    let mut b = ic_resp(0, false, false, 8192);
    b[1] = flags::HDGSTF;
    assert_eq!(
        fatal_before_init(cfg(true, false), &b),
        (fes::INVALID_HEADER_FIELD, 1)
    );
}

#[test]
fn h_pdu_07_hdgstf_differs_from_negotiated() {
    // Off, but set (the digest bytes are there too).
    for which in 0..3 {
        let r = fatal_after_init(|c| {
            let mut b = match which {
                0 => c.resp(0, Status::SUCCESS),
                1 => c.c2h(0, 0, &pattern(512), true, false),
                _ => c.r2t(0, 0, 0, 512),
            };
            b[1] |= flags::HDGSTF;
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 1), "pdu {which}");
    }
    // On, but missing.
    for which in 0..3 {
        let (mut host, mut ctrl, now) = connect_with(cfg(true, false), 0, 8192);
        let cid = read(&mut host, now, 512);
        ctrl.recv(&mut host);
        let plain = Ctrl {
            rx: Framer::new(Direction::HostToController, 1 << 20),
            tx: TxParams::default(),
        };
        let b = match which {
            0 => plain.resp(cid, Status::SUCCESS),
            1 => plain.c2h(cid, 0, &pattern(512), true, false),
            _ => plain.r2t(cid, 0, 0, 512),
        };
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::INVALID_HEADER_FIELD, 1),
            "pdu {which}"
        );
    }
}

#[test]
fn h_pdu_08_plen_shorter_than_header() {
    let r = fatal_after_init(|c| {
        let mut b = c.resp(0, Status::SUCCESS);
        put32(&mut b, 4, 20);
        b
    });
    assert_eq!(r, (fes::INVALID_HEADER_FIELD, 4));
    // Header digests on: PLEN 24 leaves no room for the HDGST.
    let (mut host, mut ctrl, now) = connect_with(cfg(true, false), 0, 8192);
    let mut b = ctrl.resp(0, Status::SUCCESS);
    put32(&mut b, 4, 24);
    b.truncate(24);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::INVALID_HEADER_FIELD, 4)
    );
}

#[test]
fn h_pdu_09_pdo_in_capsule_resp_or_r2t() {
    for (which, pdo) in [(0, 24u8), (0, 4), (1, 24), (1, 8)] {
        let r = fatal_after_init(|c| {
            let mut b = if which == 0 {
                c.resp(0, Status::SUCCESS)
            } else {
                c.r2t(0, 0, 0, 512)
            };
            b[3] = pdo;
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 3), "pdu {which} pdo {pdo}");
    }
}

#[test]
fn h_pdu_10_capsule_resp_or_r2t_with_data() {
    for (which, extra) in [(0, 4usize), (0, 512), (1, 8)] {
        let r = fatal_after_init(|c| {
            let mut b = if which == 0 {
                c.resp(0, Status::SUCCESS)
            } else {
                c.r2t(0, 0, 0, 512)
            };
            let plen = (b.len() + extra) as u32;
            b.resize(b.len() + extra, 0);
            put32(&mut b, 4, plen);
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 4), "pdu {which} +{extra}");
    }
}

#[test]
fn h_pdu_11_header_digest_mismatch() {
    let (mut host, mut ctrl, now) = connect_with(cfg(true, true), 0, 8192);
    let cid = flush(&mut host, now);
    ctrl.recv(&mut host);
    let mut b = ctrl.resp(cid, Status::SUCCESS);
    b[24] ^= 0x5a;
    let received = u32le(&b, 24);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::HEADER_DIGEST_ERROR, received)
    );
    // Checked as soon as the digest is in, before the data arrives.
    let (mut host, mut ctrl, now) = connect_with(cfg(true, true), 0, 8192);
    let cid = read(&mut host, now, 4096);
    ctrl.recv(&mut host);
    let mut b = ctrl.c2h(cid, 0, &pattern(4096), true, true);
    b[25] ^= 0x01;
    let received = u32le(&b, 24);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b[..28]),
        (fes::HEADER_DIGEST_ERROR, received)
    );
}

#[test]
fn h_pdu_12_c2h_term_req_closes_without_reply() {
    // (FES, FEI, data bytes, reserved bytes 14..24 as SPDK leaves them)
    for (fes_v, fei, n, leftovers) in [
        (fes::PDU_SEQUENCE_ERROR, 0u32, 0usize, false),
        (7, 0xdead_beef, 128, false),
        (0xffff, 5, 24, true),
        (fes::INVALID_HEADER_FIELD, 8, 72, true),
    ] {
        let (mut host, mut ctrl, now) = connect();
        let _ = read(&mut host, now, 512);
        ctrl.recv(&mut host);
        // Not yet handed to the socket: dropped by the termination.
        let _ = flush(&mut host, now);
        let mut b = term(fes_v, fei, &pattern(n));
        if leftovers {
            // An earlier ICResp's CPDA, DGST and MAXH2CDATA.
            b[14..24]
                .copy_from_slice(&[0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00]);
        }
        host.handle_bytes(now, &b);
        assert!(host.is_closed());
        let ev = events(&mut host);
        assert_eq!(ev.len(), 3, "{ev:?}");
        for e in &ev[..2] {
            assert!(
                matches!(e, Event::Complete { result: Err(HostError::TerminatedByController { fes: f, fei: i }), .. } if *f == fes_v && *i == fei),
                "{e:?}"
            );
        }
        assert!(matches!(
            ev[2],
            Event::Closed(HostError::TerminatedByController { .. })
        ));
        assert!(
            ctrl.recv(&mut host).is_empty(),
            "no H2CTermReq, nothing else"
        );
    }
}

#[test]
fn h_pdu_13_malformed_c2h_term_req() {
    // PLEN below 24 or above 24 + 128.
    let r = fatal_after_init(|_| {
        let mut b = term(1, 0, &[]);
        put32(&mut b, 4, 23);
        b
    });
    assert_eq!(r, (fes::INVALID_HEADER_FIELD, 4));
    let r = fatal_after_init(|_| term(1, 0, &pattern(129)));
    assert_eq!(r, (fes::INVALID_HEADER_FIELD, 4));
    // PDO, HLEN, flags.
    for (at, v, fei) in [(3usize, 4u8, 3u32), (2, 28, 2), (1, 1, 1), (1, 0x04, 1)] {
        let r = fatal_after_init(|_| {
            let mut b = term(1, 0, &pattern(8));
            b[at] = v;
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, fei), "byte {at} = {v:#x}");
    }
}

#[test]
fn h_pdu_14_c2h_term_req_before_icresp() {
    let (mut host, mut ctrl, now) = fresh(cfg(false, false));
    host.handle_bytes(now, &term(fes::UNSUPPORTED_PARAMETER, 10, &[0; 128]));
    assert!(host.is_closed());
    let ev = events(&mut host);
    assert!(
        matches!(
            ev.as_slice(),
            [Event::Closed(HostError::TerminatedByController {
                fes: 6,
                fei: 10
            })]
        ),
        "{ev:?}"
    );
    assert!(ctrl.recv(&mut host).is_empty());
}

#[test]
fn h_pdu_15_connection_lost_fails_every_command() {
    let (mut host, mut ctrl, now) = connect();
    let _ = read(&mut host, now, 512);
    let _ = flush(&mut host, now);
    ctrl.recv(&mut host);
    host.handle_connection_lost("controller closed the connection");
    assert!(host.is_closed());
    let ev = events(&mut host);
    assert_eq!(ev.len(), 3, "{ev:?}");
    for e in &ev[..2] {
        assert!(
            matches!(e, Event::Complete { result: Err(HostError::ConnectionLost(m)), .. } if m == "controller closed the connection"),
            "{e:?}"
        );
    }
    assert!(matches!(&ev[2], Event::Closed(e) if e.is_fatal_for_connection()));
    assert!(
        ctrl.recv(&mut host).is_empty(),
        "no TermReq on a lost connection"
    );
}

// ---------------------------------------------------------------------------
// H-IC: ICResp

#[test]
fn h_ic_01_pfv_not_zero_is_unsupported_parameter() {
    for pfv in [1u16, 0xffff] {
        let mut b = ic_resp(0, false, false, 8192);
        put16(&mut b, 8, pfv);
        assert_eq!(
            fatal_before_init(cfg(false, false), &b),
            (fes::UNSUPPORTED_PARAMETER, 8)
        );
    }
}

#[test]
fn h_ic_02_cpda_above_31() {
    for cpda in [32u8, 255] {
        let b = ic_resp(cpda, false, false, 8192);
        assert_eq!(
            fatal_before_init(cfg(false, false), &b),
            (fes::INVALID_HEADER_FIELD, 10)
        );
    }
}

#[test]
fn h_ic_03_cpda_pads_h2c_data_and_in_capsule_data() {
    for (cpda, hd, capsule_pdo, data_pdo) in [
        (1u8, false, 72u8, 24u8),
        (3, true, 80, 32),
        (31, false, 128, 128),
        (31, true, 128, 128),
    ] {
        let (mut host, mut ctrl, now) = connect_with(cfg(hd, false), cpda, 4096);
        let n = host.negotiated().expect("negotiated");
        assert_eq!(n.cpda, cpda);
        // In-capsule write.
        let cid = write(&mut host, now, 512);
        let raw = raw_out(&mut host);
        assert_eq!(raw[3], capsule_pdo, "CapsuleCmd PDO for CPDA {cpda}");
        ctrl.rx.feed(&raw);
        let got = ctrl.recv(&mut host);
        assert_eq!(got[0].data, pattern(512));
        host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
        assert!(completion(&mut host).is_ok());
        // Solicited write.
        host.set_in_capsule_max_bytes(0);
        let cid = write(&mut host, now, 1000);
        ctrl.recv(&mut host);
        host.handle_bytes(now, &ctrl.r2t(cid, 1, 0, 1000));
        let raw = raw_out(&mut host);
        assert_eq!(raw[0], 0x06);
        assert_eq!(raw[3], data_pdo, "H2CData PDO for CPDA {cpda}");
        ctrl.rx.feed(&raw);
        let got = ctrl.recv(&mut host);
        assert_eq!(got[0].data, pattern(1000));
        host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
        assert!(completion(&mut host).is_ok());
    }
}

#[test]
fn h_ic_04_dgst_reserved_bits() {
    for dgst in [0x04u8, 0x80, 0xff] {
        let mut b = ic_resp(0, false, false, 8192);
        b[11] = dgst;
        assert_eq!(
            fatal_before_init(cfg(true, true), &b),
            (fes::INVALID_HEADER_FIELD, 11),
            "dgst {dgst:#04x}"
        );
    }
}

#[test]
fn h_ic_05_digest_the_host_did_not_ask_for() {
    for (hd, dd) in [(true, false), (false, true), (true, true)] {
        let b = ic_resp(0, hd, dd, 8192);
        assert_eq!(
            fatal_before_init(cfg(false, false), &b),
            (fes::INVALID_HEADER_FIELD, 11)
        );
    }
}

#[test]
fn h_ic_06_declined_digest_is_off_both_ways() {
    for (hd, dd) in [(false, false), (true, false), (false, true)] {
        let (mut host, mut ctrl, now) = fresh(cfg(true, true));
        host.handle_bytes(now, &ic_resp(0, hd, dd, 8192));
        assert!(host.is_ready());
        let n = host.negotiated().expect("negotiated");
        assert_eq!((n.hdr_digest, n.data_digest), (hd, dd));
        ctrl.rx.set_initialized(hd, dd, 0, 1 << 24);
        ctrl.tx = TxParams {
            hdgst: hd,
            ddgst: dd,
            pda: 0,
        };
        let cid = write(&mut host, now, 512);
        let raw = raw_out(&mut host);
        let want = if hd { flags::HDGSTF } else { 0 } | if dd { flags::DDGSTF } else { 0 };
        assert_eq!(raw[1], want, "CapsuleCmd flags for ({hd}, {dd})");
        ctrl.rx.feed(&raw);
        ctrl.recv(&mut host);
        host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
        assert!(completion(&mut host).is_ok());
        let cid = read(&mut host, now, 512);
        ctrl.recv(&mut host);
        host.handle_bytes(now, &ctrl.c2h(cid, 0, &pattern(512), true, true));
        assert_eq!(completion(&mut host).expect("read").data, pattern(512));
    }
}

#[test]
fn h_ic_07_maxh2cdata_below_4096_or_not_dword_aligned() {
    for v in [0u32, 4, 4092, 4094, 4097, 0xffff] {
        let b = ic_resp(0, false, false, v);
        assert_eq!(
            fatal_before_init(cfg(false, false), &b),
            (fes::INVALID_HEADER_FIELD, 12),
            "MAXH2CDATA {v:#x}"
        );
    }
    // What nvmet (4 MiB) and nvmf_tgt (128 KiB by default) send, and the floor.
    for v in [4096u32, 131072, 0x40_0000, 0xffff_fffc] {
        let (host, _, _) = connect_with(cfg(false, false), 0, v);
        assert_eq!(host.negotiated().expect("negotiated").maxh2cdata_bytes, v);
    }
}

#[test]
fn h_ic_09_icresp_reserved_byte() {
    for at in [16usize, 17, 64, 127] {
        let mut b = ic_resp(0, false, false, 8192);
        b[at] = 1;
        assert_eq!(
            fatal_before_init(cfg(false, false), &b),
            (fes::INVALID_HEADER_FIELD, at as u32)
        );
    }
}

#[test]
fn h_ic_10_icresp_flags_pdo_plen() {
    let mut b = ic_resp(0, false, false, 8192);
    b[1] = flags::LAST_PDU;
    assert_eq!(
        fatal_before_init(cfg(false, false), &b),
        (fes::INVALID_HEADER_FIELD, 1)
    );
    let mut b = ic_resp(0, false, false, 8192);
    b[3] = 4;
    assert_eq!(
        fatal_before_init(cfg(false, false), &b),
        (fes::INVALID_HEADER_FIELD, 3)
    );
    for plen in [124u32, 132, 256] {
        let mut b = ic_resp(0, false, false, 8192);
        b.resize(plen.max(128) as usize, 0);
        put32(&mut b, 4, plen);
        assert_eq!(
            fatal_before_init(cfg(false, false), &b),
            (fes::INVALID_HEADER_FIELD, 4),
            "PLEN {plen}"
        );
    }
}

#[test]
fn h_ic_11_no_icresp_times_out_without_term_req() {
    let (mut host, mut ctrl, now) = fresh(cfg(false, false));
    assert_eq!(host.poll_timeout(), Some(now + Duration::from_secs(5)));
    host.handle_timeout(now + Duration::from_millis(4999));
    assert!(!host.is_closed());
    host.handle_timeout(now + Duration::from_secs(5));
    assert!(host.is_closed());
    let ev = events(&mut host);
    assert!(
        matches!(
            ev.as_slice(),
            [Event::Closed(HostError::Timeout {
                opcode: 0,
                cid: 0,
                timeout_ms: 5000
            })]
        ),
        "{ev:?}"
    );
    assert!(ctrl.recv(&mut host).is_empty());
}

// ---------------------------------------------------------------------------
// H-DATA: C2HData

#[test]
fn h_data_01_c2h_data_for_unknown_cid() {
    for wrong in [1u16, 5, 31, 32, 0xffff] {
        let (mut host, mut ctrl, now) = connect();
        let cid = read(&mut host, now, 512);
        assert_eq!(cid, 0);
        ctrl.recv(&mut host);
        let b = ctrl.c2h(wrong, 0, &pattern(512), true, true);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::INVALID_HEADER_FIELD, 8),
            "CID {wrong}"
        );
    }
}

#[test]
fn h_data_02_c2h_data_for_command_without_read_buffer() {
    for kind in 0..3 {
        let (mut host, mut ctrl, now) = connect();
        let cid = match kind {
            0 => write(&mut host, now, 512),
            1 => {
                host.set_in_capsule_max_bytes(0);
                write(&mut host, now, 512)
            }
            _ => flush(&mut host, now),
        };
        ctrl.recv(&mut host);
        let b = ctrl.c2h(cid, 0, &pattern(512), true, true);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::PDU_SEQUENCE_ERROR, 0),
            "kind {kind}"
        );
    }
}

#[test]
fn h_data_03_c2h_data_after_last_pdu() {
    let (mut host, mut ctrl, now) = connect();
    let cid = read(&mut host, now, 1024);
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.c2h(cid, 0, &pattern(512), true, false));
    assert!(!host.is_closed());
    let b = ctrl.c2h(cid, 512, &pattern(512), true, false);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::PDU_SEQUENCE_ERROR, 0)
    );
}

#[test]
fn h_data_04_c2h_data_beyond_command_length() {
    // (DATAO, DATAL) for a 4096-byte read; the range is checked before DATAO.
    for (off, len) in [
        (0u32, 8192usize),
        (4096, 4),
        (2048, 4096),
        (0xffff_ff00, 512),
    ] {
        let (mut host, mut ctrl, now) = connect();
        let cid = read(&mut host, now, 4096);
        ctrl.recv(&mut host);
        let b = ctrl.c2h(cid, off, &pattern(len), true, false);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::DATA_OUT_OF_RANGE, 0),
            "DATAO {off} DATAL {len}"
        );
    }
}

#[test]
fn h_data_05_c2h_data_offset_gap_overlap_resend() {
    // (first PDU, if any; offending PDU), as (offset, length).
    for (first, bad) in [
        (None, (512u32, 512usize)),
        (Some((0u32, 1024usize)), (512, 1024)),
        (Some((0, 1024)), (0, 1024)),
        (Some((0, 1024)), (2048, 512)),
    ] {
        let (mut host, mut ctrl, now) = connect();
        let cid = read(&mut host, now, 4096);
        ctrl.recv(&mut host);
        if let Some((o, l)) = first {
            host.handle_bytes(now, &ctrl.c2h(cid, o, &pattern(l), false, false));
            assert!(!host.is_closed());
        }
        let b = ctrl.c2h(cid, bad.0, &pattern(bad.1), false, false);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::INVALID_HEADER_FIELD, 12),
            "{first:?} then {bad:?}"
        );
    }
}

#[test]
fn h_data_06_datal_differs_from_payload() {
    for datal in [511u32, 513, 0, 0xffff_ffff] {
        let r = fatal_after_init(|c| {
            let mut b = c.c2h(0, 0, &pattern(512), true, false);
            put32(&mut b, 16, datal);
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 16), "DATAL {datal}");
    }
}

#[test]
fn h_data_07_c2h_data_without_data() {
    let r = fatal_after_init(|c| {
        let mut b = c.c2h(0, 0, &pattern(512), true, false);
        b.truncate(24);
        put32(&mut b, 4, 24);
        b
    });
    assert_eq!(r, (fes::INVALID_HEADER_FIELD, 4));
}

#[test]
fn h_data_08_pdo_before_header_end_or_misaligned() {
    for pdo in [0u8, 8, 20, 26, 30] {
        let r = fatal_after_init(|c| {
            let mut b = c.c2h(0, 0, &pattern(512), true, false);
            b[3] = pdo;
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, 3), "PDO {pdo}");
    }
}

#[test]
fn h_data_09_plen_leaves_no_data_after_pdo() {
    let r = fatal_after_init(|c| {
        let mut b = c.c2h(0, 0, &pattern(512), true, false);
        b[3] = 28;
        b.truncate(28);
        put32(&mut b, 4, 28);
        b
    });
    assert_eq!(r, (fes::INVALID_HEADER_FIELD, 4));
    // Data digests on: PDO 24, PLEN 28 is only the DDGST.
    let (mut host, mut ctrl, now) = connect_with(cfg(false, true), 0, 8192);
    let cid = read(&mut host, now, 512);
    ctrl.recv(&mut host);
    let mut b = ctrl.c2h(cid, 0, &pattern(512), true, false);
    b.truncate(28);
    put32(&mut b, 4, 28);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::INVALID_HEADER_FIELD, 4)
    );
}

#[test]
fn h_data_10_c2h_data_above_the_host_limit() {
    let mut c = cfg(false, false);
    c.c2h_data_max_bytes = 8192;
    // At the limit: accepted.
    let (mut host, mut ctrl, now) = connect_with(c.clone(), 0, 8192);
    let cid = read(&mut host, now, 8192);
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.c2h(cid, 0, &pattern(8192), true, true));
    assert_eq!(completion(&mut host).expect("read").data, pattern(8192));
    // Above it: refused from the common header alone.
    let (mut host, mut ctrl, now) = connect_with(c, 0, 8192);
    let cid = read(&mut host, now, 8192);
    ctrl.recv(&mut host);
    let b = ctrl.c2h(cid, 0, &pattern(8196), true, true);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b[..8]),
        (fes::INVALID_HEADER_FIELD, 4)
    );
}

#[test]
fn h_data_11_ddgstf_differs_from_negotiated() {
    let r = fatal_after_init(|c| {
        let mut b = c.c2h(0, 0, &pattern(512), true, false);
        b[1] |= flags::DDGSTF;
        b
    });
    assert_eq!(r, (fes::INVALID_HEADER_FIELD, 1));
    let (mut host, mut ctrl, now) = connect_with(cfg(false, true), 0, 8192);
    let cid = read(&mut host, now, 512);
    ctrl.recv(&mut host);
    let mut b = ctrl.c2h(cid, 0, &pattern(512), true, false);
    b[1] &= !flags::DDGSTF;
    b.truncate(b.len() - 4);
    let plen = b.len() as u32;
    put32(&mut b, 4, plen);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::INVALID_HEADER_FIELD, 1)
    );
}

#[test]
fn h_data_12_c2h_data_reserved_bytes() {
    for at in [10usize, 11, 20, 21, 23] {
        let r = fatal_after_init(|c| {
            let mut b = c.c2h(0, 0, &pattern(512), true, false);
            b[at] = 0x80;
            b
        });
        assert_eq!(r, (fes::INVALID_HEADER_FIELD, at as u32), "byte {at}");
    }
}

#[test]
fn h_data_13_success_without_last_pdu() {
    let r = fatal_after_init(|c| {
        let mut b = c.c2h(0, 0, &pattern(512), true, true);
        b[1] &= !flags::LAST_PDU;
        assert_eq!(b[1] & flags::SUCCESS, flags::SUCCESS);
        b
    });
    assert_eq!(r, (fes::INVALID_HEADER_FIELD, 1));
}

#[test]
fn h_data_14_success_completes_with_synthesized_cqe() {
    let (mut host, mut ctrl, now) = connect();
    let cid = read(&mut host, now, 4096);
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.c2h(cid, 0, &pattern(4096), true, true));
    let c = completion(&mut host).expect("read");
    assert_eq!(c.data, pattern(4096));
    assert_eq!(
        (c.cqe.cid, c.cqe.sqid, c.cqe.result, c.cqe.dw1, c.cqe.sqhd),
        (cid, QID, 0, 0, 0)
    );
    assert!(c.cqe.status().is_success());
    assert_eq!(host.in_flight(), 0, "no CapsuleResp is awaited");
    carries_on(&mut host, &mut ctrl, now);
}

#[test]
fn h_data_15_success_with_short_data() {
    let (mut host, mut ctrl, now) = connect();
    let cid = read(&mut host, now, 1024);
    ctrl.recv(&mut host);
    let b = ctrl.c2h(cid, 0, &pattern(512), true, true);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::PDU_SEQUENCE_ERROR, 0)
    );
}

#[test]
fn h_data_17_last_with_short_data_then_capsule_resp() {
    let (mut host, mut ctrl, now) = connect();
    let cid = read(&mut host, now, 1024);
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.c2h(cid, 0, &pattern(512), true, false));
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    match completion(&mut host) {
        Err(HostError::Transport(m)) => assert!(m.contains("512 of 1024"), "{m}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
    carries_on(&mut host, &mut ctrl, now);
}

#[test]
fn h_data_18_all_data_without_last_then_capsule_resp() {
    let (mut host, mut ctrl, now) = connect();
    let cid = read(&mut host, now, 1024);
    ctrl.recv(&mut host);
    let d = pattern(1024);
    host.handle_bytes(now, &ctrl.c2h(cid, 0, &d[..512], false, false));
    host.handle_bytes(now, &ctrl.c2h(cid, 512, &d[512..], false, false));
    assert!(events(&mut host).is_empty());
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    assert_eq!(completion(&mut host).expect("read").data, d);
    carries_on(&mut host, &mut ctrl, now);
}

#[test]
fn h_data_19_data_digest_error_fails_only_the_command() {
    for success in [true, false] {
        let (mut host, mut ctrl, now) = connect_with(cfg(true, true), 0, 8192);
        let cid = read(&mut host, now, 512);
        ctrl.recv(&mut host);
        let mut b = ctrl.c2h(cid, 0, &pattern(512), true, success);
        let n = b.len();
        b[n - 1] ^= 0xff;
        host.handle_bytes(now, &b);
        if !success {
            host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
        }
        assert!(matches!(completion(&mut host), Err(HostError::DataDigest { cid: c }) if c == cid));
        assert!(ctrl.recv(&mut host).is_empty(), "no TermReq");
        carries_on(&mut host, &mut ctrl, now);
    }
}

#[test]
fn h_data_21_late_c2h_data_for_timed_out_command() {
    for success in [true, false] {
        let (mut host, mut ctrl, now) = connect();
        let cid = read(&mut host, now, 1024);
        ctrl.recv(&mut host);
        let later = now + Duration::from_secs(5);
        host.handle_timeout(later);
        let ev = events(&mut host);
        assert!(
            matches!(
                ev.as_slice(),
                [
                    Event::Complete {
                        result: Err(HostError::Timeout { .. }),
                        ..
                    },
                    Event::TimedOut { .. }
                ]
            ),
            "{ev:?}"
        );
        assert_eq!(host.in_flight(), 1);
        host.handle_bytes(later, &ctrl.c2h(cid, 0, &pattern(1024), true, success));
        if !success {
            host.handle_bytes(later, &ctrl.resp(cid, Status::SUCCESS));
        }
        assert!(events(&mut host).is_empty(), "reported once only");
        assert_eq!(host.in_flight(), 0, "the CID is free again");
        carries_on(&mut host, &mut ctrl, later);
    }
}

// ---------------------------------------------------------------------------
// H-R2T: R2T

/// A ready core with one solicited write of `len` bytes outstanding.
fn solicited(len: usize, maxh2cdata: u32) -> (QueuePairCore, Ctrl, Instant, u16) {
    let (mut host, mut ctrl, now) = connect_with(cfg(false, false), 0, maxh2cdata);
    host.set_in_capsule_max_bytes(0);
    let cid = write(&mut host, now, len);
    ctrl.recv(&mut host);
    (host, ctrl, now, cid)
}

/// The H2CData PDUs the host sent: (CCCID, TTAG, DATAO, DATAL, LAST) and
/// the bytes.
/// One H2CData PDU: (CCCID, TTAG, DATAO, DATAL, LAST).
type H2cPdu = (u16, u16, u32, u32, bool);

fn h2c_data(got: Vec<Got>) -> (Vec<H2cPdu>, Vec<u8>) {
    let mut v = Vec::new();
    let mut bytes = Vec::new();
    for g in got {
        match g.header {
            PduHeader::H2CData(d) => {
                v.push((d.cccid, d.ttag, d.offset, d.len, d.last));
                bytes.extend(g.data);
            }
            h => panic!("expected H2CData, got {h:?}"),
        }
    }
    (v, bytes)
}

#[test]
fn h_r2t_01_r2t_for_unknown_cid() {
    for wrong in [1u16, 31, 32, 0xffff] {
        let (mut host, mut ctrl, now, _) = solicited(4096, 8192);
        let b = ctrl.r2t(wrong, 0, 0, 4096);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::INVALID_HEADER_FIELD, 8)
        );
    }
}

#[test]
fn h_r2t_02_r2t_for_command_without_solicited_data() {
    for kind in 0..3 {
        let (mut host, mut ctrl, now) = connect();
        let cid = match kind {
            0 => read(&mut host, now, 4096),
            1 => write(&mut host, now, 4096),
            _ => flush(&mut host, now),
        };
        ctrl.recv(&mut host);
        let b = ctrl.r2t(cid, 0, 0, 4096);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::PDU_SEQUENCE_ERROR, 0),
            "kind {kind}"
        );
    }
}

#[test]
fn h_r2t_03_r2t_beyond_write_length() {
    // Range before offset: (2048, 4096) is out of range, not a wrong R2TO.
    for (off, len) in [(0u32, 4097u32), (2048, 4096), (4096, 1), (0xffff_ffff, 2)] {
        let (mut host, mut ctrl, now, cid) = solicited(4096, 8192);
        let b = ctrl.r2t(cid, 0, off, len);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::DATA_OUT_OF_RANGE, 0),
            "R2TO {off} R2TL {len}"
        );
    }
}

#[test]
fn h_r2t_04_r2to_not_where_solicited_data_ends() {
    for (first, bad) in [
        (None, (1024u32, 1024u32)),
        (Some((0u32, 4096u32)), (2048, 4096)),
        (Some((0, 4096)), (0, 4096)),
        (Some((0, 2048)), (4096, 2048)),
    ] {
        let (mut host, mut ctrl, now, cid) = solicited(8192, 8192);
        if let Some((o, l)) = first {
            host.handle_bytes(now, &ctrl.r2t(cid, 1, o, l));
            ctrl.recv(&mut host);
            assert!(!host.is_closed());
        }
        let b = ctrl.r2t(cid, 2, bad.0, bad.1);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::INVALID_HEADER_FIELD, 12),
            "{first:?} then {bad:?}"
        );
    }
}

#[test]
fn h_r2t_05_r2tl_zero() {
    let (mut host, mut ctrl, now, cid) = solicited(4096, 8192);
    let b = ctrl.r2t(cid, 0, 0, 0);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::INVALID_HEADER_FIELD, 16)
    );
}

#[test]
fn h_r2t_06_r2tl_above_maxh2cdata_is_split() {
    // nvmet: one R2T for the whole write, MAXH2CDATA 4 MiB.
    let len = (5 << 20) + 100;
    let (mut host, mut ctrl, now, cid) = solicited(len, 0x40_0000);
    host.handle_bytes(now, &ctrl.r2t(cid, 7, 0, len as u32));
    let (pdus, bytes) = h2c_data(ctrl.recv(&mut host));
    assert_eq!(
        pdus,
        vec![
            (cid, 7, 0, 0x40_0000, false),
            (cid, 7, 0x40_0000, (1 << 20) + 100, true)
        ]
    );
    assert!(bytes == pattern(len));
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    assert!(completion(&mut host).is_ok());
    // MAXH2CDATA 8 KiB, 20000 bytes.
    let (mut host, mut ctrl, now, cid) = solicited(20000, 8192);
    host.handle_bytes(now, &ctrl.r2t(cid, 1, 0, 20000));
    let (pdus, bytes) = h2c_data(ctrl.recv(&mut host));
    let lens: Vec<u32> = pdus.iter().map(|p| p.3).collect();
    assert_eq!(lens, vec![8192, 8192, 3616]);
    assert_eq!(bytes, pattern(20000));
}

#[test]
fn h_r2t_07_second_r2t_before_first_data_left() {
    let (mut host, mut ctrl, now, cid) = solicited(20000, 8192);
    let mut b = ctrl.r2t(cid, 1, 0, 10000);
    b.extend(ctrl.r2t(cid, 2, 10000, 10000));
    host.handle_bytes(now, &b);
    assert!(!host.is_closed());
    let (pdus, bytes) = h2c_data(ctrl.recv(&mut host));
    assert_eq!(
        pdus,
        vec![
            (cid, 1, 0, 8192, false),
            (cid, 1, 8192, 1808, true),
            (cid, 2, 10000, 8192, false),
            (cid, 2, 18192, 1808, true),
        ]
    );
    assert_eq!(bytes, pattern(20000));
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    assert!(completion(&mut host).is_ok());
}

#[test]
fn h_r2t_08_any_ttag_is_echoed() {
    for ttag in [0u16, 0x7fff, 0xffff] {
        let (mut host, mut ctrl, now, cid) = solicited(4096, 8192);
        host.handle_bytes(now, &ctrl.r2t(cid, ttag, 0, 4096));
        let (pdus, _) = h2c_data(ctrl.recv(&mut host));
        assert_eq!(pdus, vec![(cid, ttag, 0, 4096, true)]);
    }
}

#[test]
fn h_r2t_09_r2t_reserved_bytes() {
    for at in [20usize, 21, 22, 23] {
        let (mut host, mut ctrl, now, cid) = solicited(4096, 8192);
        let mut b = ctrl.r2t(cid, 0, 0, 4096);
        b[at] = 1;
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::INVALID_HEADER_FIELD, at as u32)
        );
    }
}

// ---------------------------------------------------------------------------
// H-RSP: CapsuleResp

#[test]
fn h_rsp_01_capsule_resp_for_unknown_cid() {
    for wrong in [1u16, 31, 32, 0xffff] {
        let (mut host, mut ctrl, now) = connect();
        let _ = flush(&mut host, now);
        ctrl.recv(&mut host);
        let b = ctrl.resp(wrong, Status::SUCCESS);
        assert_eq!(
            expect_fatal(&mut host, &mut ctrl, now, &b),
            (fes::INVALID_HEADER_FIELD, 20),
            "CID {wrong}"
        );
    }
    // A CID that a C2HData SUCCESS already completed.
    let (mut host, mut ctrl, now) = connect();
    let cid = read(&mut host, now, 512);
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.c2h(cid, 0, &pattern(512), true, true));
    assert!(completion(&mut host).is_ok());
    let b = ctrl.resp(cid, Status::SUCCESS);
    assert_eq!(
        expect_fatal(&mut host, &mut ctrl, now, &b),
        (fes::INVALID_HEADER_FIELD, 20)
    );
}

#[test]
fn h_rsp_02_error_status_fails_only_the_command() {
    for status in [
        Status::INVALID_FIELD,
        Status::LBA_OUT_OF_RANGE,
        Status::new(0, 0x22),
        Status::new(7, 0xff),
    ] {
        let (mut host, mut ctrl, now) = connect();
        let cid = read(&mut host, now, 512);
        ctrl.recv(&mut host);
        let mut cqe = Cqe::new(cid, status);
        cqe.result = 0x1234_5678;
        host.handle_bytes(now, &ctrl.cqe(cqe));
        match completion(&mut host) {
            Err(HostError::Nvme {
                opcode,
                status: s,
                result,
            }) => assert_eq!((opcode, s, result), (io::READ, status, 0x1234_5678)),
            other => panic!("expected an NVMe error, got {other:?}"),
        }
        carries_on(&mut host, &mut ctrl, now);
    }
}

#[test]
fn h_rsp_03_p_crd_m_dnr_on_success_are_ignored() {
    // Status field (bit 0 P, 13:12 CRD, 14 M, 15 DNR) with SCT = SC = 0.
    for field in [0x0001u16, 0x1000, 0x2000, 0x3000, 0x4000, 0x8000, 0xf001] {
        let (mut host, mut ctrl, now) = connect();
        let cid = flush(&mut host, now);
        ctrl.recv(&mut host);
        let mut cqe = Cqe::new(cid, Status::SUCCESS);
        cqe.status = StatusField(field);
        host.handle_bytes(now, &ctrl.cqe(cqe));
        let c = completion(&mut host).unwrap_or_else(|e| panic!("{field:#06x}: {e}"));
        assert_eq!(c.cqe.status, StatusField(field));
        carries_on(&mut host, &mut ctrl, now);
    }
}

#[test]
fn h_rsp_04_any_sqhd_is_accepted() {
    let (mut host, mut ctrl, now) = connect();
    for sqhd in [0u16, 0xffff, 1, 31, 0, 0x8000] {
        let cid = flush(&mut host, now);
        ctrl.recv(&mut host);
        let mut cqe = Cqe::new(cid, Status::SUCCESS);
        cqe.sqhd = sqhd;
        host.handle_bytes(now, &ctrl.cqe(cqe));
        assert_eq!(completion(&mut host).expect("flush").cqe.sqhd, sqhd);
    }
    assert!(!host.is_closed());
}

#[test]
fn h_rsp_05_any_sqid_is_accepted() {
    let (mut host, mut ctrl, now) = connect();
    for sqid in [0u16, QID + 1, 0xffff] {
        let cid = read(&mut host, now, 512);
        ctrl.recv(&mut host);
        host.handle_bytes(now, &ctrl.c2h(cid, 0, &pattern(512), true, false));
        let mut cqe = Cqe::new(cid, Status::SUCCESS);
        cqe.sqid = sqid;
        host.handle_bytes(now, &ctrl.cqe(cqe));
        assert_eq!(completion(&mut host).expect("read").data, pattern(512));
    }
    assert!(!host.is_closed());
}

#[test]
fn h_rsp_06_success_before_read_data() {
    let (mut host, mut ctrl, now) = connect();
    let cid = read(&mut host, now, 4096);
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    match completion(&mut host) {
        Err(HostError::Transport(m)) => assert!(m.contains("before its data"), "{m}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert_eq!(host.in_flight(), 0);
    carries_on(&mut host, &mut ctrl, now);
    // A zero-length read needs no data.
    let cid = read(&mut host, now, 0);
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    assert!(completion(&mut host).is_ok());
}

#[test]
fn h_rsp_07_success_before_solicited_write_data() {
    let (mut host, mut ctrl, now, cid) = solicited(20000, 8192);
    host.handle_bytes(now, &ctrl.r2t(cid, 1, 0, 10000));
    ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.resp(cid, Status::SUCCESS));
    match completion(&mut host) {
        Err(HostError::Transport(m)) => assert!(m.contains("10000 of 20000"), "{m}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
    carries_on(&mut host, &mut ctrl, now);
}

// ---------------------------------------------------------------------------
// A scripted controller on loopback for the Connect, keep alive and
// authentication rows.

const SUBNQN: &str = "nqn.2024-01.io.sluice:scripted";

/// How the scripted controller behaves.
#[derive(Debug, Clone)]
struct Script {
    admin_cntlid: u16,
    /// CNTLID in I/O Connect responses (default: the one the host sent).
    io_cntlid: Option<u16>,
    /// Bits OR'ed into the admin / I/O Connect response DW0 (ATR, ASCR).
    admin_connect_bits: u32,
    io_connect_bits: u32,
    /// Refuse every Connect with this status and DW0.
    connect_refusal: Option<(Status, u32)>,
    /// Refuse an I/O Connect that asks to disable SQ flow control, on
    /// QIDs from the third field on, with this status and DW0.
    sq_flow_refusal: Option<(Status, u32, u16)>,
    /// CSTS to report (default: RDY follows CC.EN).
    csts: Option<u32>,
    keep_alive_status: Status,
    /// Never answer a Flush.
    ignore_flush: bool,
    /// As SPDK nvmf_tgt v22.01..v26.05: C2HData SUCCESS on every successful
    /// read (no CapsuleResp), SQID 0 in every CQE.
    spdk_release: bool,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            admin_cntlid: 1,
            io_cntlid: None,
            admin_connect_bits: 0,
            io_connect_bits: 0,
            connect_refusal: None,
            sq_flow_refusal: None,
            csts: None,
            keep_alive_status: Status::SUCCESS,
            ignore_flush: false,
            spdk_release: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeenConnect {
    qid: u16,
    cattr: u8,
    kato_ms: u32,
    /// CNTLID in the Connect data.
    cntlid: u16,
}

/// What the scripted controller saw.
#[derive(Debug, Default)]
struct Seen {
    connects: Mutex<Vec<SeenConnect>>,
    keep_alives: AtomicU64,
    /// CDW10 of each Abort.
    aborts: Mutex<Vec<u32>>,
    /// (QID, CID) of commands left unanswered.
    ignored: Mutex<Vec<(u16, u16)>>,
    /// SQHD of every CQE sent on I/O queues.
    io_sqhds: Mutex<Vec<u16>>,
}

struct Scripted {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
}

impl Scripted {
    fn start(script: Script) -> Scripted {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Seen::default());
        let (st, se) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                if st.load(Ordering::Acquire) {
                    break;
                }
                let Ok(s) = s else { continue };
                let (st, se, sc) = (st.clone(), se.clone(), script.clone());
                std::thread::spawn(move || {
                    let _ = serve(s, &sc, &se, &st);
                });
            }
        });
        Scripted { addr, stop, seen }
    }

    /// Closes every connection without a TermReq (nvmet on KATO expiry).
    fn drop_connections(&self) {
        self.stop.store(true, Ordering::Release);
    }

    fn connects(&self) -> Vec<SeenConnect> {
        self.seen.connects.lock().unwrap().clone()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

fn serve(mut s: TcpStream, sc: &Script, seen: &Seen, stop: &AtomicBool) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_millis(20)))?;
    let mut rx = Framer::new(Direction::HostToController, 1 << 20);
    let mut q = ScriptedQueue {
        sc,
        seen,
        tx: TxParams::default(),
        qid: 0,
        sqsize: 0,
        sqhd: 0,
        cc: 0,
        out: Vec::new(),
    };
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let n = match s.read(rx.read_buf()) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        rx.advance(n);
        loop {
            let (header, data) = match rx.next_pdu() {
                Ok(Some(p)) => (p.header.clone(), p.data.to_vec()),
                Ok(None) => break,
                Err(_) => return Ok(()),
            };
            match header {
                PduHeader::IcReq(r) => {
                    let resp = IcResp {
                        pfv: 0,
                        cpda: 0,
                        hdgst: r.hdgst,
                        ddgst: r.ddgst,
                        maxh2cdata: 131072,
                    };
                    encode_pdu(
                        &PduHeader::IcResp(resp),
                        &[],
                        &TxParams::default(),
                        &mut q.out,
                    );
                    q.tx = TxParams {
                        hdgst: r.hdgst,
                        ddgst: r.ddgst,
                        pda: 0,
                    };
                    rx.set_initialized(r.hdgst, r.ddgst, 0, 1 << 20);
                }
                PduHeader::CapsuleCmd(sqe) => q.command(sqe, &data),
                _ => return Ok(()),
            }
        }
        if !q.out.is_empty() {
            s.write_all(&q.out)?;
            q.out.clear();
        }
    }
}

struct ScriptedQueue<'a> {
    sc: &'a Script,
    seen: &'a Seen,
    tx: TxParams,
    qid: u16,
    sqsize: u16,
    sqhd: u16,
    cc: u32,
    out: Vec<u8>,
}

impl ScriptedQueue<'_> {
    /// A CQE; SQHD advances as the reference targets count it.
    fn cqe(&mut self, cid: u16, status: Status, result: u64) -> Cqe {
        self.sqhd = (self.sqhd + 1) % (self.sqsize.saturating_add(1)).max(1);
        if self.qid != 0 {
            self.seen.io_sqhds.lock().unwrap().push(self.sqhd);
        }
        let mut c = Cqe::new(cid, status);
        c.result = result as u32;
        c.dw1 = (result >> 32) as u32;
        c.sqhd = self.sqhd;
        c.sqid = if self.sc.spdk_release { 0 } else { self.qid };
        c
    }

    fn resp(&mut self, cid: u16, status: Status, result: u64) {
        let c = self.cqe(cid, status, result);
        encode_pdu(&PduHeader::CapsuleResp(c), &[], &self.tx, &mut self.out);
    }

    /// One C2HData with LAST (nvmet and nvmf_tgt master), then a
    /// CapsuleResp, or SUCCESS and no CapsuleResp (nvmf_tgt releases).
    fn data(&mut self, cid: u16, d: &[u8]) {
        let success = self.sc.spdk_release;
        let h = DataHeader {
            cccid: cid,
            ttag: 0,
            offset: 0,
            len: d.len() as u32,
            last: true,
            success,
        };
        encode_pdu(&PduHeader::C2HData(h), d, &self.tx, &mut self.out);
        if success {
            let _ = self.cqe(cid, Status::SUCCESS, 0);
        } else {
            self.resp(cid, Status::SUCCESS, 0);
        }
    }

    fn command(&mut self, sqe: Sqe, data: &[u8]) {
        if sqe.opcode() == admin::FABRICS {
            return self.fabrics(sqe, data);
        }
        if self.qid == 0 {
            self.admin(sqe);
        } else {
            self.io(sqe);
        }
    }

    fn fabrics(&mut self, sqe: Sqe, data: &[u8]) {
        let cid = sqe.cid();
        match sqe.fctype() {
            fctype::CONNECT => {
                let c = ConnectCommand::parse(&sqe);
                let sent = ConnectData::parse(data).map(|d| d.cntlid).unwrap_or(0);
                self.seen.connects.lock().unwrap().push(SeenConnect {
                    qid: c.qid,
                    cattr: c.cattr,
                    kato_ms: c.kato_ms,
                    cntlid: sent,
                });
                self.qid = c.qid;
                self.sqsize = c.sqsize;
                if let Some((st, r)) = self.sc.connect_refusal {
                    return self.resp(cid, st, r as u64);
                }
                if let Some((st, r, from_qid)) = self.sc.sq_flow_refusal {
                    if c.qid >= from_qid && c.cattr & CATTR_DISABLE_SQ_FLOW != 0 {
                        return self.resp(cid, st, r as u64);
                    }
                }
                let (cntlid, bits) = if c.qid == 0 {
                    (self.sc.admin_cntlid, self.sc.admin_connect_bits)
                } else {
                    (self.sc.io_cntlid.unwrap_or(sent), self.sc.io_connect_bits)
                };
                self.resp(cid, Status::SUCCESS, (cntlid as u32 | bits) as u64);
            }
            fctype::PROPERTY_GET => {
                let p = PropertyCommand::parse(&sqe);
                let v = match p.offset {
                    prop::CAP => Cap {
                        mqes: 1023,
                        to_500ms: 1,
                    }
                    .encode(),
                    prop::VS => VS_1_3 as u64,
                    prop::CC => self.cc as u64,
                    prop::CSTS => self.sc.csts.unwrap_or(self.cc & 1) as u64,
                    _ => return self.resp(cid, Status::INVALID_FIELD, 0),
                };
                self.resp(cid, Status::SUCCESS, v);
            }
            fctype::PROPERTY_SET => {
                let p = PropertyCommand::parse(&sqe);
                if p.offset == prop::CC {
                    self.cc = p.value as u32;
                }
                self.resp(cid, Status::SUCCESS, 0);
            }
            _ => self.resp(cid, Status::INVALID_OPCODE, 0),
        }
    }

    fn admin(&mut self, sqe: Sqe) {
        let cid = sqe.cid();
        match sqe.opcode() {
            admin::IDENTIFY => {
                let d = if sqe.cdw(10) & 0xff == cns::CONTROLLER as u32 {
                    IdentifyController {
                        serial: "SCRIPTED1".into(),
                        model: "sluice scripted controller".into(),
                        firmware: "0.1".into(),
                        mdts: 5,
                        cntlid: self.sc.admin_cntlid,
                        ver: VS_1_3,
                        cntrltype: cntrltype::IO,
                        kas: 10,
                        sqes: 0x66,
                        cqes: 0x44,
                        maxcmd: 1024,
                        nn: 1,
                        sgls: 0x0010_0001,
                        subnqn: SUBNQN.into(),
                        ioccsz: (8192 + 64) / 16,
                        iorcsz: 1,
                        ..Default::default()
                    }
                    .encode()
                } else {
                    // An empty active namespace list (and anything else).
                    vec![0; 4096]
                };
                self.data(cid, &d);
            }
            admin::SET_FEATURES => {
                let n = (sqe.cdw(11) & 0xffff) as u64;
                self.resp(cid, Status::SUCCESS, n | (n << 16));
            }
            admin::KEEP_ALIVE => {
                self.seen.keep_alives.fetch_add(1, Ordering::Relaxed);
                self.resp(cid, self.sc.keep_alive_status, 0);
            }
            admin::ABORT => {
                self.seen.aborts.lock().unwrap().push(sqe.cdw(10));
                // As nvmet: "not aborted".
                self.resp(cid, Status::SUCCESS, 1);
            }
            _ => self.resp(cid, Status::INVALID_OPCODE, 0),
        }
    }

    fn io(&mut self, sqe: Sqe) {
        let cid = sqe.cid();
        match sqe.opcode() {
            io::FLUSH if self.sc.ignore_flush => {
                self.seen.ignored.lock().unwrap().push((self.qid, cid));
            }
            io::FLUSH => self.resp(cid, Status::SUCCESS, 0),
            io::READ => {
                let n = sqe.sgl().length as usize;
                self.data(cid, &pattern(n));
            }
            _ => self.resp(cid, Status::INVALID_OPCODE, 0),
        }
    }
}

fn copts() -> ConnectOptions {
    ConnectOptions {
        hostnqn: "nqn.2024-01.io.sluice:conformance".into(),
        io_queues: 1,
        queue_depth: 16,
        command_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        reconnect: ReconnectPolicy {
            attempts_max: 0,
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn connect_scripted(t: &Scripted, o: ConnectOptions) -> Result<Controller, HostError> {
    Controller::connect(t.addr, SUBNQN, o).await
}

/// A 4096-byte read on the I/O queue.
async fn io_read(c: &Controller) -> Result<Vec<u8>, HostError> {
    c.io(Sqe::rw(io::READ, 0, 1, 0, 8, false), Payload::Read(4096))
        .await
        .map(|c| c.data)
}

// ---------------------------------------------------------------------------
// H-DATA-16 and H-RSP-04/05 against a controller that behaves like
// released nvmf_tgt.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_data_16_success_flag_without_cattr_is_accepted() {
    let t = Scripted::start(Script {
        spdk_release: true,
        ..Default::default()
    });
    let o = ConnectOptions {
        disable_sq_flow: false,
        ..copts()
    };
    let c = connect_scripted(&t, o).await.expect("connect");
    assert!(
        t.connects().iter().all(|s| s.cattr == 0),
        "CATTR 0 on every queue"
    );
    // 40 reads on a 16-entry queue: SQHD wraps, SQID is always 0.
    for _ in 0..40 {
        assert_eq!(io_read(&c).await.expect("read"), pattern(4096));
    }
    let sqhds = t.seen.io_sqhds.lock().unwrap().clone();
    assert!(
        sqhds.len() > 40 && sqhds.contains(&0) && sqhds.contains(&15),
        "{sqhds:?}"
    );
    c.disconnect(Duration::from_millis(200)).await;
}

// ---------------------------------------------------------------------------
// H-CONN: Connect, timeouts, keep alive

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_01_refused_connect_names_status_iattr_and_ipo() {
    let t = Scripted::start(Script {
        connect_refusal: Some((Status::CONNECT_INVALID_PARAMETERS, (1 << 16) | 256)),
        ..Default::default()
    });
    match connect_scripted(&t, copts()).await {
        Err(HostError::Incompatible(m)) => {
            assert!(m.contains("Connect qid 0"), "{m}");
            assert!(m.contains("Connect Invalid Parameters"), "{m}");
            assert!(m.contains("IATTR 1, IPO 256"), "{m}");
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_02_admin_cntlid_taken_as_is() {
    for cntlid in [0u16, 0x1234, 0xfffe, 0xffff] {
        let t = Scripted::start(Script {
            admin_cntlid: cntlid,
            ..Default::default()
        });
        let c = connect_scripted(&t, copts()).await.expect("connect");
        assert_eq!(c.cntlid(), cntlid);
        let seen = t.connects();
        assert_eq!(seen[0].qid, 0);
        assert_eq!(
            seen[0].cntlid, 0xffff,
            "admin Connect asks for a dynamic CNTLID"
        );
        assert_eq!((seen[1].qid, seen[1].cntlid), (1, cntlid));
        c.disconnect(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_03_io_connect_cntlid_is_ignored() {
    let t = Scripted::start(Script {
        admin_cntlid: 3,
        io_cntlid: Some(0x77),
        ..Default::default()
    });
    let c = connect_scripted(&t, copts()).await.expect("connect");
    assert_eq!(c.cntlid(), 3);
    assert_eq!(io_read(&c).await.expect("read"), pattern(4096));
    c.disconnect(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_04_io_queues_disable_sq_flow_control_unless_asked() {
    for (disable, io_cattr) in [(true, CATTR_DISABLE_SQ_FLOW), (false, 0)] {
        let t = Scripted::start(Script::default());
        let o = ConnectOptions {
            io_queues: 2,
            disable_sq_flow: disable,
            ..copts()
        };
        let c = connect_scripted(&t, o).await.expect("connect");
        let seen = t.connects();
        assert_eq!(
            seen.iter().map(|s| (s.qid, s.cattr)).collect::<Vec<_>>(),
            vec![(0, 0), (1, io_cattr), (2, io_cattr)],
            "disable_sq_flow = {disable}: the admin queue keeps SQ flow control"
        );
        assert_eq!(io_read(&c).await.expect("read"), pattern(4096));
        c.disconnect(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_04_a_refused_sq_flow_disable_connects_again_with_it() {
    let cattr_field = u32::from(connect_offset::CATTR);
    for (status, dw0) in [
        (Status::CONNECT_INVALID_PARAMETERS, cattr_field),
        (Status::INVALID_FIELD, 0),
    ] {
        let t = Scripted::start(Script {
            sq_flow_refusal: Some((status, dw0, 1)),
            ..Default::default()
        });
        let o = ConnectOptions {
            io_queues: 2,
            ..copts()
        };
        let c = connect_scripted(&t, o).await.expect("connect");
        assert_eq!(
            t.connects()
                .iter()
                .map(|s| (s.qid, s.cattr))
                .collect::<Vec<_>>(),
            vec![(0, 0), (1, CATTR_DISABLE_SQ_FLOW), (1, 0), (2, 0)],
            "{status}: queue 1 connects again without CATTR bit 2, and queue 2 does not ask"
        );
        assert_eq!(io_read(&c).await.expect("read"), pattern(4096));
        c.disconnect(Duration::from_millis(200)).await;
    }

    // A refusal naming another field (SQSIZE in the command, the host NQN
    // in the data) is not about CATTR: the connect fails with it, and the
    // queue is not connected again.
    for (dw0, says) in [
        (u32::from(connect_offset::SQSIZE), "IATTR 0, IPO 44"),
        (
            1 << 16 | u32::from(connect_data_offset::HOSTNQN),
            "IATTR 1, IPO 512",
        ),
    ] {
        let t = Scripted::start(Script {
            sq_flow_refusal: Some((Status::CONNECT_INVALID_PARAMETERS, dw0, 1)),
            ..Default::default()
        });
        match connect_scripted(&t, copts()).await {
            Err(HostError::Incompatible(m)) => assert!(m.contains(says), "{m}"),
            r => panic!("expected the refusal: {:?}", r.map(|_| ())),
        }
        assert_eq!(
            t.connects()
                .iter()
                .map(|s| (s.qid, s.cattr))
                .collect::<Vec<_>>(),
            vec![(0, 0), (1, CATTR_DISABLE_SQ_FLOW)]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_04_a_direct_queue_refused_sq_flow_disable_connects_again_with_it() {
    // The threaded queue (QID 1) is accepted; the direct queue (QID 2)
    // is refused, and connects again without asking.
    let t = Scripted::start(Script {
        sq_flow_refusal: Some((Status::INVALID_FIELD, 0, 2)),
        ..Default::default()
    });
    let o = ConnectOptions {
        direct_queues: 1,
        ..copts()
    };
    let c = connect_scripted(&t, o).await.expect("connect");
    let mut q = c.connect_direct_queue().await.expect("direct queue");
    assert_eq!(q.qid(), 2);
    assert_eq!(
        t.connects()
            .iter()
            .map(|s| (s.qid, s.cattr))
            .collect::<Vec<_>>(),
        vec![
            (0, 0),
            (1, CATTR_DISABLE_SQ_FLOW),
            (2, CATTR_DISABLE_SQ_FLOW),
            (2, 0)
        ]
    );
    let read = tokio::task::spawn_blocking(move || {
        q.submit(Sqe::rw(io::READ, 0, 1, 0, 8, false), Payload::Read(4096), 1)
            .expect("submit");
        let mut out = Vec::new();
        while out.is_empty() {
            q.poll(&mut out, Some(Duration::from_millis(5)))
                .expect("poll");
        }
        out.pop().map(|(_, r)| r.expect("read").data)
    })
    .await
    .expect("join");
    assert_eq!(read, Some(pattern(4096)));
    c.disconnect(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_05_kato_and_failed_keep_alive() {
    let t = Scripted::start(Script {
        keep_alive_status: Status::INTERNAL_ERROR,
        ..Default::default()
    });
    let o = ConnectOptions {
        kato: Duration::from_millis(200),
        ..copts()
    };
    let c = connect_scripted(&t, o).await.expect("connect");
    let seen = t.connects();
    assert_eq!(
        seen.iter().map(|s| (s.qid, s.kato_ms)).collect::<Vec<_>>(),
        vec![(0, 200), (1, 0)]
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let n = t.seen.keep_alives.load(Ordering::Relaxed);
    assert!(
        (3..=12).contains(&n),
        "{n} keep alives in 700 ms at KATO/2 = 100 ms"
    );
    // Failed keep alives were only logged.
    assert_eq!(io_read(&c).await.expect("read"), pattern(4096));
    c.disconnect(Duration::from_millis(200)).await;
    // KATO 0: no keep alive.
    let t = Scripted::start(Script::default());
    let o = ConnectOptions {
        kato: Duration::ZERO,
        ..copts()
    };
    let c = connect_scripted(&t, o).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(t.seen.keep_alives.load(Ordering::Relaxed), 0);
    assert_eq!(t.connects()[0].kato_ms, 0);
    c.disconnect(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_06_unanswered_command_times_out_aborts_then_closes() {
    let t = Scripted::start(Script {
        ignore_flush: true,
        ..Default::default()
    });
    let o = ConnectOptions {
        command_timeout: Duration::from_millis(300),
        ..copts()
    };
    let c = connect_scripted(&t, o).await.expect("connect");
    // Bounded: a host whose timer never fires fails here, not hangs.
    let e = tokio::time::timeout(
        Duration::from_secs(10),
        c.io(Sqe::new(io::FLUSH, 0, 1), Payload::None),
    )
    .await
    .expect("the command timeout fires within 10 s")
    .expect_err("no answer");
    assert!(
        matches!(
            e,
            HostError::Timeout {
                opcode: io::FLUSH,
                timeout_ms: 300,
                ..
            }
        ),
        "{e}"
    );
    let (qid, cid) = t.seen.ignored.lock().unwrap()[0];
    let deadline = Instant::now() + Duration::from_secs(2);
    while t.seen.aborts.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        t.seen.aborts.lock().unwrap().clone(),
        vec![qid as u32 | ((cid as u32) << 16)]
    );
    // No answer after a second period either: the I/O queue closes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    match io_read(&c).await {
        Err(HostError::ConnectionLost(m)) => assert!(m.contains("did not answer"), "{m}"),
        other => panic!("expected ConnectionLost, got {other:?}"),
    }
    c.disconnect(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_07_target_closes_sockets_without_term_req() {
    let t = Scripted::start(Script::default());
    let c = connect_scripted(&t, copts()).await.expect("connect");
    assert_eq!(io_read(&c).await.expect("read"), pattern(4096));
    t.drop_connections();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = io_read(&c).await.expect_err("connection gone");
    assert!(
        matches!(e, HostError::ConnectionLost(_)) && e.is_fatal_for_connection(),
        "{e}"
    );
    c.disconnect(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_conn_08_csts_cfs_or_never_ready() {
    let t = Scripted::start(Script {
        csts: Some(csts::CFS),
        ..Default::default()
    });
    match connect_scripted(&t, copts()).await {
        Err(HostError::Incompatible(m)) => assert!(m.contains("CSTS.CFS"), "{m}"),
        other => panic!("expected Incompatible, got {other:?}"),
    }
    let t = Scripted::start(Script {
        csts: Some(0),
        ..Default::default()
    });
    let started = Instant::now();
    match connect_scripted(&t, copts()).await {
        Err(HostError::Timeout {
            opcode: admin::FABRICS,
            timeout_ms: 500,
            ..
        }) => {}
        other => panic!("expected a CAP.TO timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(500));
}

// ---------------------------------------------------------------------------
// H-AUTH: Connect AUTHREQ

fn secret(seed: u8) -> Secret {
    Secret::new((0..48).map(|i| seed ^ i).collect(), Some(HashId::Sha384)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_auth_02_atr_without_secret_on_any_queue() {
    // ATR on the I/O queue only: the bit is read per queue.
    for (admin_bits, io_bits, qid) in [(CONNECT_AUTHREQ_ATR, 0, 0), (0, CONNECT_AUTHREQ_ATR, 1)] {
        let t = Scripted::start(Script {
            admin_connect_bits: admin_bits,
            io_connect_bits: io_bits,
            ..Default::default()
        });
        match connect_scripted(&t, copts()).await {
            Err(HostError::Authentication(m)) => {
                assert!(m.contains(&format!("queue {qid}")), "{m}");
                assert!(m.contains("--dhchap-secret"), "{m}");
            }
            other => panic!("expected an authentication error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_auth_03_no_atr_while_host_holds_secrets() {
    let o = ConnectOptions {
        dhchap_secret: Some(secret(1)),
        dhchap_ctrl_secret: Some(secret(2)),
        ..copts()
    };
    // Sluice's target without DH-HMAC-CHAP on the subsystem.
    let t = common::RealTarget::start();
    let c = Controller::connect(t.addr(), &t.subnqn, o.clone())
        .await
        .expect("connect without authentication");
    let ns = c.namespace(1).expect("ns");
    ns.write(0, &pattern(4096), IoFlags::default())
        .await
        .expect("write");
    assert_eq!(
        ns.read(0, 4096, IoFlags::default()).await.expect("read"),
        pattern(4096)
    );
    c.disconnect(Duration::from_millis(200)).await;
    // The scripted controller: no AUTH command is ever sent.
    let s = Scripted::start(Script::default());
    let c = connect_scripted(&s, o).await.expect("connect");
    assert_eq!(io_read(&c).await.expect("read"), pattern(4096));
    c.disconnect(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_auth_04_ascr_is_refused() {
    const ASCR: u32 = 1 << 18;
    for (admin_bits, io_bits, qid, secret_v) in [
        (ASCR, 0, 0, None),
        (ASCR | CONNECT_AUTHREQ_ATR, 0, 0, Some(secret(1))),
        (0, ASCR, 1, None),
    ] {
        let t = Scripted::start(Script {
            admin_connect_bits: admin_bits,
            io_connect_bits: io_bits,
            ..Default::default()
        });
        let o = ConnectOptions {
            dhchap_secret: secret_v,
            ..copts()
        };
        match connect_scripted(&t, o).await {
            Err(HostError::Authentication(m)) => {
                assert!(m.contains("secure channel concatenation"), "{m}");
                assert!(m.contains(&format!("queue {qid}")), "{m}");
            }
            other => panic!("expected an authentication error, got {other:?}"),
        }
    }
}
