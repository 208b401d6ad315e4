//! The hash functions and Diffie-Hellman groups DH-HMAC-CHAP negotiates
//! (NVMe identifiers), and the HMAC and digest primitives over them.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};

/// A hash function DH-HMAC-CHAP can use (NVMe identifiers 1-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub fn from_id(id: u8) -> Option<HashId> {
        match id {
            1 => Some(HashId::Sha256),
            2 => Some(HashId::Sha384),
            3 => Some(HashId::Sha512),
            _ => None,
        }
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// The digest length in bytes (the challenge and response length).
    pub fn len_bytes(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }

    /// `sha256`, `hmac(sha256)` (nvmet's spelling) or `sha-256`, any case.
    pub fn parse(s: &str) -> Result<HashId, String> {
        let l = s.trim().to_ascii_lowercase().replace('-', "");
        let l = l
            .strip_prefix("hmac(")
            .and_then(|x| x.strip_suffix(')'))
            .unwrap_or(&l);
        HashId::ALL
            .into_iter()
            .find(|h| h.name() == l)
            .ok_or_else(|| {
                format!("{s:?} is not a DH-HMAC-CHAP hash; use sha256, sha384 or sha512")
            })
    }
}

impl fmt::Display for HashId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Diffie-Hellman group (NVMe identifiers 0-5): none, or an RFC 7919
/// group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DhGroup {
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.id() == id)
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// The length of a public value and of the shared secret: the prime's
    /// length (0 for the null group).
    pub fn value_len_bytes(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 384,
            DhGroup::Ffdhe4096 => 512,
            DhGroup::Ffdhe6144 => 768,
            DhGroup::Ffdhe8192 => 1024,
        }
    }

    /// `null`, `ffdhe2048` ... `ffdhe8192`, or the bit count alone.
    pub fn parse(s: &str) -> Result<DhGroup, String> {
        let l = s.trim().to_ascii_lowercase();
        DhGroup::ALL
            .into_iter()
            .find(|g| g.name() == l || g.name().strip_prefix("ffdhe") == Some(l.as_str()))
            .ok_or_else(|| {
                format!("{s:?} is not a DH group; use null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192")
            })
    }
}

impl fmt::Display for DhGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// HMAC over the concatenation of `parts`.
pub(crate) fn hmac(hash: HashId, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    macro_rules! run {
        ($h:ty) => {{
            // HMAC takes keys of any length.
            let mut m = <Hmac<$h> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }};
    }
    match hash {
        HashId::Sha256 => run!(Sha256),
        HashId::Sha384 => run!(Sha384),
        HashId::Sha512 => run!(Sha512),
    }
}

pub(crate) fn digest(hash: HashId, data: &[u8]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => Sha256::digest(data).to_vec(),
        HashId::Sha384 => Sha384::digest(data).to_vec(),
        HashId::Sha512 => Sha512::digest(data).to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_nvme_cli_and_nvmet_write_them() {
        assert_eq!(HashId::parse("hmac(sha384)"), Ok(HashId::Sha384));
        assert_eq!(HashId::parse("SHA-512"), Ok(HashId::Sha512));
        assert!(HashId::parse("md5").unwrap_err().contains("sha256"));
        assert_eq!(DhGroup::parse("ffdhe3072"), Ok(DhGroup::Ffdhe3072));
        assert_eq!(DhGroup::parse("8192"), Ok(DhGroup::Ffdhe8192));
        assert_eq!(DhGroup::parse("NULL"), Ok(DhGroup::Null));
        assert!(DhGroup::parse("ffdhe1024").is_err());
        for g in DhGroup::ALL {
            assert_eq!(DhGroup::from_id(g.id()), Some(g));
        }
    }
}
