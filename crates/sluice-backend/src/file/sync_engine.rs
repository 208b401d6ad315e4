//! Synchronous file engine: `pread` / `pwrite` / `fdatasync` executed inside
//! `submit`, completing at the next poll. Used when io_uring is unavailable
//! or explicitly requested.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::RawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{EngineKind, FileEngine};
use crate::{BackendError, IoCompletion, IoOp, IoRequest};

#[derive(Debug)]
pub(crate) struct SyncEngine {
    file: Arc<File>,
    ready: VecDeque<IoCompletion>,
}

impl SyncEngine {
    pub(crate) fn new(file: Arc<File>) -> Self {
        Self {
            file,
            ready: VecDeque::new(),
        }
    }

    fn execute(&self, req: &mut IoRequest) -> Result<(), BackendError> {
        let offset_bytes = req.offset_bytes;
        match req.op {
            IoOp::Read => {
                let buf = req
                    .buf
                    .as_mut()
                    .ok_or(BackendError::Unsupported("read without buffer"))?;
                self.file
                    .read_exact_at(buf.as_mut_slice(), offset_bytes)
                    .map_err(|source| BackendError::ReadError {
                        offset_bytes,
                        source,
                    })
            }
            IoOp::Write { fua } => {
                let buf = req
                    .buf
                    .as_ref()
                    .ok_or(BackendError::Unsupported("write without buffer"))?;
                self.file
                    .write_all_at(buf.as_slice(), offset_bytes)
                    .and_then(|()| if fua { self.file.sync_data() } else { Ok(()) })
                    .map_err(|source| BackendError::WriteFault {
                        offset_bytes,
                        source,
                    })
            }
            IoOp::Flush => self
                .file
                .sync_data()
                .map_err(|source| BackendError::WriteFault {
                    offset_bytes: 0,
                    source,
                }),
            IoOp::WriteZeroes { .. } | IoOp::Deallocate => {
                Err(BackendError::Unsupported("range op routed to engine"))
            }
        }
    }
}

impl FileEngine for SyncEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sync
    }

    fn submit(&mut self, mut req: IoRequest) {
        let result = self.execute(&mut req);
        self.ready
            .push_back(IoCompletion::new(req.tag, result, req.buf));
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) {
        out.extend(self.ready.drain(..));
    }

    fn notify_fd(&self) -> Option<RawFd> {
        None
    }

    fn signal(&self) {}

    fn in_flight(&self) -> usize {
        self.ready.len()
    }
}
