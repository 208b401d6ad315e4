//! Conformance row SEQ-11 (`docs/conformance.md`): one worker holding
//! `CONNECTIONS_PER_WORKER_MAX` (4096) connections drops the next one it is
//! handed, silently. Its own test binary: it needs about 8200 descriptors
//! (raised to the hard limit here) and must not starve other tests of them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_config::{Config, NamespaceConfig, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_target::{Target, TargetHandle};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const SUBNQN: &str = "nqn.2026-11.io.sluice:test";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const CONNECTIONS: u32 = 4096;

/// Raises the soft open-file limit to the hard one; false if that is still
/// too low for the test (then it is skipped, loudly).
fn raise_nofile(needed: u64) -> bool {
    // SAFETY: getrlimit/setrlimit on a valid, owned rlimit.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return false;
        }
        if r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
        r.rlim_cur >= needed
    }
}

fn start() -> TargetHandle {
    let n = CONNECTIONS + 16;
    let c = Config::default()
        .with_target(
            TargetSettings::default()
                .with_workers(1)
                .with_polling(PollingPolicy::Interrupt)
                .with_listen(SocketAddr::from(([127, 0, 0, 1], 0)))
                .with_discovery_listen(None)
                .with_shutdown_drain_ms(500)
                .with_handshake_timeout_ms(600_000)
                .with_connections_max(n)
                .with_connections_per_source_max(n)
                .with_connections_handshaking_max(n)
                .with_connections_handshaking_per_source_max(n),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(NamespaceConfig::ram(1, 1 << 20).with_block_size(512)),
        )
        .validated()
        .unwrap();
    Target::start(&c).unwrap()
}

fn wait_open(t: &TargetHandle, open: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.connections().open != open && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(t.connections().open, open, "{:?}", t.connections());
}

#[test]
fn seq_11_full_worker_drops_new_connection() {
    if !raise_nofile(2 * u64::from(CONNECTIONS) + 256) {
        eprintln!("SKIPPED: the open-file limit is below what 4097 loopback connections need");
        return;
    }
    let t = start();
    let addr = t.local_addr();
    let held: Vec<TcpStream> = (0..CONNECTIONS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Wait until the worker has placed them all (an idle one is not closed).
    wait_open(&t, CONNECTIONS);
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = TcpStream::connect(addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 64];
    match extra.read(&mut b) {
        Ok(0) => {}
        Ok(n) => panic!("the target sent {n} bytes to a connection it cannot hold"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    drop(held);
    t.shutdown();
}
