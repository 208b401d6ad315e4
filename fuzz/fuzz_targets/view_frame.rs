//! The view's fast channel framing fed hostile bytes, split anywhere: the
//! decoder never panics, never hands out a frame beyond the limit, and an
//! error sticks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_flint::wire::{encode, FrameDecoder, FRAME_BYTES_MAX};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut).max(1);
    let mut d = FrameDecoder::new();
    let mut failed = false;
    for piece in bytes.chunks(cut) {
        assert!(d.wanted() >= 1);
        d.feed(piece);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => {
                    assert!(!failed, "a frame after an error");
                    assert!(f.body.len() < FRAME_BYTES_MAX);
                    // What decodes re-encodes to the same bytes' frame.
                    let again = encode(f.kind, &f.body).expect("it fitted once");
                    let mut d2 = FrameDecoder::new();
                    d2.feed(&again);
                    assert_eq!(d2.next_frame().expect("valid"), Some(f));
                }
                Ok(None) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
    }
});
