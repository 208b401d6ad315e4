//! The control API's client, with the bearer token attached to every call.
//! The channels connect lazily and reconnect by themselves, so a client
//! outlives a control-plane restart. Given several addresses
//! (`HOST:PORT,HOST:PORT`: control planes sharing one etcd), a call that
//! finds a follower or an unreachable process moves on to the next address,
//! and the client remembers which one answered.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_admin::BearerToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use crate::auth::AttachToken;
use crate::error::VolumeError;
use crate::pb;
use crate::pb::control_client::ControlClient as Raw;

/// How long one control call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a call waits for an election (a leader's lease is 3 s).
pub const LEADER_WAIT: Duration = Duration::from_secs(8);

/// Control-plane addresses one client may be given, at most.
pub const ADDRS_MAX: usize = 16;

type Stub = Raw<InterceptedService<Channel, AttachToken>>;

/// An authenticated client of `sluice control`.
#[derive(Clone, Debug)]
pub struct ControlClient {
    stubs: Vec<Stub>,
    addrs: Vec<String>,
    /// The address that answered last.
    current: Arc<AtomicUsize>,
    /// For the view's fast channel, which sends it in its hello.
    token: Option<BearerToken>,
}

impl ControlClient {
    /// A client of the control plane at `addr` (`HOST:PORT`, or several
    /// separated by commas). Call it inside a tokio runtime: the channels'
    /// workers are spawned on it.
    pub fn new(addr: &str, token: Option<&BearerToken>) -> Result<ControlClient, VolumeError> {
        let addrs: Vec<String> = addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        if addrs.is_empty() || addrs.len() > ADDRS_MAX {
            return Err(VolumeError::Control(format!(
                "control address {addr:?}: give 1-{ADDRS_MAX} HOST:PORT, comma-separated"
            )));
        }
        let mut stubs = Vec::with_capacity(addrs.len());
        for a in &addrs {
            let endpoint = Endpoint::from_shared(format!("http://{a}"))
                .map_err(|e| VolumeError::Control(format!("control address {a:?}: {e}")))?
                .connect_timeout(Duration::from_secs(3))
                .timeout(CALL_TIMEOUT)
                .tcp_nodelay(true);
            stubs.push(Raw::with_interceptor(
                endpoint.connect_lazy(),
                AttachToken::new(token),
            ));
        }
        Ok(ControlClient {
            stubs,
            addrs,
            current: Arc::new(AtomicUsize::new(0)),
            token: token.cloned(),
        })
    }

    /// The bearer token this client presents.
    pub fn token(&self) -> Option<&BearerToken> {
        self.token.as_ref()
    }

    /// The control plane's address (the one that answered last).
    pub fn addr(&self) -> &str {
        &self.addrs[self.current.load(Ordering::Relaxed) % self.addrs.len()]
    }

    /// Calls `f` on the current address, then on the others while they are
    /// unreachable or not the leader.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, VolumeError>
    where
        F: Fn(Stub) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let n = self.stubs.len();
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        loop {
            let start = self.current.load(Ordering::Relaxed);
            let mut last = None;
            let mut election = false;
            for k in 0..n {
                let i = (start + k) % n;
                match f(self.stubs[i].clone()).await {
                    Ok(r) => {
                        self.current.store(i, Ordering::Relaxed);
                        return Ok(r.into_inner());
                    }
                    Err(s) if s.code() == Code::Unavailable => {
                        election |= s.metadata().contains_key(crate::leader::NOT_LEADER_KEY);
                        last = Some(s);
                    }
                    Err(s) => return Err(VolumeError::from_status(&self.addrs[i], s)),
                }
            }
            let s = last.unwrap_or_else(|| tonic::Status::unavailable("no control plane answered"));
            // A follower answered: an election is under way (start-up, or a
            // dead leader's lease running out). Wait for it; an unreachable
            // control plane, on the other hand, is reported at once.
            if !election || tokio::time::Instant::now() >= deadline {
                return Err(VolumeError::from_status(&self.addrs.join(","), s));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn add_drive(
        &self,
        addr: &str,
        nqn: &str,
        nsid: u32,
    ) -> Result<pb::Drive, VolumeError> {
        let req = pb::AddDriveRequest {
            addr: addr.into(),
            nqn: nqn.into(),
            nsid,
        };
        self.call(|mut s| {
            let req = req.clone();
            async move { s.add_drive(req).await }
        })
        .await
    }

    pub async fn list_drives(&self) -> Result<Vec<pb::Drive>, VolumeError> {
        let r = self
            .call(|mut s| async move { s.list_drives(pb::ListDrivesRequest {}).await })
            .await?;
        Ok(r.drives)
    }

    pub async fn set_drive_state(&self, id: u32, up: bool) -> Result<pb::Drive, VolumeError> {
        self.set_drive(pb::SetDriveStateRequest {
            id,
            up,
            release_quarantined: false,
        })
        .await
    }

    /// Sets a drive's state and, when asked, releases its quarantined
    /// slots without a fence.
    pub async fn set_drive(&self, req: pb::SetDriveStateRequest) -> Result<pb::Drive, VolumeError> {
        self.call(|mut s| async move { s.set_drive_state(req).await })
            .await
    }

    pub async fn create_volume(
        &self,
        req: pb::CreateVolumeRequest,
    ) -> Result<pb::Volume, VolumeError> {
        self.call(|mut s| {
            let req = req.clone();
            async move { s.create_volume(req).await }
        })
        .await
    }

    pub async fn list_volumes(&self) -> Result<Vec<pb::Volume>, VolumeError> {
        let r = self
            .call(|mut s| async move { s.list_volumes(pb::ListVolumesRequest {}).await })
            .await?;
        Ok(r.volumes)
    }

    pub async fn open_volume(&self, name: &str) -> Result<pb::VolumeLayout, VolumeError> {
        let req = pb::VolumeName { name: name.into() };
        self.call(|mut s| {
            let req = req.clone();
            async move { s.open_volume(req).await }
        })
        .await
    }

    /// The volume's record (size, epoch, state), without its extents.
    pub async fn get_volume(&self, name: &str) -> Result<pb::Volume, VolumeError> {
        let req = pb::VolumeName { name: name.into() };
        self.call(|mut s| {
            let req = req.clone();
            async move { s.get_volume(req).await }
        })
        .await
    }

    pub async fn resize_volume(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<pb::Volume, VolumeError> {
        let req = pb::ResizeVolumeRequest {
            name: name.into(),
            size_bytes,
        };
        self.call(|mut s| {
            let req = req.clone();
            async move { s.resize_volume(req).await }
        })
        .await
    }

    pub async fn delete_volume(&self, name: &str) -> Result<(), VolumeError> {
        let req = pb::VolumeName { name: name.into() };
        self.call(|mut s| {
            let req = req.clone();
            async move { s.delete_volume(req).await }
        })
        .await?;
        Ok(())
    }

    pub async fn allocate_extent(
        &self,
        name: &str,
        volume_id: u64,
        index: u64,
        epoch: u64,
    ) -> Result<pb::ExtentAllocation, VolumeError> {
        let req = pb::AllocateExtentRequest {
            name: name.into(),
            volume_id,
            index,
            epoch,
        };
        self.call(|mut s| {
            let req = req.clone();
            async move { s.allocate_extent(req).await }
        })
        .await
    }

    pub async fn fail_drive(
        &self,
        id: u32,
        force: bool,
        reason: &str,
    ) -> Result<pb::FailDriveResponse, VolumeError> {
        let req = pb::FailDriveRequest {
            id,
            force,
            reason: reason.into(),
        };
        self.call(|mut s| {
            let req = req.clone();
            async move { s.fail_drive(req).await }
        })
        .await
    }

    /// The status of the control plane at the current address (followers
    /// answer too: `is_leader` says which it is).
    pub async fn status(&self) -> Result<pb::StatusResponse, VolumeError> {
        self.call(|mut s| async move { s.status(pb::StatusRequest {}).await })
            .await
    }

    /// Sends a batch of view samples; the answer carries the counters.
    pub async fn view_sync(&self, batch: pb::ViewBatch) -> Result<pb::ViewAck, VolumeError> {
        self.call(|mut s| {
            let b = batch.clone();
            async move { s.view_sync(b).await }
        })
        .await
    }

    /// A target's report of its namespaces' I/O.
    pub async fn view_target_report(
        &self,
        report: pb::TargetReport,
    ) -> Result<pb::TargetReportAck, VolumeError> {
        self.call(|mut s| {
            let r = report.clone();
            async move { s.view_target_report(r).await }
        })
        .await
    }

    /// PULL: entities of the view and the latest bottleneck report.
    pub async fn view_query(
        &self,
        req: pb::ViewQueryRequest,
    ) -> Result<pb::ViewSnapshot, VolumeError> {
        self.call(|mut s| {
            let r = req.clone();
            async move { s.view_query(r).await }
        })
        .await
    }

    /// PUSH: opens the stream on which the controller sends `client`'s part
    /// of the view every epoch.
    pub async fn watch_view(
        &self,
        client: &str,
    ) -> Result<tonic::Streaming<pb::ViewPush>, VolumeError> {
        self.watch_view_with(client, Vec::new()).await
    }

    /// [`Self::watch_view`] with event subscriptions.
    pub async fn watch_view_with(
        &self,
        client: &str,
        subscriptions: Vec<pb::ViewSubscription>,
    ) -> Result<tonic::Streaming<pb::ViewPush>, VolumeError> {
        let req = pb::WatchViewRequest {
            client: client.into(),
            subscriptions,
        };
        self.call(|mut s| {
            let r = req.clone();
            async move { s.watch_view(r).await }
        })
        .await
    }

    /// The bandwidth auction's state.
    pub async fn auction_status(&self) -> Result<pb::AuctionStatusResponse, VolumeError> {
        self.call(|mut s| async move { s.auction_status(pb::AuctionStatusRequest {}).await })
            .await
    }

    /// Switches the bandwidth auction on or off.
    pub async fn set_auction(&self, on: bool) -> Result<pb::AuctionStatusResponse, VolumeError> {
        self.call(|mut s| async move { s.set_auction(pb::SetAuctionRequest { on }).await })
            .await
    }

    /// Puts a tenant in an SLO class.
    pub async fn set_tenant(&self, name: &str, slo_class: &str) -> Result<pb::Tenant, VolumeError> {
        let req = pb::SetTenantRequest {
            name: name.into(),
            slo_class: slo_class.into(),
        };
        self.call(|mut s| {
            let r = req.clone();
            async move { s.set_tenant(r).await }
        })
        .await
    }

    /// Tenants, the SLO classes and the default class.
    pub async fn list_tenants(&self) -> Result<pb::ListTenantsResponse, VolumeError> {
        self.call(|mut s| async move { s.list_tenants(pb::ListTenantsRequest {}).await })
            .await
    }
}
