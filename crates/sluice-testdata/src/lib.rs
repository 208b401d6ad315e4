//! Test data for Sluice's tests and examples (dev only, never shipped).
//!
//! Every data-path test writes a pattern and reads it back. A pattern that
//! is a byte function of the offset alone (`i * 31 + 7`) repeats every
//! 256 bytes, so a block served from the wrong place, at any block-aligned
//! distance, matches it: a RAM read lent from the start of its chunk
//! instead of its place passed every test with such patterns (stop 56).
//! [`pattern_byte`] mixes the offset and the seed, so neither the blocks of
//! one pattern nor two patterns of different seeds agree at any distance
//! a namespace can hold.

/// Byte `i` of the pattern `seed`: a multiply-xorshift of the offset and
/// the seed, so `pattern_byte(i, s)` does not repeat with a short period in
/// `i` and differs between seeds.
pub fn pattern_byte(i: u64, seed: u64) -> u8 {
    let mut z = i
        .wrapping_add(seed << 40)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z ^= z >> 29;
    (z >> 32).to_le_bytes()[0]
}

/// `len` bytes of the pattern `seed` from offset 0.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    pattern_at(0, len, seed)
}

/// `len` bytes of the pattern `seed` from byte `offset` of it: what a
/// namespace written whole with `pattern(size, seed)` holds there.
pub fn pattern_at(offset: u64, len: usize, seed: u64) -> Vec<u8> {
    (offset..offset + len as u64)
        .map(|i| pattern_byte(i, seed))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No 4 KiB block of a 64 MiB pattern equals another, nor its place in
    /// a pattern of another seed: a block read from the wrong place, or
    /// from another test's data, is seen.
    #[test]
    fn no_block_repeats_within_a_namespace_or_across_seeds() {
        let blocks = 16 * 1024;
        let p = pattern(blocks * 4096, 1);
        let mut seen = std::collections::HashSet::with_capacity(blocks);
        for b in p.chunks(4096) {
            assert!(seen.insert(b), "a block repeats");
        }
        let q = pattern_at(4096 * 100, 4096, 2);
        assert_ne!(&p[4096 * 100..4096 * 101], &q[..]);
    }

    #[test]
    fn pattern_at_is_the_same_bytes_as_the_whole() {
        let whole = pattern(10_000, 9);
        assert_eq!(pattern_at(1234, 5000, 9), &whole[1234..6234]);
    }
}
