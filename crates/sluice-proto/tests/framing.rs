//! Encode/decode round trips through the streaming framer, and every decode
//! error mapped to its TermReq FES.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use proptest::prelude::*;
use sluice_proto::command::{Cqe, Sqe, StatusField};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::*;

const MAX: u32 = 1 << 20;

fn arb_sqe() -> impl Strategy<Value = Sqe> {
    prop::collection::vec(any::<u8>(), 64).prop_map(|v| {
        let mut a = [0u8; 64];
        a.copy_from_slice(&v);
        Sqe(a)
    })
}

fn arb_h2c() -> impl Strategy<Value = (PduHeader, Vec<u8>)> {
    prop_oneof![
        (arb_sqe(), prop::collection::vec(any::<u8>(), 0..9000))
            .prop_map(|(s, d)| (PduHeader::CapsuleCmd(s), d)),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 1..9000)
        )
            .prop_map(|(cccid, ttag, offset, last, d)| {
                (
                    PduHeader::H2CData(DataHeader {
                        cccid,
                        ttag,
                        offset,
                        len: d.len() as u32,
                        last,
                        success: false,
                    }),
                    d,
                )
            }),
    ]
}

fn arb_c2h() -> impl Strategy<Value = (PduHeader, Vec<u8>)> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u32>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>()
        )
            .prop_map(|(result, dw1, sqhd, sqid, cid, st)| {
                (
                    PduHeader::CapsuleResp(Cqe {
                        result,
                        dw1,
                        sqhd,
                        sqid,
                        cid,
                        status: StatusField(st),
                    }),
                    vec![],
                )
            }),
        (
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 1..9000)
        )
            .prop_map(|(cccid, offset, last, success, d)| {
                (
                    PduHeader::C2HData(DataHeader {
                        cccid,
                        ttag: 0,
                        offset,
                        len: d.len() as u32,
                        last: last || success,
                        success,
                    }),
                    d,
                )
            }),
        (any::<u16>(), any::<u16>(), any::<u32>(), 1u32..).prop_map(
            |(cccid, ttag, offset, len)| {
                (
                    PduHeader::R2t(R2t {
                        cccid,
                        ttag,
                        offset,
                        len,
                    }),
                    vec![],
                )
            }
        ),
    ]
}

/// Encodes `pdus` on an initialized connection, feeds them in `chunk`-sized
/// pieces, and checks every PDU comes out unchanged.
fn round_trip(
    dir: Direction,
    pdus: &[(PduHeader, Vec<u8>)],
    tx: TxParams,
    chunk: usize,
) -> Result<(), TestCaseError> {
    let mut wire = Vec::new();
    for (h, d) in pdus {
        encode_pdu(h, d, &tx, &mut wire);
    }
    let mut f = Framer::new(dir, MAX);
    f.set_initialized(tx.hdgst, tx.ddgst, tx.pda, MAX);
    let mut got = Vec::new();
    for piece in wire.chunks(chunk.max(1)) {
        f.feed(piece);
        while let Some(p) = f
            .next_pdu()
            .map_err(|e| TestCaseError::fail(e.to_string()))?
        {
            prop_assert!(p.data_digest_ok);
            got.push((p.header, p.data.to_vec()));
        }
    }
    prop_assert_eq!(f.buffered(), 0);
    prop_assert_eq!(got.as_slice(), pdus);
    Ok(())
}

proptest! {
    #[test]
    fn h2c_round_trip(pdus in prop::collection::vec(arb_h2c(), 1..6), hdgst: bool, ddgst: bool, pda in 0u8..8, chunk in 1usize..20000) {
        round_trip(Direction::HostToController, &pdus, TxParams { hdgst, ddgst, pda }, chunk)?;
    }

    #[test]
    fn c2h_round_trip(pdus in prop::collection::vec(arb_c2h(), 1..6), hdgst: bool, ddgst: bool, pda in 0u8..8, chunk in 1usize..20000) {
        round_trip(Direction::ControllerToHost, &pdus, TxParams { hdgst, ddgst, pda }, chunk)?;
    }

    #[test]
    fn ic_round_trip(hpda in 0u8..32, hdgst: bool, ddgst: bool, maxr2t: u32, maxh2c in 1024u32..(1 << 28)) {
        let req = PduHeader::IcReq(IcReq { pfv: 0, hpda, hdgst, ddgst, maxr2t });
        let mut f = Framer::new(Direction::HostToController, MAX);
        let mut w = Vec::new();
        encode_pdu(&req, &[], &TxParams::default(), &mut w);
        prop_assert_eq!(w.len(), IC_LEN);
        f.feed(&w);
        prop_assert_eq!(f.next_pdu().unwrap().unwrap().header, req);

        let resp = PduHeader::IcResp(IcResp { pfv: 0, cpda: hpda, hdgst, ddgst, maxh2cdata: maxh2c * 4 });
        let mut f = Framer::new(Direction::ControllerToHost, MAX);
        let mut w = Vec::new();
        encode_pdu(&resp, &[], &TxParams::default(), &mut w);
        f.feed(&w);
        prop_assert_eq!(f.next_pdu().unwrap().unwrap().header, resp);
    }

    /// Arbitrary bytes never panic the framer, and an error is sticky.
    #[test]
    fn garbage_never_panics(init: bool, bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let mut f = Framer::new(Direction::HostToController, 65536);
        if init { f.set_initialized(true, true, 0, 65536); }
        f.feed(&bytes);
        let mut n = 0;
        loop {
            match f.next_pdu() {
                Ok(Some(_)) => { n += 1; prop_assert!(n < 10_000); }
                Ok(None) => break,
                Err(e) => {
                    prop_assert!((1..=6).contains(&e.fes()));
                    prop_assert!(f.next_pdu().is_err());
                    break;
                }
            }
        }
    }
}

fn init_framer(hdgst: bool, ddgst: bool) -> Framer {
    let mut f = Framer::new(Direction::HostToController, 8192);
    f.set_initialized(hdgst, ddgst, 0, 8192);
    f
}

fn capsule(tx: TxParams, data: &[u8]) -> Vec<u8> {
    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::CapsuleCmd(Sqe::new(0x02, 1, 1)),
        data,
        &tx,
        &mut w,
    );
    w
}

fn err_of(f: &mut Framer, w: &[u8]) -> DecodeError {
    f.feed(w);
    match f.next_pdu() {
        Err(e) => e,
        Ok(p) => panic!("expected an error, got {p:?}"),
    }
}

#[test]
fn unknown_type_is_invalid_header_field_at_byte_0() {
    let mut w = capsule(TxParams::default(), &[]);
    w[0] = 0x08;
    let e = err_of(&mut init_framer(false, false), &w);
    assert_eq!((e.fes(), e.fei()), (fes::INVALID_HEADER_FIELD, 0));
}

#[test]
fn c2h_type_sent_to_controller_is_rejected() {
    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::CapsuleResp(Cqe::default()),
        &[],
        &TxParams::default(),
        &mut w,
    );
    let e = err_of(&mut init_framer(false, false), &w);
    assert_eq!(e.fes(), fes::INVALID_HEADER_FIELD);
}

#[test]
fn wrong_hlen_names_hlen() {
    let mut w = capsule(TxParams::default(), &[]);
    w[2] = 24;
    let e = err_of(&mut init_framer(false, false), &w);
    assert_eq!((e.fes(), e.fei()), (fes::INVALID_HEADER_FIELD, 2));
    assert!(e.to_string().contains("hlen"));
}

#[test]
fn plen_too_short_and_too_long() {
    let mut w = capsule(TxParams::default(), &[]);
    w[4..8].copy_from_slice(&10u32.to_le_bytes());
    let e = err_of(&mut init_framer(false, false), &w);
    assert_eq!((e.fes(), e.fei()), (fes::INVALID_HEADER_FIELD, 4));

    // An in-capsule payload beyond the receiver's limit is refused (FES 05h)
    // from the common header alone, before the data is buffered.
    let mut w = capsule(TxParams::default(), &[0; 16]);
    w[4..8].copy_from_slice(&(72 + 100_000u32).to_le_bytes());
    let mut f = init_framer(false, false);
    f.feed(&w[..8]);
    let e = f.next_pdu().unwrap_err();
    assert_eq!((e.fes(), e.fei()), (fes::DATA_LIMIT_EXCEEDED, 0));
}

#[test]
fn h2c_data_over_limit_is_data_limit_exceeded() {
    let mut w = Vec::new();
    let d = vec![0u8; 9000];
    let h = PduHeader::H2CData(DataHeader {
        cccid: 1,
        ttag: 1,
        offset: 0,
        len: 9000,
        last: true,
        success: false,
    });
    encode_pdu(&h, &d, &TxParams::default(), &mut w);
    let e = err_of(&mut init_framer(false, false), &w);
    assert_eq!(e.fes(), fes::DATA_LIMIT_EXCEEDED);
}

#[test]
fn misaligned_pdo_names_pdo() {
    let mut f = Framer::new(Direction::HostToController, 8192);
    f.set_initialized(false, false, 1, 8192); // data must be 8-byte aligned
    let mut w = capsule(
        TxParams {
            pda: 0,
            ..Default::default()
        },
        &[1; 8],
    );
    w[3] = 76;
    let e = err_of(&mut f, &w);
    assert_eq!((e.fes(), e.fei()), (fes::INVALID_HEADER_FIELD, 3));
}

#[test]
fn header_digest_mismatch_is_fes_3_with_received_value() {
    let mut w = capsule(
        TxParams {
            hdgst: true,
            ..Default::default()
        },
        &[],
    );
    w[10] ^= 0xff; // corrupt the SQE
    let received = u32::from_le_bytes([w[72], w[73], w[74], w[75]]);
    let e = err_of(&mut init_framer(true, false), &w);
    assert_eq!((e.fes(), e.fei()), (fes::HEADER_DIGEST_ERROR, received));
}

#[test]
fn missing_header_digest_flag_is_rejected() {
    let w = capsule(TxParams::default(), &[]);
    let e = err_of(&mut init_framer(true, false), &w);
    assert_eq!((e.fes(), e.fei()), (fes::INVALID_HEADER_FIELD, 1));
}

#[test]
fn data_digest_mismatch_is_reported_not_fatal() {
    let tx = TxParams {
        hdgst: false,
        ddgst: true,
        pda: 0,
    };
    let mut w = capsule(tx, &[7; 64]);
    let n = w.len();
    w[n - 1] ^= 1;
    w.extend_from_slice(&capsule(tx, &[8; 64]));
    let mut f = init_framer(false, true);
    f.feed(&w);
    assert!(!f.next_pdu().unwrap().unwrap().data_digest_ok);
    let p = f.next_pdu().unwrap().unwrap();
    assert!(p.data_digest_ok);
    assert_eq!(p.data, &[8; 64]);
}

#[test]
fn capsule_before_icreq_is_sequence_error() {
    let mut f = Framer::new(Direction::HostToController, 8192);
    let e = err_of(&mut f, &capsule(TxParams::default(), &[]));
    assert_eq!(e.fes(), fes::PDU_SEQUENCE_ERROR);
}

#[test]
fn second_icreq_is_sequence_error() {
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
    let e = err_of(&mut init_framer(false, false), &w);
    assert_eq!(e.fes(), fes::PDU_SEQUENCE_ERROR);
}

#[test]
fn wrong_pfv_is_unsupported_parameter() {
    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::IcReq(IcReq {
            pfv: 1,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }),
        &[],
        &TxParams::default(),
        &mut w,
    );
    let e = err_of(&mut Framer::new(Direction::HostToController, 8192), &w);
    assert_eq!((e.fes(), e.fei()), (fes::UNSUPPORTED_PARAMETER, 8));
}

/// Reserved ICReq bytes and DGST bits are the controller's to ignore (as
/// nvmet and nvmf_tgt do; the target logs them once), and
/// `ignored_header_fields` names them; the host still refuses them in an
/// ICResp.
#[test]
fn icreq_reserved_bytes_are_ignored_icresp_reserved_bytes_are_not() {
    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: true,
            maxr2t: 0,
        }),
        &[],
        &TxParams::default(),
        &mut w,
    );
    w[100] = 1;
    w[11] |= 0x10;
    let mut f = Framer::new(Direction::HostToController, 8192);
    f.feed(&w);
    let p = f.next_pdu().unwrap().unwrap();
    assert!(matches!(
        p.header,
        PduHeader::IcReq(IcReq {
            ddgst: true,
            hdgst: false,
            ..
        })
    ));
    let ignored: Vec<_> =
        sluice_proto::pdu::ignored_header_fields(p.raw_header, p.data.len()).collect();
    assert_eq!(ignored, [IgnoredField::ReservedBytes]);

    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: false,
            ddgst: false,
            maxh2cdata: 8192,
        }),
        &[],
        &TxParams::default(),
        &mut w,
    );
    w[100] = 1;
    let e = err_of(&mut Framer::new(Direction::ControllerToHost, 8192), &w);
    assert_eq!((e.fes(), e.fei()), (fes::INVALID_HEADER_FIELD, 100));
}

#[test]
fn error_quote_is_the_offending_header() {
    let mut w = Vec::new();
    let h = PduHeader::H2CData(DataHeader {
        cccid: 1,
        ttag: 1,
        offset: 0,
        len: 16,
        last: true,
        success: false,
    });
    encode_pdu(&h, &[0; 16], &TxParams::default(), &mut w);
    w[16..20].copy_from_slice(&15u32.to_le_bytes());
    let mut f = init_framer(false, false);
    f.feed(&w);
    assert!(f.next_pdu().is_err());
    assert_eq!(f.current_header(), &w[..24]);
    // A bad common header is quoted as far as it arrived.
    let mut w2 = capsule(TxParams::default(), &[]);
    w2[2] = 40;
    let mut f = init_framer(false, false);
    f.feed(&w2);
    assert!(f.next_pdu().is_err());
    assert_eq!(f.current_header(), &w2[..40]);
}

#[test]
fn datal_must_match_payload() {
    let mut w = Vec::new();
    let h = PduHeader::H2CData(DataHeader {
        cccid: 1,
        ttag: 1,
        offset: 0,
        len: 16,
        last: true,
        success: false,
    });
    encode_pdu(&h, &[0; 16], &TxParams::default(), &mut w);
    w[16..20].copy_from_slice(&15u32.to_le_bytes());
    let e = err_of(&mut init_framer(false, false), &w);
    assert_eq!((e.fes(), e.fei()), (fes::INVALID_HEADER_FIELD, 16));
}

#[test]
fn term_req_quotes_header() {
    let e = DecodeError::invalid("hlen", 2, "x");
    let t = term_req_for(&e, &[9; 200]);
    assert_eq!(t.data.len(), TERM_REQ_DATA_MAX);
    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::C2HTermReq(t.clone()),
        &t.data,
        &TxParams {
            hdgst: true,
            ddgst: true,
            pda: 0,
        },
        &mut w,
    );
    // TermReqs never carry digests.
    assert_eq!(w.len(), SHORT_HLEN + TERM_REQ_DATA_MAX);
    let mut f = Framer::new(Direction::ControllerToHost, 8192);
    f.set_initialized(true, true, 0, 8192);
    f.feed(&w);
    match f.next_pdu().unwrap().unwrap().header {
        PduHeader::C2HTermReq(got) => assert_eq!(got, t),
        other => panic!("{other:?}"),
    }
}

/// Nothing is allocated before the first read; a small read chunk keeps the
/// buffer small while an ICReq and a Connect-sized capsule go through, and
/// raising it grows the buffer at the next read that needs room.
#[test]
fn buffer_follows_the_read_chunk() {
    let mut f = Framer::new(Direction::HostToController, 1024);
    assert_eq!(f.capacity_bytes(), 0, "nothing allocated before a read");
    f.set_read_chunk(256);
    assert_eq!(f.read_chunk(), 256);
    let mut w = Vec::new();
    let req = PduHeader::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    });
    encode_pdu(&req, &[], &TxParams::default(), &mut w);
    f.feed(&w);
    assert_eq!(f.next_pdu().unwrap().unwrap().header, req);
    assert_eq!(f.capacity_bytes(), 512, "twice the read chunk");
    assert!(f.read_buf().len() >= 256);

    f.set_initialized(false, false, 0, 1024);
    let w = capsule(TxParams::default(), &[7; 1024]);
    f.feed(&w);
    let p = f.next_pdu().unwrap().unwrap();
    assert_eq!(p.data, &[7; 1024][..]);
    assert!(
        f.capacity_bytes() <= 4096,
        "a Connect-sized capsule needs about its own size, got {}",
        f.capacity_bytes()
    );

    f.set_read_chunk(64 * 1024);
    assert!(f.read_buf().len() >= 64 * 1024);
    assert!(f.capacity_bytes() >= 128 * 1024);
    // A chunk below one common header is raised to it.
    f.set_read_chunk(1);
    assert_eq!(f.read_chunk(), 8);
}

/// `set_data_len_max` applies from the next PDU on: a capsule over the new
/// limit is refused naming PLEN, one within it passes.
#[test]
fn data_len_max_can_be_raised_after_init() {
    let mut f = Framer::new(Direction::HostToController, 1024);
    f.set_initialized(false, false, 0, 1024);
    let e = err_of(&mut f, &capsule(TxParams::default(), &[1; 2048]));
    assert_eq!((e.fes(), e.fei()), (fes::DATA_LIMIT_EXCEEDED, 0));

    let mut f = Framer::new(Direction::HostToController, 1024);
    f.set_initialized(false, false, 0, 1024);
    f.set_data_len_max(8192);
    f.feed(&capsule(TxParams::default(), &[1; 2048]));
    assert_eq!(f.next_pdu().unwrap().unwrap().data.len(), 2048);
}

fn c2h_data_pdu(tx: TxParams, len: usize) -> Vec<u8> {
    let mut w = Vec::new();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
    encode_pdu(
        &PduHeader::C2HData(DataHeader {
            cccid: 5,
            ttag: 0,
            offset: 0,
            len: len as u32,
            last: true,
            success: true,
        }),
        &data,
        &tx,
        &mut w,
    );
    w
}

fn host_framer(hdgst: bool, ddgst: bool) -> Framer {
    let mut f = Framer::new(Direction::ControllerToHost, MAX);
    f.set_initialized(hdgst, ddgst, 0, MAX);
    f
}

/// A data PDU is split off only once its header is in and enough of its
/// data is missing; the head comes out, the rest and the digest are the
/// caller's, and the framer then goes on with the next PDU.
#[test]
fn split_data_hands_out_the_head_and_leaves_the_rest() {
    for (hdgst, ddgst) in [(false, false), (true, true)] {
        let tx = TxParams {
            hdgst,
            ddgst,
            pda: 0,
        };
        let w = c2h_data_pdu(tx, 65536);
        let data_at = 24 + if hdgst { 4 } else { 0 };
        let mut f = host_framer(hdgst, ddgst);
        // Header not complete: nothing to split.
        f.feed(&w[..data_at - 1]);
        assert!(f.next_pdu().unwrap().is_none());
        assert!(f.split_data(1).unwrap().is_none());
        f.feed(&w[data_at - 1..data_at + 1000]);
        assert!(f.next_pdu().unwrap().is_none());
        // Too little missing for the threshold asked.
        assert!(f.split_data(65536).unwrap().is_none());
        let sp = f.split_data(4096).unwrap().unwrap();
        assert!(matches!(sp.header, PduHeader::C2HData(d) if d.len == 65536 && d.cccid == 5));
        assert_eq!(sp.data_head, &w[data_at..data_at + 1000]);
        assert_eq!(sp.data_rest, 65536 - 1000);
        assert_eq!(sp.ddgst, ddgst);
        assert_eq!(sp.raw_header.len(), 24);
        assert_eq!(f.buffered(), 0);
        // The caller receives the rest; then the digest and a next PDU
        // arrive through the framer.
        let data_end = data_at + 65536;
        let mut next = w[data_end..].to_vec();
        next.extend_from_slice(&c2h_data_pdu(tx, 100));
        f.feed(&next);
        if ddgst {
            assert_eq!(f.take_bytes(4).unwrap(), &w[data_end..data_end + 4]);
        }
        let p = f.next_pdu().unwrap().unwrap();
        assert!(matches!(p.header, PduHeader::C2HData(d) if d.len == 100));
        assert!(p.data_digest_ok);
        assert!(f.take_bytes(1).is_none());
    }
}

/// `split_data` checks the header digest itself: bytes fed after the last
/// `next_pdu` (which saw only the common header) may complete a header
/// whose digest is wrong, and the split must not hand it out.
#[test]
fn split_data_refuses_a_header_with_a_wrong_digest() {
    let tx = TxParams {
        hdgst: true,
        ddgst: false,
        pda: 0,
    };
    let mut w = c2h_data_pdu(tx, 65536);
    w[12] ^= 0x01; // the data offset field, under the digest
    let received = u32::from_le_bytes([w[24], w[25], w[26], w[27]]);
    let mut f = host_framer(true, false);
    f.feed(&w[..8]);
    assert!(
        f.next_pdu().unwrap().is_none(),
        "only the common header is in"
    );
    f.feed(&w[8..28 + 1000]);
    let e = f
        .split_data(4096)
        .map(|_| ())
        .expect_err("a wrong header digest is refused");
    assert_eq!((e.fes(), e.fei()), (fes::HEADER_DIGEST_ERROR, received));
    // Poisoned: the next call says the same.
    assert!(f.next_pdu().is_err());
}

/// A CapsuleCmd with in-capsule data splits as a data PDU does, when its
/// caller accepts the header; refused, it stays in the framer untouched
/// and comes out whole later. `split_data` never splits it.
#[test]
fn split_pdu_splits_a_capsule_with_data_only_when_accepted() {
    for (hdgst, ddgst, pda) in [(false, false, 0), (true, true, 0), (false, true, 3)] {
        let tx = TxParams { hdgst, ddgst, pda };
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let sqe = Sqe::new(0x01, 9, 1);
        let mut w = Vec::new();
        encode_pdu(&PduHeader::CapsuleCmd(sqe), &data, &tx, &mut w);
        let data_at = w.len() - data.len() - if ddgst { 4 } else { 0 };
        let mut f = Framer::new(Direction::HostToController, MAX);
        f.set_initialized(hdgst, ddgst, pda, MAX);
        f.feed(&w[..data_at + 3000]);
        assert!(f.next_pdu().unwrap().is_none());
        assert!(
            f.split_data(1).unwrap().is_none(),
            "split_data: data PDUs only"
        );
        assert!(f.split_pdu(1, |_| false).unwrap().is_none());
        assert_eq!(
            f.buffered(),
            data_at + 3000,
            "a refused split moved the framer"
        );
        let sp = f
            .split_pdu(
                4096,
                |h| matches!(h, PduHeader::CapsuleCmd(s) if s.cid() == 9),
            )
            .unwrap()
            .unwrap();
        assert_eq!(sp.data_head, &data[..3000]);
        assert_eq!(sp.data_rest, 65536 - 3000);
        assert_eq!(sp.ddgst, ddgst);
        assert_eq!(sp.raw_header.len(), 72);
        assert_eq!(f.buffered(), 0);
        // The rest goes elsewhere; the digest and the next PDU come through.
        let mut next = w[data_at + 65536..].to_vec();
        encode_pdu(
            &PduHeader::CapsuleCmd(Sqe::new(0x02, 10, 1)),
            &[],
            &tx,
            &mut next,
        );
        f.feed(&next);
        if ddgst {
            assert_eq!(f.take_bytes(4).unwrap(), &w[w.len() - 4..]);
        }
        let p = f.next_pdu().unwrap().unwrap();
        assert!(matches!(p.header, PduHeader::CapsuleCmd(s) if s.cid() == 10));
        // Refused throughout, the same capsule comes out whole.
        let mut f = Framer::new(Direction::HostToController, MAX);
        f.set_initialized(hdgst, ddgst, pda, MAX);
        for c in w.chunks(5000) {
            f.feed(c);
            assert!(f.split_pdu(1, |_| false).unwrap().is_none());
        }
        let p = f.next_pdu().unwrap().unwrap();
        assert!(matches!(p.header, PduHeader::CapsuleCmd(s) if s.cid() == 9));
        assert_eq!(p.data, &data[..]);
        assert!(p.data_digest_ok);
    }
}

#[test]
fn split_data_leaves_other_pdus_and_whole_pdus_alone() {
    let mut f = host_framer(false, false);
    let mut w = Vec::new();
    encode_pdu(
        &PduHeader::CapsuleResp(Cqe::new(1, sluice_proto::Status::SUCCESS)),
        &[],
        &TxParams::default(),
        &mut w,
    );
    f.feed(&w[..10]);
    assert!(f.next_pdu().unwrap().is_none());
    assert!(f.split_data(1).unwrap().is_none());
    f.feed(&w[10..]);
    assert!(f.next_pdu().unwrap().is_some());
    // All of a data PDU's data is in (only the digest missing): no split.
    let tx = TxParams {
        hdgst: false,
        ddgst: true,
        pda: 0,
    };
    let mut f = host_framer(false, true);
    let w = c2h_data_pdu(tx, 8192);
    f.feed(&w[..w.len() - 2]);
    assert!(f.next_pdu().unwrap().is_none());
    assert!(f.split_data(1).unwrap().is_none());
}

#[test]
fn split_data_checks_the_header_digest_and_poisons() {
    let tx = TxParams {
        hdgst: true,
        ddgst: false,
        pda: 0,
    };
    let mut w = c2h_data_pdu(tx, 65536);
    w[9] ^= 0xff; // corrupt the header
    let mut f = host_framer(true, false);
    f.feed(&w[..27]); // header and 3 bytes of its digest: not yet checked
    assert!(f.next_pdu().unwrap().is_none());
    assert!(f.split_data(1).unwrap().is_none());
    f.feed(&w[27..]);
    let e = f.split_data(1).err().or_else(|| f.next_pdu().err());
    let e = e.expect("header digest error");
    assert_eq!(e.fes(), fes::HEADER_DIGEST_ERROR);
    assert_eq!(f.next_pdu().err(), Some(e.clone()), "sticky");
    assert_eq!(f.split_data(1).err(), Some(e));
    assert_eq!(f.current_header(), &w[..24]);
}

/// A read that fills the in-place buffer and spills into the framer's.
#[test]
fn in_place_takes_its_bytes_first() {
    use sluice_proto::framer::InPlace;
    let mut p = InPlace { at: 100, left: 50 };
    assert_eq!(p.range(), 100..150);
    assert_eq!(p.take(20), 0);
    assert_eq!(p, InPlace { at: 120, left: 30 });
    assert_eq!(p.take(40), 10, "10 bytes went past it");
    assert_eq!(p, InPlace { at: 150, left: 0 });
    assert_eq!(p.take(7), 7);
}
