//! The bandwidth auction (Flint §4.6, Algorithms 3 and 4), sans-IO.
//!
//! Capacity and bandwidth are allocated apart: a small volume may earn as
//! much bandwidth as a large one, and a large one no more than its weighted
//! share. A volume client may send an I/O to a drive only while it holds
//! an unspent **slice** of that drive's bandwidth; the [`Arbiter`] in the
//! control plane sells the slices, the [`Wallet`] in each client spends
//! them.
//!
//! **The arbiter** (Algorithm 4) runs once per epoch:
//!
//! 1. `estimate_avail_bw()`: every drive's capacity is estimated from what
//!    the last epoch showed (below); a target port (IOPipe) and a client's
//!    NetPipe have the capacity the operator gave them, or none.
//! 2. `reassign_quota()`: deficit round-robin over the active sessions
//!    (one per client, volume and drive). Each round a session's deficit
//!    vector (NetPipe, IOPipe, drive) grows by a quantum in proportion to
//!    its weight (its tenant's SLO class); a slice is granted only when all
//!    three deficits cover its cost **and** all three entities still have
//!    that much budget left this epoch (gang admission). Granting subtracts
//!    the cost from both. A session that showed no appetite (it never ran
//!    out of slices last epoch) is granted at most 1.5 times what it spent,
//!    so the rest goes to the hungry ones: the result is weighted max-min
//!    fair.
//! 3. A session that sent no bid for `idle_us` is idle: its deficit is
//!    cleared and it gets nothing until it bids again (Algorithm 4, lines
//!    9-12), so its share is reclaimed at once.
//!
//! A `reserve_share` of every drive's budget is held back each epoch: a
//! session that wakes mid-epoch with no slice is given one from it at its
//! first bid instead of waiting for the next epoch.
//!
//! **Capacity.** Bandwidth slices are only fair if they add up to what the
//! drive can do: granted beyond that, the I/O queues in the drive and the
//! drive's own order decides who gets served (with 4 KiB and 128 KiB
//! readers on one SSD, the large reader takes most of it). So each drive's
//! estimate follows its **queueing**, as a congestion window follows loss:
//! the epoch's mean latency above the unloaded latency of each I/O's size
//! (from the shadow view), in units of the longest unloaded latency among
//! the sizes seen, that is, roughly how many of the slowest I/Os the
//! average one waited behind. Neither a fixed delay target nor each I/O's
//! own inflation would do: one 128 KiB read on a slow drive takes longer
//! than a fast drive's whole queue, and a 4 KiB read behind a single 128
//! KiB transfer is inflated tenfold without any queue. When the measure
//! passes `inflation_target`, the estimate drops to `back_off` times what
//! the drive completed. When a session leaves most of its share unspent
//! without running out while its own I/O is *contended* (waits, on average,
//! as long again as its unloaded latency: held up by other I/O; the view
//! measures it per session, so that a heavy session's many samples cannot
//! hide a light one's stalls), beside one that moves a quarter more bytes
//! than it, the first is held back by the second's queue, and equal slices
//! only mean equal bandwidth once both can spend them. (A session whose own
//! I/O does not wait here is not held back here, whatever it leaves
//! unspent: its client may be waiting for slices of other drives.) Then the
//! drive's *heavy cap* (what a session that is not held back may be
//! granted) shrinks by `back_off` (the heavy one need not be out of slices:
//! capping makes it so). The held-back session is never capped and its
//! share follows the estimate, which this rule leaves alone: a light,
//! latency-bound session looks held back whatever the estimate, and
//! shrinking the estimate shrank its share until it ran out of slices
//! itself. Otherwise, while sessions run out of slices, the cap grows by
//! `probe_up` while it binds, then the estimate (a drive that cannot
//! complete more fills its clients' queues, and they stop running out).
//! While the auction is off the estimate follows what the drive completes,
//! so that switching it on starts from the drive's real pace. An operator's
//! figure caps it.
//!
//! **Shares.** Every active session keeps its whole weighted share of each
//! epoch, hungry or not (Flint: "a large volume cannot take more than its
//! (weighted) equal share"); only an idle session's share goes to the
//! others. Handing an active but light session's unspent share to a heavy
//! one would feed the very queue that keeps the light one light, and the
//! light one, when it wants more again, would wait for the next epoch.
//! What the drive can give beyond the shares in use goes to the hungry
//! through the capacity estimate: while sessions run out of slices and no
//! one is held back, it grows.
//!
//! **The client** (Algorithm 3): an I/O takes `bytes` from its session's
//! purse and goes at once while the purse is positive (it may overdraw;
//! the debt is paid from what comes next); otherwise it waits in the
//! client, in order, and the session bids as hungry. A grant is paced: an
//! eighth of it is spendable at once, the rest accrues evenly over the
//! epoch, so a session never dumps its whole slice into the drive's queue
//! at the start of an epoch. Each epoch's grant replaces what is left of
//! the last (slices expire). The client reports
//! what it spent, cumulatively, in every bid (piggybacked on the view's
//! sync, Algorithm 3 lines 12-14). If no grant arrives for `fallback_us`
//! (the control plane is down), the wallet stops metering and lets every
//! I/O through: an I/O never waits for the control plane beyond its
//! slices, and losing the control plane costs fairness, never service.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// A session moving this many times a starved one's bytes holds it back.
const HEAVIER: f64 = 1.25;
/// A session that spent less than this share of its grant without running
/// out was held back (or needed less).
const STARVED: f64 = 0.7;
/// Epochs in a row a session must be held back before the contention rule
/// acts on it: between two sessions alike (4 KiB mixes), which one spent
/// less flips from epoch to epoch, and capping on each flip cost W5 a
/// sixth of its bandwidth; a light session beside a heavy one stays held
/// back epoch after epoch.
const HELD_BACK_EPOCHS_MIN: u32 = 2;
/// Mean contention (an I/O's wait as a multiple of its own unloaded
/// latency) beyond which a session's I/O counts as contended: if it also
/// leaves its share unspent, it is taken to be held back by the others.
const CONTENDED: f64 = 1.0;
/// An epoch may run this fraction of a period early (1/8).
const EPOCH_SLACK: u64 = 8;
/// Weight of the newest epoch in a drive's smoothed completion rate.
const COMPLETED_EWMA: f64 = 0.5;
/// A hungry wallet bids this long after the auction it waits for ran.
const BID_AFTER_AUCTION_US: u64 = 500;
/// Sessions the arbiter tracks, at most.
pub const SESSIONS_MAX: usize = 65_536;
/// Sessions one bid may name, at most.
pub const BID_SESSIONS_MAX: usize = 4096;
/// I/Os a wallet holds back, at most (beyond it, I/Os go unmetered).
pub const WAITERS_MAX: usize = 1 << 16;
/// DRR rounds per epoch, at most (a guard; a round grants at least one
/// slice or moves every session's deficit closer to one).
const ROUNDS_MAX: usize = 1 << 20;

/// The arbiter's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuctionConfig {
    /// Time between auctions; grants are for one epoch.
    pub epoch_us: u64,
    /// The unit of a grant.
    pub slice_bytes: u64,
    /// Share of each drive's budget held back for sessions that wake
    /// mid-epoch.
    pub reserve_share: f64,
    /// A session that sent no bid for this long is idle.
    pub idle_us: u64,
    /// The drive's estimate backs off when its I/O waits, on average, longer
    /// than this many of its slowest I/O's unloaded latencies.
    pub inflation_target: f64,
    /// I/Os an epoch must show before its inflation counts.
    pub signal_ios_min: u64,
    /// Estimate of a drive the auction has not measured yet.
    pub drive_bytes_per_sec_initial: f64,
    /// The estimate never falls below this.
    pub drive_bytes_per_sec_min: f64,
    /// Growth per epoch while sessions run out of slices and the drive
    /// keeps up.
    pub probe_up: f64,
    /// Share of the completed bandwidth kept when the drive queues too
    /// long.
    pub back_off: f64,
    /// What a written byte costs on the drive, in read bytes (1: slices
    /// are shared by bytes, whatever their direction).
    pub write_cost: f64,
}

impl Default for AuctionConfig {
    fn default() -> Self {
        AuctionConfig {
            epoch_us: 50_000,
            slice_bytes: 256 << 10,
            reserve_share: 0.1,
            idle_us: 500_000,
            inflation_target: 2.0,
            signal_ios_min: 8,
            drive_bytes_per_sec_initial: 256e6,
            drive_bytes_per_sec_min: 4e6,
            probe_up: 1.1,
            back_off: 0.9,
            write_cost: 1.0,
        }
    }
}

impl AuctionConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.epoch_us < 1_000 {
            return Err(format!(
                "auction epoch {} us must be at least 1000",
                self.epoch_us
            ));
        }
        if self.slice_bytes < 4096 {
            return Err(format!(
                "auction slice {} bytes must be at least 4096",
                self.slice_bytes
            ));
        }
        if !(0.0..1.0).contains(&self.reserve_share) {
            return Err(format!(
                "auction reserve_share {} must be in 0..1",
                self.reserve_share
            ));
        }
        for (name, v) in [
            ("inflation_target", self.inflation_target),
            (
                "drive_bytes_per_sec_initial",
                self.drive_bytes_per_sec_initial,
            ),
            ("drive_bytes_per_sec_min", self.drive_bytes_per_sec_min),
            ("write_cost", self.write_cost),
        ] {
            if !v.is_finite() || v <= 0.0 {
                return Err(format!("auction {name} = {v} must be a finite number > 0"));
            }
        }
        if !self.probe_up.is_finite() || self.probe_up <= 1.0 {
            return Err(format!("auction probe_up {} must be > 1", self.probe_up));
        }
        if !(self.back_off > 0.0 && self.back_off < 1.0) {
            return Err(format!(
                "auction back_off {} must be in (0, 1)",
                self.back_off
            ));
        }
        Ok(())
    }
}

/// One session of a bid: a volume's I/O from this client to one drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionBid {
    pub volume: u64,
    pub drive: u64,
    /// Bytes spent since the wallet started (cumulative, so a lost bid
    /// loses nothing).
    pub spent_bytes_total: u64,
    /// Of which written.
    pub written_bytes_total: u64,
    /// I/O waited for a slice since the last bid.
    pub hungry: bool,
}

/// A client's bid: what it spent and where it wants more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    pub client: String,
    pub sessions: Vec<SessionBid>,
}

/// Slices of one session for one epoch: `bytes` is the total granted this
/// epoch so far (a repeat carries nothing new).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub volume: u64,
    pub drive: u64,
    pub epoch: u64,
    pub bytes: u64,
}

/// The arbiter's answer to a bid: whether the auction runs, and every
/// grant of the client's sessions for the current epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    pub on: bool,
    pub epoch: u64,
    pub epoch_us: u64,
    pub grants: Vec<Grant>,
    /// When the next auction runs, from the answer's time: a hungry client
    /// bids just after it.
    pub next_epoch_in_us: u64,
}

/// What the view saw of a drive over the last epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DriveSignal {
    /// I/Os completed.
    pub ios: u64,
    pub bytes: u64,
    /// Their mean latency above the unloaded latency of their size.
    pub queue_delay_us_mean: f64,
    /// That mean in units of the longest unloaded latency among the sizes
    /// seen: about how many of the slowest I/Os the average one waited for.
    pub inflation_mean: f64,
    /// Each I/O's excess as a multiple of its own unloaded latency (capped
    /// at 10), averaged per session, the worst-off session's: how much its
    /// I/O is held up by other I/O.
    pub contention_mean: f64,
    /// That mean for each session (client, then volume) with enough
    /// samples to count; I/O that is no volume's counts in
    /// `contention_mean` only. The contention rule takes a session that
    /// leaves its share unspent to be held back by the others only when its
    /// own I/O waited: a client whose queue depth is tied up waiting for
    /// slices of *other* drives also leaves its share here unspent, and
    /// capping the sessions that do move here would cap the victim.
    pub contention_by_session: BTreeMap<String, BTreeMap<u64, f64>>,
}

impl DriveSignal {
    /// The contention of `client`'s I/O for `volume` (0 when it had too few
    /// samples to count).
    pub fn session_contention(&self, client: &str, volume: u64) -> f64 {
        self.contention_by_session
            .get(client)
            .and_then(|v| v.get(&volume))
            .copied()
            .unwrap_or(0.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuctionError {
    #[error("a bid names {got} sessions; at most {BID_SESSIONS_MAX}")]
    BidTooLarge { got: usize },
    #[error("the auction already tracks {SESSIONS_MAX} sessions")]
    TooManySessions,
    #[error("client name must be 1..=256 bytes")]
    ClientName,
}

/// Which entity a deficit or a budget belongs to.
const NET: usize = 0;
const IO: usize = 1;
const DRIVE: usize = 2;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SessionKey {
    client: String,
    volume: u64,
    drive: u64,
}

#[derive(Clone, Debug, Default)]
struct SessionState {
    deficit: [f64; 3],
    granted: u64,
    granted_last: u64,
    spent_total: u64,
    written_total: u64,
    spent_epoch: u64,
    spent_last: u64,
    written_epoch: u64,
    written_last: u64,
    hungry_epoch: bool,
    hungry_last: bool,
    /// Granted from the reserve this epoch.
    topped_up: bool,
    /// Epochs in a row it was held back (`held_back`).
    held_back_epochs: u32,
    last_bid_us: u64,
    idle: bool,
}

/// A session that left much of its last grant unspent without running
/// out of slices: held back by others' I/O in the drive (or it needed
/// less). Never capped by the contention rule.
fn held_back(s: &SessionState) -> bool {
    #[allow(clippy::cast_precision_loss)]
    let short = (s.spent_last as f64) < STARVED * s.granted_last as f64;
    !s.hungry_last && s.granted_last > 0 && short
}

/// Held back by the others' I/O, as the contention rule takes it: it left
/// its share unspent without running out for [`HELD_BACK_EPOCHS_MIN`]
/// epochs while its own I/O waited (`contention`, its mean on the drive).
fn held_back_by_others(s: &SessionState, contention: f64) -> bool {
    !s.idle && s.held_back_epochs >= HELD_BACK_EPOCHS_MIN && contention >= CONTENDED
}

/// One drive's sessions as the estimate weighs them.
#[derive(Clone, Copy, Debug, Default)]
struct Appetite {
    hungry: bool,
    granted: u64,
    starved_spent: Option<u64>,
    spent_max: u64,
}

/// A drive's estimate and budget.
#[derive(Clone, Debug)]
pub struct DriveAuction {
    pub port: String,
    /// Estimated bandwidth.
    pub bytes_per_sec: f64,
    /// The operator's figure, if any (caps the estimate).
    pub bytes_per_sec_max: Option<f64>,
    /// Budget left this epoch for top-ups (the reserve plus what DRR left).
    pub reserve_bytes: f64,
    /// This epoch's grant unit: a sixteenth of the drive's budget, within
    /// 4 KiB..=`slice_bytes`, so that a slow drive still sells slices.
    pub slice_bytes: u64,
    /// Granted this epoch.
    pub granted_bytes: u64,
    /// What the last epoch showed.
    pub last: DriveSignal,
    /// The last epoch's I/O queued beyond `inflation_target`.
    pub inflated: bool,
    /// What the drive completed per second, smoothed over epochs (telemetry
    /// arrives in batches, so one epoch alone is noisy).
    pub completed_bytes_per_sec: f64,
    /// The most a session that is not held back is granted per second (at
    /// the top weight; less in proportion below it): the contention rule's
    /// lever. A held-back session is never capped, so shrinking this only
    /// ever slows the sessions that hold it back. At most the estimate.
    pub heavy_cap_bytes_per_sec: f64,
}

/// One session as the arbiter sees it (for the API and metrics).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionView {
    pub client: String,
    pub volume: u64,
    pub drive: u64,
    pub weight: f64,
    pub granted_bytes: u64,
    pub spent_last_bytes: u64,
    pub hungry: bool,
    pub idle: bool,
    /// Its own I/O's contention on the drive last epoch (see
    /// [`DriveSignal::contention_by_session`]).
    pub contention_mean: f64,
    /// Held back by the others' I/O as the contention rule sees it: it
    /// left its share unspent without running out for two epochs or more
    /// while its own I/O waited. Such a session is never capped.
    pub held_back: bool,
}

/// The arbiter (Algorithm 4).
#[derive(Debug)]
pub struct Arbiter {
    cfg: AuctionConfig,
    on: bool,
    drives: BTreeMap<u64, DriveAuction>,
    port_bytes_per_sec: BTreeMap<String, f64>,
    client_bytes_per_sec: BTreeMap<String, f64>,
    weights: HashMap<u64, f64>,
    sessions: BTreeMap<SessionKey, SessionState>,
    epoch: u64,
    next_epoch_us: u64,
    /// Where the next epoch's DRR walk starts, so that no session is
    /// always first to the remainder.
    rotation: usize,
    /// Budgets left this epoch per port and client (bytes).
    port_left: BTreeMap<String, f64>,
    client_left: BTreeMap<String, f64>,
}

impl Arbiter {
    pub fn new(cfg: AuctionConfig) -> Result<Arbiter, String> {
        cfg.check()?;
        Ok(Arbiter {
            cfg,
            on: false,
            drives: BTreeMap::new(),
            port_bytes_per_sec: BTreeMap::new(),
            client_bytes_per_sec: BTreeMap::new(),
            weights: HashMap::new(),
            sessions: BTreeMap::new(),
            epoch: 0,
            next_epoch_us: 0,
            rotation: 0,
            port_left: BTreeMap::new(),
            client_left: BTreeMap::new(),
        })
    }

    pub fn config(&self) -> &AuctionConfig {
        &self.cfg
    }

    /// Switches the auction on or off. Off, every grant answer says so and
    /// wallets stop metering.
    pub fn set_on(&mut self, on: bool) {
        self.on = on;
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Adds or updates a drive: its port and the operator's bandwidth
    /// figure, if any.
    pub fn set_drive(&mut self, drive: u64, port: &str, bytes_per_sec_max: Option<f64>) {
        let max = bytes_per_sec_max.filter(|b| b.is_finite() && *b > 0.0);
        let initial = self.cfg.drive_bytes_per_sec_initial;
        let d = self.drives.entry(drive).or_insert_with(|| DriveAuction {
            port: port.to_owned(),
            bytes_per_sec: max.unwrap_or(initial),
            bytes_per_sec_max: max,
            reserve_bytes: 0.0,
            slice_bytes: 4096,
            granted_bytes: 0,
            last: DriveSignal::default(),
            inflated: false,
            completed_bytes_per_sec: 0.0,
            heavy_cap_bytes_per_sec: max.unwrap_or(initial),
        });
        d.port = port.to_owned();
        d.bytes_per_sec_max = max;
        if let Some(m) = max {
            d.bytes_per_sec = d.bytes_per_sec.min(m);
        }
    }

    /// Forgets drives not in `keep`, and their sessions.
    pub fn retain_drives(&mut self, keep: &std::collections::BTreeSet<u64>) {
        self.drives.retain(|d, _| keep.contains(d));
        self.sessions.retain(|k, _| keep.contains(&k.drive));
    }

    /// A target port's bandwidth (None: not a constraint).
    pub fn set_port_capacity(&mut self, port: &str, bytes_per_sec: Option<f64>) {
        match bytes_per_sec.filter(|b| b.is_finite() && *b > 0.0) {
            Some(b) => self.port_bytes_per_sec.insert(port.to_owned(), b),
            None => self.port_bytes_per_sec.remove(port),
        };
    }

    /// A client's NetPipe bandwidth (None: not a constraint).
    pub fn set_client_capacity(&mut self, client: &str, bytes_per_sec: Option<f64>) {
        match bytes_per_sec.filter(|b| b.is_finite() && *b > 0.0) {
            Some(b) => self.client_bytes_per_sec.insert(client.to_owned(), b),
            None => self.client_bytes_per_sec.remove(client),
        };
    }

    /// A volume's weight (its tenant's SLO class; 1 when never set).
    pub fn set_weight(&mut self, volume: u64, weight: f64) {
        if weight.is_finite() && weight > 0.0 {
            self.weights.insert(volume, weight);
        }
    }

    fn weight(&self, volume: u64) -> f64 {
        self.weights.get(&volume).copied().unwrap_or(1.0)
    }

    /// What a slice of `slice` bytes costs each entity for a session whose
    /// recent writes are `write_share` of its bytes.
    fn slice_cost(&self, slice: u64, write_share: f64) -> [f64; 3] {
        #[allow(clippy::cast_precision_loss)]
        let s = slice as f64;
        let drive = s * (1.0 + write_share.clamp(0.0, 1.0) * (self.cfg.write_cost - 1.0));
        [s, s, drive]
    }

    /// Takes a bid (Algorithm 3's report): records what each session spent,
    /// tops up a hungry session that has no slice this epoch from the
    /// drive's reserve, and answers with the client's grants.
    pub fn handle_bid(&mut self, now_us: u64, bid: &Bid) -> Result<Grants, AuctionError> {
        if bid.sessions.len() > BID_SESSIONS_MAX {
            return Err(AuctionError::BidTooLarge {
                got: bid.sessions.len(),
            });
        }
        if bid.client.is_empty() || bid.client.len() > 256 {
            return Err(AuctionError::ClientName);
        }
        for s in &bid.sessions {
            if !self.drives.contains_key(&s.drive) {
                continue; // a drive the pool no longer has
            }
            let key = SessionKey {
                client: bid.client.clone(),
                volume: s.volume,
                drive: s.drive,
            };
            if !self.sessions.contains_key(&key) && self.sessions.len() >= SESSIONS_MAX {
                return Err(AuctionError::TooManySessions);
            }
            let st = self
                .sessions
                .entry(key.clone())
                .or_insert_with(|| SessionState {
                    spent_total: s.spent_bytes_total,
                    written_total: s.written_bytes_total,
                    ..SessionState::default()
                });
            // A total that went back means the client restarted.
            let spent = s.spent_bytes_total.saturating_sub(st.spent_total);
            let written = s.written_bytes_total.saturating_sub(st.written_total);
            st.spent_total = s.spent_bytes_total;
            st.written_total = s.written_bytes_total;
            st.spent_epoch = st.spent_epoch.saturating_add(spent);
            st.written_epoch = st.written_epoch.saturating_add(written);
            st.hungry_epoch |= s.hungry;
            st.last_bid_us = now_us;
            st.idle = false;
            if self.on && s.hungry && !st.topped_up && st.granted == 0 {
                self.top_up(&key);
            }
        }
        Ok(self.grants_for(&bid.client, now_us))
    }

    /// One slice from the drive's reserve to a session that has none.
    fn top_up(&mut self, key: &SessionKey) {
        let Some(d) = self.drives.get(&key.drive) else {
            return;
        };
        let port = d.port.clone();
        let slice = d.slice_bytes;
        let cost = self.slice_cost(slice, 0.0);
        let fits = d.reserve_bytes >= cost[DRIVE]
            && self.port_left.get(&port).is_none_or(|l| *l >= cost[IO])
            && self
                .client_left
                .get(&key.client)
                .is_none_or(|l| *l >= cost[NET]);
        if !fits {
            return;
        }
        if let Some(d) = self.drives.get_mut(&key.drive) {
            d.reserve_bytes -= cost[DRIVE];
            d.granted_bytes += slice;
        }
        if let Some(l) = self.port_left.get_mut(&port) {
            *l -= cost[IO];
        }
        if let Some(l) = self.client_left.get_mut(&key.client) {
            *l -= cost[NET];
        }
        if let Some(st) = self.sessions.get_mut(key) {
            st.granted += slice;
            st.topped_up = true;
        }
    }

    /// The current grants of `client`'s sessions.
    pub fn grants_for(&self, client: &str, now_us: u64) -> Grants {
        let lo = SessionKey {
            client: client.to_owned(),
            volume: 0,
            drive: 0,
        };
        let grants = self
            .sessions
            .range(lo..)
            .take_while(|(k, _)| k.client == client)
            .filter(|(_, s)| s.granted > 0)
            .map(|(k, s)| Grant {
                volume: k.volume,
                drive: k.drive,
                epoch: self.epoch,
                bytes: s.granted,
            })
            .collect();
        Grants {
            on: self.on,
            epoch: self.epoch,
            epoch_us: self.cfg.epoch_us,
            grants,
            next_epoch_in_us: self.next_epoch_us.saturating_sub(now_us),
        }
    }

    /// Runs an auction when one is due. `signal` gives what the view saw of
    /// each drive since the last call. Returns whether one ran.
    pub fn poll_epoch(&mut self, now_us: u64, signal: impl Fn(u64) -> Option<DriveSignal>) -> bool {
        // A timer that fires a little early still runs the epoch (else it
        // would skip a whole period); a late call runs one, not a burst.
        if now_us.saturating_add(self.cfg.epoch_us / EPOCH_SLACK) < self.next_epoch_us {
            return false;
        }
        self.next_epoch_us = now_us + self.cfg.epoch_us;
        self.epoch += 1;
        for st in self.sessions.values_mut() {
            st.granted_last = st.granted;
            st.granted = 0;
            st.spent_last = st.spent_epoch;
            st.spent_epoch = 0;
            st.written_last = st.written_epoch;
            st.written_epoch = 0;
            st.hungry_last = st.hungry_epoch;
            st.hungry_epoch = false;
            st.topped_up = false;
            st.held_back_epochs = if held_back(st) {
                st.held_back_epochs.saturating_add(1)
            } else {
                0
            };
            if now_us.saturating_sub(st.last_bid_us) >= self.cfg.idle_us {
                st.idle = true;
                st.deficit = [0.0; 3];
            }
        }
        // Idle for ten times the idle time: forgotten.
        let forget = self.cfg.idle_us.saturating_mul(10);
        self.sessions
            .retain(|_, s| now_us.saturating_sub(s.last_bid_us) < forget);
        self.estimate(&signal);
        self.reassign();
        true
    }

    /// `estimate_avail_bw()`: every drive's bandwidth from the last epoch.
    fn estimate(&mut self, signal: &impl Fn(u64) -> Option<DriveSignal>) {
        #[allow(clippy::cast_precision_loss)]
        let epoch_s = self.cfg.epoch_us as f64 / 1e6;
        // Per drive: a session ran out of slices; what was granted; the
        // least a starved session spent (an active session that left much
        // of its grant unspent without running out); the most any active
        // session spent.
        let signals: BTreeMap<u64, DriveSignal> = self
            .drives
            .keys()
            .map(|id| (*id, signal(*id).unwrap_or_default()))
            .collect();
        let mut appetite: BTreeMap<u64, Appetite> = BTreeMap::new();
        for (k, s) in &self.sessions {
            let a = appetite.entry(k.drive).or_default();
            a.hungry |= s.hungry_last;
            a.granted += s.granted_last;
            if s.idle {
                continue;
            }
            a.spent_max = a.spent_max.max(s.spent_last);
            let contention = signals
                .get(&k.drive)
                .map_or(0.0, |sig| sig.session_contention(&k.client, k.volume));
            if held_back_by_others(s, contention) {
                a.starved_spent = Some(
                    a.starved_spent
                        .map_or(s.spent_last, |m| m.min(s.spent_last)),
                );
            }
        }
        let cfg = self.cfg;
        let on = self.on;
        for (id, d) in &mut self.drives {
            let sig = signals.get(id).cloned().unwrap_or_default();
            let a = appetite.get(id).copied().unwrap_or_default();
            let (hungry, granted) = (a.hungry, a.granted);
            // Held back by another: a starved session whose I/O waits in
            // the drive (contended) beside one that moves a quarter more
            // than it (a lone session, or sessions alike, never count as
            // held back by each other).
            #[allow(clippy::cast_precision_loss)]
            let starved = a
                .starved_spent
                .is_some_and(|least| a.spent_max as f64 > least as f64 * HEAVIER);
            #[allow(clippy::cast_precision_loss)]
            let completed = sig.bytes as f64 / epoch_s;
            d.completed_bytes_per_sec += COMPLETED_EWMA * (completed - d.completed_bytes_per_sec);
            d.inflated = sig.ios >= cfg.signal_ios_min && sig.inflation_mean > cfg.inflation_target;
            if !on {
                // Off, the drive runs as fast as its clients push it: what
                // it completes is where the auction starts when switched on.
                if d.completed_bytes_per_sec > 0.0 {
                    d.bytes_per_sec = d.completed_bytes_per_sec;
                }
            } else if d.inflated {
                d.bytes_per_sec =
                    d.bytes_per_sec.min(d.completed_bytes_per_sec.max(1.0)) * cfg.back_off;
            } else if starved {
                // One session moves far more than another that, with its
                // share unspent, waits behind it in the drive: cap the
                // sessions that are not held back, until the first runs
                // out of slices and the queue shrinks (equal shares only
                // mean equal bandwidth once both can spend them). The
                // estimate stays: shrinking it would shrink the held-back
                // session's share too, and a light, latency-bound session
                // (a database beside a streamer) that never spends its
                // share looks held back whatever the estimate, so it would
                // shrink until that session ran out of slices itself.
                d.heavy_cap_bytes_per_sec =
                    d.heavy_cap_bytes_per_sec.min(d.bytes_per_sec) * cfg.back_off;
            } else if hungry && granted > 0 {
                // Sessions want more and none is held back: probe, the cap
                // first while it binds. A drive that cannot complete more
                // fills its clients' queues, so they stop running out of
                // slices and probing stops.
                if d.heavy_cap_bytes_per_sec < d.bytes_per_sec {
                    d.heavy_cap_bytes_per_sec *= cfg.probe_up;
                } else {
                    d.bytes_per_sec *= cfg.probe_up;
                    d.heavy_cap_bytes_per_sec = d.bytes_per_sec;
                }
            }
            d.bytes_per_sec = d.bytes_per_sec.max(cfg.drive_bytes_per_sec_min);
            if let Some(m) = d.bytes_per_sec_max {
                d.bytes_per_sec = d.bytes_per_sec.min(m);
            }
            if !on {
                d.heavy_cap_bytes_per_sec = d.bytes_per_sec;
            }
            d.heavy_cap_bytes_per_sec = d.heavy_cap_bytes_per_sec.clamp(
                cfg.drive_bytes_per_sec_min.min(d.bytes_per_sec),
                d.bytes_per_sec,
            );
            d.last = sig;
        }
    }

    /// `reassign_quota()`: DRR with gang admission over every active
    /// session.
    fn reassign(&mut self) {
        #[allow(clippy::cast_precision_loss)]
        let epoch_s = self.cfg.epoch_us as f64 / 1e6;
        let reserve = self.cfg.reserve_share;
        let slice_max = self.cfg.slice_bytes;
        // Each drive's budget, its slice, and what is held back.
        let mut drive_left: BTreeMap<u64, f64> = BTreeMap::new();
        let mut held: BTreeMap<u64, f64> = BTreeMap::new();
        for (id, d) in &mut self.drives {
            let budget = d.bytes_per_sec * epoch_s;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let sixteenth = (budget / 16.0) as u64 / 4096 * 4096;
            d.slice_bytes = sixteenth.clamp(4096, slice_max);
            #[allow(clippy::cast_precision_loss)]
            let hold = (budget * reserve).max(d.slice_bytes as f64).min(budget);
            held.insert(*id, hold);
            drive_left.insert(*id, budget - hold);
        }
        self.port_left = self
            .port_bytes_per_sec
            .iter()
            .map(|(p, b)| (p.clone(), b * epoch_s))
            .collect();
        self.client_left = self
            .client_bytes_per_sec
            .iter()
            .map(|(c, b)| (c.clone(), b * epoch_s))
            .collect();
        for d in self.drives.values_mut() {
            d.granted_bytes = 0;
        }
        if !self.on {
            for d in self.drives.values_mut() {
                d.reserve_bytes = 0.0;
            }
            return;
        }
        // The walk: active sessions, rotated.
        let mut keys: Vec<SessionKey> = self
            .sessions
            .iter()
            .filter(|(k, s)| !s.idle && self.drives.contains_key(&k.drive))
            .map(|(k, _)| k.clone())
            .collect();
        if !keys.is_empty() {
            let r = self.rotation % keys.len();
            keys.rotate_left(r);
            self.rotation = self.rotation.wrapping_add(1);
        }
        let w_max = keys
            .iter()
            .map(|k| self.weight(k.volume))
            .fold(0.0f64, f64::max);
        struct Walk {
            key: SessionKey,
            port: String,
            slice: u64,
            quantum: f64,
            cost: [f64; 3],
            blocked: bool,
            /// Most it may be granted this epoch (the heavy cap), unless
            /// it is held back.
            cap: Option<f64>,
        }
        let mut walk: Vec<Walk> = keys
            .into_iter()
            .filter_map(|k| {
                let s = self.sessions.get(&k)?;
                let d = self.drives.get(&k.drive)?;
                let port = d.port.clone();
                let slice_bytes = d.slice_bytes;
                #[allow(clippy::cast_precision_loss)]
                let slice = slice_bytes as f64;
                #[allow(clippy::cast_precision_loss)]
                let write_share = if s.spent_last > 0 {
                    s.written_last as f64 / s.spent_last as f64
                } else {
                    0.0
                };
                let cap = (!held_back(s))
                    .then(|| d.heavy_cap_bytes_per_sec * epoch_s * self.weight(k.volume) / w_max);
                Some(Walk {
                    slice: slice_bytes,
                    quantum: slice * self.weight(k.volume) / w_max,
                    port,
                    cost: self.slice_cost(slice_bytes, write_share),
                    blocked: false,
                    cap,
                    key: k,
                })
            })
            .collect();
        for _ in 0..ROUNDS_MAX {
            let mut moving = false;
            for w in &mut walk {
                if w.blocked {
                    continue;
                }
                let Some(s) = self.sessions.get_mut(&w.key) else {
                    w.blocked = true;
                    continue;
                };
                for k in 0..3 {
                    s.deficit[k] += w.quantum;
                }
                moving = true;
                if (0..3).any(|k| s.deficit[k] < w.cost[k]) {
                    continue;
                }
                let drive = drive_left.get(&w.key.drive).copied().unwrap_or(0.0);
                let port = self.port_left.get(&w.port).copied();
                let client = self.client_left.get(&w.key.client).copied();
                #[allow(clippy::cast_precision_loss)]
                let under_cap = w
                    .cap
                    .is_none_or(|c| (s.granted + w.slice) as f64 <= c.max(w.slice as f64));
                let room = under_cap
                    && drive >= w.cost[DRIVE]
                    && port.is_none_or(|l| l >= w.cost[IO])
                    && client.is_none_or(|l| l >= w.cost[NET]);
                if !room {
                    // One of its three entities is spent: nothing more for
                    // this session this epoch, and its deficit does not
                    // pile up (Algorithm 4 resets it).
                    w.blocked = true;
                    s.deficit = [0.0; 3];
                    continue;
                }
                for k in 0..3 {
                    s.deficit[k] -= w.cost[k];
                }
                if let Some(l) = drive_left.get_mut(&w.key.drive) {
                    *l -= w.cost[DRIVE];
                }
                if let Some(l) = self.port_left.get_mut(&w.port) {
                    *l -= w.cost[IO];
                }
                if let Some(l) = self.client_left.get_mut(&w.key.client) {
                    *l -= w.cost[NET];
                }
                s.granted += w.slice;
            }
            if !moving {
                break;
            }
        }
        // A session keeps no credit beyond one slice.
        for w in &walk {
            if let Some(s) = self.sessions.get_mut(&w.key) {
                for k in 0..3 {
                    s.deficit[k] = s.deficit[k].min(w.cost[k]);
                }
            }
        }
        for (id, d) in &mut self.drives {
            let left = drive_left.get(id).copied().unwrap_or(0.0);
            d.reserve_bytes = left + held.get(id).copied().unwrap_or(0.0);
            d.granted_bytes = self
                .sessions
                .iter()
                .filter(|(k, _)| k.drive == *id)
                .map(|(_, s)| s.granted)
                .sum();
        }
    }

    /// Every drive's estimate and budget.
    pub fn drives(&self) -> impl Iterator<Item = (u64, &DriveAuction)> {
        self.drives.iter().map(|(id, d)| (*id, d))
    }

    /// Every session, for the API and metrics.
    pub fn sessions(&self) -> Vec<SessionView> {
        self.sessions
            .iter()
            .map(|(k, s)| {
                let contention_mean = self
                    .drives
                    .get(&k.drive)
                    .map_or(0.0, |d| d.last.session_contention(&k.client, k.volume));
                SessionView {
                    client: k.client.clone(),
                    volume: k.volume,
                    drive: k.drive,
                    weight: self.weight(k.volume),
                    granted_bytes: s.granted,
                    spent_last_bytes: s.spent_last,
                    hungry: s.hungry_last,
                    idle: s.idle,
                    contention_mean,
                    held_back: held_back_by_others(s, contention_mean),
                }
            })
            .collect()
    }
}

/// The client's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalletConfig {
    /// With no grant for this long, the wallet stops metering.
    pub fallback_us: u64,
}

impl Default for WalletConfig {
    fn default() -> Self {
        WalletConfig {
            fallback_us: 1_000_000,
        }
    }
}

/// Share of a grant spendable at once; the rest accrues over the epoch.
const BURST_SHARE: f64 = 0.125;

#[derive(Debug)]
struct Waiter<T> {
    bytes: u64,
    write: bool,
    token: T,
}

#[derive(Debug)]
struct Purse<T> {
    /// Bytes that may be spent now (negative: a debt).
    tokens: f64,
    /// Accrual, bytes per microsecond, until `accrue_until_us`.
    rate: f64,
    accrued_at_us: u64,
    accrue_until_us: u64,
    epoch: u64,
    granted_seen: u64,
    spent_total: u64,
    written_total: u64,
    waiters: VecDeque<Waiter<T>>,
    /// Waited since the last bid.
    hungry: bool,
    /// Spent since the last bid.
    moved: bool,
    /// Bid hungry this epoch already (a top-up comes at most once).
    asked: bool,
}

impl<T> Purse<T> {
    fn new() -> Purse<T> {
        Purse {
            tokens: 0.0,
            rate: 0.0,
            accrued_at_us: 0,
            accrue_until_us: 0,
            epoch: 0,
            granted_seen: 0,
            spent_total: 0,
            written_total: 0,
            waiters: VecDeque::new(),
            hungry: false,
            moved: false,
            asked: false,
        }
    }

    /// Adds what accrued since the last call.
    fn accrue(&mut self, now_us: u64) {
        let until = now_us.min(self.accrue_until_us);
        if until > self.accrued_at_us {
            #[allow(clippy::cast_precision_loss)]
            let dt = (until - self.accrued_at_us) as f64;
            self.tokens += self.rate * dt;
        }
        self.accrued_at_us = self.accrued_at_us.max(now_us);
    }

    /// Counts `bytes` spent; a metered spend takes them from the purse.
    fn spend(&mut self, bytes: u64, write: bool, metered: bool) {
        if metered {
            #[allow(clippy::cast_precision_loss)]
            let b = bytes as f64;
            self.tokens -= b;
        }
        self.spent_total = self.spent_total.saturating_add(bytes);
        if write {
            self.written_total = self.written_total.saturating_add(bytes);
        }
        self.moved = true;
    }

    /// A new epoch's grant of `bytes`, paced over `epoch_us`.
    fn grant(&mut self, now_us: u64, epoch: u64, bytes: u64, epoch_us: u64) {
        self.accrue(now_us);
        #[allow(clippy::cast_precision_loss)]
        let b = bytes as f64;
        // Slices expire with their epoch; a debt carries over.
        self.tokens = self.tokens.min(0.0) + b * BURST_SHARE;
        #[allow(clippy::cast_precision_loss)]
        let span = epoch_us.max(1) as f64;
        self.rate = b * (1.0 - BURST_SHARE) / span;
        self.accrued_at_us = now_us;
        self.accrue_until_us = now_us.saturating_add(epoch_us);
        self.epoch = epoch;
        self.granted_seen = bytes;
    }

    /// When the purse turns positive again, if it accrues.
    fn positive_at_us(&self) -> Option<u64> {
        if self.tokens > 0.0 {
            return Some(self.accrued_at_us);
        }
        if self.rate <= 0.0 {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let wait = (-self.tokens / self.rate).ceil() as u64 + 1;
        let at = self.accrued_at_us.saturating_add(wait);
        (at <= self.accrue_until_us).then_some(at)
    }
}

/// What [`Wallet::request`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Spend<T> {
    /// The I/O may go now.
    Go(T),
    /// It waits for a slice; its token comes back from
    /// [`Wallet::handle_grants`] or [`Wallet::poll_release`].
    Wait,
}

/// A client's purses (Algorithm 3). `T` wakes a waiting I/O.
#[derive(Debug)]
pub struct Wallet<T> {
    cfg: WalletConfig,
    on: bool,
    epoch_us: u64,
    last_grants_us: Option<u64>,
    last_bid_us: u64,
    /// When the arbiter runs its next auction, on this wallet's clock.
    next_epoch_at_us: Option<u64>,
    /// The newest epoch granted.
    epoch: u64,
    purses: HashMap<(u64, u64), Purse<T>>,
    waiting: usize,
}

impl<T> Wallet<T> {
    pub fn new(cfg: WalletConfig) -> Wallet<T> {
        Wallet {
            cfg,
            on: false,
            epoch_us: AuctionConfig::default().epoch_us,
            last_grants_us: None,
            last_bid_us: 0,
            next_epoch_at_us: None,
            epoch: 0,
            purses: HashMap::new(),
            waiting: 0,
        }
    }

    /// Whether I/O is metered now: the auction is on and grants arrive.
    pub fn metered(&self, now_us: u64) -> bool {
        self.on
            && self
                .last_grants_us
                .is_some_and(|t| now_us.saturating_sub(t) < self.cfg.fallback_us)
    }

    /// An I/O of `bytes` to `drive` for `volume`: it goes now while its
    /// purse is positive (or nothing is metered), else it waits behind the
    /// session's earlier waiters.
    pub fn request(
        &mut self,
        now_us: u64,
        volume: u64,
        drive: u64,
        bytes: u64,
        write: bool,
        token: T,
    ) -> Spend<T> {
        if self.try_spend(now_us, volume, drive, bytes, write) {
            return Spend::Go(token);
        }
        self.wait(volume, drive, bytes, write, token);
        Spend::Wait
    }

    /// [`Self::request`] without a token: true when the I/O may go now (and
    /// is counted); false when it must [`Self::wait`] (nothing was done).
    pub fn try_spend(
        &mut self,
        now_us: u64,
        volume: u64,
        drive: u64,
        bytes: u64,
        write: bool,
    ) -> bool {
        let metered = self.metered(now_us) && self.waiting < WAITERS_MAX;
        let p = self
            .purses
            .entry((volume, drive))
            .or_insert_with(Purse::new);
        p.accrue(now_us);
        if !metered || (p.waiters.is_empty() && p.tokens > 0.0) {
            p.spend(bytes, write, metered);
            return true;
        }
        false
    }

    /// Queues an I/O that [`Self::try_spend`] refused, behind the session's
    /// earlier waiters.
    pub fn wait(&mut self, volume: u64, drive: u64, bytes: u64, write: bool, token: T) {
        let p = self
            .purses
            .entry((volume, drive))
            .or_insert_with(Purse::new);
        p.waiters.push_back(Waiter {
            bytes,
            write,
            token,
        });
        p.hungry = true;
        self.waiting += 1;
    }

    /// Takes the arbiter's answer; returns the I/Os that may go now.
    pub fn handle_grants(&mut self, now_us: u64, g: &Grants) -> Vec<T> {
        self.on = g.on;
        self.epoch_us = g.epoch_us.max(1);
        self.last_grants_us = Some(now_us);
        self.next_epoch_at_us = Some(now_us.saturating_add(g.next_epoch_in_us));
        if g.epoch > self.epoch {
            self.epoch = g.epoch;
            for p in self.purses.values_mut() {
                p.asked = false;
            }
        }
        let epoch_us = self.epoch_us;
        for gr in &g.grants {
            let p = self
                .purses
                .entry((gr.volume, gr.drive))
                .or_insert_with(Purse::new);
            if gr.epoch > p.epoch {
                p.grant(now_us, gr.epoch, gr.bytes, epoch_us);
            } else if gr.epoch == p.epoch && gr.bytes > p.granted_seen {
                // A top-up: spendable at once.
                p.accrue(now_us);
                #[allow(clippy::cast_precision_loss)]
                let more = (gr.bytes - p.granted_seen) as f64;
                p.tokens += more;
                p.granted_seen = gr.bytes;
            }
        }
        // Sessions with no grant in a newer epoch: what they held expired.
        for p in self.purses.values_mut() {
            if p.epoch < g.epoch {
                p.accrue(now_us);
                p.tokens = p.tokens.min(0.0);
                p.rate = 0.0;
                p.epoch = g.epoch;
                p.granted_seen = 0;
            }
        }
        self.release(now_us)
    }

    /// Waiting I/Os that may go now: those their purse covers as it
    /// accrues, or all of them once metering stopped.
    pub fn poll_release(&mut self, now_us: u64) -> Vec<T> {
        self.release(now_us)
    }

    fn release(&mut self, now_us: u64) -> Vec<T> {
        let metered = self.metered(now_us);
        let mut out = Vec::new();
        for p in self.purses.values_mut() {
            p.accrue(now_us);
            while let Some(w) = p.waiters.front() {
                if metered && p.tokens <= 0.0 {
                    break;
                }
                let (bytes, write) = (w.bytes, w.write);
                if let Some(w) = p.waiters.pop_front() {
                    p.spend(bytes, write, metered);
                    out.push(w.token);
                }
            }
        }
        self.waiting -= out.len();
        out
    }

    /// The bid due now, if any. A session with I/O waiting bids at once
    /// the first time in an epoch (the arbiter may top it up from its
    /// reserve) and again just after the next auction; a session that
    /// spends reports twice an epoch; a wallet that has never heard from
    /// the arbiter bids at its first I/O.
    pub fn poll_bid(&mut self, now_us: u64) -> Option<Vec<SessionBid>> {
        let waiting = |p: &Purse<T>| p.hungry || !p.waiters.is_empty();
        let ask = self.purses.values().any(|p| waiting(p) && !p.asked);
        let auction_ran = self
            .next_epoch_at_us
            .is_some_and(|t| now_us >= t.saturating_add(BID_AFTER_AUCTION_US));
        let hungry = self.purses.values().any(waiting);
        let moved = self.purses.values().any(|p| p.moved);
        let since = now_us.saturating_sub(self.last_bid_us);
        let due = ask
            || (hungry && auction_ran)
            || (moved && since >= self.epoch_us / 2)
            || (self.last_grants_us.is_none() && moved);
        if !due {
            return None;
        }
        self.last_bid_us = now_us;
        if auction_ran {
            // Until the answer says when the next one runs.
            self.next_epoch_at_us = None;
        }
        let mut bids: Vec<SessionBid> = self
            .purses
            .iter_mut()
            .filter(|(_, p)| p.moved || waiting(p))
            .map(|(&(volume, drive), p)| {
                let b = SessionBid {
                    volume,
                    drive,
                    spent_bytes_total: p.spent_total,
                    written_bytes_total: p.written_total,
                    hungry: waiting(p),
                };
                p.asked |= b.hungry;
                p.hungry = false;
                p.moved = false;
                b
            })
            .collect();
        bids.sort_by_key(|b| (b.volume, b.drive));
        bids.truncate(BID_SESSIONS_MAX);
        Some(bids)
    }

    /// The next time the wallet has something to do by itself: a bid that
    /// falls due, a waiter its purse will cover, or the fallback.
    pub fn deadline_us(&self) -> Option<u64> {
        let hungry = self
            .purses
            .values()
            .any(|p| p.hungry || !p.waiters.is_empty());
        let moved = self.purses.values().any(|p| p.moved);
        let after_auction = self
            .next_epoch_at_us
            .filter(|_| hungry)
            .map(|t| t.saturating_add(BID_AFTER_AUCTION_US));
        let report = moved.then(|| self.last_bid_us.saturating_add(self.epoch_us / 2));
        let fallback = (self.waiting > 0)
            .then(|| {
                self.last_grants_us
                    .map(|t| t.saturating_add(self.cfg.fallback_us))
            })
            .flatten();
        let release = self
            .purses
            .values()
            .filter(|p| !p.waiters.is_empty())
            .filter_map(Purse::positive_at_us)
            .min();
        [after_auction, report, fallback, release]
            .into_iter()
            .flatten()
            .min()
    }

    /// I/Os waiting for slices.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// The purse of a session as of its last change: bytes spendable
    /// (negative: a debt).
    pub fn tokens(&self, volume: u64, drive: u64) -> Option<f64> {
        self.purses.get(&(volume, drive)).map(|p| p.tokens)
    }
}

#[cfg(test)]
mod tests;
