//! Identify data decoders on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::identify::{
    decode_active_ns_list, decode_ns_descriptors, IdentifyController, IdentifyControllerNvm,
    IdentifyNamespace,
};

fuzz_target!(|data: &[u8]| {
    if let Some(c) = IdentifyController::decode(data) {
        let _ = format!("{c:?}");
    }
    if let Some(nvm) = IdentifyControllerNvm::decode(data) {
        // Any WZSL, with any CAP.MPSMIN, gives a limit without overflow.
        for mpsmin in 0..16u32 {
            if let Some(b) = nvm.write_zeroes_bytes_max(4096 << mpsmin) {
                assert!(b >= 4096, "a Write Zeroes limit below one page");
            }
        }
        let again = IdentifyControllerNvm::decode(&nvm.encode()).expect("encoded limits decode");
        assert_eq!(again, nvm, "NVM Identify Controller round trip");
    }
    if let Some(ns) = IdentifyNamespace::decode(data) {
        let _ = ns.block_size_bytes();
        // Numeric fields survive an encode/decode round trip.
        let again = IdentifyNamespace::decode(&ns.encode()).expect("encoded namespace decodes");
        assert_eq!(again, ns, "Identify Namespace round trip");
    }

    let descs = decode_ns_descriptors(data);
    let mut used = 0usize;
    for (t, v) in &descs {
        assert_ne!(*t, 0, "descriptor of type 0 returned");
        assert!(v.len() <= 255);
        used += 4 + v.len();
    }
    assert!(used <= data.len(), "descriptors cover more than the input");

    let ids = decode_active_ns_list(data);
    assert!(ids.len() <= data.len() / 4);
    assert!(ids.iter().all(|&n| n != 0));
});
