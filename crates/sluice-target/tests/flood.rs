//! Idle connections cost little and give their memory back: two waves of
//! 2000 idle sockets against a real target in this process (its own test
//! binary, so no other test allocates meanwhile), with the anonymous part
//! of the process's resident set (`RssAnon` of /proc/self/status): the
//! executable's own pages (`RssFile`, 7 MiB of this test's 8 MiB at rest)
//! grow with the code a wave runs and shrink and grow again with the page
//! cache's pressure, which made the whole resident set fail this test
//! under load with nothing left to free. Each wave ends with a
//! tail: a few connections spread over the heap close after the target has
//! already trimmed for the rest, as happens when a wave's closes straddle
//! the acceptor's once-a-second check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_config::{Config, NamespaceConfig, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_runtime::memory::resident_anon_bytes;
use sluice_target::{Target, TargetHandle};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const WAVE_CONNECTIONS: u32 = 2000;
const CONNECT_BATCH: usize = 100;
/// What one idle connection may add to the resident set.
const PER_CONNECTION_BYTES_MAX: u64 = 16 * 1024;
/// Every this many connections of a wave, one closes late, with the tail.
const TAIL_EVERY: usize = 50;
/// What an explicit trim may still free once the target has had time to
/// trim after the tail: the tail's connections pin 140-370 KiB of pages
/// that are free once they close (measured with the wave's trim alone).
const UNTRIMMED_BYTES_MAX: u64 = 64 * 1024;

/// Raises the soft open-file limit to the hard one (each connection is two
/// descriptors here: the client's and the target's).
fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit on a valid, owned rlimit.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn start() -> TargetHandle {
    let n = WAVE_CONNECTIONS + 100;
    let c = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen(SocketAddr::from(([127, 0, 0, 1], 0)))
                .with_discovery_listen(None)
                .with_workers(2)
                .with_polling(PollingPolicy::Interrupt)
                .with_connections_max(n)
                .with_connections_per_source_max(n)
                .with_connections_handshaking_max(n)
                .with_connections_handshaking_per_source_max(n)
                .with_handshake_timeout_ms(120_000),
        )
        .with_subsystem(
            SubsystemConfig::new("nqn.2026-11.io.sluice:flood")
                .allow_any_host()
                .with_namespace(NamespaceConfig::ram(1, 1 << 20)),
        )
        .validated()
        .unwrap();
    Target::start(&c).unwrap()
}

fn rss() -> u64 {
    resident_anon_bytes().expect("RssAnon in /proc/self/status")
}

fn wait_open(t: &TargetHandle, open: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.connections().open != open && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(t.connections().open, open, "{:?}", t.connections());
}

/// Waits (up to 5 s: the acceptor checks once a second) for the resident
/// set to fall to `bound`; returns the last reading.
fn wait_rss_below(bound: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = rss();
        if r <= bound || Instant::now() >= deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kib(b: u64) -> u64 {
    b / 1024
}

#[test]
fn idle_connection_waves_cost_little_and_give_memory_back() {
    raise_nofile();
    let t = start();
    let addr = t.local_addr();
    // Let start-up allocations (threads, admin structures) settle.
    std::thread::sleep(Duration::from_millis(200));
    let base = rss();
    let mut first_growth = 0;
    for wave in 0..2 {
        let mut socks = Vec::new();
        // In batches the acceptor keeps up with (the listen backlog is 128:
        // a SYN it drops costs the client a one-second retransmit).
        while socks.len() < WAVE_CONNECTIONS as usize {
            for _ in 0..CONNECT_BATCH {
                socks.push(TcpStream::connect(addr).expect("connect"));
            }
            wait_open(&t, u32::try_from(socks.len()).unwrap());
        }
        assert_eq!(t.connections().handshaking, WAVE_CONNECTIONS);
        // The workers have taken every socket once the count is reached
        // only at the acceptor; give them a moment to set up the queues.
        std::thread::sleep(Duration::from_millis(300));
        let peak = rss();
        let growth = peak.saturating_sub(base);
        let per = growth / u64::from(WAVE_CONNECTIONS);
        let (tail, rest): (Vec<_>, Vec<_>) = socks
            .into_iter()
            .enumerate()
            .partition(|(i, _)| i % TAIL_EVERY == 0);
        let tail_len = u32::try_from(tail.len()).unwrap();
        drop(rest);
        wait_open(&t, tail_len);
        // The acceptor checks once a second: it trims for the wave first.
        std::thread::sleep(Duration::from_millis(1500));
        drop(tail);
        wait_open(&t, 0);
        let after = wait_rss_below(base + growth / 4);
        // Two more checks: the first after the tail trims for it.
        std::thread::sleep(Duration::from_millis(2200));
        let settled = rss();
        sluice_runtime::memory::release_free_memory();
        let trimmed = rss();
        eprintln!(
            "wave {wave}: base {} KiB, {} connections open {} KiB ({per} bytes each), all closed {} KiB, settled {} KiB, {} KiB after an explicit trim",
            kib(base),
            WAVE_CONNECTIONS,
            kib(peak),
            kib(after),
            kib(settled),
            kib(trimmed)
        );
        assert!(
            settled.saturating_sub(trimmed) <= UNTRIMMED_BYTES_MAX,
            "wave {wave}: an explicit trim freed {} KiB the target had kept after the wave's tail closed",
            kib(settled.saturating_sub(trimmed))
        );
        assert!(
            per < PER_CONNECTION_BYTES_MAX,
            "wave {wave}: {per} bytes per idle connection"
        );
        assert!(
            after <= base + growth / 4 + (512 << 10),
            "wave {wave}: resident {} KiB after close, {} KiB before the wave, {} KiB at its peak",
            kib(after),
            kib(base),
            kib(peak)
        );
        if wave == 0 {
            first_growth = growth;
        } else {
            assert!(
                growth <= first_growth * 2 + (1 << 20),
                "the second wave grew {} KiB, the first {} KiB: memory piles up",
                kib(growth),
                kib(first_growth)
            );
        }
    }
    t.shutdown();
}
