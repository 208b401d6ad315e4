//! The wire floor: what raw TCP on this host does with NVMe-sized messages,
//! against a built-in echo/sink server on loopback, so bench results can be
//! stated as ratios to it.
//!
//! * ping-pong: a 72-byte request (a CapsuleCmd) answered by 16 + 4096 bytes
//!   (a C2HData header and a 4 KiB block), one at a time (QD 1);
//! * pipelined: the same with `qd` requests outstanding on one connection;
//! * bulk: one connection streaming 1 MiB writes into a sink.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use sluice_runtime::cast::nanos;

/// Request size: the common header plus a 64-byte SQE.
pub const REQUEST_BYTES: usize = 72;
/// Reply size: a C2HData header (16 bytes counted as in the brief) plus 4 KiB.
pub const REPLY_BYTES: usize = 16 + 4096;
const BULK_CHUNK_BYTES: usize = 1 << 20;

/// Results of the floor measurement.
#[derive(Debug, Clone, Serialize)]
pub struct FloorReport {
    pub pingpong_latency_us_p50: f64,
    pub(crate) pingpong_latency_us_p99: f64,
    pub(crate) pingpong_latency_us_mean: f64,
    pub(crate) pingpong_rtt_per_s: f64,
    pub(crate) pipelined_qd: u32,
    pub pipelined_iops: f64,
    pub(crate) pipelined_latency_us_p50: f64,
    pub(crate) pipelined_latency_us_p99: f64,
    pub bulk_mib_per_s: f64,
}

/// The echo/sink server: first byte of a connection picks the mode
/// (b'E' echo of REPLY_BYTES per REQUEST_BYTES, b'S' sink).
struct Server {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start() -> anyhow::Result<Server> {
        let l = TcpListener::bind("127.0.0.1:0").context("bind floor server")?;
        let addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        std::thread::Builder::new()
            .name("floor-accept".into())
            .spawn(move || {
                for s in l.incoming() {
                    if st.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    let _ = std::thread::Builder::new()
                        .name("floor-conn".into())
                        .spawn(move || serve(s));
                }
            })?;
        Ok(Server { addr, stop })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

fn serve(mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut mode = [0u8; 1];
    s.read_exact(&mut mode)?;
    if mode[0] == b'S' {
        let mut buf = vec![0u8; BULK_CHUNK_BYTES];
        loop {
            if s.read(&mut buf)? == 0 {
                return Ok(());
            }
        }
    }
    let reply = vec![0xa5u8; REPLY_BYTES];
    let mut req = [0u8; REQUEST_BYTES];
    loop {
        if let Err(e) = s.read_exact(&mut req) {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(())
            } else {
                Err(e)
            };
        }
        s.write_all(&reply)?;
    }
}

fn hist() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000, 3).context("histogram")
}

/// Round trips with `qd` requests outstanding for `dur`; latency in ns.
fn pingpong(
    addr: std::net::SocketAddr,
    qd: u32,
    dur: Duration,
) -> anyhow::Result<(Histogram<u64>, u64, f64)> {
    let mut s = TcpStream::connect(addr).context("connect floor server")?;
    s.set_nodelay(true)?;
    s.write_all(b"E")?;
    let req = [0x5au8; REQUEST_BYTES];
    let mut reply = vec![0u8; REPLY_BYTES];
    let mut h = hist()?;
    let mut sent = std::collections::VecDeque::with_capacity(qd as usize);
    let start = Instant::now();
    let end = start + dur;
    for _ in 0..qd.max(1) {
        sent.push_back(Instant::now());
        s.write_all(&req)?;
    }
    let mut n = 0u64;
    while let Some(t0) = sent.pop_front() {
        s.read_exact(&mut reply)?;
        let now = Instant::now();
        h.record(nanos(now - t0).max(1))?;
        n += 1;
        if now < end {
            sent.push_back(Instant::now());
            s.write_all(&req)?;
        }
    }
    Ok((h, n, start.elapsed().as_secs_f64()))
}

fn bulk(addr: std::net::SocketAddr, dur: Duration) -> anyhow::Result<f64> {
    let mut s = TcpStream::connect(addr).context("connect floor server")?;
    s.write_all(b"S")?;
    let buf = vec![0x11u8; BULK_CHUNK_BYTES];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < dur {
        s.write_all(&buf)?;
        bytes += buf.len() as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    // Wait for the sink to drain so the bytes are really through.
    let mut b = [0u8; 1];
    let _ = s.read(&mut b);
    Ok(bytes as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64())
}

/// Measures the floor: each of the three parts runs for `dur_each`.
pub fn measure(qd: u32, dur_each: Duration) -> anyhow::Result<FloorReport> {
    let srv = Server::start()?;
    let us = |ns: u64| ns as f64 / 1000.0;
    let (h1, n1, t1) = pingpong(srv.addr, 1, dur_each)?;
    let (hq, nq, tq) = pingpong(srv.addr, qd.max(1), dur_each)?;
    let bw = bulk(srv.addr, dur_each)?;
    Ok(FloorReport {
        pingpong_latency_us_p50: us(h1.value_at_quantile(0.5)),
        pingpong_latency_us_p99: us(h1.value_at_quantile(0.99)),
        pingpong_latency_us_mean: h1.mean() / 1000.0,
        pingpong_rtt_per_s: n1 as f64 / t1,
        pipelined_qd: qd.max(1),
        pipelined_iops: nq as f64 / tq,
        pipelined_latency_us_p50: us(hq.value_at_quantile(0.5)),
        pipelined_latency_us_p99: us(hq.value_at_quantile(0.99)),
        bulk_mib_per_s: bw,
    })
}
