//! The real I/O layer on loopback sockets: a blocking test client built from
//! the protocol crate talks to a running target.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use sluice_config::{
    Config, NamespaceConfig, PollingPolicy, SsdConfig, SubsystemConfig, TargetSettings,
};
use sluice_proto::command::{io, sgl, Cqe, SglDescriptor, Sqe};
use sluice_proto::fabrics::{cc, fctype, prop, ConnectCommand, ConnectData, PropertyCommand};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{encode_pdu, DataHeader, Direction, IcReq, PduHeader, TxParams};
use sluice_proto::send::{SchedulerKind, SendConfig};
use sluice_proto::Status;
use sluice_target::{Target, TargetHandle};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const SUBNQN: &str = "nqn.2026-11.io.sluice:loop";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:loopback-host";

fn start(polling: &str, workers: usize) -> TargetHandle {
    start_with(polling, workers, SendConfig::default())
}

fn start_with(polling: &str, workers: usize, send: SendConfig) -> TargetHandle {
    start_settings(
        TargetSettings::default()
            .with_workers(workers)
            .with_polling(PollingPolicy::parse(polling, 50).unwrap())
            .with_send(send),
    )
}

/// The loopback target: `settings` listening on an ephemeral port of
/// 127.0.0.1, no discovery port, one 16 MiB RAM namespace for `HOSTNQN`.
fn start_settings(settings: TargetSettings) -> TargetHandle {
    let c = Config::default()
        .with_target(
            settings
                .with_listen(SocketAddr::from(([127, 0, 0, 1], 0)))
                .with_discovery_listen(None)
                .with_shutdown_drain_ms(2000),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(NamespaceConfig::ram(1, 16 << 20)),
        )
        .validated()
        .unwrap();
    Target::start(&c).unwrap()
}

struct Client {
    s: TcpStream,
    rx: Framer,
    txp: TxParams,
    cid: u16,
    maxh2c: usize,
    /// Writes up to this size carry their data in the capsule.
    inline_max: usize,
}

impl Client {
    fn connect(addr: SocketAddr, digests: bool) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client {
            s,
            rx: Framer::new(Direction::ControllerToHost, 1 << 22),
            txp: TxParams::default(),
            cid: 0,
            maxh2c: 0,
            inline_max: 8192,
        };
        c.send(
            &PduHeader::IcReq(IcReq {
                pfv: 0,
                hpda: 0,
                hdgst: digests,
                ddgst: digests,
                maxr2t: 0,
            }),
            &[],
        );
        match c.recv() {
            PduHeader::IcResp(r) => {
                c.rx.set_initialized(r.hdgst, r.ddgst, 0, 1 << 22);
                c.txp = TxParams {
                    hdgst: r.hdgst,
                    ddgst: r.ddgst,
                    pda: r.cpda,
                };
                c.maxh2c = r.maxh2cdata as usize;
            }
            other => panic!("{other:?}"),
        }
        c
    }

    fn send(&mut self, h: &PduHeader, data: &[u8]) {
        let mut w = Vec::new();
        encode_pdu(h, data, &self.txp, &mut w);
        self.s.write_all(&w).unwrap();
    }

    fn recv_with_data(&mut self) -> (PduHeader, Vec<u8>) {
        loop {
            if let Some(p) = self.rx.next_pdu().expect("valid PDU from target") {
                return (p.header, p.data.to_vec());
            }
            let b = self.rx.read_buf();
            let n = loop {
                // A signal may interrupt the blocking read (as `read_exact`
                // retries, so does this).
                match self.s.read(b) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r.expect("read from target"),
                }
            };
            assert!(n > 0, "target closed the connection");
            self.rx.advance(n);
        }
    }

    fn recv(&mut self) -> PduHeader {
        self.recv_with_data().0
    }

    fn next_cid(&mut self) -> u16 {
        self.cid += 1;
        self.cid
    }

    fn cmd(&mut self, sqe: Sqe, data: &[u8]) -> (Cqe, Vec<u8>) {
        self.send(&PduHeader::CapsuleCmd(sqe), data);
        let mut out = Vec::new();
        loop {
            match self.recv_with_data() {
                (PduHeader::C2HData(_), d) => out.extend_from_slice(&d),
                (PduHeader::CapsuleResp(c), _) => return (c, out),
                (other, _) => panic!("{other:?}"),
            }
        }
    }

    fn connect_queue(&mut self, qid: u16, cntlid: u16) -> Cqe {
        let cid = self.next_cid();
        let cmd = ConnectCommand {
            cid,
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato_ms: if qid == 0 { 10_000 } else { 0 },
        };
        let data = ConnectData {
            hostid: [3; 16],
            cntlid,
            subnqn: SUBNQN.into(),
            hostnqn: HOSTNQN.into(),
        }
        .encode();
        self.cmd(cmd.to_sqe(), &data).0
    }

    fn admin(addr: SocketAddr) -> (Client, u16) {
        let mut a = Client::connect(addr, false);
        let c = a.connect_queue(0, 0xffff);
        assert_eq!(c.status(), Status::SUCCESS);
        let cid = a.next_cid();
        let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        let s = PropertyCommand {
            size8: false,
            offset: prop::CC,
            value: en as u64,
        }
        .to_sqe(cid, fctype::PROPERTY_SET);
        assert_eq!(a.cmd(s, &[]).0.status(), Status::SUCCESS);
        (a, c.result as u16)
    }

    /// A write of `len` bytes at `slba` whose data rides in the capsule.
    fn in_capsule_write(&mut self, slba: u64, len: usize) -> Sqe {
        let mut s = Sqe::rw(
            io::WRITE,
            self.next_cid(),
            1,
            slba,
            (len / 512) as u32,
            false,
        );
        s.set_sgl(SglDescriptor {
            address: 0,
            length: len as u32,
            id: sgl::DATA_BLOCK_OFFSET,
        });
        s
    }

    fn write(&mut self, slba: u64, data: &[u8]) -> Status {
        if data.len() <= self.inline_max {
            let s = self.in_capsule_write(slba, data.len());
            return self.cmd(s, data).0.status();
        }
        let cid = self.next_cid();
        let nlb = (data.len() / 512) as u32;
        let mut s = Sqe::rw(io::WRITE, cid, 1, slba, nlb, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: data.len() as u32,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        self.send(&PduHeader::CapsuleCmd(s), &[]);
        let r2t = match self.recv() {
            PduHeader::R2t(r) => r,
            other => panic!("{other:?}"),
        };
        for (i, piece) in data.chunks(self.maxh2c).enumerate() {
            let offset = (i * self.maxh2c) as u32;
            let last = offset as usize + piece.len() == data.len();
            let h = PduHeader::H2CData(DataHeader {
                cccid: cid,
                ttag: r2t.ttag,
                offset,
                len: piece.len() as u32,
                last,
                success: false,
            });
            self.send(&h, piece);
        }
        match self.recv() {
            PduHeader::CapsuleResp(c) => c.status(),
            other => panic!("{other:?}"),
        }
    }

    fn read(&mut self, slba: u64, nlb: u32) -> (Status, Vec<u8>) {
        let cid = self.next_cid();
        let mut s = Sqe::rw(io::READ, cid, 1, slba, nlb, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: nlb * 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        let (c, d) = self.cmd(s, &[]);
        (c.status(), d)
    }
}

/// Never repeats within a namespace ([`sluice_testdata::pattern`]).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    sluice_testdata::pattern(len, u64::from(seed))
}

fn write_read_over(polling: &str, workers: usize, digests: bool) {
    write_read_with(polling, workers, digests, SendConfig::default());
}

fn write_read_with(polling: &str, workers: usize, digests: bool, send: SendConfig) {
    let t = start_with(polling, workers, send);
    let addr = t.local_addr();
    let (_admin, cntlid) = Client::admin(addr);
    let mut q = Client::connect(addr, digests);
    assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
    for (i, len) in [512usize, 4096, 8192, 65536, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let d = pattern(len, i as u8);
        let slba = (i as u64) * 4096;
        assert_eq!(q.write(slba, &d), Status::SUCCESS, "write {len}");
        let (st, back) = q.read(slba, (len / 512) as u32);
        assert_eq!(st, Status::SUCCESS);
        assert!(back == d, "read back {len} bytes differs");
    }
    let report = t.shutdown();
    assert_eq!(report.workers.len(), workers);
    assert!(report.workers.iter().map(|w| w.connections).sum::<u64>() >= 2);
}

/// Writes of up to 128 KiB in their capsules, over real sockets, with and
/// without digests: their data is received in place past the framer's
/// first read (the socket path of `recv_bufs`; counted in
/// `sluice_target_received_in_place_bytes_total`), and reads back intact.
#[test]
fn large_in_capsule_writes_read_back() {
    let t = start_settings(
        TargetSettings::default()
            .with_workers(1)
            .with_polling(PollingPolicy::parse("interrupt", 50).unwrap())
            .with_inline_data_bytes(128 * 1024),
    );
    let addr = t.local_addr();
    let (_admin, cntlid) = Client::admin(addr);
    for digests in [false, true] {
        let mut q = Client::connect(addr, digests);
        q.inline_max = 128 * 1024;
        assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
        for (i, len) in [4096usize, 20 * 1024, 65536, 100 * 1024, 128 * 1024]
            .into_iter()
            .enumerate()
        {
            let d = pattern(len, i as u8 ^ u8::from(digests));
            let slba = (i as u64) * 256;
            assert_eq!(q.write(slba, &d), Status::SUCCESS, "write {len}");
            let (st, back) = q.read(slba, (len / 512) as u32);
            assert_eq!(st, Status::SUCCESS);
            assert!(
                back == d,
                "digests {digests}: read back {len} bytes differs"
            );
        }
    }
    let written: usize = 2 * (4096 + 20 * 1024 + 65536 + 100 * 1024 + 128 * 1024);
    let received = metric(&t, "sluice_target_received_bytes_total", None);
    let in_place = metric(&t, "sluice_target_received_in_place_bytes_total", None);
    assert!(received > written as f64, "{received} bytes received");
    // The 100 and 128 KiB writes leave at least 16 KiB each to come after
    // the framer's first read (at most 64 KiB).
    assert!(
        in_place >= (4 * 16 * 1024) as f64 && in_place < received,
        "{in_place} of {received} bytes received in place"
    );
    t.shutdown();
}

#[test]
fn write_read_interrupt_mode() {
    write_read_over("interrupt", 1, false);
}

#[test]
fn write_read_busy_poll_two_workers_digests() {
    write_read_over("busy-poll", 2, true);
}

/// Every send scheduler and coalescing mode over real sockets. The client
/// runs at QD 1, so a PDU held by a freight or the coalescer can only leave
/// through its timer: with millisecond timers and degrees no single command
/// reaches, each step proves the worker sleeps no longer than the send
/// path's deadline (even in `interrupt` mode, where nothing else wakes it).
#[test]
fn write_read_every_send_mode() {
    for (sched, co) in [
        ("unified", "off"),
        ("isolated", "off"),
        ("immediate", "static"),
        ("immediate", "adaptive"),
        ("isolated", "calibrated"),
    ] {
        let mut send = SendConfig {
            scheduler: sched.parse::<SchedulerKind>().unwrap(),
            ..SendConfig::default()
        };
        // Slow freights: degrees no single command reaches, millisecond timers.
        send.unified.degree = 64;
        send.unified.timer = Duration::from_micros(3000);
        send.latency.degree = 64;
        send.latency.timer = Duration::from_micros(2000);
        send.data.degree = 64;
        send.data.timer = Duration::from_micros(4000);
        send.coalescing.mode = co.parse().unwrap();
        send.coalescing.threshold = 8;
        send.coalescing.timeout = Duration::from_micros(2500);
        send.coalescing.correction = 2.0;
        let t0 = std::time::Instant::now();
        write_read_with("interrupt", 1, false, send);
        write_read_with("adaptive", 2, true, send);
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{sched}/{co}: held PDUs waited far beyond their deadlines"
        );
    }
}

/// RAM reads of 4 KiB or more go out from the namespace's memory
/// (`target.ram_reads_in_place`, on by default) and read back what was
/// written, before and after writes over part of them; with it off they
/// are copied and read back the same.
#[test]
fn ram_reads_in_place_read_back_what_was_written() {
    for in_place in [true, false] {
        let t = start_settings(
            TargetSettings::default()
                .with_polling(PollingPolicy::parse("adaptive", 50).unwrap())
                .with_ram_reads_in_place(in_place),
        );
        let addr = t.local_addr();
        let (_admin, cntlid) = Client::admin(addr);
        let mut q = Client::connect(addr, false);
        assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
        let before = metric(&t, "sluice_ram_reads_in_place_total", None);
        let mut image = pattern(1 << 20, 7);
        assert_eq!(q.write(0, &image), Status::SUCCESS);
        for round in 0..3u8 {
            // 128 KiB within a chunk, 128 KiB across two, 16 KiB, 4 KiB.
            for (slba, blocks) in [(256u64, 256u32), (128, 256), (1024, 32), (1500, 8)] {
                let (st, back) = q.read(slba, blocks);
                assert_eq!(st, Status::SUCCESS);
                let at = slba as usize * 512;
                assert!(
                    back == image[at..at + blocks as usize * 512],
                    "in_place {in_place}: read of {blocks} blocks at {slba} differs in round {round}"
                );
            }
            let over = pattern(4096, round.wrapping_mul(31));
            assert_eq!(q.write(264 + u64::from(round) * 8, &over), Status::SUCCESS);
            let at = (264 + usize::from(round) * 8) * 512;
            image[at..at + 4096].copy_from_slice(&over);
        }
        let after = metric(&t, "sluice_ram_reads_in_place_total", None);
        if in_place {
            // Process-wide: other tests may add to it, never take from it.
            // Three a round: within a chunk at 128 KiB, 16 KiB and 4 KiB.
            assert!(after >= before + 9.0, "{before} -> {after}");
        }
        t.shutdown();
    }
}

/// `target.tcp_congestion`: a target whose sockets use Reno (built into
/// every kernel, whatever the system default) serves large reads and writes
/// intact; one naming an algorithm the kernel lacks does not start, and says
/// which key and what the kernel offers. (That accepted sockets take the
/// listener's algorithm is `sluice_runtime::net`'s test.)
#[test]
fn tcp_congestion_is_set_on_the_target_sockets() {
    let t = start_settings(TargetSettings::default().with_tcp_congestion(Some("reno")));
    let addr = t.local_addr();
    let (_admin, cntlid) = Client::admin(addr);
    let mut q = Client::connect(addr, false);
    assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
    let image = pattern(1 << 20, 3);
    assert_eq!(q.write(0, &image), Status::SUCCESS);
    for slba in (0..2048u64).step_by(256) {
        let (st, back) = q.read(slba, 256);
        assert_eq!(st, Status::SUCCESS);
        let at = slba as usize * 512;
        assert!(back == image[at..at + 128 * 1024], "read at {slba} differs");
    }
    t.shutdown();

    let c = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen(SocketAddr::from(([127, 0, 0, 1], 0)))
                .with_discovery_listen(None)
                .with_tcp_congestion(Some("no-such-cc")),
        )
        .validated()
        .unwrap();
    let e = Target::start(&c).unwrap_err().to_string();
    assert!(
        e.starts_with("target.tcp_congestion: cannot use `no-such-cc`"),
        "{e}"
    );
    assert!(e.contains("reno"), "{e}");
}

/// Reads larger than the congestion window (1 MiB on a fresh connection,
/// whose window starts at 10 segments) go out in writes capped by the
/// window, the rest on the worker's next turns, and arrives intact, in
/// every polling mode (interrupt included: no edge says the window
/// opened, so a capped connection must not wait for one). With
/// `send_within_cwnd = false` no write is capped.
#[test]
fn large_reads_are_sent_within_the_congestion_window() {
    for (polling, within) in [
        ("interrupt", true),
        ("adaptive", true),
        ("busy-poll", true),
        ("adaptive", false),
    ] {
        let policy = PollingPolicy::parse(polling, 50).unwrap();
        let t = start_settings(
            TargetSettings::default()
                .with_polling(policy)
                .with_send_within_cwnd(within),
        );
        let addr = t.local_addr();
        let (_admin, cntlid) = Client::admin(addr);
        let image = pattern(8 << 20, 11);
        let mut w = Client::connect(addr, false);
        assert_eq!(w.connect_queue(1, cntlid).status(), Status::SUCCESS);
        for (i, part) in image.chunks(1 << 20).enumerate() {
            assert_eq!(w.write(i as u64 * 2048, part), Status::SUCCESS);
        }
        // A fresh queue for the reads: its window starts small.
        let mut q = Client::connect(addr, false);
        assert_eq!(q.connect_queue(2, cntlid).status(), Status::SUCCESS);
        for slba in (0u64..16384).step_by(2048) {
            let (st, back) = q.read(slba, 2048);
            assert_eq!(st, Status::SUCCESS, "{polling}");
            let at = slba as usize * 512;
            assert!(
                back == image[at..at + (1 << 20)],
                "{polling}: the read at {slba} differs"
            );
        }
        let capped = t.window_capped_writes();
        if within {
            assert!(capped > 0, "{polling}: no write was capped");
        } else {
            assert_eq!(capped, 0, "send_within_cwnd = false caps nothing");
        }
        t.shutdown();
    }
}

/// Over a real socket, large reads with `send.responses_after_data` on
/// (the default) and off read back what was written; the held responses
/// are counted (a flush reason), and none is held when it is off.
#[test]
fn large_reads_with_and_without_responses_after_data_read_back() {
    for after in [true, false] {
        let send = SendConfig {
            responses_after_data: after,
            ..SendConfig::default()
        };
        let t = start_with("adaptive", 1, send);
        let addr = t.local_addr();
        let (_admin, cntlid) = Client::admin(addr);
        let image = pattern(2 << 20, 5);
        let mut q = Client::connect(addr, false);
        assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
        for (i, part) in image.chunks(1 << 20).enumerate() {
            assert_eq!(q.write(i as u64 * 2048, part), Status::SUCCESS);
        }
        for slba in (0u64..4096).step_by(256) {
            let (st, back) = q.read(slba, 256);
            assert_eq!(st, Status::SUCCESS);
            let at = slba as usize * 512;
            assert!(
                back == image[at..at + (128 << 10)],
                "after {after}: read at {slba}"
            );
        }
        let held = t
            .shutdown()
            .send
            .reason(sluice_proto::send::FlushReason::AfterData);
        if after {
            assert!(held >= 16, "after: {held} responses held for 16 reads");
        } else {
            assert_eq!(held, 0, "off: nothing held");
        }
    }
}

#[test]
fn write_read_adaptive() {
    write_read_over("adaptive", 1, true);
}

/// A hostile peer and a host that vanishes mid-transfer do not disturb a
/// healthy host on the same worker; their controllers are cleaned up.
#[test]
fn hostile_and_vanishing_peers_leave_others_alone() {
    let t = start("interrupt", 1);
    let addr = t.local_addr();
    let (_admin, cntlid) = Client::admin(addr);
    let mut good = Client::connect(addr, false);
    assert_eq!(good.connect_queue(1, cntlid).status(), Status::SUCCESS);
    assert_eq!(good.write(0, &pattern(4096, 1)), Status::SUCCESS);

    // Garbage instead of an ICReq: the target answers with a C2HTermReq and closes.
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    bad.write_all(&[0xff; 200]).unwrap();
    let mut buf = vec![0u8; 512];
    let mut got = Vec::new();
    loop {
        match bad.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("target did not close the hostile connection: {e}"),
        }
    }
    assert_eq!(got.first(), Some(&0x03), "C2HTermReq");
    assert_eq!(
        u16::from_le_bytes([got[8], got[9]]),
        1,
        "FES invalid header field"
    );

    // A host that asks to write 1 MiB and disappears after the R2T.
    let (va, vcntlid) = Client::admin(addr);
    let mut v = Client::connect(addr, false);
    assert_eq!(v.connect_queue(1, vcntlid).status(), Status::SUCCESS);
    let mut s = Sqe::rw(io::WRITE, 77, 1, 0, 2048, false);
    s.set_sgl(SglDescriptor {
        address: 0,
        length: 1 << 20,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    v.send(&PduHeader::CapsuleCmd(s), &[]);
    assert!(matches!(v.recv(), PduHeader::R2t(_)));
    v.send(
        &PduHeader::H2CData(DataHeader {
            cccid: 77,
            ttag: 0,
            offset: 0,
            len: 4096,
            last: false,
            success: false,
        }),
        &[9; 4096],
    );
    drop(v);
    va.s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(va);

    // The healthy host carries on; its data is intact.
    assert_eq!(good.read(0, 8), (Status::SUCCESS, pattern(4096, 1)));
    let sub = t.registry().subsystems()[SUBNQN].clone();
    let deadline = Instant::now() + Duration::from_secs(5);
    while sub.controller_count() != 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        sub.controller_count(),
        1,
        "the vanished host's controller is removed"
    );
    t.shutdown();
}

/// Graceful shutdown answers the commands in flight before closing.
#[test]
fn shutdown_drains_and_closes() {
    let t = start("adaptive", 1);
    let addr = t.local_addr();
    let (_admin, cntlid) = Client::admin(addr);
    let mut q = Client::connect(addr, false);
    assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
    assert_eq!(q.write(8, &pattern(8192, 4)), Status::SUCCESS);
    let report = t.shutdown();
    assert!(report.process_cpu > Duration::ZERO);
    // The connection is closed by the target.
    let mut b = [0u8; 16];
    q.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(q.s.read(&mut b).unwrap_or(0), 0);
}

/// A command still in a slow backend when the drain ends does not keep the
/// host waiting: the target closes its connections at the drain deadline,
/// then waits for the backend and flushes it. Before, it waited first (here
/// 2.5 s for the device's reads; a host's own command timeout is 10-30 s),
/// unless the admin queue's close happened to tear the I/O queue down
/// first: the I/O queue notices a failed controller at its next check, on
/// a 200 ms grid, which came before the end of a 100 ms drain in about
/// half the runs. With no drain the worker stops at its first turn, so the
/// old order fails every time.
#[test]
fn shutdown_closes_connections_before_waiting_for_the_backend() {
    let c = Config::default()
        .with_target(
            TargetSettings::default()
                .with_workers(1)
                .with_polling(PollingPolicy::Interrupt)
                .with_listen(SocketAddr::from(([127, 0, 0, 1], 0)))
                .with_discovery_listen(None)
                .with_shutdown_drain_ms(0),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(NamespaceConfig::ram(1, 16 << 20))
                .with_namespace(NamespaceConfig::emulated_ssd(
                    2,
                    1 << 20,
                    SsdConfig::default().with_base_read_latency_us(2_500_000),
                )),
        )
        .validated()
        .unwrap();
    let t = Target::start(&c).unwrap();
    let addr = t.local_addr();
    let (mut admin, cntlid) = Client::admin(addr);
    let mut q = Client::connect(addr, false);
    assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
    for slba in [0u64, 8, 16] {
        let cid = q.next_cid();
        let mut s = Sqe::rw(io::READ, cid, 2, slba, 8, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: 4096,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        q.send(&PduHeader::CapsuleCmd(s), &[]);
    }
    // Let the reads reach the device.
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let stopper = std::thread::spawn(move || t.shutdown());
    assert!(
        closed_by_target(&mut q.s, Duration::from_millis(1500)),
        "the I/O queue is still open {:?} after the shutdown began",
        t0.elapsed()
    );
    assert!(closed_by_target(&mut admin.s, Duration::from_secs(2)));
    let closed_after = t0.elapsed();
    stopper.join().unwrap();
    eprintln!(
        "closed after {closed_after:?}; the shutdown returned after {:?} (the backend's reads)",
        t0.elapsed()
    );
}

/// The acceptor deals sockets round robin, which puts every controller's
/// single I/O queue on the same worker (admin, I/O, admin, I/O ...). Each
/// I/O queue is placed after its Connect on the worker with the fewest I/O
/// queues, handed over with its state; data written before and after the
/// hand-over reads back on every queue.
#[test]
fn io_queues_spread_over_workers() {
    let t = start("interrupt", 2);
    let addr = t.local_addr();
    let mut queues = Vec::new();
    let mut admins = Vec::new();
    for _ in 0..3 {
        let (admin, cntlid) = Client::admin(addr);
        let mut q = Client::connect(addr, false);
        assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
        admins.push(admin);
        queues.push(q);
    }
    for round in 0..3u8 {
        for (i, q) in queues.iter_mut().enumerate() {
            let len = [4096usize, 1 << 20, 8192][round as usize];
            let d = pattern(len, round * 16 + i as u8);
            let slba = (i as u64) * 4096 + u64::from(round) * 1024;
            assert_eq!(q.write(slba, &d), Status::SUCCESS);
            let (st, back) = q.read(slba, (len / 512) as u32);
            assert_eq!(st, Status::SUCCESS);
            assert!(back == d, "queue {i} round {round}: data differs");
        }
    }
    let mut per = t.io_queues_per_worker();
    per.sort_unstable();
    assert_eq!(per, vec![1, 2], "I/O queues per worker");
    drop(queues);
    drop(admins);
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.io_queues_per_worker().iter().sum::<usize>() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(t.io_queues_per_worker(), vec![0, 0], "counts follow closes");
    t.shutdown();
}

/// A target with the given connection limits (interrupt polling, one worker).
fn start_limited(per_source: u32, handshaking: u32, handshake_timeout_ms: u32) -> TargetHandle {
    start_settings(
        TargetSettings::default()
            .with_polling(PollingPolicy::Interrupt)
            .with_connections_per_source_max(per_source)
            .with_connections_handshaking_max(handshaking)
            .with_handshake_timeout_ms(handshake_timeout_ms),
    )
}

/// A TCP connection to `to` from the loopback address `from` (all of
/// 127.0.0.0/8 is local on Linux), so one test can be several sources.
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&to.into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Whether the target closes `s` (end of file or reset) before `within`.
fn closed_by_target(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // a C2HTermReq or ICResp before the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false, // timed out: still open
        }
    }
}

/// Waits until the target counts `open` connections.
fn wait_open(t: &TargetHandle, open: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.connections().open != open && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(t.connections().open, open, "{:?}", t.connections());
}

/// The target's metrics as (name, labels) → value.
fn metric(t: &TargetHandle, name: &str, label: Option<(&str, &str)>) -> f64 {
    let text =
        sluice_target::tenant::admin::metrics_text(t.tenants().clone(), t.registry().clone());
    sluice_admin::metrics::parse_text(&text)
        .into_iter()
        .find(|(n, l, _)| {
            n == name && label.is_none_or(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| s.2)
        .unwrap_or_else(|| panic!("no sample {name} {label:?} in\n{text}"))
}

/// More connections from one source than `connections_per_source_max`:
/// the extra ones are closed at accept and counted, while a host at
/// another address carries on with its I/O; slots come back at close.
#[test]
fn per_source_limit_refuses_the_extra_and_spares_other_hosts() {
    let t = start_limited(4, 64, 10_000);
    let addr = t.local_addr();
    let (_admin, cntlid) = Client::admin(addr);
    let mut good = Client::connect(addr, false);
    assert_eq!(good.connect_queue(1, cntlid).status(), Status::SUCCESS);
    assert_eq!(good.write(0, &pattern(8192, 3)), Status::SUCCESS);

    let mut flood: Vec<TcpStream> = (0..4).map(|_| connect_from([127, 0, 0, 2], addr)).collect();
    wait_open(&t, 6);
    for _ in 0..3 {
        let mut extra = connect_from([127, 0, 0, 2], addr);
        assert!(
            closed_by_target(&mut extra, Duration::from_secs(5)),
            "a connection over the per-source limit is closed"
        );
    }
    let c = t.connections();
    assert_eq!((c.open, c.sources, c.busiest_source), (6, 2, 4), "{c:?}");
    for s in &mut flood {
        assert!(
            !closed_by_target(s, Duration::from_millis(20)),
            "admitted ones stay"
        );
    }

    // The host at 127.0.0.1 is unaffected.
    assert_eq!(good.read(0, 16), (Status::SUCCESS, pattern(8192, 3)));
    assert_eq!(good.write(64, &pattern(1 << 20, 5)), Status::SUCCESS);
    assert_eq!(good.read(64, 2048), (Status::SUCCESS, pattern(1 << 20, 5)));

    let refused = ("limit", "connections_per_source_max");
    assert_eq!(
        metric(&t, "sluice_connections_refused_total", Some(refused)),
        3.0
    );
    let other = ("limit", "connections_max");
    assert_eq!(
        metric(&t, "sluice_connections_refused_total", Some(other)),
        0.0
    );
    assert_eq!(metric(&t, "sluice_connections", None), 6.0);
    assert_eq!(metric(&t, "sluice_connections_handshaking", None), 4.0);
    assert_eq!(metric(&t, "sluice_connection_sources", None), 2.0);
    assert_eq!(metric(&t, "sluice_connections_busiest_source", None), 4.0);
    assert_eq!(metric(&t, "sluice_connections_limit", Some(refused)), 4.0);

    // Closing one gives its slot back to that source.
    drop(flood.pop());
    wait_open(&t, 5);
    let mut again = connect_from([127, 0, 0, 2], addr);
    assert!(!closed_by_target(&mut again, Duration::from_millis(200)));
    wait_open(&t, 6);
    t.shutdown();
}

/// Idle sockets can take every handshake slot, but only until the
/// handshake timeout closes them (also one that sent its ICReq and then
/// nothing); a connected queue holds no handshake slot.
#[test]
fn handshake_limit_and_timeout() {
    let t = start_limited(64, 3, 600);
    let addr = t.local_addr();
    // Connected queues leave the handshake: they do not count.
    let (_admin, cntlid) = Client::admin(addr);
    let mut good = Client::connect(addr, false);
    assert_eq!(good.connect_queue(1, cntlid).status(), Status::SUCCESS);
    assert_eq!(t.connections().handshaking, 0);

    let started = Instant::now();
    let mut idle: Vec<TcpStream> = (0..2).map(|_| connect_from([127, 0, 0, 3], addr)).collect();
    let half = Client::connect(addr, false); // ICReq answered, no Connect
    wait_open(&t, 5);
    assert_eq!(t.connections().handshaking, 3);
    let mut over = connect_from([127, 0, 0, 4], addr);
    assert!(closed_by_target(&mut over, Duration::from_secs(5)));
    assert_eq!(
        metric(
            &t,
            "sluice_connections_refused_total",
            Some(("limit", "connections_handshaking_max"))
        ),
        1.0
    );

    // The timeout closes all three, and not before it.
    let mut half = half.s;
    for s in idle.iter_mut().chain([&mut half]) {
        assert!(closed_by_target(s, Duration::from_secs(5)));
    }
    assert!(started.elapsed() >= Duration::from_millis(600));
    wait_open(&t, 2);
    assert_eq!(t.connections().handshaking, 0);
    assert_eq!(metric(&t, "sluice_handshake_timeouts_total", None), 3.0);
    // Slots are free again for a new host.
    let (_admin2, cntlid2) = Client::admin(addr);
    assert!(cntlid2 != cntlid);
    assert_eq!(good.read(0, 8).0, Status::SUCCESS);
    t.shutdown();
}

/// DH-HMAC-CHAP outcomes and tolerated inputs are exported: failures by
/// the reason sent to the host (no host label), tolerated inputs by case.
#[test]
fn auth_outcomes_and_tolerated_inputs_are_metrics() {
    let t = start("interrupt", 1);
    let reason_failed =
        sluice_auth::message::reason::describe(sluice_auth::message::reason::FAILED);
    assert_eq!(
        metric(
            &t,
            "sluice_auth_failures_total",
            Some(("reason", reason_failed))
        ),
        0.0
    );
    t.registry()
        .auth
        .record_failure(sluice_auth::message::reason::FAILED);
    t.registry().auth.record_failure(200);
    t.registry().auth.record_success();
    assert_eq!(
        metric(
            &t,
            "sluice_auth_failures_total",
            Some(("reason", reason_failed))
        ),
        1.0
    );
    assert_eq!(
        metric(&t, "sluice_auth_failures_total", Some(("reason", "other"))),
        1.0
    );
    assert_eq!(metric(&t, "sluice_auth_successes_total", None), 1.0);
    for case in sluice_target::tolerated::Tolerated::ALL {
        // Process-wide counts: another test may add to one meanwhile.
        let before = sluice_target::tolerated::count(case) as f64;
        let v = metric(
            &t,
            "sluice_tolerated_inputs_total",
            Some(("case", case.name())),
        );
        let after = sluice_target::tolerated::count(case) as f64;
        assert!(
            (before..=after).contains(&v),
            "{}: {v} not in {before}..={after}",
            case.name()
        );
    }
    t.shutdown();
}

/// A PDU that arrives in pieces with pauses between them is read whole. A
/// worker ends a socket's reads at a short read (epoll is edge-triggered),
/// so it must be woken by each later piece: an in-capsule write sent as a
/// byte, the rest of its header, and its data in uneven pieces, 3 ms apart
/// (the worker sleeps in between, in interrupt mode and after the adaptive
/// spin), is answered and reads back.
#[test]
fn a_pdu_dribbled_in_pieces_is_read_whole() {
    for polling in ["interrupt", "adaptive"] {
        let t = start(polling, 1);
        let addr = t.local_addr();
        let (_admin, cntlid) = Client::admin(addr);
        let mut q = Client::connect(addr, false);
        assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
        let d = pattern(4096, 42);
        let s = q.in_capsule_write(64, d.len());
        let mut w = Vec::new();
        encode_pdu(&PduHeader::CapsuleCmd(s), &d, &q.txp, &mut w);
        let mut at = 0;
        for cut in [1, 8, 72, 1000, 3001, w.len()] {
            q.s.write_all(&w[at..cut]).unwrap();
            at = cut;
            std::thread::sleep(Duration::from_millis(3));
        }
        match q.recv() {
            PduHeader::CapsuleResp(c) => assert_eq!(c.status(), Status::SUCCESS, "{polling}"),
            other => panic!("{polling}: {other:?}"),
        }
        let (st, back) = q.read(64, 8);
        assert_eq!(st, Status::SUCCESS);
        assert!(back == d, "{polling}: read back differs");
        t.shutdown();
    }
}

/// The descriptors of this process open on `path`.
fn fds_on(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

/// A subsystem removed by a reload, on the real I/O layer: its host's
/// connections are closed by the target, the other subsystem serves on, and
/// once they are gone the workers drop their queues of its namespace, so
/// its file is closed (an operator may then delete or reuse it).
#[test]
fn a_removed_subsystem_is_closed_and_its_file_released() {
    const KEPT: &str = "nqn.2026-11.io.sluice:kept";
    let path = std::env::temp_dir().join(format!("sluice-removed-{}.img", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let path = std::fs::canonicalize(&path).unwrap();
    let kept = SubsystemConfig::new(KEPT)
        .with_host(HOSTNQN)
        .with_namespace(NamespaceConfig::ram(1, 4 << 20));
    let both = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen(SocketAddr::from(([127, 0, 0, 1], 0)))
                .with_discovery_listen(None)
                .with_workers(2),
        )
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(NamespaceConfig::file(1, &path).with_block_size(512)),
        )
        .with_subsystem(kept)
        .validated()
        .unwrap();
    let t = Target::start(&both).unwrap();
    let addr = t.local_addr();
    let (mut admin, cntlid) = Client::admin(addr);
    let mut q = Client::connect(addr, false);
    assert_eq!(q.connect_queue(1, cntlid).status(), Status::SUCCESS);
    let d = pattern(8192, 3);
    assert_eq!(q.write(16, &d), Status::SUCCESS);
    assert_eq!(q.read(16, 16), (Status::SUCCESS, d));
    assert!(fds_on(&path) > 0, "the target holds the file");

    let mut only_kept = both.clone();
    only_kept.subsystems.retain(|s| s.nqn != SUBNQN);
    let report = t.reload(&only_kept).unwrap();
    assert_eq!(report.subsystems_removed.len(), 1);
    assert_eq!(report.subsystems_removed[0].controllers_failed.len(), 1);
    // The failed controller's queues close at their next check.
    assert!(closed_by_target(&mut admin.s, Duration::from_secs(5)));
    assert!(closed_by_target(&mut q.s, Duration::from_secs(5)));
    drop((admin, q));
    let deadline = Instant::now() + Duration::from_secs(5);
    while fds_on(&path) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fds_on(&path), 0, "the removed namespace's file is closed");
    assert!(t.registry().subsystem(SUBNQN).is_none());
    t.shutdown();
    std::fs::remove_file(&path).unwrap();
}
