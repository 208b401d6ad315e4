//! Flint's isolation across volumes, without I/O (Flint §3, §4.5-4.6).
//!
//! Volumes of different tenants share drives, target ports and the clients'
//! network pipes. The target's per-tenant fair queuing sees one target at a
//! time; the mechanisms here see the whole system:
//!
//! * [`window`]: sliding-window counters (I/Os, bytes, latency) with an EWMA,
//!   the bookkeeping every view entity uses.
//! * [`view`]: the shadow view. Entities are a client's NetPipe, a target
//!   port (IOPipe) and a drive; the [`view::ViewController`] keeps a window
//!   and a recency counter per entity, takes batches of per-I/O samples from
//!   [`view::ViewAgent`]s, answers with the counters it changed (the agent
//!   learns whether its partial copy is stale), and each epoch runs the
//!   back-propagation bottleneck analysis (Algorithm 1, [`bottleneck`]).
//! * [`eio`]: the eIO scheduler (Algorithm 2): a PIFO per drive ranked by
//!   estimated cost, queueing time, allocated share and bottleneck reports,
//!   order kept within a stream, admission bounded by the bytes in flight.
//! * [`auction`]: the bandwidth auction (Algorithms 3-4): the arbiter's
//!   DRR with gang admission over NetPipe, IOPipe and drive, and the
//!   client's wallet of slices.
//!
//! * [`wire`]: the framing of the view's fast channel (`ViewSync` over a
//!   plain TCP stream instead of gRPC).
//!
//! Nothing here touches a socket, a file or a clock: time is passed in as
//! microseconds on the caller's monotonic clock.

pub mod auction;
pub mod bottleneck;
pub mod eio;
pub mod view;
pub mod window;
pub mod wire;

pub use auction::{Arbiter, AuctionConfig, Wallet, WalletConfig};
pub use bottleneck::{BottleneckReport, Session};
pub use eio::{EioConfig, EioScheduler, IoKind, StreamId};
pub use view::{
    Entity, IoSample, TargetAgent, TargetCounters, ViewAgent, ViewController, ViewControllerConfig,
};
pub use window::{Window, WindowStats};
