//! The embedded store: one redb file, nothing to install.
//!
//! redb gives ACID transactions over copy-on-write B-trees with one writer at
//! a time; a commit is durable when it returns (`Durability::Immediate`) and a
//! crash at any point leaves the last committed state. Each value is stored
//! behind its 8-byte little-endian `mod_revision`; the store revision lives
//! in a second table. redb calls block, so they run on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::store::{Committed, Compare, MetaStore, StoreError, Txn, Versioned};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const REVISION_KEY: &str = "revision";

/// A redb file as a [`MetaStore`].
#[derive(Clone)]
pub struct RedbStore {
    db: Arc<Database>,
    path: PathBuf,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedbStore({})", self.path.display())
    }
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

impl RedbStore {
    /// Opens `path`, creating it when missing. Fails when another process has
    /// it open (redb locks the file).
    pub fn open(path: &Path) -> Result<RedbStore, StoreError> {
        let db = Database::create(path)
            .map_err(|e| StoreError::Unavailable(format!("opening {}: {e}", path.display())))?;
        let txn = db.begin_write().map_err(io)?;
        {
            txn.open_table(KV).map_err(io)?;
            let mut meta = txn.open_table(META).map_err(io)?;
            if meta.get(REVISION_KEY).map_err(io)?.is_none() {
                meta.insert(REVISION_KEY, 0).map_err(io)?;
            }
        }
        txn.commit().map_err(io)?;
        Ok(RedbStore {
            db: Arc::new(db),
            path: path.to_owned(),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| StoreError::Io(format!("metadata task failed: {e}")))?
    }
}

fn decode(key: &str, raw: &[u8]) -> Result<Versioned, StoreError> {
    let (rev, value) = raw
        .split_first_chunk::<8>()
        .ok_or_else(|| StoreError::Corrupt {
            key: key.to_owned(),
            reason: format!("stored value of {} bytes has no revision header", raw.len()),
        })?;
    Ok(Versioned {
        value: value.to_vec(),
        mod_revision: u64::from_le_bytes(*rev),
    })
}

impl MetaStore for RedbStore {
    fn describe(&self) -> String {
        format!("redb:{}", self.path.display())
    }

    async fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        let key = key.to_owned();
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(io)?;
            let kv = txn.open_table(KV).map_err(io)?;
            let got = kv.get(key.as_str()).map_err(io)?;
            got.map(|v| decode(&key, v.value())).transpose()
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<(u64, Vec<(String, Versioned)>), StoreError> {
        let prefix = prefix.to_owned();
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(io)?;
            let rev = txn
                .open_table(META)
                .map_err(io)?
                .get(REVISION_KEY)
                .map_err(io)?
                .map_or(0, |g| g.value());
            let kv = txn.open_table(KV).map_err(io)?;
            let mut out = Vec::new();
            for entry in kv.range(prefix.as_str()..).map_err(io)? {
                let (k, v) = entry.map_err(io)?;
                let k = k.value();
                if !k.starts_with(prefix.as_str()) {
                    break;
                }
                out.push((k.to_owned(), decode(k, v.value())?));
            }
            Ok((rev, out))
        })
        .await
    }

    async fn commit(&self, txn: Txn) -> Result<Committed, StoreError> {
        txn.check()?;
        self.blocking(move |db| {
            let w = db.begin_write().map_err(io)?;
            let revision;
            {
                let mut kv = w.open_table(KV).map_err(io)?;
                for c in &txn.compares {
                    let holds = match c {
                        Compare::Absent(k) => kv.get(k.as_str()).map_err(io)?.is_none(),
                        Compare::Revision(k, rev) => match kv.get(k.as_str()).map_err(io)? {
                            Some(v) => decode(k, v.value())?.mod_revision == *rev,
                            None => false,
                        },
                    };
                    if !holds {
                        // Dropping `w` aborts the transaction.
                        return Ok(Committed::Conflict);
                    }
                }
                let mut meta = w.open_table(META).map_err(io)?;
                revision = meta.get(REVISION_KEY).map_err(io)?.map_or(0, |g| g.value()) + 1;
                meta.insert(REVISION_KEY, revision).map_err(io)?;
                for k in &txn.deletes {
                    kv.remove(k.as_str()).map_err(io)?;
                }
                for (k, v) in &txn.puts {
                    let mut raw = Vec::with_capacity(8 + v.len());
                    raw.extend_from_slice(&revision.to_le_bytes());
                    raw.extend_from_slice(v);
                    kv.insert(k.as_str(), raw.as_slice()).map_err(io)?;
                }
            }
            w.commit().map_err(io)?;
            Ok(Committed::Applied { revision })
        })
        .await
    }
}
