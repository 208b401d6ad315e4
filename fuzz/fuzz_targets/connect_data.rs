//! `ConnectData::parse` on arbitrary bytes; on success, encode/parse must
//! give back the same value and the encoding must be 1024 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::fabrics::{ConnectData, CONNECT_DATA_LEN};

fuzz_target!(|data: &[u8]| {
    match ConnectData::parse(data) {
        Ok(d) => {
            let enc = d.encode();
            assert_eq!(enc.len(), CONNECT_DATA_LEN);
            let again = ConnectData::parse(&enc).expect("re-encoded Connect data must parse");
            assert_eq!(again, d, "Connect data encode/parse round trip");
            assert_eq!(again.encode(), enc, "encoding is not stable");
        }
        Err(e) => {
            // The IPO must point inside the 1024-byte Connect data.
            assert!(
                (e.offset as usize) < CONNECT_DATA_LEN,
                "IPO {} out of range",
                e.offset
            );
            let _ = e.to_string();
        }
    }
});
