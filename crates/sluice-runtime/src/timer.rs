//! Precise sleeps for event loops. epoll sleeps in whole milliseconds, far
//! too coarse for freight and coalescing timers of tens of microseconds, so
//! a loop registers a [`Sleeper`]: a non-blocking `CLOCK_MONOTONIC` timerfd
//! in its `mio::Poll`, armed for the loop's nearest deadline. Deadlines
//! closer than [`SPIN_BELOW`] are met by polling without sleeping, since a
//! wake-up costs more than that here.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

use crate::polling::{PollingPolicy, Wait};

/// Deadlines nearer than this are met by polling without sleeping.
pub const SPIN_BELOW: Duration = Duration::from_micros(100);
/// Without a timerfd, deadlines nearer than this are met by polling (epoll
/// would round them up to a whole millisecond).
const SPIN_BELOW_WITHOUT_TIMER: Duration = Duration::from_millis(1);

/// A loop's precise timer and its wait decision.
#[derive(Debug)]
pub struct Sleeper {
    timer: Option<TimerFd>,
    token: Token,
}

impl Sleeper {
    /// Registers a timerfd under `token`. Without one (a kernel that refuses
    /// timerfds) the sleeper still works, with millisecond sleeps; the error
    /// is returned beside it so the caller can log it once.
    pub fn new(registry: &Registry, token: Token) -> (Sleeper, Option<io::Error>) {
        match TimerFd::new(registry, token) {
            Ok(t) => (
                Sleeper {
                    timer: Some(t),
                    token,
                },
                None,
            ),
            Err(e) => (Sleeper { timer: None, token }, Some(e)),
        }
    }

    /// A sleeper with no timerfd (millisecond sleeps); for loops that have
    /// no `mio::Poll`, and tests.
    pub fn without_timer() -> Sleeper {
        Sleeper {
            timer: None,
            token: Token(usize::MAX),
        }
    }

    /// The token the timer fires under.
    pub fn token(&self) -> Token {
        self.token
    }

    /// The epoll timeout for this turn of a loop that made no progress:
    /// `Some(ZERO)` polls without sleeping (spin), `None` sleeps until an
    /// event (the timer, armed for `deadline`, is one), `Some(d)` sleeps at
    /// most `d`. `idle_for` is the time since the loop's last progress.
    pub fn timeout(
        &mut self,
        policy: PollingPolicy,
        now: Instant,
        idle_for: Duration,
        deadline: Option<Instant>,
    ) -> Option<Duration> {
        if policy.wait(idle_for) == Wait::Spin {
            return Some(Duration::ZERO);
        }
        let deadline = deadline?;
        let until = deadline.saturating_duration_since(now);
        match self.timer.as_mut() {
            _ if until < SPIN_BELOW => Some(Duration::ZERO),
            Some(timer) => {
                timer.arm(deadline, until);
                None
            }
            None if until < SPIN_BELOW_WITHOUT_TIMER => Some(Duration::ZERO),
            None => Some(until),
        }
    }

    /// Handles the timer's event (`token` is the event's token); true when
    /// it was the timer's.
    pub fn handle_event(&mut self, token: Token) -> bool {
        if token != self.token {
            return false;
        }
        if let Some(t) = self.timer.as_mut() {
            t.drain();
        }
        true
    }
}

/// A non-blocking `CLOCK_MONOTONIC` timerfd armed with relative times.
#[derive(Debug)]
struct TimerFd {
    fd: OwnedFd,
    armed: Option<Instant>,
}

impl TimerFd {
    fn new(registry: &Registry, token: Token) -> io::Result<TimerFd> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(TimerFd { fd, armed: None })
    }

    /// Arms the timer for `at`, which is `after` from now (re-arming
    /// replaces the previous expiry; arming for the same `at` is free).
    fn arm(&mut self, at: Instant, after: Duration) {
        if self.armed == Some(at) {
            return;
        }
        // A zero value would disarm the timer: fire after at least 1 ns.
        let after = after.max(Duration::from_nanos(1));
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: after.as_secs().try_into().unwrap_or(i64::MAX),
                tv_nsec: after.subsec_nanos().into(),
            },
        };
        if timerfd_settime(&self.fd, TimerfdTimerFlags::empty(), &spec).is_ok() {
            self.armed = Some(at);
        }
    }

    /// Clears the expiration count after the timer fired.
    fn drain(&mut self) {
        let mut buf = [0u8; 8];
        // EAGAIN (a spurious wake-up) leaves nothing to clear.
        let _ = rustix::io::read(&self.fd, &mut buf);
        self.armed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};

    const TIMER: Token = Token(7);

    #[test]
    fn spin_policy_and_near_deadlines_never_sleep() {
        let poll = Poll::new().expect("epoll");
        let (mut s, err) = Sleeper::new(poll.registry(), TIMER);
        assert!(err.is_none());
        let now = Instant::now();
        let idle = Duration::from_secs(1);
        assert_eq!(
            s.timeout(PollingPolicy::BusyPoll, now, idle, None),
            Some(Duration::ZERO)
        );
        let near = Some(now + Duration::from_micros(50));
        assert_eq!(
            s.timeout(PollingPolicy::Interrupt, now, idle, near),
            Some(Duration::ZERO)
        );
        assert_eq!(s.timeout(PollingPolicy::Interrupt, now, idle, None), None);
        let a = PollingPolicy::Adaptive { spin_us: 50 };
        assert_eq!(
            s.timeout(a, now, Duration::from_micros(10), None),
            Some(Duration::ZERO)
        );
        assert_eq!(s.timeout(a, now, idle, None), None);
    }

    #[test]
    fn the_timerfd_wakes_epoll_on_time_for_a_sub_millisecond_deadline() {
        let mut poll = Poll::new().expect("epoll");
        let (mut s, _) = Sleeper::new(poll.registry(), TIMER);
        let mut events = Events::with_capacity(4);
        let start = Instant::now();
        let deadline = start + Duration::from_micros(300);
        let t = s.timeout(
            PollingPolicy::Interrupt,
            start,
            Duration::from_secs(1),
            Some(deadline),
        );
        assert_eq!(t, None, "a 300 µs deadline sleeps on the timer");
        // A safety cap, so a broken timer fails the test instead of hanging.
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .expect("poll");
        let woke = Instant::now();
        let ev = events.iter().next().expect("an event before the 5 s cap");
        assert!(s.handle_event(ev.token()));
        assert!(woke >= deadline, "woke before the deadline");
        // Drained: a poll without sleeping finds nothing more.
        poll.poll(&mut events, Some(Duration::ZERO)).expect("poll");
        assert!(events.is_empty(), "timer drained");
        assert!(!s.handle_event(Token(1)));
    }

    #[test]
    fn without_a_timer_millisecond_deadlines_sleep_and_shorter_ones_spin() {
        let mut s = Sleeper::without_timer();
        let now = Instant::now();
        let idle = Duration::from_secs(1);
        let p = PollingPolicy::Interrupt;
        assert_eq!(
            s.timeout(p, now, idle, Some(now + Duration::from_micros(500))),
            Some(Duration::ZERO)
        );
        assert_eq!(
            s.timeout(p, now, idle, Some(now + Duration::from_millis(5))),
            Some(Duration::from_millis(5))
        );
    }
}
