//! Sans-IO NVMe/TCP protocol for Sluice.
//!
//! This crate knows the bytes on the wire and nothing else: it never touches a
//! socket, a clock or a thread. The target and the host drive it.
//!
//! * [`pdu`]: the nine NVMe/TCP PDU types, strict header validation, and the
//!   mapping of every decode error to the TermReq fatal error status (FES).
//! * [`framer`]: a streaming receiver that turns a byte stream into whole PDUs,
//!   checking PLEN/HLEN/PDO, padding and CRC32C digests.
//! * [`command`]: the 64-byte submission queue entry and the 16-byte
//!   completion queue entry, opcodes and SGL descriptors.
//! * [`dsm`]: Dataset Management fields and its range list (a decoder that
//!   returns errors, never panics, on short data).
//! * [`status`]: NVMe status codes with readable names.
//! * [`fabrics`]: Connect, Property Get/Set, Disconnect, controller properties.
//! * [`identify`]: Identify Controller/Namespace, active namespace list and
//!   namespace identification descriptors.
//! * [`log`]: log pages (error, SMART, firmware slot, commands supported and
//!   effects, changed namespace list) and the discovery log page.
//! * [`digest`]: CRC32C as NVMe/TCP uses it.
//! * [`coalesce`]: completion coalescing (static, adaptive, calibrated).
//! * [`fence`]: chain-epoch fences, Sluice's vendor extension for elastic
//!   volumes (the Fence admin command, the epoch a write carries).
//! * [`reservation`]: reservations (Register, Acquire, Release, Report),
//!   the Reservation Status data and the Reservation Notification log page.
//! * [`send`]: per-queue send schedulers (immediate, unified, isolated
//!   freights), shared by the target and the host.
//! * [`outbuf`]: the schedulers' byte buffers, where bulk data can be an
//!   attachment sent from its own buffer (vectored) instead of a copy.

pub mod coalesce;
pub mod command;
pub mod digest;
pub mod dsm;
pub mod fabrics;
pub mod fence;
pub mod framer;
pub mod identify;
pub mod log;
pub mod outbuf;
pub mod pdu;
pub mod reservation;
pub mod send;
pub mod status;
mod wire;

pub use command::{Cqe, Sqe};
pub use status::Status;

/// Well-known NQN of the discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// IANA port of the NVMe/TCP discovery service.
pub const DISCOVERY_PORT: u16 = 8009;
/// Default NVMe/TCP I/O port.
pub const DEFAULT_PORT: u16 = 4420;
/// Longest NQN in bytes (the NQN fields are 256 bytes, NUL terminated).
pub const NQN_LEN_MAX: usize = 223;
