//! Protocol behaviour of the target that needs a byte-level host (in memory,
//! virtual time): hostile and malformed PDUs, CID conflicts, queue overruns,
//! wrong Connects, SGLs and chunkings Sluice's host never sends, discovery,
//! an emulated SSD. Each test runs in every send mode (`SEND_MODES`). What a
//! well-behaved host does is tested on the real pair in `crates/sluice-pair`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::*;
use proptest::prelude::*;
use sluice_config::{Config, NamespaceConfig, SsdConfig, SubsystemConfig, TargetSettings};
use sluice_proto::command::{io, sgl, SglDescriptor, Sqe};
use sluice_proto::fabrics::{connect_data_offset, CNTLID_DYNAMIC};
use sluice_proto::identify::{self, IdentifyController};
use sluice_proto::log::{self, lid, GetLogPage};
use sluice_proto::pdu::{fes, DataHeader, PduHeader};
use sluice_proto::send::{SchedulerKind, SendConfig};
use sluice_proto::Status;
use std::time::Duration;

/// The target with the default namespace and the send path `mode` (see
/// `common::SEND_MODES`): every test that is not about one send path runs
/// in each of them.
fn reg_in(mode: &str) -> std::sync::Arc<sluice_target::registry::Registry> {
    registry(&config_in(mode, default_ns()))
}

#[test]
fn host_not_on_allow_list_is_refused_with_0x184() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let mut p = Pair::new(r.clone());
        p.icreq(false, false);
        let c = p.connect(
            0,
            CNTLID_DYNAMIC,
            "nqn.2014-08.org.nvmexpress:uuid:intruder",
            0,
        );
        assert_eq!(c.status(), Status::CONNECT_INVALID_HOST);
        assert_eq!((c.status().sct, c.status().sc), (1, 0x84));
        assert_eq!(r.subsystems()[SUBNQN].controller_count(), 0);
    }
}

#[test]
fn connect_to_unknown_subsystem_names_subnqn() {
    for mode in SEND_MODES {
        let mut p = Pair::new(reg_in(mode));
        p.icreq(false, false);
        let c = p.connect_to("nqn.nope:x", 0, 0xffff, 0);
        assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
        assert_eq!(
            c.result,
            1 << 16 | connect_data_offset::SUBNQN as u32,
            "IATTR=data, IPO=subnqn"
        );
    }
}

#[test]
fn io_queue_connect_checks_controller() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = Pair::new(r.clone());
        p.icreq(false, false);
        assert_eq!(
            p.connect(1, cntlid.wrapping_add(100), HOSTNQN, 0).status(),
            Status::CONNECT_INVALID_PARAMETERS
        );
        let mut p = Pair::new(r.clone());
        p.icreq(false, false);
        assert_eq!(p.connect(1, cntlid, HOSTNQN, 0).status(), Status::SUCCESS);
        // The same qid twice is refused.
        let mut q = Pair::new(r.clone());
        q.icreq(false, false);
        assert_eq!(
            q.connect(1, cntlid, HOSTNQN, 0).status(),
            Status::CONNECT_INVALID_PARAMETERS
        );
    }
}

#[test]
fn io_before_enable_is_command_sequence_error() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let mut a = Pair::new(r.clone());
        a.icreq(false, false);
        let c = a.connect(0, CNTLID_DYNAMIC, HOSTNQN, 0);
        let cntlid = c.result as u16;
        let mut p = Pair::new(r.clone());
        p.icreq(false, false);
        assert_eq!(
            p.connect(1, cntlid, HOSTNQN, 0).status(),
            Status::COMMAND_SEQUENCE_ERROR
        );
    }
}

#[test]
fn io_errors_have_the_right_status() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let blocks = 4 * 1024 * 1024 / 512;
        assert_eq!(p.read(blocks - 1, 2).0, Status::LBA_OUT_OF_RANGE);
        assert_eq!(
            p.read(u64::MAX - 1, 4).0,
            Status::LBA_OUT_OF_RANGE,
            "overflowing range"
        );
        assert_eq!(p.write(blocks, &[0; 512], 8192), Status::LBA_OUT_OF_RANGE);
        // Wrong namespace.
        let cid = p.cid();
        let mut s = Sqe::rw(io::READ, cid, 2, 0, 1, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        assert_eq!(p.command(s, &[]).0.status(), Status::INVALID_NAMESPACE);
        // Unknown I/O opcode.
        let cid = p.cid();
        assert_eq!(
            p.command(Sqe::new(0x7c, cid, 1), &[]).0.status(),
            Status::INVALID_OPCODE
        );
        // SGL length disagrees with NLB.
        let cid = p.cid();
        let mut s = Sqe::rw(io::READ, cid, 1, 0, 2, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        assert_eq!(
            p.command(s, &[]).0.status(),
            Status::DATA_SGL_LENGTH_INVALID
        );
        // In-capsule data shorter than the SGL says.
        let cid = p.cid();
        let mut s = Sqe::rw(io::WRITE, cid, 1, 0, 16, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 8192,
            id: sgl::DATA_BLOCK_OFFSET,
        });
        assert_eq!(
            p.command(s, &[0; 4096]).0.status(),
            Status::DATA_SGL_LENGTH_INVALID
        );
        // Data on a command that moves none.
        let cid = p.cid();
        let mut s = Sqe::new(io::FLUSH, cid, 1);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id: sgl::DATA_BLOCK_OFFSET,
        });
        assert_eq!(p.command(s, &[0; 512]).0.status(), Status::INVALID_FIELD);
        // Beyond MDTS (1 MiB).
        let cid = p.cid();
        let mut s = Sqe::rw(io::READ, cid, 1, 0, 4096, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 4096 * 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        assert_eq!(
            p.command(s, &[]).0.status(),
            Status::DATA_SGL_LENGTH_INVALID
        );
        // Unknown SGL type.
        let cid = p.cid();
        let mut s = Sqe::rw(io::READ, cid, 1, 0, 1, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id: 0x30,
        });
        assert_eq!(
            p.command(s, &[]).0.status(),
            Status::SGL_DESCRIPTOR_TYPE_INVALID
        );
        // The connection is still fine.
        assert_eq!(p.read(0, 1).0, Status::SUCCESS);
        assert!(p.term.is_none());
    }
}

#[test]
fn h2c_data_outside_r2t_is_fatal_fes_4() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let cid = p.cid();
        let mut s = Sqe::rw(io::WRITE, cid, 1, 0, 32, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 16384,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        p.send(&PduHeader::CapsuleCmd(s), &[]);
        let r2t = match p.take().as_slice() {
            [Got {
                header: PduHeader::R2t(r),
                ..
            }] => *r,
            other => panic!("{other:?}"),
        };
        let h = PduHeader::H2CData(DataHeader {
            cccid: cid,
            ttag: r2t.ttag,
            offset: 12288,
            len: 8192,
            last: true,
            success: false,
        });
        p.send(&h, &[0; 8192]);
        assert_eq!(p.term.map(|t| t.0), Some(fes::DATA_OUT_OF_RANGE));
        assert!(p.conn.is_closed());
    }
}

/// A target whose H2CData PDUs may carry 128 KiB.
fn reg_large_h2c(mode: &str) -> std::sync::Arc<sluice_target::registry::Registry> {
    reg_large(mode, target_settings(send_config(mode)).max_c2h_data_bytes)
}

/// A target whose H2CData and C2HData PDUs may both carry 128 KiB.
fn reg_large_pdus(mode: &str) -> std::sync::Arc<sluice_target::registry::Registry> {
    reg_large(mode, 128 * 1024)
}

/// 128 KiB H2CData PDUs, and C2HData PDUs of `c2h_bytes`.
fn reg_large(mode: &str, c2h_bytes: u32) -> std::sync::Arc<sluice_target::registry::Registry> {
    reg_large_send(send_config(mode), c2h_bytes)
}

/// [`reg_large`] with the send path `send`.
fn reg_large_send(
    send: SendConfig,
    c2h_bytes: u32,
) -> std::sync::Arc<sluice_target::registry::Registry> {
    let c = Config::default()
        .with_target(
            target_settings(send)
                .with_max_h2c_data_bytes(128 * 1024)
                .with_max_c2h_data_bytes(c2h_bytes),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(default_ns()),
        )
        .validated()
        .expect("test config is valid");
    registry(&c)
}

/// Sends a write of `data` at LBA 0 by R2T and returns the wire of its
/// H2CData PDUs (`pdu` bytes each) for the caller to deliver.
fn start_r2t_write(p: &mut Pair, data: &[u8], pdu: usize) -> (u16, Vec<u8>) {
    let cid = p.cid();
    let mut s = Sqe::rw(io::WRITE, cid, 1, 0, (data.len() / 512) as u32, false);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: data.len() as u32,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    p.send(&PduHeader::CapsuleCmd(s), &[]);
    let r2t = match p.take().as_slice() {
        [Got {
            header: PduHeader::R2t(r),
            ..
        }] => *r,
        other => panic!("{other:?}"),
    };
    let mut wire = Vec::new();
    let mut off = 0;
    while off < data.len() {
        let n = pdu.min(data.len() - off);
        let h = PduHeader::H2CData(DataHeader {
            cccid: cid,
            ttag: r2t.ttag,
            offset: off as u32,
            len: n as u32,
            last: off + n == data.len(),
            success: false,
        });
        sluice_proto::pdu::encode_pdu(&h, &data[off..off + n], &p.txp, &mut wire);
        off += n;
    }
    (cid, wire)
}

/// Large H2CData PDUs are received into the command's buffer (the rest of
/// each past the framer), whatever the read sizes and digests: the data
/// written is the data read back.
#[test]
fn large_h2c_data_is_received_into_the_command_buffer() {
    for (hdgst, ddgst) in [(false, false), (true, true)] {
        for chunk in [1000usize, 7000, 70_000] {
            let r = reg_large_h2c("immediate");
            let (_a, cntlid) = admin_pair(&r);
            let mut p = io_pair(&r, cntlid, hdgst, ddgst);
            let data = pattern(256 * 1024, chunk as u8);
            let (cid, wire) = start_r2t_write(&mut p, &data, 128 * 1024);
            for c in wire.chunks(chunk) {
                p.conn.feed(c, p.now);
            }
            p.pump();
            let (c, _) = p.collect_response(cid);
            assert_eq!(c.status(), Status::SUCCESS, "chunk {chunk}");
            assert!(
                p.conn.stats().rx_direct_bytes() > 128 * 1024,
                "chunk {chunk}: {} bytes in place",
                p.conn.stats().rx_direct_bytes()
            );
            let (st, back) = p.read(0, 512);
            assert_eq!(st, Status::SUCCESS);
            assert!(back == data, "hdgst {hdgst} ddgst {ddgst} chunk {chunk}");
            assert!(!p.conn.is_closed());
        }
    }
}

/// Large reads go out from their own buffers (attached to their C2HData
/// PDUs, written with `writev`), in every send mode, with and without
/// digests and with a C2HData size that splits them: the data read is the
/// data written, and small reads are still copied.
#[test]
fn large_read_data_is_sent_from_its_own_buffer() {
    for mode in SEND_MODES {
        for (hdgst, ddgst) in [(false, false), (true, true)] {
            let r = reg_large_pdus(mode);
            let (_a, cntlid) = admin_pair(&r);
            let mut p = io_pair(&r, cntlid, hdgst, ddgst);
            let data = pattern(256 * 1024, 7);
            let (cid, wire) = start_r2t_write(&mut p, &data, 128 * 1024);
            p.send_raw(&wire);
            assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
            let (st, small) = p.read(0, 8);
            assert_eq!(st, Status::SUCCESS);
            assert!(small == data[..4096], "{mode}: small read");
            assert_eq!(
                p.conn.stats().c2h_attached_bytes(),
                0,
                "{mode}: 4 KiB copied"
            );
            let (st, back) = p.read(0, 512);
            assert_eq!(st, Status::SUCCESS);
            assert!(
                back == data,
                "{mode} hdgst {hdgst} ddgst {ddgst}: data read back"
            );
            assert_eq!(
                p.conn.stats().c2h_attached_bytes(),
                256 * 1024,
                "{mode}: the large read was attached"
            );
            assert!(!p.conn.is_closed());
        }
    }
}

/// `send.responses_after_data` (on by default): the CapsuleResps of the
/// large reads one batch completes follow all their data, so a host sees
/// them complete together; a small read's response (its data copied) and
/// every response with the setting off go out right behind their data.
#[test]
fn a_batch_of_large_reads_completes_after_all_its_data() {
    for after in [true, false] {
        let mut send = send_config("immediate");
        send.responses_after_data = after;
        let r = reg_large_send(send, 128 * 1024);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let data = pattern(256 * 1024, 3);
        let (cid, wire) = start_r2t_write(&mut p, &data, 128 * 1024);
        p.send_raw(&wire);
        assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
        // Three 64 KiB reads and a 4 KiB one, in one segment.
        let reads: [(u64, u32); 4] = [(0, 128), (128, 128), (256, 8), (384, 128)];
        let mut wire = Vec::new();
        let mut cids = Vec::new();
        for (slba, nlb) in reads {
            let cid = p.cid();
            cids.push(cid);
            let sqe = with_c2h(Sqe::rw(io::READ, cid, 1, slba, nlb, false), nlb * 512);
            sluice_proto::pdu::encode_pdu(&PduHeader::CapsuleCmd(sqe), &[], &p.txp, &mut wire);
        }
        p.send_raw(&wire);
        let got = p.take();
        let order: Vec<(&str, u16)> = got
            .iter()
            .map(|g| match &g.header {
                PduHeader::C2HData(d) => ("data", d.cccid),
                PduHeader::CapsuleResp(c) => {
                    assert!(c.status().is_success());
                    ("resp", c.cid)
                }
                other => panic!("unexpected PDU {other:?}"),
            })
            .collect();
        let [a, b, small, d] = [cids[0], cids[1], cids[2], cids[3]];
        let want: Vec<(&str, u16)> = if after {
            vec![
                ("data", a),
                ("data", b),
                ("data", small),
                ("resp", small),
                ("data", d),
                ("resp", a),
                ("resp", b),
                ("resp", d),
            ]
        } else {
            vec![
                ("data", a),
                ("resp", a),
                ("data", b),
                ("resp", b),
                ("data", small),
                ("resp", small),
                ("data", d),
                ("resp", d),
            ]
        };
        assert_eq!(order, want, "responses_after_data = {after}");
        // Every read returns what was written.
        for (i, (slba, nlb)) in reads.into_iter().enumerate() {
            let at = slba as usize * 512;
            let back: Vec<u8> = got
                .iter()
                .filter_map(|g| match &g.header {
                    PduHeader::C2HData(h) if h.cccid == cids[i] => Some(g.data.as_slice()),
                    _ => None,
                })
                .flatten()
                .copied()
                .collect();
            assert!(back == data[at..at + nlb as usize * 512], "read {i}");
        }
        assert!(!p.conn.is_closed());
    }
}

/// A host that disables SQ flow control gets its reads completed by the
/// SUCCESS flag on their last C2HData, with no CapsuleResp, unless the
/// queue coalesces its responses: then every read keeps its CapsuleResp,
/// for the coalescer to batch (a Barrier's completion fires it).
#[test]
fn reads_complete_with_their_data_unless_responses_are_coalesced() {
    for (mode, success) in [("immediate", true), ("immediate/static", false)] {
        let r = registry(&config_in(mode, default_ns()));
        let (_a, cntlid) = admin_pair(&r);
        let mut p = Pair::new(r.clone());
        p.icreq(false, false);
        let c = p.connect_to(
            SUBNQN,
            1,
            cntlid,
            sluice_proto::fabrics::CATTR_DISABLE_SQ_FLOW,
        );
        assert!(c.status().is_success(), "{mode}: {:?}", c.status());
        assert_eq!(p.write(0, &pattern(4096, 9), 8192), Status::SUCCESS);
        let cid = p.cid();
        let sqe = with_c2h(Sqe::rw(io::READ, cid, 1, 0, 8, false), 4096);
        p.send(&PduHeader::CapsuleCmd(sqe), &[]);
        // The static coalescer holds the response for its timeout.
        p.advance(Duration::from_millis(1));
        let got = p.take();
        let last = got.iter().rev().find_map(|g| match &g.header {
            PduHeader::C2HData(d) => Some(d.success),
            _ => None,
        });
        assert_eq!(last, Some(success), "{mode}: SUCCESS on the last C2HData");
        let resps = got
            .iter()
            .filter(|g| matches!(g.header, PduHeader::CapsuleResp(_)))
            .count();
        assert_eq!(resps, usize::from(!success), "{mode}: CapsuleResps");
    }
}

/// Read and write buffers are not zeroed when taken from the pool (the
/// RAM backend fills reads whole, received data fills writes): a read of
/// blocks never written after large transfers through the same pool
/// still returns zeros, never an earlier transfer's bytes.
#[test]
fn reused_buffers_never_show_earlier_data() {
    let r = reg_large_h2c("immediate");
    let (_a, cntlid) = admin_pair(&r);
    let mut p = io_pair(&r, cntlid, false, false);
    for round in 0..3u8 {
        let data = pattern(128 * 1024, round + 1);
        let (cid, wire) = start_r2t_write(&mut p, &data, 128 * 1024);
        p.send_raw(&wire);
        assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
        assert_eq!(p.read(0, 256).1, data);
        // LBA 4096 on: never written.
        let (st, back) = p.read(4096, 256);
        assert_eq!(st, Status::SUCCESS);
        assert!(
            back.iter().all(|&b| b == 0),
            "round {round}: unwritten blocks read non-zero"
        );
    }
}

#[test]
fn large_h2c_data_digest_error_fails_only_the_command() {
    let r = reg_large_h2c("immediate");
    let (_a, cntlid) = admin_pair(&r);
    let mut p = io_pair(&r, cntlid, false, true);
    let (cid, mut wire) = start_r2t_write(&mut p, &pattern(65536, 1), 65536);
    let n = wire.len();
    wire[n - 1] ^= 0xff; // corrupt DDGST
    for c in wire.chunks(5000) {
        p.conn.feed(c, p.now);
    }
    p.pump();
    let (c, _) = p.collect_response(cid);
    assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR);
    assert!(p.conn.stats().rx_direct_bytes() > 0);
    assert!(!p.conn.is_closed());
    // The stream stays in step: the next write and read work.
    let data = pattern(65536, 2);
    let (cid, wire) = start_r2t_write(&mut p, &data, 65536);
    for c in wire.chunks(5000) {
        p.conn.feed(c, p.now);
    }
    p.pump();
    assert_eq!(p.collect_response(cid).0.status(), Status::SUCCESS);
    assert_eq!(p.read(0, 128).1, data);
}

/// A target that takes 128 KiB of in-capsule data (and 128 KiB H2CData).
fn reg_large_inline() -> std::sync::Arc<sluice_target::registry::Registry> {
    let c = Config::default()
        .with_target(
            target_settings(send_config("immediate"))
                .with_max_h2c_data_bytes(128 * 1024)
                .with_inline_data_bytes(128 * 1024),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(default_ns()),
        )
        .validated()
        .expect("test config is valid");
    registry(&c)
}

/// The wire of a Write of `data` at `slba` with its data in the capsule.
fn in_capsule_write(p: &mut Pair, slba: u64, data: &[u8]) -> (u16, Vec<u8>) {
    let cid = p.cid();
    let mut s = Sqe::rw(io::WRITE, cid, 1, slba, (data.len() / 512) as u32, false);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: data.len() as u32,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    let mut wire = Vec::new();
    sluice_proto::pdu::encode_pdu(&PduHeader::CapsuleCmd(s), data, &p.txp, &mut wire);
    (cid, wire)
}

/// The status of the CapsuleResp for `cid` among `got`.
fn response_status(got: &[Got], cid: u16) -> Option<Status> {
    got.iter().find_map(|g| match &g.header {
        PduHeader::CapsuleResp(c) if c.cid == cid => Some(c.status()),
        _ => None,
    })
}

/// Large in-capsule data is received into the command's buffer (the rest
/// of it past the framer), whatever the read sizes and digests, with the
/// next command right behind it on the wire: the data written is the data
/// read back.
#[test]
fn large_in_capsule_data_is_received_into_the_command_buffer() {
    for (hdgst, ddgst) in [(false, false), (true, true)] {
        for chunk in [1000usize, 7000, 70_000] {
            let r = reg_large_inline();
            let (_a, cntlid) = admin_pair(&r);
            let mut p = io_pair(&r, cntlid, hdgst, ddgst);
            let first = pattern(128 * 1024, chunk as u8);
            let second = pattern(64 * 1024, chunk as u8 ^ 0x5a);
            let (cid1, mut wire) = in_capsule_write(&mut p, 0, &first);
            let (cid2, w2) = in_capsule_write(&mut p, 256, &second);
            wire.extend_from_slice(&w2);
            for c in wire.chunks(chunk) {
                p.conn.feed(c, p.now);
            }
            p.pump();
            let got = p.take();
            for cid in [cid1, cid2] {
                let st = response_status(&got, cid);
                assert_eq!(st, Some(Status::SUCCESS), "chunk {chunk} cid {cid}");
            }
            let direct = p.conn.stats().rx_direct_bytes();
            assert!(direct > 64 * 1024, "chunk {chunk}: {direct} bytes in place");
            let (st, back) = p.read(0, 256);
            assert_eq!(st, Status::SUCCESS);
            assert!(back == first, "hdgst {hdgst} ddgst {ddgst} chunk {chunk}");
            let (st, back) = p.read(256, 128);
            assert_eq!(st, Status::SUCCESS);
            assert!(back == second, "hdgst {hdgst} ddgst {ddgst} chunk {chunk}");
            assert!(!p.conn.is_closed());
        }
    }
}

/// A split in-capsule Write whose data digest is wrong fails alone
/// (Transient Transport Error, as a whole capsule's), and one refused at
/// admission (LBA out of range) has its data read and dropped: either way
/// nothing is written and the stream stays in step.
#[test]
fn a_split_in_capsule_write_that_fails_leaves_the_stream_in_step() {
    let r = reg_large_inline();
    let (_a, cntlid) = admin_pair(&r);
    let mut p = io_pair(&r, cntlid, false, true);
    let bad = pattern(128 * 1024, 7);
    let (cid, mut wire) = in_capsule_write(&mut p, 0, &bad);
    let n = wire.len();
    wire[n - 1] ^= 0xff; // corrupt DDGST
                         // 8192 LBAs of 512 bytes: 8100 + 256 runs past the end.
    let (cid_oor, w) = in_capsule_write(&mut p, 8100, &bad);
    wire.extend_from_slice(&w);
    let good = pattern(32 * 1024, 9);
    let (cid_ok, w) = in_capsule_write(&mut p, 512, &good);
    wire.extend_from_slice(&w);
    for c in wire.chunks(5000) {
        p.conn.feed(c, p.now);
    }
    p.pump();
    let got = p.take();
    let status = |cid: u16| response_status(&got, cid);
    assert_eq!(status(cid), Some(Status::TRANSIENT_TRANSPORT_ERROR));
    assert_eq!(status(cid_oor), Some(Status::LBA_OUT_OF_RANGE));
    assert_eq!(status(cid_ok), Some(Status::SUCCESS));
    assert!(p.conn.stats().rx_direct_bytes() > 128 * 1024);
    assert!(!p.conn.is_closed());
    let (st, back) = p.read(0, 256);
    assert_eq!(st, Status::SUCCESS);
    assert!(back.iter().all(|&b| b == 0), "a failed write landed");
    assert_eq!(p.read(512, 64).1, good);
}

/// More in-capsule data than advertised is fatal even when it would be
/// split, before any of it is received in place.
#[test]
fn split_in_capsule_data_beyond_the_limit_is_fatal() {
    let r = reg_large_h2c("immediate");
    let (_a, cntlid) = admin_pair(&r);
    let mut p = io_pair(&r, cntlid, false, false);
    let (_cid, wire) = in_capsule_write(&mut p, 0, &pattern(64 * 1024, 3));
    p.conn.feed(&wire[..4096], p.now);
    p.pump();
    assert_eq!(p.term.map(|t| t.0), Some(fes::DATA_LIMIT_EXCEEDED));
    assert!(p.conn.is_closed());
    assert_eq!(p.conn.stats().rx_direct_bytes(), 0);
}

/// A large H2CData outside its R2T is refused when its header is in, with
/// the FES a whole one gets, and nothing of it lands.
#[test]
fn large_h2c_data_outside_r2t_is_fatal() {
    let r = reg_large_h2c("immediate");
    let (_a, cntlid) = admin_pair(&r);
    let mut p = io_pair(&r, cntlid, false, false);
    let (_cid, mut wire) = start_r2t_write(&mut p, &pattern(65536, 1), 65536);
    wire[12] = 0x02; // DATAO 2: not where the R2T's data starts
    p.conn.feed(&wire[..4096], p.now);
    p.pump();
    assert_eq!(p.term.map(|t| t.0), Some(fes::DATA_OUT_OF_RANGE));
    assert!(p.conn.is_closed());
    assert_eq!(p.conn.stats().rx_direct_bytes(), 0);
    p.conn.feed(&wire[4096..], p.now);
}

#[test]
fn h2c_data_for_unknown_ttag_is_fatal() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let h = PduHeader::H2CData(DataHeader {
            cccid: 5,
            ttag: 77,
            offset: 0,
            len: 512,
            last: true,
            success: false,
        });
        p.send(&h, &[0; 512]);
        assert_eq!(p.term, Some((fes::INVALID_HEADER_FIELD, 10)));
        assert!(p.conn.is_closed());
    }
}

#[test]
fn capsule_beyond_in_capsule_size_is_fatal() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let mut s = Sqe::rw(io::WRITE, 3, 1, 0, 32, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 16384,
            id: sgl::DATA_BLOCK_OFFSET,
        });
        p.send(&PduHeader::CapsuleCmd(s), &[0; 16384]);
        assert_eq!(
            p.term,
            Some((fes::DATA_LIMIT_EXCEEDED, 0)),
            "in-capsule data beyond what was advertised"
        );
        assert!(p.conn.is_closed());
    }
}

#[test]
fn malformed_header_gets_term_req_and_close() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let mut p = Pair::new(r);
        p.icreq(false, false);
        let mut w = Vec::new();
        sluice_proto::pdu::encode_pdu(
            &PduHeader::CapsuleCmd(Sqe::new(0x06, 1, 0)),
            &[],
            &p.txp,
            &mut w,
        );
        w[2] = 100; // HLEN
        p.send_raw(&w);
        assert_eq!(p.term, Some((fes::INVALID_HEADER_FIELD, 2)));
        assert!(p.conn.is_closed());
    }
}

/// A read whose data is on its way when a protocol error arrives: the
/// TermReq is the last PDU on the wire in every send mode, though the read
/// completes afterwards (found by the `target_queue` fuzzer).
#[test]
fn nothing_follows_a_term_req() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let mut w = Vec::new();
        for cid in 1..=4u16 {
            let mut s = Sqe::rw(io::READ, cid, 1, 0, 8, false);
            s.set_sgl(SglDescriptor {
                address: 0,
                length: 4096,
                id: sgl::TRANSPORT_DATA_BLOCK,
            });
            sluice_proto::pdu::encode_pdu(&PduHeader::CapsuleCmd(s), &[], &p.txp, &mut w);
        }
        let mut bad = Vec::new();
        sluice_proto::pdu::encode_pdu(
            &PduHeader::CapsuleCmd(Sqe::new(0x02, 9, 1)),
            &[],
            &p.txp,
            &mut bad,
        );
        bad[2] = 100; // HLEN
        w.extend_from_slice(&bad);
        p.send_raw(&w);
        let got = p.take();
        let last = got.last().map(|g| &g.header);
        assert!(
            matches!(last, Some(PduHeader::C2HTermReq(t)) if t.fes == fes::INVALID_HEADER_FIELD),
            "{mode}: the TermReq is not last: {got:?}"
        );
        assert!(p.conn.is_closed(), "{mode}");
    }
}

#[test]
fn header_digest_error_is_fes_3() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, true, false);
        let mut w = Vec::new();
        let mut s = Sqe::rw(io::READ, 9, 1, 0, 1, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        sluice_proto::pdu::encode_pdu(&PduHeader::CapsuleCmd(s), &[], &p.txp, &mut w);
        w[20] ^= 0x55;
        p.send_raw(&w);
        assert_eq!(p.term.map(|t| t.0), Some(fes::HEADER_DIGEST_ERROR));
        assert!(p.conn.is_closed());
    }
}

#[test]
fn exceeding_queue_depth_is_fatal() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        // Queue depth 64: park 64 writes waiting for their data, then one more.
        for i in 0..64u16 {
            let mut s = Sqe::rw(io::WRITE, 100 + i, 1, 0, 32, false);
            s.set_sgl(SglDescriptor {
                address: 0,
                length: 16384,
                id: sgl::TRANSPORT_DATA_BLOCK,
            });
            p.send(&PduHeader::CapsuleCmd(s), &[]);
        }
        assert_eq!(p.take().len(), 64, "64 R2Ts");
        assert!(p.term.is_none());
        let mut s = Sqe::rw(io::READ, 500, 1, 0, 1, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        p.send(&PduHeader::CapsuleCmd(s), &[]);
        assert_eq!(p.term.map(|t| t.0), Some(fes::PDU_SEQUENCE_ERROR));
    }
}

#[test]
fn cid_conflict() {
    for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let mut s = Sqe::rw(io::WRITE, 42, 1, 0, 32, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 16384,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        p.send(&PduHeader::CapsuleCmd(s), &[]);
        assert!(matches!(
            p.take().as_slice(),
            [Got {
                header: PduHeader::R2t(_),
                ..
            }]
        ));
        let mut s2 = Sqe::rw(io::READ, 42, 1, 0, 1, false);
        s2.set_sgl(SglDescriptor {
            address: 0,
            length: 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        let (c, _) = p.command(s2, &[]);
        assert_eq!(c.status(), Status::CID_CONFLICT);
    }
}

fn with_c2h(mut s: Sqe, len: u32) -> Sqe {
    s.set_sgl(SglDescriptor {
        address: 0,
        length: len,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    s
}

#[test]
fn discovery_lists_only_allowed_subsystems_at_the_advertised_address() {
    let c = Config::default()
        .with_target(TargetSettings::default().with_advertise(Some("10.0.2.2".into()), Some(14420)))
        .with_subsystem(SubsystemConfig::new(SUBNQN).with_host(HOSTNQN))
        .with_subsystem(
            SubsystemConfig::new("nqn.2026-11.io.sluice:other")
                .with_host("nqn.2014-08.org.nvmexpress:uuid:someone-else"),
        )
        .validated()
        .unwrap();
    let r = registry(&c);
    let mut p = Pair::new(r.clone());
    p.icreq(false, false);
    let disc = p.connect_to(sluice_proto::DISCOVERY_NQN, 0, 0xffff, 0);
    assert_eq!(disc.status(), Status::SUCCESS);
    let disc_cntlid = disc.result as u16;
    assert_eq!(
        p.prop_set(sluice_proto::fabrics::prop::CC, 1),
        Status::SUCCESS
    );
    let (st, d) = p.identify(identify::cns::CONTROLLER, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(
        IdentifyController::decode(&d).unwrap().cntrltype,
        identify::cntrltype::DISCOVERY
    );
    // Header first, then the whole log.
    let g = GetLogPage {
        lid: lid::DISCOVERY,
        lsp: 0,
        rae: false,
        len_bytes: 1024,
        offset_bytes: 0,
    };
    let cid = p.cid();
    let (_, h) = p.command(with_c2h(g.to_sqe(cid, 0), 1024), &[]);
    let hdr = log::decode_discovery_header(&h).unwrap();
    assert_eq!(
        hdr.numrec, 2,
        "our subsystem + the current discovery subsystem"
    );
    let len = 1024 + 1024 * hdr.numrec;
    let g = GetLogPage {
        lid: lid::DISCOVERY,
        lsp: 0,
        rae: false,
        len_bytes: len,
        offset_bytes: 0,
    };
    let cid = p.cid();
    let (c, d) = p.command(with_c2h(g.to_sqe(cid, 0), len as u32), &[]);
    assert_eq!(c.status(), Status::SUCCESS);
    let e = log::decode_discovery_entries(&d, hdr.numrec);
    assert_eq!(e[0].subnqn, SUBNQN);
    assert_eq!(e[0].traddr, "10.0.2.2");
    assert_eq!(e[0].trsvcid, "14420");
    assert_eq!(e[0].trtype, log::TRTYPE_TCP);
    assert_eq!(e[0].subtype, log::subtype::NVME);
    assert_eq!(e[1].subtype, log::subtype::CURRENT_DISCOVERY);
    // No I/O queues on a discovery controller.
    let mut q = Pair::new(r.clone());
    q.icreq(false, false);
    assert_eq!(
        q.connect_to(sluice_proto::DISCOVERY_NQN, 1, disc_cntlid, 0)
            .status(),
        Status::CONNECT_INVALID_PARAMETERS
    );
}

/// A host with an empty HOSTNQN (SPDK's perf default): the discovery
/// controller admits it (as nvmet's `nvmet_host_allowed` and SPDK's
/// discovery subsystem do) and its log lists only the subsystems that admit
/// any host; an allow-listed subsystem refuses it with Connect Invalid Host.
#[test]
fn empty_hostnqn_discovers_only_open_subsystems() {
    const OPEN: &str = "nqn.2026-11.io.sluice:open";
    let c = Config::default()
        .with_subsystem(SubsystemConfig::new(SUBNQN).with_host(HOSTNQN))
        .with_subsystem(SubsystemConfig::new(OPEN).allow_any_host())
        .validated()
        .unwrap();
    let r = registry(&c);
    let mut p = Pair::new(r.clone());
    p.icreq(false, false);
    let disc = p.connect_as(sluice_proto::DISCOVERY_NQN, "", 0, CNTLID_DYNAMIC);
    assert_eq!(disc.status(), Status::SUCCESS);
    assert_eq!(
        p.prop_set(sluice_proto::fabrics::prop::CC, 1),
        Status::SUCCESS
    );
    let len: u32 = 1024 + 1024 * 3;
    let g = GetLogPage {
        lid: lid::DISCOVERY,
        lsp: 0,
        rae: false,
        len_bytes: len.into(),
        offset_bytes: 0,
    };
    let cid = p.cid();
    let (c, d) = p.command(with_c2h(g.to_sqe(cid, 0), len), &[]);
    assert_eq!(c.status(), Status::SUCCESS);
    let hdr = log::decode_discovery_header(&d).unwrap();
    assert_eq!(
        hdr.numrec, 2,
        "the open subsystem + the discovery subsystem"
    );
    let e = log::decode_discovery_entries(&d, hdr.numrec);
    assert_eq!(e[0].subnqn, OPEN);
    assert_eq!(e[1].subtype, log::subtype::CURRENT_DISCOVERY);

    for (sub, want) in [
        (OPEN, Status::SUCCESS),
        (SUBNQN, Status::CONNECT_INVALID_HOST),
    ] {
        let mut q = Pair::new(r.clone());
        q.icreq(false, false);
        let c = q.connect_as(sub, "", 0, CNTLID_DYNAMIC);
        assert_eq!(c.status(), want, "{sub}");
    }
    assert_eq!(r.subsystems()[SUBNQN].controller_count(), 0);
    assert_eq!(r.subsystems()[OPEN].controller_count(), 1);
}

#[test]
fn emulated_ssd_namespace_completes_in_virtual_time() {
    for mode in SEND_MODES {
        let ns = NamespaceConfig::emulated_ssd(
            1,
            4 << 20,
            SsdConfig::default()
                .with_base_read_latency_us(100)
                .with_base_write_latency_us(30),
        );
        let r = registry(&config_in(mode, ns));
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, false, false);
        let t0 = p.now;
        assert_eq!(p.write(16, &pattern(4096, 4), 8192), Status::SUCCESS);
        assert_eq!(p.read(16, 8), (Status::SUCCESS, pattern(4096, 4)));
        assert!(
            p.now - t0 >= Duration::from_micros(130),
            "service time elapsed in virtual time"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Random writes (in-capsule or R2T, any H2CData chunking) and reads
    /// agree with a byte-array model.
    #[test]
    fn random_io_matches_model(ops in prop::collection::vec((any::<bool>(), 0u64..8000, 1u32..48, any::<u8>(), 1usize..4), 1..24),
                               hdgst: bool, ddgst: bool) {
        for mode in SEND_MODES {
        let r = reg_in(mode);
        let (_a, cntlid) = admin_pair(&r);
        let mut p = io_pair(&r, cntlid, hdgst, ddgst);
        let mut model = vec![0u8; 4 * 1024 * 1024];
        for (is_write, slba, nlb, seed, chunk_k) in ops.iter().copied() {
            let off = slba as usize * 512;
            let len = nlb as usize * 512;
            if is_write {
                let d = pattern(len, seed);
                if len > 8192 {
                    // R2T path with a chosen H2CData size (<= MAXH2CDATA).
                    let cid = p.cid();
                    let mut s = Sqe::rw(io::WRITE, cid, 1, slba, nlb, false);
                    s.set_sgl(SglDescriptor { address: 0, length: len as u32, id: sgl::TRANSPORT_DATA_BLOCK });
                    p.send(&PduHeader::CapsuleCmd(s), &[]);
                    let r2t = match p.take().as_slice() { [Got { header: PduHeader::R2t(r), .. }] => *r, o => panic!("{o:?}") };
                    p.h2c_all(cid, r2t.ttag, &d, chunk_k * 2048);
                    let (c, _) = p.collect_response(cid);
                    prop_assert_eq!(c.status(), Status::SUCCESS);
                } else {
                    prop_assert_eq!(p.write(slba, &d, 8192), Status::SUCCESS);
                }
                model[off..off + len].copy_from_slice(&d);
            } else {
                let (st, d) = p.read(slba, nlb);
                prop_assert_eq!(st, Status::SUCCESS);
                prop_assert_eq!(&d[..], &model[off..off + len]);
            }
        }
        }
    }

    /// Random bytes after a valid ICReq never panic the target; it either
    /// waits for more, answers, or sends a TermReq with a valid FES and closes.
    #[test]
    fn garbage_after_icreq_is_handled(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        for mode in SEND_MODES {
        let mut p = Pair::new(reg_in(mode));
        p.icreq(false, false);
        p.conn.feed(&bytes, p.now);
        let due = p.conn.due_copy();
        p.conn.consume(due.len(), p.now);
        if let Some((fes, _)) = p.term {
            prop_assert!((1..=6).contains(&fes));
        }
        }
    }
}

/// A PDU held by the isolated scheduler leaves exactly at its freight's
/// deadline with no other traffic, and `poll_timeout` reports that deadline
/// (the worker sleeps on it).
#[test]
fn held_pdu_is_flushed_at_its_deadline() {
    let mut send = SendConfig {
        scheduler: SchedulerKind::Isolated,
        ..SendConfig::default()
    };
    send.latency.timer = Duration::from_micros(40);
    send.data.timer = Duration::from_micros(90);
    let r = registry(&config(send, default_ns()));
    let (_a, cntlid) = admin_pair(&r);
    let mut q = io_pair(&r, cntlid, false, false);
    // A 16 KiB write without in-capsule data: the R2T waits in the latency freight.
    let cid = q.cid();
    let mut s = Sqe::rw(io::WRITE, cid, 1, 0, 32, false);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 16384,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    let mut w = Vec::new();
    sluice_proto::pdu::encode_pdu(&PduHeader::CapsuleCmd(s), &[], &q.txp, &mut w);
    let t = q.now;
    let before = q.conn.send_stats();
    q.conn.feed(&w, t);
    assert!(q.conn.due().is_empty(), "R2T held");
    let d = t + Duration::from_micros(40);
    assert_eq!(q.conn.send_deadline(), Some(d));
    assert_eq!(q.conn.poll_timeout(), Some(d));
    q.conn.handle_timeout(d - Duration::from_nanos(1));
    assert!(q.conn.due().is_empty(), "not before the deadline");
    q.conn.handle_timeout(d);
    assert!(!q.conn.due().is_empty(), "flushed at the deadline");
    q.now = d;
    q.pump();
    let got = q.take();
    assert!(matches!(got[0].header, PduHeader::R2t(_)), "{got:?}");
    let st = q.conn.send_stats();
    use sluice_proto::send::FlushReason::Timer;
    assert_eq!(st.reason(Timer) - before.reason(Timer), 1);
    assert_eq!(st.wait_ns_latency - before.wait_ns_latency, 40_000);
}

/// Connections made at different moments but aligned to one origin wake for
/// their periodic checks at the same instants (idle connections then cost
/// one worker wake per interval, not one each).
#[test]
fn periodic_checks_of_aligned_connections_fall_on_one_grid() {
    use sluice_target::queue::{QueueConnection, CONTROLLER_CHECK_INTERVAL};
    let reg = reg_in("immediate");
    let origin = std::time::Instant::now();
    let mut a = QueueConnection::new(reg.clone(), None, None, origin + Duration::from_millis(13));
    let mut b = QueueConnection::new(reg.clone(), None, None, origin + Duration::from_millis(171));
    assert_ne!(a.poll_timeout(), b.poll_timeout(), "unaligned, they differ");
    a.align_checks_to(origin);
    b.align_checks_to(origin);
    assert_eq!(a.poll_timeout(), Some(origin + CONTROLLER_CHECK_INTERVAL));
    assert_eq!(b.poll_timeout(), a.poll_timeout());
    // After a check, the next one is one interval further, still shared.
    let t = origin + CONTROLLER_CHECK_INTERVAL + Duration::from_millis(3);
    a.handle_timeout(t);
    b.handle_timeout(t);
    assert_eq!(
        a.poll_timeout(),
        Some(origin + CONTROLLER_CHECK_INTERVAL * 2)
    );
    assert_eq!(b.poll_timeout(), a.poll_timeout());
}
