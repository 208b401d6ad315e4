//! The client side of Flint's isolation across volumes: one per process
//! (inside the [`crate::DrivePool`] its volumes share).
//!
//! * **View agent** ([`ViewAgent`]): every drive I/O a volume sends is
//!   timed and recorded. A task sends the samples in batches (`ViewSync`),
//!   pulls the entities whose counters show another client moved them
//!   (`ViewQuery`), and a second task holds a `WatchView` stream on which
//!   the controller pushes this client's part of the view each epoch.
//!   Queries ([`ClientIsolation::query`]) read the local copy: no round trip.
//! * **eIO gate** ([`EioScheduler`]): volumes with eIO on wait here for
//!   admission before each drive I/O; the PIFO decides the order, using
//!   the view's service rate per drive and the victims of the last report.
//! * **Wallet** ([`Wallet`]): while the control plane runs the bandwidth
//!   auction, each drive I/O spends its session's slice first; when the
//!   slice is spent the I/O waits here for the next grant. Bids ride on the
//!   agent's `ViewSync` and grants on its answer.
//!
//! The control plane is never waited for on an I/O's path beyond the
//! slices: telemetry goes out from its own task, an unreachable control
//! plane only means the view ages (samples are held up to a bound, then
//! dropped), and a wallet that hears no grant for a second stops metering.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sluice_flint::auction::{Wallet, WalletConfig};
use sluice_flint::eio::{EioConfig, EioCounters, EioScheduler, IoKind, StreamId};
use sluice_flint::view::{AgentConfig, EntityView, IoSample, SampleBatch, ViewAgent};
use sluice_flint::Entity;
use sluice_runtime::sync::lock;
use tokio::sync::oneshot;

use crate::client::ControlClient;
use crate::view_pb;

/// How often the agent task looks for a due batch.
const AGENT_TICK: Duration = Duration::from_millis(5);
/// Longest wait before the PUSH stream is opened again.
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);

type Gate = EioScheduler<oneshot::Sender<()>>;

/// A process's view agent and eIO gate.
#[derive(Debug)]
pub struct ClientIsolation {
    client: String,
    origin: Instant,
    agent: Mutex<ViewAgent>,
    eio: Mutex<Gate>,
    wallet: Mutex<Wallet<oneshot::Sender<()>>>,
    /// Wakes the sync task: a session ran out of slices.
    hungry: tokio::sync::Notify,
    /// Syncs sent over the fast channel and over gRPC.
    paths: Mutex<(u64, u64)>,
    /// The last answer said the auction runs (the I/O path's cheap test).
    auction_on: AtomicBool,
    started: AtomicBool,
    /// I/Os sent past the gate because its PIFO was full.
    eio_unscheduled: AtomicU64,
}

/// The default client name: `HOSTNAME:PID`.
pub fn default_client_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// An admitted I/O's place in the gate; dropping it completes the I/O.
#[derive(Debug)]
pub struct EioPermit {
    gate: Arc<ClientIsolation>,
    drive: u64,
    bytes: u64,
}

impl Drop for EioPermit {
    fn drop(&mut self) {
        self.gate.complete(self.drive, self.bytes);
    }
}

/// Waiting for admission; if the waiting future is dropped after the gate
/// admitted it, the slot is given back.
struct Waiting {
    gate: Arc<ClientIsolation>,
    rx: Option<oneshot::Receiver<()>>,
    drive: u64,
    bytes: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.gate.complete(self.drive, self.bytes);
            }
        }
    }
}

impl ClientIsolation {
    pub fn new(client: &str, eio: EioConfig) -> Result<Arc<ClientIsolation>, String> {
        Ok(Arc::new(ClientIsolation {
            client: client.to_owned(),
            origin: Instant::now(),
            agent: Mutex::new(ViewAgent::new(client, AgentConfig::default())),
            eio: Mutex::new(EioScheduler::new(eio)?),
            wallet: Mutex::new(Wallet::new(WalletConfig::default())),
            hungry: tokio::sync::Notify::new(),
            paths: Mutex::new((0, 0)),
            auction_on: AtomicBool::new(false),
            started: AtomicBool::new(false),
            eio_unscheduled: AtomicU64::new(0),
        }))
    }

    /// The name the control plane knows this client by (its NetPipe).
    pub fn client(&self) -> &str {
        &self.client
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Records one completed drive I/O of `volume` (`None`: of no volume)
    /// for the view.
    pub fn record(
        &self,
        volume: Option<u64>,
        drive: u64,
        write: bool,
        bytes: usize,
        latency: Duration,
    ) {
        let s = IoSample {
            drive,
            volume,
            write,
            bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
            latency_us: u32::try_from(latency.as_micros()).unwrap_or(u32::MAX),
            at_us: self.now_us(),
        };
        lock(&self.agent).record(s);
    }

    /// Spends `bytes` of `volume`'s slice of `drive` (Algorithm 3): at once
    /// while the slice lasts or the auction is off, else after the next
    /// grant.
    pub async fn spend(&self, volume: u64, drive: u64, bytes: u64, write: bool) {
        // The auction off (the usual case): nothing to count, no clock, no
        // lock.
        if !self.auction_on.load(Ordering::Relaxed) {
            return;
        }
        let rx = {
            let now = self.now_us();
            let mut w = lock(&self.wallet);
            if w.try_spend(now, volume, drive, bytes, write) {
                return;
            }
            let (tx, rx) = oneshot::channel();
            w.wait(volume, drive, bytes, write, tx);
            rx
        };
        self.hungry.notify_one();
        // The sender goes when the wallet releases it or is dropped with
        // `self`; either way the I/O may go.
        let _ = rx.await;
    }

    /// Syncs sent so far over the control plane's fast channel and over
    /// gRPC.
    pub fn sync_paths(&self) -> (u64, u64) {
        *lock(&self.paths)
    }

    /// I/Os waiting for slices.
    pub fn auction_waiting(&self) -> usize {
        lock(&self.wallet).waiting()
    }

    /// Whether this client's I/O is metered by the auction now.
    pub fn metered(&self) -> bool {
        lock(&self.wallet).metered(self.now_us())
    }

    /// Waits until the eIO PIFO admits an I/O of `bytes` to `drive`.
    pub async fn admit(
        self: &Arc<Self>,
        stream: StreamId,
        drive: u64,
        kind: IoKind,
        bytes: u64,
        weight: f64,
    ) -> EioPermit {
        let (tx, rx) = oneshot::channel();
        {
            let now = self.now_us();
            let mut g = lock(&self.eio);
            if let Err(tx) = g.enqueue(now, stream, drive, kind, bytes, weight, tx) {
                // The PIFO is full: admit outside it rather than fail the
                // I/O (the limit bounds memory, not correctness).
                drop(tx);
                drop(g);
                self.eio_unscheduled.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(drive, "eIO gate full; I/O sent unscheduled");
                return EioPermit::unscheduled(self.clone(), drive);
            }
            self.dispatch(&mut g, now);
        }
        let mut w = Waiting {
            gate: self.clone(),
            rx: Some(rx),
            drive,
            bytes,
        };
        if let Some(rx) = w.rx.as_mut() {
            // The sender is only dropped unsent when the gate is dropped,
            // and the gate lives as long as `self`.
            let _ = rx.await;
        }
        w.rx = None;
        EioPermit {
            gate: self.clone(),
            drive,
            bytes,
        }
    }

    /// Sends every admission the gate allows now.
    fn dispatch(&self, g: &mut Gate, now: u64) {
        while let Some(a) = g.poll_admit(now) {
            if a.token.send(()).is_err() {
                // Its waiter is gone: the slot is free again.
                g.complete(a.drive, a.bytes);
            }
        }
    }

    fn complete(&self, drive: u64, bytes: u64) {
        if bytes == u64::MAX {
            return; // unscheduled
        }
        let now = self.now_us();
        let mut g = lock(&self.eio);
        g.complete(drive, bytes);
        self.dispatch(&mut g, now);
    }

    /// The agent task's step: the batch due now, if any (public for
    /// benchmarks and tests).
    pub fn poll_batch(&self) -> Option<SampleBatch> {
        let now = self.now_us();
        lock(&self.agent).poll_batch(now)
    }

    /// I/Os waiting in the eIO gate.
    pub fn eio_pending(&self) -> usize {
        lock(&self.eio).pending()
    }

    /// What the eIO gate holds and has done, and how many I/Os went past
    /// it unscheduled because its PIFO was full.
    pub fn eio_counters(&self) -> (EioCounters, u64) {
        (
            lock(&self.eio).counters(),
            self.eio_unscheduled.load(Ordering::Relaxed),
        )
    }

    /// The view of `e` as this client holds it (no round trip).
    pub fn query(&self, e: &Entity) -> Option<EntityView> {
        lock(&self.agent).query(e).cloned()
    }

    /// Whether the last report this client has calls its session to
    /// `drive` a victim.
    pub fn is_victim(&self, drive: u64) -> bool {
        lock(&self.agent).is_victim(drive)
    }

    /// How loaded `drive` looks from here, for choosing a replica to read
    /// (lower is better): a congested drive first of all, then the view's
    /// queueing delay, then this client's own mean *read* latency to it in
    /// the window. Writes do not count: a replica that took one large
    /// write would otherwise look slower than another's small reads and
    /// never be read from. A drive this client has not read from lately
    /// scores only the view's part, so it gets tried. 0 when nothing is
    /// known.
    pub fn drive_load(&self, drive: u64) -> f64 {
        let a = lock(&self.agent);
        let held = a.query(&Entity::Drive(drive));
        let congested = held.is_some_and(|v| v.congested);
        let delay = held.map_or(0.0, |v| v.stats.queue_delay_us_mean);
        let own = a
            .local_read_stats(drive, self.now_us())
            .map_or(0.0, |s| s.latency_us_mean);
        (if congested { 1e9 } else { 0.0 }) + delay + own
    }

    /// This client's own window of its I/O to `drive`.
    pub fn local_stats(&self, drive: u64) -> Option<sluice_flint::WindowStats> {
        let now = self.now_us();
        lock(&self.agent).local_stats(drive, now)
    }

    /// The epoch of the last report this client has.
    pub fn epoch(&self) -> u64 {
        lock(&self.agent).report().epoch
    }

    /// Samples waiting to go out, and samples dropped while the control
    /// plane could not take them.
    pub fn telemetry_backlog(&self) -> (usize, u64) {
        let a = lock(&self.agent);
        (a.pending(), a.dropped())
    }

    /// Starts the agent's tasks on the current tokio runtime, once per
    /// process (the first volume's control plane is the one told).
    pub fn start(self: &Arc<Self>, control: &ControlClient) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(sync_task(Arc::downgrade(self), control.clone()));
        tokio::spawn(watch_task(Arc::downgrade(self), control.clone()));
    }

    /// Takes a snapshot (PUSH or PULL) into the agent and the gate: each
    /// drive's service rate (its capacity as the view knows it) and whether
    /// this client's session to it is a victim.
    fn absorb(&self, snap: sluice_flint::view::ViewSnapshot) {
        let mut a = lock(&self.agent);
        a.handle_snapshot(snap);
        let mut g = lock(&self.eio);
        for (d, v) in held_drives(&a) {
            let rate = (v.capacity_bytes_per_sec > 0.0).then(|| v.capacity_bytes_per_sec / 1e6);
            g.set_drive_view(d, rate, a.is_victim(d));
        }
    }
}

/// The drive entries an agent holds.
fn held_drives(a: &ViewAgent) -> Vec<(u64, EntityView)> {
    a.held()
        .filter_map(|v| match v.entity {
            Entity::Drive(d) => Some((d, v.clone())),
            _ => None,
        })
        .collect()
}

impl EioPermit {
    fn unscheduled(gate: Arc<ClientIsolation>, drive: u64) -> EioPermit {
        EioPermit {
            gate,
            drive,
            bytes: u64::MAX,
        }
    }
}

/// How syncs travel: the control plane's fast channel when it serves one,
/// gRPC otherwise or whenever the channel fails.
#[derive(Debug)]
pub struct SyncPath {
    channel: Option<crate::view_wire::ViewChannel>,
    /// When to look for (or retry) the channel.
    next_try: Instant,
    /// Syncs sent over the channel and over gRPC.
    pub over_channel: u64,
    pub over_grpc: u64,
}

/// Time between attempts to (re)open the fast channel.
const CHANNEL_RETRY: Duration = Duration::from_secs(5);

impl Default for SyncPath {
    fn default() -> Self {
        SyncPath {
            channel: None,
            next_try: Instant::now(),
            over_channel: 0,
            over_grpc: 0,
        }
    }
}

impl SyncPath {
    /// Opens the fast channel if the control plane serves one and it is
    /// time to try.
    async fn ensure(&mut self, control: &ControlClient) {
        if self.channel.is_some() || Instant::now() < self.next_try {
            return;
        }
        self.next_try = Instant::now() + CHANNEL_RETRY;
        let Ok(status) = control.status().await else {
            return;
        };
        if status.view_addr.is_empty() {
            return;
        }
        match crate::view_wire::ViewChannel::connect(&status.view_addr, control.token()).await {
            Ok(c) => {
                tracing::debug!(addr = %status.view_addr, "view: syncing over the fast channel");
                self.channel = Some(c);
            }
            Err(e) => tracing::debug!(addr = %status.view_addr, error = %e,
                "view: fast channel unavailable; gRPC"),
        }
    }

    /// Counts an exchange over the channel; a failure drops the channel
    /// (the caller then goes over gRPC).
    fn took<T>(&mut self, r: Result<T, crate::view_wire::WireCallError>) -> Option<T> {
        match r {
            Ok(v) => {
                self.over_channel += 1;
                Some(v)
            }
            Err(e) => {
                tracing::debug!(error = %e, "view: fast channel failed; gRPC");
                self.channel = None;
                None
            }
        }
    }

    /// One `ViewSync`.
    pub async fn view_sync(
        &mut self,
        control: &ControlClient,
        msg: crate::pb::ViewBatch,
    ) -> Result<crate::pb::ViewAck, crate::error::VolumeError> {
        self.ensure(control).await;
        if let Some(c) = self.channel.as_mut() {
            let r = c.view_sync(&msg).await;
            if let Some(ack) = self.took(r) {
                return Ok(ack);
            }
        }
        self.over_grpc += 1;
        control.view_sync(msg).await
    }

    /// One `ViewTargetReport`.
    pub async fn target_report(
        &mut self,
        control: &ControlClient,
        msg: crate::pb::TargetReport,
    ) -> Result<crate::pb::TargetReportAck, crate::error::VolumeError> {
        self.ensure(control).await;
        if let Some(c) = self.channel.as_mut() {
            let r = c.target_report(&msg).await;
            if let Some(ack) = self.took(r) {
                return Ok(ack);
            }
        }
        self.over_grpc += 1;
        control.view_target_report(msg).await
    }
}

/// Sends due batches and bids, takes the grants, and pulls stale
/// entities, until the process's isolation state is dropped.
async fn sync_task(me: Weak<ClientIsolation>, control: ControlClient) {
    let mut failing = false;
    let mut path = SyncPath::default();
    loop {
        let wait = {
            let Some(iso) = me.upgrade() else { return };
            let now = iso.now_us();
            let deadline = lock(&iso.wallet).deadline_us();
            let until = deadline.map_or(AGENT_TICK, |d| {
                Duration::from_micros(d.saturating_sub(now)).min(AGENT_TICK)
            });
            let iso2 = iso.clone();
            async move {
                tokio::select! {
                    () = tokio::time::sleep(until) => {}
                    () = iso2.hungry.notified() => {}
                }
            }
        };
        wait.await;
        let Some(iso) = me.upgrade() else { return };
        let now = iso.now_us();
        release(lock(&iso.wallet).poll_release(now));
        let bids = lock(&iso.wallet).poll_bid(now);
        let batch = {
            let mut a = lock(&iso.agent);
            // A bid takes whatever samples wait along.
            if bids.is_some() {
                Some(a.flush_batch(now))
            } else {
                a.poll_batch(now)
            }
        };
        if let Some(batch) = batch {
            let bids = bids.unwrap_or_default();
            let synced = path
                .view_sync(&control, view_pb::batch_to_pb(&batch, &bids))
                .await;
            *lock(&iso.paths) = (path.over_channel, path.over_grpc);
            match synced {
                Ok(ack) => {
                    if failing {
                        tracing::info!(control = %control.addr(), "view: telemetry flows again");
                        failing = false;
                    }
                    match view_pb::ack_from_pb(ack) {
                        Ok((ack, grants)) => {
                            lock(&iso.agent).handle_ack(&ack);
                            let now = iso.now_us();
                            iso.auction_on.store(grants.on, Ordering::Relaxed);
                            release(lock(&iso.wallet).handle_grants(now, &grants));
                        }
                        Err(e) => tracing::warn!(error = %e, "view: bad acknowledgement"),
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(control = %control.addr(), error = %e,
                            "view: telemetry cannot reach the control plane; holding samples");
                        failing = true;
                    }
                    lock(&iso.agent).handle_undelivered(batch);
                }
            }
        }
        let pull = lock(&iso.agent).poll_pull();
        if let Some(entities) = pull {
            let req = crate::pb::ViewQueryRequest {
                entities: entities.iter().map(view_pb::entity_to_pb).collect(),
                all: false,
            };
            match control.view_query(req).await {
                Ok(snap) => match view_pb::snapshot_from_pb(&snap) {
                    Ok(snap) => iso.absorb(snap),
                    Err(e) => tracing::warn!(error = %e, "view: bad snapshot"),
                },
                Err(e) => tracing::debug!(error = %e, "view: pull failed"),
            }
        }
    }
}

/// Lets go the I/Os the wallet released.
fn release(released: Vec<oneshot::Sender<()>>) {
    for tx in released {
        // A waiter that is gone has nothing to spend.
        let _ = tx.send(());
    }
}

/// A target's view agent: every `interval`, reads `counters` (the
/// target's per-namespace I/O) and reports what changed to the control
/// plane, until the returned future is dropped. An unreachable control
/// plane is logged once and retried at the next interval (the report of
/// the lost interval is gone; the view only ages).
pub async fn target_agent(
    control: ControlClient,
    port: String,
    interval: Duration,
    counters: impl Fn() -> Vec<sluice_flint::TargetCounters> + Send + 'static,
) {
    let origin = Instant::now();
    let interval_us = u64::try_from(interval.as_micros()).unwrap_or(u64::MAX);
    let mut agent = sluice_flint::TargetAgent::new(&port, interval_us);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut path = SyncPath::default();
    loop {
        tick.tick().await;
        let now = u64::try_from(origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        let Some(report) = agent.poll_report(now, &counters()) else {
            continue;
        };
        if report.namespaces.is_empty() {
            continue;
        }
        match path
            .target_report(&control, view_pb::target_report_to_pb(&report))
            .await
        {
            Ok(ack) => {
                if failing {
                    tracing::info!(control = %control.addr(), "view: target reports flow again");
                    failing = false;
                }
                if ack.unknown > 0 {
                    tracing::debug!(unknown = ack.unknown, port = %port,
                        "view: namespaces the pool has no drive for");
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(control = %control.addr(), error = %e,
                        "view: target reports cannot reach the control plane");
                    failing = true;
                }
            }
        }
    }
}

/// Holds the PUSH stream open, reopening it with backoff.
async fn watch_task(me: Weak<ClientIsolation>, control: ControlClient) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(client) = me.upgrade().map(|i| i.client.clone()) else {
            return;
        };
        match control.watch_view(&client).await {
            Ok(mut stream) => {
                backoff = Duration::from_millis(100);
                loop {
                    match stream.message().await {
                        Ok(Some(push)) => {
                            let Some(iso) = me.upgrade() else { return };
                            let Some(snap) = push.snapshot else { continue };
                            match view_pb::snapshot_from_pb(&snap) {
                                Ok(snap) => iso.absorb(snap),
                                Err(e) => tracing::warn!(error = %e, "view: bad push"),
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "view: push stream ended");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "view: cannot open the push stream"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(WATCH_BACKOFF_MAX);
    }
}

/// Flint's isolation on the client side (eIO gate, view agent, wallet) as
/// Prometheus metrics, read at scrape time: one sample per volume's gate,
/// labelled with the volume and the client's name in the view.
#[derive(Debug)]
pub struct IsolationCollector(pub Vec<(String, Arc<ClientIsolation>)>);

/// One volume's isolation, read once per scrape (each lock taken once:
/// the gate's is on the I/O path).
struct IsolationSnapshot<'a> {
    volume: &'a str,
    client: &'a str,
    eio: EioCounters,
    eio_unscheduled: u64,
    auction_waiting: usize,
    metered: bool,
    syncs: (u64, u64),
    epoch: u64,
    telemetry: (usize, u64),
}

impl IsolationSnapshot<'_> {
    /// The labels of this volume's samples.
    fn labels(&self) -> [(&'static str, sluice_admin::metrics::Esc<'_>); 2] {
        use sluice_admin::metrics::Esc;
        [("volume", Esc(self.volume)), ("client", Esc(self.client))]
    }
}

impl prometheus_client::collector::Collector for IsolationCollector {
    fn encode(&self, mut enc: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use prometheus_client::registry::Unit;
        use sluice_admin::metrics::{counters, gauges, Esc};
        let snaps: Vec<IsolationSnapshot> = self
            .0
            .iter()
            .map(|(volume, i)| {
                let (eio, eio_unscheduled) = i.eio_counters();
                IsolationSnapshot {
                    volume,
                    client: i.client(),
                    eio,
                    eio_unscheduled,
                    auction_waiting: i.auction_waiting(),
                    metered: i.metered(),
                    syncs: i.sync_paths(),
                    epoch: i.epoch(),
                    telemetry: i.telemetry_backlog(),
                }
            })
            .collect();
        let e = &mut enc;
        let each = |f: fn(&IsolationSnapshot) -> u64| {
            snaps
                .iter()
                .map(move |s| (s.labels(), f(s)))
                .collect::<Vec<_>>()
        };
        gauges(
            e,
            "sluice_isolation_eio_pending",
            "Drive I/Os waiting in the eIO gate for admission.",
            None,
            each(|s| s.eio.pending as u64),
        )?;
        gauges(
            e,
            "sluice_isolation_eio_inflight",
            "Drive I/Os the eIO gate admitted that have not completed.",
            None,
            each(|s| u64::from(s.eio.inflight_ios)),
        )?;
        counters(
            e,
            "sluice_isolation_eio_admitted",
            "Drive I/Os the eIO gate admitted.",
            None,
            each(|s| s.eio.admitted),
        )?;
        counters(
            e,
            "sluice_isolation_eio_passed_blocked_head",
            "Small drive I/Os admitted past a large one that did not fit (into the small-I/O reserve).",
            None,
            each(|s| s.eio.passed_blocked_head),
        )?;
        counters(
            e,
            "sluice_isolation_eio_wait",
            "Time admitted drive I/Os waited in the eIO gate, summed.",
            Some(&Unit::Seconds),
            snaps
                .iter()
                .map(|s| (s.labels(), s.eio.waited_us as f64 / 1e6)),
        )?;
        counters(
            e,
            "sluice_isolation_eio_unscheduled",
            "Drive I/Os sent past the eIO gate because its queue was full.",
            None,
            each(|s| s.eio_unscheduled),
        )?;
        gauges(
            e,
            "sluice_isolation_auction_waiting",
            "Drive I/Os waiting for the bandwidth auction's next grant.",
            None,
            each(|s| s.auction_waiting as u64),
        )?;
        gauges(
            e,
            "sluice_isolation_auction_metered",
            "1 while the bandwidth auction meters this client's I/O.",
            None,
            each(|s| u64::from(s.metered)),
        )?;
        counters(
            e,
            "sluice_isolation_view_syncs",
            "Telemetry syncs sent to the control plane, by path (the fast channel or gRPC).",
            None,
            snaps.iter().flat_map(|s| {
                let [volume, client] = s.labels();
                [("fast", s.syncs.0), ("grpc", s.syncs.1)]
                    .map(|(path, n)| ([volume, client, ("path", Esc(path))], n))
            }),
        )?;
        gauges(
            e,
            "sluice_isolation_view_epoch",
            "Epoch of the last view report this client holds.",
            None,
            each(|s| s.epoch),
        )?;
        gauges(
            e,
            "sluice_isolation_telemetry_pending_samples",
            "I/O samples waiting to go to the control plane.",
            None,
            each(|s| s.telemetry.0 as u64),
        )?;
        counters(
            e,
            "sluice_isolation_telemetry_dropped_samples",
            "I/O samples dropped while the control plane could not take them.",
            None,
            each(|s| s.telemetry.1),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    fn one_at_a_time() -> Arc<ClientIsolation> {
        ClientIsolation::new(
            "t",
            EioConfig {
                drive_inflight_ios_max: 1,
                ..EioConfig::default()
            },
        )
        .expect("config")
    }

    #[tokio::test]
    async fn a_waiter_dropped_before_or_after_admission_gives_its_slot_back() {
        let g = one_at_a_time();
        let a = g.admit(StreamId(1), 7, IoKind::Read, 4096, 1.0).await;
        // B waits behind A; its future is dropped while it waits.
        let g2 = g.clone();
        let b = tokio::spawn(async move {
            let _p = g2.admit(StreamId(2), 7, IoKind::Read, 4096, 1.0).await;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        assert_eq!(g.eio_pending(), 1);
        b.abort();
        let _ = b.await;
        // A completes: the slot passes to nobody and stays free.
        drop(a);
        assert_eq!(g.eio_pending(), 0);
        let c = tokio::time::timeout(
            Duration::from_secs(5),
            g.admit(StreamId(3), 7, IoKind::Read, 4096, 1.0),
        )
        .await
        .expect("the drive is idle again");
        // Admitted but never polled again: dropping the waiter frees it.
        let g3 = g.clone();
        let mut d = Box::pin(g3.admit(StreamId(4), 7, IoKind::Read, 4096, 1.0));
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(d.as_mut().poll(&mut cx).is_pending());
        drop(c); // admits d's waiter, which is never polled...
        drop(d); // ...and is dropped: the slot comes back
        tokio::time::timeout(
            Duration::from_secs(5),
            g.admit(StreamId(5), 7, IoKind::Read, 4096, 1.0),
        )
        .await
        .expect("no slot leaked");
    }

    #[test]
    fn replicas_are_compared_by_their_reads_and_an_unread_one_gets_tried() {
        let g = one_at_a_time();
        // Drive 1 took one large, slow write; drive 2 answers small reads
        // in 3 ms. Nothing is known of drive 1's reads: it is tried first.
        g.record(None, 1, true, 1 << 20, Duration::from_millis(10));
        g.record(None, 2, false, 4096, Duration::from_millis(3));
        assert!(g.drive_load(1) < g.drive_load(2));
        assert_eq!(g.drive_load(1), 0.0);
        // Once drive 1 has read fast, it stays ahead; if it reads slower
        // than drive 2, drive 2 is ahead again.
        g.record(None, 1, false, 4096, Duration::from_micros(80));
        assert!(g.drive_load(1) < g.drive_load(2));
        for _ in 0..10 {
            g.record(None, 1, false, 4096, Duration::from_millis(9));
        }
        assert!(g.drive_load(1) > g.drive_load(2));
    }

    #[tokio::test]
    async fn the_gate_is_served_as_prometheus_metrics() {
        let g = one_at_a_time();
        let a = g.admit(StreamId(1), 7, IoKind::Read, 4096, 1.0).await;
        let g2 = g.clone();
        let b = tokio::spawn(async move {
            let _p = g2.admit(StreamId(2), 7, IoKind::Read, 4096, 1.0).await;
        });
        tokio::task::yield_now().await;
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register_collector(Box::new(IsolationCollector(vec![("v1".into(), g.clone())])));
        let text = sluice_admin::metrics::encode(&reg).expect("encodes");
        let samples = sluice_admin::metrics::parse_text(&text);
        let find = |n: &str| {
            samples
                .iter()
                .find(|x| {
                    x.0 == n
                        && x.1.iter().any(|l| l == &("client".into(), "t".into()))
                        && x.1.iter().any(|l| l == &("volume".into(), "v1".into()))
                })
                .map(|x| x.2)
        };
        assert_eq!(find("sluice_isolation_eio_pending"), Some(1.0), "{text}");
        assert_eq!(find("sluice_isolation_eio_inflight"), Some(1.0), "{text}");
        assert_eq!(
            find("sluice_isolation_eio_admitted_total"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            find("sluice_isolation_eio_unscheduled_total"),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            find("sluice_isolation_auction_metered"),
            Some(0.0),
            "{text}"
        );
        let grpc = samples.iter().find(|x| {
            x.0 == "sluice_isolation_view_syncs_total"
                && x.1.iter().any(|l| l == &("path".into(), "grpc".into()))
        });
        assert_eq!(grpc.map(|x| x.2), Some(0.0), "{text}");
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), b)
            .await
            .expect("the second read is admitted")
            .expect("task");
        let (c, _) = g.eio_counters();
        assert_eq!((c.admitted, c.pending, c.inflight_ios), (2, 0, 0));
    }
}
