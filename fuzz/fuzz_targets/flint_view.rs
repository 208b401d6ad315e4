//! The shadow view and the bandwidth auction fed by hostile clients and
//! targets: sample batches, bids and target reports with arbitrary drives,
//! sizes, latencies, clocks and names (what `ViewSync` and
//! `ViewTargetReport` take from the wire after protobuf decoding), epochs at
//! arbitrary times, and a wallet taking arbitrary grants. Nothing panics;
//! grants never exceed what the arbiter may sell; every I/O the wallet
//! holds is released exactly once.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use sluice_flint::auction::{Bid, Grant, Grants, SessionBid, Spend, Wallet, WalletConfig};
use sluice_flint::view::{IoSample, SampleBatch, TargetDelta, ViewControllerConfig};
use sluice_flint::{Arbiter, AuctionConfig, Entity, ViewController};

/// A cursor over the fuzzer's bytes.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn word(&mut self) -> Option<u64> {
        let (w, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*w))
    }

    fn small(&mut self, n: u64) -> Option<u64> {
        Some(u64::from(self.byte()?) % n.max(1))
    }
}

fn client(i: u64) -> String {
    // Mostly a few names; sometimes the empty and an over-long one.
    match i {
        0 => String::new(),
        1 => "x".repeat(300),
        i => format!("c{}", i % 4),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Ok(mut view) = ViewController::new(ViewControllerConfig {
        congestion_ios_min: 2,
        ..ViewControllerConfig::default()
    }) else {
        return;
    };
    let Ok(mut arb) = Arbiter::new(AuctionConfig {
        epoch_us: 10_000,
        ..AuctionConfig::default()
    }) else {
        return;
    };
    arb.set_on(true);
    for d in 0..4u64 {
        let port = format!("t{}:4420", d % 2);
        let _ = view.set_drive(d, &port, (d == 3).then_some(1e8));
        arb.set_drive(d, &port, (d == 3).then_some(1e8));
    }
    let mut wallet: Wallet<u32> = Wallet::new(WalletConfig {
        fallback_us: 50_000,
    });
    let mut waiting: BTreeSet<u32> = BTreeSet::new();
    let mut token = 0u32;
    let mut now = 0u64;
    while let Some(op) = input.byte() {
        now = now.saturating_add(input.small(64).unwrap_or(1) * 500);
        match op % 8 {
            0 => {
                let n = input.small(40).unwrap_or(0);
                let name = client(input.small(8).unwrap_or(2));
                let mut samples = Vec::new();
                for _ in 0..n {
                    let Some(w) = input.word() else { break };
                    samples.push(IoSample {
                        drive: w % 6,
                        // Few volumes, so that windows per volume fill.
                        volume: (w & 128 != 0).then_some((w >> 40) % 12),
                        write: w & 64 != 0,
                        bytes: (w >> 8) as u32,
                        latency_us: (w >> 32) as u32,
                        at_us: w.rotate_left(17),
                    });
                }
                let batch = SampleBatch {
                    client: name,
                    sent_at_us: input.word().unwrap_or(now),
                    samples,
                };
                let _ = view.handle_batch(now, &batch);
            }
            1 => {
                let name = client(input.small(8).unwrap_or(2));
                let mut sessions = Vec::new();
                for _ in 0..input.small(6).unwrap_or(0) {
                    let Some(w) = input.word() else { break };
                    sessions.push(SessionBid {
                        volume: w % 3,
                        drive: (w >> 8) % 6,
                        spent_bytes_total: w >> 16,
                        written_bytes_total: w >> 20,
                        hungry: w & 1 == 1,
                    });
                }
                if let Ok(g) = arb.handle_bid(
                    now,
                    &Bid {
                        client: name,
                        sessions,
                    },
                ) {
                    // Grants are whole slices of this epoch's size.
                    for gr in &g.grants {
                        let slice = arb
                            .drives()
                            .find(|(id, _)| *id == gr.drive)
                            .map_or(0, |(_, d)| d.slice_bytes);
                        assert!(slice >= 4096, "drive {} sold no slice size", gr.drive);
                        assert!(gr.bytes > 0 && gr.bytes % slice == 0, "{gr:?} of {slice}");
                    }
                }
            }
            2 => {
                let w = input.word().unwrap_or(0);
                let d = TargetDelta {
                    nqn: "nqn.x".into(),
                    nsid: 1,
                    interval_us: w % 1_000_000,
                    ios: w >> 40,
                    write_ios: w >> 20,
                    bytes: w.rotate_left(7),
                    latency_us_sum: w.rotate_left(29),
                };
                view.handle_target(now, (w >> 3) % 6, &d);
            }
            3 => {
                let _ = view.poll_epoch(now);
                let all = view.snapshot_all(now);
                // A drive's volumes are its heaviest few, and their shares
                // of its work add up to at most all of it.
                for e in &all.entities {
                    assert!(e.volumes.len() <= sluice_flint::view::VOLUMES_IN_VIEW_MAX);
                    let sum: f64 = e.volumes.iter().map(|l| l.share).sum();
                    assert!(sum <= 1.0 + 1e-9, "{e:?}");
                }
                let _ = view.query(&[Entity::Drive(1), Entity::NetPipe("c2".into())], now);
            }
            4 => {
                let signals = view.take_drive_signals(now);
                // Contention is a mean of per-sample figures each in 0..=10,
                // per session, and the drive's is at least every session's.
                for sig in signals.values() {
                    let means = || sig.contention_by_session.values().flat_map(|v| v.values());
                    assert!(means().all(|m| (0.0..=10.0).contains(m)), "{sig:?}");
                    // Sessions of no volume count for the drive only.
                    assert!(means().all(|m| *m <= sig.contention_mean + 1e-9), "{sig:?}");
                    assert!((0.0..=10.0).contains(&sig.contention_mean), "{sig:?}");
                }
                arb.poll_epoch(now, |d| signals.get(&d).cloned());
                // What was sold of each drive fits its epoch budget (the
                // estimate times the epoch), slice rounding aside.
                for (_, d) in arb.drives() {
                    let budget = d.bytes_per_sec * 0.01;
                    assert!(d.bytes_per_sec.is_finite() && d.bytes_per_sec > 0.0);
                    assert!(
                        (d.granted_bytes as f64) <= budget + d.slice_bytes as f64 * 2.0,
                        "{} granted of {budget}",
                        d.granted_bytes
                    );
                }
            }
            5 => {
                let w = input.word().unwrap_or(0);
                token += 1;
                match wallet.request(
                    now,
                    w % 2,
                    (w >> 8) % 3,
                    (w >> 16) % (1 << 20) + 1,
                    false,
                    token,
                ) {
                    Spend::Go(t) => assert_eq!(t, token),
                    Spend::Wait => {
                        waiting.insert(token);
                    }
                }
            }
            6 => {
                let w = input.word().unwrap_or(0);
                let g = Grants {
                    on: w & 1 == 1,
                    epoch: (w >> 1) % 16,
                    epoch_us: (w >> 8) % 100_000,
                    grants: vec![Grant {
                        volume: (w >> 20) % 2,
                        drive: (w >> 24) % 3,
                        epoch: (w >> 28) % 16,
                        bytes: w >> 32,
                    }],
                    next_epoch_in_us: w >> 44,
                };
                for t in wallet.handle_grants(now, &g) {
                    assert!(waiting.remove(&t), "released {t} twice or never held");
                }
            }
            _ => {
                for t in wallet.poll_release(now) {
                    assert!(waiting.remove(&t), "released {t} twice or never held");
                }
                let _ = wallet.poll_bid(now);
                let _ = wallet.deadline_us();
            }
        }
    }
    assert_eq!(wallet.waiting(), waiting.len());
});
