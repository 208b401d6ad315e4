//! The NBD export: sans-IO protocol in [`proto`], tokio I/O layer in [`server`].

pub mod proto;
pub mod server;

pub use server::{NbdConfig, NbdServer};
