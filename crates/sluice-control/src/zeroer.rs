//! The leader's slot zeroer: keeps clean slots ready on every drive in
//! service so that an extent fault is one metadata transaction, takes over
//! zeroing claims that another process left (fencing them first), and
//! releases quarantined slots once a fence protects them.
//!
//! A new extent must read as zeros, so its slots are zeroed before any
//! client can see them. Doing that inside the fault put a Write Zeroes of
//! 2 MiB per replica (p50 140 µs, p99 397 µs here) and a lock held across
//! it on every fault's path. The zeroer does it ahead of time, in three
//! steps that are each safe to crash in (`Catalog::zero_ahead`): claim a
//! batch of dirty slots (one transaction at revision R), zero them at
//! epoch R, declare them clean (one transaction). See docs/volumes.md,
//! "Zeroing ahead of the faults".

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_host::HostError;
use sluice_meta::catalog::{FenceJob, Fenced, ZeroJob};
use sluice_meta::{Catalog, MetaStore};
use sluice_proto::fence::GRANULE_SHIFT;
use sluice_volume::{DriveId, DriveState, EXTENT_BYTES};

use crate::leader::Leadership;
use crate::pb;
use crate::volume::DrivePool;

/// What the zeroer keeps ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroerConfig {
    /// Clean slots kept per drive in service: refilled in batches (one
    /// claim and one declaration each) when below half, or when short and
    /// no fault took one since the last pass. 0 turns the refill off
    /// (faults then zero inline).
    pub clean_slots_per_drive: usize,
    /// How often it looks.
    pub interval: Duration,
}

impl Default for ZeroerConfig {
    fn default() -> Self {
        ZeroerConfig {
            clean_slots_per_drive: 64,
            interval: Duration::from_millis(200),
        }
    }
}

/// How much sooner the zeroer looks again while faults drain a drive.
const DRAINING_SPEEDUP: u32 = 20;

/// Clean slots per drive, at most (1024 × 2 MiB = 2 GiB zeroed ahead).
pub const CLEAN_SLOTS_PER_DRIVE_MAX: usize = 1024;

impl ZeroerConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.clean_slots_per_drive > CLEAN_SLOTS_PER_DRIVE_MAX {
            return Err(format!(
                "clean slots per drive {} is above {CLEAN_SLOTS_PER_DRIVE_MAX}",
                self.clean_slots_per_drive
            ));
        }
        if self.interval.is_zero() {
            return Err("the zeroer's interval must be above 0".into());
        }
        Ok(())
    }
}

/// Write Zeroes in flight per zeroing job: the control plane's connection
/// to a drive has a queue depth of 4, and a fault that zeroes inline must
/// not wait behind a batch of the zeroer's.
pub const ZEROES_IN_FLIGHT_MAX: usize = 2;

/// Slots one Write Zeroes covers at most (64 MiB): runs of adjacent slots
/// go out as one command, so a batch of fresh slots costs a few commands,
/// not one per slot (each command is a round trip and CPU on both ends,
/// taken from the extent faults that share the machine).
pub const ZERO_RUN_SLOTS_MAX: usize = 32;

/// `slots` as runs of adjacent slots, lowest first, each at most
/// [`ZERO_RUN_SLOTS_MAX`] long: (first slot, slots).
fn zero_runs(slots: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = slots.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for s in sorted {
        match runs.last_mut() {
            Some((first, n)) if *first + *n == s && *n < ZERO_RUN_SLOTS_MAX as u64 => *n += 1,
            _ => runs.push((s, 1)),
        }
    }
    runs
}

/// Zeroes `job`'s slots on its drive at the job's epoch (NVMe Write Zeroes,
/// no data on the wire): a command per run of adjacent slots,
/// [`ZEROES_IN_FLIGHT_MAX`] at a time.
pub(crate) async fn zero_slots(drives: &DrivePool, job: ZeroJob) -> Result<(), String> {
    let d = &job.drive;
    let ns = drives
        .namespace(&pb::Drive::from(d), None)
        .await
        .map_err(|e| format!("zeroing on drive {}: {e}", d.id))?;
    let bs = u64::from(ns.block_size_bytes());
    let runs = zero_runs(&job.slots);
    for chunk in runs.chunks(ZEROES_IN_FLIGHT_MAX) {
        let zeroes = chunk.iter().map(|&(first, n)| {
            let ns = ns.clone();
            async move {
                ns.write_zeroes_at_epoch(d.slot_lba(first), n * EXTENT_BYTES / bs, job.epoch)
                    .await
                    .map_err(|e| {
                        format!(
                            "zeroing slots {first}..{} of drive {}: {e}",
                            first + n,
                            d.id
                        )
                    })
            }
        });
        futures_util::future::try_join_all(zeroes).await?;
    }
    Ok(())
}

/// Fences `job`'s slots at its epoch and waits (at most `drain`) for the
/// writes in flight there to end.
pub(crate) async fn fence_slots(drives: &DrivePool, job: FenceJob, drain: Duration) -> Fenced {
    let d = &job.drive;
    let ns = match drives.namespace(&pb::Drive::from(d), None).await {
        Ok(ns) => ns,
        Err(e) => return Fenced::NotNow(format!("drive {} unreachable: {e}", d.id)),
    };
    let bs = u64::from(ns.block_size_bytes());
    let mut draining = Vec::new();
    for &slot in &job.slots {
        let granule = (d.slot_lba(slot) * bs) >> GRANULE_SHIFT;
        match ns.fence(granule, 1, job.epoch, true).await {
            Ok(a) if a.granule_shift != GRANULE_SHIFT => return Fenced::Unsupported,
            Ok(a) if a.writes_in_flight == 0 => {}
            Ok(_) => draining.push(granule),
            Err(HostError::Nvme { status, .. })
                if status == sluice_proto::Status::INVALID_OPCODE =>
            {
                return Fenced::Unsupported
            }
            Err(e) => return Fenced::NotNow(format!("fencing on drive {}: {e}", d.id)),
        }
    }
    let deadline = Instant::now() + drain;
    for granule in draining {
        if let Err(e) = drain_granule(&ns, granule, job.epoch, deadline).await {
            return Fenced::NotNow(format!("drive {}: {e}", d.id));
        }
    }
    Fenced::Yes
}

/// Waits until no write admitted before the fence at `epoch` on `granule`
/// is in flight (asking the drive with the Fence command, no raise), or
/// fails once `deadline` has passed or the drive does not answer.
pub(crate) async fn drain_granule(
    ns: &sluice_host::Namespace,
    granule: u64,
    epoch: u64,
    deadline: Instant,
) -> Result<(), String> {
    let mut pause = Duration::from_micros(200);
    loop {
        let a = ns
            .fence(granule, 1, epoch, false)
            .await
            .map_err(|e| format!("draining: {e}"))?;
        if a.writes_in_flight == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} writes still in flight at the drain deadline",
                a.writes_in_flight
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(DRAIN_PAUSE_MAX);
    }
}

/// Longest pause between two questions while a fenced granule drains.
const DRAIN_PAUSE_MAX: Duration = Duration::from_millis(20);

/// What the zeroer has done, for `/metrics`.
#[derive(Debug, Default)]
pub struct ZeroerProgress {
    slots_zeroed: AtomicU64,
    claims_taken_over: AtomicU64,
    quarantine_released: AtomicU64,
    /// Over the drives in service, at the zeroer's last look.
    slots_clean: AtomicU64,
    /// Over every drive, at the zeroer's last look.
    slots_quarantined: AtomicU64,
    steps_ridden: AtomicU64,
}

/// The zeroer's progress as Prometheus metrics, read at scrape time.
#[derive(Debug)]
pub struct ZeroerCollector(pub Arc<ZeroerProgress>);

impl prometheus_client::collector::Collector for ZeroerCollector {
    fn encode(&self, mut enc: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use sluice_admin::metrics::{counter, gauge};
        let p = &self.0;
        let e = &mut enc;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            e,
            "sluice_zeroer_slots_clean",
            "Slots zeroed ahead and ready for extent faults, on drives in service.",
            None,
            get(&p.slots_clean),
        )?;
        gauge(
            e,
            "sluice_zeroer_slots_quarantined",
            "Deleted volumes' slots held back until a fence protects them (or the operator releases them).",
            None,
            get(&p.slots_quarantined),
        )?;
        counter(
            e,
            "sluice_zeroer_slots_zeroed",
            "Slots the zeroer zeroed ahead of faults since this process started.",
            None,
            get(&p.slots_zeroed),
        )?;
        counter(
            e,
            "sluice_zeroer_steps_ridden",
            "Zeroer steps (declare a batch clean, claim the next) carried by extent faults' transactions instead of committed alone.",
            None,
            get(&p.steps_ridden),
        )?;
        counter(
            e,
            "sluice_zeroer_claims_taken_over",
            "Stale zeroing claims fenced and zeroed again since this process started.",
            None,
            get(&p.claims_taken_over),
        )?;
        counter(
            e,
            "sluice_zeroer_quarantine_released",
            "Quarantined slots released after a fence since this process started.",
            None,
            get(&p.quarantine_released),
        )
    }
}

/// How long the zeroer leaves a drive alone after one of its steps there
/// failed.
pub const DRIVE_RETRY: Duration = Duration::from_secs(5);

/// What the zeroer keeps from one pass to the next.
#[derive(Debug, Default)]
pub(crate) struct PassState {
    /// One warning per drive and kind of trouble, not one per pass.
    warned: BTreeMap<(DriveId, &'static str), String>,
    /// Each drive's clean slots at the last pass.
    last_clean: BTreeMap<DriveId, usize>,
    /// Drives left alone until then (a step failed there).
    retry_at: BTreeMap<DriveId, Instant>,
}

impl PassState {
    /// Records how a step on drive `id` went. A drive whose step failed
    /// (unreachable, not draining, zeroing refused) is left alone for
    /// [`DRIVE_RETRY`]: each refill of a dead drive would claim another
    /// batch and rewrite its record, and a fence of an unreachable one may
    /// wait for its connect timeout. One warning per drive and trouble.
    fn note(&mut self, now: Instant, id: DriveId, what: &'static str, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.warned.remove(&(id, what));
            }
            Err(e) => {
                self.retry_at.insert(id, now + DRIVE_RETRY);
                if self.warned.get(&(id, what)) != Some(&e) {
                    tracing::warn!(drive = %id, error = %e, "{what}; retrying in {DRIVE_RETRY:?}");
                    self.warned.insert((id, what), e);
                }
            }
        }
    }

    /// Warns once about a lasting condition of drive `id`.
    fn warn_once(&mut self, id: DriveId, what: &'static str, why: &str) {
        if self.warned.get(&(id, what)).map(String::as_str) != Some(why) {
            tracing::warn!(drive = %id, "{what}: {why}");
            self.warned.insert((id, what), why.to_owned());
        }
    }
}

/// The leader's zeroer task.
pub(crate) struct Zeroer<S> {
    pub(crate) catalog: Arc<Catalog<S>>,
    pub(crate) drives: Arc<DrivePool>,
    pub(crate) leadership: Arc<Leadership>,
    pub(crate) cfg: ZeroerConfig,
    pub(crate) drain: Duration,
    pub(crate) progress: Arc<ZeroerProgress>,
    /// Starts a pass now (a drive was added).
    pub(crate) wake: Arc<tokio::sync::Notify>,
}

impl<S: MetaStore> Zeroer<S> {
    pub(crate) async fn run(self) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut state = PassState::default();
        let mut short = false;
        loop {
            // While faults drain clean slots, look again soon.
            if short {
                tokio::select! {
                    () = tokio::time::sleep(self.cfg.interval / DRAINING_SPEEDUP) => {}
                    () = self.wake.notified() => {}
                }
            } else {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = self.wake.notified() => {}
                }
            }
            short = false;
            if !self.leadership.is_leader() {
                continue;
            }
            match self.pass(&mut state, Instant::now()).await {
                Ok(s) => short = s,
                Err(e) => tracing::warn!(error = %e, "zeroer pass failed; retrying"),
            }
        }
    }

    /// One look at every drive not in its retry pause: stale claims,
    /// quarantine, refill. Returns whether faults are draining some
    /// drive's clean slots.
    pub(crate) async fn pass(
        &self,
        state: &mut PassState,
        now: Instant,
    ) -> Result<bool, sluice_meta::catalog::CatalogError> {
        let mut draining = false;
        let drives = self.drives.clone();
        let drain = self.drain;
        let fence = move |job: FenceJob| {
            let drives = drives.clone();
            async move { fence_slots(&drives, job, drain).await }
        };
        let drives = self.drives.clone();
        let zero = move |job: ZeroJob| {
            let drives = drives.clone();
            async move { zero_slots(&drives, job).await }
        };
        let drives = self.catalog.drives().await?;
        let add = |a: &AtomicU64, n: usize| a.fetch_add(n as u64, Ordering::Relaxed);
        self.progress.slots_clean.store(
            drives
                .iter()
                .filter(|d| d.state == DriveState::Up)
                .map(|d| d.slots_clean() as u64)
                .sum(),
            Ordering::Relaxed,
        );
        self.progress
            .steps_ridden
            .store(self.catalog.zeroer_steps_ridden(), Ordering::Relaxed);
        self.progress.slots_quarantined.store(
            drives.iter().map(|d| d.quarantined.len() as u64).sum(),
            Ordering::Relaxed,
        );
        for d in drives {
            if state.retry_at.get(&d.id).is_some_and(|&t| now < t) {
                continue;
            }
            state.retry_at.remove(&d.id);
            // 1. Claims another process (or a failed zeroing) left.
            let stale = self.catalog.stale_claims(&d);
            if !stale.is_empty() {
                let what = "stale zeroing claims wait for a fence";
                match self
                    .catalog
                    .recover_claims(d.id, &stale, &fence, &zero)
                    .await?
                {
                    Fenced::Yes => {
                        add(&self.progress.claims_taken_over, stale.len());
                        tracing::info!(drive = %d.id, slots = stale.len(), "took over stale zeroing claims: fenced, zeroed, clean");
                        state.note(now, d.id, what, Ok(()));
                    }
                    Fenced::Unsupported => {
                        tracing::warn!(drive = %d.id, slots = stale.len(),
                            "stale zeroing claims on a drive that cannot fence: quarantined until the operator releases them (sluice drive set --release-quarantined)");
                    }
                    Fenced::NotNow(e) => state.note(now, d.id, what, Err(e)),
                }
            }
            // 2. A deleted volume's slots the delete could not fence.
            if !d.quarantined.is_empty() && !state.retry_at.contains_key(&d.id) {
                let what = "quarantined slots wait for a fence";
                match self.catalog.release_fenced_quarantine(d.id, &fence).await? {
                    (Fenced::Yes, n) => {
                        add(&self.progress.quarantine_released, n);
                        if n > 0 {
                            tracing::info!(drive = %d.id, slots = n, "quarantined slots fenced and released");
                        }
                        state.note(now, d.id, what, Ok(()));
                    }
                    // Not transient: warned about once, and the drive
                    // still gets its refills.
                    (Fenced::Unsupported, _) => state.warn_once(
                        d.id,
                        what,
                        "the drive cannot fence: the operator releases them (sluice drive set --release-quarantined)",
                    ),
                    (Fenced::NotNow(e), _) => state.note(now, d.id, what, Err(e)),
                }
            }
            // 3. Clean slots for the faults to come: below half, or short
            // and untouched since the last pass (the faults paused). Each
            // refill is two transactions, so while faults drain a drive it
            // refills in batches of half or more, not a slot per pass.
            let want = self.cfg.clean_slots_per_drive;
            let clean = d.slots_clean();
            let last = state.last_clean.insert(d.id, clean);
            if d.state != DriveState::Up
                || clean >= want
                || d.slots_dirty() == 0
                || state.retry_at.contains_key(&d.id)
            {
                continue;
            }
            let idle = last == Some(clean);
            draining |= !idle;
            if clean >= want / 2 && !idle {
                continue;
            }
            let what = "zeroing slots ahead of faults failed";
            match self.catalog.zero_ahead(d.id, want - clean, &zero).await {
                Ok(n) => {
                    add(&self.progress.slots_zeroed, n);
                    state.note(now, d.id, what, Ok(()));
                }
                Err(sluice_meta::catalog::CatalogError::Prepare(e)) => {
                    state.note(now, d.id, what, Err(e))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(draining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_slots_are_zeroed_by_one_command_up_to_the_run_limit() {
        assert_eq!(zero_runs(&[]), vec![]);
        assert_eq!(zero_runs(&[7, 3, 4, 5, 9, 8]), vec![(3, 3), (7, 3)]);
        assert_eq!(zero_runs(&[1, 1, 2]), vec![(1, 2)]);
        let long: Vec<u64> = (100..100 + ZERO_RUN_SLOTS_MAX as u64 * 2 + 1).collect();
        let max = ZERO_RUN_SLOTS_MAX as u64;
        assert_eq!(
            zero_runs(&long),
            vec![(100, max), (100 + max, max), (100 + 2 * max, 1)]
        );
        let covered: u64 = zero_runs(&long).iter().map(|r| r.1).sum();
        assert_eq!(covered, long.len() as u64);
    }

    #[test]
    fn bad_zeroer_settings_are_refused_naming_the_setting() {
        assert!(ZeroerConfig::default().check().is_ok());
        let e = ZeroerConfig {
            clean_slots_per_drive: CLEAN_SLOTS_PER_DRIVE_MAX + 1,
            ..ZeroerConfig::default()
        }
        .check()
        .unwrap_err();
        assert!(e.contains("clean slots per drive"), "{e}");
        let e = ZeroerConfig {
            interval: Duration::ZERO,
            ..ZeroerConfig::default()
        }
        .check()
        .unwrap_err();
        assert!(e.contains("interval"), "{e}");
        // Off is allowed: faults then zero inline.
        assert!(ZeroerConfig {
            clean_slots_per_drive: 0,
            ..ZeroerConfig::default()
        }
        .check()
        .is_ok());
    }

    #[test]
    fn a_failed_step_leaves_its_drive_alone_for_a_while_and_a_lasting_one_does_not() {
        let mut st = PassState::default();
        let t0 = Instant::now();
        st.note(t0, DriveId(3), "zeroing", Err("unreachable".into()));
        assert_eq!(st.retry_at.get(&DriveId(3)), Some(&(t0 + DRIVE_RETRY)));
        st.note(t0, DriveId(3), "zeroing", Ok(()));
        assert!(!st.warned.contains_key(&(DriveId(3), "zeroing")));
        st.warn_once(DriveId(4), "quarantine", "cannot fence");
        assert!(!st.retry_at.contains_key(&DriveId(4)), "not a pause");
        assert!(st.warned.contains_key(&(DriveId(4), "quarantine")));
    }

    #[test]
    fn progress_is_served_as_prometheus_metrics() {
        let p = Arc::new(ZeroerProgress::default());
        p.slots_clean.store(128, Ordering::Relaxed);
        p.slots_quarantined.store(8, Ordering::Relaxed);
        p.slots_zeroed.store(300, Ordering::Relaxed);
        p.claims_taken_over.store(2, Ordering::Relaxed);
        p.quarantine_released.store(5, Ordering::Relaxed);
        p.steps_ridden.store(40, Ordering::Relaxed);
        crate::assert_metric_lines(
            ZeroerCollector(p),
            &[
                "sluice_zeroer_slots_clean 128",
                "sluice_zeroer_slots_quarantined 8",
                "sluice_zeroer_slots_zeroed_total 300",
                "sluice_zeroer_steps_ridden_total 40",
                "sluice_zeroer_claims_taken_over_total 2",
                "sluice_zeroer_quarantine_released_total 5",
            ],
        );
    }
}
