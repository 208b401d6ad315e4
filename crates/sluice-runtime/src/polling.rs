//! How an event loop waits when a turn made no progress: the one polling
//! policy of target worker threads and host queue threads.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// Spin time of `adaptive` when none is given.
pub const ADAPTIVE_SPIN_US_DEFAULT: u32 = 50;
/// Longest adaptive spin accepted (1 s): past that, use `busy-poll`.
pub const ADAPTIVE_SPIN_US_MAX: u32 = 1_000_000;
/// While its own commands are outstanding, an adaptive host spins this many
/// times its spin time (1 ms at the default) before it sleeps.
pub const ADAPTIVE_OUTSTANDING_SPIN_FACTOR: u32 = 20;

/// How a loop waits for its sockets and timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollingPolicy {
    /// Sleep in epoll until a socket, a wake-up or a timer is ready.
    #[default]
    Interrupt,
    /// Never sleep: poll without blocking, turn after turn.
    BusyPoll,
    /// Poll without sleeping for `spin_us` µs after the last progress, then
    /// sleep like `Interrupt`.
    Adaptive { spin_us: u32 },
}

/// Idle spells shorter than this are not counted by [`IdleGaps`]: PDUs of
/// one batch arriving a few microseconds apart.
const IDLE_GAP_NS_MIN: u64 = 5_000;
/// An adaptive loop whose idle spells average under this many spin times
/// spins this many spin times (200 µs at the default) before it sleeps.
pub const ADAPTIVE_STEADY_SPIN_FACTOR: u32 = 4;

/// How long a loop's idle spells last (an exponentially weighted mean), so
/// that `adaptive` spins through the short gaps of a steady load and still
/// sleeps through the long ones of a light load.
///
/// Measured: a target under a Sluice host at 4 KiB QD 32 is idle 60-100 µs
/// between the host's batches. With a fixed 50 µs spin it slept in each gap,
/// and the host's next send paid the target's wake-up (16 % of the host's
/// CPU, in `sock_def_readable`); the pair ran at 0.66x of the same pair with
/// a 200 µs spin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdleGaps {
    /// Mean idle spell, 0 before the first.
    mean_ns: u64,
}

impl IdleGaps {
    /// A loop that went idle `gap` ago made progress.
    pub fn record(&mut self, gap: Duration) {
        let g = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
        if g < IDLE_GAP_NS_MIN {
            return;
        }
        self.mean_ns = if self.mean_ns == 0 {
            g
        } else {
            self.mean_ns - self.mean_ns / 4 + g / 4
        };
    }

    /// The mean idle spell so far (zero before the first).
    pub fn mean(&self) -> Duration {
        Duration::from_nanos(self.mean_ns)
    }

    /// The policy for the next idle spell: `adaptive` spins
    /// [`ADAPTIVE_STEADY_SPIN_FACTOR`] times longer while idle spells
    /// average under that long; other policies are unchanged.
    pub fn policy(&self, p: PollingPolicy) -> PollingPolicy {
        match p {
            PollingPolicy::Adaptive { spin_us } => {
                let long_us = spin_us
                    .saturating_mul(ADAPTIVE_STEADY_SPIN_FACTOR)
                    .min(ADAPTIVE_SPIN_US_MAX);
                let steady = self.mean_ns != 0 && self.mean_ns < u64::from(long_us) * 1000;
                if steady {
                    PollingPolicy::Adaptive { spin_us: long_us }
                } else {
                    p
                }
            }
            p => p,
        }
    }
}

/// What a loop that made no progress this turn does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Poll again without sleeping.
    Spin,
    /// Sleep until an event (or a timer the caller armed).
    Sleep,
}

impl PollingPolicy {
    /// `adaptive` with the default spin time.
    pub const ADAPTIVE: PollingPolicy = PollingPolicy::Adaptive {
        spin_us: ADAPTIVE_SPIN_US_DEFAULT,
    };

    /// Parses a policy name, with `adaptive_spin_us` as the spin time of a
    /// bare `adaptive` (`adaptive:N` overrides it). Accepted names:
    /// `interrupt` (`irq`), `busy-poll` (`busy`, `busypoll`), `adaptive`,
    /// `adaptive:SPIN_US`.
    pub fn parse(s: &str, adaptive_spin_us: u32) -> Result<Self, String> {
        let policy = match s {
            "interrupt" | "irq" => PollingPolicy::Interrupt,
            "busy-poll" | "busy" | "busypoll" => PollingPolicy::BusyPoll,
            "adaptive" => PollingPolicy::Adaptive {
                spin_us: adaptive_spin_us,
            },
            _ => match s.strip_prefix("adaptive:") {
                Some(n) => PollingPolicy::Adaptive {
                    spin_us: n.parse().map_err(|e| format!("bad spin time `{n}`: {e}"))?,
                },
                None => {
                    return Err(format!(
                        "`{s}` is not one of interrupt, busy-poll, adaptive, adaptive:SPIN_US"
                    ))
                }
            },
        };
        if let PollingPolicy::Adaptive { spin_us } = policy {
            if spin_us > ADAPTIVE_SPIN_US_MAX {
                return Err(format!(
                    "spin time {spin_us} µs is over {ADAPTIVE_SPIN_US_MAX} µs (use busy-poll)"
                ));
            }
        }
        Ok(policy)
    }

    /// The policy to wait with when `outstanding` commands of this loop
    /// await their completions (a host queue): `adaptive` then spins
    /// [`ADAPTIVE_OUTSTANDING_SPIN_FACTOR`] times longer, because a
    /// completion is on its way and a sleep would cost a wake-up on this
    /// side and, in turn, an idle spell and a wake-up on the peer's. With
    /// both sides adaptive and 50 µs spins, a QD 32 batch took longer than
    /// a spin, so host and target slept in turn and the pair ran at about
    /// half its busy-poll rate. Other policies are unchanged.
    pub fn while_outstanding(self, outstanding: bool) -> PollingPolicy {
        match self {
            PollingPolicy::Adaptive { spin_us } if outstanding => PollingPolicy::Adaptive {
                spin_us: spin_us
                    .saturating_mul(ADAPTIVE_OUTSTANDING_SPIN_FACTOR)
                    .min(ADAPTIVE_SPIN_US_MAX),
            },
            p => p,
        }
    }

    /// Whether a loop idle for `idle_for` (since its last progress) spins.
    pub fn wait(&self, idle_for: Duration) -> Wait {
        let spin = match *self {
            PollingPolicy::BusyPoll => true,
            PollingPolicy::Interrupt => false,
            PollingPolicy::Adaptive { spin_us } => idle_for < Duration::from_micros(spin_us.into()),
        };
        if spin {
            Wait::Spin
        } else {
            Wait::Sleep
        }
    }

    /// The configuration spelling (`parse` reads it back).
    pub fn name(&self) -> &'static str {
        match self {
            PollingPolicy::Interrupt => "interrupt",
            PollingPolicy::BusyPoll => "busy-poll",
            PollingPolicy::Adaptive { .. } => "adaptive",
        }
    }
}

impl FromStr for PollingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PollingPolicy::parse(s, ADAPTIVE_SPIN_US_DEFAULT)
    }
}

impl fmt::Display for PollingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PollingPolicy::Adaptive { spin_us } => write!(f, "adaptive:{spin_us}"),
            other => f.write_str(other.name()),
        }
    }
}

/// How often a spinning loop reads its involuntary context switches.
pub const CONTENTION_SAMPLE_INTERVAL: Duration = Duration::from_micros(200);
/// How long a loop that saw one backs off its long spin.
pub const CONTENTION_BACKOFF: Duration = Duration::from_millis(100);

/// Whether an adaptive host's long spin ([`PollingPolicy::while_outstanding`])
/// takes CPU that another task is waiting for. While it spins, the loop
/// reads its thread's involuntary context switches (a task preempted it:
/// something else was runnable on its core) at most every
/// [`CONTENTION_SAMPLE_INTERVAL`]; after a rise it keeps to the base spin
/// for [`CONTENTION_BACKOFF`].
///
/// Measured: with hosts and targets sharing 2 cores (Fig. 7c of the
/// volumes lab, up to 4 targets), the 1 ms spin took the targets' CPU and
/// the figure fell from 0.89 / 0.87 to 0.76 / 0.68 at N = 4 / 8; a pair on
/// dedicated cores lost 3-15 % when the spin yielded instead. The
/// switches only rise in the first case. Time and the reading are passed
/// in: [`thread_involuntary_switches`] is the reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpinContention {
    sampled_at: Option<Instant>,
    switches: u64,
    contended_until: Option<Instant>,
    /// Times a rise was seen (for counters and tests).
    seen: u64,
}

impl SpinContention {
    /// The loop spins at `now`: reads the switches (with `read`) if the
    /// last reading is [`CONTENTION_SAMPLE_INTERVAL`] old, and backs off
    /// if they rose.
    pub fn spinning(&mut self, now: Instant, read: impl FnOnce() -> Option<u64>) {
        if self
            .sampled_at
            .is_some_and(|t| now.saturating_duration_since(t) < CONTENTION_SAMPLE_INTERVAL)
        {
            return;
        }
        let Some(n) = read() else { return };
        if self.sampled_at.is_some() && n > self.switches {
            self.contended_until = Some(now + CONTENTION_BACKOFF);
            self.seen += 1;
        }
        self.sampled_at = Some(now);
        self.switches = n;
    }

    /// The loop slept: the next spin starts a new reading (a preemption
    /// while it slept or worked is not its spin's doing).
    pub fn slept(&mut self) {
        self.sampled_at = None;
    }

    pub fn contended(&self, now: Instant) -> bool {
        self.contended_until.is_some_and(|u| now < u)
    }

    /// Rises seen so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The policy of a loop with `outstanding` commands:
    /// [`PollingPolicy::while_outstanding`], unless contended.
    pub fn policy(&self, p: PollingPolicy, outstanding: bool, now: Instant) -> PollingPolicy {
        if self.contended(now) {
            p
        } else {
            p.while_outstanding(outstanding)
        }
    }
}

/// The calling thread's involuntary context switches so far
/// (`getrusage(RUSAGE_THREAD)`), or `None` where that fails.
pub fn thread_involuntary_switches() -> Option<u64> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole `rusage` into the pointer on
    // success; it is read only then.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: rc == 0: the struct is initialised.
    let ru = unsafe { ru.assume_init() };
    u64::try_from(ru.ru_nivcsw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_parses_and_display_round_trips() {
        for (s, p) in [
            ("interrupt", PollingPolicy::Interrupt),
            ("irq", PollingPolicy::Interrupt),
            ("busy-poll", PollingPolicy::BusyPoll),
            ("busy", PollingPolicy::BusyPoll),
            ("busypoll", PollingPolicy::BusyPoll),
            ("adaptive", PollingPolicy::Adaptive { spin_us: 50 }),
            ("adaptive:7", PollingPolicy::Adaptive { spin_us: 7 }),
        ] {
            let got: PollingPolicy = s.parse().expect(s);
            assert_eq!(got, p, "{s}");
            assert_eq!(got.to_string().parse::<PollingPolicy>(), Ok(got));
        }
        assert_eq!(
            PollingPolicy::parse("adaptive", 9),
            Ok(PollingPolicy::Adaptive { spin_us: 9 })
        );
    }

    #[test]
    fn bad_names_and_spin_times_are_refused_with_the_reason() {
        let e = "spin".parse::<PollingPolicy>().unwrap_err();
        assert!(e.contains("`spin` is not one of"), "{e}");
        let e = "adaptive:-1".parse::<PollingPolicy>().unwrap_err();
        assert!(e.contains("bad spin time `-1`"), "{e}");
        let e = "adaptive:2000000".parse::<PollingPolicy>().unwrap_err();
        assert!(e.contains("over 1000000"), "{e}");
        assert!("".parse::<PollingPolicy>().is_err());
    }

    #[test]
    fn wait_follows_the_policy() {
        let us = Duration::from_micros;
        assert_eq!(PollingPolicy::BusyPoll.wait(us(1_000_000)), Wait::Spin);
        assert_eq!(PollingPolicy::Interrupt.wait(us(0)), Wait::Sleep);
        let a = PollingPolicy::Adaptive { spin_us: 50 };
        assert_eq!(a.wait(us(49)), Wait::Spin);
        assert_eq!(a.wait(us(50)), Wait::Sleep);
        // Outstanding commands stretch the spin; nothing else changes.
        assert_eq!(a.while_outstanding(false), a);
        assert_eq!(a.while_outstanding(true).wait(us(999)), Wait::Spin);
        assert_eq!(a.while_outstanding(true).wait(us(1000)), Wait::Sleep);
        // Idle spells: a steady load's short gaps stretch the spin to 200 µs;
        // long gaps (a light load) and tiny ones (one batch) do not.
        let mut g = IdleGaps::default();
        assert_eq!(g.policy(a), a, "nothing learnt yet");
        g.record(us(2));
        assert_eq!(
            g.policy(a),
            a,
            "a gap inside one batch is not an idle spell"
        );
        g.record(us(80));
        assert_eq!(g.mean(), us(80));
        assert_eq!(g.policy(a), PollingPolicy::Adaptive { spin_us: 200 });
        assert_eq!(g.policy(PollingPolicy::Interrupt), PollingPolicy::Interrupt);
        assert_eq!(g.policy(PollingPolicy::BusyPoll), PollingPolicy::BusyPoll);
        for _ in 0..8 {
            g.record(us(1000));
        }
        assert!(g.mean() > us(200), "{:?}", g.mean());
        assert_eq!(g.policy(a), a, "a light load sleeps after the base spin");
        for _ in 0..12 {
            g.record(us(60));
        }
        assert_eq!(
            g.policy(a),
            PollingPolicy::Adaptive { spin_us: 200 },
            "back to steady"
        );
        let long = PollingPolicy::Adaptive {
            spin_us: ADAPTIVE_SPIN_US_MAX,
        };
        assert_eq!(long.while_outstanding(true), long);
        for p in [PollingPolicy::BusyPoll, PollingPolicy::Interrupt] {
            assert_eq!(p.while_outstanding(true), p);
        }
        assert_eq!(
            PollingPolicy::Adaptive { spin_us: 0 }.wait(us(0)),
            Wait::Sleep
        );
    }

    #[test]
    fn a_rise_in_involuntary_switches_backs_the_long_spin_off() {
        let t0 = Instant::now();
        let a = PollingPolicy::ADAPTIVE;
        let long = a.while_outstanding(true);
        let mut c = SpinContention::default();
        // The first reading is a baseline.
        c.spinning(t0, || Some(10));
        assert_eq!(c.policy(a, true, t0), long);
        // Within the sample interval nothing is read.
        c.spinning(t0 + Duration::from_micros(50), || panic!("read too soon"));
        // The same count later: not contended.
        let t1 = t0 + CONTENTION_SAMPLE_INTERVAL;
        c.spinning(t1, || Some(10));
        assert!(!c.contended(t1));
        // A rise: the base spin for the backoff, then the long one again.
        let t2 = t1 + CONTENTION_SAMPLE_INTERVAL;
        c.spinning(t2, || Some(11));
        assert!(c.contended(t2));
        assert_eq!(c.seen(), 1);
        assert_eq!(c.policy(a, true, t2), a);
        assert_eq!(c.policy(a, true, t2 + CONTENTION_BACKOFF), long);
        // Other policies are what while_outstanding makes them.
        assert_eq!(
            c.policy(PollingPolicy::BusyPoll, true, t2),
            PollingPolicy::BusyPoll
        );
        // A preemption while it slept is not counted on the next spin.
        c.slept();
        let t3 = t2 + CONTENTION_BACKOFF;
        c.spinning(t3, || Some(50));
        assert!(!c.contended(t3));
        c.spinning(t3 + CONTENTION_SAMPLE_INTERVAL, || None);
        assert!(!c.contended(t3 + CONTENTION_SAMPLE_INTERVAL));
    }

    #[test]
    fn this_threads_switches_can_be_read() {
        assert!(thread_involuntary_switches().is_some());
    }
}
