//! A shared exporter: one NBD server with two exports (two tenants: own
//! controller and host NQN each), per-export CPU accounting, and i-NVMe
//! throttling of the export whose CPU share is small.
#![allow(clippy::unwrap_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_cpu::ThrottleParams;
use sluice_export::account::CpuAccountant;
use sluice_export::nbd::proto::*;
use sluice_export::nbd::server::{ExportEntry, UnixSocketPath};
use sluice_export::nbd::{NbdConfig, NbdServer};
use sluice_export::ByteDevice;
use sluice_host::{ConnectOptions, Controller};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SUBNQN: &str = "nqn.2026-11.io.sluice:shared-exporter";

mod common;
use common::Client;

#[test]
fn capped_export_is_throttled_the_other_is_not_on_tasks() {
    capped_export_is_throttled_the_other_is_not(0);
}

/// The same with each connection on its own run-to-completion thread and
/// queue: the thread's CPU is the export's own, and a throttled export's
/// thread stops reading its client.
#[test]
fn capped_export_is_throttled_the_other_is_not_run_to_completion() {
    capped_export_is_throttled_the_other_is_not(1);
}

fn capped_export_is_throttled_the_other_is_not(direct_queues: u16) {
    let target = common::ram_target(SUBNQN, 16 << 20);
    let addr = target.local_addr();
    let dir = std::env::temp_dir().join(format!(
        "sluice-shared-exp-{}-{direct_queues}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("nbd.sock");

    let acct = CpuAccountant::new();
    let a2 = acct.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || a2.register_current_thread())
        .build()
        .unwrap();
    const CAP: f64 = 0.05;
    let (server, ctrls) = rt.block_on(async {
        let mut entries = Vec::new();
        let mut ctrls = Vec::new();
        for (name, host, share) in [
            ("capped", "nqn.2026-11.io.sluice:tenant-capped", Some(CAP)),
            ("free", "nqn.2026-11.io.sluice:tenant-free", None),
        ] {
            let opts = ConnectOptions {
                hostnqn: host.into(),
                io_queues: 1,
                direct_queues,
                ..Default::default()
            };
            let c = Controller::connect(addr, SUBNQN, opts).await.unwrap();
            let ns = c.namespace(1).unwrap();
            let c2 = c.clone();
            let account =
                acct.add_export(name, host, share, Some(Box::new(move || c2.queue_tids())));
            entries.push(ExportEntry {
                dev: ByteDevice::new(ns),
                cfg: NbdConfig {
                    export_name: name.into(),
                    description: String::new(),
                    read_only: false,
                    hostnqn: host.into(),
                },
                account: Some(account),
            });
            ctrls.push(c);
        }
        (NbdServer::with_exports(entries), ctrls)
    });
    let acct_thread = acct
        .spawn(Duration::from_millis(2), ThrottleParams::default())
        .unwrap();
    let (l, _guard) = rt.block_on(async { UnixSocketPath::bind(&sock) }).unwrap();
    let srv = rt.spawn(server.clone().serve_unix(l));

    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for name in ["capped", "free"] {
        let sock = sock.clone();
        let stop = stop.clone();
        clients.push(std::thread::spawn(move || {
            let mut c = Client::connect(&sock, name);
            assert_eq!(c.size, 16 << 20, "export {name}: size from NBD_INFO_EXPORT");
            assert_ne!(c.flags, 0);
            let data = vec![0x42u8; 128 * 1024];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let off = (n % 64) * data.len() as u64;
                let (e, _) = c.call(CMD_WRITE, 0, off, data.len() as u32, &data);
                assert_eq!(e, 0);
                let (e, d) = c.call(CMD_READ, 0, off, data.len() as u32, &[]);
                assert_eq!((e, d.len()), (0, data.len()));
                n += 1;
            }
            c.send(CMD_DISC, 0, 1, 0, 0, &[]);
            n
        }));
    }
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let counts: Vec<u64> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    acct.stop();
    acct_thread.join().unwrap();
    let ex = acct.exports();
    let (cap, free) = (ex[0].counters(), ex[1].counters());
    println!(
        "{cap:?}\n{free:?}\nunattributed {:?}\nloops {counts:?}",
        acct.unattributed()
    );
    println!("{}", acct.prometheus());
    let cap_rate = cap.cpu.as_secs_f64() / elapsed;
    let free_rate = free.cpu.as_secs_f64() / elapsed;
    assert!(cap.ios > 0 && free.ios > 0);
    assert!(
        cap.throttle_events > 0,
        "capped export never throttled: {cap:?}"
    );
    assert!(cap.throttled > Duration::ZERO);
    assert_eq!(
        free.throttle_events, 0,
        "uncapped export throttled: {free:?}"
    );
    // Its charged CPU stays near its cap (generous: overshoot of one 2 ms
    // batch per sub-throttle on a loaded 2-vCPU machine).
    assert!(
        cap_rate <= CAP * 3.0,
        "capped export used {cap_rate:.3} CPU, cap {CAP}"
    );
    assert!(
        cap_rate >= CAP * 0.2,
        "capped export starved: {cap_rate:.3}"
    );
    // The uncapped one is not held back.
    assert!(
        free_rate > cap_rate * 2.0 && free.bytes > cap.bytes * 2,
        "free {free_rate:.3} CPU {} B, capped {cap_rate:.3} CPU {} B",
        free.bytes,
        cap.bytes
    );
    // Each export's one connection, on the path asked for.
    let paths =
        |c: &sluice_export::account::ExportCounters| (c.direct_connections, c.task_connections);
    let want = if direct_queues > 0 { (1, 0) } else { (0, 1) };
    assert_eq!((paths(&cap), paths(&free)), (want, want));
    // And on /metrics.
    let line = format!(
        "sluice_export_nbd_direct_connections_total{{export=\"free\",hostnqn=\"nqn.2026-11.io.sluice:tenant-free\"}} {}.0",
        want.0
    );
    assert!(acct.prometheus().contains(&line), "no `{line}`");
    srv.abort();
    rt.block_on(async {
        for c in ctrls {
            c.disconnect(Duration::from_secs(2)).await;
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    drop(target);
}
