//! The computations of DH-HMAC-CHAP (NVMe Base 2.x, 8.3.4.5): HMAC and
//! digests over SHA-2, the challenge augmented by a Diffie-Hellman session
//! key, the host's and the controller's responses, and finite-field DH.
//!
//! Byte orders and field sequences follow what the Linux host and nvmet
//! compute, which is what interoperates:
//! - host response R1 = HMAC(Kh, C1' || le32 S1 || le16 T_ID || 00h ||
//!   "HostHost" || NQNh || 00h || NQNc);
//! - controller response R2 = HMAC(Kc, C2' || le32 S2 || le16 T_ID || 00h ||
//!   "Controller" || NQNc || 00h || NQNh);
//! - with a DH group, C' = HMAC(H(g^xy mod p), C), the shared value written
//!   big-endian at the prime's full length; without one, C' = C.

use num_bigint::BigUint;
use zeroize::Zeroize;

use crate::algo::{digest, hmac, DhGroup, HashId};

/// Compares in time independent of where the inputs differ.
pub(crate) fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// C' = HMAC(H(session key), C), or C itself without a session key.
pub(crate) fn augmented(hash: HashId, session_key: Option<&[u8]>, challenge: &[u8]) -> Vec<u8> {
    match session_key {
        None => challenge.to_vec(),
        Some(k) => {
            let mut hk = digest(hash, k);
            let out = hmac(hash, &hk, &[challenge]);
            hk.zeroize();
            out
        }
    }
}

/// What each side proves: `who` is "HostHost" or "Controller", `first` and
/// `second` the NQNs in that side's order.
#[allow(clippy::too_many_arguments)]
fn response(
    hash: HashId,
    key: &[u8],
    challenge: &[u8],
    seqnum: u32,
    t_id: u16,
    who: &[u8],
    first: &str,
    second: &str,
) -> Vec<u8> {
    hmac(
        hash,
        key,
        &[
            challenge,
            &seqnum.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[0],
            who,
            first.as_bytes(),
            &[0],
            second.as_bytes(),
        ],
    )
}

/// R1, the host's response to the controller's challenge C1.
pub fn host_response(
    hash: HashId,
    host_key: &[u8],
    augmented_c1: &[u8],
    s1: u32,
    t_id: u16,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    response(
        hash,
        host_key,
        augmented_c1,
        s1,
        t_id,
        b"HostHost",
        hostnqn,
        subnqn,
    )
}

/// R2, the controller's response to the host's challenge C2.
pub fn controller_response(
    hash: HashId,
    ctrl_key: &[u8],
    augmented_c2: &[u8],
    s2: u32,
    t_id: u16,
    subnqn: &str,
    hostnqn: &str,
) -> Vec<u8> {
    response(
        hash,
        ctrl_key,
        augmented_c2,
        s2,
        t_id,
        b"Controller",
        subnqn,
        hostnqn,
    )
}

fn prime(group: DhGroup) -> Option<BigUint> {
    let hex = match group {
        DhGroup::Null => return None,
        DhGroup::Ffdhe2048 => crate::ffdhe::FFDHE2048,
        DhGroup::Ffdhe3072 => crate::ffdhe::FFDHE3072,
        DhGroup::Ffdhe4096 => crate::ffdhe::FFDHE4096,
        DhGroup::Ffdhe6144 => crate::ffdhe::FFDHE6144,
        DhGroup::Ffdhe8192 => crate::ffdhe::FFDHE8192,
    };
    BigUint::parse_bytes(hex.as_bytes(), 16)
}

/// Private exponent length: twice each group's security strength, at
/// least RFC 7919's recommended sizes (225-400 bits).
fn exponent_len_bytes(group: DhGroup) -> usize {
    match group {
        DhGroup::Null => 0,
        DhGroup::Ffdhe2048 => 32,
        DhGroup::Ffdhe3072 => 40,
        DhGroup::Ffdhe4096 => 48,
        DhGroup::Ffdhe6144 => 56,
        DhGroup::Ffdhe8192 => 64,
    }
}

/// `v` big-endian, left-padded with zeros to `len` bytes.
fn to_fixed(v: &BigUint, len: usize) -> Vec<u8> {
    let b = v.to_bytes_be();
    let mut out = vec![0u8; len.saturating_sub(b.len())];
    out.extend_from_slice(&b);
    out
}

/// One side's ephemeral Diffie-Hellman key pair in an FFDHE group.
pub struct DhKeyPair {
    group: DhGroup,
    p: BigUint,
    x: BigUint,
    public: Vec<u8>,
}

impl std::fmt::Debug for DhKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhKeyPair")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// A peer's DH value that must not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("DH value is {got} bytes; the group needs {want}")]
    Length { got: usize, want: usize },
    #[error("DH value is outside 2..p-2")]
    Range,
}

impl DhKeyPair {
    /// A fresh key pair; `None` for the null group. `random` fills a buffer
    /// with secret random bytes.
    pub fn generate(group: DhGroup, random: &mut dyn FnMut(&mut [u8])) -> Option<DhKeyPair> {
        let p = prime(group)?;
        let mut xb = vec![0u8; exponent_len_bytes(group)];
        random(&mut xb);
        // Never 0 or 1.
        if let Some(last) = xb.last_mut() {
            *last |= 2;
        }
        let x = BigUint::from_bytes_be(&xb);
        xb.zeroize();
        let public = to_fixed(&BigUint::from(2u32).modpow(&x, &p), group.value_len_bytes());
        Some(DhKeyPair {
            group,
            p,
            x,
            public,
        })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// g^x mod p, big-endian at the prime's length.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The session key (peer^x mod p at the prime's length), after checking
    /// that the peer's value is a proper element (1 < y < p-1).
    pub fn shared(&self, peer: &[u8]) -> Result<Vec<u8>, DhError> {
        let want = self.group.value_len_bytes();
        if peer.len() != want {
            return Err(DhError::Length {
                got: peer.len(),
                want,
            });
        }
        let y = BigUint::from_bytes_be(peer);
        let one = BigUint::from(1u32);
        if y <= one || y >= &self.p - &one {
            return Err(DhError::Range);
        }
        Ok(to_fixed(&y.modpow(&self.x, &self.p), want))
    }
}

impl Drop for DhKeyPair {
    fn drop(&mut self) {
        // BigUint cannot be wiped in place; overwrite what we can.
        self.x = BigUint::default();
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn counter(seed: u8) -> impl FnMut(&mut [u8]) {
        let mut n = seed;
        move |b: &mut [u8]| {
            for x in b {
                n = n.wrapping_mul(31).wrapping_add(17);
                *x = n;
            }
        }
    }

    #[test]
    fn the_primes_are_safe_prime_shaped_and_2_has_order_q() {
        for g in DhGroup::ALL.into_iter().skip(1) {
            let p = prime(g).unwrap();
            assert_eq!(p.bits() as usize, g.value_len_bytes() * 8, "{g}");
            let b = p.to_bytes_be();
            // RFC 7919: the top and bottom 64 bits are all ones.
            assert!(
                b[..8].iter().chain(&b[b.len() - 8..]).all(|&x| x == 0xff),
                "{g}"
            );
        }
        // 2^q = 1 mod p (q = (p-1)/2): checked on the smallest group; the
        // others take seconds in a debug build.
        let p = prime(DhGroup::Ffdhe2048).unwrap();
        let q = (&p - 1u32) >> 1;
        assert_eq!(BigUint::from(2u32).modpow(&q, &p), BigUint::from(1u32));
    }

    #[test]
    fn both_sides_derive_the_same_session_key() {
        for g in [DhGroup::Ffdhe2048, DhGroup::Ffdhe3072] {
            let a = DhKeyPair::generate(g, &mut counter(1)).unwrap();
            let b = DhKeyPair::generate(g, &mut counter(2)).unwrap();
            assert_eq!(a.public().len(), g.value_len_bytes());
            let ka = a.shared(b.public()).unwrap();
            assert_eq!(ka, b.shared(a.public()).unwrap());
            assert_eq!(ka.len(), g.value_len_bytes());
        }
        assert!(DhKeyPair::generate(DhGroup::Null, &mut counter(1)).is_none());
    }

    #[test]
    fn degenerate_peer_values_are_refused() {
        let a = DhKeyPair::generate(DhGroup::Ffdhe2048, &mut counter(3)).unwrap();
        let n = 256;
        let mut one = vec![0u8; n];
        one[n - 1] = 1;
        assert_eq!(a.shared(&one), Err(DhError::Range));
        assert_eq!(a.shared(&vec![0u8; n]), Err(DhError::Range));
        let p_minus_1 = to_fixed(&(prime(DhGroup::Ffdhe2048).unwrap() - 1u32), n);
        assert_eq!(a.shared(&p_minus_1), Err(DhError::Range));
        assert_eq!(
            a.shared(&[0xff; 255]),
            Err(DhError::Length {
                got: 255,
                want: 256
            })
        );
    }

    #[test]
    fn responses_bind_every_field() {
        let base = host_response(HashId::Sha256, &[7; 32], &[1; 32], 5, 9, "nqn.h", "nqn.c");
        assert_eq!(base.len(), 32);
        for other in [
            host_response(HashId::Sha256, &[8; 32], &[1; 32], 5, 9, "nqn.h", "nqn.c"),
            host_response(HashId::Sha256, &[7; 32], &[2; 32], 5, 9, "nqn.h", "nqn.c"),
            host_response(HashId::Sha256, &[7; 32], &[1; 32], 6, 9, "nqn.h", "nqn.c"),
            host_response(HashId::Sha256, &[7; 32], &[1; 32], 5, 8, "nqn.h", "nqn.c"),
            host_response(HashId::Sha256, &[7; 32], &[1; 32], 5, 9, "nqn.x", "nqn.c"),
            host_response(HashId::Sha256, &[7; 32], &[1; 32], 5, 9, "nqn.h", "nqn.x"),
            // The controller's response over the same inputs differs.
            controller_response(HashId::Sha256, &[7; 32], &[1; 32], 5, 9, "nqn.h", "nqn.c"),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(
            host_response(HashId::Sha512, &[7; 64], &[1; 64], 5, 9, "a", "b").len(),
            64
        );
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        // Key "Jefe", data "what do ya want for nothing?".
        let out = hmac(
            HashId::Sha256,
            b"Jefe",
            &[b"what do ya ", b"want for nothing?"],
        );
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(equal(&out, &out.clone()));
        assert!(!equal(&out, &out[..31]));
    }
}
