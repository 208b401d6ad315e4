//! The runtime toolkit that the target, the host library, `sluice bench` and
//! the exports share, so each side waits, sleeps and measures CPU the same
//! way:
//!
//! - `polling`: [`PollingPolicy`] (interrupt / busy-poll / adaptive), one
//!   type with one spelling on both sides, and the sans-IO decision of how a
//!   loop with nothing to do waits ([`PollingPolicy::wait`]).
//! - `timer`: [`Sleeper`], which meets sub-millisecond deadlines with a
//!   timerfd registered in the loop's `mio::Poll` (epoll itself sleeps in
//!   whole milliseconds) and spins only for the last few microseconds.
//! - [`clock`]: thread and process CPU clocks and the caller's TID.
//! - [`limits`]: the limits every loop shares (worker threads).
//! - [`memory`]: the resident set size, and giving freed heap memory back
//!   to the kernel after a drop in load (`malloc_trim` on glibc).
//! - [`affinity`]: pinning the calling thread to a CPU.
//! - [`net`]: a TCP socket's congestion control algorithm
//!   (`TCP_CONGESTION`), checked, set and read.
//! - [`cast`]: `u64` → `usize` without loss (64-bit targets only), and
//!   durations in saturating nanoseconds.
//! - [`sync`]: locking std mutexes and rwlocks without poison recovery (a
//!   panic is a bug; see the module for the decision).
//!
//! Syscalls go through `rustix`; `libc` remains only for the per-thread CPU
//! clock of *another* thread, `getrusage` and `malloc_trim`, which rustix
//! does not expose.

pub mod affinity;
pub mod cast;
pub mod clock;
pub mod limits;
pub mod memory;
pub mod net;
pub mod notify;
pub mod polling;
pub mod sync;
mod timer;

pub use polling::{IdleGaps, PollingPolicy, SpinContention, Wait};
pub use timer::Sleeper;
