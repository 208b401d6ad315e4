//! Helpers shared by the control crate's end-to-end tests: Sluice targets
//! as drives, a control plane, volumes, patterns.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_admin::BearerToken;
use sluice_config::{Config, NamespaceConfig, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_control::server::{ControlConfig, Metadata};
use sluice_control::{pb, ControlClient};
use sluice_host::{ConnectOptions, Controller, IoFlags};
use sluice_target::{Target, TargetHandle};

pub const MIB: u64 = 1 << 20;
pub const NQN: &str = "nqn.2026-11.io.sluice:drives";

/// A Sluice target with two 32 MiB RAM namespaces (two drives).
pub struct Drives {
    handle: Option<TargetHandle>,
}

impl Drives {
    pub fn start() -> Drives {
        Drives::start_at("127.0.0.1:0", None)
    }

    /// A target on `addr`, its namespaces' NGUIDs derived from `ids` when
    /// given (a stopped target's address and ids bring it back as the same
    /// drives, with empty namespaces).
    pub fn start_at(addr: &str, ids: Option<u8>) -> Drives {
        let ns = |nsid: u32, bs: u32| {
            let mut n = NamespaceConfig::ram(nsid, 32 << 20).with_block_size(bs);
            if let Some(seed) = ids {
                let mut u = [0x5au8; 16];
                u[0] = seed;
                u[1] = nsid as u8;
                n.uuid = Some(u);
            }
            n
        };
        let sub = SubsystemConfig::new(NQN)
            .with_namespace(ns(1, 512))
            .with_namespace(ns(2, 4096))
            .allow_any_host();
        let settings = TargetSettings::default()
            .with_listen(addr.parse().unwrap())
            .with_discovery_listen(None)
            .with_workers(1)
            .with_polling(PollingPolicy::Interrupt)
            .with_shutdown_drain_ms(200);
        let c = Config::default()
            .with_target(settings)
            .with_subsystem(sub)
            .validated()
            .unwrap();
        Drives {
            handle: Some(Target::start(&c).unwrap()),
        }
    }

    pub fn addr(&self) -> String {
        self.handle.as_ref().unwrap().local_addr().to_string()
    }

    pub fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
    }
}

impl Drop for Drives {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A control plane on 127.0.0.1:PORT, stopped by dropping `stop`.
pub struct ControlPlane {
    pub addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), sluice_control::server::ServeError>>>,
}

impl ControlPlane {
    pub async fn start(metadata: Metadata, token: Option<BearerToken>, port: u16) -> ControlPlane {
        let mut cfg = ControlConfig::new(metadata);
        cfg.token = token;
        ControlPlane::start_with(cfg, port).await
    }

    pub async fn start_with(cfg: ControlConfig, port: u16) -> ControlPlane {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(sluice_control::serve(cfg, listener, async move {
            let _ = rx.await;
        }));
        ControlPlane {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.rsplit_once(':').unwrap().1.parse().unwrap()
    }
}

/// A control plane on a fresh redb file, and a client of it.
pub async fn redb_control() -> (tempfile::TempDir, ControlPlane, ControlClient) {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(Metadata::Redb(dir.path().join("m.redb")), None, 0).await;
    let c = ControlClient::new(&cp.addr, None).unwrap();
    (dir, cp, c)
}

/// A control plane on a fresh redb file whose zeroer keeps
/// `clean_slots_per_drive` (0: none; faults zero inline), and a client.
pub async fn redb_control_zeroing(
    clean_slots_per_drive: usize,
) -> (tempfile::TempDir, ControlPlane, ControlClient) {
    redb_control_zeroing_every(clean_slots_per_drive, std::time::Duration::from_millis(50)).await
}

/// As [`redb_control_zeroing`], the zeroer looking every `interval` unless
/// woken.
pub async fn redb_control_zeroing_every(
    clean_slots_per_drive: usize,
    interval: std::time::Duration,
) -> (tempfile::TempDir, ControlPlane, ControlClient) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ControlConfig::new(Metadata::Redb(dir.path().join("m.redb")));
    cfg.zeroer.clean_slots_per_drive = clean_slots_per_drive;
    cfg.zeroer.interval = interval;
    let cp = ControlPlane::start_with(cfg, 0).await;
    let c = ControlClient::new(&cp.addr, None).unwrap();
    (dir, cp, c)
}

/// Waits (at most 20 s) until `done` holds for the pool's drives.
pub async fn wait_for_drives(c: &ControlClient, what: &str, done: impl Fn(&[pb::Drive]) -> bool) {
    let t0 = std::time::Instant::now();
    loop {
        let drives = c.list_drives().await.unwrap();
        if done(&drives) {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "{what}: still {drives:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Creates volume `name` (4 KiB blocks, no tenant).
pub async fn create(c: &ControlClient, name: &str, size_bytes: u64, replicas: u32) {
    let req = pb::CreateVolumeRequest {
        name: name.into(),
        size_bytes,
        replicas,
        ..Default::default()
    };
    c.create_volume(req).await.unwrap();
}

/// Bytes that never repeat within a volume (a pattern with a short period
/// would let a read served from the wrong extent match).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    sluice_testdata::pattern(len, seed)
}

pub fn host_opts() -> ConnectOptions {
    ConnectOptions {
        hostnqn: "nqn.2026-11.io.sluice:test-client".into(),
        ..ConnectOptions::default()
    }
}

pub async fn add_all(c: &ControlClient, targets: &[&Drives]) {
    for t in targets {
        for nsid in [1, 2] {
            c.add_drive(&t.addr(), NQN, nsid).await.unwrap();
        }
    }
}

/// Reads `len` bytes at byte `offset` of a drive directly, bypassing the
/// volume: proof of where the data went.
pub async fn read_drive(d: &pb::Drive, offset: u64, len: usize) -> Vec<u8> {
    let ctrl = Controller::connect(d.addr.parse().unwrap(), &d.nqn, host_opts())
        .await
        .unwrap();
    let ns = ctrl.namespace(d.nsid).unwrap();
    let data = ns
        .read(
            offset / u64::from(d.block_size_bytes),
            len,
            IoFlags::default(),
        )
        .await
        .unwrap();
    ctrl.disconnect(Duration::from_millis(50)).await;
    data
}

/// A block of `len` bytes that names its generation in its first 8 bytes.
pub fn generation_block(generation: u64, len: usize) -> Vec<u8> {
    let mut b = pattern(generation, len);
    b[..8].copy_from_slice(&generation.to_le_bytes());
    b
}

/// The generation a [`generation_block`] names.
pub fn generation_of(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap())
}

/// A verified read/write workload on `blocks` blocks of `block_len` bytes
/// (block `b` at LBA `b * stride_lbas`, 4 KiB blocks): a writer
/// writes ever newer generations, recording each acknowledged one, and a
/// reader checks that every block it reads is whole and at least as new as
/// the last generation acknowledged before the read began. Both run until
/// `stop`; each panics on the first failure or wrong block.
pub struct VerifiedWorkload {
    pub acked: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, u64>>>,
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub reads: std::sync::Arc<std::sync::atomic::AtomicU64>,
    writer: tokio::task::JoinHandle<u64>,
    reader: tokio::task::JoinHandle<()>,
}

impl VerifiedWorkload {
    /// Starts both tasks; every block must already hold a generation block
    /// recorded in `acked`, and generations continue above `blocks`.
    pub fn start(
        v: std::sync::Arc<sluice_control::Volume>,
        blocks: u64,
        block_len: usize,
        stride_lbas: u64,
        acked: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, u64>>>,
    ) -> VerifiedWorkload {
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reads = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let lbas = stride_lbas;
        let writer = {
            let (v, acked, stop) = (v.clone(), acked.clone(), stop.clone());
            tokio::spawn(async move {
                let mut g = blocks;
                while !stop.load(Relaxed) {
                    g += 1;
                    let b = g * 7 % blocks;
                    v.write(
                        b * lbas,
                        &generation_block(g, block_len),
                        IoFlags::default(),
                    )
                    .await
                    .expect("writes keep succeeding");
                    acked.lock().unwrap().insert(b, g);
                }
                g
            })
        };
        let reader = {
            let (acked, stop, reads) = (acked.clone(), stop.clone(), reads.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    i += 1;
                    let b = i * 13 % blocks;
                    let before = acked.lock().unwrap()[&b];
                    let data = v
                        .read(b * lbas, block_len, IoFlags::default())
                        .await
                        .expect("reads keep succeeding");
                    let g = generation_of(&data);
                    assert!(
                        g >= before,
                        "block {b}: generation {g} read after {before} was acknowledged"
                    );
                    assert!(
                        data == generation_block(g, block_len),
                        "block {b}: a torn or foreign block (generation {g})"
                    );
                    reads.fetch_add(1, Relaxed);
                }
            })
        };
        VerifiedWorkload {
            acked,
            stop,
            reads,
            writer,
            reader,
        }
    }

    /// Stops both tasks; returns the last generation written.
    pub async fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let g = self.writer.await.unwrap();
        self.reader.await.unwrap();
        g
    }

    /// Every acknowledged (block, generation), by block.
    pub fn acknowledged(&self) -> Vec<(u64, u64)> {
        self.acked
            .lock()
            .unwrap()
            .iter()
            .map(|(b, g)| (*b, *g))
            .collect()
    }
}
