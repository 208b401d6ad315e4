//! Flint's isolation in `sluice control` (Flint §3, §4.6): the shared
//! [`ViewController`] and bandwidth [`Arbiter`], their epoch tasks, PUSH
//! to watching agents, and their Prometheus metrics and JSON
//! (`--admin-listen`).
//!
//! The view's epoch task, every `epoch_us`: refreshes the drive list from
//! the catalog (once a second), runs the analysis, hands each drive's busy
//! degree to placement (`Catalog::report_busy`: new extents avoid a
//! congested drive, Flint §5.5), and wakes every `WatchView` stream, which
//! then sends its client's part of the view and its fired events.
//!
//! The auction's task, every auction epoch: takes what the view saw of
//! each drive since the last one and runs the auction; once a second it
//! refreshes each volume's weight from its tenant's SLO class. Bids and
//! grants travel on `ViewSync` ([`ViewHub::sync`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use sluice_admin::metrics::{counters, gauge, gauges, Esc};
use sluice_flint::auction::{Bid, Grants};
use sluice_flint::view::{Ack, Notification, SampleBatch, ViewError, ViewSnapshot};
use sluice_flint::{Arbiter, AuctionConfig, Entity, ViewController, ViewControllerConfig};
use sluice_meta::{Catalog, MetaStore};
use sluice_runtime::sync::lock;

/// Epochs between drive-list refreshes from the catalog.
const DRIVE_REFRESH_EPOCHS: u64 = 10;
/// How often the volumes' weights are read again from the catalog.
const WEIGHT_REFRESH: Duration = Duration::from_secs(1);
/// SLO classes, at most.
pub const SLO_CLASSES_MAX: usize = 64;

/// Service classes and their weights in the auction; a tenant is put in
/// one with `sluice tenant set`, and a volume bids with its tenant's
/// class's weight (the default class's when it has none).
#[derive(Clone, Debug, PartialEq)]
pub struct SloClasses {
    classes: BTreeMap<String, f64>,
    default: String,
}

impl Default for SloClasses {
    fn default() -> Self {
        SloClasses {
            classes: [("gold", 4.0), ("silver", 2.0), ("bronze", 1.0)]
                .into_iter()
                .map(|(n, w)| (n.to_owned(), w))
                .collect(),
            default: "bronze".into(),
        }
    }
}

impl SloClasses {
    /// Parses `NAME=WEIGHT[,NAME=WEIGHT...]`; `default` must be one of them.
    pub fn parse(spec: &str, default: &str) -> Result<SloClasses, String> {
        let mut classes = BTreeMap::new();
        for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("SLO class {part:?} is not NAME=WEIGHT"))?;
            let name = name.trim();
            sluice_volume::record::check_slo_class(name)?;
            let w: f64 = weight
                .trim()
                .parse()
                .map_err(|_| format!("SLO class {name}: weight {weight:?} is not a number"))?;
            if !w.is_finite() || !(0.01..=1000.0).contains(&w) {
                return Err(format!(
                    "SLO class {name}: weight {w} must be in 0.01..=1000"
                ));
            }
            if classes.insert(name.to_owned(), w).is_some() {
                return Err(format!("SLO class {name} is given twice"));
            }
        }
        if classes.is_empty() || classes.len() > SLO_CLASSES_MAX {
            return Err(format!(
                "between 1 and {SLO_CLASSES_MAX} SLO classes, got {}",
                classes.len()
            ));
        }
        if !classes.contains_key(default) {
            return Err(format!(
                "the default SLO class {default:?} is not among {:?}",
                classes.keys().collect::<Vec<_>>()
            ));
        }
        Ok(SloClasses {
            classes,
            default: default.to_owned(),
        })
    }

    pub fn weight(&self, class: &str) -> Option<f64> {
        self.classes.get(class).copied()
    }

    pub fn default_class(&self) -> &str {
        &self.default
    }

    pub fn classes(&self) -> impl Iterator<Item = (&str, f64)> {
        self.classes.iter().map(|(n, w)| (n.as_str(), *w))
    }

    /// The weight a volume of `tenant` bids with.
    pub fn weight_of(&self, tenant: Option<&str>, tenants: &BTreeMap<String, String>) -> f64 {
        let class = tenant
            .and_then(|t| tenants.get(t))
            .map_or(self.default.as_str(), String::as_str);
        self.weight(class)
            .or_else(|| self.weight(&self.default))
            .unwrap_or(1.0)
    }
}

/// One line per drive of the auction's state (for experiments' logs).
pub fn render_auction_brief(a: &crate::pb::AuctionStatusResponse) -> String {
    let mut out = String::new();
    for d in &a.drives {
        let sessions: Vec<String> = a
            .sessions
            .iter()
            .filter(|s| s.drive == d.drive)
            .map(|s| {
                format!(
                    "{}:{:.1}/{:.1}{}c{:.1}",
                    s.client,
                    s.granted_bytes as f64 / 1e6,
                    s.spent_last_bytes as f64 / 1e6,
                    if s.hungry {
                        "h"
                    } else if s.held_back {
                        "b"
                    } else {
                        ""
                    },
                    s.contention_mean
                )
            })
            .collect();
        out.push_str(&format!(
            "auction d{} est {:.0} MB/s done {:.0} MB/s waits {:.2} contention {:.2} cap {:.0} MB/s | {}\n",
            d.drive,
            d.bytes_per_sec / 1e6,
            d.completed_bytes_per_sec / 1e6,
            d.inflation_mean,
            d.contention_mean,
            d.heavy_cap_bytes_per_sec / 1e6,
            sessions.join(" ")
        ));
    }
    out
}

/// The auction's state for `sluice auction status` and `/v1/auction`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AuctionStatus {
    pub on: bool,
    pub epoch: u64,
    pub epoch_us: u64,
    pub drives: Vec<AuctionDriveStatus>,
    pub sessions: Vec<sluice_flint::auction::SessionView>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct AuctionDriveStatus {
    pub drive: u64,
    pub port: String,
    pub bytes_per_sec: f64,
    pub bytes_per_sec_max: Option<f64>,
    pub slice_bytes: u64,
    pub granted_bytes: u64,
    pub queue_delay_us_mean: f64,
    pub inflation_mean: f64,
    pub contention_mean: f64,
    pub completed_bytes_per_sec: f64,
    pub heavy_cap_bytes_per_sec: f64,
}

/// What matches a target's namespace to a drive.
#[derive(Clone, Debug)]
struct DriveKey {
    id: u64,
    addr: String,
    nqn: String,
    nsid: u32,
}

impl DriveKey {
    fn of(d: &sluice_volume::DriveRecord) -> DriveKey {
        DriveKey {
            id: u64::from(d.id.0),
            addr: d.spec.addr.clone(),
            nqn: d.spec.nqn.clone(),
            nsid: d.spec.nsid,
        }
    }
}

/// The view controller, the arbiter, and what wakes the watchers.
#[derive(Debug)]
pub struct ViewHub {
    controller: Mutex<ViewController>,
    /// The pool's drives by target, namespace and address.
    drive_keys: Mutex<Vec<DriveKey>>,
    arbiter: Mutex<Arbiter>,
    slo: SloClasses,
    origin: Instant,
    /// Each epoch's fired notifications; watchers filter their own.
    epochs: tokio::sync::broadcast::Sender<Arc<Vec<Notification>>>,
    /// A batch named a drive the view does not know: refresh the list at
    /// the next epoch rather than at the next periodic refresh.
    stale_drives: std::sync::atomic::AtomicBool,
    /// Set at shutdown: every PUSH stream ends, so that the server's
    /// graceful shutdown does not wait on them forever.
    closed: tokio::sync::watch::Sender<bool>,
}

impl ViewHub {
    /// A hub with the auction off and the default classes.
    pub fn new(cfg: ViewControllerConfig) -> Result<Arc<ViewHub>, ViewError> {
        Self::with_auction(cfg, AuctionConfig::default(), false, SloClasses::default())
    }

    pub fn with_auction(
        cfg: ViewControllerConfig,
        auction: AuctionConfig,
        auction_on: bool,
        slo: SloClasses,
    ) -> Result<Arc<ViewHub>, ViewError> {
        let (epochs, _) = tokio::sync::broadcast::channel(16);
        let mut arbiter = Arbiter::new(auction).map_err(ViewError::BadConfig)?;
        arbiter.set_on(auction_on);
        Ok(Arc::new(ViewHub {
            controller: Mutex::new(ViewController::new(cfg)?),
            drive_keys: Mutex::new(Vec::new()),
            arbiter: Mutex::new(arbiter),
            slo,
            origin: Instant::now(),
            epochs,
            stale_drives: std::sync::atomic::AtomicBool::new(false),
            closed: tokio::sync::watch::channel(false).0,
        }))
    }

    /// Microseconds on the hub's clock.
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Ends every PUSH stream (the process is shutting down).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Resolves once [`Self::close`] was called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closed.subscribe();
        async move {
            // An error means the hub is gone: closed too.
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// Notes that a batch named drives the view does not know.
    pub fn drives_unknown(&self) {
        self.stale_drives
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `f` on the controller.
    pub fn with<T>(&self, f: impl FnOnce(&mut ViewController) -> T) -> T {
        f(&mut lock(&self.controller))
    }

    /// `volume`'s share of `drive`'s work in the view's window (0..=1), or
    /// `None` when the view has nothing on the drive.
    pub fn volume_share(&self, drive: u64, volume: u64) -> Option<f64> {
        let now = self.now_us();
        self.with(|c| c.volume_share(drive, volume, now))
    }

    /// Runs `f` on the arbiter.
    pub fn with_arbiter<T>(&self, f: impl FnOnce(&mut Arbiter) -> T) -> T {
        f(&mut lock(&self.arbiter))
    }

    pub fn slo(&self) -> &SloClasses {
        &self.slo
    }

    /// A client's `ViewSync`: its samples into the view, its bid into the
    /// auction; the answer carries the counters and its grants.
    pub fn sync(&self, batch: &SampleBatch, bid: &Bid) -> Result<(Ack, Grants), String> {
        let now = self.now_us();
        let ack = self
            .with(|c| c.handle_batch(now, batch))
            .map_err(|e| e.to_string())?;
        let grants = self
            .with_arbiter(|a| a.handle_bid(now, bid))
            .map_err(|e| e.to_string())?;
        Ok((ack, grants))
    }

    /// The auction as the API shows it.
    pub fn auction_status(&self) -> AuctionStatus {
        self.with_arbiter(|a| AuctionStatus {
            on: a.is_on(),
            epoch: a.epoch(),
            epoch_us: a.config().epoch_us,
            drives: a
                .drives()
                .map(|(id, d)| AuctionDriveStatus {
                    drive: id,
                    port: d.port.clone(),
                    bytes_per_sec: d.bytes_per_sec,
                    bytes_per_sec_max: d.bytes_per_sec_max,
                    slice_bytes: d.slice_bytes,
                    granted_bytes: d.granted_bytes,
                    queue_delay_us_mean: d.last.queue_delay_us_mean,
                    inflation_mean: d.last.inflation_mean,
                    contention_mean: d.last.contention_mean,
                    completed_bytes_per_sec: d.completed_bytes_per_sec,
                    heavy_cap_bytes_per_sec: d.heavy_cap_bytes_per_sec,
                })
                .collect(),
            sessions: a.sessions(),
        })
    }

    /// The auction's task: one auction per epoch, weights once a second.
    pub async fn run_auction<S: MetaStore>(self: Arc<Self>, catalog: Arc<Catalog<S>>) {
        let epoch = Duration::from_micros(self.with_arbiter(|a| a.config().epoch_us));
        let mut tick = tokio::time::interval(epoch);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut weights_at: Option<Instant> = None;
        loop {
            tick.tick().await;
            if weights_at.is_none_or(|t| t.elapsed() >= WEIGHT_REFRESH) {
                weights_at = Some(Instant::now());
                self.refresh_weights(&catalog).await;
            }
            let now = self.now_us();
            let signals = self.with(|c| c.take_drive_signals(now));
            self.with_arbiter(|a| a.poll_epoch(now, |d| signals.get(&d).cloned()));
        }
    }

    /// Every volume's weight from its tenant's class.
    pub async fn refresh_weights<S: MetaStore>(&self, catalog: &Catalog<S>) {
        let (volumes, tenants) = match (catalog.volumes().await, catalog.tenants().await) {
            (Ok(v), Ok(t)) => (v, t),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "auction: reading weights failed; keeping the last");
                return;
            }
        };
        let tenants: BTreeMap<String, String> =
            tenants.into_iter().map(|t| (t.name, t.slo_class)).collect();
        self.with_arbiter(|a| {
            for v in &volumes {
                a.set_weight(v.id.0, self.slo.weight_of(v.tenant.as_deref(), &tenants));
            }
        });
    }

    /// A receiver of each epoch's notifications.
    pub fn subscribe_epochs(&self) -> tokio::sync::broadcast::Receiver<Arc<Vec<Notification>>> {
        self.epochs.subscribe()
    }

    /// The whole view now.
    pub fn snapshot_all(&self) -> ViewSnapshot {
        let now = self.now_us();
        self.with(|c| c.snapshot_all(now))
    }

    /// A drive joined the pool: the view and the auction track it.
    pub fn add_drive(&self, d: &sluice_volume::DriveRecord) -> Result<(), ViewError> {
        let id = u64::from(d.id.0);
        lock(&self.drive_keys).push(DriveKey::of(d));
        self.with_arbiter(|a| a.set_drive(id, &d.spec.addr, None));
        self.with(|c| c.set_drive(id, &d.spec.addr, None))
    }

    /// A target's agent reports its namespaces: those that are drives of
    /// the pool go into the view. Returns (drives, unknown namespaces).
    pub fn handle_target_report(&self, r: &sluice_flint::view::TargetReport) -> (u64, u64) {
        let now = self.now_us();
        let keys = lock(&self.drive_keys).clone();
        let (mut known, mut unknown) = (0u64, 0u64);
        self.with(|c| {
            for n in &r.namespaces {
                let drive = keys.iter().find(|k| {
                    k.nqn == n.nqn
                        && k.nsid == n.nsid
                        && sluice_flint::view::port_serves(&r.port, &k.addr)
                });
                match drive {
                    Some(k) if c.handle_target(now, k.id, n) => known += 1,
                    _ => unknown += 1,
                }
            }
        });
        (known, unknown)
    }

    /// Brings the controller's and the arbiter's drives in line with the
    /// catalog's.
    pub async fn refresh_drives<S: MetaStore>(&self, catalog: &Catalog<S>) {
        let drives = match catalog.drives().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "view: listing drives failed; keeping the last list");
                return;
            }
        };
        let keep: BTreeSet<u64> = drives.iter().map(|d| u64::from(d.id.0)).collect();
        *lock(&self.drive_keys) = drives.iter().map(DriveKey::of).collect();
        self.with(|c| {
            c.retain_drives(&keep);
            for d in &drives {
                if let Err(e) = c.set_drive(u64::from(d.id.0), &d.spec.addr, None) {
                    tracing::warn!(drive = %d.id, error = %e, "view: drive not tracked");
                }
            }
        });
        self.with_arbiter(|a| {
            a.retain_drives(&keep);
            for d in &drives {
                a.set_drive(u64::from(d.id.0), &d.spec.addr, None);
            }
        });
    }

    /// The epoch task; runs until the hub is dropped by everyone else.
    pub async fn run_epochs<S: MetaStore>(self: Arc<Self>, catalog: Arc<Catalog<S>>) {
        let epoch = Duration::from_micros(self.with(|c| c.config().epoch_us));
        let mut tick = tokio::time::interval(epoch);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0u64;
        loop {
            tick.tick().await;
            let stale = self
                .stale_drives
                .swap(false, std::sync::atomic::Ordering::Relaxed);
            if stale || n.is_multiple_of(DRIVE_REFRESH_EPOCHS) {
                self.refresh_drives(&catalog).await;
            }
            n += 1;
            let now = self.now_us();
            let (fired, busy) = self.with(|c| {
                let fired = c.poll_epoch(now);
                let busy: Vec<(u64, f64)> = c.busy_degrees().collect();
                (fired, busy)
            });
            let Some(fired) = fired else { continue };
            for (drive, degree) in busy {
                if let Ok(id) = u32::try_from(drive) {
                    catalog.report_busy(sluice_volume::DriveId(id), degree);
                }
            }
            // No watcher is not an error.
            let _ = self.epochs.send(Arc::new(fired));
        }
    }
}

/// The view as Prometheus gauges, read at scrape time.
#[derive(Debug)]
pub struct ViewCollector(pub Arc<ViewHub>);

impl Collector for ViewCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.snapshot_all();
        let e = &mut enc;
        gauge(
            e,
            "sluice_view_epoch",
            "Bottleneck analyses run.",
            None,
            snap.epoch,
        )?;
        let mut drives = Vec::new();
        let mut ports = Vec::new();
        let mut clients = Vec::new();
        for v in &snap.entities {
            match &v.entity {
                Entity::Drive(d) => drives.push((d.to_string(), v)),
                Entity::IoPipe(p) => ports.push((p.clone(), v)),
                Entity::NetPipe(c) => clients.push((c.clone(), v)),
            }
        }
        for (kind, label, list) in [
            ("drive", "drive", &drives),
            ("iopipe", "port", &ports),
            ("netpipe", "client", &clients),
        ] {
            gauges(
                e,
                &format!("sluice_view_{kind}_bytes_per_second"),
                "Throughput over the view's window.",
                None,
                list.iter()
                    .map(|(n, v)| ([(label, Esc(n))], v.stats.bytes_per_sec)),
            )?;
            gauges(
                e,
                &format!("sluice_view_{kind}_iops"),
                "I/Os per second over the view's window.",
                None,
                list.iter().map(|(n, v)| ([(label, Esc(n))], v.stats.iops)),
            )?;
            gauges(
                e,
                &format!("sluice_view_{kind}_latency_us_mean"),
                "Mean I/O latency over the view's window.",
                None,
                list.iter()
                    .map(|(n, v)| ([(label, Esc(n))], v.stats.latency_us_mean)),
            )?;
            gauges(
                e,
                &format!("sluice_view_{kind}_queue_delay_us_mean"),
                "Mean latency above the unloaded latency of each I/O's size.",
                None,
                list.iter()
                    .map(|(n, v)| ([(label, Esc(n))], v.stats.queue_delay_us_mean)),
            )?;
            gauges(
                e,
                &format!("sluice_view_{kind}_congested"),
                "1 when the last analysis found it congested.",
                None,
                list.iter()
                    .map(|(n, v)| ([(label, Esc(n))], u64::from(v.congested))),
            )?;
        }
        gauges(
            e,
            "sluice_view_drive_busy_degree",
            "Busy degree (0..1) that placement weighs.",
            None,
            drives
                .iter()
                .map(|(n, v)| ([("drive", Esc(n))], v.busy_degree)),
        )?;
        gauges(
            e,
            "sluice_view_drive_headroom_bytes_per_second",
            "Capacity (configured, else the peak seen) minus current throughput.",
            None,
            drives
                .iter()
                .map(|(n, v)| ([("drive", Esc(n))], v.headroom_bytes_per_sec)),
        )?;
        counters(
            e,
            "sluice_view_drive_untracked_samples",
            &format!(
                "Samples counted for the drive but not for their volume (past {} volumes) or session (past {} sessions an epoch): nonzero means the per-volume view and the auction's contention miss someone.",
                sluice_flint::view::VOLUMES_PER_DRIVE_MAX,
                sluice_flint::view::SESSIONS_PER_DRIVE_MAX
            ),
            None,
            drives.iter().flat_map(|(n, v)| {
                [
                    ([("drive", Esc(n)), ("limit", Esc("volumes"))], v.untracked.volume_samples),
                    ([("drive", Esc(n)), ("limit", Esc("sessions"))], v.untracked.session_samples),
                ]
            }),
        )?;
        // Who loads each drive: its heaviest volumes (a bounded number per
        // drive, so the label set stays small).
        let loads: Vec<(&String, String, &sluice_flint::view::VolumeLoad)> = drives
            .iter()
            .flat_map(|(n, v)| v.volumes.iter().map(move |l| (n, l.volume.to_string(), l)))
            .collect();
        gauges(
            e,
            "sluice_view_drive_volume_bytes_per_second",
            "A volume's I/O to the drive over the view's window, from every client (the drive's heaviest volumes).",
            None,
            loads
                .iter()
                .map(|(d, v, l)| ([("drive", Esc(d)), ("volume", Esc(v))], l.stats.bytes_per_sec)),
        )?;
        gauges(
            e,
            "sluice_view_drive_volume_iops",
            "A volume's I/Os per second to the drive over the view's window.",
            None,
            loads
                .iter()
                .map(|(d, v, l)| ([("drive", Esc(d)), ("volume", Esc(v))], l.stats.iops)),
        )?;
        gauges(
            e,
            "sluice_view_drive_volume_share",
            "A volume's share (0..1) of the drive's bytes over the view's window.",
            None,
            loads
                .iter()
                .map(|(d, v, l)| ([("drive", Esc(d)), ("volume", Esc(v))], l.share)),
        )?;
        let mut victims: BTreeMap<String, u64> = BTreeMap::new();
        for (s, _) in &snap.report.victims {
            *victims.entry(s.client.clone()).or_default() += 1;
        }
        let (on, epoch, drives_auction, sessions) = self.0.with_arbiter(|a| {
            let d: Vec<(String, f64, u64, f64)> = a
                .drives()
                .map(|(id, d)| {
                    (
                        id.to_string(),
                        d.bytes_per_sec,
                        d.granted_bytes,
                        d.heavy_cap_bytes_per_sec,
                    )
                })
                .collect();
            (a.is_on(), a.epoch(), d, a.sessions())
        });
        gauge(
            e,
            "sluice_auction_on",
            "1 while the bandwidth auction meters the volumes' I/O.",
            None,
            u64::from(on),
        )?;
        gauge(e, "sluice_auction_epoch", "Auctions run.", None, epoch)?;
        gauges(
            e,
            "sluice_auction_drive_estimate_bytes_per_second",
            "The auction's estimate of what the drive can carry.",
            None,
            drives_auction
                .iter()
                .map(|(id, b, _, _)| ([("drive", Esc(id))], *b)),
        )?;
        gauges(
            e,
            "sluice_auction_drive_granted_bytes",
            "Bytes of the drive granted in the current epoch.",
            None,
            drives_auction
                .iter()
                .map(|(id, _, g, _)| ([("drive", Esc(id))], *g)),
        )?;
        gauges(
            e,
            "sluice_auction_drive_heavy_cap_bytes_per_second",
            "The most a session that is not held back may be granted of the drive per second (the contention rule's cap; the estimate when it does not bind).",
            None,
            drives_auction
                .iter()
                .map(|(id, _, _, f)| ([("drive", Esc(id))], *f)),
        )?;
        let mut per_volume: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
        for s in &sessions {
            let v = per_volume.entry(s.volume.to_string()).or_default();
            v.0 += s.granted_bytes;
            v.1 += s.spent_last_bytes;
            v.2 += u64::from(s.hungry);
        }
        gauges(
            e,
            "sluice_auction_volume_granted_bytes",
            "Bytes granted to the volume's sessions in the current epoch.",
            None,
            per_volume.iter().map(|(v, t)| ([("volume", Esc(v))], t.0)),
        )?;
        gauges(
            e,
            "sluice_auction_volume_spent_bytes",
            "Bytes the volume's sessions spent in the last epoch.",
            None,
            per_volume.iter().map(|(v, t)| ([("volume", Esc(v))], t.1)),
        )?;
        gauges(
            e,
            "sluice_auction_volume_hungry_sessions",
            "The volume's sessions that ran out of slices in the last epoch.",
            None,
            per_volume.iter().map(|(v, t)| ([("volume", Esc(v))], t.2)),
        )?;
        gauges(
            e,
            "sluice_view_victim_sessions",
            "Sessions the last analysis found bounded by congestion, per client.",
            None,
            victims.iter().map(|(c, n)| ([("client", Esc(c))], *n)),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_classes_parse_and_weigh_tenants() {
        let c = SloClasses::parse("gold=4, silver=2,bronze=1", "bronze").expect("classes");
        assert_eq!(c.weight("gold"), Some(4.0));
        assert_eq!(c.default_class(), "bronze");
        let tenants: BTreeMap<String, String> = [("a".to_owned(), "gold".to_owned())].into();
        assert_eq!(c.weight_of(Some("a"), &tenants), 4.0);
        // No class named, or a tenant nobody classed: the default.
        assert_eq!(c.weight_of(None, &tenants), 1.0);
        assert_eq!(c.weight_of(Some("b"), &tenants), 1.0);
        // A class this process does not define: the default too.
        let stale: BTreeMap<String, String> = [("a".to_owned(), "platinum".to_owned())].into();
        assert_eq!(c.weight_of(Some("a"), &stale), 1.0);
        for (spec, default, needle) in [
            ("gold", "gold", "NAME=WEIGHT"),
            ("gold=x", "gold", "not a number"),
            ("gold=0", "gold", "0.01..=1000"),
            ("gold=nan", "gold", "0.01..=1000"),
            ("gold=1,gold=2", "gold", "twice"),
            ("go ld=1", "go ld", "letters"),
            ("", "gold", "between 1"),
            ("gold=1", "bronze", "default SLO class"),
        ] {
            let e = SloClasses::parse(spec, default).expect_err(spec);
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }
}
