//! The NBD sans-IO codec: handshake scenarios, request round trips, every
//! malformed input's error, and random input never panicking.
#![allow(clippy::unwrap_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use proptest::prelude::*;
use sluice_export::errno::{EINVAL, ENOSPC, EPERM};
use sluice_export::nbd::proto::*;

fn export(read_only: bool) -> ExportInfo {
    ExportInfo {
        name: "disk".into(),
        description: "test".into(),
        size_bytes: 1 << 20,
        read_only,
        preferred_block_bytes: 4096,
    }
}

fn opt(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn info_data(name: &str, reqs: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
    for r in reqs {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

/// Parses option replies: (option, type, data).
fn replies(mut b: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = vec![];
    while !b.is_empty() {
        assert_eq!(
            u64::from_be_bytes(b[0..8].try_into().unwrap()),
            REPLY_MAGIC_OPT
        );
        let o = u32::from_be_bytes(b[8..12].try_into().unwrap());
        let t = u32::from_be_bytes(b[12..16].try_into().unwrap());
        let l = u32::from_be_bytes(b[16..20].try_into().unwrap()) as usize;
        out.push((o, t, b[20..20 + l].to_vec()));
        b = &b[20 + l..];
    }
    out
}

fn started(read_only: bool) -> ServerHandshake {
    let mut hs = ServerHandshake::new(export(read_only));
    let g = hs.take_output();
    assert_eq!(&g[0..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    assert_eq!(
        u16::from_be_bytes([g[16], g[17]]),
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
    );
    hs.feed(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    assert_eq!(hs.process(), Ok(HandshakeStatus::NeedMore));
    hs
}

#[test]
fn go_with_info_replies_and_leftover() {
    let mut hs = started(false);
    hs.feed(&opt(OPT_STRUCTURED_REPLY, &[]));
    hs.feed(&opt(
        OPT_INFO,
        &info_data("disk", &[INFO_NAME, INFO_DESCRIPTION]),
    ));
    let mut go = opt(OPT_GO, &info_data("", &[INFO_BLOCK_SIZE]));
    go.extend_from_slice(b"xyz"); // first bytes of transmission
    hs.feed(&go);
    let st = hs.process().unwrap();
    assert_eq!(
        st,
        HandshakeStatus::Done {
            leftover: b"xyz".to_vec()
        }
    );
    let r = replies(&hs.take_output());
    assert_eq!(r[0].0, OPT_STRUCTURED_REPLY);
    assert_eq!(r[0].1, REP_ACK);
    assert_eq!(
        hs.session(),
        Session {
            structured: true,
            base_allocation: false,
            size_bytes: Some(1 << 20),
        }
    );
    // INFO: export, block size, name, description, ack.
    let info: Vec<_> = r.iter().filter(|x| x.0 == OPT_INFO).collect();
    assert_eq!(info.len(), 5);
    assert_eq!(info[0].1, REP_INFO);
    assert_eq!(&info[0].2[0..2], &INFO_EXPORT.to_be_bytes());
    assert_eq!(
        u64::from_be_bytes(info[0].2[2..10].try_into().unwrap()),
        1 << 20
    );
    let flags = u16::from_be_bytes([info[0].2[10], info[0].2[11]]);
    assert_ne!(flags & TFLAG_SEND_FLUSH, 0);
    assert_ne!(flags & TFLAG_SEND_FUA, 0);
    assert_ne!(flags & TFLAG_SEND_TRIM, 0);
    assert_ne!(flags & TFLAG_SEND_WRITE_ZEROES, 0);
    assert_ne!(flags & TFLAG_CAN_MULTI_CONN, 0);
    assert_eq!(flags & TFLAG_READ_ONLY, 0);
    assert_eq!(&info[1].2[0..2], &INFO_BLOCK_SIZE.to_be_bytes());
    assert_eq!(u32::from_be_bytes(info[1].2[2..6].try_into().unwrap()), 1);
    assert_eq!(
        u32::from_be_bytes(info[1].2[6..10].try_into().unwrap()),
        4096
    );
    assert_eq!(
        u32::from_be_bytes(info[1].2[10..14].try_into().unwrap()),
        REQUEST_BYTES_MAX
    );
    assert_eq!(&info[2].2[2..], b"disk");
    assert_eq!(&info[3].2[2..], b"test");
    assert_eq!(info[4].1, REP_ACK);
    let go: Vec<_> = r.iter().filter(|x| x.0 == OPT_GO).collect();
    assert_eq!(go.last().unwrap().1, REP_ACK);
}

#[test]
fn export_name_with_and_without_zeroes() {
    for no_zeroes in [false, true] {
        let mut hs = ServerHandshake::new(export(true));
        hs.take_output();
        let f = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
        hs.feed(&f.to_be_bytes());
        hs.feed(&opt(OPT_EXPORT_NAME, b"disk"));
        assert!(matches!(hs.process(), Ok(HandshakeStatus::Done { .. })));
        let out = hs.take_output();
        assert_eq!(out.len(), if no_zeroes { 10 } else { 134 });
        assert_eq!(u64::from_be_bytes(out[0..8].try_into().unwrap()), 1 << 20);
        let flags = u16::from_be_bytes([out[8], out[9]]);
        assert_ne!(flags & TFLAG_READ_ONLY, 0);
    }
}

#[test]
fn list_abort_unknown_and_errors() {
    let mut hs = started(false);
    hs.feed(&opt(OPT_LIST, &[]));
    hs.feed(&opt(OPT_LIST, b"junk"));
    hs.feed(&opt(OPT_GO, &info_data("nope", &[])));
    hs.feed(&opt(OPT_GO, &[0, 0, 0, 9, b'a'])); // name length beyond data
    hs.feed(&opt(OPT_INFO, &info_data("disk", &[1, 2])[..12])); // truncated requests
    hs.feed(&opt(OPT_STARTTLS, &[]));
    hs.feed(&opt(0x1234, &[]));
    assert_eq!(hs.process(), Ok(HandshakeStatus::NeedMore));
    let r = replies(&hs.take_output());
    let types: Vec<u32> = r.iter().map(|x| x.1).collect();
    assert_eq!(
        types,
        vec![
            REP_SERVER,
            REP_ACK,
            REP_ERR_INVALID,
            REP_ERR_UNKNOWN,
            REP_ERR_INVALID,
            REP_ERR_INVALID,
            REP_ERR_UNSUP,
            REP_ERR_UNSUP
        ]
    );
    assert_eq!(&r[0].2[4..8], b"disk");
    // Oversized option: TOO_BIG, its data skipped even when fed in pieces.
    let big = vec![7u8; OPTION_PAYLOAD_BYTES_MAX as usize + 10];
    let o = opt(OPT_GO, &big);
    hs.feed(&o[..100]);
    assert_eq!(hs.process(), Ok(HandshakeStatus::NeedMore));
    hs.feed(&o[100..]);
    hs.feed(&opt(OPT_ABORT, &[]));
    assert_eq!(hs.process(), Ok(HandshakeStatus::Aborted));
    let r = replies(&hs.take_output());
    assert_eq!(r[0].1, REP_ERR_TOO_BIG);
    assert_eq!((r[1].0, r[1].1), (OPT_ABORT, REP_ACK));
}

#[test]
fn fatal_handshake_errors() {
    let mut hs = ServerHandshake::new(export(false));
    hs.feed(&0u32.to_be_bytes());
    assert_eq!(hs.process(), Err(HandshakeError::NotFixedNewstyle));
    let mut hs = ServerHandshake::new(export(false));
    hs.feed(&0x8000_0001u32.to_be_bytes());
    assert_eq!(
        hs.process(),
        Err(HandshakeError::BadClientFlags(0x8000_0001))
    );
    let mut hs = started(false);
    let mut o = opt(OPT_GO, &[]);
    o[0] = 0;
    hs.feed(&o);
    assert!(matches!(
        hs.process(),
        Err(HandshakeError::BadOptionMagic(_))
    ));
    let mut hs = started(false);
    hs.feed(&opt(OPT_EXPORT_NAME, b"other"));
    assert_eq!(
        hs.process(),
        Err(HandshakeError::UnknownExport("other".into()))
    );
    let mut hs = started(false);
    for _ in 0..=OPTIONS_MAX {
        hs.feed(&opt(OPT_LIST, &[]));
    }
    assert_eq!(hs.process(), Err(HandshakeError::TooManyOptions));
}

fn hdr(kind: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
    RequestHeader {
        flags,
        kind,
        cookie: 42,
        offset,
        length,
    }
}

#[test]
fn validation_errnos() {
    let rw = export(false);
    let ro = export(true);
    let size = rw.size_bytes;
    let v = |h: RequestHeader, e: &ExportInfo| validate(&h, e).map_err(|r| r.errno);
    assert_eq!(
        v(hdr(CMD_READ, 0, 1, 3), &rw),
        Ok(Command::Read {
            offset: 1,
            length: 3
        })
    );
    assert_eq!(
        v(hdr(CMD_WRITE, CMD_FLAG_FUA, 7, 9), &rw),
        Ok(Command::Write {
            offset: 7,
            fua: true
        })
    );
    assert_eq!(v(hdr(CMD_FLUSH, 0, 0, 0), &ro), Ok(Command::Flush));
    assert_eq!(v(hdr(CMD_DISC, 0, 0, 0), &rw), Ok(Command::Disconnect));
    assert_eq!(
        v(hdr(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 512), &rw),
        Ok(Command::WriteZeroes {
            offset: 0,
            length: 512,
            fua: false
        })
    );
    assert_eq!(v(hdr(CMD_READ, 0, size - 1, 2), &rw), Err(EINVAL));
    assert_eq!(v(hdr(CMD_TRIM, 0, size, 1), &rw), Err(EINVAL));
    assert_eq!(v(hdr(CMD_WRITE, 0, size - 1, 2), &rw), Err(ENOSPC));
    assert_eq!(v(hdr(CMD_WRITE_ZEROES, 0, u64::MAX, 2), &rw), Err(ENOSPC));
    assert_eq!(v(hdr(CMD_WRITE, 0, 0, 1), &ro), Err(EPERM));
    assert_eq!(v(hdr(CMD_TRIM, 0, 0, 1), &ro), Err(EPERM));
    assert_eq!(v(hdr(CMD_WRITE_ZEROES, 0, 0, 1), &ro), Err(EPERM));
    assert_eq!(v(hdr(CMD_READ, 0, 0, 0), &rw), Err(EINVAL));
    assert_eq!(
        v(hdr(CMD_READ, 0, 0, REQUEST_BYTES_MAX + 1), &rw),
        Err(EINVAL)
    );
    assert_eq!(v(hdr(CMD_FLUSH, 0, 1, 0), &rw), Err(EINVAL));
    assert_eq!(v(hdr(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1), &rw), Err(EINVAL));
    assert_eq!(v(hdr(CMD_DISC, CMD_FLAG_FUA, 0, 0), &rw), Err(EINVAL));
    assert_eq!(v(hdr(5, 0, 0, 1), &rw), Err(EINVAL)); // CACHE not offered
    assert_eq!(v(hdr(77, 0, 0, 1), &rw), Err(EINVAL));
}

#[test]
fn decoder_errors() {
    let mut d = RequestDecoder::new();
    let mut b = hdr(CMD_READ, 0, 0, 1).encode();
    b[0] ^= 1;
    d.feed(&b);
    assert!(matches!(
        d.next_request(),
        Err(TransmissionError::BadMagic(_))
    ));
    assert!(d.next_request().is_err(), "errors are sticky");
    let mut d = RequestDecoder::new();
    d.feed(&hdr(CMD_WRITE, 0, 0, REQUEST_BYTES_MAX + 1).encode());
    assert_eq!(
        d.next_request(),
        Err(TransmissionError::WriteTooLarge {
            cookie: 42,
            length: REQUEST_BYTES_MAX + 1
        })
    );
    // A huge read is not a framing error: the header is returned for EINVAL.
    let mut d = RequestDecoder::new();
    d.feed(&hdr(CMD_READ, 0, 0, u32::MAX).encode());
    assert!(d.next_request().unwrap().is_some());
}

#[test]
fn simple_reply_round_trip() {
    let b = encode_simple_reply(0xdead_beef_0102_0304, EINVAL);
    assert_eq!(
        decode_simple_reply(&b),
        Some((EINVAL, 0xdead_beef_0102_0304))
    );
    let mut bad = b;
    bad[0] = 0;
    assert_eq!(decode_simple_reply(&bad), None);
}

fn arb_header() -> impl Strategy<Value = RequestHeader> {
    (
        any::<u16>(),
        0u16..10,
        any::<u64>(),
        any::<u64>(),
        0u32..5000,
    )
        .prop_map(|(flags, kind, cookie, offset, length)| RequestHeader {
            flags,
            kind,
            cookie,
            offset,
            length,
        })
}

proptest! {
    /// Requests survive encoding, arbitrary fragmentation and decoding.
    #[test]
    fn requests_round_trip(hs in proptest::collection::vec(arb_header(), 1..8), cut in 1usize..64) {
        let mut wire = vec![];
        let mut expect = vec![];
        for h in &hs {
            wire.extend_from_slice(&h.encode());
            let payload: Vec<u8> = (0..h.payload_bytes()).map(|i| i as u8).collect();
            wire.extend_from_slice(&payload);
            expect.push(Incoming { header: *h, payload });
        }
        let mut d = RequestDecoder::new();
        let mut got = vec![];
        for piece in wire.chunks(cut) {
            d.feed(piece);
            while let Some(r) = d.next_request().unwrap() {
                got.push(r);
            }
        }
        prop_assert_eq!(got, expect);
        prop_assert_eq!(d.buffered(), 0);
    }

    /// Random bytes never panic the decoder or the validator.
    #[test]
    fn random_requests_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), magic in any::<bool>()) {
        let mut d = RequestDecoder::new();
        let mut b = bytes;
        if magic && b.len() >= 4 {
            b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        d.feed(&b);
        for _ in 0..20 {
            match d.next_request() {
                Ok(Some(r)) => { let _ = validate(&r.header, &export(false)); }
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// Random bytes never panic the handshake, whatever the fragmentation,
    /// and the outcome does not depend on it.
    #[test]
    fn random_handshake_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), cut in 1usize..50, valid_prefix in any::<bool>()) {
        let mut input = vec![];
        if valid_prefix {
            input.extend_from_slice(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
            input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        }
        input.extend_from_slice(&bytes);
        let run = |chunk: usize| {
            let mut hs = ServerHandshake::new(export(false));
            let mut out = hs.take_output();
            let mut last = Ok(HandshakeStatus::NeedMore);
            for piece in input.chunks(chunk) {
                hs.feed(piece);
                last = hs.process();
                out.extend(hs.take_output());
                if !matches!(last, Ok(HandshakeStatus::NeedMore)) { break; }
            }
            (last, out)
        };
        prop_assert_eq!(run(cut), run(input.len().max(1)));
    }

    /// Validation agrees with a direct statement of the rules.
    #[test]
    fn validation_model(h in arb_header(), ro in any::<bool>(), small in any::<bool>()) {
        let mut e = export(ro);
        let mut h = h;
        if small { h.offset %= 2 << 20; }
        if h.kind == CMD_FLUSH || h.kind == CMD_DISC { h.offset = 0; h.length = 0; }
        e.size_bytes = 1 << 20;
        let r = validate(&h, &e);
        let writes = matches!(h.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        let fits = h.offset.checked_add(h.length as u64).is_some_and(|x| x <= e.size_bytes);
        let allowed_flags = match h.kind { CMD_WRITE_ZEROES => 3, CMD_DISC => 0, 0 | 1 | 3 | 4 => 1, _ => 0 };
        let known = matches!(h.kind, 0..=4 | 6);
        match r {
            Ok(_) => {
                prop_assert!(known && h.flags & !allowed_flags == 0);
                prop_assert!(!(writes && ro));
                if !matches!(h.kind, CMD_FLUSH | CMD_DISC) { prop_assert!(fits && h.length > 0); }
            }
            Err(x) => {
                let expect_ok = known && h.flags & !allowed_flags == 0 && !(writes && ro)
                    && (matches!(h.kind, CMD_FLUSH | CMD_DISC) || (fits && h.length > 0));
                prop_assert!(!expect_ok, "refused {:?} with {}", h, x.errno);
            }
        }
    }
}

fn two_exports() -> ServerHandshake {
    let a = export(false);
    let b = ExportInfo {
        name: "second".into(),
        description: "tenant b".into(),
        size_bytes: 2 << 20,
        read_only: true,
        preferred_block_bytes: 4096,
    };
    let mut hs = ServerHandshake::with_exports(vec![a, b]);
    hs.take_output();
    hs.feed(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    hs
}

#[test]
fn several_exports_selected_by_name() {
    // LIST names every export.
    let mut hs = two_exports();
    hs.feed(&opt(OPT_LIST, &[]));
    assert_eq!(hs.process(), Ok(HandshakeStatus::NeedMore));
    let r = replies(&hs.take_output());
    let names: Vec<&[u8]> = r
        .iter()
        .filter(|(_, t, _)| *t == REP_SERVER)
        .map(|(_, _, d)| &d[4..4 + u32::from_be_bytes(d[..4].try_into().unwrap()) as usize])
        .collect();
    assert_eq!(names, vec![&b"disk"[..], &b"second"[..]]);
    // GO "second": its size and flags, selected() = 1.
    let mut hs = two_exports();
    hs.feed(&opt(OPT_GO, &info_data("second", &[])));
    assert!(matches!(hs.process(), Ok(HandshakeStatus::Done { .. })));
    assert_eq!(hs.selected(), 1);
    let r = replies(&hs.take_output());
    let info = &r
        .iter()
        .find(|(_, t, d)| *t == REP_INFO && d[..2] == INFO_EXPORT.to_be_bytes())
        .unwrap()
        .2;
    assert_eq!(u64::from_be_bytes(info[2..10].try_into().unwrap()), 2 << 20);
    assert_ne!(
        u16::from_be_bytes([info[10], info[11]]) & TFLAG_READ_ONLY,
        0
    );
    // EXPORT_NAME "" is the first; an unknown name still fails.
    let mut hs = two_exports();
    hs.feed(&opt(OPT_EXPORT_NAME, b""));
    assert!(matches!(hs.process(), Ok(HandshakeStatus::Done { .. })));
    assert_eq!(hs.selected(), 0);
    let mut hs = two_exports();
    hs.feed(&opt(OPT_EXPORT_NAME, b"second"));
    assert!(matches!(hs.process(), Ok(HandshakeStatus::Done { .. })));
    assert_eq!(hs.selected(), 1);
    let mut hs = two_exports();
    hs.feed(&opt(OPT_EXPORT_NAME, b"third"));
    assert!(hs.process().is_err());
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// Meta contexts: LIST names `base:allocation`; SET needs structured
/// replies, selects it by its full name only, and ignores other contexts;
/// malformed payloads and unknown exports get the right errors; GO of
/// another export leaves BLOCK_STATUS off.
#[test]
fn structured_replies_and_the_allocation_context() {
    let mut hs = started(false);
    hs.feed(&opt(
        OPT_SET_META_CONTEXT,
        &meta_data("disk", &["base:allocation"]),
    ));
    hs.feed(&opt(OPT_LIST_META_CONTEXT, &meta_data("", &[])));
    hs.feed(&opt(
        OPT_LIST_META_CONTEXT,
        &meta_data("disk", &["qemu:dirty-bitmap:x"]),
    ));
    hs.feed(&opt(OPT_LIST_META_CONTEXT, &meta_data("nope", &[])));
    hs.feed(&opt(OPT_LIST_META_CONTEXT, b"\0\0\0\x09disk"));
    hs.feed(&opt(OPT_STRUCTURED_REPLY, b"x"));
    hs.feed(&opt(OPT_STRUCTURED_REPLY, &[]));
    hs.feed(&opt(
        OPT_SET_META_CONTEXT,
        &meta_data("disk", &["qemu:dirty-bitmap:x", "base:allocation"]),
    ));
    assert_eq!(hs.process(), Ok(HandshakeStatus::NeedMore));
    let r = replies(&hs.take_output());
    let kinds: Vec<(u32, u32)> = r.iter().map(|x| (x.0, x.1)).collect();
    assert_eq!(
        kinds,
        vec![
            (OPT_SET_META_CONTEXT, REP_ERR_INVALID), // before structured replies
            (OPT_LIST_META_CONTEXT, REP_META_CONTEXT),
            (OPT_LIST_META_CONTEXT, REP_ACK),
            (OPT_LIST_META_CONTEXT, REP_ACK), // nothing matched
            (OPT_LIST_META_CONTEXT, REP_ERR_UNKNOWN),
            (OPT_LIST_META_CONTEXT, REP_ERR_INVALID),
            (OPT_STRUCTURED_REPLY, REP_ERR_INVALID),
            (OPT_STRUCTURED_REPLY, REP_ACK),
            (OPT_SET_META_CONTEXT, REP_META_CONTEXT),
            (OPT_SET_META_CONTEXT, REP_ACK),
        ]
    );
    assert_eq!(&r[1].2[4..], b"base:allocation");
    assert_eq!(
        u32::from_be_bytes(r[8].2[0..4].try_into().unwrap()),
        META_BASE_ALLOCATION_ID
    );
    assert_eq!(&r[8].2[4..], b"base:allocation");
    hs.feed(&opt(OPT_GO, &info_data("disk", &[])));
    assert!(matches!(hs.process(), Ok(HandshakeStatus::Done { .. })));
    let session = hs.session();
    assert_eq!(
        session,
        Session {
            structured: true,
            base_allocation: true,
            size_bytes: Some(1 << 20),
        }
    );

    // BLOCK_STATUS is checked like a read, and needs the context.
    let e = export(false);
    let v = |h: RequestHeader, s: Session| validate_in(&h, &e, s).map_err(|r| r.errno);
    assert_eq!(
        v(hdr(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 4096, 8192), session),
        Ok(Command::BlockStatus {
            offset: 4096,
            length: 8192,
            one: true
        })
    );
    assert_eq!(
        v(hdr(CMD_BLOCK_STATUS, 0, 0, 4096), Session::default()),
        Err(EINVAL)
    );
    assert_eq!(
        v(hdr(CMD_BLOCK_STATUS, CMD_FLAG_FUA, 0, 4096), session),
        Err(EINVAL)
    );
    assert_eq!(v(hdr(CMD_BLOCK_STATUS, 0, 0, 0), session), Err(EINVAL));
    // Not bound by the transfer limit: a question about the whole export.
    let big = ExportInfo {
        size_bytes: 8 << 30,
        ..export(false)
    };
    let told_big = Session {
        size_bytes: Some(big.size_bytes),
        ..session
    };
    assert!(validate_in(&hdr(CMD_BLOCK_STATUS, 0, 0, u32::MAX), &big, told_big).is_ok());
    assert_eq!(
        v(hdr(CMD_BLOCK_STATUS, 0, (1 << 20) - 512, 4096), session),
        Err(EINVAL)
    );
    // Read-only exports answer block status too.
    let ro = export(true);
    assert!(validate_in(&hdr(CMD_BLOCK_STATUS, 0, 0, 4096), &ro, session).is_ok());

    // A SET naming another export does not carry over to GO of this one.
    let mut hs = two_exports();
    hs.feed(&opt(OPT_STRUCTURED_REPLY, &[]));
    hs.feed(&opt(
        OPT_SET_META_CONTEXT,
        &meta_data("second", &["base:allocation"]),
    ));
    hs.feed(&opt(OPT_GO, &info_data("disk", &[])));
    assert!(matches!(hs.process(), Ok(HandshakeStatus::Done { .. })));
    assert!(!hs.session().base_allocation);
}

/// Structured reply chunks: header fields, payload layouts.
#[test]
fn structured_chunks_are_framed_as_the_protocol_says() {
    let head = |b: &[u8]| {
        (
            u32::from_be_bytes(b[0..4].try_into().unwrap()),
            u16::from_be_bytes(b[4..6].try_into().unwrap()),
            u16::from_be_bytes(b[6..8].try_into().unwrap()),
            u64::from_be_bytes(b[8..16].try_into().unwrap()),
            u32::from_be_bytes(b[16..20].try_into().unwrap()) as usize,
        )
    };
    let r = encode_read_chunk(7, 4096, b"abcd");
    assert_eq!(
        head(&r),
        (
            STRUCTURED_REPLY_MAGIC,
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            7,
            12
        )
    );
    assert_eq!(&r[20..28], &4096u64.to_be_bytes());
    assert_eq!(&r[28..], b"abcd");
    let r = encode_error_chunk(8, EINVAL, "bad");
    assert_eq!(
        head(&r),
        (
            STRUCTURED_REPLY_MAGIC,
            REPLY_FLAG_DONE,
            REPLY_TYPE_ERROR,
            8,
            9
        )
    );
    assert_eq!(&r[20..24], &EINVAL.to_be_bytes());
    assert_eq!(&r[24..26], &3u16.to_be_bytes());
    assert_eq!(&r[26..], b"bad");
    let r = encode_block_status(9, &[(4096, 0), (8192, STATE_HOLE | STATE_ZERO)]);
    assert_eq!(
        head(&r),
        (
            STRUCTURED_REPLY_MAGIC,
            REPLY_FLAG_DONE,
            REPLY_TYPE_BLOCK_STATUS,
            9,
            20
        )
    );
    assert_eq!(&r[20..24], &META_BASE_ALLOCATION_ID.to_be_bytes());
    assert_eq!(&r[24..32], &[0, 0, 0x10, 0, 0, 0, 0, 0]);
    assert_eq!(&r[32..40], &[0, 0, 0x20, 0, 0, 0, 0, 3]);
}

/// A handshake that does not offer structured replies refuses the option
/// with NBD_REP_ERR_POLICY, so SET_META_CONTEXT is refused too, and the
/// session after GO is all simple replies.
#[test]
fn a_handshake_without_structured_replies_refuses_them_by_policy() {
    let mut hs = ServerHandshake::new(export(false)).offering_structured_replies(false);
    let _ = hs.take_output();
    hs.feed(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    hs.feed(&opt(OPT_STRUCTURED_REPLY, &[]));
    hs.feed(&opt(
        OPT_SET_META_CONTEXT,
        &meta_data("disk", &["base:allocation"]),
    ));
    assert_eq!(hs.process(), Ok(HandshakeStatus::NeedMore));
    let kinds: Vec<(u32, u32)> = replies(&hs.take_output())
        .iter()
        .map(|x| (x.0, x.1))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (OPT_STRUCTURED_REPLY, REP_ERR_POLICY),
            (OPT_SET_META_CONTEXT, REP_ERR_INVALID),
        ]
    );
    hs.feed(&opt(OPT_GO, &info_data("disk", &[])));
    assert!(matches!(hs.process(), Ok(HandshakeStatus::Done { .. })));
    assert_eq!(
        hs.session(),
        Session {
            size_bytes: Some(1 << 20),
            ..Session::default()
        }
    );
}
