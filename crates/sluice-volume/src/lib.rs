//! Elastic volumes without I/O (Flint §4.2-4.4).
//!
//! A volume is a sequence of [`EXTENT_BYTES`] extents. Each allocated extent
//! maps to a replica chain: one physical extent ("slot") on each of one or
//! more drives, head first, tail last. Drives are namespaces on any NVMe/TCP
//! target (Flint's mega-volumes).
//!
//! * [`record`]: the persistent records the control plane stores (drives,
//!   volumes, extents) and their invariants.
//! * [`map`]: a client's cached copy of one volume's extent map, with its
//!   epoch, and the planner that turns a byte range into per-drive commands,
//!   split at extent edges and merged where neighbouring extents are
//!   physically contiguous on the same drives.
//! * [`placement`]: the weighted score that chooses drives for a new extent.
//!
//! Nothing here touches a socket, a file or a clock; the control plane
//! (`sluice-control`) and the metadata stores (`sluice-meta`) drive it.

pub mod map;
pub mod placement;
pub mod record;

pub use map::{ExtentFault, MappedExtent, Piece, PieceTarget, VolumeMap};
pub use placement::{DriveCandidate, PlacementError, PlacementWeights};
pub use record::{
    Chain, DriveId, DriveRecord, DriveSpec, DriveState, ExtentRecord, Replica, TenantRecord,
    VolumeId, VolumeRecord, VolumeState, ZeroClaim, EXTENT_BYTES,
};
