//! CPU affinity of the calling thread (or of a thread by id). Threads
//! inherit the affinity of the thread that starts them, which is what
//! `taskset` does for a process.

use anyhow::{bail, Result};

/// Pins thread `tid` (0: the calling thread) to `cpu`.
pub fn pin(tid: i32, cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; the libc macros write into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "sched_setaffinity({tid}, cpu {cpu}): {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// The calling thread's affinity mask.
pub fn get_mask() -> Result<libc::cpu_set_t> {
    // SAFETY: sched_getaffinity fills the zeroed set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
        }
        Ok(set)
    }
}

/// Restores a mask from [`get_mask`] on the calling thread.
pub fn set_mask(set: &libc::cpu_set_t) -> Result<()> {
    // SAFETY: a valid cpu_set_t; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// CPUs online (not the affinity of the calling thread).
pub fn cpus() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    // -1 on error: at least one CPU.
    usize::try_from(n).unwrap_or(0).max(1)
}
