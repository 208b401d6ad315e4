//! The control API's client, with the bearer token attached to every call.
//! The channel connects lazily and reconnects by itself, so a client outlives
//! a control-plane restart.

use std::time::Duration;

use sluice_admin::BearerToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::AttachToken;
use crate::error::VolumeError;
use crate::pb;
use crate::pb::control_client::ControlClient as Raw;

/// How long one control call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// An authenticated client of `sluice control`.
#[derive(Clone, Debug)]
pub struct ControlClient {
    raw: Raw<InterceptedService<Channel, AttachToken>>,
    addr: String,
}

impl ControlClient {
    /// A client of the control plane at `addr` (`HOST:PORT`). Call it inside
    /// a tokio runtime: the channel's worker is spawned on it.
    pub fn new(addr: &str, token: Option<&BearerToken>) -> Result<ControlClient, VolumeError> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| VolumeError::Control(format!("control address {addr:?}: {e}")))?
            .connect_timeout(Duration::from_secs(3))
            .timeout(CALL_TIMEOUT)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        Ok(ControlClient {
            raw: Raw::with_interceptor(channel, AttachToken::new(token)),
            addr: addr.to_owned(),
        })
    }

    /// The control plane's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn err(&self, s: tonic::Status) -> VolumeError {
        VolumeError::from_status(&self.addr, s)
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
        self.raw
            .clone()
            .add_drive(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
    }

    pub async fn list_drives(&self) -> Result<Vec<pb::Drive>, VolumeError> {
        self.raw
            .clone()
            .list_drives(pb::ListDrivesRequest {})
            .await
            .map(|r| r.into_inner().drives)
            .map_err(|s| self.err(s))
    }

    pub async fn set_drive_state(&self, id: u32, up: bool) -> Result<pb::Drive, VolumeError> {
        let req = pb::SetDriveStateRequest { id, up };
        self.raw
            .clone()
            .set_drive_state(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
    }

    pub async fn create_volume(
        &self,
        req: pb::CreateVolumeRequest,
    ) -> Result<pb::Volume, VolumeError> {
        self.raw
            .clone()
            .create_volume(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
    }

    pub async fn list_volumes(&self) -> Result<Vec<pb::Volume>, VolumeError> {
        self.raw
            .clone()
            .list_volumes(pb::ListVolumesRequest {})
            .await
            .map(|r| r.into_inner().volumes)
            .map_err(|s| self.err(s))
    }

    pub async fn open_volume(&self, name: &str) -> Result<pb::VolumeLayout, VolumeError> {
        let req = pb::VolumeName { name: name.into() };
        self.raw
            .clone()
            .open_volume(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
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
        self.raw
            .clone()
            .resize_volume(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
    }

    pub async fn delete_volume(&self, name: &str) -> Result<(), VolumeError> {
        let req = pb::VolumeName { name: name.into() };
        self.raw
            .clone()
            .delete_volume(req)
            .await
            .map(|_| ())
            .map_err(|s| self.err(s))
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
        self.raw
            .clone()
            .allocate_extent(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
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
        self.raw
            .clone()
            .fail_drive(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
    }

    pub async fn status(&self) -> Result<pb::StatusResponse, VolumeError> {
        self.raw
            .clone()
            .status(pb::StatusRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.err(s))
    }
}
