//! `ByteDevice` (sub-block read-modify-write) against a byte-array model,
//! sequentially and with concurrent writes sharing blocks.
#![allow(clippy::unwrap_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use proptest::prelude::*;
use sluice_export::errno::{EINVAL, ENOSPC};
use sluice_export::{ByteDevice, MemDevice};

const BS: u32 = 512;
const BLOCKS: u64 = 16;
const SIZE: u64 = BS as u64 * BLOCKS;

#[derive(Debug, Clone)]
enum Op {
    Write(u64, Vec<u8>, bool),
    Zero(u64, u64),
    Trim(u64, u64),
    Read(u64, u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    let range = (0..SIZE + 600, 0u64..2000);
    prop_oneof![
        (range.clone(), any::<u8>(), any::<bool>()).prop_map(|((o, l), b, f)| Op::Write(
            o,
            (0..l).map(|i| b ^ i as u8).collect(),
            f
        )),
        range.clone().prop_map(|(o, l)| Op::Zero(o, l)),
        range.clone().prop_map(|(o, l)| Op::Trim(o, l)),
        range.prop_map(|(o, l)| Op::Read(o, l)),
    ]
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn matches_model(ops in proptest::collection::vec(arb_op(), 1..30)) {
        let rt = rt();
        let dev = ByteDevice::new(MemDevice::new(BS, BLOCKS));
        let mut model = vec![0u8; SIZE as usize];
        // Bytes a trim may have changed: unknown until rewritten.
        let mut known = vec![true; SIZE as usize];
        rt.block_on(async {
            for op in ops {
                match op {
                    Op::Write(o, d, fua) => {
                        let end = o + d.len() as u64;
                        let r = dev.write(o, d.clone(), fua).await;
                        if end > SIZE {
                            prop_assert_eq!(r.unwrap_err().errno(), ENOSPC);
                        } else {
                            r.unwrap();
                            model[o as usize..end as usize].copy_from_slice(&d);
                            known[o as usize..end as usize].fill(true);
                        }
                    }
                    Op::Zero(o, l) => {
                        let r = dev.write_zeroes(o, l, false).await;
                        if o + l > SIZE {
                            prop_assert_eq!(r.unwrap_err().errno(), ENOSPC);
                        } else {
                            r.unwrap();
                            model[o as usize..(o + l) as usize].fill(0);
                            known[o as usize..(o + l) as usize].fill(true);
                        }
                    }
                    Op::Trim(o, l) => {
                        let r = dev.trim(o, l, true).await;
                        if o + l > SIZE {
                            prop_assert_eq!(r.unwrap_err().errno(), EINVAL);
                        } else {
                            r.unwrap();
                            // Only whole blocks inside the range may change.
                            let s = o.div_ceil(BS as u64) * BS as u64;
                            let e = ((o + l) / BS as u64) * BS as u64;
                            if e > s {
                                known[s as usize..e as usize].fill(false);
                            }
                        }
                    }
                    Op::Read(o, l) => {
                        let r = dev.read(o, l as usize).await;
                        if o + l > SIZE {
                            prop_assert_eq!(r.unwrap_err().errno(), EINVAL);
                        } else {
                            let got = r.unwrap();
                            prop_assert_eq!(got.len() as u64, l);
                            for (i, b) in got.iter().enumerate() {
                                let at = o as usize + i;
                                if known[at] {
                                    prop_assert_eq!(*b, model[at], "byte {}", at);
                                }
                            }
                        }
                    }
                }
            }
            // Bytes outside trimmed blocks must match exactly at the end.
            let snap = dev.device().snapshot();
            for i in 0..SIZE as usize {
                if known[i] {
                    prop_assert_eq!(snap[i], model[i], "final byte {}", i);
                }
            }
            prop_assert_eq!(dev.locks().held(), 0);
            Ok(())
        })?;
    }
}

/// Many concurrent sub-block writes to disjoint bytes of the same blocks:
/// without the range lock, RMWs would overwrite each other's bytes.
#[test]
fn concurrent_rmw_in_shared_blocks_loses_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        let dev = ByteDevice::new(MemDevice::new(BS, 4));
        let mut tasks = vec![];
        // 100-byte pieces with a stride of 100: every block is shared by
        // several writers, and pieces cross block boundaries.
        for i in 0..20u64 {
            let dev = dev.clone();
            tasks.push(tokio::spawn(async move {
                dev.write(i * 100, vec![i as u8 + 1; 100], false).await
            }));
        }
        // Aligned whole-block writes race with the RMWs too.
        let d2 = dev.clone();
        tasks.push(tokio::spawn(async move {
            d2.write(1536, vec![0xee; 512], false).await
        }));
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let snap = dev.device().snapshot();
        for i in 0..20usize {
            let piece = &snap[i * 100..i * 100 + 100];
            let want = i as u8 + 1;
            let ok = piece.iter().enumerate().all(|(j, &b)| {
                let at = i * 100 + j;
                b == want || (1536..2048).contains(&at) && b == 0xee
            });
            assert!(ok, "piece {i} lost: {piece:?}");
        }
        assert_eq!(dev.locks().held(), 0);
    });
}

#[test]
fn aligned_io_skips_rmw_and_partial_reads_slice() {
    let rt = rt();
    rt.block_on(async {
        let dev = ByteDevice::new(MemDevice::new(BS, 8));
        dev.write(512, vec![1; 1024], false).await.unwrap();
        // One write, no reads for an aligned write.
        assert_eq!(dev.device().counts.lock().unwrap()[..2], [0, 1]);
        dev.write(513, vec![2; 10], false).await.unwrap();
        assert_eq!(dev.device().counts.lock().unwrap()[..2], [1, 2]);
        let r = dev.read(510, 6).await.unwrap();
        assert_eq!(r, vec![0, 0, 1, 2, 2, 2]);
        dev.trim(100, 300, false).await.unwrap(); // no whole block: no dealloc
        assert_eq!(dev.device().counts.lock().unwrap()[4], 0);
        dev.write_zeroes(500, 1100, true).await.unwrap();
        let c = dev.device().counts.lock().unwrap().to_owned();
        assert_eq!(
            (c[2], c[3]),
            (1, 1),
            "FUA adds a flush; one Write Zeroes for the middle"
        );
        assert!(dev.read(0, 2048).await.unwrap()[500..1600]
            .iter()
            .all(|&b| b == 0));
    });
}
