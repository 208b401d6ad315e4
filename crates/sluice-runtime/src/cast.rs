//! Integer conversions that are lossless on every target Sluice builds for,
//! and durations as saturating nanoseconds.
//!
//! Sluice runs only on 64-bit Linux (io_uring, O_DIRECT, 64-bit LBAs held in
//! memory as `usize` offsets); the assertion below refuses any other target
//! at compile time, so a `u64` always fits a `usize`. Clippy's
//! `cast_possible_truncation` cannot know that, hence this one allowed cast
//! instead of one `#[allow]` per call site.

use std::time::Duration;

const _: () = assert!(
    usize::BITS >= u64::BITS,
    "Sluice needs 64-bit pointers (u64 lengths and offsets are used as usize)"
);

/// `n` as a `usize`: lossless, since `usize` has at least 64 bits here.
#[inline]
#[must_use]
pub const fn usize_from(n: u64) -> usize {
    // Lossless: the compile-time assertion above guarantees 64-bit usize.
    #[allow(clippy::cast_possible_truncation)]
    let u = n as usize;
    u
}

/// `d` in whole nanoseconds, saturating at `u64::MAX` (584 years).
#[inline]
#[must_use]
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widens_without_loss() {
        assert_eq!(usize_from(u64::MAX) as u64, u64::MAX);
        assert_eq!(usize_from(0), 0);
    }

    #[test]
    fn nanos_saturate() {
        assert_eq!(nanos(Duration::from_micros(3)), 3000);
        assert_eq!(nanos(Duration::MAX), u64::MAX);
    }
}
