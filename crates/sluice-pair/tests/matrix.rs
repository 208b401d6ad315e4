//! Data written is data read back, for every combination of the pair's
//! parameters: digests, in-capsule size (including forced R2T), C2HData
//! SUCCESS, the target's scheduler and coalescing, the host's scheduler,
//! queue depth, MAXH2CDATA and the C2HData PDU size. The wire is checked
//! too: R2Ts only for writes beyond the in-capsule size, H2CData and C2HData
//! within their limits, digest flags as negotiated, SUCCESS instead of a
//! CapsuleResp exactly when SQ flow control is disabled.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use proptest::prelude::*;
use sluice_pair::*;
use sluice_proto::pdu::{flags, pdu_type};
use sluice_proto::send::{FlushReason, SendStats};

/// Payload bytes of a data PDU (CPDA/HPDA are 0: no padding).
fn data_len(w: &WirePdu) -> u32 {
    let hd = if w.has(flags::HDGSTF) { 4 } else { 0 };
    let dd = if w.has(flags::DDGSTF) { 4 } else { 0 };
    w.plen - 24 - hd - dd
}

/// Writes `sizes` (in bytes, at disjoint LBAs) concurrently up to the queue
/// depth, reads them back concurrently, compares, and checks the I/O
/// queue's wire traffic against the parameters.
fn cycle(p: Params, sizes: &[usize], seed: u64) {
    let what = format!("{p:?}");
    let mut pair = Pair::new(p.clone());
    let bs = p.block_size as usize;
    let mut slba = 0u64;
    let mut regions = Vec::new();
    for (k, &len) in sizes.iter().enumerate() {
        regions.push((slba, pattern(len, seed + k as u64)));
        slba += len.div_ceil(bs) as u64 + 1;
    }
    pair.take_wire();
    for batch in regions.chunks(p.depth as usize) {
        let toks: Vec<u64> = batch
            .iter()
            .map(|(lba, d)| pair.submit_write(*lba, d.clone()))
            .collect();
        pair.run();
        for t in toks {
            pair.take_result(IO, t)
                .expect("write completed")
                .unwrap_or_else(|e| panic!("write failed: {e} with {what}"));
        }
    }
    for batch in regions.chunks(p.depth as usize) {
        let toks: Vec<u64> = batch
            .iter()
            .map(|(lba, d)| pair.submit_read(*lba, d.len()))
            .collect();
        pair.run();
        for (t, (lba, d)) in toks.into_iter().zip(batch) {
            let got = pair
                .take_result(IO, t)
                .expect("read completed")
                .unwrap_or_else(|e| panic!("read failed: {e} with {what}"));
            assert!(
                got.data == *d,
                "LBA {lba}: read differs from write with {what}"
            );
        }
    }
    // Blocks never written read as zeroes.
    let bs = p.block_size as usize;
    assert_eq!(pair.read(slba + 1, bs).unwrap(), vec![0; bs], "{what}");
    let wire: Vec<WirePdu> = pair
        .take_wire()
        .into_iter()
        .filter(|w| w.link == IO)
        .collect();
    let n = sizes.len();
    let r2t_writes = sizes
        .iter()
        .filter(|&&l| l > p.in_capsule_bytes as usize)
        .count();
    let count = |t: u8| wire.iter().filter(|w| w.pdu_type == t).count();
    assert_eq!(count(pdu_type::R2T), r2t_writes, "R2Ts with {what}");
    assert_eq!(
        count(pdu_type::CAPSULE_CMD),
        2 * n + 1,
        "commands with {what}"
    );
    // With SQ flow control disabled, reads complete with SUCCESS on their
    // last C2HData, unless the target coalesces its responses.
    let c2h_success =
        p.c2h_success && p.target_send.coalescing.mode == sluice_proto::coalesce::CoalesceMode::Off;
    let resps = if c2h_success { n } else { 2 * n + 1 };
    assert_eq!(
        count(pdu_type::CAPSULE_RESP),
        resps,
        "CapsuleResps with {what}"
    );
    let successes = wire
        .iter()
        .filter(|w| w.pdu_type == pdu_type::C2H_DATA && w.has(flags::SUCCESS))
        .count();
    assert_eq!(
        successes,
        if c2h_success { n + 1 } else { 0 },
        "C2HData with SUCCESS with {what}"
    );
    for w in &wire {
        assert_eq!(w.has(flags::HDGSTF), p.hdr_digest, "{w:?} with {what}");
        let carries_data = match w.pdu_type {
            pdu_type::H2C_DATA | pdu_type::C2H_DATA => true,
            pdu_type::CAPSULE_CMD => w.plen > 72 + if p.hdr_digest { 4 } else { 0 },
            _ => false,
        };
        if carries_data {
            assert_eq!(w.has(flags::DDGSTF), p.data_digest, "{w:?} with {what}");
        }
        if w.pdu_type == pdu_type::H2C_DATA {
            assert!(data_len(w) <= p.max_h2c_data_bytes, "{w:?} with {what}");
        }
        if w.pdu_type == pdu_type::C2H_DATA {
            assert!(data_len(w) <= p.max_c2h_data_bytes, "{w:?} with {what}");
            if w.has(flags::SUCCESS) {
                assert!(
                    w.has(flags::LAST_PDU),
                    "SUCCESS without LAST_PDU with {what}"
                );
            }
        }
    }
    // The send paths under test are the ones that ran.
    let ts = pair.link(IO).target.send_stats();
    let hs = pair.link(IO).host.send_stats();
    let immediate = |s: &SendStats| s.reason(FlushReason::Immediate) > 0;
    assert_eq!(
        immediate(&ts),
        p.target_send.scheduler == SchedulerKind::Immediate,
        "target {ts:?} with {what}"
    );
    assert_eq!(
        ts.coalesce_held_ns > 0,
        p.target_send.coalescing.mode != Coalescing::Off,
        "target {ts:?} with {what}"
    );
    assert_eq!(
        immediate(&hs),
        p.host_send.scheduler == SchedulerKind::Immediate,
        "host {hs:?} with {what}"
    );
    assert!(!pair.link(IO).host.is_closed());
    assert!(pair.link(IO).closed().is_none());
}

/// Sizes straddling the in-capsule limits and the PDU sizes of the table.
const SIZES: [usize; 7] = [512, 4096, 4608, 8192, 8704, 33280, 65536];

#[test]
fn every_parameter_combination_reads_back() {
    let mut cases = 0;
    for digests in 0..4 {
        for in_capsule in [0u32, 4096, 8192] {
            for c2h_success in [false, true] {
                for ts in SCHEDULERS {
                    for co in COALESCING {
                        for hs in SCHEDULERS {
                            // Depth, MAXH2CDATA and C2HData size cycle with
                            // the case number, so every value meets every
                            // scheduler and every in-capsule size.
                            // Containers flush when idle in every other case.
                            let mut target_send = send_config(ts, co);
                            let mut host_send = send_config(hs, Coalescing::Off);
                            target_send.flush_when_idle = cases % 2 == 0;
                            host_send.flush_when_idle = cases % 2 == 0;
                            let p = Params {
                                hdr_digest: digests & 1 != 0,
                                data_digest: digests & 2 != 0,
                                in_capsule_bytes: in_capsule,
                                c2h_success,
                                target_send,
                                host_send,
                                depth: [2, 5, 32][cases % 3],
                                max_h2c_data_bytes: [4096, 8192, 131072][(cases / 3) % 3],
                                max_c2h_data_bytes: [4096, 65536][(cases / 9) % 2],
                                ..Params::default()
                            };
                            cycle(p, &SIZES, cases as u64);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 4 * 3 * 2 * 3 * 4 * 3);
}

#[test]
fn block_size_4096_and_large_transfers() {
    for ts in SCHEDULERS {
        let p = Params {
            block_size: 4096,
            in_capsule_bytes: 4096,
            target_send: send_config(ts, Coalescing::Calibrated),
            host_send: send_config(ts, Coalescing::Off),
            ..Params::default()
        };
        cycle(p, &[4096, 8192, 1 << 20], 99);
    }
}

fn arb_params() -> impl Strategy<Value = Params> {
    (
        (any::<bool>(), any::<bool>(), 0u32..=32, any::<bool>()),
        (0usize..3, 0usize..4, 0usize..3, any::<bool>()),
        (2u16..=64, 1u32..=32, 1u32..=32),
    )
        .prop_map(
            |((hd, dd, ic, success), (ts, co, hs, idle), (depth, h2c_k, c2h_k))| {
                let mut target_send = send_config(SCHEDULERS[ts], COALESCING[co]);
                let mut host_send = send_config(SCHEDULERS[hs], Coalescing::Off);
                target_send.flush_when_idle = idle;
                host_send.flush_when_idle = idle;
                Params {
                    hdr_digest: hd,
                    data_digest: dd,
                    in_capsule_bytes: ic * 512,
                    c2h_success: success,
                    target_send,
                    host_send,
                    depth,
                    max_h2c_data_bytes: h2c_k * 4096,
                    max_c2h_data_bytes: c2h_k * 4096,
                    ..Params::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random parameters and random I/O (concurrent, up to the queue depth;
    /// writes in one batch do not overlap) agree with a byte-array model.
    #[test]
    fn random_io_matches_model(
        p in arb_params(),
        ops in prop::collection::vec((0u64..8000, 1usize..160, any::<u64>()), 1..40),
    ) {
        let mut pair = Pair::new(p.clone());
        let mut model = vec![0u8; p.ns_bytes as usize];
        for batch in ops.chunks(p.depth as usize) {
            let mut taken: Vec<(u64, u64)> = Vec::new();
            let mut writes = Vec::new();
            for &(slba, nlb, seed) in batch {
                let end = slba + nlb as u64;
                if taken.iter().any(|&(a, b)| slba < b && a < end) {
                    continue;
                }
                taken.push((slba, end));
                let d = pattern(nlb * 512, seed);
                writes.push((pair.submit_write(slba, d.clone()), slba, d));
            }
            pair.run();
            for (t, slba, d) in writes {
                let r = pair.take_result(IO, t).expect("write completed");
                prop_assert!(r.is_ok(), "{:?} with {:?}", r, p);
                let off = slba as usize * 512;
                model[off..off + d.len()].copy_from_slice(&d);
            }
            let reads: Vec<(u64, u64, usize)> = batch
                .iter()
                .map(|&(slba, nlb, seed)| {
                    // Read a window shifted by a little, so reads straddle writes.
                    let s = slba.saturating_sub(seed % 3);
                    (pair.submit_read(s, nlb * 512), s, nlb * 512)
                })
                .collect();
            pair.run();
            for (t, s, len) in reads {
                let c = pair.take_result(IO, t).expect("read completed");
                prop_assert!(c.is_ok(), "{:?} with {:?}", c, p);
                let off = s as usize * 512;
                prop_assert!(c.unwrap().data == model[off..off + len], "LBA {} with {:?}", s, p);
            }
        }
    }
}

/// The same parameters and I/O give the same PDUs on the wire, in the same
/// order, at the same virtual time: nothing depends on the real clock or on
/// scheduling.
#[test]
fn runs_are_deterministic() {
    // Containers that hold PDUs for their timers (not flushing when idle),
    // so that virtual time moves.
    let mut target_send = send_config(SchedulerKind::Isolated, Coalescing::Adaptive);
    let mut host_send = send_config(SchedulerKind::Unified, Coalescing::Off);
    target_send.flush_when_idle = false;
    host_send.flush_when_idle = false;
    let p = Params {
        hdr_digest: true,
        data_digest: true,
        in_capsule_bytes: 4096,
        target_send,
        host_send,
        depth: 8,
        max_h2c_data_bytes: 8192,
        ..Params::default()
    };
    let run = || {
        let mut pair = Pair::new(p.clone());
        let toks: Vec<u64> = (0..8u64)
            .map(|i| pair.submit_write(i * 200, pattern(512 << (i % 6), i)))
            .collect();
        pair.run();
        for t in toks {
            pair.take_result(IO, t).unwrap().unwrap();
        }
        let toks: Vec<u64> = (0..8u64)
            .map(|i| pair.submit_read(i * 200, 512 << (i % 6)))
            .collect();
        pair.run();
        let data: Vec<Vec<u8>> = toks
            .into_iter()
            .map(|t| pair.take_result(IO, t).unwrap().unwrap().data)
            .collect();
        (pair.take_wire(), pair.elapsed(), data)
    };
    let a = run();
    let b = run();
    assert!(
        a.1 > std::time::Duration::ZERO,
        "freights held PDUs in virtual time"
    );
    assert_eq!(a, b);
}

/// With `flush_when_idle`, a container holds nothing past the end of a
/// turn: QD 1 writes (in-capsule, the host's data freight) and reads (the
/// latency freights, then C2HData) through `unified` and `isolated` on
/// both sides complete without the virtual clock moving, every flush is an
/// `idle` one or a trigger's, none a timer's; without it every round trip
/// waits out the freights' timers.
#[test]
fn containers_flushing_when_idle_hold_nothing_past_a_turn() {
    for sched in [SchedulerKind::Unified, SchedulerKind::Isolated] {
        for idle in [false, true] {
            let mut send = send_config(sched, Coalescing::Off);
            send.flush_when_idle = idle;
            let p = Params {
                in_capsule_bytes: 4096,
                target_send: send,
                host_send: send,
                depth: 4,
                ..Params::default()
            };
            let what = format!("{sched:?}, flush_when_idle = {idle}");
            let mut pair = Pair::new(p);
            let t0 = pair.elapsed();
            let stats0 = (
                pair.link(IO).host.send_stats(),
                pair.link(IO).target.send_stats(),
            );
            for i in 0..4u64 {
                let d = pattern(4096, i);
                pair.write(i * 16, &d).unwrap();
                assert_eq!(pair.read(i * 16, 4096).unwrap(), d, "{what}");
            }
            let waited = pair.elapsed() - t0;
            let host = pair.link(IO).host.send_stats();
            let target = pair.link(IO).target.send_stats();
            let timers = host.reason(FlushReason::Timer) - stats0.0.reason(FlushReason::Timer)
                + target.reason(FlushReason::Timer)
                - stats0.1.reason(FlushReason::Timer);
            let idles = host.reason(FlushReason::Idle) - stats0.0.reason(FlushReason::Idle)
                + target.reason(FlushReason::Idle)
                - stats0.1.reason(FlushReason::Idle);
            if idle {
                assert_eq!(waited, std::time::Duration::ZERO, "{what}");
                assert_eq!(timers, 0, "{what}");
                // Host: the write capsule and the read command; target: the
                // write's response, the read's data and response.
                assert!(idles >= 8 * 2, "{what}: {idles} idle flushes");
            } else {
                // Every one of the 8 round trips waits out at least one
                // 25 µs timer on each side.
                assert!(
                    waited >= std::time::Duration::from_micros(8 * 2 * 25),
                    "{what}: waited {waited:?}"
                );
                assert_eq!(idles, 0, "{what}");
            }
        }
    }
}
