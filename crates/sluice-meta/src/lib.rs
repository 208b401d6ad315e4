//! The control plane's metadata.
//!
//! * [`store`]: the [`MetaStore`] trait: versioned keys and atomic
//!   transactions guarded by compare-and-swap on key revisions, the common
//!   ground of an embedded database and etcd.
//! * [`redb_store`]: the embedded default, one redb file.
//! * [`etcd_store`]: etcd v3, when the control plane spans machines.
//! * [`keys`]: the key layout and record encoding (JSON, so `etcdctl get`
//!   is readable); a record that does not decode names its key.
//! * [`catalog`]: drives, volumes and extents as transactions on a store:
//!   every change is one transaction with a revision, so a crash leaves the
//!   old state or the new one.
//! * [`rebuild`]: the catalog's side of rebuilding a lost replica: begin
//!   (a new replica is reserved, writes wait), finish (it joins the chain's
//!   tail), abort.
//! * [`check`]: the whole-catalog invariants (no slot leaked, none owned
//!   twice, reservations add up), run at start-up and by the tests.

pub mod catalog;
pub mod check;
pub mod etcd_store;
pub mod keys;
pub mod rebuild;
pub mod redb_store;
pub mod store;
pub mod testing;

pub use catalog::{Catalog, CatalogError, CrashPoint, VolumeSpec};
pub use etcd_store::EtcdStore;
pub use rebuild::Rebuild;
pub use redb_store::RedbStore;
pub use store::{Committed, Compare, MetaStore, StoreError, Txn, Versioned, TXN_OPS_MAX};
