//! Thin safe wrappers over the Linux calls the file backend needs that `std`
//! lacks: block-device ioctls, `fallocate`, and eventfd.

use rustix::fs::FallocateFlags;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use sluice_runtime::cast::usize_from;

use crate::AlignedBuf;

// `_IOR(0x12, 114, u64)`, `_IO(0x12, 119)`, `_IO(0x12, 127)` — the generic
// Linux ioctl encoding (x86_64, aarch64, riscv64). libc does not export them.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// Size in bytes of the block device behind `file`.
pub(crate) fn blk_size_bytes(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Logical block size of the block device behind `file`.
pub(crate) fn blk_logical_block_bytes(file: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET as _,
            &mut size as *mut libc::c_int,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(size).map_err(|_| io::Error::other("negative logical block size"))
}

fn blk_range_ioctl(
    file: &File,
    request: libc::c_ulong,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<()> {
    let range: [u64; 2] = [offset_bytes, len_bytes];
    // SAFETY: BLKDISCARD/BLKZEROOUT read two u64 (start, len) through the pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request as _, range.as_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn blk_discard(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    blk_range_ioctl(file, BLKDISCARD, offset_bytes, len_bytes)
}

pub(crate) fn blk_zeroout(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    blk_range_ioctl(file, BLKZEROOUT, offset_bytes, len_bytes)
}

/// Whether the block device `rdev` advertises discard support (sysfs).
pub(crate) fn blk_supports_discard(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!(
        "/sys/dev/block/{major}:{minor}/queue/discard_max_bytes"
    ))
    .ok()
    .and_then(|s| s.trim().parse::<u64>().ok())
    .is_some_and(|n| n > 0)
}

/// `fallocate(2)` with `mode`, retried on EINTR.
pub(crate) fn fallocate(
    file: &File,
    mode: FallocateFlags,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<()> {
    loop {
        match rustix::fs::fallocate(file, mode, offset_bytes, len_bytes) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}

/// True for errors meaning "this fallocate mode / ioctl is not available".
pub(crate) fn is_unsupported(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS | libc::EINVAL)
    )
}

/// Writes zeroes over the range with ordinary (aligned) writes.
pub(crate) fn write_zeroes(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    const STEP_BYTES: u64 = 1 << 20;
    let zeroes = AlignedBuf::new(usize_from(STEP_BYTES.min(len_bytes)));
    let mut done = 0u64;
    while done < len_bytes {
        let n = usize_from(STEP_BYTES.min(len_bytes - done));
        file.write_all_at(&zeroes[..n], offset_bytes + done)?;
        done += n as u64;
    }
    Ok(())
}
