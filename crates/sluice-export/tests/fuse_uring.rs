//! The FUSE session of our own (`sluice fuse --transport uring`): over the
//! kernel's FUSE-over-io_uring when it offers it (the test turns the `fuse`
//! module's `enable_uring` on when it may), and over `/dev/fuse` when asked
//! not to use io_uring; on an in-memory device, and on a Sluice target's
//! namespace, where the ring thread runs aligned I/O on an NVMe/TCP queue
//! of its own. Every way serves the same file: concurrent direct I/O from
//! several threads reads back, sizes and errors are the file's (ENOSPC
//! past the end, EPERM on truncate), and punching a hole zeroes it.
//!
//! Needs root and `/dev/fuse` (it mounts with mount(2)); skipped, with a
//! message, without them.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use sluice_export::account::CpuAccountant;
use sluice_export::fuse::uring::{self, Transport};
use sluice_export::fuse::{FuseAccounting, FuseConfig};
use sluice_export::{BlockDevice, ByteDevice, MemDevice};
use sluice_host::{ConnectOptions, Controller};
use std::sync::Arc;

mod common;

const SUBNQN: &str = "nqn.2026-11.io.sluice:fuse-uring";
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

const BLOCK: u32 = 4096;
const BLOCKS: u64 = 4096; // 16 MiB

fn can_mount() -> bool {
    Path::new("/dev/fuse").exists() && rustix::process::geteuid().is_root()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    sluice_testdata::pattern(len, seed)
}

fn config() -> FuseConfig {
    FuseConfig {
        file_name: "disk.img".into(),
        read_only: false,
        hostnqn: "nqn.2026-11.io.sluice:test".into(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Aborts the mount's FUSE connection if the checks have not finished in
/// a minute, so that a session that stopped serving fails the test
/// instead of leaving it blocked in the kernel for good.
struct Watchdog {
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl Watchdog {
    fn arm(mountpoint: &Path) -> Watchdog {
        use std::os::unix::fs::MetadataExt;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The connection's number is the minor of the mount's device.
        let minor = libc::minor(std::fs::metadata(mountpoint).unwrap().dev());
        let d = done.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while std::time::Instant::now() < deadline {
                if d.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let ctl = Path::new("/sys/fs/fuse/connections");
            if !ctl.join(minor.to_string()).exists() {
                let _ = std::process::Command::new("mount")
                    .args(["-t", "fusectl", "none", "/sys/fs/fuse/connections"])
                    .status();
            }
            eprintln!("the FUSE session stopped serving: aborting connection {minor}");
            let _ = std::fs::write(ctl.join(minor.to_string()).join("abort"), "1");
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
    }
}

fn mem_device() -> Arc<ByteDevice<MemDevice>> {
    ByteDevice::new(MemDevice::new(BLOCK, BLOCKS))
}

/// Mounts, runs the checks, unmounts; returns the transport it got and
/// the I/Os run on the ring's own NVMe/TCP queue.
fn mount_and_check<D: BlockDevice>(
    rt: &tokio::runtime::Runtime,
    dev: Arc<ByteDevice<D>>,
    want_uring: bool,
) -> (Transport, u64) {
    mount_and_check_accounted(rt, dev, want_uring, None)
}

/// As [`mount_and_check`], the session accounted to an export of `acct`
/// when given: its request counts must then be the export's, on
/// `/metrics`.
fn mount_and_check_accounted<D: BlockDevice>(
    rt: &tokio::runtime::Runtime,
    dev: Arc<ByteDevice<D>>,
    want_uring: bool,
    acct: Option<&Arc<CpuAccountant>>,
) -> (Transport, u64) {
    let dir = tempfile::tempdir().unwrap();
    let accounting = acct.map(|a| FuseAccounting {
        accountant: a.clone(),
        export: a.add_export("disk.img", "nqn.test:fuse-uring", None, None),
    });
    let session = uring::mount(
        dev,
        rt.handle().clone(),
        &config(),
        accounting,
        dir.path(),
        want_uring,
    )
    .unwrap();
    let transport = session.transport();
    let _watchdog = Watchdog::arm(dir.path());
    let path = dir.path().join("disk.img");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), u64::from(BLOCK) * BLOCKS);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["disk.img".to_owned()]);

    // Four threads of direct I/O at once, 4 KiB to 256 KiB, each in its
    // own 4 MiB quarter; then every write reads back.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .unwrap();
                let base = t * (4 << 20);
                let mut written = Vec::new();
                let mut at = 0u64;
                for (i, len) in [4096usize, 65536, 131072, 8192, 262144, 4096]
                    .iter()
                    .enumerate()
                {
                    let data = pattern(t * 100 + i as u64, *len);
                    f.write_all_at(&data, base + at).unwrap();
                    written.push((base + at, data));
                    at += *len as u64;
                }
                for (off, data) in written {
                    let mut got = vec![0u8; data.len()];
                    f.read_exact_at(&mut got, off).unwrap();
                    assert!(got == data, "thread {t}: data at {off} reads back");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }

    // Unaligned bytes through the page-cache-less file.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all_at(b"sluice", 5000).unwrap();
    let mut got = [0u8; 6];
    f.read_exact_at(&mut got, 5000).unwrap();
    assert_eq!(&got, b"sluice");
    // The size is the namespace's.
    let end = u64::from(BLOCK) * BLOCKS;
    let e = f.write_at(b"x", end).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let e = f.set_len(end / 2).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    // A punched hole reads as zeroes.
    let r = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            8192,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let mut got = vec![1u8; 8192];
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got.iter().all(|&b| b == 0));
    f.sync_all().unwrap();
    drop(f);
    let (ring, dev_fuse) = session.requests();
    let direct = session.direct_ios();
    let in_place = session.reads_in_place();
    eprintln!("{transport:?}: {ring} requests over the ring, {dev_fuse} over /dev/fuse; {direct} I/Os on its own queue, {in_place} reads in place");
    if let Some(a) = acct {
        // The same counters (read between two reads of the session's, as
        // a late request may still arrive).
        let text = a.prometheus();
        let (ring_after, dev_after) = session.requests();
        let direct_after = session.direct_ios();
        let in_place_after = session.reads_in_place();
        let value = |family: &str| -> u64 {
            let key = format!("{family}{{export=\"disk.img\",hostnqn=\"nqn.test:fuse-uring\"}} ");
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix(key.as_str()))
                .unwrap_or_else(|| panic!("{key} not in\n{text}"));
            line.trim().trim_end_matches(".0").parse::<u64>().unwrap()
        };
        for (family, lo, hi) in [
            ("sluice_export_fuse_ring_requests_total", ring, ring_after),
            ("sluice_export_fuse_dev_requests_total", dev_fuse, dev_after),
            ("sluice_export_fuse_direct_ios_total", direct, direct_after),
            (
                "sluice_export_fuse_reads_in_place_total",
                in_place,
                in_place_after,
            ),
        ] {
            let v = value(family);
            assert!(
                (lo..=hi).contains(&v),
                "{family} {v}, the session counted {lo}..={hi}"
            );
        }
    }
    // The aligned reads on the ring's own queue land in the ring's reply
    // buffers (their data was checked above).
    assert!(in_place <= direct, "{in_place} of {direct}");
    if direct > 0 {
        assert!(
            in_place >= 10,
            "{in_place} reads in place of {direct} direct I/Os"
        );
    }
    match transport {
        // A few may come before the ring is ready; the I/O goes over it.
        Transport::IoUring { .. } => assert!(ring > 50 && ring > dev_fuse, "{ring} / {dev_fuse}"),
        Transport::DevFuse => assert!(ring == 0 && dev_fuse > 50, "{ring} / {dev_fuse}"),
    }
    drop(session);
    // Unmounted: the directory is empty again.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    (transport, direct)
}

#[test]
fn the_own_session_serves_the_file_over_io_uring_and_over_dev_fuse() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    // Turn io_uring on where the kernel has the switch (root may).
    let _ = std::fs::write("/sys/module/fuse/parameters/enable_uring", "Y");
    let rt = runtime();
    let (t, direct) = mount_and_check(&rt, mem_device(), true);
    assert_eq!(direct, 0, "a memory device has no NVMe/TCP queue");
    if uring::kernel_offers_uring() {
        assert!(
            matches!(t, Transport::IoUring { queues } if queues >= 1),
            "{t:?}"
        );
    } else {
        eprintln!("this kernel offers no FUSE-over-io_uring: checked the /dev/fuse fallback only");
        assert_eq!(t, Transport::DevFuse);
    }
    assert_eq!(
        mount_and_check(&rt, mem_device(), false).0,
        Transport::DevFuse
    );

    // A namespace of a Sluice target: aligned I/O runs on the ring's own
    // queue (the controller grants it one more queue ID), the rest (the
    // unaligned bytes, the punched hole) on the task path.
    let target = common::ram_target(SUBNQN, u64::from(BLOCK) * BLOCKS);
    let ctrl = rt
        .block_on(Controller::connect(
            target.local_addr(),
            SUBNQN,
            ConnectOptions {
                io_queues: 1,
                direct_queues: 1,
                ..Default::default()
            },
        ))
        .unwrap();
    let ns = ctrl.namespace(1).unwrap();
    // Accounted as `sluice fuse` accounts it: the counts are on /metrics.
    let acct = CpuAccountant::new();
    let (t, direct) = mount_and_check_accounted(&rt, ByteDevice::new(ns), true, Some(&acct));
    if uring::kernel_offers_uring() {
        assert!(matches!(t, Transport::IoUring { .. }), "{t:?}");
        assert!(direct >= 40, "{direct} I/Os on the ring's own queue");
    }
    rt.block_on(ctrl.disconnect(std::time::Duration::from_secs(5)));
}

/// The target goes away under the io_uring mount and comes back on the
/// same address and file: data acknowledged before reads back, new writes
/// work, and the ring gets a new NVMe/TCP queue of its own once the
/// controller has reconnected (its direct I/O count grows again).
#[test]
fn the_ring_gets_a_new_queue_after_the_target_restarts() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let _ = std::fs::write("/sys/module/fuse/parameters/enable_uring", "Y");
    if !uring::kernel_offers_uring() {
        eprintln!("skipped: this kernel offers no FUSE-over-io_uring");
        return;
    }
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("ns.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(u64::from(BLOCK) * BLOCKS)
        .unwrap();
    let t1 = common::file_target(SUBNQN, &img, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = t1.local_addr();
    let mut opts = ConnectOptions {
        io_queues: 1,
        direct_queues: 1,
        ..Default::default()
    };
    // As `sluice fuse` connects: I/O that meets a lost connection is
    // retried once after the reconnect.
    opts.reconnect.retry_io = true;
    let ctrl = rt
        .block_on(Controller::connect(addr, SUBNQN, opts))
        .unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let session = uring::mount(
        ByteDevice::new(ctrl.namespace(1).unwrap()),
        rt.handle().clone(),
        &config(),
        None,
        &mnt,
        true,
    )
    .unwrap();
    let _watchdog = Watchdog::arm(&mnt);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("disk.img"))
        .unwrap();
    // FUSE direct I/O takes any buffer alignment.
    let before = pattern(3, 65536);
    f.write_all_at(&before, 1 << 20).unwrap();
    f.sync_all().unwrap();
    let direct_before = session.direct_ios();
    assert!(direct_before >= 2, "{direct_before}");

    t1.shutdown();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let _t2 = loop {
        if let Some(t) = common::file_target(SUBNQN, &img, addr) {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "{addr} stays taken");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // Reads of what was acknowledged before; the first may meet the dead
    // queue and go to the task path, which reconnects.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut direct_after = 0;
    let mut round = 0u64;
    while std::time::Instant::now() < deadline {
        let mut got = vec![0u8; 65536];
        f.read_exact_at(&mut got, 1 << 20).unwrap();
        assert!(got == before, "data acknowledged before the restart");
        let after = pattern(100 + round, 65536);
        f.write_all_at(&after, 2 << 20).unwrap();
        f.read_exact_at(&mut got, 2 << 20).unwrap();
        assert!(got == after, "a write after the restart reads back");
        direct_after = session.direct_ios();
        if session.direct_queues_replaced() > 0 && direct_after > direct_before + 2 {
            break;
        }
        round += 1;
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        session.direct_queues_replaced() == 1 && direct_after > direct_before + 2,
        "the ring never got a new direct queue: {} replaced, {direct_before} -> {direct_after} direct I/Os",
        session.direct_queues_replaced()
    );
    eprintln!("after the restart: {round} rounds until the ring's new queue carried I/O");
    drop(f);
    drop(session);
    rt.block_on(ctrl.disconnect(std::time::Duration::from_secs(5)));
}

/// A mountpoint that does not exist: a clear error naming it, no panic,
/// nothing left mounted.
#[test]
fn a_missing_mountpoint_is_an_error_naming_it() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let e = uring::mount(
        mem_device(),
        rt.handle().clone(),
        &config(),
        None,
        &missing,
        true,
    )
    .expect_err("mounting on a missing directory");
    let msg = e.to_string();
    assert!(
        msg.contains("no-such-dir") && msg.contains("mount(2)"),
        "{msg}"
    );
}

/// The exported file grows with its namespace: a reload of the target
/// grows the file namespace, the host library sees the Namespace Attribute
/// Changed event, and the mounted file's size follows (at the next
/// attribute lookup, within the 1 s the kernel caches them); writes past
/// the old end, which failed with ENOSPC, land and read back, on the
/// ring's own NVMe/TCP queue and through the page cache, and the data
/// below stays.
#[test]
fn the_file_grows_with_its_namespace() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let _ = std::fs::write("/sys/module/fuse/parameters/enable_uring", "Y");
    let img = tempfile::NamedTempFile::new().unwrap();
    let small = 4u64 << 20;
    let ns = |bytes: u64| {
        sluice_config::NamespaceConfig::file(1, img.path())
            .with_create(true)
            .with_block_size(BLOCK)
            .with_size(bytes)
    };
    let cfg = common::one_namespace_config(SUBNQN, "127.0.0.1:0".parse().unwrap(), ns(small));
    let target = sluice_target::Target::start(&cfg).unwrap();
    let rt = runtime();
    let ctrl = rt
        .block_on(Controller::connect(
            target.local_addr(),
            SUBNQN,
            ConnectOptions {
                io_queues: 1,
                direct_queues: 1,
                ..Default::default()
            },
        ))
        .unwrap();
    let dev = ByteDevice::new(ctrl.namespace(1).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let session =
        uring::mount(dev, rt.handle().clone(), &config(), None, dir.path(), true).unwrap();
    let _watchdog = Watchdog::arm(dir.path());
    let path = dir.path().join("disk.img");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), small);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let low = pattern(1, 65536);
    f.write_all_at(&low, 0).unwrap();
    let high = pattern(2, 65536);
    let e = f.write_at(&high, small).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");

    let mut grown = cfg.clone();
    grown.subsystems[0].namespaces[0] = ns(2 * small);
    let report = target.reload(&grown).unwrap();
    assert_eq!(report.namespaces_grown.len(), 1, "{report:?}");
    let t0 = std::time::Instant::now();
    while std::fs::metadata(&path).unwrap().len() != 2 * small {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the file is still {} bytes",
            std::fs::metadata(&path).unwrap().len()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let direct_before = session.direct_ios();
    f.write_all_at(&high, small).unwrap();
    let mut got = vec![0u8; high.len()];
    f.read_exact_at(&mut got, small).unwrap();
    assert!(got == high, "the new blocks read back");
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got == low, "the old blocks keep their data");
    if matches!(session.transport(), Transport::IoUring { .. }) {
        assert!(
            session.direct_ios() >= direct_before + 2,
            "the grown range went over the ring's own queue"
        );
    }
    // Unaligned, through the page cache, at the new end.
    let buffered = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    buffered.write_all_at(b"grown", 2 * small - 5).unwrap();
    let mut tail = [0u8; 5];
    buffered.read_exact_at(&mut tail, 2 * small - 5).unwrap();
    assert_eq!(&tail, b"grown");
    let e = buffered.write_at(b"x", 2 * small).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop((f, buffered));
    drop(session);
    rt.block_on(ctrl.disconnect(std::time::Duration::from_secs(5)));
    target.shutdown();
}
