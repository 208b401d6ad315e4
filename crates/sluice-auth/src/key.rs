//! Secrets in the `DHHC-1` form that `nvme gen-dhchap-key` prints, and the
//! hash functions and Diffie-Hellman groups DH-HMAC-CHAP negotiates.
//!
//! A secret reads `DHHC-1:hh:<base64 of key and CRC-32>:`. `hh` names the
//! hash that transforms the key before use (00: none, 01: SHA-256,
//! 02: SHA-384, 03: SHA-512): the transformed key is
//! HMAC-hh(key, NQN || "NVMe-over-Fabrics"), so one secret gives each NQN a
//! different key. The key is 32, 48 or 64 bytes; the CRC-32 (little-endian)
//! guards against typing errors.

use std::fmt;

use base64::Engine;
use zeroize::Zeroize;

use crate::algo::{self, HashId};

/// Why a `DHHC-1` secret was refused. The messages never quote the secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("a DH-HMAC-CHAP secret starts with \"DHHC-1:\" (nvme gen-dhchap-key prints one)")]
    Prefix,
    #[error("the transform field after \"DHHC-1:\" must be 00, 01, 02 or 03")]
    Transform,
    #[error("the key is not valid base64")]
    Base64,
    #[error("the key decodes to {0} bytes; 36, 52 or 68 expected (a 32, 48 or 64-byte key and its CRC-32)")]
    Length(usize),
    #[error("the key's CRC-32 does not match: the secret was mistyped or truncated")]
    Crc,
    #[error("a {key_bytes}-byte key cannot be transformed with {hash}, which needs {need} bytes")]
    TransformLength {
        key_bytes: usize,
        hash: HashId,
        need: usize,
    },
}

/// A DH-HMAC-CHAP secret. Its bytes are wiped when dropped and never
/// printed: `Debug` shows only its length and transform.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
    transform: Option<HashId>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Secret(<redacted {} bytes>, transform {})",
            self.key.len(),
            self.transform.map_or("none", HashId::name)
        )
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl Secret {
    /// Parses `DHHC-1:hh:<base64>:` (the trailing colon may be left out;
    /// surrounding whitespace is ignored).
    pub fn parse(s: &str) -> Result<Secret, KeyError> {
        let rest = s.trim().strip_prefix("DHHC-1:").ok_or(KeyError::Prefix)?;
        let (hh, b64) = rest.split_once(':').ok_or(KeyError::Transform)?;
        let transform = match hh {
            "00" => None,
            "01" | "02" | "03" => HashId::from_id(hh.as_bytes()[1] - b'0'),
            _ => return Err(KeyError::Transform),
        };
        let b64 = b64.strip_suffix(':').unwrap_or(b64);
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| KeyError::Base64)?;
        if !matches!(raw.len(), 36 | 52 | 68) {
            let n = raw.len();
            raw.zeroize();
            return Err(KeyError::Length(n));
        }
        let n = raw.len() - 4;
        let crc = u32::from_le_bytes([raw[n], raw[n + 1], raw[n + 2], raw[n + 3]]);
        if crc32fast::hash(&raw[..n]) != crc {
            raw.zeroize();
            return Err(KeyError::Crc);
        }
        raw.truncate(n);
        Secret::new(raw, transform)
    }

    /// A secret from its key bytes (32, 48 or 64) and transform.
    pub fn new(key: Vec<u8>, transform: Option<HashId>) -> Result<Secret, KeyError> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(KeyError::Length(key.len() + 4));
        }
        if let Some(h) = transform {
            // Linux keys the HMAC with the key's own length: only a key as
            // long as the transform's digest interoperates.
            if key.len() != h.len_bytes() {
                return Err(KeyError::TransformLength {
                    key_bytes: key.len(),
                    hash: h,
                    need: h.len_bytes(),
                });
            }
        }
        Ok(Secret { key, transform })
    }

    /// The secret in `DHHC-1` form (what `nvme gen-dhchap-key` prints).
    pub fn to_dhhc(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let s = format!(
            "DHHC-1:{:02}:{}:",
            self.transform.map_or(0, HashId::id),
            base64::engine::general_purpose::STANDARD.encode(&raw)
        );
        raw.zeroize();
        s
    }

    pub fn len_bytes(&self) -> usize {
        self.key.len()
    }

    pub fn transform(&self) -> Option<HashId> {
        self.transform
    }

    /// The key as used for `nqn`: HMAC-hh(key, nqn || "NVMe-over-Fabrics"),
    /// or the key itself when the transform is 00; wiped when dropped.
    pub fn transformed(&self, nqn: &str) -> zeroize::Zeroizing<Vec<u8>> {
        match self.transform {
            None => zeroize::Zeroizing::new(self.key.clone()),
            Some(h) => zeroize::Zeroizing::new(algo::hmac(
                h,
                &self.key,
                &[nqn.as_bytes(), b"NVMe-over-Fabrics"],
            )),
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn key(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn secrets_round_trip_through_the_dhhc_form() {
        for (n, t) in [
            (32, None),
            (48, None),
            (64, None),
            (32, Some(HashId::Sha256)),
            (48, Some(HashId::Sha384)),
            (64, Some(HashId::Sha512)),
        ] {
            let s = Secret::new(key(n), t).unwrap();
            let text = s.to_dhhc();
            assert!(
                text.starts_with(&format!("DHHC-1:{:02}:", t.map_or(0, HashId::id))),
                "{text}"
            );
            assert_eq!(Secret::parse(&text).unwrap(), s);
            // Without the trailing colon, and with whitespace.
            let bare = format!("  {}\n", text.trim_end_matches(':'));
            assert_eq!(Secret::parse(&bare).unwrap(), s);
        }
    }

    #[test]
    fn bad_secrets_say_what_is_wrong_without_quoting_the_key() {
        let good = Secret::new(key(32), None).unwrap().to_dhhc();
        assert_eq!(Secret::parse("DHHC-2:00:abcd:"), Err(KeyError::Prefix));
        assert_eq!(
            Secret::parse(&good.replace(":00:", ":04:")),
            Err(KeyError::Transform)
        );
        assert_eq!(Secret::parse("DHHC-1:00:!!!!:"), Err(KeyError::Base64));
        let short = base64::engine::general_purpose::STANDARD.encode([0u8; 20]);
        assert_eq!(
            Secret::parse(&format!("DHHC-1:00:{short}:")),
            Err(KeyError::Length(20))
        );
        // One character changed: the CRC catches it.
        let mut typo: Vec<char> = good.chars().collect();
        typo[12] = if typo[12] == 'A' { 'B' } else { 'A' };
        let typo: String = typo.into_iter().collect();
        assert_eq!(Secret::parse(&typo), Err(KeyError::Crc));
        // A 32-byte key with a SHA-512 transform.
        let mismatched = good.replace(":00:", ":03:");
        let e = Secret::parse(&mismatched).unwrap_err();
        assert!(
            matches!(
                e,
                KeyError::TransformLength {
                    key_bytes: 32,
                    need: 64,
                    ..
                }
            ),
            "{e}"
        );
        for e in [KeyError::Crc, KeyError::Base64, e] {
            assert!(!e.to_string().contains(&good[10..20]));
        }
    }

    #[test]
    fn debug_never_shows_the_key() {
        let s = Secret::new(vec![0xab; 32], Some(HashId::Sha256)).unwrap();
        let d = format!("{s:?}");
        assert!(!d.to_lowercase().contains("abab"), "{d}");
        assert!(d.contains("redacted"), "{d}");
    }

    #[test]
    fn the_transform_depends_on_the_nqn_and_the_hash() {
        let plain = Secret::new(key(32), None).unwrap();
        assert_eq!(*plain.transformed("nqn.a"), key(32));
        let t = Secret::new(key(32), Some(HashId::Sha256)).unwrap();
        let a = t.transformed("nqn.a");
        assert_eq!(a.len(), 32);
        assert_ne!(*a, *t.transformed("nqn.b"));
        assert_ne!(*a, key(32));
        let t512 = Secret::new(key(64), Some(HashId::Sha512)).unwrap();
        assert_eq!(t512.transformed("nqn.a").len(), 64);
    }
}
