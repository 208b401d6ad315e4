//! What the FUSE file answers, apart from how requests arrive: the one
//! file's rules (fixed size, read-only exports, which fallocate modes
//! work) and, for the session of our own (`uring.rs`), each decoded
//! request's outcome: a reply now, or block I/O to run first.
//!
//! Both sessions (fuser's and ours) use the same rules, so a file behaves
//! the same whichever transport serves it.

use super::abi::{self, Attr, Request};

pub const ROOT_INO: u64 = 1;
pub const FILE_INO: u64 = 2;
/// Seconds the kernel may cache entries and attributes.
pub const ATTR_TTL_S: u64 = 1;
const DT_DIR: u32 = 4;
const DT_REG: u32 = 8;

/// Where the file's size comes from: the exported device's size now (a
/// namespace grown online makes the file larger).
pub type SizeSource = std::sync::Arc<dyn Fn() -> u64 + Send + Sync>;

/// The one-file filesystem's rules.
#[derive(Clone)]
pub struct FileRules {
    pub file_name: String,
    pub read_only: bool,
    /// The file's size, asked at each request.
    pub size_source: SizeSource,
    pub block_size_bytes: u32,
    pub uid: u32,
    pub gid: u32,
    /// Mount time, seconds since the epoch (every timestamp).
    pub time_s: u64,
}

/// Block I/O a request needs before its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockIo {
    Read {
        offset: u64,
        len: usize,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
    Zero {
        offset: u64,
        len: u64,
    },
}

/// A request's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success with this reply body.
    Reply(Vec<u8>),
    /// Failure with this (positive) errno.
    Error(u32),
    /// No reply (FORGET).
    Silent,
    /// Run the I/O, then reply with its result.
    Io(BlockIo),
}

impl std::fmt::Debug for FileRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRules")
            .field("file_name", &self.file_name)
            .field("read_only", &self.read_only)
            .field("size_bytes", &self.size_bytes())
            .field("block_size_bytes", &self.block_size_bytes)
            .finish_non_exhaustive()
    }
}

impl FileRules {
    /// The file's size now.
    pub fn size_bytes(&self) -> u64 {
        (self.size_source)()
    }

    pub fn attr(&self, ino: u64) -> Attr {
        let (mode, size, nlink) = if ino == ROOT_INO {
            (libc::S_IFDIR | 0o755, 0, 2)
        } else {
            let perm = if self.read_only { 0o444 } else { 0o644 };
            (libc::S_IFREG | perm, self.size_bytes(), 1)
        };
        Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            time_s: self.time_s,
            mode,
            nlink,
            uid: self.uid,
            gid: self.gid,
            blksize: self.block_size_bytes.max(4096),
        }
    }

    /// Opening the file: refused for writing on a read-only export, and
    /// truncation is refused (the size is the namespace's).
    pub fn open(&self, ino: u64, flags: i32) -> Result<(), u32> {
        if ino != FILE_INO {
            return Err(errno(libc::EISDIR));
        }
        if self.read_only && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(errno(libc::EROFS));
        }
        if flags & libc::O_TRUNC != 0 && self.size_bytes() != 0 {
            return Err(errno(libc::EPERM));
        }
        Ok(())
    }

    /// A setattr: only the file's own size may be "set".
    pub fn setattr(&self, ino: u64, size: Option<u64>) -> Result<(), u32> {
        if ino != ROOT_INO && ino != FILE_INO {
            return Err(errno(libc::ENOENT));
        }
        match size {
            Some(s) if ino != FILE_INO || s != self.size_bytes() => Err(errno(libc::EPERM)),
            _ => Ok(()),
        }
    }

    /// The bytes a read of `size` at `offset` covers (short at the end;
    /// empty past it).
    pub fn read_range(&self, ino: u64, offset: u64, size: u32) -> Result<(u64, usize), u32> {
        if ino != FILE_INO {
            return Err(errno(libc::EISDIR));
        }
        let end = offset
            .saturating_add(u64::from(size))
            .min(self.size_bytes());
        let len = end.saturating_sub(offset);
        // len <= size, a u32.
        Ok((offset, usize::try_from(len).unwrap_or(0)))
    }

    /// How many of `len` bytes a write at `offset` takes: `ENOSPC` at or
    /// past the end, shortened across it.
    pub fn write_len(&self, ino: u64, offset: u64, len: usize) -> Result<usize, u32> {
        if ino != FILE_INO {
            return Err(errno(libc::EISDIR));
        }
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        let size_bytes = self.size_bytes();
        if offset >= size_bytes && len > 0 {
            return Err(errno(libc::ENOSPC));
        }
        let room = size_bytes - offset.min(size_bytes);
        Ok(len.min(usize::try_from(room).unwrap_or(usize::MAX)))
    }

    /// fallocate: the byte range to zero, if any. Plain allocation
    /// succeeds (every byte exists); PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE
    /// zero the range; other modes are `EOPNOTSUPP`.
    pub fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<Option<(u64, u64)>, u32> {
        if ino != FILE_INO {
            return Err(errno(libc::EISDIR));
        }
        let end = offset.saturating_add(length);
        let size_bytes = self.size_bytes();
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let zero = libc::FALLOC_FL_ZERO_RANGE;
        if mode == 0 || mode == libc::FALLOC_FL_KEEP_SIZE {
            return if end <= size_bytes || mode == libc::FALLOC_FL_KEEP_SIZE {
                Ok(None)
            } else {
                Err(errno(libc::EFBIG))
            };
        }
        if mode != punch && mode != zero && mode != zero | libc::FALLOC_FL_KEEP_SIZE {
            return Err(errno(libc::EOPNOTSUPP));
        }
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        let end = end.min(size_bytes);
        Ok((offset < end).then(|| (offset, end - offset)))
    }

    /// The root directory's entries from `offset` (1-based index of the
    /// next entry), as `(ino, next offset, dirent type, name)`.
    pub fn dir_entries(&self, offset: u64) -> impl Iterator<Item = (u64, u64, u32, &[u8])> + '_ {
        let entries: [(u64, u32, &[u8]); 3] = [
            (ROOT_INO, DT_DIR, b"."),
            (ROOT_INO, DT_DIR, b".."),
            (FILE_INO, DT_REG, self.file_name.as_bytes()),
        ];
        (1u64..)
            .zip(entries)
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .map(|(next, (ino, t, name))| (ino, next, t, name))
    }

    /// The outcome of a decoded request on inode `nodeid` (everything but
    /// INIT, which the session answers).
    pub fn handle(&self, nodeid: u64, r: &Request<'_>) -> Outcome {
        self.handle_with(nodeid, r, &mut |data| data.to_vec())
    }

    /// [`Self::handle`], with a write's data copied into the buffer
    /// `copy` makes of it (the ring reuses its buffers this way).
    pub fn handle_with(
        &self,
        nodeid: u64,
        r: &Request<'_>,
        copy: &mut dyn FnMut(&[u8]) -> Vec<u8>,
    ) -> Outcome {
        let ttl = ATTR_TTL_S;
        match *r {
            Request::Lookup { name } => {
                if nodeid == ROOT_INO && name == self.file_name.as_bytes() {
                    Outcome::Reply(abi::entry_out(FILE_INO, ttl, &self.attr(FILE_INO)))
                } else {
                    Outcome::Error(errno(libc::ENOENT))
                }
            }
            Request::Getattr => match nodeid {
                ROOT_INO | FILE_INO => Outcome::Reply(abi::attr_out(ttl, &self.attr(nodeid))),
                _ => Outcome::Error(errno(libc::ENOENT)),
            },
            Request::Setattr { size } => match self.setattr(nodeid, size) {
                Ok(()) => Outcome::Reply(abi::attr_out(ttl, &self.attr(nodeid))),
                Err(e) => Outcome::Error(e),
            },
            Request::Open { flags } => {
                match self.open(nodeid, i32::from_ne_bytes(flags.to_ne_bytes())) {
                    Ok(()) => Outcome::Reply(abi::open_out(0, abi::FOPEN_DIRECT_IO)),
                    Err(e) => Outcome::Error(e),
                }
            }
            Request::Read { offset, size } => match self.read_range(nodeid, offset, size) {
                Ok((_, 0)) => Outcome::Reply(Vec::new()),
                Ok((offset, len)) => Outcome::Io(BlockIo::Read { offset, len }),
                Err(e) => Outcome::Error(e),
            },
            Request::Write {
                offset,
                data,
                flags,
            } => match self.write_len(nodeid, offset, data.len()) {
                Ok(0) => Outcome::Reply(abi::write_out(0)),
                Ok(n) => Outcome::Io(BlockIo::Write {
                    offset,
                    data: copy(&data[..n]),
                    fua: i32::from_ne_bytes(flags.to_ne_bytes()) & (libc::O_SYNC | libc::O_DSYNC)
                        != 0,
                }),
                Err(e) => Outcome::Error(e),
            },
            Request::Flush | Request::Fsync => {
                if nodeid != FILE_INO || self.read_only {
                    Outcome::Reply(Vec::new())
                } else {
                    Outcome::Io(BlockIo::Flush)
                }
            }
            Request::Fallocate {
                offset,
                length,
                mode,
            } => {
                match self.fallocate(
                    nodeid,
                    offset,
                    length,
                    i32::from_ne_bytes(mode.to_ne_bytes()),
                ) {
                    Ok(Some((offset, len))) => Outcome::Io(BlockIo::Zero { offset, len }),
                    Ok(None) => Outcome::Reply(Vec::new()),
                    Err(e) => Outcome::Error(e),
                }
            }
            Request::Statfs => Outcome::Reply(abi::statfs_out(
                self.size_bytes() / u64::from(self.block_size_bytes.max(1)),
                self.block_size_bytes,
            )),
            Request::Opendir => {
                if nodeid == ROOT_INO {
                    Outcome::Reply(abi::open_out(0, 0))
                } else {
                    Outcome::Error(errno(libc::ENOTDIR))
                }
            }
            Request::Readdir { offset, size } => {
                if nodeid != ROOT_INO {
                    return Outcome::Error(errno(libc::ENOTDIR));
                }
                let room = size as usize;
                let mut b = Vec::new();
                for (ino, next, t, name) in self.dir_entries(offset) {
                    if !abi::push_dirent(&mut b, room, ino, next, t, name) {
                        break;
                    }
                }
                Outcome::Reply(b)
            }
            Request::Release | Request::Releasedir | Request::Fsyncdir | Request::Destroy => {
                Outcome::Reply(Vec::new())
            }
            Request::Forget => Outcome::Silent,
            // Requests are not cancelled: each finishes soon on its own.
            Request::Interrupt => Outcome::Silent,
            Request::Init { .. } => Outcome::Error(errno(libc::EPROTO)),
            Request::Other(_) => Outcome::Error(errno(libc::ENOSYS)),
        }
    }
}

fn errno(e: i32) -> u32 {
    u32::try_from(e).unwrap_or(5)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(read_only: bool) -> FileRules {
        FileRules {
            file_name: "disk.img".into(),
            read_only,
            size_source: std::sync::Arc::new(|| 1 << 20),
            block_size_bytes: 4096,
            uid: 0,
            gid: 0,
            time_s: 0,
        }
    }

    #[test]
    fn a_writes_data_is_copied_by_the_callers_copier_and_only_what_fits() {
        let r = rules(false);
        let data = [9u8; 300];
        let mut seen = Vec::new();
        let mut copy = |d: &[u8]| {
            seen.push(d.len());
            let mut b = vec![0xEE; 4096]; // a reused buffer, longer and stale
            b.truncate(d.len());
            b.copy_from_slice(d);
            b
        };
        let out = r.handle_with(
            FILE_INO,
            &Request::Write {
                offset: (1 << 20) - 100,
                data: &data,
                flags: 0,
            },
            &mut copy,
        );
        assert_eq!(
            out,
            Outcome::Io(BlockIo::Write {
                offset: (1 << 20) - 100,
                data: vec![9; 100],
                fua: false
            })
        );
        // Not asked to copy anything for a read or a refused write.
        let _ = r.handle_with(
            FILE_INO,
            &Request::Read {
                offset: 0,
                size: 4096,
            },
            &mut copy,
        );
        let refused = Request::Write {
            offset: 1 << 20,
            data: &data,
            flags: 0,
        };
        let _ = r.handle_with(FILE_INO, &refused, &mut copy);
        assert_eq!(seen, vec![100]);
    }

    #[test]
    fn reads_and_writes_stop_at_the_end_of_the_namespace() {
        let r = rules(false);
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Read {
                    offset: (1 << 20) - 100,
                    size: 4096
                }
            ),
            Outcome::Io(BlockIo::Read {
                offset: (1 << 20) - 100,
                len: 100
            })
        );
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Read {
                    offset: 1 << 21,
                    size: 4096
                }
            ),
            Outcome::Reply(vec![])
        );
        let data = [7u8; 200];
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Write {
                    offset: (1 << 20) - 100,
                    data: &data,
                    flags: 0
                }
            ),
            Outcome::Io(BlockIo::Write {
                offset: (1 << 20) - 100,
                data: vec![7; 100],
                fua: false
            })
        );
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Write {
                    offset: 1 << 20,
                    data: &data,
                    flags: 0
                }
            ),
            Outcome::Error(libc::ENOSPC as u32)
        );
        let ro = rules(true);
        assert_eq!(
            ro.handle(
                FILE_INO,
                &Request::Write {
                    offset: 0,
                    data: &data,
                    flags: 0
                }
            ),
            Outcome::Error(libc::EROFS as u32)
        );
        assert_eq!(
            ro.handle(
                FILE_INO,
                &Request::Open {
                    flags: libc::O_RDWR as u32
                }
            ),
            Outcome::Error(libc::EROFS as u32)
        );
    }

    #[test]
    fn fallocate_zeroes_punched_ranges_and_refuses_other_modes() {
        let r = rules(false);
        let punch = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Fallocate {
                    offset: 4096,
                    length: 1 << 30,
                    mode: punch
                }
            ),
            Outcome::Io(BlockIo::Zero {
                offset: 4096,
                len: (1 << 20) - 4096
            })
        );
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Fallocate {
                    offset: 0,
                    length: 4096,
                    mode: 0
                }
            ),
            Outcome::Reply(vec![])
        );
        // A hole punched wholly past the end: nothing to zero (found by
        // the fuse_request fuzz target).
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Fallocate {
                    offset: 1 << 40,
                    length: 4096,
                    mode: punch
                }
            ),
            Outcome::Reply(vec![])
        );
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Fallocate {
                    offset: 0,
                    length: 1 << 21,
                    mode: 0
                }
            ),
            Outcome::Error(libc::EFBIG as u32)
        );
        assert_eq!(
            r.handle(
                FILE_INO,
                &Request::Fallocate {
                    offset: 0,
                    length: 1,
                    mode: libc::FALLOC_FL_COLLAPSE_RANGE as u32
                }
            ),
            Outcome::Error(libc::EOPNOTSUPP as u32)
        );
    }

    #[test]
    fn the_directory_lists_its_one_file_and_lookup_finds_it() {
        let r = rules(false);
        let Outcome::Reply(b) = r.handle(
            ROOT_INO,
            &Request::Readdir {
                offset: 2,
                size: 4096,
            },
        ) else {
            panic!("readdir")
        };
        assert_eq!(&b[24..32], b"disk.img");
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), FILE_INO);
        let Outcome::Reply(e) = r.handle(ROOT_INO, &Request::Lookup { name: b"disk.img" }) else {
            panic!("lookup")
        };
        assert_eq!(u64::from_le_bytes(e[0..8].try_into().unwrap()), FILE_INO);
        assert_eq!(
            r.handle(ROOT_INO, &Request::Lookup { name: b"other" }),
            Outcome::Error(libc::ENOENT as u32)
        );
        assert_eq!(
            r.handle(FILE_INO, &Request::Other(99)),
            Outcome::Error(libc::ENOSYS as u32)
        );
    }
}
