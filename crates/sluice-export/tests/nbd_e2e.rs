//! End to end: a Sluice target with a RAM namespace, sluice-host, the NBD
//! server on a temporary Unix socket, and a minimal blocking NBD client.
#![allow(clippy::unwrap_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_export::account::ExportAccount;
use sluice_export::errno::{EINVAL, ENOSPC};
use sluice_export::nbd::proto::*;
use sluice_export::nbd::server::{ExportEntry, UnixSocketPath};
use sluice_export::nbd::{NbdConfig, NbdServer};
use sluice_export::ByteDevice;
use sluice_host::{ConnectOptions, Controller};
use std::io::{Read, Write};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

const SUBNQN: &str = "nqn.2026-11.io.sluice:nbd-e2e";
const SIZE_BYTES: u64 = 16 << 20;

mod common;
use common::Client;

/// Never repeats within an export (a byte function of the offset alone
/// repeats every 256 bytes, and a read from the wrong block would match).
fn pattern(seed: u8, n: usize) -> Vec<u8> {
    sluice_testdata::pattern(n, u64::from(seed))
}

/// A RAM target, a controller with `io_queues` + `direct_queues` I/O
/// queues, and an NBD server of its namespace (export "disk") on a Unix
/// socket in a directory of its own.
struct Served {
    target: sluice_target::TargetHandle,
    dir: std::path::PathBuf,
    sock: std::path::PathBuf,
    rt: tokio::runtime::Runtime,
    ctrl: Controller,
    account: std::sync::Arc<ExportAccount>,
    _guard: UnixSocketPath,
}

fn serve(tag: &str, io_queues: u16, direct_queues: u16) -> Served {
    let target = common::ram_target(SUBNQN, SIZE_BYTES);
    let dir = std::env::temp_dir().join(format!("sluice-nbd-{tag}-{}", std::process::id()));
    let e = export(&dir, target.local_addr(), io_queues, direct_queues);
    Served {
        target,
        dir,
        sock: e.sock,
        rt: e.rt,
        ctrl: e.ctrl,
        account: e.account,
        _guard: e.guard,
    }
}

/// An NBD server (export "disk", on `dir`/nbd.sock) of namespace 1 of the
/// target at `addr`, through a controller with `io_queues` +
/// `direct_queues` I/O queues.
struct Exported {
    sock: std::path::PathBuf,
    rt: tokio::runtime::Runtime,
    ctrl: Controller,
    account: std::sync::Arc<ExportAccount>,
    guard: UnixSocketPath,
}

fn export(
    dir: &std::path::Path,
    addr: std::net::SocketAddr,
    io_queues: u16,
    direct_queues: u16,
) -> Exported {
    std::fs::create_dir_all(dir).unwrap();
    let sock = dir.join("nbd.sock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let account = ExportAccount::new("disk", "test", None, std::time::Instant::now(), None);
    let (ctrl, guard) = rt.block_on(async {
        let mut opts = ConnectOptions {
            io_queues,
            direct_queues,
            ..ConnectOptions::default()
        };
        // As `sluice nbd` connects: a command that meets a lost connection
        // is retried once after the reconnect.
        opts.reconnect.retry_io = true;
        let ctrl = Controller::connect(addr, SUBNQN, opts).await.unwrap();
        let server = NbdServer::with_exports(vec![ExportEntry {
            dev: ByteDevice::new(ctrl.namespace(1).unwrap()),
            cfg: NbdConfig {
                export_name: "disk".into(),
                description: "e2e".into(),
                read_only: false,
                hostnqn: "test".into(),
            },
            account: Some(account.clone()),
        }]);
        let (l, guard) = UnixSocketPath::bind(&sock).unwrap();
        tokio::spawn(server.serve_unix(l));
        (ctrl, guard)
    });
    Exported {
        sock,
        rt,
        ctrl,
        account,
        guard,
    }
}

/// The target goes away under a connection served run-to-completion and
/// comes back on the same address and file. The connection's queue is
/// dead: its requests go to the task path, whose controller reconnects,
/// and read the data acknowledged before; writes and flushes carry on;
/// then the connection gets a new direct queue and runs on it again.
#[test]
fn direct_queue_failure_falls_back_to_tasks_and_loses_nothing() {
    let dir = std::env::temp_dir().join(format!("sluice-nbd-fallback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("ns.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(SIZE_BYTES)
        .unwrap();
    let t1 =
        common::file_target(SUBNQN, &img, "127.0.0.1:0".parse().unwrap()).expect("target starts");
    let addr = t1.local_addr();
    // Two direct queue IDs: one replaces the failed queue, one is for the
    // new connection at the end.
    let e = export(&dir, addr, 1, 2);
    let mut c = Client::connect(&e.sock, "disk");
    let before = pattern(3, 65536);
    assert_eq!(
        c.call(CMD_WRITE, CMD_FLAG_FUA, 1 << 20, 65536, &before).0,
        0
    );
    assert!(c.call(CMD_READ, 0, 1 << 20, 65536, &[]) == (0, before.clone()));
    let k0 = e.account.counters();
    assert_eq!(k0.direct_connections, 1);
    assert_eq!(k0.handed_off_requests, 0, "{k0:?}");

    t1.shutdown();
    // The same address again (the listener sets SO_REUSEADDR).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let t2 = loop {
        if let Some(t) = common::file_target(SUBNQN, &img, addr) {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "{addr} stays taken");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Acknowledged before the failure, read after it.
    let read = |c: &mut Client, at: u64| {
        let (errno, d) = c.call(CMD_READ, 0, at, 65536, &[]);
        assert_eq!(errno, 0, "read at {at} after the target came back");
        d
    };
    assert!(
        read(&mut c, 1 << 20) == before,
        "data acknowledged before the failure differs"
    );
    let after = pattern(9, 65536);
    assert_eq!(c.call(CMD_WRITE, 0, 2 << 20, 65536, &after).0, 0);
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).0, 0);
    assert!(
        read(&mut c, 2 << 20) == after,
        "a write after the failure reads back wrong"
    );
    assert!(read(&mut c, 1 << 20) == before);
    let k1 = e.account.counters();
    assert!(
        k1.handed_off_requests >= 1,
        "the request that met the dead queue went to a task: {k1:?}"
    );
    // The connection gets a new direct queue and runs on it again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let k1 = loop {
        assert!(read(&mut c, 2 << 20) == after);
        let k = e.account.counters();
        if k.direct_queues_replaced == 1 && k.direct_requests >= k0.direct_requests + 3 {
            break k;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the connection never got a new direct queue: {k:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // A new connection gets a direct queue of the new association.
    let mut c2 = Client::connect(&e.sock, "disk");
    let third = pattern(11, 65536);
    assert_eq!(c2.call(CMD_WRITE, 0, 3 << 20, 65536, &third).0, 0);
    assert!(c2.call(CMD_READ, 0, 3 << 20, 65536, &[]) == (0, third));
    assert!(c2.call(CMD_READ, 0, 1 << 20, 65536, &[]).1 == before);
    let k2 = e.account.counters();
    assert_eq!(k2.direct_connections, 2, "{k2:?}");
    assert!(k2.direct_requests >= k1.direct_requests + 3, "{k2:?}");
    drop(c2);
    drop(c);
    e.rt.block_on(e.ctrl.disconnect(Duration::from_secs(2)));
    drop(e);
    t2.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nbd_over_sluice_target_on_tasks() {
    nbd_over_sluice_target(0);
}

#[test]
fn nbd_over_sluice_target_run_to_completion() {
    // One queue per connection, so none waits for another's to come back.
    nbd_over_sluice_target(3);
}

/// The whole protocol through one export whose controller has
/// `direct_queues` run-to-completion queues (0: every connection on tasks).
fn nbd_over_sluice_target(direct_queues: u16) {
    let Served {
        target,
        dir,
        sock,
        rt,
        ctrl,
        account,
        _guard,
    } = serve(&format!("e2e-{direct_queues}"), 2, direct_queues);

    let mut c = Client::connect(&sock, "disk");
    assert_eq!(c.size, SIZE_BYTES);
    for f in [
        TFLAG_SEND_FLUSH,
        TFLAG_SEND_FUA,
        TFLAG_SEND_TRIM,
        TFLAG_SEND_WRITE_ZEROES,
        TFLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(c.flags & f, 0, "flag {f:#x}");
    }
    assert_eq!(c.flags & TFLAG_READ_ONLY, 0);

    // Aligned write (FUA) and read back, larger than one NVMe command.
    let big = pattern(1, 3 << 20);
    assert_eq!(
        c.call(CMD_WRITE, CMD_FLAG_FUA, 1 << 20, big.len() as u32, &big)
            .0,
        0
    );
    let (e, d) = c.call(CMD_READ, 0, 1 << 20, big.len() as u32, &[]);
    assert_eq!(e, 0);
    assert!(d == big, "read back differs");
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).0, 0);

    // Unaligned write inside and across blocks; neighbours intact.
    let small = pattern(9, 700);
    assert_eq!(c.call(CMD_WRITE, 0, (1 << 20) + 100, 700, &small).0, 0);
    let (_, d) = c.call(CMD_READ, 0, 1 << 20, 2048, &[]);
    assert_eq!(&d[..100], &big[..100]);
    assert_eq!(&d[100..800], &small[..]);
    assert_eq!(&d[800..], &big[800..2048]);

    // Write zeroes (unaligned edges) and trim.
    assert_eq!(
        c.call(CMD_WRITE_ZEROES, CMD_FLAG_FUA, (1 << 20) + 10, 5000, &[])
            .0,
        0
    );
    let (_, d) = c.call(CMD_READ, 0, 1 << 20, 6000, &[]);
    assert_eq!(&d[..10], &big[..10]);
    assert!(d[10..5010].iter().all(|&b| b == 0));
    assert_eq!(&d[5010..], &big[5010..6000]);
    assert_eq!(c.call(CMD_TRIM, 0, 2 << 20, 1 << 20, &[]).0, 0);
    // TRIM reached the namespace as a Deallocate (a RAM namespace reads
    // deallocated blocks as zeros); the blocks around it keep their data.
    let (e, d) = c.call(CMD_READ, 0, (2 << 20) - 4096, (1 << 20) + 8192, &[]);
    assert_eq!(e, 0);
    let at = (1 << 20) - 4096;
    assert!(d[..4096] == big[at..at + 4096], "the block before the trim");
    assert!(d[4096..4096 + (1 << 20)].iter().all(|&b| b == 0), "trimmed");
    let at = (2 << 20) as usize;
    assert!(
        d[4096 + (1 << 20)..] == big[at..at + 4096],
        "the block after the trim"
    );

    // Errors: out of range, bad flags, unknown command; connection lives on.
    assert_eq!(
        c.call(CMD_WRITE, 0, SIZE_BYTES - 10, 20, &[0; 20]).0,
        ENOSPC
    );
    assert_eq!(c.call(CMD_READ, 0, SIZE_BYTES, 1, &[]).0, EINVAL);
    assert_eq!(c.call(CMD_READ, 1 << 7, 0, 512, &[]).0, EINVAL);
    assert_eq!(c.call(99, 0, 0, 512, &[]).0, EINVAL);
    assert_eq!(c.call(CMD_READ, 0, 0, REQUEST_BYTES_MAX + 1, &[]).0, EINVAL);

    // Pipelined: 32 writes then 32 reads in flight, replies in any order.
    for i in 0..32u64 {
        let d = pattern(i as u8, 4096 + i as usize * 3);
        c.send(
            CMD_WRITE,
            0,
            1000 + i,
            (8 << 20) + i * 8192 + i,
            d.len() as u32,
            &d,
        );
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..32 {
        let (cookie, e, _) = c.reply(|_| 0);
        assert_eq!(e, 0);
        assert!(seen.insert(cookie));
    }
    for i in 0..32u64 {
        c.send(
            CMD_READ,
            0,
            2000 + i,
            (8 << 20) + i * 8192 + i,
            4096 + i as u32 * 3,
            &[],
        );
    }
    for _ in 0..32 {
        let (cookie, e, d) = c.reply(|ck| 4096 + (ck - 2000) as usize * 3);
        assert_eq!(e, 0);
        let i = cookie - 2000;
        assert!(
            d == pattern(i as u8, 4096 + i as usize * 3),
            "cookie {cookie}"
        );
    }

    // Pipelined aligned I/O (the run-to-completion path's own): 64 writes
    // of 4-64 KiB in flight, then 64 reads, then a flush among reads.
    let at = |i: u64| (10 << 20) + i * (64 << 10);
    let len = |i: u64| 4096 * (1 + (i % 16) as u32);
    for i in 0..64u64 {
        let d = pattern(100 + i as u8, len(i) as usize);
        c.send(CMD_WRITE, 0, 3000 + i, at(i), len(i), &d);
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        let (cookie, e, _) = c.reply(|_| 0);
        assert_eq!(e, 0, "write {cookie}");
        assert!(seen.insert(cookie));
    }
    for i in 0..64u64 {
        c.send(CMD_READ, 0, 4000 + i, at(i), len(i), &[]);
        if i == 32 {
            c.send(CMD_FLUSH, 0, 4999, 0, 0, &[]);
        }
    }
    for _ in 0..65 {
        let (cookie, e, d) = c.reply(|ck| {
            if ck == 4999 {
                0
            } else {
                len(ck - 4000) as usize
            }
        });
        assert_eq!(e, 0, "cookie {cookie}");
        if cookie != 4999 {
            let i = cookie - 4000;
            assert!(
                d == pattern(100 + i as u8, len(i) as usize),
                "cookie {cookie}"
            );
        }
    }

    // A second connection sees the first one's data (multi-conn).
    let mut c2 = Client::connect(&sock, "");
    let (_, d) = c2.call(CMD_READ, 0, (8 << 20) + 8193, 4099, &[]);
    assert!(d == pattern(1, 4099), "second connection reads other data");

    // Bad magic closes the connection.
    c2.s.write_all(&[0u8; 28]).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(c2.s.read(&mut b).unwrap(), 0);

    // A write announcing more than the request limit: EINVAL for it, then
    // the server closes rather than read the payload.
    let mut c3 = Client::connect(&sock, "disk");
    c3.send(CMD_WRITE, 0, 77, 0, REQUEST_BYTES_MAX + 1, &[]);
    let (cookie, e, _) = c3.reply(|_| 0);
    assert_eq!((cookie, e), (77, EINVAL));
    assert_eq!(c3.s.read(&mut b).unwrap(), 0);

    // Disconnect: the server closes after DISC.
    c.send(CMD_DISC, 0, 1, 0, 0, &[]);
    assert_eq!(c.s.read(&mut b).unwrap(), 0);

    // How the three connections were served (counted as they start, and
    // each request before its reply).
    let c = account.counters();
    if direct_queues == 0 {
        assert_eq!((c.direct_connections, c.task_connections), (0, 3));
        assert_eq!((c.direct_requests, c.handed_off_requests), (0, 0));
    } else {
        assert_eq!((c.direct_connections, c.task_connections), (3, 0));
        // Aligned reads, writes and flushes ran on the direct queues; the
        // unaligned ones, trims, zeroes and refusals went to tasks.
        assert!(c.direct_requests >= 130, "{c:?}");
        assert!(c.handed_off_requests >= 31 + 31 + 2, "{c:?}");
    }

    rt.block_on(ctrl.disconnect(Duration::from_secs(2)));
    drop(rt);
    target.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run-to-completion write never lets a concurrent read-modify-write
/// (an unaligned write on the task path, from another connection) put
/// back bytes it overwrote: both hold the block-range lock. Connection B
/// alone writes bytes 100.. of a 4 KiB region, each version acknowledged
/// before it reads the region back, so every read must show B's latest
/// version there; connection A keeps rewriting bytes 0..100 (RMW of the
/// region's first block) at the same time.
#[test]
fn direct_writes_and_rmw_on_shared_blocks_lose_nothing() {
    let Served {
        target,
        dir,
        sock,
        rt,
        ctrl,
        account,
        _guard,
    } = serve("rmw", 1, 2);
    const AT: u64 = 1 << 20;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rmw = {
        let (sock, stop) = (sock.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut a = Client::connect(&sock, "disk");
            let mut n = 0u32;
            while !stop.load(Relaxed) {
                let d = pattern(n as u8, 100);
                assert_eq!(a.call(CMD_WRITE, 0, AT, 100, &d).0, 0);
                n += 1;
            }
            n
        })
    };
    let mut b = Client::connect(&sock, "disk");
    for v in 0..400u32 {
        let d = pattern(v as u8 ^ 0x5a, 4096);
        assert_eq!(b.call(CMD_WRITE, 0, AT, 4096, &d).0, 0);
        let (e, got) = b.call(CMD_READ, 0, AT, 4096, &[]);
        assert_eq!(e, 0);
        assert!(
            got[100..] == d[100..],
            "version {v}: an acknowledged write was undone by a concurrent RMW"
        );
    }
    stop.store(true, Relaxed);
    let rmws = rmw.join().unwrap();
    assert!(rmws > 10, "the RMW connection ran only {rmws} writes");
    assert_eq!(account.counters().direct_connections, 2);
    rt.block_on(ctrl.disconnect(Duration::from_secs(2)));
    drop(rt);
    target.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bytes waiting in `s`'s receive queue (FIONREAD).
fn queued_bytes(s: &std::os::unix::net::UnixStream) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which lives
    // across the call; the descriptor is open.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &raw mut n) };
    assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    usize::try_from(n).unwrap()
}

/// The replies to a queue of large reads fit in a Unix client's socket:
/// the export asks for a send buffer of
/// `UNIX_CLIENT_SEND_BUFFER_BYTES`, so a client that has not read yet
/// finds at least 1 MiB of replies waiting (the default buffer, 208 KiB
/// here, held fewer than two 128 KiB replies, and the export had to wake
/// at each of the client's reads to write the next). The data is the data
/// written.
#[test]
fn replies_to_large_reads_wait_in_the_unix_socket() {
    const READS: u64 = 16;
    const READ_BYTES: u32 = 128 << 10;
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let Served {
        target,
        dir,
        sock,
        rt,
        ctrl,
        _guard,
        ..
    } = serve("sndbuf", 1, 1);
    let mut c = Client::connect(&sock, "disk");
    let data = pattern(9, (READS * u64::from(READ_BYTES)) as usize);
    for (i, chunk) in data.chunks(READ_BYTES as usize).enumerate() {
        let at = i as u64 * u64::from(READ_BYTES);
        assert_eq!(c.call(CMD_WRITE, 0, at, READ_BYTES, chunk).0, 0);
    }
    for i in 0..READS {
        c.send(CMD_READ, 0, i, i * u64::from(READ_BYTES), READ_BYTES, &[]);
    }
    // Wait until the export has written all it can: the queue stops
    // growing for 300 ms (or holds every reply).
    let all = (READS as usize) * (READ_BYTES as usize + 16);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (mut last, mut since) = (0, std::time::Instant::now());
    loop {
        let q = queued_bytes(&c.s);
        if q != last {
            (last, since) = (q, std::time::Instant::now());
        }
        if q >= all || since.elapsed() > Duration::from_millis(300) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "queue still moving at {q} bytes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    if wmem_max >= 1 << 20 {
        assert!(last >= 1 << 20, "only {last} bytes of replies queued");
    } else {
        eprintln!(
            "net.core.wmem_max is {wmem_max}: the kernel caps the buffer below 1 MiB, not checked"
        );
    }
    // Replies come back in any order; each carries its own range's data.
    for _ in 0..READS {
        let (cookie, errno, got) = c.reply(|_| READ_BYTES as usize);
        assert_eq!(errno, 0);
        let at = (cookie * u64::from(READ_BYTES)) as usize;
        assert!(
            got == data[at..at + READ_BYTES as usize],
            "read {cookie} differs"
        );
    }
    drop(c);
    rt.block_on(ctrl.disconnect(Duration::from_secs(2)));
    drop(rt);
    target.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that connects after the export's namespace grew is told the
/// new size: a reload grows the file namespace, the host library follows
/// the Namespace Attribute Changed event, and the new client writes and
/// reads at the new end (on the task path and run to completion); a client
/// connected before keeps the size its handshake told it (ENOSPC past it),
/// as NBD has no way to tell it more.
#[test]
fn a_grown_namespace_is_larger_for_later_clients() {
    for direct_queues in [0u16, 1] {
        let img = tempfile::NamedTempFile::new().unwrap();
        let small = 4u64 << 20;
        let ns = |bytes: u64| {
            sluice_config::NamespaceConfig::file(1, img.path())
                .with_create(true)
                .with_block_size(4096)
                .with_size(bytes)
        };
        let cfg = common::one_namespace_config(SUBNQN, "127.0.0.1:0".parse().unwrap(), ns(small));
        let target = sluice_target::Target::start(&cfg).unwrap();
        let dir = std::env::temp_dir().join(format!(
            "sluice-nbd-grow-{direct_queues}-{}",
            std::process::id()
        ));
        let e = export(&dir, target.local_addr(), 1, direct_queues);
        let mut before = Client::connect(&e.sock, "disk");
        assert_eq!(before.size, small);

        let mut grown = cfg.clone();
        grown.subsystems[0].namespaces[0] = ns(2 * small);
        target.reload(&grown).unwrap();
        let handle = e.ctrl.namespace(1).unwrap();
        let t0 = std::time::Instant::now();
        while handle.size_blocks() != 2 * small / 4096 {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the host did not follow the growth"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut after = Client::connect(&e.sock, "disk");
        assert_eq!(after.size, 2 * small);
        let d = pattern(3, 65536);
        let end = 2 * small - 65536;
        assert_eq!(after.call(CMD_WRITE, 0, end, 65536, &d).0, 0);
        let (errno, got) = after.call(CMD_READ, 0, end, 65536, &[]);
        assert_eq!(errno, 0);
        assert!(
            got == d,
            "the new end reads back ({direct_queues} direct queues)"
        );
        assert_eq!(
            after.call(CMD_WRITE, 0, 2 * small, 4096, &d[..4096]).0,
            ENOSPC
        );
        assert_eq!(
            before.call(CMD_WRITE, 0, small, 4096, &d[..4096]).0,
            ENOSPC,
            "a connection keeps the size it was told"
        );
        assert_eq!(before.call(CMD_READ, 0, 0, 4096, &[]).0, 0);
        drop((before, after));
        e.rt.block_on(e.ctrl.disconnect(Duration::from_secs(5)));
        drop(e);
        target.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
