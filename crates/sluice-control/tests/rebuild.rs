//! Rebuilding lost replicas: a target dies under a verified read/write
//! workload and its extents are rebuilt onto the survivors while the
//! workload runs; a client on a stale map is fenced out and its writes
//! reach the rebuilt replica.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_control::{pb, ControlClient, DrivePool, Volume};
use sluice_host::{ConnectOptions, IoFlags};
use sluice_volume::EXTENT_BYTES;

use common::*;

const BLOCK: usize = 64 << 10;
const BLOCKS: u64 = 256; // 16 MiB

fn block(generation: u64) -> Vec<u8> {
    generation_block(generation, BLOCK)
}

fn client_opts() -> ConnectOptions {
    ConnectOptions {
        reconnect: sluice_host::ReconnectPolicy {
            attempts_max: 1,
            ..Default::default()
        },
        command_timeout: Duration::from_secs(5),
        ..host_opts()
    }
}

/// Waits until every allocated extent of `name` has its full chain again
/// and nothing is being rebuilt; returns the layout.
async fn wait_rebuilt(c: &ControlClient, name: &str, within: Duration) -> pb::VolumeLayout {
    let deadline = Instant::now() + within;
    loop {
        let l = c.open_volume(name).await.unwrap();
        let v = l.volume.clone().unwrap();
        let whole = l
            .extents
            .iter()
            .all(|e| e.chain.len() == v.replicas as usize && e.rebuilding.is_none());
        if whole && v.degraded_extents == 0 {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "not rebuilt within {within:?}: {:?}",
            c.status().await.unwrap().rebuilds
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pool's drives by id.
async fn drives_by_id(c: &ControlClient) -> BTreeMap<u32, pb::Drive> {
    c.list_drives()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id, d))
        .collect()
}

/// Every replica of every extent holds the same bytes.
async fn replicas_agree(c: &ControlClient, l: &pb::VolumeLayout) {
    let drives = drives_by_id(c).await;
    for e in &l.extents {
        let mut first: Option<Vec<u8>> = None;
        for r in &e.chain {
            let d = &drives[&r.drive];
            let data = read_drive(d, r.slot * EXTENT_BYTES, EXTENT_BYTES as usize).await;
            match &first {
                None => first = Some(data),
                Some(f) => assert!(*f == data, "extent {}: replicas differ", e.index),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_targets_extents_are_rebuilt_under_a_verified_workload() {
    let t1 = Drives::start();
    let t2 = Drives::start();
    let mut t3 = Drives::start();
    let (_dir, mut cp, c) = redb_control().await;
    add_all(&c, &[&t1, &t2, &t3]).await;
    create(&c, "r", BLOCKS * BLOCK as u64, 2).await;
    let v = Arc::new(
        Volume::open(c.clone(), DrivePool::new(client_opts()), "r")
            .await
            .unwrap(),
    );
    // Generation g goes to block g * 7 % 256; the first 256 fill the volume.
    let acked = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
    for g in 1..=BLOCKS {
        let b = g * 7 % BLOCKS;
        v.write(b * 16, &block(g), IoFlags::default())
            .await
            .unwrap();
        acked.lock().unwrap().insert(b, g);
    }
    let on_t3 = c
        .open_volume("r")
        .await
        .unwrap()
        .extents
        .iter()
        .filter(|e| e.chain.iter().any(|r| r.drive >= 4))
        .count() as u64;
    assert!(on_t3 > 0, "some extents have a replica on the third target");

    let work = VerifiedWorkload::start(v.clone(), BLOCKS, BLOCK, 16, acked.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    t3.stop();
    let reads_at_kill = work.reads.load(Relaxed);
    // The writer finds the dead replicas and reports them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while c
        .list_drives()
        .await
        .unwrap()
        .iter()
        .filter(|d| !d.up)
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the dead target's drives were never failed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_rebuilt(&c, "r", Duration::from_secs(60)).await;
    let reads_during = work.reads.load(Relaxed) - reads_at_kill;
    // The workload goes on over the rebuilt chains.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let generations = work.finish().await;
    assert!(
        generations > BLOCKS + 20,
        "the writer made progress: {generations}"
    );
    assert!(
        reads_during > 0,
        "reads ran during the failure and the rebuild"
    );

    // Every acknowledged write reads back, through the volume and from
    // every replica alike.
    let all: Vec<(u64, u64)> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|(b, g)| (*b, *g))
        .collect();
    for (b, g) in &all {
        let data = v.read(b * 16, BLOCK, IoFlags::default()).await.unwrap();
        assert_eq!(generation_of(&data), *g, "block {b}");
        assert!(data == block(*g), "block {b}");
    }
    let l = c.open_volume("r").await.unwrap();
    let drives = c.list_drives().await.unwrap();
    let dead: Vec<u32> = drives.iter().filter(|d| !d.up).map(|d| d.id).collect();
    assert_eq!(dead.len(), 2, "{drives:?}");
    let target = |id: u32| drives.iter().find(|d| d.id == id).unwrap().addr.clone();
    for e in &l.extents {
        assert_eq!(e.chain.len(), 2, "{e:?}");
        assert!(e.chain.iter().all(|r| !dead.contains(&r.drive)), "{e:?}");
        assert_ne!(
            target(e.chain[0].drive),
            target(e.chain[1].drive),
            "replicas on distinct targets: {e:?}"
        );
    }
    replicas_agree(&c, &l).await;
    let status = c.status().await.unwrap().rebuilds.unwrap();
    assert!(status.extents_rebuilt >= on_t3, "{status:?}");
    assert_eq!(status.bytes_copied, status.extents_rebuilt * EXTENT_BYTES);
    assert_eq!(status.current, "");
    cp.stop().await;
}

/// A client that never refetched its map, writing after a rebuild, is
/// refused by the fenced chain, refetches, and writes the new chain: the
/// rebuilt replica gets its data. (Unfenced, its write would reach only
/// the old chain and the rebuilt replica would silently miss it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_a_stale_map_is_fenced_and_reaches_the_rebuilt_replica() {
    let t1 = Drives::start();
    let t2 = Drives::start();
    let t3 = Drives::start();
    let (_dir, mut cp, c) = redb_control().await;
    add_all(&c, &[&t1, &t2, &t3]).await;
    create(&c, "s", 2 * EXTENT_BYTES, 2).await;
    let a = Volume::open(c.clone(), DrivePool::new(client_opts()), "s")
        .await
        .unwrap();
    a.write(0, &block(1), IoFlags::default()).await.unwrap();
    a.write(EXTENT_BYTES / 4096, &block(2), IoFlags::default())
        .await
        .unwrap();
    let stale = Volume::open(c.clone(), DrivePool::new(client_opts()), "s")
        .await
        .unwrap();
    let before = c.open_volume("s").await.unwrap();
    let old_chain = before.extents[0].chain.clone();
    // An operator retires the head of extent 0's chain: the drive still
    // answers, so only fencing keeps a stale writer off the old chain.
    let retired = old_chain[0].drive;
    let r = c
        .fail_drive(retired, true, "test retires it")
        .await
        .unwrap();
    assert!(r.failed);
    let l = wait_rebuilt(&c, "s", Duration::from_secs(30)).await;
    let chain = &l.extents[0].chain;
    assert!(chain.iter().all(|x| x.drive != retired));
    assert!(l.extents[0].epoch > before.extents[0].epoch);

    let epoch_before = stale.epoch();
    stale.write(8, &block(3), IoFlags::default()).await.unwrap();
    assert!(
        stale.epoch() > epoch_before,
        "the stale client refetched its map"
    );
    let drives = drives_by_id(&c).await;
    for x in chain {
        let got = read_drive(&drives[&x.drive], x.slot * EXTENT_BYTES + 8 * 4096, BLOCK).await;
        assert!(
            got == block(3),
            "replica on drive {} missed the stale client's write",
            x.drive
        );
        let first = read_drive(&drives[&x.drive], x.slot * EXTENT_BYTES, 8 * 4096).await;
        assert!(
            first == block(1)[..8 * 4096],
            "the copy carried the old data to drive {}",
            x.drive
        );
    }
    replicas_agree(&c, &l).await;
    cp.stop().await;
}
