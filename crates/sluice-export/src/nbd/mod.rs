//! The NBD export: sans-IO protocol in [`proto`], tokio I/O layer in
//! [`server`], and the run-to-completion path for connections to one
//! namespace in `direct`.

mod direct;
pub mod proto;
mod reply;
pub mod server;

pub use direct::{ClientSocket, IntoClientSocket};
pub use server::{NbdConfig, NbdServer};
