//! The target's queue state machine (`sluice_target::queue::QueueConnection`)
//! fed sequences of PDUs by a hostile host, rather than single decodes: up to
//! three connections to one registry, each driven through ICReq, Connect,
//! Property Set, admin and I/O capsules, H2CData answering (or mangling) the
//! R2Ts it got, raw bytes, split feeds, stalled backends and jumps of the
//! virtual clock. One subsystem's queues send at once, the other's through
//! PINoF's freights flushing when idle.
//!
//! Each step is an opcode byte and its fields (missing bytes read as zero).
//! Checked after every step:
//! - no panic, no arithmetic overflow (debug assertions are on);
//! - everything the target sends decodes as a well-formed PDU;
//! - nothing follows a C2HTermReq, and the connection is then closing;
//! - a CID gets no more responses than capsules the host sent with it, and
//!   C2HData and R2T only name a CID the host has outstanding;
//! - the target never has more backend I/O in flight than its queue-depth limit.
#![no_main]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use sluice_backend::{BackendQueue, IoCompletion};
use sluice_config::{Config, NamespaceConfig, SubsystemConfig, TargetSettings};
use sluice_proto::command::{admin, io, sgl, SglDescriptor, Sqe};
use sluice_proto::fabrics::{
    cc, fctype, prop, AuthCommand, ConnectCommand, ConnectData, PropertyCommand, CNTLID_DYNAMIC,
};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{
    encode_pdu, DataHeader, Direction, IcReq, PduHeader, R2t, TermReq, TxParams,
};
use sluice_proto::send::{SchedulerKind, SendConfig};
use sluice_target::queue::QueueConnection;
use sluice_target::registry::Registry;

#[path = "common/input.rs"]
mod input;
use input::Input;

const SUBNQN: &str = "nqn.2026-11.io.sluice:fuzz";
const OPEN_SUBNQN: &str = "nqn.2026-11.io.sluice:fuzz-open";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000f1";
const CONNECTIONS_MAX: usize = 3;
/// Above any queue depth the target admits (MQES is 16 bits, 0's based).
const BACKEND_IN_FLIGHT_MAX: u32 = 65_536;

struct Conn {
    q: QueueConnection,
    rx: Framer,
    txp: TxParams,
    hpda: u8,
    backends: HashMap<usize, Box<dyn BackendQueue>>,
    /// Capsules sent per CID, less responses received.
    outstanding: HashMap<u16, u32>,
    /// False once raw bytes went out: CIDs are then unknown.
    tracked: bool,
    term_seen: bool,
    r2ts: Vec<R2t>,
    cntlid: Option<u16>,
    connect_cid: Option<u16>,
    next_cid: u16,
    /// Feed in chunks of this many bytes (0: all at once).
    chunk: usize,
}

impl Conn {
    fn new(reg: &Arc<Registry>, now: Instant) -> Conn {
        Conn {
            q: QueueConnection::new(reg.clone(), None, None, now),
            rx: Framer::new(Direction::ControllerToHost, 1 << 24),
            txp: TxParams::default(),
            hpda: 0,
            backends: HashMap::new(),
            outstanding: HashMap::new(),
            tracked: true,
            term_seen: false,
            r2ts: Vec::new(),
            cntlid: None,
            connect_cid: None,
            next_cid: 0,
            chunk: 0,
        }
    }

    fn cid(&mut self, inp: &mut Input) -> u16 {
        // Mostly fresh CIDs, sometimes a reused one.
        if inp.u8() < 230 {
            self.next_cid = self.next_cid.wrapping_add(1);
        }
        self.next_cid
    }

    /// Feeds bytes as the I/O layer would: only while the target wants to read.
    fn feed(&mut self, bytes: &[u8], now: Instant) {
        let chunk = if self.chunk == 0 {
            bytes.len().max(1)
        } else {
            self.chunk
        };
        for c in bytes.chunks(chunk) {
            if !self.q.wants_read() {
                return;
            }
            self.q.feed(c, now);
        }
    }

    fn send(&mut self, h: &PduHeader, data: &[u8], now: Instant) {
        if let PduHeader::CapsuleCmd(s) = h {
            *self.outstanding.entry(s.cid()).or_default() += 1;
        }
        let mut w = Vec::new();
        encode_pdu(h, data, &self.txp, &mut w);
        self.feed(&w, now);
    }

    fn capsule(&mut self, s: Sqe, data: &[u8], inp: &mut Input, now: Instant) {
        let mut s = s;
        // Sometimes flip a byte of the SQE the structure built.
        if inp.u8() >= 224 {
            let at = usize::from(inp.u8() % 64);
            s.0[at] ^= inp.u8() | 1;
        }
        self.send(&PduHeader::CapsuleCmd(s), data, now);
    }

    /// Runs the backend (unless held) and checks everything the target sent.
    fn pump(&mut self, now: &mut Instant, hold_backend: bool) {
        for _ in 0..1_000 {
            let mut progress = false;
            if !hold_backend {
                while let Some(sub) = self.q.poll_backend() {
                    progress = true;
                    let q = match self.backends.entry(sub.ns.index) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(sub.ns.backend.open_queue().expect("RAM queue opens"))
                        }
                    };
                    q.submit(sub.req, *now);
                }
                let mut done: Vec<IoCompletion> = Vec::new();
                for q in self.backends.values_mut() {
                    q.poll_completions(*now, &mut done);
                }
                for c in done {
                    progress = true;
                    self.q.handle_backend_completion(c, *now);
                }
            }
            assert!(
                self.q.backend_in_flight() <= BACKEND_IN_FLIGHT_MAX,
                "backend in flight {}",
                self.q.backend_in_flight()
            );
            // The fuzzed host's bytes are all fed: the turn's input is done.
            self.q.handle_idle(*now);
            let due = self.q.due_copy();
            if !due.is_empty() {
                progress = true;
                self.q.consume(due.len(), *now);
                self.check_output(&due);
            }
            if !progress {
                match self.q.send_deadline() {
                    Some(d) if d > *now => {
                        *now = d;
                        self.q.handle_timeout(*now);
                    }
                    Some(_) => self.q.handle_timeout(*now),
                    None => return,
                }
            }
        }
    }

    fn check_output(&mut self, bytes: &[u8]) {
        self.rx.feed(bytes);
        loop {
            let pdu = match self.rx.next_pdu() {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => panic!("the target sent a malformed PDU: {e}"),
            };
            assert!(
                !self.term_seen,
                "the target sent {:?} after a C2HTermReq",
                pdu.header
            );
            assert!(pdu.data_digest_ok, "the target sent a bad data digest");
            match pdu.header {
                PduHeader::IcResp(r) => {
                    self.rx
                        .set_initialized(r.hdgst, r.ddgst, self.hpda, 1 << 24);
                    self.txp = TxParams {
                        hdgst: r.hdgst,
                        ddgst: r.ddgst,
                        pda: 0,
                    };
                }
                PduHeader::C2HTermReq(_) => {
                    self.term_seen = true;
                    assert!(
                        self.q.is_closing() || self.q.is_closed(),
                        "a C2HTermReq went out and the connection stays open"
                    );
                }
                PduHeader::CapsuleResp(c) => {
                    self.answered(c.cid, true);
                    // A Connect's response names the controller.
                    if self.connect_cid == Some(c.cid) && c.status().is_success() {
                        self.cntlid = Some((c.result & 0xffff) as u16);
                    }
                }
                PduHeader::C2HData(d) => self.answered(d.cccid, d.success),
                PduHeader::R2t(r) => {
                    self.answered(r.cccid, false);
                    if self.r2ts.len() < 16 {
                        self.r2ts.push(r);
                    }
                }
                ref other => panic!("the target sent a host-to-controller PDU: {other:?}"),
            }
        }
    }

    fn answered(&mut self, cid: u16, completes: bool) {
        if !self.tracked {
            return;
        }
        let n = self.outstanding.get(&cid).copied().unwrap_or(0);
        assert!(
            n > 0,
            "the target answered CID {cid}, which has no command outstanding"
        );
        if completes {
            self.outstanding.insert(cid, n - 1);
        }
    }
}

fn registry() -> Arc<Registry> {
    let settings = TargetSettings::default()
        // Above the size from which in-capsule data is split off the
        // framer and received in place (16 KiB still to come).
        .with_inline_data_bytes(32 * 1024)
        .with_max_h2c_data_bytes(4096)
        .with_max_c2h_data_bytes(4096)
        // The open subsystem's queues batch in PINoF's freights, flushing
        // when idle; the other's send at once.
        .with_subsystem_send(
            OPEN_SUBNQN,
            SendConfig {
                scheduler: SchedulerKind::Isolated,
                flush_when_idle: true,
                ..SendConfig::default()
            },
        );
    let cfg = Config::default()
        .with_target(settings)
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(NamespaceConfig::ram(1, 256 << 10).with_block_size(512)),
        )
        .with_subsystem(
            SubsystemConfig::new(OPEN_SUBNQN)
                .allow_any_host()
                .with_namespace(NamespaceConfig::ram(1, 64 << 10).with_block_size(4096)),
        )
        .validated()
        .expect("the fuzz config is valid");
    Arc::new(Registry::build(&cfg).expect("the fuzz registry builds"))
}

fn sgl_for(inp: &mut Input, len: u32) -> SglDescriptor {
    let id = match inp.u8() % 8 {
        0..=3 => sgl::TRANSPORT_DATA_BLOCK,
        4..=5 => sgl::DATA_BLOCK_OFFSET,
        _ => inp.u8(),
    };
    let length = if inp.u8() < 200 { len } else { inp.u32() };
    let address = if inp.u8() < 220 {
        0
    } else {
        u64::from(inp.u32())
    };
    SglDescriptor {
        address,
        length,
        id,
    }
}

/// A command dword: one byte (small counts and flags) or any 32 bits.
fn small_or_any(inp: &mut Input) -> u32 {
    if inp.bool() {
        u32::from(inp.u8())
    } else {
        inp.u32()
    }
}

fn step(
    inp: &mut Input,
    reg: &Arc<Registry>,
    conns: &mut Vec<Conn>,
    now: &mut Instant,
    hold: &mut bool,
) {
    let op = inp.u8();
    if op % 16 == 15 {
        if conns.len() < CONNECTIONS_MAX {
            conns.push(Conn::new(reg, *now));
        }
        return;
    }
    let i = usize::from(inp.u8()) % conns.len();
    let c = &mut conns[i];
    let t = *now;
    match op % 16 {
        0 => {
            let pfv = if inp.u8() < 200 { 0 } else { inp.u16() };
            let hpda = inp.u8() % 40;
            c.hpda = hpda.min(31);
            let flags = inp.u8();
            let maxr2t = if inp.bool() { inp.u32() } else { 0 };
            c.send(
                &PduHeader::IcReq(IcReq {
                    pfv,
                    hpda,
                    hdgst: flags & 1 != 0,
                    ddgst: flags & 2 != 0,
                    maxr2t,
                }),
                &[],
                t,
            );
        }
        1 | 2 => {
            let cid = c.cid(inp);
            let admin_q = op % 16 == 1;
            let qid = if admin_q { 0 } else { u16::from(inp.u8() % 6) };
            let sqsize = match inp.u8() % 6 {
                0 => 0,
                1 => 1,
                2 => 31,
                3 => 127,
                4 => u16::MAX,
                _ => inp.u16(),
            };
            let cntlid = if admin_q {
                if inp.u8() < 220 {
                    CNTLID_DYNAMIC
                } else {
                    inp.u16()
                }
            } else {
                match conns.iter().find_map(|x| x.cntlid) {
                    Some(id) if inp.u8() < 220 => id,
                    _ => inp.u16(),
                }
            };
            let c = &mut conns[i];
            let (subnqn, hostnqn) = match inp.u8() % 5 {
                0 | 1 => (SUBNQN, HOSTNQN.to_string()),
                2 => (OPEN_SUBNQN, String::new()),
                3 => (SUBNQN, "nqn.fuzz:stranger".to_string()),
                _ => ("nqn.2014-08.org.nvmexpress.discovery", HOSTNQN.to_string()),
            };
            let cmd = ConnectCommand {
                cid,
                recfmt: if inp.u8() < 240 { 0 } else { inp.u16() },
                qid,
                sqsize,
                cattr: inp.u8() & 0x0f,
                kato_ms: if inp.bool() {
                    0
                } else {
                    u32::from(inp.u16()) * 10
                },
            };
            let mut data = ConnectData {
                hostid: [inp.u8(); 16],
                cntlid,
                subnqn: subnqn.into(),
                hostnqn,
            }
            .encode();
            if inp.u8() >= 240 {
                let at = usize::from(inp.u16()) % data.len();
                data[at] = inp.u8();
            }
            let len = if inp.u8() < 230 {
                data.len()
            } else {
                usize::from(inp.u16()) % 2048
            };
            data.resize(len, 0);
            c.connect_cid = Some(cid);
            let mut s = cmd.to_sqe();
            s.set_sgl(SglDescriptor {
                address: 0,
                length: data.len() as u32,
                id: sgl::DATA_BLOCK_OFFSET,
            });
            c.capsule(s, &data, inp, t);
        }
        3 => {
            let cid = c.cid(inp);
            let value = match inp.u8() % 5 {
                0 => u64::from(cc::EN | 6u32 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT),
                1 => {
                    u64::from(6u32 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT | 1 << cc::SHN_SHIFT)
                }
                2 => 0,
                3 => u64::from(inp.u32()),
                _ => u64::from(inp.u32()) << 32 | u64::from(inp.u32()),
            };
            let offset = if inp.u8() < 200 {
                prop::CC
            } else {
                u32::from(inp.u8())
            };
            let s = PropertyCommand {
                size8: inp.bool(),
                offset,
                value,
            }
            .to_sqe(cid, fctype::PROPERTY_SET);
            c.capsule(s, &[], inp, t);
        }
        4 => {
            let cid = c.cid(inp);
            let offset = match inp.u8() % 6 {
                0 => prop::CAP,
                1 => prop::VS,
                2 => prop::CC,
                3 => prop::CSTS,
                4 => prop::NSSR,
                _ => u32::from(inp.u16()),
            };
            let s = PropertyCommand {
                size8: inp.bool(),
                offset,
                value: 0,
            }
            .to_sqe(cid, fctype::PROPERTY_GET);
            c.capsule(s, &[], inp, t);
        }
        5 => {
            // Admin commands, with their usual shapes and fuzzed fields.
            let cid = c.cid(inp);
            let opcode = match inp.u8() % 10 {
                0 | 1 => admin::IDENTIFY,
                2 => admin::GET_LOG_PAGE,
                3 => admin::GET_FEATURES,
                4 => admin::SET_FEATURES,
                5 => admin::KEEP_ALIVE,
                6 => admin::ABORT,
                7 => admin::ASYNC_EVENT_REQUEST,
                8 => admin::FABRICS,
                _ => inp.u8(),
            };
            let nsid = match inp.u8() % 4 {
                0 => 0,
                1 => 1,
                2 => u32::MAX,
                _ => inp.u32(),
            };
            let mut s = Sqe::new(opcode, cid, nsid);
            s.set_cdw(10, small_or_any(inp));
            s.set_cdw(11, small_or_any(inp));
            s.set_cdw(12, inp.u32());
            let len = match inp.u8() % 4 {
                0 => 0,
                1 => 4096,
                2 => 512,
                _ => u32::from(inp.u16()),
            };
            let d = sgl_for(inp, len);
            let data = if d.id == sgl::DATA_BLOCK_OFFSET {
                inp.bytes((d.length as usize).min(8192 + 64))
            } else {
                Vec::new()
            };
            s.set_sgl(d);
            if opcode == admin::FABRICS && inp.bool() {
                s = AuthCommand {
                    send: inp.bool(),
                    len,
                }
                .to_sqe(cid);
                s.set_sgl(d);
            }
            c.capsule(s, &data, inp, t);
        }
        6 | 7 => {
            // I/O commands.
            let cid = c.cid(inp);
            let opcode = match inp.u8() % 8 {
                0 | 1 => io::READ,
                2 | 3 => io::WRITE,
                4 => io::FLUSH,
                5 => io::WRITE_ZEROES,
                6 => io::DATASET_MANAGEMENT,
                _ => inp.u8(),
            };
            let nsid = if inp.u8() < 230 { 1 } else { inp.u32() };
            let slba = if inp.u8() < 230 {
                u64::from(inp.u16() % 600)
            } else {
                u64::from(inp.u32()) << 16
            };
            let nlb = u32::from(inp.u8() % 32) + 1;
            let mut s = Sqe::rw(opcode, cid, nsid, slba, nlb, inp.bool());
            if opcode == io::DATASET_MANAGEMENT {
                s.set_cdw(10, u32::from(inp.u8() % 4));
                s.set_cdw(11, 0x4);
            }
            let bytes = nlb * 512;
            let d = sgl_for(
                inp,
                if opcode == io::DATASET_MANAGEMENT {
                    16
                } else {
                    bytes
                },
            );
            let data = if d.id == sgl::DATA_BLOCK_OFFSET {
                let n = (d.length as usize).min(32 * 1024 + 64);
                let mut v = inp.bytes(n);
                v.resize(n, 0xa5);
                v
            } else {
                Vec::new()
            };
            if !matches!(opcode, io::FLUSH | io::WRITE_ZEROES) || inp.bool() {
                s.set_sgl(d);
            }
            c.capsule(s, &data, inp, t);
        }
        8 => {
            // H2CData for an R2T received, faithful or perturbed.
            if c.r2ts.is_empty() {
                return;
            }
            let r = c.r2ts[usize::from(inp.u8()) % c.r2ts.len()];
            let mode = inp.u8();
            let (mut offset, mut len) = (r.offset, r.len);
            if mode & 0x0f == 1 {
                offset = offset.wrapping_add(u32::from(inp.u16()));
            }
            if mode & 0x0f == 2 {
                len = u32::from(inp.u16()).max(1);
            }
            let ttag = if mode & 0x0f == 3 { inp.u16() } else { r.ttag };
            let cccid = if mode & 0x0f == 4 { inp.u16() } else { r.cccid };
            let pieces = u32::from(inp.u8() % 4) + 1;
            let piece = len.div_ceil(pieces).clamp(1, 1 << 16);
            let mut off = 0u32;
            while off < len {
                let n = piece.min(len - off);
                let h = PduHeader::H2CData(DataHeader {
                    cccid,
                    ttag,
                    offset: offset.wrapping_add(off),
                    len: n,
                    last: off + n == len || mode & 0x10 != 0,
                    success: mode & 0x20 != 0,
                });
                let data = vec![mode; n as usize];
                c.send(&h, &data, t);
                off += n;
            }
            if mode & 0x40 == 0 {
                c.r2ts.retain(|x| x != &r);
            }
        }
        9 => {
            // Raw bytes: a mangled copy of a small capsule, or noise.
            let n = usize::from(inp.u8()) + 1;
            let bytes = inp.bytes(n);
            c.tracked = false;
            c.feed(&bytes, t);
        }
        10 => {
            let fes = inp.u16();
            let fei = inp.u32();
            let quoted = usize::from(inp.u8() % 140);
            let term = TermReq {
                fes,
                fei,
                data: inp.bytes(quoted),
            };
            c.send(&PduHeader::H2CTermReq(term), &[], t);
        }
        11 => {
            *now += Duration::from_millis(u64::from(inp.u16()) * 4);
            for x in conns.iter_mut() {
                x.q.handle_timeout(*now);
            }
        }
        12 => c.chunk = usize::from(inp.u8() % 9),
        13 => *hold = inp.bool(),
        14 => {
            if inp.bool() {
                c.q.handle_peer_closed("fuzz: peer closed");
            } else {
                c.q.begin_drain();
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let reg = registry();
    let mut now = Instant::now();
    let mut conns = vec![Conn::new(&reg, now)];
    let mut hold = false;
    let mut inp = Input(data);
    let mut steps = 0;
    while !inp.done() && steps < 256 {
        step(&mut inp, &reg, &mut conns, &mut now, &mut hold);
        for c in conns.iter_mut() {
            c.pump(&mut now, hold);
        }
        steps += 1;
    }
    // Everything held completes; then every connection goes away.
    for c in conns.iter_mut() {
        c.pump(&mut now, false);
        c.q.handle_peer_closed("fuzz: end of input");
        c.pump(&mut now, false);
        c.q.finish();
    }
});
