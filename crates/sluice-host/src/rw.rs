//! Read and Write commands as the host builds them: [`IoFlags`] (the
//! per-I/O hints and their wire use, docs/host.md) and [`RwBuilder`], used
//! by [`crate::Namespace`] and by [`crate::DirectQueue`]'s callers.

use sluice_proto::command::{io, Sqe};

use crate::core::{LentBuf, Payload};
use crate::error::{HostError, Result};

/// CDW13 Dataset Management: Access Latency = 11b (low latency) for urgent I/O.
pub const DSM_ACCESS_LATENCY_LOW: u32 = 0b11 << 4;
/// CDW13 bit 8 (reserved in NVMe Read/Write, ignored by Linux nvmet): Sluice's
/// barrier hint. Sent only when [`crate::ConnectOptions::wire_hints`] is on.
pub const SLUICE_BARRIER_BIT: u32 = 1 << 8;

/// Per-I/O hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoFlags {
    /// Latency-sensitive: DSM Access Latency 11b in CDW13.
    pub urgent: bool,
    /// Ordering barrier: CDW13 bit 8 (Sluice-specific, see docs/host.md).
    pub barrier: bool,
    /// Force Unit Access (CDW12 bit 30).
    pub fua: bool,
    /// The caller's chain epoch, carried in CDW2-3 of reads and writes (0:
    /// none). Sluice drives refuse an I/O whose epoch is below its
    /// granule's fence with Stale Chain Epoch (`sluice_proto::fence`);
    /// other targets ignore these dwords.
    pub epoch: u64,
}

/// Builds one namespace's Read and Write commands exactly as
/// [`crate::Namespace::read`] and [`crate::Namespace::write`] do (CDW13 hints, FUA, the
/// write epoch), for callers that submit commands themselves
/// ([`crate::DirectQueue`]). A copy of what it needs: from
/// [`crate::Namespace::rw_builder`], valid for the association it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RwBuilder {
    pub(crate) nsid: u32,
    pub(crate) block_size_bytes: u32,
    pub(crate) size_blocks: u64,
    /// Most blocks one command may move.
    pub(crate) chunk_blocks: u32,
    pub(crate) wire_hints: bool,
}

impl RwBuilder {
    pub fn nsid(&self) -> u32 {
        self.nsid
    }
    pub fn block_size_bytes(&self) -> u32 {
        self.block_size_bytes
    }
    pub fn size_blocks(&self) -> u64 {
        self.size_blocks
    }
    /// The largest transfer of one command (MDTS, the host's cap, 65536
    /// blocks); [`crate::Namespace::read`] splits larger ones, these helpers refuse
    /// them.
    pub fn max_command_bytes(&self) -> u64 {
        u64::from(self.chunk_blocks) * u64::from(self.block_size_bytes)
    }

    /// One Read command of `len_bytes` at `lba`.
    pub fn read(&self, lba: u64, len_bytes: usize, flags: IoFlags) -> Result<(Sqe, Payload)> {
        let blocks = self.one_command(lba, len_bytes)?;
        let n = u32::try_from(len_bytes).map_err(|_| {
            HostError::InvalidArgument(format!("read of {len_bytes} bytes is too large"))
        })?;
        Ok((self.sqe(io::READ, lba, blocks, flags), Payload::Read(n)))
    }

    /// One Read command at `lba` into `buf` (its length is the read's; see
    /// [`Payload::ReadInto`]).
    pub fn read_into(&self, lba: u64, buf: Vec<u8>, flags: IoFlags) -> Result<(Sqe, Payload)> {
        let blocks = self.one_command(lba, buf.len())?;
        Ok((
            self.sqe(io::READ, lba, blocks, flags),
            Payload::ReadInto(buf),
        ))
    }

    /// One Read command at `lba` into lent memory (its length is the
    /// read's; see [`Payload::ReadLent`]).
    pub fn read_lent(&self, lba: u64, buf: LentBuf, flags: IoFlags) -> Result<(Sqe, Payload)> {
        let blocks = self.one_command(lba, buf.len_bytes())?;
        Ok((
            self.sqe(io::READ, lba, blocks, flags),
            Payload::ReadLent(buf),
        ))
    }

    /// One Write command of `data` at `lba`.
    pub fn write(&self, lba: u64, data: Vec<u8>, flags: IoFlags) -> Result<(Sqe, Payload)> {
        let blocks = self.one_command(lba, data.len())?;
        Ok((
            self.sqe(io::WRITE, lba, blocks, flags),
            Payload::Write(data),
        ))
    }

    /// A Flush of the namespace (every completed write made durable).
    pub fn flush(&self) -> (Sqe, Payload) {
        (Sqe::new(io::FLUSH, 0, self.nsid), Payload::None)
    }

    fn one_command(&self, lba: u64, len_bytes: usize) -> Result<u32> {
        let blocks = self.check(lba, len_bytes)?;
        match u32::try_from(blocks) {
            Ok(b) if b <= self.chunk_blocks => Ok(b),
            _ => Err(HostError::InvalidArgument(format!(
                "{len_bytes} bytes exceed one command ({} bytes); split the transfer",
                self.max_command_bytes()
            ))),
        }
    }

    /// The blocks of `len_bytes` at `lba`; refused locally when the length
    /// is not a positive multiple of the block size or the range leaves
    /// the namespace.
    pub(crate) fn check(&self, lba: u64, len_bytes: usize) -> Result<u64> {
        let bs = self.block_size_bytes as usize;
        if len_bytes == 0 || !len_bytes.is_multiple_of(bs) {
            return Err(HostError::InvalidArgument(format!(
                "length {len_bytes} is not a positive multiple of the {bs} byte block size"
            )));
        }
        let blocks = (len_bytes / bs) as u64;
        if lba.checked_add(blocks).is_none_or(|e| e > self.size_blocks) {
            return Err(HostError::InvalidArgument(format!(
                "LBA {lba} + {blocks} blocks beyond the namespace ({} blocks)",
                self.size_blocks
            )));
        }
        Ok(blocks)
    }

    /// A Read or Write SQE of `blocks` blocks at `lba` with `flags`.
    pub(crate) fn sqe(&self, opcode: u8, lba: u64, blocks: u32, flags: IoFlags) -> Sqe {
        let mut s = Sqe::rw(opcode, 0, self.nsid, lba, blocks, flags.fua);
        if self.wire_hints {
            let mut dsm = 0;
            if flags.urgent {
                dsm |= DSM_ACCESS_LATENCY_LOW;
            }
            if flags.barrier {
                dsm |= SLUICE_BARRIER_BIT;
            }
            s.set_cdw(13, dsm);
        }
        if (opcode == io::WRITE || opcode == io::READ) && flags.epoch != 0 {
            sluice_proto::fence::set_io_epoch(&mut s, flags.epoch);
        }
        s
    }
}
