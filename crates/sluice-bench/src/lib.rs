//! The engine of `sluice bench`: an NVMe/TCP load generator in the spirit of
//! fio and spdk_nvme_perf, on top of `sluice-host`.
//!
//! [`run`] takes [`BenchArgs`] (a clap `Args` struct for the CLI to flatten)
//! and returns a [`BenchReport`] with per-job and total IOPS, bandwidth,
//! latency percentiles (hdrhistogram, µs, measured per I/O from submit to
//! completion), the CPU the bench process used, and optionally the raw TCP
//! wire floor measured in the same run ([`FloorReport`]).

mod device;
mod direct;
mod floor;
mod spec;

use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use device::Device;
use hdrhistogram::Histogram;
use serde::Serialize;
use sluice_host::{
    ConnectOptions, Controller, DirectQueue, HostQueueStats, IoFlags, PollingPolicy, RwBuilder,
};
use sluice_proto::coalesce::{CoalesceConfig, CoalesceMode};
use sluice_proto::send::{SchedulerKind, SendConfig};
use sluice_runtime::cast::{nanos, usize_from};
use sluice_runtime::sync::lock;

pub use floor::FloorReport;

/// The wire floor's batched loop, for experiments that put other servers
/// behind the same client (`sluice-lab sockets`).
pub mod wire {
    pub use crate::floor::{
        batched_client, Answerer, BatchedRun, Polling, REPLY_HEADER_BYTES, REQUEST_BYTES,
    };
}
pub use spec::{BlockSizes, JobSpec, RwMode};

/// Most jobs in one run.
pub const JOBS_MAX: usize = 64;
/// Most outstanding I/Os per job.
pub const QD_MAX: u32 = 4096;
/// `--submit-chunk`'s default: see docs/host.md for the measurements.
pub const SUBMIT_CHUNK_DEFAULT: u32 = 0;
/// Longest run.
pub const RUNTIME_S_MAX: u64 = 24 * 3600;
/// Largest `--wake-batch-min`.
pub const WAKE_BATCH_MIN_BYTES_MAX: u64 = 1 << 30;

/// How a job drives its I/O (`--engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Engine {
    /// Run to completion: one OS thread per job (per I/O queue) keeps `qd`
    /// I/Os outstanding on a `sluice_host::DirectQueue`, no queue thread
    /// and no channels (as spdk_nvme_perf).
    #[default]
    Direct,
    /// `qd` tokio tasks, each awaiting one `Namespace` I/O at a time through
    /// the threaded queues.
    Async,
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Direct => "direct",
            Engine::Async => "async",
        })
    }
}

/// clap's parser of `--tcp-congestion` (here and in the exports): a name
/// the kernel could have; whether it has it shows at connect.
pub fn parse_tcp_congestion(s: &str) -> Result<String, String> {
    sluice_runtime::net::check_tcp_congestion_name(s)?;
    Ok(s.to_owned())
}

/// Arguments of `sluice bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Target address, ADDR:PORT (not with --volume).
    #[arg(long, default_value = "")]
    pub target: String,
    /// Subsystem NQN (not with --volume).
    #[arg(long, default_value = "")]
    pub nqn: String,
    /// An elastic volume to drive instead of a namespace: its map comes
    /// from the control plane (--control), its I/O goes straight to the
    /// drives.
    #[arg(long, conflicts_with_all = ["target", "nqn", "nsid"])]
    pub volume: Option<String>,
    /// The control plane's HOST:PORT, with --volume.
    #[arg(long, default_value = "127.0.0.1:9500", env = "SLUICE_CONTROL")]
    pub control: String,
    /// File holding the control plane's bearer token, with --volume.
    #[arg(long, env = "SLUICE_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// With --volume: pass the volume's I/O through the eIO scheduler
    /// (Flint's PIFO; docs/isolation-volumes.md).
    #[arg(long, requires = "volume")]
    pub eio: bool,
    /// Namespace ID (default: the first active one).
    #[arg(long)]
    pub(crate) nsid: Option<u32>,
    /// Host NQN of the default job.
    #[arg(
        long,
        default_value = "nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-000000000001"
    )]
    pub hostnqn: String,
    /// Charge the queue threads through the kernel: every queue thread of
    /// every job's controller joins this cgroup (v1 `cpu` dir: TID to
    /// `tasks`; v2 threaded: `cgroup.threads`). Per job: `cgroup=PATH`.
    #[arg(long)]
    pub(crate) cgroup: Option<std::path::PathBuf>,
    /// I/O pattern: read, write, randread, randwrite, rw, randrw.
    #[arg(long, default_value = "randread")]
    pub rw: RwMode,
    /// Percentage of reads in rw/randrw.
    #[arg(long, default_value_t = 50)]
    pub rwmixread: u8,
    /// Block size: 4k, a range 4k-128k, or weights 4k:70,128k:30.
    #[arg(long, default_value = "4k")]
    pub bs: BlockSizes,
    /// Outstanding I/Os per job.
    #[arg(long, default_value_t = 32)]
    pub qd: u32,
    /// I/O queues (TCP connections) per job.
    #[arg(long, default_value_t = 1)]
    pub queues: u16,
    /// Run for this many seconds (default 10 unless --ios is given).
    #[arg(long, conflicts_with = "ios")]
    pub runtime: Option<f64>,
    /// Stop after this many I/Os per job.
    #[arg(long)]
    pub ios: Option<u64>,
    /// Limit each job to this many I/Os per second.
    #[arg(long)]
    pub rate_iops: Option<u64>,
    /// Write a pattern derived from (LBA, generation) and check reads.
    #[arg(long)]
    pub verify: bool,
    /// Extra jobs: NAME,hostnqn=...,rw=...,bs=...,qd=...,rwmixread=...,rate-iops=...
    /// (repeatable; each job connects with its own host NQN).
    #[arg(long = "job")]
    pub jobs: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub dhchap: DhchapArgs,
    #[arg(long)]
    pub(crate) hdr_digest: bool,
    #[arg(long)]
    pub(crate) data_digest: bool,
    /// TCP congestion control of the queues' sockets (e.g. cubic; default:
    /// the system's). See docs/host.md.
    #[arg(long, value_parser = parse_tcp_congestion)]
    pub tcp_congestion: Option<String>,
    /// Keep SQ flow control on the I/O queues (by default they ask the
    /// controller to disable it, so reads complete with their last
    /// C2HData, without a CapsuleResp). See docs/host.md.
    #[arg(long)]
    pub sq_flow_control: bool,
    /// Receive path: interrupt, busy, adaptive[:SPIN_US]. With the direct
    /// engine it is the job thread's loop: busy never waits, adaptive
    /// spins SPIN_US after the last progress (20 x SPIN_US while I/Os are
    /// outstanding) then waits in epoll, interrupt waits in epoll.
    #[arg(long, default_value = "interrupt")]
    pub polling: PollingPolicy,
    /// With adaptive polling on the direct engine: spin only while at most
    /// N commands are outstanding on the queue; with more, wait in epoll as
    /// interrupt does. A wake-up then serves a batch of completions, where
    /// at shallow depths it would cost one per I/O. Off by default (adaptive
    /// spins at any depth). See docs/host.md.
    #[arg(long)]
    pub spin_depth_max: Option<u32>,
    /// Direct engine: while at least SIZE of data is due from the target
    /// (e.g. 256KiB: two 128 KiB reads in flight), adaptive polling does
    /// not spin, and each sleep lasts until half of what is due has arrived
    /// (a socket low-water mark) instead of ending at the first byte: one
    /// wake-up per batch of large reads. Trades latency for host CPU. Off
    /// by default. See docs/host.md.
    #[arg(long, value_name = "SIZE")]
    pub wake_batch_min: Option<String>,
    /// Direct engine: write each turn's new commands every N submissions
    /// instead of all at the end of the turn (0: at the end). At QD 32 a
    /// turn resubmits a whole batch of completions; sent as one write, a
    /// target with time to spare idles while the host builds it. See
    /// docs/host.md.
    #[arg(long, default_value_t = SUBMIT_CHUNK_DEFAULT, value_name = "N")]
    pub submit_chunk: u32,
    /// I/O engine: direct (run to completion on the job's own thread) or
    /// async (tokio tasks over the threaded queues). Direct falls back to
    /// async, with a notice, for DH-HMAC-CHAP, --volume, --coalescing,
    /// and block sizes above one command.
    #[arg(long, value_enum, default_value_t = Engine::Direct)]
    pub engine: Engine,
    /// Also measure the raw TCP wire floor on loopback, shaped after the
    /// job with the largest QD (its block size and direction).
    #[arg(long)]
    pub floor: bool,
    /// Pin the floor's echo server to this CPU (the target's core), so the
    /// floor has the two-core layout of target and bench.
    #[arg(long, requires = "floor")]
    pub floor_server_cpu: Option<usize>,
    /// Per-command timeout in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub(crate) timeout_ms: u64,
    /// Use only the first SPAN bytes (or blocks with suffix) of the namespace, e.g. 1g.
    #[arg(long)]
    pub span: Option<String>,
    /// Show live IOPS on stderr even when it is not a terminal.
    #[arg(long)]
    pub(crate) progress: bool,
    /// Host completion coalescing of task wake-ups: off, static, adaptive,
    /// calibrated, calibrated-fixed (docs/isolation.md).
    #[arg(long, default_value = "off")]
    pub coalescing: CoalesceMode,
    /// Coalescing threshold (completions per wake-up batch).
    #[arg(long, default_value_t = 16)]
    pub(crate) coalescing_threshold: u32,
    /// Static coalescing: aggregation time in microseconds (and the fixed Δ
    /// of calibrated-fixed).
    #[arg(long, default_value_t = 20)]
    pub(crate) coalescing_timeout_us: u64,
    /// Mark every I/O urgent (the host API's urgent flag; `--job ...,urgent=1`
    /// per job).
    #[arg(long)]
    pub(crate) urgent: bool,
    /// Submit QD I/Os at a time as one batch whose last I/O carries the
    /// Barrier hint (CDW13 bit 8) and wait for the whole batch before the
    /// next (`--job ...,batch=1` per job; direct engine only).
    #[arg(long)]
    pub batch: bool,
    /// Host send scheduler of the I/O queues: immediate, unified, isolated
    /// (paper defaults; docs/isolation.md).
    #[arg(long, default_value = "immediate")]
    pub send_scheduler: SchedulerKind,
    /// With `unified` or `isolated`: containers also flush when the queue
    /// has nothing more to send this turn (`send.flush_when_idle`); false
    /// holds them for their triggers, as the papers do.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub send_flush_when_idle: bool,
}

/// `--dhchap-secret` and `--dhchap-ctrl-secret`, shared by `sluice bench`,
/// `nbd` and `fuse`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DhchapArgs {
    /// DH-HMAC-CHAP secret (`DHHC-1:...`, as `sluice gen-dhchap-key` or
    /// `nvme gen-dhchap-key` prints it), or `@FILE` holding it: every queue
    /// authenticates when the target asks.
    #[arg(long, env = "SLUICE_DHCHAP_SECRET", hide_env_values = true)]
    pub dhchap_secret: Option<String>,
    /// The target must prove this secret too (bidirectional); `@FILE` reads it.
    #[arg(
        long,
        env = "SLUICE_DHCHAP_CTRL_SECRET",
        hide_env_values = true,
        requires = "dhchap_secret"
    )]
    pub dhchap_ctrl_secret: Option<String>,
}

/// The host's secret and the controller's, as parsed from the flags.
pub type DhchapSecrets = (Option<sluice_auth::Secret>, Option<sluice_auth::Secret>);

impl DhchapArgs {
    /// Parses both secrets (reading `@FILE`s); errors name the flag.
    pub fn load(&self) -> anyhow::Result<DhchapSecrets> {
        Ok((
            load_secret("--dhchap-secret", self.dhchap_secret.as_deref())?,
            load_secret("--dhchap-ctrl-secret", self.dhchap_ctrl_secret.as_deref())?,
        ))
    }
}

/// A DH-HMAC-CHAP secret from a flag: the `DHHC-1:...` text, or `@FILE`
/// holding it. Errors name the flag (and the file), never the secret.
fn load_secret(flag: &str, value: Option<&str>) -> anyhow::Result<Option<sluice_auth::Secret>> {
    let Some(v) = value else { return Ok(None) };
    let text = match v.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("{flag}: reading the secret from {path}"))?,
        None => v.to_owned(),
    };
    let s = sluice_auth::Secret::parse(&text).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
    Ok(Some(s))
}

impl BenchArgs {
    /// The namespace to run on (else the first active one).
    pub fn with_nsid(mut self, nsid: u32) -> Self {
        self.nsid = Some(nsid);
        self
    }

    /// Defaults for library callers and tests.
    pub fn new(target: impl Into<String>, nqn: impl Into<String>) -> Self {
        BenchArgs {
            target: target.into(),
            nqn: nqn.into(),
            volume: None,
            control: "127.0.0.1:9500".into(),
            token_file: None,
            eio: false,
            nsid: None,
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-000000000001".into(),
            cgroup: None,
            rw: RwMode::RandRead,
            rwmixread: 50,
            bs: BlockSizes::fixed(4096),
            qd: 32,
            queues: 1,
            runtime: None,
            ios: None,
            rate_iops: None,
            verify: false,
            jobs: Vec::new(),
            json: false,
            dhchap: DhchapArgs::default(),
            hdr_digest: false,
            data_digest: false,
            tcp_congestion: None,
            sq_flow_control: false,
            polling: PollingPolicy::Interrupt,
            spin_depth_max: None,
            wake_batch_min: None,
            submit_chunk: SUBMIT_CHUNK_DEFAULT,
            engine: Engine::Direct,
            floor: false,
            floor_server_cpu: None,
            timeout_ms: 30_000,
            span: None,
            progress: false,
            coalescing: CoalesceMode::Off,
            coalescing_threshold: 16,
            coalescing_timeout_us: 20,
            urgent: false,
            batch: false,
            send_scheduler: SchedulerKind::Immediate,
            send_flush_when_idle: true,
        }
    }
}

/// Results of one job (or the total).
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    pub name: String,
    pub(crate) hostnqn: String,
    pub(crate) rw: String,
    pub(crate) qd: u32,
    /// The engine that ran the job (`direct` or `async`; `mixed` in a
    /// total over both).
    pub engine: String,
    pub ios: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub errors: u64,
    pub verify_errors: u64,
    pub elapsed_s: f64,
    pub iops: f64,
    pub bandwidth_mib_s: f64,
    pub latency_us_mean: f64,
    pub latency_us_min: f64,
    pub latency_us_p50: f64,
    pub latency_us_p90: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    pub latency_us_p9999: f64,
    pub latency_us_max: f64,
    /// Host queue counters (wake-ups, send flushes and waits) over the
    /// measured window.
    pub host: HostCounters,
    /// First few error messages.
    pub error_samples: Vec<String>,
}

/// Host-side send and wake-up counters of a job over the measured window.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct HostCounters {
    pub(crate) completions: u64,
    /// Wake-up batches delivered to waiting tasks.
    pub(crate) notifications: u64,
    /// Socket write calls that moved bytes.
    pub(crate) send_syscalls: u64,
    /// Socket read calls that returned bytes.
    pub(crate) read_syscalls: u64,
    pub notifications_per_io: f64,
    pub send_syscalls_per_io: f64,
    pub read_syscalls_per_io: f64,
    /// Mean time a completion was held by the coalescer, µs (held ones only
    /// count; 0 when coalescing is off).
    pub held_us_per_notification: f64,
    /// Send scheduler: PDUs per flushed container, flushes by timer.
    pub(crate) pdus_per_flush: f64,
    pub(crate) timer_flushes: u64,
    /// Mean time a PDU waited in the latency / data freight, µs.
    pub(crate) freight_wait_us_latency: f64,
    pub(crate) freight_wait_us_data: f64,
    /// Times the I/O loop slept in epoll, and times an adaptive loop's
    /// long spin backed off because its thread waited to run.
    pub(crate) sleeps: u64,
    /// Of the sleeps, those that waited for a batch (`--wake-batch-min`).
    pub(crate) batched_sleeps: u64,
    pub(crate) spin_backoffs: u64,
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

impl HostCounters {
    fn from_stats(s: &HostQueueStats) -> HostCounters {
        let per = |n: u64| {
            if s.completions == 0 {
                0.0
            } else {
                n as f64 / s.completions as f64
            }
        };
        HostCounters {
            completions: s.completions,
            notifications: s.notifications,
            send_syscalls: s.sends,
            read_syscalls: s.reads,
            notifications_per_io: per(s.notifications),
            send_syscalls_per_io: per(s.sends),
            read_syscalls_per_io: per(s.reads),
            held_us_per_notification: if s.notifications == 0 {
                0.0
            } else {
                s.held_ns as f64 / 1000.0 / s.notifications as f64
            },
            pdus_per_flush: ratio(s.flush_pdus, s.flushes),
            timer_flushes: s.timer_flushes,
            freight_wait_us_latency: ratio(s.wait_ns_latency, s.waited_latency) / 1000.0,
            freight_wait_us_data: ratio(s.wait_ns_data, s.waited_data) / 1000.0,
            sleeps: s.sleeps,
            batched_sleeps: s.batched_sleeps,
            spin_backoffs: s.spin_backoffs,
        }
    }
}

/// Results of a bench run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub jobs: Vec<JobReport>,
    pub total: JobReport,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// When the CPU above was counted: UNIX times (s) of the first and last
    /// reading, the run's I/O between them. A harness that measures the
    /// target's CPU alongside counts it over the same window
    /// (`scripts/bench-vs-spdk.py`), not over the process's connect and
    /// disconnect.
    pub cpu_window_unix_s: [f64; 2],
    pub(crate) iops_per_cpu_s: f64,
    /// The host loops' polling policy (`--polling`, spelled as the
    /// configuration spells it), so that a report says how it was run.
    pub polling: String,
    /// `--spin-depth-max`, when given.
    pub spin_depth_max: Option<u32>,
    /// `--wake-batch-min` in bytes, when given.
    pub wake_batch_min_bytes: Option<u64>,
    /// `--submit-chunk` (0: a turn's commands go out in one write).
    pub submit_chunk: u32,
    pub floor: Option<FloorReport>,
}

impl BenchReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The human table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<12} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "job",
            "IOPS",
            "MiB/s",
            "mean_us",
            "p50_us",
            "p90_us",
            "p99_us",
            "p99.9_us",
            "p99.99_us",
            "max_us",
            "errors"
        );
        let mut rows: Vec<&JobReport> = self.jobs.iter().collect();
        if self.jobs.len() > 1 {
            rows.push(&self.total);
        }
        for j in rows {
            let _ = writeln!(
                s,
                "{:<12} {:>10.0} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7}",
                j.name,
                j.iops,
                j.bandwidth_mib_s,
                j.latency_us_mean,
                j.latency_us_p50,
                j.latency_us_p90,
                j.latency_us_p99,
                j.latency_us_p999,
                j.latency_us_p9999,
                j.latency_us_max,
                j.errors + j.verify_errors
            );
        }
        for j in &self.jobs {
            let _ = writeln!(
                s,
                "host [{}] ({}): {:.3} notifications/I/O, {:.3} send syscalls/I/O, {:.3} read syscalls/I/O ({} completions, {} notifications, {} sends, {} reads); {:.2} PDUs/flush, {} timer flushes, freight wait {:.1}/{:.1} us (latency/data); {} sleeps ({} batched), {} spin back-offs",
                j.name,
                j.engine,
                j.host.notifications_per_io,
                j.host.send_syscalls_per_io,
                j.host.read_syscalls_per_io,
                j.host.completions,
                j.host.notifications,
                j.host.send_syscalls,
                j.host.read_syscalls,
                j.host.pdus_per_flush,
                j.host.timer_flushes,
                j.host.freight_wait_us_latency,
                j.host.freight_wait_us_data,
                j.host.sleeps,
                j.host.batched_sleeps,
                j.host.spin_backoffs
            );
        }
        let _ = writeln!(
            s,
            "cpu: user {:.2} s, sys {:.2} s, {:.0} IOPS per CPU-second (polling {}{}{}{})",
            self.cpu_user_s,
            self.cpu_sys_s,
            self.iops_per_cpu_s,
            self.polling,
            self.spin_depth_max
                .map_or(String::new(), |n| format!(", spin depth max {n}")),
            self.wake_batch_min_bytes
                .map_or(String::new(), |n| format!(", wake batch min {n} bytes")),
            if self.submit_chunk > 0 {
                format!(", submit chunk {}", self.submit_chunk)
            } else {
                String::new()
            }
        );
        for j in &self.jobs {
            for e in &j.error_samples {
                let _ = writeln!(s, "error [{}]: {e}", j.name);
            }
        }
        if let Some(f) = &self.floor {
            s.push_str(&floor_lines(f, &self.total));
        }
        s
    }

    pub fn print_table(&self) {
        print!("{}", self.table());
    }
}

/// The floor's lines of the table: the floor for the workload, the ratio
/// of `total` to it, and the old blocking echo loop for history.
pub fn floor_lines(f: &FloorReport, total: &JobReport) -> String {
    use floor::FloorBasis;
    use std::fmt::Write;
    let mut s = String::new();
    let dir = if f.write { "write" } else { "read" };
    let pin = f
        .server_cpu
        .map_or(String::new(), |c| format!(", server on cpu {c}"));
    let _ = writeln!(
        s,
        "wire floor ({dir} {} B, {} B request / {} B reply{pin}): batched QD{} {:.0} IOPS ({:.0} MiB/s, {} polling, {:.1} req/write, {:.1} replies/read) p50 {:.1} us; bulk {:.0} MiB/s = {:.0} IOPS ceiling; busy ping-pong p50 {:.1} us p99 {:.1} us",
        f.block_size_bytes,
        f.request_bytes,
        f.reply_bytes,
        f.batched_qd,
        f.batched_iops,
        f.batched_mib_per_s,
        if f.batched_polling == floor::Polling::Busy { "busy" } else { "blocking" },
        f.batched_client_requests_per_write,
        f.batched_client_replies_per_read,
        f.batched_latency_us_p50,
        f.bulk_mib_per_s,
        f.bulk_iops_ceiling,
        f.busy_pingpong_latency_us_p50,
        f.busy_pingpong_latency_us_p99,
    );
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let _ =
        match f.floor_basis {
            FloorBasis::BusyRtt | FloorBasis::BlockingRtt => writeln!(
            s,
            "ratio to floor: p50 latency {:.2}x the {} round trip ({:.1} us); {:.2} of its rate",
            ratio(total.latency_us_p50, f.floor_latency_us_p50),
            if f.floor_basis == FloorBasis::BusyRtt { "busy-polled" } else { "blocking" },
            f.floor_latency_us_p50,
            ratio(total.iops, f.floor_iops),
        ),
            basis if f.block_size_bytes >= floor::LARGE_BLOCK_BYTES => writeln!(
                s,
                "ratio to floor: {:.2} of {} ({:.0} of {:.0} MiB/s)",
                ratio(total.bandwidth_mib_s, f.floor_mib_per_s),
                if basis == FloorBasis::Bulk {
                    "bulk TCP"
                } else {
                    "batched pipelined TCP"
                },
                total.bandwidth_mib_s,
                f.floor_mib_per_s,
            ),
            basis => writeln!(
                s,
                "ratio to floor: {:.2} of {} ({:.0} of {:.0} IOPS)",
                ratio(total.iops, f.floor_iops),
                match basis {
                    FloorBasis::Bulk => "the bulk ceiling",
                    FloorBasis::EchoPipelined => "the echo loop",
                    _ => "batched pipelined TCP",
                },
                total.iops,
                f.floor_iops,
            ),
        };
    let _ = writeln!(
        s,
        "old floor (history; blocking echo loop, 72 B / 4112 B, one message per syscall): QD1 p50 {:.1} us p99 {:.1} us; QD{} {:.0} IOPS p50 {:.1} us; {:.2} of its IOPS",
        f.pingpong_latency_us_p50,
        f.pingpong_latency_us_p99,
        f.pipelined_qd,
        f.pipelined_iops,
        f.pipelined_latency_us_p50,
        ratio(total.iops, f.pipelined_iops),
    );
    s
}

/// Runs the bench to completion on a private tokio runtime. Call it from
/// synchronous code (not from inside a tokio runtime); async callers use
/// [`run_async`].
pub fn run(args: BenchArgs) -> anyhow::Result<BenchReport> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("sluice-bench")
        .build()
        .context("tokio runtime")?;
    rt.block_on(run_async(args))
}

fn cpu_times_s() -> (f64, f64) {
    let (user, system) = sluice_runtime::clock::process_cpu_split();
    (user.as_secs_f64(), system.as_secs_f64())
}

/// Wall-clock seconds since the UNIX epoch, for reports that other
/// processes' measurements are lined up with (0 if the clock is before it).
fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn resolve(target: &str) -> anyhow::Result<SocketAddr> {
    target
        .to_socket_addrs()
        .with_context(|| format!("resolve target `{target}`"))?
        .next()
        .with_context(|| format!("target `{target}` resolves to nothing"))
}

/// The floor's workload: the job with the largest QD (the first of equals),
/// its largest block size, writes when it only writes.
fn floor_spec(jobs: &[JobSpec], server_cpu: Option<usize>) -> floor::FloorSpec {
    let j = jobs.iter().reduce(|a, b| if b.qd > a.qd { b } else { a });
    floor::FloorSpec {
        qd: j.map_or(1, |j| j.qd.max(1)),
        block_size: j.map_or(4096, |j| j.bs.max_bytes().max(1)),
        write: j.is_some_and(|j| matches!(j.rw, RwMode::Write | RwMode::RandWrite)),
        server_cpu,
    }
}

/// Runs the bench (see [`run`]).
pub async fn run_async(args: BenchArgs) -> anyhow::Result<BenchReport> {
    if args.volume.is_none() && (args.target.is_empty() || args.nqn.is_empty()) {
        bail!("give --target and --nqn, or --volume (with --control)");
    }
    if args.eio && args.volume.is_none() {
        bail!("--eio schedules a volume's I/O: give --volume (with --control)");
    }
    let jobs = spec::jobs_from_args(&args)?;
    if jobs.is_empty() || jobs.len() > JOBS_MAX {
        bail!("between 1 and {JOBS_MAX} jobs, got {}", jobs.len());
    }
    let runtime = match (args.runtime, args.ios) {
        (Some(r), _) if !(0.0..=RUNTIME_S_MAX as f64).contains(&r) || r.is_nan() => {
            bail!("--runtime must be between 0 and {RUNTIME_S_MAX} seconds")
        }
        (Some(r), _) => Some(Duration::from_secs_f64(r)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    };
    let floor = if args.floor {
        let spec = floor_spec(&jobs, args.floor_server_cpu);
        let each = runtime
            .unwrap_or(Duration::from_secs(2))
            .min(Duration::from_secs(2));
        Some(
            tokio::task::spawn_blocking(move || floor::measure(spec, each))
                .await
                .context("floor task")??,
        )
    } else {
        None
    };
    let coalescing = CoalesceConfig {
        mode: args.coalescing,
        threshold: args.coalescing_threshold,
        timeout: Duration::from_micros(args.coalescing_timeout_us),
        ..Default::default()
    };
    if let Err((k, why)) = coalescing.validate() {
        bail!("--coalescing: {k} {why}");
    }
    if let Some(n) = args.spin_depth_max {
        if !(1..=QD_MAX).contains(&n) {
            bail!("--spin-depth-max must be between 1 and {QD_MAX}, got {n}");
        }
        if !matches!(args.polling, PollingPolicy::Adaptive { .. }) {
            bail!("--spin-depth-max bounds adaptive polling's spin: give --polling adaptive");
        }
    }
    let wake_batch_min_bytes = match &args.wake_batch_min {
        Some(v) => {
            let n = spec::parse_size(v).context("--wake-batch-min")?;
            if !(1..=WAKE_BATCH_MIN_BYTES_MAX).contains(&n) {
                bail!("--wake-batch-min must be between 1 byte and 1GiB, got {n} bytes");
            }
            if matches!(args.polling, PollingPolicy::BusyPoll) {
                bail!("--wake-batch-min batches sleeps, and busy polling never sleeps: give --polling adaptive or interrupt");
            }
            Some(n)
        }
        None => None,
    };
    let (dhchap_secret, dhchap_ctrl_secret) = args.dhchap.load()?;
    // Connect every job first, so the measured window holds only I/O.
    let mut prepared = Vec::new();
    for j in &jobs {
        let opts = ConnectOptions {
            hostnqn: j.hostnqn.clone(),
            io_queues: j.queues,
            queue_depth: (j.qd.div_ceil(j.queues.max(1) as u32) + 1).min(1024) as u16,
            hdr_digest: args.hdr_digest,
            data_digest: args.data_digest,
            polling: args.polling,
            command_timeout: Duration::from_millis(args.timeout_ms.max(1)),
            coalescing,
            send: SendConfig {
                scheduler: args.send_scheduler,
                flush_when_idle: args.send_flush_when_idle,
                ..SendConfig::default()
            },
            cgroup: j.cgroup.clone(),
            dhchap_secret: dhchap_secret.clone(),
            dhchap_ctrl_secret: dhchap_ctrl_secret.clone(),
            tcp_congestion: args.tcp_congestion.clone(),
            disable_sq_flow: !args.sq_flow_control,
            ..Default::default()
        };
        let p = match &args.volume {
            Some(name) => {
                if args.engine == Engine::Direct {
                    notice(j, "volumes are driven by the async engine");
                }
                Prepared {
                    ctrl: None,
                    dev: device::open_volume(&args, name, opts)
                        .await
                        .with_context(|| format!("job {}", j.name))?,
                    direct: None,
                }
            }
            None => {
                let addr = resolve(&args.target)?;
                let why_async = match args.engine {
                    Engine::Async => None,
                    Engine::Direct if coalescing.mode != CoalesceMode::Off => {
                        Some("--coalescing batches the async engine's wake-ups".to_string())
                    }
                    Engine::Direct => None,
                };
                let direct = match (args.engine, why_async) {
                    (Engine::Async, _) => None,
                    (Engine::Direct, Some(why)) => {
                        notice(j, &why);
                        None
                    }
                    (Engine::Direct, None) => match connect_direct(addr, &args, j, &opts).await? {
                        Ok(p) => Some(p),
                        Err(why) => {
                            notice(j, &why);
                            None
                        }
                    },
                };
                match direct {
                    Some(p) => p,
                    None => {
                        let c = Controller::connect(addr, &args.nqn, opts)
                            .await
                            .with_context(|| {
                                format!("job {}: connect to {} at {addr}", j.name, args.nqn)
                            })?;
                        let ns = pick_namespace(&c, &args, j)?;
                        Prepared {
                            ctrl: Some(c),
                            dev: Device::Namespace(ns),
                            direct: None,
                        }
                    }
                }
            }
        };
        if args.submit_chunk > 0 && p.direct.is_none() {
            bail!(
                "job {}: --submit-chunk needs the direct engine (this job runs on the async engine: see the notice above)",
                j.name
            );
        }
        if args.spin_depth_max.is_some() && p.direct.is_none() {
            bail!(
                "job {}: --spin-depth-max needs the direct engine (this job runs on the async engine: see the notice above)",
                j.name
            );
        }
        if wake_batch_min_bytes.is_some() && p.direct.is_none() {
            bail!(
                "job {}: --wake-batch-min needs the direct engine (this job runs on the async engine: see the notice above)",
                j.name
            );
        }
        if j.batch && p.direct.is_none() {
            bail!(
                "job {}: batch=1 needs the direct engine (this job runs on the async engine: see the notice above)",
                j.name
            );
        }
        prepared.push((j.clone(), p));
    }
    let span_blocks = match &args.span {
        Some(s) => Some(spec::parse_size(s).context("--span")?),
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stats_of =
        |c: &Option<Controller>| c.as_ref().map(Controller::io_stats).unwrap_or_default();
    let host0: Vec<HostQueueStats> = prepared.iter().map(|(_, p)| stats_of(&p.ctrl)).collect();
    let (u0, s0) = cpu_times_s();
    let window_from = unix_now_s();
    let start = Instant::now();
    let mut handles = Vec::new();
    let mut counters = Vec::new();
    let mut engines = Vec::new();
    for (j, p) in &mut prepared {
        let ctr = Arc::new(AtomicU64::new(0));
        counters.push((j.name.clone(), ctr.clone()));
        let job = JobRun::new(
            j.clone(),
            p.dev.clone(),
            span_blocks,
            args.verify,
            args.ios,
            stop.clone(),
            ctr,
        )?;
        match p.direct.take() {
            Some(d) => {
                engines.push(Engine::Direct);
                let polling = direct::DirectPolling {
                    policy: args.polling,
                    spin_depth_max: args.spin_depth_max.map(|n| usize_from(u64::from(n))),
                    wake_batch_min_bytes: wake_batch_min_bytes.map(usize_from),
                    submit_chunk: usize_from(u64::from(args.submit_chunk)),
                };
                let replace = direct::Replacer {
                    ctrl: d.ctrl,
                    rt: tokio::runtime::Handle::current(),
                };
                handles.push(tokio::task::spawn_blocking(move || {
                    job.run_direct(d.queues, d.rw, polling, replace)
                }));
            }
            None => {
                engines.push(Engine::Async);
                handles.push(tokio::spawn(async move {
                    let (st, h) = job.run().await?;
                    Ok((st, h, None))
                }));
            }
        }
    }
    let progress = args.progress || std::io::stderr().is_terminal();
    let deadline = runtime.map(|r| start + r);
    let mut last = (Instant::now(), 0u64);
    loop {
        if handles.iter().all(|h| h.is_finished()) {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            stop.store(true, Ordering::Release);
            break;
        }
        tokio::time::sleep(
            Duration::from_millis(if progress { 1000 } else { 20 }).min(
                deadline
                    .map(|d| d.saturating_duration_since(Instant::now()))
                    .unwrap_or(Duration::from_secs(1))
                    .max(Duration::from_millis(1)),
            ),
        )
        .await;
        if progress {
            let now = Instant::now();
            let n: u64 = counters
                .iter()
                .map(|(_, c)| c.load(Ordering::Relaxed))
                .sum();
            let dt = (now - last.0).as_secs_f64().max(1e-6);
            eprint!(
                "\r{:>6.1}s  {:>10.0} IOPS  ({} I/Os)   ",
                (now - start).as_secs_f64(),
                (n - last.1) as f64 / dt,
                n
            );
            last = (now, n);
        }
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.context("job task")??);
    }
    let (u1, s1) = cpu_times_s();
    let window_to = unix_now_s();
    let host: Vec<HostQueueStats> = prepared
        .iter()
        .zip(&host0)
        .zip(&results)
        .map(|(((_, p), h0), (_, _, direct))| match direct {
            Some(d) => *d,
            None => stats_of(&p.ctrl).since(h0),
        })
        .collect();
    if progress {
        eprintln!();
    }
    for (_, p) in &prepared {
        if let Some(c) = &p.ctrl {
            c.disconnect(Duration::from_secs(2)).await;
        }
    }
    let mut total_hist = hist()?;
    let mut reports = Vec::new();
    let mut total = JobStats::default();
    let mut elapsed_max = 0f64;
    let mut host_total = HostQueueStats::default();
    for (((j, (stats, h, _)), hs), e) in jobs.iter().zip(results).zip(&host).zip(&engines) {
        total_hist.add(&h).context("merge histograms")?;
        elapsed_max = elapsed_max.max(stats.elapsed_s);
        let mut r = stats.report(j, &h);
        r.host = HostCounters::from_stats(hs);
        r.engine = e.to_string();
        reports.push(r);
        total.merge(&stats);
        host_total.add(hs);
    }
    total.elapsed_s = elapsed_max;
    let total_spec = JobSpec {
        name: "total".into(),
        hostnqn: String::new(),
        rw: jobs[0].rw,
        qd: jobs.iter().map(|j| j.qd).sum(),
        ..jobs[0].clone()
    };
    let mut total_report = total.report(&total_spec, &total_hist);
    total_report.host = HostCounters::from_stats(&host_total);
    total_report.engine = if engines.windows(2).all(|w| w[0] == w[1]) {
        engines.first().map_or(String::new(), Engine::to_string)
    } else {
        "mixed".into()
    };
    total_report.rw = if jobs.len() > 1 {
        "mixed".into()
    } else {
        jobs[0].rw.to_string()
    };
    let cpu = (u1 - u0) + (s1 - s0);
    Ok(BenchReport {
        iops_per_cpu_s: if cpu > 0.0 {
            total_report.ios as f64 / cpu
        } else {
            0.0
        },
        jobs: reports,
        total: total_report,
        cpu_user_s: u1 - u0,
        cpu_sys_s: s1 - s0,
        cpu_window_unix_s: [window_from, window_to],
        polling: args.polling.to_string(),
        spin_depth_max: args.spin_depth_max,
        wake_batch_min_bytes,
        submit_chunk: args.submit_chunk,
        floor,
    })
}

/// A job's connection, ready to run.
struct Prepared {
    /// The controller (none for a volume).
    ctrl: Option<Controller>,
    dev: Device,
    /// The direct engine's queues, taken when the job starts.
    direct: Option<DirectSetup>,
}

/// What the direct engine drives: a `DirectQueue` per `--queues`, and the
/// controller that gives a new one when a queue fails.
struct DirectSetup {
    queues: Vec<DirectQueue>,
    rw: RwBuilder,
    ctrl: Controller,
}

/// One line on stderr: job `j` runs on the async engine, and why.
fn notice(j: &JobSpec, why: &str) {
    eprintln!(
        "sluice bench: job {}: using the async engine ({why})",
        j.name
    );
}

/// `--nsid` or the controller's first active namespace.
fn pick_namespace(
    c: &Controller,
    args: &BenchArgs,
    j: &JobSpec,
) -> anyhow::Result<sluice_host::Namespace> {
    let nsid = match args.nsid {
        Some(n) => n,
        None => c
            .namespaces()
            .first()
            .map(|n| n.nsid)
            .with_context(|| format!("{} has no namespace", args.nqn))?,
    };
    c.namespace(nsid).with_context(|| format!("job {}", j.name))
}

/// Connects job `j` for the direct engine: a controller whose threaded
/// queues stay idle (one I/O queue, interrupt polling: the job's own loop
/// polls) and `--queues` direct queues. `Ok(Err(why))` when the job must
/// fall back to the async engine (the controller asks the direct queues to
/// authenticate; a block size above one command).
async fn connect_direct(
    addr: SocketAddr,
    args: &BenchArgs,
    j: &JobSpec,
    opts: &ConnectOptions,
) -> anyhow::Result<Result<Prepared, String>> {
    let n = j.queues.max(1);
    let o = ConnectOptions {
        io_queues: 1,
        direct_queues: n,
        polling: PollingPolicy::Interrupt,
        ..opts.clone()
    };
    let c = Controller::connect(addr, &args.nqn, o)
        .await
        .with_context(|| format!("job {}: connect to {} at {addr}", j.name, args.nqn))?;
    let ns = pick_namespace(&c, args, j)?;
    let rw = ns.rw_builder();
    let mut fallback = None;
    if j.bs.max_bytes() > rw.max_command_bytes() {
        fallback = Some(format!(
            "--bs up to {} bytes is above one command ({} bytes); the async engine splits it",
            j.bs.max_bytes(),
            rw.max_command_bytes()
        ));
    }
    let mut queues = Vec::new();
    while fallback.is_none() && queues.len() < usize::from(n) {
        match c.connect_direct_queue().await {
            Ok(q) => queues.push(q),
            Err(e) => {
                drop(queues);
                c.disconnect(Duration::from_secs(1)).await;
                return Err(anyhow::Error::new(e).context(format!(
                    "job {}: direct queue to {} at {addr}",
                    j.name, args.nqn
                )));
            }
        }
    }
    if let Some(why) = fallback {
        drop(queues);
        c.disconnect(Duration::from_secs(1)).await;
        return Ok(Err(why));
    }
    Ok(Ok(Prepared {
        ctrl: Some(c.clone()),
        dev: Device::Namespace(ns),
        direct: Some(DirectSetup {
            queues,
            rw,
            ctrl: c,
        }),
    }))
}

fn hist() -> anyhow::Result<Histogram<u64>> {
    // Nanoseconds from 1 ns to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("histogram")
}

#[derive(Debug, Default, Clone)]
struct JobStats {
    ios: u64,
    reads: u64,
    writes: u64,
    bytes: u64,
    errors: u64,
    verify_errors: u64,
    elapsed_s: f64,
    error_samples: Vec<String>,
}

impl JobStats {
    fn merge(&mut self, o: &JobStats) {
        self.ios += o.ios;
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.verify_errors += o.verify_errors;
    }

    fn report(&self, j: &JobSpec, h: &Histogram<u64>) -> JobReport {
        let us = |ns: u64| ns as f64 / 1000.0;
        let e = self.elapsed_s.max(1e-9);
        let empty = h.is_empty();
        let q = |p: f64| {
            if empty {
                0.0
            } else {
                us(h.value_at_quantile(p))
            }
        };
        JobReport {
            name: j.name.clone(),
            hostnqn: j.hostnqn.clone(),
            rw: j.rw.to_string(),
            engine: String::new(),
            qd: j.qd,
            ios: self.ios,
            reads: self.reads,
            writes: self.writes,
            bytes: self.bytes,
            errors: self.errors,
            verify_errors: self.verify_errors,
            elapsed_s: self.elapsed_s,
            iops: self.ios as f64 / e,
            bandwidth_mib_s: self.bytes as f64 / (1 << 20) as f64 / e,
            latency_us_mean: if empty { 0.0 } else { h.mean() / 1000.0 },
            latency_us_min: if empty { 0.0 } else { us(h.min()) },
            latency_us_p50: q(0.50),
            latency_us_p90: q(0.90),
            latency_us_p99: q(0.99),
            latency_us_p999: q(0.999),
            latency_us_p9999: q(0.9999),
            latency_us_max: if empty { 0.0 } else { us(h.max()) },
            host: HostCounters::default(),
            error_samples: self.error_samples.clone(),
        }
    }
}

/// Shared state of one running job.
struct JobRun {
    spec: JobSpec,
    ns: Device,
    /// Usable blocks.
    blocks: u64,
    verify: bool,
    ios_limit: Option<u64>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    /// I/O tickets handed out (for --ios and the rate limiter).
    issued: AtomicU64,
    seq_cursor: AtomicU64,
    stats: Mutex<JobStats>,
}

/// splitmix64: fast, good enough for offsets and patterns.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The verify pattern of one block: 8-byte words derived from (lba, generation).
pub fn fill_pattern(buf: &mut [u8], lba: u64, generation: u32) {
    let seed = mix(lba ^ ((generation as u64) << 48));
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let v = mix(seed.wrapping_add(i as u64)).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

#[cfg(test)]
pub(crate) fn tests_support_mix(x: u64) -> u64 {
    mix(x)
}

impl JobRun {
    fn new(
        spec: JobSpec,
        ns: Device,
        span_bytes: Option<u64>,
        verify: bool,
        ios_limit: Option<u64>,
        stop: Arc<AtomicBool>,
        done: Arc<AtomicU64>,
    ) -> anyhow::Result<Arc<JobRun>> {
        let bs = ns.block_size_bytes() as u64;
        let mut blocks = ns.size_blocks();
        if let Some(s) = span_bytes {
            blocks = blocks.min((s / bs).max(1));
        }
        let max_io = spec.bs.max_bytes().div_ceil(bs);
        if max_io * spec.qd as u64 > blocks && verify {
            bail!(
                "job {}: --verify needs qd x largest block ({} blocks) within the namespace ({blocks} blocks)",
                spec.name,
                max_io * spec.qd as u64
            );
        }
        if max_io > blocks {
            bail!("job {}: block size larger than the namespace", spec.name);
        }
        Ok(Arc::new(JobRun {
            spec,
            ns,
            blocks,
            verify,
            ios_limit,
            stop,
            done,
            issued: AtomicU64::new(0),
            seq_cursor: AtomicU64::new(0),
            stats: Mutex::new(JobStats::default()),
        }))
    }

    async fn run(self: Arc<Self>) -> anyhow::Result<(JobStats, Histogram<u64>)> {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..self.spec.qd.clamp(1, QD_MAX) {
            let me = self.clone();
            tasks.push(tokio::spawn(async move { me.worker(w, start).await }));
        }
        let mut h = hist()?;
        for t in tasks {
            let wh = t.await.context("worker")??;
            h.add(&wh).context("merge histograms")?;
        }
        let mut st = lock(&self.stats).clone();
        st.elapsed_s = start.elapsed().as_secs_f64();
        Ok((st, h))
    }

    /// The direct engine: one OS thread per queue, each driving its slots
    /// (`crate::direct`); blocks until they finish.
    fn run_direct(
        self: Arc<Self>,
        queues: Vec<DirectQueue>,
        rw: RwBuilder,
        polling: direct::DirectPolling,
        replace: direct::Replacer,
    ) -> anyhow::Result<(JobStats, Histogram<u64>, Option<HostQueueStats>)> {
        let start = Instant::now();
        let n = u32::try_from(queues.len()).context("queues")?;
        let mut threads = Vec::new();
        for (k, q) in (0u32..).zip(queues) {
            let me = self.clone();
            let replace = replace.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("sluice-bench-d{k}"))
                    .spawn(move || me.direct_thread(q, rw, k, n, start, polling, &replace))
                    .context("spawn the direct I/O thread")?,
            );
        }
        let mut h = hist()?;
        let mut host = HostQueueStats::default();
        let mut first_err = None;
        for t in threads {
            match t.join() {
                Ok(Ok((th, hs))) => {
                    h.add(&th).context("merge histograms")?;
                    host.add(&hs);
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow::anyhow!("a direct I/O thread panicked"));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let mut st = lock(&self.stats).clone();
        st.elapsed_s = start.elapsed().as_secs_f64();
        Ok((st, h, Some(host)))
    }

    /// One outstanding I/O at a time; `qd` workers give the queue depth.
    async fn worker(self: Arc<Self>, w: u32, start: Instant) -> anyhow::Result<Histogram<u64>> {
        let mut h = hist()?;
        let bs = self.ns.block_size_bytes() as u64;
        let mut rng = mix(0x5eed ^ ((w as u64) << 32) ^ nanos(start.elapsed()));
        let qd = self.spec.qd.max(1) as u64;
        // Verify: each worker owns a disjoint region, so generations are exact.
        let region = self.blocks / qd;
        let region_start = w as u64 * region;
        let mut gens: Vec<u32> = if self.verify {
            vec![0; usize_from(region)]
        } else {
            Vec::new()
        };
        let mut local = JobStats::default();
        let flags = IoFlags {
            urgent: self.spec.urgent,
            ..Default::default()
        };
        let junk = self.junk();
        loop {
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            let ticket = self.issued.fetch_add(1, Ordering::AcqRel);
            if self.ios_limit.is_some_and(|n| ticket >= n) {
                break;
            }
            if let Some(due) = self.ticket_due(start, ticket) {
                let now = Instant::now();
                if due > now {
                    // Sleep in slices so a stop is noticed quickly.
                    let mut left = due - now;
                    while !left.is_zero() {
                        let s = left.min(Duration::from_millis(50));
                        tokio::time::sleep(s).await;
                        if self.stop.load(Ordering::Acquire) {
                            break;
                        }
                        left = due.saturating_duration_since(Instant::now());
                    }
                    if self.stop.load(Ordering::Acquire) {
                        break;
                    }
                }
            }
            let io = self.next_io(&mut rng, region_start, region);
            let len = usize_from(io.blocks * bs);
            let t0 = Instant::now();
            let r = if io.read {
                self.ns.read(io.lba, len, flags).await.map(Some)
            } else {
                let data = self.write_data(&mut gens, region_start, &io, &junk);
                self.ns.write_owned(io.lba, data, flags).await.map(|_| None)
            };
            let dt = t0.elapsed();
            h.record(nanos(dt).max(1)).context("record latency")?;
            self.done.fetch_add(1, Ordering::Relaxed);
            match r {
                Ok(data) => self.completed(&mut local, &gens, region_start, &io, data.as_deref()),
                Err(e) => {
                    self.forget(&mut gens, region_start, &io);
                    self.failed(&mut local, e.to_string());
                    if e.is_fatal_for_connection() && local.errors > 100 {
                        break;
                    }
                }
            }
        }
        self.merge_stats(local);
        Ok(h)
    }

    /// A buffer of junk bytes for writes without --verify.
    fn junk(&self) -> Vec<u8> {
        let mut junk = vec![0u8; usize_from(self.spec.bs.max_bytes())];
        for (i, b) in junk.iter_mut().enumerate() {
            *b = (mix(i as u64) & 0xff) as u8;
        }
        junk
    }

    /// When I/O ticket `ticket` may start under --rate-iops (ticket n is not
    /// issued before start + n/rate); `None` without a rate.
    fn ticket_due(&self, start: Instant, ticket: u64) -> Option<Instant> {
        let rate = self.spec.rate_iops.filter(|r| *r > 0)?;
        Some(start + Duration::from_secs_f64(ticket as f64 / rate as f64))
    }

    /// The next I/O of a worker (or direct slot) owning the verify region
    /// `region_start..+region`: its direction, LBA and length.
    fn next_io(&self, rng: &mut u64, region_start: u64, region: u64) -> NextIo {
        let bs = self.ns.block_size_bytes() as u64;
        *rng = mix(*rng);
        let blocks = self.spec.bs.pick(*rng).div_ceil(bs).max(1);
        let read = match self.spec.rw {
            RwMode::Read | RwMode::RandRead => true,
            RwMode::Write | RwMode::RandWrite => false,
            RwMode::Rw | RwMode::RandRw => (mix(*rng ^ 0xabc) % 100) < self.spec.rwmixread as u64,
        };
        let (lo, span) = if self.verify {
            (region_start, region)
        } else {
            (0, self.blocks)
        };
        let span = span.max(blocks);
        let lba = if self.spec.rw.is_random() {
            lo + (mix(*rng ^ 0x1234) % (span - blocks + 1))
        } else {
            let c = self.seq_cursor.fetch_add(blocks, Ordering::AcqRel);
            lo + (c % (span - blocks + 1))
        };
        NextIo { read, lba, blocks }
    }

    /// A write's data: with --verify each block's pattern from (LBA, its
    /// next generation in `gens`), else junk.
    fn write_data(&self, gens: &mut [u32], region_start: u64, io: &NextIo, junk: &[u8]) -> Vec<u8> {
        let bs = self.ns.block_size_bytes() as u64;
        let len = usize_from(io.blocks * bs);
        if !self.verify {
            return junk[..len].to_vec();
        }
        let mut d = vec![0u8; len];
        for b in 0..io.blocks {
            let g = &mut gens[usize_from(io.lba - region_start + b)];
            *g = g.wrapping_add(1).max(1);
            let at = usize_from(b * bs);
            fill_pattern(&mut d[at..at + usize_from(bs)], io.lba + b, *g);
        }
        d
    }

    /// Accounts a successful I/O; with --verify checks a read's blocks
    /// against their last written generation.
    fn completed(
        &self,
        local: &mut JobStats,
        gens: &[u32],
        region_start: u64,
        io: &NextIo,
        data: Option<&[u8]>,
    ) {
        let bs = self.ns.block_size_bytes() as u64;
        local.ios += 1;
        local.bytes += io.blocks * bs;
        if io.read {
            local.reads += 1;
        } else {
            local.writes += 1;
        }
        let (true, Some(d)) = (self.verify, data) else {
            return;
        };
        let mut expect = vec![0u8; usize_from(bs)];
        for b in 0..io.blocks {
            let g = gens[usize_from(io.lba - region_start + b)];
            if g == 0 {
                continue;
            }
            fill_pattern(&mut expect, io.lba + b, g);
            let at = usize_from(b * bs);
            if d.get(at..at + usize_from(bs)) != Some(&expect[..]) {
                local.verify_errors += 1;
                if local.error_samples.len() < 5 {
                    local
                        .error_samples
                        .push(format!("verify: LBA {} generation {g} differs", io.lba + b));
                }
            }
        }
    }

    /// After a failed write (with --verify): what its blocks hold is
    /// unknown (the old data, the new, or nothing after a target lost
    /// them), so they are not checked until the next successful write.
    fn forget(&self, gens: &mut [u32], region_start: u64, io: &NextIo) {
        if !self.verify || io.read {
            return;
        }
        for b in 0..io.blocks {
            if let Some(g) = gens.get_mut(usize_from(io.lba - region_start + b)) {
                *g = 0;
            }
        }
    }

    /// Accounts a failed I/O.
    fn failed(&self, local: &mut JobStats, error: String) {
        local.ios += 1;
        local.errors += 1;
        if local.error_samples.len() < 5 {
            local.error_samples.push(error);
        }
    }

    /// Adds a worker's (or direct thread's) counts to the job's.
    fn merge_stats(&self, mut local: JobStats) {
        let mut s = lock(&self.stats);
        let samples = std::mem::take(&mut local.error_samples);
        s.merge(&local);
        for e in samples {
            if s.error_samples.len() < 5 {
                s.error_samples.push(e);
            }
        }
    }
}

/// One I/O to issue.
#[derive(Debug, Clone, Copy)]
struct NextIo {
    read: bool,
    lba: u64,
    blocks: u64,
}
