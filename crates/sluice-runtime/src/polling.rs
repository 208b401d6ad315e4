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

/// How often a spinning loop reads how long it has waited to run.
pub const CONTENTION_SAMPLE_INTERVAL: Duration = Duration::from_millis(1);
/// A spinning loop is contended when the share of time it waited to run
/// (runnable, another task on its core), averaged over its readings, is
/// above this, in thousandths.
pub const CONTENTION_WAITED_PERMILLE_MAX: u64 = 125;
/// Each reading's share moves the average this fraction of the way (1/16):
/// a kernel thread that takes the core once for a few milliseconds (DAMON's
/// `kdamond`, RCU) leaves it well under the limit; a process that needs
/// the core half the time crosses it in five readings.
pub const CONTENTION_AVERAGE_WEIGHT_SHIFT: u32 = 4;
/// How long a loop that saw one backs off its long spin.
pub const CONTENTION_BACKOFF: Duration = Duration::from_millis(100);

/// Whether an adaptive host's long spin ([`PollingPolicy::while_outstanding`])
/// takes CPU that another task is waiting for. While it spins, the loop
/// reads the time its thread has waited to run (the scheduler's run delay:
/// runnable, but another task had the core) at most every
/// [`CONTENTION_SAMPLE_INTERVAL`]; when the share of the time between two
/// readings that it waited, averaged over the readings, is over
/// [`CONTENTION_WAITED_PERMILLE_MAX`], it keeps to the base spin for
/// [`CONTENTION_BACKOFF`].
///
/// Measured: with hosts and targets sharing 2 cores (Fig. 7c of the
/// volumes lab, up to 4 targets), the 1 ms spin took the targets' CPU and
/// the figure fell from 0.89 / 0.87 to 0.76 / 0.68 at N = 4 / 8; a pair on
/// dedicated cores lost 3-15 % when the spin yielded instead. The first
/// version counted involuntary context switches and backed off at any
/// rise; but a spinner on a core of its own is preempted a few hundred
/// times a second for microseconds (RCU, softirq threads, the process's
/// other threads) and now and then for milliseconds (`kdamond`), so
/// `sluice bench` against nvmf_tgt saw contention all the time and lost
/// 28 % of its 128 KiB read bandwidth to sleeps between bursts of
/// completions. Time and the reading are passed in:
/// [`ThreadRunDelay`] is the reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpinContention {
    sampled_at: Option<Instant>,
    /// The run delay at `sampled_at`.
    waited: Duration,
    /// The average share of time waited, in millionths (fine enough that
    /// the shifts of the average do not stall it above zero).
    waited_ppm: u64,
    contended_until: Option<Instant>,
    /// Back-offs started (a reading over the limit while not backed off).
    seen: u64,
}

impl SpinContention {
    /// The loop spins at `now`: reads its run delay (with `read`) if the
    /// last reading is [`CONTENTION_SAMPLE_INTERVAL`] old, and backs off
    /// if the average share of time it waited is over the limit.
    pub fn spinning(&mut self, now: Instant, read: impl FnOnce() -> Option<Duration>) {
        if self
            .sampled_at
            .is_some_and(|t| now.saturating_duration_since(t) < CONTENTION_SAMPLE_INTERVAL)
        {
            return;
        }
        let Some(waited) = read() else { return };
        if let Some(t) = self.sampled_at {
            let window_ns = now.saturating_duration_since(t).as_nanos().max(1);
            let grew_ns = waited.saturating_sub(self.waited).as_nanos();
            let share_ppm = u64::try_from((grew_ns * 1_000_000 / window_ns).min(1_000_000))
                .unwrap_or(1_000_000);
            let avg = self.waited_ppm;
            self.waited_ppm = avg - (avg >> CONTENTION_AVERAGE_WEIGHT_SHIFT)
                + (share_ppm >> CONTENTION_AVERAGE_WEIGHT_SHIFT);
            if self.waited_ppm > CONTENTION_WAITED_PERMILLE_MAX * 1000 {
                if !self.contended(now) {
                    self.seen += 1;
                }
                self.contended_until = Some(now + CONTENTION_BACKOFF);
            }
        }
        self.sampled_at = Some(now);
        self.waited = waited;
    }

    /// The loop slept: the next spin starts a new reading (a wait to run
    /// after a wake-up is not its spin's doing).
    pub fn slept(&mut self) {
        self.sampled_at = None;
    }

    pub fn contended(&self, now: Instant) -> bool {
        self.contended_until.is_some_and(|u| now < u)
    }

    /// Back-offs started so far (a reading that extends a back-off is not
    /// a new one).
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

/// The time the thread that made it has spent runnable but not running
/// (the second field of `/proc/thread-self/schedstat`), read through a
/// descriptor opened once: make it on the thread it is to measure. Reads
/// `None` where the kernel does not keep the figure (no
/// `CONFIG_SCHED_INFO`); a [`SpinContention`] then never backs off.
#[derive(Debug)]
pub struct ThreadRunDelay {
    file: Option<std::fs::File>,
}

impl ThreadRunDelay {
    /// The calling thread's.
    pub fn of_this_thread() -> ThreadRunDelay {
        ThreadRunDelay {
            file: std::fs::File::open("/proc/thread-self/schedstat").ok(),
        }
    }

    /// The run delay so far (one `pread`).
    pub fn read(&self) -> Option<Duration> {
        use std::os::unix::fs::FileExt;
        let file = self.file.as_ref()?;
        // Three decimal u64s and spaces: at most 62 bytes.
        let mut buf = [0u8; 96];
        let n = file.read_at(&mut buf, 0).ok()?;
        parse_run_delay(buf.get(..n)?)
    }
}

/// The run delay in a schedstat line (`<on-cpu ns> <waited ns> <slices>`).
fn parse_run_delay(line: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(line).ok()?;
    let ns: u64 = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
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
    fn waiting_to_run_for_a_share_of_the_time_backs_the_long_spin_off() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        let a = PollingPolicy::ADAPTIVE;
        let long = a.while_outstanding(true);
        let mut c = SpinContention::default();
        let mut waited = ms(10);
        // The first reading is a baseline.
        c.spinning(t0, || Some(waited));
        assert_eq!(c.policy(a, true, t0), long);
        // Within the sample interval nothing is read.
        c.spinning(t0 + us(50), || panic!("read too soon"));
        // Preempted for microseconds at every reading (housekeeping): never
        // contended.
        let mut t = t0;
        for _ in 0..100 {
            t += CONTENTION_SAMPLE_INTERVAL;
            waited += us(30);
            c.spinning(t, || Some(waited));
            assert!(!c.contended(t));
        }
        // One kernel thread that took the core for 3 ms: not contended.
        t += ms(4);
        waited += ms(3);
        c.spinning(t, || Some(waited));
        assert!(!c.contended(t));
        assert_eq!(c.seen(), 0);
        for _ in 0..50 {
            t += CONTENTION_SAMPLE_INTERVAL;
            c.spinning(t, || Some(waited));
        }
        // A process that takes half the core: contended from the fifth
        // reading; the base spin for the backoff, then the long one again.
        for i in 1..=5 {
            t += CONTENTION_SAMPLE_INTERVAL;
            waited += CONTENTION_SAMPLE_INTERVAL / 2;
            c.spinning(t, || Some(waited));
            assert_eq!(c.contended(t), i == 5, "reading {i}");
        }
        assert_eq!(c.seen(), 1);
        // Still over the limit: the back-off is extended, not a new one.
        t += CONTENTION_SAMPLE_INTERVAL;
        waited += CONTENTION_SAMPLE_INTERVAL / 2;
        c.spinning(t, || Some(waited));
        assert!(c.contended(t));
        assert_eq!(c.seen(), 1);
        assert_eq!(c.policy(a, true, t), a);
        assert_eq!(c.policy(a, true, t + CONTENTION_BACKOFF), long);
        // Other policies are what while_outstanding makes them.
        assert_eq!(
            c.policy(PollingPolicy::BusyPoll, true, t),
            PollingPolicy::BusyPoll
        );
        // A wait while it slept is not counted on the next spin.
        c.slept();
        t += CONTENTION_BACKOFF;
        waited += ms(50);
        c.spinning(t, || Some(waited));
        assert!(!c.contended(t));
        assert_eq!(c.seen(), 1);
        // No reading: nothing changes.
        c.spinning(t + CONTENTION_SAMPLE_INTERVAL, || None);
        assert!(!c.contended(t + CONTENTION_SAMPLE_INTERVAL));
    }

    #[test]
    fn a_steady_share_is_contended_only_above_the_limit() {
        let limit = CONTENTION_WAITED_PERMILLE_MAX;
        for (permille, contended) in [(limit - 5, false), (limit + 5, true)] {
            let mut c = SpinContention::default();
            let (mut t, mut waited) = (Instant::now(), Duration::ZERO);
            c.spinning(t, || Some(waited));
            for _ in 0..500 {
                t += CONTENTION_SAMPLE_INTERVAL;
                waited += Duration::from_micros(permille);
                c.spinning(t, || Some(waited));
            }
            assert_eq!(c.contended(t), contended, "{permille} per mille");
        }
    }

    #[test]
    fn a_schedstat_line_gives_its_second_field() {
        assert_eq!(
            parse_run_delay(b"227679933 5448800 88\n"),
            Some(Duration::from_nanos(5_448_800))
        );
        assert_eq!(parse_run_delay(b"227679933"), None);
        assert_eq!(parse_run_delay(b"1 x 3"), None);
        assert_eq!(parse_run_delay(b""), None);
        assert_eq!(parse_run_delay(&[0xff, b' ', b'1']), None);
    }

    #[test]
    fn this_threads_run_delay_is_read_and_never_falls() {
        let r = ThreadRunDelay::of_this_thread();
        let a = r.read().expect("Linux keeps schedstat");
        // Another thread's reading of it stays this thread's.
        let b = std::thread::scope(|s| s.spawn(|| r.read()).join().unwrap())
            .expect("readable from another thread");
        assert!(b >= a);
    }
}
