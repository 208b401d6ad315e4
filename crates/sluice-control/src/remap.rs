//! Remapping extents off congested drives (Flint §5.5, "dynamic extent
//! remapping"): placement already keeps *new* extents off a drive the
//! shadow view reports busy; this moves extents that were placed there
//! before it congested.
//!
//! [`RemapPlanner`] is the policy, sans-IO (time is passed in):
//!
//! * a drive qualifies once the view has reported it congested for
//!   [`RemapConfig::congested_for`] without a break (one calm epoch resets
//!   it), so a burst moves nothing;
//! * on such a drive, extents of the volumes that load it stay: those that
//!   moved at least [`AGGRESSOR_SHARE`] of its bytes in the shadow view's
//!   window, and those that *prefer* it (a tenant that asked for the drive
//!   is usually the one loading it). Moving their extents would carry the
//!   load elsewhere; Flint moves the victims. The others are moved, the
//!   volumes with the least share of the drive's work first, then those
//!   with the fewest extents there (a small footprint on a hot drive is the
//!   likely victim; a volume spread wide is the likely load);
//! * at most [`RemapConfig::extents_per_scan`] extents per scan, each moved
//!   at most once per [`RemapConfig::cooldown`], so nothing ping-pongs
//!   between drives that take turns being hot.
//!
//! The rebuilder (`rebuild.rs`) carries a move out like a rebuild:
//! `Catalog::begin_move` reserves a replica on the best drive that is not
//! congested and marks the old one retiring; the chain is fenced, drained
//! and copied; the retiring replica is fenced one epoch higher (so a
//! reader on an old map is refused there and refetches), and
//! `Catalog::finish_rebuild` swaps the replicas and frees the old slot.
//! Writes to the extent wait for the copy, as during a rebuild.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// How extents are remapped off congested drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemapConfig {
    /// Off unless asked for (`sluice control --remap`): moving extents
    /// spends drive bandwidth, and an operator should choose it.
    pub enabled: bool,
    /// How long a drive must stay congested before its extents move.
    pub congested_for: Duration,
    /// Extents moved per scan, at most (the rebuild rate spaces them).
    pub extents_per_scan: usize,
    /// The shortest time between two moves of one extent.
    pub cooldown: Duration,
}

impl Default for RemapConfig {
    fn default() -> Self {
        RemapConfig {
            enabled: false,
            congested_for: Duration::from_secs(3),
            extents_per_scan: 8,
            cooldown: Duration::from_secs(300),
        }
    }
}

/// Bounds of [`RemapConfig::extents_per_scan`].
pub const EXTENTS_PER_SCAN_MAX: usize = 256;
/// Moves remembered for the cool-down, at most (the oldest go first).
pub const MOVES_REMEMBERED_MAX: usize = 65_536;

impl RemapConfig {
    pub fn check(&self) -> Result<(), String> {
        if !(1..=EXTENTS_PER_SCAN_MAX).contains(&self.extents_per_scan) {
            return Err(format!(
                "remap extents per scan {} is outside 1..={EXTENTS_PER_SCAN_MAX}",
                self.extents_per_scan
            ));
        }
        if self.congested_for > Duration::from_secs(3600) {
            return Err(format!(
                "remap congested-for {:?} is over an hour",
                self.congested_for
            ));
        }
        Ok(())
    }
}

/// A volume that moved at least this share of a congested drive's bytes
/// in the view's window loads it: its extents stay there.
pub const AGGRESSOR_SHARE: f64 = 0.5;

/// An extent that may move off a congested drive.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub volume: String,
    pub index: u64,
    /// The volume prefers the congested drive (`--prefer`).
    pub prefers_drive: bool,
    /// The volume's extents on the congested drive.
    pub volume_extents_on_drive: u64,
    /// The volume's share of the drive's work in the view's window (0..=1;
    /// `None` when the view has nothing on the drive).
    pub load_share: Option<f64>,
}

/// The remap policy's state.
#[derive(Debug, Default)]
pub struct RemapPlanner {
    cfg: RemapConfig,
    /// Congested drives, since when (without a break).
    since: BTreeMap<u64, Instant>,
    /// Extents moved, when.
    moved: HashMap<(String, u64), Instant>,
}

impl RemapPlanner {
    pub fn new(cfg: RemapConfig) -> RemapPlanner {
        RemapPlanner {
            cfg,
            ..RemapPlanner::default()
        }
    }

    /// Takes the drives the view reports congested now; returns those
    /// congested for long enough to move extents off.
    pub fn observe(&mut self, now: Instant, congested: &BTreeSet<u64>) -> Vec<u64> {
        self.since.retain(|d, _| congested.contains(d));
        for d in congested {
            self.since.entry(*d).or_insert(now);
        }
        self.since
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= self.cfg.congested_for)
            .map(|(d, _)| *d)
            .collect()
    }

    /// Chooses up to `limit` of `candidates` (extents on one congested
    /// drive) to move now, and remembers them for the cool-down.
    pub fn pick(
        &mut self,
        now: Instant,
        mut candidates: Vec<Candidate>,
        limit: usize,
    ) -> Vec<Candidate> {
        let cooldown = self.cfg.cooldown;
        self.moved
            .retain(|_, t| now.saturating_duration_since(*t) < cooldown);
        candidates.retain(|c| {
            !c.prefers_drive
                && c.load_share.is_none_or(|s| s < AGGRESSOR_SHARE)
                && !self.moved.contains_key(&(c.volume.clone(), c.index))
        });
        let share = |c: &Candidate| c.load_share.unwrap_or(0.0);
        candidates.sort_by(|a, b| {
            share(a).total_cmp(&share(b)).then_with(|| {
                (a.volume_extents_on_drive, &a.volume, a.index).cmp(&(
                    b.volume_extents_on_drive,
                    &b.volume,
                    b.index,
                ))
            })
        });
        candidates.truncate(limit);
        if self.moved.len() + candidates.len() > MOVES_REMEMBERED_MAX {
            // Forget the oldest: the cool-down is a courtesy, not safety.
            let mut by_age: Vec<_> = self.moved.iter().map(|(k, t)| (*t, k.clone())).collect();
            by_age.sort();
            for (_, k) in by_age.into_iter().take(candidates.len()) {
                self.moved.remove(&k);
            }
        }
        for c in &candidates {
            self.moved.insert((c.volume.clone(), c.index), now);
        }
        candidates
    }

    /// The move of `volume`'s extent `index` did not happen (no room, a
    /// race): it may be tried again at once.
    pub fn forget(&mut self, volume: &str, index: u64) {
        self.moved.remove(&(volume.to_owned(), index));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(volume: &str, index: u64, prefers: bool, on_drive: u64) -> Candidate {
        Candidate {
            volume: volume.into(),
            index,
            prefers_drive: prefers,
            volume_extents_on_drive: on_drive,
            load_share: None,
        }
    }

    fn loading(share: f64, mut c: Candidate) -> Candidate {
        c.load_share = Some(share);
        c
    }

    #[test]
    fn the_volumes_that_load_the_drive_stay_and_the_lightest_go_first() {
        let t0 = Instant::now();
        let mut p = RemapPlanner::new(RemapConfig::default());
        let all = vec![
            // The stream that congests the drive, not marked as preferring
            // it, and with few extents there.
            loading(0.9, cand("stream", 0, false, 1)),
            // Exactly the threshold loads it too.
            loading(AGGRESSOR_SHARE, cand("half", 0, false, 1)),
            loading(0.3, cand("busy", 1, false, 1)),
            loading(0.01, cand("victim", 5, false, 30)),
            // No share known (the view has no samples of the drive):
            // ranked as no load.
            cand("quiet", 2, false, 3),
        ];
        let picked: Vec<(String, u64)> = p
            .pick(t0, all, 10)
            .into_iter()
            .map(|c| (c.volume, c.index))
            .collect();
        assert_eq!(
            picked,
            vec![
                ("quiet".to_owned(), 2),
                ("victim".to_owned(), 5),
                ("busy".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn a_drive_qualifies_after_staying_congested_and_a_calm_epoch_resets_it() {
        let t0 = Instant::now();
        let mut p = RemapPlanner::new(RemapConfig {
            congested_for: Duration::from_secs(3),
            ..RemapConfig::default()
        });
        let hot: BTreeSet<u64> = [1, 2].into();
        assert!(p.observe(t0, &hot).is_empty());
        assert!(p.observe(t0 + Duration::from_secs(2), &hot).is_empty());
        // Drive 2 calms down for one epoch.
        assert!(p
            .observe(t0 + Duration::from_secs(2), &[1].into())
            .is_empty());
        assert_eq!(p.observe(t0 + Duration::from_secs(3), &hot), vec![1]);
        assert_eq!(p.observe(t0 + Duration::from_secs(5), &hot), vec![1]);
        assert_eq!(p.observe(t0 + Duration::from_secs(6), &hot), vec![1, 2]);
        assert!(p
            .observe(t0 + Duration::from_secs(7), &BTreeSet::new())
            .is_empty());
    }

    #[test]
    fn preferring_volumes_stay_small_footprints_go_first_and_moves_cool_down() {
        let t0 = Instant::now();
        let mut p = RemapPlanner::new(RemapConfig {
            cooldown: Duration::from_secs(60),
            ..RemapConfig::default()
        });
        let all = vec![
            cand("noisy", 0, true, 64),
            cand("wide", 3, false, 20),
            cand("wide", 4, false, 20),
            cand("victim", 9, false, 2),
            cand("victim", 7, false, 2),
        ];
        let first = p.pick(t0, all.clone(), 3);
        assert_eq!(
            first,
            vec![
                cand("victim", 7, false, 2),
                cand("victim", 9, false, 2),
                cand("wide", 3, false, 20)
            ]
        );
        // Not again within the cool-down; what was left is next.
        let second = p.pick(t0 + Duration::from_secs(1), all.clone(), 3);
        assert_eq!(second, vec![cand("wide", 4, false, 20)]);
        // A move that did not happen may be tried again at once.
        p.forget("wide", 4);
        assert_eq!(p.pick(t0 + Duration::from_secs(2), all.clone(), 3).len(), 1);
        // After the cool-down everything but the preferring volume again.
        assert_eq!(p.pick(t0 + Duration::from_secs(70), all, 10).len(), 4);
    }

    #[test]
    fn config_bounds_are_checked() {
        assert!(RemapConfig::default().check().is_ok());
        let bad = RemapConfig {
            extents_per_scan: 0,
            ..RemapConfig::default()
        };
        assert!(bad.check().unwrap_err().contains("extents per scan"));
    }
}
