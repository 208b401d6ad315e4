//! The real pair, in memory: Sluice's host queue-pair core
//! ([`sluice_host::core::QueuePairCore`]) against Sluice's target queue
//! ([`sluice_target::queue::QueueConnection`] with its controller, registry and
//! a RAM namespace from `sluice-backend`), quinn style.
//!
//! Nothing here opens a socket, starts a thread or reads the clock after
//! [`Pair::new`] took the origin of the virtual clock: bytes are shuttled
//! between `poll_transmit` / `due` and `handle_bytes` / `feed`, the target's
//! backend requests are submitted to backend queues owned by the harness and
//! their completions handed back (what a target worker does in `server.rs`),
//! and time only moves when the harness moves it: [`Pair::run`] jumps to the
//! send schedulers' flush deadlines and time-driven backend completions while
//! commands are outstanding, [`Pair::advance`] walks every timer (command
//! timeouts, keep alive, controller checks) up to a point in virtual time.
//!
//! The harness is a dev-only crate (`publish = false`); no shipped crate
//! depends on it. Its tests (`tests/`) cover the parameter matrix of
//! [`Params`]; the host's and the target's own tests keep hand-written peers
//! only where a deliberately misbehaving peer is the point.
#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_backend::{Backend, BackendError, BackendQueue, Geometry, IoCompletion, RamBackend};
use sluice_config::{Config, NamespaceConfig, SubsystemConfig};
use sluice_host::core::{Completion, CoreConfig, Event, Payload, QueuePairCore};
use sluice_host::HostError;
use sluice_proto::coalesce::CoalesceMode;
use sluice_proto::command::{admin, io, Sqe};
use sluice_proto::fabrics::{
    cc, csts, fctype, prop, ConnectCommand, ConnectData, PropertyCommand, CATTR_DISABLE_SQ_FLOW,
    CNTLID_DYNAMIC,
};
use sluice_proto::pdu::flags;
use sluice_proto::send::SendConfig;
use sluice_proto::Status;
use sluice_target::queue::QueueConnection;
use sluice_target::registry::{Registry, VolumeOpener};

pub use sluice_proto::coalesce::CoalesceMode as Coalescing;
pub use sluice_proto::send::SchedulerKind;

/// Subsystem NQN of the harness's target.
pub const SUBNQN: &str = "nqn.2026-11.io.sluice:pair";
/// Host NQN the harness connects with (the only host the subsystem admits).
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa";
/// Index of the admin queue in [`Pair::link`].
pub const ADMIN: usize = 0;
/// Index of the (single) I/O queue in [`Pair::link`].
pub const IO: usize = 1;
/// Namespace ID of the RAM namespace.
pub const NSID: u32 = 1;

/// Everything that shapes one pair. `Default` is the plain case: no
/// digests, 8 KiB in-capsule data, immediate send paths, queue depth 32.
#[derive(Debug, Clone)]
pub struct Params {
    /// Header digests (asked by the host, granted by the target).
    pub hdr_digest: bool,
    /// Data digests.
    pub data_digest: bool,
    /// In-capsule data on the I/O queue: the target's `inline_data_bytes`
    /// and the host's in-capsule limit. 0 forces every write through R2T.
    pub in_capsule_bytes: u32,
    /// The host disables SQ flow control at the I/O Connect, so successful
    /// reads end with a C2HData carrying SUCCESS and no CapsuleResp.
    pub c2h_success: bool,
    /// The target's send path: scheduler and completion coalescing.
    pub target_send: SendConfig,
    /// The host's send path (its coalescing lives in the threaded I/O layer,
    /// not in the core, and is ignored here).
    pub host_send: SendConfig,
    /// I/O queue depth (host command slots and SQSIZE + 1), at least 2.
    pub depth: u16,
    /// MAXH2CDATA the target announces.
    pub max_h2c_data_bytes: u32,
    /// Largest C2HData PDU the target sends.
    pub max_c2h_data_bytes: u32,
    /// The target's MDTS in bytes (a power-of-two multiple of 4 KiB).
    pub mdts_bytes: u32,
    /// The host's per-command timeout.
    pub command_timeout: Duration,
    /// KATO sent in the admin Connect (0: no keep alive timer).
    pub kato_ms: u32,
    /// The target's grace past KATO.
    pub kato_grace_ms: u32,
    /// Size of the RAM namespace.
    pub ns_bytes: u64,
    /// Its block size (512 or 4096).
    pub block_size: u32,
    /// The host NQN in every Connect ([`HOSTNQN`]; empty: a host that
    /// gives none, as SPDK's perf does by default).
    pub hostnqn: String,
    /// The HOSTID in every Connect.
    pub hostid: [u8; 16],
    /// The subsystem admits any host (`allow_any_host`) instead of only
    /// [`HOSTNQN`].
    pub open_subsystem: bool,
    /// The namespace can grow online, like an elastic volume resized by its
    /// control plane: it starts at `ns_bytes` and reports what this holds
    /// (at most [`GROWABLE_CAPACITY_FACTOR`] × `ns_bytes`).
    pub growable: Option<Arc<AtomicU64>>,
    /// DH-HMAC-CHAP settings for [`HOSTNQN`] on the subsystem.
    pub dhchap: Option<sluice_config::auth::HostAuthConfig>,
    /// The subsystem refuses hosts without DH-HMAC-CHAP settings.
    pub require_auth: bool,
}

/// RAM behind a growable namespace, as a multiple of its starting size.
pub const GROWABLE_CAPACITY_FACTOR: u64 = 4;

/// A RAM namespace whose reported size a test moves, like an elastic
/// volume resized by its control plane: it opens at `start_bytes` and then
/// reports what `size_bytes` holds, at most the RAM behind it. Used by the
/// harness's growable namespace and by the target's conformance tests of
/// online growth.
#[derive(Debug)]
pub struct GrowableRam {
    ram: RamBackend,
    start_bytes: u64,
    size_bytes: Arc<AtomicU64>,
}

impl GrowableRam {
    /// `capacity_bytes` of RAM in `block_size` blocks, opening at
    /// `start_bytes`; the test grows it by storing into `size_bytes`.
    pub fn new(
        capacity_bytes: u64,
        block_size: u32,
        start_bytes: u64,
        size_bytes: Arc<AtomicU64>,
    ) -> Result<GrowableRam, BackendError> {
        assert!(
            start_bytes <= capacity_bytes,
            "a growable namespace opens within its RAM"
        );
        Ok(GrowableRam {
            ram: RamBackend::new(capacity_bytes, block_size)?,
            start_bytes,
            size_bytes,
        })
    }
}

impl Backend for GrowableRam {
    fn geometry(&self) -> Geometry {
        let mut g = self.ram.geometry();
        g.size_bytes = self.start_bytes;
        g
    }
    fn kind(&self) -> &'static str {
        "ram"
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
            .load(Ordering::Acquire)
            .min(self.ram.geometry().size_bytes)
    }
    fn open_queue(&self) -> Result<Box<dyn BackendQueue>, BackendError> {
        self.ram.open_queue()
    }
}

/// Opens the harness's "volume": a [`GrowableRam`].
struct GrowableOpener {
    start_bytes: u64,
    block_size: u32,
    size_bytes: Arc<AtomicU64>,
}

impl VolumeOpener for GrowableOpener {
    fn open_volume(
        &self,
        _name: &str,
        _control: &str,
        _token_file: Option<&std::path::Path>,
    ) -> Result<Arc<dyn Backend>, String> {
        let ram = GrowableRam::new(
            self.start_bytes * GROWABLE_CAPACITY_FACTOR,
            self.block_size,
            self.start_bytes,
            self.size_bytes.clone(),
        )
        .map_err(|e| e.to_string())?;
        Ok(Arc::new(ram))
    }
}

impl Default for Params {
    fn default() -> Self {
        Params {
            hdr_digest: false,
            data_digest: false,
            in_capsule_bytes: 8192,
            c2h_success: false,
            target_send: SendConfig::default(),
            host_send: SendConfig::default(),
            depth: 32,
            max_h2c_data_bytes: 32 * 1024,
            max_c2h_data_bytes: 32 * 1024,
            mdts_bytes: 1 << 20,
            command_timeout: Duration::from_secs(5),
            kato_ms: 0,
            kato_grace_ms: 500,
            ns_bytes: 4 << 20,
            block_size: 512,
            hostnqn: HOSTNQN.into(),
            hostid: [0xaa; 16],
            open_subsystem: false,
            growable: None,
            dhchap: None,
            require_auth: false,
        }
    }
}

/// A send path: `scheduler` with `coalescing` (the other knobs default).
/// `threshold` 4 and 20 µs, so coalescing actually holds completions in
/// small tests.
pub fn send_config(scheduler: SchedulerKind, coalescing: CoalesceMode) -> SendConfig {
    let mut s = SendConfig {
        scheduler,
        ..SendConfig::default()
    };
    s.coalescing.mode = coalescing;
    s.coalescing.threshold = 4;
    s.coalescing.timeout = Duration::from_micros(20);
    s
}

/// Every scheduler.
pub const SCHEDULERS: [SchedulerKind; 3] = [
    SchedulerKind::Immediate,
    SchedulerKind::Unified,
    SchedulerKind::Isolated,
];
/// Every coalescing mode.
pub const COALESCING: [CoalesceMode; 4] = [
    CoalesceMode::Off,
    CoalesceMode::Static,
    CoalesceMode::Adaptive,
    CoalesceMode::Calibrated,
];

/// Direction of a PDU on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Host to controller.
    H2C,
    /// Controller to host.
    C2H,
}

/// A fault the harness injects into the byte stream between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Flips a bit of the data digest of the `nth` (from 0, counted from
    /// when the fault is armed) PDU of `pdu_type` going `dir` on `link` that
    /// carries a data digest.
    DataDigest {
        link: usize,
        dir: Dir,
        pdu_type: u8,
        nth: usize,
    },
}

/// One PDU that crossed the wire (its common header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WirePdu {
    pub link: usize,
    pub dir: Dir,
    pub pdu_type: u8,
    pub flags: u8,
    pub plen: u32,
}

impl WirePdu {
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// One connection: the host core and the target queue facing each other.
#[derive(Debug)]
pub struct Link {
    pub host: QueuePairCore,
    pub target: QueueConnection,
    /// The target was told the host closed.
    host_gone: bool,
    /// The host was told the target closed.
    target_gone: bool,
    /// `QueueConnection::finish` ran.
    finished: bool,
    results: HashMap<u64, Result<Completion, HostError>>,
    timed_out: Vec<(u16, u8)>,
    closed: Option<HostError>,
}

impl Link {
    /// Commands the host reported timed out: (CID, opcode).
    pub fn timed_out(&self) -> &[(u16, u8)] {
        &self.timed_out
    }
    /// Why the host's side closed, once it did.
    pub fn closed(&self) -> Option<&HostError> {
        self.closed.as_ref()
    }
}

#[derive(Debug)]
struct ArmedFault {
    fault: Fault,
    seen: usize,
}

/// The host core and the target queue of one controller (an admin queue and
/// one I/O queue), connected in memory, on a virtual clock.
#[derive(Debug)]
pub struct Pair {
    pub params: Params,
    pub reg: Arc<Registry>,
    /// CNTLID the target assigned.
    pub cntlid: u16,
    /// Origin of the virtual clock.
    start: Instant,
    now: Instant,
    links: Vec<Link>,
    /// The harness's backend queues, one per namespace (a worker's).
    queues: HashMap<usize, Box<dyn BackendQueue>>,
    backend_paused: bool,
    wire: Vec<WirePdu>,
    faults: Vec<ArmedFault>,
    next_token: u64,
}

/// The target's configuration for `p`: one subsystem admitting [`HOSTNQN`]
/// (or any host, `open_subsystem`) with one RAM namespace.
pub fn config(p: &Params) -> Config {
    let sub = SubsystemConfig::new(SUBNQN);
    let sub = if p.open_subsystem {
        sub.allow_any_host()
    } else {
        sub.with_host(HOSTNQN)
    };
    let sub = match &p.dhchap {
        Some(a) => sub.with_dhchap(a.clone()),
        None => sub,
    };
    let sub = if p.require_auth {
        sub.require_auth()
    } else {
        sub
    };
    let ns = if p.growable.is_some() {
        NamespaceConfig::volume(NSID, "growable", "127.0.0.1:1")
    } else {
        NamespaceConfig::ram(NSID, p.ns_bytes)
    };
    let mut c = Config::default()
        .with_subsystem(sub.with_namespace(ns.with_block_size(p.block_size)))
        .validated()
        .expect("harness config is valid");
    // The protocol parameters are set after validation, as they always
    // were: the tests choose them, not a file.
    let depth_max = c.target.queue_depth_max.max(p.depth);
    c.target = c
        .target
        .with_inline_data_bytes(p.in_capsule_bytes)
        .with_max_h2c_data_bytes(p.max_h2c_data_bytes)
        .with_max_c2h_data_bytes(p.max_c2h_data_bytes)
        .with_mdts_bytes(p.mdts_bytes)
        .with_queue_depth_max(depth_max)
        .with_kato_grace_ms(p.kato_grace_ms)
        .with_send(p.target_send);
    c
}

/// The target's registry for `p` (see [`config`]).
pub fn registry(p: &Params) -> Arc<Registry> {
    let reg = match &p.growable {
        Some(size_bytes) => Registry::build_with(
            &config(p),
            &GrowableOpener {
                start_bytes: p.ns_bytes,
                block_size: p.block_size,
                size_bytes: size_bytes.clone(),
            },
        ),
        None => Registry::build(&config(p)),
    };
    Arc::new(reg.expect("registry builds"))
}

/// The host address the target is told link `i` comes from (TEST-NET-1,
/// so log lines name a peer as the I/O layer's do).
pub fn peer_addr(i: usize) -> std::net::SocketAddr {
    let port = 40000 + u16::try_from(i).unwrap_or(0);
    std::net::SocketAddr::from(([192, 0, 2, 1], port))
}

fn core_config(p: &Params, qid: u16, depth: u16) -> CoreConfig {
    CoreConfig {
        qid,
        depth,
        hdr_digest: p.hdr_digest,
        data_digest: p.data_digest,
        // The Connect data (1 KiB) goes in-capsule, as controller.rs sends it;
        // the I/O queue's limit is set after its Connect.
        in_capsule_max_bytes: sluice_target::queue::ADMIN_INLINE_BYTES,
        command_timeout: p.command_timeout,
        c2h_data_max_bytes: 8 << 20,
    }
}

impl Pair {
    /// A connected pair: admin queue up (ICReq, Connect, CC.EN, CSTS.RDY)
    /// and the I/O queue connected. Panics if any step fails.
    pub fn new(params: Params) -> Pair {
        let mut p = Pair::unconnected(params);
        p.connect_admin();
        p.connect_io();
        p
    }

    /// A pair with no queue yet (to script the bring-up in a test).
    pub fn unconnected(params: Params) -> Pair {
        let reg = registry(&params);
        // The origin of the virtual clock: the only time ever read.
        let start = Instant::now();
        Pair {
            start,
            params,
            reg,
            cntlid: 0,
            now: start,
            links: Vec::new(),
            queues: HashMap::new(),
            backend_paused: false,
            wire: Vec::new(),
            faults: Vec::new(),
            next_token: 1,
        }
    }

    /// Opens a connection (host core + target queue); ICReq/ICResp is
    /// exchanged. Returns its index.
    pub fn open_link(&mut self, qid: u16, depth: u16, send: SendConfig) -> usize {
        let mut sc = send;
        sc.coalescing.mode = CoalesceMode::Off;
        let host = QueuePairCore::with_scheduler(
            core_config(&self.params, qid, depth),
            self.now,
            sc.build(false),
        );
        let peer = Some(peer_addr(self.links.len()));
        let target = QueueConnection::new(self.reg.clone(), peer, None, self.now);
        self.links.push(Link {
            host,
            target,
            host_gone: false,
            target_gone: false,
            finished: false,
            results: HashMap::new(),
            timed_out: Vec::new(),
            closed: None,
        });
        let i = self.links.len() - 1;
        self.run();
        assert!(
            self.links[i].host.is_ready(),
            "ICReq/ICResp on link {i} did not complete"
        );
        i
    }

    /// Sends a Fabrics Connect on `link`; returns the completion.
    pub fn connect(
        &mut self,
        link: usize,
        qid: u16,
        sqsize: u16,
        cattr: u8,
        cntlid: u16,
    ) -> Result<Completion, HostError> {
        let (hostid, hostnqn) = (self.params.hostid, self.params.hostnqn.clone());
        self.connect_as(link, qid, sqsize, cattr, cntlid, hostid, &hostnqn)
    }

    /// A Fabrics Connect on `link` with the given HOSTID and host NQN.
    #[allow(clippy::too_many_arguments)]
    pub fn connect_as(
        &mut self,
        link: usize,
        qid: u16,
        sqsize: u16,
        cattr: u8,
        cntlid: u16,
        hostid: [u8; 16],
        hostnqn: &str,
    ) -> Result<Completion, HostError> {
        let cmd = ConnectCommand {
            cid: 0,
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato_ms: if qid == 0 { self.params.kato_ms } else { 0 },
        };
        let data = ConnectData {
            hostid,
            cntlid,
            subnqn: SUBNQN.into(),
            hostnqn: hostnqn.into(),
        };
        self.execute(link, cmd.to_sqe(), Payload::Write(data.encode()))
    }

    /// Admin queue: ICReq, Connect, CC.EN, wait for CSTS.RDY.
    pub fn connect_admin(&mut self) {
        let l = self.open_link(0, 32, SendConfig::default());
        assert_eq!(l, ADMIN, "the admin queue is the first link");
        let c = self
            .connect(ADMIN, 0, 31, 0, CNTLID_DYNAMIC)
            .expect("admin Connect succeeds");
        // The Connect response's CNTLID is the low word of DW0.
        self.cntlid = (c.cqe.result & 0xffff) as u16;
        let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        self.prop_set(prop::CC, en as u64).expect("CC.EN");
        let rdy = self.prop_get(prop::CSTS).expect("CSTS");
        assert_eq!(rdy & csts::RDY as u64, 1, "CSTS.RDY after CC.EN");
    }

    /// I/O queue 1 with the parameters' depth, send path and CATTR.
    pub fn connect_io(&mut self) {
        let p = &self.params;
        let (depth, send) = (p.depth, p.host_send);
        let cattr = if p.c2h_success {
            CATTR_DISABLE_SQ_FLOW
        } else {
            0
        };
        let l = self.open_link(1, depth, send);
        assert_eq!(l, IO, "the I/O queue is the second link");
        self.connect(IO, 1, depth - 1, cattr, self.cntlid)
            .expect("I/O Connect succeeds");
        let ic = self.params.in_capsule_bytes;
        self.links[IO].host.set_in_capsule_max_bytes(ic);
    }

    // ------------------------------------------------------------ commands

    /// Submits a command on `link`; returns its token.
    pub fn submit(&mut self, link: usize, sqe: Sqe, payload: Payload) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        let now = self.now;
        self.links[link]
            .host
            .submit(now, sqe, payload, token)
            .expect("the host core accepts the command");
        token
    }

    /// The result of `token` if it completed (taken).
    pub fn take_result(
        &mut self,
        link: usize,
        token: u64,
    ) -> Option<Result<Completion, HostError>> {
        self.links[link].results.remove(&token)
    }

    /// Runs until `token` completes; panics if the pair goes quiet first.
    pub fn wait(&mut self, link: usize, token: u64) -> Result<Completion, HostError> {
        self.run();
        self.take_result(link, token)
            .unwrap_or_else(|| panic!("command {token} on link {link} never completed"))
    }

    /// Submits and waits.
    pub fn execute(
        &mut self,
        link: usize,
        sqe: Sqe,
        payload: Payload,
    ) -> Result<Completion, HostError> {
        let t = self.submit(link, sqe, payload);
        self.wait(link, t)
    }

    pub fn prop_get(&mut self, offset: u32) -> Result<u64, HostError> {
        let s = PropertyCommand {
            size8: offset == prop::CAP,
            offset,
            value: 0,
        }
        .to_sqe(0, fctype::PROPERTY_GET);
        let c = self.execute(ADMIN, s, Payload::None)?;
        Ok(c.cqe.result as u64 | (c.cqe.dw1 as u64) << 32)
    }

    pub fn prop_set(&mut self, offset: u32, value: u64) -> Result<(), HostError> {
        let s = PropertyCommand {
            size8: false,
            offset,
            value,
        }
        .to_sqe(0, fctype::PROPERTY_SET);
        self.execute(ADMIN, s, Payload::None).map(|_| ())
    }

    /// Sends a Keep Alive on the admin queue.
    pub fn keep_alive(&mut self) -> Result<(), HostError> {
        self.execute(ADMIN, Sqe::new(admin::KEEP_ALIVE, 0, 0), Payload::None)
            .map(|_| ())
    }

    /// The SQE of a Read or Write of `len` bytes at `slba`.
    pub fn rw_sqe(&self, opcode: u8, slba: u64, len: usize) -> Sqe {
        let nlb = u32::try_from(len / self.params.block_size as usize)
            .expect("a test I/O of at most u32::MAX blocks");
        Sqe::rw(opcode, 0, NSID, slba, nlb.max(1), false)
    }

    /// Submits a write of `data` at `slba` on the I/O queue.
    pub fn submit_write(&mut self, slba: u64, data: Vec<u8>) -> u64 {
        let s = self.rw_sqe(io::WRITE, slba, data.len());
        self.submit(IO, s, Payload::Write(data))
    }

    /// Submits a read of `len` bytes at `slba` on the I/O queue.
    pub fn submit_read(&mut self, slba: u64, len: usize) -> u64 {
        let s = self.rw_sqe(io::READ, slba, len);
        let len = u32::try_from(len).expect("a test read of at most u32::MAX bytes");
        self.submit(IO, s, Payload::Read(len))
    }

    pub fn write(&mut self, slba: u64, data: &[u8]) -> Result<(), HostError> {
        let t = self.submit_write(slba, data.to_vec());
        self.wait(IO, t).map(|_| ())
    }

    pub fn read(&mut self, slba: u64, len: usize) -> Result<Vec<u8>, HostError> {
        let t = self.submit_read(slba, len);
        self.wait(IO, t).map(|c| c.data)
    }

    // ------------------------------------------------------------ control

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Virtual time since the pair was created.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    pub fn link(&self, i: usize) -> &Link {
        &self.links[i]
    }

    pub fn link_mut(&mut self, i: usize) -> &mut Link {
        &mut self.links[i]
    }

    /// Stops (true) or resumes (false) handing backend completions back:
    /// requests stay in the backend, as on a stalled device.
    pub fn pause_backend(&mut self, paused: bool) {
        self.backend_paused = paused;
    }

    /// Arms a fault.
    pub fn inject(&mut self, fault: Fault) {
        self.faults.push(ArmedFault { fault, seen: 0 });
    }

    /// Every PDU that crossed the wire since the last [`Self::take_wire`].
    pub fn take_wire(&mut self) -> Vec<WirePdu> {
        std::mem::take(&mut self.wire)
    }

    /// Moves bytes, backend requests and completions until nothing moves;
    /// while commands are outstanding, jumps the clock to the next send
    /// scheduler flush or time-driven backend completion. Command timeouts,
    /// keep alive and other timers only fire through [`Self::advance`].
    pub fn run(&mut self) {
        for _ in 0..100_000 {
            self.pump();
            let mut next: Option<Instant> = None;
            let mut min = |t: Option<Instant>| {
                if let Some(t) = t {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            };
            for l in &self.links {
                if l.target.is_closed() {
                    continue;
                }
                min(l.target.send_deadline());
                min(l.host.send_deadline());
            }
            if !self.backend_paused {
                for q in self.queues.values() {
                    min(q.next_deadline());
                }
            }
            match next {
                Some(t) => self.now = self.now.max(t),
                None => return,
            }
        }
        panic!("the pair keeps producing deadlines without settling");
    }

    /// Moves the virtual clock forward by `d`, firing every timer of both
    /// sides (and the backend's) at its own time on the way.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            self.run();
            let mut next: Option<Instant> = None;
            let mut min = |t: Option<Instant>| {
                if let Some(t) = t {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            };
            for l in &self.links {
                min(l.target.poll_timeout());
                min(l.host.poll_timeout());
            }
            let t = match next {
                Some(t) if t < end => t.max(self.now + Duration::from_nanos(1)).min(end),
                _ => end,
            };
            self.now = self.now.max(t);
            if self.now >= end {
                self.run();
                return;
            }
        }
    }

    /// Runs [`Self::step`] until nothing moves.
    fn pump(&mut self) {
        for _ in 0..1_000_000 {
            if !self.step() {
                return;
            }
        }
        panic!("the pair did not settle");
    }

    /// One round over every link, as one iteration of a target worker and
    /// of the host's queue threads. Returns whether anything moved.
    fn step(&mut self) -> bool {
        let now = self.now;
        let mut progress = false;
        for i in 0..self.links.len() {
            // Host timers and host → target bytes.
            let l = &mut self.links[i];
            if l.host.send_deadline().is_some_and(|d| d <= now) {
                l.host.poll_send(now);
            }
            if l.host.poll_timeout().is_some_and(|t| t <= now) {
                l.host.handle_timeout(now);
            }
            // The callers' submissions of this round are in: the batch ends.
            l.host.handle_idle(now);
            while let Some(mut bytes) = self.links[i].host.poll_transmit() {
                progress = true;
                self.tap(i, Dir::H2C, &mut bytes);
                let l = &mut self.links[i];
                if !l.target.is_closing() {
                    l.target.feed(&bytes, now);
                }
            }
            let l = &mut self.links[i];
            if l.host.is_closed() && !l.host_gone {
                progress = true;
                l.host_gone = true;
                l.target.handle_peer_closed("host closed the connection");
            }
            // Backend submissions, tagged with the link like a worker does.
            while let Some(sub) = l.target.poll_backend() {
                progress = true;
                let mut req = sub.req;
                req.tag = ((i as u64) << 32) | (req.tag & 0xffff_ffff);
                let reg = &self.reg;
                let q = self.queues.entry(sub.ns.index).or_insert_with(|| {
                    sluice_target::queue::open_backend_queue(
                        sub.ns.backend.as_ref(),
                        reg.settings(),
                    )
                    .expect("backend queue opens")
                });
                q.submit(req, now);
            }
        }
        // Backend completions.
        if !self.backend_paused {
            let mut out: Vec<IoCompletion> = Vec::new();
            for q in self.queues.values_mut() {
                q.poll_completions(now, &mut out);
            }
            for c in out {
                progress = true;
                let i = (c.tag >> 32) as usize;
                if let Some(l) = self.links.get_mut(i) {
                    l.target.handle_backend_completion(
                        IoCompletion {
                            tag: c.tag & 0xffff_ffff,
                            ..c
                        },
                        now,
                    );
                }
            }
        }
        for i in 0..self.links.len() {
            // Target timers and target → host bytes.
            let l = &mut self.links[i];
            if l.target.poll_timeout().is_some_and(|t| t <= now) {
                l.target.handle_timeout(now);
            }
            // Every byte the host sent is fed: the worker's turn ends.
            l.target.handle_idle(now);
            let mut due = l.target.due_copy();
            if !due.is_empty() {
                progress = true;
                l.target.consume(due.len(), now);
                self.tap(i, Dir::C2H, &mut due);
                let l = &mut self.links[i];
                if !l.host.is_closed() {
                    l.host.handle_bytes(now, &due);
                }
            }
            let l = &mut self.links[i];
            if l.target.is_closed() && !l.target_gone {
                progress = true;
                l.target_gone = true;
                l.host
                    .handle_connection_lost("the target closed the connection");
            }
            if l.target.is_closed() && !l.finished && l.target.backend_in_flight() == 0 {
                l.finished = true;
                l.target.finish();
            }
            while let Some(ev) = l.host.poll_event() {
                progress = true;
                match ev {
                    Event::Complete { token, result } => {
                        l.results.insert(token, result);
                    }
                    Event::TimedOut { cid, opcode, .. } => l.timed_out.push((cid, opcode)),
                    Event::Closed(e) => l.closed = Some(e),
                }
            }
        }
        progress
    }

    /// Records the PDUs in `bytes` (whole PDUs, as both sides hand them
    /// out) and applies armed faults.
    fn tap(&mut self, link: usize, dir: Dir, bytes: &mut [u8]) {
        let mut off = 0;
        while off + 8 <= bytes.len() {
            let pdu_type = bytes[off];
            let fl = bytes[off + 1];
            let plen = u32::from_le_bytes([
                bytes[off + 4],
                bytes[off + 5],
                bytes[off + 6],
                bytes[off + 7],
            ]);
            let end = off + plen as usize;
            assert!(
                plen >= 8 && end <= bytes.len(),
                "{dir:?} bytes on link {link} are not whole PDUs"
            );
            self.wire.push(WirePdu {
                link,
                dir,
                pdu_type,
                flags: fl,
                plen,
            });
            if fl & flags::DDGSTF != 0 {
                for a in &mut self.faults {
                    let Fault::DataDigest {
                        link: fl_link,
                        dir: fdir,
                        pdu_type: ft,
                        nth,
                    } = a.fault;
                    if fl_link == link && fdir == dir && ft == pdu_type {
                        if a.seen == nth {
                            bytes[end - 1] ^= 0x01;
                        }
                        a.seen += 1;
                    }
                }
            }
            off = end;
        }
        assert_eq!(off, bytes.len(), "trailing partial PDU");
    }
}

/// The NVMe status of a failed command, if it failed with one.
pub fn nvme_status<T>(r: &Result<T, HostError>) -> Option<Status> {
    match r {
        Err(HostError::Nvme { status, .. }) => Some(*status),
        _ => None,
    }
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x & 0xff) as u8
        })
        .collect()
}
