//! The host's send path as a scheduler, with virtual time: read
//! commands go to the latency freight, writes with in-capsule data and
//! H2CData to the data freight; each trigger fires exactly when it should,
//! priorities reorder only across freights and never within a command.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use sluice_host::core::{CoreConfig, Payload, QueuePairCore};
use sluice_proto::command::{io, Sqe};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{encode_pdu, Direction, IcResp, PduHeader, R2t, TxParams};
use sluice_proto::send::{FlushReason, FreightParams, SchedulerKind, SendConfig, Weights};

fn cfg() -> CoreConfig {
    CoreConfig {
        qid: 1,
        depth: 64,
        hdr_digest: false,
        data_digest: false,
        in_capsule_max_bytes: 8192,
        command_timeout: Duration::from_secs(5),
        c2h_data_max_bytes: 1 << 20,
    }
}

fn fp(size: u32, degree: u32, timer_us: u64) -> FreightParams {
    FreightParams {
        size_bytes: size,
        degree,
        timer: Duration::from_micros(timer_us),
    }
}

/// What the controller saw: (kind, cid, opcode or data offset).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Cmd { cid: u16, opcode: u8, data: usize },
    H2C { cid: u16, offset: u32, len: u32 },
}

struct Ctrl {
    rx: Framer,
}

impl Ctrl {
    fn recv(&mut self, host: &mut QueuePairCore) -> Vec<Seen> {
        while let Some(b) = host.poll_transmit() {
            self.rx.feed(&b);
        }
        let mut out = Vec::new();
        while let Some(p) = self.rx.next_pdu().expect("valid PDU") {
            match &p.header {
                PduHeader::CapsuleCmd(sqe) => out.push(Seen::Cmd {
                    cid: sqe.cid(),
                    opcode: sqe.opcode(),
                    data: p.data.len(),
                }),
                PduHeader::H2CData(h) => out.push(Seen::H2C {
                    cid: h.cccid,
                    offset: h.offset,
                    len: h.len,
                }),
                PduHeader::IcReq(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        out
    }
}

fn connect(send: SendConfig) -> (QueuePairCore, Ctrl, Instant) {
    let now = Instant::now();
    let mut host = QueuePairCore::with_scheduler(cfg(), now, send.build(false));
    let mut ctrl = Ctrl {
        rx: Framer::new(Direction::HostToController, 1 << 20),
    };
    // ICReq is a control PDU: due at once in every mode.
    assert!(ctrl.recv(&mut host).is_empty());
    assert!(host.send_deadline().is_none());
    let mut b = Vec::new();
    encode_pdu(
        &PduHeader::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: false,
            ddgst: false,
            maxh2cdata: 8192,
        }),
        &[],
        &TxParams::default(),
        &mut b,
    );
    ctrl.rx.set_initialized(false, false, 0, 1 << 20);
    host.handle_bytes(now, &b);
    assert!(host.is_ready());
    (host, ctrl, now)
}

fn isolated() -> SendConfig {
    SendConfig {
        scheduler: SchedulerKind::Isolated,
        ..SendConfig::default()
    }
}

fn read(host: &mut QueuePairCore, now: Instant, lba: u64, token: u64) -> u16 {
    host.submit(
        now,
        Sqe::rw(io::READ, 0, 1, lba, 8, false),
        Payload::Read(4096),
        token,
    )
    .expect("submit read")
}

fn write(host: &mut QueuePairCore, now: Instant, lba: u64, len: usize, token: u64) -> u16 {
    let blocks = (len / 512) as u32;
    host.submit(
        now,
        Sqe::rw(io::WRITE, 0, 1, lba, blocks, false),
        Payload::Write(vec![0x5a; len]),
        token,
    )
    .expect("submit write")
}

fn r2t(host: &mut QueuePairCore, now: Instant, cid: u16, len: u32) {
    let mut b = Vec::new();
    encode_pdu(
        &PduHeader::R2t(R2t {
            cccid: cid,
            ttag: 1,
            offset: 0,
            len,
        }),
        &[],
        &TxParams::default(),
        &mut b,
    );
    host.handle_bytes(now, &b);
}

const NS: Duration = Duration::from_nanos(1);

#[test]
fn read_waits_in_the_latency_freight_exactly_its_timer() {
    let (mut host, mut ctrl, t0) = connect(isolated());
    let cid = read(&mut host, t0, 0, 1);
    assert!(ctrl.recv(&mut host).is_empty());
    assert_eq!(host.send_deadline(), Some(t0 + Duration::from_micros(25)));
    host.poll_send(t0 + Duration::from_micros(25) - NS);
    assert!(ctrl.recv(&mut host).is_empty());
    host.poll_send(t0 + Duration::from_micros(25));
    assert_eq!(
        ctrl.recv(&mut host),
        vec![Seen::Cmd {
            cid,
            opcode: 0x02,
            data: 0
        }]
    );
    let s = host.send_stats();
    assert_eq!(s.reason(FlushReason::Timer), 1);
    assert_eq!(s.waited_latency, 1);
    assert_eq!(s.wait_ns_latency, 25_000);
    assert!(host.send_deadline().is_none());
}

#[test]
fn reads_overtake_a_held_in_capsule_write() {
    let (mut host, mut ctrl, t0) = connect(isolated());
    let w = write(&mut host, t0, 100, 4096, 1);
    let r = read(&mut host, t0 + Duration::from_micros(1), 0, 2);
    // Latency freight first (25 µs after the read), data at 75 µs.
    host.poll_send(t0 + Duration::from_micros(26));
    assert_eq!(
        ctrl.recv(&mut host),
        vec![Seen::Cmd {
            cid: r,
            opcode: 0x02,
            data: 0
        }]
    );
    host.poll_send(t0 + Duration::from_micros(75) - NS);
    assert!(ctrl.recv(&mut host).is_empty());
    host.poll_send(t0 + Duration::from_micros(75));
    assert_eq!(
        ctrl.recv(&mut host),
        vec![Seen::Cmd {
            cid: w,
            opcode: 0x01,
            data: 4096
        }]
    );
    let s = host.send_stats();
    assert_eq!(s.waited_data, 1);
    assert_eq!(s.wait_ns_data, 75_000);
}

#[test]
fn read_commands_flush_by_weighted_degree() {
    // Commands weigh like responses (2): four reads fill an 8-degree freight.
    let (mut host, mut ctrl, t0) = connect(isolated());
    for i in 0..3 {
        read(&mut host, t0, i, i);
    }
    assert!(ctrl.recv(&mut host).is_empty());
    read(&mut host, t0, 3, 3);
    assert_eq!(ctrl.recv(&mut host).len(), 4);
    assert_eq!(host.send_stats().reason(FlushReason::Priority), 1);
    // Without weights, the paper's 512 B freight overflows before the degree
    // of 8: a capsule is 72 B, so the 8th one flushes the 7 before it (size
    // trigger) and waits for the next batch.
    let unweighted = Weights {
        r2t: 1,
        response: 1,
        data: 1,
    };
    let (mut host, mut ctrl, t0) = connect(SendConfig {
        weights: unweighted,
        ..isolated()
    });
    for i in 0..7 {
        read(&mut host, t0, i, i);
    }
    assert!(ctrl.recv(&mut host).is_empty());
    read(&mut host, t0, 7, 7);
    assert_eq!(ctrl.recv(&mut host).len(), 7);
    assert_eq!(host.send_stats().reason(FlushReason::Size), 1);
    assert_eq!(host.send_deadline(), Some(t0 + Duration::from_micros(25)));
    // With room for them, it takes the full degree of 8.
    let (mut host, mut ctrl, t0) = connect(SendConfig {
        weights: unweighted,
        latency: fp(4096, 8, 25),
        ..isolated()
    });
    for i in 0..7 {
        read(&mut host, t0, i, i);
    }
    assert!(ctrl.recv(&mut host).is_empty());
    read(&mut host, t0, 7, 7);
    assert_eq!(ctrl.recv(&mut host).len(), 8);
    assert_eq!(host.send_stats().reason(FlushReason::Degree), 1);
}

#[test]
fn h2c_data_goes_to_the_data_freight_in_order() {
    let (mut host, mut ctrl, t0) = connect(isolated());
    // 32 KiB: above the 8 KiB in-capsule limit, so the capsule carries no
    // data (latency freight) and the data follows the R2T.
    let w = write(&mut host, t0, 0, 32768, 1);
    host.poll_send(t0 + Duration::from_micros(25));
    assert_eq!(
        ctrl.recv(&mut host),
        vec![Seen::Cmd {
            cid: w,
            opcode: 0x01,
            data: 0
        }]
    );
    let t1 = t0 + Duration::from_micros(30);
    r2t(&mut host, t1, w, 32768);
    // Four 8 KiB H2CData PDUs (MAXH2CDATA): the size trigger (64 KiB) is not
    // reached, the degree (16) neither; they wait for the 75 µs timer.
    assert!(ctrl.recv(&mut host).is_empty());
    let r = read(&mut host, t1, 500, 2);
    host.poll_send(t1 + Duration::from_micros(25));
    assert_eq!(
        ctrl.recv(&mut host),
        vec![Seen::Cmd {
            cid: r,
            opcode: 0x02,
            data: 0
        }]
    );
    host.poll_send(t1 + Duration::from_micros(75));
    let got = ctrl.recv(&mut host);
    let want: Vec<Seen> = (0..4)
        .map(|i| Seen::H2C {
            cid: w,
            offset: i * 8192,
            len: 8192,
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn unified_batches_everything_up_to_its_degree() {
    let (mut host, mut ctrl, t0) = connect(SendConfig {
        scheduler: SchedulerKind::Unified,
        ..SendConfig::default()
    });
    for i in 0..15u64 {
        if i % 2 == 0 {
            read(&mut host, t0, i, i);
        } else {
            write(&mut host, t0, 100 + i * 8, 512, i);
        }
    }
    assert!(ctrl.recv(&mut host).is_empty());
    assert_eq!(host.send_deadline(), Some(t0 + Duration::from_micros(50)));
    read(&mut host, t0, 99, 99);
    let got = ctrl.recv(&mut host);
    assert_eq!(got.len(), 16);
    // Submission order is kept within the one container.
    let cids: Vec<u16> = got
        .iter()
        .map(|s| match s {
            Seen::Cmd { cid, .. } => *cid,
            Seen::H2C { cid, .. } => *cid,
        })
        .collect();
    // CIDs are handed out in ascending order on a fresh queue.
    assert_eq!(cids, (0..16).collect::<Vec<u16>>());
    assert_eq!(host.send_stats().reason(FlushReason::Degree), 1);
}

#[test]
fn immediate_sends_at_once() {
    let (mut host, mut ctrl, t0) = connect(SendConfig::default());
    read(&mut host, t0, 0, 1);
    write(&mut host, t0, 8, 512, 2);
    assert_eq!(ctrl.recv(&mut host).len(), 2);
    assert!(host.send_deadline().is_none());
}

#[derive(Debug, Clone)]
enum Op {
    Read,
    Write(usize),
    Step(u64),
    R2t,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Read),
        3 => prop::sample::select(vec![512usize, 4096, 8192, 16384, 65536]).prop_map(Op::Write),
        3 => (0u64..120).prop_map(Op::Step),
        2 => Just(Op::R2t),
    ]
}

fn sched() -> impl Strategy<Value = SendConfig> {
    (
        0..3usize,
        prop::sample::select(vec![64u32, 512, 8192, 65536]),
        1u32..20,
        1u64..100,
        1u32..4,
    )
        .prop_map(|(k, size, degree, timer, w)| SendConfig {
            scheduler: [
                SchedulerKind::Immediate,
                SchedulerKind::Unified,
                SchedulerKind::Isolated,
            ][k],
            unified: fp(size, degree, timer),
            latency: fp(size, degree, timer),
            data: fp(size.max(4096), degree + 3, timer + 20),
            weights: Weights {
                r2t: w,
                response: w,
                data: 1,
            },
            ..SendConfig::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Under random submissions, R2Ts, time steps and schedulers: every
    /// command capsule reaches the controller exactly once, every H2CData
    /// exactly once and in offset order after its capsule, and nothing is
    /// held past the largest timer.
    #[test]
    fn nothing_lost_duplicated_or_reordered(send in sched(), ops in prop::collection::vec(op(), 1..60)) {
        let (mut host, mut ctrl, t0) = connect(send);
        let mut now = t0;
        let mut seen: Vec<Seen> = Vec::new();
        let mut cmds: Vec<(u16, usize, bool)> = Vec::new(); // (cid, len, is_read)
        let mut solicited: Vec<u16> = Vec::new();
        let mut token = 0u64;
        for o in ops {
            match o {
                Op::Read if host.can_submit() => {
                    token += 1;
                    let c = read(&mut host, now, token * 16, token);
                    cmds.push((c, 4096, true));
                }
                Op::Write(len) if host.can_submit() => {
                    token += 1;
                    let c = write(&mut host, now, token * 256, len, token);
                    cmds.push((c, len, false));
                }
                Op::Step(us) => {
                    now += Duration::from_micros(us);
                    host.poll_send(now);
                }
                Op::R2t => {
                    // Solicit the data of the oldest large write whose
                    // capsule the controller has seen.
                    let next = cmds.iter().find(|(c, len, r)| {
                        !*r && *len > 8192
                            && !solicited.contains(c)
                            && seen.iter().any(|s| matches!(s, Seen::Cmd { cid, .. } if cid == c))
                    });
                    if let Some(&(c, len, _)) = next {
                        solicited.push(c);
                        r2t(&mut host, now, c, len as u32);
                    }
                }
                _ => {}
            }
            seen.extend(ctrl.recv(&mut host));
            if let Some(d) = host.send_deadline() {
                prop_assert!(d <= now + Duration::from_micros(200), "deadline too far");
            }
        }
        now += Duration::from_micros(200);
        host.poll_send(now);
        seen.extend(ctrl.recv(&mut host));
        prop_assert!(!host.has_transmit());
        for (c, len, is_read) in &cmds {
            let caps: Vec<usize> = seen
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s, Seen::Cmd { cid, .. } if cid == c))
                .map(|(i, _)| i)
                .collect();
            prop_assert_eq!(caps.len(), 1, "capsule of cid {} seen {:?}", c, caps);
            let data: Vec<(usize, u32, u32)> = seen
                .iter()
                .enumerate()
                .filter_map(|(i, s)| match s {
                    Seen::H2C { cid, offset, len } if cid == c => Some((i, *offset, *len)),
                    _ => None,
                })
                .collect();
            if !is_read && *len > 8192 && solicited.contains(c) {
                let total: u32 = data.iter().map(|d| d.2).sum();
                prop_assert_eq!(total as usize, *len);
                let mut off = 0;
                for (i, o, l) in &data {
                    prop_assert!(*i > caps[0]);
                    prop_assert_eq!(*o, off);
                    off += l;
                }
            } else {
                prop_assert!(data.is_empty());
            }
        }
    }
}
