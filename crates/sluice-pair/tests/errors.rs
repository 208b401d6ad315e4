//! Error paths of the real pair: NVMe statuses as the host sees them, data
//! digest errors injected on the wire, timeouts and keep alive on the
//! virtual clock (no real sleeping anywhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_host::core::Payload;
use sluice_host::HostError;
use sluice_pair::*;
use sluice_proto::command::{admin, io, Sqe};
use sluice_proto::pdu::pdu_type;
use sluice_proto::Status;

/// One pair per send mode of both sides (schedulers × coalescing).
fn every_send_mode(base: Params) -> impl Iterator<Item = Params> {
    SCHEDULERS.into_iter().flat_map(move |ts| {
        let base = base.clone();
        COALESCING.into_iter().map(move |co| Params {
            target_send: send_config(ts, co),
            host_send: send_config(ts, Coalescing::Off),
            ..base.clone()
        })
    })
}

#[test]
fn out_of_range_lba_gives_lba_out_of_range() {
    for p in every_send_mode(Params::default()) {
        let mut pair = Pair::new(p.clone());
        let blocks = p.ns_bytes / 512;
        let r = pair.read(blocks - 1, 1024);
        assert_eq!(nvme_status(&r), Some(Status::LBA_OUT_OF_RANGE), "{p:?}");
        // A solicited write (no data moves) and an in-capsule one.
        for len in [16384, 512] {
            let t = pair.submit_write(blocks, pattern(len, 1));
            let r = pair.wait(IO, t);
            assert_eq!(nvme_status(&r), Some(Status::LBA_OUT_OF_RANGE), "{p:?}");
        }
        // SLBA + NLB overflowing u64.
        let t = pair.submit_read(u64::MAX - 1, 2048);
        assert_eq!(
            nvme_status(&pair.wait(IO, t)),
            Some(Status::LBA_OUT_OF_RANGE)
        );
        // The queue carries on.
        pair.write(blocks - 1, &pattern(512, 2)).unwrap();
        assert_eq!(pair.read(blocks - 1, 512).unwrap(), pattern(512, 2));
        assert!(!pair.link(IO).host.is_closed());
    }
}

#[test]
fn other_command_errors_have_their_status() {
    let p = Params {
        mdts_bytes: 64 * 1024,
        ..Params::default()
    };
    let mut pair = Pair::new(p);
    // Beyond MDTS, both directions.
    let t = pair.submit_read(0, 128 * 1024);
    assert_eq!(
        nvme_status(&pair.wait(IO, t)),
        Some(Status::DATA_SGL_LENGTH_INVALID)
    );
    let t = pair.submit_write(0, pattern(128 * 1024, 3));
    assert_eq!(
        nvme_status(&pair.wait(IO, t)),
        Some(Status::DATA_SGL_LENGTH_INVALID)
    );
    // At MDTS: fine.
    pair.write(0, &pattern(64 * 1024, 3)).unwrap();
    // Unknown namespace.
    let s = Sqe::rw(io::READ, 0, 2, 0, 1, false);
    let r = pair.execute(IO, s, Payload::Read(512));
    assert_eq!(nvme_status(&r), Some(Status::INVALID_NAMESPACE));
    // Unknown opcode.
    let r = pair.execute(IO, Sqe::new(0x7c, 0, NSID), Payload::None);
    assert_eq!(nvme_status(&r), Some(Status::INVALID_OPCODE));
    // An SGL length that disagrees with NLB (2 blocks, 512 bytes).
    let s = Sqe::rw(io::READ, 0, NSID, 0, 2, false);
    let r = pair.execute(IO, s, Payload::Read(512));
    assert_eq!(nvme_status(&r), Some(Status::DATA_SGL_LENGTH_INVALID));
    // A Connect on a connected queue: Invalid Opcode, as nvmet and SPDK.
    let r = pair.connect(IO, 1, 31, 0, pair.cntlid);
    assert_eq!(nvme_status(&r), Some(Status::INVALID_OPCODE));
    assert_eq!(pair.read(0, 64 * 1024).unwrap(), pattern(64 * 1024, 3));
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    for p in every_send_mode(Params::default()) {
        let mut pair = Pair::new(p);
        let d = pattern(8192, 9);
        pair.write(0, &d).unwrap();
        pair.execute(IO, Sqe::new(io::FLUSH, 0, NSID), Payload::None)
            .unwrap();
        pair.execute(IO, Sqe::new(io::FLUSH, 0, 0xffff_ffff), Payload::None)
            .unwrap();
        // Write Zeroes blocks 0..4.
        let s = Sqe::rw(io::WRITE_ZEROES, 0, NSID, 0, 4, false);
        pair.execute(IO, s, Payload::None).unwrap();
        let r = pair.read(0, 8192).unwrap();
        assert_eq!(&r[..2048], &[0u8; 2048][..]);
        assert_eq!(&r[2048..], &d[2048..]);
        // DSM deallocate blocks 4..8 (RAM reads deallocated blocks as zeroes).
        let dsm = |slba: u64| {
            let mut s = Sqe::new(io::DATASET_MANAGEMENT, 0, NSID);
            s.set_cdw(10, 0);
            s.set_cdw(11, 0x4);
            let mut range = vec![0u8; 16];
            range[4..8].copy_from_slice(&4u32.to_le_bytes());
            range[8..16].copy_from_slice(&slba.to_le_bytes());
            (s, Payload::Write(range))
        };
        let (s, pl) = dsm(4);
        pair.execute(IO, s, pl).unwrap();
        let r = pair.read(0, 8192).unwrap();
        assert_eq!(&r[..4096], &[0u8; 4096][..]);
        assert_eq!(&r[4096..], &d[4096..]);
        let (s, pl) = dsm(1 << 40);
        let r = pair.execute(IO, s, pl);
        assert_eq!(nvme_status(&r), Some(Status::LBA_OUT_OF_RANGE));
    }
}

/// A data digest error on host-to-controller data fails that command alone
/// with Transient Transport Error; nothing of it is written, the commands
/// around it succeed and the queue carries on.
#[test]
fn h2c_data_digest_error_fails_only_that_command() {
    let base = Params {
        data_digest: true,
        depth: 8,
        ..Params::default()
    };
    for p in every_send_mode(base) {
        // 64 KiB writes go in two H2CData PDUs of 32 KiB: the third PDU is
        // the first of the second write. 4 KiB writes go in-capsule.
        for (ty, len, nth) in [
            (pdu_type::H2C_DATA, 65536, 2),
            (pdu_type::CAPSULE_CMD, 4096, 1),
        ] {
            let mut pair = Pair::new(p.clone());
            pair.inject(Fault::DataDigest {
                link: IO,
                dir: Dir::H2C,
                pdu_type: ty,
                nth,
            });
            let toks: Vec<u64> = (0..3)
                .map(|i| pair.submit_write(i * 1000, pattern(len, i)))
                .collect();
            pair.run();
            for (i, t) in toks.into_iter().enumerate() {
                let r = pair.take_result(IO, t).expect("completed");
                if i == 1 {
                    assert_eq!(
                        nvme_status(&r),
                        Some(Status::TRANSIENT_TRANSPORT_ERROR),
                        "{ty:#x} {p:?}"
                    );
                    assert_eq!(pair.read(1000, len).unwrap(), vec![0; len], "not written");
                } else {
                    r.unwrap();
                    assert_eq!(
                        pair.read(i as u64 * 1000, len).unwrap(),
                        pattern(len, i as u64)
                    );
                }
            }
            assert!(!pair.link(IO).host.is_closed());
            assert!(!pair.link(IO).target.is_closing());
        }
    }
}

/// A data digest error on controller-to-host data fails that read alone
/// on the host (DataDigest naming its CID); the others and the queue are fine.
#[test]
fn c2h_data_digest_error_fails_only_that_read() {
    let base = Params {
        data_digest: true,
        depth: 8,
        ..Params::default()
    };
    for success in [false, true] {
        for p in every_send_mode(Params {
            c2h_success: success,
            ..base.clone()
        }) {
            let mut pair = Pair::new(p.clone());
            for i in 0..3u64 {
                pair.write(i * 1000, &pattern(65536, i)).unwrap();
            }
            // 65536 bytes in 32 KiB PDUs: the fourth C2HData is the 2nd
            // PDU of the second read.
            pair.inject(Fault::DataDigest {
                link: IO,
                dir: Dir::C2H,
                pdu_type: pdu_type::C2H_DATA,
                nth: 3,
            });
            let toks: Vec<u64> = (0..3).map(|i| pair.submit_read(i * 1000, 65536)).collect();
            pair.run();
            for (i, t) in toks.into_iter().enumerate() {
                let r = pair.take_result(IO, t).expect("completed");
                if i == 1 {
                    assert!(
                        matches!(r, Err(HostError::DataDigest { .. })),
                        "{r:?} {p:?}"
                    );
                } else {
                    assert_eq!(r.unwrap().data, pattern(65536, i as u64));
                }
            }
            assert!(!pair.link(IO).host.is_closed());
            assert_eq!(pair.read(1000, 65536).unwrap(), pattern(65536, 1));
        }
    }
}

/// A command the controller does not answer (its backend paused) times
/// out on the host after the command timeout of virtual time, not before;
/// its CID stays reserved, the admin queue works meanwhile, and a second
/// period without an answer closes the connection. An Asynchronous Event
/// Request, which the controller holds until it has an event, never times
/// out (as the Linux host holds its AER).
#[test]
fn command_timeout_fires_on_the_virtual_clock() {
    let timeout = Duration::from_secs(3);
    let mut pair = Pair::new(Params {
        command_timeout: timeout,
        ..Params::default()
    });
    let t0 = pair.now();
    let aer = pair.submit(
        ADMIN,
        Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0),
        Payload::None,
    );
    pair.pause_backend(true);
    let read = pair.submit_read(0, 4096);
    pair.run();
    assert!(pair.take_result(ADMIN, aer).is_none(), "the AER is held");
    pair.advance(timeout - Duration::from_millis(1));
    assert!(
        pair.take_result(IO, read).is_none(),
        "not before the timeout"
    );
    pair.advance(Duration::from_millis(1));
    let r = pair.take_result(IO, read).expect("timed out");
    assert!(
        matches!(
            r,
            Err(HostError::Timeout {
                opcode: io::READ,
                timeout_ms: 3000,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(pair.link(IO).timed_out().len(), 1);
    assert_eq!(pair.link(IO).timed_out()[0].1, io::READ);
    assert_eq!(pair.link(IO).host.in_flight(), 1, "CID still reserved");
    assert_eq!(pair.now() - t0, timeout);
    // The admin queue works meanwhile; its AER is still held, not timed out.
    pair.prop_get(sluice_proto::fabrics::prop::CSTS).unwrap();
    assert!(pair.take_result(ADMIN, aer).is_none());
    assert!(pair.link(ADMIN).timed_out().is_empty());
    pair.advance(timeout);
    assert!(pair.link(IO).host.is_closed(), "unresponsive controller");
    assert!(matches!(
        pair.link(IO).closed(),
        Some(HostError::ConnectionLost(_))
    ));
    assert!(
        pair.link(ADMIN).timed_out().is_empty(),
        "the AER never times out"
    );
}

/// An I/O command stuck in the backend times out; when the backend answers
/// late the CID is released and the queue carries on.
#[test]
fn io_timeout_and_late_completion() {
    for p in every_send_mode(Params {
        command_timeout: Duration::from_secs(2),
        ..Params::default()
    }) {
        let mut pair = Pair::new(p.clone());
        pair.write(0, &pattern(4096, 5)).unwrap();
        pair.pause_backend(true);
        let t = pair.submit_read(0, 4096);
        pair.advance(Duration::from_secs(2));
        let r = pair.take_result(IO, t).expect("timed out");
        assert!(
            matches!(
                r,
                Err(HostError::Timeout {
                    opcode: io::READ,
                    ..
                })
            ),
            "{r:?}"
        );
        assert_eq!(pair.link(IO).host.in_flight(), 1);
        pair.pause_backend(false);
        pair.run();
        assert_eq!(
            pair.link(IO).host.in_flight(),
            0,
            "late completion frees the CID"
        );
        assert!(pair.take_result(IO, t).is_none(), "reported once");
        assert_eq!(pair.read(0, 4096).unwrap(), pattern(4096, 5), "{p:?}");
    }
}

/// KATO on the virtual clock: keep alives hold the association; without
/// them the target fails the controller after KATO + grace, closes the
/// admin queue, then the I/O queue, and the host sees both connections go.
#[test]
fn keep_alive_timeout_fails_the_association() {
    let mut pair = Pair::new(Params {
        kato_ms: 5000,
        kato_grace_ms: 500,
        command_timeout: Duration::from_secs(30),
        ..Params::default()
    });
    pair.advance(Duration::from_millis(4000));
    pair.keep_alive().unwrap();
    pair.advance(Duration::from_millis(4000));
    assert!(
        !pair.link(ADMIN).target.is_closing(),
        "keep alive reset the timer"
    );
    pair.write(0, &pattern(512, 1)).unwrap();
    pair.advance(Duration::from_millis(1000));
    assert!(!pair.link(ADMIN).target.is_closing(), "within KATO + grace");
    pair.pause_backend(true);
    let t = pair.submit_read(0, 512);
    pair.advance(Duration::from_millis(600));
    assert!(
        pair.link(ADMIN).target.is_closed(),
        "KATO (5 s) + grace expired"
    );
    assert!(pair.link(ADMIN).host.is_closed());
    assert!(
        pair.reg
            .controller(&pair.reg.subsystems()[SUBNQN], pair.cntlid)
            .is_none(),
        "controller removed"
    );
    // The I/O queue follows its controller at its next check (200 ms).
    pair.advance(Duration::from_millis(300));
    assert!(pair.link(IO).target.is_closing());
    assert!(pair.link(IO).host.is_closed());
    let r = pair.take_result(IO, t).expect("failed with the connection");
    assert!(matches!(r, Err(HostError::ConnectionLost(_))), "{r:?}");
}

/// The host never has more commands outstanding than its depth; the target
/// accepts exactly that many (depth = SQSIZE + 1) and all complete.
#[test]
fn full_queue_depth_completes() {
    for depth in [2u16, 7, 64] {
        let mut pair = Pair::new(Params {
            depth,
            ..Params::default()
        });
        pair.pause_backend(true);
        let toks: Vec<u64> = (0..depth as u64)
            .map(|i| pair.submit_write(i * 64, pattern(16384, i)))
            .collect();
        pair.run();
        assert!(!pair.link(IO).host.can_submit(), "all {depth} slots taken");
        assert_eq!(pair.link(IO).target.backend_in_flight(), depth as u32);
        pair.pause_backend(false);
        pair.run();
        for t in toks {
            pair.take_result(IO, t).unwrap().unwrap();
        }
        for i in 0..depth as u64 {
            assert_eq!(pair.read(i * 64, 16384).unwrap(), pattern(16384, i));
        }
    }
}
