//! A small, scriptable in-memory NVMe/TCP target (one RAM namespace, one
//! thread per connection, blocking sockets on loopback). It is not Sluice's
//! target: the host's tests use the real one (`RealTarget` in `mod.rs`,
//! and the in-memory pair in `crates/sluice-pair`) wherever a well-behaved
//! controller will do, and keep this one only for peer behaviour the real
//! target does not have or cannot be made to show: a CPDA other than 0 and
//! odd C2HData sizes, discovery logs with referrals, dropping every
//! connection while still listening, and recording the CDW13 it received.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_proto::command::{admin, io, sgl, Cqe, Sqe};
use sluice_proto::fabrics::{
    fctype, prop, Cap, ConnectCommand, ConnectData, PropertyCommand, VS_1_3,
};
use sluice_proto::framer::Framer;
use sluice_proto::identify::{
    cns, cntrltype, encode_active_ns_list, oncs, IdentifyController, IdentifyControllerNvm,
    IdentifyNamespace,
};
use sluice_proto::log::{encode_discovery_log, DiscoveryEntry, GetLogPage};
use sluice_proto::pdu::{encode_pdu, DataHeader, Direction, IcResp, PduHeader, R2t, TxParams};
use sluice_proto::{Status, DISCOVERY_NQN};

/// Configuration of a [`MemTarget`].
#[derive(Debug, Clone)]
pub struct MemTargetConfig {
    pub subnqn: String,
    /// Host NQNs allowed to connect (empty: any).
    pub allowed_hosts: Vec<String>,
    pub block_size_bytes: u32,
    pub size_blocks: u64,
    /// MDTS as a power of two of 4 KiB pages (0 = no limit).
    pub mdts: u8,
    pub maxh2cdata_bytes: u32,
    /// Controller PDU data alignment announced in ICResp.
    pub cpda: u8,
    /// In-capsule data accepted on I/O queues.
    pub in_capsule_bytes: u32,
    /// C2HData PDUs carry at most this much.
    pub c2h_chunk_bytes: u32,
    /// Use the C2HData SUCCESS flag instead of a CapsuleResp for reads.
    pub c2h_success: bool,
    pub io_queues_max: u16,
    /// Entries served by the discovery log.
    pub discovery: Vec<DiscoveryEntry>,
    /// ONCS in Identify Controller; Write Zeroes and Dataset Management
    /// not in it are refused with Invalid Opcode.
    pub oncs: u16,
    /// The answer to CNS 06h (None: Invalid Field). Write Zeroes past its
    /// WZSL, and Dataset Management past DMRL, DMRSL or DMSL, are refused
    /// with Invalid Field.
    pub nvm_limits: Option<IdentifyControllerNvm>,
    /// OAES in Identify Controller (what it advertises; it refuses Set
    /// Features Asynchronous Event Configuration and AERs all the same).
    pub oaes: u32,
}

impl Default for MemTargetConfig {
    fn default() -> Self {
        MemTargetConfig {
            subnqn: "nqn.2024-01.io.sluice:mem".into(),
            allowed_hosts: Vec::new(),
            block_size_bytes: 512,
            size_blocks: 32768,
            mdts: 5,
            maxh2cdata_bytes: 32768,
            cpda: 0,
            in_capsule_bytes: 8192,
            c2h_chunk_bytes: 65536,
            c2h_success: true,
            io_queues_max: 8,
            discovery: Vec::new(),
            oncs: oncs::DSM | oncs::WRITE_ZEROES,
            nvm_limits: None,
            oaes: 0,
        }
    }
}

/// Counters of what the target saw.
#[derive(Debug, Default)]
pub struct MemTargetStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub r2ts: AtomicU64,
    pub in_capsule_writes: AtomicU64,
    pub keep_alives: AtomicU64,
    /// CDW13 of the last Read/Write.
    pub last_cdw13: AtomicU64,
    /// Write Zeroes commands completed.
    pub write_zeroes: AtomicU64,
    /// Dataset Management commands completed, and their ranges.
    pub dsm_commands: AtomicU64,
    pub dsm_ranges: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    cfg: MemTargetConfig,
    disk: Mutex<Vec<u8>>,
    stop: AtomicBool,
    /// Bumped to make every open connection close.
    epoch: AtomicU64,
    next_cntlid: AtomicU16,
    stats: MemTargetStats,
}

/// A running in-memory target; stops when dropped.
#[derive(Debug)]
pub struct MemTarget {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl MemTarget {
    /// Listens on 127.0.0.1 on an ephemeral port.
    pub fn start(cfg: MemTargetConfig) -> std::io::Result<MemTarget> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let bytes = (cfg.size_blocks * cfg.block_size_bytes as u64) as usize;
        let shared = Arc::new(Shared {
            disk: Mutex::new(vec![0; bytes]),
            cfg,
            stop: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            next_cntlid: AtomicU16::new(1),
            stats: MemTargetStats::default(),
        });
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("memtarget-accept".into())
            .spawn(move || {
                for s in l.incoming() {
                    if sh.stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    let sh = sh.clone();
                    let _ = std::thread::Builder::new()
                        .name("memtarget-conn".into())
                        .spawn(move || {
                            let _ = Conn::new(sh).serve(s);
                        });
                }
            })?;
        Ok(MemTarget { addr, shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn stats(&self) -> &MemTargetStats {
        &self.shared.stats
    }
    /// Closes every open connection (within ~50 ms); keeps listening.
    pub fn drop_connections(&self) {
        self.shared.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// A copy of the namespace contents.
    pub fn disk(&self) -> Vec<u8> {
        self.shared
            .disk
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }
}

impl Drop for MemTarget {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Unblock accept().
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

struct Pending {
    sqe: Sqe,
    buf: Vec<u8>,
    received: usize,
}

struct Conn {
    sh: Arc<Shared>,
    tx: TxParams,
    out: Vec<u8>,
    discovery: bool,
    qid: u16,
    cc: u32,
    pending: Vec<Pending>,
}

impl Conn {
    fn new(sh: Arc<Shared>) -> Self {
        Conn {
            sh,
            tx: TxParams::default(),
            out: Vec::new(),
            discovery: false,
            qid: 0,
            cc: 0,
            pending: Vec::new(),
        }
    }

    fn serve(&mut self, mut s: TcpStream) -> std::io::Result<()> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        let mut framer = Framer::new(Direction::HostToController, 1 << 20);
        let epoch = self.sh.epoch.load(Ordering::Acquire);
        loop {
            if self.sh.stop.load(Ordering::Acquire)
                || self.sh.epoch.load(Ordering::Acquire) != epoch
            {
                return Ok(());
            }
            let b = framer.read_buf();
            let n = match s.read(b) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            };
            framer.advance(n);
            loop {
                let pdu = match framer.next_pdu() {
                    Ok(Some(p)) => p,
                    Ok(None) => break,
                    Err(_) => return Ok(()),
                };
                let header = pdu.header.clone();
                let data = pdu.data.to_vec();
                match header {
                    PduHeader::IcReq(r) => {
                        let resp = IcResp {
                            pfv: 0,
                            cpda: self.sh.cfg.cpda,
                            hdgst: r.hdgst,
                            ddgst: r.ddgst,
                            maxh2cdata: self.sh.cfg.maxh2cdata_bytes,
                        };
                        encode_pdu(
                            &PduHeader::IcResp(resp),
                            &[],
                            &TxParams::default(),
                            &mut self.out,
                        );
                        self.tx = TxParams {
                            hdgst: r.hdgst,
                            ddgst: r.ddgst,
                            pda: r.hpda,
                        };
                        framer.set_initialized(r.hdgst, r.ddgst, self.sh.cfg.cpda, 1 << 20);
                    }
                    PduHeader::CapsuleCmd(sqe) => self.command(sqe, data),
                    PduHeader::H2CData(d) => self.h2c(d, &data),
                    PduHeader::H2CTermReq(_) => return Ok(()),
                    _ => return Ok(()),
                }
            }
            if !self.out.is_empty() {
                s.write_all(&self.out)?;
                self.out.clear();
            }
        }
    }

    fn resp(&mut self, cid: u16, status: Status, result: u64) {
        let mut c = Cqe::new(cid, status);
        c.result = result as u32;
        c.dw1 = (result >> 32) as u32;
        c.sqid = self.qid;
        encode_pdu(&PduHeader::CapsuleResp(c), &[], &self.tx, &mut self.out);
    }

    fn send_data(&mut self, cid: u16, data: &[u8], status_ok: bool) {
        let chunk = self.sh.cfg.c2h_chunk_bytes.max(512) as usize;
        let n = data.len().div_ceil(chunk);
        for (i, piece) in data.chunks(chunk).enumerate() {
            let last = i + 1 == n;
            let h = DataHeader {
                cccid: cid,
                ttag: 0,
                offset: (i * chunk) as u32,
                len: piece.len() as u32,
                last,
                success: last && status_ok && self.sh.cfg.c2h_success,
            };
            encode_pdu(&PduHeader::C2HData(h), piece, &self.tx, &mut self.out);
        }
        if !(status_ok && self.sh.cfg.c2h_success) || data.is_empty() {
            self.resp(cid, Status::SUCCESS, 0);
        }
    }

    fn command(&mut self, sqe: Sqe, data: Vec<u8>) {
        let cid = sqe.cid();
        let sg = sqe.sgl();
        // Solicited write: ask for the data with one R2T.
        if sg.id == sgl::TRANSPORT_DATA_BLOCK
            && sg.length > 0
            && data.is_empty()
            && (self.qid != 0 || sqe.opcode() == io::WRITE)
            && matches!(sqe.opcode(), io::WRITE | io::DATASET_MANAGEMENT)
        {
            self.sh.stats.r2ts.fetch_add(1, Ordering::Relaxed);
            let r = R2t {
                cccid: cid,
                ttag: cid,
                offset: 0,
                len: sg.length,
            };
            encode_pdu(&PduHeader::R2t(r), &[], &self.tx, &mut self.out);
            self.pending.push(Pending {
                sqe,
                buf: vec![0; sg.length as usize],
                received: 0,
            });
            return;
        }
        if self.qid != 0 && sqe.opcode() == io::WRITE {
            self.sh
                .stats
                .in_capsule_writes
                .fetch_add(1, Ordering::Relaxed);
        }
        self.execute(sqe, data);
    }

    fn h2c(&mut self, d: DataHeader, data: &[u8]) {
        let Some(i) = self.pending.iter().position(|p| p.sqe.cid() == d.cccid) else {
            return;
        };
        let p = &mut self.pending[i];
        let off = d.offset as usize;
        if off + data.len() > p.buf.len() {
            return;
        }
        p.buf[off..off + data.len()].copy_from_slice(data);
        p.received += data.len();
        if p.received >= p.buf.len() {
            let p = self.pending.swap_remove(i);
            self.execute(p.sqe, p.buf);
        }
    }

    fn execute(&mut self, sqe: Sqe, data: Vec<u8>) {
        if sqe.opcode() == admin::FABRICS {
            return self.fabrics(sqe, data);
        }
        if self.qid == 0 {
            self.admin(sqe)
        } else {
            self.io(sqe, data)
        }
    }

    fn fabrics(&mut self, sqe: Sqe, data: Vec<u8>) {
        let cid = sqe.cid();
        match sqe.fctype() {
            fctype::CONNECT => {
                let c = ConnectCommand::parse(&sqe);
                let Ok(d) = ConnectData::parse(&data) else {
                    return self.resp(cid, Status::CONNECT_INVALID_PARAMETERS, 0);
                };
                self.discovery = d.subnqn == DISCOVERY_NQN;
                let cfg = &self.sh.cfg;
                if !self.discovery && d.subnqn != cfg.subnqn {
                    return self.resp(cid, Status::CONNECT_INVALID_PARAMETERS, (1 << 16) | 256);
                }
                if !cfg.allowed_hosts.is_empty() && !cfg.allowed_hosts.contains(&d.hostnqn) {
                    return self.resp(cid, Status::CONNECT_INVALID_HOST, 0);
                }
                self.qid = c.qid;
                let cntlid = if c.qid == 0 {
                    self.sh.next_cntlid.fetch_add(1, Ordering::Relaxed)
                } else {
                    d.cntlid
                };
                self.resp(cid, Status::SUCCESS, cntlid as u64)
            }
            fctype::PROPERTY_GET => {
                let p = PropertyCommand::parse(&sqe);
                let v = match p.offset {
                    prop::CAP => Cap {
                        mqes: 1023,
                        to_500ms: 2,
                    }
                    .encode(),
                    prop::VS => VS_1_3 as u64,
                    prop::CC => self.cc as u64,
                    prop::CSTS => (self.cc & 1) as u64,
                    _ => return self.resp(cid, Status::INVALID_FIELD, 0),
                };
                self.resp(cid, Status::SUCCESS, v)
            }
            fctype::PROPERTY_SET => {
                let p = PropertyCommand::parse(&sqe);
                if p.offset == prop::CC {
                    self.cc = p.value as u32;
                }
                self.resp(cid, Status::SUCCESS, 0)
            }
            _ => self.resp(cid, Status::INVALID_OPCODE, 0),
        }
    }

    fn admin(&mut self, sqe: Sqe) {
        let cid = sqe.cid();
        let cfg = self.sh.cfg.clone();
        match sqe.opcode() {
            admin::IDENTIFY => {
                let d = match (sqe.cdw(10) & 0xff) as u8 {
                    cns::CONTROLLER => IdentifyController {
                        serial: "MEM0001".into(),
                        model: "sluice memtarget".into(),
                        firmware: "0.1".into(),
                        mdts: cfg.mdts,
                        cntlid: 1,
                        ver: VS_1_3,
                        cntrltype: if self.discovery {
                            cntrltype::DISCOVERY
                        } else {
                            cntrltype::IO
                        },
                        kas: 10,
                        sqes: 0x66,
                        cqes: 0x44,
                        maxcmd: 1024,
                        nn: 1,
                        sgls: 0x0010_0001,
                        subnqn: if self.discovery {
                            DISCOVERY_NQN.into()
                        } else {
                            cfg.subnqn.clone()
                        },
                        ioccsz: (cfg.in_capsule_bytes + 64) / 16,
                        iorcsz: 1,
                        oncs: if self.discovery { 0 } else { cfg.oncs },
                        oaes: cfg.oaes,
                        ..Default::default()
                    }
                    .encode(),
                    cns::CS_CONTROLLER if !self.discovery && sqe.cdw(11) >> 24 == 0 => {
                        match cfg.nvm_limits {
                            Some(l) => l.encode(),
                            None => return self.resp(cid, Status::INVALID_FIELD, 0),
                        }
                    }
                    cns::NAMESPACE if sqe.nsid() == 1 => IdentifyNamespace {
                        nsze: cfg.size_blocks,
                        ncap: cfg.size_blocks,
                        nuse: cfg.size_blocks,
                        lbads: cfg.block_size_bytes.trailing_zeros() as u8,
                        ..Default::default()
                    }
                    .encode(),
                    cns::ACTIVE_NS_LIST => encode_active_ns_list(&[1], sqe.nsid()),
                    _ => return self.resp(cid, Status::INVALID_FIELD, 0),
                };
                self.send_data(cid, &d, true)
            }
            admin::SET_FEATURES if sqe.cdw(10) & 0xff == 0x07 => {
                let n =
                    (sqe.cdw(11) & 0xffff).min(cfg.io_queues_max.saturating_sub(1) as u32) as u64;
                self.resp(cid, Status::SUCCESS, n | (n << 16))
            }
            admin::KEEP_ALIVE => {
                self.sh.stats.keep_alives.fetch_add(1, Ordering::Relaxed);
                self.resp(cid, Status::SUCCESS, 0)
            }
            admin::ABORT => self.resp(cid, Status::SUCCESS, 1),
            admin::GET_LOG_PAGE => {
                let g = GetLogPage::parse(&sqe);
                if g.lid != sluice_proto::log::lid::DISCOVERY || !self.discovery {
                    return self.resp(cid, Status::INVALID_LOG_PAGE, 0);
                }
                let page = encode_discovery_log(1, &cfg.discovery);
                let mut out = vec![0u8; g.len_bytes.min(1 << 20) as usize];
                let off = g.offset_bytes as usize;
                if off < page.len() {
                    let n = (page.len() - off).min(out.len());
                    out[..n].copy_from_slice(&page[off..off + n]);
                }
                self.send_data(cid, &out, true)
            }
            _ => self.resp(cid, Status::INVALID_OPCODE, 0),
        }
    }

    fn io(&mut self, sqe: Sqe, data: Vec<u8>) {
        let cid = sqe.cid();
        let bs = self.sh.cfg.block_size_bytes as u64;
        if sqe.nsid() != 1 && sqe.opcode() != io::FLUSH {
            return self.resp(cid, Status::INVALID_NAMESPACE, 0);
        }
        let size_blocks = self.sh.cfg.size_blocks;
        let in_range =
            |slba: u64, nlb: u64| slba.checked_add(nlb).is_some_and(|e| e <= size_blocks);
        let cfg = &self.sh.cfg;
        let lim = cfg.nvm_limits.unwrap_or_default();
        match sqe.opcode() {
            io::WRITE_ZEROES if cfg.oncs & oncs::WRITE_ZEROES == 0 => {
                return self.resp(cid, Status::INVALID_OPCODE, 0)
            }
            io::DATASET_MANAGEMENT if cfg.oncs & oncs::DSM == 0 => {
                return self.resp(cid, Status::INVALID_OPCODE, 0)
            }
            io::WRITE_ZEROES
                if lim
                    .write_zeroes_bytes_max(4096)
                    .is_some_and(|max| (sqe.nlb() as u64) * bs > max) =>
            {
                return self.resp(cid, Status::INVALID_FIELD, 0)
            }
            _ => {}
        }
        match sqe.opcode() {
            io::READ | io::WRITE | io::WRITE_ZEROES => {
                let (slba, nlb) = (sqe.slba(), sqe.nlb() as u64);
                if !in_range(slba, nlb) {
                    return self.resp(cid, Status::LBA_OUT_OF_RANGE, 0);
                }
                self.sh
                    .stats
                    .last_cdw13
                    .store(sqe.cdw(13) as u64, Ordering::Relaxed);
                let (a, b) = ((slba * bs) as usize, ((slba + nlb) * bs) as usize);
                let op = sqe.opcode();
                if op == io::READ {
                    self.sh.stats.reads.fetch_add(1, Ordering::Relaxed);
                    if sqe.sgl().length as usize != b - a {
                        return self.resp(cid, Status::DATA_SGL_LENGTH_INVALID, 0);
                    }
                    let d = self.sh.disk.lock().ok().map(|g| g[a..b].to_vec());
                    return match d {
                        Some(d) => self.send_data(cid, &d, true),
                        None => self.resp(cid, Status::INTERNAL_ERROR, 0),
                    };
                }
                if op == io::WRITE && data.len() != b - a {
                    return self.resp(cid, Status::DATA_SGL_LENGTH_INVALID, 0);
                }
                if op == io::WRITE {
                    self.sh.stats.writes.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.sh.stats.write_zeroes.fetch_add(1, Ordering::Relaxed);
                }
                if let Ok(mut g) = self.sh.disk.lock() {
                    if op == io::WRITE {
                        g[a..b].copy_from_slice(&data);
                    } else {
                        g[a..b].fill(0);
                    }
                }
                self.resp(cid, Status::SUCCESS, 0)
            }
            io::FLUSH => self.resp(cid, Status::SUCCESS, 0),
            io::DATASET_MANAGEMENT => {
                let nr = (sqe.cdw(10) & 0xff) as usize + 1;
                if data.len() < nr * 16 {
                    return self.resp(cid, Status::DATA_SGL_LENGTH_INVALID, 0);
                }
                let nlbs = data
                    .chunks_exact(16)
                    .take(nr)
                    .map(|r| u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as u64);
                if (lim.dmrl != 0 && nr > lim.dmrl as usize)
                    || (lim.dmrsl != 0 && nlbs.clone().any(|n| n > lim.dmrsl as u64))
                    || (lim.dmsl != 0 && nlbs.sum::<u64>() > lim.dmsl)
                {
                    return self.resp(cid, Status::INVALID_FIELD, 0);
                }
                self.sh.stats.dsm_commands.fetch_add(1, Ordering::Relaxed);
                self.sh
                    .stats
                    .dsm_ranges
                    .fetch_add(nr as u64, Ordering::Relaxed);
                for r in data.chunks_exact(16).take(nr) {
                    let nlb = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as u64;
                    let mut sl = [0u8; 8];
                    sl.copy_from_slice(&r[8..16]);
                    let slba = u64::from_le_bytes(sl);
                    if !in_range(slba, nlb) {
                        return self.resp(cid, Status::LBA_OUT_OF_RANGE, 0);
                    }
                    if let Ok(mut g) = self.sh.disk.lock() {
                        g[(slba * bs) as usize..((slba + nlb) * bs) as usize].fill(0);
                    }
                }
                self.resp(cid, Status::SUCCESS, 0)
            }
            _ => self.resp(cid, Status::INVALID_OPCODE, 0),
        }
    }
}
