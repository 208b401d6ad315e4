//! The metadata-store trait: versioned keys and compare-and-swap
//! transactions.
//!
//! This is the part of etcd's v3 model that the catalog needs, and no more:
//! every key carries the store revision of its last change
//! (`mod_revision`), and a [`Txn`] applies its puts and deletes atomically
//! only if every [`Compare`] still holds, bumping the store's revision by
//! one. Both implementations give the same answers to the same calls; the
//! tests in `tests/stores.rs` run against both.

use std::future::Future;

/// Operations (puts plus deletes plus compares) in one transaction, at most.
/// etcd refuses more than 128 by default (`--max-txn-ops`); the embedded
/// store enforces the same limit so that a catalog that works on one works
/// on the other.
pub const TXN_OPS_MAX: usize = 120;

/// Largest value stored (etcd's default request limit is 1.5 MiB).
pub const VALUE_BYTES_MAX: usize = 1 << 20;

/// A value and the revision that last changed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Vec<u8>,
    pub mod_revision: u64,
}

/// A condition a transaction needs to hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key exists and was last changed at this revision.
    Revision(String, u64),
}

/// An atomic change: all of it or none of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub puts: Vec<(String, Vec<u8>)>,
    pub deletes: Vec<String>,
}

impl Txn {
    /// Requires `key` to be absent.
    pub fn absent(mut self, key: impl Into<String>) -> Txn {
        self.compares.push(Compare::Absent(key.into()));
        self
    }

    /// Requires `key` to be unchanged since `rev`.
    pub fn unchanged(mut self, key: impl Into<String>, rev: u64) -> Txn {
        self.compares.push(Compare::Revision(key.into(), rev));
        self
    }

    /// Writes `key`.
    pub fn put(mut self, key: impl Into<String>, value: Vec<u8>) -> Txn {
        self.puts.push((key.into(), value));
        self
    }

    /// Deletes `key`.
    pub fn delete(mut self, key: impl Into<String>) -> Txn {
        self.deletes.push(key.into());
        self
    }

    /// Operations in the transaction.
    pub fn ops(&self) -> usize {
        self.compares.len() + self.puts.len() + self.deletes.len()
    }

    /// Refuses transactions over the limits, before they reach a store.
    pub fn check(&self) -> Result<(), StoreError> {
        if self.ops() > TXN_OPS_MAX {
            return Err(StoreError::TooLarge(format!(
                "{} operations, limit {TXN_OPS_MAX}",
                self.ops()
            )));
        }
        if let Some((k, v)) = self.puts.iter().find(|(_, v)| v.len() > VALUE_BYTES_MAX) {
            return Err(StoreError::TooLarge(format!(
                "value of {k} is {} bytes, limit {VALUE_BYTES_MAX}",
                v.len()
            )));
        }
        let mut keys: Vec<&str> = self
            .puts
            .iter()
            .map(|(k, _)| k.as_str())
            .chain(self.deletes.iter().map(String::as_str))
            .collect();
        keys.sort_unstable();
        if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
            // etcd refuses a transaction that writes one key twice.
            return Err(StoreError::TooLarge(format!(
                "key {} written twice in one transaction",
                w[0]
            )));
        }
        Ok(())
    }
}

/// What a commit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    /// Applied at this store revision.
    Applied { revision: u64 },
    /// A compare failed; nothing changed.
    Conflict,
}

/// A store failure (not a conflict: those are [`Committed::Conflict`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    #[error("metadata store I/O failed: {0}")]
    Io(String),
    #[error("metadata transaction too large: {0}")]
    TooLarge(String),
    #[error("metadata key {key} is corrupt: {reason}")]
    Corrupt { key: String, reason: String },
}

/// A versioned key-value store with atomic compare-and-swap transactions.
///
/// Keys are relative (`volumes/db1`); an implementation may put them under
/// its own prefix.
pub trait MetaStore: Send + Sync + 'static {
    /// What the store is, for logs (`redb:/var/lib/sluice/meta.redb`).
    fn describe(&self) -> String;

    /// One key.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Versioned>, StoreError>> + Send;

    /// Every key starting with `prefix`, in key order, with the store
    /// revision the listing was taken at.
    fn list(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<(u64, Vec<(String, Versioned)>), StoreError>> + Send;

    /// Applies `txn` atomically if its compares hold.
    fn commit(&self, txn: Txn) -> impl Future<Output = Result<Committed, StoreError>> + Send;
}
