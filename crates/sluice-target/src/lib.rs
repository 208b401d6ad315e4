//! Sluice's NVMe/TCP target.
//!
//! The configuration (TOML schema, validation, builders) is the leaf crate
//! `sluice-config`; this crate only reads it.
//!
//! * [`subsystem`]: subsystems and namespaces (over `sluice-backend`).
//! * [`registry`]: the target-wide registry (settings, subsystems,
//!   namespaces, host counters) and the live controllers.
//! * `controller`: controller state (CC/CSTS, keep alive, features).
//! * `admin`: the admin commands, including the discovery log.
//! * [`reload`]: a configuration reload, which replaces who each subsystem
//!   admits while the target runs.
//! * `events`: asynchronous event notices (a namespace grew online) and
//!   the Changed Namespace List log.
//! * [`reservation`]: a namespace's registrations and reservation (the
//!   Reservation commands, the I/O path's conflict check, notices).
//! * [`queue`]: one queue pair as a sans-IO state machine.
//! * The per-queue send scheduler is `sluice_proto::send`, shared with the
//!   host.
//! * `server`: the I/O layer ([`Target`], [`TargetHandle`]): listeners,
//!   worker threads, polling policy.
//! * [`admission`]: connection limits (in total, per source address, in
//!   the handshake) checked at accept, and their counters.
//! * [`metrics`]: counters per namespace and host.
//! * [`slots`]: per-namespace state that grows while workers read it.
//! * `tag`: the backend request tag layout (`BackendTag`).
//! * [`tolerated`]: inputs accepted because both reference targets accept
//!   them, each logged once at debug level and counted.
//! * [`tenant`]: tenants, fair scheduling, rate limits, CPU isolation, the
//!   admin endpoint.

mod admin;
pub mod admission;
mod controller;
mod events;
pub mod fence;
pub mod metrics;
pub mod queue;
pub mod registry;
pub mod reload;
pub mod reservation;
mod server;
pub mod slots;
pub mod subsystem;
mod tag;
pub mod tenant;
pub mod tolerated;

pub use registry::{NoVolumes, VolumeOpener};
pub use server::{
    NamespaceCounters, ShutdownReport, StartError, Target, TargetHandle, WorkerReport,
};
