//! [`EventFd`]: a counter file descriptor that one side makes readable and
//! an event loop (epoll, or io_uring's completion notification) waits on.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::event::{eventfd, EventfdFlags};

/// A non-blocking, close-on-exec eventfd.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        Ok(EventFd {
            fd: eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?,
        })
    }

    /// Makes the eventfd readable. A full counter (2^64 − 2 signals not
    /// drained) leaves it readable anyway, so the error is not reported.
    pub fn signal(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Resets the counter; a no-op when it is not readable (EAGAIN).
    pub fn drain(&self) {
        let mut value = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut value);
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags};
    use rustix::time::Timespec;

    /// Whether the eventfd is readable now (poll without waiting).
    fn readable(e: &EventFd) -> bool {
        let mut fds = [PollFd::new(e, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        poll(&mut fds, Some(&zero)).expect("poll");
        fds[0].revents().contains(PollFlags::IN)
    }

    #[test]
    fn signal_makes_it_readable_and_drain_resets_it() {
        let e = EventFd::new().expect("eventfd");
        assert!(!readable(&e), "a new eventfd is idle");
        e.signal();
        e.signal();
        assert!(readable(&e));
        e.drain();
        assert!(!readable(&e), "drained");
        e.drain(); // EAGAIN: a no-op
        assert!(!readable(&e));
    }
}
