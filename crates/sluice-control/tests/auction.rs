//! The bandwidth auction end to end (Flint §4.6): volume clients bid on
//! `ViewSync`, `sluice control` sells slices of each drive's bandwidth, and
//! the clients' wallets hold I/O beyond their slices. Two tenants' volumes
//! on one slow drive: a 4 KiB reader and a 128 KiB reader.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use sluice_config::{
    Config, NamespaceConfig, PollingPolicy, SsdConfig, SubsystemConfig, TargetSettings,
};
use sluice_control::isolation::ClientIsolation;
use sluice_control::server::{ControlConfig, Metadata};
use sluice_control::{pb, ControlClient, DrivePool, Volume};
use sluice_flint::eio::EioConfig;
use sluice_flint::AuctionConfig;
use sluice_host::IoFlags;
use sluice_target::{Target, TargetHandle};

const DRIVE_NQN: &str = "nqn.2026-11.io.sluice:auction";

/// One emulated SSD that reads 40 MB/s on two channels: a 128 KiB read
/// holds its bus for 3.3 ms, so a queue of them starves small reads.
fn slow_drive() -> TargetHandle {
    let model = SsdConfig::default()
        .with_read_bytes_per_sec_max(40_000_000)
        .with_base_read_latency_us(100)
        .with_parallelism(2);
    let settings = TargetSettings::default()
        .with_listen("127.0.0.1:0".parse().unwrap())
        .with_discovery_listen(None)
        .with_workers(1)
        .with_polling(PollingPolicy::Interrupt)
        .with_shutdown_drain_ms(200);
    let c = Config::default()
        .with_target(settings)
        .with_subsystem(
            SubsystemConfig::new(DRIVE_NQN)
                .with_namespace(
                    NamespaceConfig::emulated_ssd(1, 64 << 20, model).with_block_size(4096),
                )
                .allow_any_host(),
        )
        .validated()
        .unwrap();
    Target::start(&c).unwrap()
}

async fn control(
    dir: &std::path::Path,
    auction_on: bool,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut cfg = ControlConfig::new(Metadata::Redb(dir.join("m.redb")));
    cfg.auction = AuctionConfig {
        drive_bytes_per_sec_initial: 20e6,
        ..AuctionConfig::default()
    };
    cfg.auction_on = auction_on;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(sluice_control::serve(cfg, listener, async move {
        let _ = rx.await;
    }));
    (addr, tx)
}

fn client(name: &str) -> Arc<DrivePool> {
    DrivePool::with_isolation(
        host_opts(),
        ClientIsolation::new(name, EioConfig::default()).unwrap(),
    )
}

async fn create(c: &ControlClient, name: &str, tenant: &str, size_bytes: u64) {
    c.create_volume(pb::CreateVolumeRequest {
        name: name.into(),
        size_bytes,
        replicas: 1,
        tenant: Some(tenant.into()),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Writes the first `bytes` of the volume with a pattern.
async fn fill(v: &Volume, seed: u64, bytes: u64) -> Vec<u8> {
    let data = pattern(seed, bytes as usize);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        v.write(i as u64 * 256, chunk, IoFlags::default())
            .await
            .unwrap();
    }
    data
}

/// `qd` readers of `len` bytes over the first `span` bytes, until `stop`;
/// every read is checked against `data`. Returns the bytes read.
async fn readers(v: &Arc<Volume>, data: &Arc<Vec<u8>>, len: usize, qd: u64, stop: Instant) -> u64 {
    let blocks = (data.len() / len) as u64;
    let tasks: Vec<_> = (0..qd)
        .map(|w| {
            let (v, data) = (v.clone(), data.clone());
            tokio::spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w + 1);
                let mut bytes = 0u64;
                while Instant::now() < stop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = x % blocks;
                    let lba = i * (len as u64 / 4096);
                    let got = v.read(lba, len, IoFlags::default()).await.unwrap();
                    let at = (i as usize) * len;
                    assert!(got == data[at..at + len], "read of block {lba} is wrong");
                    bytes += len as u64;
                }
                bytes
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

fn jain(a: f64, b: f64) -> f64 {
    (a + b) * (a + b) / (2.0 * (a * a + b * b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auction_shares_a_drive_between_a_small_and_a_large_reader() {
    let dir = tempfile::tempdir().unwrap();
    let drive = slow_drive();
    let (addr, _stop) = control(dir.path(), false).await;
    let c = ControlClient::new(&addr, None).unwrap();
    c.add_drive(&drive.local_addr().to_string(), DRIVE_NQN, 1)
        .await
        .unwrap();
    // Volumes of different sizes on the same drive.
    create(&c, "small", "t-small", 8 * MIB).await;
    create(&c, "large", "t-large", 32 * MIB).await;
    let (ps, pl) = (client("small-reader"), client("large-reader"));
    let small = Arc::new(Volume::open(c.clone(), ps.clone(), "small").await.unwrap());
    let large = Arc::new(Volume::open(c.clone(), pl.clone(), "large").await.unwrap());
    let ds = Arc::new(fill(&small, 1, 8 * MIB).await);
    let dl = Arc::new(fill(&large, 2, 8 * MIB).await);

    let run = |secs: f64| {
        let (small, large, ds, dl) = (small.clone(), large.clone(), ds.clone(), dl.clone());
        async move {
            let stop = Instant::now() + Duration::from_secs_f64(secs);
            let (s, l) = tokio::join!(
                readers(&small, &ds, 4096, 8, stop),
                readers(&large, &dl, 128 << 10, 8, stop)
            );
            (s as f64, l as f64)
        }
    };
    // Off: the drive's own order lets the large reader take nearly all.
    let (s_off, l_off) = run(2.0).await;
    assert!(!ps.isolation().metered());
    // On: slices of the drive's bandwidth, equal shares by bytes.
    let status = c.set_auction(true).await.unwrap();
    assert!(status.on);
    run(1.0).await; // the estimate settles
    assert!(ps.isolation().metered() && pl.isolation().metered());
    let (s_on, l_on) = run(3.0).await;
    let (j_off, j_on) = (jain(s_off, l_off), jain(s_on, l_on));
    eprintln!(
        "off: small {:.1} MB/s, large {:.1} MB/s, Jain {j_off:.3}; on: small {:.1} MB/s, large {:.1} MB/s, Jain {j_on:.3}",
        s_off / 2e6,
        l_off / 2e6,
        s_on / 3e6,
        l_on / 3e6
    );
    assert!(j_off < 0.75, "the scenario is unfair without the auction");
    assert!(
        j_on > 0.85 && j_on > j_off + 0.15,
        "the auction shares the drive"
    );

    // The auction's state names both sessions, with grants.
    let a = c.auction_status().await.unwrap();
    assert_eq!(a.drives.len(), 1);
    assert!(a.drives[0].bytes_per_sec > 0.0);
    let clients: Vec<&str> = a.sessions.iter().map(|s| s.client.as_str()).collect();
    assert!(
        clients.contains(&"small-reader") && clients.contains(&"large-reader"),
        "{clients:?}"
    );

    // Off again: the clients stop metering at their next answer.
    c.set_auction(false).await.unwrap();
    run(0.3).await;
    assert!(!ps.isolation().metered());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_in_a_heavier_class_gets_more_and_unknown_classes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let drive = slow_drive();
    let (addr, _stop) = control(dir.path(), true).await;
    let c = ControlClient::new(&addr, None).unwrap();
    c.add_drive(&drive.local_addr().to_string(), DRIVE_NQN, 1)
        .await
        .unwrap();
    let e = c.set_tenant("t-gold", "platinum").await.unwrap_err();
    assert!(e.to_string().contains("slo_class"), "{e}");
    assert!(e.to_string().contains("platinum"), "{e}");
    let e = c.set_tenant("", "gold").await.unwrap_err();
    assert!(e.to_string().contains("tenant"), "{e}");
    let t = c.set_tenant("t-gold", "gold").await.unwrap();
    assert_eq!((t.slo_class.as_str(), t.weight), ("gold", 4.0));
    let l = c.list_tenants().await.unwrap();
    assert_eq!(l.default_class, "bronze");
    assert_eq!(l.tenants.len(), 1);
    assert_eq!(l.classes.len(), 3);

    create(&c, "gold", "t-gold", 8 * MIB).await;
    create(&c, "plain", "t-plain", 8 * MIB).await;
    let (pg, pp) = (client("gold-reader"), client("plain-reader"));
    let gold = Arc::new(Volume::open(c.clone(), pg, "gold").await.unwrap());
    let plain = Arc::new(Volume::open(c.clone(), pp, "plain").await.unwrap());
    let dg = Arc::new(fill(&gold, 3, 8 * MIB).await);
    let dp = Arc::new(fill(&plain, 4, 8 * MIB).await);
    let stop = Instant::now() + Duration::from_secs(3);
    let (g, p) = tokio::join!(
        readers(&gold, &dg, 64 << 10, 8, stop),
        readers(&plain, &dp, 64 << 10, 8, stop)
    );
    let a = c.auction_status().await.unwrap();
    let weight = |client: &str| {
        a.sessions
            .iter()
            .find(|s| s.client == client)
            .map(|s| s.weight)
    };
    assert_eq!(weight("gold-reader"), Some(4.0));
    assert_eq!(weight("plain-reader"), Some(1.0));
    let ratio = g as f64 / p as f64;
    eprintln!("gold {g} B, plain {p} B: {ratio:.2}x");
    assert!(
        ratio > 1.8,
        "gold (weight 4) gets more than bronze (1): {ratio}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_carries_on_when_the_control_plane_running_the_auction_stops() {
    let dir = tempfile::tempdir().unwrap();
    let drive = slow_drive();
    let (addr, stop) = control(dir.path(), true).await;
    let c = ControlClient::new(&addr, None).unwrap();
    c.add_drive(&drive.local_addr().to_string(), DRIVE_NQN, 1)
        .await
        .unwrap();
    create(&c, "v", "t", 8 * MIB).await;
    let pool = client("lonely");
    let v = Arc::new(Volume::open(c.clone(), pool.clone(), "v").await.unwrap());
    let data = Arc::new(fill(&v, 5, 4 * MIB).await);
    readers(
        &v,
        &data,
        64 << 10,
        4,
        Instant::now() + Duration::from_millis(500),
    )
    .await;
    assert!(pool.isolation().metered());
    drop(stop);
    // The control plane is gone: slices run out, and within the wallet's
    // fallback (1 s) every I/O goes unmetered.
    let t = Instant::now();
    let bytes = readers(&v, &data, 64 << 10, 4, t + Duration::from_secs(3)).await;
    assert!(!pool.isolation().metered());
    assert_eq!(pool.isolation().auction_waiting(), 0);
    assert!(bytes >= 10 * MIB, "reads went on: {bytes} B in 3 s");
}
