//! The send path of one queue: a scheduler, not a `write` call.
//!
//! The queue encodes each outgoing PDU straight into a buffer the scheduler
//! hands out for that PDU's [`PduClass`], then commits it. The scheduler
//! decides when committed bytes become due for the socket. [`Immediate`] makes
//! every PDU due at once (stock NVMe/TCP behaviour); batching and isolating
//! schedulers (PINoF freights, i10-style containers) plug in behind the same
//! trait, with `next_deadline` bounding how long any PDU may wait.
//!
//! Shared by the target (each `QueueConnection` sends through one) and the
//! host (`sluice_host::core`): on the target the latency freight takes R2T and
//! CapsuleResp and the data freight C2HData; on the host the latency
//! freight takes command capsules without data ([`PduClass::Command`], e.g.
//! reads) and the data freight writes with in-capsule data and H2CData
//! (both [`PduClass::Data`]).

use crate::coalesce::Hint;
use crate::coalesce::{CoalesceConfig, CoalesceMode, Coalescer, Decision, FireReason};
use crate::outbuf::{Attachment, OutBuf};
use std::io::IoSlice;
use std::time::{Duration, Instant};

/// What kind of PDU is being sent, for schedulers that treat them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PduClass {
    /// ICResp, TermReq: connection management.
    Control,
    /// R2T: unblocks a host's write data.
    R2t,
    /// CapsuleResp: completes a command.
    Response,
    /// Bulk data: C2HData (target), H2CData and write capsules with
    /// in-capsule data (host).
    Data,
    /// Host: a command capsule without data (reads, admin, writes whose data
    /// follows an R2T). Latency freight, weighted like a response.
    Command,
}

/// Why a container (freight) was flushed into the due bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReason {
    /// `immediate`: every PDU on its own.
    Immediate = 0,
    /// The next PDU did not fit (or one PDU filled the freight).
    Size = 1,
    /// The PDU count reached the degree.
    Degree = 2,
    /// The weighted count reached the degree before the raw count did
    /// (R2T/response weights).
    Priority = 3,
    /// The container's timer expired.
    Timer = 4,
    /// A control PDU (ICResp, TermReq) flushes everything before it.
    Control = 5,
    /// Completion coalescing: threshold reached.
    Threshold = 6,
    /// Completion coalescing: an urgent I/O completed.
    Urgent = 7,
    /// Completion coalescing: a barrier and everything before it completed.
    Barrier = 8,
    /// Completion coalescing: adaptive/static timeout or the hold bound.
    CoalesceTimer = 9,
    /// The queue went idle (nothing more to hand in for now) and the
    /// scheduler flushes when idle ([`SendConfig::flush_when_idle`]).
    Idle = 10,
    /// `immediate` with [`SendConfig::responses_after_data`]: a large
    /// read's CapsuleResp was held behind the due data (it joins them at
    /// their next write or at the end of the turn).
    AfterData = 11,
}

pub const FLUSH_REASONS: usize = 12;
pub const FLUSH_REASON_NAMES: [&str; FLUSH_REASONS] = [
    "immediate",
    "size",
    "degree",
    "priority",
    "timer",
    "control",
    "threshold",
    "urgent",
    "barrier",
    "coalesce-timer",
    "idle",
    "after-data",
];

/// Counters every scheduler keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// PDUs committed.
    pub pdus: u64,
    pub bytes: u64,
    /// Write calls that moved bytes (one per `consume` with n > 0).
    pub sends: u64,
    /// Containers flushed into the due bytes.
    pub flushes: u64,
    /// PDUs moved by those flushes (PDUs per flush = flush_pdus / flushes).
    pub flush_pdus: u64,
    /// Flushes by [`FlushReason`] (index = reason as usize).
    pub reasons: [u64; FLUSH_REASONS],
    /// Total time PDUs waited in the latency (or unified) container, ns.
    pub wait_ns_latency: u64,
    pub waited_latency: u64,
    /// Total time PDUs waited in the data container, ns.
    pub wait_ns_data: u64,
    pub waited_data: u64,
    /// Response deliveries (coalescer fires, or one per response when off).
    pub notifications: u64,
    /// CapsuleResps held by the coalescer, total ns.
    pub coalesce_held_ns: u64,
}

impl SendStats {
    pub fn reason(&self, r: FlushReason) -> u64 {
        self.reasons[r as usize]
    }
    /// Adds `o` into `self` (aggregating queues).
    pub fn add(&mut self, o: &SendStats) {
        self.pdus += o.pdus;
        self.bytes += o.bytes;
        self.sends += o.sends;
        self.flushes += o.flushes;
        self.flush_pdus += o.flush_pdus;
        for i in 0..FLUSH_REASONS {
            self.reasons[i] += o.reasons[i];
        }
        self.wait_ns_latency += o.wait_ns_latency;
        self.waited_latency += o.waited_latency;
        self.wait_ns_data += o.wait_ns_data;
        self.waited_data += o.waited_data;
        self.notifications += o.notifications;
        self.coalesce_held_ns += o.coalesce_held_ns;
    }
}

/// A per-queue send scheduler.
pub trait SendScheduler: Send + std::fmt::Debug {
    /// A buffer to append one encoded PDU of `class` to.
    fn buffer(&mut self, class: PduClass) -> &mut Vec<u8>;
    /// Marks the bytes appended since the last commit as one PDU.
    fn commit(&mut self, class: PduClass, now: Instant);
    /// Like `commit`, for a PDU that belongs to the command `cid`: PDUs of
    /// one command are never reordered (a C2HData stays ahead of its
    /// CapsuleResp), and a CapsuleResp completes the command for coalescing.
    fn commit_cmd(&mut self, class: PduClass, _cid: u16, now: Instant) {
        self.commit(class, now)
    }
    /// Adds `data` to the PDU being encoded in `buffer(class)`, after the
    /// bytes appended so far: it is sent from its own buffer by a vectored
    /// write, never copied into the send buffer. The default copies it.
    fn attach(&mut self, class: PduClass, data: Attachment) {
        self.buffer(class).extend_from_slice(data.as_slice());
    }
    /// A command started, with its completion hint (coalescing).
    fn command_started(&mut self, _cid: u16, _hint: Hint) {}
    /// The first contiguous run of bytes due for the socket (all of them
    /// unless PDUs carry attachments); empty only when nothing is due.
    fn due(&self) -> &[u8];
    /// The bytes due for the socket as runs, oldest first, into `out`;
    /// returns how many runs it filled (fewer than all when `out` is full).
    fn due_vectored<'a>(&'a self, out: &mut [IoSlice<'a>]) -> usize {
        match out.first_mut() {
            Some(o) if !self.due().is_empty() => {
                *o = IoSlice::new(self.due());
                1
            }
            _ => 0,
        }
    }
    /// How many bytes are due, all runs together.
    fn due_len(&self) -> usize {
        self.due().len()
    }
    /// A copy of every due byte (for a TermReq or a scheduler swap).
    fn due_copy(&self) -> Vec<u8> {
        self.due().to_vec()
    }
    /// Reports that the first `n` due bytes were written.
    fn consume(&mut self, n: usize);
    /// Moves PDUs whose trigger fired into the due bytes.
    fn poll(&mut self, now: Instant);
    /// The queue has nothing more to hand in for now: the target's worker
    /// has read all the input it will read this turn, the host's caller
    /// has submitted its batch. A scheduler that flushes when idle moves
    /// what its containers hold into the due bytes (the way Linux's
    /// nvme-tcp sends at the last request of a batch); others ignore it.
    fn idle(&mut self, _now: Instant) {}
    /// When `poll` must next run even without new PDUs.
    fn next_deadline(&self) -> Option<Instant>;
    /// Bytes committed but not yet written (back-pressure input).
    fn backlog_bytes(&self) -> usize;
    fn stats(&self) -> SendStats;
}

/// With [`Immediate::responses_after_data`], only a command whose data
/// went out in attachments this large has its CapsuleResp held: small
/// reads sent from the namespace's memory (4 KiB) complete as they always
/// did. Holding their responses too cost spdk_nvme_perf's 4 KiB reads
/// (stop 40: −11 %; 2026-12-06: a median of 0.88x over 6 rounds).
pub const HELD_RESPONSE_ATTACH_BYTES_MIN: usize = 16 * 1024;

/// Writes every PDU as soon as it exists; with
/// [`Immediate::responses_after_data`], the CapsuleResp of a command whose
/// data went out as a large attachment waits until the due bytes are next
/// written, and then follows all of them.
#[derive(Debug, Default)]
pub struct Immediate {
    out: OutBuf,
    /// End of the committed bytes of `out` (inline position).
    committed: usize,
    stats: SendStats,
    /// See [`Immediate::responses_after_data`].
    responses_after_data: bool,
    /// An attachment of at least [`HELD_RESPONSE_ATTACH_BYTES_MIN`] was
    /// added to the PDU being encoded.
    attaching: bool,
    /// The command of the last PDU committed, when that PDU was a Data PDU
    /// with a large attachment (`attaching`; its CapsuleResp, next, is
    /// held).
    attached_cid: Option<u16>,
    /// Held CapsuleResps, encoded, in commit order: one per completed
    /// command whose response the host has not been sent yet (bounded as
    /// the backlog is: `backlog_bytes` counts them), released at the next
    /// write (`consume`), `idle` or `poll`.
    held: Vec<u8>,
}

impl Immediate {
    pub fn new() -> Self {
        Immediate::default()
    }

    /// A CapsuleResp that completes a command whose data was just
    /// committed as an attachment (a large read sent from its own buffer)
    /// is held aside, and appended to the due bytes once some of those are
    /// written ([`SendScheduler::consume`]) or the queue goes idle
    /// ([`SendScheduler::idle`], the end of the worker's turn; `poll` too):
    /// the large reads of one turn then reach the host as their data, then
    /// all their completions, so a host that submits from its completions
    /// sends its next commands together. A response is held only behind
    /// due bytes, so a write, and with it the release, always comes. Every
    /// other PDU goes out in commit order.
    pub fn responses_after_data(mut self, on: bool) -> Self {
        self.responses_after_data = on;
        self
    }

    /// Appends the held CapsuleResps to the due bytes.
    fn release_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        debug_assert_eq!(
            self.out.inline_end(),
            self.committed,
            "a PDU is half encoded"
        );
        self.out.inline().extend_from_slice(&self.held);
        self.held.clear();
        self.committed = self.out.inline_end();
    }

    /// Holds the CapsuleResp just encoded (the bytes after `committed`).
    fn hold_response(&mut self) {
        let bytes = self.out.inline();
        let pdu_bytes = bytes.len() - self.committed;
        self.held.extend_from_slice(&bytes[self.committed..]);
        bytes.truncate(self.committed);
        self.stats.pdus += 1;
        self.stats.notifications += 1;
        self.stats.bytes += pdu_bytes as u64;
        self.stats.flushes += 1;
        self.stats.flush_pdus += 1;
        self.stats.reasons[FlushReason::AfterData as usize] += 1;
    }
}

impl SendScheduler for Immediate {
    fn buffer(&mut self, _class: PduClass) -> &mut Vec<u8> {
        self.out.inline()
    }

    fn attach(&mut self, _class: PduClass, data: Attachment) {
        self.stats.bytes += data.len() as u64;
        self.attaching |= data.len() >= HELD_RESPONSE_ATTACH_BYTES_MIN;
        self.out.attach(data);
    }

    fn commit_cmd(&mut self, class: PduClass, cid: u16, now: Instant) {
        if class == PduClass::Response && self.attached_cid == Some(cid) && !self.due().is_empty() {
            // Behind due bytes: their write releases it.
            self.attached_cid = None;
            self.hold_response();
            return;
        }
        let attached = class == PduClass::Data && self.attaching && self.responses_after_data;
        self.commit(class, now);
        if attached {
            self.attached_cid = Some(cid);
        }
    }

    fn idle(&mut self, _now: Instant) {
        self.release_held();
    }

    fn commit(&mut self, class: PduClass, _now: Instant) {
        debug_assert!(self.out.inline_end() >= self.committed);
        self.attaching = false;
        self.attached_cid = None;
        self.stats.pdus += 1;
        if class == PduClass::Response {
            self.stats.notifications += 1;
        }
        self.stats.bytes += (self.out.inline_end() - self.committed) as u64;
        self.stats.flushes += 1;
        self.stats.flush_pdus += 1;
        self.stats.reasons[FlushReason::Immediate as usize] += 1;
        self.committed = self.out.inline_end();
    }

    fn due(&self) -> &[u8] {
        self.out.first_upto(self.committed)
    }

    fn due_vectored<'a>(&'a self, out: &mut [IoSlice<'a>]) -> usize {
        self.out.slices_upto(self.committed, out)
    }

    fn due_len(&self) -> usize {
        self.out.len_upto(self.committed)
    }

    fn due_copy(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.out.copy_upto(self.committed, &mut v);
        v
    }

    fn consume(&mut self, n: usize) {
        let before = self.out.inline_end();
        self.out.consume(n, self.committed);
        // Consuming may drop the written prefix: keep `committed` in step.
        self.committed -= before - self.out.inline_end();
        if n > 0 {
            self.stats.sends += 1;
            // The bytes ahead of the held responses went out.
            self.release_held();
        }
    }

    fn poll(&mut self, _now: Instant) {
        self.release_held();
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn backlog_bytes(&self) -> usize {
        self.out.len_upto(self.committed) + self.held.len()
    }

    fn stats(&self) -> SendStats {
        self.stats
    }
}

// ---------------------------------------------------------------- configuration

/// Triggers of one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreightParams {
    /// Size trigger: a PDU that does not fit flushes what is there first.
    pub size_bytes: u32,
    /// Degree trigger: flush when the (weighted) PDU count reaches this.
    pub degree: u32,
    /// Timer trigger: flush this long after the first PDU entered.
    pub timer: Duration,
}

/// Which scheduler a queue uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulerKind {
    #[default]
    Immediate,
    Unified,
    Isolated,
}

impl std::str::FromStr for SchedulerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "immediate" => Ok(SchedulerKind::Immediate),
            "unified" => Ok(SchedulerKind::Unified),
            "isolated" => Ok(SchedulerKind::Isolated),
            o => Err(format!("`{o}` is not one of immediate, unified, isolated")),
        }
    }
}

impl SchedulerKind {
    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Immediate => "immediate",
            SchedulerKind::Unified => "unified",
            SchedulerKind::Isolated => "isolated",
        }
    }
}

/// Degree weights per PDU class (isolated scheduler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    pub r2t: u32,
    pub response: u32,
    pub data: u32,
}

/// Everything that shapes one queue's send path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendConfig {
    pub scheduler: SchedulerKind,
    /// `unified`: the one container (i10: 64 KiB, 16 PDUs, 50 µs).
    pub unified: FreightParams,
    /// `isolated`: the latency freight (R2T, CapsuleResp; PINoF: 512 B, 8).
    pub latency: FreightParams,
    /// `isolated`: the data freight (C2HData; PINoF: 64 KiB, 16).
    pub data: FreightParams,
    /// `isolated`: degree weights (PINoF: R2T 3, response 2, data 1).
    pub weights: Weights,
    /// `unified` and `isolated`: a container also flushes when its queue
    /// goes idle ([`SendScheduler::idle`]), so batching only groups what
    /// one turn produces and never holds a PDU for its timer when nothing
    /// else is coming (on by default: docs/isolation.md measures why).
    /// Off: containers wait for their triggers, as the papers' i10 and
    /// PINoF define them.
    pub flush_when_idle: bool,
    /// `immediate`, I/O queues: the CapsuleResps of large reads sent from
    /// their own buffers follow all the data due when they are written
    /// ([`Immediate::responses_after_data`]; on by default).
    pub responses_after_data: bool,
    /// Completion coalescing of CapsuleResps on I/O queues.
    pub coalescing: CoalesceConfig,
}

impl Default for SendConfig {
    fn default() -> Self {
        SendConfig {
            scheduler: SchedulerKind::Immediate,
            unified: FreightParams {
                size_bytes: 64 * 1024,
                degree: 16,
                timer: Duration::from_micros(50),
            },
            latency: FreightParams {
                size_bytes: 512,
                degree: 8,
                timer: Duration::from_micros(25),
            },
            data: FreightParams {
                size_bytes: 64 * 1024,
                degree: 16,
                timer: Duration::from_micros(75),
            },
            weights: Weights {
                r2t: 3,
                response: 2,
                data: 1,
            },
            flush_when_idle: true,
            responses_after_data: true,
            coalescing: CoalesceConfig::default(),
        }
    }
}

/// Upper bounds of the parameters (nothing is held long or grows unbounded).
pub const FREIGHT_SIZE_MAX: u32 = 16 << 20;
pub const FREIGHT_DEGREE_MAX: u32 = 4096;
pub const FREIGHT_TIMER_MAX: Duration = Duration::from_secs(1);
pub const WEIGHT_MAX: u32 = 64;

impl SendConfig {
    /// Checks every parameter; the error is (field path, reason), e.g.
    /// (`send.data_size`, ...).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let check = |name: &str, f: &FreightParams| -> Result<(), (String, String)> {
            if f.size_bytes == 0 || f.size_bytes > FREIGHT_SIZE_MAX {
                return Err((
                    format!("send.{name}_size"),
                    format!(
                        "{} must be from 1 to {FREIGHT_SIZE_MAX} bytes",
                        f.size_bytes
                    ),
                ));
            }
            if f.degree == 0 || f.degree > FREIGHT_DEGREE_MAX {
                return Err((
                    format!("send.{name}_degree"),
                    format!("{} must be from 1 to {FREIGHT_DEGREE_MAX}", f.degree),
                ));
            }
            if f.timer.is_zero() || f.timer > FREIGHT_TIMER_MAX {
                return Err((
                    format!("send.{name}_timer_us"),
                    "must be from 1 µs to 1 s (a zero timer is only for send_scheduler = \"immediate\")"
                        .to_string(),
                ));
            }
            Ok(())
        };
        match self.scheduler {
            SchedulerKind::Immediate => {}
            SchedulerKind::Unified => check("unified", &self.unified)?,
            SchedulerKind::Isolated => {
                check("latency", &self.latency)?;
                check("data", &self.data)?;
                for (n, w) in [
                    ("weight_r2t", self.weights.r2t),
                    ("weight_response", self.weights.response),
                    ("weight_data", self.weights.data),
                ] {
                    if w == 0 || w > WEIGHT_MAX {
                        return Err((
                            format!("send.{n}"),
                            format!("{w} must be from 1 to {WEIGHT_MAX}"),
                        ));
                    }
                }
            }
        }
        self.coalescing
            .validate()
            .map_err(|(k, r)| (format!("coalescing.{k}"), r))
    }

    /// The scheduler for a queue; coalescing applies to I/O queues only.
    pub fn build(&self, io_queue: bool) -> Box<dyn SendScheduler> {
        let inner: Box<dyn SendScheduler> = match self.scheduler {
            SchedulerKind::Immediate => Box::new(
                Immediate::new().responses_after_data(io_queue && self.responses_after_data),
            ),
            SchedulerKind::Unified => {
                Box::new(Freighted::unified(self.unified).flushing_when_idle(self.flush_when_idle))
            }
            SchedulerKind::Isolated => Box::new(
                Freighted::isolated(self.latency, self.data, self.weights)
                    .flushing_when_idle(self.flush_when_idle),
            ),
        };
        if io_queue && self.coalescing.mode != CoalesceMode::Off {
            Box::new(Coalesced::new(inner, self.coalescing))
        } else {
            inner
        }
    }
}

// ---------------------------------------------------------------- freights

/// Index of the latency (or the unified) freight.
const LAT: usize = 0;
/// Index of the data freight (isolated only).
const DATA: usize = 1;

#[derive(Debug)]
struct Freight {
    p: FreightParams,
    buf: OutBuf,
    /// Commit time of each PDU in `buf`.
    times: Vec<Instant>,
    /// Weighted PDU count.
    weight: u32,
    /// Commands with a PDU in this freight (isolated data freight).
    cids: Vec<u16>,
}

impl Freight {
    fn new(p: FreightParams) -> Self {
        Freight {
            p,
            buf: OutBuf::default(),
            times: Vec::new(),
            weight: 0,
            cids: Vec::new(),
        }
    }
    fn deadline(&self) -> Option<Instant> {
        self.times.first().map(|t| *t + self.p.timer)
    }
}

/// `unified` (one container, i10 style) and `isolated` (PINoF: a latency
/// freight for R2T/CapsuleResp and a data freight for C2HData) schedulers.
///
/// Each freight flushes on its own size, degree (weighted) and timer
/// triggers into the due bytes, which the I/O layer writes with one send.
/// PDUs keep their order within a freight; a CapsuleResp whose command still
/// has C2HData in the data freight joins that freight behind its data, so no
/// command's PDUs are ever reordered. Control PDUs flush everything first.
/// With `flush_when_idle`, [`SendScheduler::idle`] flushes every freight,
/// latency first.
#[derive(Debug)]
pub struct Freighted {
    freights: Vec<Freight>,
    weights: Weights,
    isolated: bool,
    flush_when_idle: bool,
    /// Encoding space for PDUs whose freight is decided at commit.
    staging: Vec<u8>,
    /// Inline length of each freight's buffer when the PDU being encoded
    /// there started (the first `buffer` call since the last commit).
    marks: [usize; 2],
    /// Whether a PDU is being encoded in each freight (`buffer` was called
    /// and `commit` was not yet): later `buffer` calls for the same PDU,
    /// around an `attach`, keep its mark.
    open: [bool; 2],
    due: OutBuf,
    stats: SendStats,
}

impl Freighted {
    pub fn unified(p: FreightParams) -> Self {
        Freighted {
            freights: vec![Freight::new(p)],
            weights: Weights {
                r2t: 1,
                response: 1,
                data: 1,
            },
            isolated: false,
            flush_when_idle: false,
            staging: Vec::new(),
            marks: [0; 2],
            open: [false; 2],
            due: OutBuf::default(),
            stats: SendStats::default(),
        }
    }

    pub fn isolated(latency: FreightParams, data: FreightParams, weights: Weights) -> Self {
        Freighted {
            freights: vec![Freight::new(latency), Freight::new(data)],
            weights,
            isolated: true,
            flush_when_idle: false,
            staging: Vec::new(),
            marks: [0; 2],
            open: [false; 2],
            due: OutBuf::default(),
            stats: SendStats::default(),
        }
    }

    /// Also flushes every freight when the queue goes idle.
    pub fn flushing_when_idle(mut self, on: bool) -> Self {
        self.flush_when_idle = on;
        self
    }

    fn weight(&self, class: PduClass) -> u32 {
        match class {
            PduClass::R2t => self.weights.r2t,
            PduClass::Response | PduClass::Command => self.weights.response,
            PduClass::Data | PduClass::Control => self.weights.data,
        }
    }

    /// Moves the first `upto` bytes (whole PDUs: the first `npdus`) of freight
    /// `i` into the due bytes.
    fn flush_part(&mut self, i: usize, upto: usize, npdus: usize, why: FlushReason, now: Instant) {
        if npdus == 0 {
            return;
        }
        let f = &mut self.freights[i];
        f.buf.move_prefix_into(&mut self.due, upto);
        let mut waited = 0u64;
        for t in f.times.drain(..npdus) {
            let w = now.saturating_duration_since(t).as_nanos();
            waited += u64::try_from(w).unwrap_or(u64::MAX);
        }
        f.weight = 0;
        f.cids.clear();
        if i == LAT {
            self.stats.wait_ns_latency += waited;
            self.stats.waited_latency += npdus as u64;
        } else {
            self.stats.wait_ns_data += waited;
            self.stats.waited_data += npdus as u64;
        }
        self.stats.flushes += 1;
        self.stats.flush_pdus += npdus as u64;
        self.stats.reasons[why as usize] += 1;
    }

    fn flush(&mut self, i: usize, why: FlushReason, now: Instant) {
        let n = self.freights[i].times.len();
        let len = self.freights[i].buf.inline_end();
        self.flush_part(i, len, n, why, now);
    }

    /// Adds the PDU at inline position `mark..` of freight `i` (with its
    /// attachments) and applies the triggers; sizes count attached bytes.
    fn add(&mut self, i: usize, mark: usize, class: PduClass, cid: Option<u16>, now: Instant) {
        let size = self.freights[i].p.size_bytes as usize;
        let held = self.freights[i].times.len();
        if held > 0 && self.freights[i].buf.len() > size {
            // Size trigger: the new PDU does not fit; send what is there.
            self.flush_part(i, mark, held, FlushReason::Size, now);
        }
        let w = self.weight(class);
        let f = &mut self.freights[i];
        f.times.push(now);
        f.weight += w;
        if let Some(c) = cid {
            if i == DATA {
                f.cids.push(c);
            }
        }
        let (len, n, weight, degree) = (
            f.buf.len(),
            u32::try_from(f.times.len()).unwrap_or(u32::MAX),
            f.weight,
            f.p.degree,
        );
        if len >= size {
            self.flush(i, FlushReason::Size, now);
        } else if n >= degree {
            self.flush(i, FlushReason::Degree, now);
        } else if weight >= degree {
            self.flush(i, FlushReason::Priority, now);
        }
    }

    /// Marks where the PDU being encoded in freight `i` starts, unless one
    /// is already open there (a `buffer` call after an `attach`).
    fn open_pdu(&mut self, i: usize) {
        if !self.open[i] {
            self.marks[i] = self.freights[i].buf.inline_end();
            self.open[i] = true;
        }
    }

    fn freight_for(&self, class: PduClass, cid: Option<u16>) -> usize {
        if !self.isolated {
            return LAT;
        }
        match class {
            PduClass::Data => DATA,
            PduClass::Response => match cid {
                Some(c) if self.freights[DATA].cids.contains(&c) => DATA,
                _ => LAT,
            },
            _ => LAT,
        }
    }

    fn commit_inner(&mut self, class: PduClass, cid: Option<u16>, now: Instant) {
        self.stats.pdus += 1;
        if class == PduClass::Response {
            self.stats.notifications += 1;
        }
        match class {
            PduClass::Control => {
                self.stats.bytes += self.staging.len() as u64;
                for i in 0..self.freights.len() {
                    self.flush(i, FlushReason::Control, now);
                }
                self.due.inline().extend_from_slice(&self.staging);
                self.staging.clear();
                self.stats.flushes += 1;
                self.stats.flush_pdus += 1;
                self.stats.reasons[FlushReason::Control as usize] += 1;
            }
            PduClass::Response => {
                let i = self.freight_for(class, cid);
                let mark = self.freights[i].buf.inline_end();
                self.stats.bytes += self.staging.len() as u64;
                let f = &mut self.freights[i];
                f.buf.inline().extend_from_slice(&self.staging);
                self.staging.clear();
                self.add(i, mark, class, cid, now);
            }
            PduClass::R2t | PduClass::Data | PduClass::Command => {
                let i = self.freight_for(class, cid);
                let mark = self.marks[i];
                self.stats.bytes += (self.freights[i].buf.inline_end() - mark) as u64;
                self.open[i] = false;
                self.add(i, mark, class, cid, now);
                self.marks[i] = self.freights[i].buf.inline_end();
            }
        }
    }
}

impl SendScheduler for Freighted {
    fn buffer(&mut self, class: PduClass) -> &mut Vec<u8> {
        match class {
            PduClass::Control | PduClass::Response => &mut self.staging,
            PduClass::R2t | PduClass::Data | PduClass::Command => {
                let i = self.freight_for(class, None);
                self.open_pdu(i);
                self.freights[i].buf.inline()
            }
        }
    }

    fn attach(&mut self, class: PduClass, data: Attachment) {
        match class {
            PduClass::Control | PduClass::Response => {
                self.staging.extend_from_slice(data.as_slice());
            }
            PduClass::R2t | PduClass::Data | PduClass::Command => {
                let i = self.freight_for(class, None);
                self.open_pdu(i);
                self.stats.bytes += data.len() as u64;
                self.freights[i].buf.attach(data);
            }
        }
    }

    fn commit(&mut self, class: PduClass, now: Instant) {
        self.commit_inner(class, None, now);
    }

    fn commit_cmd(&mut self, class: PduClass, cid: u16, now: Instant) {
        self.commit_inner(class, Some(cid), now);
    }

    fn due(&self) -> &[u8] {
        self.due.first_upto(self.due.inline_end())
    }

    fn due_vectored<'a>(&'a self, out: &mut [IoSlice<'a>]) -> usize {
        self.due.slices_upto(self.due.inline_end(), out)
    }

    fn due_len(&self) -> usize {
        self.due.len()
    }

    fn due_copy(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.due.copy_upto(self.due.inline_end(), &mut v);
        v
    }

    fn consume(&mut self, n: usize) {
        self.due.consume(n, self.due.inline_end());
        if n > 0 {
            self.stats.sends += 1;
        }
    }

    fn poll(&mut self, now: Instant) {
        // Priority order: the latency freight goes first.
        for i in 0..self.freights.len() {
            if let Some(d) = self.freights[i].deadline() {
                if now >= d {
                    self.flush(i, FlushReason::Timer, now);
                }
            }
        }
    }

    fn idle(&mut self, now: Instant) {
        debug_assert!(
            !self.open.iter().any(|o| *o),
            "idle while a PDU is being encoded"
        );
        if self.flush_when_idle {
            // Priority order, as for timers: the latency freight first.
            for i in 0..self.freights.len() {
                self.flush(i, FlushReason::Idle, now);
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.freights.iter().filter_map(|f| f.deadline()).min()
    }

    fn backlog_bytes(&self) -> usize {
        self.due.len() + self.freights.iter().map(|f| f.buf.len()).sum::<usize>()
    }

    fn stats(&self) -> SendStats {
        self.stats
    }
}

// ---------------------------------------------------------------- coalescing

/// Holds CapsuleResps per a [`Coalescer`] (Algorithm 1) in front of any
/// scheduler; released responses enter the inner scheduler in arrival order.
#[derive(Debug)]
pub struct Coalesced {
    inner: Box<dyn SendScheduler>,
    co: Coalescer,
    staging: Vec<u8>,
    held: Vec<(u16, Vec<u8>)>,
    held_bytes: usize,
    delivered_alone: u64,
}

impl Coalesced {
    pub fn new(inner: Box<dyn SendScheduler>, cfg: CoalesceConfig) -> Self {
        Coalesced {
            inner,
            co: Coalescer::new(cfg),
            staging: Vec::new(),
            held: Vec::new(),
            held_bytes: 0,
            delivered_alone: 0,
        }
    }

    fn pass(&mut self, cid: Option<u16>, bytes: &[u8], now: Instant) {
        self.inner
            .buffer(PduClass::Response)
            .extend_from_slice(bytes);
        match cid {
            Some(c) => self.inner.commit_cmd(PduClass::Response, c, now),
            None => self.inner.commit(PduClass::Response, now),
        }
    }

    fn release_all(&mut self, now: Instant) {
        let held = std::mem::take(&mut self.held);
        self.held_bytes = 0;
        for (cid, b) in held {
            self.pass(Some(cid), &b, now);
        }
    }

    fn response(&mut self, cid: Option<u16>, now: Instant) {
        let key = cid.map_or(u64::MAX, u64::from);
        let bytes = std::mem::take(&mut self.staging);
        match self.co.completed(key, now) {
            Decision::Deliver => {
                self.delivered_alone += 1;
                self.pass(cid, &bytes, now);
            }
            Decision::Hold => {
                self.held_bytes += bytes.len();
                self.held.push((cid.unwrap_or(u16::MAX), bytes));
            }
            Decision::FlushAll(_) => {
                self.held.push((cid.unwrap_or(u16::MAX), bytes));
                self.release_all(now);
            }
        }
    }
}

impl SendScheduler for Coalesced {
    fn buffer(&mut self, class: PduClass) -> &mut Vec<u8> {
        if class == PduClass::Response {
            self.staging.clear();
            &mut self.staging
        } else {
            self.inner.buffer(class)
        }
    }

    fn commit(&mut self, class: PduClass, now: Instant) {
        if class == PduClass::Response {
            self.response(None, now);
        } else {
            if class == PduClass::Control {
                // Nothing may follow a TermReq unsent: release held responses.
                self.release_all(now);
            }
            self.inner.commit(class, now);
        }
    }

    fn commit_cmd(&mut self, class: PduClass, cid: u16, now: Instant) {
        if class == PduClass::Response {
            self.response(Some(cid), now);
        } else {
            self.inner.commit_cmd(class, cid, now);
        }
    }

    fn command_started(&mut self, cid: u16, hint: Hint) {
        self.co.submitted(cid as u64, hint);
        self.inner.command_started(cid, hint);
    }

    fn attach(&mut self, class: PduClass, data: Attachment) {
        if class == PduClass::Response {
            self.staging.extend_from_slice(data.as_slice());
        } else {
            self.inner.attach(class, data);
        }
    }

    fn due(&self) -> &[u8] {
        self.inner.due()
    }

    fn due_vectored<'a>(&'a self, out: &mut [IoSlice<'a>]) -> usize {
        self.inner.due_vectored(out)
    }

    fn due_len(&self) -> usize {
        self.inner.due_len()
    }

    fn due_copy(&self) -> Vec<u8> {
        self.inner.due_copy()
    }

    fn consume(&mut self, n: usize) {
        self.inner.consume(n);
    }

    fn poll(&mut self, now: Instant) {
        if self.co.poll(now).is_some() {
            self.release_all(now);
        }
        self.inner.poll(now);
    }

    fn idle(&mut self, now: Instant) {
        // Held responses wait for the coalescer's own triggers; what the
        // inner scheduler holds may go.
        self.inner.idle(now);
    }

    fn next_deadline(&self) -> Option<Instant> {
        match (self.inner.next_deadline(), self.co.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn backlog_bytes(&self) -> usize {
        self.inner.backlog_bytes() + self.held_bytes
    }

    fn stats(&self) -> SendStats {
        let mut s = self.inner.stats();
        let c = self.co.stats();
        s.notifications = c.notifications;
        s.coalesce_held_ns = c.held_ns;
        s.reasons[FlushReason::Threshold as usize] += c.fired_threshold;
        s.reasons[FlushReason::Urgent as usize] += c.fired_urgent;
        s.reasons[FlushReason::Barrier as usize] += c.fired_barrier;
        s.reasons[FlushReason::CoalesceTimer as usize] += c.fired_timeout + c.fired_hold_max;
        s
    }
}

/// Maps a coalescer fire to a flush reason (for reporting).
pub fn fire_reason(r: FireReason) -> FlushReason {
    match r {
        FireReason::Threshold => FlushReason::Threshold,
        FireReason::Urgent => FlushReason::Urgent,
        FireReason::Barrier => FlushReason::Barrier,
        FireReason::Timeout | FireReason::HoldMax => FlushReason::CoalesceTimer,
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod tests {
    use super::*;

    #[test]
    fn immediate_keeps_order_and_partial_writes() {
        let now = Instant::now();
        let mut s = Immediate::new();
        s.buffer(PduClass::Response).extend_from_slice(b"aaaa");
        s.commit(PduClass::Response, now);
        s.buffer(PduClass::Data).extend_from_slice(b"bb");
        s.commit(PduClass::Data, now);
        assert_eq!(s.due(), b"aaaabb");
        s.consume(3);
        assert_eq!(s.due(), b"abb");
        assert_eq!(s.backlog_bytes(), 3);
        s.consume(3);
        assert_eq!(s.due(), b"");
        assert_eq!(s.stats().pdus, 2);
        assert_eq!(s.stats().sends, 2);
        assert_eq!(s.stats().bytes, 6);
        assert_eq!(s.next_deadline(), None);
    }

    /// The order of the due PDUs of a scheduler, as (cid, class, seq).
    fn due_records(s: &dyn SendScheduler) -> Vec<(u16, u8, u32)> {
        let mut pending = s.due_copy();
        let mut out = Vec::new();
        parse(&mut out, &mut pending);
        assert!(pending.is_empty(), "due bytes end within a PDU");
        out
    }

    const DATA: u8 = PduClass::Data as u8;
    const RESP: u8 = PduClass::Response as u8;

    /// A read's C2HData (`att` as [`put_attached`]; 1 and 2 attach) and
    /// its CapsuleResp, numbered `seq` and `seq + 1`.
    fn put_read(s: &mut dyn SendScheduler, cid: u16, seq: u32, len: usize, att: u8, now: Instant) {
        put_attached(s, PduClass::Data, cid, seq, len, att, now);
        put(s, PduClass::Response, cid, seq + 1, 24, now);
    }

    #[test]
    fn responses_of_attached_reads_follow_the_due_data() {
        let now = Instant::now();
        let mut s = Immediate::new().responses_after_data(true);
        // Two large reads (data from their own buffers, 20 KiB attached
        // each), then a small one (its data copied) and a write's response.
        put_read(&mut s, 1, 0, 30000, 1, now);
        put_read(&mut s, 2, 2, 30000, 2, now);
        put_read(&mut s, 3, 4, 100, 0, now);
        put(&mut s, PduClass::Response, 4, 6, 24, now);
        assert_eq!(
            due_records(&s),
            [
                (1, DATA, 0),
                (2, DATA, 2),
                (3, DATA, 4),
                (3, RESP, 5),
                (4, RESP, 6)
            ],
            "the large reads' responses wait; the others do not"
        );
        assert_eq!(
            s.backlog_bytes(),
            s.due_len() + 2 * 24,
            "held bytes count as backlog"
        );
        assert_eq!(s.stats().pdus, 7);
        // The end of the turn puts them after everything due.
        s.idle(now);
        assert_eq!(
            due_records(&s),
            [
                (1, DATA, 0),
                (2, DATA, 2),
                (3, DATA, 4),
                (3, RESP, 5),
                (4, RESP, 6),
                (1, RESP, 1),
                (2, RESP, 3)
            ]
        );
        assert_eq!(s.backlog_bytes(), s.due_len());
    }

    #[test]
    fn a_write_releases_the_held_responses_behind_what_is_left() {
        let now = Instant::now();
        let mut s = Immediate::new().responses_after_data(true);
        put_read(&mut s, 1, 0, 30000, 1, now);
        put_read(&mut s, 2, 2, 30000, 1, now);
        let due = s.due_len();
        assert_eq!(due, 60000);
        // A write takes part of the first read's data.
        let mut pending = Vec::new();
        pending.extend_from_slice(&s.due_copy()[..1000]);
        s.consume(1000);
        assert_eq!(
            s.due_len(),
            due - 1000 + 2 * 24,
            "released after the data left"
        );
        pending.extend_from_slice(&s.due_copy());
        let mut out = Vec::new();
        parse(&mut out, &mut pending);
        assert_eq!(
            out,
            [(1, DATA, 0), (2, DATA, 2), (1, RESP, 1), (2, RESP, 3)]
        );
    }

    #[test]
    fn without_responses_after_data_every_pdu_goes_in_commit_order() {
        let now = Instant::now();
        for s in [
            Immediate::new(),
            Immediate::new().responses_after_data(false),
        ] {
            let mut s = s;
            put_read(&mut s, 1, 0, 30000, 1, now);
            put_read(&mut s, 2, 2, 30000, 1, now);
            assert_eq!(
                due_records(&s),
                [(1, DATA, 0), (1, RESP, 1), (2, DATA, 2), (2, RESP, 3)]
            );
            assert_eq!(s.backlog_bytes(), s.due_len());
        }
    }

    #[test]
    fn a_response_with_nothing_due_ahead_is_not_held() {
        let now = Instant::now();
        let mut s = Immediate::new().responses_after_data(true);
        put_attached(&mut s, PduClass::Data, 1, 0, 30000, 1, now);
        // Its data was written before the response came.
        let n = s.due_len();
        s.consume(n);
        put(&mut s, PduClass::Response, 1, 1, 24, now);
        assert_eq!(due_records(&s), [(1, RESP, 1)]);
        // And a response for another command than the data's is not held.
        put_attached(&mut s, PduClass::Data, 2, 2, 30000, 1, now);
        put(&mut s, PduClass::Response, 3, 3, 24, now);
        assert_eq!(due_records(&s), [(1, RESP, 1), (2, DATA, 2), (3, RESP, 3)]);
    }

    /// A read whose data went out as a small attachment (4 KiB from the
    /// namespace's memory) completes in commit order: its response is not
    /// held behind the turn's data.
    #[test]
    fn a_small_attached_read_is_not_held() {
        let now = Instant::now();
        let mut s = Immediate::new().responses_after_data(true);
        // Attachments of about 4 KiB, then one of 20 KiB.
        put_read(&mut s, 1, 0, 6200, 1, now);
        put_read(&mut s, 2, 2, 6200, 2, now);
        put_read(&mut s, 3, 4, 30000, 1, now);
        put(&mut s, PduClass::Response, 4, 6, 24, now);
        assert_eq!(
            due_records(&s),
            [
                (1, DATA, 0),
                (1, RESP, 1),
                (2, DATA, 2),
                (2, RESP, 3),
                (3, DATA, 4),
                (4, RESP, 6)
            ]
        );
        s.idle(now);
        assert_eq!(due_records(&s).last(), Some(&(3, RESP, 5)));
    }

    #[test]
    fn only_io_queues_send_responses_after_data() {
        let now = Instant::now();
        let cfg = SendConfig::default();
        assert!(cfg.responses_after_data, "on by default");
        for (io_queue, held) in [(true, true), (false, false)] {
            let mut s = cfg.build(io_queue);
            put_read(&mut *s, 1, 0, 30000, 1, now);
            assert_eq!(s.backlog_bytes() > s.due_len(), held, "io queue {io_queue}");
        }
    }

    // ------------------------------------------------------------ freights

    use crate::coalesce::CoalesceMode;
    use proptest::prelude::*;

    const US: Duration = Duration::from_micros(1);

    /// A test PDU: len u32 | cid u16 | class u8 | seq u32 | padding.
    fn put(
        s: &mut dyn SendScheduler,
        class: PduClass,
        cid: u16,
        seq: u32,
        len: usize,
        now: Instant,
    ) {
        let b = s.buffer(class);
        let len = len.max(11);
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend_from_slice(&cid.to_le_bytes());
        b.push(class as u8);
        b.extend_from_slice(&seq.to_le_bytes());
        b.resize(b.len() + len - 11, 0xaa);
        s.commit_cmd(class, cid, now);
    }

    /// Like `put`, with the body (every byte `seq as u8`) in up to three
    /// parts: `att` 0 all inline; 1 an inline head, then an attachment;
    /// 2 head, attachment and a 4-byte inline tail (like a data digest).
    #[allow(clippy::too_many_arguments)]
    fn put_attached(
        s: &mut dyn SendScheduler,
        class: PduClass,
        cid: u16,
        seq: u32,
        len: usize,
        att: u8,
        now: Instant,
    ) {
        let len = len.max(11 + 8);
        let body = len - 11;
        let fill = seq as u8;
        let b = s.buffer(class);
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend_from_slice(&cid.to_le_bytes());
        b.push(class as u8);
        b.extend_from_slice(&seq.to_le_bytes());
        if att == 0 {
            b.resize(b.len() + body, fill);
        } else {
            let head = body / 3;
            let tail = if att == 2 { 4 } else { 0 };
            b.resize(b.len() + head, fill);
            // A shared buffer of which the PDU carries only a middle range.
            let mut shared = vec![0x55u8; body + 7];
            shared[3..3 + body - head - tail].fill(fill);
            let shared: crate::outbuf::SharedBytes = std::sync::Arc::new(shared);
            let a = Attachment::new(shared, 3..3 + body - head - tail).expect("range");
            s.attach(class, a);
            let b = s.buffer(class);
            b.resize(b.len() + tail, fill);
        }
        s.commit_cmd(class, cid, now);
    }

    /// Parses whole test PDUs off `pending` into (cid, class, seq) records,
    /// checking each body.
    fn parse(out: &mut Vec<(u16, u8, u32)>, pending: &mut Vec<u8>) {
        while pending.len() >= 11 {
            let len = u32::from_le_bytes(pending[0..4].try_into().unwrap()) as usize;
            if pending.len() < len {
                break;
            }
            let cid = u16::from_le_bytes([pending[4], pending[5]]);
            let seq = u32::from_le_bytes(pending[7..11].try_into().unwrap());
            let body = &pending[11..len];
            assert!(
                body.iter().all(|&b| b == seq as u8 || b == 0xaa),
                "PDU {seq}: body bytes out of place"
            );
            out.push((cid, pending[6], seq));
            pending.drain(..len);
        }
    }

    /// Drains the due bytes into (cid, class, seq) records.
    fn drain(s: &mut dyn SendScheduler, out: &mut Vec<(u16, u8, u32)>, pending: &mut Vec<u8>) {
        while s.due_len() > 0 {
            let mut runs = [IoSlice::new(&[]); 8];
            let k = s.due_vectored(&mut runs);
            let mut n = 0;
            for r in &runs[..k] {
                pending.extend_from_slice(r);
                n += r.len();
            }
            s.consume(n);
        }
        parse(out, pending);
    }

    fn fp(size: u32, degree: u32, timer_us: u64) -> FreightParams {
        FreightParams {
            size_bytes: size,
            degree,
            timer: Duration::from_micros(timer_us),
        }
    }

    /// The isolated scheduler with PINoF's freights and weights (the
    /// defaults of `SendConfig`), holding PDUs for their triggers.
    fn pinof() -> Freighted {
        Freighted::isolated(
            fp(512, 8, 25),
            fp(65536, 16, 75),
            Weights {
                r2t: 3,
                response: 2,
                data: 1,
            },
        )
    }

    #[test]
    fn unified_degree_fires_exactly_at_the_degree() {
        let t0 = Instant::now();
        let mut s = Freighted::unified(fp(64 * 1024, 16, 50));
        for i in 0..15 {
            put(&mut s, PduClass::Response, i, i as u32, 24, t0);
            assert!(s.due().is_empty(), "held at {i}");
        }
        assert_eq!(s.next_deadline(), Some(t0 + 50 * US));
        put(&mut s, PduClass::Response, 15, 15, 24, t0 + US);
        assert_eq!(s.due().len(), 16 * 24);
        assert_eq!(s.stats().reason(FlushReason::Degree), 1);
        assert_eq!(s.next_deadline(), None);
        assert_eq!(s.stats().wait_ns_latency, 15 * 1000, "15 PDUs waited 1 µs");
    }

    #[test]
    fn size_trigger_sends_what_fits_and_keeps_the_new_pdu() {
        let t0 = Instant::now();
        let mut s = Freighted::unified(fp(64 * 1024, 16, 50));
        for i in 0..15 {
            put(&mut s, PduClass::Data, 1, i, 4120, t0);
        }
        assert!(s.due().is_empty());
        // 15 × 4120 = 61800; the 16th would make 65920 > 65536.
        put(&mut s, PduClass::Data, 1, 15, 4120, t0 + 2 * US);
        assert_eq!(s.due().len(), 15 * 4120);
        assert_eq!(s.stats().reason(FlushReason::Size), 1);
        assert_eq!(s.backlog_bytes(), 16 * 4120);
        // The kept PDU's timer starts at its own commit.
        assert_eq!(s.next_deadline(), Some(t0 + 52 * US));
        // A PDU as large as the freight goes out by itself.
        let mut s = Freighted::unified(fp(4096, 16, 50));
        put(&mut s, PduClass::Data, 1, 0, 4096, t0);
        assert_eq!(s.due().len(), 4096);
        assert_eq!(s.stats().reason(FlushReason::Size), 1);
    }

    #[test]
    fn idle_flushes_held_freights_only_when_asked_latency_first() {
        let t0 = Instant::now();
        // Off (the papers' containers): idle changes nothing.
        let mut s = pinof();
        put(&mut s, PduClass::Data, 2, 0, 4120, t0);
        put(&mut s, PduClass::Response, 1, 1, 24, t0);
        s.idle(t0 + US);
        assert!(s.due().is_empty());
        assert_eq!(s.next_deadline(), Some(t0 + 25 * US));
        // On: both freights leave at once, the latency freight's first,
        // each as one flush with its reason.
        let mut s = pinof().flushing_when_idle(true);
        put(&mut s, PduClass::Data, 2, 0, 4120, t0);
        put(&mut s, PduClass::Response, 1, 1, 24, t0);
        put(&mut s, PduClass::R2t, 3, 2, 24, t0);
        s.idle(t0 + 2 * US);
        assert_eq!(s.next_deadline(), None);
        assert_eq!(s.backlog_bytes(), s.due_len());
        let (mut out, mut pend) = (Vec::new(), Vec::new());
        drain(&mut s, &mut out, &mut pend);
        let seqs: Vec<u32> = out.iter().map(|r| r.2).collect();
        assert_eq!(seqs, vec![1, 2, 0], "latency freight ahead of the data");
        let st = s.stats();
        assert_eq!(st.reason(FlushReason::Idle), 2);
        assert_eq!(st.flushes, 2);
        assert_eq!(st.wait_ns_latency, 2 * 2000, "two PDUs waited 2 µs");
        // Empty freights make no flush.
        s.idle(t0 + 3 * US);
        assert_eq!(s.stats().flushes, 2);
        // Through the configuration, unified too.
        let c = SendConfig {
            scheduler: SchedulerKind::Unified,
            flush_when_idle: true,
            ..SendConfig::default()
        };
        let mut s = c.build(true);
        put(&mut *s, PduClass::Response, 1, 0, 24, t0);
        assert!(s.due().is_empty());
        s.idle(t0);
        assert_eq!(s.due().len(), 24);
        assert_eq!(s.stats().reason(FlushReason::Idle), 1);
    }

    #[test]
    fn timer_fires_exactly_at_the_deadline() {
        let t0 = Instant::now();
        let mut s = pinof();
        put(&mut s, PduClass::Response, 1, 0, 24, t0);
        put(&mut s, PduClass::Data, 2, 1, 4120, t0 + US);
        assert_eq!(s.next_deadline(), Some(t0 + 25 * US));
        s.poll(t0 + 25 * US - Duration::from_nanos(1));
        assert!(s.due().is_empty());
        s.poll(t0 + 25 * US);
        assert_eq!(s.due().len(), 24, "only the latency freight");
        assert_eq!(s.next_deadline(), Some(t0 + 76 * US));
        s.poll(t0 + 76 * US);
        assert_eq!(s.due().len(), 24 + 4120);
        assert_eq!(s.stats().reason(FlushReason::Timer), 2);
        assert_eq!(s.next_deadline(), None);
        assert_eq!(s.stats().waited_data, 1);
        assert_eq!(s.stats().wait_ns_data, 75_000);
    }

    #[test]
    fn weights_make_r2t_and_responses_flush_first() {
        let t0 = Instant::now();
        let mut s = pinof();
        put(&mut s, PduClass::R2t, 1, 0, 24, t0);
        put(&mut s, PduClass::R2t, 2, 1, 24, t0);
        assert!(s.due().is_empty());
        put(&mut s, PduClass::R2t, 3, 2, 24, t0); // 9 >= 8
        assert_eq!(s.due().len(), 72);
        assert_eq!(s.stats().reason(FlushReason::Priority), 1);
        for i in 0..3 {
            put(&mut s, PduClass::Response, 10 + i, 3, 24, t0);
        }
        assert_eq!(s.due().len(), 72);
        put(&mut s, PduClass::Response, 13, 4, 24, t0); // 8 >= 8
        assert_eq!(s.due().len(), 72 + 96);
        assert_eq!(s.stats().reason(FlushReason::Priority), 2);
        // Without priorities the degree counts PDUs.
        let mut s = Freighted::isolated(
            fp(512, 8, 25),
            fp(65536, 16, 75),
            Weights {
                r2t: 1,
                response: 1,
                data: 1,
            },
        );
        for i in 0..7 {
            put(&mut s, PduClass::R2t, i, i as u32, 24, t0);
        }
        assert!(s.due().is_empty());
        put(&mut s, PduClass::R2t, 7, 7, 24, t0);
        assert_eq!(s.stats().reason(FlushReason::Degree), 1);
    }

    #[test]
    fn priorities_reorder_freights_but_never_a_command() {
        let t0 = Instant::now();
        let mut s = pinof();
        let (mut out, mut pend) = (Vec::new(), Vec::new());
        // Read 1: data then its response; the response joins the data freight.
        put(&mut s, PduClass::Data, 1, 0, 4120, t0);
        put(&mut s, PduClass::Response, 1, 1, 24, t0);
        // Writes 2..4: R2Ts overtake the held read (different commands).
        for c in 2..5 {
            put(&mut s, PduClass::R2t, c, c as u32, 24, t0);
        }
        drain(&mut s, &mut out, &mut pend);
        assert_eq!(out.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 3, 4]);
        s.poll(t0 + 75 * US);
        drain(&mut s, &mut out, &mut pend);
        let cids: Vec<_> = out.iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            cids,
            vec![
                (2, 1),
                (3, 1),
                (4, 1),
                (1, PduClass::Data as u8),
                (1, PduClass::Response as u8)
            ]
        );
    }

    #[test]
    fn control_flushes_everything_before_it() {
        let t0 = Instant::now();
        let mut s = pinof();
        let (mut out, mut pend) = (Vec::new(), Vec::new());
        put(&mut s, PduClass::Data, 1, 0, 100, t0);
        put(&mut s, PduClass::Response, 2, 1, 24, t0);
        put(&mut s, PduClass::Control, 0, 2, 24, t0);
        drain(&mut s, &mut out, &mut pend);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].1, PduClass::Control as u8);
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn coalesced_urgent_and_barrier() {
        let t0 = Instant::now();
        let cfg = CoalesceConfig {
            mode: CoalesceMode::Calibrated,
            threshold: 8,
            correction: 0.5,
            ..CoalesceConfig::default()
        };
        let mut s = Coalesced::new(Box::new(Immediate::new()), cfg);
        let (mut out, mut pend) = (Vec::new(), Vec::new());
        for c in 1..=4 {
            s.command_started(
                c,
                if c == 3 {
                    Hint::Urgent
                } else if c == 4 {
                    Hint::Barrier
                } else {
                    Hint::Normal
                },
            );
        }
        put(&mut s, PduClass::Response, 1, 0, 24, t0);
        assert!(s.due().is_empty(), "normal response held");
        put(&mut s, PduClass::Response, 3, 1, 24, t0);
        drain(&mut s, &mut out, &mut pend);
        assert_eq!(
            out,
            vec![(3, PduClass::Response as u8, 1)],
            "urgent overtakes"
        );
        put(&mut s, PduClass::Response, 4, 2, 24, t0);
        assert!(s.due().is_empty(), "barrier waits for command 2");
        // Command 2's data goes out at once; its response completes the barrier.
        put(&mut s, PduClass::Data, 2, 3, 100, t0);
        put(&mut s, PduClass::Response, 2, 4, 24, t0);
        drain(&mut s, &mut out, &mut pend);
        let got: Vec<_> = out[1..].iter().map(|r| r.0).collect();
        assert_eq!(got, vec![2, 1, 4, 2]);
        assert_eq!(s.stats().reason(FlushReason::Barrier), 1);
        assert_eq!(s.stats().notifications, 2);
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = SendConfig {
            scheduler: SchedulerKind::Isolated,
            ..SendConfig::default()
        };
        c.data.size_bytes = 0;
        assert_eq!(c.validate().unwrap_err().0, "send.data_size");
        c = SendConfig {
            scheduler: SchedulerKind::Unified,
            ..SendConfig::default()
        };
        c.unified.timer = Duration::ZERO;
        assert_eq!(c.validate().unwrap_err().0, "send.unified_timer_us");
        c.scheduler = SchedulerKind::Immediate;
        assert!(c.validate().is_ok(), "timers do not matter for immediate");
        c = SendConfig {
            scheduler: SchedulerKind::Isolated,
            ..SendConfig::default()
        };
        c.weights.r2t = 0;
        assert_eq!(c.validate().unwrap_err().0, "send.weight_r2t");
        c.weights.r2t = 3;
        c.latency.degree = 0;
        assert_eq!(c.validate().unwrap_err().0, "send.latency_degree");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Read {
            len: usize,
            pdus: u8,
            hint: u8,
            att: u8,
        },
        Write {
            hint: u8,
        },
        Complete(usize),
        Advance(u16),
        Consume(u16),
        Control,
        Idle,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (24usize..5000, 1u8..4, 0u8..3, 0u8..3).prop_map(|(len, pdus, hint, att)| Op::Read {
                len,
                pdus,
                hint,
                att
            }),
            (0u8..3).prop_map(|hint| Op::Write { hint }),
            (0usize..64).prop_map(Op::Complete),
            (0u16..120).prop_map(Op::Advance),
            (0u16..9000).prop_map(Op::Consume),
            Just(Op::Control),
            Just(Op::Idle),
        ]
    }

    fn sched() -> impl Strategy<Value = SendConfig> {
        (
            0u8..3,
            1u32..9000,
            1u32..20,
            1u64..100,
            1u32..4,
            0u8..4,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(k, size, degree, timer, w, co, ooo, idle, after)| {
                let p = fp(size, degree, timer);
                SendConfig {
                    scheduler: [
                        SchedulerKind::Immediate,
                        SchedulerKind::Unified,
                        SchedulerKind::Isolated,
                    ][k as usize],
                    unified: p,
                    latency: fp(size / 4 + 1, degree, timer / 2 + 1),
                    data: p,
                    weights: Weights {
                        r2t: w + 1,
                        response: w,
                        data: 1,
                    },
                    flush_when_idle: idle,
                    responses_after_data: after,
                    coalescing: CoalesceConfig {
                        mode: [
                            CoalesceMode::Off,
                            CoalesceMode::Static,
                            CoalesceMode::Adaptive,
                            CoalesceMode::Calibrated,
                        ][co as usize],
                        threshold: degree,
                        timeout: Duration::from_micros(timer),
                        correction: 0.3,
                        urgent_out_of_order: ooo,
                        hold_max: Duration::from_micros(300),
                    },
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Random interleavings of commands, completions, time and partial
        /// writes: no PDU is lost or duplicated, PDUs of one command keep
        /// their order, a held PDU always has a deadline, and after the
        /// longest bound every PDU is due. Data PDUs carry attachments
        /// (sent from their own buffers) or not; writes take the due runs
        /// a few at a time, in pieces.
        #[test]
        fn no_pdu_lost_duplicated_or_reordered(cfg in sched(), ops in prop::collection::vec(op(), 1..200)) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut s = cfg.build(true);
            let (mut out, mut pend) = (Vec::new(), Vec::new());
            let mut sent: Vec<(u16, u8, u32)> = Vec::new();
            let mut seq = 0u32;
            let mut next_cid = 0u16;
            // Commands in flight: (cid, is_read, remaining data pdus, len, att)
            let mut inflight: Vec<(u16, bool, u8, usize, u8)> = Vec::new();
            for o in ops {
                match o {
                    Op::Read { len, pdus, hint, att } => {
                        next_cid = next_cid.wrapping_add(1);
                        s.command_started(next_cid, [Hint::Normal, Hint::Urgent, Hint::Barrier][hint as usize]);
                        inflight.push((next_cid, true, pdus, len, att));
                    }
                    Op::Write { hint } => {
                        next_cid = next_cid.wrapping_add(1);
                        s.command_started(next_cid, [Hint::Normal, Hint::Urgent, Hint::Barrier][hint as usize]);
                        put(&mut *s, PduClass::R2t, next_cid, seq, 24, now);
                        sent.push((next_cid, PduClass::R2t as u8, seq));
                        seq += 1;
                        inflight.push((next_cid, false, 0, 0, 0));
                    }
                    Op::Complete(i) if !inflight.is_empty() => {
                        let (cid, _, pdus, len, att) = inflight.remove(i % inflight.len());
                        for _ in 0..pdus {
                            put_attached(&mut *s, PduClass::Data, cid, seq, len, att, now);
                            sent.push((cid, PduClass::Data as u8, seq));
                            seq += 1;
                        }
                        put(&mut *s, PduClass::Response, cid, seq, 24, now);
                        sent.push((cid, PduClass::Response as u8, seq));
                        seq += 1;
                    }
                    Op::Complete(_) => {}
                    Op::Advance(us) => {
                        now += Duration::from_micros(us as u64);
                        s.poll(now);
                    }
                    Op::Consume(n) => {
                        // What a writev of three runs that took `n` bytes does.
                        let mut runs = [IoSlice::new(&[]); 3];
                        let k = s.due_vectored(&mut runs);
                        let mut left = n as usize;
                        let mut took = 0;
                        for r in &runs[..k] {
                            let m = left.min(r.len());
                            pend.extend_from_slice(&r[..m]);
                            left -= m;
                            took += m;
                        }
                        prop_assert_eq!(k == 0, s.due().is_empty());
                        s.consume(took);
                        parse(&mut out, &mut pend);
                    }
                    Op::Control => {
                        put(&mut *s, PduClass::Control, 0, seq, 24, now);
                        sent.push((0, PduClass::Control as u8, seq));
                        seq += 1;
                    }
                    Op::Idle => {
                        let before = s.stats();
                        s.idle(now);
                        if cfg.flush_when_idle && cfg.coalescing.mode == CoalesceMode::Off {
                            // Nothing stays held once the queue is idle.
                            prop_assert_eq!(s.backlog_bytes(), s.due_len());
                        }
                        if !cfg.flush_when_idle {
                            prop_assert_eq!(s.stats(), before, "idle moved PDUs while off");
                        }
                    }
                }
                prop_assert_eq!(s.due_copy().len(), s.due_len());
                prop_assert!(s.due_copy().starts_with(s.due()));
                prop_assert!(s.backlog_bytes() >= s.due_len());
                if s.backlog_bytes() > s.due_len() {
                    // Held by a timer, or (responses after data) behind
                    // due bytes whose write releases them.
                    match s.next_deadline() {
                        Some(d) => prop_assert!(d <= now + Duration::from_micros(400)),
                        None => prop_assert!(
                            cfg.responses_after_data && s.due_len() > 0,
                            "held bytes with neither a deadline nor a write to come"
                        ),
                    }
                }
            }
            // Everything is due by the longest bound (timer + coalescing hold).
            now += Duration::from_micros(400);
            s.poll(now);
            now += Duration::from_micros(400);
            s.poll(now);
            prop_assert_eq!(s.backlog_bytes(), s.due_len());
            drain(&mut *s, &mut out, &mut pend);
            prop_assert!(pend.is_empty());
            let mut a = out.clone();
            a.sort_by_key(|r| r.2);
            prop_assert_eq!(&a, &sent, "lost or duplicated PDUs");
            // Per command order: the order of seq numbers per cid is increasing.
            let mut last: std::collections::HashMap<u16, u32> = Default::default();
            for (cid, class, sq) in &out {
                if *class == PduClass::Control as u8 { continue; }
                if let Some(p) = last.insert(*cid, *sq) {
                    prop_assert!(p < *sq, "command {} reordered", cid);
                }
            }
        }
    }
}
