//! A hand-written, byte-level host driving a target `QueueConnection` with
//! virtual time. It exists for what the real host never does: hostile or
//! malformed PDUs, out-of-order data, commands the host API cannot express.
//! Well-behaved protocol tests run on the real pair in `crates/sluice-pair`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_backend::{BackendQueue, IoCompletion};
use sluice_config::{Config, NamespaceConfig, SubsystemConfig, TargetSettings};
use sluice_proto::coalesce::CoalesceMode;
use sluice_proto::command::{admin, io, sgl, Cqe, SglDescriptor, Sqe};
use sluice_proto::fabrics::{
    cc, fctype, ConnectCommand, ConnectData, PropertyCommand, CNTLID_DYNAMIC,
};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{encode_pdu, DataHeader, Direction, IcReq, PduHeader, TxParams};
use sluice_proto::send::{SchedulerKind, SendConfig};
use sluice_proto::Status;
use sluice_target::queue::QueueConnection;
use sluice_target::registry::Registry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const SUBNQN: &str = "nqn.2026-11.io.sluice:test";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
pub const HOSTID: [u8; 16] = [7; 16];

/// The send paths (`SCHEDULER[/COALESCING]`) the target's protocol tests
/// run in: each test loops over them (the well-behaved host's view of every
/// combination is in `crates/sluice-pair`).
pub const SEND_MODES: [&str; 7] = [
    "immediate",
    "unified",
    "isolated",
    "immediate/static",
    "immediate/adaptive",
    "isolated/calibrated",
    "unified/calibrated",
];

/// The send path `mode` (`SCHEDULER[/COALESCING]`): that scheduler, and
/// response coalescing in that mode (`off` when absent) with threshold 4
/// and timeout 20 µs.
pub fn send_config(mode: &str) -> SendConfig {
    let (sched, co) = mode.split_once('/').unwrap_or((mode, "off"));
    let mut s = SendConfig {
        scheduler: sched.parse::<SchedulerKind>().expect("send mode scheduler"),
        ..SendConfig::default()
    };
    s.coalescing.mode = co.parse::<CoalesceMode>().expect("send mode coalescing");
    s.coalescing.threshold = 4;
    s.coalescing.timeout = Duration::from_micros(20);
    s
}

/// The tests' target settings: 8 KiB in-capsule data, H2CData and C2HData
/// PDUs, and the send path `send`.
pub fn target_settings(send: SendConfig) -> TargetSettings {
    TargetSettings::default()
        .with_inline_data_bytes(8192)
        .with_max_h2c_data_bytes(8192)
        .with_max_c2h_data_bytes(8192)
        .with_send(send)
}

/// A target config with send path `send`: [`SUBNQN`] admitting [`HOSTNQN`],
/// with namespace `ns`.
pub fn config(send: SendConfig, ns: NamespaceConfig) -> Config {
    Config::default()
        .with_target(target_settings(send))
        .with_subsystem(
            SubsystemConfig::new(SUBNQN)
                .with_host(HOSTNQN)
                .with_namespace(ns),
        )
        .validated()
        .expect("test config is valid")
}

/// A target config with send path `mode` (see [`send_config`]).
pub fn config_in(mode: &str, ns: NamespaceConfig) -> Config {
    config(send_config(mode), ns)
}

/// Namespace 1: 4 MiB of RAM, 512-byte blocks.
pub fn default_ns() -> NamespaceConfig {
    NamespaceConfig::ram(1, 4 << 20).with_block_size(512)
}

pub fn registry(c: &Config) -> Arc<Registry> {
    Arc::new(Registry::build(c).expect("registry builds"))
}

/// A received PDU.
#[derive(Debug, Clone)]
pub struct Got {
    pub header: PduHeader,
    pub data: Vec<u8>,
    pub digest_ok: bool,
}

pub struct Pair {
    pub reg: Arc<Registry>,
    pub conn: QueueConnection,
    pub now: Instant,
    pub host_rx: Framer,
    pub txp: TxParams,
    pub queues: HashMap<usize, Box<dyn BackendQueue>>,
    pub inbox: Vec<Got>,
    pub next_cid: u16,
    pub term: Option<(u16, u32)>,
    /// The Host Identifier this pair's Connect commands carry.
    pub hostid: [u8; 16],
}

impl Pair {
    pub fn new(reg: Arc<Registry>) -> Pair {
        let now = Instant::now();
        Pair {
            conn: QueueConnection::new(reg.clone(), None, None, now),
            reg,
            now,
            host_rx: Framer::new(Direction::ControllerToHost, 1 << 24),
            txp: TxParams::default(),
            queues: HashMap::new(),
            inbox: Vec::new(),
            next_cid: 1,
            term: None,
            hostid: HOSTID,
        }
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.conn.handle_timeout(self.now);
        self.pump();
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.conn.feed(bytes, self.now);
        self.pump();
    }

    pub fn send(&mut self, h: &PduHeader, data: &[u8]) {
        let mut w = Vec::new();
        encode_pdu(h, data, &self.txp, &mut w);
        self.send_raw(&w);
    }

    /// Runs backend I/O to completion (advancing virtual time for time-driven
    /// backends) and collects everything the target sends.
    pub fn pump(&mut self) {
        for _ in 0..10_000 {
            let mut progress = false;
            while let Some(sub) = self.conn.poll_backend() {
                progress = true;
                let q = self
                    .queues
                    .entry(sub.ns.index)
                    .or_insert_with(|| sub.ns.backend.open_queue().expect("queue"));
                q.submit(sub.req, self.now);
            }
            let mut out: Vec<IoCompletion> = Vec::new();
            let mut next: Option<Instant> = None;
            for q in self.queues.values_mut() {
                q.poll_completions(self.now, &mut out);
                if let Some(d) = q.next_deadline() {
                    next = Some(next.map_or(d, |x: Instant| x.min(d)));
                }
            }
            for c in out {
                progress = true;
                self.conn.handle_backend_completion(c, self.now);
            }
            let due = self.conn.due_copy();
            if !due.is_empty() {
                progress = true;
                self.conn.consume(due.len(), self.now);
                self.host_rx.feed(&due);
                loop {
                    match self.host_rx.next_pdu() {
                        Ok(Some(p)) => {
                            if let PduHeader::C2HTermReq(t) = &p.header {
                                self.term = Some((t.fes, t.fei));
                            }
                            let g = Got {
                                header: p.header,
                                data: p.data.to_vec(),
                                digest_ok: p.data_digest_ok,
                            };
                            if let PduHeader::IcResp(r) = &g.header {
                                self.host_rx.set_initialized(r.hdgst, r.ddgst, 0, 1 << 24);
                            }
                            self.inbox.push(g);
                        }
                        Ok(None) => break,
                        Err(e) => panic!("target sent a malformed PDU: {e}"),
                    }
                }
            }
            if !progress {
                let busy = self.queues.values().any(|q| q.in_flight() > 0);
                // PDUs held by the send scheduler leave at their deadline, as
                // the worker's poll timeout makes them do.
                if let Some(d) = self.conn.send_deadline() {
                    if !busy || next.is_none_or(|n| d <= n) {
                        self.now = self.now.max(d);
                        self.conn.handle_timeout(self.now);
                        continue;
                    }
                }
                match next {
                    Some(d) if busy => {
                        self.now = self.now.max(d);
                    }
                    _ if busy => {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    _ => return,
                }
            }
        }
        panic!("pump did not settle");
    }

    pub fn take(&mut self) -> Vec<Got> {
        std::mem::take(&mut self.inbox)
    }

    pub fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        self.next_cid
    }

    pub fn icreq(&mut self, hdgst: bool, ddgst: bool) {
        self.send(
            &PduHeader::IcReq(IcReq {
                pfv: 0,
                hpda: 0,
                hdgst,
                ddgst,
                maxr2t: 0,
            }),
            &[],
        );
        let got = self.take();
        assert!(
            matches!(
                got.as_slice(),
                [Got {
                    header: PduHeader::IcResp(_),
                    ..
                }]
            ),
            "{got:?}"
        );
        self.txp = TxParams {
            hdgst,
            ddgst,
            pda: 0,
        };
    }

    /// Sends a capsule and returns the response CQE (and any C2H data).
    pub fn command(&mut self, sqe: Sqe, inline: &[u8]) -> (Cqe, Vec<u8>) {
        self.send(&PduHeader::CapsuleCmd(sqe), inline);
        self.collect_response(sqe.cid())
    }

    pub fn collect_response(&mut self, cid: u16) -> (Cqe, Vec<u8>) {
        let mut data = Vec::new();
        let got = self.take();
        let mut cqe = None;
        for g in got {
            match g.header {
                PduHeader::C2HData(d) if d.cccid == cid => {
                    assert!(g.digest_ok, "C2H data digest");
                    assert_eq!(d.offset as usize, data.len(), "C2HData in order");
                    data.extend_from_slice(&g.data);
                    if d.success {
                        cqe = Some(Cqe {
                            cid,
                            sqhd: 0xffff,
                            ..Default::default()
                        });
                    }
                }
                PduHeader::CapsuleResp(c) if c.cid == cid => cqe = Some(c),
                other => panic!("unexpected PDU {other:?}"),
            }
        }
        (
            cqe.unwrap_or_else(|| panic!("no response for cid {cid}")),
            data,
        )
    }

    pub fn connect(&mut self, qid: u16, cntlid: u16, hostnqn: &str, kato_ms: u32) -> Cqe {
        let sqsize = if qid == 0 { 31 } else { 63 };
        self.connect_req(SUBNQN, hostnqn, qid, cntlid, sqsize, 0, kato_ms)
    }

    /// Connect to any subsystem (SQSIZE 31, no KATO) with the given CATTR.
    pub fn connect_to(&mut self, subnqn: &str, qid: u16, cntlid: u16, cattr: u8) -> Cqe {
        self.connect_req(subnqn, HOSTNQN, qid, cntlid, 31, cattr, 0)
    }

    /// Connect to any subsystem as any host NQN (SQSIZE 31, no KATO).
    pub fn connect_as(&mut self, subnqn: &str, hostnqn: &str, qid: u16, cntlid: u16) -> Cqe {
        self.connect_req(subnqn, hostnqn, qid, cntlid, 31, 0, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn connect_req(
        &mut self,
        subnqn: &str,
        hostnqn: &str,
        qid: u16,
        cntlid: u16,
        sqsize: u16,
        cattr: u8,
        kato_ms: u32,
    ) -> Cqe {
        let cid = self.cid();
        let cmd = ConnectCommand {
            cid,
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato_ms,
        };
        let data = ConnectData {
            hostid: self.hostid,
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode();
        self.command(cmd.to_sqe(), &data).0
    }

    pub fn prop_get(&mut self, offset: u32, size8: bool) -> u64 {
        let cid = self.cid();
        let (c, _) = self.command(
            PropertyCommand {
                size8,
                offset,
                value: 0,
            }
            .to_sqe(cid, fctype::PROPERTY_GET),
            &[],
        );
        assert!(c.status().is_success(), "{:?}", c.status());
        c.result as u64 | (c.dw1 as u64) << 32
    }

    pub fn prop_set(&mut self, offset: u32, value: u64) -> Status {
        let cid = self.cid();
        self.command(
            PropertyCommand {
                size8: false,
                offset,
                value,
            }
            .to_sqe(cid, fctype::PROPERTY_SET),
            &[],
        )
        .0
        .status()
    }

    /// ICReq, admin Connect, CC.EN. Returns the CNTLID.
    pub fn admin_up(&mut self) -> u16 {
        self.admin_up_as(HOSTNQN)
    }

    /// [`Pair::admin_up`] as host `hostnqn` (with [`Pair::hostid`]).
    pub fn admin_up_as(&mut self, hostnqn: &str) -> u16 {
        self.icreq(false, false);
        let c = self.connect(0, CNTLID_DYNAMIC, hostnqn, 5000);
        assert!(c.status().is_success(), "{:?}", c.status());
        let cntlid = c.result as u16;
        let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        assert_eq!(
            self.prop_set(sluice_proto::fabrics::prop::CC, en as u64),
            Status::SUCCESS
        );
        assert_eq!(
            self.prop_get(sluice_proto::fabrics::prop::CSTS, false) & 1,
            1
        );
        cntlid
    }

    pub fn admin_cmd(
        &mut self,
        opcode: u8,
        nsid: u32,
        cdw10: u32,
        cdw11: u32,
        c2h_len: u32,
    ) -> (Cqe, Vec<u8>) {
        let cid = self.cid();
        let mut s = Sqe::new(opcode, cid, nsid);
        s.set_cdw(10, cdw10);
        s.set_cdw(11, cdw11);
        if c2h_len > 0 {
            s.set_sgl(SglDescriptor {
                address: 0,
                length: c2h_len,
                id: sgl::TRANSPORT_DATA_BLOCK,
            });
        }
        self.command(s, &[])
    }

    pub fn identify(&mut self, cns: u8, nsid: u32) -> (Status, Vec<u8>) {
        let (c, d) = self.admin_cmd(admin::IDENTIFY, nsid, cns as u32, 0, 4096);
        (c.status(), d)
    }

    /// Write to namespace 1 with in-capsule data when it fits
    /// `inline_max`, else via R2T.
    pub fn write(&mut self, slba: u64, data: &[u8], inline_max: usize) -> Status {
        self.write_ns(1, slba, data, inline_max)
    }

    /// [`Pair::write`] to namespace `nsid`.
    pub fn write_ns(&mut self, nsid: u32, slba: u64, data: &[u8], inline_max: usize) -> Status {
        let cid = self.cid();
        let nlb = (data.len() / 512) as u32;
        let mut s = Sqe::rw(io::WRITE, cid, nsid, slba, nlb, false);
        if data.len() <= inline_max {
            s.set_sgl(SglDescriptor {
                address: 0,
                length: data.len() as u32,
                id: sgl::DATA_BLOCK_OFFSET,
            });
            return self.command(s, data).0.status();
        }
        s.set_sgl(SglDescriptor {
            address: 0,
            length: data.len() as u32,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        self.send(&PduHeader::CapsuleCmd(s), &[]);
        let got = self.take();
        let r2t = match got.as_slice() {
            [Got {
                header: PduHeader::R2t(r),
                ..
            }] => *r,
            [Got {
                header: PduHeader::CapsuleResp(c),
                ..
            }] => return c.status(),
            other => panic!("expected R2T, got {other:?}"),
        };
        assert_eq!(r2t.cccid, cid);
        assert_eq!((r2t.offset, r2t.len as usize), (0, data.len()));
        self.h2c_all(cid, r2t.ttag, data, 8192);
        let (c, _) = self.collect_response(cid);
        c.status()
    }

    pub fn h2c_all(&mut self, cid: u16, ttag: u16, data: &[u8], chunk: usize) {
        let mut off = 0;
        let mut wire = Vec::new();
        while off < data.len() {
            let n = chunk.min(data.len() - off);
            let h = PduHeader::H2CData(DataHeader {
                cccid: cid,
                ttag,
                offset: off as u32,
                len: n as u32,
                last: off + n == data.len(),
                success: false,
            });
            encode_pdu(&h, &data[off..off + n], &self.txp, &mut wire);
            off += n;
        }
        self.send_raw(&wire);
    }

    /// Reads `nlb` 512-byte blocks at `slba` of namespace 1.
    pub fn read(&mut self, slba: u64, nlb: u32) -> (Status, Vec<u8>) {
        self.read_ns(1, slba, nlb)
    }

    /// [`Pair::read`] of namespace `nsid`.
    pub fn read_ns(&mut self, nsid: u32, slba: u64, nlb: u32) -> (Status, Vec<u8>) {
        let cid = self.cid();
        let mut s = Sqe::rw(io::READ, cid, nsid, slba, nlb, false);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: nlb * 512,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        let (c, d) = self.command(s, &[]);
        (c.status(), d)
    }

    /// Sends an Asynchronous Event Request with `cid`; it is held (no
    /// response).
    pub fn post_aer(&mut self, cid: u16) {
        self.send(
            &PduHeader::CapsuleCmd(Sqe::new(admin::ASYNC_EVENT_REQUEST, cid, 0)),
            &[],
        );
        let got = self.take();
        assert!(got.is_empty(), "AER {cid} is held: {got:?}");
    }
}

/// A target with an admin queue connected (returns the admin pair and CNTLID).
pub fn admin_pair(reg: &Arc<Registry>) -> (Pair, u16) {
    let mut p = Pair::new(reg.clone());
    let id = p.admin_up();
    (p, id)
}

/// An I/O queue connected to controller `cntlid`.
pub fn io_pair(reg: &Arc<Registry>, cntlid: u16, hdgst: bool, ddgst: bool) -> Pair {
    let mut p = Pair::new(reg.clone());
    p.icreq(hdgst, ddgst);
    let c = p.connect(1, cntlid, HOSTNQN, 0);
    assert!(c.status().is_success(), "{:?}", c.status());
    p
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    sluice_testdata::pattern(len, u64::from(seed))
}
