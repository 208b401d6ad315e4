//! Token buckets with injected time (Firecracker `rate_limiter` style).
//!
//! A bucket holds up to `capacity` tokens and refills continuously at
//! `rate` tokens per second. Tokens are kept in nano-tokens (token × 10⁹) so
//! refills are exact integers: `elapsed_ns × rate`. A request larger than
//! the capacity is admitted when the bucket is full and leaves it in debt
//! (negative), so the long-run rate is honoured exactly for any request size
//! (Firecracker calls this over-consumption). Nothing here reads a clock.

use sluice_config::tenants::{RateSpec, BYTES_PER_SEC_MIN};
use std::time::{Duration, Instant};

const NANO: i128 = 1_000_000_000;

/// One token bucket.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: u64,
    capacity: u64,
    /// Nano-tokens; may be negative (debt after an oversized request).
    tokens: i128,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `rate` and `capacity` must be non-zero.
    pub fn new(rate: u64, capacity: u64, now: Instant) -> Self {
        assert!(
            rate > 0 && capacity > 0,
            "token bucket needs rate and capacity"
        );
        TokenBucket {
            rate,
            capacity,
            tokens: i128::from(capacity) * NANO,
            last: now,
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn refill(&mut self, now: Instant) {
        if now <= self.last {
            return;
        }
        // A Duration's nanoseconds (below 2^94) always fit.
        let ns = i128::try_from(now.duration_since(self.last).as_nanos()).unwrap_or(i128::MAX);
        let cap = i128::from(self.capacity) * NANO;
        self.tokens = (self.tokens + ns * i128::from(self.rate)).min(cap);
        self.last = now;
    }

    /// Whole tokens available now (0 when in debt).
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        // At most the capacity, a u64 (`refill` caps the tokens).
        u64::try_from(self.tokens.max(0) / NANO).unwrap_or(u64::MAX)
    }

    /// Whether `n` tokens may be taken now (`n` above the capacity: when full).
    pub fn can(&mut self, n: u64, now: Instant) -> bool {
        self.refill(now);
        let need = i128::from(n.min(self.capacity)) * NANO;
        self.tokens >= need
    }

    /// Takes `n` tokens unconditionally (may go into debt).
    pub fn consume(&mut self, n: u64, now: Instant) {
        self.refill(now);
        self.tokens -= i128::from(n) * NANO;
    }

    /// Takes `n` tokens if [`can`](Self::can) allows it.
    pub fn try_consume(&mut self, n: u64, now: Instant) -> bool {
        if self.can(n, now) {
            self.consume(n, now);
            true
        } else {
            false
        }
    }

    /// How long until `n` tokens may be taken (zero if now).
    pub fn time_until(&mut self, n: u64, now: Instant) -> Duration {
        self.refill(now);
        let need = i128::from(n.min(self.capacity)) * NANO;
        if self.tokens >= need {
            return Duration::ZERO;
        }
        let missing = need - self.tokens;
        let ns = (missing + i128::from(self.rate) - 1) / i128::from(self.rate);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Changes rate and capacity, keeping the current fill (clamped).
    pub fn reconfigure(&mut self, rate: u64, capacity: u64, now: Instant) {
        assert!(
            rate > 0 && capacity > 0,
            "token bucket needs rate and capacity"
        );
        self.refill(now);
        self.rate = rate;
        self.capacity = capacity;
        self.tokens = self.tokens.min(i128::from(capacity) * NANO);
    }
}

/// Direction of an I/O for rates and costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    Read,
    Write,
    /// Flush, Write Zeroes, Deallocate: counted as an operation, no bytes.
    Other,
}

impl Dir {
    /// For log lines: `read`, `write` or `other`.
    pub fn name(self) -> &'static str {
        match self {
            Dir::Read => "read",
            Dir::Write => "write",
            Dir::Other => "other",
        }
    }
}

/// Burst allowed by a bucket: this fraction of a second of its rate.
pub const BURST_DIVISOR: u64 = 50; // 20 ms

fn ops_bucket(rate: u64, now: Instant) -> TokenBucket {
    TokenBucket::new(rate, (rate / BURST_DIVISOR).max(1), now)
}
fn bytes_bucket(rate: u64, now: Instant) -> TokenBucket {
    TokenBucket::new(rate, (rate / BURST_DIVISOR).max(BYTES_PER_SEC_MIN), now)
}

/// The buckets of one [`RateSpec`]; an I/O passes only if all of its
/// buckets allow it, and then takes from all of them.
#[derive(Debug, Clone, Default)]
pub struct RateLimiter {
    iops: Option<TokenBucket>,
    read_iops: Option<TokenBucket>,
    write_iops: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
    read_bytes: Option<TokenBucket>,
    write_bytes: Option<TokenBucket>,
}

impl RateLimiter {
    pub fn new(spec: &RateSpec, now: Instant) -> Self {
        RateLimiter {
            iops: spec.iops.map(|r| ops_bucket(r, now)),
            read_iops: spec.read_iops.map(|r| ops_bucket(r, now)),
            write_iops: spec.write_iops.map(|r| ops_bucket(r, now)),
            bytes: spec.bytes_per_sec.map(|r| bytes_bucket(r, now)),
            read_bytes: spec.read_bytes_per_sec.map(|r| bytes_bucket(r, now)),
            write_bytes: spec.write_bytes_per_sec.map(|r| bytes_bucket(r, now)),
        }
    }

    pub fn is_unlimited(&self) -> bool {
        self.iops.is_none()
            && self.read_iops.is_none()
            && self.write_iops.is_none()
            && self.bytes.is_none()
            && self.read_bytes.is_none()
            && self.write_bytes.is_none()
    }

    fn buckets(&mut self, dir: Dir, bytes: u64) -> [(Option<&mut TokenBucket>, u64); 4] {
        let (dops, dbytes) = match dir {
            Dir::Read => (self.read_iops.as_mut(), self.read_bytes.as_mut()),
            Dir::Write => (self.write_iops.as_mut(), self.write_bytes.as_mut()),
            Dir::Other => (None, None),
        };
        [
            (self.iops.as_mut(), 1),
            (dops, 1),
            (self.bytes.as_mut(), bytes),
            (dbytes, bytes),
        ]
    }

    /// Whether an I/O may pass now.
    pub fn can(&mut self, dir: Dir, bytes: u64, now: Instant) -> bool {
        self.buckets(dir, bytes)
            .into_iter()
            .all(|(b, n)| b.is_none_or(|b| n == 0 || b.can(n, now)))
    }

    /// Takes the I/O's tokens (call after [`can`](Self::can)).
    pub fn consume(&mut self, dir: Dir, bytes: u64, now: Instant) {
        for (b, n) in self.buckets(dir, bytes) {
            if let Some(b) = b {
                if n > 0 {
                    b.consume(n, now);
                }
            }
        }
    }

    /// When the I/O could pass (zero: now).
    pub fn time_until(&mut self, dir: Dir, bytes: u64, now: Instant) -> Duration {
        self.buckets(dir, bytes)
            .into_iter()
            .filter_map(|(b, n)| {
                b.map(|b| {
                    if n == 0 {
                        Duration::ZERO
                    } else {
                        b.time_until(n, now)
                    }
                })
            })
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bucket_refills_and_waits() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, 10, t0);
        assert!(b.try_consume(10, t0));
        assert!(!b.try_consume(1, t0));
        assert_eq!(b.time_until(1, t0), Duration::from_millis(1));
        assert!(b.try_consume(1, t0 + Duration::from_millis(1)));
        // Oversized request: waits for a full bucket, then goes into debt.
        let t1 = t0 + Duration::from_secs(1);
        assert!(b.try_consume(25, t1));
        assert_eq!(b.time_until(1, t1), Duration::from_millis(16));
    }

    proptest! {
        /// Over any run, what passes is at most capacity + rate × elapsed +
        /// one request (the debt of an oversized request).
        #[test]
        fn limit_never_exceeded(rate in 1u64..1_000_000, sizes in proptest::collection::vec(1u64..200_000, 1..300),
                                gaps in proptest::collection::vec(0u64..5_000_000, 1..300)) {
            let t0 = Instant::now();
            let mut l = RateLimiter::new(&RateSpec { bytes_per_sec: Some(rate.max(BYTES_PER_SEC_MIN)), iops: Some(rate), ..Default::default() }, t0);
            let rate_b = rate.max(BYTES_PER_SEC_MIN);
            let mut now = t0;
            let (mut ops, mut bytes, mut max_io) = (0u64, 0u64, 0u64);
            for (i, s) in sizes.iter().enumerate() {
                now += Duration::from_nanos(gaps[i % gaps.len()]);
                let wait = l.time_until(Dir::Read, *s, now);
                now += wait;
                prop_assert!(l.can(Dir::Read, *s, now));
                l.consume(Dir::Read, *s, now);
                ops += 1; bytes += s; max_io = max_io.max(*s);
                let el = now.duration_since(t0).as_nanos();
                let cap_ops = (rate / BURST_DIVISOR).max(1) as u128;
                let cap_b = (rate_b / BURST_DIVISOR).max(BYTES_PER_SEC_MIN) as u128;
                prop_assert!((ops as u128) <= cap_ops + 1 + el * rate as u128 / 1_000_000_000);
                prop_assert!((bytes as u128) <= cap_b + max_io as u128 + el * rate_b as u128 / 1_000_000_000);
            }
        }
    }
}
