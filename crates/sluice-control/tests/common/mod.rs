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
        let sub = SubsystemConfig::new(NQN)
            .with_namespace(NamespaceConfig::ram(1, 32 << 20).with_block_size(512))
            .with_namespace(NamespaceConfig::ram(2, 32 << 20).with_block_size(4096))
            .allow_any_host();
        let settings = TargetSettings::default()
            .with_listen("127.0.0.1:0".parse().unwrap())
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
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut cfg = ControlConfig::new(metadata);
        cfg.token = token;
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

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) as u8)
        .collect()
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
