//! Discovery: read the discovery log page of a discovery controller and
//! follow referrals to a bounded depth.

use std::collections::HashSet;
use std::net::{SocketAddr, ToSocketAddrs};

use sluice_proto::log::{
    decode_discovery_entries, decode_discovery_header, lid, subtype, DiscoveryEntry,
    DISCOVERY_ENTRY_LEN, DISCOVERY_HEADER_LEN,
};
use sluice_proto::DISCOVERY_NQN;

use crate::controller::{get_log_page, open_admin, ConnectOptions};
use crate::error::{HostError, Result};

/// How deep referrals are followed.
pub(crate) const REFERRAL_DEPTH_MAX: u32 = 4;
/// Most records read from one discovery log page.
pub const DISCOVERY_RECORDS_MAX: u64 = 1024;
/// Re-reads when GENCTR changes while reading.
const GENCTR_RETRIES_MAX: u32 = 3;

/// Reads the discovery log at `addr` and, recursively, at the referrals it
/// lists (at most 4 levels, `REFERRAL_DEPTH_MAX`, each address once).
/// Returns the non-referral entries of all of them.
pub async fn discover(addr: SocketAddr, opts: &ConnectOptions) -> Result<Vec<DiscoveryEntry>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut todo = vec![(addr, 0u32)];
    while let Some((a, depth)) = todo.pop() {
        if !seen.insert(a) {
            continue;
        }
        let entries = match read_log(a, opts).await {
            Ok(e) => e,
            Err(e) if depth > 0 => {
                tracing::warn!(referral = %a, error = %e, "referral unreachable");
                continue;
            }
            Err(e) => return Err(e),
        };
        for e in entries {
            if e.subtype == subtype::REFERRAL {
                if depth + 1 > REFERRAL_DEPTH_MAX {
                    continue;
                }
                match resolve(&e.traddr, &e.trsvcid) {
                    Some(r) => todo.push((r, depth + 1)),
                    None => {
                        tracing::warn!(traddr = %e.traddr, trsvcid = %e.trsvcid, "bad referral address")
                    }
                }
            } else if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    Ok(out)
}

fn resolve(traddr: &str, trsvcid: &str) -> Option<SocketAddr> {
    let port: u16 = trsvcid.trim().parse().ok()?;
    (traddr.trim(), port).to_socket_addrs().ok()?.next()
}

/// One discovery controller's log page: header first, then all entries,
/// re-read if GENCTR changed meanwhile.
pub async fn read_log(addr: SocketAddr, opts: &ConnectOptions) -> Result<Vec<DiscoveryEntry>> {
    let s = open_admin(addr, DISCOVERY_NQN, opts, None).await?;
    let q = s.admin.clone();
    let r = async {
        for _ in 0..GENCTR_RETRIES_MAX {
            // DISCOVERY_HEADER_LEN is 1024.
            #[allow(clippy::cast_possible_truncation)]
            let header_len = DISCOVERY_HEADER_LEN as u32;
            let h = get_log_page(&q, lid::DISCOVERY, 0, 0, header_len).await?;
            let hdr = decode_discovery_header(&h)
                .ok_or_else(|| HostError::Incompatible("short discovery log header".into()))?;
            let n = hdr.numrec.min(DISCOVERY_RECORDS_MAX);
            if n == 0 {
                return Ok(Vec::new());
            }
            let total = DISCOVERY_HEADER_LEN + n as usize * DISCOVERY_ENTRY_LEN;
            let mut page = h;
            page.truncate(DISCOVERY_HEADER_LEN);
            // Entries in pieces of at most 64 KiB.
            let mut off = DISCOVERY_HEADER_LEN;
            while off < total {
                let len = (total - off).min(64 * 1024);
                // At most 64 KiB.
                #[allow(clippy::cast_possible_truncation)]
                let len32 = len as u32;
                let d = get_log_page(&q, lid::DISCOVERY, 0, off as u64, len32).await?;
                page.extend_from_slice(&d);
                off += len;
            }
            let again = get_log_page(&q, lid::DISCOVERY, 0, 0, 32).await?;
            match decode_discovery_header(&again) {
                Some(h2) if h2.genctr == hdr.genctr => {
                    return Ok(decode_discovery_entries(&page, n));
                }
                _ => tracing::debug!("discovery log changed while reading, retrying"),
            }
        }
        Err(HostError::Incompatible(
            "discovery log keeps changing".into(),
        ))
    }
    .await;
    q.shutdown();
    r
}
