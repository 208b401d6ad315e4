//! Sluice's NVMe/TCP initiator.
//!
//! * [`core`]: the sans-IO queue-pair state machine ([`core::QueuePairCore`]).
//! * `queue`: the I/O layer: one thread per TCP connection driving a core,
//!   with interrupt-style, busy-poll or adaptive receive ([`PollingPolicy`]).
//! * [`controller`]: association setup (ICReq, Connect, properties, Identify,
//!   queues, keep alive), namespaces and I/O ([`Controller`], [`Namespace`]).
//! * `direct`: [`DirectQueue`], an I/O queue pair driven by the thread that
//!   owns it (run to completion: no queue thread, channels or locks).
//! * `discovery`: the discovery log page with referrals ([`discover`]).
//!
//! See `docs/host.md` for the design and the wire use of I/O hints.

pub mod controller;
pub mod core;
mod direct;
mod discovery;
mod error;
mod queue;
mod rw;

pub use controller::{
    CommandLimits, ConnectOptions, Controller, FenceAnswer, IoFlags, Namespace, NamespaceInfo,
    ReconnectPolicy, RwBuilder,
};
pub use direct::DirectQueue;
pub use discovery::discover;
pub use error::{HostError, Result};
pub use queue::HostQueueStats;
pub use sluice_runtime::PollingPolicy;
