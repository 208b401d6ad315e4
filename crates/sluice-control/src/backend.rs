//! An elastic volume as a target backend (`backend = "volume"`), so that an
//! unmodified NVMe/TCP host (`nvme connect`) uses a volume whose extents live
//! on other targets.
//!
//! The target's workers submit requests from their event loops and must
//! never block; the volume client is async. So the backend owns a small
//! tokio runtime: `submit` spawns the request onto it, the finished request
//! is queued for its worker, and the worker's eventfd is signalled
//! (`notify_fd`), which its event loop already waits on for io_uring
//! backends. Each worker queue has its own completion list and eventfd.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sluice_backend::{
    validate_request, AlignedBuf, Backend, BackendError, BackendQueue, Geometry, IoCompletion,
    IoOp, IoRequest,
};
use sluice_host::{ConnectOptions, IoFlags};
use sluice_runtime::notify::EventFd;

use crate::error::VolumeError;
use crate::volume::Volume;

/// Requests in flight per worker queue, at most (more fail with QueueFull,
/// which the host retries).
pub const QUEUE_IN_FLIGHT_MAX: usize = 1024;
/// How often the backend asks the control plane for the volume's size, so
/// that an online resize reaches the target's hosts (as a Namespace
/// Attribute Changed event) within about this long.
pub const SIZE_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A volume served as a namespace.
pub struct VolumeBackend {
    volume: Arc<Volume>,
    runtime: Arc<tokio::runtime::Runtime>,
    /// The geometry at open; the size grows in `size_bytes`.
    geometry: Geometry,
    /// The volume's size as last polled (see [`SIZE_POLL_INTERVAL`]).
    size_bytes: Arc<AtomicU64>,
}

impl std::fmt::Debug for VolumeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeBackend")
            .field("volume", &self.volume.name())
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl VolumeBackend {
    /// Opens volume `name` through the control plane at `control`; the
    /// drive connections use `opts` (their host NQN must be admitted by the
    /// drives).
    pub fn open(
        name: &str,
        control: &str,
        token_file: Option<&std::path::Path>,
        opts: ConnectOptions,
    ) -> Result<VolumeBackend, VolumeError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-volume")
            .enable_all()
            .build()
            .map_err(|e| VolumeError::Control(format!("starting the volume runtime: {e}")))?;
        let volume = runtime.block_on(crate::volume::open(control, token_file, name, opts))?;
        let geometry = Geometry::external(
            volume.size_blocks() * u64::from(volume.block_size_bytes()),
            volume.block_size_bytes(),
        );
        let volume = Arc::new(volume);
        let size_bytes = Arc::new(AtomicU64::new(geometry.size_bytes));
        runtime.spawn(watch_size(volume.clone(), size_bytes.clone()));
        Ok(VolumeBackend {
            volume,
            runtime: Arc::new(runtime),
            geometry,
            size_bytes,
        })
    }
}

/// Polls the control plane for the volume's size every
/// [`SIZE_POLL_INTERVAL`] and publishes growth in `size_bytes`. Runs until
/// the backend's runtime shuts down. An unreachable control plane is
/// logged once per outage; I/O does not depend on it.
async fn watch_size(volume: Arc<Volume>, size_bytes: Arc<AtomicU64>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(SIZE_POLL_INTERVAL).await;
        match volume.poll_size().await {
            Ok(now) => {
                if failing {
                    tracing::info!(volume = volume.name(), "control plane reachable again");
                    failing = false;
                }
                let before = size_bytes.fetch_max(now, Ordering::AcqRel);
                if now > before {
                    tracing::info!(
                        volume = volume.name(),
                        size_bytes_before = before,
                        size_bytes = now,
                        "volume grew online"
                    );
                }
            }
            Err(e) if !failing => {
                tracing::warn!(volume = volume.name(), error = %e,
                    "cannot poll the volume's size; an online resize will be seen once the control plane answers");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

impl Backend for VolumeBackend {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "volume"
    }

    fn open_queue(&self) -> Result<Box<dyn BackendQueue>, BackendError> {
        Ok(Box::new(VolumeQueue {
            volume: self.volume.clone(),
            runtime: self.runtime.clone(),
            geometry: self.geometry,
            size_bytes: self.size_bytes.clone(),
            shared: Arc::new(Shared {
                done: Mutex::new(Vec::new()),
                notify: EventFd::new()?,
            }),
            in_flight: Arc::new(AtomicUsize::new(0)),
        }))
    }
}

#[derive(Debug)]
struct Shared {
    done: Mutex<Vec<IoCompletion>>,
    notify: EventFd,
}

/// One worker's queue onto the volume.
#[derive(Debug)]
struct VolumeQueue {
    volume: Arc<Volume>,
    runtime: Arc<tokio::runtime::Runtime>,
    geometry: Geometry,
    size_bytes: Arc<AtomicU64>,
    shared: Arc<Shared>,
    in_flight: Arc<AtomicUsize>,
}

fn backend_error(e: VolumeError, offset_bytes: u64, write: bool) -> BackendError {
    match e {
        VolumeError::CapacityExceeded(m) => BackendError::CapacityExceeded(m),
        VolumeError::ControlUnavailable { .. } | VolumeError::Rebuilding { .. } => {
            BackendError::Unavailable(e.to_string())
        }
        VolumeError::Drive { .. } | VolumeError::DriveChanged { .. } if write => {
            BackendError::WriteFault {
                offset_bytes,
                source: std::io::Error::other(e.to_string()),
            }
        }
        VolumeError::Drive { .. } | VolumeError::DriveChanged { .. } => BackendError::ReadError {
            offset_bytes,
            source: std::io::Error::other(e.to_string()),
        },
        other => BackendError::Io(std::io::Error::other(other.to_string())),
    }
}

impl VolumeQueue {
    fn finish(shared: &Shared, in_flight: &AtomicUsize, c: IoCompletion) {
        shared
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(c);
        in_flight.fetch_sub(1, Ordering::AcqRel);
        shared.notify.signal();
    }
}

impl BackendQueue for VolumeQueue {
    fn submit(&mut self, req: IoRequest, _now: Instant) {
        let mut geometry = self.geometry;
        geometry.size_bytes = self.size_bytes.load(Ordering::Acquire);
        if let Err(e) = validate_request(&geometry, &req) {
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let c = IoCompletion::new(req.tag, Err(e), req.buf);
            Self::finish(&self.shared, &self.in_flight, c);
            return;
        }
        if self.in_flight.load(Ordering::Acquire) >= QUEUE_IN_FLIGHT_MAX {
            let in_flight = self.in_flight.load(Ordering::Acquire);
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let c = IoCompletion::new(req.tag, Err(BackendError::QueueFull { in_flight }), req.buf);
            Self::finish(&self.shared, &self.in_flight, c);
            return;
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let (volume, shared, in_flight) = (
            self.volume.clone(),
            self.shared.clone(),
            self.in_flight.clone(),
        );
        let bs = u64::from(self.geometry.block_size_bytes);
        self.runtime.spawn(async move {
            let IoRequest {
                tag,
                op,
                offset_bytes,
                len_bytes,
                buf,
            } = req;
            let lba = offset_bytes / bs;
            let (result, buf) = match op {
                IoOp::Read => {
                    let len = usize::try_from(len_bytes).unwrap_or(0);
                    match volume.read(lba, len, IoFlags::default()).await {
                        Ok(data) => {
                            let mut b = buf.unwrap_or_else(|| AlignedBuf::new(len));
                            b.as_mut_slice()[..data.len()].copy_from_slice(&data);
                            (Ok(()), Some(b))
                        }
                        Err(e) => (Err(backend_error(e, offset_bytes, false)), buf),
                    }
                }
                IoOp::Write { fua } => {
                    let flags = IoFlags {
                        fua,
                        ..IoFlags::default()
                    };
                    let r = match &buf {
                        Some(b) => volume.write(lba, b.as_slice(), flags).await,
                        None => Err(VolumeError::BadAnswer("write without data".into())),
                    };
                    (r.map_err(|e| backend_error(e, offset_bytes, true)), buf)
                }
                IoOp::Flush => (
                    volume
                        .flush()
                        .await
                        .map_err(|e| backend_error(e, offset_bytes, true)),
                    buf,
                ),
                IoOp::WriteZeroes { .. } => {
                    // Zeroes written as data: a volume has no cheaper way that
                    // is correct on every drive kind. Bounded by the
                    // transfer limit the request was validated against.
                    const CHUNK_BYTES: u64 = 4 << 20;
                    let zeros = vec![0u8; usize::try_from(len_bytes.min(CHUNK_BYTES)).unwrap_or(0)];
                    let mut at = 0;
                    let mut r = Ok(());
                    while at < len_bytes && r.is_ok() {
                        let n = (len_bytes - at).min(CHUNK_BYTES);
                        let chunk = &zeros[..usize::try_from(n).unwrap_or(0)];
                        r = volume
                            .write((offset_bytes + at) / bs, chunk, IoFlags::default())
                            .await;
                        at += n;
                    }
                    (r.map_err(|e| backend_error(e, offset_bytes, true)), buf)
                }
                IoOp::Deallocate => (
                    Err(BackendError::Unsupported("deallocate on a volume")),
                    buf,
                ),
            };
            VolumeQueue::finish(&shared, &in_flight, IoCompletion::new(tag, result, buf));
        });
    }

    fn poll_completions(&mut self, _now: Instant, out: &mut Vec<IoCompletion>) {
        self.shared.notify.drain();
        out.append(
            &mut self
                .shared
                .done
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn notify_fd(&self) -> Option<RawFd> {
        Some(self.shared.notify.as_raw_fd())
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
            + self
                .shared
                .done
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
    }
}
