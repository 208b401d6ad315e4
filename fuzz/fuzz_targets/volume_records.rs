//! Extent-map records from hostile metadata (a tampered etcd, a corrupt
//! redb file, a broken control plane): JSON records decode or fail, the map
//! refuses records that break its invariants, and planning any range of an
//! accepted map never panics and tiles the request exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_volume::{ExtentRecord, PieceTarget, VolumeMap, VolumeRecord};

fuzz_target!(|data: &[u8]| {
    // Layout: 2 bytes volume length, volume JSON, then extents JSON (an
    // array), then 24 bytes of request (offset, length, cap).
    let Some((head, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let vlen = usize::from(u16::from_le_bytes(*head)).min(rest.len());
    let (vjson, rest) = rest.split_at(vlen);
    let Some((ejson, req)) = rest.split_last_chunk::<24>() else {
        return;
    };
    let Ok(volume) = serde_json::from_slice::<VolumeRecord>(vjson) else {
        return;
    };
    if volume.check().is_err() || volume.extents() > 1 << 16 {
        return;
    }
    let extents: Vec<ExtentRecord> = serde_json::from_slice(ejson).unwrap_or_default();
    let Ok(map) = VolumeMap::from_records(volume, extents) else {
        return;
    };
    let word = |i: usize| u64::from_le_bytes(req[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    let (offset, len, cap) = (word(0), word(1) % (64 << 20), word(2));
    let Ok(plan) = map.plan(offset, len, cap) else {
        return;
    };
    let mut at = 0;
    for p in plan {
        assert_eq!(p.buf_offset, at);
        assert!(p.len_bytes > 0);
        if let PieceTarget::Mapped { extent } = p.target {
            assert!(map.chain(extent).is_some());
        }
        at += p.len_bytes;
    }
    assert_eq!(at, len);
});
