//! Elastic volumes end to end: real Sluice targets (RAM namespaces) as the
//! drives, `sluice control` on redb (and etcd), and the volume client doing
//! I/O straight to the drives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use sluice_admin::BearerToken;
use sluice_config::{Config, NamespaceConfig, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_control::server::{ControlConfig, Metadata};
use sluice_control::{pb, ControlClient, DrivePool, Volume, VolumeError};
use sluice_host::{ConnectOptions, Controller, IoFlags};
use sluice_meta::testing::EtcdServer;
use sluice_target::Target;
use sluice_volume::EXTENT_BYTES;

use common::*;
async fn volume_round_trip(metadata: Metadata) {
    let t1 = Drives::start();
    let t2 = Drives::start();
    let mut cp = ControlPlane::start(metadata, None, 0).await;
    let c = ControlClient::new(&cp.addr, None).unwrap();
    add_all(&c, &[&t1, &t2]).await;
    let drives = c.list_drives().await.unwrap();
    assert_eq!(drives.len(), 4);
    assert_eq!(drives.iter().map(|d| d.slots_total).sum::<u64>(), 64);

    create(&c, "data", 40 * MIB, 1).await;
    let pool = DrivePool::new(host_opts());
    let v = Volume::open(c.clone(), pool.clone(), "data").await.unwrap();
    assert_eq!(v.block_size_bytes(), 4096);
    assert_eq!(v.size_blocks(), 40 * MIB / 4096);

    // Unallocated reads are zeros and allocate nothing.
    assert_eq!(
        v.read(0, 1 << 20, IoFlags::default()).await.unwrap(),
        vec![0u8; 1 << 20]
    );
    assert_eq!(v.allocations(), 0);
    assert_eq!(c.open_volume("data").await.unwrap().extents.len(), 0);

    // 7 MiB from 1 MiB spans extents 0-3: allocated on first write.
    let data = pattern(1, 7 << 20);
    v.write(256, &data, IoFlags::default()).await.unwrap();
    assert_eq!(v.allocations(), 4);
    assert_eq!(
        v.read(256, 7 << 20, IoFlags::default()).await.unwrap(),
        data
    );
    // Around the written range: still zeros.
    assert_eq!(
        v.read(0, 1 << 20, IoFlags::default()).await.unwrap(),
        vec![0u8; 1 << 20]
    );
    // A 4 KiB write straddling nothing, into an allocated extent: no fault.
    v.write(300, &pattern(2, 4096), IoFlags::default())
        .await
        .unwrap();
    assert_eq!(v.allocations(), 4);

    // The layout spreads the four extents over the four drives, and each
    // piece is on its drive where the map says.
    let layout = c.open_volume("data").await.unwrap();
    assert_eq!(layout.extents.len(), 4);
    let used: std::collections::BTreeSet<u32> =
        layout.extents.iter().map(|e| e.chain[0].drive).collect();
    assert_eq!(used.len(), 4, "{layout:?}");
    let e1 = layout.extents.iter().find(|e| e.index == 1).unwrap();
    let d1 = layout
        .drives
        .iter()
        .find(|d| d.id == e1.chain[0].drive)
        .unwrap();
    let direct = read_drive(d1, e1.chain[0].slot * EXTENT_BYTES, 4096).await;
    // Extent 1 starts 1 MiB into `data`.
    assert_eq!(direct, data[(1 << 20)..(1 << 20) + 4096]);

    // A second client sees the same data; both share nothing but the pool.
    let v2 = Volume::open(c.clone(), pool.clone(), "data").await.unwrap();
    assert_eq!(
        v2.read(256 + 1024, 4096, IoFlags::default()).await.unwrap(),
        data[4 << 20..(4 << 20) + 4096]
    );
    // Two targets, one subsystem each: two associations for both volumes.
    assert_eq!(pool.connections().await, 2);

    // The allocation map (what NBD block status reports): extents 0-3
    // hold data. Extent 10, allocated by the other client after this one
    // fetched its map, is data too: a hole is only reported after a refetch.
    let blocks = |mib: u64| mib * MIB / 4096;
    v.write(blocks(20), &pattern(2, 4096), IoFlags::default())
        .await
        .unwrap();
    assert_eq!(
        v2.allocation(0, blocks(40)).await.unwrap(),
        vec![
            (blocks(8), true),
            (blocks(12), false),
            (blocks(2), true),
            (blocks(18), false)
        ]
    );
    assert_eq!(v2.allocation(blocks(1), 1).await.unwrap(), vec![(1, true)]);
    assert!(v2.allocation(blocks(40), 1).await.is_err(), "past the end");

    // Online growth: a write past the old end is seen after a refetch.
    c.resize_volume("data", 48 * MIB).await.unwrap();
    assert_eq!(v2.poll_size().await.unwrap(), 48 * MIB, "polled growth");
    v.write((44 * MIB) / 4096, &pattern(3, 8192), IoFlags::default())
        .await
        .unwrap();
    assert_eq!(
        v.read((44 * MIB) / 4096, 8192, IoFlags::default())
            .await
            .unwrap(),
        pattern(3, 8192)
    );

    // Delete frees every extent.
    c.delete_volume("data").await.unwrap();
    let status = c.status().await.unwrap();
    assert_eq!((status.volumes, status.slots_reserved), (0, 0));
    assert!(c
        .list_drives()
        .await
        .unwrap()
        .iter()
        .all(|d| d.slots_used == 0));
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_data_round_trips_over_extents_on_two_targets_redb() {
    let dir = tempfile::tempdir().unwrap();
    volume_round_trip(Metadata::Redb(dir.path().join("meta.redb"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_data_round_trips_over_extents_on_two_targets_etcd() {
    let Some(server) = EtcdServer::start_or_skip("volume_round_trip_etcd") else {
        return;
    };
    let hostport = server.endpoint.trim_start_matches("http://").to_owned();
    volume_round_trip(format!("etcd://{hostport}/e2e").parse().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_writes_reach_every_replica_in_chain_order() {
    let t1 = Drives::start();
    let t2 = Drives::start();
    let (_dir, mut cp, c) = redb_control().await;
    add_all(&c, &[&t1, &t2]).await;
    create(&c, "r2", 8 * MIB, 2).await;
    let v = Volume::open(c.clone(), DrivePool::new(host_opts()), "r2")
        .await
        .unwrap();
    let data = pattern(9, 3 << 20);
    v.write(0, &data, IoFlags::default()).await.unwrap();
    let layout = c.open_volume("r2").await.unwrap();
    assert_eq!(layout.extents.len(), 2);
    for e in &layout.extents {
        assert_eq!(e.chain.len(), 2);
        let targets: std::collections::BTreeSet<&str> = e
            .chain
            .iter()
            .map(|r| {
                layout
                    .drives
                    .iter()
                    .find(|d| d.id == r.drive)
                    .unwrap()
                    .addr
                    .as_str()
            })
            .collect();
        assert_eq!(targets.len(), 2, "replicas on distinct targets");
        for r in &e.chain {
            let d = layout.drives.iter().find(|d| d.id == r.drive).unwrap();
            let got = read_drive(d, r.slot * EXTENT_BYTES, 65536).await;
            let at = usize::try_from(e.index * EXTENT_BYTES).unwrap();
            assert_eq!(
                got,
                data[at..at + 65536],
                "replica on drive {} of extent {}",
                r.drive,
                e.index
            );
        }
    }
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_to_allocated_extents_continues_while_the_control_plane_is_down() {
    let t1 = Drives::start();
    let dir = tempfile::tempdir().unwrap();
    let meta = Metadata::Redb(dir.path().join("m.redb"));
    let mut cp = ControlPlane::start(meta.clone(), None, 0).await;
    let port = cp.port();
    let c = ControlClient::new(&cp.addr, None).unwrap();
    add_all(&c, &[&t1]).await;
    create(&c, "v", 16 * MIB, 1).await;
    let v = Volume::open(c.clone(), DrivePool::new(host_opts()), "v")
        .await
        .unwrap();
    v.write(0, &pattern(4, 1 << 20), IoFlags::default())
        .await
        .unwrap();

    cp.stop().await;
    // Allocated: reads and writes go straight to the drive.
    v.write(16, &pattern(5, 65536), IoFlags::default())
        .await
        .unwrap();
    assert_eq!(
        v.read(16, 65536, IoFlags::default()).await.unwrap(),
        pattern(5, 65536)
    );
    // Unallocated: a clear error after the retries.
    let e = v
        .write((8 * MIB) / 4096, &pattern(6, 4096), IoFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(e, VolumeError::ControlUnavailable { .. }), "{e}");
    assert!(e.to_string().contains("extent 4"), "{e}");

    // The control plane comes back on the same port and file: the retry works.
    let mut cp = ControlPlane::start(meta, None, port).await;
    v.write((8 * MIB) / 4096, &pattern(6, 4096), IoFlags::default())
        .await
        .unwrap();
    assert_eq!(
        v.read((8 * MIB) / 4096, 4096, IoFlags::default())
            .await
            .unwrap(),
        pattern(6, 4096)
    );
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors() {
    let t1 = Drives::start();
    let dir = tempfile::tempdir().unwrap();
    let token = BearerToken::new("s3cret-token");
    let mut cp =
        ControlPlane::start(Metadata::Redb(dir.path().join("m.redb")), token.clone(), 0).await;
    // No token, wrong token: refused.
    for t in [None, BearerToken::new("wrong")] {
        let e = ControlClient::new(&cp.addr, t.as_ref())
            .unwrap()
            .status()
            .await
            .unwrap_err();
        assert!(e.to_string().contains("unauthenticated"), "{e}");
    }
    let c = ControlClient::new(&cp.addr, token.as_ref()).unwrap();
    add_all(&c, &[&t1]).await;
    let e = c.add_drive(&t1.addr(), NQN, 1).await.unwrap_err();
    assert!(e.to_string().contains("already in the pool"), "{e}");
    let e = c.add_drive(&t1.addr(), NQN, 9).await.unwrap_err();
    assert!(e.to_string().contains("nsid 9"), "{e}");
    let e = c.add_drive("127.0.0.1:1", NQN, 1).await.unwrap_err();
    assert!(e.to_string().contains("cannot add drive"), "{e}");

    let mk = |name: &str, size_bytes: u64, replicas: u32| pb::CreateVolumeRequest {
        name: name.into(),
        size_bytes,
        replicas,
        ..Default::default()
    };
    c.create_volume(mk("a", 8 * MIB, 1)).await.unwrap();
    let e = c.create_volume(mk("a", 8 * MIB, 1)).await.unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    // 64 MiB of drives: 60 more MiB do not fit.
    let e = c.create_volume(mk("big", 60 * MIB, 1)).await.unwrap_err();
    assert!(matches!(e, VolumeError::CapacityExceeded(_)), "{e}");
    // Two replicas need two drives with 4 KiB-compatible blocks: there are.
    // Four replicas is beyond the limit.
    let e = c.create_volume(mk("r4", 8 * MIB, 4)).await.unwrap_err();
    assert!(e.to_string().contains("replicas"), "{e}");
    let e = c.resize_volume("a", 4 * MIB).await.unwrap_err();
    assert!(e.to_string().contains("not shrink"), "{e}");
    let e = c.open_volume("nope").await.unwrap_err();
    assert!(e.to_string().contains("not found"), "{e}");
    let e = c.get_volume("nope").await.unwrap_err();
    assert!(e.to_string().contains("not found"), "{e}");
    let e = c.get_volume("bad/name").await.unwrap_err();
    assert!(e.to_string().contains("volume name"), "{e}");
    let e = Volume::open(c.clone(), DrivePool::new(host_opts()), "nope")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no volume named"), "{e}");
    // I/O outside the volume or unaligned.
    let v = Volume::open(c.clone(), DrivePool::new(host_opts()), "a")
        .await
        .unwrap();
    assert!(v.read(2048, 4096, IoFlags::default()).await.is_err());
    assert!(v.write(0, &[0u8; 100], IoFlags::default()).await.is_err());
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_that_comes_back_different_is_refused() {
    let mut t1 = Drives::start();
    let (_dir, mut cp, c) = redb_control().await;
    add_all(&c, &[&t1]).await;
    create(&c, "v", 8 * MIB, 1).await;
    let addr = t1.addr();
    {
        let v = Volume::open(c.clone(), DrivePool::new(host_opts()), "v")
            .await
            .unwrap();
        v.write(0, &pattern(7, 8192), IoFlags::default())
            .await
            .unwrap();
    }
    // The target restarts on the same address with the same configuration:
    // its RAM namespaces come back empty, under new NGUIDs. The volume must
    // not read them as if they held its data.
    t1.stop();
    let sub = SubsystemConfig::new(NQN)
        .with_namespace(NamespaceConfig::ram(1, 32 << 20).with_block_size(512))
        .with_namespace(NamespaceConfig::ram(2, 32 << 20).with_block_size(4096))
        .allow_any_host();
    let settings = TargetSettings::default()
        .with_listen(addr.parse().unwrap())
        .with_discovery_listen(None)
        .with_workers(1)
        .with_polling(PollingPolicy::Interrupt);
    let cfg = Config::default()
        .with_target(settings)
        .with_subsystem(sub)
        .validated()
        .unwrap();
    let h = Target::start(&cfg).unwrap();
    let v = Volume::open(c.clone(), DrivePool::new(host_opts()), "v")
        .await
        .unwrap();
    let e = v.read(0, 8192, IoFlags::default()).await.unwrap_err();
    assert!(matches!(e, VolumeError::DriveChanged { .. }), "{e}");
    assert!(e.to_string().contains("NGUID"), "{e}");
    h.shutdown();
    cp.stop().await;
    let _ = Arc::new(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_target_leaves_replicated_volumes_serving_with_nothing_acknowledged_lost() {
    let t1 = Drives::start();
    let mut t2 = Drives::start();
    let (_dir, mut cp, c) = redb_control().await;
    add_all(&c, &[&t1, &t2]).await;
    create(&c, "r", 16 * MIB, 2).await;
    let opts = ConnectOptions {
        reconnect: sluice_host::ReconnectPolicy {
            attempts_max: 1,
            ..Default::default()
        },
        command_timeout: Duration::from_secs(5),
        ..host_opts()
    };
    let v = Arc::new(
        Volume::open(c.clone(), DrivePool::new(opts), "r")
            .await
            .unwrap(),
    );
    // A writer: 64 KiB blocks round the volume, generation in the pattern;
    // only acknowledged writes are recorded.
    let acked = Arc::new(std::sync::Mutex::new(
        std::collections::BTreeMap::<u64, u64>::new(),
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (v, acked, stop) = (v.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut generation = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                generation += 1;
                let slot = (generation * 7) % 256;
                let data = pattern(generation, 65536);
                v.write(slot * 16, &data, IoFlags::default())
                    .await
                    .expect("writes keep succeeding");
                acked.lock().unwrap().insert(slot, generation);
            }
            generation
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    t2.stop();
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Reads during the degraded run are right.
    let snapshot: Vec<(u64, u64)> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|(s, g)| (*s, *g))
        .collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let generations = writer.await.unwrap();
    assert!(generations > 20, "the writer made progress: {generations}");
    for (slot, generation) in snapshot.iter().take(40) {
        let now = *acked.lock().unwrap().get(slot).unwrap();
        assert!(now >= *generation);
    }
    // Every acknowledged write reads back.
    let all: Vec<(u64, u64)> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|(s, g)| (*s, *g))
        .collect();
    for (slot, generation) in &all {
        assert_eq!(
            v.read(slot * 16, 65536, IoFlags::default()).await.unwrap(),
            pattern(*generation, 65536),
            "slot {slot}"
        );
    }
    // The dead target's drives are down and in no chain.
    let drives = c.list_drives().await.unwrap();
    let dead: Vec<u32> = drives.iter().filter(|d| !d.up).map(|d| d.id).collect();
    assert_eq!(dead.len(), 2, "{drives:?}");
    let layout = c.open_volume("r").await.unwrap();
    assert!(layout.volume.as_ref().unwrap().epoch > 1);
    for e in &layout.extents {
        assert!(e.chain.iter().all(|r| !dead.contains(&r.drive)), "{e:?}");
    }
    cp.stop().await;
}

/// Opens volume namespaces with the volume client, as `sluice target` does.
struct Opener;

impl sluice_target::VolumeOpener for Opener {
    fn open_volume(
        &self,
        name: &str,
        control: &str,
        _token: Option<&std::path::Path>,
    ) -> Result<Arc<dyn sluice_backend::Backend>, String> {
        let b = sluice_control::backend::VolumeBackend::open(name, control, None, host_opts())
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(b))
    }
}

/// `sluice volume resize` of the volume behind `ctrl`'s namespace 1 (24 MiB,
/// 4 KiB blocks): the controller advertises Namespace Attribute Notices,
/// the host library's held AER completes with one and it identifies the
/// namespace again, so its handle shows 32 MiB; Identify agrees, and a
/// write past the old end reads back.
async fn grows_online_under_a_connected_host(ctrl: &Controller, c: &ControlClient) {
    use sluice_host::core::Payload;
    use sluice_proto::command::{admin, io};
    use sluice_proto::identify::{cns, IdentifyController, IdentifyNamespace};
    use sluice_proto::Sqe;
    let identify = |cns_v: u8, nsid: u32| {
        let mut s = Sqe::new(admin::IDENTIFY, 0, nsid);
        s.set_cdw(10, u32::from(cns_v));
        ctrl.admin(s, Payload::Read(4096))
    };
    let oaes = IdentifyController::decode(&identify(cns::CONTROLLER, 0).await.unwrap().data)
        .unwrap()
        .oaes;
    assert_ne!(oaes & 1 << 8, 0, "Namespace Attribute Notices advertised");
    let ns = ctrl.namespace(1).unwrap();
    let old_blocks = 24 * MIB / 4096;
    assert_eq!(ns.size_blocks(), old_blocks);
    let write_at = |lba: u64, seed: u64| {
        ctrl.io(
            Sqe::rw(io::WRITE, 0, 1, lba, 1, false),
            Payload::Write(pattern(seed, 4096)),
        )
    };
    let e = write_at(old_blocks, 21).await.unwrap_err();
    assert!(e.to_string().contains("LBA Out of Range"), "{e}");

    c.resize_volume("exported", 32 * MIB).await.unwrap();
    let t0 = std::time::Instant::now();
    while ns.size_blocks() != 32 * MIB / 4096 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the host did not see the growth within 10 s of the resize"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let id = IdentifyNamespace::decode(&identify(cns::NAMESPACE, 1).await.unwrap().data).unwrap();
    assert_eq!(id.nsze, 32 * MIB / 4096);
    write_at(old_blocks + 7, 22).await.unwrap();
    let r = ctrl
        .io(
            Sqe::rw(io::READ, 0, 1, old_blocks + 7, 1, false),
            Payload::Read(4096),
        )
        .await
        .unwrap();
    assert_eq!(r.data, pattern(22, 4096));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_exports_a_volume_whose_extents_live_on_other_targets() {
    let t1 = Drives::start();
    let t2 = Drives::start();
    let (_dir, mut cp, c) = redb_control().await;
    add_all(&c, &[&t1, &t2]).await;
    create(&c, "exported", 24 * MIB, 2).await;
    // The exporting target: one namespace, backend = "volume".
    let front_nqn = "nqn.2026-11.io.sluice:front";
    let sub = SubsystemConfig::new(front_nqn)
        .with_namespace(NamespaceConfig::volume(1, "exported", cp.addr.clone()))
        .allow_any_host();
    let settings = TargetSettings::default()
        .with_listen("127.0.0.1:0".parse().unwrap())
        .with_discovery_listen(None)
        .with_workers(2)
        .with_polling(PollingPolicy::Interrupt);
    let cfg = Config::default()
        .with_target(settings)
        .with_subsystem(sub)
        .validated()
        .unwrap();
    let front = tokio::task::spawn_blocking(move || Target::start_with(&cfg, &Opener))
        .await
        .unwrap()
        .unwrap();
    // A plain NVMe/TCP host sees one 24 MiB namespace of 4 KiB blocks.
    let ctrl = Controller::connect(front.local_addr(), front_nqn, host_opts())
        .await
        .unwrap();
    let ns = ctrl.namespace(1).unwrap();
    assert_eq!(
        (ns.block_size_bytes(), ns.size_blocks()),
        (4096, 24 * MIB / 4096)
    );
    assert_eq!(
        ns.read(0, 65536, IoFlags::default()).await.unwrap(),
        vec![0u8; 65536]
    );
    let data = pattern(11, 5 << 20);
    ns.write(256, &data, IoFlags::default()).await.unwrap();
    assert_eq!(
        ns.read(256, 5 << 20, IoFlags::default()).await.unwrap(),
        data
    );
    ns.flush().await.unwrap();
    grows_online_under_a_connected_host(&ctrl, &c).await;
    // The data sits on the drives of the other two targets, twice (3
    // extents, and the one written past the old end).
    let layout = c.open_volume("exported").await.unwrap();
    assert_eq!(layout.extents.len(), 4);
    let e = layout.extents.iter().find(|e| e.index == 1).unwrap();
    for r in &e.chain {
        let d = layout.drives.iter().find(|d| d.id == r.drive).unwrap();
        assert_eq!(
            read_drive(d, r.slot * EXTENT_BYTES, 4096).await,
            data[(1 << 20)..(1 << 20) + 4096]
        );
    }
    // Every drive out of service: a write needing a new extent fails with
    // Capacity Exceeded (generic status 0x81).
    for d in c.list_drives().await.unwrap() {
        c.set_drive_state(d.id, false).await.unwrap();
    }
    let e = ns
        .write((20 * MIB) / 4096, &pattern(12, 4096), IoFlags::default())
        .await
        .unwrap_err();
    match &e {
        sluice_host::HostError::Nvme { status, .. } => {
            assert_eq!((status.sct, status.sc), (0, 0x81), "{e}")
        }
        other => panic!("expected an NVMe status, got {other}"),
    }
    // Allocated extents still take writes.
    ns.write(256, &pattern(13, 4096), IoFlags::default())
        .await
        .unwrap();
    ctrl.disconnect(Duration::from_millis(100)).await;
    tokio::task::spawn_blocking(move || front.shutdown())
        .await
        .unwrap();
    cp.stop().await;
}

/// A control plane on a runtime of its own: dropping the runtime kills it
/// without a goodbye (no resign, no lease revoke), as a crash would.
struct OwnRuntime {
    rt: Option<tokio::runtime::Runtime>,
    addr: String,
}

impl OwnRuntime {
    fn start(metadata: Metadata) -> OwnRuntime {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let addr = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            tokio::spawn(sluice_control::serve(
                ControlConfig::new(metadata),
                l,
                std::future::pending(),
            ));
            addr
        });
        OwnRuntime { rt: Some(rt), addr }
    }

    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn control_planes_on_one_etcd_elect_a_leader_and_hand_over_when_it_dies() {
    let Some(server) = EtcdServer::start_or_skip("leader_election") else {
        return;
    };
    let hostport = server.endpoint.trim_start_matches("http://").to_owned();
    let meta: Metadata = format!("etcd://{hostport}/ha").parse().unwrap();
    let mut planes = [
        OwnRuntime::start(meta.clone()),
        OwnRuntime::start(meta.clone()),
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t = Drives::start();
    let addrs = format!("{},{}", planes[0].addr, planes[1].addr);
    let (c, v, leader) = rt.block_on(async {
        // Exactly one leads; the other refuses and names it.
        let mut leader = None;
        for _ in 0..100 {
            let mut leading = Vec::new();
            for (i, p) in planes.iter().enumerate() {
                let s = ControlClient::new(&p.addr, None)
                    .unwrap()
                    .status()
                    .await
                    .unwrap();
                if s.is_leader {
                    leading.push(i);
                }
            }
            assert!(leading.len() <= 1, "two leaders: {leading:?}");
            if let [i] = leading[..] {
                leader = Some(i);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let leader = leader.expect("a leader within 10 s");
        let follower = 1 - leader;
        let e = ControlClient::new(&planes[follower].addr, None)
            .unwrap()
            .list_drives()
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("not the leader")
                && e.to_string().contains(&planes[leader].addr),
            "{e}"
        );

        // A client given both addresses finds the leader.
        let c = ControlClient::new(&addrs, None).unwrap();
        add_all(&c, &[&t]).await;
        let req = pb::CreateVolumeRequest {
            name: "ha".into(),
            size_bytes: 30 * EXTENT_BYTES,
            ..Default::default()
        };
        let v = c.create_volume(req).await.unwrap();
        for i in 0..10 {
            c.allocate_extent("ha", v.id, i, v.epoch).await.unwrap();
        }
        assert_eq!(c.addr(), planes[leader].addr);
        (c, v, leader)
    });
    // The leader dies without a word; the follower takes over once its
    // lease expires, and allocation goes on with nothing lost or doubled.
    planes[leader].kill();
    let killed = std::time::Instant::now();
    let mut handover = None;
    rt.block_on(async {
        for i in 10..30 {
            let deadline = std::time::Instant::now() + Duration::from_secs(15);
            loop {
                match c.allocate_extent("ha", v.id, i, v.epoch).await {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "no leader after the kill: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            handover.get_or_insert(killed.elapsed());
        }
    });
    let handover = handover.unwrap();
    assert!(
        handover < Duration::from_secs(10),
        "hand-over took {handover:?}"
    );
    eprintln!("hand-over after the leader's death: {handover:?}");
    rt.block_on(async {
        let store = sluice_meta::EtcdStore::connect(std::slice::from_ref(&server.endpoint), "/ha/")
            .await
            .unwrap();
        let s = sluice_meta::check::check_catalog(&store).await.unwrap();
        assert_eq!((s.volumes, s.extents, s.slots_used), (1, 30, 30));
    });
    drop(planes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_reaches_its_drives_under_its_tenants_host_nqn() {
    // Drives that admit the control plane and the tenant "gold" only.
    let gold = sluice_control::volume::tenant_hostnqn("gold");
    assert_eq!(gold, "nqn.2026-11.io.sluice:tenant:gold");
    assert_eq!(
        sluice_control::volume::tenant_hostnqn("nqn.2014-08.org.example:x"),
        "nqn.2014-08.org.example:x"
    );
    let sub = SubsystemConfig::new(NQN)
        .with_namespace(NamespaceConfig::ram(1, 32 << 20).with_block_size(512))
        .with_host("nqn.2026-11.io.sluice:control")
        .with_host(gold.as_str());
    let settings = TargetSettings::default()
        .with_listen("127.0.0.1:0".parse().unwrap())
        .with_discovery_listen(None)
        .with_workers(1)
        .with_polling(PollingPolicy::Interrupt);
    let cfg = Config::default()
        .with_target(settings)
        .with_subsystem(sub)
        .validated()
        .unwrap();
    let t = Target::start(&cfg).unwrap();
    let (_dir, mut cp, c) = redb_control().await;
    c.add_drive(&t.local_addr().to_string(), NQN, 1)
        .await
        .unwrap();
    for (name, tenant) in [("g", "gold"), ("s", "silver")] {
        let req = pb::CreateVolumeRequest {
            name: name.into(),
            size_bytes: 4 * MIB,
            tenant: Some(tenant.into()),
            ..Default::default()
        };
        c.create_volume(req).await.unwrap();
    }
    let pool = DrivePool::new(host_opts());
    let g = Volume::open(c.clone(), pool.clone(), "g").await.unwrap();
    g.write(0, &pattern(21, 8192), IoFlags::default())
        .await
        .unwrap();
    assert_eq!(
        g.read(0, 8192, IoFlags::default()).await.unwrap(),
        pattern(21, 8192)
    );
    // Silver is not admitted by the drive: its I/O is refused there.
    let s = Volume::open(c.clone(), pool.clone(), "s").await.unwrap();
    let e = s
        .write(0, &pattern(22, 8192), IoFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(e, VolumeError::Drive { .. }), "{e}");
    assert_eq!(pool.connections().await, 1, "one association, gold's");
    cp.stop().await;
    t.shutdown();
}

/// A control plane with one drive only (so a second volume gets the first
/// one's slots) and the 8 MiB volume "old" on it, open and written whole
/// with `pattern(seed, ..)`.
struct OldOnOneDrive {
    _drives: Drives,
    _dir: tempfile::TempDir,
    cp: ControlPlane,
    c: ControlClient,
    pool: Arc<DrivePool>,
    old: Volume,
}

/// With the zeroer off, so that the next volume's faults find only the
/// deleted volume's dirty slots and zero them inline.
async fn old_on_one_drive(seed: u64) -> OldOnOneDrive {
    let drives = Drives::start();
    let (dir, cp, c) = redb_control_zeroing(0).await;
    c.add_drive(&drives.addr(), NQN, 1).await.unwrap();
    create(&c, "old", 8 * MIB, 1).await;
    let pool = DrivePool::new(host_opts());
    let old = Volume::open(c.clone(), pool.clone(), "old").await.unwrap();
    old.write(0, &pattern(seed, 8 << 20), IoFlags::default())
        .await
        .unwrap();
    OldOnOneDrive {
        _drives: drives,
        _dir: dir,
        cp,
        c,
        pool,
        old,
    }
}

/// A client that still has a deleted volume open cannot write into the
/// volume's old slots: the delete fenced them above its chains' epochs
/// before freeing them, so its writes are refused (Stale Chain Epoch,
/// then the refetch finds no volume) and the volume that gets the slots
/// next keeps its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_volumes_open_client_cannot_write_into_its_old_slots() {
    // `_drives` and `_dir` are bindings, so they live to the end.
    let OldOnOneDrive {
        _drives,
        _dir,
        mut cp,
        c,
        pool,
        old,
    } = old_on_one_drive(41).await;
    c.delete_volume("old").await.unwrap();
    create(&c, "new", 8 * MIB, 1).await;
    let new = Volume::open(c.clone(), pool.clone(), "new").await.unwrap();
    new.write(0, &pattern(42, 8 << 20), IoFlags::default())
        .await
        .unwrap();
    for e in 0..4u64 {
        let r = old
            .write(e * 512, &pattern(43, 4096), IoFlags::default())
            .await;
        assert!(
            r.is_err(),
            "a write through the deleted volume into extent {e} succeeded"
        );
    }
    let all = new.read(0, 8 << 20, IoFlags::default()).await.unwrap();
    assert!(
        all == pattern(42, 8 << 20),
        "the new volume's data was overwritten"
    );
    cp.stop().await;
}

/// A delete is never refused for a drive that cannot be fenced: with one
/// of two targets gone, the replicated volume's delete fences what it can,
/// passes over the dead drives (one connection attempt each, not one per
/// slot), frees the slots it fenced and quarantines the others: a client
/// that still held the volume could write there. When the target comes
/// back, the zeroer fences the quarantined slots and releases them; the
/// operator can release them without a fence too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_with_a_drive_down_quarantines_its_slots_until_a_fence_holds() {
    let a = Drives::start();
    let mut b = Drives::start_at("127.0.0.1:0", Some(7));
    let b_addr = b.addr();
    let (_dir, mut cp, c) = redb_control_zeroing(4).await;
    add_all(&c, &[&a, &b]).await;
    create(&c, "v", 16 * MIB, 2).await;
    let pool = DrivePool::new(host_opts());
    let v = Volume::open(c.clone(), pool.clone(), "v").await.unwrap();
    v.write(0, &pattern(51, 16 << 20), IoFlags::default())
        .await
        .unwrap();
    drop(v);
    let used: u64 = c
        .list_drives()
        .await
        .unwrap()
        .iter()
        .map(|d| d.slots_used)
        .sum();
    assert_eq!(used, 16, "8 extents x 2 replicas");
    b.stop();
    let t0 = std::time::Instant::now();
    c.delete_volume("v").await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "the delete took {:?}",
        t0.elapsed()
    );
    let drives = c.list_drives().await.unwrap();
    let on_b: Vec<&pb::Drive> = drives.iter().filter(|d| d.addr == b_addr).collect();
    assert!(
        drives
            .iter()
            .filter(|d| d.addr != b_addr)
            .all(|d| d.slots_used == 0),
        "{drives:#?}"
    );
    let quarantined: u64 = on_b.iter().map(|d| d.slots_quarantined).sum();
    assert_eq!(
        quarantined, 8,
        "one replica of each extent on the dead target: {drives:#?}"
    );
    assert!(on_b.iter().all(|d| d.slots_used == d.slots_quarantined));
    // The operator releases one drive's quarantine without a fence.
    let first = on_b.iter().find(|d| d.slots_quarantined > 0).unwrap();
    let released = c
        .set_drive(pb::SetDriveStateRequest {
            id: first.id,
            up: true,
            release_quarantined: true,
        })
        .await
        .unwrap();
    assert_eq!((released.slots_quarantined, released.slots_used), (0, 0));
    // The target comes back: the zeroer fences the rest and releases them.
    let _b = Drives::start_at(&b_addr, Some(7));
    wait_for_drives(&c, "quarantine released once fenced", |ds| {
        ds.iter()
            .all(|d| d.slots_used == 0 && d.slots_quarantined == 0)
    })
    .await;
    cp.stop().await;
}

/// The zeroer really zeroes: a deleted volume's slots, given back dirty,
/// are zeroed ahead and declared clean, and a new volume's faults, which
/// then take clean slots without zeroing, read zeros, not the old data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_take_slots_the_zeroer_cleaned_ahead() {
    let drives = Drives::start();
    let (_dir, mut cp, c) = redb_control_zeroing(16).await;
    c.add_drive(&drives.addr(), NQN, 1).await.unwrap();
    wait_for_drives(&c, "the zeroer cleans the new drive", |ds| {
        ds.iter().all(|d| d.slots_clean == 16)
    })
    .await;
    create(&c, "old", 8 * MIB, 1).await;
    let pool = DrivePool::new(host_opts());
    let old = Volume::open(c.clone(), pool.clone(), "old").await.unwrap();
    old.write(0, &pattern(61, 8 << 20), IoFlags::default())
        .await
        .unwrap();
    drop(old);
    c.delete_volume("old").await.unwrap();
    wait_for_drives(&c, "the zeroer re-cleans the freed slots", |ds| {
        ds.iter().all(|d| d.slots_clean == 16 && d.slots_used == 0)
    })
    .await;
    create(&c, "new", 32 * MIB, 1).await;
    let new = Volume::open(c.clone(), pool.clone(), "new").await.unwrap();
    for e in 0..16u64 {
        new.write(e * 512 + 7, &pattern(62, 4096), IoFlags::default())
            .await
            .unwrap();
    }
    let all = new.read(0, 32 << 20, IoFlags::default()).await.unwrap();
    assert_zeros_but_one_block(&all, 7, &pattern(62, 4096));
    cp.stop().await;
}

/// A fault that takes a drive below half its reserve wakes the zeroer,
/// which refills at once rather than at its next look (an hour away here);
/// faults that leave half or more do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_below_half_the_reserve_wakes_the_zeroer() {
    let drives = Drives::start();
    let (_dir, mut cp, c) =
        redb_control_zeroing_every(8, std::time::Duration::from_secs(3600)).await;
    // Adding a drive wakes the zeroer too.
    c.add_drive(&drives.addr(), NQN, 1).await.unwrap();
    wait_for_drives(&c, "the zeroer cleans the new drive", |ds| {
        ds.iter().all(|d| d.slots_clean == 8)
    })
    .await;
    create(&c, "v", 10 * MIB, 1).await;
    let pool = DrivePool::new(host_opts());
    let v = Volume::open(c.clone(), pool.clone(), "v").await.unwrap();
    let fault = |e: u64| {
        let v = &v;
        async move {
            v.write(e * 512, &pattern(70 + e, 4096), IoFlags::default())
                .await
                .unwrap();
        }
    };
    for e in 0..4 {
        fault(e).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let ds = c.list_drives().await.unwrap();
    assert_eq!(ds[0].slots_clean, 4, "half the reserve left: no refill yet");
    fault(4).await;
    wait_for_drives(&c, "the fault below half wakes the zeroer", |ds| {
        ds.iter().all(|d| d.slots_clean == 8 && d.slots_used == 5)
    })
    .await;
    for e in 0..5u64 {
        let got = v.read(e * 512, 4096, IoFlags::default()).await.unwrap();
        assert_eq!(got, pattern(70 + e, 4096), "extent {e}");
    }
    cp.stop().await;
}

/// Every 2 MiB extent in `all` holds `block` at 4 KiB block `at` and zeros
/// elsewhere (no data of a volume that had the slots before).
fn assert_zeros_but_one_block(all: &[u8], at: usize, block: &[u8]) {
    for (e, extent) in all.chunks(2 << 20).enumerate() {
        let written = at * 4096;
        assert!(
            extent[..written].iter().all(|&b| b == 0),
            "extent {e} shows old data before the write"
        );
        assert_eq!(&extent[written..written + block.len()], block, "extent {e}");
        assert!(
            extent[written + block.len()..].iter().all(|&b| b == 0),
            "extent {e} shows old data after the write"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_extent_never_shows_another_volumes_old_data() {
    // `_drives` and `_dir` are bindings, so they live to the end.
    let OldOnOneDrive {
        _drives,
        _dir,
        mut cp,
        c,
        pool,
        old,
    } = old_on_one_drive(31).await;
    drop(old);
    c.delete_volume("old").await.unwrap();
    // The new volume's first write touches one block of each extent; the
    // rest of every extent must read as zeros, not as "old".
    create(&c, "new", 8 * MIB, 1).await;
    let new = Volume::open(c.clone(), pool.clone(), "new").await.unwrap();
    for e in 0..4u64 {
        new.write(e * 512 + 100, &pattern(32, 4096), IoFlags::default())
            .await
            .unwrap();
    }
    let all = new.read(0, 8 << 20, IoFlags::default()).await.unwrap();
    assert_zeros_but_one_block(&all, 100, &pattern(32, 4096));
    cp.stop().await;
}
