//! The Sluice admin API: one HTTP server and one metrics registry for the
//! target and the exporters.
//!
//! * [`AdminServer`]: axum routes served by hyper on a small tokio runtime
//!   of its own (one thread, `sluice-admin`), so the target's mio workers
//!   and the exporter's runtime are untouched. Concurrent connections (up
//!   to [`AdminConfig::max_connections`]), a header size and count limit
//!   (431), a body limit (413), a header read timeout and a whole-request
//!   timeout (408), an optional bearer token (401), graceful shutdown.
//! * [`compose`]: the router-composition function. Every part (metrics,
//!   JSON endpoints, tenant updates, and later the control plane's routes)
//!   is a plain [`axum::Router`]; `compose` merges them and wraps them in
//!   the limits and the authentication, so all parts get the same rules.
//! * [`metrics`]: the Prometheus registry (`prometheus-client`) and helpers
//!   for collectors that read existing atomic counters at scrape time.
//! * [`routes`]: the standard parts: `GET /metrics`, JSON `GET` endpoints
//!   from closures, and the tenant table API over a [`routes::TenantApi`].
//! * [`schema`]: the JSON documents (shared by the server side and
//!   `sluice top`).
//! * [`client`]: a minimal blocking HTTP/1.1 client for tools and tests.
//!
//! This crate knows nothing of the target or the exporter: they hand it
//! their data through the [`routes::TenantApi`] trait, closures, and
//! [`prometheus_client::collector::Collector`]s.

pub mod client;
pub mod metrics;
pub mod routes;
pub mod schema;
mod server;

pub use axum::Router;
pub use prometheus_client;
pub use server::{compose, AdminConfig, AdminServer, BearerToken, ShutdownHandle};

/// Errors of the admin server.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the admin thread: {0}")]
    Thread(std::io::Error),
    #[error("admin token file `{path}`: {reason}")]
    TokenFile { path: String, reason: String },
}
