//! CPU clocks: the whole process (getrusage, for the shutdown report) and
//! the calling thread (one read per worker loop batch, for tenant CPU
//! accounting and the worker report).

use std::time::Duration;

/// CPU time (user + system) of the whole process so far.
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the calling thread (one clock read: sample per batch, not per I/O).
pub fn thread_cpu() -> Duration {
    Duration::from_nanos(sluice_cpu::current_thread_cpu_ns())
}
