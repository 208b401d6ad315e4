//! The key layout and record encoding.
//!
//! ```text
//! pool/ids                      next drive and volume ids
//! pool/reserved                 slots reserved by all volumes
//! drives/{id:08}                DriveRecord
//! volumes/{name}                VolumeRecord
//! extents/{volume:016x}/{index:016x}   ExtentRecord
//! tenants/{name}                TenantRecord (SLO class)
//! leader/...                    the control planes' election (etcd only)
//! ```
//!
//! Records are JSON: small, and readable with `etcdctl get`. Extent keys use
//! the volume's id, not its name, so a re-created volume never sees its
//! predecessor's extents. Fixed-width hex keeps key order equal to numeric
//! order.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sluice_volume::{DriveId, VolumeId};

use crate::store::{StoreError, Versioned};

pub const IDS: &str = "pool/ids";
pub const RESERVED: &str = "pool/reserved";
pub const DRIVES: &str = "drives/";
pub const VOLUMES: &str = "volumes/";
pub const EXTENTS: &str = "extents/";
pub const TENANTS: &str = "tenants/";
/// The control planes' election (etcd's election API keeps one key per
/// candidate under it; not catalog records).
pub const LEADER: &str = "leader";

pub fn drive(id: DriveId) -> String {
    format!("drives/{:08}", id.0)
}

pub fn volume(name: &str) -> String {
    format!("volumes/{name}")
}

pub fn tenant(name: &str) -> String {
    format!("tenants/{name}")
}

pub fn extents_of(volume: VolumeId) -> String {
    format!("extents/{:016x}/", volume.0)
}

pub fn extent(volume: VolumeId, index: u64) -> String {
    format!("extents/{:016x}/{index:016x}", volume.0)
}

/// The next ids to hand out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ids {
    pub next_drive: u32,
    pub next_volume: u64,
}

/// Slots reserved by every volume (size × replicas, in extents).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    pub slots: u64,
}

/// Encodes a record.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these plain structs to JSON cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// Decodes the record at `key`, naming the key when it does not decode.
pub fn decode<T: DeserializeOwned>(key: &str, v: &Versioned) -> Result<T, StoreError> {
    serde_json::from_slice(&v.value).map_err(|e| StoreError::Corrupt {
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_is_numeric_order() {
        assert!(extent(VolumeId(1), 9) < extent(VolumeId(1), 10));
        assert!(extent(VolumeId(1), u64::MAX) < extent(VolumeId(2), 0));
        assert!(drive(DriveId(9)) < drive(DriveId(10)));
        assert!(extent(VolumeId(3), 5).starts_with(&extents_of(VolumeId(3))));
    }

    #[test]
    fn corrupt_records_name_their_key() {
        let v = Versioned {
            value: b"{not json".to_vec(),
            mod_revision: 1,
        };
        let e = decode::<Ids>("pool/ids", &v).unwrap_err();
        assert!(e.to_string().contains("pool/ids"), "{e}");
    }
}
