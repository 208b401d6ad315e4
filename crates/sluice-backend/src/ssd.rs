//! Emulated SSD: RAM storage plus a time-based service model. Data is copied
//! at submit; the completion is released only once `now` reaches the
//! completion time computed by the device-wide [`ServiceModel`].
//!
//! The model (pure, driven only by the `now` it is given) has three gates per
//! request: an IOPS gate (minimum spacing `1 / iops_max` per op type), a
//! bandwidth gate (the device-wide "bus" for that op type is busy for
//! `len / bytes_per_sec_max`), and one of `parallelism` channels, which is
//! busy for `base_latency + len / bytes_per_sec_max`. At queue depth 1 on an
//! idle device the latency is exactly `base_latency + transfer time`; under
//! load the gates push start times later, so throughput saturates at the
//! configured limits and latency grows with queueing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use sluice_runtime::sync::lock;
use std::time::{Duration, Instant};

use crate::io::{fail, validate_request};
use crate::ram::{check_ram_geometry, RamStore};
use crate::{Backend, BackendError, BackendQueue, Geometry, IoCompletion, IoOp, IoRequest};

/// Upper bound on `SsdModel::parallelism`.
pub const PARALLELISM_MAX: u32 = 1024;
/// Upper bound on base latencies (10 s).
pub const BASE_LATENCY_US_MAX: u64 = 10_000_000;
/// Pending completions per emulated-SSD queue.
pub const SSD_QUEUE_DEPTH_MAX: usize = 65_536;

/// Performance envelope of an emulated SSD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsdModel {
    pub read_iops_max: u64,
    pub write_iops_max: u64,
    pub read_bytes_per_sec_max: u64,
    pub write_bytes_per_sec_max: u64,
    pub base_read_latency_us: u64,
    pub base_write_latency_us: u64,
    /// Independent channels that service requests concurrently.
    pub parallelism: u32,
}

impl Default for SsdModel {
    /// A modest NVMe drive. These are the only defaults of the emulated
    /// SSD: the target config (`ssd = { ... }`, docs/configuration.md)
    /// fills absent keys from here.
    fn default() -> Self {
        Self {
            read_iops_max: 100_000,
            write_iops_max: 50_000,
            read_bytes_per_sec_max: 1_000_000_000,
            write_bytes_per_sec_max: 500_000_000,
            base_read_latency_us: 80,
            base_write_latency_us: 20,
            parallelism: 8,
        }
    }
}

impl SsdModel {
    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), BackendError> {
        let positive = [
            ("read_iops_max", self.read_iops_max),
            ("write_iops_max", self.write_iops_max),
            ("read_bytes_per_sec_max", self.read_bytes_per_sec_max),
            ("write_bytes_per_sec_max", self.write_bytes_per_sec_max),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(BackendError::config(field, "must be > 0"));
            }
        }
        if self.parallelism == 0 || self.parallelism > PARALLELISM_MAX {
            return Err(BackendError::config(
                "parallelism",
                format!("{} not in 1..={PARALLELISM_MAX}", self.parallelism),
            ));
        }
        for (field, value) in [
            ("base_read_latency_us", self.base_read_latency_us),
            ("base_write_latency_us", self.base_write_latency_us),
        ] {
            if value > BASE_LATENCY_US_MAX {
                return Err(BackendError::config(
                    field,
                    format!("{value} exceeds {BASE_LATENCY_US_MAX}"),
                ));
            }
        }
        Ok(())
    }
}

/// Operation class as seen by the service model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceOp {
    Read,
    /// Writes, write-zeroes and deallocates (the latter two with zero bytes
    /// transferred).
    Write,
    /// Completes once all previously scheduled work has completed.
    Flush,
}

impl ServiceOp {
    /// Model class and transferred bytes for an I/O op.
    pub fn classify(op: IoOp, len_bytes: u64) -> (Self, u64) {
        match op {
            IoOp::Read => (Self::Read, len_bytes),
            IoOp::Write { .. } => (Self::Write, len_bytes),
            IoOp::WriteZeroes { .. } | IoOp::Deallocate => (Self::Write, 0),
            IoOp::Flush => (Self::Flush, 0),
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Gate {
    /// Earliest start of the next IOPS slot.
    iops_next: Option<Instant>,
    /// When the bandwidth "bus" frees up.
    bus_free: Option<Instant>,
}

/// Pure queueing model of an SSD; see the module docs.
#[derive(Debug, Clone)]
pub struct ServiceModel {
    model: SsdModel,
    read_gate: Gate,
    write_gate: Gate,
    /// Busy-until time per channel (`None` = never used).
    channels: Vec<Option<Instant>>,
    read_iops_interval: Duration,
    write_iops_interval: Duration,
}

fn later(a: Instant, b: Option<Instant>) -> Instant {
    b.map_or(a, |b| a.max(b))
}

/// `bytes / bytes_per_sec` rounded up to the nanosecond.
fn transfer_time(bytes: u64, bytes_per_sec: u64) -> Duration {
    assert!(bytes_per_sec > 0);
    let nanos = (u128::from(bytes) * 1_000_000_000).div_ceil(u128::from(bytes_per_sec));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

impl ServiceModel {
    pub fn new(model: SsdModel) -> Result<Self, BackendError> {
        model.validate()?;
        Ok(Self {
            read_gate: Gate::default(),
            write_gate: Gate::default(),
            channels: vec![None; model.parallelism as usize],
            read_iops_interval: transfer_time(1, model.read_iops_max),
            write_iops_interval: transfer_time(1, model.write_iops_max),
            model,
        })
    }

    pub fn model(&self) -> &SsdModel {
        &self.model
    }

    /// Books a request arriving at `now` and returns its completion time
    /// (always `>= now`).
    pub fn schedule(&mut self, op: ServiceOp, len_bytes: u64, now: Instant) -> Instant {
        let (gate, interval, bytes_per_sec, base_us) = match op {
            ServiceOp::Flush => {
                let done = self.channels.iter().fold(now, |acc, c| later(acc, *c));
                assert!(done >= now);
                return done;
            }
            ServiceOp::Read => (
                &mut self.read_gate,
                self.read_iops_interval,
                self.model.read_bytes_per_sec_max,
                self.model.base_read_latency_us,
            ),
            ServiceOp::Write => (
                &mut self.write_gate,
                self.write_iops_interval,
                self.model.write_bytes_per_sec_max,
                self.model.base_write_latency_us,
            ),
        };
        let transfer = transfer_time(len_bytes, bytes_per_sec);
        let admitted = later(now, gate.iops_next);
        gate.iops_next = Some(admitted + interval);
        let bus_start = later(admitted, gate.bus_free);
        gate.bus_free = Some(bus_start + transfer);

        // Least-busy channel; an unused or idle one starts immediately.
        let (index, free) = self
            .channels
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.map_or(now, |c| c.max(now)))
            .map(|(i, c)| (i, c.map_or(now, |c| c.max(now))))
            .unwrap_or((0, now));
        let start = bus_start.max(free);
        let done = start + Duration::from_micros(base_us) + transfer;
        self.channels[index] = Some(done);
        assert!(done >= now);
        done
    }
}

/// RAM-backed namespace whose completions follow an [`SsdModel`].
#[derive(Debug, Clone)]
pub struct EmulatedSsd {
    store: Arc<RamStore>,
    block_size_bytes: u32,
    size_bytes: u64,
    service: Arc<Mutex<ServiceModel>>,
}

impl EmulatedSsd {
    pub fn new(
        size_bytes: u64,
        block_size_bytes: u32,
        model: SsdModel,
    ) -> Result<Self, BackendError> {
        check_ram_geometry(size_bytes, block_size_bytes)?;
        let service = ServiceModel::new(model)?;
        Ok(Self {
            store: Arc::new(RamStore::new(size_bytes, false)),
            block_size_bytes,
            size_bytes,
            service: Arc::new(Mutex::new(service)),
        })
    }

    pub fn model(&self) -> SsdModel {
        *lock(&self.service).model()
    }
}

impl Backend for EmulatedSsd {
    fn geometry(&self) -> Geometry {
        Geometry {
            size_bytes: self.size_bytes,
            block_size_bytes: self.block_size_bytes,
            volatile_write_cache: false,
            supports_deallocate: true,
            deallocated_reads_zero: true,
        }
    }

    fn kind(&self) -> &'static str {
        "emulated-ssd"
    }

    /// Yes: the RAM store beneath copies or zero-fills every span.
    fn fills_reads(&self) -> bool {
        true
    }

    fn open_queue(&self) -> Result<Box<dyn BackendQueue>, BackendError> {
        Ok(Box::new(SsdQueue {
            geometry: self.geometry(),
            store: Arc::clone(&self.store),
            service: Arc::clone(&self.service),
            pending: BinaryHeap::new(),
            seq: 0,
        }))
    }
}

#[derive(Debug)]
struct Pending {
    ready_at: Instant,
    seq: u64,
    completion: IoCompletion,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.ready_at, self.seq) == (other.ready_at, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.ready_at, self.seq).cmp(&(other.ready_at, other.seq))
    }
}

/// Queue on an [`EmulatedSsd`].
#[derive(Debug)]
pub struct SsdQueue {
    geometry: Geometry,
    store: Arc<RamStore>,
    service: Arc<Mutex<ServiceModel>>,
    pending: BinaryHeap<Reverse<Pending>>,
    seq: u64,
}

impl BackendQueue for SsdQueue {
    fn submit(&mut self, mut req: IoRequest, now: Instant) {
        let (completion, ready_at) = if self.pending.len() >= SSD_QUEUE_DEPTH_MAX {
            let in_flight = self.pending.len();
            (fail(req, BackendError::QueueFull { in_flight }), now)
        } else {
            match validate_request(&self.geometry, &req) {
                Err(err) => (fail(req, err), now),
                Ok(()) => {
                    self.store.execute(&mut req);
                    let (op, bytes) = ServiceOp::classify(req.op, req.len_bytes);
                    let ready_at = lock(&self.service).schedule(op, bytes, now);
                    let completion = IoCompletion::new(req.tag, Ok(()), req.buf);
                    (completion, ready_at)
                }
            }
        };
        self.seq += 1;
        self.pending.push(Reverse(Pending {
            ready_at,
            seq: self.seq,
            completion,
        }));
    }

    fn poll_completions(&mut self, now: Instant, out: &mut Vec<IoCompletion>) {
        while self.pending.peek().is_some_and(|p| p.0.ready_at <= now) {
            if let Some(Reverse(p)) = self.pending.pop() {
                out.push(p.completion);
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.pending.peek().map(|p| p.0.ready_at)
    }

    fn notify_fd(&self) -> Option<RawFd> {
        None
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
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
    use crate::AlignedBuf;

    fn model() -> SsdModel {
        SsdModel {
            read_iops_max: 100_000,
            write_iops_max: 50_000,
            read_bytes_per_sec_max: 1_000_000_000,
            write_bytes_per_sec_max: 400_000_000,
            base_read_latency_us: 100,
            base_write_latency_us: 30,
            parallelism: 16,
        }
    }

    #[test]
    fn validation_names_field() {
        type Mutation = (&'static str, fn(&mut SsdModel));
        let cases: [Mutation; 6] = [
            ("parallelism", |m| m.parallelism = 0),
            ("parallelism", |m| m.parallelism = PARALLELISM_MAX + 1),
            ("read_iops_max", |m| m.read_iops_max = 0),
            ("write_bytes_per_sec_max", |m| m.write_bytes_per_sec_max = 0),
            ("base_read_latency_us", |m| {
                m.base_read_latency_us = BASE_LATENCY_US_MAX + 1
            }),
            ("write_iops_max", |m| m.write_iops_max = 0),
        ];
        for (name, mutate) in cases {
            let mut m = model();
            mutate(&mut m);
            match ServiceModel::new(m) {
                Err(BackendError::InvalidConfig { field, .. }) => assert_eq!(field, name),
                other => panic!("expected InvalidConfig({name}), got {other:?}"),
            }
            assert!(EmulatedSsd::new(1 << 20, 512, m).is_err());
        }
        assert!(ServiceModel::new(model()).is_ok());
    }

    #[test]
    fn qd1_latency_is_base_plus_transfer() {
        let mut s = ServiceModel::new(model()).expect("model");
        let t0 = Instant::now();
        // Idle device, spaced far apart: pure latency.
        let mut now = t0;
        for _ in 0..10 {
            let done = s.schedule(ServiceOp::Read, 4096, now);
            // 100 us + 4096 B / 1 GB/s = 4.096 us.
            assert_eq!(done - now, Duration::from_nanos(100_000 + 4_096));
            now = done;
        }
        let done = s.schedule(ServiceOp::Write, 1 << 20, now);
        // 30 us + 1 MiB / 400 MB/s = 2621.44 us (rounded up).
        assert_eq!(done - now, Duration::from_nanos(30_000 + 2_621_440));
        // Flush waits for the outstanding write.
        assert_eq!(s.schedule(ServiceOp::Flush, 0, now), done);
        assert_eq!(s.schedule(ServiceOp::Flush, 0, done), done);
    }

    /// Closed-loop load at queue depth `qd` in virtual time through a real
    /// queue; returns (ops/s, bytes/s, mean latency).
    fn closed_loop(m: SsdModel, op: IoOp, len: u64, qd: usize, total: u64) -> (f64, f64, Duration) {
        let ssd = EmulatedSsd::new(64 << 20, 4096, m).expect("ssd");
        let mut q = ssd.open_queue().expect("queue");
        let t0 = Instant::now();
        let mut now = t0;
        let mut submitted = 0u64;
        let mut completed = 0u64;
        let mut submit_times = std::collections::HashMap::new();
        let mut latency_sum = Duration::ZERO;
        let mut out = Vec::new();
        while completed < total {
            while q.in_flight() < qd && submitted < total {
                let offset_bytes = (submitted * len) % (64 << 20);
                let buf = Some(AlignedBuf::new(len as usize));
                q.submit(
                    IoRequest {
                        tag: submitted,
                        op,
                        offset_bytes,
                        len_bytes: len,
                        buf,
                    },
                    now,
                );
                submit_times.insert(submitted, now);
                submitted += 1;
            }
            now = q.next_deadline().expect("pending work has a deadline");
            out.clear();
            q.poll_completions(now, &mut out);
            assert!(!out.is_empty());
            for c in &out {
                assert!(c.result.is_ok());
                latency_sum += now - submit_times[&c.tag];
            }
            completed += out.len() as u64;
        }
        let secs = (now - t0).as_secs_f64();
        let ops = completed as f64 / secs;
        (ops, ops * len as f64, latency_sum / total as u32)
    }

    fn within(actual: f64, expected: f64, pct: f64) -> bool {
        (actual - expected).abs() <= expected * pct / 100.0
    }

    #[test]
    fn small_reads_saturate_at_iops_limit() {
        let (ops, _, _) = closed_loop(model(), IoOp::Read, 4096, 64, 50_000);
        assert!(within(ops, 100_000.0, 3.0), "read IOPS {ops}");
        let (ops, _, _) = closed_loop(model(), IoOp::Write { fua: false }, 4096, 64, 50_000);
        assert!(within(ops, 50_000.0, 3.0), "write IOPS {ops}");
    }

    #[test]
    fn large_transfers_saturate_at_bandwidth_limit() {
        let (_, bw, _) = closed_loop(model(), IoOp::Read, 1 << 20, 32, 2_000);
        assert!(within(bw, 1e9, 3.0), "read bandwidth {bw}");
        let (_, bw, _) = closed_loop(model(), IoOp::Write { fua: false }, 128 << 10, 32, 5_000);
        assert!(within(bw, 4e8, 3.0), "write bandwidth {bw}");
    }

    #[test]
    fn parallelism_bounds_throughput_and_latency_grows_with_load() {
        let mut m = model();
        m.parallelism = 2;
        m.read_iops_max = 10_000_000;
        // 2 channels, 100 us + 4.096 us each => ~19.2k IOPS.
        let (ops, _, lat) = closed_loop(m, IoOp::Read, 4096, 32, 20_000);
        let expected = 2.0 / 104.096e-6;
        assert!(within(ops, expected, 3.0), "IOPS {ops} vs {expected}");
        // Little's law: latency ~ qd / throughput, far above base latency.
        assert!(lat > Duration::from_micros(1_000), "latency {lat:?}");
        let (_, _, lat1) = closed_loop(m, IoOp::Read, 4096, 1, 1_000);
        assert_eq!(lat1, Duration::from_nanos(104_096));
    }

    #[test]
    fn completions_held_until_deadline_and_data_visible() {
        let ssd = EmulatedSsd::new(1 << 20, 512, model()).expect("ssd");
        let mut q = ssd.open_queue().expect("queue");
        let t0 = Instant::now();
        let data = AlignedBuf::from_slice(&[7u8; 4096]);
        q.submit(
            IoRequest {
                tag: 1,
                op: IoOp::Write { fua: true },
                offset_bytes: 4096,
                len_bytes: 4096,
                buf: Some(data),
            },
            t0,
        );
        // Invalid request completes immediately.
        q.submit(
            IoRequest {
                tag: 2,
                op: IoOp::Read,
                offset_bytes: 1 << 20,
                len_bytes: 512,
                buf: Some(AlignedBuf::new(512)),
            },
            t0,
        );
        let mut out = Vec::new();
        q.poll_completions(t0, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tag, 2);
        assert!(matches!(
            out[0].result,
            Err(BackendError::OutOfRange { .. })
        ));
        let deadline = q.next_deadline().expect("deadline");
        assert_eq!(deadline - t0, Duration::from_nanos(30_000 + 10_240));
        out.clear();
        q.poll_completions(deadline - Duration::from_nanos(1), &mut out);
        assert!(out.is_empty());
        assert_eq!(q.in_flight(), 1);
        q.poll_completions(deadline, &mut out);
        assert_eq!(out.len(), 1);
        assert!(q.next_deadline().is_none());
        // A second queue on the same device sees the data.
        let mut q2 = ssd.open_queue().expect("queue");
        q2.submit(
            IoRequest {
                tag: 3,
                op: IoOp::Read,
                offset_bytes: 4096,
                len_bytes: 4096,
                buf: Some(AlignedBuf::new(4096)),
            },
            deadline,
        );
        let d2 = q2.next_deadline().expect("deadline");
        out.clear();
        q2.poll_completions(d2, &mut out);
        let buf = out.pop().and_then(|c| c.buf).expect("buf");
        assert!(buf.iter().all(|&b| b == 7));
    }
}
