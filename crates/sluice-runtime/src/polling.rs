//! How an event loop waits when a turn made no progress: the one polling
//! policy of target worker threads and host queue threads.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Spin time of `adaptive` when none is given.
pub const ADAPTIVE_SPIN_US_DEFAULT: u32 = 50;
/// Longest adaptive spin accepted (1 s): past that, use `busy-poll`.
pub const ADAPTIVE_SPIN_US_MAX: u32 = 1_000_000;

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
        assert_eq!(
            PollingPolicy::Adaptive { spin_us: 0 }.wait(us(0)),
            Wait::Sleep
        );
    }
}
