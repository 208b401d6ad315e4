//! Errors of the volume client, and how catalog errors become gRPC statuses
//! (and back: the client keeps the server's message, which names the
//! volume, the field or the limit).

use sluice_meta::catalog::CatalogError;
use sluice_meta::StoreError;
use sluice_volume::map::RangeError;
use sluice_volume::DriveId;
use tonic::{Code, Status};

/// Maps a catalog error to the gRPC status a client can act on.
pub fn status_of(e: &CatalogError) -> Status {
    let code = match e {
        CatalogError::UnknownVolume(_) | CatalogError::UnknownDrive(_) => Code::NotFound,
        CatalogError::DuplicateVolume(_) | CatalogError::DuplicateDrive(_) => Code::AlreadyExists,
        CatalogError::Shrink { .. }
        | CatalogError::Invalid { .. }
        | CatalogError::ExtentOutOfRange { .. } => Code::InvalidArgument,
        CatalogError::VolumeRecreated { .. }
        | CatalogError::Deleting(_)
        | CatalogError::Prepare(_) => Code::FailedPrecondition,
        CatalogError::PoolFull(_) => Code::ResourceExhausted,
        CatalogError::Contended(_) => Code::Aborted,
        CatalogError::Store(StoreError::Unavailable(_)) => Code::Unavailable,
        CatalogError::Store(StoreError::Corrupt { .. }) | CatalogError::Inconsistent(_) => {
            Code::DataLoss
        }
        CatalogError::Store(_) => Code::Internal,
    };
    Status::new(code, e.to_string())
}

/// A volume I/O or open failure.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The control plane answered with an error (its message is kept).
    #[error("control plane: {0}")]
    Control(String),
    /// The control plane could not be reached; only extent allocation and
    /// opening need it.
    #[error("control plane at {addr} unreachable: {reason}")]
    ControlUnavailable { addr: String, reason: String },
    /// The pool has no room for the extent this write needs (reported to
    /// NVMe hosts as Capacity Exceeded).
    #[error("capacity exceeded: {0}")]
    CapacityExceeded(String),
    #[error("drive {drive}: {source}")]
    Drive {
        drive: DriveId,
        #[source]
        source: sluice_host::HostError,
    },
    /// A drive answered with another identity than the one recorded.
    #[error(
        "drive {drive} at {addr} is not the drive the pool recorded ({reason}); refusing its data"
    )]
    DriveChanged {
        drive: DriveId,
        addr: String,
        reason: String,
    },
    /// A write waited too long for an extent being rebuilt.
    #[error("extent {extent} of volume {volume:?} has been rebuilding for over {waited_ms} ms; the write gave up waiting")]
    Rebuilding {
        volume: String,
        extent: u64,
        waited_ms: u64,
    },
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error("invalid answer from the control plane: {0}")]
    BadAnswer(String),
}

impl VolumeError {
    pub(crate) fn from_status(addr: &str, s: Status) -> VolumeError {
        match s.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                VolumeError::ControlUnavailable {
                    addr: addr.to_owned(),
                    reason: s.message().to_owned(),
                }
            }
            Code::ResourceExhausted => VolumeError::CapacityExceeded(s.message().to_owned()),
            _ => VolumeError::Control(format!("{}: {}", code_name(s.code()), s.message())),
        }
    }
}

fn code_name(c: Code) -> &'static str {
    match c {
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::InvalidArgument => "invalid argument",
        Code::FailedPrecondition => "failed precondition",
        Code::Unauthenticated => "unauthenticated",
        Code::PermissionDenied => "permission denied",
        Code::DataLoss => "metadata inconsistent",
        Code::Aborted => "aborted",
        _ => "error",
    }
}
