//! The control plane's persistent records: drives, volumes and extents.
//!
//! These are what `sluice-meta` stores (one key each) and what the control
//! plane's API returns. Their invariants are checked by
//! [`DriveRecord::check`], [`VolumeRecord::check`] and
//! [`ExtentRecord::check`], which the stores call on every record they load
//! so that corrupt metadata is reported with its key, never trusted.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Entries one slot list of a drive record may expand to when decoded (a
/// 32 TiB drive's worth): a corrupt or hostile record cannot make a decode
/// allocate without bound.
pub const SLOT_LIST_ENTRIES_MAX: u64 = 1 << 24;

/// A drive record's sorted slot lists as stored: runs of adjacent slots as
/// `[first, count]`, lone slots as numbers (`[0, [5, 1024], 2000]`). Every
/// fault rewrites its drives' records, so their size is on the fault's
/// path: the clean slots of a fresh drive, or the slots of a deleted
/// volume, are mostly runs, and a reserve of 1024 clean slots costs a few
/// bytes instead of 6 KB. Records written as plain lists (before runs) read
/// the same.
mod slot_runs {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Entry {
        One(u64),
        Run(u64, u64),
    }

    pub fn serialize<S: Serializer>(slots: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &slot in slots {
            match runs.last_mut() {
                Some((first, n)) if first.checked_add(*n) == Some(slot) => *n += 1,
                _ => runs.push((slot, 1)),
            }
        }
        let entries: Vec<Entry> = runs
            .into_iter()
            .map(|(first, n)| {
                if n == 1 {
                    Entry::One(first)
                } else {
                    Entry::Run(first, n)
                }
            })
            .collect();
        entries.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        let entries = Vec::<Entry>::deserialize(d)?;
        let mut total: u64 = 0;
        for e in &entries {
            let n = match *e {
                Entry::One(_) => 1,
                Entry::Run(first, n) => {
                    if n == 0 || first.checked_add(n).is_none() {
                        return Err(D::Error::custom(format!(
                            "slot run [{first}, {n}] is empty or overflows"
                        )));
                    }
                    n
                }
            };
            total = total.saturating_add(n);
            if total > super::SLOT_LIST_ENTRIES_MAX {
                return Err(D::Error::custom(format!(
                    "slot list of more than {} slots",
                    super::SLOT_LIST_ENTRIES_MAX
                )));
            }
        }
        let mut slots = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for e in entries {
            match e {
                Entry::One(slot) => slots.push(slot),
                Entry::Run(first, n) => slots.extend(first..first + n),
            }
        }
        Ok(slots)
    }
}

/// The size of one extent, the unit of allocation and replication (Flint
/// uses 2 MiB).
pub const EXTENT_BYTES: u64 = 2 << 20;

/// Replicas per extent, at most. Chain replication's write latency grows with
/// the chain; three is what Flint and most systems use.
pub const REPLICAS_MAX: u8 = 3;

/// Drives in one pool, at most.
pub const DRIVES_MAX: usize = 4096;

/// Volumes in one pool, at most.
pub const VOLUMES_MAX: usize = 65_536;

/// The largest volume: 256 TiB, 128 Mi extents.
pub const VOLUME_BYTES_MAX: u64 = 256 << 40;

/// Longest volume name, tenant name, drive address or NQN we store.
pub const NAME_BYTES_MAX: usize = 223;

/// Block sizes a volume may expose.
pub const VOLUME_BLOCK_SIZES: [u32; 2] = [512, 4096];

/// A drive's number in the pool, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DriveId(pub u32);

impl fmt::Display for DriveId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}", self.0)
    }
}

/// A volume's number, never reused (a re-created name gets a new id, so a
/// stale client cannot write into the new volume's extents).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VolumeId(pub u64);

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Where a drive lives: a namespace on an NVMe/TCP target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveSpec {
    /// `host:port` of the target's I/O port.
    pub addr: String,
    /// The subsystem NQN.
    pub nqn: String,
    /// The namespace id.
    pub nsid: u32,
}

impl DriveSpec {
    /// The target this drive is on, for spreading replicas over targets.
    pub fn target(&self) -> &str {
        &self.addr
    }
}

impl fmt::Display for DriveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} nsid {}", self.addr, self.nqn, self.nsid)
    }
}

/// Whether a drive takes new extents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriveState {
    /// In service.
    Up,
    /// Out of service: no new extents; its replicas are to be rebuilt.
    Down,
}

/// A free slot that a control plane is zeroing ahead of the extent faults
/// that will take it. `claimant` is a random number per control-plane
/// process: only the claimant declares the slot clean, and a process that
/// finds another's claim fences the slot before zeroing it again, so the
/// other's late Write Zeroes cannot land on a later owner's data
/// (docs/volumes.md, "Zeroing ahead of the faults").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZeroClaim {
    pub slot: u64,
    pub claimant: u64,
}

/// One drive of the pool and its slot allocator.
///
/// Slots `0..next_slot` have been handed out at some time. Each is owned by
/// exactly one extent replica, or sits in exactly one of four lists (the
/// stores check this across records; see `sluice-meta`):
/// * `free`: given back, contents unknown (dirty);
/// * `zeroing`: claimed by a control plane that is zeroing it;
/// * `clean`: known to read as zeros, ready for an extent fault;
/// * `quarantined`: a deleted volume's slot that could not be fenced (its
///   drive was unreachable, or cannot fence): a client still holding the
///   volume might write there, so it is not handed out until a fence
///   succeeds or the operator releases it.
///
/// Slots at `next_slot` and above were never handed out (dirty too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveRecord {
    pub id: DriveId,
    pub spec: DriveSpec,
    pub state: DriveState,
    /// The namespace's logical block size.
    pub block_size_bytes: u32,
    /// Whole extents that fit in the namespace.
    pub slots_total: u64,
    /// The first slot never handed out.
    pub next_slot: u64,
    /// Slots handed out and given back, lowest first.
    #[serde(with = "slot_runs")]
    pub free: Vec<u64>,
    /// Free slots known to hold zeros, lowest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "slot_runs")]
    pub clean: Vec<u64>,
    /// Free slots being zeroed, by slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zeroing: Vec<ZeroClaim>,
    /// Slots held back until a fence protects them, lowest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "slot_runs")]
    pub quarantined: Vec<u64>,
    /// The namespace's NGUID when it reported one: a drive that comes back
    /// with another NGUID is a different drive, and is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nguid: Option<String>,
}

impl DriveRecord {
    /// Slots owned by extents or held in quarantine (not available).
    pub fn slots_used(&self) -> u64 {
        self.next_slot - (self.free.len() + self.clean.len() + self.zeroing.len()) as u64
    }

    /// Slots that can still be handed out (including those being zeroed).
    pub fn slots_free(&self) -> u64 {
        self.slots_total - self.slots_used()
    }

    /// Slots volumes may reserve: all but those held in quarantine until a
    /// fence (or the operator) releases them.
    pub fn slots_reservable(&self) -> u64 {
        self.slots_total
            .saturating_sub(self.quarantined.len() as u64)
    }

    /// Free slots ready for an extent fault without zeroing.
    pub fn slots_clean(&self) -> usize {
        self.clean.len()
    }

    /// Slots a zeroing claim could take: dirty free ones and new ones.
    pub fn slots_dirty(&self) -> u64 {
        self.free.len() as u64 + (self.slots_total - self.next_slot)
    }

    /// Takes a slot whose contents do not matter (a rebuild or a move
    /// overwrites all of it): the lowest given-back one, else the next new
    /// one, else a clean one.
    pub fn take_slot(&mut self) -> Option<u64> {
        if !self.free.is_empty() {
            return Some(self.free.remove(0));
        }
        if let Some(s) = self.take_new_slot() {
            return Some(s);
        }
        self.take_clean_slot()
    }

    /// Takes the lowest clean slot.
    pub fn take_clean_slot(&mut self) -> Option<u64> {
        (!self.clean.is_empty()).then(|| self.clean.remove(0))
    }

    fn take_new_slot(&mut self) -> Option<u64> {
        if self.next_slot < self.slots_total {
            self.next_slot += 1;
            return Some(self.next_slot - 1);
        }
        None
    }

    /// Whether `slot` was handed out and sits in none of the lists.
    fn is_owned(&self, slot: u64) -> bool {
        slot < self.next_slot && self.list_of(slot).is_none()
    }

    /// The list `slot` sits in (free, clean, zeroing, quarantined), if any.
    pub fn list_of(&self, slot: u64) -> Option<&'static str> {
        if self.free.binary_search(&slot).is_ok() {
            Some("free")
        } else if self.clean.binary_search(&slot).is_ok() {
            Some("clean")
        } else if self.claim(slot).is_some() {
            Some("zeroing")
        } else if self.quarantined.binary_search(&slot).is_ok() {
            Some("quarantined")
        } else {
            None
        }
    }

    /// Handed-out slots that no extent owns (in one of the lists).
    pub fn slots_unowned(&self) -> u64 {
        (self.free.len() + self.clean.len() + self.zeroing.len() + self.quarantined.len()) as u64
    }

    fn claim(&self, slot: u64) -> Option<usize> {
        self.zeroing.binary_search_by_key(&slot, |c| c.slot).ok()
    }

    /// Gives a slot back (dirty). Returns false (and changes nothing) when
    /// the slot was never handed out or is not owned: a double free is a
    /// bug the caller must report.
    pub fn give_slot(&mut self, slot: u64) -> bool {
        if !self.is_owned(slot) {
            return false;
        }
        insert_sorted(&mut self.free, slot);
        true
    }

    /// Gives a slot back into quarantine (see the type's doc). False as
    /// for [`DriveRecord::give_slot`].
    pub fn quarantine_slot(&mut self, slot: u64) -> bool {
        if !self.is_owned(slot) {
            return false;
        }
        insert_sorted(&mut self.quarantined, slot);
        true
    }

    /// Releases quarantined slots into `free`; returns those released.
    pub fn release_quarantined(&mut self, slots: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        for &s in slots {
            if let Ok(i) = self.quarantined.binary_search(&s) {
                self.quarantined.remove(i);
                insert_sorted(&mut self.free, s);
                out.push(s);
            }
        }
        out
    }

    /// Claims up to `n` dirty slots (given-back ones first, then new ones)
    /// for zeroing by `claimant`; returns them.
    pub fn claim_for_zeroing(&mut self, n: usize, claimant: u64) -> Vec<u64> {
        let mut out = Vec::new();
        while out.len() < n {
            let slot = if self.free.is_empty() {
                match self.take_new_slot() {
                    Some(s) => s,
                    None => break,
                }
            } else {
                self.free.remove(0)
            };
            let at = self.zeroing.partition_point(|c| c.slot < slot);
            self.zeroing.insert(at, ZeroClaim { slot, claimant });
            out.push(slot);
        }
        out
    }

    /// Makes `claimant` the claimant of those of `slots` being zeroed (a
    /// take-over of another's claim); returns them.
    pub fn reclaim(&mut self, slots: &[u64], claimant: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for &s in slots {
            if let Some(i) = self.claim(s) {
                self.zeroing[i].claimant = claimant;
                out.push(s);
            }
        }
        out
    }

    /// Takes `slot` for an extent straight from `claimant`'s claim (the
    /// claimant zeroed it); false when `claimant` does not claim it.
    pub fn take_claimed(&mut self, slot: u64, claimant: u64) -> bool {
        match self
            .claim(slot)
            .filter(|&i| self.zeroing[i].claimant == claimant)
        {
            Some(i) => {
                self.zeroing.remove(i);
                true
            }
            None => false,
        }
    }

    /// Declares clean those of `slots` that `claimant` still claims;
    /// returns them.
    pub fn finish_zeroing(&mut self, slots: &[u64], claimant: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for &s in slots {
            if let Some(i) = self
                .claim(s)
                .filter(|&i| self.zeroing[i].claimant == claimant)
            {
                self.zeroing.remove(i);
                insert_sorted(&mut self.clean, s);
                out.push(s);
            }
        }
        out
    }

    /// Moves claims on `slots` (any claimant) into quarantine: the drive
    /// cannot fence, so another's late zeroing cannot be excluded.
    pub fn quarantine_claims(&mut self, slots: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        for &s in slots {
            if let Some(i) = self.claim(s) {
                self.zeroing.remove(i);
                insert_sorted(&mut self.quarantined, s);
                out.push(s);
            }
        }
        out
    }

    /// Fraction of the drive's slots in use, 0..=1.
    pub fn used_fraction(&self) -> f64 {
        if self.slots_total == 0 {
            return 1.0;
        }
        self.slots_used() as f64 / self.slots_total as f64
    }

    /// Flint's fragment degree, at slot level: the share of the slots up to
    /// the highest owned one that no extent owns (given back, being
    /// zeroed, clean, quarantined), 0..=1. Unowned slots above the highest
    /// owned one, such as a fresh drive's zeroed reserve, are not holes.
    pub fn fragment_degree(&self) -> f64 {
        let mut unowned: Vec<u64> = self
            .free
            .iter()
            .chain(&self.clean)
            .chain(&self.quarantined)
            .copied()
            .chain(self.zeroing.iter().map(|z| z.slot))
            .filter(|&s| s < self.next_slot)
            .collect();
        unowned.sort_unstable();
        unowned.dedup();
        // The owned region ends at the highest owned slot.
        let mut end = self.next_slot;
        while unowned.last().is_some_and(|&s| s + 1 == end) {
            unowned.pop();
            end -= 1;
        }
        if end == 0 {
            return 0.0;
        }
        unowned.len() as f64 / end as f64
    }

    /// The drive LBA where `slot` begins.
    pub fn slot_lba(&self, slot: u64) -> u64 {
        slot * (EXTENT_BYTES / u64::from(self.block_size_bytes))
    }

    /// Checks the record's own invariants.
    pub fn check(&self) -> Result<(), String> {
        if self.block_size_bytes == 0
            || !self.block_size_bytes.is_power_of_two()
            || u64::from(self.block_size_bytes) > EXTENT_BYTES
        {
            return Err(format!(
                "block_size_bytes {} is not a power of two up to 2 MiB",
                self.block_size_bytes
            ));
        }
        if self.next_slot > self.slots_total {
            return Err(format!(
                "next_slot {} beyond slots_total {}",
                self.next_slot, self.slots_total
            ));
        }
        let claimed: Vec<u64> = self.zeroing.iter().map(|c| c.slot).collect();
        let mut all = Vec::with_capacity(
            self.free.len() + self.clean.len() + claimed.len() + self.quarantined.len(),
        );
        for (list, name) in [
            (&self.free, "free"),
            (&self.clean, "clean"),
            (&claimed, "zeroing"),
            (&self.quarantined, "quarantined"),
        ] {
            if !list.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("{name} slots not strictly ascending"));
            }
            if list.last().is_some_and(|&s| s >= self.next_slot) {
                return Err(format!("a {name} slot at or beyond next_slot"));
            }
            all.extend_from_slice(list);
        }
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!(
                "slot {} is in two of free/clean/zeroing/quarantined",
                w[0]
            ));
        }
        check_name("spec.addr", &self.spec.addr)?;
        check_name("spec.nqn", &self.spec.nqn)?;
        if self.spec.nsid == 0 || self.spec.nsid == u32::MAX {
            return Err(format!(
                "spec.nsid {} is not a namespace id",
                self.spec.nsid
            ));
        }
        Ok(())
    }
}

/// A volume's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    /// Serving I/O.
    Ready,
    /// Being deleted: its extents are freed in batches; it takes no I/O.
    Deleting,
}

/// One volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: VolumeId,
    pub name: String,
    pub state: VolumeState,
    pub size_bytes: u64,
    pub block_size_bytes: u32,
    /// Copies of every extent, on distinct drives.
    pub replicas: u8,
    /// The tenant the volume's I/O is accounted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Drive addresses or NQNs the user prefers (placement's η term).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefer: Vec<String>,
    /// Bumped on every chain change (a rebuilt or moved replica), never on a
    /// plain allocation; clients with an older epoch must refetch the map.
    pub epoch: u64,
    /// Allocated extents per drive (one count per replica, a replica being
    /// rebuilt included), for placement's spreading term.
    #[serde(default)]
    pub extents_per_drive: BTreeMap<DriveId, u64>,
    /// Extents whose chain is shorter than `replicas` (a drive failed):
    /// the control plane rebuilds them onto other drives.
    #[serde(default)]
    pub degraded_extents: u64,
}

impl VolumeRecord {
    /// Extents the volume spans.
    pub fn extents(&self) -> u64 {
        self.size_bytes.div_ceil(EXTENT_BYTES)
    }

    /// Slots the volume reserves in the pool: every extent of every replica.
    pub fn slots_reserved(&self) -> u64 {
        self.extents() * u64::from(self.replicas)
    }

    /// Extents allocated so far (counting one per chain, not per replica).
    pub fn extents_allocated(&self) -> u64 {
        self.extents_per_drive.values().sum::<u64>() / u64::from(self.replicas.max(1))
    }

    /// Checks the record's own invariants.
    pub fn check(&self) -> Result<(), String> {
        check_volume_name(&self.name)?;
        check_size(self.size_bytes, self.block_size_bytes)?;
        check_replicas(self.replicas)?;
        if let Some(t) = &self.tenant {
            check_name("tenant", t)?;
        }
        for p in &self.prefer {
            check_name("prefer", p)?;
        }
        Ok(())
    }
}

/// One replica of an extent: a slot on a drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Replica {
    pub drive: DriveId,
    pub slot: u64,
}

/// An extent's replicas in chain order: head first, tail last.
pub type Chain = Vec<Replica>;

/// One allocated extent of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentRecord {
    pub volume: VolumeId,
    pub index: u64,
    pub chain: Chain,
    /// The chain epoch writers carry (`sluice_proto::fence`). It is a
    /// metadata revision taken when the chain was last given a replica, so
    /// it only rises, and it is above every fence a previous owner of the
    /// same slots ever raised. A rebuild fences the chain's replicas at its
    /// new epoch; writers on an older chain are then refused and refetch.
    #[serde(default)]
    pub epoch: u64,
    /// A replica being filled by a rebuild: the slot is this extent's, but
    /// it takes no I/O until the copy is done and it joins the chain's tail.
    /// While it is set, writes to the extent wait (reads go on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilding: Option<Replica>,
    /// With `rebuilding`: the chain replica a remap retires when the new
    /// one joins (the extent moves off a congested drive, Flint §5.5);
    /// `None` for a rebuild of a lost replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retiring: Option<Replica>,
}

impl ExtentRecord {
    /// Checks the record against its volume.
    pub fn check(&self, volume: &VolumeRecord) -> Result<(), String> {
        if self.volume != volume.id {
            return Err(format!("belongs to {} not {}", self.volume, volume.id));
        }
        if self.index >= volume.extents() {
            return Err(format!(
                "index {} beyond the volume's {} extents",
                self.index,
                volume.extents()
            ));
        }
        if self.chain.is_empty() || self.chain.len() > usize::from(REPLICAS_MAX) {
            return Err(format!("chain of {} replicas", self.chain.len()));
        }
        for (i, r) in self.chain.iter().enumerate() {
            if self.chain[..i].iter().any(|o| o.drive == r.drive) {
                return Err(format!("two replicas on drive {}", r.drive));
            }
        }
        if let Some(r) = &self.rebuilding {
            if self.chain.iter().any(|o| o.drive == r.drive) {
                return Err(format!(
                    "rebuilding onto drive {}, already in the chain",
                    r.drive
                ));
            }
            if self.retiring.is_none() && self.chain.len() >= usize::from(volume.replicas) {
                return Err(format!(
                    "rebuilding a chain of {} replicas, as many as the volume's {}",
                    self.chain.len(),
                    volume.replicas
                ));
            }
        }
        if let Some(r) = &self.retiring {
            if self.rebuilding.is_none() {
                return Err(format!(
                    "retiring drive {}'s replica with nothing rebuilt to replace it",
                    r.drive
                ));
            }
            if !self.chain.contains(r) {
                return Err(format!(
                    "retiring drive {}'s replica, not in the chain",
                    r.drive
                ));
            }
        }
        Ok(())
    }

    /// Every slot the extent owns: its chain and a replica being rebuilt.
    pub fn owned(&self) -> impl Iterator<Item = &Replica> {
        self.chain.iter().chain(self.rebuilding.iter())
    }

    /// Whether the rebuilder has work on the extent: its chain is shorter
    /// than the volume's replica count, or it is being remapped.
    pub fn is_degraded(&self, volume: &VolumeRecord) -> bool {
        self.chain.len() < usize::from(volume.replicas) || self.retiring.is_some()
    }
}

/// Checks a volume name: 1-223 bytes of `[A-Za-z0-9._-]`, not starting with
/// a dot or dash (names become metadata keys and CLI arguments).
pub fn check_volume_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(format!(
            "volume name must be 1-{NAME_BYTES_MAX} bytes, got {}",
            name.len()
        ));
    }
    if name.starts_with(['.', '-']) {
        return Err(format!("volume name {name:?} starts with '.' or '-'"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "volume name {name:?} has {c:?}; use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Checks a volume size against its block size and [`VOLUME_BYTES_MAX`].
pub fn check_size(size_bytes: u64, block_size_bytes: u32) -> Result<(), String> {
    if !VOLUME_BLOCK_SIZES.contains(&block_size_bytes) {
        return Err(format!(
            "block size {block_size_bytes} is not one of {VOLUME_BLOCK_SIZES:?}"
        ));
    }
    if size_bytes == 0 || size_bytes > VOLUME_BYTES_MAX {
        return Err(format!(
            "size {size_bytes} bytes is not within 1 block to 256 TiB"
        ));
    }
    if !size_bytes.is_multiple_of(u64::from(block_size_bytes)) {
        return Err(format!(
            "size {size_bytes} bytes is not a multiple of the {block_size_bytes}-byte block"
        ));
    }
    Ok(())
}

/// A tenant's service class: the weight its volumes bid with in the
/// bandwidth auction comes from the class (`sluice tenant set`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    /// As volumes name it (`--tenant`): a name or a host NQN.
    pub name: String,
    pub slo_class: String,
}

impl TenantRecord {
    pub fn check(&self) -> Result<(), String> {
        check_name("tenant", &self.name)?;
        check_slo_class(&self.slo_class)
    }
}

/// Checks an SLO class name: 1-64 letters, digits, '_' or '-'.
pub fn check_slo_class(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    {
        return Err(format!(
            "SLO class {name:?} must be 1-64 letters, digits, '_' or '-'"
        ));
    }
    Ok(())
}

/// Checks a tenant name: 1-256 printable bytes.
pub fn check_tenant_name(name: &str) -> Result<(), String> {
    check_name("tenant", name)
}

/// Checks a replica count: 1..=[`REPLICAS_MAX`].
pub fn check_replicas(replicas: u8) -> Result<(), String> {
    if replicas == 0 || replicas > REPLICAS_MAX {
        return Err(format!("replicas must be 1-{REPLICAS_MAX}, got {replicas}"));
    }
    Ok(())
}

fn insert_sorted(list: &mut Vec<u64>, v: u64) {
    if let Err(at) = list.binary_search(&v) {
        list.insert(at, v);
    }
}

fn check_name(field: &str, s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > NAME_BYTES_MAX || s.chars().any(char::is_control) {
        return Err(format!(
            "{field} must be 1-{NAME_BYTES_MAX} printable bytes"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn drive(slots: u64) -> DriveRecord {
        DriveRecord {
            id: DriveId(1),
            spec: DriveSpec {
                addr: "127.0.0.1:4420".into(),
                nqn: "nqn.x".into(),
                nsid: 1,
            },
            state: DriveState::Up,
            block_size_bytes: 512,
            slots_total: slots,
            next_slot: 0,
            free: vec![],
            clean: vec![],
            zeroing: vec![],
            quarantined: vec![],
            nguid: None,
        }
    }

    #[test]
    fn slots_are_handed_out_lowest_first_and_never_twice() {
        let mut d = drive(3);
        assert_eq!(d.take_slot(), Some(0));
        assert_eq!(d.take_slot(), Some(1));
        assert!(d.give_slot(0));
        assert!(!d.give_slot(0), "double free refused");
        assert!(!d.give_slot(2), "never handed out");
        assert_eq!(d.take_slot(), Some(0));
        assert_eq!(d.take_slot(), Some(2));
        assert_eq!(d.take_slot(), None);
        assert_eq!(d.slots_free(), 0);
        d.check().unwrap();
    }

    #[test]
    fn slot_lba_scales_with_block_size() {
        let mut d = drive(4);
        assert_eq!(d.slot_lba(3), 3 * 4096);
        d.block_size_bytes = 4096;
        assert_eq!(d.slot_lba(3), 3 * 512);
    }

    #[test]
    fn names_and_sizes_are_checked() {
        assert!(check_volume_name("db-01.data_x").is_ok());
        for bad in ["", "-x", ".x", "a/b", "a b", "é"] {
            assert!(check_volume_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_size(4096, 4096).is_ok());
        assert!(check_size(0, 4096).is_err());
        assert!(check_size(4097, 4096).is_err());
        assert!(check_size(4096, 1024).is_err());
        assert!(check_size(VOLUME_BYTES_MAX + 4096, 4096).is_err());
        assert!(check_replicas(0).is_err());
        assert!(check_replicas(4).is_err());
    }

    #[test]
    fn corrupt_drive_records_are_named() {
        let mut d = drive(4);
        d.next_slot = 2;
        d.free = vec![1, 0];
        assert!(d.check().unwrap_err().contains("ascending"));
        d.free = vec![2];
        assert!(d.check().unwrap_err().contains("next_slot"));
        d.free = vec![];
        d.next_slot = 5;
        assert!(d.check().unwrap_err().contains("slots_total"));
    }

    #[test]
    fn zeroing_claims_become_clean_only_for_their_claimant() {
        let mut d = drive(6);
        assert_eq!(d.take_slot(), Some(0));
        assert!(d.give_slot(0));
        // Given-back slots first, then new ones.
        assert_eq!(d.claim_for_zeroing(3, 7), vec![0, 1, 2]);
        assert_eq!(d.slots_free(), 6, "slots being zeroed are still free");
        assert_eq!(d.take_clean_slot(), None);
        assert_eq!(
            d.finish_zeroing(&[0, 1], 8),
            Vec::<u64>::new(),
            "not 8's claim"
        );
        assert_eq!(d.reclaim(&[1, 5], 8), vec![1]);
        assert_eq!(d.finish_zeroing(&[0, 1], 7), vec![0], "7 lost slot 1 to 8");
        assert_eq!(d.finish_zeroing(&[1], 8), vec![1]);
        assert_eq!(d.quarantine_claims(&[2]), vec![2]);
        d.check().unwrap();
        assert_eq!(d.take_clean_slot(), Some(0));
        assert!(!d.give_slot(1), "a clean slot is not owned");
        assert!(!d.give_slot(2), "a quarantined slot is not owned");
        assert_eq!(d.slots_used(), 2, "slot 0 owned, slot 2 quarantined");
        assert!(d.give_slot(0));
        assert_eq!(d.release_quarantined(&[2, 3]), vec![2]);
        assert_eq!(d.slots_used(), 0);
        d.check().unwrap();
    }

    #[test]
    fn a_slot_in_two_lists_is_named() {
        let mut d = drive(4);
        d.next_slot = 3;
        d.free = vec![1];
        d.clean = vec![1];
        assert!(d.check().unwrap_err().contains("slot 1 is in two"));
        d.clean = vec![];
        d.zeroing = vec![
            ZeroClaim {
                slot: 2,
                claimant: 1,
            },
            ZeroClaim {
                slot: 0,
                claimant: 1,
            },
        ];
        assert!(d
            .check()
            .unwrap_err()
            .contains("zeroing slots not strictly ascending"));
        d.zeroing = vec![];
        d.quarantined = vec![3];
        assert!(d
            .check()
            .unwrap_err()
            .contains("quarantined slot at or beyond"));
    }

    #[test]
    fn a_zeroed_reserve_above_the_owned_slots_is_not_fragmentation() {
        let mut d = drive(100);
        assert_eq!(d.fragment_degree(), 0.0);
        // A reserve of 8 clean slots on a fresh drive: no holes.
        d.next_slot = 8;
        d.clean = (0..8).collect();
        assert_eq!(d.fragment_degree(), 0.0);
        // 10 slots owned after the reserve (slots 8..18): still none.
        d.next_slot = 18;
        d.clean.clear();
        assert_eq!(d.fragment_degree(), 0.0);
        // Slots 2 and 3 given back, 5 being zeroed, 9 quarantined, and a
        // reserve of 4 above: 4 holes below the highest owned slot (17).
        d.free = vec![2, 3];
        d.zeroing = vec![ZeroClaim {
            slot: 5,
            claimant: 1,
        }];
        d.quarantined = vec![9];
        d.next_slot = 22;
        d.clean = vec![18, 19, 20, 21];
        assert!(
            (d.fragment_degree() - 4.0 / 18.0).abs() < 1e-9,
            "{}",
            d.fragment_degree()
        );
        // Nothing owned: nothing fragmented.
        d.free = (0..18).filter(|s| ![5, 9].contains(s)).collect();
        assert_eq!(d.fragment_degree(), 0.0);
    }

    #[test]
    fn slot_lists_are_stored_as_runs_and_read_back_whole() {
        let mut d = DriveRecord {
            next_slot: 4096,
            free: vec![1, 2, 3, 7, 9, 10],
            clean: (100..1124).collect(),
            quarantined: vec![4000],
            ..drive(4096)
        };
        let json = serde_json::to_string(&d).unwrap();
        assert!(json.contains(r#""free":[[1,3],7,[9,2]]"#), "{json}");
        assert!(json.contains(r#""clean":[[100,1024]]"#), "{json}");
        assert!(json.contains(r#""quarantined":[4000]"#), "{json}");
        let back: DriveRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
        // Records written before runs (plain lists) read the same.
        let plain = json
            .replace(r#"[[1,3],7,[9,2]]"#, "[1,2,3,7,9,10]")
            .replace(r#"[[100,1024]]"#, &serde_json::to_string(&d.clean).unwrap());
        assert_eq!(serde_json::from_str::<DriveRecord>(&plain).unwrap(), back);
        // Corrupt runs are refused, not expanded.
        for bad in [
            r#"[[5,0]]"#,
            r#"[[18446744073709551615,2]]"#,
            r#"[[0,4611686018427387904]]"#,
            r#"[[0,16777216],[20000000,1]]"#,
            r#"[[1,2,3]]"#,
            r#"["x"]"#,
        ] {
            let j = json.replace(r#"[[1,3],7,[9,2]]"#, bad);
            assert!(
                serde_json::from_str::<DriveRecord>(&j).is_err(),
                "{bad} accepted"
            );
        }
        d.free.clear();
        let json = serde_json::to_string(&d).unwrap();
        assert!(json.contains(r#""free":[]"#), "{json}");
    }

    proptest! {
        #[test]
        fn slot_runs_round_trip_any_list(mut slots in proptest::collection::vec(0u64..200, 0..100), sort in any::<bool>()) {
            if sort {
                slots.sort_unstable();
            }
            #[derive(Serialize, Deserialize, PartialEq, Debug)]
            struct L(#[serde(with = "super::slot_runs")] Vec<u64>);
            let json = serde_json::to_string(&L(slots.clone())).unwrap();
            let back: L = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back.0, slots);
        }

        /// Any sequence of takes, gives, claims, zeroings, quarantines and
        /// releases keeps every slot owned or in exactly one list, never
        /// hands out an owned slot, and hands out a clean slot only after
        /// its claimant finished zeroing it.
        #[test]
        fn slot_allocator_never_double_allocates(ops in proptest::collection::vec(any::<(u8, u8)>(), 0..300)) {
            let mut d = drive(16);
            let mut owned = std::collections::BTreeSet::new();
            let mut zeroed = std::collections::BTreeSet::new();
            for (op, pick) in ops {
                let nth = |set: &std::collections::BTreeSet<u64>| {
                    set.iter().nth(usize::from(pick) % set.len().max(1)).copied()
                };
                match op % 8 {
                    0 | 1 => match d.take_slot() {
                        Some(s) => prop_assert!(owned.insert(s), "slot {} handed out twice", s),
                        None => prop_assert!(d.free.is_empty() && d.clean.is_empty() && d.next_slot == d.slots_total),
                    },
                    2 => if let Some(s) = d.take_clean_slot() {
                        prop_assert!(zeroed.contains(&s), "slot {} clean but never zeroed", s);
                        prop_assert!(owned.insert(s), "slot {} handed out twice", s);
                    },
                    3 => if let Some(s) = nth(&owned) {
                        prop_assert!(d.give_slot(s));
                        owned.remove(&s);
                    },
                    4 => if let Some(s) = nth(&owned) {
                        prop_assert!(d.quarantine_slot(s));
                        owned.remove(&s);
                    },
                    5 => { d.claim_for_zeroing(usize::from(pick % 4), u64::from(pick % 2)); }
                    6 => {
                        let claimed: Vec<u64> = d.zeroing.iter().map(|c| c.slot).collect();
                        for s in d.finish_zeroing(&claimed, u64::from(pick % 2)) {
                            zeroed.insert(s);
                        }
                    }
                    _ => {
                        let q = d.quarantined.clone();
                        d.release_quarantined(&q);
                        let claimed: Vec<u64> = d.zeroing.iter().map(|c| c.slot).collect();
                        d.quarantine_claims(&claimed[..claimed.len().min(1)]);
                    }
                }
                // A slot leaving `clean` by any way but a take is dirty again.
                zeroed.retain(|s| d.clean.contains(s) || owned.contains(s));
                prop_assert_eq!(d.slots_used(), (owned.len() + d.quarantined.len()) as u64);
                for s in &owned {
                    prop_assert!(d.is_owned(*s), "owned slot {} is also in a list", s);
                }
                prop_assert!(d.check().is_ok(), "{:?}", d.check());
            }
        }
    }
}
