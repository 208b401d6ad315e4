//! `sluice nbd` and `sluice fuse`: export a remote namespace to unmodified
//! tools (see docs/exports.md).

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_cpu::ThrottleParams;
use sluice_export::account::{CpuAccountant, ExportSpec};
use sluice_export::fuse::{FuseAccounting, FuseConfig, SluiceFs};
use sluice_export::nbd::server::{ExportEntry, UnixSocketPath};
use sluice_export::nbd::{NbdConfig, NbdServer};
use sluice_export::{ByteDevice, RemoteDevice};
use sluice_host::{ConnectOptions, Controller, Namespace};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// How to reach the namespace.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// NVMe/TCP target address, e.g. 127.0.0.1:4420 (not with --volume).
    #[arg(long, default_value = "")]
    pub target: String,
    /// Export an elastic volume instead of a namespace: its map comes from
    /// the control plane (--control), its I/O goes straight to its drives.
    #[arg(long, conflicts_with_all = ["nqn", "nsid"])]
    pub volume: Option<String>,
    /// The control plane's HOST:PORT (several, comma-separated), with --volume.
    #[arg(long, default_value = "127.0.0.1:9500", env = "SLUICE_CONTROL")]
    pub control: String,
    /// File holding the control plane's bearer token, with --volume.
    #[arg(long, env = "SLUICE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// With --volume: pass the volume's I/O through the eIO scheduler
    /// (Flint's PIFO; docs/isolation-volumes.md).
    #[arg(long, requires = "volume")]
    pub eio: bool,
    /// Subsystem NQN (required unless `nbd --export` gives exports).
    #[arg(long)]
    pub nqn: Option<String>,
    /// Namespace ID (default: the first active namespace).
    #[arg(long)]
    pub nsid: Option<u32>,
    /// Host NQN to present.
    #[arg(long)]
    pub hostnqn: Option<String>,
    /// I/O queues (TCP connections) to the target.
    #[arg(long, default_value_t = 2)]
    pub io_queues: u16,
    #[command(flatten)]
    pub dhchap: sluice_bench::DhchapArgs,
    /// Export read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Charge the NVMe/TCP queue threads through the kernel: each moves
    /// itself into this cgroup (v1 `cpu` dir: TID to `tasks`; v2 threaded:
    /// `cgroup.threads`), so its CFS quota covers them.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// TCP congestion control of the queues' sockets (e.g. cubic; default:
    /// the system's). See docs/host.md.
    #[arg(long, value_parser = sluice_bench::parse_tcp_congestion)]
    pub tcp_congestion: Option<String>,
    /// Keep SQ flow control on the I/O queues (by default they ask the
    /// target to disable it, so reads complete with their last C2HData).
    /// A target that refuses to disable it gets it anyway (the queues
    /// connect again). See docs/host.md.
    #[arg(long)]
    pub sq_flow_control: bool,
}

#[derive(Debug, Args)]
pub struct NbdArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Serve on this Unix socket path.
    #[arg(long, conflicts_with = "listen", required_unless_present = "listen")]
    pub unix: Option<PathBuf>,
    /// Serve on this TCP address:port.
    #[arg(long)]
    pub listen: Option<String>,
    /// Export name (clients may also ask for "", the default export).
    #[arg(long, default_value = "sluice")]
    pub export_name: String,
    /// A tenant export of a shared exporter (repeatable):
    /// `NAME,nqn=SUBNQN,hostnqn=NQN[,nsid=N][,cpu-share=FRACTION][,cgroup=PATH][,read-only=1]`.
    /// Each gets its own controller (host NQN = tenant); `--target` and
    /// `--io-queues` are shared. With `--nqn` too, that export comes first.
    #[arg(long = "export")]
    pub exports: Vec<sluice_export::account::ExportSpec>,
    /// NBD connections per export served run-to-completion: each on its
    /// own thread driving its own NVMe/TCP queue (more connections take the
    /// task path; 0: every connection does). The target must grant
    /// `--io-queues` + this many I/O queues. Namespaces only (not
    /// `--volume`), and not with DH-HMAC-CHAP.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub direct_queues: u16,
    /// Offer NBD structured replies (`false`: refuse them, as nbdkit's
    /// `--no-sr` does). Off, clients get no block status and read holes as
    /// zeros, but libnbd-based clients (fio's nbd engine, nbdcopy) spend
    /// less CPU per read: docs/exports.md.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub structured_replies: bool,
    #[command(flatten)]
    pub account: AccountArgs,
}

/// Per-export CPU accounting, throttling and metrics (`nbd` and `fuse`).
#[derive(Debug, Args)]
pub struct AccountArgs {
    /// Serve the admin endpoint here: `GET /metrics` (per-export
    /// counters), `GET /v1/status`, `GET /v1/exports`.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// File with a bearer token the admin endpoint requires
    /// (`Authorization: Bearer ...`).
    #[arg(long, value_name = "PATH")]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// CPU accounting batch (ms): how often thread CPU clocks are sampled.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub cpu_batch_ms: u64,
    /// i-NVMe throttle period (ms) for exports with a cpu-share.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub cpu_period_ms: u64,
    /// i-NVMe k (sub-throttles per period).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub cpu_k: u32,
}

impl AccountArgs {
    fn batch(&self) -> Duration {
        Duration::from_millis(self.cpu_batch_ms)
    }

    fn throttle_params(&self) -> ThrottleParams {
        ThrottleParams {
            period: Duration::from_millis(self.cpu_period_ms),
            k: self.cpu_k,
            ..ThrottleParams::default()
        }
    }

    /// The admin endpoint's settings from `--metrics` and
    /// `--admin-token-file`, checked before anything connects: a bad
    /// address or token file fails here, naming its flag.
    fn metrics_config(&self) -> Result<Option<sluice_admin::AdminConfig>> {
        let Some(addr) = &self.metrics else {
            return Ok(None);
        };
        let listen = addr
            .to_socket_addrs()
            .with_context(|| format!("--metrics {addr}"))?
            .next()
            .with_context(|| format!("--metrics {addr}: no address"))?;
        let mut cfg = sluice_admin::AdminConfig::new(listen);
        if let Some(p) = &self.admin_token_file {
            cfg.token = Some(sluice_admin::BearerToken::from_file(p)?);
        }
        Ok(Some(cfg))
    }
}

/// Starts the admin endpoint (its own thread) with `cfg` from
/// [`AccountArgs::metrics_config`]: the exports' counters on `/metrics`,
/// and the isolation of the volumes exported (`gates`, from
/// [`isolation_gate`]).
fn start_metrics(
    cfg: Option<sluice_admin::AdminConfig>,
    acct: &Arc<CpuAccountant>,
    service: &str,
    gates: Vec<(String, Arc<sluice_control::isolation::ClientIsolation>)>,
) -> Result<Option<sluice_admin::AdminServer>> {
    let Some(cfg) = cfg else {
        return Ok(None);
    };
    let extra: Vec<Box<dyn sluice_admin::prometheus_client::collector::Collector>> =
        if gates.is_empty() {
            Vec::new()
        } else {
            vec![Box::new(sluice_control::isolation::IsolationCollector(
                gates,
            ))]
        };
    let app = sluice_admin::compose(
        &cfg,
        sluice_export::account::admin_parts(acct.clone(), service, extra),
    );
    let s = sluice_admin::AdminServer::start(cfg, app)
        .context("starting the admin endpoint of --metrics")?;
    info!(addr = %s.local_addr(), "admin endpoint ready (/metrics, /v1/status, /v1/exports)");
    Ok(Some(s))
}

/// The volume's eIO gate, view agent and wallet, named by the volume, when
/// `d` is one (for `--metrics`).
fn isolation_gate(
    d: &RemoteDevice,
) -> Option<(String, Arc<sluice_control::isolation::ClientIsolation>)> {
    match d {
        RemoteDevice::Volume(v) => Some((v.name().to_string(), v.pool().isolation().clone())),
        RemoteDevice::Namespace(_) => None,
    }
}

#[derive(Debug, Args)]
pub struct FuseArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Directory to mount on.
    pub mountpoint: PathBuf,
    /// Name of the file inside the mount (also the `export` label of the
    /// counters).
    #[arg(long, default_value = "disk.img")]
    pub file_name: String,
    /// Cap the export's CPU (FUSE session thread, runtime workers, NVMe/TCP
    /// queue threads) at this fraction of one CPU, (0, 1], by i-NVMe
    /// throttling: while throttled, reads and writes wait before dispatch.
    #[arg(long, value_name = "FRACTION", value_parser = sluice_export::account::parse_cpu_share, allow_negative_numbers = true)]
    pub cpu_share: Option<f64>,
    /// How requests travel between the kernel and the export. `auto`
    /// (default): `uring` when running as root on a kernel that offers
    /// FUSE-over-io_uring now, else `fuser`; the log says which and why.
    /// `fuser`: the fuser session over /dev/fuse, mounted through
    /// fusermount3 (works without root). `uring`: a session of our own over
    /// the kernel's FUSE-over-io_uring (Linux 6.14+ with
    /// /sys/module/fuse/parameters/enable_uring = Y; falls back to
    /// /dev/fuse with a warning when the kernel does not offer it); needs
    /// root, as it mounts with mount(2).
    #[arg(long, value_enum, default_value_t = FuseTransport::Auto)]
    pub transport: FuseTransport,
    #[command(flatten)]
    pub account: AccountArgs,
}

/// `sluice fuse --transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseTransport {
    Auto,
    Fuser,
    Uring,
}

/// The session `sluice fuse` runs: `--transport` resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChosenTransport {
    Fuser,
    Uring,
}

/// The transport `--transport` asks for, resolved: `auto` becomes `uring`
/// only where that session can run and gain (root, for mount(2), and a
/// kernel offering FUSE-over-io_uring now), else `fuser`. Returns the
/// transport and why, for the log.
fn resolve_transport(
    requested: FuseTransport,
    is_root: bool,
    kernel_offers_uring: bool,
) -> (ChosenTransport, &'static str) {
    match requested {
        FuseTransport::Fuser => (ChosenTransport::Fuser, "asked for"),
        FuseTransport::Uring => (ChosenTransport::Uring, "asked for"),
        FuseTransport::Auto => match (is_root, kernel_offers_uring) {
            (true, true) => (
                ChosenTransport::Uring,
                "auto: root, and the kernel offers FUSE-over-io_uring",
            ),
            (false, _) => (
                ChosenTransport::Fuser,
                "auto: not root (FUSE-over-io_uring mounts with mount(2))",
            ),
            (true, false) => (
                ChosenTransport::Fuser,
                "auto: the kernel does not offer FUSE-over-io_uring \
                 (/sys/module/fuse/parameters/enable_uring is not Y)",
            ),
        },
    }
}

/// A mounted FUSE session of either kind; dropping it unmounts.
enum FuseSession {
    Fuser(sluice_export::fuse::BackgroundSession),
    Own(sluice_export::fuse::uring::OwnSession),
}

impl FuseSession {
    fn is_finished(&self) -> bool {
        match self {
            FuseSession::Fuser(s) => s.guard.is_finished(),
            FuseSession::Own(s) => s.is_finished(),
        }
    }
}

/// The runtime's worker threads, at most. The NVMe/TCP work runs on the
/// host's queue threads; the workers only move NBD and FUSE requests.
const RUNTIME_WORKERS_MAX: usize = 2;

/// The runtime; with an accountant its worker threads register as shared
/// protocol threads. One worker per CPU the process may run on, at most
/// [`RUNTIME_WORKERS_MAX`]: on one CPU a second worker only adds futex
/// hand-offs (measured: 4 KiB reads over NBD at QD 32 went from 25.7k to
/// 71.6k IOPS, 27.7 to 9.5 µs of CPU per I/O, with one worker).
fn runtime_with(acct: Option<Arc<CpuAccountant>>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    // Affinity-aware (sched_getaffinity) and cgroup-quota-aware.
    let workers = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .clamp(1, RUNTIME_WORKERS_MAX);
    b.worker_threads(workers).enable_all();
    if let Some(a) = acct {
        b.on_thread_start(move || a.register_current_thread());
    }
    b.build().context("starting the runtime")
}

/// One export to connect: subsystem, host NQN (tenant), namespace, cgroup.
struct Remote<'a> {
    target: &'a str,
    nqn: &'a str,
    nsid: Option<u32>,
    hostnqn: Option<&'a str>,
    io_queues: u16,
    /// Extra I/O queue IDs for run-to-completion queues (NBD).
    direct_queues: u16,
    cgroup: Option<&'a PathBuf>,
    dhchap: sluice_bench::DhchapSecrets,
    tcp_congestion: Option<&'a str>,
    sq_flow_control: bool,
}

impl<'a> Remote<'a> {
    /// What every connection of this remote asks for, whether to a
    /// namespace or to a volume's drives: `io_queues` I/O queues, the
    /// host NQN, DH-HMAC-CHAP, TCP congestion control, SQ flow control.
    fn connect_options(&self, io_queues: u16) -> ConnectOptions {
        let mut opts = ConnectOptions {
            io_queues: io_queues.max(1),
            dhchap_secret: self.dhchap.0.clone(),
            dhchap_ctrl_secret: self.dhchap.1.clone(),
            tcp_congestion: self.tcp_congestion.map(str::to_owned),
            disable_sq_flow: !self.sq_flow_control,
            ..ConnectOptions::default()
        };
        if let Some(h) = self.hostnqn {
            opts.hostnqn = h.to_string();
        }
        opts
    }

    fn from_args(r: &'a RemoteArgs) -> Result<Remote<'a>> {
        let nqn = match (r.nqn.as_deref(), &r.volume) {
            (Some(nqn), _) => nqn,
            (None, Some(_)) => "",
            (None, None) => bail!("--nqn SUBNQN (with --target) or --volume NAME is required (or, for nbd, one or more --export)"),
        };
        Ok(Remote {
            target: &r.target,
            nqn,
            nsid: r.nsid,
            hostnqn: r.hostnqn.as_deref(),
            io_queues: r.io_queues,
            direct_queues: 0,
            cgroup: r.cgroup.as_ref(),
            dhchap: r.dhchap.load()?,
            tcp_congestion: r.tcp_congestion.as_deref(),
            sq_flow_control: r.sq_flow_control,
        })
    }
}

/// Connects the export's device: `--volume` through the control plane,
/// else the namespace of `r`. The controller is there for namespaces (its
/// queue threads are charged to the export); a volume's drive connections
/// are not attributed.
async fn open_device(
    a: &RemoteArgs,
    r: &Remote<'_>,
) -> Result<(Option<Controller>, RemoteDevice, String)> {
    let Some(name) = &a.volume else {
        if a.eio {
            bail!("--eio schedules a volume's I/O: give --volume (with --control)");
        }
        let (c, ns, hostnqn) = connect(r).await?;
        return Ok((Some(c), RemoteDevice::Namespace(ns), hostnqn));
    };
    let opts = r.connect_options(a.io_queues);
    let hostnqn = opts.hostnqn.clone();
    let v = sluice_control::volume::open(&a.control, a.token_file.as_deref(), name, opts)
        .await
        .with_context(|| {
            format!(
                "opening volume {name:?} through the control plane at {}",
                a.control
            )
        })?;
    v.set_eio(a.eio);
    info!(volume = %name, block_size_bytes = v.block_size_bytes(), size_blocks = v.size_blocks(), eio = a.eio, "volume opened");
    Ok((None, RemoteDevice::Volume(Arc::new(v)), hostnqn))
}

async fn connect(r: &Remote<'_>) -> Result<(Controller, Namespace, String)> {
    let addr: SocketAddr = r
        .target
        .to_socket_addrs()
        .with_context(|| format!("resolving --target `{}` (expected host:port)", r.target))?
        .next()
        .with_context(|| format!("`{}` resolves to no address", r.target))?;
    let mut opts = ConnectOptions {
        direct_queues: r.direct_queues,
        cgroup: r.cgroup.cloned(),
        ..r.connect_options(r.io_queues)
    };
    // A target that restarts must not fail the exported device's I/O: a
    // command that meets the lost connection is retried once after the
    // reconnect, as the Linux host requeues its requests (a write's data
    // is then copied before submission; rewriting the same blocks with
    // the same data is safe).
    opts.reconnect.retry_io = true;
    let hostnqn = opts.hostnqn.clone();
    let ctrl = Controller::connect(addr, r.nqn, opts)
        .await
        .with_context(|| format!("connecting to {} at {addr}", r.nqn))?;
    let nsid = match r.nsid {
        Some(n) => n,
        None => match ctrl.namespaces().first() {
            Some(ns) => ns.nsid,
            None => bail!("subsystem {} has no active namespace", r.nqn),
        },
    };
    let ns = ctrl
        .namespace(nsid)
        .with_context(|| format!("namespace {nsid} of {}", r.nqn))?;
    info!(
        hostnqn = %hostnqn,
        nsid,
        block_size_bytes = ns.block_size_bytes(),
        size_blocks = ns.size_blocks(),
        "connected"
    );
    Ok((ctrl, ns, hostnqn))
}

pub fn nbd(a: NbdArgs) -> Result<()> {
    // Every export: the single-export flags first (if --nqn), then --export.
    let mut specs: Vec<ExportSpec> = Vec::new();
    if a.remote.nqn.is_some() || a.remote.volume.is_some() {
        if a.remote.volume.is_some() && !a.exports.is_empty() {
            bail!("--volume exports one volume; it does not combine with --export");
        }
        specs.push(ExportSpec {
            name: a.export_name.clone(),
            nqn: a.remote.nqn.clone().unwrap_or_default(),
            hostnqn: a.remote.hostnqn.clone().unwrap_or_default(),
            nsid: a.remote.nsid,
            cpu_share: None,
            cgroup: a.remote.cgroup.clone(),
            read_only: a.remote.read_only,
        });
    }
    for e in &a.exports {
        specs.push(e.clone());
    }
    if specs.is_empty() {
        bail!("give --nqn SUBNQN (one export) or one or more --export NAME,nqn=...,hostnqn=...");
    }
    for (i, s) in specs.iter().enumerate() {
        if specs[..i].iter().any(|o| o.name == s.name) {
            bail!("export name `{}` given twice", s.name);
        }
    }
    let dhchap = a.remote.dhchap.load()?;
    let metrics_cfg = a.account.metrics_config()?;
    let acct = CpuAccountant::new();
    let rt = runtime_with(Some(acct.clone()))?;
    rt.block_on(async {
        let mut entries = Vec::new();
        let mut gates = Vec::new();
        let mut ctrls = Vec::new();
        for s in &specs {
            let remote = Remote {
                target: &a.remote.target,
                nqn: &s.nqn,
                nsid: s.nsid,
                hostnqn: (!s.hostnqn.is_empty()).then_some(s.hostnqn.as_str()),
                io_queues: a.remote.io_queues,
                direct_queues: a.direct_queues,
                cgroup: s.cgroup.as_ref(),
                dhchap: dhchap.clone(),
                tcp_congestion: a.remote.tcp_congestion.as_deref(),
                sq_flow_control: a.remote.sq_flow_control,
            };
            let (ctrl, ns, hostnqn) = match open_device(&a.remote, &remote)
                .await
                .with_context(|| format!("export `{}`", s.name))
            {
                Ok(x) => x,
                Err(e) => {
                    for c in &ctrls {
                        Controller::disconnect(c, Duration::from_secs(5)).await;
                    }
                    return Err(e);
                }
            };
            let tids: Option<sluice_export::account::TidSource> = match ctrl.clone() {
                Some(c2) => Some(Box::new(move || c2.queue_tids())),
                None => None,
            };
            let account = acct.add_export(&s.name, &hostnqn, s.cpu_share, tids);
            gates.extend(isolation_gate(&ns));
            entries.push(ExportEntry {
                dev: ByteDevice::new(ns),
                cfg: NbdConfig {
                    export_name: s.name.clone(),
                    description: match &a.remote.volume {
                        Some(v) => {
                            format!("sluice volume {v} via control plane {}", a.remote.control)
                        }
                        None => format!("sluice {} via {}", s.nqn, a.remote.target),
                    },
                    read_only: s.read_only,
                    hostnqn,
                },
                account: Some(account),
            });
            ctrls.extend(ctrl);
        }
        if !a.structured_replies {
            info!("structured replies are off: no block status, holes read as zeros");
        }
        let server = NbdServer::with_exports_offering(entries, a.structured_replies);
        let acct_thread = acct
            .spawn(a.account.batch(), a.account.throttle_params())
            .context("starting the CPU accounting thread")?;
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let _admin = start_metrics(metrics_cfg, &acct, "sluice-nbd", gates)?;
        let metrics = std::future::pending::<Result<()>>();
        let serve = async {
            if let Some(path) = &a.unix {
                let (l, _guard) = UnixSocketPath::bind(path)
                    .with_context(|| format!("binding Unix socket {}", path.display()))?;
                info!(socket = %path.display(), exports = ?names, "NBD server ready");
                server
                    .serve_unix(l)
                    .await
                    .context("accepting on the Unix socket")
            } else if let Some(addr) = &a.listen {
                let l = tokio::net::TcpListener::bind(addr.as_str())
                    .await
                    .with_context(|| format!("binding TCP {addr}"))?;
                info!(addr = %l.local_addr()?, exports = ?names, "NBD server ready");
                server.serve_tcp(l).await.context("accepting on TCP")
            } else {
                bail!("give --unix PATH or --listen ADDR:PORT")
            }
        };
        let r = tokio::select! {
            r = serve => r,
            r = metrics => r,
            s = sluice_export::shutdown_signal() => {
                s.context("installing signal handlers")?;
                info!("signal received, shutting down");
                Ok(())
            }
        };
        acct.stop();
        let _ = acct_thread.join();
        for c in &ctrls {
            c.disconnect(Duration::from_secs(5)).await;
        }
        print_counters(&acct);
        for e in acct.exports() {
            let c = e.counters();
            eprintln!(
                "{}: connections {} run-to-completion, {} on tasks; requests of the former: {} on their queue, {} handed to tasks",
                c.name, c.direct_connections, c.task_connections, c.direct_requests, c.handed_off_requests
            );
        }
        r
    })
}

/// Per-export counters, printed on exit.
fn print_counters(acct: &CpuAccountant) {
    eprintln!(
        "{:<16} {:>10} {:>12} {:>10} {:>10} {:>9} {:>10} {:>10}",
        "export", "ios", "MiB", "cpu_s", "queue_s", "share", "throttles", "thr_s"
    );
    for e in acct.exports() {
        let c = e.counters();
        eprintln!(
            "{:<16} {:>10} {:>12.1} {:>10.3} {:>10.3} {:>9} {:>10} {:>10.3}",
            c.name,
            c.ios,
            c.bytes as f64 / (1u64 << 20) as f64,
            c.cpu.as_secs_f64(),
            c.own_cpu.as_secs_f64(),
            c.cpu_share.map_or("-".to_string(), |s| format!("{s}")),
            c.throttle_events,
            c.throttled.as_secs_f64()
        );
    }
    eprintln!(
        "unattributed shared CPU: {:.3} s",
        acct.unattributed().as_secs_f64()
    );
}

pub fn fuse(a: FuseArgs) -> Result<()> {
    let (transport, why) = resolve_transport(
        a.transport,
        sluice_export::fuse::uring::running_as_root(),
        sluice_export::fuse::uring::kernel_offers_uring(),
    );
    info!(?transport, why, "FUSE transport chosen");
    let mut remote = Remote::from_args(&a.remote)?;
    // The io_uring session's ring thread drives one NVMe/TCP queue itself.
    if transport == ChosenTransport::Uring {
        remote.direct_queues = 1;
    }
    let acct = CpuAccountant::new();
    let rt = runtime_with(Some(acct.clone()))?;
    let metrics_cfg = a.account.metrics_config()?;
    let (ctrl, ns, hostnqn) = rt.block_on(open_device(&a.remote, &remote))?;
    let _admin = match start_metrics(
        metrics_cfg,
        &acct,
        "sluice-fuse",
        isolation_gate(&ns).into_iter().collect(),
    ) {
        Ok(admin) => admin,
        Err(e) => {
            if let Some(c) = &ctrl {
                rt.block_on(c.disconnect(Duration::from_secs(5)));
            }
            return Err(e);
        }
    };
    let tids: Option<sluice_export::account::TidSource> = match ctrl.clone() {
        Some(c2) => Some(Box::new(move || c2.queue_tids())),
        None => None,
    };
    let export = acct.add_export(&a.file_name, &hostnqn, a.cpu_share, tids);
    let cfg = FuseConfig {
        file_name: a.file_name.clone(),
        read_only: a.remote.read_only,
        hostnqn,
    };
    let accounting = FuseAccounting {
        accountant: acct.clone(),
        export,
    };
    let dev = ByteDevice::new(ns);
    let mount_fuser = |dev, cfg: FuseConfig, accounting| {
        let fs = SluiceFs::new(dev, rt.handle().clone(), cfg).with_accounting(accounting);
        sluice_export::fuse::mount(fs, &a.mountpoint)
            .map(FuseSession::Fuser)
            .with_context(|| {
                format!(
                    "mounting FUSE on {} (needs /dev/fuse and fusermount3)",
                    a.mountpoint.display()
                )
            })
    };
    let mounted = match transport {
        ChosenTransport::Fuser => mount_fuser(dev, cfg, accounting),
        ChosenTransport::Uring => match sluice_export::fuse::uring::mount(
            dev.clone(),
            rt.handle().clone(),
            &cfg,
            Some(accounting.clone()),
            &a.mountpoint,
            true,
        ) {
            Ok(s) => Ok(FuseSession::Own(s)),
            // Chosen by `auto`: a mount(2) the system refuses (a container
            // without CAP_SYS_ADMIN, say) still leaves fuser's way.
            Err(e) if a.transport == FuseTransport::Auto => {
                warn!(
                    error = %e,
                    "mounting FUSE over io_uring failed; mounting over /dev/fuse with fusermount3 instead"
                );
                mount_fuser(dev, cfg, accounting)
            }
            Err(e) => Err(e).with_context(|| {
                format!(
                    "mounting FUSE over io_uring on {} (needs /dev/fuse and root)",
                    a.mountpoint.display()
                )
            }),
        },
    };
    let session = match mounted {
        Ok(s) => s,
        Err(e) => {
            if let Some(c) = &ctrl {
                rt.block_on(c.disconnect(Duration::from_secs(5)));
            }
            return Err(e);
        }
    };
    info!(
        mountpoint = %a.mountpoint.display(),
        file = %a.file_name,
        cpu_share = ?a.cpu_share,
        "FUSE export mounted"
    );
    let r = match acct
        .spawn(a.account.batch(), a.account.throttle_params())
        .context("starting the CPU accounting thread")
    {
        Ok(acct_thread) => {
            let r = rt.block_on(async {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                let signal = sluice_export::shutdown_signal();
                let metrics = std::future::pending::<Result<()>>();
                tokio::pin!(signal, metrics);
                loop {
                    tokio::select! {
                        s = &mut signal => {
                            s.context("installing signal handlers")?;
                            info!("signal received, unmounting");
                            break;
                        }
                        m = &mut metrics => return m,
                        _ = tick.tick() => {
                            if session.is_finished() {
                                info!("filesystem unmounted externally");
                                break;
                            }
                        }
                    }
                }
                anyhow::Ok(())
            });
            // Lift any throttle, so the session thread is not held, then unmount.
            acct.stop();
            let _ = acct_thread.join();
            r
        }
        Err(e) => Err(e),
    };
    drop(session);
    if let Some(c) = &ctrl {
        rt.block_on(c.disconnect(Duration::from_secs(5)));
    }
    print_counters(&acct);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_io_uring_only_as_root_on_a_kernel_that_offers_it() {
        use ChosenTransport as C;
        use FuseTransport::Auto;
        assert_eq!(resolve_transport(Auto, true, true).0, C::Uring);
        assert_eq!(resolve_transport(Auto, false, true).0, C::Fuser);
        assert_eq!(resolve_transport(Auto, true, false).0, C::Fuser);
        assert_eq!(resolve_transport(Auto, false, false).0, C::Fuser);
        assert!(resolve_transport(Auto, false, true).1.contains("not root"));
        assert!(resolve_transport(Auto, true, false)
            .1
            .contains("enable_uring"));
    }

    #[test]
    fn an_asked_for_transport_is_kept_whatever_the_machine() {
        use ChosenTransport as C;
        use FuseTransport::{Fuser, Uring};
        for (root, offers) in [(true, true), (true, false), (false, true), (false, false)] {
            assert_eq!(
                resolve_transport(Fuser, root, offers),
                (C::Fuser, "asked for")
            );
            assert_eq!(
                resolve_transport(Uring, root, offers),
                (C::Uring, "asked for")
            );
        }
    }

    #[test]
    fn the_default_transport_is_auto() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            fuse: FuseArgs,
        }
        let cli = Cli::try_parse_from(["x", "--target", "127.0.0.1:1", "--nqn", "n", "/mnt"]);
        assert_eq!(
            cli.map(|c| c.fuse.transport).ok(),
            Some(FuseTransport::Auto)
        );
    }
}
