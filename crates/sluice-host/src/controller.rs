//! Controller association setup, admin commands, namespaces and I/O.
//!
//! [`Controller::connect`] opens the admin queue (ICReq, Fabrics Connect,
//! CAP/VS, CC.EN, CSTS.RDY, Identify Controller), negotiates the number of
//! I/O queues, connects them, lists the namespaces and starts keep alive.
//! When the controller offers Namespace Attribute Notices it enables them
//! and keeps an Asynchronous Event Request posted: on each notice it reads
//! the Changed Namespace List and identifies the namespaces again, so
//! [`Controller::namespaces`] and [`Namespace::size_blocks`] follow
//! namespaces that a target adds, removes or grows online (as the Linux
//! host rescans). [`Namespace`] does block I/O of any length, split at MDTS.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sluice_proto::command::{admin, io, Sqe};
use sluice_proto::dsm::{self, DsmCommand, DsmRange};
use sluice_proto::fabrics::{
    cc, csts, fctype, prop, Cap, ConnectCommand, ConnectData, PropertyCommand, CNTLID_DYNAMIC,
};
use sluice_proto::identify::{
    cns, decode_active_ns_list, oncs, IdentifyController, IdentifyControllerNvm, IdentifyNamespace,
};
use sluice_proto::log::GetLogPage;
use sluice_proto::reservation::{
    self, AcquireAction, AcquireCommand, Cptpl, NotificationLog, RegisterAction, RegisterCommand,
    ReleaseAction, ReleaseCommand, ReportCommand, ReservationStatus, ReservationType,
};
use sluice_proto::status::Status;
use tokio::sync::mpsc;

use crate::core::{Completion, CoreConfig, Payload};
use crate::direct::{DirectParams, DirectQueue};
use crate::error::{HostError, Result};
use crate::queue::{wait, QueueHandle, QueueParams, TimedOutCommand};
pub use crate::rw::{IoFlags, RwBuilder, DSM_ACCESS_LATENCY_LOW, SLUICE_BARRIER_BIT};
use sluice_runtime::cast::usize_from;
use sluice_runtime::{sync, PollingPolicy};

/// Admin queue depth (SQSIZE 31).
pub const ADMIN_QUEUE_DEPTH: u16 = 32;
/// In-capsule data the admin queue of an NVMe/TCP controller accepts.
pub const ADMIN_IN_CAPSULE_BYTES: u32 = 8192;
/// Most I/O queues a host asks for.
pub const IO_QUEUES_MAX: u16 = 64;
/// Largest transfer one command may move (the host's own cap on MDTS).
pub const TRANSFER_BYTES_MAX: u32 = 8 << 20;
/// Most namespaces listed at connect time.
pub const NAMESPACES_MAX: usize = 1024;
/// Feature identifier: Number of Queues.
pub const FID_NUMBER_OF_QUEUES: u32 = 0x07;
/// Feature identifier: Asynchronous Event Configuration.
pub const FID_ASYNC_EVENT_CONFIG: u32 = 0x0b;
/// OAES and Asynchronous Event Configuration bit 8: Namespace Attribute
/// Notices.
pub const AEN_NS_ATTRIBUTE: u32 = 1 << 8;
/// Log page of Namespace Attribute Changed notices: the Changed Namespace
/// List.
const LID_CHANGED_NS_LIST: u8 = 0x04;
const LID_RESERVATION: u8 = 0x80;
/// The Changed Namespace List's length (1024 NSIDs).
const CHANGED_NS_LIST_BYTES: u32 = 4096;

/// When and how to re-establish a lost association.
#[derive(Debug, Clone)]
pub struct ReconnectPolicy {
    /// Attempts per loss (0 = never reconnect).
    pub attempts_max: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Retry a command that failed because the connection was lost, once,
    /// after reconnecting. Writes are then copied before submission.
    pub retry_io: bool,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            attempts_max: 5,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            retry_io: false,
        }
    }
}

/// The Host Identifier a connection sends: `opts.hostid` unless it is all
/// zero; then the UUID of a `nqn.2014-08.org.nvmexpress:uuid:` host NQN
/// (nvme-cli's rule), or for any other NQN a stable 128-bit hash of it
/// (FNV-1a: not a secret, only the same for the same NQN).
pub fn host_identifier(opts: &ConnectOptions) -> [u8; 16] {
    if opts.hostid != [0; 16] {
        return opts.hostid;
    }
    if let Some(id) = opts
        .hostnqn
        .strip_prefix("nqn.2014-08.org.nvmexpress:uuid:")
        .and_then(sluice_proto::fabrics::parse_uuid)
        .filter(|id| *id != [0; 16])
    {
        return id;
    }
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let h = opts
        .hostnqn
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u128::from(b)).wrapping_mul(PRIME));
    h.to_be_bytes()
}

/// Options of [`Controller::connect`].
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub hostnqn: String,
    /// Host Identifier (Connect data): the host's identity for the
    /// controller, and for reservations. All zero (the default): derived
    /// from `hostnqn` ([`host_identifier`]), so each host NQN is one host.
    pub hostid: [u8; 16],
    /// I/O queues to ask for (the controller may grant fewer).
    pub io_queues: u16,
    /// Extra I/O queue IDs to ask for in Set Features Number of Queues,
    /// kept for [`Controller::connect_direct_queue`] (default 0). Direct
    /// queues take the IDs after the `io_queues` threaded ones, up to what
    /// the controller granted.
    pub direct_queues: u16,
    /// Commands per I/O queue (SQSIZE + 1).
    pub queue_depth: u16,
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Keep alive timeout sent in Connect (zero disables keep alive).
    pub kato: Duration,
    pub command_timeout: Duration,
    pub connect_timeout: Duration,
    pub reconnect: ReconnectPolicy,
    pub polling: PollingPolicy,
    /// Cap on the bytes of one command (the controller's MDTS may be lower).
    pub max_transfer_bytes: u32,
    /// Put [`IoFlags`] urgent/barrier hints on the wire (CDW13).
    pub wire_hints: bool,
    /// Completion coalescing of task wake-ups on I/O queues (default off);
    /// see docs/isolation.md.
    pub coalescing: sluice_proto::coalesce::CoalesceConfig,
    /// Send scheduler of the I/O queues (default `immediate`): `unified`
    /// batches every PDU in one container, `isolated` puts read commands in
    /// a latency freight and writes with in-capsule data plus H2CData in a
    /// data freight (docs/isolation.md). `send.coalescing` is ignored here.
    pub send: sluice_proto::send::SendConfig,
    /// Charging through the kernel: every queue thread of this controller
    /// (admin and I/O, and those of later reconnects) moves itself into this
    /// cgroup when it starts, so the cgroup's CFS quota covers the
    /// NVMe/TCP protocol work done for this host NQN (tenant). cgroup v1
    /// (e.g. a directory under `/sys/fs/cgroup/cpu`): the thread's TID is
    /// written to `tasks`. cgroup v2: a threaded cgroup gets the TID in
    /// `cgroup.threads`; a domain cgroup only with [`Self::cgroup_procs`].
    /// A missing or unwritable cgroup fails the connect with
    /// [`HostError::Cgroup`] naming the path.
    pub cgroup: Option<std::path::PathBuf>,
    /// cgroup v2 domain cgroups: write the PID to `cgroup.procs`, which
    /// moves the **whole process** (every thread), not just the queue
    /// threads. Off by default; v1 and threaded v2 cgroups ignore it.
    pub cgroup_procs: bool,
    /// DH-HMAC-CHAP secret (`DHHC-1:...`): every queue authenticates with
    /// it when the controller asks (ATR in the Connect response).
    pub dhchap_secret: Option<sluice_auth::Secret>,
    /// The controller must prove this secret too (bidirectional).
    pub dhchap_ctrl_secret: Option<sluice_auth::Secret>,
    /// TCP congestion control of every queue's socket (`TCP_CONGESTION`;
    /// `None`: the system's default). A name the kernel lacks fails the
    /// connect with [`HostError::Transport`] naming it. See docs/host.md.
    pub tcp_congestion: Option<String>,
    /// I/O queues ask the controller to disable SQ flow control (Connect
    /// CATTR bit 2, what Linux's `disable_sqflow` asks): it then completes
    /// a successful read with the SUCCESS flag on its last C2HData, with no
    /// CapsuleResp, and the read completes with its data. On by default
    /// (docs/host.md, *SQ flow control*); the host never relies on SQHD,
    /// since it keeps at most its queue depth of commands outstanding. The
    /// admin queue keeps SQ flow control. A controller that refuses the bit
    /// (Connect Invalid Parameters naming CATTR, or Invalid Field)
    /// gets the queue connected again without it, with a warning.
    pub disable_sq_flow: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000".into(),
            hostid: [0; 16],
            io_queues: 1,
            direct_queues: 0,
            queue_depth: 128,
            hdr_digest: false,
            data_digest: false,
            kato: Duration::from_secs(10),
            command_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            reconnect: ReconnectPolicy::default(),
            polling: PollingPolicy::Interrupt,
            max_transfer_bytes: 1 << 20,
            wire_hints: true,
            coalescing: sluice_proto::coalesce::CoalesceConfig::default(),
            send: sluice_proto::send::SendConfig::default(),
            cgroup: None,
            cgroup_procs: false,
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tcp_congestion: None,
            disable_sq_flow: true,
        }
    }
}

/// What a Fence command answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceAnswer {
    /// Writes admitted to the granules and not completed yet.
    pub writes_in_flight: u32,
    /// log2 of the target's fence granule.
    pub granule_shift: u32,
}

/// The limits of the commands that move no data, from Identify Controller
/// (ONCS) and the NVM command set's Identify Controller (CNS 06h): how the
/// host splits Write Zeroes and Dataset Management. A controller that
/// answers CNS 06h with an error, or one below NVMe 1.2, sets no limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandLimits {
    /// ONCS: the controller takes Write Zeroes. Without it,
    /// [`Namespace::write_zeroes`] writes zeroed data instead.
    pub write_zeroes: bool,
    /// WZSL in bytes (`None`: only NLB's 65536 blocks bound a command).
    pub write_zeroes_bytes_max: Option<u64>,
    /// ONCS: the controller takes Dataset Management.
    pub dataset_management: bool,
    /// DMRL: most ranges in one Dataset Management (1..=256).
    pub dsm_ranges_max: u16,
    /// DMRSL: most blocks in one range (at least 1).
    pub dsm_range_blocks_max: u32,
    /// DMSL: most blocks in one Dataset Management (`None`: no limit).
    pub dsm_blocks_max: Option<u64>,
}

impl CommandLimits {
    /// The limits a controller's answers give: `nvm` is `None` when it
    /// had no CNS 06h to offer; `page_bytes_min` is CAP.MPSMIN's page.
    pub fn from_identify(
        ident: &IdentifyController,
        nvm: Option<&IdentifyControllerNvm>,
        page_bytes_min: u64,
    ) -> CommandLimits {
        let nvm = nvm.copied().unwrap_or_default();
        CommandLimits {
            write_zeroes: ident.oncs & oncs::WRITE_ZEROES != 0,
            write_zeroes_bytes_max: nvm.write_zeroes_bytes_max(page_bytes_min),
            dataset_management: ident.oncs & oncs::DSM != 0,
            dsm_ranges_max: if nvm.dmrl == 0 {
                256
            } else {
                u16::from(nvm.dmrl)
            },
            dsm_range_blocks_max: if nvm.dmrsl == 0 { u32::MAX } else { nvm.dmrsl },
            dsm_blocks_max: (nvm.dmsl != 0).then_some(nvm.dmsl),
        }
    }

    /// Blocks of `block_bytes` in one Write Zeroes: at most 65536 and the
    /// WZSL; `None` when the controller takes no Write Zeroes, or its WZSL
    /// is below one block.
    pub fn write_zeroes_blocks_max(&self, block_bytes: u32) -> Option<u32> {
        if !self.write_zeroes || block_bytes == 0 {
            return None;
        }
        let by_limit = self
            .write_zeroes_bytes_max
            .map_or(u64::MAX, |b| b / u64::from(block_bytes));
        let n = by_limit.min(65536);
        // n <= 65536.
        (n > 0).then(|| u32::try_from(n).unwrap_or(65536))
    }
}

/// A namespace as Identify reported it.
#[derive(Debug, Clone)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub block_size_bytes: u32,
    pub size_blocks: u64,
    pub identify: IdentifyNamespace,
}

/// One association: admin queue, I/O queues, identify data.
#[derive(Debug)]
struct Assoc {
    generation: u64,
    admin: QueueHandle,
    io: Vec<QueueHandle>,
    cntlid: u16,
    cap: u64,
    vs: u32,
    ident: IdentifyController,
    /// The active namespaces: listed at connect, and again after each
    /// Namespace Attribute Changed notice (`events`).
    namespaces: Arc<RwLock<Vec<NamespaceInfo>>>,
    max_transfer_bytes: u32,
    limits: CommandLimits,
    queue_depth: u16,
    /// In-capsule limit of the I/O queues.
    in_capsule: u32,
    /// I/O queues the controller granted (the highest usable QID).
    io_queues_granted: u16,
    /// The QID the next direct queue takes (after the threaded ones).
    next_direct_qid: AtomicU16,
    /// Whether I/O queues ask to disable SQ flow control: the option,
    /// cleared when the controller refused it on a threaded queue.
    disable_sq_flow: bool,
    /// Where queues report timed-out commands (the keep-alive task Aborts
    /// them on the admin queue).
    timeouts: mpsc::UnboundedSender<TimedOutCommand>,
    keepalive: Option<tokio::task::JoinHandle<()>>,
    /// Keeps an Asynchronous Event Request posted and handles the notices
    /// (when the controller offers Namespace Attribute Notices).
    events: Option<tokio::task::JoinHandle<()>>,
}

impl Assoc {
    fn shutdown(&self) {
        for k in self.keepalive.iter().chain(&self.events) {
            k.abort();
        }
        for q in &self.io {
            q.shutdown();
        }
        self.admin.shutdown();
    }
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    subnqn: String,
    opts: ConnectOptions,
    assoc: RwLock<Arc<Assoc>>,
    reconnecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    next_queue: AtomicUsize,
    /// Each namespace's size in blocks as last identified, shared with the
    /// [`Namespace`] handles; across reconnects too.
    sizes: Arc<NamespaceSizes>,
    /// The last reservation notices the controller sent (oldest first).
    notices: Arc<Mutex<VecDeque<NotificationLog>>>,
}

/// The size of each namespace as last identified, by NSID: set at connect
/// and after Namespace Attribute Changed notices, read by [`Namespace`]
/// handles without a lock (one atomic each).
#[derive(Debug, Default)]
struct NamespaceSizes(RwLock<BTreeMap<u32, Arc<AtomicU64>>>);

impl NamespaceSizes {
    /// The cell of `nsid`, made with `blocks` if it has none.
    fn cell(&self, nsid: u32, blocks: u64) -> Arc<AtomicU64> {
        if let Some(c) = sync::read(&self.0).get(&nsid) {
            return c.clone();
        }
        sync::write(&self.0)
            .entry(nsid)
            .or_insert_with(|| Arc::new(AtomicU64::new(blocks)))
            .clone()
    }

    /// Records the size of every namespace of `list`.
    fn record(&self, list: &[NamespaceInfo]) {
        for n in list {
            self.cell(n.nsid, n.size_blocks)
                .store(n.size_blocks, Ordering::Release);
        }
    }
}

/// A connected NVMe/TCP controller. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Controller {
    inner: Arc<Inner>,
}

/// The core of an I/O queue (threaded or direct): the admin parameters with
/// the association's transfer limit.
fn io_core(
    opts: &ConnectOptions,
    qid: u16,
    depth: u16,
    in_capsule: u32,
    max_transfer_bytes: u32,
) -> CoreConfig {
    let mut core = admin_core(opts, qid, depth, in_capsule);
    core.c2h_data_max_bytes = max_transfer_bytes.max(8192);
    core
}

fn admin_core(opts: &ConnectOptions, qid: u16, depth: u16, in_capsule: u32) -> CoreConfig {
    CoreConfig {
        qid,
        depth,
        hdr_digest: opts.hdr_digest,
        data_digest: opts.data_digest,
        in_capsule_max_bytes: in_capsule,
        command_timeout: opts.command_timeout,
        c2h_data_max_bytes: opts.max_transfer_bytes.clamp(8192, TRANSFER_BYTES_MAX),
    }
}

fn nvme(opcode: u8, c: Result<Completion>) -> Result<Completion> {
    c.map_err(|e| match e {
        HostError::Nvme { status, result, .. } => HostError::Nvme {
            opcode,
            status,
            result,
        },
        e => e,
    })
}

/// ASCR, Authentication Secure Channel Required: bit 18 of a Connect
/// response's DW0 (secure channel concatenation, which this host lacks; the
/// Linux host without `concat` refuses it the same way).
const CONNECT_AUTHREQ_ASCR: u32 = 1 << 18;

/// The Fabrics Connect command of queue `qid` and its data; an I/O queue
/// (`qid > 0`) asks for SQ flow control to be disabled when
/// `disable_sq_flow` is set.
fn connect_command(
    qid: u16,
    sqsize: u16,
    kato: Duration,
    cntlid: u16,
    subnqn: &str,
    opts: &ConnectOptions,
    disable_sq_flow: bool,
) -> (Sqe, Payload) {
    let cmd = ConnectCommand {
        cid: 0,
        recfmt: 0,
        qid,
        sqsize,
        cattr: if qid > 0 && disable_sq_flow {
            sluice_proto::fabrics::CATTR_DISABLE_SQ_FLOW
        } else {
            0
        },
        kato_ms: if qid == 0 {
            u32::try_from(kato.as_millis()).unwrap_or(u32::MAX)
        } else {
            0
        },
    };
    let data = ConnectData {
        hostid: host_identifier(opts),
        cntlid,
        subnqn: subnqn.to_string(),
        hostnqn: opts.hostnqn.clone(),
    };
    (cmd.to_sqe(), Payload::Write(data.encode()))
}

/// What a Connect's completion says: the CNTLID, and whether the controller
/// requires DH-HMAC-CHAP (ATR) before anything else.
fn connect_outcome(qid: u16, subnqn: &str, r: Result<Completion>) -> Result<(u16, bool)> {
    let c = r.map_err(|e| match e {
        HostError::Nvme { status, result, .. } => HostError::Incompatible(format!(
            "Connect qid {qid} to {subnqn} refused: {status} (IATTR {}, IPO {})",
            (result >> 16) & 1,
            result & 0xffff
        )),
        e => e,
    })?;
    if c.cqe.result & CONNECT_AUTHREQ_ASCR != 0 {
        return Err(HostError::Authentication(format!(
            "{subnqn} requires secure channel concatenation (ASCR in the Connect response of queue {qid}), which this host does not support"
        )));
    }
    let atr = c.cqe.result & sluice_proto::fabrics::CONNECT_AUTHREQ_ATR != 0;
    Ok(((c.cqe.result & 0xffff) as u16, atr))
}

/// Whether a Connect that asked to disable SQ flow control was refused for
/// asking: Connect Invalid Parameters naming CATTR (IATTR 0, IPO 46), or
/// Invalid Field in Command, which names no field. A controller that
/// cannot disable SQ flow control answers one of these (the discovery
/// log's TREQ bit 2 says which controllers can); the host then connects
/// its I/O queues without asking. A refusal naming another field (SQSIZE,
/// or the Connect data's host NQN or CNTLID) is not this.
fn refuses_sq_flow_disable(r: &Result<Completion>) -> bool {
    match r {
        Err(HostError::Nvme { status, result, .. }) => {
            let names_cattr = (result >> 16) & 1 == 0
                && result & 0xffff == u32::from(sluice_proto::fabrics::connect_offset::CATTR);
            (status.same_code(Status::CONNECT_INVALID_PARAMETERS) && names_cattr)
                || status.same_code(Status::INVALID_FIELD)
        }
        _ => false,
    }
}

/// How a queue's Connect ended.
enum ConnectOutcome {
    /// Connected (and authenticated when asked); the CNTLID.
    Connected(u16),
    /// The controller refused to disable SQ flow control
    /// ([`refuses_sq_flow_disable`]); the error says how.
    SqFlowDisableRefused(HostError),
}

/// Sends a Fabrics Connect on `q` (and authenticates when asked). An I/O
/// queue's Connect asks to disable SQ flow control when `disable_sq_flow`
/// is set; a refusal of that is [`ConnectOutcome::SqFlowDisableRefused`], so
/// the caller can connect the queue again without asking.
#[allow(clippy::too_many_arguments)]
async fn fabrics_connect(
    q: &QueueHandle,
    qid: u16,
    sqsize: u16,
    kato: Duration,
    cntlid: u16,
    subnqn: &str,
    opts: &ConnectOptions,
    disable_sq_flow: bool,
) -> Result<ConnectOutcome> {
    let (sqe, payload) = connect_command(qid, sqsize, kato, cntlid, subnqn, opts, disable_sq_flow);
    let r = q.execute(sqe, payload).await;
    let refused = qid > 0 && disable_sq_flow && refuses_sq_flow_disable(&r);
    let (cntlid, atr) = match connect_outcome(qid, subnqn, r) {
        Err(e) if refused => return Ok(ConnectOutcome::SqFlowDisableRefused(e)),
        r => r?,
    };
    if atr {
        authenticate(&mut Threaded(q), qid, subnqn, opts).await?;
    }
    Ok(ConnectOutcome::Connected(cntlid))
}

/// A queue that runs setup commands (the DH-HMAC-CHAP exchange after a
/// Connect) one at a time: a threaded queue, or a direct queue its opener
/// drives (blocking, on a blocking-pool thread).
trait SetupQueue {
    fn run(
        &mut self,
        sqe: Sqe,
        payload: Payload,
    ) -> impl std::future::Future<Output = Result<Completion>> + Send;
}

struct Threaded<'a>(&'a QueueHandle);

impl SetupQueue for Threaded<'_> {
    fn run(
        &mut self,
        sqe: Sqe,
        payload: Payload,
    ) -> impl std::future::Future<Output = Result<Completion>> + Send {
        self.0.execute(sqe, payload)
    }
}

impl SetupQueue for DirectQueue {
    /// Ready at once: the command ran to completion before it returns.
    fn run(
        &mut self,
        sqe: Sqe,
        payload: Payload,
    ) -> impl std::future::Future<Output = Result<Completion>> + Send {
        std::future::ready(self.execute_blocking(sqe, payload).and_then(|r| r))
    }
}

/// Authenticates a direct queue whose Connect asked for it, on the
/// calling (blocking-pool) thread: [`authenticate`] over
/// [`SetupQueue::run`], whose futures are ready when made, so one poll
/// finishes it.
fn authenticate_direct(
    q: &mut DirectQueue,
    qid: u16,
    subnqn: &str,
    opts: &ConnectOptions,
) -> Result<()> {
    let mut f = std::pin::pin!(authenticate(q, qid, subnqn, opts));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::future::Future::poll(f.as_mut(), &mut cx) {
        std::task::Poll::Ready(r) => r,
        // Every await is on a ready future: unreachable, but not a panic.
        std::task::Poll::Pending => Err(HostError::Authentication(format!(
            "queue {qid}: the DH-HMAC-CHAP exchange did not finish in one pass"
        ))),
    }
}

fn auth_send(msg: Vec<u8>) -> (Sqe, Payload) {
    use sluice_proto::fabrics::AuthCommand;
    let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
    (
        AuthCommand { send: true, len }.to_sqe(0),
        Payload::Write(msg),
    )
}

fn auth_receive() -> (Sqe, Payload) {
    use sluice_proto::fabrics::AuthCommand;
    (
        AuthCommand {
            send: false,
            len: AUTH_RECEIVE_BYTES,
        }
        .to_sqe(0),
        Payload::Read(AUTH_RECEIVE_BYTES),
    )
}

/// AUTH_Receive allocation length: the largest message, as the Linux host
/// asks for.
#[allow(clippy::cast_possible_truncation)] // 4096
const AUTH_RECEIVE_BYTES: u32 = sluice_auth::message::MESSAGE_BYTES_MAX as u32;

/// One DH-HMAC-CHAP transaction on queue `qid` (`sluice_auth::HostAuth`
/// does the protocol; this sends and receives its messages).
async fn authenticate<Q: SetupQueue>(
    q: &mut Q,
    qid: u16,
    subnqn: &str,
    opts: &ConnectOptions,
) -> Result<()> {
    let Some(secret) = opts.dhchap_secret.clone() else {
        return Err(HostError::Authentication(format!(
            "{subnqn} requires DH-HMAC-CHAP (the Connect of queue {qid} asked for it); give a secret (--dhchap-secret)"
        )));
    };
    let mut h = sluice_auth::HostAuth::new(
        sluice_auth::HostConfig {
            hostnqn: opts.hostnqn.clone(),
            subnqn: subnqn.to_owned(),
            secret,
            ctrl_secret: opts.dhchap_ctrl_secret.clone(),
        },
        qid,
    );
    macro_rules! send {
        ($msg:expr) => {{
            let (sqe, payload) = auth_send($msg);
            q.run(sqe, payload)
        }};
    }
    macro_rules! receive {
        () => {{
            let (sqe, payload) = auth_receive();
            q.run(sqe, payload)
        }};
    }
    let failed = |e: sluice_auth::HostAuthError| {
        HostError::Authentication(format!("queue {qid} to {subnqn}: {e}"))
    };
    nvme(admin::FABRICS, send!(h.negotiate()).await)?;
    let challenge = nvme(admin::FABRICS, receive!().await)?.data;
    let mut random_ok = true;
    let reply = h.handle_challenge(
        &challenge,
        &mut |b: &mut [u8]| random_ok &= sluice_auth::os_random(b),
        sluice_auth::random_seqnum(),
    );
    if !random_ok {
        return Err(HostError::Authentication(
            "the operating system gave no random bytes".into(),
        ));
    }
    let reply = match reply {
        Ok(r) => r,
        Err(e) => {
            if let Some(x) = e.failure2_explanation() {
                let _ = send!(h.failure2(x)).await;
            }
            return Err(failed(e));
        }
    };
    // nvmet answers a wrong response with Failure1 and then drops the
    // queue; when its close overtakes the Failure1 (a reset discards what
    // we had not read yet) the loss itself is the refusal.
    let refused = |e: HostError| {
        match e {
        HostError::ConnectionLost(m) | HostError::Transport(m) => HostError::Authentication(format!(
            "queue {qid} to {subnqn}: the controller closed the connection after our DH-HMAC-CHAP reply \
             (it refused the response: is the secret right?): {m}"
        )),
        e => e,
    }
    };
    nvme(admin::FABRICS, send!(reply).await).map_err(refused)?;
    let success1 = nvme(admin::FABRICS, receive!().await)
        .map_err(refused)?
        .data;
    match h.handle_success1(&success1) {
        Ok(Some(success2)) => {
            nvme(admin::FABRICS, send!(success2).await)?;
        }
        Ok(None) => {}
        Err(e) => {
            if let Some(x) = e.failure2_explanation() {
                let _ = send!(h.failure2(x)).await;
            }
            return Err(failed(e));
        }
    }
    if let Some((hash, group)) = h.negotiated() {
        tracing::debug!(qid, %hash, %group, bidirectional = opts.dhchap_ctrl_secret.is_some(), "authenticated (DH-HMAC-CHAP)");
    }
    Ok(())
}

async fn property_get(q: &QueueHandle, offset: u32, size8: bool) -> Result<u64> {
    let p = PropertyCommand {
        size8,
        offset,
        value: 0,
    };
    let c = nvme(
        admin::FABRICS,
        q.execute(p.to_sqe(0, fctype::PROPERTY_GET), Payload::None)
            .await,
    )?;
    Ok(c.cqe.result as u64 | ((c.cqe.dw1 as u64) << 32))
}

async fn property_set(q: &QueueHandle, offset: u32, value: u32) -> Result<()> {
    let p = PropertyCommand {
        size8: false,
        offset,
        value: value as u64,
    };
    nvme(
        admin::FABRICS,
        q.execute(p.to_sqe(0, fctype::PROPERTY_SET), Payload::None)
            .await,
    )?;
    Ok(())
}

async fn identify(q: &QueueHandle, cns_v: u8, nsid: u32) -> Result<Vec<u8>> {
    let mut s = Sqe::new(admin::IDENTIFY, 0, nsid);
    s.set_cdw(10, cns_v as u32);
    Ok(nvme(admin::IDENTIFY, q.execute(s, Payload::Read(4096)).await)?.data)
}

/// The NVM command set's Identify Controller (CNS 06h, CSI 00h), asked of
/// controllers of NVMe 1.2 and later (where CNS is a whole byte, as the
/// Linux host asks). An NVMe error status means "no limits" (`None`);
/// transport errors fail.
async fn identify_nvm(q: &QueueHandle, vs: u32) -> Result<Option<IdentifyControllerNvm>> {
    if vs < 0x0001_0200 {
        return Ok(None);
    }
    let mut s = Sqe::new(admin::IDENTIFY, 0, 0);
    s.set_cdw(10, u32::from(cns::CS_CONTROLLER));
    s.set_cdw(11, u32::from(sluice_proto::identify::csi::NVM) << 24);
    match nvme(admin::IDENTIFY, q.execute(s, Payload::Read(4096)).await) {
        Ok(c) => Ok(IdentifyControllerNvm::decode(&c.data)),
        Err(HostError::Nvme { status, .. }) => {
            tracing::debug!(%status, "no NVM Identify Controller: no Write Zeroes or DSM limits");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Enables the controller and waits for CSTS.RDY, bounded by CAP.TO.
async fn enable(q: &QueueHandle, cap: u64) -> Result<()> {
    let to = Duration::from_millis(500 * Cap::decode(cap).to_500ms.max(1) as u64);
    let v = cc::EN | (6 << cc::IOSQES_SHIFT) | (4 << cc::IOCQES_SHIFT);
    property_set(q, prop::CC, v).await?;
    let deadline = Instant::now() + to;
    loop {
        // A 4-byte property: the value is in the low half.
        let st = (property_get(q, prop::CSTS, false).await? & 0xffff_ffff) as u32;
        if st & csts::CFS != 0 {
            return Err(HostError::Incompatible(
                "controller fatal status (CSTS.CFS)".into(),
            ));
        }
        if st & csts::RDY != 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HostError::Timeout {
                opcode: admin::FABRICS,
                cid: 0,
                timeout_ms: crate::core::millis(to),
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The admin-queue part of an association (used by discovery too).
pub(crate) struct AdminSession {
    pub(crate) admin: QueueHandle,
    pub(crate) cntlid: u16,
    pub(crate) cap: u64,
    pub(crate) vs: u32,
    pub(crate) ident: IdentifyController,
}

pub(crate) async fn open_admin(
    addr: SocketAddr,
    subnqn: &str,
    opts: &ConnectOptions,
    timeouts: Option<mpsc::UnboundedSender<TimedOutCommand>>,
) -> Result<AdminSession> {
    let admin = QueueHandle::connect(
        QueueParams {
            addr,
            core: admin_core(opts, 0, ADMIN_QUEUE_DEPTH, ADMIN_IN_CAPSULE_BYTES),
            polling: opts.polling,
            connect_timeout: opts.connect_timeout,
            hostnqn: opts.hostnqn.clone(),
            coalescing: opts.coalescing,
            send: sluice_proto::send::SendConfig::default(),
            cgroup: opts.cgroup.clone(),
            cgroup_procs: opts.cgroup_procs,
            tcp_congestion: opts.tcp_congestion.clone(),
        },
        timeouts,
    )
    .await?;
    let r: Result<AdminSession> = async {
        let cntlid = match fabrics_connect(
            &admin,
            0,
            ADMIN_QUEUE_DEPTH - 1,
            opts.kato,
            CNTLID_DYNAMIC,
            subnqn,
            opts,
            false,
        )
        .await?
        {
            ConnectOutcome::Connected(cntlid) => cntlid,
            // The admin queue never asks, so this is only the error.
            ConnectOutcome::SqFlowDisableRefused(e) => return Err(e),
        };
        let cap = property_get(&admin, prop::CAP, true).await?;
        let vs = (property_get(&admin, prop::VS, false).await? & 0xffff_ffff) as u32;
        enable(&admin, cap).await?;
        let ident = IdentifyController::decode(&identify(&admin, cns::CONTROLLER, 0).await?)
            .ok_or_else(|| HostError::Incompatible("short Identify Controller".into()))?;
        Ok(AdminSession {
            admin: admin.clone(),
            cntlid,
            cap,
            vs,
            ident,
        })
    }
    .await;
    if r.is_err() {
        admin.shutdown();
    }
    r
}

/// The active namespaces: the active list, then Identify Namespace for
/// each (at most [`NAMESPACES_MAX`]; those of size 0 left out).
async fn list_namespaces(admin: &QueueHandle) -> Result<Vec<NamespaceInfo>> {
    let mut namespaces = Vec::new();
    let list = decode_active_ns_list(&identify(admin, cns::ACTIVE_NS_LIST, 0).await?);
    for nsid in list.into_iter().take(NAMESPACES_MAX) {
        let id = IdentifyNamespace::decode(&identify(admin, cns::NAMESPACE, nsid).await?)
            .ok_or_else(|| HostError::Incompatible("short Identify Namespace".into()))?;
        if id.nsze == 0 {
            continue;
        }
        namespaces.push(NamespaceInfo {
            nsid,
            block_size_bytes: u32::try_from(id.block_size_bytes()).map_err(|_| {
                HostError::Incompatible(format!("namespace {nsid}: block size over 4 GiB"))
            })?,
            size_blocks: id.nsze,
            identify: id,
        });
    }
    Ok(namespaces)
}

/// Whether an Asynchronous Event Request's DW0 is Reservation Log Page
/// Available (type I/O command specific, information 00h, log page 80h).
fn is_reservation_log_available(dw0: u32) -> bool {
    dw0 & 0x7 == 6 && (dw0 >> 8) & 0xff == 0 && (dw0 >> 16) & 0xff == u32::from(LID_RESERVATION)
}

/// Bytes of the Reservation Notification log page, as Get Log Page counts.
const RESERVATION_LOG_BYTES: u32 = 64;
const _: () = assert!(RESERVATION_LOG_BYTES as usize == reservation::NOTIFICATION_LOG_BYTES);

/// Reservation notices a controller keeps for [`Controller::reservation_notices`].
const RESERVATION_NOTICES_KEPT: usize = 64;
/// Pages one Reservation Log Page Available makes the host read at most
/// (the page says how many more wait; a controller that never says
/// "empty" is not read forever).
const RESERVATION_PAGES_PER_EVENT_MAX: usize = 256;

/// Reads the Reservation Notification log page until it is empty (which
/// also unmasks the next notice), logging and keeping each notice.
async fn take_reservation_notices(admin: &QueueHandle, kept: &Mutex<VecDeque<NotificationLog>>) {
    for _ in 0..RESERVATION_PAGES_PER_EVENT_MAX {
        let page =
            match get_log_page(admin, LID_RESERVATION, u32::MAX, 0, RESERVATION_LOG_BYTES).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the Reservation Notification log page");
                    return;
                }
            };
        let Some(n) = NotificationLog::decode(&page) else {
            return;
        };
        if n.count == 0 || n.kind == reservation::notice::EMPTY {
            return;
        }
        let what = match n.kind {
            reservation::notice::REGISTRATION_PREEMPTED => "this host's registration was preempted",
            reservation::notice::RESERVATION_RELEASED => "the reservation was released",
            reservation::notice::RESERVATION_PREEMPTED => "the reservation was preempted (cleared)",
            _ => "a reservation notice of an unknown type",
        };
        tracing::warn!(nsid = n.nsid, count = n.count, "reservation notice: {what}");
        {
            let mut k = sync::lock(kept);
            if k.len() == RESERVATION_NOTICES_KEPT {
                k.pop_front();
            }
            k.push_back(n);
        }
        if n.available == 0 {
            return;
        }
    }
}

/// Whether an Asynchronous Event Request's DW0 is a Namespace Attribute
/// Changed notice (type Notice, information 00h, log page 04h).
fn is_ns_attribute_changed(dw0: u32) -> bool {
    dw0 & 0x7 == 2 && (dw0 >> 8) & 0xff == 0 && (dw0 >> 16) & 0xff == u32::from(LID_CHANGED_NS_LIST)
}

/// Keeps one Asynchronous Event Request posted on `admin` until the queue
/// closes. On a Namespace Attribute Changed notice it reads the Changed
/// Namespace List (which unmasks the next notice) and lists the namespaces
/// again into `namespaces` and `sizes`; on Reservation Log Page Available
/// it reads the Reservation Notification log page empty into `notices`;
/// other events are logged. Ends when the controller refuses the request
/// (it held too many, say) or the association goes.
async fn async_events(
    admin: QueueHandle,
    namespaces: Arc<RwLock<Vec<NamespaceInfo>>>,
    sizes: Arc<NamespaceSizes>,
    notices: Arc<Mutex<VecDeque<NotificationLog>>>,
) {
    loop {
        let dw0 = match admin
            .execute(Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0), Payload::None)
            .await
        {
            Ok(c) => c.cqe.result,
            Err(e) => {
                if !admin.is_closed() {
                    tracing::warn!(error = %e, "asynchronous event request failed: namespace changes are not followed any more");
                }
                return;
            }
        };
        if is_reservation_log_available(dw0) {
            take_reservation_notices(&admin, &notices).await;
            continue;
        }
        if !is_ns_attribute_changed(dw0) {
            tracing::info!(dw0 = format_args!("{dw0:#010x}"), "asynchronous event");
            continue;
        }
        let changed = match get_log_page(
            &admin,
            LID_CHANGED_NS_LIST,
            u32::MAX,
            0,
            CHANGED_NS_LIST_BYTES,
        )
        .await
        {
            Ok(page) => decode_active_ns_list(&page),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the Changed Namespace List");
                Vec::new()
            }
        };
        match list_namespaces(&admin).await {
            Ok(list) => {
                let nsids: Vec<u32> = list.iter().map(|n| n.nsid).collect();
                tracing::info!(?changed, active = ?nsids, "namespaces changed: identified again");
                sizes.record(&list);
                *sync::write(&namespaces) = list;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the namespaces after a change");
            }
        }
    }
}

async fn establish(
    inner_addr: SocketAddr,
    subnqn: &str,
    opts: &ConnectOptions,
    generation: u64,
    sizes: &Arc<NamespaceSizes>,
    notices: &Arc<Mutex<VecDeque<NotificationLog>>>,
) -> Result<Assoc> {
    let span = tracing::info_span!("connect", hostnqn = %opts.hostnqn, %subnqn, addr = %inner_addr);
    let _g = span.enter();
    let (to_tx, mut to_rx) = mpsc::unbounded_channel::<TimedOutCommand>();
    let s = open_admin(inner_addr, subnqn, opts, Some(to_tx.clone())).await?;
    let admin = s.admin.clone();
    let r: Result<Assoc> = async {
        // Largest transfer: MDTS in units of the minimum page size (CAP.MPSMIN).
        let mpsmin_bytes = 4096u64 << ((s.cap >> 48) & 0xf);
        let mdts_bytes = if s.ident.mdts == 0 {
            u64::MAX
        } else {
            mpsmin_bytes << s.ident.mdts.min(20)
        };
        let max_transfer_bytes = (opts.max_transfer_bytes.clamp(4096, TRANSFER_BYTES_MAX) as u64)
            .min(mdts_bytes) as u32;
        let nvm = identify_nvm(&admin, s.vs).await?;
        let limits = CommandLimits::from_identify(&s.ident, nvm.as_ref(), mpsmin_bytes);
        // Number of queues: ask (threaded plus direct ones), then use
        // min(granted, asked) threaded queues; direct queues take the QIDs
        // after them, up to what was granted.
        let threaded = opts.io_queues.clamp(1, IO_QUEUES_MAX);
        let want = threaded.saturating_add(opts.direct_queues).min(IO_QUEUES_MAX);
        let mut sf = Sqe::new(admin::SET_FEATURES, 0, 0);
        sf.set_cdw(10, FID_NUMBER_OF_QUEUES);
        sf.set_cdw(11, (want as u32 - 1) | ((want as u32 - 1) << 16));
        let c = nvme(admin::SET_FEATURES, admin.execute(sf, Payload::None).await)?;
        // NSQA and NCQA are 0's based: 0xffff grants 65536, which saturates
        // (we never ask for more than IO_QUEUES_MAX).
        let granted_0s = (c.cqe.result & 0xffff).min(c.cqe.result >> 16);
        let granted = u16::try_from(granted_0s + 1).unwrap_or(u16::MAX);
        let nq = threaded.min(granted);
        let mqes = Cap::decode(s.cap).mqes as u32 + 1;
        let mut depth = (opts.queue_depth as u32).clamp(2, crate::core::QUEUE_DEPTH_MAX as u32).min(mqes);
        if s.ident.maxcmd > 0 {
            depth = depth.min(s.ident.maxcmd as u32);
        }
        // Clamped to QUEUE_DEPTH_MAX above.
        let depth = u16::try_from(depth).unwrap_or(crate::core::QUEUE_DEPTH_MAX);
        let in_capsule = if s.ident.icdoff == 0 && s.ident.ioccsz > 4 {
            (s.ident.ioccsz * 16 - 64).min(TRANSFER_BYTES_MAX)
        } else {
            0
        };
        tracing::debug!(nq, depth, in_capsule, max_transfer_bytes, cntlid = s.cntlid, "association parameters");
        let mut ioq = Vec::with_capacity(nq as usize);
        // Cleared when the controller refuses to disable SQ flow control:
        // the queue is connected again, and the rest asked, without it.
        let mut disable_sq_flow = opts.disable_sq_flow;
        let mut qid = 1;
        while qid <= nq {
            let core = io_core(opts, qid, depth, in_capsule, max_transfer_bytes);
            let q = QueueHandle::connect(
                QueueParams {
                    addr: inner_addr,
                    core,
                    polling: opts.polling,
                    connect_timeout: opts.connect_timeout,
                    hostnqn: opts.hostnqn.clone(),
                    coalescing: opts.coalescing,
                    send: opts.send,
                    cgroup: opts.cgroup.clone(),
                    cgroup_procs: opts.cgroup_procs,
                    tcp_congestion: opts.tcp_congestion.clone(),
                },
                Some(to_tx.clone()),
            )
            .await?;
            // Register before Connect so a failure below closes it.
            ioq.push(q.clone());
            match fabrics_connect(&q, qid, depth - 1, opts.kato, s.cntlid, subnqn, opts, disable_sq_flow).await {
                Ok(ConnectOutcome::Connected(_)) => qid += 1,
                Ok(ConnectOutcome::SqFlowDisableRefused(e)) => {
                    tracing::warn!(qid, subnqn, error = %e, "the controller refuses to disable SQ flow control: connecting the I/O queues with it");
                    q.shutdown();
                    ioq.pop();
                    disable_sq_flow = false;
                }
                Err(e) => {
                    for q in &ioq {
                        q.shutdown();
                    }
                    return Err(e);
                }
            }
        }
        let namespaces = list_namespaces(&admin).await?;
        sizes.record(&namespaces);
        let namespaces = Arc::new(RwLock::new(namespaces));
        let events = if s.ident.oaes & AEN_NS_ATTRIBUTE != 0 {
            let mut sf = Sqe::new(admin::SET_FEATURES, 0, 0);
            sf.set_cdw(10, FID_ASYNC_EVENT_CONFIG);
            sf.set_cdw(11, AEN_NS_ATTRIBUTE);
            match nvme(admin::SET_FEATURES, admin.execute(sf, Payload::None).await) {
                Ok(_) => Some(tokio::spawn(async_events(
                    admin.clone(),
                    namespaces.clone(),
                    sizes.clone(),
                    notices.clone(),
                ))),
                // As Linux: an optional feature refused is not a failed connect.
                Err(e) => {
                    tracing::warn!(error = %e, "the controller refuses the Namespace Attribute Notices it advertises: namespace changes are not followed");
                    None
                }
            }
        } else {
            None
        };
        // Keep alive every KATO/2, and best-effort Abort of timed-out commands.
        let keepalive = {
            let admin = admin.clone();
            let period = if opts.kato.is_zero() {
                None
            } else {
                Some(opts.kato / 2)
            };
            Some(tokio::spawn(async move {
                let mut tick = period.map(tokio::time::interval);
                loop {
                    tokio::select! {
                        _ = async { match tick.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending::<()>().await } } => {
                            let r = admin.execute(Sqe::new(admin::KEEP_ALIVE, 0, 0), Payload::None).await;
                            if let Err(e) = r {
                                tracing::warn!(error = %e, "keep alive failed");
                                if admin.is_closed() { return; }
                            }
                        }
                        t = to_rx.recv() => {
                            let Some(t) = t else { return };
                            let mut s = Sqe::new(admin::ABORT, 0, 0);
                            s.set_cdw(10, t.qid as u32 | ((t.cid as u32) << 16));
                            let rx = admin.submit(s, Payload::None);
                            tokio::spawn(async move { let _ = wait(rx).await; });
                        }
                    }
                }
            }))
        };
        Ok(Assoc {
            generation,
            disable_sq_flow,
            admin: admin.clone(),
            io: ioq,
            cntlid: s.cntlid,
            cap: s.cap,
            vs: s.vs,
            ident: s.ident.clone(),
            namespaces,
            max_transfer_bytes,
            limits,
            queue_depth: depth,
            in_capsule,
            io_queues_granted: granted,
            next_direct_qid: AtomicU16::new(nq + 1),
            timeouts: to_tx.clone(),
            keepalive,
            events,
        })
    }
    .await;
    if r.is_err() {
        admin.shutdown();
    }
    r
}

impl Controller {
    /// Connects to `subnqn` at `addr` and sets up the whole association.
    pub async fn connect(
        addr: SocketAddr,
        subnqn: &str,
        opts: ConnectOptions,
    ) -> Result<Controller> {
        if subnqn.is_empty() || subnqn.len() > sluice_proto::NQN_LEN_MAX {
            return Err(HostError::InvalidArgument(format!(
                "bad subsystem NQN `{subnqn}`"
            )));
        }
        if opts.hostnqn.is_empty() || opts.hostnqn.len() > sluice_proto::NQN_LEN_MAX {
            return Err(HostError::InvalidArgument(format!(
                "bad host NQN `{}`",
                opts.hostnqn
            )));
        }
        if let Err((k, why)) = opts.send.validate() {
            return Err(HostError::InvalidArgument(format!(
                "send options: {k}: {why}"
            )));
        }
        if let Some(cg) = &opts.cgroup {
            if !cg.is_dir() {
                return Err(HostError::Cgroup(
                    sluice_cpu::CgroupError::Missing(cg.clone()).to_string(),
                ));
            }
        }
        let sizes = Arc::new(NamespaceSizes::default());
        let notices = Arc::new(Mutex::new(VecDeque::new()));
        let assoc = establish(addr, subnqn, &opts, 0, &sizes, &notices).await?;
        Ok(Controller {
            inner: Arc::new(Inner {
                addr,
                subnqn: subnqn.to_string(),
                opts,
                assoc: RwLock::new(Arc::new(assoc)),
                reconnecting: tokio::sync::Mutex::new(()),
                generation: AtomicU64::new(0),
                next_queue: AtomicUsize::new(0),
                sizes,
                notices,
            }),
        })
    }

    fn assoc(&self) -> Arc<Assoc> {
        sync::read(&self.inner.assoc).clone()
    }

    pub fn cntlid(&self) -> u16 {
        self.assoc().cntlid
    }

    /// The last reservation notices the controller sent this host (at most
    /// 64, oldest first): the Reservation Notification log page entries
    /// read on each Reservation Log Page Available event, each also logged
    /// at WARN (this host's registration preempted, a reservation
    /// released or cleared).
    pub fn reservation_notices(&self) -> Vec<NotificationLog> {
        sync::lock(&self.inner.notices).iter().copied().collect()
    }
    pub fn identify(&self) -> IdentifyController {
        self.assoc().ident.clone()
    }
    /// Raw CAP and VS properties.
    pub fn properties(&self) -> (u64, u32) {
        let a = self.assoc();
        (a.cap, a.vs)
    }
    /// Counters of the I/O queues of the current association, summed
    /// (submissions, completions, wake-up notifications, send syscalls).
    pub fn io_stats(&self) -> crate::queue::HostQueueStats {
        let mut s = crate::queue::HostQueueStats::default();
        for q in &self.assoc().io {
            s.add(&q.stats());
        }
        s
    }

    /// TIDs of the queue threads of the current association (admin first,
    /// then the I/O queues); for cgroup checks and per-thread CPU clocks.
    pub fn queue_tids(&self) -> Vec<i32> {
        let a = self.assoc();
        std::iter::once(&a.admin)
            .chain(a.io.iter())
            .map(|q| q.tid())
            .collect()
    }

    /// Number of I/O queues in use.
    pub fn io_queue_count(&self) -> usize {
        self.assoc().io.len()
    }
    /// Commands per I/O queue (after CAP.MQES and MAXCMD).
    pub fn queue_depth(&self) -> u16 {
        self.assoc().queue_depth
    }
    /// Largest bytes per command (min of MDTS and the host's cap).
    pub fn max_transfer_bytes(&self) -> u32 {
        self.assoc().max_transfer_bytes
    }
    /// The active namespaces, as identified at connect or after the last
    /// Namespace Attribute Changed notice.
    pub fn namespaces(&self) -> Vec<NamespaceInfo> {
        sync::read(&self.assoc().namespaces).clone()
    }
    /// How Write Zeroes and Dataset Management are split (ONCS, CNS 06h).
    pub fn command_limits(&self) -> CommandLimits {
        self.assoc().limits
    }
    pub fn options(&self) -> &ConnectOptions {
        &self.inner.opts
    }

    /// Opens one more I/O queue of this association as a [`DirectQueue`],
    /// driven by the thread that owns it (no queue thread; see
    /// `crate::direct`). It takes the next unused QID after the threaded
    /// I/O queues, which must be within what the controller granted (ask
    /// for room with [`ConnectOptions::direct_queues`]); QIDs are not
    /// reused within an association. The queue has the threaded I/O
    /// queues' parameters (depth, digests, in-capsule and transfer limits,
    /// command timeout, send scheduler); `polling`, `coalescing` and
    /// `cgroup` do not apply (the owner's loop decides). Its timed-out
    /// commands are aborted through this controller's admin queue.
    ///
    /// A controller that asks the queue to authenticate (ATR) gets the
    /// same DH-HMAC-CHAP exchange as a threaded queue, run on the queue
    /// before it is handed out. The queue belongs to the current
    /// association: a reconnect does not carry it over.
    pub async fn connect_direct_queue(&self) -> Result<DirectQueue> {
        let a = self.assoc();
        let limit = a.io_queues_granted;
        let qid = a
            .next_direct_qid
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q != 0 && q <= limit).then(|| q.wrapping_add(1))
            })
            .map_err(|_| {
                HostError::InvalidArgument(format!(
                    "no I/O queue ID left for a direct queue: the controller granted {limit} I/O queues and all are in use (ask for room with ConnectOptions::direct_queues)"
                ))
            })?;
        let opts = self.inner.opts.clone();
        let depth = a.queue_depth;
        let subnqn = self.inner.subnqn.clone();
        let (addr, cntlid, timeouts) = (self.inner.addr, a.cntlid, a.timeouts.clone());
        let (in_capsule, max_transfer_bytes) = (a.in_capsule, a.max_transfer_bytes);
        let params =
            move |opts: &ConnectOptions, subnqn: &str, disable_sq_flow: bool| DirectParams {
                addr,
                core: io_core(opts, qid, depth, in_capsule, max_transfer_bytes),
                send: opts.send,
                connect_timeout: opts.connect_timeout,
                tcp_congestion: opts.tcp_congestion.clone(),
                connect: connect_command(
                    qid,
                    depth - 1,
                    Duration::ZERO,
                    cntlid,
                    subnqn,
                    opts,
                    disable_sq_flow,
                ),
                timeouts: Some(timeouts.clone()),
            };
        let disable_sq_flow = a.disable_sq_flow;
        let q = tokio::task::spawn_blocking(move || {
            let (mut q, mut r) = DirectQueue::open(params(&opts, &subnqn, disable_sq_flow))?;
            if disable_sq_flow && refuses_sq_flow_disable(&r) {
                let error = r.as_ref().err().map(ToString::to_string).unwrap_or_default();
                tracing::warn!(qid, subnqn, error, "the controller refuses to disable SQ flow control: connecting the direct queue with it");
                drop(q);
                (q, r) = DirectQueue::open(params(&opts, &subnqn, false))?;
            }
            let (_, atr) = connect_outcome(qid, &subnqn, r)?;
            if atr {
                authenticate_direct(&mut q, qid, &subnqn, &opts)?;
            }
            Ok::<_, HostError>(q)
        })
        .await
        .map_err(|e| HostError::Transport(format!("direct queue connect task: {e}")))??;
        tracing::debug!(qid, cntlid = a.cntlid, "direct queue connected");
        Ok(q)
    }

    /// A handle for I/O to `nsid`.
    pub fn namespace(&self, nsid: u32) -> Result<Namespace> {
        let info = sync::read(&self.assoc().namespaces)
            .iter()
            .find(|n| n.nsid == nsid)
            .cloned()
            .ok_or_else(|| HostError::InvalidArgument(format!("no active namespace {nsid}")))?;
        let size_blocks = self.inner.sizes.cell(nsid, info.size_blocks);
        Ok(Namespace {
            ctrl: self.clone(),
            info,
            size_blocks,
        })
    }

    /// Runs an admin command.
    pub async fn admin(&self, sqe: Sqe, payload: Payload) -> Result<Completion> {
        let op = sqe.opcode();
        nvme(op, self.assoc().admin.execute(sqe, payload).await)
    }

    /// Get Log Page of `len_bytes` at `offset_bytes`.
    pub async fn get_log_page(
        &self,
        lid: u8,
        nsid: u32,
        offset_bytes: u64,
        len_bytes: u32,
    ) -> Result<Vec<u8>> {
        get_log_page(&self.assoc().admin, lid, nsid, offset_bytes, len_bytes).await
    }

    /// Submits an I/O command on the next queue (round robin) and waits.
    /// On connection loss, reconnects per policy and retries once if asked.
    pub async fn io(&self, sqe: Sqe, payload: Payload) -> Result<Completion> {
        let retry = self.inner.opts.reconnect.retry_io;
        let keep = if retry { payload.duplicate() } else { None };
        let a = self.assoc();
        let r = self.submit_on(&a, sqe, payload).await;
        match r {
            Err(e) if e.is_fatal_for_connection() && self.inner.opts.reconnect.attempts_max > 0 => {
                self.reconnect(a.generation).await?;
                match keep {
                    Some(p) => self.submit_on(&self.assoc(), sqe, p).await,
                    None => Err(e),
                }
            }
            r => r,
        }
    }

    fn pick(&self, a: &Assoc) -> Result<QueueHandle> {
        if a.io.is_empty() {
            return Err(HostError::Incompatible("no I/O queues".into()));
        }
        let i = self.inner.next_queue.fetch_add(1, Ordering::Relaxed) % a.io.len();
        Ok(a.io[i].clone())
    }

    async fn submit_on(&self, a: &Assoc, sqe: Sqe, payload: Payload) -> Result<Completion> {
        let op = sqe.opcode();
        let q = self.pick(a)?;
        nvme(op, q.execute(sqe, payload).await)
    }

    /// Re-establishes the association with exponential back-off, unless
    /// another task already did since generation `seen`.
    pub async fn reconnect_if_stale(&self) -> Result<()> {
        let a = self.assoc();
        if a.admin.is_closed() || a.io.iter().any(|q| q.is_closed()) {
            self.reconnect(a.generation).await
        } else {
            Ok(())
        }
    }

    async fn reconnect(&self, seen: u64) -> Result<()> {
        let _g = self.inner.reconnecting.lock().await;
        let cur = self.assoc();
        if cur.generation != seen {
            return Ok(());
        }
        cur.shutdown();
        let p = &self.inner.opts.reconnect;
        let mut backoff = p.backoff_initial;
        let mut last = HostError::ConnectionLost("reconnect disabled".into());
        for attempt in 1..=p.attempts_max {
            tracing::info!(attempt, subnqn = %self.inner.subnqn, "reconnecting");
            let gen = self.inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
            match establish(
                self.inner.addr,
                &self.inner.subnqn,
                &self.inner.opts,
                gen,
                &self.inner.sizes,
                &self.inner.notices,
            )
            .await
            {
                Ok(a) => {
                    *sync::write(&self.inner.assoc) = Arc::new(a);
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "reconnect failed");
                    last = e;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(p.backoff_max);
                }
            }
        }
        Err(last)
    }

    /// Closes the association: waits up to `drain` for in-flight commands,
    /// stops keep alive, closes the sockets.
    pub async fn disconnect(&self, drain: Duration) {
        let a = self.assoc();
        for k in a.keepalive.iter().chain(&a.events) {
            k.abort();
        }
        for q in &a.io {
            q.shutdown();
        }
        let deadline = Instant::now() + drain;
        while a.io.iter().any(|q| !q.is_closed()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        a.admin.shutdown();
        while !a.admin.is_closed() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

pub(crate) async fn get_log_page(
    q: &QueueHandle,
    lid: u8,
    nsid: u32,
    offset_bytes: u64,
    len_bytes: u32,
) -> Result<Vec<u8>> {
    if len_bytes == 0 || !len_bytes.is_multiple_of(4) {
        return Err(HostError::InvalidArgument(format!(
            "log page length {len_bytes} must be a non-zero multiple of 4"
        )));
    }
    let g = GetLogPage {
        lid,
        lsp: 0,
        rae: false,
        len_bytes: len_bytes as u64,
        offset_bytes,
    };
    Ok(nvme(
        admin::GET_LOG_PAGE,
        q.execute(g.to_sqe(0, nsid), Payload::Read(len_bytes)).await,
    )?
    .data)
}

/// Block I/O on one namespace.
#[derive(Debug, Clone)]
pub struct Namespace {
    ctrl: Controller,
    /// As identified when the handle was made.
    info: NamespaceInfo,
    /// Its size now (the controller's cell, updated on notices).
    size_blocks: Arc<AtomicU64>,
}

impl Namespace {
    pub fn info(&self) -> &NamespaceInfo {
        &self.info
    }
    pub fn nsid(&self) -> u32 {
        self.info.nsid
    }
    pub fn block_size_bytes(&self) -> u32 {
        self.info.block_size_bytes
    }
    /// Its size in blocks now: as identified at connect, and again after
    /// each Namespace Attribute Changed notice the controller sent (a
    /// namespace grown online), where [`Self::info`] keeps the size at the
    /// handle's making.
    pub fn size_blocks(&self) -> u64 {
        self.size_blocks.load(Ordering::Acquire)
    }
    pub fn controller(&self) -> &Controller {
        &self.ctrl
    }

    /// What building this namespace's Read and Write commands needs, as a
    /// copy (for [`DirectQueue`]; no lock per command), with the size the
    /// namespace has now: a builder taken before it grew refuses I/O past
    /// the old end.
    pub fn rw_builder(&self) -> RwBuilder {
        let bs = self.info.block_size_bytes.max(1);
        RwBuilder {
            nsid: self.info.nsid,
            block_size_bytes: self.info.block_size_bytes,
            size_blocks: self.size_blocks(),
            // Blocks per command: MDTS (the negotiated transfer limit) in
            // blocks, at least 1 and at most 65536 (NLB is 16 bits, 0's based).
            chunk_blocks: (self.ctrl.max_transfer_bytes() / bs).clamp(1, 65536),
            wire_hints: self.ctrl.inner.opts.wire_hints,
        }
    }

    /// Sluice's Fence command on this namespace (`sluice_proto::fence`):
    /// with `raise`, lifts the fences of `granules` granules from
    /// `first_granule` to `epoch`; always reports the writes still in
    /// flight there. A target that is not Sluice answers Invalid Command
    /// Opcode.
    pub async fn fence(
        &self,
        first_granule: u64,
        granules: u32,
        epoch: u64,
        raise: bool,
    ) -> Result<FenceAnswer> {
        let f = sluice_proto::fence::Fence {
            nsid: self.info.nsid,
            first_granule,
            granules,
            epoch,
            raise,
        };
        let c = self.ctrl.admin(f.to_sqe(), Payload::None).await?;
        Ok(FenceAnswer {
            writes_in_flight: c.cqe.result,
            granule_shift: c.cqe.dw1,
        })
    }

    /// Reads `len_bytes` from `lba`; split into commands of at most MDTS,
    /// all in flight at once.
    pub async fn read(&self, lba: u64, len_bytes: usize, flags: IoFlags) -> Result<Vec<u8>> {
        let b = self.rw_builder();
        let blocks = b.check(lba, len_bytes)?;
        let chunk = b.chunk_blocks;
        let bs = self.info.block_size_bytes;
        if blocks <= u64::from(chunk) {
            // n * bs = len_bytes
            let n = piece(blocks, chunk);
            let s = b.sqe(io::READ, lba, n, flags);
            return Ok(self.ctrl.io(s, Payload::Read(n * bs)).await?.data);
        }
        let mut futs = Vec::new();
        let mut at = 0;
        while at < blocks {
            let n = piece(blocks - at, chunk);
            let s = b.sqe(io::READ, lba + at, n, flags);
            let c = self.ctrl.clone();
            futs.push(tokio::spawn(
                async move { c.io(s, Payload::Read(n * bs)).await },
            ));
            at += u64::from(n);
        }
        let mut out = Vec::with_capacity(len_bytes);
        for f in futs {
            let d = f
                .await
                .map_err(|e| HostError::Transport(format!("I/O task: {e}")))??;
            out.extend_from_slice(&d.data);
        }
        Ok(out)
    }

    /// Writes `data` (a multiple of the block size) at `lba`.
    pub async fn write(&self, lba: u64, data: &[u8], flags: IoFlags) -> Result<()> {
        let b = self.rw_builder();
        let blocks = b.check(lba, data.len())?;
        let chunk = b.chunk_blocks;
        let bs = self.info.block_size_bytes as usize;
        if blocks <= u64::from(chunk) {
            let s = b.sqe(io::WRITE, lba, piece(blocks, chunk), flags);
            self.ctrl.io(s, Payload::Write(data.to_vec())).await?;
            return Ok(());
        }
        let mut futs = Vec::new();
        for (i, bytes) in data.chunks(chunk as usize * bs).enumerate() {
            let s = b.sqe(
                io::WRITE,
                lba + i as u64 * u64::from(chunk),
                piece((bytes.len() / bs) as u64, chunk),
                flags,
            );
            let c = self.ctrl.clone();
            let p = bytes.to_vec();
            futs.push(tokio::spawn(
                async move { c.io(s, Payload::Write(p)).await },
            ));
        }
        for f in futs {
            f.await
                .map_err(|e| HostError::Transport(format!("I/O task: {e}")))??;
        }
        Ok(())
    }

    /// Writes an owned buffer without copying when it fits one command.
    pub async fn write_owned(&self, lba: u64, data: Vec<u8>, flags: IoFlags) -> Result<()> {
        let b = self.rw_builder();
        let blocks = b.check(lba, data.len())?;
        let chunk = b.chunk_blocks;
        if blocks <= u64::from(chunk) {
            let s = b.sqe(io::WRITE, lba, piece(blocks, chunk), flags);
            self.ctrl.io(s, Payload::Write(data)).await?;
            Ok(())
        } else {
            self.write(lba, &data, flags).await
        }
    }

    pub async fn flush(&self) -> Result<()> {
        self.ctrl
            .io(Sqe::new(io::FLUSH, 0, self.info.nsid), Payload::None)
            .await?;
        Ok(())
    }

    /// Write Zeroes over `blocks` blocks, split at the controller's limit
    /// (WZSL, and 65536 blocks). A controller without Write Zeroes (ONCS),
    /// or whose limit is below one block, gets zeroed data written instead.
    pub async fn write_zeroes(&self, lba: u64, blocks: u64) -> Result<()> {
        self.write_zeroes_at_epoch(lba, blocks, 0).await
    }

    /// [`Namespace::write_zeroes`] carrying a chain epoch (see
    /// [`IoFlags::epoch`]).
    pub async fn write_zeroes_at_epoch(&self, lba: u64, blocks: u64, epoch: u64) -> Result<()> {
        let bs = u64::from(self.info.block_size_bytes);
        self.rw_builder().check(lba, usize_from(blocks * bs))?;
        let Some(chunk) = self
            .ctrl
            .command_limits()
            .write_zeroes_blocks_max(self.info.block_size_bytes)
        else {
            return self.write_zeroed_data(lba, blocks, epoch).await;
        };
        let mut at = 0;
        while at < blocks {
            let n = piece(blocks - at, chunk);
            let mut s = Sqe::rw(io::WRITE_ZEROES, 0, self.info.nsid, lba + at, n, false);
            sluice_proto::fence::set_io_epoch(&mut s, epoch);
            self.ctrl.io(s, Payload::None).await?;
            at += u64::from(n);
        }
        Ok(())
    }

    /// Zeroes by writing zeroed buffers, as Linux's `blkdev_issue_zeroout`
    /// falls back to: pieces of at most [`ZEROED_DATA_BYTES_MAX`], one at
    /// a time (each split at MDTS by [`Namespace::write`]).
    async fn write_zeroed_data(&self, lba: u64, blocks: u64, epoch: u64) -> Result<()> {
        let bs = u64::from(self.info.block_size_bytes.max(1));
        let per = (ZEROED_DATA_BYTES_MAX as u64 / bs).max(1);
        let zeros = vec![0u8; usize_from(per.min(blocks) * bs)];
        let flags = IoFlags {
            epoch,
            ..IoFlags::default()
        };
        let mut at = 0;
        while at < blocks {
            let n = per.min(blocks - at);
            self.write(lba + at, &zeros[..usize_from(n * bs)], flags)
                .await?;
            at += n;
        }
        Ok(())
    }

    /// Deallocate (Dataset Management, AD) `blocks` blocks from `lba`, in
    /// ranges and commands within the controller's DMRSL, DMRL and DMSL. A
    /// controller without Dataset Management (ONCS) gets no command:
    /// [`HostError::Incompatible`].
    pub async fn deallocate(&self, lba: u64, blocks: u64) -> Result<()> {
        self.rw_builder().check(
            lba,
            usize_from(blocks * u64::from(self.info.block_size_bytes)),
        )?;
        let lim = self.ctrl.command_limits();
        if !lim.dataset_management {
            return Err(HostError::Incompatible(
                "the controller does not support Dataset Management (ONCS)".into(),
            ));
        }
        for group in dsm_commands(lba, blocks, &lim) {
            let mut s = Sqe::new(io::DATASET_MANAGEMENT, 0, self.info.nsid);
            DsmCommand {
                // A group has 1..=256 ranges.
                ranges: u32::try_from(group.len()).unwrap_or(dsm::RANGES_MAX),
                deallocate: true,
            }
            .write_to(&mut s);
            self.ctrl
                .io(s, Payload::Write(dsm::encode_ranges(&group)))
                .await?;
        }
        Ok(())
    }
}

/// Reservations (the NVM command set's Reservation Register, Acquire,
/// Release and Report): keys and types are the caller's, the target keeps
/// them per host (the Host Identifier of [`ConnectOptions`]). A
/// controller without reservations (ONCS) gets no command:
/// [`HostError::Incompatible`]; a refusal is [`HostError::Nvme`] with the
/// target's status (Reservation Conflict for a wrong key or a held
/// reservation).
impl Namespace {
    fn reservations_supported(&self) -> Result<()> {
        if self.ctrl.identify().oncs & oncs::RESERVATIONS == 0 {
            return Err(HostError::Incompatible(
                "the controller does not support reservations (ONCS)".into(),
            ));
        }
        Ok(())
    }

    /// Reservation Register: registers `new_key` for this host, replaces
    /// its key with `new_key` or unregisters it (`current_key` must be its
    /// key unless `ignore_existing_key`).
    pub async fn reservation_register(
        &self,
        action: RegisterAction,
        current_key: u64,
        new_key: u64,
        ignore_existing_key: bool,
    ) -> Result<()> {
        self.reservations_supported()?;
        let mut s = Sqe::new(reservation::opcode::REGISTER, 0, self.info.nsid);
        RegisterCommand {
            action,
            ignore_existing_key,
            cptpl: Cptpl::NoChange,
        }
        .write_to(&mut s);
        let data = reservation::encode_two_keys(current_key, new_key);
        self.ctrl.io(s, Payload::Write(data)).await?;
        Ok(())
    }

    /// Reservation Acquire: acquires a reservation of `rtype`, or preempts
    /// the registrants whose key is `preempt_key` (and, with
    /// [`AcquireAction::PreemptAndAbort`], waits until none of their writes
    /// is still being performed).
    pub async fn reservation_acquire(
        &self,
        action: AcquireAction,
        rtype: ReservationType,
        current_key: u64,
        preempt_key: u64,
    ) -> Result<()> {
        self.reservations_supported()?;
        let mut s = Sqe::new(reservation::opcode::ACQUIRE, 0, self.info.nsid);
        AcquireCommand {
            action,
            ignore_existing_key: false,
            rtype,
        }
        .write_to(&mut s);
        let data = reservation::encode_two_keys(current_key, preempt_key);
        self.ctrl.io(s, Payload::Write(data)).await?;
        Ok(())
    }

    /// Reservation Release: releases this host's reservation of `rtype`,
    /// or clears every registration and the reservation.
    pub async fn reservation_release(
        &self,
        action: ReleaseAction,
        rtype: ReservationType,
        current_key: u64,
    ) -> Result<()> {
        self.reservations_supported()?;
        let mut s = Sqe::new(reservation::opcode::RELEASE, 0, self.info.nsid);
        ReleaseCommand {
            action,
            ignore_existing_key: false,
            rtype: rtype.as_u8(),
        }
        .write_to(&mut s);
        let data = current_key.to_le_bytes().to_vec();
        self.ctrl.io(s, Payload::Write(data)).await?;
        Ok(())
    }

    /// Reservation Report (extended: 128-bit Host Identifiers), with every
    /// registrant: asked again at the size the first answer needs.
    pub async fn reservation_report(&self) -> Result<ReservationStatus> {
        self.reservations_supported()?;
        let mut len_bytes = REPORT_BYTES_FIRST;
        loop {
            let mut s = Sqe::new(reservation::opcode::REPORT, 0, self.info.nsid);
            ReportCommand {
                len_bytes: len_bytes as u64,
                extended: true,
            }
            .write_to(&mut s);
            // At most MDTS (a u32 of bytes) after the first 4 KiB.
            let read = u32::try_from(len_bytes).unwrap_or(u32::MAX);
            let c = self.ctrl.io(s, Payload::Read(read)).await?;
            let status = ReservationStatus::decode_extended(&c.data).ok_or_else(|| {
                HostError::Incompatible(format!(
                    "a Reservation Report of {} bytes, shorter than its header",
                    c.data.len()
                ))
            })?;
            let whole = reservation::EXTENDED_HEADER_BYTES
                + usize::from(status.registrant_count) * reservation::EXTENDED_ENTRY_BYTES;
            let mdts = self.ctrl.max_transfer_bytes() as usize;
            if whole <= len_bytes || len_bytes >= mdts {
                return Ok(status);
            }
            len_bytes = whole.min(mdts);
        }
    }
}

/// The first Reservation Report's size: the header and 63 registrants.
const REPORT_BYTES_FIRST: usize = 4096;

/// The largest zeroed buffer [`Namespace::write_zeroes`] writes at once
/// when the controller has no Write Zeroes.
pub const ZEROED_DATA_BYTES_MAX: usize = 8 << 20;

/// Splits `blocks` from `lba` into Dataset Management commands: each a list
/// of ranges of at most DMRSL blocks, at most DMRL ranges (and 256) and
/// DMSL blocks per command. Every group is non-empty. Lazy: one command's
/// ranges at a time, so a controller with tiny limits costs commands, not
/// memory.
pub fn dsm_commands(
    lba: u64,
    blocks: u64,
    lim: &CommandLimits,
) -> impl Iterator<Item = Vec<DsmRange>> {
    let range_max = lim.dsm_range_blocks_max.max(1);
    let ranges_max = usize::from(lim.dsm_ranges_max.clamp(1, 256));
    let cmd_max = lim.dsm_blocks_max.unwrap_or(u64::MAX).max(1);
    let mut at = 0u64;
    std::iter::from_fn(move || {
        if at >= blocks {
            return None;
        }
        let mut group = Vec::new();
        let mut in_group = 0u64;
        while at < blocks && group.len() < ranges_max && in_group < cmd_max {
            let n = piece((cmd_max - in_group).min(blocks - at), range_max);
            group.push(DsmRange {
                context_attributes: 0,
                nlb: n,
                slba: lba + at,
            });
            in_group += u64::from(n);
            at += u64::from(n);
        }
        Some(group)
    })
}

/// The blocks of the next command: the `left` ones, at most `chunk`.
fn piece(left: u64, chunk: u32) -> u32 {
    u32::try_from(left).map_or(chunk, |l| l.min(chunk))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_host_identifier_comes_from_the_options_or_the_nqn() {
        let with = |nqn: &str, id: [u8; 16]| ConnectOptions {
            hostnqn: nqn.into(),
            hostid: id,
            ..Default::default()
        };
        assert_eq!(
            host_identifier(&with("nqn.2024-01.io.x:a", [5; 16])),
            [5; 16]
        );
        let uuid = "nqn.2014-08.org.nvmexpress:uuid:5c1a1ce0-0000-4000-8000-0000000000ab";
        let id = host_identifier(&with(uuid, [0; 16]));
        assert_eq!(id[..4], [0x5c, 0x1a, 0x1c, 0xe0]);
        assert_eq!(id[15], 0xab);
        let (a, b) = (
            host_identifier(&with("nqn.2024-01.io.x:a", [0; 16])),
            host_identifier(&with("nqn.2024-01.io.x:b", [0; 16])),
        );
        assert_ne!(a, b, "one host per NQN");
        assert_ne!(a, [0; 16]);
        assert_eq!(
            a,
            host_identifier(&with("nqn.2024-01.io.x:a", [0; 16])),
            "stable"
        );
        // A malformed or all-zero UUID is hashed like any other NQN.
        let zero = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000";
        assert_ne!(host_identifier(&with(zero, [0; 16])), [0; 16]);
        let bad = "nqn.2014-08.org.nvmexpress:uuid:5c1a1ce0-zz00-4000-8000-0000000000ab";
        assert_ne!(
            host_identifier(&with(bad, [0; 16]))[..4],
            [0x5c, 0x1a, 0x1c, 0xe0]
        );
    }

    fn limits(ranges: u16, range_blocks: u32, cmd_blocks: Option<u64>) -> CommandLimits {
        CommandLimits {
            write_zeroes: true,
            write_zeroes_bytes_max: None,
            dataset_management: true,
            dsm_ranges_max: ranges,
            dsm_range_blocks_max: range_blocks,
            dsm_blocks_max: cmd_blocks,
        }
    }

    #[test]
    fn write_zeroes_blocks_follow_wzsl_and_nlb() {
        let mut l = limits(256, u32::MAX, None);
        assert_eq!(l.write_zeroes_blocks_max(512), Some(65536));
        l.write_zeroes_bytes_max = Some(8192);
        assert_eq!(l.write_zeroes_blocks_max(512), Some(16));
        assert_eq!(l.write_zeroes_blocks_max(4096), Some(2));
        // A limit below one block: no Write Zeroes at all.
        assert_eq!(l.write_zeroes_blocks_max(16384), None);
        l.write_zeroes = false;
        assert_eq!(l.write_zeroes_blocks_max(512), None);
        // Zeroes in CNS 06h mean no limits.
        let id = IdentifyController {
            oncs: oncs::WRITE_ZEROES | oncs::DSM,
            ..Default::default()
        };
        let zero = IdentifyControllerNvm::default();
        assert_eq!(
            CommandLimits::from_identify(&id, Some(&zero), 4096),
            limits(256, u32::MAX, None)
        );
        assert_eq!(
            CommandLimits::from_identify(&id, None, 4096),
            limits(256, u32::MAX, None)
        );
    }

    /// A controller's tiny limits over a huge range cost commands, one at
    /// a time, not a list of every range up front.
    #[test]
    fn dsm_commands_are_made_one_at_a_time() {
        let l = limits(2, 1, None);
        let mut cmds = dsm_commands(7, 1 << 40, &l);
        let first = cmds.next().expect("a command");
        assert_eq!(first.len(), 2);
        assert_eq!((first[0].slba, first[0].nlb), (7, 1));
        assert_eq!((first[1].slba, first[1].nlb), (8, 1));
        assert_eq!(cmds.next().expect("another")[0].slba, 9);
    }

    proptest! {
        /// The commands cover the range exactly, in order, each within
        /// every limit, none empty.
        #[test]
        fn dsm_commands_cover_the_range_within_the_limits(
            lba in 0u64..1 << 40,
            blocks in 1u64..5000,
            ranges in 1u16..=256,
            range_blocks in 1u32..300,
            cmd_blocks in proptest::option::of(1u64..2000),
        ) {
            let l = limits(ranges, range_blocks, cmd_blocks);
            let cmds: Vec<_> = dsm_commands(lba, blocks, &l).collect();
            let mut next = lba;
            for c in &cmds {
                prop_assert!(!c.is_empty() && c.len() <= usize::from(ranges));
                let total: u64 = c.iter().map(|r| u64::from(r.nlb)).sum();
                prop_assert!(total <= cmd_blocks.unwrap_or(u64::MAX));
                for r in c {
                    prop_assert_eq!(r.slba, next);
                    prop_assert!(r.nlb >= 1 && r.nlb <= range_blocks);
                    next += u64::from(r.nlb);
                }
            }
            prop_assert_eq!(next, lba + blocks);
        }
    }
}
