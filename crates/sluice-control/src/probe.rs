//! Asking a drive who it is, over NVMe/TCP: when it is added to the pool,
//! when a client reports it unreachable, and when a rebuild fails on it.

use std::time::Duration;

use sluice_host::{ConnectOptions, Controller};
use sluice_volume::DriveSpec;

/// Connects to a drive once: its block size, size and NGUID.
pub async fn probe_drive(
    spec: &DriveSpec,
    opts: &ConnectOptions,
) -> Result<(u32, u64, Option<String>), String> {
    let addr = tokio::net::lookup_host(spec.addr.as_str())
        .await
        .map_err(|e| format!("resolving {}: {e}", spec.addr))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", spec.addr))?;
    let ctrl = Controller::connect(addr, &spec.nqn, opts.clone())
        .await
        .map_err(|e| format!("connecting to {} {}: {e}", spec.addr, spec.nqn))?;
    let ns = ctrl
        .namespace(spec.nsid)
        .map_err(|e| format!("{} {} nsid {}: {e}", spec.addr, spec.nqn, spec.nsid));
    ctrl.disconnect(Duration::from_millis(100)).await;
    let ns = ns?;
    let info = ns.info();
    let nguid = info.identify.nguid;
    let nguid = (nguid != [0; 16]).then(|| nguid.iter().map(|b| format!("{b:02x}")).collect());
    let size = info
        .size_blocks
        .saturating_mul(u64::from(info.block_size_bytes));
    Ok((info.block_size_bytes, size, nguid))
}
