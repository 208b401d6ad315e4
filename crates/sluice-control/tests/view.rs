//! The shadow view end to end (Flint §3): volume clients' agents send their
//! samples to `sluice control`, which finds the congested drive, names the
//! victim sessions, pushes them to the agents, exports them as metrics, and
//! steers placement away from the congested drive.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
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
use sluice_flint::{Entity, ViewControllerConfig};
use sluice_host::IoFlags;
use sluice_target::{Target, TargetHandle};

const SLOW_NQN: &str = "nqn.2026-11.io.sluice:slow";
const FAST_NQN: &str = "nqn.2026-11.io.sluice:fast";

/// A target with one namespace: an emulated SSD that writes at 20 MB/s
/// (so a few 64 KiB writes in flight queue), or RAM.
fn target(nqn: &str, slow: bool) -> TargetHandle {
    let ns = if slow {
        NamespaceConfig::emulated_ssd(
            1,
            64 << 20,
            SsdConfig::default()
                .with_write_bytes_per_sec_max(20_000_000)
                .with_base_write_latency_us(100)
                .with_parallelism(1),
        )
    } else {
        NamespaceConfig::ram(1, 64 << 20)
    };
    let settings = TargetSettings::default()
        .with_listen("127.0.0.1:0".parse().unwrap())
        .with_discovery_listen(None)
        .with_workers(1)
        .with_polling(PollingPolicy::Interrupt)
        .with_shutdown_drain_ms(200);
    let c = Config::default()
        .with_target(settings)
        .with_subsystem(
            SubsystemConfig::new(nqn)
                .with_namespace(ns.with_block_size(4096))
                .allow_any_host(),
        )
        .validated()
        .unwrap();
    Target::start(&c).unwrap()
}

async fn control(
    dir: &std::path::Path,
) -> (
    String,
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
) {
    control_with(dir, |_| {}).await
}

async fn control_with(
    dir: &std::path::Path,
    tune: impl FnOnce(&mut ControlConfig),
) -> (
    String,
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let admin_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = ControlConfig::new(Metadata::Redb(dir.join("m.redb")));
    cfg.view = ViewControllerConfig {
        window_us: 500_000,
        epoch_us: 50_000,
        congestion_ios_min: 8,
        ..ViewControllerConfig::default()
    };
    cfg.admin = Some(sluice_admin::AdminConfig::new(admin_port));
    tune(&mut cfg);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(sluice_control::serve(cfg, listener, async move {
        let _ = rx.await;
    }));
    (addr, admin_port, tx)
}

fn client(name: &str) -> Arc<DrivePool> {
    DrivePool::with_isolation(
        host_opts(),
        ClientIsolation::new(name, EioConfig::default()).unwrap(),
    )
}

async fn create_on(c: &ControlClient, name: &str, addr: &str) {
    c.create_volume(pb::CreateVolumeRequest {
        name: name.into(),
        size_bytes: 16 * MIB,
        replicas: 1,
        prefer: vec![addr.into()],
        ..Default::default()
    })
    .await
    .unwrap();
}

/// `qd` (at most 16) writers of 64 KiB each, until `stop`, each pausing
/// `gap` after every write.
fn writers(
    v: &Arc<Volume>,
    qd: u64,
    gap: Duration,
    stop: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..qd)
        .map(|w| {
            let v = v.clone();
            tokio::spawn(async move {
                let data = pattern(w, 64 << 10);
                let mut i = 0u64;
                while Instant::now() < stop {
                    // Each writer owns 256 blocks (1 MiB) of the volume.
                    let lba = w * 256 + (i % 16) * 16;
                    v.write(lba, &data, IoFlags::default()).await.unwrap();
                    i += 1;
                    if !gap.is_zero() {
                        tokio::time::sleep(gap).await;
                    }
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_finds_the_congested_drive_and_its_victims_and_pushes_them_to_agents() {
    let slow = target(SLOW_NQN, true);
    let fast = target(FAST_NQN, false);
    let dir = tempfile::tempdir().unwrap();
    // The slow drive's writes queue for about 20 ms. A threshold of 5 ms
    // (the default is 1 ms, for real drives) keeps the fast drive's
    // scheduling delays on a loaded 2-core machine running debug builds
    // from reading as congestion.
    let (addr, admin, _stop) = control_with(dir.path(), |cfg| {
        cfg.view.queue_delay_us_congested = 5_000.0;
    })
    .await;
    let c = ControlClient::new(&addr, None).unwrap();
    let slow_addr = slow.local_addr().to_string();
    let fast_addr = fast.local_addr().to_string();
    let d_slow = c.add_drive(&slow_addr, SLOW_NQN, 1).await.unwrap().id;
    let d_fast = c.add_drive(&fast_addr, FAST_NQN, 1).await.unwrap().id;
    create_on(&c, "a-slow", &slow_addr).await;
    create_on(&c, "a-fast", &fast_addr).await;
    create_on(&c, "b-fast", &fast_addr).await;

    // Client a writes to both drives; client b only to the fast one.
    let pool_a = client("client-a");
    let pool_b = client("client-b");
    let a_slow = Arc::new(
        Volume::open(c.clone(), pool_a.clone(), "a-slow")
            .await
            .unwrap(),
    );
    let a_fast = Arc::new(
        Volume::open(c.clone(), pool_a.clone(), "a-fast")
            .await
            .unwrap(),
    );
    let b_fast = Arc::new(
        Volume::open(c.clone(), pool_b.clone(), "b-fast")
            .await
            .unwrap(),
    );
    // One write each while idle: the drives' unloaded latencies.
    for v in [&a_slow, &a_fast, &b_fast] {
        v.write(0, &pattern(1, 64 << 10), IoFlags::default())
            .await
            .unwrap();
    }
    let stop = Instant::now() + Duration::from_secs(4);
    // The slow drive gets more writes than it can take; the fast one a
    // steady load well inside what it (and this machine's CPU) can take.
    // Writing to it flat out would make the CPU its bottleneck: on a
    // loaded 2-core machine its writes then queue for milliseconds, and
    // the view rightly calls it congested too.
    let mut tasks = writers(&a_slow, 8, Duration::ZERO, stop);
    tasks.extend(writers(&a_fast, 2, Duration::from_millis(2), stop));
    tasks.extend(writers(&b_fast, 2, Duration::from_millis(2), stop));

    // The controller's analysis: the slow drive is congested, a's sessions
    // are victims (to the drive, and through a's NetPipe), b's is not.
    let deadline = Instant::now() + Duration::from_secs(3);
    let report = loop {
        let snap = c
            .view_query(pb::ViewQueryRequest {
                entities: vec![],
                all: true,
            })
            .await
            .unwrap();
        let r = snap.report.clone().unwrap_or_default();
        if r.congested_drives.contains(&u64::from(d_slow))
            && r.victims
                .iter()
                .any(|v| v.client == "client-a" && v.drive == u64::from(d_fast))
        {
            break (snap, r);
        }
        assert!(Instant::now() < deadline, "no congestion found: {snap:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (snap, r) = report;
    assert!(!r.congested_drives.contains(&u64::from(d_fast)), "{r:?}");
    assert_eq!(r.congested_io_pipes, vec![slow_addr.clone()]);
    assert_eq!(r.congested_net_pipes, vec!["client-a".to_owned()]);
    assert!(
        !r.victims.iter().any(|v| v.client == "client-b"),
        "b shares no pipe with the congested drive: {r:?}"
    );
    // Every client's I/O is in the view, under its own NetPipe.
    let netpipes: Vec<String> = snap
        .entities
        .iter()
        .filter_map(|e| match e.entity.as_ref().and_then(|e| e.kind.clone()) {
            Some(pb::view_entity::Kind::NetPipe(n)) => Some(n),
            _ => None,
        })
        .collect();
    assert!(netpipes.contains(&"client-a".to_owned()) && netpipes.contains(&"client-b".to_owned()));
    // Each drive names the volumes that load it, from every client: the
    // slow one only a-slow, the fast one a-fast and b-fast.
    let id = |name: &'static str| {
        let c = c.clone();
        async move {
            c.open_volume(name)
                .await
                .unwrap()
                .volume
                .map(|v| v.id)
                .unwrap()
        }
    };
    let (a_slow_id, a_fast_id, b_fast_id) =
        (id("a-slow").await, id("a-fast").await, id("b-fast").await);
    let volumes_of = |d: u32| -> Vec<(u64, f64)> {
        snap.entities
            .iter()
            .find(|e| {
                matches!(e.entity.as_ref().and_then(|e| e.kind.clone()),
                    Some(pb::view_entity::Kind::Drive(x)) if x == u64::from(d))
            })
            .map(|e| e.volumes.iter().map(|l| (l.volume, l.share)).collect())
            .unwrap_or_default()
    };
    let slow_volumes = volumes_of(d_slow);
    assert_eq!(slow_volumes.len(), 1, "{slow_volumes:?}");
    assert_eq!(slow_volumes[0].0, a_slow_id);
    assert!(slow_volumes[0].1 > 0.99, "{slow_volumes:?}");
    let mut fast_ids: Vec<u64> = volumes_of(d_fast).iter().map(|(v, _)| *v).collect();
    fast_ids.sort_unstable();
    let mut want = vec![a_fast_id, b_fast_id];
    want.sort_unstable();
    assert_eq!(fast_ids, want);
    let share_sum: f64 = volumes_of(d_fast).iter().map(|(_, s)| s).sum();
    assert!((share_sum - 1.0).abs() < 1e-6, "{:?}", volumes_of(d_fast));

    // The agents learn it without asking: a is a victim on both drives,
    // answered from its local copy.
    let iso_a = pool_a.isolation().clone();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !(iso_a.is_victim(u64::from(d_slow)) && iso_a.is_victim(u64::from(d_fast))) {
        assert!(
            Instant::now() < deadline,
            "client a never learnt it is a victim"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = iso_a.query(&Entity::Drive(u64::from(d_slow))).unwrap();
    assert!(held.congested, "{held:?}");
    assert!(!pool_b.isolation().is_victim(u64::from(d_fast)));

    // Prometheus and JSON on the admin endpoint.
    let m = sluice_admin::client::request(&admin.to_string(), "GET", "/metrics", "", None).unwrap();
    assert_eq!(m.status, 200);
    let congested = format!("sluice_view_drive_congested{{drive=\"{d_slow}\"}} 1");
    assert!(m.body.contains(&congested), "{}", m.body);
    assert!(
        m.body
            .contains("sluice_view_victim_sessions{client=\"client-a\"} 2"),
        "{}",
        m.body
    );
    let share =
        format!("sluice_view_drive_volume_share{{drive=\"{d_slow}\",volume=\"{a_slow_id}\"}} ");
    assert!(m.body.contains(&share), "{}", m.body);
    // Two volumes on the drive: nothing past the limits.
    let untracked = format!(
        "sluice_view_drive_untracked_samples_total{{drive=\"{d_slow}\",limit=\"volumes\"}} 0"
    );
    assert!(m.body.contains(&untracked), "{}", m.body);
    // Its help names the limits the code enforces.
    let limits = format!(
        "past {} volumes) or session (past {} sessions",
        sluice_flint::view::VOLUMES_PER_DRIVE_MAX,
        sluice_flint::view::SESSIONS_PER_DRIVE_MAX
    );
    assert!(m.body.contains(&limits), "{}", m.body);
    // The rebuilder's progress is served beside the view.
    for family in [
        "sluice_rebuild_degraded_extents ",
        "sluice_rebuild_extents_rebuilt_total ",
        "sluice_rebuild_copied_bytes_total ",
        "sluice_remap_extents_remapped_total ",
    ] {
        assert!(
            m.body.lines().any(|l| l.starts_with(family)),
            "{family}missing:\n{}",
            m.body
        );
    }
    let j = sluice_admin::client::request(&admin.to_string(), "GET", "/v1/view", "", None).unwrap();
    assert_eq!(j.status, 200);
    assert!(j.body.contains("client-a"), "{}", j.body);

    // Placement now avoids the congested drive: a new volume that prefers
    // neither drive gets its first extent on the fast one.
    create(&c, "new", 16 * MIB, 1).await;
    let v = Volume::open(c.clone(), pool_b.clone(), "new")
        .await
        .unwrap();
    v.write(0, &pattern(3, 4096), IoFlags::default())
        .await
        .unwrap();
    let layout = c.open_volume("new").await.unwrap();
    assert_eq!(
        layout.extents[0].chain[0].drive, d_fast,
        "placed on the congested drive"
    );

    for t in tasks {
        t.await.unwrap();
    }
    // Data written under the view reads back.
    for w in 0..8 {
        let got = a_slow
            .read(w * 256, 64 << 10, IoFlags::default())
            .await
            .unwrap();
        assert!(got == pattern(w, 64 << 10), "writer {w}'s data");
    }
    drop((slow, fast));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_view_messages_get_invalid_argument_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _admin, _stop) = control(dir.path()).await;
    let c = ControlClient::new(&addr, None).unwrap();
    let e = c
        .view_query(pb::ViewQueryRequest {
            entities: vec![pb::ViewEntity { kind: None }],
            all: false,
        })
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("entities: an entity with no kind"),
        "{e}"
    );
    let big = pb::ViewBatch {
        client: "x".into(),
        sent_at_us: 0,
        samples: vec![pb::ViewSample::default(); sluice_flint::view::BATCH_SAMPLES_MAX + 1],
        bids: vec![],
    };
    let e = c.view_sync(big).await.unwrap_err();
    assert!(e.to_string().contains("samples:"), "{e}");
    let greedy = pb::ViewBatch {
        client: "x".into(),
        bids: vec![pb::SessionBid::default(); sluice_flint::auction::BID_SESSIONS_MAX + 1],
        ..Default::default()
    };
    let e = c.view_sync(greedy).await.unwrap_err();
    assert!(e.to_string().contains("bids:"), "{e}");
    let e = c
        .view_sync(pb::ViewBatch {
            client: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("client name"), "{e}");
    let e = c
        .watch_view_with(
            "x",
            vec![pb::ViewSubscription {
                drive: 1,
                headroom_below_bytes_per_sec: -1.0,
            }],
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("headroom_below_bytes_per_sec"),
        "{e}"
    );
}

/// Reads of an extent no write is changing go to the replica whose path
/// looks least loaded; here the client's own latencies show a drive that
/// answers reads in 20 ms beside one that answers in microseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_replicated_reads_go_to_the_least_loaded_replica() {
    let slow = {
        let ns = NamespaceConfig::emulated_ssd(
            1,
            64 << 20,
            SsdConfig::default().with_base_read_latency_us(20_000),
        );
        let c = Config::default()
            .with_target(
                TargetSettings::default()
                    .with_listen("127.0.0.1:0".parse().unwrap())
                    .with_discovery_listen(None)
                    .with_workers(1)
                    .with_polling(PollingPolicy::Interrupt),
            )
            .with_subsystem(
                SubsystemConfig::new(SLOW_NQN)
                    .with_namespace(ns.with_block_size(4096))
                    .allow_any_host(),
            )
            .validated()
            .unwrap();
        Target::start(&c).unwrap()
    };
    let fast = target(FAST_NQN, false);
    let dir = tempfile::tempdir().unwrap();
    let (addr, _admin, _stop) = control(dir.path()).await;
    let c = ControlClient::new(&addr, None).unwrap();
    let d_slow = c
        .add_drive(&slow.local_addr().to_string(), SLOW_NQN, 1)
        .await
        .unwrap()
        .id;
    let d_fast = c
        .add_drive(&fast.local_addr().to_string(), FAST_NQN, 1)
        .await
        .unwrap()
        .id;
    create(&c, "r2", 16 * MIB, 2).await;
    let pool = client("reader");
    let v = Volume::open(c.clone(), pool.clone(), "r2").await.unwrap();
    let data = pattern(5, 1 << 20);
    v.write(0, &data, IoFlags::default()).await.unwrap();
    for i in 0..40u64 {
        let lba = (i * 7) % 256;
        let got = v.read(lba, 4096, IoFlags::default()).await.unwrap();
        let at = usize::try_from(lba * 4096).unwrap();
        assert!(got == data[at..at + 4096], "read {i}");
    }
    // write_share is in 0..=1, so the count it gives is in 0..=ios.
    #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
    let reads = |d: u32| {
        pool.isolation()
            .local_stats(u64::from(d))
            .map_or(0, |s| s.ios - (s.ios as f64 * s.write_share).round() as u64)
    };
    let (rs, rf) = (reads(d_slow), reads(d_fast));
    assert_eq!(rs + rf, 40);
    assert!(
        rs <= 1,
        "{rs} reads went to the slow replica, {rf} to the fast one"
    );
    drop((slow, fast));
}

/// A target's own agent reports its namespaces' I/O: the view sees a
/// drive's load from hosts that run no view agent (here, a plain NVMe/TCP
/// host writing to the namespace), and placement steers new extents away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targets_agent_shows_load_from_hosts_without_agents() {
    let slow = Arc::new(target(SLOW_NQN, true));
    let fast = target(FAST_NQN, false);
    let dir = tempfile::tempdir().unwrap();
    let (addr, _admin, _stop) = control(dir.path()).await;
    let c = ControlClient::new(&addr, None).unwrap();
    let slow_addr = slow.local_addr().to_string();
    let d_slow = c.add_drive(&slow_addr, SLOW_NQN, 1).await.unwrap().id;
    let d_fast = c
        .add_drive(&fast.local_addr().to_string(), FAST_NQN, 1)
        .await
        .unwrap()
        .id;
    // The slow target's agent, reporting as its listen port on any host.
    let port = format!("0.0.0.0:{}", slow.local_addr().port());
    let h = slow.clone();
    let agent = tokio::spawn(sluice_control::isolation::target_agent(
        c.clone(),
        port,
        Duration::from_millis(50),
        move || {
            h.namespace_counters()
                .into_iter()
                .map(|n| sluice_flint::TargetCounters {
                    nqn: n.nqn,
                    nsid: n.nsid,
                    ios: n.ios,
                    write_ios: n.write_ios,
                    bytes: n.bytes,
                    latency_us_sum: n.latency_us_sum,
                })
                .collect()
        },
    ));
    // A host with no agent writes 64 KiB at QD 8 straight to the slow
    // drive's namespace, past the end of any extent the pool hands out.
    let ctrl = sluice_host::Controller::connect(slow.local_addr(), SLOW_NQN, host_opts())
        .await
        .unwrap();
    let ns = ctrl.namespace(1).unwrap();
    let stop = Instant::now() + Duration::from_secs(3);
    let hammer: Vec<_> = (0..8u64)
        .map(|w| {
            let ns = ns.clone();
            tokio::spawn(async move {
                let data = pattern(w, 64 << 10);
                let mut i = 0u64;
                while Instant::now() < stop {
                    let lba = 8192 + w * 256 + (i % 16) * 16;
                    ns.write(lba, &data, IoFlags::default()).await.unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    let view = loop {
        let snap = c
            .view_query(pb::ViewQueryRequest {
                entities: vec![pb::ViewEntity {
                    kind: Some(pb::view_entity::Kind::Drive(u64::from(d_slow))),
                }],
                all: false,
            })
            .await
            .unwrap();
        let v = snap.entities.first().cloned();
        if v.as_ref()
            .is_some_and(|v| v.congested && v.target.is_some())
        {
            break v.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the target's load never showed: {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let t = view.target.unwrap();
    assert!(t.ios > 0 && t.bytes_per_sec > 1e6, "{t:?}");
    // The clients' own windows saw nothing: no volume client ran.
    assert_eq!(view.stats.unwrap_or_default().ios, 0);
    assert!(view.busy_degree > 0.9, "{view:?}");
    // A new volume's first extent avoids the busy drive (then spreading
    // the volume weighs in: α = 4 against γ = 2 with two drives).
    c.create_volume(pb::CreateVolumeRequest {
        name: "newcomer".into(),
        size_bytes: 8 * MIB,
        replicas: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let v = Volume::open(c.clone(), client("newcomer"), "newcomer")
        .await
        .unwrap();
    for e in 0..4u64 {
        v.write(e * 512, &pattern(e, 4096), IoFlags::default())
            .await
            .unwrap();
    }
    let layout = c.open_volume("newcomer").await.unwrap();
    let on_slow = |e: &pb::Extent| e.chain.iter().any(|r| r.drive == d_slow);
    assert!(
        layout.extents[0].chain.iter().all(|r| r.drive == d_fast),
        "{layout:?}"
    );
    assert!(
        layout.extents.iter().filter(|e| on_slow(e)).count() <= 1,
        "{layout:?}"
    );
    for t in hammer {
        t.await.unwrap();
    }
    agent.abort();
    // A report from a port the pool does not know is counted, not applied.
    let ack = c
        .view_target_report(pb::TargetReport {
            port: "10.9.9.9:4420".into(),
            namespaces: vec![pb::TargetNamespace {
                nqn: SLOW_NQN.into(),
                nsid: 1,
                ios: 5,
                ..Default::default()
            }],
        })
        .await
        .unwrap();
    assert_eq!((ack.drives, ack.unknown), (0, 1));
    let e = c
        .view_target_report(pb::TargetReport {
            port: "no-port".into(),
            namespaces: vec![],
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("port:"), "{e}");
}

/// The view's fast channel (`--view-listen`): the token in the hello, the
/// same checks as gRPC, and clients that find it through `Status` and sync
/// over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_channel_authenticates_checks_and_carries_the_clients_syncs() {
    use sluice_control::view_wire::{ViewChannel, WireCallError};
    let drives = target(FAST_NQN, false);
    let dir = tempfile::tempdir().unwrap();
    let token = sluice_admin::BearerToken::new("view-s3cret");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut cfg = ControlConfig::new(Metadata::Redb(dir.path().join("m.redb")));
    cfg.token = token.clone();
    cfg.view_listen = Some("127.0.0.1:0".parse().unwrap());
    let (_stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(sluice_control::serve(cfg, listener, async move {
        let _ = rx.await;
    }));
    let c = ControlClient::new(&addr, token.as_ref()).unwrap();
    let view_addr = loop {
        if let Ok(s) = c.status().await {
            break s.view_addr;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!view_addr.is_empty());
    let d = c
        .add_drive(&drives.local_addr().to_string(), FAST_NQN, 1)
        .await
        .unwrap()
        .id;

    // No token, or a wrong one: refused at the hello.
    for t in [None, sluice_admin::BearerToken::new("wrong")] {
        let e = ViewChannel::connect(&view_addr, t.as_ref())
            .await
            .unwrap_err();
        assert!(
            matches!(e, WireCallError::Refused(ref m) if m.contains("token")),
            "{e}"
        );
    }
    let mut ch = ViewChannel::connect(&view_addr, token.as_ref())
        .await
        .unwrap();
    let batch = pb::ViewBatch {
        client: "fast".into(),
        sent_at_us: 10,
        samples: vec![
            pb::ViewSample {
                drive: u64::from(d),
                bytes: 4096,
                latency_us: 90,
                at_us: 5,
                ..Default::default()
            };
            3
        ],
        bids: vec![],
    };
    let ack = ch.view_sync(&batch).await.unwrap();
    assert!(
        ack.counters
            .iter()
            .any(|k| k.applied == 3 && k.counter >= 3),
        "{ack:?}"
    );
    assert!(ack.grants.is_some_and(|g| !g.on));
    // The same checks as gRPC, naming the field; the connection then ends.
    let greedy = pb::ViewBatch {
        client: "fast".into(),
        samples: vec![pb::ViewSample::default(); sluice_flint::view::BATCH_SAMPLES_MAX + 1],
        ..Default::default()
    };
    let e = ch.view_sync(&greedy).await.unwrap_err();
    assert!(e.to_string().contains("samples:"), "{e}");
    let mut ch = ViewChannel::connect(&view_addr, token.as_ref())
        .await
        .unwrap();
    let e = ch
        .target_report(&pb::TargetReport {
            port: "nonsense".into(),
            namespaces: vec![],
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("port:"), "{e}");

    // A volume client finds the channel and syncs over it.
    c.create_volume(pb::CreateVolumeRequest {
        name: "v".into(),
        size_bytes: 8 * MIB,
        replicas: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let pool = client("channel-client");
    let v = Volume::open(c.clone(), pool.clone(), "v").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.isolation().sync_paths().0 == 0 {
        v.write(0, &pattern(1, 4096), IoFlags::default())
            .await
            .unwrap();
        assert!(
            Instant::now() < deadline,
            "{:?}",
            pool.isolation().sync_paths()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Remapping (Flint §5.5): a volume placed before a drive congested has
/// its extents there moved to the uncongested drives while a verified
/// read/write workload runs on it; the noisy volume that prefers the drive
/// stays. Every acknowledged write reads back, through the writing client,
/// a fresh one, and one whose map predates the remap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extents_move_off_a_congested_drive_under_a_verified_workload() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let slow = target(SLOW_NQN, true);
    let fast1 = target(FAST_NQN, false);
    let fast2 = target("nqn.2026-11.io.sluice:fast2", false);
    let dir = tempfile::tempdir().unwrap();
    let (addr, _admin, _stop) = control_with(dir.path(), |cfg| {
        cfg.remap = sluice_control::remap::RemapConfig {
            enabled: true,
            congested_for: Duration::from_millis(500),
            ..Default::default()
        };
    })
    .await;
    let c = ControlClient::new(&addr, None).unwrap();
    let slow_addr = slow.local_addr().to_string();
    let d_slow = c.add_drive(&slow_addr, SLOW_NQN, 1).await.unwrap().id;
    c.add_drive(&fast1.local_addr().to_string(), FAST_NQN, 1)
        .await
        .unwrap();
    c.add_drive(
        &fast2.local_addr().to_string(),
        "nqn.2026-11.io.sluice:fast2",
        1,
    )
    .await
    .unwrap();
    create_on(&c, "noisy", &slow_addr).await;
    // The victim is placed while every drive is calm: spread over all three.
    create(&c, "victim", 8 * sluice_volume::EXTENT_BYTES, 1).await;
    let pool = client("client-victim");
    let victim = Arc::new(Volume::open(c.clone(), pool, "victim").await.unwrap());
    const BLOCKS: u64 = 64; // one per 256 KiB: 8 per extent
    let acked = Arc::new(std::sync::Mutex::new(BTreeMap::<u64, u64>::new()));
    for b in 0..BLOCKS {
        victim
            .write(
                b * 64,
                &generation_block(b + 1, 16 << 10),
                IoFlags::default(),
            )
            .await
            .unwrap();
        acked.lock().unwrap().insert(b, b + 1);
    }
    let on_slow = |l: &pb::VolumeLayout| {
        l.extents
            .iter()
            .filter(|e| e.chain.iter().any(|r| r.drive == d_slow))
            .count()
    };
    let before = on_slow(&c.open_volume("victim").await.unwrap());
    assert!(before > 0, "the victim has extents on the slow drive");
    // A second client that only reads, its map from before the remap: the
    // retired replicas refuse its reads (fenced above its epoch), so it
    // refetches rather than read data the volume has moved on from.
    let early = Volume::open(c.clone(), client("client-early"), "victim")
        .await
        .unwrap();
    for b in 0..BLOCKS {
        let data = early
            .read(b * 64, 16 << 10, IoFlags::default())
            .await
            .unwrap();
        assert!(data == generation_block(b + 1, 16 << 10));
    }

    // The noise congests the slow drive; the victim's workload runs on.
    let noisy = Arc::new(
        Volume::open(c.clone(), client("client-noisy"), "noisy")
            .await
            .unwrap(),
    );
    noisy
        .write(0, &pattern(1, 64 << 10), IoFlags::default())
        .await
        .unwrap();
    let noise_until = Instant::now() + Duration::from_secs(20);
    let stop_noise = Arc::new(AtomicBool::new(false));
    let noise: Vec<_> = (0..8u64)
        .map(|w| {
            let (v, stop) = (noisy.clone(), stop_noise.clone());
            tokio::spawn(async move {
                let data = pattern(w, 64 << 10);
                let mut i = 0u64;
                while !stop.load(Relaxed) && Instant::now() < noise_until {
                    v.write(w * 256 + (i % 16) * 16, &data, IoFlags::default())
                        .await
                        .unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    let work = VerifiedWorkload::start(victim.clone(), BLOCKS, 16 << 10, 64, acked.clone());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let l = c.open_volume("victim").await.unwrap();
        if on_slow(&l) == 0 && l.extents.iter().all(|e| e.rebuilding.is_none()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the victim's extents never left the congested drive: {:?}",
            c.status().await.unwrap().rebuilds
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_noise.store(true, Relaxed);
    let reads = work.reads.load(Relaxed);
    work.finish().await;
    for t in noise {
        t.await.unwrap();
    }
    assert!(reads > 0);
    let status = c.status().await.unwrap().rebuilds.unwrap();
    assert!(status.extents_remapped >= before as u64, "{status:?}");
    // The volume that prefers the drive stays on it.
    let noisy_layout = c.open_volume("noisy").await.unwrap();
    assert!(noisy_layout
        .extents
        .iter()
        .all(|e| e.chain.iter().all(|r| r.drive == d_slow)));
    // Every acknowledged write reads back, through a fresh client too.
    let fresh = Volume::open(c.clone(), client("client-check"), "victim")
        .await
        .unwrap();
    let all: Vec<(u64, u64)> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|(b, g)| (*b, *g))
        .collect();
    for (b, g) in all {
        for v in [&*victim, &fresh, &early] {
            let data = v.read(b * 64, 16 << 10, IoFlags::default()).await.unwrap();
            assert!(
                data == generation_block(g, 16 << 10),
                "block {b} generation {g}"
            );
        }
    }
    drop((slow, fast1, fast2));
}
