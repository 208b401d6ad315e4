//! The acceptor thread: accepts on the I/O and discovery listeners, asks
//! [`Admission`] whether the socket fits the connection limits (a socket
//! over one is closed at once, before any queue exists for it, with one
//! WARN line per limit per second naming the peer and the limit), and deals
//! each admitted socket (TCP_NODELAY set) with its permit to a worker,
//! round robin, waking it. EMFILE and other accept errors back off briefly
//! and keep serving. Once a second it asks whether a wave of connections
//! has closed ([`Admission::trim_due`]) and if so gives the heap memory
//! they freed back to the kernel, off the workers' I/O path.

use super::worker::Incoming;
use crate::admission::{Admission, RefusalLog};
use mio::net::TcpListener;
use mio::{Events, Poll, Token, Waker};
use sluice_runtime::memory::{release_free_memory, resident_bytes};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Gives the memory of closed connections back to the kernel, logging
/// the resident set before and after.
fn release_memory() {
    let before = resident_bytes();
    let released = release_free_memory();
    tracing::debug!(
        released,
        rss_before = before,
        rss_after = resident_bytes(),
        "connections closed; freed heap memory handed back"
    );
}

pub(super) const LISTEN_IO: Token = Token(1);
pub(super) const LISTEN_DISC: Token = Token(2);
/// How often the acceptor checks whether freed memory should be returned.
const TRIM_CHECK_INTERVAL: Duration = Duration::from_secs(1);

pub(super) struct Acceptor {
    pub(super) poll: Poll,
    pub(super) io_l: TcpListener,
    pub(super) disc_l: Option<TcpListener>,
    pub(super) senders: Vec<Sender<Incoming>>,
    pub(super) wakers: Vec<Arc<Waker>>,
    pub(super) shutdown: Arc<AtomicBool>,
    pub(super) next: AtomicUsize,
    pub(super) admission: Arc<Admission>,
    pub(super) refusals: RefusalLog,
}

impl Acceptor {
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(16);
        let mut next_trim_check = Instant::now() + TRIM_CHECK_INTERVAL;
        loop {
            if let Err(e) = self.poll.poll(&mut events, Some(TRIM_CHECK_INTERVAL)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "acceptor poll failed");
                    return;
                }
            }
            if self.shutdown.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            if now >= next_trim_check {
                next_trim_check = now + TRIM_CHECK_INTERVAL;
                if self.admission.trim_due() {
                    release_memory();
                }
            }
            for ev in events.iter() {
                let l = match ev.token() {
                    LISTEN_IO => &self.io_l,
                    LISTEN_DISC => match &self.disc_l {
                        Some(l) => l,
                        None => continue,
                    },
                    _ => continue,
                };
                loop {
                    match l.accept() {
                        Ok((s, peer)) => {
                            let permit = match self.admission.admit(peer.ip()) {
                                Ok(p) => p,
                                Err(limit) => {
                                    drop(s);
                                    if let Some(suppressed) =
                                        self.refusals.note(limit, Instant::now())
                                    {
                                        tracing::warn!(
                                            %peer,
                                            limit = limit.key(),
                                            max = self.admission.limit(limit),
                                            suppressed,
                                            "connection refused: target.{} reached",
                                            limit.key()
                                        );
                                    }
                                    continue;
                                }
                            };
                            let _ = s.set_nodelay(true);
                            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
                            if self.senders[i]
                                .send(Incoming::Accepted(s, peer, permit))
                                .is_ok()
                            {
                                let _ = self.wakers[i].wake();
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            // EMFILE and friends: log, back off briefly, keep serving.
                            tracing::warn!(error = %e, "accept failed");
                            std::thread::sleep(Duration::from_millis(10));
                            break;
                        }
                    }
                }
            }
        }
    }
}
