//! One connection as a worker holds it: the socket, its
//! [`QueueConnection`], its admission [`Permit`], readiness flags and the
//! cached tenant; reading (with a per-socket budget for fairness, and
//! giving the handshake slot back once Connect is accepted) and writing
//! until WouldBlock; reads end at WouldBlock or a short read (epoll is
//! edge-triggered).

use crate::admission::Permit;
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

/// Reads what the socket has (up to the budget) into the queue.
pub(super) fn read_conn(e: &mut ConnEntry, now: Instant) -> bool {
    let progressed = read_socket(e, now);
    if e.permit.is_handshaking() && e.conn.controller().is_some() {
        e.permit.handshake_done();
    }
    progressed
}

fn read_socket(e: &mut ConnEntry, now: Instant) -> bool {
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
                e.conn.handle_received(n, now);
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

pub(super) fn write_conn(e: &mut ConnEntry, now: Instant) -> bool {
    let mut wrote = false;
    loop {
        let mut runs = [io::IoSlice::new(&[]); WRITE_RUNS_MAX];
        let n = e.conn.due_vectored(&mut runs);
        if n == 0 {
            return wrote;
        }
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
