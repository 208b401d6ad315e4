//! The FUSE kernel ABI (`include/uapi/linux/fuse.h`), the part this export
//! speaks: request decoding and reply encoding, sans-IO.
//!
//! A request is a [`InHeader`] and the bytes after it. Over `/dev/fuse` they
//! arrive in one buffer; over io_uring the header, the operation's fixed
//! argument and the rest arrive in separate places. [`Request::parse`]
//! takes the two parts (`arg`, `rest`) so both transports share it. Nothing
//! here trusts lengths: a short buffer is [`AbiError`], never a panic.

use thiserror::Error;

/// Protocol version this export speaks (7.42 added io_uring).
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 42;

pub const IN_HEADER_BYTES: usize = 40;
pub const OUT_HEADER_BYTES: usize = 16;
pub const ATTR_BYTES: usize = 88;
pub const ENTRY_OUT_BYTES: usize = 40 + ATTR_BYTES;
pub const ATTR_OUT_BYTES: usize = 16 + ATTR_BYTES;
pub const INIT_OUT_BYTES: usize = 64;
pub const OPEN_OUT_BYTES: usize = 16;
pub const WRITE_OUT_BYTES: usize = 8;
pub const STATFS_OUT_BYTES: usize = 80;
/// The smallest read buffer the kernel accepts on `/dev/fuse`.
pub const MIN_READ_BUFFER_BYTES: usize = 8192;

/// Opcodes (`enum fuse_opcode`).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
}

/// `FUSE_INIT` flags (the low 32 bits in `flags`, the high in `flags2`).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `FOPEN_DIRECT_IO`: no page cache for this open file.
pub const FOPEN_DIRECT_IO: u32 = 1;
/// `FATTR_SIZE` in `fuse_setattr_in.valid`.
pub const FATTR_SIZE: u32 = 1 << 3;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AbiError {
    #[error("FUSE request too short: {what} needs {need} bytes, got {got}")]
    Short {
        what: &'static str,
        need: usize,
        got: usize,
    },
    #[error("FUSE request header length {len} does not match the {got} bytes read")]
    Length { len: u32, got: usize },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    let mut x = [0u8; 2];
    x.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(x)
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn need(what: &'static str, b: &[u8], n: usize) -> Result<(), AbiError> {
    if b.len() < n {
        return Err(AbiError::Short {
            what,
            need: n,
            got: b.len(),
        });
    }
    Ok(())
}

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Result<InHeader, AbiError> {
        need("fuse_in_header", b, IN_HEADER_BYTES)?;
        Ok(InHeader {
            len: u32_at(b, 0),
            opcode: u32_at(b, 4),
            unique: u64_at(b, 8),
            nodeid: u64_at(b, 16),
            uid: u32_at(b, 24),
            gid: u32_at(b, 28),
            pid: u32_at(b, 32),
            total_extlen: u16_at(b, 36),
        })
    }
}

/// The fixed argument's size for `opcode`: what the io_uring transport
/// puts in the header's op area rather than the payload.
pub fn fixed_arg_bytes(opcode: u32) -> usize {
    match opcode {
        op::INIT => 64,
        op::FORGET | op::INTERRUPT => 8,
        op::GETATTR | op::FSYNC | op::FSYNCDIR => 16,
        op::SETATTR => 88,
        op::OPEN | op::OPENDIR => 8,
        op::READ | op::READDIR | op::WRITE => 40,
        op::RELEASE | op::RELEASEDIR | op::FLUSH => 24,
        op::FALLOCATE => 32,
        op::BATCH_FORGET => 8,
        // LOOKUP (a name), STATFS, DESTROY and anything unknown: no fixed
        // argument.
        _ => 0,
    }
}

/// A decoded request: what this export acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Lookup {
        name: &'a [u8],
    },
    Forget,
    Getattr,
    Setattr {
        size: Option<u64>,
    },
    Open {
        flags: u32,
    },
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        data: &'a [u8],
        flags: u32,
    },
    Statfs,
    Release,
    Fsync,
    Flush,
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
    },
    Releasedir,
    Fsyncdir,
    Interrupt,
    Destroy,
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    /// Anything else: answered `ENOSYS`.
    Other(u32),
}

impl<'a> Request<'a> {
    /// Decodes `opcode`'s fixed argument `arg` and trailing bytes `rest`
    /// (over `/dev/fuse`, the body after the header split at
    /// [`fixed_arg_bytes`]).
    pub fn parse(opcode: u32, arg: &'a [u8], rest: &'a [u8]) -> Result<Request<'a>, AbiError> {
        need("the fixed argument", arg, fixed_arg_bytes(opcode))?;
        Ok(match opcode {
            op::INIT => {
                let flags = u64::from(u32_at(arg, 12));
                let flags2 = u64::from(u32_at(arg, 16));
                let ext = flags & init::INIT_EXT != 0;
                Request::Init {
                    major: u32_at(arg, 0),
                    minor: u32_at(arg, 4),
                    max_readahead: u32_at(arg, 8),
                    flags: flags | if ext { flags2 << 32 } else { 0 },
                }
            }
            op::LOOKUP => {
                // The name is NUL-terminated.
                let name = if arg.is_empty() { rest } else { arg };
                let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
                Request::Lookup { name: &name[..end] }
            }
            op::FORGET | op::BATCH_FORGET => Request::Forget,
            op::GETATTR => Request::Getattr,
            op::SETATTR => {
                let valid = u32_at(arg, 0);
                Request::Setattr {
                    size: (valid & FATTR_SIZE != 0).then(|| u64_at(arg, 16)),
                }
            }
            op::OPEN => Request::Open {
                flags: u32_at(arg, 0),
            },
            op::READ => Request::Read {
                offset: u64_at(arg, 8),
                size: u32_at(arg, 16),
            },
            op::WRITE => {
                let size = u32_at(arg, 16) as usize;
                need("the write's data", rest, size)?;
                Request::Write {
                    offset: u64_at(arg, 8),
                    data: &rest[..size],
                    flags: u32_at(arg, 32),
                }
            }
            op::STATFS => Request::Statfs,
            op::RELEASE => Request::Release,
            op::FSYNC => Request::Fsync,
            op::FLUSH => Request::Flush,
            op::OPENDIR => Request::Opendir,
            op::READDIR => Request::Readdir {
                offset: u64_at(arg, 8),
                size: u32_at(arg, 16),
            },
            op::RELEASEDIR => Request::Releasedir,
            op::FSYNCDIR => Request::Fsyncdir,
            op::INTERRUPT => Request::Interrupt,
            op::DESTROY => Request::Destroy,
            op::FALLOCATE => Request::Fallocate {
                offset: u64_at(arg, 8),
                length: u64_at(arg, 16),
                mode: u32_at(arg, 24),
            },
            other => Request::Other(other),
        })
    }

    /// Decodes one whole request as read from `/dev/fuse`.
    pub fn parse_message(b: &'a [u8]) -> Result<(InHeader, Request<'a>), AbiError> {
        let h = InHeader::parse(b)?;
        if h.len as usize != b.len() {
            return Err(AbiError::Length {
                len: h.len,
                got: b.len(),
            });
        }
        let body = &b[IN_HEADER_BYTES..];
        let fixed = fixed_arg_bytes(h.opcode).min(body.len());
        let (arg, rest) = body.split_at(fixed);
        Ok((h, Request::parse(h.opcode, arg, rest)?))
    }

    /// Whether the kernel waits for no reply (`FORGET`, `BATCH_FORGET`).
    pub fn no_reply(opcode: u32) -> bool {
        matches!(opcode, op::FORGET | op::BATCH_FORGET)
    }
}

/// `struct fuse_out_header` for a reply of `body_len` bytes.
pub fn out_header(unique: u64, error: i32, body_len: usize) -> [u8; OUT_HEADER_BYTES] {
    let mut h = [0u8; OUT_HEADER_BYTES];
    let len = u32::try_from(OUT_HEADER_BYTES + body_len).unwrap_or(u32::MAX);
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// Attributes of an inode (`struct fuse_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub time_s: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub blksize: u32,
}

impl Attr {
    fn put(&self, b: &mut Vec<u8>) {
        for v in [
            self.ino,
            self.size,
            self.blocks,
            self.time_s,
            self.time_s,
            self.time_s,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        // atimensec, mtimensec, ctimensec
        b.extend_from_slice(&[0u8; 12]);
        for v in [
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            0,
            self.blksize,
            0,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// `struct fuse_entry_out`.
pub fn entry_out(nodeid: u64, valid_s: u64, attr: &Attr) -> Vec<u8> {
    let mut b = Vec::with_capacity(ENTRY_OUT_BYTES);
    b.extend_from_slice(&nodeid.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // generation
    b.extend_from_slice(&valid_s.to_le_bytes()); // entry_valid
    b.extend_from_slice(&valid_s.to_le_bytes()); // attr_valid
    b.extend_from_slice(&[0u8; 8]); // the two nsec fields
    attr.put(&mut b);
    debug_assert_eq!(b.len(), ENTRY_OUT_BYTES);
    b
}

/// `struct fuse_attr_out`.
pub fn attr_out(valid_s: u64, attr: &Attr) -> Vec<u8> {
    let mut b = Vec::with_capacity(ATTR_OUT_BYTES);
    b.extend_from_slice(&valid_s.to_le_bytes());
    b.extend_from_slice(&[0u8; 8]); // attr_valid_nsec, dummy
    attr.put(&mut b);
    debug_assert_eq!(b.len(), ATTR_OUT_BYTES);
    b
}

/// `struct fuse_open_out`.
pub fn open_out(fh: u64, open_flags: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(OPEN_OUT_BYTES);
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&open_flags.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // backing_id
    b
}

/// `struct fuse_write_out`.
pub fn write_out(size: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(WRITE_OUT_BYTES);
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b
}

/// `struct fuse_statfs_out` (`struct fuse_kstatfs`).
pub fn statfs_out(blocks: u64, bsize: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(STATFS_OUT_BYTES);
    // blocks, bfree, bavail, files, ffree
    for v in [blocks, 0, 0, 2, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for v in [bsize, 255, bsize, 0] {
        // bsize, namelen, frsize, padding
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&[0u8; 24]);
    debug_assert_eq!(b.len(), STATFS_OUT_BYTES);
    b
}

/// What this export answers to `FUSE_INIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitReply {
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub max_pages: u16,
}

/// `struct fuse_init_out`.
pub fn init_out(r: &InitReply) -> Vec<u8> {
    let mut b = Vec::with_capacity(INIT_OUT_BYTES);
    b.extend_from_slice(&KERNEL_VERSION.to_le_bytes());
    b.extend_from_slice(&r.minor.to_le_bytes());
    b.extend_from_slice(&r.max_readahead.to_le_bytes());
    // The low half of the flags; the high half goes in flags2.
    b.extend_from_slice(&((r.flags & 0xffff_ffff) as u32).to_le_bytes());
    b.extend_from_slice(&r.max_background.to_le_bytes());
    b.extend_from_slice(&r.congestion_threshold.to_le_bytes());
    b.extend_from_slice(&r.max_write.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes()); // time_gran
    b.extend_from_slice(&r.max_pages.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes()); // map_alignment
    b.extend_from_slice(&((r.flags >> 32) as u32).to_le_bytes());
    b.resize(INIT_OUT_BYTES, 0); // max_stack_depth, unused
    b
}

/// Appends one `struct fuse_dirent` to `b` if it fits in `room` bytes;
/// returns whether it did.
pub fn push_dirent(
    b: &mut Vec<u8>,
    room: usize,
    ino: u64,
    next: u64,
    dtype: u32,
    name: &[u8],
) -> bool {
    let len = (24 + name.len()).next_multiple_of(8);
    if b.len() + len > room {
        return false;
    }
    b.extend_from_slice(&ino.to_le_bytes());
    b.extend_from_slice(&next.to_le_bytes());
    b.extend_from_slice(&u32::try_from(name.len()).unwrap_or(u32::MAX).to_le_bytes());
    b.extend_from_slice(&dtype.to_le_bytes());
    b.extend_from_slice(name);
    b.resize(b.len() + (len - 24 - name.len()), 0);
    true
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn header(len: u32, opcode: u32, unique: u64, nodeid: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&opcode.to_le_bytes());
        b.extend_from_slice(&unique.to_le_bytes());
        b.extend_from_slice(&nodeid.to_le_bytes());
        b.extend_from_slice(&[0u8; 16]);
        b
    }

    #[test]
    fn a_write_message_decodes_its_offset_and_data() {
        let data = b"hello world";
        let mut m = header(0, op::WRITE, 7, 2);
        let mut arg = vec![0u8; 40];
        arg[8..16].copy_from_slice(&4096u64.to_le_bytes());
        arg[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
        m.extend_from_slice(&arg);
        m.extend_from_slice(data);
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_le_bytes());
        let (h, r) = Request::parse_message(&m).unwrap();
        assert_eq!((h.unique, h.nodeid, h.opcode), (7, 2, op::WRITE));
        assert_eq!(
            r,
            Request::Write {
                offset: 4096,
                data,
                flags: 0
            }
        );
    }

    #[test]
    fn short_and_mislabelled_messages_are_errors() {
        assert!(matches!(
            Request::parse_message(&[0u8; 10]),
            Err(AbiError::Short { .. })
        ));
        let m = header(99, op::GETATTR, 1, 1);
        assert_eq!(
            Request::parse_message(&m),
            Err(AbiError::Length { len: 99, got: 40 })
        );
        // A write whose size runs past its data.
        let mut m = header(0, op::WRITE, 1, 2);
        let mut arg = vec![0u8; 40];
        arg[16..20].copy_from_slice(&100u32.to_le_bytes());
        m.extend_from_slice(&arg);
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(
            Request::parse_message(&m),
            Err(AbiError::Short {
                what: "the write's data",
                ..
            })
        ));
    }

    #[test]
    fn init_flags_take_the_high_half_only_with_init_ext() {
        let mut arg = vec![0u8; 64];
        arg[0..4].copy_from_slice(&7u32.to_le_bytes());
        arg[4..8].copy_from_slice(&45u32.to_le_bytes());
        arg[12..16].copy_from_slice(&((init::INIT_EXT | init::ASYNC_DIO) as u32).to_le_bytes());
        arg[16..20].copy_from_slice(&((init::OVER_IO_URING >> 32) as u32).to_le_bytes());
        let Ok(Request::Init { flags, minor, .. }) = Request::parse(op::INIT, &arg, &[]) else {
            panic!("init")
        };
        assert_eq!(minor, 45);
        assert_ne!(flags & init::OVER_IO_URING, 0);
        arg[12..16].copy_from_slice(&(init::ASYNC_DIO as u32).to_le_bytes());
        let Ok(Request::Init { flags, .. }) = Request::parse(op::INIT, &arg, &[]) else {
            panic!("init")
        };
        assert_eq!(flags & init::OVER_IO_URING, 0);
    }

    #[test]
    fn replies_have_the_kernels_sizes() {
        let a = Attr::default();
        assert_eq!(entry_out(2, 1, &a).len(), ENTRY_OUT_BYTES);
        assert_eq!(attr_out(1, &a).len(), ATTR_OUT_BYTES);
        let r = InitReply {
            minor: 42,
            max_readahead: 0,
            flags: init::INIT_EXT | init::OVER_IO_URING,
            max_background: 1,
            congestion_threshold: 1,
            max_write: 1 << 20,
            max_pages: 256,
        };
        let b = init_out(&r);
        assert_eq!(b.len(), INIT_OUT_BYTES);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 1 << 9);
        let mut d = Vec::new();
        assert!(push_dirent(&mut d, 64, 2, 3, 8, b"disk.img"));
        assert_eq!(d.len(), 32);
        assert!(!push_dirent(&mut d, 63, 2, 3, 8, b"disk.img"));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panicking(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = Request::parse_message(&b);
            if let Ok(h) = InHeader::parse(&b) {
                let body = &b[IN_HEADER_BYTES..];
                let _ = Request::parse(h.opcode, body, body);
            }
        }
    }
}
