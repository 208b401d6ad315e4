//! Start-up: builds the registry and the tenant runtime, starts the admin
//! endpoint and the charge agents, binds the listeners, creates every
//! worker's poll, waker and timerfd before any worker runs (the shared
//! tenant schedulers wake workers by index), then starts the worker and
//! acceptor threads.

use super::acceptor::{Acceptor, LISTEN_DISC, LISTEN_IO};
use super::worker::TIMER;
use super::worker::{Incoming, Worker};
use super::{StartError, Target, TargetHandle, WAKER};
use crate::admission::RefusalLog;
use crate::registry::Registry;
use crate::tenant::admin::AdminServer;
use crate::tenant::worker::WorkerTenancy;
use crate::tenant::TenantRuntime;
use mio::net::TcpListener;
use mio::{Interest, Poll, Waker};
use sluice_config::Config;
use sluice_runtime::Sleeper;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Instant;

impl Target {
    /// Opens backends, binds listeners and starts the worker threads.
    pub fn start(config: &Config) -> Result<TargetHandle, StartError> {
        Self::start_with(config, &crate::registry::NoVolumes)
    }

    /// Like [`Target::start`], opening `volume` namespaces through `volumes`.
    pub fn start_with(
        config: &Config,
        volumes: &dyn crate::registry::VolumeOpener,
    ) -> Result<TargetHandle, StartError> {
        let reg = Arc::new(Registry::build_with(config, volumes)?);
        let tenants = Arc::new(TenantRuntime::new(config, &reg));
        let reload_action = crate::tenant::admin::ReloadSlot::default();
        let admin = match tenants.settings.admin_listen {
            Some(a) => Some(
                AdminServer::start(a, tenants.clone(), reg.clone(), reload_action.clone())
                    .map_err(|source| StartError::Listen { addr: a, source })?,
            ),
            None => None,
        };
        let charging =
            crate::tenant::cpu::ChargeAgents::start(&tenants).map_err(StartError::Thread)?;
        let st = &reg.settings;
        let std_listener =
            std::net::TcpListener::bind(st.listen).map_err(|source| StartError::Listen {
                addr: st.listen,
                source,
            })?;
        let local_addr = std_listener
            .local_addr()
            .map_err(|source| StartError::Listen {
                addr: st.listen,
                source,
            })?;
        std_listener
            .set_nonblocking(true)
            .map_err(|source| StartError::Listen {
                addr: st.listen,
                source,
            })?;
        let disc_listener = match st.discovery_listen {
            Some(a) => {
                let l = std::net::TcpListener::bind(a)
                    .map_err(|source| StartError::Listen { addr: a, source })?;
                l.set_nonblocking(true)
                    .map_err(|source| StartError::Listen { addr: a, source })?;
                Some(l)
            }
            None => None,
        };
        let discovery_addr = disc_listener.as_ref().and_then(|l| l.local_addr().ok());
        set_congestion(st, &std_listener, local_addr)?;
        log_congestion(st);
        if let (Some(l), Some(a)) = (&disc_listener, discovery_addr) {
            set_congestion(st, l, a)?;
        }
        let shutdown = Arc::new(AtomicBool::new(false));

        let mut senders = Vec::new();
        let mut wakers = Vec::new();
        let mut workers = Vec::new();
        // Every worker's poll and waker exist before any worker runs: the
        // shared tenant schedulers wake workers by index.
        let mut polls = Vec::new();
        for _ in 0..st.workers {
            let poll = Poll::new().map_err(StartError::Thread)?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(StartError::Thread)?);
            wakers.push(waker);
            polls.push(poll);
        }
        let grant_wakers = wakers.clone();
        tenants.set_waker(Box::new(move |i| {
            if let Some(w) = grant_wakers.get(i) {
                let _ = w.wake();
            }
        }));
        let mut receivers = Vec::new();
        for _ in 0..st.workers {
            let (tx, rx) = channel();
            senders.push(tx);
            receivers.push(rx);
        }
        let peers: Vec<(Sender<Incoming>, Arc<Waker>)> = senders
            .iter()
            .cloned()
            .zip(wakers.iter().cloned())
            .collect();
        let io_queues: Arc<Vec<AtomicUsize>> =
            Arc::new((0..st.workers).map(|_| AtomicUsize::new(0)).collect());
        for (id, (poll, rx)) in polls.into_iter().zip(receivers).enumerate() {
            let tenancy = WorkerTenancy::new(tenants.clone(), id);
            let mut w = Worker::new(id, poll, rx, reg.clone(), shutdown.clone(), tenancy);
            w.peers = peers.clone();
            w.io_queues = io_queues.clone();
            let (sleeper, timer_err) = Sleeper::new(w.poll.registry(), TIMER);
            w.sleeper = sleeper;
            if let Some(e) = timer_err {
                tracing::warn!(error = %e, "no timerfd; timers will have millisecond granularity");
            }
            let h = std::thread::Builder::new()
                .name(format!("sluice-worker-{id}"))
                .spawn(move || w.run())
                .map_err(StartError::Thread)?;
            workers.push(h);
        }

        let apoll = Poll::new().map_err(StartError::Thread)?;
        let acceptor_waker =
            Arc::new(Waker::new(apoll.registry(), WAKER).map_err(StartError::Thread)?);
        let mut io_l = TcpListener::from_std(std_listener);
        apoll
            .registry()
            .register(&mut io_l, LISTEN_IO, Interest::READABLE)
            .map_err(StartError::Thread)?;
        let mut disc_l = disc_listener.map(TcpListener::from_std);
        if let Some(l) = disc_l.as_mut() {
            apoll
                .registry()
                .register(l, LISTEN_DISC, Interest::READABLE)
                .map_err(StartError::Thread)?;
        }
        let acc = Acceptor {
            poll: apoll,
            io_l,
            disc_l,
            senders,
            wakers: wakers.clone(),
            shutdown: shutdown.clone(),
            next: AtomicUsize::new(0),
            admission: reg.admission.clone(),
            refusals: RefusalLog::default(),
        };
        let acceptor = std::thread::Builder::new()
            .name("sluice-accept".into())
            .spawn(move || acc.run())
            .map_err(StartError::Thread)?;

        tracing::info!(listen = %local_addr, discovery = ?discovery_addr, workers = st.workers, polling = ?st.polling, "target started");
        Ok(TargetHandle {
            reg,
            shutdown,
            wakers,
            workers,
            acceptor: Some(acceptor),
            acceptor_waker,
            local_addr,
            discovery_addr,
            started: Instant::now(),
            tenants,
            admin,
            reload_action,
            charging,
            io_queues,
        })
    }
}

/// Sets `target.tcp_congestion`, if any, on a listener (the sockets it
/// accepts inherit it).
fn set_congestion(
    st: &sluice_config::TargetSettings,
    l: &std::net::TcpListener,
    addr: std::net::SocketAddr,
) -> Result<(), StartError> {
    use sluice_runtime::net;
    let Some(name) = &st.tcp_congestion else {
        return Ok(());
    };
    net::set_tcp_congestion(l, name).map_err(|source| StartError::TcpCongestion {
        name: name.clone(),
        addr,
        available: net::available_tcp_congestion().join(" "),
        source,
    })
}

/// Says once at start which TCP congestion control the target's sockets
/// use; under the system's BBR, also that it holds back bursts of large
/// reads on short paths (docs/target.md, *Congestion control*).
fn log_congestion(st: &sluice_config::TargetSettings) {
    if let Some(name) = &st.tcp_congestion {
        tracing::info!(tcp_congestion = %name, "the target's sockets use their own TCP congestion control (target.tcp_congestion)");
        return;
    }
    match sluice_runtime::net::system_tcp_congestion() {
        Some(sys) if sys == "bbr" && st.send_within_cwnd => tracing::info!(
            system = %sys,
            "the target's sockets take the system's TCP congestion control, bbr, whose small window on short paths holds back bursts of large reads; target.send_within_cwnd (on) recovers most of that, and target.tcp_congestion = \"cubic\" changes this target's sockets alone"
        ),
        Some(sys) if sys == "bbr" => tracing::info!(
            system = %sys,
            "the target's sockets take the system's TCP congestion control, bbr, which holds back bursts of large reads on short paths (7-24 % at 128 KiB on loopback, measured, with target.send_within_cwnd off as here); target.tcp_congestion = \"cubic\" changes this target's sockets alone"
        ),
        Some(sys) => {
            tracing::info!(system = %sys, "the target's sockets take the system's TCP congestion control")
        }
        None => {}
    }
}
