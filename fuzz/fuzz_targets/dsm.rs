//! Dataset Management range lists on arbitrary bytes and counts: the decoder
//! never panics, errors only on short data, and decode/encode is stable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::dsm::{encode_ranges, ranges, DsmRange, RANGE_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((&n, list)) = data.split_first() else {
        return;
    };
    let count = u32::from(n) + 1;
    match ranges(list, count) {
        Ok(it) => {
            let got: Vec<DsmRange> = it.collect();
            assert_eq!(got.len(), count as usize);
            let bytes = encode_ranges(&got);
            assert_eq!(&bytes[..], &list[..count as usize * RANGE_LEN]);
            for r in &got {
                let _ = r.end();
            }
        }
        Err(e) => {
            assert!(list.len() < count as usize * RANGE_LEN);
            let _ = e.to_string();
        }
    }
});
