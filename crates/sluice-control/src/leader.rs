//! Leader election between `sluice control` processes on one etcd.
//!
//! Each process holds an etcd lease (TTL [`LEASE_TTL_S`], kept alive every
//! third of it) and campaigns with it under `{prefix}leader`, its value the
//! address clients should use. The one etcd elects serves the API; the
//! others answer every call with `Unavailable` naming the leader, and a
//! client given several addresses moves on to the next. When the leader dies
//! its lease expires and a follower's campaign completes: the hand-over takes
//! about one TTL. A leader that loses its lease (etcd unreachable, a long
//! pause) stops serving at once and campaigns again.
//!
//! Leadership is what keeps followers quiet, not what keeps the metadata
//! right: every catalog change is a compare-and-swap transaction, so even
//! two processes that both believe they lead cannot lose or duplicate an
//! allocation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tonic::Status;

/// Metadata of a follower's refusal: the leader's address.
pub const NOT_LEADER_KEY: &str = "x-sluice-not-leader";

/// The lease's time to live: how long a dead leader holds on.
pub const LEASE_TTL_S: i64 = 3;

/// Whether this process leads, and who does.
#[derive(Debug)]
pub struct Leadership {
    leader: AtomicBool,
    leader_addr: Mutex<String>,
    me: String,
}

impl Leadership {
    /// A process that always leads (the embedded store: one process).
    pub fn always(me: &str) -> Arc<Leadership> {
        Arc::new(Leadership {
            leader: AtomicBool::new(true),
            leader_addr: Mutex::new(me.into()),
            me: me.into(),
        })
    }

    fn follower(me: &str) -> Arc<Leadership> {
        Arc::new(Leadership {
            leader: AtomicBool::new(false),
            leader_addr: Mutex::new(String::new()),
            me: me.into(),
        })
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// Refuses a call unless this process leads. The refusal carries the
    /// [`NOT_LEADER_KEY`] metadata (the leader's address, empty while none
    /// is elected), which tells a client to look elsewhere or wait.
    pub fn check(&self) -> Result<(), Status> {
        if self.is_leader() {
            return Ok(());
        }
        let addr = self
            .leader_addr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let who = if addr.is_empty() {
            "no leader is elected yet".to_owned()
        } else {
            format!("the leader is {addr}")
        };
        let mut s = Status::unavailable(format!(
            "this control plane ({}) is not the leader; {who}",
            self.me
        ));
        if let Ok(v) = addr.parse() {
            s.metadata_mut().insert(NOT_LEADER_KEY, v);
        }
        Err(s)
    }

    fn set(&self, leader: bool) {
        let was = self.leader.swap(leader, Ordering::AcqRel);
        if leader && !was {
            *self
                .leader_addr
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = self.me.clone();
            tracing::info!(me = %self.me, "elected control-plane leader");
        } else if !leader && was {
            tracing::warn!(me = %self.me, "lost control-plane leadership");
        }
    }

    fn saw_leader(&self, addr: String) {
        *self
            .leader_addr
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = addr;
    }
}

/// Starts campaigning; the returned leadership follows the election.
pub fn campaign(client: etcd_client::Client, prefix: &str, me: &str) -> Arc<Leadership> {
    let l = Leadership::follower(me);
    let name = format!("{prefix}{}", sluice_meta::keys::LEADER);
    tokio::spawn(run(client, name, l.clone()));
    l
}

async fn run(client: etcd_client::Client, name: String, l: Arc<Leadership>) {
    loop {
        if let Err(e) = term(client.clone(), &name, &l).await {
            tracing::warn!(error = %e, "control-plane election: etcd failed; retrying");
        }
        l.set(false);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One lease's life: campaign with it, lead while it lives.
async fn term(
    mut client: etcd_client::Client,
    name: &str,
    l: &Arc<Leadership>,
) -> Result<(), etcd_client::Error> {
    let lease = client.lease_grant(LEASE_TTL_S, None).await?.id();
    let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
    let interval = Duration::from_millis(u64::try_from(LEASE_TTL_S * 1000 / 3).unwrap_or(1000));
    // Keeps the lease alive; ends when etcd stops renewing it.
    let alive = async {
        loop {
            keeper.keep_alive().await?;
            match stream.message().await? {
                Some(r) if r.ttl() > 0 => {}
                _ => return Ok::<(), etcd_client::Error>(()),
            }
            tokio::time::sleep(interval).await;
        }
    };
    // Watches who leads while this process waits.
    let watch = {
        let (mut c, l, name) = (client.clone(), l.clone(), name.to_owned());
        async move {
            loop {
                if let Ok(r) = c.leader(name.as_bytes()).await {
                    if let Some(kv) = r.kv() {
                        l.saw_leader(String::from_utf8_lossy(kv.value()).into_owned());
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let mut campaigner = client.clone();
    let elect = async {
        campaigner
            .campaign(name.as_bytes(), l.me.as_bytes(), lease)
            .await?;
        l.set(true);
        std::future::pending::<Result<(), etcd_client::Error>>().await
    };
    let r = tokio::select! {
        r = alive => r,
        r = elect => r,
        () = watch => Ok(()),
    };
    l.set(false);
    let _ = client.lease_revoke(lease).await;
    r
}
