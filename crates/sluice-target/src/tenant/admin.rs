//! The admin endpoint: a small blocking HTTP/1.1 server on its own thread.
//!
//! * `GET /metrics`: Prometheus text (per-tenant and target counters).
//! * `GET /tenants`: the running tenant table as JSON.
//! * `PUT /tenants/NAME` (or `POST`): create or update a tenant from a JSON
//!   object with any of `hosts`, `weight`, `reservation`, `limit`,
//!   `cpu_share`. A bad update gets `400` with the error naming the key and
//!   leaves the running table unchanged; `POST` to an unknown tenant is
//!   `404`, `PUT` creates it.
//!
//! One request per connection, bodies up to 64 KiB, 2 s socket timeouts; no
//! authentication, so bind it to loopback or a management network.

use super::{TenantRuntime, UpdateError};
use sluice_config::tenants::RawTenant;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const BODY_MAX: usize = 64 * 1024;

/// A running admin server.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    pub fn start(addr: SocketAddr, rt: Arc<TenantRuntime>) -> io::Result<AdminServer> {
        let l = TcpListener::bind(addr)?;
        let addr = l.local_addr()?;
        l.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-admin".into())
            .spawn(move || {
                while !s2.load(Ordering::Acquire) {
                    match l.accept() {
                        Ok((s, _)) => {
                            let _ = s.set_nonblocking(false);
                            if let Err(e) = serve(s, &rt) {
                                tracing::debug!(error = %e, "admin request failed");
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "admin accept failed");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })?;
        tracing::info!(%addr, "admin endpoint listening (GET /metrics, GET/PUT /tenants)");
        Ok(AdminServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn respond(s: &mut TcpStream, code: u16, ctype: &str, body: &str) -> io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        _ => "Error",
    };
    write!(
        s,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

fn json_error(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string() + "\n"
}

fn serve(mut s: TcpStream, rt: &TenantRuntime) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(usize::MAX);
            }
        }
    }
    if len > BODY_MAX {
        return respond(
            &mut s,
            413,
            "application/json",
            &json_error("body too large"),
        );
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body);
    match (method.as_str(), path.as_str()) {
        ("GET", "/metrics") => respond(&mut s, 200, "text/plain; version=0.0.4", &rt.prometheus()),
        ("GET", "/tenants") => {
            respond(&mut s, 200, "application/json", &(rt.tenants_json() + "\n"))
        }
        ("PUT" | "POST", p) if p.starts_with("/tenants/") => {
            let name = &p["/tenants/".len()..];
            let res = if method == "PUT" {
                rt.update_json(name, &body)
            } else {
                serde_json::from_str::<RawTenant>(&body)
                    .map_err(|e| UpdateError::Json(format!("bad tenant JSON: {e}")))
                    .and_then(|raw| rt.update(name, &raw, false))
            };
            match res {
                Ok(spec) => respond(
                    &mut s,
                    200,
                    "application/json",
                    &(serde_json::to_string(&spec).unwrap_or_default() + "\n"),
                ),
                Err(UpdateError::Unknown(n)) => respond(
                    &mut s,
                    404,
                    "application/json",
                    &json_error(&format!("unknown tenant `{n}`")),
                ),
                Err(e) => respond(&mut s, 400, "application/json", &json_error(&e.to_string())),
            }
        }
        ("GET", _) => respond(
            &mut s,
            404,
            "application/json",
            &json_error("not found; try /metrics or /tenants"),
        ),
        _ => respond(
            &mut s,
            405,
            "application/json",
            &json_error("method not allowed"),
        ),
    }
}

/// A minimal HTTP client for the admin endpoint (`sluice top`, tests).
pub fn http_request(addr: &str, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}
