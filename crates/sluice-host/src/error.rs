//! The host's error type.

use sluice_proto::pdu::DecodeError;
use sluice_proto::Status;

/// Everything a host operation can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HostError {
    /// The controller completed the command with a non-success status.
    #[error("command {opcode:#04x} failed: {status}")]
    Nvme {
        opcode: u8,
        status: Status,
        result: u32,
    },
    /// The command did not complete within the per-command timeout.
    #[error("command {opcode:#04x} (cid {cid}) timed out after {timeout_ms} ms")]
    Timeout {
        opcode: u8,
        cid: u16,
        timeout_ms: u64,
    },
    /// Socket-level failure (connect, read, write, EOF).
    #[error("transport error: {0}")]
    Transport(String),
    /// The controller broke the NVMe/TCP protocol; names the field.
    #[error("protocol violation by the controller: {0}")]
    Protocol(#[from] DecodeError),
    /// The controller sent a C2HTermReq.
    #[error("controller terminated the connection: FES {fes:#x}, FEI {fei:#x}")]
    TerminatedByController { fes: u16, fei: u32 },
    /// The data digest of a C2HData PDU did not match.
    #[error("data digest mismatch on cid {cid}")]
    DataDigest { cid: u16 },
    /// The connection was lost or closed before the command completed.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The caller asked for something out of limits or unsupported.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A queue thread could not join the configured cgroup
    /// ([`crate::ConnectOptions::cgroup`]); the message names the path.
    #[error("cgroup: {0}")]
    Cgroup(String),
    /// The controller's answers do not allow the operation.
    #[error("controller incompatible: {0}")]
    Incompatible(String),
    /// DH-HMAC-CHAP failed: the controller refused the host, the
    /// controller could not prove its secret, or no secret was given.
    #[error("authentication: {0}")]
    Authentication(String),
    /// A direct queue ([`crate::DirectQueue`]) has no free command slot.
    #[error("queue {qid} full ({depth} commands outstanding)")]
    QueueFull { qid: u16, depth: u16 },
}

impl HostError {
    /// The NVMe status, when the controller answered with one.
    pub fn status(&self) -> Option<Status> {
        match self {
            HostError::Nvme { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Errors after which the queue pair is unusable.
    pub fn is_fatal_for_connection(&self) -> bool {
        matches!(
            self,
            HostError::Transport(_)
                | HostError::Protocol(_)
                | HostError::TerminatedByController { .. }
                | HostError::ConnectionLost(_)
        )
    }
}

pub type Result<T, E = HostError> = std::result::Result<T, E>;
