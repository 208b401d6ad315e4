//! etcd v3 as the metadata store, for control planes that span machines.
//!
//! Keys live under a prefix (`/sluice/` by default). A [`Txn`] becomes one
//! etcd transaction: `Absent` is `create_revision == 0`, `Revision` is
//! `mod_revision == rev`, and etcd's own revision is the store revision.
//! The client (and its gRPC channel) is shared by every caller.

use std::time::Duration;

use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, GetOptions, Txn as EtcdTxn, TxnOp,
};

use crate::store::{Committed, Compare, MetaStore, StoreError, Txn, Versioned};

/// How long one etcd request may take before the store reports it
/// unavailable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An etcd cluster as a [`MetaStore`].
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: Vec<String>,
    prefix: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EtcdStore({})", self.describe())
    }
}

fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

fn revision_of(header: Option<&etcd_client::ResponseHeader>) -> u64 {
    header.map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0))
}

impl EtcdStore {
    /// Connects to `endpoints` (`http://host:port`) and keeps keys under
    /// `prefix`.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdStore, StoreError> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        let client = Client::connect(endpoints, Some(opts)).await.map_err(|e| {
            StoreError::Unavailable(format!(
                "connecting to etcd at {}: {e}",
                endpoints.join(",")
            ))
        })?;
        let store = EtcdStore {
            client,
            endpoints: endpoints.to_vec(),
            prefix: prefix.to_owned(),
        };
        // Prove the cluster answers now rather than at the first change.
        store.get("probe").await?;
        Ok(store)
    }

    /// The client, for leases and elections (`sluice-control`).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn relative(&self, raw: &[u8]) -> Result<String, StoreError> {
        let k = std::str::from_utf8(raw).map_err(|_| StoreError::Corrupt {
            key: String::from_utf8_lossy(raw).into_owned(),
            reason: "key is not UTF-8".into(),
        })?;
        Ok(k.strip_prefix(self.prefix.as_str()).unwrap_or(k).to_owned())
    }
}

impl MetaStore for EtcdStore {
    fn describe(&self) -> String {
        format!(
            "etcd://{} (prefix {})",
            self.endpoints.join(","),
            self.prefix
        )
    }

    async fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        let resp = self
            .client
            .clone()
            .get(self.full(key), None)
            .await
            .map_err(unavailable)?;
        Ok(resp.kvs().first().map(|kv| Versioned {
            value: kv.value().to_vec(),
            mod_revision: u64::try_from(kv.mod_revision()).unwrap_or(0),
        }))
    }

    async fn list(&self, prefix: &str) -> Result<(u64, Vec<(String, Versioned)>), StoreError> {
        let resp = self
            .client
            .clone()
            .get(self.full(prefix), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        let mut out = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            out.push((
                self.relative(kv.key())?,
                Versioned {
                    value: kv.value().to_vec(),
                    mod_revision: u64::try_from(kv.mod_revision()).unwrap_or(0),
                },
            ));
        }
        Ok((revision_of(resp.header()), out))
    }

    async fn commit(&self, txn: Txn) -> Result<Committed, StoreError> {
        txn.check()?;
        let compares: Vec<EtcdCompare> = txn
            .compares
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => {
                    EtcdCompare::create_revision(self.full(k), CompareOp::Equal, 0)
                }
                Compare::Revision(k, rev) => EtcdCompare::mod_revision(
                    self.full(k),
                    CompareOp::Equal,
                    i64::try_from(*rev).unwrap_or(i64::MAX),
                ),
            })
            .collect();
        let mut ops: Vec<TxnOp> = Vec::with_capacity(txn.puts.len() + txn.deletes.len());
        ops.extend(
            txn.deletes
                .iter()
                .map(|k| TxnOp::delete(self.full(k), None)),
        );
        ops.extend(
            txn.puts
                .into_iter()
                .map(|(k, v)| TxnOp::put(self.full(&k), v, None)),
        );
        let resp = self
            .client
            .clone()
            .txn(EtcdTxn::new().when(compares).and_then(ops))
            .await
            .map_err(unavailable)?;
        if resp.succeeded() {
            Ok(Committed::Applied {
                revision: revision_of(resp.header()),
            })
        } else {
            Ok(Committed::Conflict)
        }
    }
}
