//! The view's fast channel (`sluice control --view-listen`): `ViewSync`
//! and `ViewTargetReport` over a plain TCP stream, framed by
//! `sluice_flint::wire`, instead of gRPC. One request, one answer, in
//! lock-step; the same protobuf messages and the same checks as the gRPC
//! calls; the same bearer token, sent once in the opening `Hello`.
//!
//! The server answers on the task that read the request: no HTTP/2
//! framing, no hop between tasks, so a sync costs about a TCP round trip
//! (docs/experiments/view-table1.md). Clients find the channel in
//! `Status.view_addr` and fall back to gRPC whenever it fails.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use sluice_admin::BearerToken;
use sluice_flint::wire::{encode, Frame, FrameDecoder, Kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::leader::Leadership;
use crate::pb;
use crate::view::ViewHub;
use crate::view_pb;

/// Connections the server holds at once, at most.
pub const CONNECTIONS_MAX: usize = 4096;
/// A connection must say hello within this.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// A request must be answered within this (client side).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest read at once.
const READ_CHUNK: usize = 64 << 10;

/// Why a fast-channel exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum WireCallError {
    #[error("view channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("view channel: {0}")]
    Frame(#[from] sluice_flint::wire::WireError),
    #[error("view channel: the server said: {0}")]
    Refused(String),
    #[error("view channel: {0}")]
    Protocol(String),
    #[error("view channel: no answer within {CALL_TIMEOUT:?}")]
    Timeout,
}

/// Reads one frame from `s`.
async fn read_frame(s: &mut TcpStream, dec: &mut FrameDecoder) -> Result<Frame, WireCallError> {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        if let Some(f) = dec.next_frame()? {
            return Ok(f);
        }
        let want = dec.wanted().min(READ_CHUNK);
        let n = s.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(WireCallError::Protocol(
                "the peer closed the connection".into(),
            ));
        }
        dec.feed(&buf[..n]);
    }
}

async fn write_frame(s: &mut TcpStream, kind: Kind, body: &[u8]) -> Result<(), WireCallError> {
    s.write_all(&encode(kind, body)?).await?;
    Ok(())
}

/// Serves the fast channel until the listener's task is dropped.
pub async fn serve(
    listener: TcpListener,
    hub: Arc<ViewHub>,
    leadership: Arc<Leadership>,
    token: Option<BearerToken>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "view channel: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "view channel: {CONNECTIONS_MAX} connections open; refused");
            continue;
        };
        let (hub, leadership, token) = (hub.clone(), leadership.clone(), token.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection(stream, &hub, &leadership, token.as_ref()).await {
                tracing::debug!(%peer, error = %e, "view channel: connection ended");
            }
        });
    }
}

/// One client: hello, then requests and answers until it leaves.
async fn connection(
    mut s: TcpStream,
    hub: &ViewHub,
    leadership: &Leadership,
    token: Option<&BearerToken>,
) -> Result<(), WireCallError> {
    s.set_nodelay(true)?;
    let mut dec = FrameDecoder::new();
    let hello = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut s, &mut dec))
        .await
        .map_err(|_| WireCallError::Timeout)??;
    let authentic = hello.kind == Kind::Hello && token.is_none_or(|t| t.matches(&hello.body));
    if !authentic {
        tracing::warn!(peer = ?s.peer_addr().ok(), "view channel refused: no hello, or a missing or wrong bearer token");
        write_frame(&mut s, Kind::Error, b"missing or wrong bearer token").await?;
        return Ok(());
    }
    write_frame(&mut s, Kind::Welcome, b"").await?;
    loop {
        let f = match read_frame(&mut s, &mut dec).await {
            Ok(f) => f,
            // A client that leaves is the normal end.
            Err(WireCallError::Protocol(_)) => return Ok(()),
            Err(e) => {
                let _ = write_frame(&mut s, Kind::Error, e.to_string().as_bytes()).await;
                return Err(e);
            }
        };
        match answer(hub, leadership, &f) {
            Ok((kind, body)) => write_frame(&mut s, kind, &body).await?,
            Err(msg) => {
                write_frame(&mut s, Kind::Error, msg.as_bytes()).await?;
                return Ok(());
            }
        }
    }
}

/// The answer to one request, or the error that ends the connection.
fn answer(hub: &ViewHub, leadership: &Leadership, f: &Frame) -> Result<(Kind, Vec<u8>), String> {
    leadership.check().map_err(|s| s.message().to_owned())?;
    match f.kind {
        Kind::Sync => {
            let m = pb::ViewBatch::decode(f.body.as_slice())
                .map_err(|e| format!("ViewBatch does not decode: {e}"))?;
            let (batch, bid) = view_pb::batch_from_pb(m).map_err(|e| e.to_string())?;
            let (ack, grants) = hub.sync(&batch, &bid)?;
            if ack.unknown_drive_samples > 0 {
                hub.drives_unknown();
            }
            Ok((
                Kind::SyncAck,
                view_pb::ack_to_pb(&ack, &grants).encode_to_vec(),
            ))
        }
        Kind::Target => {
            let m = pb::TargetReport::decode(f.body.as_slice())
                .map_err(|e| format!("TargetReport does not decode: {e}"))?;
            let r = view_pb::target_report_from_pb(m).map_err(|e| e.to_string())?;
            let (drives, unknown) = hub.handle_target_report(&r);
            if unknown > 0 {
                hub.drives_unknown();
            }
            Ok((
                Kind::TargetAck,
                pb::TargetReportAck { drives, unknown }.encode_to_vec(),
            ))
        }
        other => Err(format!("frame kind {other:?} is not a request")),
    }
}

/// A client's end of the fast channel.
#[derive(Debug)]
pub struct ViewChannel {
    s: TcpStream,
    dec: FrameDecoder,
}

impl ViewChannel {
    /// Connects and says hello with `token`.
    pub async fn connect(
        addr: &str,
        token: Option<&BearerToken>,
    ) -> Result<ViewChannel, WireCallError> {
        let s = tokio::time::timeout(CALL_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| WireCallError::Timeout)??;
        s.set_nodelay(true)?;
        let mut c = ViewChannel {
            s,
            dec: FrameDecoder::new(),
        };
        let hello = token.map_or(&[][..], |t| t.expose().as_bytes());
        let f = c.call(Kind::Hello, hello).await?;
        match f.kind {
            Kind::Welcome => Ok(c),
            k => Err(WireCallError::Protocol(format!(
                "answered a hello with {k:?}"
            ))),
        }
    }

    async fn call(&mut self, kind: Kind, body: &[u8]) -> Result<Frame, WireCallError> {
        let exchange = async {
            write_frame(&mut self.s, kind, body).await?;
            read_frame(&mut self.s, &mut self.dec).await
        };
        let f = tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| WireCallError::Timeout)??;
        if f.kind == Kind::Error {
            return Err(WireCallError::Refused(
                String::from_utf8_lossy(&f.body).into_owned(),
            ));
        }
        Ok(f)
    }

    /// `ViewSync`.
    pub async fn view_sync(&mut self, batch: &pb::ViewBatch) -> Result<pb::ViewAck, WireCallError> {
        let f = self.call(Kind::Sync, &batch.encode_to_vec()).await?;
        if f.kind != Kind::SyncAck {
            return Err(WireCallError::Protocol(format!(
                "answered a sync with {:?}",
                f.kind
            )));
        }
        pb::ViewAck::decode(f.body.as_slice())
            .map_err(|e| WireCallError::Protocol(format!("ViewAck does not decode: {e}")))
    }

    /// `ViewTargetReport`.
    pub async fn target_report(
        &mut self,
        r: &pb::TargetReport,
    ) -> Result<pb::TargetReportAck, WireCallError> {
        let f = self.call(Kind::Target, &r.encode_to_vec()).await?;
        if f.kind != Kind::TargetAck {
            return Err(WireCallError::Protocol(format!(
                "answered a target report with {:?}",
                f.kind
            )));
        }
        pb::TargetReportAck::decode(f.body.as_slice())
            .map_err(|e| WireCallError::Protocol(format!("TargetReportAck does not decode: {e}")))
    }
}
