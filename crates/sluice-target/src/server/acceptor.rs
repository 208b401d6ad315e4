//! The acceptor thread: accepts on the I/O and discovery listeners and
//! deals each socket (TCP_NODELAY set) to a worker, round robin, waking it.
//! EMFILE and other accept errors back off briefly and keep serving.

use super::worker::Incoming;
use mio::net::TcpListener;
use mio::{Events, Poll, Token, Waker};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

pub(super) const LISTEN_IO: Token = Token(1);
pub(super) const LISTEN_DISC: Token = Token(2);

pub(super) struct Acceptor {
    pub(super) poll: Poll,
    pub(super) io_l: TcpListener,
    pub(super) disc_l: Option<TcpListener>,
    pub(super) senders: Vec<Sender<Incoming>>,
    pub(super) wakers: Vec<Arc<Waker>>,
    pub(super) shutdown: Arc<AtomicBool>,
    pub(super) next: AtomicUsize,
}

impl Acceptor {
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(16);
        loop {
            if let Err(e) = self.poll.poll(&mut events, None) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "acceptor poll failed");
                    return;
                }
            }
            if self.shutdown.load(Ordering::Acquire) {
                return;
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
                            let _ = s.set_nodelay(true);
                            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
                            if self.senders[i].send(Incoming::Accepted(s, peer)).is_ok() {
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
