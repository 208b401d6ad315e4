//! The NBD server's decoders on arbitrary client bytes: the handshake
//! (options, export names, meta-context queries) and then the transmission
//! phase's request decoder and validation. Neither panics, the handshake
//! ends or asks for more, and every request is either refused with an
//! errno or valid for the export.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_export::nbd::proto::{
    validate_in, ExportInfo, HandshakeStatus, RequestDecoder, ServerHandshake,
};

fuzz_target!(|data: &[u8]| {
    // The first byte splits the input into feeds (as reads would).
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let export = ExportInfo {
        name: "disk".into(),
        description: "fuzz".into(),
        size_bytes: 64 << 20,
        read_only: cut & 1 == 1,
        preferred_block_bytes: 4096,
    };
    let mut hs = ServerHandshake::with_exports(vec![
        export.clone(),
        ExportInfo {
            name: "other".into(),
            ..export.clone()
        },
    ])
    .offering_structured_replies(cut & 2 == 0);
    let _ = hs.take_output();
    let mut leftover = None;
    let mut at = 0;
    while at < rest.len() {
        let end = (at + step).min(rest.len());
        hs.feed(&rest[at..end]);
        at = end;
        match hs.process() {
            Ok(HandshakeStatus::NeedMore) => {}
            Ok(HandshakeStatus::Done { leftover: l }) => {
                leftover = Some(l);
                break;
            }
            Ok(HandshakeStatus::Aborted) | Err(_) => return,
        }
        let out = hs.take_output();
        assert!(out.len() <= 1 << 20, "a reply of {} bytes", out.len());
    }
    let Some(leftover) = leftover else { return };
    let session = hs.session();
    // A server that refuses structured replies never ends up with them.
    assert!(cut & 2 == 0 || (!session.structured && !session.base_allocation));
    let selected = hs.selected();
    assert!(selected < 2);
    let mut dec = RequestDecoder::new();
    dec.feed(&leftover);
    dec.feed(&rest[at..]);
    for _ in 0..10_000 {
        match dec.next_request() {
            Ok(Some(req)) => {
                if let Ok(cmd) = validate_in(&req.header, &export, session) {
                    let _ = format!("{cmd:?}");
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
});
