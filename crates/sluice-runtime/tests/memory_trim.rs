//! `release_free_memory` against the real allocator and the kernel's figure
//! of the anonymous resident set (`RssAnon`). Alone in its own test
//! binary: another test allocating or freeing on a second thread at the
//! same moment made the trim release almost nothing (2 runs in 20 under
//! load; never when run alone).
#![allow(clippy::unwrap_used)]

use sluice_runtime::memory::{release_free_memory, resident_anon_bytes};

/// Memory freed in small pieces between pieces still in use (so the heap
/// cannot simply shrink from its top) comes back after a trim.
#[test]
fn trim_gives_freed_pages_back() {
    let before = resident_anon_bytes().unwrap();
    // 32 MiB in 2 KiB pieces, each touched; one in 16 stays.
    let mut v: Vec<Vec<u8>> = (0..16_384u32)
        .map(|i| vec![u8::try_from(i % 251).unwrap() + 1; 2048])
        .collect();
    let full = resident_anon_bytes().unwrap();
    assert!(full > before + (16 << 20), "{before} -> {full}");
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        i % 16 == 0
    });
    // Trim and look again a few times: the kernel's RSS figure may lag.
    let mut after = full;
    for _ in 0..10 {
        release_free_memory();
        after = resident_anon_bytes().unwrap();
        if after < full - (16 << 20) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert!(
            after < full - (16 << 20),
            "resident {full} before the trim, {after} after"
        );
    }
    assert_eq!(v.len(), 1024);
}
