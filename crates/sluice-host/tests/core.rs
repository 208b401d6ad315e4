//! Unit tests of the sans-IO queue-pair core against a scripted in-memory
//! controller, with virtual time.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use std::time::{Duration, Instant};

use proptest::prelude::*;
use sluice_host::core::{CoreConfig, Event, LentBuf, Payload, QueuePairCore};
use sluice_host::HostError;
use sluice_proto::command::{admin, io, sgl, Cqe, Sqe};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{encode_pdu, fes, DataHeader, Direction, IcResp, PduHeader, R2t, TxParams};
use sluice_proto::Status;

/// A scripted controller: parses what the host sends, builds what it receives.
struct FakeCtrl {
    rx: Framer,
    tx: TxParams,
}

/// A PDU the fake controller received.
#[derive(Debug)]
struct Got {
    header: PduHeader,
    data: Vec<u8>,
}

impl FakeCtrl {
    fn new() -> Self {
        FakeCtrl {
            rx: Framer::new(Direction::HostToController, 1 << 20),
            tx: TxParams::default(),
        }
    }
    /// Everything the host has to send, parsed.
    fn recv(&mut self, host: &mut QueuePairCore) -> Vec<Got> {
        let mut out = Vec::new();
        while let Some(b) = host.poll_transmit() {
            self.rx.feed(&b);
        }
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
    /// An R2T asking for `len` bytes of command `cccid` from `offset`.
    fn r2t(&self, cccid: u16, ttag: u16, offset: u32, len: u32) -> Vec<u8> {
        self.pdu(
            PduHeader::R2t(R2t {
                cccid,
                ttag,
                offset,
                len,
            }),
            &[],
        )
    }
}

fn cfg(hdgst: bool, ddgst: bool) -> CoreConfig {
    CoreConfig {
        qid: 1,
        depth: 32,
        hdr_digest: hdgst,
        data_digest: ddgst,
        in_capsule_max_bytes: 8192,
        command_timeout: Duration::from_secs(5),
        c2h_data_max_bytes: 1 << 20,
    }
}

/// Handshake: returns a ready core and its controller.
fn connect(c: CoreConfig, cpda: u8, maxh2cdata: u32) -> (QueuePairCore, FakeCtrl, Instant) {
    let now = Instant::now();
    let (hd, dd) = (c.hdr_digest, c.data_digest);
    let mut host = QueuePairCore::new(c, now);
    let mut ctrl = FakeCtrl::new();
    let got = ctrl.recv(&mut host);
    assert_eq!(got.len(), 1);
    let PduHeader::IcReq(req) = &got[0].header else {
        panic!("expected ICReq, got {:?}", got[0].header)
    };
    assert_eq!((req.pfv, req.hpda, req.maxr2t), (0, 0, 0));
    assert_eq!((req.hdgst, req.ddgst), (hd, dd));
    assert!(!host.is_ready());
    let resp = ctrl.pdu(
        PduHeader::IcResp(IcResp {
            pfv: 0,
            cpda,
            hdgst: hd,
            ddgst: dd,
            maxh2cdata,
        }),
        &[],
    );
    ctrl.rx.set_initialized(hd, dd, cpda, 1 << 20);
    ctrl.tx = TxParams {
        hdgst: hd,
        ddgst: dd,
        pda: 0,
    };
    host.handle_bytes(now, &resp);
    assert!(host.is_ready());
    (host, ctrl, now)
}

fn events(host: &mut QueuePairCore) -> Vec<Event> {
    std::iter::from_fn(|| host.poll_event()).collect()
}

fn completion(host: &mut QueuePairCore) -> (u64, Result<sluice_host::core::Completion, HostError>) {
    let ev = events(host);
    assert_eq!(ev.len(), 1, "{ev:?}");
    match ev.into_iter().next() {
        Some(Event::Complete { token, result }) => (token, result),
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn resp(ctrl: &FakeCtrl, cid: u16, status: Status) -> Vec<u8> {
    ctrl.pdu(PduHeader::CapsuleResp(Cqe::new(cid, status)), &[])
}

/// Never repeats within a transfer ([`sluice_testdata::pattern`]), so data
/// placed at the wrong offset differs.
fn pattern(n: usize) -> Vec<u8> {
    sluice_testdata::pattern(n, 7)
}

#[test]
fn handshake_sets_negotiated_params() {
    let (host, _, _) = connect(cfg(true, false), 3, 16384);
    let n = host.negotiated().expect("negotiated");
    assert!(n.hdr_digest && !n.data_digest);
    assert_eq!((n.cpda, n.maxh2cdata_bytes), (3, 16384));
}

#[test]
fn controller_enabling_unasked_digest_is_rejected() {
    let now = Instant::now();
    let mut host = QueuePairCore::new(cfg(false, false), now);
    let mut ctrl = FakeCtrl::new();
    ctrl.recv(&mut host);
    let b = ctrl.pdu(
        PduHeader::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: true,
            ddgst: false,
            maxh2cdata: 8192,
        }),
        &[],
    );
    host.handle_bytes(now, &b);
    assert!(host.is_closed());
}

#[test]
fn in_capsule_write() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let data = pattern(4096);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::WRITE, 0, 1, 10, 8, false),
            Payload::Write(data.clone()),
            77,
        )
        .expect("submit");
    let got = ctrl.recv(&mut host);
    assert_eq!(got.len(), 1);
    let PduHeader::CapsuleCmd(sqe) = &got[0].header else {
        panic!()
    };
    assert_eq!(sqe.cid(), cid);
    assert_eq!(sqe.sgl().id, sgl::DATA_BLOCK_OFFSET);
    assert_eq!(sqe.sgl().length, 4096);
    assert_eq!(sqe.flags() & 0xc0, 0x40, "PSDT must select SGLs");
    assert_eq!(got[0].data, data);
    host.handle_bytes(now, &resp(&ctrl, cid, Status::SUCCESS));
    let (token, r) = completion(&mut host);
    assert_eq!(token, 77);
    // The write's buffer comes back with its completion, for reuse.
    assert_eq!(r.expect("write completes").data, data);
    assert_eq!(host.in_flight(), 0);
}

/// `transmit_due` / `transmit_consume` give the I/O layer the same bytes
/// as `poll_transmit` (which copies every due byte, whole PDUs), in order,
/// across partial writes, without a copy (each `transmit_due` is one run:
/// attached write data is a run of its own).
#[test]
fn transmit_due_is_consumed_in_pieces() {
    let submit = |host: &mut QueuePairCore, now| {
        for (cid_token, lba) in [(1u64, 0u64), (2, 8)] {
            host.submit(
                now,
                Sqe::rw(io::WRITE, 0, 1, lba, 8, false),
                Payload::Write(pattern(4096)),
                cid_token,
            )
            .expect("submit");
        }
    };
    let (mut a, _ca, now) = connect(cfg(false, false), 0, 8192);
    let (mut b, _cb, now_b) = connect(cfg(false, false), 0, 8192);
    submit(&mut a, now);
    submit(&mut b, now_b);
    let whole = b.poll_transmit().expect("bytes due");
    assert!(
        b.poll_transmit().is_none(),
        "poll_transmit gives every due byte"
    );
    let mut got = Vec::new();
    while !a.transmit_due().is_empty() {
        // A socket that takes 1000 bytes at a time.
        let n = a.transmit_due().len().min(1000);
        got.extend_from_slice(&a.transmit_due()[..n]);
        a.transmit_consume(n);
    }
    assert_eq!(got, whole);
    assert!(a.poll_transmit().is_none());
}

/// A socket that takes at most `cap` bytes per call, across the runs of a
/// vectored write.
struct ShortWriter {
    out: Vec<u8>,
    cap: usize,
    vectored_calls: usize,
}

impl std::io::Write for ShortWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = b.len().min(self.cap);
        self.out.extend_from_slice(&b[..n]);
        Ok(n)
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.vectored_calls += 1;
        let mut n = 0;
        for b in bufs {
            let k = b.len().min(self.cap - n);
            self.out.extend_from_slice(&b[..k]);
            n += k;
            if n == self.cap {
                break;
            }
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything due, through a short vectored writer.
fn drain_vectored(host: &mut QueuePairCore, w: &mut ShortWriter) {
    while let Some(n) = host.transmit_to(w).expect("in-memory write") {
        assert!(n > 0);
    }
    assert!(host.transmit_due().is_empty());
}

/// Write data is sent from the caller's buffer (attached to its PDU, one
/// vectored write with the headers), not copied: the completion hands back
/// the very allocation submitted. In-capsule and R2T-solicited data, with
/// and without digests, through a socket that takes 1000 bytes at a time.
#[test]
fn write_data_is_sent_from_the_callers_buffer() {
    for dd in [false, true] {
        let (mut host, mut ctrl, now) = connect(cfg(dd, dd), 0, 8192);
        let small = pattern(4096);
        let large = pattern(20000);
        let (small_sent, large_sent) = (small.clone(), large.clone());
        let (small_ptr, large_ptr) = (small_sent.as_ptr(), large_sent.as_ptr());
        let c1 = host
            .submit(
                now,
                Sqe::rw(io::WRITE, 0, 1, 0, 8, false),
                Payload::Write(small_sent),
                1,
            )
            .expect("submit");
        let c2 = host
            .submit(
                now,
                Sqe::rw(io::WRITE, 0, 1, 8, 40, false),
                Payload::Write(large_sent),
                2,
            )
            .expect("submit");
        let mut w = ShortWriter {
            out: Vec::new(),
            cap: 1000,
            vectored_calls: 0,
        };
        drain_vectored(&mut host, &mut w);
        assert!(w.vectored_calls > 0, "attached data goes out by writev");
        host.handle_bytes(now, &ctrl.r2t(c2, 9, 0, 20000));
        drain_vectored(&mut host, &mut w);
        ctrl.rx.feed(&w.out);
        let mut h2c = Vec::new();
        let mut capsules = 0;
        while let Some(p) = ctrl.rx.next_pdu().expect("valid PDUs") {
            assert!(p.data_digest_ok);
            match &p.header {
                PduHeader::CapsuleCmd(sqe) if sqe.cid() == c1 => {
                    capsules += 1;
                    assert_eq!(p.data, &small[..], "in-capsule data");
                }
                PduHeader::CapsuleCmd(_) => {
                    capsules += 1;
                    assert!(p.data.is_empty());
                }
                PduHeader::H2CData(d) => {
                    assert_eq!(d.offset as usize, h2c.len());
                    h2c.extend_from_slice(p.data);
                }
                h => panic!("unexpected {h:?}"),
            }
        }
        assert_eq!((capsules, h2c), (2, large.clone()));
        host.handle_bytes(now, &resp(&ctrl, c1, Status::SUCCESS));
        host.handle_bytes(now, &resp(&ctrl, c2, Status::SUCCESS));
        let mut back = events(&mut host)
            .into_iter()
            .map(|e| match e {
                Event::Complete { token, result } => (token, result.expect("write completes").data),
                e => panic!("{e:?}"),
            })
            .collect::<Vec<_>>();
        back.sort_by_key(|b| b.0);
        assert_eq!(back[0].1, small);
        assert_eq!(back[1].1, large);
        assert_eq!(back[0].1.as_ptr(), small_ptr, "in-capsule data was copied");
        assert_eq!(back[1].1.as_ptr(), large_ptr, "solicited data was copied");
    }
}

/// A controller that completes a write before its data went out (a broken
/// or hostile peer) still gets the right bytes later, and the completion
/// hands back a copy with the caller's data, not a buffer still in use.
#[test]
fn a_write_completed_before_its_data_was_sent_keeps_both() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 65536);
    let data = pattern(20000);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::WRITE, 0, 1, 0, 40, false),
            Payload::Write(data.clone()),
            1,
        )
        .expect("submit");
    let _capsule = ctrl.recv(&mut host);
    host.handle_bytes(now, &ctrl.r2t(cid, 3, 0, 20000));
    // Completed while the H2CData is still due.
    host.handle_bytes(now, &resp(&ctrl, cid, Status::SUCCESS));
    let (_, r) = completion(&mut host);
    assert_eq!(r.expect("completes").data, data);
    let got = ctrl.recv(&mut host);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data, data, "the queued data is intact");
}

fn r2t_write(hd: bool, dd: bool, cpda: u8) {
    let (mut host, mut ctrl, now) = connect(cfg(hd, dd), cpda, 4096);
    let data = pattern(20000);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::WRITE, 0, 1, 0, 40, false),
            Payload::Write(data.clone()),
            1,
        )
        .expect("submit");
    let got = ctrl.recv(&mut host);
    let PduHeader::CapsuleCmd(sqe) = &got[0].header else {
        panic!()
    };
    assert!(got[0].data.is_empty(), "large write must not go in-capsule");
    assert_eq!(sqe.sgl().id, sgl::TRANSPORT_DATA_BLOCK);
    assert_eq!(sqe.sgl().length, 20000);
    // Two R2Ts: 0..10000 and 10000..20000.
    let mut received = Vec::new();
    for (ttag, off, len) in [(5u16, 0u32, 10000u32), (6, 10000, 10000)] {
        let b = ctrl.r2t(cid, ttag, off, len);
        host.handle_bytes(now, &b);
        let got = ctrl.recv(&mut host);
        let mut expect = off;
        let lens: Vec<u32> = got
            .iter()
            .map(|g| match &g.header {
                PduHeader::H2CData(d) => {
                    assert_eq!((d.cccid, d.ttag), (cid, ttag));
                    assert_eq!(d.offset, expect);
                    expect += d.len;
                    d.len
                }
                h => panic!("expected H2CData, got {h:?}"),
            })
            .collect();
        assert_eq!(lens, vec![4096, 4096, 1808], "split by MAXH2CDATA");
        let lasts: Vec<bool> = got
            .iter()
            .map(|g| matches!(&g.header, PduHeader::H2CData(d) if d.last))
            .collect();
        assert_eq!(lasts, vec![false, false, true]);
        for g in got {
            received.extend_from_slice(&g.data);
        }
    }
    assert_eq!(received, data);
    host.handle_bytes(now, &resp(&ctrl, cid, Status::SUCCESS));
    assert_eq!(completion(&mut host).1.expect("write completes").data, data);
}

#[test]
fn r2t_write_split_by_maxh2cdata() {
    r2t_write(false, false, 0);
}

#[test]
fn r2t_write_with_digests_and_cpda() {
    r2t_write(true, true, 3);
}

fn read(hd: bool, dd: bool, success_flag: bool) {
    let (mut host, mut ctrl, now) = connect(cfg(hd, dd), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 16, false),
            Payload::Read(8192),
            9,
        )
        .expect("submit");
    let got = ctrl.recv(&mut host);
    let PduHeader::CapsuleCmd(sqe) = &got[0].header else {
        panic!()
    };
    assert_eq!(sqe.sgl().id, sgl::TRANSPORT_DATA_BLOCK);
    assert_eq!(sqe.sgl().length, 8192);
    let data = pattern(8192);
    let mut b = Vec::new();
    for (i, chunk) in data.chunks(3000).enumerate() {
        let last = (i + 1) * 3000 >= 8192;
        b.extend(ctrl.pdu(
            PduHeader::C2HData(DataHeader {
                cccid: cid,
                ttag: 0,
                offset: (i * 3000) as u32,
                len: chunk.len() as u32,
                last,
                success: last && success_flag,
            }),
            chunk,
        ));
    }
    if !success_flag {
        b.extend(resp(&ctrl, cid, Status::SUCCESS));
    }
    // Deliver byte by byte to exercise reassembly.
    for byte in &b {
        host.handle_bytes(now, std::slice::from_ref(byte));
    }
    let (token, r) = completion(&mut host);
    assert_eq!(token, 9);
    assert_eq!(r.expect("read ok").data, data);
    assert_eq!(host.in_flight(), 0);
}

#[test]
fn read_with_success_flag() {
    read(false, false, true);
}

#[test]
fn read_with_capsule_resp() {
    read(false, false, false);
}

#[test]
fn read_with_digests() {
    read(true, true, true);
    read(true, true, false);
}

#[test]
fn data_digest_error_fails_only_the_command() {
    let (mut host, ctrl, now) = connect(cfg(false, true), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 1, false),
            Payload::Read(512),
            1,
        )
        .expect("submit");
    let mut b = ctrl.pdu(
        PduHeader::C2HData(DataHeader {
            cccid: cid,
            ttag: 0,
            offset: 0,
            len: 512,
            last: true,
            success: true,
        }),
        &pattern(512),
    );
    let n = b.len();
    b[n - 1] ^= 0xff; // corrupt DDGST
    host.handle_bytes(now, &b);
    let (_, r) = completion(&mut host);
    assert!(matches!(r, Err(HostError::DataDigest { .. })), "{r:?}");
    assert!(!host.is_closed());
}

#[test]
fn nvme_error_status_is_reported_with_name() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 1 << 40, 1, false),
            Payload::Read(512),
            1,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    host.handle_bytes(now, &resp(&ctrl, cid, Status::LBA_OUT_OF_RANGE));
    let (_, r) = completion(&mut host);
    let e = r.expect_err("must fail");
    assert_eq!(e.status(), Some(Status::LBA_OUT_OF_RANGE));
    assert!(e.to_string().contains("LBA Out of Range"), "{e}");
}

/// Reads the H2CTermReq the host sent, if any.
fn term_req(ctrl: &mut FakeCtrl, host: &mut QueuePairCore) -> Option<u16> {
    ctrl.recv(host).into_iter().find_map(|g| match g.header {
        PduHeader::H2CTermReq(t) => Some(t.fes),
        _ => None,
    })
}

#[test]
fn unknown_cid_is_fatal() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let cid = host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 5)
        .expect("submit");
    ctrl.recv(&mut host);
    host.handle_bytes(now, &resp(&ctrl, cid + 1, Status::SUCCESS));
    assert!(host.is_closed());
    let ev = events(&mut host);
    assert!(
        matches!(
            ev[0],
            Event::Complete {
                token: 5,
                result: Err(HostError::Protocol(_))
            }
        ),
        "{ev:?}"
    );
    assert!(matches!(ev.last(), Some(Event::Closed(_))));
    assert_eq!(
        term_req(&mut ctrl, &mut host),
        Some(fes::INVALID_HEADER_FIELD)
    );
    // Closed: further input is ignored, submissions refused.
    host.handle_bytes(now, &resp(&ctrl, cid, Status::SUCCESS));
    assert!(host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 6)
        .is_err());
}

/// A slot that serves a new command gives it a new CID (the slot's next
/// generation): a response repeated for the command that held the slot
/// before, or an R2T for it, is refused and never completes or feeds the
/// new command. Sixteen generations, then the CID comes back.
#[test]
fn a_reused_slot_gets_a_cid_of_its_own() {
    let (mut host, mut ctrl, now) = connect(c_depth(1), 0, 8192);
    let mut cids = Vec::new();
    for token in 0..17u64 {
        let cid = host
            .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, token)
            .expect("submit");
        ctrl.recv(&mut host);
        host.handle_bytes(now, &resp(&ctrl, cid, Status::SUCCESS));
        let (t, r) = completion(&mut host);
        assert_eq!(t, token);
        assert_eq!(r.expect("flush").cqe.cid, cid);
        cids.push(cid);
    }
    let distinct: std::collections::BTreeSet<u16> = cids[..16].iter().copied().collect();
    assert_eq!(distinct.len(), 16, "{cids:04x?}");
    assert!(
        cids.iter().all(|c| c & 0x0fff == 0),
        "one slot: {cids:04x?}"
    );
    assert_eq!(cids[16], cids[0], "the generations wrap");

    // A repeated response for the last command, while its slot holds a write.
    let old = cids[16];
    let new = host
        .submit(
            now,
            Sqe::rw(io::WRITE, 0, 1, 0, 4, false),
            Payload::Write(pattern(16384)),
            100,
        )
        .expect("submit");
    assert_ne!(new, old);
    ctrl.recv(&mut host);
    // An R2T for the old CID is refused: no data goes out for it.
    host.handle_bytes(now, &ctrl.r2t(old, 0, 0, 16384));
    assert!(host.is_closed());
    let got = ctrl.recv(&mut host);
    assert!(
        !got.iter()
            .any(|g| matches!(g.header, PduHeader::H2CData(_))),
        "{got:?}"
    );
    assert!(got.iter().any(
        |g| matches!(&g.header, PduHeader::H2CTermReq(t) if t.fes == fes::INVALID_HEADER_FIELD)
    ));
    assert!(matches!(
        completion_or_closed(&mut host),
        (100, Err(HostError::Protocol(_)))
    ));

    // And a repeated CapsuleResp does not complete the new command.
    let (mut host, mut ctrl, now) = connect(c_depth(1), 0, 8192);
    let a = host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 1)
        .expect("submit");
    ctrl.recv(&mut host);
    host.handle_bytes(now, &resp(&ctrl, a, Status::SUCCESS));
    assert_eq!(completion(&mut host).0, 1);
    let b = host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 2)
        .expect("submit");
    ctrl.recv(&mut host);
    host.handle_bytes(now, &resp(&ctrl, a, Status::SUCCESS));
    assert!(host.is_closed());
    assert!(
        matches!(
            completion_or_closed(&mut host),
            (2, Err(HostError::Protocol(_)))
        ),
        "the repeated response for CID {a:#06x} completed CID {b:#06x}"
    );
}

fn c_depth(depth: u16) -> CoreConfig {
    CoreConfig {
        depth,
        ..cfg(false, false)
    }
}

/// The first completion among the events (a closed connection adds a
/// `Closed` event after it).
fn completion_or_closed(
    host: &mut QueuePairCore,
) -> (u64, Result<sluice_host::core::Completion, HostError>) {
    events(host)
        .into_iter()
        .find_map(|e| match e {
            Event::Complete { token, result } => Some((token, result)),
            _ => None,
        })
        .expect("a completion")
}

#[test]
fn c2h_data_for_wrong_cid_is_fatal() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 1, false),
            Payload::Read(512),
            1,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    let b = ctrl.pdu(
        PduHeader::C2HData(DataHeader {
            cccid: cid + 3,
            ttag: 0,
            offset: 0,
            len: 512,
            last: true,
            success: true,
        }),
        &pattern(512),
    );
    host.handle_bytes(now, &b);
    assert!(host.is_closed());
    assert_eq!(
        term_req(&mut ctrl, &mut host),
        Some(fes::INVALID_HEADER_FIELD)
    );
}

#[test]
fn data_beyond_length_is_out_of_range() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 8, false),
            Payload::Read(4096),
            1,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    let b = ctrl.pdu(
        PduHeader::C2HData(DataHeader {
            cccid: cid,
            ttag: 0,
            offset: 0,
            len: 8192,
            last: true,
            success: true,
        }),
        &pattern(8192),
    );
    host.handle_bytes(now, &b);
    assert!(host.is_closed());
    let ev = events(&mut host);
    assert!(
        matches!(&ev[0], Event::Complete { result: Err(HostError::Protocol(e)), .. } if e.fes() == fes::DATA_OUT_OF_RANGE),
        "{ev:?}"
    );
    assert_eq!(term_req(&mut ctrl, &mut host), Some(fes::DATA_OUT_OF_RANGE));
}

#[test]
fn r2t_beyond_length_is_out_of_range() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    host.set_in_capsule_max_bytes(0);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::WRITE, 0, 1, 0, 8, false),
            Payload::Write(pattern(4096)),
            1,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    let b = ctrl.r2t(cid, 1, 2048, 4096);
    host.handle_bytes(now, &b);
    assert!(host.is_closed());
    assert_eq!(term_req(&mut ctrl, &mut host), Some(fes::DATA_OUT_OF_RANGE));
}

#[test]
fn wrong_c2h_offset_is_fatal() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 8, false),
            Payload::Read(4096),
            1,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    let b = ctrl.pdu(
        PduHeader::C2HData(DataHeader {
            cccid: cid,
            ttag: 0,
            offset: 512,
            len: 512,
            last: false,
            success: false,
        }),
        &pattern(512),
    );
    host.handle_bytes(now, &b);
    assert!(host.is_closed());
    assert_eq!(
        term_req(&mut ctrl, &mut host),
        Some(fes::INVALID_HEADER_FIELD)
    );
}

#[test]
fn c2h_term_req_closes_without_reply() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    host.submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 1)
        .expect("submit");
    ctrl.recv(&mut host);
    let tr = sluice_proto::pdu::TermReq {
        fes: 2,
        fei: 0,
        data: vec![],
    };
    let b = ctrl.pdu(PduHeader::C2HTermReq(tr), &[]);
    host.handle_bytes(now, &b);
    assert!(host.is_closed());
    let ev = events(&mut host);
    assert!(matches!(
        &ev[0],
        Event::Complete {
            result: Err(HostError::TerminatedByController { fes: 2, .. }),
            ..
        }
    ));
    assert_eq!(term_req(&mut ctrl, &mut host), None);
}

#[test]
fn timeout_fails_command_then_late_completion_frees_cid() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let cid = host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 42)
        .expect("submit");
    ctrl.recv(&mut host);
    assert_eq!(host.poll_timeout(), Some(now + Duration::from_secs(5)));
    host.handle_timeout(now + Duration::from_secs(4));
    assert!(events(&mut host).is_empty());
    host.handle_timeout(now + Duration::from_secs(5));
    let ev = events(&mut host);
    assert!(
        matches!(
            &ev[0],
            Event::Complete {
                token: 42,
                result: Err(HostError::Timeout { .. })
            }
        ),
        "{ev:?}"
    );
    assert!(matches!(&ev[1], Event::TimedOut { cid: c, .. } if *c == cid));
    assert_eq!(host.in_flight(), 1, "CID stays reserved");
    host.handle_bytes(
        now + Duration::from_secs(6),
        &resp(&ctrl, cid, Status::SUCCESS),
    );
    assert!(
        events(&mut host).is_empty(),
        "late completion is not reported twice"
    );
    assert_eq!(host.in_flight(), 0);
}

/// An Asynchronous Event Request on the admin queue is held by the
/// controller until it has an event: it never times out, is not counted in
/// flight (a queue shutting down does not wait for it), and completes with
/// the event's DW0; another admin command beside it times out as usual. On
/// an I/O queue the same opcode is an ordinary command.
#[test]
fn an_async_event_request_is_held_without_a_deadline() {
    let mut c = cfg(false, false);
    c.qid = 0;
    let (mut host, mut ctrl, now) = connect(c, 0, 8192);
    let aer = host
        .submit(
            now,
            Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0),
            Payload::None,
            7,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    assert_eq!(host.in_flight(), 0, "a held request is not in flight");
    assert_eq!(host.poll_timeout(), None, "no deadline");
    host.handle_timeout(now + Duration::from_secs(3600));
    assert!(events(&mut host).is_empty() && !host.is_closed());
    let later = now + Duration::from_secs(3600);
    let ka = host
        .submit(later, Sqe::new(admin::KEEP_ALIVE, 0, 0), Payload::None, 8)
        .expect("submit");
    ctrl.recv(&mut host);
    assert_eq!(host.in_flight(), 1);
    assert_eq!(host.poll_timeout(), Some(later + Duration::from_secs(5)));
    let mut cqe = Cqe::new(aer, Status::SUCCESS);
    cqe.result = 0x0004_0002;
    host.handle_bytes(later, &ctrl.pdu(PduHeader::CapsuleResp(cqe), &[]));
    match completion(&mut host) {
        (7, Ok(c)) => assert_eq!(c.cqe.result, 0x0004_0002),
        other => panic!("{other:?}"),
    }
    host.handle_timeout(later + Duration::from_secs(5));
    let ev = events(&mut host);
    assert!(
        matches!(
            &ev[0],
            Event::Complete {
                token: 8,
                result: Err(HostError::Timeout { .. })
            }
        ),
        "{ev:?}"
    );
    host.handle_bytes(later, &resp(&ctrl, ka, Status::SUCCESS));
    assert_eq!(host.in_flight(), 0);

    // On an I/O queue it is an ordinary command (and would time out).
    let (mut io_host, _ctrl, now) = connect(cfg(false, false), 0, 8192);
    io_host
        .submit(
            now,
            Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0),
            Payload::None,
            9,
        )
        .expect("submit");
    assert_eq!(io_host.in_flight(), 1);
    assert_eq!(io_host.poll_timeout(), Some(now + Duration::from_secs(5)));
}

#[test]
fn unanswered_timed_out_command_closes_connection() {
    let (mut host, _ctrl, now) = connect(cfg(false, false), 0, 8192);
    host.submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 1)
        .expect("submit");
    host.handle_timeout(now + Duration::from_secs(5));
    host.handle_timeout(now + Duration::from_secs(10));
    assert!(host.is_closed());
}

#[test]
fn icresp_timeout() {
    let now = Instant::now();
    let mut host = QueuePairCore::new(cfg(false, false), now);
    host.handle_timeout(now + Duration::from_secs(6));
    assert!(host.is_closed());
}

#[test]
fn queue_full_is_refused() {
    let mut c = cfg(false, false);
    c.depth = 2;
    let (mut host, _ctrl, now) = connect(c, 0, 8192);
    for t in 0..2 {
        host.submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, t)
            .expect("submit");
    }
    assert!(!host.can_submit());
    assert!(host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 3)
        .is_err());
}

/// The C2HData PDUs of one read of `data`, `pdu_bytes` each.
fn c2h_pdus(ctrl: &FakeCtrl, cid: u16, data: &[u8], pdu_bytes: usize, success: bool) -> Vec<u8> {
    let mut b = Vec::new();
    let n = data.chunks(pdu_bytes).count();
    for (i, chunk) in data.chunks(pdu_bytes).enumerate() {
        let last = i + 1 == n;
        b.extend(ctrl.pdu(
            PduHeader::C2HData(DataHeader {
                cccid: cid,
                ttag: 0,
                offset: (i * pdu_bytes) as u32,
                len: chunk.len() as u32,
                last,
                success: last && success,
            }),
            chunk,
        ));
    }
    if !success {
        b.extend(resp(ctrl, cid, Status::SUCCESS));
    }
    b
}

/// Lends the first `len` bytes of `mem` (the test touches `mem` again
/// only once the queue handed the command's completion out).
fn lend(mem: &mut [u8], len: usize) -> LentBuf {
    assert!(len <= mem.len());
    let at = std::ptr::NonNull::new(mem.as_mut_ptr()).expect("a live slice");
    // SAFETY: every test that lends `mem` reads, writes or drops it only
    // after the queue handed out the read's completion (the queue keeps
    // no lent memory past that).
    unsafe { LentBuf::new(at, len) }
}

/// A read into lent memory: the data lands there (in pieces, and the rest
/// of a large PDU straight from the read buffers), nothing past the lent
/// length is touched, and the completion carries no data of its own.
#[test]
fn a_lent_read_lands_in_the_lenders_memory() {
    for (len, pdu_bytes, chunk) in [
        (8192, 8192, 1000),
        (64 << 10, 64 << 10, 5000),
        (64 << 10, 16 << 10, 70_000),
    ] {
        let (mut host, mut ctrl, now) = connect(cfg(false, true), 0, 8192);
        let mut mem = vec![0xEEu8; len + 4096];
        let cid = host
            .submit(
                now,
                Sqe::rw(io::READ, 0, 1, 0, 16, false),
                Payload::ReadLent(lend(&mut mem, len)),
                5,
            )
            .expect("submit");
        ctrl.recv(&mut host);
        let data = pattern(len);
        for piece in c2h_pdus(&ctrl, cid, &data, pdu_bytes, true).chunks(chunk) {
            host.handle_bytes(now, piece);
        }
        let (token, r) = completion(&mut host);
        assert_eq!(token, 5);
        assert!(
            r.expect("read ok").data.is_empty(),
            "the data is the lender's"
        );
        assert_eq!(
            &mem[..len],
            &data[..],
            "len {len}, PDUs of {pdu_bytes}, chunks of {chunk}"
        );
        assert!(mem[len..].iter().all(|&b| b == 0xEE), "past the lent bytes");
    }
}

/// A lent read that times out gives its memory back with the timeout: the
/// data that comes late lands elsewhere, and the lender's bytes stay as the
/// lender left them.
/// A queue with a lent read of `len` bytes (token `token`) of which the
/// first `early` bytes of the wire (header and some data) came in: the
/// queue, the lent memory, the rest of the wire, and the time.
fn lent_read_under_way(
    len: usize,
    token: u64,
    early: usize,
) -> (QueuePairCore, Vec<u8>, Vec<u8>, Instant) {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let mut mem = vec![0u8; len];
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 16, false),
            Payload::ReadLent(lend(&mut mem, len)),
            token,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    let mut wire = c2h_pdus(&ctrl, cid, &pattern(len), len, true);
    let late = wire.split_off(early);
    host.handle_bytes(now, &wire);
    (host, mem, late, now)
}

#[test]
fn a_timed_out_lent_read_writes_no_more_into_the_lenders_memory() {
    // The header and a third of the data, then the timeout.
    let (mut host, mut mem, late, now) = lent_read_under_way(64 << 10, 6, (64 << 10) / 3);
    host.handle_timeout(now + Duration::from_secs(5));
    let ev = events(&mut host);
    assert!(
        matches!(
            &ev[0],
            Event::Complete {
                token: 6,
                result: Err(HostError::Timeout { .. })
            }
        ),
        "{ev:?}"
    );
    // The memory is the lender's again.
    mem.fill(0x5A);
    host.handle_bytes(now + Duration::from_secs(6), &late);
    assert!(events(&mut host).is_empty(), "no second completion");
    assert_eq!(host.in_flight(), 0, "the late data freed the CID");
    assert!(!host.is_closed());
    assert!(
        mem.iter().all(|&b| b == 0x5A),
        "late data went past the lender"
    );
}

/// A queue that closes with a lent read outstanding fails it and writes
/// no more: bytes after the close do not reach the lender.
#[test]
fn a_closed_queue_gives_lent_memory_back() {
    let (mut host, mut mem, late, now) = lent_read_under_way(32 << 10, 7, (32 << 10) / 2);
    host.close("test");
    let ev = events(&mut host);
    assert!(
        matches!(
            &ev[0],
            Event::Complete {
                token: 7,
                result: Err(HostError::ConnectionLost(_))
            }
        ),
        "{ev:?}"
    );
    assert!(matches!(&ev[1], Event::Closed(_)), "{ev:?}");
    mem.fill(0x33);
    host.handle_bytes(now, &late);
    assert!(mem.iter().all(|&b| b == 0x33));
}

/// Large reads: the rest of each large C2HData PDU goes straight into
/// the command's buffer; whatever the read sizes and digests, every read
/// returns its data, and a small read behind the large ones too.
#[test]
fn large_reads_are_received_into_their_buffers() {
    for (hd, dd) in [(false, false), (true, true), (false, true)] {
        for success in [true, false] {
            for chunk in [1000, 7000, 70_000, 1 << 20] {
                let (mut host, mut ctrl, now) = connect(cfg(hd, dd), 0, 8192);
                let big = pattern(256 * 1024);
                let small: Vec<u8> = pattern(4096).iter().map(|b| b ^ 0x5a).collect();
                let c1 = host
                    .submit(
                        now,
                        Sqe::rw(io::READ, 0, 1, 0, 512, false),
                        Payload::Read(big.len() as u32),
                        1,
                    )
                    .expect("submit");
                let c2 = host
                    .submit(
                        now,
                        Sqe::rw(io::READ, 0, 1, 0, 8, false),
                        Payload::Read(4096),
                        2,
                    )
                    .expect("submit");
                ctrl.recv(&mut host);
                let mut b = c2h_pdus(&ctrl, c1, &big, 128 * 1024, success);
                b.extend(c2h_pdus(&ctrl, c2, &small, 4096, success));
                for c in b.chunks(chunk) {
                    host.handle_bytes(now, c);
                }
                let mut got: Vec<_> = events(&mut host)
                    .into_iter()
                    .map(|e| match e {
                        Event::Complete { token, result } => (token, result.expect("read ok").data),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                got.sort_by_key(|g| g.0);
                assert_eq!(got.len(), 2, "hd {hd} dd {dd} chunk {chunk}");
                assert!(
                    got[0].1 == big,
                    "hd {hd} dd {dd} success {success} chunk {chunk}"
                );
                assert!(got[1].1 == small);
                // (Handed all at once, the PDUs fill the framer's buffer first.)
                assert!(
                    chunk > 70_000 || host.rx_direct_bytes() > 128 * 1024,
                    "chunk {chunk}: only {} bytes went straight in",
                    host.rx_direct_bytes()
                );
                assert_eq!(host.in_flight(), 0);
                assert!(!host.is_closed());
            }
        }
    }
}

#[test]
fn large_read_data_digest_error_fails_only_the_command() {
    let (mut host, ctrl, now) = connect(cfg(false, true), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 128, false),
            Payload::Read(65536),
            1,
        )
        .expect("submit");
    let mut b = c2h_pdus(&ctrl, cid, &pattern(65536), 65536, true);
    let n = b.len();
    b[n - 1] ^= 0xff; // corrupt DDGST
    for c in b.chunks(9000) {
        host.handle_bytes(now, c);
    }
    assert!(host.rx_direct_bytes() > 0);
    let (_, r) = completion(&mut host);
    assert!(matches!(r, Err(HostError::DataDigest { .. })), "{r:?}");
    assert!(!host.is_closed());
    // The stream stays in step: the next read works.
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 128, false),
            Payload::Read(65536),
            2,
        )
        .expect("submit");
    for c in c2h_pdus(&ctrl, cid, &pattern(65536), 65536, true).chunks(9000) {
        host.handle_bytes(now, c);
    }
    let (_, r) = completion(&mut host);
    assert_eq!(r.expect("read ok").data, pattern(65536));
}

/// A large C2HData that breaks the rules is refused when its header is in
/// (before its data), with the same TermReq as a small one.
#[test]
fn large_c2h_data_violations_are_fatal() {
    for (cid_delta, len, fes_want) in [
        (3u16, 65536u32, fes::INVALID_HEADER_FIELD),
        (0, 131_072, fes::DATA_OUT_OF_RANGE),
    ] {
        let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
        let cid = host
            .submit(
                now,
                Sqe::rw(io::READ, 0, 1, 0, 128, false),
                Payload::Read(65536),
                1,
            )
            .expect("submit");
        ctrl.recv(&mut host);
        let b = ctrl.pdu(
            PduHeader::C2HData(DataHeader {
                cccid: cid + cid_delta,
                ttag: 0,
                offset: 0,
                len,
                last: true,
                success: true,
            }),
            &pattern(len as usize),
        );
        host.handle_bytes(now, &b[..4096]);
        assert!(host.is_closed());
        assert_eq!(host.rx_direct_bytes(), 0);
        assert_eq!(term_req(&mut ctrl, &mut host), Some(fes_want));
        // Whatever else arrives is ignored.
        host.handle_bytes(now, &b[4096..]);
    }
}

/// SUCCESS on a large C2HData that does not finish the read is fatal.
#[test]
fn large_c2h_success_before_the_end_is_fatal() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    let cid = host
        .submit(
            now,
            Sqe::rw(io::READ, 0, 1, 0, 256, false),
            Payload::Read(131_072),
            1,
        )
        .expect("submit");
    ctrl.recv(&mut host);
    let b = ctrl.pdu(
        PduHeader::C2HData(DataHeader {
            cccid: cid,
            ttag: 0,
            offset: 0,
            len: 65536,
            last: true,
            success: true,
        }),
        &pattern(65536),
    );
    for c in b.chunks(5000) {
        host.handle_bytes(now, c);
    }
    assert!(host.rx_direct_bytes() > 0);
    assert!(host.is_closed());
    assert_eq!(
        term_req(&mut ctrl, &mut host),
        Some(fes::PDU_SEQUENCE_ERROR)
    );
}

/// What `rx_due_min_bytes` counts: one response for a command without
/// data, the data and one header for a read, nothing for a timed-out one.
#[test]
fn rx_due_min_bytes_counts_outstanding_commands() {
    let (mut host, mut ctrl, now) = connect(cfg(false, false), 0, 8192);
    assert_eq!(host.rx_due_min_bytes(), 0);
    let flush = host
        .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, 1)
        .expect("submit");
    host.submit(
        now,
        Sqe::rw(io::READ, 0, 1, 0, 8, false),
        Payload::Read(4096),
        2,
    )
    .expect("submit");
    ctrl.recv(&mut host);
    assert_eq!(host.rx_due_min_bytes(), 24 + 24 + 4096);
    host.handle_bytes(now, &resp(&ctrl, flush, Status::SUCCESS));
    assert_eq!(host.rx_due_min_bytes(), 24 + 4096);
    host.handle_timeout(now + Duration::from_secs(5));
    assert_eq!(
        host.rx_due_min_bytes(),
        0,
        "a timed-out read counts nothing"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// `rx_due_min_bytes` never exceeds what the controller still has to
    /// send (a host sleeping until half of it has come wakes), whatever the
    /// reads' sizes, their PDUs (large ones received straight into the
    /// read's buffer), the SUCCESS flag and how the bytes arrive; it is 0
    /// once every command completed.
    #[test]
    fn rx_due_min_bytes_is_a_lower_bound(
        cmds in prop::collection::vec((any::<bool>(), 1u32..400, 1usize..4, any::<bool>()), 1..8),
        cuts in prop::collection::vec(1usize..70_000, 1..40),
    ) {
        let (mut host, ctrl, now) = connect(cfg(false, false), 0, 8192);
        let mut stream = Vec::new();
        for (i, &(read, sectors, pdus, success)) in cmds.iter().enumerate() {
            let len = sectors as usize * 512;
            if !read {
                let cid = host
                    .submit(now, Sqe::new(io::FLUSH, 0, 1), Payload::None, i as u64)
                    .expect("submit");
                stream.extend(resp(&ctrl, cid, Status::SUCCESS));
                continue;
            }
            let cid = host
                .submit(now, Sqe::rw(io::READ, 0, 1, 0, sectors, false), Payload::Read(len as u32), i as u64)
                .expect("submit");
            stream.extend(c2h_pdus(&ctrl, cid, &pattern(len), len.div_ceil(pdus), success));
        }
        let _ = host.poll_transmit();
        let mut at = 0;
        prop_assert!(host.rx_due_min_bytes() <= stream.len());
        // Exact while nothing arrived, when every read comes in one PDU
        // that completes it.
        if cmds.iter().all(|&(read, _, pdus, success)| !read || (pdus == 1 && success)) {
            prop_assert_eq!(host.rx_due_min_bytes(), stream.len());
        }
        for c in cuts.iter().cycle() {
            if at == stream.len() {
                break;
            }
            let end = (at + c).min(stream.len());
            host.handle_bytes(now, &stream[at..end]);
            at = end;
            let due = host.rx_due_min_bytes();
            prop_assert!(due <= stream.len() - at, "{} due, {} to come", due, stream.len() - at);
        }
        prop_assert_eq!(host.rx_due_min_bytes(), 0);
        let done = events(&mut host);
        prop_assert_eq!(done.len(), cmds.len());
        for e in done {
            prop_assert!(matches!(e, Event::Complete { result: Ok(_), .. }), "{:?}", e);
        }
    }

    /// Random bytes after the handshake: errors, never panics or hangs.
    #[test]
    fn random_c2h_stream_never_panics(chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8), hd: bool, dd: bool) {
        let (mut host, _ctrl, now) = connect(cfg(hd, dd), 0, 8192);
        let _ = host.submit(now, Sqe::rw(io::READ, 0, 1, 0, 8, false), Payload::Read(4096), 1);
        for c in &chunks {
            host.handle_bytes(now, c);
        }
        let _ = events(&mut host);
        let _ = host.poll_transmit();
    }

    /// Valid PDUs with random header fields mutated.
    #[test]
    fn mutated_c2h_pdus_never_panic(flips in prop::collection::vec((0usize..600, any::<u8>()), 1..6), success: bool, split in 1usize..64) {
        let (mut host, ctrl, now) = connect(cfg(true, true), 0, 8192);
        let cid = host.submit(now, Sqe::rw(io::READ, 0, 1, 0, 1, false), Payload::Read(512), 1).expect("submit");
        host.submit(now, Sqe::rw(io::WRITE, 0, 1, 0, 32, false), Payload::Write(pattern(16384)), 2).expect("submit");
        let mut b = ctrl.pdu(
            PduHeader::C2HData(DataHeader { cccid: cid, ttag: 0, offset: 0, len: 512, last: true, success }),
            &pattern(512),
        );
        b.extend(ctrl.r2t(1, 0, 0, 16384 ));
        b.extend(ctrl.pdu(PduHeader::CapsuleResp(Cqe::new(cid, Status::SUCCESS)), &[]));
        for (at, v) in flips {
            let n = b.len();
            b[at % n] = v;
        }
        for c in b.chunks(split) {
            host.handle_bytes(now, c);
        }
        let _ = events(&mut host);
        host.handle_timeout(now + Duration::from_secs(60));
        host.handle_timeout(now + Duration::from_secs(120));
        prop_assert_eq!(host.in_flight(), 0);
    }

    /// Reads of any size, in PDUs of any size, delivered in reads of any
    /// size, with or without digests: each read returns its own data.
    #[test]
    fn reads_of_any_size_return_their_data(
        reads in prop::collection::vec((1usize..300_000, 4096usize..140_000), 1..5),
        chunks in prop::collection::vec(1usize..100_000, 1..20),
        hd: bool,
        dd: bool,
        success: bool,
    ) {
        let (mut host, mut ctrl, now) = connect(cfg(hd, dd), 0, 8192);
        let mut want = Vec::new();
        let mut b = Vec::new();
        for (i, &(len, pdu)) in reads.iter().enumerate() {
            let data: Vec<u8> = pattern(len).iter().map(|x| x.wrapping_add(i as u8)).collect();
            let cid = host
                .submit(now, Sqe::rw(io::READ, 0, 1, 0, 1, false), Payload::Read(len as u32), i as u64)
                .expect("submit");
            b.extend(c2h_pdus(&ctrl, cid, &data, pdu, success));
            want.push(data);
        }
        ctrl.recv(&mut host);
        let mut at = 0;
        let mut k = 0;
        while at < b.len() {
            let n = chunks[k % chunks.len()].min(b.len() - at);
            host.handle_bytes(now, &b[at..at + n]);
            at += n;
            k += 1;
        }
        let mut got = Vec::new();
        while let Some(ev) = host.poll_event() {
            match ev {
                Event::Complete { token, result } => got.push((token, result.expect("read ok").data)),
                other => panic!("{other:?}"),
            }
        }
        got.sort_by_key(|g| g.0);
        prop_assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            prop_assert!(&g.1 == w);
        }
        prop_assert!(!host.is_closed());
    }
}

/// `read_draining` says a read drained the socket only when it returned
/// bytes but fewer than there was room for: a full read may have left more
/// behind, and 0 bytes is the peer closing, not an empty socket. The bytes
/// reach the core as `read_from`'s do.
#[test]
fn a_short_read_drains_a_full_one_does_not() {
    let now = Instant::now();
    let mut host = QueuePairCore::new(cfg(false, false), now);
    let mut ctrl = FakeCtrl::new();
    ctrl.recv(&mut host);
    let icresp = ctrl.pdu(
        PduHeader::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: false,
            ddgst: false,
            maxh2cdata: 8192,
        }),
        &[],
    );
    // The ICResp in two short reads: each drains, the core takes both.
    let (head, tail) = icresp.split_at(5);
    let r = host.read_draining(now, &mut &head[..]).unwrap();
    assert_eq!(r, (5, true));
    assert!(host.negotiated().is_none());
    let r = host.read_draining(now, &mut &tail[..]).unwrap();
    assert_eq!(r, (tail.len(), true));
    assert!(host.negotiated().is_some(), "the ICResp was taken whole");
    // A source with more than there is room for fills the room: not drained.
    struct Endless;
    impl std::io::Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(0);
            Ok(buf.len())
        }
    }
    let (n, drained) = host.read_draining(now, &mut Endless).unwrap();
    assert!(n > 0 && !drained, "{n} bytes filled the room");
    // End of stream: 0 bytes, not drained.
    let mut fresh = QueuePairCore::new(cfg(false, false), now);
    assert_eq!(fresh.read_draining(now, &mut &[][..]).unwrap(), (0, false));
}
