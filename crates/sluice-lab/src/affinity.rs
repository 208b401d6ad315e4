//! CPU affinity for the experiments: the runtime's helpers with `anyhow`
//! context, plus the number of CPUs online. Threads inherit the affinity
//! of the thread that starts them, which is what `taskset` does for a
//! process.

use anyhow::{Context, Result};
use sluice_runtime::affinity::{self, CpuSet};

/// Pins thread `tid` (0: the calling thread) to `cpu`.
pub fn pin(tid: i32, cpu: usize) -> Result<()> {
    affinity::pin_thread(tid, cpu).with_context(|| format!("pinning thread {tid} to cpu {cpu}"))
}

/// The calling thread's affinity mask.
pub fn get_mask() -> Result<CpuSet> {
    affinity::current_mask().context("reading the calling thread's affinity")
}

/// Restores a mask from [`get_mask`] on the calling thread.
pub fn set_mask(set: &CpuSet) -> Result<()> {
    affinity::set_current_mask(set).context("restoring the calling thread's affinity")
}

/// CPUs online (not the affinity of the calling thread).
pub fn cpus() -> usize {
    // SAFETY: sysconf has no memory effects (rustix does not wrap it).
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    // -1 on error: at least one CPU.
    usize::try_from(n).unwrap_or(0).max(1)
}
