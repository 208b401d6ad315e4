//! Socket engines for the target's connections, measured at the wire
//! (issue 12: "io_uring for the sockets is worth trying: keep it if it
//! beats epoll here, measured").
//!
//! The target's worker drives its sockets with epoll (`adaptive`: spin,
//! then sleep in `epoll_wait`) or spins on non-blocking `recv` (`busy`).
//! Before porting the worker to io_uring, this asks what io_uring can save
//! at all: one server thread pinned to CPU 0 answers the wire floor's
//! batched loop (the same client, `sluice-bench`'s floor, busy-polling on
//! CPU 1, NVMe-shaped messages) with no NVMe work in between, so the
//! socket calls are all there is to compare. Every engine reads whatever
//! has arrived and answers every whole request read with one send:
//!
//! * `blocking`: blocking `read` and `write` (two syscalls a round; the
//!   read sleeps in the kernel);
//! * `epoll`: non-blocking socket, `epoll_wait` when a read finds nothing
//!   (the target's sleeping half);
//! * `busy`: non-blocking socket, spinning on `read` (the target's busy
//!   mode and the spinning half of adaptive);
//! * `uring`: io_uring, one `recv` always armed and one `send` whenever
//!   replies are owed, both submitted and waited for in one
//!   `io_uring_enter` (one syscall a round, sleeping in the kernel);
//! * `uring-busy`: the same, entering without waiting and spinning;
//! * `uring-zc`: `uring` with zero-copy sends (`IORING_OP_SEND_ZC`) from a
//!   registered buffer, the send-side saving io_uring offers for large
//!   replies;
//! * `uring-multishot`: `uring` with one multishot `recv` into a ring of
//!   provided buffers, re-armed only when the kernel ends it: the
//!   receive-side saving.
//!
//! Reported per engine: messages per second, the p50 round trip, the
//! server thread's CPU per message (its `CLOCK_THREAD_CPUTIME_ID`) and its
//! syscalls per message. At each workload the engines run back to back,
//! `--repeats` times, starting from a different engine each repeat; ratios
//! to `epoll` are taken per repeat.

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use sluice_bench::wire::{batched_client, Answerer, Polling, REPLY_HEADER_BYTES, REQUEST_BYTES};
use sluice_runtime::clock::current_thread_cpu_ns;

use super::loadavg;
use crate::affinity::{cpus, get_mask, pin, set_mask};
use crate::report::{median, ratio_spread, spread, write};

/// The server's read buffer (as the floor's).
const SERVER_READ_BYTES: usize = 256 * 1024;
/// The most reply bytes one send carries.
const SERVER_WRITE_MAX_BYTES: usize = 4 << 20;
/// The client's read size.
const CLIENT_READ_BYTES: usize = 256 * 1024;
const RECV: u64 = 1;
const SEND: u64 = 2;

/// How the server drives its socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Blocking,
    Epoll,
    Busy,
    Uring,
    UringBusy,
    UringZc,
    UringMultishot,
}

impl Engine {
    pub const ALL: [Engine; 7] = [
        Engine::Epoll,
        Engine::Blocking,
        Engine::Busy,
        Engine::Uring,
        Engine::UringBusy,
        Engine::UringZc,
        Engine::UringMultishot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Blocking => "blocking",
            Engine::Epoll => "epoll",
            Engine::Busy => "busy",
            Engine::Uring => "uring",
            Engine::UringBusy => "uring-busy",
            Engine::UringZc => "uring-zc",
            Engine::UringMultishot => "uring-multishot",
        }
    }
}

/// What the server thread saw of one connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub requests_answered: u64,
    /// `read`/`write`/`epoll_wait`/`io_uring_enter` calls.
    pub syscalls: u64,
    /// The thread's CPU time while serving.
    pub cpu_ns: u64,
}

/// Answers the batched loop on `s` with `engine` until the client closes
/// and every reply owed is written.
pub fn serve(
    s: &mut TcpStream,
    engine: Engine,
    request_bytes: usize,
    reply_bytes: usize,
) -> std::io::Result<ServerStats> {
    let cpu0 = current_thread_cpu_ns();
    let mut a = Answerer::new(request_bytes, reply_bytes);
    let syscalls = match engine {
        Engine::Blocking | Engine::Epoll | Engine::Busy => {
            serve_sockets(s, engine, &mut a, reply_bytes)?
        }
        Engine::Uring | Engine::UringBusy | Engine::UringZc | Engine::UringMultishot => {
            let mode = UringMode {
                busy: engine == Engine::UringBusy,
                zero_copy: engine == Engine::UringZc,
                multishot: engine == Engine::UringMultishot,
            };
            serve_uring(s, mode, &mut a, reply_bytes)?
        }
    };
    Ok(ServerStats {
        requests_answered: a.answered(),
        syscalls,
        cpu_ns: current_thread_cpu_ns().saturating_sub(cpu0),
    })
}

fn reply_buffer(reply_bytes: usize) -> Vec<u8> {
    vec![
        0xa5u8;
        SERVER_WRITE_MAX_BYTES
            .min(reply_bytes * 64)
            .max(reply_bytes)
    ]
}

fn serve_sockets(
    s: &mut TcpStream,
    engine: Engine,
    a: &mut Answerer,
    reply_bytes: usize,
) -> std::io::Result<u64> {
    s.set_nonblocking(engine != Engine::Blocking)?;
    let mut rbuf = vec![0u8; SERVER_READ_BYTES];
    let wbuf = reply_buffer(reply_bytes);
    let epfd = if engine == Engine::Epoll {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Some(fd)
    } else {
        None
    };
    let mut armed_for = 0u32;
    let mut calls = 0u64;
    let mut eof = false;
    let result = (|| loop {
        while a.owed() > 0 {
            calls += 1;
            match s.write(&wbuf[..a.owed().min(wbuf.len())]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => a.wrote(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if eof {
            if a.owed() == 0 {
                return Ok(());
            }
        } else {
            calls += 1;
            match s.read(&mut rbuf) {
                Ok(0) => eof = true,
                Ok(n) => {
                    a.read(n);
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        // Nothing to read now (or only replies left to write).
        match epfd {
            Some(ep) => {
                let want = if a.owed() > 0 {
                    libc::EPOLLOUT as u32
                } else {
                    libc::EPOLLIN as u32
                };
                if want != armed_for {
                    let mut ev = libc::epoll_event {
                        events: want,
                        u64: 0,
                    };
                    let op = if armed_for == 0 {
                        libc::EPOLL_CTL_ADD
                    } else {
                        libc::EPOLL_CTL_MOD
                    };
                    calls += 1;
                    // SAFETY: `ev` outlives the call; fds are ours.
                    if unsafe { libc::epoll_ctl(ep, op, s.as_raw_fd(), &raw mut ev) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    armed_for = want;
                }
                let mut out = [libc::epoll_event { events: 0, u64: 0 }; 1];
                calls += 1;
                // SAFETY: `out` has room for the one event asked for.
                let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 1, 1000) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
            None => std::hint::spin_loop(),
        }
    })();
    if let Some(ep) = epfd {
        // SAFETY: closing the epoll fd this function opened.
        unsafe { libc::close(ep) };
    }
    result.map(|()| calls)
}

/// What an io_uring engine does beyond one `recv` and one `send` per
/// round, waiting in `io_uring_enter`.
#[derive(Clone, Copy, Debug)]
struct UringMode {
    /// Enter without waiting, and spin.
    busy: bool,
    /// `SEND_ZC` from a registered buffer.
    zero_copy: bool,
    /// One multishot `recv` into [`ProvidedBuffers`].
    multishot: bool,
}

fn serve_uring(
    s: &mut TcpStream,
    mode: UringMode,
    a: &mut Answerer,
    reply_bytes: usize,
) -> std::io::Result<u64> {
    s.set_nonblocking(false)?;
    // The buffers are declared before the ring, so they are dropped after
    // it: no operation can still point into them.
    let mut rbuf = vec![0u8; SERVER_READ_BYTES];
    let mut wbuf = reply_buffer(reply_bytes);
    let mut provided = if mode.multishot {
        Some(ProvidedBuffers::new()?)
    } else {
        None
    };
    let mut ring = IoUring::new(8)?;
    let fd = types::Fd(s.as_raw_fd());
    if mode.zero_copy {
        let iov = libc::iovec {
            iov_base: wbuf.as_mut_ptr().cast(),
            iov_len: wbuf.len(),
        };
        // SAFETY: `wbuf` outlives the ring and is never reallocated.
        unsafe { ring.submitter().register_buffers(&[iov]) }?;
    }
    if let Some(p) = &provided {
        p.register(&ring)?;
    }
    let rlen = u32::try_from(rbuf.len()).unwrap_or(u32::MAX);
    let (mut recv_armed, mut sending, mut eof) = (false, false, false);
    // Zero-copy sends whose buffer the kernel still holds.
    let mut notifs = 0u32;
    let mut calls = 0u64;
    loop {
        {
            let mut sq = ring.submission();
            if !eof && !recv_armed {
                let e = if mode.multishot {
                    opcode::RecvMulti::new(fd, PROVIDED_GROUP).build()
                } else {
                    opcode::Recv::new(fd, rbuf.as_mut_ptr(), rlen).build()
                };
                // SAFETY: `rbuf` and the provided buffers outlive the ring
                // (the loop only ends at end of stream, once the recv
                // completed).
                unsafe { sq.push(&e.user_data(RECV)) }
                    .map_err(|_| std::io::Error::other("sq full"))?;
                recv_armed = true;
            }
            if !sending && a.owed() > 0 {
                let n = u32::try_from(a.owed().min(wbuf.len())).unwrap_or(u32::MAX);
                let e = if mode.zero_copy {
                    opcode::SendZc::new(fd, wbuf.as_ptr(), n)
                        .buf_index(Some(0))
                        .build()
                } else {
                    opcode::Send::new(fd, wbuf.as_ptr(), n).build()
                };
                // SAFETY: `wbuf` outlives the send (the loop waits for it).
                unsafe { sq.push(&e.user_data(SEND)) }
                    .map_err(|_| std::io::Error::other("sq full"))?;
                sending = true;
            }
        }
        if eof && !sending && a.owed() == 0 && notifs == 0 {
            return Ok(calls);
        }
        calls += 1;
        match ring.submit_and_wait(usize::from(!mode.busy)) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        for cqe in ring.completion() {
            let (r, flags) = (cqe.result(), cqe.flags());
            // ENOBUFS: the multishot recv ran out of provided buffers and
            // ended; it is armed again below.
            if r < 0 && r != -libc::EINTR && r != -libc::EAGAIN && r != -libc::ENOBUFS {
                return Err(std::io::Error::from_raw_os_error(-r));
            }
            match cqe.user_data() {
                RECV => {
                    // A multishot recv stays armed while the kernel says so.
                    if !(mode.multishot && io_uring::cqueue::more(flags)) {
                        recv_armed = false;
                    }
                    if let (Some(p), Some(bid)) =
                        (provided.as_mut(), io_uring::cqueue::buffer_select(flags))
                    {
                        p.give_back(bid);
                    }
                    match r {
                        0 => eof = true,
                        n if n > 0 => {
                            a.read(usize::try_from(n).unwrap_or(0));
                        }
                        _ => {}
                    }
                }
                SEND if io_uring::cqueue::notif(flags) => {
                    notifs = notifs.saturating_sub(1);
                }
                SEND => {
                    sending = false;
                    if io_uring::cqueue::more(flags) {
                        notifs += 1;
                    }
                    if r > 0 {
                        a.wrote(usize::try_from(r).unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
        if mode.busy {
            std::hint::spin_loop();
        }
    }
}

/// Provided buffers of the multishot engine: count (a power of two) and
/// size of each, and their group id.
const PROVIDED_BUFFERS: u16 = 16;
const PROVIDED_BUFFER_BYTES: usize = 64 * 1024;
const PROVIDED_GROUP: u16 = 0;

/// A page-aligned anonymous mapping (the buffer ring must be page-aligned).
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> std::io::Result<Mapping> {
        // SAFETY: an anonymous private mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this value made.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// A ring of provided buffers (`io_uring_register_buf_ring`): the kernel
/// picks one for each completion of a multishot `recv`, which names it;
/// the owner gives it back once read.
struct ProvidedBuffers {
    /// The ring of entries (one page: room for 256).
    ring: Mapping,
    bufs: Vec<u8>,
    /// Entries published so far (the ring's tail).
    tail: u16,
}

impl ProvidedBuffers {
    fn new() -> std::io::Result<ProvidedBuffers> {
        let mut p = ProvidedBuffers {
            ring: Mapping::new(4096)?,
            bufs: vec![0u8; usize::from(PROVIDED_BUFFERS) * PROVIDED_BUFFER_BYTES],
            tail: 0,
        };
        for bid in 0..PROVIDED_BUFFERS {
            p.give_back(bid);
        }
        Ok(p)
    }

    /// Registers the ring with `ring`, which must not outlive `self`.
    fn register(&self, ring: &IoUring) -> std::io::Result<()> {
        // SAFETY: the mapping is page-aligned and holds the entries; the
        // caller drops the ring first.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                self.ring.ptr as u64,
                PROVIDED_BUFFERS,
                PROVIDED_GROUP,
                0,
            )
        }
    }

    /// Publishes buffer `bid` for the kernel to fill again.
    fn give_back(&mut self, bid: u16) {
        use std::sync::atomic::{AtomicU16, Ordering};
        let entries = self.ring.ptr.cast::<types::BufRingEntry>();
        let slot = usize::from(self.tail & (PROVIDED_BUFFERS - 1));
        let addr = self.bufs.as_mut_ptr() as u64
            + u64::from(bid % PROVIDED_BUFFERS) * PROVIDED_BUFFER_BYTES as u64;
        // SAFETY: `slot` < PROVIDED_BUFFERS entries, inside the mapping;
        // the kernel reads entries only up to the tail, published after.
        let e = unsafe { &mut *entries.add(slot) };
        e.set_addr(addr);
        e.set_len(u32::try_from(PROVIDED_BUFFER_BYTES).unwrap_or(u32::MAX));
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field of entry 0 lies inside the mapping, which
        // outlives this reference; the kernel reads it, so it is written
        // with release order after the entry.
        let tail = unsafe { AtomicU16::from_ptr(types::BufRingEntry::tail(entries).cast_mut()) };
        tail.store(self.tail, Ordering::Release);
    }
}

/// One workload of the comparison.
#[derive(Clone, Copy, Debug)]
struct Workload {
    name: &'static str,
    qd: u32,
    request_bytes: usize,
    reply_bytes: usize,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "4 KiB reads, QD 32",
        qd: 32,
        request_bytes: REQUEST_BYTES,
        reply_bytes: REPLY_HEADER_BYTES + 4096,
    },
    Workload {
        name: "4 KiB reads, QD 1",
        qd: 1,
        request_bytes: REQUEST_BYTES,
        reply_bytes: REPLY_HEADER_BYTES + 4096,
    },
    Workload {
        name: "128 KiB reads, QD 8",
        qd: 8,
        request_bytes: REQUEST_BYTES,
        reply_bytes: REPLY_HEADER_BYTES + (128 << 10),
    },
];

/// One run's figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    pub msgs_per_s: f64,
    pub latency_us_p50: f64,
    pub server_cpu_us_per_msg: f64,
    pub server_syscalls_per_msg: f64,
    pub server_busy: f64,
}

/// Runs the batched loop for `dur` against a server thread on `server_cpu`
/// using `engine`, the client on the calling thread.
pub fn run_one(
    engine: Engine,
    qd: u32,
    request_bytes: usize,
    reply_bytes: usize,
    server_cpu: Option<usize>,
    dur: Duration,
) -> Result<Figures> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding the socket-engine server")?;
    let addr = l.local_addr()?;
    let server = std::thread::Builder::new()
        .name(format!("sock-{}", engine.name()))
        .spawn(move || -> Result<ServerStats> {
            if let Some(c) = server_cpu {
                pin(0, c)?;
            }
            let (mut s, _) = l.accept().context("accepting the client")?;
            s.set_nodelay(true)?;
            Ok(serve(&mut s, engine, request_bytes, reply_bytes)?)
        })?;
    let mut s = TcpStream::connect(addr).context("connecting to the socket-engine server")?;
    s.set_nodelay(true)?;
    let run = batched_client(
        &mut s,
        Polling::Busy,
        qd,
        request_bytes,
        reply_bytes,
        CLIENT_READ_BYTES,
        dur,
    )?;
    drop(s);
    let st = server
        .join()
        .map_err(|_| anyhow::anyhow!("the {} server panicked", engine.name()))??;
    if st.requests_answered != run.requests_total || run.replies_total != run.requests_total {
        bail!(
            "{}: {} requests sent, {} answered, {} replies read",
            engine.name(),
            run.requests_total,
            st.requests_answered,
            run.replies_total
        );
    }
    #[allow(clippy::cast_precision_loss)]
    let per = |x: u64| x as f64 / st.requests_answered.max(1) as f64;
    #[allow(clippy::cast_precision_loss)]
    Ok(Figures {
        msgs_per_s: run.replies_in_window as f64 / run.window_s.max(1e-9),
        latency_us_p50: run.latency_ns.value_at_quantile(0.5) as f64 / 1000.0,
        server_cpu_us_per_msg: per(st.cpu_ns) / 1000.0,
        server_syscalls_per_msg: per(st.syscalls),
        server_busy: st.cpu_ns as f64 / 1e9 / run.window_s.max(1e-9),
    })
}

/// `sluice-lab sockets`: every engine at every workload, `repeats` times;
/// writes socket-engines.md.
pub fn run(out: &Path, runtime: f64, repeats: u32) -> Result<()> {
    let load0 = loadavg();
    let two = cpus() >= 2;
    let (server_cpu, client_cpu) = if two {
        (Some(0), Some(1))
    } else {
        (None, None)
    };
    let mask = get_mask()?;
    if let Some(c) = client_cpu {
        pin(0, c)?;
    }
    let dur = Duration::from_secs_f64(runtime);
    // [workload][engine][repeat]
    let mut res: Vec<Vec<Vec<Figures>>> =
        vec![vec![Vec::new(); Engine::ALL.len()]; WORKLOADS.len()];
    let outcome = (|| -> Result<()> {
        for rep in 0..repeats {
            for (wi, w) in WORKLOADS.iter().enumerate() {
                // This machine drifts between a fast and a slow state (4 KiB
                // at QD 32: ~950k or ~380k msg/s for every engine) on a
                // scale of seconds; rotating the order spreads a change of
                // state over the engines instead of always charging it to
                // the last ones.
                let n = Engine::ALL.len();
                for k in 0..n {
                    let ei = (k + rep as usize) % n;
                    let e = &Engine::ALL[ei];
                    let f = run_one(*e, w.qd, w.request_bytes, w.reply_bytes, server_cpu, dur)?;
                    eprintln!(
                        "sockets: repeat {rep} {} {}: {:.0} msg/s, p50 {:.1} us, server {:.2} us CPU and {:.3} syscalls per msg ({:.0} % busy)",
                        w.name,
                        e.name(),
                        f.msgs_per_s,
                        f.latency_us_p50,
                        f.server_cpu_us_per_msg,
                        f.server_syscalls_per_msg,
                        f.server_busy * 100.0
                    );
                    res[wi][ei].push(f);
                }
            }
        }
        Ok(())
    })();
    set_mask(&mask)?;
    outcome?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Socket engines at the wire: epoll, busy polling and io_uring\n"
    );
    let _ = writeln!(
        md,
        "`sluice-lab sockets --runtime {runtime} --repeats {repeats}`; load average before: {load0}; after: {}. Server thread pinned to CPU 0, the floor's batched client busy-polling on CPU 1, no NVMe work between the reads and the sends (`crates/sluice-lab/src/datapath/sockets.rs` says what each engine does). Cells: median (range) over the repeats; ratios to `epoll` taken per repeat.\n",
        loadavg()
    );
    for (wi, w) in WORKLOADS.iter().enumerate() {
        let _ = writeln!(md, "## {}\n", w.name);
        let _ = writeln!(
            md,
            "| engine | msg/s | vs epoll | p50 µs | vs epoll | server CPU µs/msg | vs epoll | syscalls/msg | server busy |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
        let col =
            |ei: usize, f: fn(&Figures) -> f64| -> Vec<f64> { res[wi][ei].iter().map(f).collect() };
        let base_rate = col(0, |f| f.msgs_per_s);
        let base_lat = col(0, |f| f.latency_us_p50);
        let base_cpu = col(0, |f| f.server_cpu_us_per_msg);
        for (ei, e) in Engine::ALL.iter().enumerate() {
            let rate = col(ei, |f| f.msgs_per_s);
            let lat = col(ei, |f| f.latency_us_p50);
            let cpu = col(ei, |f| f.server_cpu_us_per_msg);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.0} % |",
                e.name(),
                spread(&rate, 0),
                ratio_spread(&rate, &base_rate),
                spread(&lat, 1),
                ratio_spread(&lat, &base_lat),
                spread(&cpu, 2),
                ratio_spread(&cpu, &base_cpu),
                median(&col(ei, |f| f.server_syscalls_per_msg)),
                median(&col(ei, |f| f.server_busy)) * 100.0,
            );
        }
        let _ = writeln!(md);
    }
    write(out, "socket-engines.md", &md)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Every engine answers every request of the batched loop, at QD 1 and
    /// QD 32, with small and large replies (the client checks the counts
    /// and `run_one` checks them against the server's).
    #[test]
    fn every_engine_answers_every_request() {
        for e in Engine::ALL {
            for (qd, reply) in [(1, 24), (32, 4112), (4, 128 << 10)] {
                let f = run_one(e, qd, 72, reply, None, Duration::from_millis(100))
                    .unwrap_or_else(|err| panic!("{}: {err:#}", e.name()));
                assert!(f.msgs_per_s > 0.0, "{}: {f:?}", e.name());
                assert!(f.server_syscalls_per_msg > 0.0, "{}: {f:?}", e.name());
            }
        }
    }
}
