//! The generated gRPC code and conversions to and from the records.

#![allow(
    clippy::all,
    missing_debug_implementations,
    missing_docs,
    clippy::cast_possible_truncation
)]

tonic::include_proto!("sluice.control.v1");

use sluice_volume::{
    DriveId, DriveRecord, DriveState, ExtentRecord, Replica as ReplicaRecord, VolumeId,
    VolumeRecord, VolumeState,
};

impl From<&DriveRecord> for Drive {
    fn from(d: &DriveRecord) -> Drive {
        Drive {
            id: d.id.0,
            addr: d.spec.addr.clone(),
            nqn: d.spec.nqn.clone(),
            nsid: d.spec.nsid,
            up: d.state == DriveState::Up,
            block_size_bytes: d.block_size_bytes,
            slots_total: d.slots_total,
            slots_used: d.slots_used(),
            nguid: d.nguid.clone(),
            slots_clean: d.slots_clean() as u64,
            slots_quarantined: d.quarantined.len() as u64,
        }
    }
}

impl From<&VolumeRecord> for Volume {
    fn from(v: &VolumeRecord) -> Volume {
        Volume {
            id: v.id.0,
            name: v.name.clone(),
            deleting: v.state == VolumeState::Deleting,
            size_bytes: v.size_bytes,
            block_size_bytes: v.block_size_bytes,
            replicas: u32::from(v.replicas),
            tenant: v.tenant.clone(),
            prefer: v.prefer.clone(),
            epoch: v.epoch,
            extents_per_drive: v.extents_per_drive.iter().map(|(d, n)| (d.0, *n)).collect(),
            degraded_extents: v.degraded_extents,
        }
    }
}

impl Volume {
    /// The record this message describes; a message that breaks the
    /// record's invariants (a hostile or broken server) is refused.
    pub fn to_record(&self) -> Result<VolumeRecord, String> {
        let v = VolumeRecord {
            id: VolumeId(self.id),
            name: self.name.clone(),
            state: if self.deleting {
                VolumeState::Deleting
            } else {
                VolumeState::Ready
            },
            size_bytes: self.size_bytes,
            block_size_bytes: self.block_size_bytes,
            replicas: u8::try_from(self.replicas)
                .map_err(|_| format!("replicas {}", self.replicas))?,
            tenant: self.tenant.clone(),
            prefer: self.prefer.clone(),
            epoch: self.epoch,
            extents_per_drive: self
                .extents_per_drive
                .iter()
                .map(|(d, n)| (DriveId(*d), *n))
                .collect(),
            degraded_extents: self.degraded_extents,
        };
        v.check()?;
        Ok(v)
    }
}

impl From<&ExtentRecord> for Extent {
    fn from(e: &ExtentRecord) -> Extent {
        Extent {
            volume_id: e.volume.0,
            index: e.index,
            chain: e
                .chain
                .iter()
                .map(|r| Replica {
                    drive: r.drive.0,
                    slot: r.slot,
                })
                .collect(),
            epoch: e.epoch,
            rebuilding: e.rebuilding.map(|r| Replica {
                drive: r.drive.0,
                slot: r.slot,
            }),
            retiring: e.retiring.map(|r| Replica {
                drive: r.drive.0,
                slot: r.slot,
            }),
        }
    }
}

impl Extent {
    pub fn to_record(&self) -> ExtentRecord {
        ExtentRecord {
            volume: VolumeId(self.volume_id),
            index: self.index,
            chain: self
                .chain
                .iter()
                .map(|r| ReplicaRecord {
                    drive: DriveId(r.drive),
                    slot: r.slot,
                })
                .collect(),
            epoch: self.epoch,
            rebuilding: self.rebuilding.as_ref().map(|r| ReplicaRecord {
                drive: DriveId(r.drive),
                slot: r.slot,
            }),
            retiring: self.retiring.as_ref().map(|r| ReplicaRecord {
                drive: DriveId(r.drive),
                slot: r.slot,
            }),
        }
    }
}
