//! The server: configuration, the composed router, the accept loop.

use crate::AdminError;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// A bearer token. Its `Debug` never shows it; it is compared in constant
/// time (for a given length).
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl BearerToken {
    /// A token; `None` if it is empty or has characters a header cannot
    /// carry (only visible ASCII is allowed).
    pub fn new(token: impl Into<String>) -> Option<BearerToken> {
        let t = token.into();
        let ok = !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic());
        ok.then_some(BearerToken(t))
    }

    /// Reads a token from a file (surrounding whitespace trimmed).
    pub fn from_file(path: &Path) -> Result<BearerToken, AdminError> {
        let bad = |reason: String| AdminError::TokenFile {
            path: path.display().to_string(),
            reason,
        };
        let s = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        BearerToken::new(s.trim())
            .ok_or_else(|| bad("empty, or not a single line of visible ASCII".into()))
    }

    /// The token, for clients that send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token; the time taken depends only on
    /// the lengths, not on where the first difference is.
    pub fn matches(&self, presented: &[u8]) -> bool {
        ct_eq(self.0.as_bytes(), presented)
    }
}

/// Constant-time comparison (for inputs of the given lengths).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// Server settings. The defaults suit a management endpoint.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub(crate) listen: SocketAddr,
    /// When set, every request needs `Authorization: Bearer TOKEN` (401).
    pub token: Option<BearerToken>,
    /// Largest request body (413 beyond it).
    pub(crate) body_limit: usize,
    /// Largest request head, request line plus headers (431 beyond it;
    /// at least 8 KiB, hyper's minimum buffer).
    pub(crate) header_limit: usize,
    /// Most request headers (431 beyond it).
    pub(crate) max_headers: usize,
    /// Time allowed to send the request head (the connection is closed).
    pub header_timeout: Duration,
    /// Time allowed for a whole request, body and handler (408).
    pub request_timeout: Duration,
    /// Most connections served at once; more are closed on accept.
    pub(crate) max_connections: usize,
    /// How long shutdown waits for requests in progress.
    pub(crate) shutdown_grace: Duration,
}

impl AdminConfig {
    pub fn new(listen: SocketAddr) -> AdminConfig {
        AdminConfig {
            listen,
            token: None,
            body_limit: 64 * 1024,
            header_limit: 16 * 1024,
            max_headers: 64,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_connections: 64,
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

/// A JSON error document, `{"error": "..."}`.
pub(crate) fn json_error(code: StatusCode, msg: &str) -> Response {
    let body = serde_json::json!({ "error": msg }).to_string() + "\n";
    (
        code,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

async fn auth(State(token): State<Option<BearerToken>>, req: Request, next: Next) -> Response {
    let Some(token) = token else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .and_then(|v| {
            // Scheme is case-insensitive (RFC 7235).
            (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| &v[7..])
        });
    match presented {
        Some(p) if token.matches(p) => next.run(req).await,
        _ => {
            let mut r = json_error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
            r
        }
    }
}

async fn deadline(State(d): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(d, next.run(req)).await {
        Ok(r) => r,
        Err(_) => json_error(StatusCode::REQUEST_TIMEOUT, "request timed out"),
    }
}

/// Refuses a body announced larger than the limit before reading it
/// (bodies without a length are cut at the limit by the extractor).
async fn announced_length(State(limit): State<usize>, req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(n) if n > limit as u64 => json_error(StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
        _ => next.run(req).await,
    }
}

async fn not_found() -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        "not found; try /metrics, /v1/status or /v1/tenants",
    )
}

/// Composes the parts into one application: merged routes (two parts may
/// not claim the same path and method), a JSON 404, the body limit, the
/// request timeout and, when configured, the bearer token in front of
/// everything (unknown paths included).
pub fn compose(cfg: &AdminConfig, parts: impl IntoIterator<Item = Router>) -> Router {
    let mut app = Router::new();
    for p in parts {
        app = app.merge(p);
    }
    app.fallback(not_found)
        .layer(DefaultBodyLimit::max(cfg.body_limit))
        .layer(middleware::from_fn_with_state(
            cfg.body_limit,
            announced_length,
        ))
        .layer(middleware::from_fn_with_state(cfg.token.clone(), auth))
        .layer(middleware::from_fn_with_state(
            cfg.request_timeout,
            deadline,
        ))
}

/// Stops a running [`AdminServer`] (clonable; idempotent).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    /// Stops accepting, lets requests in progress finish (up to the grace
    /// period) and ends the server thread.
    pub fn shutdown(&self) {
        self.tx.send_replace(true);
    }
}

/// A running admin server. Dropping it shuts it down and joins its thread.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// Binds `cfg.listen` (errors are returned here, not logged later) and
    /// serves `app` (see [`compose`]) on the thread `sluice-admin`.
    pub fn start(cfg: AdminConfig, app: Router) -> Result<AdminServer, AdminError> {
        let listen_err = |source| AdminError::Listen {
            addr: cfg.listen,
            source,
        };
        let l = std::net::TcpListener::bind(cfg.listen).map_err(listen_err)?;
        let addr = l.local_addr().map_err(listen_err)?;
        l.set_nonblocking(true).map_err(listen_err)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(AdminError::Thread)?;
        let (tx, rx) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("sluice-admin".into())
            .spawn(move || {
                rt.block_on(async move {
                    match tokio::net::TcpListener::from_std(l) {
                        Ok(l) => serve(l, cfg, app, rx).await,
                        Err(e) => tracing::warn!(error = %e, "admin listener unusable"),
                    }
                })
            })
            .map_err(AdminError::Thread)?;
        tracing::info!(%addr, "admin endpoint listening");
        Ok(AdminServer {
            addr,
            handle: ShutdownHandle { tx: Arc::new(tx) },
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Shuts down and waits for the server thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    cfg: AdminConfig,
    app: Router,
    mut stop: watch::Receiver<bool>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_buf_size(cfg.header_limit.max(8192))
        .max_headers(cfg.max_headers)
        .keep_alive(true);
    let slots = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => {
                let (sock, peer) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "admin connection refused: too many connections");
                    continue;
                };
                let _ = sock.set_nodelay(true);
                let svc = TowerToHyperService::new(app.clone());
                let conn = http.serve_connection(TokioIo::new(sock), svc);
                let mut stop = stop.clone();
                let grace = cfg.shutdown_grace;
                conns.spawn(async move {
                    let _slot = slot;
                    tokio::pin!(conn);
                    let r = tokio::select! {
                        r = conn.as_mut() => r,
                        _ = stop.changed() => {
                            conn.as_mut().graceful_shutdown();
                            tokio::time::timeout(grace, conn.as_mut()).await.unwrap_or(Ok(()))
                        }
                    };
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "admin connection ended");
                    }
                });
            }
        }
    }
    drop(listener);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(cfg.shutdown_grace, drain)
        .await
        .is_err()
    {
        conns.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"", b"a"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn token_is_never_shown() {
        let t = BearerToken::new("s3cret").expect("valid token");
        assert!(!format!("{t:?}").contains("s3cret"));
        let mut c = AdminConfig::new(([127, 0, 0, 1], 0).into());
        c.token = Some(t);
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(BearerToken::new("").is_none());
        assert!(BearerToken::new("a b").is_none());
        assert!(BearerToken::new("a\n").is_none());
    }
}
