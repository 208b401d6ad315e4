//! What a job drives: a namespace on one target, or an elastic volume whose
//! pieces go straight to its drives (`--volume`, `sluice-control`).

use std::sync::Arc;

use anyhow::Context;
use sluice_control::{Volume, VolumeError};
use sluice_host::{ConnectOptions, HostError, IoFlags, Namespace};

use crate::BenchArgs;

/// A namespace or a volume.
#[derive(Debug, Clone)]
pub(crate) enum Device {
    Namespace(Namespace),
    Volume(Arc<Volume>),
}

/// An I/O failure of either kind.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeviceError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
}

impl DeviceError {
    /// Whether the job should stop after many of these.
    pub(crate) fn is_fatal_for_connection(&self) -> bool {
        match self {
            DeviceError::Host(e) | DeviceError::Volume(VolumeError::Drive { source: e, .. }) => {
                e.is_fatal_for_connection()
            }
            DeviceError::Volume(_) => false,
        }
    }
}

impl Device {
    pub(crate) fn block_size_bytes(&self) -> u32 {
        match self {
            Device::Namespace(n) => n.block_size_bytes(),
            Device::Volume(v) => v.block_size_bytes(),
        }
    }

    pub(crate) fn size_blocks(&self) -> u64 {
        match self {
            Device::Namespace(n) => n.size_blocks(),
            Device::Volume(v) => v.size_blocks(),
        }
    }

    pub(crate) async fn read(
        &self,
        lba: u64,
        len: usize,
        flags: IoFlags,
    ) -> Result<Vec<u8>, DeviceError> {
        Ok(match self {
            Device::Namespace(n) => n.read(lba, len, flags).await?,
            Device::Volume(v) => v.read(lba, len, flags).await?,
        })
    }

    pub(crate) async fn write_owned(
        &self,
        lba: u64,
        data: Vec<u8>,
        flags: IoFlags,
    ) -> Result<(), DeviceError> {
        match self {
            Device::Namespace(n) => n.write_owned(lba, data, flags).await?,
            Device::Volume(v) => v.write(lba, &data, flags).await?,
        }
        Ok(())
    }
}

/// Opens `--volume NAME` through `--control`, with the job's connect options
/// for the drive connections.
pub(crate) async fn open_volume(
    args: &BenchArgs,
    name: &str,
    opts: ConnectOptions,
) -> anyhow::Result<Device> {
    let v = sluice_control::volume::open(&args.control, args.token_file.as_deref(), name, opts)
        .await
        .with_context(|| {
            format!(
                "opening volume {name:?} through the control plane at {}",
                args.control
            )
        })?;
    v.set_eio(args.eio);
    Ok(Device::Volume(Arc::new(v)))
}
