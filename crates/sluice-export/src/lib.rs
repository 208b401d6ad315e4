//! Exports of one remote NVMe/TCP namespace (through `sluice-host`) for
//! unmodified tools.
//!
//! * `blockio`: byte-addressed I/O over a block device: sub-block writes by
//!   read-modify-write, serialised per block range ([`ByteDevice`]).
//! * [`errno`]: NVMe status / host error → errno mapping shared by both exports.
//! * [`nbd`]: an NBD server: the sans-IO protocol ([`nbd::proto`]) and a tokio
//!   I/O layer over Unix and TCP sockets ([`nbd::server`]).
//! * [`fuse`]: the namespace as one regular file in a FUSE filesystem.
//! * `replace`: after a direct queue failed, a task that gets a new one
//!   once the controller has reconnected (NBD connections, the FUSE ring).
//! * [`account`]: per-export (tenant) CPU accounting and i-NVMe throttling
//!   of a shared exporter, Prometheus text of its counters.
//!
//! See `docs/exports.md`.

pub mod account;
mod blockio;
pub mod errno;
pub mod fuse;
pub mod nbd;
mod replace;
mod spare;

pub use blockio::{BlockDevice, ByteDevice, ExportError, MemDevice, RemoteDevice};

/// Resolves when the process receives SIGINT or SIGTERM.
pub async fn shutdown_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
