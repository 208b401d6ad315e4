//! CPU clocks. A loop reads its thread clock once per batch, never per I/O:
//! one `CLOCK_THREAD_CPUTIME_ID` read costs ~0.4 µs here (vDSO does not serve
//! CPU clocks).

use std::time::Duration;

use rustix::time::{clock_gettime, ClockId, Timespec};

fn nanos(ts: Timespec) -> u64 {
    timespec_ns(ts.tv_sec, ts.tv_nsec)
}

/// Seconds and nanoseconds as ns, negative parts read as zero.
fn timespec_ns(sec: i64, nsec: i64) -> u64 {
    u64::try_from(sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(nsec).unwrap_or(0)
}

/// CPU time the calling thread has used, in ns.
pub fn current_thread_cpu_ns() -> u64 {
    nanos(clock_gettime(ClockId::ThreadCPUTime))
}

/// CPU time the calling thread has used.
pub fn thread_cpu() -> Duration {
    Duration::from_nanos(current_thread_cpu_ns())
}

/// CPU time (user + system) of the whole process so far.
pub fn process_cpu() -> Duration {
    Duration::from_nanos(nanos(clock_gettime(ClockId::ProcessCPUTime)))
}

/// User and system CPU time of the whole process so far (`getrusage`,
/// which rustix does not wrap); zero if the call fails.
pub fn process_cpu_split() -> (Duration, Duration) {
    // SAFETY: an all-zero rusage is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to an owned rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let tv = |t: libc::timeval| {
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_usec.clamp(0, 999_999)).unwrap_or(0) * 1000,
        )
    };
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// The calling thread's TID.
pub fn current_tid() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// CPU time of thread `tid` of this process, in ns; `None` once it has
/// exited. Uses the thread's own CPU clock
/// (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`), which rustix has no
/// constructor for.
pub fn thread_cpu_ns(tid: i32) -> Option<u64> {
    // Linux: ((~tid) << 3) | CPUCLOCK_PERTHREAD_MASK (4) | CPUCLOCK_SCHED (2).
    let clock = ((!(tid as libc::clockid_t)) << 3) | 6;
    // SAFETY: an all-zero timespec is valid.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; an unknown clock id only returns EINVAL.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(timespec_ns(ts.tv_sec, ts.tv_nsec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn burn(ns: u64) {
        let start = current_thread_cpu_ns();
        let mut x = 0u64;
        while current_thread_cpu_ns() - start < ns {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
    }

    #[test]
    fn own_thread_clock_matches_the_clock_by_tid_and_advances() {
        let tid = current_tid();
        assert!(tid > 0);
        let a = current_thread_cpu_ns();
        let by_tid = thread_cpu_ns(tid).expect("own thread clock readable by tid");
        burn(2_000_000);
        let b = current_thread_cpu_ns();
        assert!(b - a >= 2_000_000, "thread clock advanced by {} ns", b - a);
        assert!(
            by_tid >= a,
            "clock by tid {by_tid} behind the own clock {a}"
        );
        assert!(process_cpu() >= Duration::from_nanos(b - a));
        let (user, system) = process_cpu_split();
        assert!(user + system > Duration::ZERO);
    }

    #[test]
    fn a_thread_that_exited_has_no_clock() {
        let tid = std::thread::spawn(current_tid).join().expect("thread ran");
        // `join` returns when the thread's function has returned, which can
        // be a moment before the kernel retires the task (seen under load),
        // so allow it a second. The TID may be reused in theory, but not
        // this fast in a test.
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while thread_cpu_ns(tid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(thread_cpu_ns(tid), None);
    }
}
