//! CRC32C (Castagnoli) digests as NVMe/TCP uses them for HDGST and DDGST.
//!
//! The digest is the standard CRC32C (initial value !0, final XOR !0),
//! transmitted little-endian. The `crc32c` crate uses SSE4.2 where present.

/// CRC32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a CRC32C over a further piece, so a digest can cover data that
/// arrives in several buffers.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // RFC 3720 B.4: 32 bytes of zeroes.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        // "123456789" check value for CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn append_matches_whole() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let (a, b) = data.split_at(333);
        assert_eq!(crc32c_append(crc32c(a), b), crc32c(&data));
    }
}
