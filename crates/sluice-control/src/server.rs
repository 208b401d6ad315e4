//! `sluice control`: the gRPC service over the metadata catalog.
//!
//! At start-up it opens the store, checks the whole catalog (a corrupt
//! record stops start-up and names its key), and finishes deletes that a
//! crash interrupted. Adding a drive connects to it over NVMe/TCP once to
//! learn its size, block size and NGUID. After that the service only touches
//! metadata: it is never on an I/O's path.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sluice_admin::BearerToken;
use sluice_host::ConnectOptions;
use sluice_meta::catalog::{CatalogError, Deleting, FenceJob, Fenced, VolumeSpec};
use sluice_meta::check::check_catalog;
use sluice_meta::{Catalog, EtcdStore, MetaStore, RedbStore};
use sluice_volume::{DriveId, DriveSpec, DriveState, PlacementWeights, VolumeId};
use tonic::{Request, Response, Status};

use crate::auth::{check_listen, RequireToken};
use crate::error::status_of;
use crate::leader::Leadership;
use crate::pb;
use crate::pb::control_server::{Control, ControlServer};
use crate::rebuild::{RebuildCollector, RebuildConfig, RebuildProgress, Rebuilder};
use crate::view::{SloClasses, ViewCollector, ViewHub};
use crate::view_pb;
use crate::volume::DrivePool;
use crate::zeroer::{Zeroer, ZeroerCollector, ZeroerConfig, ZeroerProgress};
use sluice_flint::{AuctionConfig, ViewControllerConfig};

/// Where the metadata lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Metadata {
    /// `redb:PATH`: one embedded file (the default).
    Redb(PathBuf),
    /// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`.
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
    },
}

impl FromStr for Metadata {
    type Err = String;

    fn from_str(s: &str) -> Result<Metadata, String> {
        if let Some(path) = s.strip_prefix("redb:") {
            if path.is_empty() {
                return Err("--metadata redb:PATH needs a path".into());
            }
            return Ok(Metadata::Redb(PathBuf::from(path)));
        }
        if let Some(rest) = s.strip_prefix("etcd://") {
            let (hosts, prefix) = match rest.split_once('/') {
                Some((h, p)) if !p.is_empty() => (h, format!("/{}/", p.trim_matches('/'))),
                Some((h, _)) => (h, "/sluice/".to_owned()),
                None => (rest, "/sluice/".to_owned()),
            };
            let mut endpoints = Vec::new();
            for h in hosts.split(',') {
                let ok = h
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !ok {
                    return Err(format!("--metadata etcd endpoint {h:?} is not HOST:PORT"));
                }
                endpoints.push(format!("http://{h}"));
            }
            return Ok(Metadata::Etcd { endpoints, prefix });
        }
        Err(format!(
            "--metadata {s:?}: expected redb:PATH or etcd://HOST:PORT[,HOST:PORT][/PREFIX]"
        ))
    }
}

/// What `sluice control` runs with.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    pub metadata: Metadata,
    pub token: Option<BearerToken>,
    pub weights: PlacementWeights,
    /// How the control plane connects to drives to probe them.
    pub probe: ConnectOptions,
    /// The address clients should use for this process, published when it
    /// is elected leader (default: the listen address).
    pub advertise: Option<String>,
    /// The background rebuild of lost replicas.
    pub rebuild: RebuildConfig,
    /// Zeroing slots ahead of extent faults.
    pub zeroer: ZeroerConfig,
    /// Moving extents off drives the view reports congested (off unless
    /// asked for).
    pub remap: crate::remap::RemapConfig,
    /// The shadow view's windows, epoch and congestion thresholds.
    pub view: ViewControllerConfig,
    /// Where to serve `/metrics` and `/v1/view` (none by default).
    pub admin: Option<sluice_admin::AdminConfig>,
    /// The bandwidth auction: its knobs and whether it starts on.
    pub auction: AuctionConfig,
    pub auction_on: bool,
    /// SLO classes and their weights in the auction.
    pub slo: SloClasses,
    /// Where to serve the view's fast channel (none by default).
    pub view_listen: Option<SocketAddr>,
}

impl ControlConfig {
    pub fn new(metadata: Metadata) -> ControlConfig {
        let probe = ConnectOptions {
            hostnqn: "nqn.2026-11.io.sluice:control".into(),
            io_queues: 1,
            queue_depth: 4,
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(10),
            reconnect: sluice_host::ReconnectPolicy {
                attempts_max: 0,
                ..Default::default()
            },
            ..ConnectOptions::default()
        };
        ControlConfig {
            metadata,
            token: None,
            weights: PlacementWeights::default(),
            probe,
            advertise: None,
            rebuild: RebuildConfig::default(),
            zeroer: ZeroerConfig::default(),
            remap: crate::remap::RemapConfig::default(),
            view: ViewControllerConfig::default(),
            admin: None,
            auction: AuctionConfig::default(),
            auction_on: false,
            slo: SloClasses::default(),
            view_listen: None,
        }
    }
}

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("metadata: {0}")]
    Metadata(String),
    #[error("serving the control API: {0}")]
    Transport(String),
}

/// Serves the control API on `listener` until `shutdown` resolves.
pub async fn serve(
    cfg: ControlConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Transport(e.to_string()))?;
    check_listen(addr, cfg.token.as_ref()).map_err(ServeError::Config)?;
    if cfg.token.is_none() {
        tracing::warn!(%addr, "SECURITY: the control API has no token; anyone who can reach {addr} can manage volumes");
    }
    cfg.weights.check().map_err(ServeError::Config)?;
    cfg.rebuild.check().map_err(ServeError::Config)?;
    cfg.zeroer.check().map_err(ServeError::Config)?;
    cfg.remap.check().map_err(ServeError::Config)?;
    cfg.view
        .check()
        .map_err(|e| ServeError::Config(e.to_string()))?;
    cfg.auction.check().map_err(ServeError::Config)?;
    match &cfg.metadata {
        Metadata::Redb(path) => {
            // One process owns the file (redb locks it): it always leads.
            let store = RedbStore::open(path).map_err(|e| ServeError::Metadata(e.to_string()))?;
            let me = cfg.advertise.clone().unwrap_or_else(|| addr.to_string());
            run(
                store,
                cfg,
                listener,
                addr,
                Leadership::always(&me),
                shutdown,
            )
            .await
        }
        Metadata::Etcd { endpoints, prefix } => {
            let store = EtcdStore::connect(endpoints, prefix)
                .await
                .map_err(|e| ServeError::Metadata(e.to_string()))?;
            let me = cfg.advertise.clone().unwrap_or_else(|| addr.to_string());
            let leadership = crate::leader::campaign(store.client(), prefix, &me);
            run(store, cfg, listener, addr, leadership, shutdown).await
        }
    }
}

async fn run<S: MetaStore>(
    store: S,
    cfg: ControlConfig,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    leadership: Arc<Leadership>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let summary = check_catalog(&store)
        .await
        .map_err(|e| ServeError::Metadata(e.to_string()))?;
    let describe = store.describe();
    let catalog = Catalog::new(store, cfg.weights);
    let drives = DrivePool::new(ConnectOptions {
        reconnect: sluice_host::ReconnectPolicy::default(),
        ..cfg.probe.clone()
    });
    let drain = cfg.rebuild.drain_timeout;
    let resumed = catalog
        .resume_deletes_with(|d| fence_deleted(&drives, d, drain))
        .await
        .map_err(|e| ServeError::Metadata(e.to_string()))?;
    for name in resumed {
        tracing::info!(volume = %name, "finished a delete interrupted by a restart");
    }
    tracing::info!(
        %addr, metadata = %describe, drives = summary.drives, volumes = summary.volumes,
        extents = summary.extents, revision = summary.revision, "control plane serving"
    );
    let catalog = Arc::new(catalog);
    let view = ViewHub::with_auction(cfg.view, cfg.auction, cfg.auction_on, cfg.slo.clone())
        .map_err(|e| ServeError::Config(e.to_string()))?;
    view.refresh_drives(&catalog).await;
    let progress = Arc::new(RebuildProgress::default());
    let wake = Arc::new(tokio::sync::Notify::new());
    if cfg.remap.enabled {
        tracing::info!(congested_for = ?cfg.remap.congested_for, extents_per_scan = cfg.remap.extents_per_scan,
            "remapping extents off drives the view reports congested");
    }
    let rebuilder = tokio::spawn(
        Rebuilder {
            catalog: catalog.clone(),
            drives: drives.clone(),
            leadership: leadership.clone(),
            probe: cfg.probe.clone(),
            cfg: cfg.rebuild,
            progress: progress.clone(),
            wake: wake.clone(),
            view: view.clone(),
            remap: cfg.remap,
            pacer: std::sync::Mutex::new(crate::rebuild::Pacer::new(
                cfg.rebuild.rate_bytes_per_sec,
                Duration::from_micros(view.with(|c| c.config().epoch_us)),
            )),
        }
        .run(),
    );
    // A drive may have failed while no control plane ran.
    wake.notify_one();
    let zeroed = Arc::new(ZeroerProgress::default());
    let wake_zeroer = Arc::new(tokio::sync::Notify::new());
    let zeroer = tokio::spawn(
        Zeroer {
            catalog: catalog.clone(),
            drives: drives.clone(),
            leadership: leadership.clone(),
            cfg: cfg.zeroer,
            drain,
            progress: zeroed.clone(),
            wake: wake_zeroer.clone(),
        }
        .run(),
    );
    let epochs = tokio::spawn(view.clone().run_epochs(catalog.clone()));
    let auction = tokio::spawn(view.clone().run_auction(catalog.clone()));
    let (view_addr, view_channel) = match cfg.view_listen {
        None => (String::new(), None),
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| ServeError::Transport(format!("view channel on {a}: {e}")))?;
            let bound = l
                .local_addr()
                .map_err(|e| ServeError::Transport(format!("view channel on {a}: {e}")))?;
            tracing::info!(addr = %bound, "view channel ready");
            let task = tokio::spawn(crate::view_wire::serve(
                l,
                view.clone(),
                leadership.clone(),
                cfg.token.clone(),
            ));
            (bound.to_string(), Some(task))
        }
    };
    if cfg.auction_on {
        tracing::info!(epoch_us = cfg.auction.epoch_us, "bandwidth auction on");
    }
    let _admin = match cfg.admin.clone() {
        None => None,
        Some(admin) => Some(start_admin(admin, view.clone(), progress.clone(), zeroed)?),
    };
    let service = ControlService {
        catalog,
        drain,
        probe: cfg.probe.clone(),
        describe,
        leadership,
        drives,
        rebuilds: progress,
        wake_rebuilder: wake,
        wake_zeroer,
        refill_below: cfg.zeroer.clean_slots_per_drive / 2,
        view,
        view_addr,
    };
    let incoming = tokio_stream_listener(listener);
    // Shutting down ends the PUSH streams first: a graceful shutdown waits
    // for every open stream, and those never end by themselves.
    let hub = service.view.clone();
    let shutdown = async move {
        shutdown.await;
        hub.close();
    };
    let served = tonic::transport::Server::builder()
        .timeout(Duration::from_secs(30))
        .concurrency_limit_per_connection(64)
        .add_service(ControlServer::with_interceptor(
            service,
            RequireToken(cfg.token),
        ))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| ServeError::Transport(e.to_string()));
    rebuilder.abort();
    zeroer.abort();
    epochs.abort();
    auction.abort();
    if let Some(t) = view_channel {
        t.abort();
    }
    served
}

/// Serves the view's, the rebuilder's and the zeroer's metrics (`/metrics`) and the
/// view's JSON (`/v1/view`).
fn start_admin(
    cfg: sluice_admin::AdminConfig,
    view: Arc<ViewHub>,
    rebuilds: Arc<RebuildProgress>,
    zeroed: Arc<ZeroerProgress>,
) -> Result<sluice_admin::AdminServer, ServeError> {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(ViewCollector(view.clone())));
    reg.register_collector(Box::new(RebuildCollector(rebuilds)));
    reg.register_collector(Box::new(ZeroerCollector(zeroed)));
    let app = sluice_admin::compose(
        &cfg,
        [
            sluice_admin::routes::metrics(Arc::new(reg)),
            sluice_admin::routes::get_json("/v1/view", {
                let view = view.clone();
                move || view.snapshot_all()
            }),
            sluice_admin::routes::get_json("/v1/auction", move || view.auction_status()),
        ],
    );
    let s = sluice_admin::AdminServer::start(cfg, app)
        .map_err(|e| ServeError::Transport(format!("admin endpoint: {e}")))?;
    tracing::info!(addr = %s.local_addr(), "control admin endpoint ready (/metrics, /v1/view)");
    Ok(s)
}

fn tokio_stream_listener(
    listener: tokio::net::TcpListener,
) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The service over one catalog.
struct ControlService<S> {
    catalog: Arc<Catalog<S>>,
    /// Longest wait for writes in flight to a fenced slot to end.
    drain: Duration,
    probe: ConnectOptions,
    describe: String,
    leadership: Arc<Leadership>,
    /// Connections to the drives, for zeroing new extents.
    drives: Arc<DrivePool>,
    rebuilds: Arc<RebuildProgress>,
    /// Starts a rebuild scan now (a drive failed).
    wake_rebuilder: Arc<tokio::sync::Notify>,
    /// Starts a zeroer pass now (a drive was added, or a fault took a
    /// drive's clean slots below `refill_below`).
    wake_zeroer: Arc<tokio::sync::Notify>,
    /// Clean slots per drive below which the zeroer refills.
    refill_below: usize,
    /// The shadow view.
    view: Arc<ViewHub>,
    /// The view's fast channel, when served.
    view_addr: String,
}

/// Fences every slot of a volume being deleted at an epoch above its
/// chains' and waits for the writes in flight there to end, before the
/// slots are freed: a client that still has the volume open then gets
/// Stale Chain Epoch, refetches, and learns the volume is gone, instead of
/// writing into a slot another volume may get next. Returns the drives it
/// could not fence (unreachable, writes not drained, or not Sluice
/// targets): the delete goes on, and their slots are quarantined until the
/// zeroer's fence succeeds or the operator releases them.
async fn fence_deleted(drives: &DrivePool, d: Deleting, drain: Duration) -> Vec<DriveId> {
    let volume = &d.volume.name;
    // Per drive: one connection, and one warning for a drive that is
    // unreachable or refuses fences (not one per slot).
    let mut by_drive: BTreeMap<DriveId, (&sluice_volume::DriveRecord, Vec<u64>)> = BTreeMap::new();
    for (drive, r) in &d.replicas {
        by_drive
            .entry(drive.id)
            .or_insert((drive, Vec::new()))
            .1
            .push(r.slot);
    }
    let mut unfenced = Vec::new();
    for (id, (drive, slots)) in by_drive {
        let job = FenceJob {
            drive: drive.clone(),
            slots,
            epoch: d.fence_epoch,
        };
        let n = job.slots.len();
        match crate::zeroer::fence_slots(drives, job, drain).await {
            Fenced::Yes => {}
            Fenced::Unsupported => {
                tracing::warn!(%volume, drive = %id, slots = n,
                    "drive cannot fence (not a Sluice target): a deleted volume's slots there are quarantined until the operator releases them (sluice drive set {id} --release-quarantined)");
                unfenced.push(id);
            }
            Fenced::NotNow(e) => {
                tracing::warn!(%volume, drive = %id, slots = n, error = %e,
                    "a deleted volume's slots are quarantined until a fence succeeds");
                unfenced.push(id);
            }
        }
    }
    unfenced
}

type Answer<T> = Result<Response<T>, Status>;

fn ok<T>(t: T) -> Answer<T> {
    Ok(Response::new(t))
}

/// The status of a failed call, logged where it says something about the
/// pool (full, drives unreachable, metadata broken) rather than about the
/// request.
fn st(e: CatalogError) -> Status {
    match &e {
        CatalogError::PoolFull(_)
        | CatalogError::Prepare(_)
        | CatalogError::Inconsistent(_)
        | CatalogError::Contended(_)
        | CatalogError::Store(_) => tracing::warn!(error = %e, "control call failed"),
        _ => tracing::debug!(error = %e, "control call refused"),
    }
    status_of(&e)
}

/// A bad view message is the caller's fault.
fn bad_view(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

/// What `WatchView` streams.
type ViewPushStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<pb::ViewPush, Status>> + Send + 'static>,
>;

#[tonic::async_trait]
impl<S: MetaStore> Control for ControlService<S> {
    type WatchViewStream = ViewPushStream;

    async fn view_sync(&self, req: Request<pb::ViewBatch>) -> Answer<pb::ViewAck> {
        self.leadership.check()?;
        let (batch, bid) = view_pb::batch_from_pb(req.into_inner()).map_err(bad_view)?;
        let (ack, grants) = self.view.sync(&batch, &bid).map_err(bad_view)?;
        if ack.unknown_drive_samples > 0 {
            self.view.drives_unknown();
        }
        ok(view_pb::ack_to_pb(&ack, &grants))
    }

    async fn view_target_report(
        &self,
        req: Request<pb::TargetReport>,
    ) -> Answer<pb::TargetReportAck> {
        self.leadership.check()?;
        let r = view_pb::target_report_from_pb(req.into_inner()).map_err(bad_view)?;
        let (drives, unknown) = self.view.handle_target_report(&r);
        if unknown > 0 {
            // A drive added since the last refresh, or namespaces that are
            // not drives: refresh at the next epoch.
            self.view.drives_unknown();
        }
        ok(pb::TargetReportAck { drives, unknown })
    }

    async fn view_query(&self, req: Request<pb::ViewQueryRequest>) -> Answer<pb::ViewSnapshot> {
        self.leadership.check()?;
        let r = req.into_inner();
        let now = self.view.now_us();
        let snap = if r.all {
            self.view.snapshot_all()
        } else {
            let entities = r
                .entities
                .iter()
                .map(|e| view_pb::entity_from_pb(Some(e), "entities"))
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad_view)?;
            self.view
                .with(|c| c.query(&entities, now))
                .map_err(bad_view)?
        };
        ok(view_pb::snapshot_to_pb(&snap))
    }

    async fn watch_view(
        &self,
        req: Request<pb::WatchViewRequest>,
    ) -> Answer<Self::WatchViewStream> {
        self.leadership.check()?;
        let r = req.into_inner();
        let subs = r
            .subscriptions
            .iter()
            .map(view_pb::subscription_from_pb)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad_view)?;
        let now = self.view.now_us();
        let client = r.client;
        self.view
            .with(|c| {
                subs.into_iter()
                    .try_for_each(|s| c.subscribe(now, &client, s))
            })
            .map_err(bad_view)?;
        let hub = self.view.clone();
        let rx = hub.subscribe_epochs();
        let closed = Box::pin(hub.closed());
        let stream = futures_util::stream::unfold(
            (hub, rx, client, closed),
            |(hub, mut rx, client, mut closed)| async move {
                loop {
                    let next = tokio::select! {
                        r = rx.recv() => r,
                        () = &mut closed => return None,
                    };
                    match next {
                        Ok(fired) => {
                            let now = hub.now_us();
                            let snap = hub.with(|c| c.snapshot_for(&client, now));
                            let push = pb::ViewPush {
                                snapshot: Some(view_pb::snapshot_to_pb(&snap)),
                                notifications: fired
                                    .iter()
                                    .filter(|n| n.client == client)
                                    .map(view_pb::notification_to_pb)
                                    .collect(),
                            };
                            return Some((Ok(push), (hub, rx, client, closed)));
                        }
                        // A slow watcher skips epochs; the next push is whole.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        );
        ok(Box::pin(stream) as ViewPushStream)
    }

    async fn add_drive(&self, req: Request<pb::AddDriveRequest>) -> Answer<pb::Drive> {
        self.leadership.check()?;
        let r = req.into_inner();
        let spec = DriveSpec {
            addr: r.addr,
            nqn: r.nqn,
            nsid: if r.nsid == 0 { 1 } else { r.nsid },
        };
        let (bs, size, nguid) = crate::probe::probe_drive(&spec, &self.probe)
            .await
            .map_err(|e| Status::failed_precondition(format!("cannot add drive: {e}")))?;
        let d = self
            .catalog
            .add_drive(spec, bs, size, nguid)
            .await
            .map_err(st)?;
        tracing::info!(drive = %d.id, spec = %d.spec, slots = d.slots_total, "drive added");
        // Clean slots on the new drive before its first faults.
        self.wake_zeroer.notify_one();
        if let Err(e) = self.view.add_drive(&d) {
            tracing::warn!(drive = %d.id, error = %e, "view: drive not tracked");
        }
        ok(pb::Drive::from(&d))
    }

    async fn list_drives(
        &self,
        _: Request<pb::ListDrivesRequest>,
    ) -> Answer<pb::ListDrivesResponse> {
        self.leadership.check()?;
        let drives = self.catalog.drives().await.map_err(st)?;
        ok(pb::ListDrivesResponse {
            drives: drives.iter().map(pb::Drive::from).collect(),
        })
    }

    async fn set_drive_state(&self, req: Request<pb::SetDriveStateRequest>) -> Answer<pb::Drive> {
        self.leadership.check()?;
        let r = req.into_inner();
        let state = if r.up {
            DriveState::Up
        } else {
            DriveState::Down
        };
        let mut d = self
            .catalog
            .set_drive_state(DriveId(r.id), state)
            .await
            .map_err(st)?;
        tracing::info!(drive = %d.id, ?state, "drive state changed");
        if r.release_quarantined {
            let n = self.catalog.release_quarantine(d.id).await.map_err(st)?;
            tracing::warn!(drive = %d.id, slots = n,
                "quarantined slots released by the operator, unfenced: no client may still hold a deleted volume there");
            d = self
                .catalog
                .drives()
                .await
                .map_err(st)?
                .into_iter()
                .find(|x| x.id == d.id)
                .ok_or_else(|| st(CatalogError::UnknownDrive(d.id)))?;
        }
        ok(pb::Drive::from(&d))
    }

    async fn create_volume(&self, req: Request<pb::CreateVolumeRequest>) -> Answer<pb::Volume> {
        self.leadership.check()?;
        let r = req.into_inner();
        let spec = VolumeSpec {
            name: r.name,
            size_bytes: r.size_bytes,
            block_size_bytes: if r.block_size_bytes == 0 {
                4096
            } else {
                r.block_size_bytes
            },
            replicas: u8::try_from(r.replicas.max(1)).map_err(|_| {
                Status::invalid_argument(format!("invalid replicas: {}", r.replicas))
            })?,
            tenant: r.tenant,
            prefer: r.prefer,
        };
        let v = self.catalog.create_volume(spec).await.map_err(st)?;
        tracing::info!(volume = %v.name, id = %v.id, size_bytes = v.size_bytes, replicas = v.replicas, "volume created");
        ok(pb::Volume::from(&v))
    }

    async fn list_volumes(
        &self,
        _: Request<pb::ListVolumesRequest>,
    ) -> Answer<pb::ListVolumesResponse> {
        self.leadership.check()?;
        let vs = self.catalog.volumes().await.map_err(st)?;
        ok(pb::ListVolumesResponse {
            volumes: vs.iter().map(pb::Volume::from).collect(),
        })
    }

    async fn open_volume(&self, req: Request<pb::VolumeName>) -> Answer<pb::VolumeLayout> {
        self.leadership.check()?;
        let l = self
            .catalog
            .layout(&req.into_inner().name)
            .await
            .map_err(st)?;
        ok(pb::VolumeLayout {
            volume: Some(pb::Volume::from(&l.volume)),
            extents: l.extents.iter().map(pb::Extent::from).collect(),
            drives: l.drives.iter().map(pb::Drive::from).collect(),
        })
    }

    async fn get_volume(&self, req: Request<pb::VolumeName>) -> Answer<pb::Volume> {
        self.leadership.check()?;
        let v = self
            .catalog
            .volume(&req.into_inner().name)
            .await
            .map_err(st)?;
        ok(pb::Volume::from(&v))
    }

    async fn resize_volume(&self, req: Request<pb::ResizeVolumeRequest>) -> Answer<pb::Volume> {
        self.leadership.check()?;
        let r = req.into_inner();
        let v = self
            .catalog
            .resize_volume(&r.name, r.size_bytes)
            .await
            .map_err(st)?;
        tracing::info!(volume = %v.name, size_bytes = v.size_bytes, "volume resized");
        ok(pb::Volume::from(&v))
    }

    async fn delete_volume(
        &self,
        req: Request<pb::VolumeName>,
    ) -> Answer<pb::DeleteVolumeResponse> {
        self.leadership.check()?;
        let name = req.into_inner().name;
        let (drives, drain) = (&self.drives, self.drain);
        self.catalog
            .delete_volume_with(&name, |d| fence_deleted(drives, d, drain))
            .await
            .map_err(st)?;
        tracing::info!(volume = %name, "volume deleted");
        ok(pb::DeleteVolumeResponse {})
    }

    async fn allocate_extent(
        &self,
        req: Request<pb::AllocateExtentRequest>,
    ) -> Answer<pb::ExtentAllocation> {
        self.leadership.check()?;
        let r = req.into_inner();
        let drives = self.drives.clone();
        let a = self
            .catalog
            .allocate_with(&r.name, VolumeId(r.volume_id), r.index, move |job| {
                let drives = drives.clone();
                async move { crate::zeroer::zero_slots(&drives, job).await }
            })
            .await
            .map_err(st)?;
        // The zeroer refills as soon as a fault takes a drive below half its
        // reserve, not at its next look: a burst of faults drains a
        // reserve of 64 in tens of milliseconds.
        if a.drives
            .iter()
            .any(|d| d.state == DriveState::Up && d.slots_clean() < self.refill_below)
        {
            self.wake_zeroer.notify_one();
        }
        ok(pb::ExtentAllocation {
            extent: Some(pb::Extent::from(&a.extent)),
            volume: Some(pb::Volume::from(&a.volume)),
            drives: a.drives.iter().map(pb::Drive::from).collect(),
        })
    }

    async fn fail_drive(
        &self,
        req: Request<pb::FailDriveRequest>,
    ) -> Answer<pb::FailDriveResponse> {
        self.leadership.check()?;
        let peer = req
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        let r = req.into_inner();
        let id = DriveId(r.id);
        let drive = self
            .catalog
            .drives()
            .await
            .map_err(st)?
            .into_iter()
            .find(|d| d.id == id)
            .ok_or_else(|| st(CatalogError::UnknownDrive(id)))?;
        if !r.force
            && crate::probe::probe_drive(&drive.spec, &self.probe)
                .await
                .is_ok()
        {
            tracing::info!(drive = %id, %peer, reason = %r.reason, "drive failure reported, but the drive answers; keeping it");
            return ok(pb::FailDriveResponse {
                failed: false,
                chains_shortened: 0,
                detail: "the drive answers the control plane".into(),
            });
        }
        let n = self.catalog.fail_drive(id).await.map_err(st)?;
        self.wake_rebuilder.notify_one();
        tracing::warn!(drive = %id, spec = %drive.spec, %peer, reason = %r.reason, chains_shortened = n,
            "drive failed: taken out of service and out of every replicated chain");
        ok(pb::FailDriveResponse {
            failed: true,
            chains_shortened: n,
            detail: format!("{n} chain(s) shortened"),
        })
    }

    async fn auction_status(
        &self,
        _: Request<pb::AuctionStatusRequest>,
    ) -> Answer<pb::AuctionStatusResponse> {
        self.leadership.check()?;
        ok(view_pb::auction_to_pb(&self.view.auction_status()))
    }

    async fn set_auction(
        &self,
        req: Request<pb::SetAuctionRequest>,
    ) -> Answer<pb::AuctionStatusResponse> {
        self.leadership.check()?;
        let on = req.into_inner().on;
        self.view.with_arbiter(|a| a.set_on(on));
        tracing::info!(on, "bandwidth auction switched");
        ok(view_pb::auction_to_pb(&self.view.auction_status()))
    }

    async fn set_tenant(&self, req: Request<pb::SetTenantRequest>) -> Answer<pb::Tenant> {
        self.leadership.check()?;
        let r = req.into_inner();
        let Some(weight) = self.view.slo().weight(&r.slo_class) else {
            let known: Vec<&str> = self.view.slo().classes().map(|(n, _)| n).collect();
            return Err(Status::invalid_argument(format!(
                "slo_class: no SLO class {:?}; this control plane has {known:?}",
                r.slo_class
            )));
        };
        let t = self
            .catalog
            .set_tenant(&r.name, &r.slo_class)
            .await
            .map_err(st)?;
        tracing::info!(tenant = %t.name, slo_class = %t.slo_class, weight, "tenant's class set");
        self.view.refresh_weights(&self.catalog).await;
        ok(pb::Tenant {
            name: t.name,
            slo_class: t.slo_class,
            weight,
        })
    }

    async fn list_tenants(
        &self,
        _: Request<pb::ListTenantsRequest>,
    ) -> Answer<pb::ListTenantsResponse> {
        self.leadership.check()?;
        let slo = self.view.slo();
        let tenants = self
            .catalog
            .tenants()
            .await
            .map_err(st)?
            .into_iter()
            .map(|t| pb::Tenant {
                // A class this process does not define bids at the default.
                weight: slo
                    .weight(&t.slo_class)
                    .or_else(|| slo.weight(slo.default_class()))
                    .unwrap_or(1.0),
                name: t.name,
                slo_class: t.slo_class,
            })
            .collect();
        ok(pb::ListTenantsResponse {
            tenants,
            classes: slo
                .classes()
                .map(|(name, weight)| pb::SloClass {
                    name: name.to_owned(),
                    weight,
                })
                .collect(),
            default_class: slo.default_class().to_owned(),
        })
    }

    async fn status(&self, _: Request<pb::StatusRequest>) -> Answer<pb::StatusResponse> {
        let (total, reserved) = self.catalog.capacity().await.map_err(st)?;
        let drives = self.catalog.drives().await.map_err(st)?.len() as u64;
        let vols = self.catalog.volumes().await.map_err(st)?;
        let volumes = vols.len() as u64;
        // Degraded extents come from the metadata, not from the rebuilder's
        // own counting (which would read 0 before its first scan).
        let rebuilds = pb::Rebuilds {
            degraded_extents: vols.iter().map(|v| v.degraded_extents).sum(),
            ..self.rebuilds.snapshot()
        };
        ok(pb::StatusResponse {
            leader: self
                .leadership
                .check()
                .err()
                .map_or_else(String::new, |s| s.message().to_owned()),
            is_leader: self.leadership.is_leader(),
            metadata: self.describe.clone(),
            drives,
            volumes,
            slots_total: total,
            slots_reserved: reserved,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            rebuilds: Some(rebuilds),
            view_addr: self.view_addr.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_parse_or_name_the_problem() {
        assert_eq!(
            "redb:/tmp/m.redb".parse(),
            Ok(Metadata::Redb("/tmp/m.redb".into()))
        );
        assert_eq!(
            "etcd://10.0.0.1:2379,10.0.0.2:2379/prod".parse(),
            Ok(Metadata::Etcd {
                endpoints: vec!["http://10.0.0.1:2379".into(), "http://10.0.0.2:2379".into()],
                prefix: "/prod/".into()
            })
        );
        assert_eq!(
            "etcd://h:2379"
                .parse::<Metadata>()
                .map(|m| matches!(m, Metadata::Etcd { prefix, .. } if prefix == "/sluice/")),
            Ok(true)
        );
        for bad in ["redb:", "etcd://h", "etcd://:1", "mysql://x", ""] {
            assert!(bad.parse::<Metadata>().is_err(), "{bad}");
        }
    }
}
