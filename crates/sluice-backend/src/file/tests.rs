//! Unit tests for the file backend: both engines, FUA/Flush, range ops,
//! O_DIRECT fallback, short-read handling, backlog overflow.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// Temporary file removed on drop (std only; no extra dependency).
#[derive(Debug)]
pub(crate) struct TempPath(pub(crate) PathBuf);

impl TempPath {
    pub(crate) fn new(tag: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::var_os("SLUICE_TEST_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        Self(dir.join(format!(
            "sluice-backend-{}-{tag}-{n}.img",
            std::process::id()
        )))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(crate) fn wait_all(q: &mut dyn BackendQueue, want: usize) -> Vec<IoCompletion> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while out.len() < want {
        q.poll_completions(Instant::now(), &mut out);
        if out.len() < want {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for completions"
            );
            if let Some(fd) = q.notify_fd() {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 100) };
            } else {
                std::thread::yield_now();
            }
        }
    }
    assert_eq!(out.len(), want);
    out
}

fn run(q: &mut dyn BackendQueue, req: IoRequest) -> IoCompletion {
    q.submit(req, Instant::now());
    wait_all(q, 1).pop().expect("one completion")
}

fn opts(engine: EngineKind, direct: bool) -> FileOptions {
    FileOptions {
        direct,
        engine,
        create_size_bytes: Some(1 << 20),
        ..FileOptions::default()
    }
}

fn write(offset_bytes: u64, data: &[u8], fua: bool) -> IoRequest {
    IoRequest {
        tag: offset_bytes,
        op: IoOp::Write { fua },
        offset_bytes,
        len_bytes: data.len() as u64,
        buf: Some(AlignedBuf::from_slice(data)),
    }
}

fn read(offset_bytes: u64, len: usize) -> IoRequest {
    IoRequest {
        tag: 7,
        op: IoOp::Read,
        offset_bytes,
        len_bytes: len as u64,
        buf: Some(AlignedBuf::new(len)),
    }
}

const ENGINES: [EngineKind; 2] = [EngineKind::IoUring, EngineKind::Sync];

#[test]
fn write_read_fua_flush_both_engines() {
    for engine in ENGINES {
        for direct in [true, false] {
            let tmp = TempPath::new("rw");
            let be = FileBackend::open(&tmp.0, opts(engine, direct)).expect("open");
            assert_eq!(be.kind(), "file");
            assert_eq!(be.engine(), engine);
            let g = be.geometry();
            assert_eq!(g.size_bytes, 1 << 20);
            assert_eq!(g.block_size_bytes, 4096);
            assert!(g.volatile_write_cache);
            let mut q = be.open_queue().expect("queue");
            assert_eq!(q.notify_fd().is_some(), engine == EngineKind::IoUring);
            let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
            assert!(
                run(q.as_mut(), write(4096, &data, true)).result.is_ok(),
                "fua write"
            );
            assert!(
                run(q.as_mut(), write(65536, &data, false)).result.is_ok(),
                "plain write"
            );
            let flush = IoRequest {
                tag: 99,
                op: IoOp::Flush,
                offset_bytes: 0,
                len_bytes: 0,
                buf: None,
            };
            let c = run(q.as_mut(), flush);
            assert_eq!(c.tag, 99);
            assert!(c.result.is_ok(), "flush {:?}", c.result);
            for off in [4096u64, 65536] {
                let c = run(q.as_mut(), read(off, 8192));
                assert!(c.result.is_ok());
                assert_eq!(c.buf.expect("buf").as_slice(), data.as_slice());
            }
            // Independent check through std: the bytes reached the file.
            let on_disk = std::fs::read(&tmp.0).expect("read file");
            assert_eq!(&on_disk[4096..4096 + 8192], data.as_slice());
            assert_eq!(q.in_flight(), 0);
        }
    }
}

#[test]
fn write_zeroes_and_deallocate() {
    for engine in ENGINES {
        let tmp = TempPath::new("wz");
        let be = FileBackend::open(&tmp.0, opts(engine, true)).expect("open");
        let mut q = be.open_queue().expect("queue");
        let ones = vec![0xFFu8; 64 << 10];
        assert!(run(q.as_mut(), write(0, &ones, false)).result.is_ok());
        let ops = [
            (
                IoOp::WriteZeroes {
                    deallocate: false,
                    fua: true,
                },
                4096u64,
            ),
            (
                IoOp::WriteZeroes {
                    deallocate: true,
                    fua: false,
                },
                16384,
            ),
            (IoOp::Deallocate, 40960),
        ];
        for (op, off) in ops {
            let c = run(
                q.as_mut(),
                IoRequest {
                    tag: 1,
                    op,
                    offset_bytes: off,
                    len_bytes: 8192,
                    buf: None,
                },
            );
            assert!(c.result.is_ok(), "{op:?}: {:?}", c.result);
        }
        let c = run(q.as_mut(), read(0, 64 << 10));
        let buf = c.buf.expect("buf");
        for (i, &b) in buf.iter().enumerate() {
            let i = i as u64;
            let zero = (4096..12288).contains(&i)
                || (16384..24576).contains(&i)
                || (40960..49152).contains(&i);
            assert_eq!(b, if zero { 0 } else { 0xFF }, "byte {i} ({engine:?})");
        }
        // Size is unchanged by punch/zero-range (KEEP_SIZE).
        assert_eq!(std::fs::metadata(&tmp.0).expect("meta").len(), 1 << 20);
    }
}

#[test]
fn rejects_invalid_requests_and_read_only_writes() {
    let tmp = TempPath::new("inv");
    let be = FileBackend::open(&tmp.0, opts(EngineKind::IoUring, true)).expect("open");
    let mut q = be.open_queue().expect("queue");
    let c = run(q.as_mut(), read(1 << 20, 4096));
    assert!(matches!(c.result, Err(BackendError::OutOfRange { .. })));
    let c = run(q.as_mut(), read(512, 4096));
    assert!(matches!(c.result, Err(BackendError::Misaligned { .. })));
    let c = run(
        q.as_mut(),
        IoRequest {
            tag: 3,
            op: IoOp::Write { fua: false },
            offset_bytes: 0,
            len_bytes: 4096,
            buf: None,
        },
    );
    assert!(matches!(c.result, Err(BackendError::InvalidBuffer { .. })));
    drop(q);
    drop(be);
    let ro = FileBackend::open(
        &tmp.0,
        FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .expect("ro");
    assert!(ro.is_read_only());
    let mut q = ro.open_queue().expect("queue");
    let c = run(q.as_mut(), write(0, &[1u8; 4096], false));
    assert!(matches!(c.result, Err(BackendError::ReadOnly)));
    assert!(run(q.as_mut(), read(0, 4096)).result.is_ok());
}

#[test]
fn open_validates_options() {
    let tmp = TempPath::new("opt");
    let r = FileBackend::open(
        &tmp.0,
        FileOptions {
            block_size_bytes: Some(1024),
            ..opts(EngineKind::Sync, true)
        },
    );
    assert!(matches!(
        r,
        Err(BackendError::InvalidConfig {
            field: "block_size_bytes",
            ..
        })
    ));
    // Missing file without create_size_bytes.
    let r = FileBackend::open(&tmp.0, FileOptions::default());
    assert!(matches!(r, Err(BackendError::Io(_))));
    // Tail not a multiple of the block size is ignored; 512-byte blocks work.
    std::fs::write(&tmp.0, vec![0u8; 4096 * 3 + 100]).expect("write");
    let be = FileBackend::open(
        &tmp.0,
        FileOptions {
            block_size_bytes: Some(512),
            ..FileOptions::default()
        },
    )
    .expect("open");
    assert_eq!(be.geometry().size_bytes, 4096 * 3);
    assert_eq!(be.geometry().block_size_bytes, 512);
    // Existing larger file is not shrunk by create_size_bytes.
    let be = FileBackend::open(
        &tmp.0,
        FileOptions {
            create_size_bytes: Some(4096),
            ..FileOptions::default()
        },
    )
    .expect("open");
    assert_eq!(be.geometry().size_bytes, 4096 * 3);
    let r = FileBackend::open("/dev/null", FileOptions::default());
    assert!(r.is_err(), "char device refused");
}

#[test]
fn a_file_without_a_block_size_takes_its_filesystem_block() {
    // Linux nvmet's rule: the filesystem's block, at most 4096, so that no
    // direct write covers part of a filesystem block.
    assert_eq!(super::file_block_size(None, 4096), 4096);
    assert_eq!(super::file_block_size(None, 65536), 4096);
    assert_eq!(super::file_block_size(None, 1024), 512);
    assert_eq!(super::file_block_size(None, 0), 512);
    // Asked for: kept (warned about when smaller than the filesystem's).
    assert_eq!(super::file_block_size(Some(512), 4096), 512);
    assert_eq!(super::file_block_size(Some(4096), 512), 4096);
    // Opened: the temporary directory's filesystem decides.
    let tmp = TempPath::new("fsblock");
    std::fs::write(&tmp.0, vec![0u8; 1 << 16]).expect("write");
    let fs_block = std::fs::metadata(&tmp.0).expect("stat").blksize();
    let be = FileBackend::open(&tmp.0, FileOptions::default()).expect("open");
    let want = if fs_block >= 4096 { 4096 } else { 512 };
    assert_eq!(
        be.geometry().block_size_bytes,
        want,
        "st_blksize {fs_block}"
    );
}

#[test]
fn uring_backlog_beyond_ring_size_completes_everything() {
    let tmp = TempPath::new("deep");
    let be = FileBackend::open(
        &tmp.0,
        FileOptions {
            create_size_bytes: Some(8 << 20),
            ..opts(EngineKind::IoUring, true)
        },
    )
    .expect("open");
    let mut q = be.open_queue().expect("queue");
    let n = RING_ENTRIES as usize * 3;
    for i in 0..n {
        let off = (i as u64 % 2048) * 4096;
        q.submit(
            write(off, &[(i % 200) as u8 + 1; 4096], false),
            Instant::now(),
        );
    }
    assert_eq!(q.in_flight(), n);
    let done = wait_all(q.as_mut(), n);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_eq!(q.in_flight(), 0);
    // Dropping a queue with I/O in flight waits for the kernel.
    for i in 0..64u64 {
        q.submit(read(i * 4096, 4096), Instant::now());
    }
    drop(q);
}

#[test]
fn uring_short_read_at_eof_is_an_error_not_a_hang() {
    // Shrink the file behind the backend's back: reads past the new EOF see
    // 0 bytes, which must surface as ReadError.
    for engine in ENGINES {
        let tmp = TempPath::new("eof");
        let be = FileBackend::open(&tmp.0, opts(engine, false)).expect("open");
        let mut q = be.open_queue().expect("queue");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp.0)
            .expect("open")
            .set_len(4096 + 512)
            .expect("truncate");
        let c = run(q.as_mut(), read(4096, 8192));
        assert!(
            matches!(c.result, Err(BackendError::ReadError { .. })),
            "{engine:?}: {:?}",
            c.result
        );
        let c = run(q.as_mut(), read(0, 4096));
        assert!(c.result.is_ok());
    }
}

#[test]
fn notify_fd_becomes_readable() {
    let tmp = TempPath::new("fd");
    let be = FileBackend::open(&tmp.0, opts(EngineKind::IoUring, true)).expect("open");
    let mut q = be.open_queue().expect("queue");
    let fd = q.notify_fd().expect("uring fd");
    for req in [write(0, &[3u8; 4096], false), read(1 << 20, 4096)] {
        q.submit(req, Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
        assert_eq!(n, 1, "eventfd readable after submit");
        let mut out = Vec::new();
        while out.is_empty() {
            q.poll_completions(Instant::now(), &mut out);
        }
        // After reaping, the fd is quiet again.
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 0);
    }
}

#[test]
fn concurrent_queues_share_one_file() {
    let tmp = TempPath::new("mt");
    let be = Arc::new(FileBackend::open(&tmp.0, opts(EngineKind::Auto, true)).expect("open"));
    let threads: Vec<_> = (0..2u8)
        .map(|t| {
            let be = Arc::clone(&be);
            std::thread::spawn(move || {
                let mut q = be.open_queue().expect("queue");
                let base = u64::from(t) * (512 << 10);
                for i in 0..64u64 {
                    q.submit(
                        write(base + i * 4096, &[t + 1; 4096], i % 8 == 0),
                        Instant::now(),
                    );
                }
                assert!(wait_all(q.as_mut(), 64).iter().all(|c| c.result.is_ok()));
                let c = run(q.as_mut(), read(base, 64 * 4096));
                assert!(c.buf.expect("buf").iter().all(|&b| b == t + 1));
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn direct_flag_matches_open_fd() {
    for direct in [true, false] {
        let tmp = TempPath::new("direct");
        let be = FileBackend::open(&tmp.0, opts(EngineKind::Sync, direct)).expect("open");
        // SAFETY: F_GETFL on a valid fd.
        let flags =
            unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&*be.file), libc::F_GETFL) };
        assert!(flags >= 0);
        assert_eq!(be.is_direct(), flags & libc::O_DIRECT != 0);
        if !direct {
            assert!(!be.is_direct());
        }
        eprintln!(
            "{}: direct requested={direct} effective={}",
            tmp.0.display(),
            be.is_direct()
        );
    }
}

/// Block-device path (BLKGETSIZE64, BLKSSZGET, BLKZEROOUT, BLKDISCARD).
/// Destructive, so it only runs when `SLUICE_TEST_BLOCKDEV` names a scratch
/// device, e.g. a loop device: `losetup -f --show img` (8 MiB or more).
#[test]
fn block_device_when_provided() {
    let Some(dev) = std::env::var_os("SLUICE_TEST_BLOCKDEV") else {
        eprintln!("SLUICE_TEST_BLOCKDEV not set; skipping block-device test");
        return;
    };
    for engine in ENGINES {
        let be = FileBackend::open(
            &dev,
            FileOptions {
                engine,
                ..FileOptions::default()
            },
        )
        .expect("open device");
        assert_eq!(be.kind(), "block");
        let g = be.geometry();
        assert!(g.size_bytes >= 8 << 20, "{g:?}");
        assert!(!g.deallocated_reads_zero);
        let bs = g.block_size_bytes as usize;
        let mut q = be.open_queue().expect("queue");
        let data: Vec<u8> = (0..4 * bs).map(|i| (i % 253) as u8 | 1).collect();
        assert!(run(q.as_mut(), write(0, &data, true)).result.is_ok());
        let c = run(q.as_mut(), read(0, data.len()));
        assert_eq!(c.buf.expect("buf").as_slice(), data.as_slice());
        let wz = IoOp::WriteZeroes {
            deallocate: false,
            fua: true,
        };
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 1,
                op: wz,
                offset_bytes: bs as u64,
                len_bytes: bs as u64,
                buf: None,
            },
        );
        assert!(c.result.is_ok(), "{:?}", c.result);
        let c = run(q.as_mut(), read(0, data.len()));
        let buf = c.buf.expect("buf");
        assert!(buf[bs..2 * bs].iter().all(|&b| b == 0));
        assert_eq!(&buf[..bs], &data[..bs]);
        assert_eq!(&buf[2 * bs..], &data[2 * bs..]);
        let c = run(
            q.as_mut(),
            IoRequest {
                tag: 2,
                op: IoOp::Deallocate,
                offset_bytes: 0,
                len_bytes: 1 << 20,
                buf: None,
            },
        );
        assert!(c.result.is_ok(), "{:?}", c.result);
        let flush = IoRequest {
            tag: 3,
            op: IoOp::Flush,
            offset_bytes: 0,
            len_bytes: 0,
            buf: None,
        };
        assert!(run(q.as_mut(), flush).result.is_ok());
        let c = run(q.as_mut(), read(g.size_bytes, bs));
        assert!(matches!(c.result, Err(BackendError::OutOfRange { .. })));
    }
}

#[test]
fn revalidate_takes_in_a_file_grown_underneath_or_extended_never_a_shrink() {
    for engine in ENGINES {
        let tmp = TempPath::new("grow");
        let be = FileBackend::open(&tmp.0, opts(engine, true)).expect("open");
        let mut q = be.open_queue().expect("queue");
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
        assert!(run(q.as_mut(), write(0, &data, false)).result.is_ok());
        // Past the end: refused until the file grows.
        let past = run(q.as_mut(), write(1 << 20, &data, false));
        assert!(
            matches!(past.result, Err(BackendError::OutOfRange { size_bytes, .. }) if size_bytes == 1 << 20),
            "{:?}",
            past.result
        );
        // Nothing changed: the same size.
        assert_eq!(be.revalidate().expect("revalidate"), 1 << 20);
        // Grown underneath (`truncate -s`), by a part block too: whole blocks only.
        let f = OpenOptions::new().write(true).open(&tmp.0).expect("reopen");
        f.set_len((2 << 20) + 100).expect("grow the file");
        assert_eq!(be.size_bytes(), 1 << 20, "not before a revalidation");
        assert_eq!(be.revalidate().expect("revalidate"), 2 << 20);
        assert_eq!(be.size_bytes(), 2 << 20);
        assert_eq!(
            be.geometry().size_bytes,
            1 << 20,
            "the geometry is the one at open"
        );
        // The queue opened before sees the new size: the write lands and reads back.
        assert!(run(q.as_mut(), write(1 << 20, &data, false)).result.is_ok());
        let back = run(q.as_mut(), read(1 << 20, 4096));
        assert_eq!(back.buf.expect("buffer").as_slice(), &data[..]);
        // Extended to a size asked for, taken in by the next revalidation.
        be.extend(3 << 20).expect("extend");
        assert_eq!(std::fs::metadata(&tmp.0).expect("stat").len(), 3 << 20);
        assert_eq!(be.size_bytes(), 2 << 20, "not before a revalidation");
        assert_eq!(be.revalidate().expect("revalidate"), 3 << 20);
        // Asked for less than it has: neither the file nor the namespace shrinks.
        be.extend(1 << 20).expect("extend");
        assert_eq!(std::fs::metadata(&tmp.0).expect("stat").len(), 3 << 20);
        assert_eq!(be.revalidate().expect("revalidate"), 3 << 20);
        // Shrunk underneath: the namespace keeps its size, and I/O past the
        // file's end fails rather than reading nothing.
        f.set_len(1 << 20).expect("shrink the file");
        assert_eq!(be.revalidate().expect("revalidate"), 3 << 20);
        assert_eq!(be.size_bytes(), 3 << 20);
        let gone = run(q.as_mut(), read(2 << 20, 4096));
        assert!(gone.result.is_err(), "a read past the file's end succeeded");
        // Data below the end is intact.
        let first = run(q.as_mut(), read(0, 4096));
        assert_eq!(first.buf.expect("buffer").as_slice(), &data[..]);
    }
}

#[test]
fn a_read_only_file_is_not_extended() {
    let tmp = TempPath::new("ro-grow");
    drop(FileBackend::open(&tmp.0, opts(EngineKind::Sync, false)).expect("create"));
    let ro = FileBackend::open(
        &tmp.0,
        FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .expect("open read-only");
    assert!(matches!(ro.extend(2 << 20), Err(BackendError::ReadOnly)));
    assert_eq!(std::fs::metadata(&tmp.0).expect("stat").len(), 1 << 20);
    assert_eq!(ro.revalidate().expect("revalidate"), 1 << 20);
}
