//! Rebuilding lost replicas in the background, on the leading control plane.
//!
//! After a drive fails, the extents it held in replicated chains are
//! degraded (their chains are shorter than the volume's replica count). The
//! rebuilder scans for them (every [`RebuildConfig::scan_interval`], and at
//! once when a drive fails) and rebuilds one extent at a time, at most
//! [`RebuildConfig::rate_bytes_per_sec`] on average:
//!
//! 1. `Catalog::begin_rebuild` reserves a replica on another drive and
//!    raises the extent's epoch. Volume clients that refetch the map see
//!    the extent being rebuilt and hold their writes to it (reads go on).
//! 2. **Fence**: every replica's granule is fenced at the new epoch (the
//!    Fence command of `sluice_proto::fence`), and each is asked until no
//!    write admitted before the fence is still in flight. A client on an
//!    older map is refused from then on, refetches, and waits. So nothing
//!    writes the extent from here to step 4, and nothing written before is
//!    still landing.
//! 3. **Copy** the extent from the chain's tail (which holds every
//!    acknowledged write) to the new replica, its writes carrying the new
//!    epoch, then flush it.
//! 4. `Catalog::finish_rebuild`: the replica joins the chain's tail at a
//!    higher epoch; writers refetch and carry on over the full chain.
//!
//! Any failure gives the replica back (`abort_rebuild`) and the extent is
//! tried again at the next scan; a drive that fails its probe meanwhile is
//! taken out of service, so the next attempt goes elsewhere.
//!
//! Fencing needs drives that are Sluice targets. A drive that answers the
//! Fence command with Invalid Command Opcode (Linux nvmet, SPDK) cannot be
//! fenced; its extents stay degraded and the status says why.
//!
//! Writes to the extent wait during steps 2-3 only: one extent's copy at
//! full speed (a few ms on this machine); the rate limit spaces the
//! extents out, not the bytes of one.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use sluice_host::{HostError, IoFlags};
use sluice_meta::rebuild::Rebuild;
use sluice_meta::{Catalog, MetaStore};
use sluice_proto::fence::GRANULE_SHIFT;
use sluice_volume::{DriveId, Replica, EXTENT_BYTES};

use crate::leader::Leadership;
use crate::pb;
use crate::remap::{Candidate, RemapConfig, RemapPlanner};
use crate::view::ViewHub;
use crate::volume::DrivePool;

/// How the rebuilder runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RebuildConfig {
    /// Average copy rate, bytes per second (each extent is copied at full
    /// speed, and the next one starts when the budget allows).
    pub rate_bytes_per_sec: u64,
    /// Time between scans for degraded extents.
    pub scan_interval: Duration,
    /// Longest wait for writes in flight to drain after a fence.
    pub drain_timeout: Duration,
    /// Extents rebuilt at once (each its own fence, drain and copy); the
    /// rate limit spaces their starts.
    pub parallel: usize,
    /// Whether the rate yields to the foreground: `rate_bytes_per_sec` is
    /// then a ceiling, and the rate halves while the shadow view reports a
    /// busy survivor (see [`Pacer`]). Off: the configured rate, always.
    pub adaptive: bool,
}

impl Default for RebuildConfig {
    fn default() -> Self {
        RebuildConfig {
            rate_bytes_per_sec: 32 << 20,
            scan_interval: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(10),
            parallel: 4,
            adaptive: true,
        }
    }
}

/// Bounds of the rate (1 MiB/s to 16 GiB/s).
pub const RATE_BYTES_PER_SEC_MIN: u64 = 1 << 20;
pub const RATE_BYTES_PER_SEC_MAX: u64 = 16 << 30;
/// Extents taken from one volume per scan.
pub const EXTENTS_PER_SCAN_MAX: usize = 256;
/// Extents rebuilt at once, at most.
pub const PARALLEL_MAX: usize = 64;
/// How often the remapper looks at the view's congested drives.
pub const REMAP_SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes per read and write of the copy.
pub const COPY_CHUNK_BYTES: usize = 256 << 10;

impl RebuildConfig {
    pub fn check(&self) -> Result<(), String> {
        if !(RATE_BYTES_PER_SEC_MIN..=RATE_BYTES_PER_SEC_MAX).contains(&self.rate_bytes_per_sec) {
            return Err(format!(
                "rebuild rate {} bytes/s is outside {RATE_BYTES_PER_SEC_MIN}..={RATE_BYTES_PER_SEC_MAX}",
                self.rate_bytes_per_sec
            ));
        }
        if !(1..=PARALLEL_MAX).contains(&self.parallel) {
            return Err(format!(
                "rebuild parallelism {} is outside 1..={PARALLEL_MAX}",
                self.parallel
            ));
        }
        Ok(())
    }
}

/// A busy degree (0..=1, from the shadow view: the foreground's queueing
/// delay over the congestion threshold) at which a rebuild yields.
pub const BUSY_YIELD: f64 = 0.8;

/// The adaptive rebuild rate: additive increase, multiplicative decrease,
/// one step per view epoch at most (the view's busy degrees change once an
/// epoch; acting on every extent start would repeat one reading).
///
/// The signal is the busiest of a degraded extent's surviving replicas as
/// the view reports it, which the volume clients' agents (the foreground)
/// and the targets' agents feed. The rebuild's own copies come from the
/// control plane's connections, which report to no agent, so the rebuild
/// does not throttle itself on its own traffic, only on what the
/// foreground sees. Without agents every degree is 0: the configured rate.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: u64,
    max: u64,
    min: u64,
    step: Duration,
    last_step: Option<Instant>,
}

impl Pacer {
    /// A pacer starting at, and never above, `max_bytes_per_sec`; never
    /// below a sixteenth of it (the rebuild always progresses). `step` is
    /// the shortest time between two changes (the view's epoch).
    pub fn new(max_bytes_per_sec: u64, step: Duration) -> Pacer {
        let max = max_bytes_per_sec.max(1);
        Pacer {
            rate: max,
            max,
            min: (max / 16).max(RATE_BYTES_PER_SEC_MIN).min(max),
            step,
            last_step: None,
        }
    }

    /// Takes the busiest survivor's degree at `now`; returns the rate.
    pub fn observe(&mut self, now: Instant, busiest: f64) -> u64 {
        if self
            .last_step
            .is_some_and(|t| now.saturating_duration_since(t) < self.step)
        {
            return self.rate;
        }
        self.last_step = Some(now);
        self.rate = if busiest >= BUSY_YIELD {
            (self.rate / 2).max(self.min)
        } else {
            self.rate.saturating_add(self.max / 8).min(self.max)
        };
        self.rate
    }

    /// Bytes per second now.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The spacing of extent starts at the current rate.
    pub fn per_extent(&self) -> Duration {
        Duration::from_secs_f64(EXTENT_BYTES as f64 / self.rate as f64)
    }
}

/// What the rebuilder has done (the `Status` call's `rebuilds`).
#[derive(Debug, Default)]
pub struct RebuildProgress {
    inner: Mutex<pb::Rebuilds>,
}

impl RebuildProgress {
    pub fn snapshot(&self) -> pb::Rebuilds {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, pb::Rebuilds> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The rebuilder's and the remapper's progress as Prometheus metrics,
/// read at scrape time (`sluice control --admin-listen`, `/metrics`).
#[derive(Debug)]
pub struct RebuildCollector(pub Arc<RebuildProgress>);

impl prometheus_client::collector::Collector for RebuildCollector {
    fn encode(&self, mut enc: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use prometheus_client::registry::Unit;
        use sluice_admin::metrics::{counter, gauge};
        let p = self.0.snapshot();
        let e = &mut enc;
        gauge(
            e,
            "sluice_rebuild_rate",
            "Average copy rate of rebuilds now (the configured rate, or below it while the foreground is busy).",
            Some(&Unit::Other("bytes_per_second".into())),
            p.rate_bytes_per_sec,
        )?;
        gauge(
            e,
            "sluice_rebuild_degraded_extents",
            "Extents whose chain is short of the volume's replicas (at the last scan).",
            None,
            p.degraded_extents,
        )?;
        gauge(
            e,
            "sluice_rebuild_in_progress",
            "1 while an extent is being copied.",
            None,
            u64::from(!p.current.is_empty()),
        )?;
        counter(
            e,
            "sluice_rebuild_extents_rebuilt",
            "Extents rebuilt since this process started.",
            None,
            p.extents_rebuilt,
        )?;
        counter(
            e,
            "sluice_rebuild_copied",
            "Bytes copied by rebuilds and remaps since this process started.",
            Some(&Unit::Bytes),
            p.bytes_copied,
        )?;
        counter(
            e,
            "sluice_rebuild_extents_aborted",
            "Rebuilds given up (and retried at a later scan).",
            None,
            p.extents_aborted,
        )?;
        counter(
            e,
            "sluice_remap_extents_remapped",
            "Extents moved off congested drives since this process started.",
            None,
            p.extents_remapped,
        )
    }
}

/// A failed rebuild, and the drive to blame when there is one.
#[derive(Debug)]
struct Failure {
    drive: Option<DriveId>,
    reason: String,
}

fn fail(drive: DriveId, reason: String) -> Failure {
    Failure {
        drive: Some(drive),
        reason,
    }
}

/// The rebuilder of one control-plane process.
pub(crate) struct Rebuilder<S> {
    pub(crate) catalog: Arc<Catalog<S>>,
    pub(crate) drives: Arc<DrivePool>,
    pub(crate) leadership: Arc<Leadership>,
    pub(crate) probe: sluice_host::ConnectOptions,
    pub(crate) cfg: RebuildConfig,
    pub(crate) progress: Arc<RebuildProgress>,
    pub(crate) wake: Arc<tokio::sync::Notify>,
    /// The shadow view, whose congested drives the remapper moves
    /// extents off (`remap.rs`), and how.
    pub(crate) view: Arc<ViewHub>,
    pub(crate) remap: RemapConfig,
    /// The adaptive rate (when `cfg.adaptive`).
    pub(crate) pacer: Mutex<Pacer>,
}

impl<S: MetaStore> Rebuilder<S> {
    /// Scans and rebuilds until the process ends.
    pub(crate) async fn run(self) {
        self.progress.lock().rate_bytes_per_sec = self.cfg.rate_bytes_per_sec;
        // The earliest start of the next extent's copy (the rate limit).
        let mut next_start = Instant::now();
        let mut planner = RemapPlanner::new(self.remap);
        let mut scan_tick = tokio::time::interval(self.cfg.scan_interval);
        scan_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut remap_tick = tokio::time::interval(REMAP_SCAN_INTERVAL);
        remap_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let remap_due = tokio::select! {
                _ = scan_tick.tick() => false,
                () = self.wake.notified() => false,
                _ = remap_tick.tick(), if self.remap.enabled => true,
            };
            if !self.leadership.is_leader() {
                continue;
            }
            // A remap only moves healthy extents (`begin_move` leaves a
            // degraded one to the rebuild scan).
            let r = if remap_due {
                self.remap(&mut planner, &mut next_start).await
            } else {
                self.scan(&mut next_start).await
            };
            if let Err(e) = r {
                let what = if remap_due { "remap" } else { "rebuild" };
                tracing::warn!(error = %e, "{what} scan failed; retrying at the next scan");
                self.progress.lock().last_error = e;
            }
        }
    }

    /// Moves extents off drives the view has reported congested for long
    /// enough (`remap.rs` chooses which), one at a time, spaced by the
    /// rebuild rate.
    async fn remap(
        &self,
        planner: &mut RemapPlanner,
        next_start: &mut Instant,
    ) -> Result<(), String> {
        let congested: std::collections::BTreeSet<u64> = self
            .view
            .with(|c| c.report().congested_drives.iter().copied().collect());
        let hot = planner.observe(Instant::now(), &congested);
        if hot.is_empty() {
            return Ok(());
        }
        // New replicas go to no congested drive.
        let avoid: Vec<DriveId> = congested
            .iter()
            .filter_map(|d| u32::try_from(*d).ok())
            .map(DriveId)
            .collect();
        let drives = self.catalog.drives().await.map_err(|e| e.to_string())?;
        let volumes = self.catalog.volumes().await.map_err(|e| e.to_string())?;
        let per_extent =
            Duration::from_secs_f64(EXTENT_BYTES as f64 / self.cfg.rate_bytes_per_sec as f64);
        let mut budget = self.remap.extents_per_scan;
        for d in hot {
            let Some(rec) = drives.iter().find(|x| u64::from(x.id.0) == d) else {
                continue;
            };
            let mut candidates = Vec::new();
            for v in &volumes {
                let Some(&on_drive) = v.extents_per_drive.get(&rec.id) else {
                    continue;
                };
                if v.state != sluice_volume::VolumeState::Ready {
                    continue;
                }
                let prefers_drive = v
                    .prefer
                    .iter()
                    .any(|p| *p == rec.spec.addr || *p == rec.spec.nqn);
                if prefers_drive {
                    continue;
                }
                let load_share = self.view.volume_share(d, v.id.0);
                let layout = match self.catalog.layout(&v.name).await {
                    Ok(l) => l,
                    Err(sluice_meta::CatalogError::UnknownVolume(_)) => continue,
                    Err(e) => return Err(e.to_string()),
                };
                candidates.extend(
                    layout
                        .extents
                        .iter()
                        .filter(|e| {
                            e.rebuilding.is_none() && e.chain.iter().any(|r| r.drive == rec.id)
                        })
                        .map(|e| Candidate {
                            volume: v.name.clone(),
                            index: e.index,
                            prefers_drive,
                            volume_extents_on_drive: on_drive,
                            load_share,
                        }),
                );
            }
            let picked = planner.pick(Instant::now(), candidates, budget);
            budget -= picked.len();
            for c in picked {
                if !self.leadership.is_leader() {
                    return Ok(());
                }
                let start = Instant::now().max(*next_start);
                *next_start = start + per_extent;
                tokio::time::sleep_until(start.into()).await;
                let here = format!("{}/{}", c.volume, c.index);
                self.progress.lock().current = here.clone();
                let r = self.move_extent(&c.volume, c.index, rec.id, &avoid).await;
                let mut p = self.progress.lock();
                p.current.clear();
                match r {
                    Ok(true) => {
                        p.extents_remapped += 1;
                        p.bytes_copied += EXTENT_BYTES;
                    }
                    Ok(false) => planner.forget(&c.volume, c.index),
                    Err(err) => {
                        planner.forget(&c.volume, c.index);
                        p.extents_aborted += 1;
                        p.last_error = format!("remapping {here}: {err}");
                    }
                }
            }
            if budget == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Moves one extent off drive `from`; `Ok(false)` when there was
    /// nothing to move (or nowhere uncongested to move it: then nothing
    /// changed and the next scan tries again).
    async fn move_extent(
        &self,
        name: &str,
        index: u64,
        from: DriveId,
        avoid: &[DriveId],
    ) -> Result<bool, String> {
        let r = match self.catalog.begin_move(name, index, from, avoid).await {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(false),
            Err(sluice_meta::CatalogError::PoolFull(m)) => {
                tracing::debug!(volume = %name, extent = index, %m, "no uncongested drive to remap onto");
                return Ok(false);
            }
            Err(e) => return Err(e.to_string()),
        };
        self.carry_out(name, index, r).await
    }

    async fn scan(&self, next_start: &mut Instant) -> Result<(), String> {
        let volumes = self
            .catalog
            .degraded_volumes()
            .await
            .map_err(|e| e.to_string())?;
        for v in volumes {
            let extents = self
                .catalog
                .degraded_extents(&v, EXTENTS_PER_SCAN_MAX)
                .await
                .map_err(|e| e.to_string())?;
            let next_start = std::sync::Mutex::new(&mut *next_start);
            futures_util::stream::iter(extents)
                .for_each_concurrent(self.cfg.parallel, |e| {
                    let (name, next_start) = (&v.name, &next_start);
                    async move {
                        if !self.leadership.is_leader() {
                            return;
                        }
                        let per_extent = self.pace(&e);
                        // Starts are spaced by the rate; copies overlap.
                        let start = {
                            let mut next =
                                next_start.lock().unwrap_or_else(PoisonError::into_inner);
                            let start = Instant::now().max(**next);
                            **next = start + per_extent;
                            start
                        };
                        tokio::time::sleep_until(start.into()).await;
                        let here = format!("{name}/{}", e.index);
                        self.progress.lock().current = here.clone();
                        let r = self.rebuild_extent(name, e.index).await;
                        let mut p = self.progress.lock();
                        if p.current == here {
                            p.current.clear();
                        }
                        match r {
                            Ok(true) => {
                                p.extents_rebuilt += 1;
                                p.bytes_copied += EXTENT_BYTES;
                            }
                            Ok(false) => {}
                            Err(err) => {
                                p.extents_aborted += 1;
                                p.last_error = format!("{here}: {err}");
                            }
                        }
                    }
                })
                .await;
        }
        Ok(())
    }

    /// The spacing before the next extent's copy: the configured rate, or
    /// the pacer's after it has looked at the extent's survivors.
    fn pace(&self, e: &sluice_volume::ExtentRecord) -> Duration {
        if !self.cfg.adaptive {
            return Duration::from_secs_f64(
                EXTENT_BYTES as f64 / self.cfg.rate_bytes_per_sec as f64,
            );
        }
        let busiest = self.view.with(|c| {
            c.busy_degrees()
                .filter(|(d, _)| e.chain.iter().any(|r| u64::from(r.drive.0) == *d))
                .map(|(_, b)| b)
                .fold(0.0, f64::max)
        });
        let mut p = self.pacer.lock().unwrap_or_else(PoisonError::into_inner);
        let before = p.rate();
        let rate = p.observe(Instant::now(), busiest);
        if rate != before {
            tracing::debug!(
                rate_bytes_per_sec = rate,
                busiest,
                "rebuild rate adapted to the foreground"
            );
            self.progress.lock().rate_bytes_per_sec = rate;
        }
        p.per_extent()
    }

    /// Rebuilds one extent; `Ok(false)` when it needed nothing.
    async fn rebuild_extent(&self, name: &str, index: u64) -> Result<bool, String> {
        let Some(r) = self
            .catalog
            .begin_rebuild(name, index)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(false);
        };
        self.carry_out(name, index, r).await
    }

    /// Fences, copies and finishes a begun rebuild or remap (or gives its
    /// new replica back).
    async fn carry_out(&self, name: &str, index: u64, r: Rebuild) -> Result<bool, String> {
        let started = Instant::now();
        match self.fence_and_copy(&r).await {
            Ok(()) => match self.catalog.finish_rebuild(&r).await {
                Ok(Some(e)) => {
                    if let Some(old) = r.extent.retiring {
                        tracing::info!(volume = %name, extent = index, epoch = e.epoch,
                            from = %old.drive, to = ?r.target().map(|t| t.drive), ms = started.elapsed().as_millis(),
                            "extent remapped off a congested drive");
                    } else {
                        tracing::info!(volume = %name, extent = index, epoch = e.epoch,
                            replicas = e.chain.len(), ms = started.elapsed().as_millis(),
                            "extent rebuilt: the new replica joined the chain");
                    }
                    Ok(true)
                }
                Ok(None) => {
                    Err("the rebuild was overtaken (a drive failed or the volume went)".into())
                }
                Err(e) => Err(format!("finishing: {e}")),
            },
            Err(f) => {
                tracing::warn!(volume = %name, extent = index, reason = %f.reason, "rebuild failed; giving the new replica back");
                if let Err(e) = self.catalog.abort_rebuild(&r).await {
                    tracing::warn!(volume = %name, extent = index, error = %e, "aborting the rebuild failed; the next scan resumes it");
                }
                if let Some(d) = f.drive {
                    self.fail_if_dead(d, &f.reason).await;
                }
                Err(f.reason)
            }
        }
    }

    /// Takes a drive out of service if it does not answer a probe.
    async fn fail_if_dead(&self, id: DriveId, reason: &str) {
        let Ok(drives) = self.catalog.drives().await else {
            return;
        };
        let Some(d) = drives.into_iter().find(|d| d.id == id) else {
            return;
        };
        if crate::probe::probe_drive(&d.spec, &self.probe)
            .await
            .is_ok()
        {
            return;
        }
        match self.catalog.fail_drive(id).await {
            Ok(n) => tracing::warn!(drive = %id, spec = %d.spec, chains_shortened = n, %reason,
                "drive failed during a rebuild: taken out of service"),
            Err(e) => tracing::warn!(drive = %id, error = %e, "could not mark a dead drive down"),
        }
    }

    async fn namespace(
        &self,
        r: &Rebuild,
        replica: Replica,
    ) -> Result<(sluice_host::Namespace, u64), Failure> {
        let d = r
            .drive(replica.drive)
            .ok_or_else(|| fail(replica.drive, "drive record missing".into()))?;
        let ns = self
            .drives
            .namespace(&pb::Drive::from(d), None)
            .await
            .map_err(|e| fail(replica.drive, e.to_string()))?;
        Ok((ns, d.slot_lba(replica.slot)))
    }

    async fn fence_and_copy(&self, r: &Rebuild) -> Result<(), Failure> {
        let target = r.target().ok_or_else(|| Failure {
            drive: None,
            reason: "no replica to rebuild".into(),
        })?;
        let epoch = r.extent.epoch;
        // 2. Fence every replica (the chain, then the new one), then drain.
        // Every one must answer: the copy uses these namespaces.
        let mut fenced = Vec::new();
        for rep in r.extent.owned() {
            let (ns, lba) = self.namespace(r, *rep).await?;
            let granule = (lba * u64::from(ns.block_size_bytes())) >> GRANULE_SHIFT;
            match ns.fence(granule, 1, epoch, true).await {
                Ok(a) if a.granule_shift == GRANULE_SHIFT => {}
                Ok(a) => {
                    return Err(fail(rep.drive, format!(
                        "fence granule is 2^{} bytes, not 2^{GRANULE_SHIFT}",
                        a.granule_shift
                    )))
                }
                Err(HostError::Nvme { status, .. })
                    if status == sluice_proto::Status::INVALID_OPCODE =>
                {
                    return Err(Failure {
                        drive: None,
                        reason: format!(
                            "drive {} cannot fence writes (not a Sluice target); rebuilding onto or from it is unsafe",
                            rep.drive
                        ),
                    })
                }
                Err(e) => return Err(fail(rep.drive, format!("fencing: {e}"))),
            }
            fenced.push((rep.drive, ns, lba, granule));
        }
        let deadline = Instant::now() + self.cfg.drain_timeout;
        for (drive, ns, _, granule) in &fenced {
            crate::zeroer::drain_granule(ns, *granule, epoch, deadline)
                .await
                .map_err(|e| fail(*drive, e))?;
        }
        // 3. Copy from the tail (every acknowledged write is there; its
        // predecessors have them too when it cannot be read).
        let Some(((_, dst, dst_lba, _), chain)) = fenced.split_last() else {
            return Err(Failure {
                drive: None,
                reason: "nothing fenced".into(),
            });
        };
        let bs = u64::from(dst.block_size_bytes());
        let flags = IoFlags {
            epoch,
            ..IoFlags::default()
        };
        let mut sources = chain.iter().rev().peekable();
        let mut at = 0u64;
        while at < EXTENT_BYTES {
            let len =
                COPY_CHUNK_BYTES.min(usize::try_from(EXTENT_BYTES - at).unwrap_or(usize::MAX));
            let data = loop {
                let (drive, ns, lba, _) = sources.peek().ok_or_else(|| Failure {
                    drive: None,
                    reason: "no replica of the chain could be read".into(),
                })?;
                let sbs = u64::from(ns.block_size_bytes());
                match ns.read(lba + at / sbs, len, IoFlags::default()).await {
                    Ok(d) => break d,
                    Err(e) => {
                        tracing::warn!(drive = %drive, error = %e, "rebuild read failed; reading its predecessor");
                        sources.next();
                    }
                }
            };
            dst.write(dst_lba + at / bs, &data, flags)
                .await
                .map_err(|e| fail(target.drive, format!("writing the new replica: {e}")))?;
            at += len as u64;
        }
        dst.flush()
            .await
            .map_err(|e| fail(target.drive, format!("flushing the new replica: {e}")))?;
        // 4. A remap: the retiring replica is fenced above every map that
        // names it, so a reader on such a map is refused there (reads carry
        // the epoch too) and refetches, before its slot is freed.
        if let Some(old) = r.extent.retiring {
            let (_, ns, _, granule) = fenced
                .iter()
                .find(|(d, ..)| *d == old.drive)
                .ok_or_else(|| fail(old.drive, "the retiring replica was not fenced".into()))?;
            ns.fence(*granule, 1, epoch + 1, true)
                .await
                .map_err(|e| fail(old.drive, format!("fencing the retiring replica: {e}")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_halves_on_a_busy_survivor_and_climbs_back_once_per_epoch() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pacer::new(64 << 20, ms(100));
        let max = 64u64 << 20;
        assert_eq!(p.observe(t0, 0.9), max / 2);
        // Within the epoch: the same reading is not acted on twice.
        assert_eq!(p.observe(t0 + ms(50), 0.9), max / 2);
        assert_eq!(p.observe(t0 + ms(100), 1.0), max / 4);
        for i in 2..10 {
            p.observe(t0 + ms(100 * i), 1.0);
        }
        assert_eq!(p.rate(), max / 16, "never below a sixteenth");
        // Idle foreground: +1/8 of the ceiling per epoch, up to it.
        for i in 10..30 {
            p.observe(t0 + ms(100 * i), 0.1);
        }
        assert_eq!(p.rate(), max);
        assert_eq!(p.per_extent(), Duration::from_secs_f64(1.0 / 32.0));
    }

    #[test]
    fn progress_is_served_as_prometheus_metrics() {
        let p = Arc::new(RebuildProgress::default());
        {
            let mut g = p.lock();
            g.rate_bytes_per_sec = 64 << 20;
            g.degraded_extents = 3;
            g.extents_rebuilt = 7;
            g.bytes_copied = 7 * EXTENT_BYTES;
            g.extents_aborted = 1;
            g.current = "v/2".into();
            g.extents_remapped = 2;
        }
        crate::assert_metric_lines(
            RebuildCollector(p),
            &[
                "sluice_rebuild_rate_bytes_per_second 67108864",
                "sluice_rebuild_degraded_extents 3",
                "sluice_rebuild_in_progress 1",
                "sluice_rebuild_extents_rebuilt_total 7",
                "sluice_rebuild_copied_bytes_total 14680064",
                "sluice_rebuild_extents_aborted_total 1",
                "sluice_remap_extents_remapped_total 2",
            ],
        );
    }
}
