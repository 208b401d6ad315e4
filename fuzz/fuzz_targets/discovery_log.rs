//! Discovery log page decoders on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::log::{
    decode_discovery_entries, decode_discovery_header, DISCOVERY_ENTRY_LEN, DISCOVERY_HEADER_LEN,
};

fuzz_target!(|data: &[u8]| {
    let header = decode_discovery_header(data);
    if data.len() >= 18 {
        assert!(header.is_some());
    }
    // With the header's NUMREC, and with a hostile NUMREC whatever the header says.
    let numrecs = [header.map(|h| h.numrec).unwrap_or(0), u64::MAX, 0, 1];
    for numrec in numrecs {
        let entries = decode_discovery_entries(data, numrec);
        let room = data.len().saturating_sub(DISCOVERY_HEADER_LEN) / DISCOVERY_ENTRY_LEN;
        assert!(entries.len() as u64 <= numrec);
        assert!(entries.len() <= room, "more entries than the page holds");
        for e in &entries {
            assert!(e.trsvcid.len() <= 32 * 3);
            let _ = format!("{e:?}");
        }
    }
});
