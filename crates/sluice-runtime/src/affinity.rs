//! CPU affinity of the calling thread. Threads inherit the affinity of the
//! thread that starts them (which is how `taskset` pins a whole process), so
//! a thread that must run elsewhere, such as the wire floor's echo server
//! standing in for the target on its own core, pins itself after it starts.

pub use rustix::thread::CpuSet;
use rustix::thread::{sched_getaffinity, sched_setaffinity, Pid};

/// Pins the calling thread to `cpu`. Errors (an offline CPU, one outside the
/// cgroup's cpuset, one past [`CpuSet::MAX_CPU`]) name the CPU.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    pin_thread(0, cpu)
}

/// Pins thread `tid` of this process (0: the calling thread) to `cpu`.
pub fn pin_thread(tid: i32, cpu: usize) -> std::io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "cpu {cpu} is past the largest CPU id {}",
                CpuSet::MAX_CPU - 1
            ),
        ));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(Pid::from_raw(tid), &set).map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("sched_setaffinity(thread {tid}, cpu {cpu}): {e}"),
        )
    })
}

/// The calling thread's affinity mask (to restore with [`set_current_mask`]).
pub fn current_mask() -> std::io::Result<CpuSet> {
    Ok(sched_getaffinity(None)?)
}

/// Sets the calling thread's affinity mask.
pub fn set_current_mask(set: &CpuSet) -> std::io::Result<()> {
    Ok(sched_setaffinity(None, set)?)
}

/// The CPUs the calling thread may run on, in ascending order.
pub fn current_thread_cpus() -> std::io::Result<Vec<usize>> {
    let set = sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_a_thread_to_one_of_its_cpus() {
        let cpus = current_thread_cpus().expect("affinity");
        let last = *cpus.last().expect("at least one CPU");
        let got = std::thread::spawn(move || {
            pin_current_thread(last).expect("pin");
            current_thread_cpus().expect("affinity")
        })
        .join()
        .expect("thread");
        assert_eq!(got, vec![last]);
        // The spawning thread keeps its own mask.
        assert_eq!(current_thread_cpus().expect("affinity"), cpus);
    }

    #[test]
    fn out_of_range_cpu_is_an_error_naming_it() {
        let e = std::thread::spawn(|| pin_current_thread(CpuSet::MAX_CPU + 3))
            .join()
            .expect("thread")
            .expect_err("must fail");
        assert!(
            e.to_string().contains(&format!("{}", CpuSet::MAX_CPU + 3)),
            "{e}"
        );
    }
}
