//! Connection admission: the target-wide limits on open connections, in
//! total (`target.connections_max`), per source address
//! (`target.connections_per_source_max`) and still in the handshake, i.e.
//! accepted and not yet past their Connect command
//! (`target.connections_handshaking_max`), and the counters behind their
//! metrics.
//!
//! The acceptor asks [`Admission::admit`] before anything is allocated for
//! a socket; a refused socket is closed at once. An admitted one carries a
//! [`Permit`] for as long as it lives (it moves with the connection between
//! workers); [`Permit::handshake_done`] releases its handshake slot when
//! its Connect is accepted, and dropping the permit releases the rest. A
//! connection that never completes its handshake is closed by the
//! handshake timeout (`target.handshake_timeout_ms`, in the queue), so idle
//! sockets cannot hold handshake slots for ever.
//!
//! Sources are IP addresses (an IPv4-mapped IPv6 address counts as the
//! IPv4 one), except that IPv6 addresses are grouped by their /64 prefix,
//! the smallest block a single host is usually given.
//!
//! [`RefusalLog`] rate-limits the acceptor's WARN lines: one per limit per
//! [`REFUSAL_LOG_INTERVAL`], saying how many refusals it did not log.
//!
//! [`Admission::trim_due`] tells the acceptor when a wave of connections has
//! ended ([`TRIM_AFTER_CLOSES`] fewer open than at the peak since the last
//! time, and once more for the wave's tail if more close after that), so it
//! hands the memory they freed back to the kernel
//! (`sluice_runtime::memory::release_free_memory`; glibc would keep it).
//!
//! Sans-IO: addresses and `now` come in; nothing here touches a socket or
//! a clock. The state is one mutex taken at accept, at Connect and at
//! close, never on the I/O path.

use sluice_config::TargetSettings;
use sluice_runtime::sync::lock;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A connection limit, by the config key that sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// `target.connections_max`.
    Connections,
    /// `target.connections_per_source_max`.
    PerSource,
    /// `target.connections_handshaking_max`.
    Handshaking,
    /// `target.connections_handshaking_per_source_max`.
    HandshakingPerSource,
}

impl Limit {
    /// Every limit, in the order [`Admission::admit`] checks them.
    pub const ALL: [Limit; 4] = [
        Limit::PerSource,
        Limit::HandshakingPerSource,
        Limit::Handshaking,
        Limit::Connections,
    ];

    /// The config key (also the metrics' `limit` label).
    pub fn key(self) -> &'static str {
        match self {
            Limit::Connections => "connections_max",
            Limit::PerSource => "connections_per_source_max",
            Limit::Handshaking => "connections_handshaking_max",
            Limit::HandshakingPerSource => "connections_handshaking_per_source_max",
        }
    }

    fn index(self) -> usize {
        match self {
            Limit::Connections => 0,
            Limit::PerSource => 1,
            Limit::Handshaking => 2,
            Limit::HandshakingPerSource => 3,
        }
    }
}

/// A source of connections as the per-source limit counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(IpAddr);

impl Source {
    /// The source of a peer address: IPv4 as is (also when mapped into
    /// IPv6), IPv6 by its /64 prefix.
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V6(a) => {
                let s = a.segments();
                Source(IpAddr::V6(Ipv6Addr::new(
                    s[0], s[1], s[2], s[3], 0, 0, 0, 0,
                )))
            }
            v4 => Source(v4),
        }
    }
}

/// Open connections at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Admitted and not yet closed.
    pub open: u32,
    /// Admitted and not yet past their Connect command.
    pub handshaking: u32,
    /// Distinct sources with an open connection.
    pub sources: u32,
    /// Open connections of the source with the most.
    pub busiest_source: u32,
}

#[derive(Debug, Default)]
struct State {
    open: u32,
    handshaking: u32,
    per_source: HashMap<Source, u32>,
    /// Connections per source still in their handshake (sources with none
    /// are absent).
    handshaking_per_source: HashMap<Source, u32>,
    /// The most open at once since [`Admission::trim_due`] last said yes.
    peak_since_trim: u32,
    /// How many were open when [`Admission::trim_due`] last said yes for a
    /// wave, until it has said yes once more for the wave's tail.
    open_at_wave_trim: Option<u32>,
}

/// How many fewer connections than at their peak must be open before
/// [`Admission::trim_due`] says yes: between 100 KiB (connections that
/// never got past the handshake) and 8 MiB (connected queues with their
/// 128 KiB receive buffers) freed.
pub const TRIM_AFTER_CLOSES: u32 = 64;

/// The limits and the live counts of the whole target.
#[derive(Debug)]
pub struct Admission {
    connections_max: u32,
    per_source_max: u32,
    handshaking_max: u32,
    handshaking_per_source_max: u32,
    state: Mutex<State>,
    /// Refusals per limit, by [`Limit::index`].
    refused: [AtomicU64; 4],
    handshake_timeouts: AtomicU64,
}

impl Admission {
    /// The limits of `[target]`.
    pub fn new(st: &TargetSettings) -> Admission {
        Admission::with_limits(
            st.connections_max,
            st.connections_per_source_max,
            st.connections_handshaking_max,
        )
        .with_handshaking_per_source_max(st.connections_handshaking_per_source_max)
    }

    /// Sets the per-source handshake limit (unlimited by default in
    /// [`Admission::with_limits`]).
    pub fn with_handshaking_per_source_max(mut self, n: u32) -> Self {
        self.handshaking_per_source_max = n;
        self
    }

    /// Explicit limits (tests).
    pub fn with_limits(connections_max: u32, per_source_max: u32, handshaking_max: u32) -> Self {
        Admission {
            connections_max,
            per_source_max,
            handshaking_max,
            handshaking_per_source_max: u32::MAX,
            state: Mutex::new(State::default()),
            refused: Default::default(),
            handshake_timeouts: AtomicU64::new(0),
        }
    }

    /// Admits a new connection from `peer`, or names the limit it would
    /// pass (the first of [`Limit::ALL`] that is full: the most specific),
    /// counting the refusal.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Permit, Limit> {
        let source = Source::of(peer);
        let mut s = lock(&self.state);
        let from_source = s.per_source.get(&source).copied().unwrap_or(0);
        let handshaking_from_source = s.handshaking_per_source.get(&source).copied().unwrap_or(0);
        let full = if from_source >= self.per_source_max {
            Some(Limit::PerSource)
        } else if handshaking_from_source >= self.handshaking_per_source_max {
            Some(Limit::HandshakingPerSource)
        } else if s.handshaking >= self.handshaking_max {
            Some(Limit::Handshaking)
        } else if s.open >= self.connections_max {
            Some(Limit::Connections)
        } else {
            None
        };
        if let Some(l) = full {
            drop(s);
            self.refused[l.index()].fetch_add(1, Relaxed);
            return Err(l);
        }
        // Below limits that fit in u32: no overflow.
        s.open += 1;
        s.handshaking += 1;
        s.peak_since_trim = s.peak_since_trim.max(s.open);
        *s.per_source.entry(source).or_insert(0) += 1;
        *s.handshaking_per_source.entry(source).or_insert(0) += 1;
        Ok(Permit {
            admission: self.clone(),
            source,
            handshaking: true,
        })
    }

    /// The configured value of `limit`.
    pub fn limit(&self, limit: Limit) -> u32 {
        match limit {
            Limit::Connections => self.connections_max,
            Limit::PerSource => self.per_source_max,
            Limit::Handshaking => self.handshaking_max,
            Limit::HandshakingPerSource => self.handshaking_per_source_max,
        }
    }

    /// Connections refused by `limit` so far.
    pub fn refused(&self, limit: Limit) -> u64 {
        self.refused[limit.index()].load(Relaxed)
    }

    /// Counts a connection closed because its handshake took too long.
    pub fn record_handshake_timeout(&self) {
        self.handshake_timeouts.fetch_add(1, Relaxed);
    }

    /// Connections closed by the handshake timeout so far.
    pub fn handshake_timeouts(&self) -> u64 {
        self.handshake_timeouts.load(Relaxed)
    }

    /// Whether at least [`TRIM_AFTER_CLOSES`] connections have closed since
    /// the peak (the most open at once since the last yes): the time to
    /// hand freed memory back. Saying yes starts a new peak.
    ///
    /// A wave rarely ends between two checks: the check that sees the
    /// threshold crossed often comes while the wave's last connections are
    /// still closing, and the pages they pin stay with the process. So after
    /// a wave's yes, the first check that sees any fewer open says yes once
    /// more, for the tail (at most two trims per wave).
    pub fn trim_due(&self) -> bool {
        let mut s = lock(&self.state);
        if s.peak_since_trim.saturating_sub(s.open) >= TRIM_AFTER_CLOSES {
            s.peak_since_trim = s.open;
            s.open_at_wave_trim = Some(s.open);
            true
        } else if s.open_at_wave_trim.is_some_and(|o| s.open < o) {
            s.peak_since_trim = s.open;
            s.open_at_wave_trim = None;
            true
        } else {
            false
        }
    }

    /// The live counts (one lock; `busiest_source` walks the sources).
    pub fn counts(&self) -> ConnectionCounts {
        let s = lock(&self.state);
        ConnectionCounts {
            open: s.open,
            handshaking: s.handshaking,
            sources: u32::try_from(s.per_source.len()).unwrap_or(u32::MAX),
            busiest_source: s.per_source.values().copied().max().unwrap_or(0),
        }
    }

    fn release(&self, source: Source, handshaking: bool) {
        let mut s = lock(&self.state);
        debug_assert!(s.open > 0, "open connection count underflows");
        s.open = s.open.saturating_sub(1);
        if handshaking {
            debug_assert!(s.handshaking > 0, "handshaking count underflows");
            s.handshaking = s.handshaking.saturating_sub(1);
            Self::leave_source_handshake(&mut s, source);
        }
        if let Some(n) = s.per_source.get_mut(&source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.per_source.remove(&source);
                // Give back the table a flood of sources grew.
                if s.per_source.capacity() > 64 && s.per_source.len() < s.per_source.capacity() / 4
                {
                    s.per_source.shrink_to_fit();
                }
            }
        } else {
            debug_assert!(false, "closing a connection of an unknown source");
        }
    }

    fn leave_handshake(&self, source: Source) {
        let mut s = lock(&self.state);
        debug_assert!(s.handshaking > 0, "handshaking count underflows");
        s.handshaking = s.handshaking.saturating_sub(1);
        Self::leave_source_handshake(&mut s, source);
    }

    fn leave_source_handshake(s: &mut State, source: Source) {
        if let Some(n) = s.handshaking_per_source.get_mut(&source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.handshaking_per_source.remove(&source);
                if s.handshaking_per_source.capacity() > 64
                    && s.handshaking_per_source.len() < s.handshaking_per_source.capacity() / 4
                {
                    s.handshaking_per_source.shrink_to_fit();
                }
            }
        } else {
            debug_assert!(false, "a handshake of an unknown source ends");
        }
    }
}

/// An admitted connection's share of the limits, released when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    source: Source,
    handshaking: bool,
}

impl Permit {
    /// Whether the connection still holds a handshake slot.
    pub fn is_handshaking(&self) -> bool {
        self.handshaking
    }

    /// The connection's Connect was accepted: its handshake slot is free
    /// for the next one (idempotent).
    pub fn handshake_done(&mut self) {
        if self.handshaking {
            self.handshaking = false;
            self.admission.leave_handshake(self.source);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.release(self.source, self.handshaking);
    }
}

/// The shortest time between two WARN lines of refusals by one limit.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Rate limit of the acceptor's refusal lines: at most one per limit per
/// [`REFUSAL_LOG_INTERVAL`].
#[derive(Debug, Default)]
pub struct RefusalLog {
    /// When each limit's last line was written, by [`Limit::index`].
    last: [Option<Instant>; 4],
    /// Refusals by each limit since its last line.
    suppressed: [u64; 4],
}

impl RefusalLog {
    /// Notes a refusal by `limit` at `now`: `Some(n)` when a line is due,
    /// `n` being the refusals by that limit not logged since its last line.
    pub fn note(&mut self, limit: Limit, now: Instant) -> Option<u64> {
        let i = limit.index();
        let due = self.last[i].is_none_or(|t| now.duration_since(t) >= REFUSAL_LOG_INTERVAL);
        if due {
            self.last[i] = Some(now);
            Some(std::mem::take(&mut self.suppressed[i]))
        } else {
            self.suppressed[i] += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn per_source_limit_counts_each_address() {
        let a = Arc::new(Admission::with_limits(10, 2, 10));
        let p1 = a.admit(ip("10.0.0.1")).unwrap();
        let _p2 = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.1")).err(), Some(Limit::PerSource));
        let _q = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(
            a.counts(),
            ConnectionCounts {
                open: 3,
                handshaking: 3,
                sources: 2,
                busiest_source: 2
            }
        );
        drop(p1);
        let _p3 = a.admit(ip("10.0.0.1")).expect("a slot came back");
        assert_eq!(a.refused(Limit::PerSource), 1);
        assert_eq!(a.refused(Limit::Connections), 0);
    }

    #[test]
    fn one_source_cannot_hold_every_handshake_slot() {
        let a = Arc::new(Admission::with_limits(100, 100, 10).with_handshaking_per_source_max(3));
        let mut held: Vec<Permit> = (0..3).map(|_| a.admit(ip("10.0.0.9")).unwrap()).collect();
        assert_eq!(
            a.admit(ip("10.0.0.9")).err(),
            Some(Limit::HandshakingPerSource)
        );
        // Another address still gets in.
        let _other = a.admit(ip("10.0.0.10")).unwrap();
        // A connection past Connect frees its source's handshake slot, and
        // a closed one too.
        held[0].handshake_done();
        let _next = a.admit(ip("10.0.0.9")).unwrap();
        assert_eq!(
            a.admit(ip("10.0.0.9")).err(),
            Some(Limit::HandshakingPerSource)
        );
        held.pop();
        let _again = a.admit(ip("10.0.0.9")).unwrap();
        assert_eq!(a.refused(Limit::HandshakingPerSource), 2);
        assert_eq!(a.limit(Limit::HandshakingPerSource), 3);
    }

    #[test]
    fn total_limit_and_release_on_drop() {
        let a = Arc::new(Admission::with_limits(2, 10, 10));
        let mut p1 = a.admit(ip("10.0.0.1")).unwrap();
        p1.handshake_done();
        let p2 = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.3")).err(), Some(Limit::Connections));
        assert_eq!(a.refused(Limit::Connections), 1);
        drop(p1);
        drop(p2);
        assert_eq!(a.counts(), ConnectionCounts::default());
        let _p = a.admit(ip("10.0.0.3")).unwrap();
    }

    #[test]
    fn handshake_slots_free_at_connect_and_at_close() {
        let a = Arc::new(Admission::with_limits(10, 10, 2));
        let mut p1 = a.admit(ip("10.0.0.1")).unwrap();
        let p2 = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.3")).err(), Some(Limit::Handshaking));
        assert!(p1.is_handshaking());
        p1.handshake_done();
        p1.handshake_done(); // idempotent
        assert!(!p1.is_handshaking());
        assert_eq!(a.counts().handshaking, 1);
        let p3 = a.admit(ip("10.0.0.3")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.4")).err(), Some(Limit::Handshaking));
        drop(p2); // closed before Connect: its handshake slot returns too
        assert_eq!(a.counts().handshaking, 1);
        assert_eq!(a.counts().open, 2);
        drop(p3);
        drop(p1);
        assert_eq!(a.counts(), ConnectionCounts::default());
        assert_eq!(a.refused(Limit::Handshaking), 2);
    }

    /// The most specific full limit is named: a source at its own limit
    /// is told so even when the target is full too.
    #[test]
    fn refusal_names_the_most_specific_limit() {
        let a = Arc::new(Admission::with_limits(1, 1, 1));
        let _p = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.1")).err(), Some(Limit::PerSource));
        assert_eq!(a.admit(ip("10.0.0.2")).err(), Some(Limit::Handshaking));
        let a = Arc::new(Admission::with_limits(1, 1, 5));
        let _p = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.2")).err(), Some(Limit::Connections));
    }

    #[test]
    fn sources_are_addresses_and_ipv6_prefixes() {
        assert_eq!(
            Source::of(ip("::ffff:10.1.2.3")),
            Source::of(ip("10.1.2.3"))
        );
        assert_eq!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:3::1"))
        );
        let a = Arc::new(Admission::with_limits(10, 1, 10));
        let _p = a.admit(ip("2001:db8::1")).unwrap();
        assert_eq!(a.admit(ip("2001:db8::2")).err(), Some(Limit::PerSource));
    }

    #[test]
    fn source_table_shrinks_after_a_flood_of_sources() {
        let a = Arc::new(Admission::with_limits(10_000, 1, 10_000));
        let permits: Vec<_> = (0..2000u32)
            .map(|i| a.admit(IpAddr::from(i.to_be_bytes())).unwrap())
            .collect();
        assert_eq!(a.counts().sources, 2000);
        drop(permits);
        assert_eq!(a.counts(), ConnectionCounts::default());
        assert!(lock(&a.state).per_source.capacity() <= 256);
    }

    #[test]
    fn trim_is_due_once_a_wave_has_closed() {
        let a = Arc::new(Admission::with_limits(10_000, 10_000, 10_000));
        assert!(!a.trim_due());
        let mut wave: Vec<_> = (0..200).map(|_| a.admit(ip("10.0.0.1")).unwrap()).collect();
        wave.truncate(200 - (TRIM_AFTER_CLOSES as usize - 1));
        assert!(!a.trim_due(), "one short of the threshold");
        // Churn below the peak does not count as a wave.
        wave.push(a.admit(ip("10.0.0.1")).unwrap());
        wave.pop();
        assert!(!a.trim_due());
        wave.pop();
        assert!(a.trim_due());
        assert!(!a.trim_due(), "a new peak starts at the trim");
        drop(wave);
        assert!(a.trim_due());
    }

    #[test]
    fn the_tail_of_a_wave_gets_one_more_trim() {
        let a = Arc::new(Admission::with_limits(10_000, 10_000, 10_000));
        let mut wave: Vec<_> = (0..200).map(|_| a.admit(ip("10.0.0.1")).unwrap()).collect();
        // The check comes while the wave is still closing.
        wave.truncate(10);
        assert!(a.trim_due());
        assert!(!a.trim_due(), "nothing closed since");
        // Openings alone are no tail.
        wave.push(a.admit(ip("10.0.0.1")).unwrap());
        assert!(!a.trim_due());
        wave.truncate(3);
        assert!(a.trim_due(), "the tail closed after the wave's trim");
        wave.truncate(1);
        assert!(!a.trim_due(), "one trim for the tail, not one per close");
        // A new wave starts the pair again.
        wave.extend((0..100).map(|_| a.admit(ip("10.0.0.1")).unwrap()));
        wave.truncate(20);
        assert!(a.trim_due());
        wave.clear();
        assert!(a.trim_due());
        assert!(!a.trim_due());
    }

    #[test]
    fn refusal_log_writes_one_line_per_limit_per_interval() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        assert_eq!(log.note(Limit::PerSource, t0), Some(0));
        assert_eq!(log.note(Limit::PerSource, t0), None);
        assert_eq!(
            log.note(Limit::PerSource, t0 + Duration::from_millis(500)),
            None
        );
        // Another limit has its own window.
        assert_eq!(log.note(Limit::Handshaking, t0), Some(0));
        assert_eq!(
            log.note(Limit::PerSource, t0 + REFUSAL_LOG_INTERVAL),
            Some(2),
            "the line says how many were not logged"
        );
        assert_eq!(log.note(Limit::PerSource, t0 + REFUSAL_LOG_INTERVAL), None);
    }
}
