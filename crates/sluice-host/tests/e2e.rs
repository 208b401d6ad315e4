//! The host library over real loopback TCP: against Sluice's real target
//! wherever a well-behaved controller will do, against the scripted
//! `MemTarget` for what only it can show (CPDA, odd C2HData sizes, referrals,
//! dropped connections, the CDW13 it received).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::mem_target::{MemTarget, MemTargetConfig};
use common::RealTarget;
use sluice_host::{discover, ConnectOptions, Controller, HostError, IoFlags, PollingPolicy};
use sluice_proto::log::{adrfam, subtype, DiscoveryEntry, TRTYPE_TCP};

fn opts() -> ConnectOptions {
    ConnectOptions {
        hostnqn: "nqn.2024-01.io.sluice:host-a".into(),
        io_queues: 2,
        queue_depth: 16,
        command_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

/// Never repeats within a namespace ([`sluice_testdata::pattern`]).
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    sluice_testdata::pattern(n, u64::from(seed))
}

async fn round_trip(cfg: MemTargetConfig, o: ConnectOptions) {
    let t = MemTarget::start(cfg.clone()).expect("target");
    round_trip_at(t.addr(), &cfg.subnqn, cfg.size_blocks, o).await;
}

async fn round_trip_real(o: ConnectOptions) {
    let t = RealTarget::start();
    round_trip_at(t.addr(), &t.subnqn.clone(), t.size_blocks, o).await;
}

async fn round_trip_at(addr: SocketAddr, subnqn: &str, size_blocks: u64, o: ConnectOptions) {
    let c = Controller::connect(addr, subnqn, o).await.expect("connect");
    assert_eq!(c.io_queue_count(), 2);
    assert_eq!(c.queue_depth(), 16);
    let nss = c.namespaces();
    assert_eq!(nss.len(), 1);
    assert_eq!(nss[0].block_size_bytes, 512);
    let ns = c.namespace(1).expect("ns");
    // Small (in-capsule), medium (R2T split by MAXH2CDATA), large (split by MDTS).
    for (lba, len, seed) in [
        (0u64, 512usize, 1u8),
        (8, 4096, 2),
        (100, 96 * 1024, 3),
        (1000, 1 << 20, 4),
    ] {
        let d = pattern(len, seed);
        ns.write(lba, &d, IoFlags::default()).await.expect("write");
        let r = ns.read(lba, len, IoFlags::default()).await.expect("read");
        assert!(r == d, "read back differs at lba {lba} len {len}");
    }
    ns.flush().await.expect("flush");
    ns.write_zeroes(8, 8).await.expect("write zeroes");
    assert!(ns
        .read(8, 4096, IoFlags::default())
        .await
        .expect("read")
        .iter()
        .all(|&b| b == 0));
    ns.deallocate(100, 16).await.expect("deallocate");
    assert!(ns
        .read(100, 8192, IoFlags::default())
        .await
        .expect("read")
        .iter()
        .all(|&b| b == 0));
    // Out of range is refused locally; the controller's status carries a name.
    assert!(matches!(
        ns.read(size_blocks, 512, IoFlags::default()).await,
        Err(HostError::InvalidArgument(_))
    ));
    c.disconnect(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_default() {
    round_trip_real(opts()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_digests_capsule_resp_and_cpda() {
    let cfg = MemTargetConfig {
        c2h_success: false,
        cpda: 7,
        c2h_chunk_bytes: 3000,
        maxh2cdata_bytes: 8192,
        ..Default::default()
    };
    let o = ConnectOptions {
        hdr_digest: true,
        data_digest: true,
        ..opts()
    };
    round_trip(cfg, o.clone()).await;
    round_trip_real(o).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_busy_and_adaptive_polling() {
    for p in [
        PollingPolicy::BusyPoll,
        PollingPolicy::Adaptive { spin_us: 20 },
    ] {
        round_trip_real(ConnectOptions {
            polling: p,
            ..opts()
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_travel_in_cdw13() {
    let cfg = MemTargetConfig::default();
    let t = MemTarget::start(cfg.clone()).expect("target");
    let c = Controller::connect(t.addr(), &cfg.subnqn, opts())
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    let f = IoFlags {
        urgent: true,
        barrier: true,
        fua: true,
        epoch: 0,
    };
    ns.write(0, &[7u8; 512], f).await.expect("write");
    let cdw13 = t
        .stats()
        .last_cdw13
        .load(std::sync::atomic::Ordering::Relaxed) as u32;
    assert_eq!(cdw13 & 0x30, 0x30, "urgent = Access Latency 11b");
    assert_eq!(cdw13 & (1 << 8), 1 << 8, "barrier bit");
    ns.read(0, 512, IoFlags::default()).await.expect("read");
    assert_eq!(
        t.stats()
            .last_cdw13
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_host_gets_named_status() {
    let t = RealTarget::start_with(&["nqn.2024-01.io.sluice:someone-else"], |t| t);
    let e = Controller::connect(t.addr(), &t.subnqn, opts())
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("Connect Invalid Host"), "{e}");
    let e = Controller::connect(t.addr(), "nqn.2024-01.io.sluice:nope", opts())
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("Connect Invalid Parameters"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_is_transport_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    let e = Controller::connect(addr, "nqn.x", opts())
        .await
        .expect_err("no target");
    assert!(matches!(e, HostError::Transport(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_referrals() {
    let entry = |sub: &str, st: u8, port: u16| DiscoveryEntry {
        trtype: TRTYPE_TCP,
        adrfam: adrfam::IPV4,
        subtype: st,
        treq: 0,
        portid: 1,
        cntlid: 0xffff,
        asqsz: 32,
        eflags: 0,
        trsvcid: port.to_string(),
        subnqn: sub.into(),
        traddr: "127.0.0.1".into(),
        sectype: 0,
    };
    let leaf = MemTarget::start(MemTargetConfig {
        discovery: vec![entry("nqn.2024-01.io.sluice:b", subtype::NVME, 4421)],
        ..Default::default()
    })
    .expect("leaf");
    let mut root_entries: Vec<_> = (0..3)
        .map(|i| entry(&format!("nqn.2024-01.io.sluice:a{i}"), subtype::NVME, 4420))
        .collect();
    root_entries.push(entry(
        sluice_proto::DISCOVERY_NQN,
        subtype::REFERRAL,
        leaf.addr().port(),
    ));
    let root = MemTarget::start(MemTargetConfig {
        discovery: root_entries,
        ..Default::default()
    })
    .expect("root");
    let found = discover(root.addr(), &opts()).await.expect("discover");
    let mut names: Vec<_> = found.iter().map(|e| e.subnqn.clone()).collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "nqn.2024-01.io.sluice:a0",
            "nqn.2024-01.io.sluice:a1",
            "nqn.2024-01.io.sluice:a2",
            "nqn.2024-01.io.sluice:b"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connection_fails_then_reconnects() {
    let t = RealTarget::start();
    let o = ConnectOptions {
        kato: Duration::from_millis(200),
        ..opts()
    };
    let c = Controller::connect(t.addr(), &t.subnqn, o)
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    ns.write(0, &[1u8; 512], IoFlags::default())
        .await
        .expect("write");
    let addr = t.addr();
    drop(t); // the target stops; its connections close within ~200 ms
    tokio::time::sleep(Duration::from_millis(600)).await;
    let e = ns
        .read(0, 512, IoFlags::default())
        .await
        .expect_err("target is gone");
    assert!(
        e.is_fatal_for_connection() || matches!(e, HostError::Transport(_)),
        "{e}"
    );
    // A new target on another port cannot take over the same address, so
    // just check the controller reports the loss cleanly and disconnects.
    let _ = addr;
    c.disconnect(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_and_retries_after_connection_loss() {
    let cfg = MemTargetConfig::default();
    let t = MemTarget::start(cfg.clone()).expect("target");
    let mut o = opts();
    o.reconnect.retry_io = true;
    o.reconnect.backoff_initial = Duration::from_millis(10);
    let c = Controller::connect(t.addr(), &cfg.subnqn, o)
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    ns.write(0, &[5u8; 512], IoFlags::default())
        .await
        .expect("write");
    t.drop_connections();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The queue noticed the loss; the read reconnects and is retried.
    let r = ns
        .read(0, 512, IoFlags::default())
        .await
        .expect("read after reconnect");
    assert_eq!(r, vec![5u8; 512]);
    c.disconnect(Duration::from_secs(1)).await;
}

/// The host's send schedulers (`sluice_proto::send`): the full round trip (in-capsule,
/// R2T-split and MDTS-split writes, reads, admin) plus concurrent mixed I/O
/// in every mode, paper defaults and with millisecond timers that only the
/// timer trigger can flush (a lone held PDU must still leave), those also
/// flushing when idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_every_send_mode() {
    use sluice_proto::send::{FreightParams, SchedulerKind, SendConfig};
    let slow = FreightParams {
        size_bytes: 1 << 20,
        degree: 4096,
        timer: Duration::from_millis(2),
    };
    let mut modes = Vec::new();
    for k in [
        SchedulerKind::Immediate,
        SchedulerKind::Unified,
        SchedulerKind::Isolated,
    ] {
        modes.push(SendConfig {
            scheduler: k,
            ..SendConfig::default()
        });
    }
    for k in [SchedulerKind::Unified, SchedulerKind::Isolated] {
        for flush_when_idle in [false, true] {
            modes.push(SendConfig {
                scheduler: k,
                unified: slow,
                latency: slow,
                data: slow,
                flush_when_idle,
                ..SendConfig::default()
            });
        }
    }
    for send in modes {
        let o = ConnectOptions { send, ..opts() };
        round_trip_real(o.clone()).await;
        let t = RealTarget::start();
        let c = Controller::connect(t.addr(), &t.subnqn, o)
            .await
            .expect("connect");
        let ns = c.namespace(1).expect("ns");
        let mut tasks = Vec::new();
        for i in 0..24u64 {
            let ns = ns.clone();
            tasks.push(tokio::spawn(async move {
                let len = [512usize, 4096, 16384][i as usize % 3];
                let d = pattern(len, i as u8);
                ns.write(i * 64, &d, IoFlags::default()).await?;
                let r = ns.read(i * 64, len, IoFlags::default()).await?;
                Ok::<bool, HostError>(r == d)
            }));
        }
        for t in tasks {
            assert!(t.await.expect("task").expect("io"), "{send:?}");
        }
        let st = c.io_stats();
        assert!(st.flushes > 0 && st.flush_pdus >= st.flushes, "{st:?}");
        if send.scheduler == SchedulerKind::Isolated {
            assert!(st.waited_latency > 0 && st.waited_data > 0, "{st:?}");
        }
        c.disconnect(Duration::from_secs(1)).await;
    }
    // A zero-sized freight is refused with the key named.
    let bad = SendConfig {
        scheduler: SchedulerKind::Isolated,
        data: FreightParams {
            size_bytes: 0,
            ..SendConfig::default().data
        },
        ..SendConfig::default()
    };
    let t = RealTarget::start();
    let e = Controller::connect(
        t.addr(),
        &t.subnqn,
        ConnectOptions {
            send: bad,
            ..opts()
        },
    )
    .await
    .expect_err("refused");
    assert!(e.to_string().contains("data_size"), "{e}");
}

/// The full round trip with every completion coalescing mode on the host's
/// wake-up path (held completions are released by threshold, timer, urgent
/// or barrier; nothing is lost), plus concurrent hinted I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_every_coalescing_mode() {
    use sluice_proto::coalesce::{CoalesceConfig, CoalesceMode};
    for mode in [
        CoalesceMode::Static,
        CoalesceMode::Adaptive,
        CoalesceMode::Calibrated,
    ] {
        let co = CoalesceConfig {
            mode,
            threshold: 4,
            timeout: Duration::from_micros(50),
            ..CoalesceConfig::default()
        };
        round_trip_real(ConnectOptions {
            coalescing: co,
            ..opts()
        })
        .await;
        let t = RealTarget::start();
        let c = Controller::connect(
            t.addr(),
            &t.subnqn,
            ConnectOptions {
                coalescing: co,
                ..opts()
            },
        )
        .await
        .expect("connect");
        let ns = c.namespace(1).expect("ns");
        let mut tasks = Vec::new();
        for i in 0..24u64 {
            let ns = ns.clone();
            let flags = IoFlags {
                urgent: i % 5 == 0,
                barrier: i % 7 == 0,
                fua: false,
                epoch: 0,
            };
            tasks.push(tokio::spawn(async move {
                ns.read(i * 8, 4096, flags).await.map(|d| d.len())
            }));
        }
        for t in tasks {
            assert_eq!(t.await.expect("task").expect("read"), 4096);
        }
        c.disconnect(Duration::from_secs(1)).await;
    }
}

/// Chain-epoch fences against the real target: a write below its granule's
/// fence is refused with Stale Chain Epoch and changes nothing; writes at
/// or above it, and writes to other granules, go through; Write Zeroes and
/// Deallocate are fenced too; the Fence command counts writes in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_below_a_fence_are_refused_and_change_nothing() {
    use sluice_proto::fence::{GRANULE_BYTES, GRANULE_SHIFT};
    let t = RealTarget::start();
    let c = Controller::connect(t.addr(), &t.subnqn.clone(), opts())
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    let at = |epoch| IoFlags {
        epoch,
        ..IoFlags::default()
    };
    let lba = GRANULE_BYTES / 512; // granule 1
    ns.write(lba, &pattern(4096, 1), at(0))
        .await
        .expect("unfenced write");

    let a = ns.fence(1, 1, 7, true).await.expect("fence");
    assert_eq!(a.writes_in_flight, 0);
    assert_eq!(a.granule_shift, GRANULE_SHIFT);

    for epoch in [0, 6] {
        match ns.write(lba, &pattern(4096, 2), at(epoch)).await {
            Err(HostError::Nvme { status, .. }) => {
                assert!(status.is_stale_epoch() && status.dnr, "{status}")
            }
            r => panic!("epoch {epoch} below the fence: {r:?}"),
        }
    }
    match ns.write_zeroes(lba, 8).await {
        Err(HostError::Nvme { status, .. }) => assert!(status.is_stale_epoch()),
        r => panic!("unfenced Write Zeroes: {r:?}"),
    }
    match ns.deallocate(lba, 8).await {
        Err(HostError::Nvme { status, .. }) => assert!(status.is_stale_epoch()),
        r => panic!("unfenced Deallocate: {r:?}"),
    }
    assert_eq!(
        ns.read(lba, 4096, IoFlags::default()).await.unwrap(),
        pattern(4096, 1),
        "refused writes changed nothing"
    );
    ns.write(lba, &pattern(4096, 3), at(7))
        .await
        .expect("write at the fence");
    ns.write(0, &pattern(4096, 4), at(0))
        .await
        .expect("granule 0 is not fenced");
    ns.write_zeroes_at_epoch(lba + 8, 8, 9)
        .await
        .expect("zeroes above the fence");
    let mut want = pattern(4096, 3);
    want.extend(vec![0; 4096]);
    assert_eq!(ns.read(lba, 8192, IoFlags::default()).await.unwrap(), want);
    // Fences never go down; nothing is left in flight.
    ns.fence(1, 1, 2, true).await.expect("lower raise");
    assert!(ns.write(lba, &pattern(4096, 5), at(6)).await.is_err());
    assert_eq!(ns.fence(1, 1, 0, false).await.unwrap().writes_in_flight, 0);
    // Bad fences are the right errors.
    let blocks_granules = (t.size_blocks * 512).div_ceil(GRANULE_BYTES);
    match ns.fence(blocks_granules, 1, 1, true).await {
        Err(HostError::Nvme { status, .. }) => {
            assert_eq!(status, sluice_proto::Status::INVALID_FIELD)
        }
        r => panic!("fence beyond the namespace: {r:?}"),
    }
    match ns.fence(0, 0, 1, true).await {
        Err(HostError::Nvme { status, .. }) => {
            assert_eq!(status, sluice_proto::Status::INVALID_FIELD)
        }
        r => panic!("fence of no granule: {r:?}"),
    }
    let unknown = sluice_proto::fence::Fence {
        nsid: 9,
        first_granule: 0,
        granules: 1,
        epoch: 1,
        raise: true,
    };
    match c
        .admin(unknown.to_sqe(), sluice_host::core::Payload::None)
        .await
    {
        Err(HostError::Nvme { status, .. }) => {
            assert_eq!(status, sluice_proto::Status::INVALID_NAMESPACE)
        }
        r => panic!("fence of an unknown namespace: {r:?}"),
    }
    // The connection carries on after every refusal.
    ns.write(lba, &pattern(4096, 6), at(7))
        .await
        .expect("still serving");
}

/// A scripted target's counter.
fn n(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(std::sync::atomic::Ordering::Relaxed)
}

/// A controller's Write Zeroes and Dataset Management limits (CNS 06h:
/// WZSL, DMRL, DMRSL, DMSL) split the host's commands; the scripted target
/// refuses any command past them with Invalid Field, so one unsplit
/// command fails the test. Zeroed and deallocated ranges read back zero,
/// their neighbours keep their data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_zeroes_and_deallocate_split_at_the_controllers_limits() {
    use sluice_proto::identify::IdentifyControllerNvm;
    let cfg = MemTargetConfig {
        nvm_limits: Some(IdentifyControllerNvm {
            wzsl: 1, // 2 pages: 8 KiB, 16 blocks of 512 bytes
            dmrl: 2,
            dmrsl: 8,
            dmsl: 12,
            ..Default::default()
        }),
        ..Default::default()
    };
    let t = MemTarget::start(cfg.clone()).expect("target");
    let c = Controller::connect(t.addr(), &cfg.subnqn, opts())
        .await
        .expect("connect");
    let lim = c.command_limits();
    assert_eq!(lim.write_zeroes_bytes_max, Some(8192));
    assert_eq!(lim.write_zeroes_blocks_max(512), Some(16));
    assert_eq!(
        (
            lim.dsm_ranges_max,
            lim.dsm_range_blocks_max,
            lim.dsm_blocks_max
        ),
        (2, 8, Some(12))
    );
    let ns = c.namespace(1).expect("ns");
    let all = pattern(256 * 512, 7);
    ns.write(0, &all, IoFlags::default()).await.expect("write");

    ns.write_zeroes(10, 100).await.expect("write zeroes");
    // 100 blocks at 16 per command.
    assert_eq!(n(&t.stats().write_zeroes), 7);
    let mut want = all.clone();
    want[10 * 512..110 * 512].fill(0);
    assert!(ns.read(0, all.len(), IoFlags::default()).await.unwrap() == want);

    ns.deallocate(150, 50).await.expect("deallocate");
    // 50 blocks: ranges of at most 8, at most 12 blocks and 2 ranges per
    // command: 4 commands of 8 + 4 blocks, then one range of 2.
    let st = t.stats();
    assert_eq!(n(&st.dsm_commands), 5);
    assert_eq!(n(&st.dsm_ranges), 9);
    want[150 * 512..200 * 512].fill(0);
    assert!(ns.read(0, all.len(), IoFlags::default()).await.unwrap() == want);
    c.disconnect(Duration::from_secs(1)).await;
}

/// A controller without Write Zeroes in ONCS gets zeroed data written
/// instead (no Write Zeroes command: the target would refuse it with
/// Invalid Opcode); one without Dataset Management gets no Deallocate, and
/// the caller learns why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_without_write_zeroes_or_dsm_gets_neither() {
    let cfg = MemTargetConfig {
        oncs: 0,
        ..Default::default()
    };
    let t = MemTarget::start(cfg.clone()).expect("target");
    let c = Controller::connect(t.addr(), &cfg.subnqn, opts())
        .await
        .expect("connect");
    let lim = c.command_limits();
    assert!(!lim.write_zeroes && !lim.dataset_management);
    // No CNS 06h answer: no limits beyond NLB.
    assert_eq!(lim.write_zeroes_bytes_max, None);
    let ns = c.namespace(1).expect("ns");
    let all = pattern(64 * 512, 9);
    ns.write(0, &all, IoFlags::default()).await.expect("write");
    let writes_before = n(&t.stats().writes);
    ns.write_zeroes(4, 40).await.expect("zeroes as data");
    assert!(n(&t.stats().writes) > writes_before);
    assert_eq!(n(&t.stats().write_zeroes), 0);
    let mut want = all.clone();
    want[4 * 512..44 * 512].fill(0);
    assert!(ns.read(0, all.len(), IoFlags::default()).await.unwrap() == want);
    match ns.deallocate(0, 8).await {
        Err(HostError::Incompatible(why)) => assert!(why.contains("Dataset Management"), "{why}"),
        r => panic!("deallocate without DSM: {r:?}"),
    }
    assert_eq!(n(&t.stats().dsm_commands), 0);
    assert!(ns.read(0, all.len(), IoFlags::default()).await.unwrap() == want);
    c.disconnect(Duration::from_secs(1)).await;
}

/// Sluice's target advertises `target.write_zeroes_bytes_max` as WZSL and
/// refuses longer commands; the host reads it and splits, so a 1 MiB
/// Write Zeroes succeeds and reads back zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_zeroes_within_a_sluice_targets_wzsl() {
    let t = RealTarget::start_with(&[], |s| s.with_write_zeroes_bytes_max(Some(64 << 10)));
    let c = Controller::connect(t.addr(), &t.subnqn.clone(), opts())
        .await
        .expect("connect");
    assert_eq!(c.command_limits().write_zeroes_bytes_max, Some(64 << 10));
    let ns = c.namespace(1).expect("ns");
    let d = pattern(1 << 20, 3);
    ns.write(2048, &d, IoFlags::default()).await.expect("write");
    ns.write_zeroes(2048, 2048).await.expect("1 MiB of zeroes");
    assert!(ns
        .read(2048, 1 << 20, IoFlags::default())
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    c.disconnect(Duration::from_secs(1)).await;
}

/// Polls `cond` every 20 ms for up to 20 s.
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within 20 s: {what}");
}

/// The host follows namespaces its target changes online: it keeps an
/// Asynchronous Event Request posted and, on the Namespace Attribute
/// Changed notice a reload brings, lists the namespaces again. A grown
/// file namespace's handle reports the new size and its I/O reaches the
/// new blocks, an added namespace gets a handle, a removed one is gone;
/// disconnecting does not wait for the request the controller holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_follows_namespaces_a_reload_changes() {
    let img = std::env::temp_dir().join(format!("sluice-host-grow-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&img);
    let file_ns = |bytes: u64| {
        sluice_config::NamespaceConfig::file(1, &img)
            .with_create(true)
            .with_block_size(512)
            .with_size(bytes)
    };
    let t = RealTarget::start_sub(
        &[],
        |s| s,
        |mut s| {
            s.namespaces = vec![file_ns(1 << 20)];
            s
        },
    );
    let c = Controller::connect(t.addr(), &t.subnqn, opts())
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    assert_eq!(ns.size_blocks(), 2048);
    let d = pattern(4096, 7);
    let past = ns.write(2048, &d, IoFlags::default()).await;
    assert!(
        matches!(&past, Err(HostError::InvalidArgument(why)) if why.contains("2048 blocks")),
        "refused locally: {past:?}"
    );

    let mut grown = t.config.clone();
    grown.subsystems[0].namespaces[0] = file_ns(2 << 20);
    grown.subsystems[0]
        .namespaces
        .push(sluice_config::NamespaceConfig::ram(2, 1 << 20).with_block_size(512));
    t.handle().reload(&grown).expect("reload");
    wait_until(
        "the host sees namespace 1 grow and namespace 2 come",
        || ns.size_blocks() == 4096 && c.namespace(2).is_ok(),
    )
    .await;
    assert_eq!(
        ns.info().size_blocks,
        2048,
        "info is as the handle was made"
    );
    assert_eq!(c.namespace(1).expect("ns").info().size_blocks, 4096);
    ns.write(2048, &d, IoFlags::default())
        .await
        .expect("write past the old end");
    assert_eq!(
        ns.read(2048, 4096, IoFlags::default()).await.expect("read"),
        d
    );
    let two = c.namespace(2).expect("ns 2");
    two.write(8, &d, IoFlags::default())
        .await
        .expect("write ns 2");
    assert_eq!(
        two.read(8, 4096, IoFlags::default())
            .await
            .expect("read ns 2"),
        d
    );

    let mut fewer = grown.clone();
    fewer.subsystems[0].namespaces.truncate(1);
    t.handle().reload(&fewer).expect("reload");
    wait_until("the host sees namespace 2 go", || c.namespace(2).is_err()).await;
    assert_eq!(
        c.namespaces().iter().map(|n| n.nsid).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(ns.size_blocks(), 4096);

    let t0 = std::time::Instant::now();
    c.disconnect(Duration::from_secs(30)).await;
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "disconnect waited for the held Asynchronous Event Request"
    );
    drop(t);
    let _ = std::fs::remove_file(&img);
}

/// A controller that advertises Namespace Attribute Notices but refuses
/// to enable them (Set Features 0Bh: Invalid Opcode) still connects: an
/// optional feature refused is logged, not a failed connect, and I/O works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_refusing_the_notices_it_advertises_still_connects() {
    let cfg = MemTargetConfig {
        oaes: sluice_host::controller::AEN_NS_ATTRIBUTE,
        ..MemTargetConfig::default()
    };
    let t = MemTarget::start(cfg.clone()).expect("target");
    let c = Controller::connect(t.addr(), &cfg.subnqn, opts())
        .await
        .expect("connects without the notices");
    let ns = c.namespace(1).expect("ns");
    let d = pattern(4096, 9);
    ns.write(8, &d, IoFlags::default()).await.expect("write");
    assert_eq!(ns.read(8, 4096, IoFlags::default()).await.expect("read"), d);
    c.disconnect(Duration::from_secs(5)).await;
}

/// Two hosts (two Host Identifiers) through the library against the real
/// target: registrations, a Write Exclusive reservation that refuses the
/// other host's writes (and only those), a report naming both, a preempt
/// and abort that moves the reservation, and a clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_between_two_hosts() {
    use sluice_proto::reservation::{
        AcquireAction, RegisterAction, ReleaseAction, ReservationType,
    };
    use sluice_proto::Status;
    let t = RealTarget::start();
    // No Host Identifier set: each is derived from its host NQN, so the
    // two NQNs are two hosts (as `sluice resv` and `sluice bench` run).
    let host = |name: &str| ConnectOptions {
        hostnqn: format!("nqn.2024-01.io.sluice:{name}"),
        ..opts()
    };
    let (ida, idb) = (
        sluice_host::controller::host_identifier(&host("host-a")),
        sluice_host::controller::host_identifier(&host("host-b")),
    );
    let a = Controller::connect(t.addr(), &t.subnqn, host("host-a"))
        .await
        .expect("connect a");
    let b = Controller::connect(t.addr(), &t.subnqn, host("host-b"))
        .await
        .expect("connect b");
    let (na, nb) = (a.namespace(1).unwrap(), b.namespace(1).unwrap());
    let data = pattern(4096, 9);
    let conflict = |r: Result<(), HostError>| matches!(&r, Err(e) if e.status().is_some_and(|s| s.same_code(Status::RESERVATION_CONFLICT)));
    na.reservation_register(RegisterAction::Register, 0, 0xa1, false)
        .await
        .expect("a registers");
    nb.reservation_register(RegisterAction::Register, 0, 0xb1, false)
        .await
        .expect("b registers");
    assert!(conflict(
        na.reservation_acquire(
            AcquireAction::Acquire,
            ReservationType::WriteExclusive,
            0xbad,
            0
        )
        .await
    ));
    na.reservation_acquire(
        AcquireAction::Acquire,
        ReservationType::WriteExclusive,
        0xa1,
        0,
    )
    .await
    .expect("a acquires");
    na.write(0, &data, IoFlags::default())
        .await
        .expect("the holder writes");
    assert!(conflict(
        nb.write(0, &pattern(4096, 1), IoFlags::default()).await
    ));
    assert_eq!(
        nb.read(0, 4096, IoFlags::default()).await.unwrap(),
        data,
        "b reads, a's data"
    );
    let rep = nb.reservation_report().await.expect("report");
    assert_eq!(rep.reservation(), Some(ReservationType::WriteExclusive));
    let seen: Vec<([u8; 16], u64, bool)> = rep
        .registrants
        .iter()
        .map(|r| (r.hostid, r.key, r.holds))
        .collect();
    assert_eq!(seen, vec![(ida, 0xa1, true), (idb, 0xb1, false)]);
    // B preempts A and aborts its writes: now A is the one refused.
    nb.reservation_acquire(
        AcquireAction::PreemptAndAbort,
        ReservationType::WriteExclusive,
        0xb1,
        0xa1,
    )
    .await
    .expect("b preempts a");
    assert!(conflict(
        na.write(0, &pattern(4096, 2), IoFlags::default()).await
    ));
    // A's library reads the notice the target sends it (log page 80h);
    // B, who preempted, is told nothing.
    wait_until("a is told its registration was preempted", || {
        a.reservation_notices().iter().any(|n| {
            n.nsid == 1 && n.kind == sluice_proto::reservation::notice::REGISTRATION_PREEMPTED
        })
    })
    .await;
    assert!(b.reservation_notices().is_empty());
    nb.write(0, &pattern(4096, 3), IoFlags::default())
        .await
        .expect("b writes");
    assert!(
        conflict(
            na.reservation_release(
                ReleaseAction::Release,
                ReservationType::WriteExclusive,
                0xa1
            )
            .await
        ),
        "a is no longer registered"
    );
    nb.reservation_release(ReleaseAction::Clear, ReservationType::WriteExclusive, 0xb1)
        .await
        .expect("b clears");
    let rep = na.reservation_report().await.expect("report");
    assert_eq!((rep.rtype, rep.registrant_count), (0, 0));
    na.write(0, &data, IoFlags::default())
        .await
        .expect("anyone writes again");
    a.disconnect(Duration::from_secs(1)).await;
    b.disconnect(Duration::from_secs(1)).await;
}
