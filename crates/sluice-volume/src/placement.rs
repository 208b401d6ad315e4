//! Choosing drives for a new extent: Flint's weighted score (§4.2).
//!
//! ```text
//! Score(eVol_i, SSD_j) = α·Extent# + β·Capacity_used + γ·Busy_degree
//!                      + δ·Fragment_degree + η·Preference
//! ```
//!
//! The lowest score wins. The paper gives no values for the weights nor units
//! for the terms, so Sluice normalises every term to 0..=1 and picks weights
//! that rank the goals in the order the paper's text argues for them:
//!
//! | term | Sluice's definition (0..=1) | default weight |
//! |---|---|---|
//! | Extent# | this volume's extents on the drive ÷ the volume's allocated extents + 1 (spread one volume over many drives) | α = 4 |
//! | Capacity_used | slots used ÷ slots on the drive (balance utilisation) | β = 1 |
//! | Busy_degree | recent busy share from telemetry (0 when none is reported) | γ = 2 |
//! | Fragment_degree | unowned slots (given back, zeroing, clean, quarantined) below the highest owned slot ÷ the slots up to it | δ = 0.25 |
//! | Preference | 0 on a preferred drive, 1 elsewhere, 0 for all when the volume names none | η = 8 |
//!
//! So a user's preference dominates while a preferred drive has room; after
//! it, spreading a volume wide (Flint's whole point: bandwidth adds up over
//! drives) outweighs a fuller drive; a busy drive loses against an idle one
//! at equal spread. Ties go to the drive after the volume's own rotation
//! point, so that new volumes do not all start on drive 0.
//!
//! Replicas go to distinct drives always, and to distinct targets while
//! drives on unused targets remain (Flint §4.4 chooses "three different SSDs
//! with the lowest scores").

use serde::{Deserialize, Serialize};

use crate::record::DriveId;

/// The weights of the score's terms (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementWeights {
    pub alpha_extents: f64,
    pub beta_capacity: f64,
    pub gamma_busy: f64,
    pub delta_fragment: f64,
    pub eta_preference: f64,
}

impl Default for PlacementWeights {
    fn default() -> Self {
        PlacementWeights {
            alpha_extents: 4.0,
            beta_capacity: 1.0,
            gamma_busy: 2.0,
            delta_fragment: 0.25,
            eta_preference: 8.0,
        }
    }
}

impl PlacementWeights {
    /// Refuses weights that are negative or not finite.
    pub fn check(&self) -> Result<(), String> {
        for (name, w) in [
            ("alpha_extents", self.alpha_extents),
            ("beta_capacity", self.beta_capacity),
            ("gamma_busy", self.gamma_busy),
            ("delta_fragment", self.delta_fragment),
            ("eta_preference", self.eta_preference),
        ] {
            if !w.is_finite() || w < 0.0 {
                return Err(format!(
                    "placement weight {name} = {w} must be a finite number >= 0"
                ));
            }
        }
        Ok(())
    }
}

/// What placement knows of one drive.
#[derive(Clone, Debug, PartialEq)]
pub struct DriveCandidate {
    pub drive: DriveId,
    /// The target the drive is on (replicas prefer distinct targets).
    pub target: String,
    /// Free slots; a drive with none is not a candidate.
    pub slots_free: u64,
    /// This volume's extents (replicas) already on the drive.
    pub volume_extents: u64,
    /// 0..=1.
    pub used_fraction: f64,
    /// 0..=1, from telemetry.
    pub busy_degree: f64,
    /// 0..=1.
    pub fragment_degree: f64,
    /// The volume prefers this drive.
    pub preferred: bool,
}

/// Why no chain could be placed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("the pool is full: {replicas} replica(s) need {replicas} drives with a free extent, {available} have one")]
    PoolFull { replicas: usize, available: usize },
}

/// The score of one candidate (lower is better).
pub fn score(
    c: &DriveCandidate,
    volume_allocated: u64,
    any_preferred: bool,
    w: &PlacementWeights,
) -> f64 {
    let extents = c.volume_extents as f64 / (volume_allocated as f64 + 1.0);
    let preference = if any_preferred && !c.preferred {
        1.0
    } else {
        0.0
    };
    w.alpha_extents * extents
        + w.beta_capacity * c.used_fraction.clamp(0.0, 1.0)
        + w.gamma_busy * c.busy_degree.clamp(0.0, 1.0)
        + w.delta_fragment * c.fragment_degree.clamp(0.0, 1.0)
        + w.eta_preference * preference
}

/// Chooses `replicas` distinct drives for a new extent, head first.
///
/// `volume_allocated` is the volume's replicas allocated so far and
/// `rotation` spreads ties (pass the volume id plus the extent index).
pub fn choose(
    candidates: &[DriveCandidate],
    replicas: usize,
    volume_allocated: u64,
    rotation: u64,
    w: &PlacementWeights,
) -> Result<Vec<DriveId>, PlacementError> {
    let usable: Vec<&DriveCandidate> = candidates.iter().filter(|c| c.slots_free > 0).collect();
    if usable.len() < replicas || replicas == 0 {
        return Err(PlacementError::PoolFull {
            replicas,
            available: usable.len(),
        });
    }
    let any_preferred = usable.iter().any(|c| c.preferred);
    let n = usable.len() as u64;
    let mut ranked: Vec<(f64, u64, &DriveCandidate)> = usable
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let tie = (i as u64 + n - rotation % n) % n;
            (score(c, volume_allocated, any_preferred, w), tie, *c)
        })
        .collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<&DriveCandidate> = Vec::with_capacity(replicas);
    // First pass: the best drive on each target not yet used; second pass:
    // the best remaining drives, when there are fewer targets than replicas.
    for (_, _, c) in &ranked {
        if chosen.len() == replicas {
            break;
        }
        if !chosen.iter().any(|o| o.target == c.target) {
            chosen.push(c);
        }
    }
    for (_, _, c) in &ranked {
        if chosen.len() == replicas {
            break;
        }
        if !chosen.iter().any(|o| o.drive == c.drive) {
            chosen.push(c);
        }
    }
    debug_assert_eq!(chosen.len(), replicas);
    Ok(chosen.iter().map(|c| c.drive).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cand(id: u32, target: &str) -> DriveCandidate {
        DriveCandidate {
            drive: DriveId(id),
            target: target.into(),
            slots_free: 100,
            volume_extents: 0,
            used_fraction: 0.0,
            busy_degree: 0.0,
            fragment_degree: 0.0,
            preferred: false,
        }
    }

    #[test]
    fn a_volume_spreads_over_all_drives_before_doubling_up() {
        let w = PlacementWeights::default();
        let mut drives: Vec<_> = (0..4).map(|i| cand(i, &format!("t{i}"))).collect();
        let mut seen = Vec::new();
        for e in 0..8u64 {
            let d = choose(&drives, 1, e, 0, &w).unwrap()[0];
            seen.push(d.0);
            let c = drives.iter_mut().find(|c| c.drive == d).unwrap();
            c.volume_extents += 1;
            c.used_fraction = c.volume_extents as f64 / 100.0;
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 0, 1, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn busy_full_and_preferred_drives_are_weighed() {
        let w = PlacementWeights::default();
        let mut a = cand(0, "t0");
        let b = cand(1, "t1");
        a.busy_degree = 0.9;
        assert_eq!(
            choose(&[a.clone(), b.clone()], 1, 0, 0, &w).unwrap(),
            vec![DriveId(1)]
        );
        a.busy_degree = 0.0;
        a.used_fraction = 0.8;
        assert_eq!(
            choose(&[a.clone(), b.clone()], 1, 0, 0, &w).unwrap(),
            vec![DriveId(1)]
        );
        a.preferred = true;
        assert_eq!(choose(&[a, b], 1, 0, 0, &w).unwrap(), vec![DriveId(0)]);
    }

    #[test]
    fn replicas_take_distinct_targets_then_distinct_drives() {
        let w = PlacementWeights::default();
        let drives = [cand(0, "t0"), cand(1, "t0"), cand(2, "t1")];
        let c = choose(&drives, 2, 0, 0, &w).unwrap();
        assert_ne!(
            drives[c[0].0 as usize].target,
            drives[c[1].0 as usize].target
        );
        let c = choose(&drives, 3, 0, 0, &w).unwrap();
        let mut ids: Vec<_> = c.iter().map(|d| d.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![0, 1, 2]);
    }

    #[test]
    fn a_full_pool_is_a_clear_error() {
        let w = PlacementWeights::default();
        let mut a = cand(0, "t0");
        a.slots_free = 0;
        let b = cand(1, "t1");
        assert_eq!(
            choose(&[a, b], 2, 0, 0, &w),
            Err(PlacementError::PoolFull {
                replicas: 2,
                available: 1
            })
        );
    }

    #[test]
    fn rotation_spreads_first_extents_of_different_volumes() {
        let w = PlacementWeights::default();
        let drives: Vec<_> = (0..4).map(|i| cand(i, "t")).collect();
        let firsts: std::collections::BTreeSet<_> = (0..4)
            .map(|v| choose(&drives, 1, 0, v, &w).unwrap()[0])
            .collect();
        assert_eq!(firsts.len(), 4);
    }

    #[test]
    fn weights_are_checked() {
        assert!(PlacementWeights::default().check().is_ok());
        let w = PlacementWeights {
            gamma_busy: -1.0,
            ..Default::default()
        };
        assert!(w.check().unwrap_err().contains("gamma_busy"));
        let w = PlacementWeights {
            alpha_extents: f64::NAN,
            ..Default::default()
        };
        assert!(w.check().is_err());
    }

    proptest! {
        #[test]
        fn chains_are_distinct_drives_with_free_slots(
            free in proptest::collection::vec(0u64..3, 1..8),
            targets in proptest::collection::vec(0u8..3, 8),
            replicas in 1usize..4,
            rotation in any::<u64>(),
        ) {
            let drives: Vec<_> = free.iter().enumerate().map(|(i, &f)| {
                let mut c = cand(u32::try_from(i).unwrap(), &format!("t{}", targets[i]));
                c.slots_free = f;
                c
            }).collect();
            let usable = drives.iter().filter(|c| c.slots_free > 0).count();
            match choose(&drives, replicas, 0, rotation, &PlacementWeights::default()) {
                Ok(chain) => {
                    prop_assert_eq!(chain.len(), replicas);
                    for (i, d) in chain.iter().enumerate() {
                        prop_assert!(!chain[..i].contains(d));
                        prop_assert!(drives[d.0 as usize].slots_free > 0);
                    }
                    let distinct_targets: std::collections::BTreeSet<_> = drives.iter().filter(|c| c.slots_free > 0).map(|c| &c.target).collect();
                    let used_targets: std::collections::BTreeSet<_> = chain.iter().map(|d| &drives[d.0 as usize].target).collect();
                    prop_assert_eq!(used_targets.len(), replicas.min(distinct_targets.len()));
                }
                Err(PlacementError::PoolFull { .. }) => prop_assert!(usable < replicas),
            }
        }
    }
}
