//! `sluice fuse` with CPU accounting: two FUSE mounts (fuser through
//! fusermount3), each a tenant with its own controller, host NQN,
//! accountant and runtime, as two `sluice fuse` processes would be. The
//! mount with a small `cpu_share` is throttled (events > 0, charged CPU near
//! its cap), the uncapped one is not; data written through one file reads
//! back through both (the same namespace).
//!
//! Needs `/dev/fuse` and `fusermount3` (or root); skipped, with a message,
//! when either is missing.
#![allow(clippy::unwrap_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_cpu::ThrottleParams;
use sluice_export::account::{CpuAccountant, ExportCounters};
use sluice_export::fuse::{FuseAccounting, FuseConfig, SluiceFs};
use sluice_export::ByteDevice;
use sluice_host::{ConnectOptions, Controller};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

const SUBNQN: &str = "nqn.2026-11.io.sluice:fuse-export";
const FILE: &str = "disk.img";
const SIZE_BYTES: u64 = 32 << 20;

fn fuse_available() -> bool {
    let in_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).exists()))
    };
    Path::new("/dev/fuse").exists() && (in_path("fusermount3") || in_path("fusermount"))
}

/// One mounted export, like one `sluice fuse` process. Dropping it unmounts.
struct Mounted {
    acct: Arc<CpuAccountant>,
    acct_thread: Option<std::thread::JoinHandle<()>>,
    session: Option<fuser::BackgroundSession>,
    ctrl: Controller,
    rt: tokio::runtime::Runtime,
    dir: PathBuf,
    /// Shared threads registered before / after mounting (the session
    /// thread registers when it serves FUSE_INIT).
    shared_threads: (usize, usize),
}

impl Mounted {
    fn start(addr: std::net::SocketAddr, name: &str, share: Option<f64>) -> Mounted {
        let acct = CpuAccountant::new();
        let a2 = acct.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || a2.register_current_thread())
            .build()
            .unwrap();
        let host = format!("nqn.2026-11.io.sluice:fuse-{name}");
        let ctrl = rt
            .block_on(Controller::connect(
                addr,
                SUBNQN,
                ConnectOptions {
                    hostnqn: host.clone(),
                    io_queues: 1,
                    ..Default::default()
                },
            ))
            .unwrap();
        let ns = ctrl.namespace(1).unwrap();
        let c2 = ctrl.clone();
        let export = acct.add_export(name, &host, share, Some(Box::new(move || c2.queue_tids())));
        let fs = SluiceFs::new(
            ByteDevice::new(ns),
            rt.handle().clone(),
            FuseConfig {
                file_name: FILE.into(),
                read_only: false,
                hostnqn: host,
            },
        )
        .with_accounting(FuseAccounting {
            accountant: acct.clone(),
            export,
        });
        let dir = std::env::temp_dir().join(format!("sluice-fuse-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let before = acct.shared_tids().len();
        let session = sluice_export::fuse::mount(fs, &dir).unwrap();
        let acct_thread = acct
            .spawn(Duration::from_millis(2), ThrottleParams::default())
            .unwrap();
        let mut m = Mounted {
            acct,
            acct_thread: Some(acct_thread),
            session: Some(session),
            ctrl,
            rt,
            dir,
            shared_threads: (before, 0),
        };
        let t0 = Instant::now();
        while std::fs::metadata(m.file()).map(|md| md.len()).ok() != Some(SIZE_BYTES) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{name}: mount did not appear"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m.shared_threads.1 = m.acct.shared_tids().len();
        m
    }

    fn counters(&self) -> ExportCounters {
        self.acct.exports()[0].counters()
    }

    fn file(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    fn open(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.file())
            .unwrap()
    }

    /// Stops the accountant (ends any throttle) and returns the counters.
    fn stop_accounting(&mut self) -> ExportCounters {
        self.acct.stop();
        if let Some(t) = self.acct_thread.take() {
            t.join().unwrap();
        }
        self.acct.exports()[0].counters()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.acct.stop();
        if let Some(t) = self.acct_thread.take() {
            let _ = t.join();
        }
        drop(self.session.take());
        self.rt
            .block_on(self.ctrl.disconnect(Duration::from_secs(2)));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn capped_fuse_export_is_throttled_uncapped_is_not_and_data_reads_back() {
    if !fuse_available() {
        eprintln!("skipped: needs /dev/fuse and fusermount3");
        return;
    }
    let target = common::ram_target(SUBNQN, 32 << 20);
    let addr = target.local_addr();
    const CAP: f64 = 0.05;
    let mut capped = Mounted::start(addr, "capped", Some(CAP));
    let mut free = Mounted::start(addr, "free", None);

    // Data: aligned and unaligned writes through the capped mount read back
    // through it and through the other mount (so they reached the target).
    let pattern: Vec<u8> = (0..(1u32 << 20) + 777)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let at = 24u64 << 20;
    let f = capped.open();
    f.write_all_at(&pattern[..1 << 20], at).unwrap();
    f.write_all_at(&pattern[1 << 20..], at + (1 << 20) + 1001)
        .unwrap();
    f.sync_all().unwrap();
    for (who, m) in [("capped", &capped), ("free", &free)] {
        let g = m.open();
        let mut back = vec![0u8; 1 << 20];
        g.read_exact_at(&mut back, at).unwrap();
        assert!(back == pattern[..1 << 20], "{who}: aligned 1 MiB differs");
        let mut back = vec![0u8; 777];
        g.read_exact_at(&mut back, at + (1 << 20) + 1001).unwrap();
        assert_eq!(
            back,
            pattern[1 << 20..],
            "{who}: unaligned 777 bytes differ"
        );
        let mut gap = vec![0xffu8; 1001];
        g.read_exact_at(&mut gap, at + (1 << 20)).unwrap();
        assert!(
            gap.iter().all(|b| *b == 0),
            "{who}: bytes between the writes"
        );
    }
    drop(f);

    // Load: one QD 1 128 KiB write+read client per mount, 3 s.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for (i, m) in [&capped, &free].into_iter().enumerate() {
        let f = m.open();
        let stop = stop.clone();
        clients.push(std::thread::spawn(move || {
            let data = vec![0x42u8 + i as u8; 128 * 1024];
            let mut back = vec![0u8; data.len()];
            let base = i as u64 * (8 << 20);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let off = base + (n % 64) * data.len() as u64;
                f.write_all_at(&data, off).unwrap();
                f.read_exact_at(&mut back, off).unwrap();
                assert!(back == data);
                n += 1;
            }
            n
        }));
    }
    let (cap0, free0) = (capped.counters(), free.counters());
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let loops: Vec<u64> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let shared = [capped.shared_threads, free.shared_threads];
    let unattributed = [capped.acct.unattributed(), free.acct.unattributed()];
    // Counters of the 3 s window (the data phase before it is left out).
    let delta = |c: ExportCounters, c0: &ExportCounters| ExportCounters {
        ios: c.ios - c0.ios,
        bytes: c.bytes - c0.bytes,
        cpu: c.cpu - c0.cpu,
        own_cpu: c.own_cpu - c0.own_cpu,
        throttle_events: c.throttle_events - c0.throttle_events,
        throttled: c.throttled - c0.throttled,
        ..c
    };
    let cap = delta(capped.stop_accounting(), &cap0);
    let fr = delta(free.stop_accounting(), &free0);
    println!(
        "{cap:?}\n{fr:?}\nloops {loops:?} shared threads {shared:?} unattributed {unattributed:?}"
    );
    println!("{}", capped.acct.prometheus());
    let cap_rate = cap.cpu.as_secs_f64() / elapsed;
    let free_rate = fr.cpu.as_secs_f64() / elapsed;
    println!(
        "capped: {cap_rate:.3} CPU (cap {CAP}), {} throttles, throttled {:.2} s of {elapsed:.2} s; free: {free_rate:.3} CPU, {} throttles; bytes {} vs {}",
        cap.throttle_events,
        cap.throttled.as_secs_f64(),
        fr.throttle_events,
        cap.bytes,
        fr.bytes
    );

    // The session thread registered when the mount came up.
    assert!(
        shared.iter().all(|(before, after)| after > before),
        "shared threads (before, after mount) {shared:?}"
    );
    assert!(cap.ios > 0 && fr.ios > 0);
    assert!(
        cap.own_cpu > Duration::ZERO,
        "queue threads charged: {cap:?}"
    );
    assert!(
        cap.throttle_events > 0,
        "capped export never throttled: {cap:?}"
    );
    assert!(cap.throttled > Duration::ZERO);
    assert_eq!(fr.throttle_events, 0, "uncapped export throttled: {fr:?}");
    // Charged CPU near the cap (generous: batch granularity and the request
    // in flight at each sub-throttle, on a loaded 2-vCPU machine).
    assert!(
        cap_rate <= CAP * 3.0,
        "capped export used {cap_rate:.3} CPU, cap {CAP}"
    );
    assert!(
        cap_rate >= CAP * 0.2,
        "capped export starved: {cap_rate:.3}"
    );
    assert!(
        free_rate > cap_rate * 2.0 && fr.bytes > cap.bytes * 2,
        "free {free_rate:.3} CPU {} B, capped {cap_rate:.3} CPU {} B",
        fr.bytes,
        cap.bytes
    );
    drop(capped);
    drop(free);
    drop(target);
}
