//! Limits shared by every event loop (TIGER_STYLE: a limit on everything).

/// Most worker threads a target (or any Sluice event-loop pool) runs.
pub const WORKERS_MAX: usize = 64;
