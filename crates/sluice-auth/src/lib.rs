//! DH-HMAC-CHAP: NVMe in-band authentication (NVMe Base 2.x, 8.3.4.5; TP
//! 8006), as the Linux host and nvmet speak it.
//!
//! - `algo`: hashes and DH groups ([`HashId`], [`DhGroup`]), HMAC;
//! - [`key`]: `DHHC-1` secrets (`nvme gen-dhchap-key`);
//! - [`message`]: the AUTH_Send/AUTH_Receive payloads;
//! - [`crypto`]: responses, augmented challenges, FFDHE key exchange;
//! - [`controller`] and [`host`]: each side's transaction, sans-IO (no
//!   sockets, clocks or global randomness: random bytes come in through a
//!   closure).
//!
//! Secrets never reach a log: [`Secret`]'s `Debug` is redacted and its
//! bytes are wiped on drop.

mod algo;
pub mod controller;
pub mod crypto;
mod ffdhe;
pub mod host;
pub mod key;
pub mod message;

pub use algo::{DhGroup, HashId};
pub use controller::{ControllerAuth, ControllerConfig, Outcome};
pub use host::{HostAuth, HostAuthError, HostConfig};
pub use key::{KeyError, Secret};

/// Fills `buf` from the operating system's random source. Authentication
/// cannot go on without it, so a failure (no entropy source at all) is
/// fatal for the exchange: the buffer is left zeroed and `false` returned.
pub fn os_random(buf: &mut [u8]) -> bool {
    if getrandom::fill(buf).is_ok() {
        return true;
    }
    buf.fill(0);
    false
}

/// A random sequence-number seed (never 0).
pub fn random_seqnum() -> u32 {
    let mut b = [0u8; 4];
    os_random(&mut b);
    u32::from_le_bytes(b).max(1)
}
