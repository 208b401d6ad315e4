//! How long a first write into a fresh 2 MiB chunk of a RAM namespace on
//! huge pages waits, with the chunk reserve (what the backend does) and
//! with the fault taken by the writer (what it did before: a chunk advised
//! `MADV_HUGEPAGE` and faulted by the first write). A measurement, not a
//! test: `cargo run --release -p sluice-backend --example ram_first_writes
//! -- [CHUNKS] [GAP_MS]`. Each round writes 4 KiB into CHUNKS fresh chunks,
//! GAP_MS apart (0: back to back), both ways in turn, and prints p50, p99
//! and max in µs, and how many chunks came from the reserve (populated) and
//! from its spares (mapped only), and how long after the writes paused
//! the reserve's thread had collapsed those spares onto huge pages.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use sluice_backend::{
    ram_huge_chunks, AlignedBuf, Backend, IoOp, IoRequest, RamBackend, RamHugeChunks,
    RAM_HUGE_CHUNK_BYTES,
};
use std::time::{Duration, Instant};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn report(name: &str, mut v: Vec<f64>) {
    let max = v.iter().copied().fold(0.0, f64::max);
    println!(
        "{name:<28} p50 {:>8.1}  p99 {:>8.1}  max {:>8.1}",
        pct(&mut v, 0.5),
        pct(&mut v, 0.99),
        max
    );
}

/// The old path: the writer faults a fresh chunk advised onto huge pages.
fn writer_faults(chunks: usize, gap: Duration) -> Vec<f64> {
    let len = RAM_HUGE_CHUNK_BYTES;
    let src = vec![7u8; 4096];
    let mut maps = Vec::new();
    let mut out = Vec::new();
    for _ in 0..chunks {
        // SAFETY: a fresh private anonymous mapping, trimmed to an aligned
        // window below; only memory inside it is written.
        unsafe {
            let raw = libc::mmap(
                std::ptr::null_mut(),
                2 * len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            assert_ne!(raw, libc::MAP_FAILED);
            let start = (raw as usize).next_multiple_of(len);
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            let t = Instant::now();
            std::ptr::copy_nonoverlapping(src.as_ptr(), (start + 4096) as *mut u8, 4096);
            out.push(t.elapsed().as_secs_f64() * 1e6);
            maps.push((raw, 2 * len));
        }
        std::thread::sleep(gap);
    }
    for (p, l) in maps {
        // SAFETY: unmaps exactly what was mapped above.
        unsafe { libc::munmap(p, l) };
    }
    out
}

/// The backend's path: a write through a RAM queue into each fresh chunk.
fn through_backend(chunks: usize, gap: Duration) -> (Vec<f64>, u64, u64, Collapse) {
    let chunk = RAM_HUGE_CHUNK_BYTES as u64;
    let ram = RamBackend::with_huge_pages(chunks as u64 * chunk, 4096, true).expect("ram");
    // Let the reserve fill (it starts with the first store on huge pages).
    std::thread::sleep(Duration::from_millis(300));
    let mut q = ram.open_queue().expect("queue");
    let c0 = ram_huge_chunks();
    let mut out = Vec::new();
    let mut done = Vec::new();
    for i in 0..chunks as u64 {
        let t = Instant::now();
        q.submit(
            IoRequest {
                tag: i,
                op: IoOp::Write { fua: false },
                offset_bytes: i * chunk + 4096,
                len_bytes: 4096,
                buf: Some(AlignedBuf::from_slice(&[7u8; 4096])),
            },
            t,
        );
        q.poll_completions(Instant::now(), &mut done);
        out.push(t.elapsed().as_secs_f64() * 1e6);
        std::thread::sleep(gap);
    }
    assert_eq!(done.len(), chunks);
    assert!(done.iter().all(|c| c.result.is_ok()));
    let c1 = ram_huge_chunks();
    // The writes paused: how long until the reserve's thread has collapsed
    // the chunks they faulted on small pages (the store stays alive).
    let small = c1.from_spares - c0.from_spares + c1.inline - c0.inline;
    let paused = Instant::now();
    let tried =
        |c: RamHugeChunks| c.collapsed + c.collapse_failed - c1.collapsed - c1.collapse_failed;
    while tried(ram_huge_chunks()) < small && paused.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let c2 = ram_huge_chunks();
    let collapse = Collapse {
        ms: paused.elapsed().as_secs_f64() * 1e3,
        collapsed: c2.collapsed - c1.collapsed,
        failed: c2.collapse_failed - c1.collapse_failed,
    };
    (
        out,
        c1.from_reserve - c0.from_reserve,
        c1.from_spares - c0.from_spares,
        collapse,
    )
}

/// The collapses after one round's writes paused.
struct Collapse {
    ms: f64,
    collapsed: u64,
    failed: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let chunks: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let gap = Duration::from_millis(args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0));
    println!("first 4 KiB write into each of {chunks} fresh 2 MiB chunks, {gap:?} apart (µs)");
    for round in 1..=3 {
        report(
            &format!("round {round}: writer faults"),
            writer_faults(chunks, gap),
        );
        let (v, from, spares, c) = through_backend(chunks, gap);
        report(
            &format!("round {round}: reserve {from}, spares {spares}"),
            v,
        );
        println!(
            "round {round}: {} collapsed onto huge pages ({} refused) {:.0} ms after the writes paused",
            c.collapsed, c.failed, c.ms
        );
    }
}
