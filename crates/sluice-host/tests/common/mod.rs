//! Peers for the host's tests over loopback: Sluice's real target
//! ([`RealTarget`]) and, for what only a scripted peer can show, the
//! in-memory [`mem_target::MemTarget`].
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod mem_target;

use std::net::SocketAddr;

use sluice_config::Config;
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
}

impl RealTarget {
    /// Admits any host.
    pub fn start() -> RealTarget {
        RealTarget::start_with(&[], "")
    }

    /// Admits only `hosts` (any host when empty); `extra` is added to the
    /// `[target]` table.
    pub fn start_with(hosts: &[&str], extra: &str) -> RealTarget {
        let subnqn = "nqn.2024-01.io.sluice:real".to_string();
        let access = if hosts.is_empty() {
            "allow_any_host = true".to_string()
        } else {
            let l: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
            format!("hosts = [{}]", l.join(", "))
        };
        let toml = format!(
            r#"
[target]
listen = "127.0.0.1:0"
discovery_listen = ""
workers = 1
polling = "interrupt"
inline_data_bytes = 8192
max_h2c_data_bytes = 32768
max_c2h_data_bytes = 65536
mdts_bytes = 131072
shutdown_drain_ms = 1000
{extra}
[[subsystem]]
nqn = "{subnqn}"
{access}
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "16MiB"
block_size = 512
"#
        );
        let c = Config::from_toml(&toml).expect("test target config");
        let handle = Target::start(&c).expect("target starts");
        RealTarget {
            handle: Some(handle),
            subnqn,
            size_blocks: 32768,
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
