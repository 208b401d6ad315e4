//! One connection as a worker holds it: the socket, its
//! [`QueueConnection`], its admission [`Permit`], readiness flags and the
//! cached tenant; reading (with a per-socket budget for fairness, and
//! giving the handshake slot back once Connect is accepted) and writing
//! until WouldBlock; reads end at WouldBlock or a short read (epoll is
//! edge-triggered).

use crate::admission::Permit;
use crate::metrics::ReceiveTotals;
use crate::queue::QueueConnection;
use crate::tenant::worker::WorkerTenancy;
use crate::tenant::TenantId;
use mio::net::TcpStream;
use std::io::{self, Read, Write};
use std::time::Instant;

/// Bytes read from one socket before moving on to others (fairness).
const READ_BUDGET_BYTES: usize = 1 << 20;

pub(super) struct ConnEntry {
    pub(super) stream: TcpStream,
    pub(super) conn: QueueConnection,
    /// Readable edge seen and the socket not yet read empty (WouldBlock,
    /// or a short read).
    pub(super) read_ready: bool,
    /// Last write hit WouldBlock; wait for a writable edge.
    pub(super) write_blocked: bool,
    /// The last write sent only what the congestion window admitted and
    /// left due bytes: the worker writes again next turn without sleeping
    /// (no edge will come: the socket's buffer is not full).
    pub(super) window_capped: bool,
    pub(super) closed_socket: bool,
    /// (tenant table generation, tenant) once the host NQN is known.
    pub(super) tenant: Option<(u64, TenantId)>,
    /// An I/O queue counted in `io_queues` (placed after its Connect).
    pub(super) placed: bool,
    /// Its share of the connection limits, released with the entry.
    pub(super) permit: Permit,
}

/// The connection's tenant, cached once its host NQN is known.
pub(super) fn conn_tenant(e: &mut ConnEntry, t: &WorkerTenancy) -> TenantId {
    let gen = t.generation();
    match e.tenant {
        Some((g, id)) if g == gen => id,
        _ => {
            let host = e.conn.hostnqn();
            let id = t.tenant_of(host);
            if host.is_some() {
                e.tenant = Some((gen, id));
                if let Some(name) = t.tenant_name(id) {
                    e.conn.record_tenant(name);
                }
            }
            id
        }
    }
}

/// Whether the connection has input to read this turn: its socket may hold
/// bytes, its queue takes them, and its tenant is not throttled.
pub(super) fn more_input(e: &ConnEntry, throttled: bool) -> bool {
    e.read_ready && e.conn.wants_read() && !throttled
}

/// Reads what the socket has (up to the budget) into the queue, and
/// counts what it read in `totals`.
pub(super) fn read_conn(e: &mut ConnEntry, now: Instant, totals: &ReceiveTotals) -> bool {
    let mut got = Received::default();
    let progressed = read_socket(e, now, &mut got);
    totals.add(got.bytes, got.in_place_bytes);
    if e.permit.is_handshaking() && e.conn.controller().is_some() {
        e.permit.handshake_done();
    }
    progressed
}

/// Bytes one [`read_conn`] read, and how many of them went in place.
#[derive(Default)]
struct Received {
    bytes: u64,
    in_place_bytes: u64,
}

fn read_socket(e: &mut ConnEntry, now: Instant, got: &mut Received) -> bool {
    let mut total = 0usize;
    loop {
        if !e.conn.wants_read() {
            return total > 0;
        }
        let (a, b) = e.conn.recv_bufs();
        let room = a.len() + b.len();
        let r = if a.is_empty() {
            e.stream.read(b)
        } else {
            e.stream
                .read_vectored(&mut [io::IoSliceMut::new(a), io::IoSliceMut::new(b)])
        };
        match r {
            Ok(0) => {
                e.read_ready = false;
                e.conn.handle_peer_closed("peer closed the connection");
                return true;
            }
            Ok(n) => {
                got.in_place_bytes += e.conn.handle_received(n, now) as u64;
                got.bytes += n as u64;
                total += n;
                if total >= READ_BUDGET_BYTES {
                    // Leave read_ready set: more may be waiting.
                    return true;
                }
                if n < room {
                    // A short read emptied the socket: the next bytes
                    // raise a new edge (epoll is edge-triggered), so no
                    // `recv` is spent to see WouldBlock.
                    e.read_ready = false;
                    return true;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                e.read_ready = false;
                return total > 0;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                e.read_ready = false;
                e.conn.handle_peer_closed(&format!("read error: {err}"));
                return true;
            }
        }
    }
}

/// Runs of due bytes handed to one `writev` (headers and small PDUs are
/// one run per freight flush; each large read's data is a run of its own).
const WRITE_RUNS_MAX: usize = 64;

/// With `target.send_within_cwnd`, a write of more due bytes than this
/// first asks how much the congestion window admits (one `TCP_INFO`).
/// Smaller writes (a turn's 4 KiB reads at QD 32 are about 140 KiB) never
/// ask.
const WINDOW_CHECK_BYTES_MIN: usize = 256 << 10;
/// The least a write capped by the congestion window sends, so that every
/// turn makes progress even when the window reports full.
const WINDOW_CAPPED_WRITE_BYTES_MIN: usize = 64 << 10;

/// How many bytes this write sends: all that is due, or with
/// `within_cwnd` and more than [`WINDOW_CHECK_BYTES_MIN`] due, what the
/// congestion window admits (`room`, asked only then), at least
/// [`WINDOW_CAPPED_WRITE_BYTES_MIN`].
fn write_limit_bytes(
    due_bytes: usize,
    within_cwnd: bool,
    room: impl FnOnce() -> Option<usize>,
) -> usize {
    if !within_cwnd || due_bytes <= WINDOW_CHECK_BYTES_MIN {
        return due_bytes;
    }
    match room() {
        Some(r) => r.max(WINDOW_CAPPED_WRITE_BYTES_MIN).min(due_bytes),
        None => due_bytes,
    }
}

/// The first `limit` bytes of `runs`, as runs in `out`; returns how many.
fn runs_within<'b>(
    runs: &'b [io::IoSlice<'_>],
    limit: usize,
    out: &mut [io::IoSlice<'b>],
) -> usize {
    let mut left = limit;
    let mut n = 0;
    for (run, o) in runs.iter().zip(out.iter_mut()) {
        if left == 0 {
            break;
        }
        let take = run.len().min(left);
        *o = io::IoSlice::new(&run[..take]);
        left -= take;
        n += 1;
    }
    n
}

pub(super) fn write_conn(e: &mut ConnEntry, now: Instant, within_cwnd: bool) -> bool {
    let mut wrote = false;
    e.window_capped = false;
    loop {
        let mut runs = [io::IoSlice::new(&[]); WRITE_RUNS_MAX];
        let n = e.conn.due_vectored(&mut runs);
        if n == 0 {
            return wrote;
        }
        let due: usize = runs[..n].iter().map(|r| r.len()).sum();
        let stream = &e.stream;
        let limit = write_limit_bytes(due, within_cwnd, || {
            sluice_runtime::net::tcp_send_window_room_bytes(stream).ok()
        });
        // Filled only when the window caps the write.
        let mut capped_runs;
        let (runs, n) = if limit < due {
            capped_runs = [io::IoSlice::new(&[]); WRITE_RUNS_MAX];
            let m = runs_within(&runs[..n], limit, &mut capped_runs);
            (&capped_runs, m)
        } else {
            (&runs, n)
        };
        let res = if n == 1 {
            e.stream.write(&runs[0])
        } else {
            e.stream.write_vectored(&runs[..n])
        };
        match res {
            Ok(0) => {
                e.conn.handle_peer_closed("socket accepted no bytes");
                return true;
            }
            Ok(n) => {
                wrote = true;
                e.conn.consume(n, now);
                if limit < due {
                    // The rest waits for this worker's next turn.
                    e.window_capped = true;
                    return wrote;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                e.write_blocked = true;
                return wrote;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                e.conn.handle_peer_closed(&format!("write error: {err}"));
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_large_writes_ask_the_window() {
        let never = || -> Option<usize> { panic!("asked the window") };
        assert_eq!(write_limit_bytes(1 << 20, false, never), 1 << 20);
        assert_eq!(
            write_limit_bytes(WINDOW_CHECK_BYTES_MIN, true, never),
            WINDOW_CHECK_BYTES_MIN
        );
        let big = WINDOW_CHECK_BYTES_MIN + 1;
        assert_eq!(write_limit_bytes(big, true, || Some(200 << 10)), 200 << 10);
        assert_eq!(
            write_limit_bytes(big, true, || Some(4 << 20)),
            big,
            "the window admits all"
        );
        assert_eq!(
            write_limit_bytes(big, true, || Some(0)),
            WINDOW_CAPPED_WRITE_BYTES_MIN,
            "a full window still lets the floor through"
        );
        assert_eq!(
            write_limit_bytes(big, true, || None),
            big,
            "no TCP_INFO: all"
        );
    }

    #[test]
    fn runs_are_cut_at_the_limit() {
        let (a, b, c) = ([1u8; 10], [2u8; 20], [3u8; 30]);
        let runs = [
            io::IoSlice::new(&a),
            io::IoSlice::new(&b),
            io::IoSlice::new(&c),
        ];
        let mut out = [io::IoSlice::new(&[]); 4];
        let lens = |out: &[io::IoSlice<'_>], n: usize| -> Vec<usize> {
            out[..n].iter().map(|r| r.len()).collect()
        };
        let n = runs_within(&runs, 25, &mut out);
        assert_eq!(lens(&out, n), vec![10, 15]);
        assert!(out[1].iter().all(|&x| x == 2));
        let n = runs_within(&runs, 30, &mut out);
        assert_eq!(lens(&out, n), vec![10, 20], "a cut on a run's end");
        let n = runs_within(&runs, 1000, &mut out);
        assert_eq!(lens(&out, n), vec![10, 20, 30]);
        assert_eq!(runs_within(&runs, 0, &mut out), 0);
    }
}
