//! Peers for the host's tests over loopback: Sluice's real target
//! ([`RealTarget`]) and, for what only a scripted peer can show, the
//! in-memory [`mem_target::MemTarget`].
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod mem_target;

use std::net::SocketAddr;

use sluice_config::{Config, NamespaceConfig, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_target::{Target, TargetHandle};

/// Sluice's target on 127.0.0.1 (ephemeral port, no discovery listener),
/// one RAM namespace shaped like `MemTargetConfig::default()`: 16 MiB of
/// 512-byte blocks, MDTS 128 KiB, MAXH2CDATA 32 KiB, 8 KiB in-capsule.
/// Shut down when dropped.
#[derive(Debug)]
pub struct RealTarget {
    handle: Option<TargetHandle>,
    pub subnqn: String,
    pub size_blocks: u64,
    /// The configuration it started with (a test's reload edits a copy).
    pub config: Config,
}

impl RealTarget {
    /// Admits any host.
    pub fn start() -> RealTarget {
        RealTarget::start_with(&[], |t| t)
    }

    /// Admits only `hosts` (any host when empty); `target` adjusts the
    /// target settings.
    pub fn start_with(
        hosts: &[&str],
        target: impl FnOnce(TargetSettings) -> TargetSettings,
    ) -> RealTarget {
        RealTarget::start_sub(hosts, target, |s| s)
    }

    /// As [`RealTarget::start_with`], with `sub` adjusting the subsystem
    /// (DH-HMAC-CHAP secrets, for one).
    pub fn start_sub(
        hosts: &[&str],
        target: impl FnOnce(TargetSettings) -> TargetSettings,
        sub_fn: impl FnOnce(SubsystemConfig) -> SubsystemConfig,
    ) -> RealTarget {
        let subnqn = "nqn.2024-01.io.sluice:real".to_string();
        let mut sub = SubsystemConfig::new(&subnqn)
            .with_namespace(NamespaceConfig::ram(1, 16 << 20).with_block_size(512));
        sub = sub_fn(sub);
        if hosts.is_empty() {
            sub = sub.allow_any_host();
        }
        for h in hosts {
            sub = sub.with_host(*h);
        }
        let settings = TargetSettings::default()
            .with_listen("127.0.0.1:0".parse().expect("address"))
            .with_discovery_listen(None)
            .with_workers(1)
            .with_polling(PollingPolicy::Interrupt)
            .with_inline_data_bytes(8192)
            .with_max_h2c_data_bytes(32768)
            .with_max_c2h_data_bytes(65536)
            .with_mdts_bytes(131072)
            .with_shutdown_drain_ms(1000);
        let c = Config::default()
            .with_target(target(settings))
            .with_subsystem(sub)
            .validated()
            .expect("test target config");
        let handle = Target::start(&c).expect("target starts");
        RealTarget {
            handle: Some(handle),
            subnqn,
            size_blocks: 32768,
            config: c,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.handle.as_ref().expect("running").local_addr()
    }

    pub fn handle(&self) -> &TargetHandle {
        self.handle.as_ref().expect("running")
    }
}

impl Drop for RealTarget {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
    }
}
