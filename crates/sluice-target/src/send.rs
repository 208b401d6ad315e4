//! The send path of one queue: a scheduler, not a `write` call.
//!
//! The schedulers (`immediate`, `unified`, `isolated`), the response
//! coalescing wrapper and their counters live in [`sluice_proto::send`], so
//! the host's send path uses the same code (docs/isolation.md). This module
//! re-exports them under their historical path.

pub use sluice_proto::send::*;
