//! The worker's timerfd: epoll sleeps in whole milliseconds, so interrupt
//! and adaptive modes arm a CLOCK_MONOTONIC timerfd for precise wake-ups.

use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};
use std::io;
use std::time::{Duration, Instant};

/// The worker's timerfd token (precise sleeps in interrupt and adaptive modes).
pub(super) const TIMER: Token = Token(3);

/// A non-blocking CLOCK_MONOTONIC timerfd, armed with relative times.
#[derive(Debug)]
pub(super) struct TimerFd {
    fd: std::os::fd::OwnedFd,
    armed: Option<Instant>,
}

impl TimerFd {
    pub(super) fn new(poll: &Poll) -> io::Result<TimerFd> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain syscall; the returned fd is owned below.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        poll.registry()
            .register(&mut SourceFd(&fd.as_raw_fd()), TIMER, Interest::READABLE)?;
        Ok(TimerFd { fd, armed: None })
    }

    /// Arms the timer to fire `after` from now (re-arming replaces it).
    pub(super) fn arm(&mut self, at: Instant, after: Duration) {
        use std::os::fd::AsRawFd;
        if self.armed == Some(at) {
            return;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                // A zero value would disarm: fire after at least 1 ns.
                tv_nsec: (after
                    .subsec_nanos()
                    .max(if after.as_secs() == 0 { 1 } else { 0 }))
                    as libc::c_long,
            },
        };
        // SAFETY: valid fd and itimerspec; the old value is not needed.
        if unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) }
            == 0
        {
            self.armed = Some(at);
        }
    }

    /// Clears the expiration count after the timer fired.
    pub(super) fn drain(&mut self) {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 8];
        // SAFETY: reading 8 bytes into a valid buffer from our fd.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        self.armed = None;
    }
}
