//! Drive records from hostile metadata (a tampered etcd, a corrupt redb
//! file): the JSON decodes or fails (slot lists as runs are bounded, never
//! expanded without limit), a decoded record that passes its check answers
//! every query without panicking, and it encodes back to what it decoded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_volume::DriveRecord;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = serde_json::from_slice::<DriveRecord>(data) else {
        return;
    };
    if d.check().is_err() {
        return;
    }
    let _ = (
        d.slots_used(),
        d.slots_free(),
        d.slots_clean(),
        d.slots_dirty(),
    );
    let f = d.fragment_degree();
    assert!((0.0..=1.0).contains(&f), "fragment degree {f}");
    let json = serde_json::to_vec(&d).expect("a record encodes");
    let back: DriveRecord = serde_json::from_slice(&json).expect("an encoded record decodes");
    assert_eq!(back, d);
});
