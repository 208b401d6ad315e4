//! NVMe status and host errors → errno (Linux values; NBD uses the same
//! numbers on the wire).
//!
//! | error | errno |
//! | --- | --- |
//! | range beyond the export, checked locally | `ENOSPC` for write / write-zeroes, `EINVAL` for read / trim |
//! | NVMe LBA Out of Range (00h/80h) | same as above |
//! | NVMe Capacity Exceeded (00h/81h) | `ENOSPC` |
//! | NVMe Invalid Opcode / Field / Namespace (00h/01h, 02h, 0Bh), bad argument | `EINVAL` |
//! | NVMe Namespace Write Protected (00h/20h), Access Denied (02h/86h) | `EPERM` |
//! | media errors (SCT 02h), other statuses, timeouts, transport loss | `EIO` |

use sluice_host::HostError;
use sluice_proto::status::sct;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// What the failed operation was, for the direction-dependent mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
}

impl OpKind {
    pub fn writes(self) -> bool {
        matches!(self, OpKind::Write | OpKind::Trim | OpKind::WriteZeroes)
    }
    /// errno for a range that does not fit the export: `ENOSPC` for writes
    /// of data or zeroes, `EINVAL` for reads and trims (as the NBD spec says).
    pub fn out_of_range_errno(self) -> u32 {
        if matches!(self, OpKind::Write | OpKind::WriteZeroes) {
            ENOSPC
        } else {
            EINVAL
        }
    }
}

/// errno for a failed host operation.
pub fn from_host_error(e: &HostError, op: OpKind) -> u32 {
    match e {
        HostError::Nvme { status, .. } => match (status.sct, status.sc) {
            (sct::GENERIC, 0x80) => op.out_of_range_errno(),
            (sct::GENERIC, 0x81) => ENOSPC,
            (sct::GENERIC, 0x01 | 0x02 | 0x0b) => EINVAL,
            (sct::GENERIC, 0x20) | (sct::MEDIA, 0x86) => EPERM,
            _ => EIO,
        },
        HostError::InvalidArgument(_) => EINVAL,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::Status;

    fn nvme(s: Status) -> HostError {
        HostError::Nvme {
            opcode: 1,
            status: s,
            result: 0,
        }
    }

    #[test]
    fn mapping() {
        assert_eq!(
            from_host_error(&nvme(Status::LBA_OUT_OF_RANGE), OpKind::Write),
            ENOSPC
        );
        assert_eq!(
            from_host_error(&nvme(Status::LBA_OUT_OF_RANGE), OpKind::Read),
            EINVAL
        );
        assert_eq!(
            from_host_error(&nvme(Status::CAPACITY_EXCEEDED), OpKind::Write),
            ENOSPC
        );
        assert_eq!(
            from_host_error(&nvme(Status::INVALID_FIELD), OpKind::Read),
            EINVAL
        );
        assert_eq!(
            from_host_error(&nvme(Status::WRITE_FAULT), OpKind::Write),
            EIO
        );
        assert_eq!(
            from_host_error(&nvme(Status::UNRECOVERED_READ_ERROR), OpKind::Read),
            EIO
        );
        assert_eq!(
            from_host_error(&nvme(Status::new(sct::MEDIA, 0x86)), OpKind::Write),
            EPERM
        );
        assert_eq!(
            from_host_error(&nvme(Status::new(sct::GENERIC, 0x20)), OpKind::Write),
            EPERM
        );
        assert_eq!(
            from_host_error(&HostError::ConnectionLost("x".into()), OpKind::Flush),
            EIO
        );
        assert_eq!(
            from_host_error(&HostError::InvalidArgument("x".into()), OpKind::Trim),
            EINVAL
        );
    }
}
