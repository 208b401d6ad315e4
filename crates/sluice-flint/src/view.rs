//! The shadow view (Flint §3): a telemetry database of the storage system,
//! built from per-I/O samples.
//!
//! Sluice's hardware model replaces the EBOF's with what NVMe/TCP over a
//! network has: each client's **NetPipe** (its network path), each target
//! port (**IOPipe**: every drive behind one `HOST:PORT` shares its receive
//! and send path) and each **drive** (a namespace).
//!
//! * A [`ViewAgent`] lives in every volume client. It times each I/O,
//!   keeps its own windows per drive, and batches the samples
//!   (`<client, drive, type, size, RTT>`, §3.3) for the controller.
//! * The [`ViewController`] lives in `sluice control`. It applies a batch to
//!   the windows of every entity the samples traversed, bumps each entity's
//!   recency counter by the samples applied, and acknowledges with the
//!   counters (§3.4). An agent that finds a counter moved by more than its
//!   own samples knows its copy is stale and pulls it.
//! * Each epoch the controller decides which drives are congested, runs
//!   Algorithm 1 ([`crate::bottleneck`]) and publishes the report, pushed to
//!   agents with their part of the view.
//!
//! Congestion. Flint estimates a drive's headroom from offline profiles and
//! the end-to-end delay. Sluice does the same with what it can learn online:
//! the **queueing delay** is each sample's latency above the unloaded
//! latency of its size class (the least seen, drifting up slowly so that it
//! can be relearnt), and the **headroom** is the drive's capacity minus its
//! current throughput, where the capacity is the operator's figure when
//! given (`sluice drive add --bandwidth`) and the peak seen otherwise. A
//! drive is congested when its mean queueing delay passes
//! `queue_delay_us_congested`, or when a configured capacity leaves less
//! than `headroom_share_congested` of itself free.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::bottleneck::{self, BottleneckReport, Session};
use crate::window::{Window, WindowStats};

/// Samples in one batch, at most.
pub const BATCH_SAMPLES_MAX: usize = 4096;
/// Clients the controller tracks, at most.
pub const CLIENTS_MAX: usize = 4096;
/// Drives the controller tracks, at most.
pub const DRIVES_MAX: usize = 65_536;
/// Entities one query may name, at most.
pub const QUERY_ENTITIES_MAX: usize = 4096;
/// Event subscriptions per client, at most.
pub const SUBSCRIPTIONS_PER_CLIENT_MAX: usize = 64;
/// Size classes for the unloaded-latency baselines (512 B .. 16 MiB).
pub const SIZE_CLASSES: usize = 16;
/// Unloaded-latency baselines per drive: reads and writes of each class.
const BASELINES: usize = 2 * SIZE_CLASSES;
/// Longest client name.
pub const CLIENT_NAME_BYTES_MAX: usize = 256;
/// Volumes whose share of one drive the controller tracks, at most (the
/// rest still count in the drive's own window).
pub const VOLUMES_PER_DRIVE_MAX: usize = 256;
/// Volumes a drive's view lists, at most: the heaviest.
pub const VOLUMES_IN_VIEW_MAX: usize = 8;

/// One entity of the view.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Entity {
    /// A client's network path.
    NetPipe(String),
    /// A target port, `HOST:PORT`.
    IoPipe(String),
    /// A drive, by its control-plane id.
    Drive(u64),
}

impl std::fmt::Display for Entity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entity::NetPipe(c) => write!(f, "netpipe:{c}"),
            Entity::IoPipe(p) => write!(f, "iopipe:{p}"),
            Entity::Drive(d) => write!(f, "drive:{d}"),
        }
    }
}

/// One completed I/O, as the agent timed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoSample {
    pub drive: u64,
    /// The volume the I/O was for (`None`: no volume's, e.g. a rebuild's
    /// copy).
    #[serde(default)]
    pub volume: Option<u64>,
    pub write: bool,
    pub bytes: u32,
    /// Submission to completion, at the drive (not the time it waited in
    /// the client's scheduler).
    pub latency_us: u32,
    /// Completion time on the agent's clock.
    pub at_us: u64,
}

/// A batch of samples from one client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleBatch {
    pub client: String,
    /// When the batch left, on the agent's clock: the controller places each
    /// sample at `now - (sent_at_us - at_us)` on its own clock.
    pub sent_at_us: u64,
    pub samples: Vec<IoSample>,
}

/// The controller's answer to a batch: each entity it touched, with its
/// counter after the batch and how many of this batch's samples it took.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub counters: Vec<(Entity, u64, u64)>,
    /// Samples naming a drive the controller does not know (dropped).
    pub unknown_drive_samples: u64,
    /// The epoch of the latest bottleneck report.
    pub epoch: u64,
}

/// What the view says of one entity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntityView {
    pub entity: Entity,
    pub counter: u64,
    pub stats: WindowStats,
    pub ewma: Option<WindowStats>,
    /// Drives only: the capacity in bytes/s (configured, else the peak
    /// seen; 0 when unknown), the headroom, and the busy degree (0..=1)
    /// that placement weighs.
    pub capacity_bytes_per_sec: f64,
    pub headroom_bytes_per_sec: f64,
    pub busy_degree: f64,
    pub congested: bool,
    /// Drives whose target reports: the drive as the target sees it (all
    /// hosts' I/O, timed at the target).
    pub target: Option<WindowStats>,
    /// Drives whose target reports: the clients' mean latency above the
    /// target's (time in the port and the network).
    pub path_delay_us: Option<f64>,
    /// Drives only: the volumes that loaded it in the window, heaviest
    /// first (at most [`VOLUMES_IN_VIEW_MAX`]).
    #[serde(default)]
    pub volumes: Vec<VolumeLoad>,
    /// Drives only: samples past the per-drive limits since the drive was
    /// added (counted for the drive, not for their volume or session).
    #[serde(default)]
    pub untracked: Untracked,
}

/// One volume's part of a drive's load in the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeLoad {
    pub volume: u64,
    /// The volume's I/O to this drive, from every client.
    pub stats: WindowStats,
    /// Its share of the drive's work in the window (0..=1): of the bytes
    /// when the drive moved any, else of the I/Os.
    pub share: f64,
}

/// Part of the view, with the latest report: what PUSH and PULL carry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewSnapshot {
    pub epoch: u64,
    pub entities: Vec<EntityView>,
    pub report: BottleneckReport,
}

/// An event a client asks to be told of at once (§3.4: callbacks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Subscription {
    /// The drive becomes congested, or stops being.
    Congestion { drive: u64 },
    /// The drive's headroom falls below, or climbs back over, a figure.
    HeadroomBelow { drive: u64, bytes_per_sec: f64 },
}

/// A subscription that fired, for one client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    pub client: String,
    pub subscription: Subscription,
    /// Whether the condition now holds (it fires on each change).
    pub holds: bool,
    pub view: EntityView,
}

/// Why the controller refused something.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("a batch holds {got} samples; at most {BATCH_SAMPLES_MAX}")]
    BatchTooLarge { got: usize },
    #[error("client name: {0}")]
    ClientName(String),
    #[error("the view already tracks {CLIENTS_MAX} clients")]
    TooManyClients,
    #[error("the view already tracks {DRIVES_MAX} drives")]
    TooManyDrives,
    #[error("a query names {got} entities; at most {QUERY_ENTITIES_MAX}")]
    QueryTooLarge { got: usize },
    #[error("client {client:?} already holds {SUBSCRIPTIONS_PER_CLIENT_MAX} subscriptions")]
    TooManySubscriptions { client: String },
    #[error("{0}")]
    BadConfig(String),
}

/// The controller's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewControllerConfig {
    /// Span of every window.
    pub window_us: u64,
    /// Time between bottleneck analyses (and EWMA folds).
    pub epoch_us: u64,
    /// EWMA weight of the newest epoch, 0..=1.
    pub ewma_alpha: f64,
    /// A drive whose mean queueing delay reaches this is congested.
    pub queue_delay_us_congested: f64,
    /// A drive with a configured capacity is congested when less than
    /// this share of it is free.
    pub headroom_share_congested: f64,
    /// Samples a drive's window must hold before it can be congested
    /// (a few slow I/Os are not congestion).
    pub congestion_ios_min: u64,
    /// A client silent this long leaves the directory.
    pub client_idle_us: u64,
}

impl Default for ViewControllerConfig {
    fn default() -> Self {
        ViewControllerConfig {
            window_us: 1_000_000,
            epoch_us: 100_000,
            ewma_alpha: 0.3,
            queue_delay_us_congested: 1_000.0,
            headroom_share_congested: 0.1,
            congestion_ios_min: 32,
            client_idle_us: 30_000_000,
        }
    }
}

impl ViewControllerConfig {
    pub fn check(&self) -> Result<(), ViewError> {
        let bad = |m: String| Err(ViewError::BadConfig(m));
        if self.epoch_us == 0 || self.window_us < self.epoch_us {
            return bad(format!(
                "view epoch {} us must be > 0 and no longer than the window {} us",
                self.epoch_us, self.window_us
            ));
        }
        if !(0.0..=1.0).contains(&self.ewma_alpha) {
            return bad(format!(
                "view ewma_alpha {} must be in 0..=1",
                self.ewma_alpha
            ));
        }
        if !(0.0..=1.0).contains(&self.headroom_share_congested) {
            return bad(format!(
                "view headroom_share_congested {} must be in 0..=1",
                self.headroom_share_congested
            ));
        }
        if !self.queue_delay_us_congested.is_finite() || self.queue_delay_us_congested <= 0.0 {
            return bad(format!(
                "view queue_delay_us_congested {} must be > 0",
                self.queue_delay_us_congested
            ));
        }
        Ok(())
    }
}

/// The size class of an I/O: log2 of its size in 512-byte units.
pub fn size_class(bytes: u32) -> usize {
    let units = (bytes / 512).max(1);
    (units.ilog2() as usize).min(SIZE_CLASSES - 1)
}

#[derive(Clone, Debug)]
struct Counted {
    window: Window,
    counter: u64,
}

impl Counted {
    fn new(span_us: u64) -> Counted {
        Counted {
            window: Window::new(span_us),
            counter: 0,
        }
    }
}

/// A drive's samples since the auction last took them.
#[derive(Clone, Debug, Default)]
struct SinceTake {
    ios: u64,
    bytes: u64,
    /// Latency above the unloaded latency of each sample's size, summed.
    excess_us: u64,
    /// Per session (client and volume): its samples, and their excess as a
    /// multiple of each sample's own unloaded latency (at most
    /// [`CONTENTION_MAX`]), summed. Kept apart so that one heavy session's
    /// many samples cannot hide another's stalls.
    contention: BTreeMap<String, BTreeMap<Option<u64>, (u64, f64)>>,
    /// Sessions in `contention`: at most [`SESSIONS_PER_DRIVE_MAX`].
    sessions: usize,
}

/// Sessions (client and volume) whose contention a drive keeps per epoch,
/// at most.
pub const SESSIONS_PER_DRIVE_MAX: usize = 1024;

/// A session needs this many samples in an epoch for its contention to
/// count (a stray sample is noise).
const CONTENTION_SAMPLES_MIN: u64 = 4;

/// One sample counts at most this much in the contention measure, so that
/// a few stalls do not stand for the whole epoch.
const CONTENTION_MAX: f64 = 10.0;

#[derive(Clone, Debug)]
struct DriveState {
    port: String,
    capacity_configured: Option<f64>,
    peak_bytes_per_sec: f64,
    /// Least latency seen per direction and size class (reads first;
    /// `u64::MAX`: none yet): a write and a read of one size cost the drive
    /// differently, so each is measured against its own kind.
    baseline_us: [u64; BASELINES],
    /// When each was last seen (for the auction's measure: the slowest
    /// unloaded latency among the sizes in use).
    class_seen_us: [u64; BASELINES],
    c: Counted,
    congested: bool,
    headroom: f64,
    busy: f64,
    /// Samples since the auction last took them.
    since_take: SinceTake,
    /// What the drive's target says of it (its agent's counters).
    target: Option<TargetSide>,
    /// The clients' latency above the target's: the port and network.
    path_delay_us: Option<f64>,
    /// Each volume's own I/O to the drive (who loads it).
    volumes: BTreeMap<u64, Window>,
    /// Samples past the limits, counted for the drive only.
    untracked: Untracked,
}

/// A drive's samples that counted for the drive but not for their volume
/// or session, because the drive already tracked as many as it may: what
/// tells an operator that the per-volume view and the auction's
/// per-session contention are missing someone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Untracked {
    /// Samples of a volume beyond [`VOLUMES_PER_DRIVE_MAX`] in the window.
    pub volume_samples: u64,
    /// Samples of a session (client and volume) beyond the sessions whose
    /// contention a drive keeps per epoch ([`SESSIONS_PER_DRIVE_MAX`]).
    pub session_samples: u64,
}

/// `part`'s share of `all`: of the bytes when `all` moved any, else of the
/// I/Os.
fn share_of(part: &WindowStats, all: &WindowStats) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let share = if all.bytes > 0 {
        part.bytes as f64 / all.bytes as f64
    } else if all.ios > 0 {
        part.ios as f64 / all.ios as f64
    } else {
        0.0
    };
    share.clamp(0.0, 1.0)
}

impl DriveState {
    /// Every tracked volume's load, heaviest (by bytes, then I/Os) first.
    fn volume_loads(&self, now_us: u64) -> Vec<VolumeLoad> {
        let all = self.c.window.stats(now_us);
        let mut v: Vec<VolumeLoad> = self
            .volumes
            .iter()
            .map(|(id, w)| {
                let stats = w.stats(now_us);
                VolumeLoad {
                    volume: *id,
                    share: share_of(&stats, &all),
                    stats,
                }
            })
            .filter(|l| l.stats.ios > 0)
            .collect();
        v.sort_by(|a, b| {
            (b.stats.bytes, b.stats.ios, a.volume).cmp(&(a.stats.bytes, a.stats.ios, b.volume))
        });
        v
    }
}

/// A drive as its target sees it: every I/O that reached it, from any
/// host, timed from arrival at the target to completion.
#[derive(Clone, Debug)]
struct TargetSide {
    window: Window,
    /// Least mean latency of a report (of at least
    /// [`TARGET_REPORT_IOS_MIN`] I/Os): the unloaded latency at the target.
    baseline_us: u64,
}

/// A target's report for a drive counts toward its unloaded latency only
/// with at least this many I/Os (fewer are noise).
pub const TARGET_REPORT_IOS_MIN: u64 = 8;

impl DriveState {
    fn capacity(&self) -> f64 {
        self.capacity_configured.unwrap_or(self.peak_bytes_per_sec)
    }
}

#[derive(Clone, Debug)]
struct ClientState {
    c: Counted,
    sessions: BTreeMap<u64, Window>,
    last_seen_us: u64,
    subscriptions: Vec<(Subscription, bool)>,
}

/// The view controller: the whole view, serialised through `&mut self`.
#[derive(Debug)]
pub struct ViewController {
    cfg: ViewControllerConfig,
    drives: BTreeMap<u64, DriveState>,
    ports: BTreeMap<String, Counted>,
    clients: BTreeMap<String, ClientState>,
    epoch: u64,
    next_epoch_us: u64,
    report: BottleneckReport,
}

impl ViewController {
    pub fn new(cfg: ViewControllerConfig) -> Result<ViewController, ViewError> {
        cfg.check()?;
        Ok(ViewController {
            cfg,
            drives: BTreeMap::new(),
            ports: BTreeMap::new(),
            clients: BTreeMap::new(),
            epoch: 0,
            next_epoch_us: 0,
            report: BottleneckReport::default(),
        })
    }

    pub fn config(&self) -> &ViewControllerConfig {
        &self.cfg
    }

    /// Adds or updates a drive: the port it sits behind and its capacity
    /// (bytes/s) when the operator gave one.
    pub fn set_drive(
        &mut self,
        drive: u64,
        port: &str,
        capacity_bytes_per_sec: Option<f64>,
    ) -> Result<(), ViewError> {
        let span = self.cfg.window_us;
        let capacity = capacity_bytes_per_sec.filter(|c| c.is_finite() && *c > 0.0);
        if let Some(d) = self.drives.get_mut(&drive) {
            d.port = port.to_owned();
            d.capacity_configured = capacity;
        } else {
            if self.drives.len() >= DRIVES_MAX {
                return Err(ViewError::TooManyDrives);
            }
            self.drives.insert(
                drive,
                DriveState {
                    port: port.to_owned(),
                    capacity_configured: capacity,
                    peak_bytes_per_sec: 0.0,
                    baseline_us: [u64::MAX; BASELINES],
                    class_seen_us: [0; BASELINES],
                    c: Counted::new(span),
                    congested: false,
                    headroom: 0.0,
                    busy: 0.0,
                    since_take: SinceTake::default(),
                    target: None,
                    path_delay_us: None,
                    volumes: BTreeMap::new(),
                    untracked: Untracked::default(),
                },
            );
        }
        self.ports
            .entry(port.to_owned())
            .or_insert_with(|| Counted::new(span));
        Ok(())
    }

    /// Forgets drives not in `keep` (removed from the pool).
    pub fn retain_drives(&mut self, keep: &BTreeSet<u64>) {
        self.drives.retain(|d, _| keep.contains(d));
        let ports: BTreeSet<String> = self.drives.values().map(|d| d.port.clone()).collect();
        self.ports.retain(|p, _| ports.contains(p));
    }

    fn client_mut(&mut self, client: &str, now_us: u64) -> Result<&mut ClientState, ViewError> {
        if client.is_empty() || client.len() > CLIENT_NAME_BYTES_MAX {
            return Err(ViewError::ClientName(format!(
                "{} bytes; it must be 1..={CLIENT_NAME_BYTES_MAX}",
                client.len()
            )));
        }
        if !self.clients.contains_key(client) {
            if self.clients.len() >= CLIENTS_MAX {
                return Err(ViewError::TooManyClients);
            }
            self.clients.insert(
                client.to_owned(),
                ClientState {
                    c: Counted::new(self.cfg.window_us),
                    sessions: BTreeMap::new(),
                    last_seen_us: now_us,
                    subscriptions: Vec::new(),
                },
            );
        }
        let c = self
            .clients
            .get_mut(client)
            .ok_or_else(|| ViewError::ClientName("vanished".into()))?;
        c.last_seen_us = now_us;
        Ok(c)
    }

    /// Applies a batch of samples (§3.3) and acknowledges it with the
    /// counters of every entity touched (§3.4).
    pub fn handle_batch(&mut self, now_us: u64, batch: &SampleBatch) -> Result<Ack, ViewError> {
        if batch.samples.len() > BATCH_SAMPLES_MAX {
            return Err(ViewError::BatchTooLarge {
                got: batch.samples.len(),
            });
        }
        let span = self.cfg.window_us;
        self.client_mut(&batch.client, now_us)?;
        let mut applied: BTreeMap<Entity, u64> = BTreeMap::new();
        let mut unknown = 0u64;
        let mut per_client = Vec::with_capacity(batch.samples.len());
        for s in &batch.samples {
            let Some(d) = self.drives.get_mut(&s.drive) else {
                unknown += 1;
                continue;
            };
            // Place the sample on our clock by its age in the batch.
            let age = batch.sent_at_us.saturating_sub(s.at_us);
            let at = now_us.saturating_sub(age);
            let class = size_class(s.bytes) + usize::from(s.write) * SIZE_CLASSES;
            let base = &mut d.baseline_us[class];
            let latency = u64::from(s.latency_us);
            *base = (*base).min(latency);
            let excess = latency.saturating_sub(*base);
            #[allow(clippy::cast_precision_loss)]
            let contention = (excess as f64 / (*base).max(1) as f64).min(CONTENTION_MAX);
            d.class_seen_us[class] = d.class_seen_us[class].max(at);
            let bytes = u64::from(s.bytes);
            if d.c.window.record(at, bytes, latency, excess, s.write) {
                // A volume past the limit counts for the drive only.
                if let Some(volume) = s.volume {
                    if d.volumes.len() < VOLUMES_PER_DRIVE_MAX || d.volumes.contains_key(&volume) {
                        d.volumes
                            .entry(volume)
                            .or_insert_with(|| Window::new(span))
                            .record(at, bytes, latency, excess, s.write);
                    } else {
                        d.untracked.volume_samples += 1;
                    }
                }
                d.c.counter += 1;
                let t = &mut d.since_take;
                t.ios += 1;
                t.bytes = t.bytes.saturating_add(bytes);
                t.excess_us = t.excess_us.saturating_add(excess);
                // A session past the limit counts for the drive only.
                let room = t.sessions < SESSIONS_PER_DRIVE_MAX;
                if let Some(volumes) = t.contention.get_mut(&batch.client) {
                    match volumes.get_mut(&s.volume) {
                        Some(c) => *c = (c.0 + 1, c.1 + contention),
                        None if room => {
                            volumes.insert(s.volume, (1, contention));
                            t.sessions += 1;
                        }
                        None => d.untracked.session_samples += 1,
                    }
                } else if room {
                    t.contention.insert(
                        batch.client.clone(),
                        BTreeMap::from([(s.volume, (1, contention))]),
                    );
                    t.sessions += 1;
                } else {
                    d.untracked.session_samples += 1;
                }
                *applied.entry(Entity::Drive(s.drive)).or_default() += 1;
                let port = d.port.clone();
                if let Some(p) = self.ports.get_mut(&port) {
                    p.window.record(at, bytes, latency, excess, s.write);
                    p.counter += 1;
                    *applied.entry(Entity::IoPipe(port)).or_default() += 1;
                }
                per_client.push((s.drive, at, bytes, latency, excess, s.write));
            }
        }
        let c = self.client_mut(&batch.client, now_us)?;
        for (drive, at, bytes, latency, excess, write) in per_client {
            c.c.window.record(at, bytes, latency, excess, write);
            c.c.counter += 1;
            c.sessions
                .entry(drive)
                .or_insert_with(|| Window::new(span))
                .record(at, bytes, latency, excess, write);
            *applied
                .entry(Entity::NetPipe(batch.client.clone()))
                .or_default() += 1;
        }
        let counters = applied
            .into_iter()
            .map(|(e, n)| {
                let counter = self.counter(&e).unwrap_or(0);
                (e, counter, n)
            })
            .collect();
        Ok(Ack {
            counters,
            unknown_drive_samples: unknown,
            epoch: self.epoch,
        })
    }

    /// Takes a target's report for one drive: `d` covers `interval_us` up
    /// to now. Returns false when the view does not know the drive.
    pub fn handle_target(&mut self, now_us: u64, drive: u64, d: &TargetDelta) -> bool {
        let span = self.cfg.window_us;
        let Some(state) = self.drives.get_mut(&drive) else {
            return false;
        };
        if d.ios == 0 {
            return true;
        }
        let t = state.target.get_or_insert_with(|| TargetSide {
            window: Window::new(span),
            baseline_us: u64::MAX,
        });
        let mean = d.latency_us_sum / d.ios;
        if d.ios >= TARGET_REPORT_IOS_MIN {
            t.baseline_us = t.baseline_us.min(mean);
        }
        let base = if t.baseline_us == u64::MAX {
            mean
        } else {
            t.baseline_us
        };
        let excess = d.latency_us_sum.saturating_sub(base.saturating_mul(d.ios));
        // The interval's I/O lands in the bucket of its middle.
        let at = now_us.saturating_sub(d.interval_us / 2);
        t.window.record_many(
            at,
            d.ios,
            d.write_ios,
            d.bytes,
            d.latency_us_sum,
            mean,
            excess,
        );
        true
    }

    fn counter(&self, e: &Entity) -> Option<u64> {
        match e {
            Entity::NetPipe(c) => self.clients.get(c).map(|c| c.c.counter),
            Entity::IoPipe(p) => self.ports.get(p).map(|p| p.counter),
            Entity::Drive(d) => self.drives.get(d).map(|d| d.c.counter),
        }
    }

    /// Registers an event for `client`.
    pub fn subscribe(
        &mut self,
        now_us: u64,
        client: &str,
        sub: Subscription,
    ) -> Result<(), ViewError> {
        let c = self.client_mut(client, now_us)?;
        if c.subscriptions.iter().any(|(s, _)| *s == sub) {
            return Ok(());
        }
        if c.subscriptions.len() >= SUBSCRIPTIONS_PER_CLIENT_MAX {
            return Err(ViewError::TooManySubscriptions {
                client: client.to_owned(),
            });
        }
        c.subscriptions.push((sub, false));
        Ok(())
    }

    /// The epoch of the latest analysis.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The latest bottleneck report.
    pub fn report(&self) -> &BottleneckReport {
        &self.report
    }

    /// Runs an epoch when one is due: folds EWMAs, decides which drives
    /// are congested, runs Algorithm 1, drops silent clients, and returns
    /// the subscriptions that changed state. `None` when no epoch was due.
    pub fn poll_epoch(&mut self, now_us: u64) -> Option<Vec<Notification>> {
        // A timer that fires a little early (an eighth of a period) still
        // runs the epoch, rather than skipping a whole period.
        if now_us.saturating_add(self.cfg.epoch_us / 8) < self.next_epoch_us {
            return None;
        }
        self.next_epoch_us = now_us + self.cfg.epoch_us;
        self.epoch += 1;
        let cfg = self.cfg;
        let mut congested = BTreeSet::new();
        let mut congested_ports = BTreeSet::new();
        for (id, d) in &mut self.drives {
            let ewma = d.c.window.fold_ewma(now_us, cfg.ewma_alpha);
            let cur = d.c.window.stats(now_us);
            // The target's own view of the drive, when its agent reports:
            // all I/O (hosts without agents too), without the network.
            let at_target = d.target.as_mut().and_then(|t| {
                let e = t.window.fold_ewma(now_us, cfg.ewma_alpha);
                let s = t.window.stats(now_us);
                (s.ios >= cfg.congestion_ios_min).then_some((s, e))
            });
            let (drive, drive_ewma) = at_target.unwrap_or((cur, ewma));
            d.peak_bytes_per_sec = d.peak_bytes_per_sec.max(drive_ewma.bytes_per_sec);
            let capacity = d.capacity();
            d.headroom = (capacity - drive.bytes_per_sec).max(0.0);
            let by_delay = drive.queue_delay_us_mean >= cfg.queue_delay_us_congested;
            let by_headroom = d.capacity_configured.is_some()
                && d.headroom <= cfg.headroom_share_congested * capacity;
            d.congested = drive.ios >= cfg.congestion_ios_min && (by_delay || by_headroom);
            // The clients wait longer than the target serves: the time goes
            // in the port or the network before it.
            d.path_delay_us = at_target
                .filter(|_| cur.ios >= cfg.congestion_ios_min)
                .map(|(t, _)| cur.latency_us_mean - t.latency_us_mean);
            if d.path_delay_us
                .is_some_and(|p| p >= cfg.queue_delay_us_congested)
            {
                congested_ports.insert(d.port.clone());
            }
            // Load counts against an operator's capacity only: against the
            // peak seen, any drive running at its best so far would look
            // full, idle neighbours included.
            let load = match d.capacity_configured {
                Some(c) if c > 0.0 => cur.bytes_per_sec / c,
                _ => 0.0,
            };
            d.busy = load
                .max(drive.queue_delay_us_mean / cfg.queue_delay_us_congested)
                .clamp(0.0, 1.0);
            if d.congested {
                congested.insert(*id);
            }
            d.volumes.retain(|_, w| !w.is_idle(now_us));
            // Unloaded latencies drift up slowly (1/1024 per epoch), so a
            // drive that became slower for good is relearnt in minutes.
            for b in d.baseline_us.iter_mut().filter(|b| **b != u64::MAX) {
                *b = b.saturating_add(*b / 1024 + 1);
            }
            if let Some(t) = d.target.as_mut().filter(|t| t.baseline_us != u64::MAX) {
                t.baseline_us = t.baseline_us.saturating_add(t.baseline_us / 1024 + 1);
            }
        }
        for p in self.ports.values_mut() {
            p.window.fold_ewma(now_us, cfg.ewma_alpha);
        }
        self.clients
            .retain(|_, c| now_us.saturating_sub(c.last_seen_us) < cfg.client_idle_us);
        let mut sessions = BTreeSet::new();
        for (name, c) in &mut self.clients {
            c.c.window.fold_ewma(now_us, cfg.ewma_alpha);
            c.sessions.retain(|_, w| !w.is_idle(now_us));
            for drive in c.sessions.keys() {
                sessions.insert(Session {
                    client: name.clone(),
                    drive: *drive,
                });
            }
        }
        let ports: BTreeMap<u64, String> = self
            .drives
            .iter()
            .map(|(id, d)| (*id, d.port.clone()))
            .collect();
        self.report =
            bottleneck::analyze(self.epoch, &congested, &congested_ports, &ports, &sessions);
        Some(self.fire_subscriptions(now_us))
    }

    fn fire_subscriptions(&mut self, now_us: u64) -> Vec<Notification> {
        let mut fired = Vec::new();
        let names: Vec<String> = self.clients.keys().cloned().collect();
        for name in names {
            let Some(subs) = self.clients.get(&name).map(|c| c.subscriptions.clone()) else {
                continue;
            };
            let mut next = Vec::with_capacity(subs.len());
            for (sub, held) in subs {
                let (drive, holds) = match &sub {
                    Subscription::Congestion { drive } => {
                        (*drive, self.drives.get(drive).is_some_and(|d| d.congested))
                    }
                    Subscription::HeadroomBelow {
                        drive,
                        bytes_per_sec,
                    } => (
                        *drive,
                        self.drives
                            .get(drive)
                            .is_some_and(|d| d.capacity() > 0.0 && d.headroom < *bytes_per_sec),
                    ),
                };
                if holds != held {
                    if let Some(view) = self.entity_view(&Entity::Drive(drive), now_us) {
                        fired.push(Notification {
                            client: name.clone(),
                            subscription: sub.clone(),
                            holds,
                            view,
                        });
                    }
                }
                next.push((sub, holds));
            }
            if let Some(c) = self.clients.get_mut(&name) {
                c.subscriptions = next;
            }
        }
        fired
    }

    /// The view of one entity, or `None` when the view does not know it.
    pub fn entity_view(&self, e: &Entity, now_us: u64) -> Option<EntityView> {
        let plain = |c: &Counted| EntityView {
            entity: e.clone(),
            counter: c.counter,
            stats: c.window.stats(now_us),
            ewma: c.window.ewma(),
            capacity_bytes_per_sec: 0.0,
            headroom_bytes_per_sec: 0.0,
            busy_degree: 0.0,
            congested: false,
            target: None,
            path_delay_us: None,
            volumes: Vec::new(),
            untracked: Untracked::default(),
        };
        match e {
            Entity::NetPipe(c) => self.clients.get(c).map(|c| EntityView {
                congested: self.report.congested_net_pipes.contains(&e_name(e)),
                ..plain(&c.c)
            }),
            Entity::IoPipe(p) => self.ports.get(p).map(|p| EntityView {
                congested: self.report.congested_io_pipes.contains(&e_name(e)),
                ..plain(p)
            }),
            Entity::Drive(d) => self.drives.get(d).map(|d| EntityView {
                capacity_bytes_per_sec: d.capacity(),
                headroom_bytes_per_sec: d.headroom,
                busy_degree: d.busy,
                congested: d.congested,
                target: d.target.as_ref().map(|t| t.window.stats(now_us)),
                path_delay_us: d.path_delay_us,
                volumes: {
                    let mut v = d.volume_loads(now_us);
                    v.truncate(VOLUMES_IN_VIEW_MAX);
                    v
                },
                untracked: d.untracked,
                ..plain(&d.c)
            }),
        }
    }

    /// `volume`'s share of `drive`'s work in the window (0..=1), or `None`
    /// when the drive is unknown or did no work.
    pub fn volume_share(&self, drive: u64, volume: u64, now_us: u64) -> Option<f64> {
        let d = self.drives.get(&drive)?;
        let all = d.c.window.stats(now_us);
        if all.ios == 0 {
            return None;
        }
        let share = d
            .volumes
            .get(&volume)
            .map_or(0.0, |w| share_of(&w.stats(now_us), &all));
        Some(share)
    }

    /// PULL: the named entities (those the view does not know are left
    /// out) with the latest report.
    pub fn query(&self, entities: &[Entity], now_us: u64) -> Result<ViewSnapshot, ViewError> {
        if entities.len() > QUERY_ENTITIES_MAX {
            return Err(ViewError::QueryTooLarge {
                got: entities.len(),
            });
        }
        Ok(ViewSnapshot {
            epoch: self.epoch,
            entities: entities
                .iter()
                .filter_map(|e| self.entity_view(e, now_us))
                .collect(),
            report: self.report.clone(),
        })
    }

    /// PUSH: the part of the view `client` touches (its NetPipe, the drives
    /// of its sessions and their ports), with the latest report.
    pub fn snapshot_for(&self, client: &str, now_us: u64) -> ViewSnapshot {
        let mut entities = vec![Entity::NetPipe(client.to_owned())];
        if let Some(c) = self.clients.get(client) {
            let mut ports = BTreeSet::new();
            for d in c.sessions.keys() {
                entities.push(Entity::Drive(*d));
                if let Some(ds) = self.drives.get(d) {
                    ports.insert(ds.port.clone());
                }
            }
            entities.extend(ports.into_iter().map(Entity::IoPipe));
        }
        ViewSnapshot {
            epoch: self.epoch,
            entities: entities
                .iter()
                .filter_map(|e| self.entity_view(e, now_us))
                .collect(),
            report: self.report.clone(),
        }
    }

    /// The whole view: every entity, for the API and `sluice top`.
    pub fn snapshot_all(&self, now_us: u64) -> ViewSnapshot {
        let entities: Vec<Entity> = self
            .clients
            .keys()
            .map(|c| Entity::NetPipe(c.clone()))
            .chain(self.ports.keys().map(|p| Entity::IoPipe(p.clone())))
            .chain(self.drives.keys().map(|d| Entity::Drive(*d)))
            .collect();
        ViewSnapshot {
            epoch: self.epoch,
            entities: entities
                .iter()
                .filter_map(|e| self.entity_view(e, now_us))
                .collect(),
            report: self.report.clone(),
        }
    }

    /// What each drive's samples showed since the last call (the bandwidth
    /// auction's signal), and starts counting anew.
    pub fn take_drive_signals(
        &mut self,
        now_us: u64,
    ) -> BTreeMap<u64, crate::auction::DriveSignal> {
        let span = self.cfg.window_us;
        self.drives
            .iter_mut()
            .map(|(id, d)| {
                let t = std::mem::take(&mut d.since_take);
                // The slowest unloaded latency among the sizes used within
                // the window.
                let base_us_max = d
                    .baseline_us
                    .iter()
                    .zip(&d.class_seen_us)
                    .filter(|(b, seen)| **b != u64::MAX && now_us.saturating_sub(**seen) < span)
                    .map(|(b, _)| *b)
                    .max()
                    .unwrap_or(1);
                #[allow(clippy::cast_precision_loss)]
                let delay = if t.ios == 0 {
                    0.0
                } else {
                    t.excess_us as f64 / t.ios as f64
                };
                // Each session's mean, where it has samples enough; the
                // drive's figure is the worst-off one's, sessions of no
                // volume included.
                let mut worst = 0.0f64;
                let mut by_session: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
                for (client, volumes) in t.contention {
                    let mut means = BTreeMap::new();
                    for (volume, (n, sum)) in volumes {
                        if n < CONTENTION_SAMPLES_MIN {
                            continue;
                        }
                        #[allow(clippy::cast_precision_loss)]
                        let mean = sum / n as f64;
                        worst = worst.max(mean);
                        if let Some(v) = volume {
                            means.insert(v, mean);
                        }
                    }
                    if !means.is_empty() {
                        by_session.insert(client, means);
                    }
                }
                #[allow(clippy::cast_precision_loss)]
                let signal = crate::auction::DriveSignal {
                    ios: t.ios,
                    bytes: t.bytes,
                    queue_delay_us_mean: delay,
                    inflation_mean: delay / base_us_max.max(1) as f64,
                    contention_mean: worst,
                    contention_by_session: by_session,
                };
                (*id, signal)
            })
            .collect()
    }

    /// Busy degree (0..=1) per drive, for placement.
    pub fn busy_degrees(&self) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.drives.iter().map(|(id, d)| (*id, d.busy))
    }

    /// Clients in the directory.
    pub fn clients(&self) -> impl Iterator<Item = &str> {
        self.clients.keys().map(String::as_str)
    }
}

fn e_name(e: &Entity) -> String {
    match e {
        Entity::NetPipe(s) | Entity::IoPipe(s) => s.clone(),
        Entity::Drive(d) => d.to_string(),
    }
}

/// One namespace's cumulative counters at a target, as its agent reads
/// them (the target's own I/O accounting: every host's I/O, timed from
/// arrival at the target to completion).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetCounters {
    pub nqn: String,
    pub nsid: u32,
    pub ios: u64,
    pub write_ios: u64,
    pub bytes: u64,
    pub latency_us_sum: u64,
}

/// One namespace's I/O over an interval.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetDelta {
    pub nqn: String,
    pub nsid: u32,
    pub interval_us: u64,
    pub ios: u64,
    pub write_ios: u64,
    pub bytes: u64,
    pub latency_us_sum: u64,
}

/// What a target's agent sends: its port and each namespace's interval.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReport {
    /// The target's port as clients reach it, `HOST:PORT` (an unspecified
    /// host matches drives on any host with that port).
    pub port: String,
    pub namespaces: Vec<TargetDelta>,
}

/// Namespaces one target report may carry, at most.
pub const TARGET_REPORT_NAMESPACES_MAX: usize = 4096;

/// The view agent in a target: turns its cumulative counters into
/// interval reports.
#[derive(Debug)]
pub struct TargetAgent {
    port: String,
    interval_us: u64,
    last: HashMap<(String, u32), TargetCounters>,
    last_us: Option<u64>,
}

impl TargetAgent {
    pub fn new(port: &str, interval_us: u64) -> TargetAgent {
        TargetAgent {
            port: port.to_owned(),
            interval_us: interval_us.max(1),
            last: HashMap::new(),
            last_us: None,
        }
    }

    /// A report when an interval has passed since the last, of the
    /// namespaces that did I/O in it (counters that went back, a target
    /// restarted, start again). The first call only takes a baseline.
    pub fn poll_report(
        &mut self,
        now_us: u64,
        counters: &[TargetCounters],
    ) -> Option<TargetReport> {
        if self
            .last_us
            .is_some_and(|t| now_us.saturating_sub(t) < self.interval_us)
        {
            return None;
        }
        let since = self.last_us.replace(now_us);
        let mut namespaces = Vec::new();
        for c in counters.iter().take(TARGET_REPORT_NAMESPACES_MAX) {
            let key = (c.nqn.clone(), c.nsid);
            let prev = self.last.insert(key, c.clone());
            let (Some(since), Some(prev)) = (since, prev) else {
                continue;
            };
            if c.ios < prev.ios {
                continue;
            }
            let ios = c.ios - prev.ios;
            if ios == 0 {
                continue;
            }
            namespaces.push(TargetDelta {
                nqn: c.nqn.clone(),
                nsid: c.nsid,
                interval_us: now_us.saturating_sub(since),
                ios,
                write_ios: c.write_ios.saturating_sub(prev.write_ios),
                bytes: c.bytes.saturating_sub(prev.bytes),
                latency_us_sum: c.latency_us_sum.saturating_sub(prev.latency_us_sum),
            });
        }
        since.map(|_| TargetReport {
            port: self.port.clone(),
            namespaces,
        })
    }
}

/// Whether a target reporting as `port` serves a drive added as `addr`:
/// the same `HOST:PORT`, or the same port when the target did not say
/// which host it is (it listens on every address).
pub fn port_serves(port: &str, addr: &str) -> bool {
    if port == addr {
        return true;
    }
    let split = |s: &str| {
        s.rsplit_once(':')
            .map(|(h, p)| (h.trim_matches(['[', ']']).to_owned(), p.to_owned()))
    };
    match (split(port), split(addr)) {
        (Some((h, p)), Some((_, q))) => p == q && matches!(h.as_str(), "0.0.0.0" | "::" | ""),
        _ => false,
    }
}

/// Agent-side knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// A batch leaves when it holds this many samples...
    pub batch_samples: usize,
    /// ...or when its oldest sample is this old.
    pub batch_age_us: u64,
    /// Span of the agent's own windows.
    pub window_us: u64,
    /// Samples held while the controller cannot be reached, at most (the
    /// oldest are dropped: telemetry is never worth unbounded memory).
    pub pending_max: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            batch_samples: 512,
            batch_age_us: 10_000,
            window_us: 1_000_000,
            pending_max: 4 * BATCH_SAMPLES_MAX,
        }
    }
}

/// The view agent in a volume client: its own samples, its copy of the
/// part of the view it uses, and the latest report.
#[derive(Debug)]
pub struct ViewAgent {
    client: String,
    cfg: AgentConfig,
    pending: VecDeque<IoSample>,
    dropped: u64,
    local: HashMap<u64, Window>,
    /// The same, reads only: what choosing a replica to read compares. A
    /// large write's latency says nothing about how fast a drive reads.
    local_reads: HashMap<u64, Window>,
    held: HashMap<Entity, EntityView>,
    counters: HashMap<Entity, u64>,
    stale: BTreeSet<Entity>,
    report: BottleneckReport,
    victims: BTreeSet<u64>,
}

impl ViewAgent {
    pub fn new(client: &str, cfg: AgentConfig) -> ViewAgent {
        ViewAgent {
            client: client.to_owned(),
            cfg: AgentConfig {
                batch_samples: cfg.batch_samples.clamp(1, BATCH_SAMPLES_MAX),
                pending_max: cfg.pending_max.max(BATCH_SAMPLES_MAX),
                ..cfg
            },
            pending: VecDeque::new(),
            dropped: 0,
            local: HashMap::new(),
            local_reads: HashMap::new(),
            held: HashMap::new(),
            counters: HashMap::new(),
            stale: BTreeSet::new(),
            report: BottleneckReport::default(),
            victims: BTreeSet::new(),
        }
    }

    pub fn client(&self) -> &str {
        &self.client
    }

    /// Records one completed I/O.
    pub fn record(&mut self, s: IoSample) {
        let span = self.cfg.window_us;
        let (bytes, latency) = (u64::from(s.bytes), u64::from(s.latency_us));
        self.local
            .entry(s.drive)
            .or_insert_with(|| Window::new(span))
            .record(s.at_us, bytes, latency, 0, s.write);
        if !s.write {
            self.local_reads
                .entry(s.drive)
                .or_insert_with(|| Window::new(span))
                .record(s.at_us, bytes, latency, 0, false);
        }
        if self.pending.len() >= self.cfg.pending_max {
            self.pending.pop_front();
            self.dropped += 1;
        }
        self.pending.push_back(s);
    }

    /// Samples dropped because the controller could not take them.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The next batch, when one is due (full, or its oldest sample old
    /// enough).
    pub fn poll_batch(&mut self, now_us: u64) -> Option<SampleBatch> {
        let oldest = self.pending.front()?.at_us;
        if self.pending.len() < self.cfg.batch_samples
            && now_us.saturating_sub(oldest) < self.cfg.batch_age_us
        {
            return None;
        }
        let n = self.pending.len().min(BATCH_SAMPLES_MAX);
        Some(SampleBatch {
            client: self.client.clone(),
            sent_at_us: now_us,
            samples: self.pending.drain(..n).collect(),
        })
    }

    /// Whatever samples wait, as a batch (possibly empty): a bid for
    /// bandwidth takes them along.
    pub fn flush_batch(&mut self, now_us: u64) -> SampleBatch {
        let n = self.pending.len().min(BATCH_SAMPLES_MAX);
        SampleBatch {
            client: self.client.clone(),
            sent_at_us: now_us,
            samples: self.pending.drain(..n).collect(),
        }
    }

    /// A batch could not be delivered: its samples go back, oldest first.
    pub fn handle_undelivered(&mut self, batch: SampleBatch) {
        for s in batch.samples.into_iter().rev() {
            if self.pending.len() >= self.cfg.pending_max {
                self.dropped += 1;
                continue;
            }
            self.pending.push_front(s);
        }
    }

    /// Takes the controller's acknowledgement: an entity whose counter
    /// moved by more than this batch's samples was changed by other
    /// clients too, so the copy held is stale (§3.4). Returns how many
    /// entities became stale.
    pub fn handle_ack(&mut self, ack: &Ack) -> usize {
        let mut stale = 0;
        for (e, counter, applied) in &ack.counters {
            let held = self.counters.get(e).copied();
            let current = held.is_some_and(|h| counter.saturating_sub(h) == *applied)
                && self.held.contains_key(e);
            if !current && self.stale.insert(e.clone()) {
                stale += 1;
            }
            self.counters.insert(e.clone(), *counter);
        }
        if ack.epoch > self.report.epoch {
            // A newer report exists: pull it with the stale entities.
            self.stale.insert(Entity::NetPipe(self.client.clone()));
        }
        stale
    }

    /// The entities to PULL, if any are stale.
    pub fn poll_pull(&mut self) -> Option<Vec<Entity>> {
        if self.stale.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.stale).into_iter().collect())
    }

    /// Takes a PUSH or a PULL answer. Entries older than the copy held
    /// (a lower counter) are ignored; so is an older report.
    pub fn handle_snapshot(&mut self, snap: ViewSnapshot) {
        for v in snap.entities {
            let newer = self
                .held
                .get(&v.entity)
                .is_none_or(|h| v.counter >= h.counter);
            if newer {
                self.counters.insert(v.entity.clone(), v.counter);
                self.stale.remove(&v.entity);
                self.held.insert(v.entity.clone(), v);
            }
        }
        if snap.report.epoch >= self.report.epoch {
            self.victims = snap
                .report
                .victims
                .iter()
                .filter(|(s, _)| s.client == self.client)
                .map(|(s, _)| s.drive)
                .collect();
            self.report = snap.report;
        }
    }

    /// The view of `e` as held locally (no round trip).
    pub fn query(&self, e: &Entity) -> Option<&EntityView> {
        self.held.get(e)
    }

    /// Every entity view held locally.
    pub fn held(&self) -> impl Iterator<Item = &EntityView> {
        self.held.values()
    }

    /// The latest report this agent has.
    pub fn report(&self) -> &BottleneckReport {
        &self.report
    }

    /// Whether this client's session to `drive` is a victim in the latest
    /// report.
    pub fn is_victim(&self, drive: u64) -> bool {
        self.victims.contains(&drive)
    }

    /// This client's own window of its I/O to `drive`.
    pub fn local_stats(&self, drive: u64, now_us: u64) -> Option<WindowStats> {
        self.local.get(&drive).map(|w| w.stats(now_us))
    }

    /// This client's own window of its reads from `drive`.
    pub fn local_read_stats(&self, drive: u64, now_us: u64) -> Option<WindowStats> {
        self.local_reads.get(&drive).map(|w| w.stats(now_us))
    }

    /// Samples waiting to be sent.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bottleneck::Bound;

    fn sample(drive: u64, bytes: u32, latency_us: u32, at_us: u64) -> IoSample {
        IoSample {
            drive,
            volume: None,
            write: false,
            bytes,
            latency_us,
            at_us,
        }
    }

    fn controller() -> ViewController {
        let mut c = ViewController::new(ViewControllerConfig::default()).expect("config");
        c.set_drive(1, "10.0.0.1:4420", None).expect("drive");
        c.set_drive(2, "10.0.0.1:4420", None).expect("drive");
        c.set_drive(3, "10.0.0.2:4420", None).expect("drive");
        c
    }

    fn batch(client: &str, sent_at_us: u64, samples: Vec<IoSample>) -> SampleBatch {
        SampleBatch {
            client: client.into(),
            sent_at_us,
            samples,
        }
    }

    fn of_volume(volume: u64, mut s: IoSample) -> IoSample {
        s.volume = Some(volume);
        s
    }

    #[test]
    fn a_drive_view_names_the_volumes_that_load_it_heaviest_first() {
        let mut c = controller();
        let mut samples = Vec::new();
        for i in 0..30 {
            // Volume 7 moves 128 KiB at a time, volume 9 4 KiB; samples of
            // no volume (a rebuild's copies) count for the drive only.
            samples.push(of_volume(7, sample(1, 128 << 10, 500, 1_000 + i)));
            samples.push(of_volume(9, sample(1, 4096, 100, 1_000 + i)));
            samples.push(sample(1, 4096, 100, 1_000 + i));
        }
        samples.push(of_volume(9, sample(2, 4096, 100, 1_000)));
        c.handle_batch(2_000, &batch("a", 2_000, samples))
            .expect("batch");
        let v = c.entity_view(&Entity::Drive(1), 2_000).expect("drive 1");
        let ids: Vec<u64> = v.volumes.iter().map(|l| l.volume).collect();
        assert_eq!(ids, vec![7, 9], "{v:?}");
        let total = f64::from(30 * ((128 << 10) + 4096 + 4096));
        assert!((v.volumes[0].share - f64::from(30 * (128 << 10)) / total).abs() < 1e-9);
        assert!((v.volumes[1].share - f64::from(30 * 4096) / total).abs() < 1e-9);
        assert_eq!(v.volumes[0].stats.ios, 30);
        let d2 = c.entity_view(&Entity::Drive(2), 2_000).expect("drive 2");
        assert_eq!(d2.volumes.len(), 1);
        assert!((d2.volumes[0].share - 1.0).abs() < 1e-9, "{d2:?}");
        assert_eq!(c.volume_share(1, 9, 2_000), Some(v.volumes[1].share));
        assert_eq!(
            c.volume_share(1, 42, 2_000),
            Some(0.0),
            "a volume never seen"
        );
        assert_eq!(
            c.volume_share(3, 7, 2_000),
            None,
            "a drive that did nothing"
        );
        // Other entities list no volumes.
        let n = c
            .entity_view(&Entity::NetPipe("a".into()), 2_000)
            .expect("netpipe");
        assert!(n.volumes.is_empty());
    }

    #[test]
    fn a_drive_tracks_a_bounded_number_of_volumes_and_forgets_idle_ones() {
        let mut c = controller();
        let n = u64::try_from(VOLUMES_PER_DRIVE_MAX).expect("fits") + 10;
        let samples: Vec<IoSample> = (1..=n)
            .map(|v| of_volume(v - 1, sample(1, 4096, 100, 1_000)))
            .collect();
        for chunk in samples.chunks(BATCH_SAMPLES_MAX) {
            c.handle_batch(2_000, &batch("a", 2_000, chunk.to_vec()))
                .expect("batch");
        }
        let v = c.entity_view(&Entity::Drive(1), 2_000).expect("drive 1");
        assert_eq!(v.stats.ios, n, "every sample counts for the drive");
        assert_eq!(v.volumes.len(), VOLUMES_IN_VIEW_MAX);
        assert_eq!(
            v.untracked.volume_samples, 10,
            "the samples of the 10 volumes past the limit are counted"
        );
        assert_eq!(
            c.volume_share(1, n - 1, 2_000),
            Some(0.0),
            "a volume past the limit is not tracked"
        );
        // A window later nobody has done I/O: the epoch forgets them all,
        // and a new volume is tracked again.
        let later = 2_000 + 3 * ViewControllerConfig::default().window_us;
        c.poll_epoch(later).expect("epoch due");
        c.handle_batch(
            later,
            &batch(
                "a",
                later,
                vec![of_volume(n - 1, sample(1, 4096, 100, later))],
            ),
        )
        .expect("batch");
        assert_eq!(c.volume_share(1, n - 1, later), Some(1.0));
    }

    #[test]
    fn a_batch_updates_every_entity_it_traversed_and_the_ack_carries_their_counters() {
        let mut c = controller();
        let ack = c
            .handle_batch(
                1000,
                &batch(
                    "a",
                    1000,
                    vec![sample(1, 4096, 100, 900), sample(3, 4096, 100, 950)],
                ),
            )
            .expect("batch");
        let get = |e: Entity| {
            ack.counters
                .iter()
                .find(|(x, _, _)| *x == e)
                .map(|(_, c, n)| (*c, *n))
        };
        assert_eq!(get(Entity::Drive(1)), Some((1, 1)));
        assert_eq!(get(Entity::Drive(3)), Some((1, 1)));
        assert_eq!(get(Entity::IoPipe("10.0.0.1:4420".into())), Some((1, 1)));
        assert_eq!(get(Entity::NetPipe("a".into())), Some((2, 2)));
        assert_eq!(get(Entity::Drive(2)), None);
    }

    fn delta(ios: u64, latency_us_each: u64, interval_us: u64) -> TargetDelta {
        TargetDelta {
            nqn: "nqn.x".into(),
            nsid: 1,
            interval_us,
            ios,
            write_ios: 0,
            bytes: ios * 4096,
            latency_us_sum: ios * latency_us_each,
        }
    }

    #[test]
    fn a_target_agent_reports_intervals_of_its_counters() {
        let mut a = TargetAgent::new("0.0.0.0:4420", 100_000);
        let c = |ios: u64| TargetCounters {
            nqn: "nqn.x".into(),
            nsid: 1,
            ios,
            write_ios: ios / 2,
            bytes: ios * 4096,
            latency_us_sum: ios * 90,
        };
        assert!(
            a.poll_report(0, &[c(10)]).is_none(),
            "the first call takes a baseline"
        );
        assert!(
            a.poll_report(50_000, &[c(20)]).is_none(),
            "not an interval yet"
        );
        let r = a.poll_report(100_000, &[c(110)]).expect("a report");
        assert_eq!(r.port, "0.0.0.0:4420");
        assert_eq!(r.namespaces.len(), 1);
        let d = &r.namespaces[0];
        assert_eq!(
            (d.ios, d.write_ios, d.bytes, d.latency_us_sum),
            (100, 50, 409_600, 9000)
        );
        assert_eq!(d.interval_us, 100_000);
        // Counters that went back (the target restarted): nothing this time.
        let r = a.poll_report(200_000, &[c(5)]).expect("a report");
        assert!(r.namespaces.is_empty());
        assert!(port_serves("0.0.0.0:4420", "10.1.2.3:4420"));
        assert!(port_serves("[::]:4420", "10.1.2.3:4420"));
        assert!(port_serves("10.1.2.3:4420", "10.1.2.3:4420"));
        assert!(!port_serves("10.1.2.4:4420", "10.1.2.3:4420"));
        assert!(!port_serves("0.0.0.0:4421", "10.1.2.3:4420"));
    }

    #[test]
    fn a_targets_counters_show_the_drive_and_the_path_to_it() {
        let cfg = ViewControllerConfig {
            congestion_ios_min: 8,
            ..ViewControllerConfig::default()
        };
        let mut c = ViewController::new(cfg).expect("config");
        c.set_drive(1, "t1:4420", None).expect("drive");
        c.set_drive(2, "t1:4420", None).expect("drive");
        assert!(
            !c.handle_target(0, 9, &delta(10, 100, 100_000)),
            "unknown drive"
        );
        // Drive 1: unloaded at 100 us at the target, then queueing 3 ms
        // there (other hosts' I/O the clients' agents never saw).
        c.handle_target(100_000, 1, &delta(50, 100, 100_000));
        c.handle_target(200_000, 1, &delta(50, 3_100, 100_000));
        c.poll_epoch(200_000);
        let v = c.entity_view(&Entity::Drive(1), 200_000).expect("drive 1");
        let t = v.target.expect("target side");
        assert_eq!(t.ios, 100);
        assert!((t.queue_delay_us_mean - 1500.0).abs() < 1.0, "{t:?}");
        assert!(v.congested, "the target's own counters show the queue");
        assert!(c.report().congested_drives.contains(&1));
        // Drive 2: the target serves it in 100 us, the clients see 2.1 ms:
        // the port (or the network) is where the time goes.
        for i in 0..3u64 {
            c.handle_target(300_000 + i * 100_000, 2, &delta(50, 100, 100_000));
        }
        let samples: Vec<IoSample> = (0..20)
            .map(|i| sample(2, 4096, 2_100, 500_000 + i))
            .collect();
        c.handle_batch(500_000, &batch("a", 500_000, samples))
            .expect("batch");
        c.poll_epoch(600_000);
        let v = c.entity_view(&Entity::Drive(2), 600_000).expect("drive 2");
        assert!(v.path_delay_us.is_some_and(|p| p > 1900.0), "{v:?}");
        assert!(!v.congested, "the drive itself is fine");
        let r = c.report();
        assert!(r.congested_io_pipes.contains(&"t1:4420".to_owned()));
        assert!(r.victims.iter().any(|(s, b)| s.client == "a"
            && s.drive == 2
            && *b == Bound::IoPipe("t1:4420".into())));
    }

    #[test]
    fn the_auctions_signal_counts_waits_in_units_of_the_slowest_size_in_use() {
        let mut c = controller();
        // Unloaded: 4 KiB in 100 us, 128 KiB in 1000 us.
        let unloaded = vec![sample(1, 4096, 100, 0), sample(1, 128 << 10, 1000, 0)];
        c.handle_batch(10, &batch("a", 10, unloaded))
            .expect("batch");
        c.take_drive_signals(10);
        // Then 4 KiB reads that waited 2 ms each: two of the slowest I/O.
        let waited: Vec<IoSample> = (0..10).map(|i| sample(1, 4096, 2100, 20 + i)).collect();
        c.handle_batch(40, &batch("a", 40, waited)).expect("batch");
        let s = c.take_drive_signals(40);
        let d1 = s.get(&1).expect("drive 1");
        assert_eq!((d1.ios, d1.bytes), (10, 40_960));
        assert!((d1.queue_delay_us_mean - 2000.0).abs() < 1e-9, "{d1:?}");
        assert!((d1.inflation_mean - 2.0).abs() < 1e-9, "{d1:?}");
        // Taken: the next call starts from nothing.
        assert_eq!(c.take_drive_signals(50).get(&1).map(|d| d.ios), Some(0));
        // A size unused for a whole window no longer sets the unit.
        let late = vec![sample(1, 4096, 300, 2_000_000)];
        c.handle_batch(2_000_000, &batch("a", 2_000_000, late))
            .expect("batch");
        let s = c.take_drive_signals(2_000_000);
        let d1 = s.get(&1).expect("drive 1");
        assert!(
            d1.inflation_mean > 1.5,
            "in units of the 4 KiB read now: {d1:?}"
        );
    }

    #[test]
    fn the_auctions_signal_measures_contention_per_session() {
        let mut c = controller();
        let at = |drive, volume, latency_us, at_us| IoSample {
            volume,
            ..sample(drive, 4096, latency_us, at_us)
        };
        // The unloaded 4 KiB read takes 100 us.
        c.handle_batch(10, &batch("a", 10, vec![at(1, Some(7), 100, 0)]))
            .expect("batch");
        c.take_drive_signals(10);
        // Client a's volume 7 waits 300 us more than that on every read, its
        // volume 8 does not wait; client b waits but sends too few samples
        // to count; samples of no volume are a session of their own, which
        // counts for the drive's figure only.
        let mut samples: Vec<IoSample> = (0..8).map(|i| at(1, Some(7), 400, 20 + i)).collect();
        samples.extend((0..8).map(|i| at(1, Some(8), 100, 20 + i)));
        samples.extend((0..4).map(|i| at(1, None, 700, 20 + i)));
        c.handle_batch(40, &batch("a", 40, samples)).expect("batch");
        let few: Vec<IoSample> = (0..2).map(|i| at(1, Some(7), 5000, 20 + i)).collect();
        c.handle_batch(40, &batch("b", 40, few)).expect("batch");
        let s = c.take_drive_signals(40);
        let d1 = s.get(&1).expect("drive 1");
        assert!((d1.session_contention("a", 7) - 3.0).abs() < 1e-9, "{d1:?}");
        assert!(d1.session_contention("a", 8).abs() < 1e-9, "{d1:?}");
        assert!(d1.session_contention("b", 7).abs() < 1e-9, "{d1:?}");
        let listed: Vec<(&str, Vec<u64>)> = d1
            .contention_by_session
            .iter()
            .map(|(c, v)| (c.as_str(), v.keys().copied().collect()))
            .collect();
        assert_eq!(listed, [("a", vec![7, 8])], "{d1:?}");
        // The drive's figure is the worst-off session's: here the one of
        // no volume.
        assert!((d1.contention_mean - 6.0).abs() < 1e-9, "{d1:?}");
        // A drive keeps a bounded number of sessions an epoch; the rest
        // count for the drive only.
        let n = u64::try_from(SESSIONS_PER_DRIVE_MAX).expect("fits") + 10;
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let samples: Vec<IoSample> = chunk
                .iter()
                .flat_map(|v| (0..4).map(move |i| at(1, Some(*v), 400, 100 + i)))
                .collect();
            c.handle_batch(200, &batch("a", 200, samples))
                .expect("batch");
        }
        let s = c.take_drive_signals(200);
        let d1 = s.get(&1).expect("drive 1");
        assert_eq!(d1.ios, 4 * n);
        let listed: usize = d1.contention_by_session.values().map(BTreeMap::len).sum();
        assert_eq!(listed, SESSIONS_PER_DRIVE_MAX);
        let v = c.entity_view(&Entity::Drive(1), 200).expect("drive 1");
        assert_eq!(
            v.untracked.session_samples,
            4 * 10,
            "the 10 sessions past the limit, 4 samples each, are counted"
        );
    }

    #[test]
    fn an_agent_learns_its_copy_is_stale_when_another_client_moved_a_counter() {
        let mut c = controller();
        let mut a = ViewAgent::new("a", AgentConfig::default());
        // First contact: nothing held, so everything touched is stale.
        a.record(sample(1, 4096, 100, 10));
        let b = a.poll_batch(1_000_000).expect("due");
        let ack = c.handle_batch(1_000_000, &b).expect("batch");
        assert!(a.handle_ack(&ack) > 0);
        let pull = a.poll_pull().expect("stale");
        a.handle_snapshot(c.query(&pull, 1_000_000).expect("query"));
        assert!(a.query(&Entity::Drive(1)).is_some());
        // Only a's I/O since: its copy stays current.
        a.record(sample(1, 4096, 100, 1_000_010));
        let ack = c
            .handle_batch(1_020_020, &a.poll_batch(1_020_020).expect("due"))
            .expect("batch");
        assert_eq!(ack.counters.len(), 3, "{ack:?}");
        a.handle_ack(&ack);
        assert_eq!(a.poll_pull(), None);
        // b writes to drive 1: a's next ack shows the counter jumped.
        c.handle_batch(
            1_020_030,
            &batch("b", 1_020_030, vec![sample(1, 4096, 100, 1_020_030)]),
        )
        .expect("batch");
        a.record(sample(1, 4096, 100, 1_020_040));
        let ack = c
            .handle_batch(1_040_050, &a.poll_batch(1_040_050).expect("due"))
            .expect("batch");
        a.handle_ack(&ack);
        let pull = a.poll_pull().expect("stale after b's write");
        assert!(pull.contains(&Entity::Drive(1)));
        assert!(!pull.contains(&Entity::Drive(3)));
    }

    #[test]
    fn batches_leave_when_full_or_old() {
        let mut a = ViewAgent::new(
            "a",
            AgentConfig {
                batch_samples: 3,
                batch_age_us: 100,
                ..AgentConfig::default()
            },
        );
        assert!(a.poll_batch(0).is_none());
        a.record(sample(1, 512, 1, 10));
        assert!(a.poll_batch(50).is_none());
        assert_eq!(a.poll_batch(110).map(|b| b.samples.len()), Some(1));
        for i in 0..3 {
            a.record(sample(1, 512, 1, 200 + i));
        }
        assert_eq!(a.poll_batch(201).map(|b| b.samples.len()), Some(3));
        // Undelivered samples come back, bounded.
        a.record(sample(1, 512, 1, 300));
        let b = a.poll_batch(1000).expect("due");
        a.handle_undelivered(b);
        assert_eq!(a.pending(), 1);
    }

    /// Feeds `n` samples per millisecond to `drive` for `ms` milliseconds.
    fn load(
        c: &mut ViewController,
        client: &str,
        drive: u64,
        bytes: u32,
        lat: u32,
        ms: u64,
        from_us: u64,
    ) {
        for t in 0..ms {
            let at = from_us + t * 1000;
            let samples = (0..4).map(|_| sample(drive, bytes, lat, at)).collect();
            c.handle_batch(at, &batch(client, at, samples))
                .expect("batch");
        }
    }

    #[test]
    fn a_drive_with_queueing_delay_is_congested_and_its_sessions_and_pipes_become_victims() {
        let mut c = controller();
        // Unloaded: 4 KiB reads in 100 us on every drive.
        load(&mut c, "a", 1, 4096, 100, 50, 0);
        load(&mut c, "a", 3, 4096, 100, 50, 0);
        load(&mut c, "b", 2, 4096, 100, 50, 0);
        c.poll_epoch(50_000).expect("epoch due");
        assert!(c.report().victims.is_empty(), "{:?}", c.report());
        // Now drive 1 answers in 3 ms.
        load(&mut c, "a", 1, 4096, 3000, 900, 60_000);
        load(&mut c, "a", 3, 4096, 100, 900, 60_000);
        c.poll_epoch(1_000_000).expect("epoch due");
        let r = c.report().clone();
        assert_eq!(r.congested_drives, vec![1]);
        assert_eq!(r.congested_io_pipes, vec!["10.0.0.1:4420".to_owned()]);
        assert_eq!(r.congested_net_pipes, vec!["a".to_owned()]);
        assert!(r.is_victim("a", 1) && r.is_victim("a", 3));
        assert!(
            !r.is_victim("b", 2),
            "b's session has aged out or is unaffected"
        );
        let d1 = c.entity_view(&Entity::Drive(1), 1_000_000).expect("known");
        assert!(d1.congested && d1.busy_degree > 0.9, "{d1:?}");
        let d3 = c.entity_view(&Entity::Drive(3), 1_000_000).expect("known");
        assert!(!d3.congested, "{d3:?}");
        // The agent learns it from a PUSH.
        let mut a = ViewAgent::new("a", AgentConfig::default());
        a.handle_snapshot(c.snapshot_for("a", 1_000_000));
        assert!(a.is_victim(1) && a.is_victim(3));
        assert!(a.query(&Entity::Drive(1)).is_some_and(|v| v.congested));
    }

    #[test]
    fn a_configured_capacity_sets_headroom_and_congestion_and_subscriptions_fire_on_change() {
        let mut c = ViewController::new(ViewControllerConfig::default()).expect("config");
        // 8 MB/s capacity; 4 x 4 KiB per ms is ~16 MB/s: no headroom.
        c.set_drive(1, "t:1", Some(8e6)).expect("drive");
        c.subscribe(0, "a", Subscription::Congestion { drive: 1 })
            .expect("sub");
        c.subscribe(
            0,
            "a",
            Subscription::HeadroomBelow {
                drive: 1,
                bytes_per_sec: 1e6,
            },
        )
        .expect("sub");
        assert!(c.poll_epoch(0).expect("due").is_empty());
        load(&mut c, "a", 1, 4096, 100, 900, 1000);
        let fired = c.poll_epoch(1_000_000).expect("due");
        assert_eq!(fired.len(), 2, "{fired:?}");
        assert!(fired.iter().all(|n| n.holds && n.client == "a"));
        // Nothing changes: nothing fires.
        assert!(c.poll_epoch(1_100_000).expect("due").is_empty());
        // Two windows later the drive is idle: both fire again, as cleared.
        let fired = c.poll_epoch(3_000_000).expect("due");
        assert_eq!(fired.len(), 2);
        assert!(fired.iter().all(|n| !n.holds));
    }

    #[test]
    fn bad_batches_and_names_are_refused() {
        let mut c = controller();
        let big = vec![sample(1, 512, 1, 0); BATCH_SAMPLES_MAX + 1];
        assert_eq!(
            c.handle_batch(0, &batch("a", 0, big)),
            Err(ViewError::BatchTooLarge {
                got: BATCH_SAMPLES_MAX + 1
            })
        );
        assert!(matches!(
            c.handle_batch(0, &batch("", 0, vec![])),
            Err(ViewError::ClientName(_))
        ));
        let ack = c
            .handle_batch(0, &batch("a", 0, vec![sample(99, 512, 1, 0)]))
            .expect("unknown drives are counted, not fatal");
        assert_eq!(ack.unknown_drive_samples, 1);
        assert!(ViewController::new(ViewControllerConfig {
            epoch_us: 0,
            ..ViewControllerConfig::default()
        })
        .is_err());
    }

    #[test]
    fn size_classes_cover_512_bytes_to_16_mib() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(512), 0);
        assert_eq!(size_class(4096), 3);
        assert_eq!(size_class(128 << 10), 8);
        assert_eq!(size_class(u32::MAX), SIZE_CLASSES - 1);
    }
}
