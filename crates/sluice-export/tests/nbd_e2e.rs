//! End to end: a Sluice target with a RAM namespace, sluice-host, the NBD
//! server on a temporary Unix socket, and a minimal blocking NBD client.
#![allow(clippy::unwrap_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_export::errno::{EINVAL, ENOSPC};
use sluice_export::nbd::proto::*;
use sluice_export::nbd::server::UnixSocketPath;
use sluice_export::nbd::{NbdConfig, NbdServer};
use sluice_export::ByteDevice;
use sluice_host::{ConnectOptions, Controller};
use std::io::{Read, Write};
use std::time::Duration;

const SUBNQN: &str = "nqn.2026-11.io.sluice:nbd-e2e";
const SIZE_BYTES: u64 = 16 << 20;

mod common;
use common::Client;

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn nbd_over_sluice_target() {
    let target = common::ram_target(SUBNQN, 16 << 20);
    let addr = target.local_addr();
    let dir = std::env::temp_dir().join(format!("sluice-nbd-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("nbd.sock");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (ctrl, _guard) = rt.block_on(async {
        let opts = ConnectOptions {
            io_queues: 2,
            ..ConnectOptions::default()
        };
        let ctrl = Controller::connect(addr, SUBNQN, opts).await.unwrap();
        let ns = ctrl.namespace(1).unwrap();
        let server = NbdServer::new(
            ByteDevice::new(ns),
            NbdConfig {
                export_name: "disk".into(),
                description: "e2e".into(),
                read_only: false,
                hostnqn: "test".into(),
            },
        );
        let (l, guard) = UnixSocketPath::bind(&sock).unwrap();
        tokio::spawn(server.serve_unix(l));
        (ctrl, guard)
    });

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

    // A second connection sees the first one's data (multi-conn).
    let mut c2 = Client::connect(&sock, "");
    let (_, d) = c2.call(CMD_READ, 0, (8 << 20) + 8193, 4099, &[]);
    assert!(d == pattern(1, 4099), "second connection reads other data");

    // Bad magic closes the connection.
    c2.s.write_all(&[0u8; 28]).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(c2.s.read(&mut b).unwrap(), 0);

    // Disconnect: the server closes after DISC.
    c.send(CMD_DISC, 0, 1, 0, 0, &[]);
    assert_eq!(c.s.read(&mut b).unwrap(), 0);

    rt.block_on(ctrl.disconnect(Duration::from_secs(2)));
    drop(rt);
    target.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
