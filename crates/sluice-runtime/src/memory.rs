//! Process memory: the resident set size as the kernel reports it (all
//! of it, and its anonymous part), and handing heap memory the program has
//! freed back to the kernel.
//!
//! glibc's malloc keeps freed small and medium chunks in its arenas for
//! reuse, and raises its mmap threshold past every large block freed, so
//! after a wave of short-lived connections the process can keep their
//! memory resident for good although nothing uses it. [`release_free_memory`]
//! (`malloc_trim(0)`) gives every whole free page of every arena back; a
//! caller does it after a drop in load, never per request (it locks each
//! arena in turn). On other C libraries it does nothing.

/// The resident set size (`VmRSS` of `/proc/self/status`), in bytes;
/// `None` where there is no procfs or the line is missing.
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kib(&s, "VmRSS:")
}

/// The anonymous part of the resident set (`RssAnon`): the heap, stacks
/// and anonymous mappings, without the executable's and libraries' pages
/// (`RssFile`), which come and go with what code has run and with the page
/// cache's pressure, not with what the program allocated.
pub fn resident_anon_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kib(&s, "RssAnon:")
}

/// `KEY   1234 kB` → bytes.
fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// Returns freed heap memory to the kernel (`malloc_trim(0)` on glibc);
/// whether anything was released (always `false` elsewhere).
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim has no preconditions; it takes each arena's
        // lock like any allocation does.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_vm_rss_in_bytes() {
        let s = "Name:\tx\nVmPeak:\t  100 kB\nVmRSS:\t    7560 kB\nRssAnon:\t     804 kB\nThreads:\t3\n";
        assert_eq!(parse_status_kib(s, "VmRSS:"), Some(7560 * 1024));
        assert_eq!(parse_status_kib(s, "RssAnon:"), Some(804 * 1024));
        assert_eq!(parse_status_kib("VmRSS:\t12 MB\n", "VmRSS:"), None);
        assert_eq!(parse_status_kib("VmSize:\t12 kB\n", "VmRSS:"), None);
        let (all, anon) = (resident_bytes().unwrap(), resident_anon_bytes().unwrap());
        assert!(anon > 0 && anon <= all, "{anon} of {all}");
    }
}
