//! The volume client: elastic volumes over plain NVMe/TCP namespaces.
//!
//! Opening a volume fetches its map once (`OpenVolume`) and caches it with
//! its epoch. Every I/O is planned against the cached map
//! ([`VolumeMap::plan`]) and each piece goes straight to its drive over a
//! connection from the [`DrivePool`], which volumes share. The control plane
//! is called only:
//! * on an extent fault (a write to an unallocated extent): `AllocateExtent`,
//!   retried with backoff while the control plane is unreachable; when its
//!   answer shows a newer epoch, the whole map is refetched;
//! * when a request runs past the cached size (the volume may have grown).
//!
//! Reads of unallocated ranges return zeros and allocate nothing.
//!
//! **Replication** is chain replication driven by the client, as in Flint
//! (§4.4): a write goes to the head, then to each next replica, and is
//! acknowledged once the tail has it; reads go to the tail, which holds only
//! acknowledged data. The client drives the chain rather than the drives
//! forwarding, because the drives are any NVMe/TCP target (Linux nvmet,
//! SPDK), and none of them can forward a write to another target.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use sluice_host::{ConnectOptions, Controller, IoFlags, Namespace};
use sluice_volume::{DriveId, PieceTarget, VolumeMap, VolumeRecord};

use crate::client::ControlClient;
use crate::error::VolumeError;
use crate::isolation::{default_client_name, ClientIsolation, EioPermit};
use crate::pb;
use sluice_flint::eio::{EioConfig, IoKind, StreamId};

/// Longest piece sent as one namespace request (the host library splits it
/// further at the drive's MDTS).
pub const PIECE_BYTES_MAX: u64 = 8 << 20;

/// Attempts at one write while replicas fail (each failure shortens chains).
pub const WRITE_ATTEMPTS_MAX: u32 = 4;

/// Attempts at an extent allocation while the control plane is unreachable.
pub const ALLOCATE_ATTEMPTS_MAX: u32 = 5;

/// Refetches of the map after drives refused a write's chain epoch.
pub const STALE_EPOCH_RETRIES_MAX: u32 = 8;

/// Longest a write waits for an extent being rebuilt (one extent's copy
/// takes milliseconds; this covers a control plane restarting mid-rebuild).
pub const REBUILD_WAIT_MAX: Duration = Duration::from_secs(30);

/// Whether a drive refused a write for its stale chain epoch.
fn stale_epoch(e: &VolumeError) -> bool {
    matches!(e, VolumeError::Drive { source: sluice_host::HostError::Nvme { status, .. }, .. } if status.is_stale_epoch())
}

/// Connections to drives, shared by every volume of a process: one
/// association per (address, subsystem NQN, host NQN), so the volumes of one
/// tenant share theirs and each tenant's I/O reaches the drives under its
/// own host NQN.
#[derive(Debug)]
pub struct DrivePool {
    opts: ConnectOptions,
    /// The process's view agent and eIO gate (Flint's isolation).
    isolation: Arc<ClientIsolation>,
    /// By (address, subsystem NQN, host NQN).
    conns: tokio::sync::Mutex<HashMap<(String, String, String), Controller>>,
}

/// Reconnection attempts on a lost drive connection, at most. A volume's
/// drives fail fast: a write that cannot reach a replica reports it, and
/// the control plane's own probe decides whether the drive is gone (a
/// transient loss is not failed, and the write is retried). Five attempts
/// with the default backoff held every write to a dead drive for 3.1 s.
pub const DRIVE_RECONNECT_ATTEMPTS_MAX: u32 = 1;
pub const DRIVE_RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(200);

impl DrivePool {
    /// A pool whose client is `HOSTNAME:PID` in the view, with the
    /// default eIO scheduler.
    pub fn new(opts: ConnectOptions) -> Arc<DrivePool> {
        let iso = ClientIsolation::new(&default_client_name(), EioConfig::default())
            .unwrap_or_else(|e| unreachable!("the default eIO configuration is valid: {e}"));
        Self::with_isolation(opts, iso)
    }

    /// A pool with its own view client name and eIO scheduler.
    pub fn with_isolation(
        mut opts: ConnectOptions,
        isolation: Arc<ClientIsolation>,
    ) -> Arc<DrivePool> {
        let r = &mut opts.reconnect;
        r.attempts_max = r.attempts_max.min(DRIVE_RECONNECT_ATTEMPTS_MAX);
        r.backoff_max = r.backoff_max.min(DRIVE_RECONNECT_BACKOFF_MAX);
        r.backoff_initial = r.backoff_initial.min(r.backoff_max);
        Arc::new(DrivePool {
            opts,
            isolation,
            conns: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The process's view agent and eIO gate.
    pub fn isolation(&self) -> &Arc<ClientIsolation> {
        &self.isolation
    }

    /// Associations open.
    pub async fn connections(&self) -> usize {
        self.conns.lock().await.len()
    }

    /// The namespace of `drive`, connecting on first use, and checking that
    /// it is still the drive the pool recorded (block size, NGUID).
    pub(crate) async fn namespace(
        &self,
        drive: &pb::Drive,
        hostnqn: Option<&str>,
    ) -> Result<Namespace, VolumeError> {
        let id = DriveId(drive.id);
        let hostnqn = hostnqn.unwrap_or(&self.opts.hostnqn).to_owned();
        let key = (drive.addr.clone(), drive.nqn.clone(), hostnqn.clone());
        let ctrl = {
            let mut conns = self.conns.lock().await;
            match conns.get(&key).cloned() {
                // A target that went away and came back: the admin queue
                // (fences) does not reconnect by itself, I/O queues do.
                // Not under the pool's lock: other drives carry on.
                Some(c) => {
                    drop(conns);
                    c.reconnect_if_stale()
                        .await
                        .map_err(|source| VolumeError::Drive { drive: id, source })?;
                    c
                }
                None => {
                    let addr: SocketAddr = tokio::net::lookup_host(drive.addr.as_str())
                        .await
                        .ok()
                        .and_then(|mut a| a.next())
                        .ok_or_else(|| VolumeError::Drive {
                            drive: id,
                            source: sluice_host::HostError::Transport(format!(
                                "{} does not resolve",
                                drive.addr
                            )),
                        })?;
                    let opts = ConnectOptions {
                        hostnqn,
                        ..self.opts.clone()
                    };
                    let c = Controller::connect(addr, &drive.nqn, opts)
                        .await
                        .map_err(|source| VolumeError::Drive { drive: id, source })?;
                    conns.insert(key, c.clone());
                    c
                }
            }
        };
        let ns = ctrl
            .namespace(drive.nsid)
            .map_err(|source| VolumeError::Drive { drive: id, source })?;
        let changed = |reason: String| VolumeError::DriveChanged {
            drive: id,
            addr: drive.addr.clone(),
            reason,
        };
        if ns.block_size_bytes() != drive.block_size_bytes {
            return Err(changed(format!(
                "block size {} where {} was recorded",
                ns.block_size_bytes(),
                drive.block_size_bytes
            )));
        }
        let size = ns
            .size_blocks()
            .saturating_mul(u64::from(ns.block_size_bytes()));
        if size < drive.slots_total * sluice_volume::EXTENT_BYTES {
            return Err(changed(format!(
                "{size} bytes, smaller than the {} extents recorded",
                drive.slots_total
            )));
        }
        if let Some(want) = &drive.nguid {
            let got: String = ns
                .info()
                .identify
                .nguid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            if *want != got {
                return Err(changed(format!("NGUID {got} where {want} was recorded")));
            }
        }
        Ok(ns)
    }
}

/// Whether an error means the drive could not be reached (as opposed to the
/// drive answering with an error status).
fn unreachable_drive(e: &VolumeError) -> bool {
    match e {
        VolumeError::Drive { source, .. } => {
            source.is_fatal_for_connection()
                || matches!(source, sluice_host::HostError::Timeout { .. })
        }
        _ => false,
    }
}

/// The host NQN a tenant's volumes use on their drives: the tenant itself
/// when it is an NQN (Sluice targets know tenants by host NQN), else
/// `nqn.2026-11.io.sluice:tenant:NAME`. The drives' tenant configuration
/// then applies to the volume's I/O (fair queuing, limits, CPU).
pub fn tenant_hostnqn(tenant: &str) -> String {
    if tenant.starts_with("nqn.") && tenant.len() <= sluice_proto::NQN_LEN_MAX {
        tenant.to_owned()
    } else {
        format!("nqn.2026-11.io.sluice:tenant:{tenant}")
    }
}

/// Opens volume `name` through the control plane at `control` (one or
/// more `HOST:PORT`, comma-separated), with the bearer token read from
/// `token_file`; the volume's drive connections use `opts`. The one way the
/// CLI's commands and the target open a volume. Call it inside a tokio
/// runtime.
pub async fn open(
    control: &str,
    token_file: Option<&std::path::Path>,
    name: &str,
    opts: ConnectOptions,
) -> Result<Volume, VolumeError> {
    let token = token_file
        .map(|p| {
            sluice_admin::BearerToken::from_file(p)
                .map_err(|e| VolumeError::Control(format!("control token: {e}")))
        })
        .transpose()?;
    let client = ControlClient::new(control, token.as_ref())?;
    Volume::open(client, DrivePool::new(opts), name).await
}

/// One open volume.
#[derive(Debug)]
pub struct Volume {
    name: String,
    /// The volume's id (fixed: a volume deleted and re-created under the
    /// same name is another volume, which this handle refuses).
    id: u64,
    /// The host NQN the drives see this volume's I/O under (its tenant).
    hostnqn: Option<String>,
    control: ControlClient,
    pool: Arc<DrivePool>,
    map: RwLock<VolumeMap>,
    drives: RwLock<HashMap<DriveId, pb::Drive>>,
    namespaces: tokio::sync::RwLock<HashMap<DriveId, Namespace>>,
    allocations: std::sync::atomic::AtomicU64,
    /// Whether this volume's I/O passes the eIO scheduler (off by default).
    eio: std::sync::atomic::AtomicBool,
    /// This volume's share in the eIO scheduler (1 = equal), as f64 bits.
    eio_weight: std::sync::atomic::AtomicU64,
    /// Extents with writes of this client in flight, and how many: their
    /// replicas may differ until the writes reach the tail.
    writing: std::sync::Mutex<HashMap<u64, u32>>,
    /// Extents where a write failed part-way down the chain: their
    /// replicas may differ for good, so only the tail serves reads.
    diverged: std::sync::Mutex<std::collections::HashSet<u64>>,
}

/// Counts a write in flight on an extent for as long as it lives.
struct Writing<'a> {
    v: &'a Volume,
    extent: u64,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut w = sluice_runtime::sync::lock(&self.v.writing);
        if let Some(n) = w.get_mut(&self.extent) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.extent);
            }
        }
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

fn bad(e: impl std::fmt::Display) -> VolumeError {
    VolumeError::BadAnswer(e.to_string())
}

impl Volume {
    /// Opens `name`: fetches its map from the control plane.
    pub async fn open(
        control: ControlClient,
        pool: Arc<DrivePool>,
        name: &str,
    ) -> Result<Volume, VolumeError> {
        let layout = control.open_volume(name).await?;
        let (map, drives) = Self::decode_layout(layout)?;
        if map.volume().state != sluice_volume::VolumeState::Ready {
            return Err(VolumeError::Control(format!(
                "volume {name:?} is being deleted"
            )));
        }
        let hostnqn = map.volume().tenant.as_deref().map(tenant_hostnqn);
        pool.isolation.start(&control);
        Ok(Volume {
            name: name.to_owned(),
            id: map.volume().id.0,
            hostnqn,
            control,
            pool,
            map: RwLock::new(map),
            drives: RwLock::new(drives),
            namespaces: tokio::sync::RwLock::new(HashMap::new()),
            allocations: std::sync::atomic::AtomicU64::new(0),
            eio: std::sync::atomic::AtomicBool::new(false),
            eio_weight: std::sync::atomic::AtomicU64::new(1.0f64.to_bits()),
            writing: std::sync::Mutex::new(HashMap::new()),
            diverged: std::sync::Mutex::new(std::collections::HashSet::new()),
        })
    }

    fn decode_layout(
        l: pb::VolumeLayout,
    ) -> Result<(VolumeMap, HashMap<DriveId, pb::Drive>), VolumeError> {
        let v = l
            .volume
            .ok_or_else(|| bad("layout without a volume"))?
            .to_record()
            .map_err(bad)?;
        let map =
            VolumeMap::from_records(v, l.extents.iter().map(pb::Extent::to_record)).map_err(bad)?;
        let drives = l.drives.into_iter().map(|d| (DriveId(d.id), d)).collect();
        Ok((map, drives))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The drive pool this volume uses (shared with the other volumes
    /// opened on it).
    pub fn pool(&self) -> &Arc<DrivePool> {
        &self.pool
    }

    /// The volume as last fetched.
    pub fn record(&self) -> VolumeRecord {
        read(&self.map).volume().clone()
    }

    pub fn block_size_bytes(&self) -> u32 {
        read(&self.map).volume().block_size_bytes
    }

    pub fn size_blocks(&self) -> u64 {
        let m = read(&self.map);
        m.volume().size_bytes / u64::from(m.volume().block_size_bytes)
    }

    /// The cached map's epoch.
    pub fn epoch(&self) -> u64 {
        read(&self.map).epoch()
    }

    /// Extents allocated in the cached map.
    pub fn extents_allocated(&self) -> usize {
        read(&self.map).allocated()
    }

    /// Extent faults this client resolved through the control plane.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Switches the eIO scheduler on or off for this volume's I/O (Flint
    /// §4.5). Off, its I/O goes to the drives as it comes.
    pub fn set_eio(&self, on: bool) {
        self.eio.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn eio(&self) -> bool {
        self.eio.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This volume's share of the eIO scheduler, relative to others (1 by
    /// default; 2 pays half the rank per byte). Refused unless finite > 0.
    pub fn set_eio_weight(&self, weight: f64) -> Result<(), VolumeError> {
        if !weight.is_finite() || weight <= 0.0 {
            return Err(VolumeError::Control(format!(
                "eIO weight {weight} must be a finite number > 0"
            )));
        }
        self.eio_weight
            .store(weight.to_bits(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Sends one drive I/O: after its bandwidth slice (when the auction
    /// runs) and through the eIO gate (when it is on), timed for the view
    /// either way.
    async fn drive_io<T>(
        &self,
        drive: DriveId,
        kind: IoKind,
        bytes: usize,
        io: impl std::future::Future<Output = Result<T, sluice_host::HostError>>,
    ) -> Result<T, VolumeError> {
        let iso = &self.pool.isolation;
        let volume = self.id;
        // The auction's slice first (no wait while it lasts or the auction
        // is off), then the eIO gate's order.
        iso.spend(
            volume,
            u64::from(drive.0),
            bytes as u64,
            kind == IoKind::Write,
        )
        .await;
        let _permit: Option<EioPermit> = if self.eio() {
            let weight = f64::from_bits(self.eio_weight.load(std::sync::atomic::Ordering::Relaxed));
            let stream = StreamId((volume << 32) | u64::from(drive.0));
            Some(
                iso.admit(stream, u64::from(drive.0), kind, bytes as u64, weight)
                    .await,
            )
        } else {
            None
        };
        let start = std::time::Instant::now();
        let r = io.await;
        if r.is_ok() {
            iso.record(
                Some(volume),
                u64::from(drive.0),
                kind == IoKind::Write,
                bytes,
                start.elapsed(),
            );
        }
        r.map_err(|source| VolumeError::Drive { drive, source })
    }

    /// Refetches the whole map (after a resize or a chain change). Several
    /// tasks may refetch at once and answers may arrive out of order, so the
    /// fetched map is absorbed ([`VolumeMap::absorb`]), never just stored:
    /// an older answer must not hide an extent allocated since.
    pub async fn refresh(&self) -> Result<(), VolumeError> {
        let (map, drives) = Self::decode_layout(self.control.open_volume(&self.name).await?)?;
        if map.volume().id != read(&self.map).volume().id {
            return Err(VolumeError::Control(format!(
                "volume {:?} was deleted and created again; open it again",
                self.name
            )));
        }
        write(&self.map).absorb(map);
        write(&self.drives).extend(drives);
        // Chains may have moved: forget nothing (connections stay valid),
        // but drop namespaces of drives no longer known.
        Ok(())
    }

    /// Asks the control plane for the volume's record and takes in an
    /// online resize (a newer epoch refetches the whole map). Returns the
    /// size in bytes now known. A client that exports the volume polls this
    /// so that its own hosts see the volume grow.
    pub async fn poll_size(&self) -> Result<u64, VolumeError> {
        let v = self
            .control
            .get_volume(&self.name)
            .await?
            .to_record()
            .map_err(bad)?;
        let (size, epoch) = {
            let m = read(&self.map);
            (m.volume().size_bytes, m.epoch())
        };
        if v.epoch > epoch {
            self.refresh().await?;
        } else if v.size_bytes > size {
            let mut m = write(&self.map);
            if v.size_bytes > m.volume().size_bytes {
                m.update_volume(v);
            }
        }
        Ok(read(&self.map).volume().size_bytes)
    }

    async fn namespace(&self, id: DriveId) -> Result<Namespace, VolumeError> {
        if let Some(ns) = self.namespaces.read().await.get(&id) {
            return Ok(ns.clone());
        }
        let drive = read(&self.drives)
            .get(&id)
            .cloned()
            .ok_or_else(|| bad(format!("chain names unknown drive {id}")))?;
        let ns = self.pool.namespace(&drive, self.hostnqn.as_deref()).await?;
        self.namespaces.write().await.insert(id, ns.clone());
        Ok(ns)
    }

    /// Plans a byte range, refetching the volume once if the range runs past
    /// the cached size (it may have grown online).
    async fn pieces(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<sluice_volume::Piece>, VolumeError> {
        let plan = |m: &VolumeMap| {
            m.plan(offset, len, PIECE_BYTES_MAX)
                .map(Iterator::collect::<Vec<_>>)
        };
        let first = plan(&read(&self.map));
        match first {
            Ok(p) => Ok(p),
            Err(sluice_volume::map::RangeError::Beyond { .. }) => {
                self.refresh().await?;
                Ok(plan(&read(&self.map))?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Allocates extent `index` (an extent fault).
    async fn fault(&self, index: u64) -> Result<(), VolumeError> {
        let (id, epoch) = {
            let m = read(&self.map);
            (m.volume().id.0, m.epoch())
        };
        let mut backoff = Duration::from_millis(50);
        let mut attempt = 0;
        let answer = loop {
            attempt += 1;
            match self.control.allocate_extent(&self.name, id, index, epoch).await {
                Ok(a) => break a,
                Err(VolumeError::ControlUnavailable { addr, reason }) if attempt < ALLOCATE_ATTEMPTS_MAX => {
                    tracing::warn!(volume = %self.name, extent = index, %addr, %reason, attempt,
                        "extent allocation failed: control plane unreachable; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(VolumeError::ControlUnavailable { addr, reason }) => {
                    return Err(VolumeError::ControlUnavailable {
                        addr,
                        reason: format!(
                            "extent {index} of volume {:?} is not allocated and {ALLOCATE_ATTEMPTS_MAX} attempts failed: {reason}",
                            self.name
                        ),
                    })
                }
                Err(e) => return Err(e),
            }
        };
        self.allocations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let v = answer
            .volume
            .ok_or_else(|| bad("allocation without a volume"))?
            .to_record()
            .map_err(bad)?;
        let extent = answer
            .extent
            .ok_or_else(|| bad("allocation without an extent"))?
            .to_record();
        write(&self.drives).extend(answer.drives.into_iter().map(|d| (DriveId(d.id), d)));
        if v.epoch > epoch {
            // Chains changed since the map was fetched: refetch all of it.
            return self.refresh().await;
        }
        let mut m = write(&self.map);
        if v.size_bytes > m.volume().size_bytes {
            m.update_volume(v);
        }
        m.insert(extent).map_err(bad)
    }

    /// Which of `blocks` blocks from `lba` lie in allocated extents: runs
    /// of (blocks, allocated) that tile the range. Extents the cached map
    /// shows unallocated may have been allocated by another client since,
    /// so the map is refetched first when the range has any (a hole
    /// reported here was a hole when this call asked).
    pub async fn allocation(&self, lba: u64, blocks: u64) -> Result<Vec<(u64, bool)>, VolumeError> {
        let bs = u64::from(self.block_size_bytes());
        let runs = |m: &VolumeMap| -> Result<Vec<(u64, bool)>, VolumeError> {
            let mut out: Vec<(u64, bool)> = Vec::new();
            for p in m.plan(lba * bs, blocks * bs, u64::MAX)? {
                let allocated = matches!(p.target, PieceTarget::Mapped { .. });
                let n = p.len_bytes / bs;
                match out.last_mut() {
                    Some((k, a)) if *a == allocated => *k += n,
                    _ => out.push((n, allocated)),
                }
            }
            Ok(out)
        };
        let cached = runs(&read(&self.map));
        match cached {
            Ok(r) if r.iter().all(|(_, a)| *a) => Ok(r),
            _ => {
                self.refresh().await?;
                runs(&read(&self.map))
            }
        }
    }

    /// Reads `len_bytes` at block `lba`.
    pub async fn read(
        &self,
        lba: u64,
        len_bytes: usize,
        flags: IoFlags,
    ) -> Result<Vec<u8>, VolumeError> {
        let bs = u64::from(self.block_size_bytes());
        let offset = lba.checked_mul(bs).ok_or_else(|| bad("LBA overflows"))?;
        let mut stale = 0;
        loop {
            match self.read_once(offset, len_bytes, flags).await {
                // A replica remapped away answers a reader on an old map so.
                Err(e) if stale < STALE_EPOCH_RETRIES_MAX && stale_epoch(&e) => {
                    stale += 1;
                    tracing::debug!(volume = %self.name, error = %e, "read refused for its chain epoch; refetching the map");
                    tokio::time::sleep(Duration::from_millis(u64::from(stale))).await;
                    self.refresh().await?;
                }
                r => return r,
            }
        }
    }

    async fn read_once(
        &self,
        offset: u64,
        len_bytes: usize,
        flags: IoFlags,
    ) -> Result<Vec<u8>, VolumeError> {
        let pieces = self.pieces(offset, len_bytes as u64).await?;
        if let [p] = pieces.as_slice() {
            return self.read_piece(p, flags).await;
        }
        let mut out = vec![0u8; len_bytes];
        for p in &pieces {
            let data = self.read_piece(p, flags).await?;
            let at = usize::try_from(p.buf_offset).map_err(bad)?;
            out[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(out)
    }

    async fn read_piece(
        &self,
        p: &sluice_volume::Piece,
        flags: IoFlags,
    ) -> Result<Vec<u8>, VolumeError> {
        let len = usize::try_from(p.len_bytes).map_err(bad)?;
        let PieceTarget::Mapped { extent } = p.target else {
            return Ok(vec![0u8; len]);
        };
        let m = read(&self.map)
            .extent(extent)
            .cloned()
            .ok_or_else(|| bad("mapped piece without a chain"))?;
        let chain = &m.chain;
        // Reads carry the chain epoch: a replica fenced above it (retired
        // by a remap) refuses them, and the map is refetched.
        let flags = IoFlags {
            epoch: m.epoch,
            ..flags
        };
        // The tail holds only acknowledged writes. When it cannot be
        // reached, its predecessors hold every acknowledged write too (a
        // write reaches the tail last), so they serve the read.
        //
        // While no write of this client is in flight on the extent and none
        // failed part-way down its chain, every replica is clean (a volume
        // has one writer), so the read goes to the replica whose path the
        // view shows least loaded (Flint §5.5); the tail wins ties.
        let mut order: Vec<&sluice_volume::Replica> = chain.iter().rev().collect();
        if order.len() > 1 && self.clean(extent) {
            let iso = &self.pool.isolation;
            let mut scored: Vec<(f64, &sluice_volume::Replica)> = order
                .iter()
                .map(|r| (iso.drive_load(u64::from(r.drive.0)), *r))
                .collect();
            scored.sort_by(|a, b| a.0.total_cmp(&b.0));
            order = scored.into_iter().map(|(_, r)| r).collect();
        }
        // A replica about to leave (a remap) is read last.
        if let Some(old) = m.retiring {
            order.sort_by_key(|r| **r == old);
        }
        let mut last = None;
        for replica in order {
            let r = async {
                let ns = self.namespace(replica.drive).await?;
                let lba = p.drive_offset(replica) / u64::from(ns.block_size_bytes());
                self.drive_io(replica.drive, IoKind::Read, len, ns.read(lba, len, flags))
                    .await
            }
            .await;
            match r {
                Ok(data) => return Ok(data),
                Err(e) if unreachable_drive(&e) => {
                    tracing::warn!(volume = %self.name, drive = %replica.drive, error = %e, "replica unreachable; reading another");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| bad("empty chain")))
    }

    /// Writes `data` at block `lba`, allocating extents on first write.
    ///
    /// If a replica cannot be reached, the control plane is told
    /// (`FailDrive`: it probes the drive and, if it is gone, takes it out of
    /// every chain with another replica), the map is refetched, and the
    /// whole request is written again on the new chains. Writing the same
    /// data twice is harmless, and nothing is acknowledged before every
    /// replica of the current chain has it.
    ///
    /// Every piece carries its extent's chain epoch. A drive that refuses
    /// it (Stale Chain Epoch: the chain changed, a replica is being
    /// rebuilt) makes the client refetch the map; a write to an extent
    /// being rebuilt waits, refetching, until the new replica has joined.
    pub async fn write(&self, lba: u64, data: &[u8], flags: IoFlags) -> Result<(), VolumeError> {
        let bs = u64::from(self.block_size_bytes());
        let offset = lba.checked_mul(bs).ok_or_else(|| bad("LBA overflows"))?;
        let len = data.len() as u64;
        let mut attempt = 0;
        let mut stale = 0;
        let mut waiting: Option<(std::time::Instant, Duration)> = None;
        loop {
            match self.write_once(offset, len, data, flags).await {
                Err(e) if stale < STALE_EPOCH_RETRIES_MAX && stale_epoch(&e) => {
                    stale += 1;
                    tracing::debug!(volume = %self.name, error = %e, "chain epoch refused; refetching the map");
                    self.refresh().await?;
                }
                Err(VolumeError::Rebuilding { extent, .. }) => {
                    let (since, pause) = waiting
                        .get_or_insert((std::time::Instant::now(), Duration::from_millis(1)));
                    if since.elapsed() > REBUILD_WAIT_MAX {
                        return Err(VolumeError::Rebuilding {
                            volume: self.name.clone(),
                            extent,
                            waited_ms: u64::try_from(since.elapsed().as_millis())
                                .unwrap_or(u64::MAX),
                        });
                    }
                    tokio::time::sleep(*pause).await;
                    *pause = (*pause * 2).min(Duration::from_millis(50));
                    // The rebuild ends with a new chain: refetch to see it.
                    // An unreachable control plane is waited out too.
                    if let Err(e) = self.refresh().await {
                        tracing::debug!(volume = %self.name, error = %e, "refetching the map while an extent rebuilds");
                    }
                }
                Err(e) if attempt + 1 < WRITE_ATTEMPTS_MAX && unreachable_drive(&e) => {
                    attempt += 1;
                    if let VolumeError::Drive { drive, source } = &e {
                        self.drive_unreachable(*drive, source).await?;
                    }
                }
                r => return r,
            }
        }
    }

    async fn write_once(
        &self,
        offset: u64,
        len: u64,
        data: &[u8],
        flags: IoFlags,
    ) -> Result<(), VolumeError> {
        let mut pieces = self.pieces(offset, len).await?;
        loop {
            // Not `while let`: its guard would live across the await below.
            let fault = read(&self.map).first_fault(offset, len);
            let Some(fault) = fault else { break };
            self.fault(fault.index).await?;
            // Safe to loop: each fault allocates (or learns) one extent.
            pieces = self.pieces(offset, len).await?;
            if read(&self.map).chain(fault.index).is_none() {
                return Err(bad(format!(
                    "extent {} still unallocated after allocation",
                    fault.index
                )));
            }
        }
        for p in &pieces {
            let PieceTarget::Mapped { extent } = p.target else {
                return Err(bad("an unallocated piece after allocation"));
            };
            let m = read(&self.map)
                .extent(extent)
                .cloned()
                .ok_or_else(|| bad("mapped piece without a chain"))?;
            if m.rebuilding {
                return Err(VolumeError::Rebuilding {
                    volume: self.name.clone(),
                    extent,
                    waited_ms: 0,
                });
            }
            let flags = IoFlags {
                epoch: m.epoch,
                ..flags
            };
            let at = usize::try_from(p.buf_offset).map_err(bad)?;
            let bytes = &data[at..at + usize::try_from(p.len_bytes).map_err(bad)?];
            let _writing = self.writing(extent);
            // Head first, tail last: acknowledged once the tail has it.
            for (i, replica) in m.chain.iter().enumerate() {
                let r = async {
                    let ns = self.namespace(replica.drive).await?;
                    let dlba = p.drive_offset(replica) / u64::from(ns.block_size_bytes());
                    self.drive_io(
                        replica.drive,
                        IoKind::Write,
                        bytes.len(),
                        ns.write(dlba, bytes, flags),
                    )
                    .await
                }
                .await;
                if let Err(e) = r {
                    if i > 0 {
                        // The head has data the tail has not: from now on
                        // only the tail serves reads of this extent.
                        sluice_runtime::sync::lock(&self.diverged).insert(extent);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Marks a write in flight on `extent`.
    fn writing(&self, extent: u64) -> Writing<'_> {
        *sluice_runtime::sync::lock(&self.writing)
            .entry(extent)
            .or_insert(0) += 1;
        Writing { v: self, extent }
    }

    /// Whether every replica of `extent` holds the same data: no write of
    /// this client in flight on it, and none ever failed part-way.
    fn clean(&self, extent: u64) -> bool {
        !sluice_runtime::sync::lock(&self.writing).contains_key(&extent)
            && !sluice_runtime::sync::lock(&self.diverged).contains(&extent)
    }

    /// A replica could not be reached: report it and refetch the map.
    async fn drive_unreachable(
        &self,
        drive: DriveId,
        e: &sluice_host::HostError,
    ) -> Result<(), VolumeError> {
        self.namespaces.write().await.remove(&drive);
        // Another writer may have reported it already: then the fresh map
        // no longer uses it, and one report is enough.
        self.refresh().await?;
        if !read(&self.map).uses_drive(drive) {
            tracing::debug!(volume = %self.name, %drive, "replica unreachable, already out of every chain");
            return Ok(());
        }
        tracing::warn!(volume = %self.name, %drive, error = %e, "replica unreachable; reporting it to the control plane");
        let reason = format!("volume {:?}: {e}", self.name);
        let answer = self.control.fail_drive(drive.0, false, &reason).await?;
        tracing::info!(volume = %self.name, %drive, failed = answer.failed, detail = %answer.detail, "drive failure reported");
        self.refresh().await
    }

    /// Flushes every drive the volume has written to.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        let nss: Vec<(DriveId, Namespace)> = self
            .namespaces
            .read()
            .await
            .iter()
            .map(|(d, n)| (*d, n.clone()))
            .collect();
        for (drive, ns) in nss {
            ns.flush()
                .await
                .map_err(|source| VolumeError::Drive { drive, source })?;
        }
        Ok(())
    }
}
