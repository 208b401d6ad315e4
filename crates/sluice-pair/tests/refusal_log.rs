//! The one line a refused Connect leaves in the log.
//!
//! Alone in its own test binary: tracing caches, per call site, whether any
//! subscriber is interested. A test in the same process that reaches the
//! same call site at the moment this test installs its scoped subscriber can
//! leave that cache saying "nobody", and the line is never captured (this
//! failed once in CI while `hostnqn.rs` refused Connects in parallel).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use sluice_host::HostError;
use sluice_pair::*;
use sluice_proto::fabrics::CNTLID_DYNAMIC;
use sluice_proto::send::SendConfig;
use sluice_proto::Status;

fn anonymous() -> Params {
    Params {
        hostnqn: String::new(),
        hostid: [0; 16],
        open_subsystem: false,
        ..Params::default()
    }
}

/// The status a refused Connect answered with.
fn refusal<T: std::fmt::Debug>(r: Result<T, HostError>) -> Status {
    match r {
        Err(HostError::Nvme { status, .. }) => status,
        other => panic!("expected an NVMe status, got {other:?}"),
    }
}

/// A writer collecting what the fmt subscriber prints.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let b = self.0.lock().unwrap();
        String::from_utf8_lossy(&b)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn one_refusal_logs_one_line_with_peer_nqn_and_field() {
    let out = Captured::default();
    let writer = out.clone();
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(sub, || {
        let mut pair = Pair::unconnected(anonymous());
        pair.open_link(0, 32, SendConfig::default());
        let st = refusal(pair.connect(ADMIN, 0, 31, 0, CNTLID_DYNAMIC));
        assert_eq!(st, Status::CONNECT_INVALID_HOST);
    });
    let lines = out.lines();
    let refused: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("Connect refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{lines:#?}");
    let l = refused[0];
    assert!(l.contains(" WARN "), "{l}");
    assert!(l.contains(&peer_addr(ADMIN).to_string()), "{l}");
    assert!(l.contains("hostnqn=\"(empty)\""), "{l}");
    assert!(l.contains("field=\"hostnqn\""), "{l}");
    assert!(l.contains(SUBNQN), "{l}");
    // Nothing else about this Connect at warn.
    assert_eq!(
        lines.iter().filter(|l| l.contains(" WARN ")).count(),
        1,
        "{lines:#?}"
    );
}
