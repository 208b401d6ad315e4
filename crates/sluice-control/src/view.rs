//! The view controller's home in `sluice control` (Flint §3): the shared
//! [`ViewController`], the epoch task, PUSH to watching agents, and the
//! view's Prometheus metrics and JSON (`--admin-listen`).
//!
//! The epoch task, every `epoch_us`: refreshes the drive list from the
//! catalog (once a second), runs the analysis, hands each drive's busy
//! degree to placement (`Catalog::report_busy`: new extents avoid a
//! congested drive, Flint §5.5), and wakes every `WatchView` stream, which
//! then sends its client's part of the view and its fired events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use sluice_admin::metrics::{gauge, gauges, Esc};
use sluice_flint::view::{Notification, ViewError, ViewSnapshot};
use sluice_flint::{Entity, ViewController, ViewControllerConfig};
use sluice_meta::{Catalog, MetaStore};
use sluice_runtime::sync::lock;

/// Epochs between drive-list refreshes from the catalog.
const DRIVE_REFRESH_EPOCHS: u64 = 10;

/// The controller and what wakes the watchers.
#[derive(Debug)]
pub struct ViewHub {
    controller: Mutex<ViewController>,
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
    pub fn new(cfg: ViewControllerConfig) -> Result<Arc<ViewHub>, ViewError> {
        let (epochs, _) = tokio::sync::broadcast::channel(16);
        Ok(Arc::new(ViewHub {
            controller: Mutex::new(ViewController::new(cfg)?),
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

    /// A receiver of each epoch's notifications.
    pub fn subscribe_epochs(&self) -> tokio::sync::broadcast::Receiver<Arc<Vec<Notification>>> {
        self.epochs.subscribe()
    }

    /// The whole view now.
    pub fn snapshot_all(&self) -> ViewSnapshot {
        let now = self.now_us();
        self.with(|c| c.snapshot_all(now))
    }

    /// Brings the controller's drives in line with the catalog's.
    pub async fn refresh_drives<S: MetaStore>(&self, catalog: &Catalog<S>) {
        let drives = match catalog.drives().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "view: listing drives failed; keeping the last list");
                return;
            }
        };
        self.with(|c| {
            let keep: BTreeSet<u64> = drives.iter().map(|d| u64::from(d.id.0)).collect();
            c.retain_drives(&keep);
            for d in &drives {
                if let Err(e) = c.set_drive(u64::from(d.id.0), &d.spec.addr, None) {
                    tracing::warn!(drive = %d.id, error = %e, "view: drive not tracked");
                }
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
        let mut victims: BTreeMap<String, u64> = BTreeMap::new();
        for (s, _) in &snap.report.victims {
            *victims.entry(s.client.clone()).or_default() += 1;
        }
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
