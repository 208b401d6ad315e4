//! Sluice's control plane and volume client (Flint §4.2-4.4 over standard
//! NVMe/TCP).
//!
//! * [`pb`]: the gRPC API (`proto/control.proto`) and conversions between
//!   its messages and `sluice-volume`'s records.
//! * [`auth`]: bearer tokens on the API, and the rule that an endpoint
//!   listening beyond loopback must have one.
//! * [`server`]: `sluice control`: the service over a `sluice-meta`
//!   catalog (redb or etcd); probes drives over NVMe/TCP when they are added.
//! * [`probe`]: asking a drive over NVMe/TCP for its size, block size and
//!   NGUID.
//! * [`leader`]: leader election between control planes on one etcd.
//! * [`rebuild`]: the leader's background rebuild of lost replicas:
//!   fence the chain at a new epoch, drain, copy from the tail, join.
//! * [`client`]: the authenticated API client the CLI and volumes use.
//! * [`backend`]: a volume as a target backend (`backend = "volume"`),
//!   so unmodified NVMe/TCP hosts use elastic volumes.
//! * [`volume`]: the volume client: fetches the map once, connects to the
//!   drives it needs (sharing connections between volumes), sends every
//!   piece of an I/O straight to its drive, drives replication as a chain,
//!   and calls the control plane only to allocate an extent on first write.
//! * [`view`]: the shadow view's controller in `sluice control` (Flint §3):
//!   epochs, PUSH to watching agents, busy degrees for placement, metrics.
//! * [`view_pb`]: the view's types to and from their gRPC messages.
//! * [`view_wire`]: the view's fast channel (`--view-listen`): `ViewSync`
//!   over a plain TCP stream, about a round trip instead of gRPC's hops.
//! * [`zeroer`]: the leader's slot zeroer: clean slots ready before the
//!   faults that take them, stale zeroing claims fenced and taken over,
//!   quarantined slots released once fenced.
//! * [`isolation`]: the client side of Flint's isolation: the view agent's
//!   task and the eIO gate every volume's I/O passes (Flint §4.5).

pub mod auth;
pub mod backend;
pub mod client;
pub mod error;
pub mod isolation;
pub mod leader;
pub mod pb;
pub mod probe;
pub mod rebuild;
pub mod remap;
pub mod server;
pub mod view;
pub mod view_pb;
pub mod view_wire;
pub mod volume;
pub mod zeroer;

pub use client::ControlClient;
pub use error::VolumeError;
pub use server::{serve, ControlConfig, Metadata};
pub use volume::{DrivePool, Volume};
pub use zeroer::ZeroerConfig;

/// Asserts that `collector`'s metrics text has each of `lines` as a whole
/// line (the collectors' unit tests).
#[cfg(test)]
pub(crate) fn assert_metric_lines(
    collector: impl prometheus_client::collector::Collector + 'static,
    lines: &[&str],
) {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(collector));
    let text = sluice_admin::metrics::encode(&reg).expect("encodes");
    for line in lines {
        assert!(
            text.lines().any(|l| l == *line),
            "{line:?} missing in\n{text}"
        );
    }
}
