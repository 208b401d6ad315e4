//! io_uring file engine: one ring per queue, an eventfd registered for
//! completion notification, FUA via `RWF_DSYNC`, Flush via
//! `IORING_OP_FSYNC` with `DATASYNC`. Short transfers are resubmitted for the
//! remainder. In-flight operations are bounded by the ring size; excess
//! requests wait in a bounded backlog.

use sluice_runtime::notify::EventFd;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring, Probe};
use sluice_runtime::cast::usize_from;

use super::{EngineKind, FileEngine};
use crate::{BackendError, IoCompletion, IoOp, IoRequest};

/// Submission ring entries (and in-flight slots) per queue.
pub const RING_ENTRIES: u32 = 256;
/// Requests waiting for a free slot, per queue, before `QueueFull`.
pub const BACKLOG_MAX: usize = 4096;

#[derive(Debug)]
struct Slot {
    req: IoRequest,
    done_bytes: u64,
}

pub(crate) struct UringEngine {
    ring: IoUring,
    file: Arc<File>,
    eventfd: EventFd,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    backlog: VecDeque<IoRequest>,
    /// Completions produced without the kernel (push failures, backlog full).
    ready: Vec<IoCompletion>,
    cqes: Vec<(u64, i32)>,
    needs_submit: bool,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("fd", &self.file.as_raw_fd())
            .field("eventfd", &self.eventfd)
            .field("in_flight_slots", &(self.slots.len() - self.free.len()))
            .field("backlog", &self.backlog.len())
            .finish_non_exhaustive()
    }
}

/// Checks that io_uring works here and supports the opcodes we use.
pub(crate) fn probe() -> io::Result<()> {
    let ring = IoUring::new(8)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for code in [opcode::Read::CODE, opcode::Write::CODE, opcode::Fsync::CODE] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring opcode {code} unsupported"),
            ));
        }
    }
    Ok(())
}

impl UringEngine {
    pub(crate) fn new(file: Arc<File>) -> io::Result<Self> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let eventfd = EventFd::new()?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        let slot_count = RING_ENTRIES as usize;
        Ok(Self {
            ring,
            file,
            eventfd,
            slots: (0..slot_count).map(|_| None).collect(),
            free: (0..slot_count).rev().collect(),
            backlog: VecDeque::new(),
            ready: Vec::new(),
            cqes: Vec::with_capacity(slot_count * 2),
            needs_submit: false,
        })
    }

    /// Pushes the SQE for the (remaining part of the) request in `index`.
    fn push_sqe(&mut self, index: usize) {
        let fd = types::Fd(self.file.as_raw_fd());
        let Some(slot) = self.slots[index].as_mut() else {
            unreachable!("push_sqe on an empty slot");
        };
        let remaining = slot.req.len_bytes - slot.done_bytes;
        // Validation bounds transfers by TRANSFER_BYTES_MAX < u32::MAX.
        let len = u32::try_from(remaining).unwrap_or(u32::MAX);
        let offset = slot.req.offset_bytes + slot.done_bytes;
        let done = usize_from(slot.done_bytes);
        let entry = match (slot.req.op, slot.req.buf.as_mut()) {
            (IoOp::Read, Some(buf)) => {
                assert!(done + len as usize <= buf.len());
                // SAFETY (pointer validity): the buffer's heap allocation
                // stays put and alive while the slot owns it.
                let ptr = unsafe { buf.as_mut_ptr().add(done) };
                opcode::Read::new(fd, ptr, len).offset(offset).build()
            }
            (IoOp::Write { fua }, Some(buf)) => {
                assert!(done + len as usize <= buf.len());
                // SAFETY: as above.
                let ptr = unsafe { buf.as_mut_ptr().add(done) };
                let flags = if fua { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, ptr, len)
                    .offset(offset)
                    .rw_flags(flags)
                    .build()
            }
            (IoOp::Flush, _) => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            _ => {
                self.complete(
                    index,
                    Err(BackendError::Unsupported(
                        "op not handled by io_uring engine",
                    )),
                );
                return;
            }
        };
        let entry = entry.user_data(index as u64);
        // SAFETY: the SQE references the slot's buffer, which outlives the
        // operation (slots are only freed on completion or in Drop after
        // waiting for the kernel).
        let pushed = unsafe { self.ring.submission().push(&entry) };
        match pushed {
            Ok(()) => self.needs_submit = true,
            Err(_) => self.complete(
                index,
                Err(BackendError::Io(io::Error::other(
                    "io_uring submission queue full",
                ))),
            ),
        }
    }

    fn complete(&mut self, index: usize, result: Result<(), BackendError>) {
        if let Some(slot) = self.slots[index].take() {
            self.free.push(index);
            self.ready
                .push(IoCompletion::new(slot.req.tag, result, slot.req.buf));
        }
    }

    fn start(&mut self, req: IoRequest) {
        let Some(index) = self.free.pop() else {
            unreachable!("start without a free slot");
        };
        assert!(self.slots[index].is_none());
        self.slots[index] = Some(Slot { req, done_bytes: 0 });
        self.push_sqe(index);
    }

    fn flush_submissions(&mut self) {
        if !self.needs_submit {
            return;
        }
        match self.ring.submit() {
            Ok(_) => self.needs_submit = false,
            Err(err) => match err.raw_os_error() {
                // Transient: entries stay in the SQ and are retried at poll.
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                _ => tracing::error!(%err, "io_uring submit failed; will retry"),
            },
        }
    }

    fn handle_cqe(&mut self, index: usize, res: i32) {
        let Some(slot) = self.slots.get_mut(index).and_then(Option::as_mut) else {
            tracing::error!(index, "io_uring completion for unknown slot");
            return;
        };
        let op = slot.req.op;
        let offset_bytes = slot.req.offset_bytes + slot.done_bytes;
        if res < 0 {
            let errno = -res;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                self.push_sqe(index);
                return;
            }
            let source = io::Error::from_raw_os_error(errno);
            let err = match op {
                IoOp::Read => BackendError::ReadError {
                    offset_bytes,
                    source,
                },
                _ => BackendError::WriteFault {
                    offset_bytes,
                    source,
                },
            };
            self.complete(index, Err(err));
            return;
        }
        if op == IoOp::Flush {
            self.complete(index, Ok(()));
            return;
        }
        let n = u64::from(res.unsigned_abs());
        let remaining = slot.req.len_bytes - slot.done_bytes;
        if n == 0 && remaining > 0 {
            let err = match op {
                IoOp::Read => BackendError::ReadError {
                    offset_bytes,
                    source: io::Error::from(io::ErrorKind::UnexpectedEof),
                },
                _ => BackendError::WriteFault {
                    offset_bytes,
                    source: io::Error::from(io::ErrorKind::WriteZero),
                },
            };
            self.complete(index, Err(err));
            return;
        }
        assert!(n <= remaining, "kernel transferred more than requested");
        slot.done_bytes += n;
        if slot.done_bytes < slot.req.len_bytes {
            self.push_sqe(index); // Short transfer: resubmit the remainder.
        } else {
            self.complete(index, Ok(()));
        }
    }
}

impl FileEngine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::IoUring
    }

    fn submit(&mut self, req: IoRequest) {
        if !self.free.is_empty() && self.backlog.is_empty() {
            self.start(req);
            self.flush_submissions();
        } else if self.backlog.len() < BACKLOG_MAX {
            self.backlog.push_back(req);
        } else {
            let in_flight = self.in_flight();
            self.ready.push(IoCompletion::new(
                req.tag,
                Err(BackendError::QueueFull { in_flight }),
                req.buf,
            ));
            self.signal();
        }
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) {
        // Reset the eventfd before reaping so no wakeup is lost.
        self.eventfd.drain();
        self.flush_submissions();
        self.cqes.clear();
        self.cqes
            .extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        let cqes = std::mem::take(&mut self.cqes);
        for &(user_data, res) in &cqes {
            self.handle_cqe(usize::try_from(user_data).unwrap_or(usize::MAX), res);
        }
        self.cqes = cqes;
        while !self.free.is_empty() {
            let Some(req) = self.backlog.pop_front() else {
                break;
            };
            self.start(req);
        }
        self.flush_submissions();
        debug_assert_eq!(
            self.slots.iter().filter(|s| s.is_none()).count(),
            self.free.len(),
            "free list out of sync with slots"
        );
        assert!(self.backlog.is_empty() || self.free.is_empty());
        out.append(&mut self.ready);
    }

    fn notify_fd(&self) -> Option<RawFd> {
        Some(self.eventfd.as_raw_fd())
    }

    fn signal(&self) {
        self.eventfd.signal();
    }

    fn in_flight(&self) -> usize {
        (self.slots.len() - self.free.len()) + self.backlog.len() + self.ready.len()
    }
}

impl Drop for UringEngine {
    /// Waits for the kernel to finish with every buffer before freeing them.
    fn drop(&mut self) {
        loop {
            let busy = self.slots.iter().filter(|s| s.is_some()).count();
            if busy == 0 {
                return;
            }
            if let Err(err) = self.ring.submit_and_wait(1) {
                if err.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                tracing::error!(%err, busy, "io_uring drain failed; leaking in-flight buffers");
                for slot in self.slots.iter_mut() {
                    std::mem::forget(slot.take());
                }
                return;
            }
            let done: Vec<u64> = self.ring.completion().map(|c| c.user_data()).collect();
            for user_data in done {
                if let Some(slot) = usize::try_from(user_data)
                    .ok()
                    .and_then(|i| self.slots.get_mut(i))
                {
                    *slot = None;
                }
            }
        }
    }
}
