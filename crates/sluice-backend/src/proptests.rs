//! Property tests: random sequences of write / read / deallocate /
//! write-zeroes (plus invalid requests) against every backend must agree with
//! a plain `Vec<u8>` model.

use std::time::Instant;

use proptest::prelude::*;

use crate::file::tests::{wait_all, TempPath};
use crate::{
    AlignedBuf, Backend, BackendError, BackendQueue, EmulatedSsd, EngineKind, FileBackend,
    FileOptions, IoCompletion, IoOp, IoRequest, RamBackend, SsdModel,
};

#[derive(Debug, Clone)]
enum Step {
    Write {
        block: u64,
        blocks: u64,
        seed: u8,
        fua: bool,
    },
    Read {
        block: u64,
        blocks: u64,
    },
    Zero {
        block: u64,
        blocks: u64,
        deallocate: bool,
    },
    Deallocate {
        block: u64,
        blocks: u64,
    },
    Flush,
    /// Range starting past the end or running over it.
    OutOfRange {
        block_past_end: u64,
        blocks: u64,
    },
    /// Offset not a multiple of the block size.
    Misaligned {
        byte_offset: u64,
    },
}

fn step(blocks_total: u64) -> impl Strategy<Value = Step> {
    let range = (0..blocks_total).prop_flat_map(move |b| (Just(b), 1..=(blocks_total - b).min(80)));
    prop_oneof![
        4 => (range.clone(), any::<u8>(), any::<bool>())
            .prop_map(|((block, blocks), seed, fua)| Step::Write { block, blocks, seed, fua: fua && seed % 8 == 0 }),
        4 => range.clone().prop_map(|(block, blocks)| Step::Read { block, blocks }),
        1 => (range.clone(), any::<bool>()).prop_map(|((block, blocks), deallocate)| Step::Zero { block, blocks, deallocate }),
        1 => range.prop_map(|(block, blocks)| Step::Deallocate { block, blocks }),
        1 => Just(Step::Flush),
        1 => (0..4u64, 1..8u64).prop_map(|(block_past_end, blocks)| Step::OutOfRange { block_past_end, blocks }),
        1 => (1..511u64).prop_map(|byte_offset| Step::Misaligned { byte_offset }),
    ]
}

/// Submits one request and returns its completion, advancing virtual time
/// to the queue's deadline when it has one.
fn exec(q: &mut dyn BackendQueue, now: &mut Instant, req: IoRequest) -> IoCompletion {
    q.submit(req, *now);
    if let Some(deadline) = q.next_deadline() {
        assert!(deadline >= *now);
        *now = deadline;
        let mut out = Vec::new();
        q.poll_completions(*now, &mut out);
        assert_eq!(out.len(), 1);
        return out.pop().expect("one");
    }
    wait_all(q, 1).pop().expect("one")
}

/// `share_min`: the queue shares reads of at least this many bytes
/// ([`BackendQueue::share_reads`]); the shared data of every read is kept
/// to the end and must still hold what the range held when it was read.
fn check_against_model(
    backend: &dyn Backend,
    steps: &[Step],
    share_min: Option<usize>,
) -> Result<(), TestCaseError> {
    let geometry = backend.geometry();
    let bs = u64::from(geometry.block_size_bytes);
    let mut model = vec![0u8; geometry.size_bytes as usize];
    let mut q = backend
        .open_queue()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    if let Some(min) = share_min {
        q.share_reads(min);
    }
    let mut held: Vec<(crate::SharedRange, Vec<u8>)> = Vec::new();
    let mut now = Instant::now();
    for (i, s) in steps.iter().enumerate() {
        let tag = i as u64;
        let range =
            |block: u64, blocks: u64| (block * bs) as usize..((block + blocks) * bs) as usize;
        match *s {
            Step::Write {
                block,
                blocks,
                seed,
                fua,
            } => {
                let r = range(block, blocks);
                let data: Vec<u8> = (0..r.len())
                    .map(|j| seed.wrapping_add((j / 512) as u8) ^ (j as u8))
                    .collect();
                model[r.clone()].copy_from_slice(&data);
                let req = IoRequest {
                    tag,
                    op: IoOp::Write { fua },
                    offset_bytes: r.start as u64,
                    len_bytes: r.len() as u64,
                    buf: Some(AlignedBuf::from_slice(&data)),
                };
                let c = exec(q.as_mut(), &mut now, req);
                prop_assert_eq!(c.tag, tag);
                prop_assert!(c.result.is_ok(), "write failed: {:?}", c.result);
            }
            Step::Read { block, blocks } => {
                let r = range(block, blocks);
                let req = IoRequest {
                    tag,
                    op: IoOp::Read,
                    offset_bytes: r.start as u64,
                    len_bytes: r.len() as u64,
                    buf: Some(AlignedBuf::new(r.len())),
                };
                let c = exec(q.as_mut(), &mut now, req);
                prop_assert!(c.result.is_ok(), "read failed: {:?}", c.result);
                let data = c
                    .read_data()
                    .ok_or_else(|| TestCaseError::fail("no data"))?;
                prop_assert!(
                    data == &model[r.clone()],
                    "data mismatch in {:?} at step {}",
                    r,
                    i
                );
                prop_assert!(
                    c.shared.is_none() || c.buf.is_none(),
                    "both shared and a buffer"
                );
                if let Some(shared) = c.shared {
                    prop_assert!(share_min.is_some_and(|m| r.len() >= m), "shared unasked");
                    held.push((shared, model[r].to_vec()));
                }
            }
            Step::Zero { block, blocks, .. } | Step::Deallocate { block, blocks } => {
                let r = range(block, blocks);
                model[r.clone()].fill(0);
                let op = match *s {
                    Step::Zero { deallocate, .. } => IoOp::WriteZeroes {
                        deallocate,
                        fua: false,
                    },
                    _ => IoOp::Deallocate,
                };
                let req = IoRequest {
                    tag,
                    op,
                    offset_bytes: r.start as u64,
                    len_bytes: r.len() as u64,
                    buf: None,
                };
                let c = exec(q.as_mut(), &mut now, req);
                prop_assert!(c.result.is_ok(), "{:?} failed: {:?}", op, c.result);
            }
            Step::Flush => {
                let req = IoRequest {
                    tag,
                    op: IoOp::Flush,
                    offset_bytes: 0,
                    len_bytes: 0,
                    buf: None,
                };
                let c = exec(q.as_mut(), &mut now, req);
                prop_assert!(c.result.is_ok(), "flush failed: {:?}", c.result);
            }
            Step::OutOfRange {
                block_past_end,
                blocks,
            } => {
                let start = geometry.size_bytes / bs - 1 + block_past_end;
                let len = ((blocks + 1) * bs) as usize;
                let req = IoRequest {
                    tag,
                    op: IoOp::Write { fua: false },
                    offset_bytes: start * bs,
                    len_bytes: len as u64,
                    buf: Some(AlignedBuf::from_slice(&vec![0xEE; len])),
                };
                let c = exec(q.as_mut(), &mut now, req);
                prop_assert!(
                    matches!(c.result, Err(BackendError::OutOfRange { .. })),
                    "{:?}",
                    c.result
                );
                prop_assert!(c.buf.is_some());
            }
            Step::Misaligned { byte_offset } => {
                let req = IoRequest {
                    tag,
                    op: IoOp::Write { fua: false },
                    offset_bytes: byte_offset,
                    len_bytes: bs,
                    buf: Some(AlignedBuf::from_slice(&vec![0xEE; bs as usize])),
                };
                let c = exec(q.as_mut(), &mut now, req);
                prop_assert!(
                    matches!(c.result, Err(BackendError::Misaligned { .. })),
                    "{:?}",
                    c.result
                );
            }
        }
    }
    prop_assert_eq!(q.in_flight(), 0);
    // Final full comparison.
    let req = IoRequest {
        tag: u64::MAX,
        op: IoOp::Read,
        offset_bytes: 0,
        len_bytes: geometry.size_bytes,
        buf: Some(AlignedBuf::new(model.len())),
    };
    let c = exec(q.as_mut(), &mut now, req);
    let data = c
        .read_data()
        .ok_or_else(|| TestCaseError::fail("no data"))?;
    prop_assert!(data == model.as_slice(), "final image mismatch");
    for (shared, then) in &held {
        prop_assert!(
            shared.as_slice() == then.as_slice(),
            "a shared read changed after later writes"
        );
    }
    Ok(())
}

/// 384 KiB: three 128 KiB RAM chunks, so ranges straddle chunk boundaries.
const SIZE_BYTES: u64 = 384 << 10;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn ram_matches_model(bs in prop_oneof![Just(512u32), Just(4096u32)], steps in proptest::collection::vec(step(96), 1..60)) {
        // Blocks are indexed in units of the chosen block size; clamp to fit.
        let ram = RamBackend::new(SIZE_BYTES, bs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let steps = clamp(steps, SIZE_BYTES / u64::from(bs));
        check_against_model(&ram, &steps, None)?;
    }

    /// Reads shared from the chunks (as the target asks for): every read
    /// still matches the model, and every shared read keeps its bytes
    /// through the writes and deallocations after it.
    #[test]
    fn ram_shared_reads_match_model(
        bs in prop_oneof![Just(512u32), Just(4096u32)],
        huge in any::<bool>(),
        steps in proptest::collection::vec(step(96), 1..60),
    ) {
        let _huge = huge.then(crate::ram::tests::huge_chunk_tests);
        let size = if huge { 3 * crate::RAM_HUGE_CHUNK_BYTES as u64 } else { SIZE_BYTES };
        let ram = RamBackend::with_huge_pages(size, bs, huge).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let steps = clamp(steps, size / u64::from(bs));
        check_against_model(&ram, &steps, Some(bs as usize))?;
    }

    /// Batches, as a target's turn submits them: reads and writes submitted
    /// together, then one poll. Every read of a batch returns the range as
    /// the batch's writes left it (a RAM queue runs them first), and every
    /// shared read kept past its batch keeps those bytes through the
    /// batches after it.
    #[test]
    fn ram_batches_read_their_writes(
        huge in any::<bool>(),
        batches in proptest::collection::vec(
            proptest::collection::vec((any::<bool>(), 0..96u64, 1..=8u64, any::<u8>()), 1..12),
            1..12,
        ),
    ) {
        let _huge = huge.then(crate::ram::tests::huge_chunk_tests);
        let bs = 4096u64;
        let size = if huge { 3 * crate::RAM_HUGE_CHUNK_BYTES as u64 } else { SIZE_BYTES };
        let blocks_total = size / bs;
        let ram = RamBackend::with_huge_pages(size, bs as u32, huge).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut q = ram.open_queue().map_err(|e| TestCaseError::fail(e.to_string()))?;
        q.share_reads(4096);
        let mut model = vec![0u8; size as usize];
        let mut kept: Vec<(crate::SharedRange, Vec<u8>)> = Vec::new();
        let mut tag = 0u64;
        for batch in &batches {
            let mut reads = std::collections::HashMap::new();
            let mut after = model.clone();
            for &(write, block, blocks, seed) in batch {
                let block = block % blocks_total;
                let blocks = blocks.min(blocks_total - block);
                let r = (block * bs) as usize..((block + blocks) * bs) as usize;
                tag += 1;
                let (op, buf) = if write {
                    let data: Vec<u8> = (0..r.len()).map(|j| seed ^ (j as u8) ^ (tag as u8)).collect();
                    after[r.clone()].copy_from_slice(&data);
                    (IoOp::Write { fua: false }, AlignedBuf::from_slice(&data))
                } else {
                    reads.insert(tag, r.clone());
                    (IoOp::Read, AlignedBuf::new(r.len()))
                };
                q.submit(IoRequest { tag, op, offset_bytes: r.start as u64, len_bytes: r.len() as u64, buf: Some(buf) }, Instant::now());
            }
            model = after;
            let mut out = Vec::new();
            q.poll_completions(Instant::now(), &mut out);
            prop_assert_eq!(out.len(), batch.len());
            let mut shared_now = Vec::new();
            for c in out {
                prop_assert!(c.result.is_ok(), "{:?}", c.result);
                if let Some(r) = reads.get(&c.tag) {
                    let data = c.read_data().expect("a read's data");
                    prop_assert!(data == &model[r.clone()], "read {} differs from the batch's writes", c.tag);
                    if let Some(s) = c.shared {
                        shared_now.push((s, model[r.clone()].to_vec()));
                    }
                }
            }
            // Keep one read in four to the end; the rest are sent now.
            for (i, k) in shared_now.into_iter().enumerate() {
                if i % 4 == 0 {
                    kept.push(k);
                }
            }
        }
        for (s, bytes) in &kept {
            prop_assert!(s.as_slice() == &bytes[..], "a kept shared read changed");
        }
    }

    #[test]
    fn emulated_ssd_matches_model(steps in proptest::collection::vec(step(96), 1..60)) {
        let ssd = EmulatedSsd::new(SIZE_BYTES, 4096, SsdModel::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_against_model(&ssd, &steps, None)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn file_matches_model(
        engine in prop_oneof![Just(EngineKind::IoUring), Just(EngineKind::Sync)],
        direct in any::<bool>(),
        bs in prop_oneof![Just(512u32), Just(4096u32)],
        steps in proptest::collection::vec(step(96), 1..40),
    ) {
        let tmp = TempPath::new("prop");
        let options = FileOptions {
            direct,
            engine,
            block_size_bytes: Some(bs),
            create_size_bytes: Some(SIZE_BYTES),
            read_only: false,
        };
        let file = FileBackend::open(&tmp.0, options).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let steps = clamp(steps, SIZE_BYTES / u64::from(bs));
        check_against_model(&file, &steps, Some(512))?;
    }
}

/// Re-maps block indices generated for 96 blocks onto `blocks_total`.
fn clamp(steps: Vec<Step>, blocks_total: u64) -> Vec<Step> {
    let fit = |block: u64, blocks: u64| {
        let block = block * blocks_total / 96;
        let blocks = blocks.min(blocks_total - block).max(1);
        (block, blocks)
    };
    steps
        .into_iter()
        .map(|s| match s {
            Step::Write {
                block,
                blocks,
                seed,
                fua,
            } => {
                let (block, blocks) = fit(block, blocks);
                Step::Write {
                    block,
                    blocks,
                    seed,
                    fua,
                }
            }
            Step::Read { block, blocks } => {
                let (block, blocks) = fit(block, blocks);
                Step::Read { block, blocks }
            }
            Step::Zero {
                block,
                blocks,
                deallocate,
            } => {
                let (block, blocks) = fit(block, blocks);
                Step::Zero {
                    block,
                    blocks,
                    deallocate,
                }
            }
            Step::Deallocate { block, blocks } => {
                let (block, blocks) = fit(block, blocks);
                Step::Deallocate { block, blocks }
            }
            other => other,
        })
        .collect()
}
