//! Flint's isolation across volumes (docs/isolation-volumes.md).
//!
//! `auction` (Flint Fig. 9a): see [`run_auction`].
//!
//! `eio` (Flint Fig. 10): a latency-sensitive volume beside a volume that
//! streams 128 KiB reads, both on one emulated SSD and opened by one client
//! (one `DrivePool`, so one eIO scheduler). The victim reads 4 KiB at
//! random at QD 4; the streamer reads 128 KiB at random at QD 32. Each
//! repeat runs both with the eIO scheduler off, then on, in the same
//! process; the table gives the victim's P50/P99/P999 and both volumes'
//! throughput, medians over the repeats with their ranges.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_config::SsdConfig;
use sluice_control::isolation::ClientIsolation;
use sluice_control::server::Metadata;
use sluice_control::{DrivePool, Volume};
use sluice_flint::EioConfig;
use sluice_host::{ConnectOptions, IoFlags};

use crate::report;
use crate::stall::StallDetector;
use crate::volumes::{drive_target, drive_target_polling, Control};
use crate::EioArgs;

const MIB: u64 = 1 << 20;
/// Bytes of each volume written before the runs (reads of unallocated
/// extents never reach a drive).
const FILLED_BYTES: u64 = 64 * MIB;
const VICTIM_QD: u64 = 4;
const STREAM_QD: u64 = 32;
const STREAM_BYTES: usize = 128 << 10;
/// The stall detector's sleep, and the lateness that counts as a stall:
/// wake-ups of a real-time thread are late by microseconds unless the vCPU
/// was gone.
const STALL_PERIOD: Duration = Duration::from_millis(1);
const STALL_LATE_MIN: Duration = Duration::from_micros(500);

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Run {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    victim_iops: f64,
    stream_mb_s: f64,
    /// P999 of the victim's I/Os that overlapped no vCPU stall (NaN when
    /// the detector could not run real-time).
    p999_us_unstalled: f64,
    /// vCPU stalls seen, and the share of the victim's I/Os they touched.
    stalls: usize,
    stalled_ms: f64,
    stalled_io_share: f64,
}

fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)])
}

/// A cheap per-task random stream (xorshift).
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

async fn workload(victim: &Arc<Volume>, stream: &Arc<Volume>, runtime: Duration) -> Result<Run> {
    let blocks = FILLED_BYTES / 4096;
    let start = Instant::now();
    let stop = start + runtime;
    let detector = StallDetector::start(crate::affinity::cpus(), STALL_PERIOD, STALL_LATE_MIN);
    let mut tasks = Vec::new();
    for w in 0..VICTIM_QD {
        let v = victim.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat: Vec<(Instant, u32)> = Vec::with_capacity(1 << 16);
            let mut x = 0x9e37_79b9_7f4a_7c15 ^ (w + 1);
            while Instant::now() < stop {
                let lba = next(&mut x) % blocks;
                let t = Instant::now();
                v.read(lba, 4096, IoFlags::default()).await?;
                lat.push((
                    t,
                    u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX),
                ));
            }
            anyhow::Ok((lat, 0u64))
        }));
    }
    for w in 0..STREAM_QD {
        let v = stream.clone();
        tasks.push(tokio::spawn(async move {
            let per = (STREAM_BYTES / 4096) as u64;
            let mut x = 0x2545_f491_4f6c_dd1d ^ (w + 1);
            let mut bytes = 0u64;
            while Instant::now() < stop {
                let lba = (next(&mut x) % (blocks / per)) * per;
                v.read(lba, STREAM_BYTES, IoFlags::default()).await?;
                bytes += STREAM_BYTES as u64;
            }
            anyhow::Ok((Vec::new(), bytes))
        }));
    }
    if std::env::var_os("SLUICE_LAB_DEBUG").is_some() {
        let v = victim.clone();
        tokio::spawn(async move {
            while Instant::now() < stop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                eprintln!("eio pending {}", v.pool().isolation().eio_pending());
            }
        });
    }
    let mut lat = Vec::new();
    let mut bytes = 0;
    for t in tasks {
        let (l, b) = t.await??;
        lat.extend(l);
        bytes += b;
    }
    let secs = start.elapsed().as_secs_f64();
    let stalls = detector.stop();
    let mut unstalled: Vec<u32> = lat
        .iter()
        .filter(|(t, us)| !stalls.overlaps(*t, *t + Duration::from_micros(u64::from(*us))))
        .map(|(_, us)| *us)
        .collect();
    unstalled.sort_unstable();
    let stalled = lat.len() - unstalled.len();
    let mut lat: Vec<u32> = lat.into_iter().map(|(_, us)| us).collect();
    lat.sort_unstable();
    #[allow(clippy::cast_precision_loss)]
    Ok(Run {
        p50_us: quantile(&lat, 0.5),
        p99_us: quantile(&lat, 0.99),
        p999_us: quantile(&lat, 0.999),
        victim_iops: lat.len() as f64 / secs,
        stream_mb_s: bytes as f64 / secs / 1e6,
        p999_us_unstalled: if stalls.realtime {
            quantile(&unstalled, 0.999)
        } else {
            f64::NAN
        },
        stalls: stalls.count(),
        stalled_ms: stalls.total().as_secs_f64() * 1e3,
        stalled_io_share: stalled as f64 / lat.len().max(1) as f64,
    })
}

/// The drive: a modest NVMe SSD (1 GB/s reads, 8 channels, 80 µs).
fn ssd() -> SsdConfig {
    SsdConfig::default()
}

pub fn run_eio(a: &EioArgs) -> Result<()> {
    let (out, runtime, repeats) = (&a.repeat.out, a.repeat.runtime, a.repeat.repeats);
    let dir = std::env::temp_dir().join(format!("sluice-lab-eio-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let target = drive_target_polling(1, 256 * MIB, Some(ssd()), a.target_polling)?;
    let control = Control::start(Metadata::Redb(dir.join("m.redb")))?;
    control.add_drives(&[&target], 1)?;
    control.create("victim", 128 * MIB, 1)?;
    control.create("stream", 128 * MIB, 1)?;
    let client = control.client()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The configurations: off, then on with four in-flight caps per drive.
    let caps_kib = &a.caps_kib;
    let runs: Vec<Vec<Run>> = rt.block_on(async {
        let opts = ConnectOptions {
            hostnqn: "nqn.2026-11.io.sluice:lab-eio".into(),
            queue_depth: 128,
            ..ConnectOptions::default()
        };
        // Fill through one client first: volumes opened before the fill
        // would hold maps without these extents and read zeros.
        {
            let pool = DrivePool::new(opts.clone());
            let chunk = vec![0x5au8; 1 << 20];
            for name in ["victim", "stream"] {
                let v = Volume::open(client.clone(), pool.clone(), name).await?;
                for i in 0..FILLED_BYTES / MIB {
                    v.write(i * MIB / 4096, &chunk, IoFlags::default())
                        .await
                        .context("filling the volumes")?;
                }
            }
        }
        let mut pairs = Vec::new();
        for &cap in caps_kib {
            let iso = ClientIsolation::new(
                &format!("lab-eio-{cap}k"),
                EioConfig {
                    drive_inflight_bytes_max: cap << 10,
                    ..EioConfig::default()
                },
            )
            .map_err(anyhow::Error::msg)?;
            let pool = DrivePool::with_isolation(opts.clone(), iso);
            let victim = Arc::new(Volume::open(client.clone(), pool.clone(), "victim").await?);
            let stream = Arc::new(Volume::open(client.clone(), pool.clone(), "stream").await?);
            pairs.push((victim, stream));
        }
        let mut runs = Vec::new();
        for rep in 0..repeats {
            let mut row = Vec::new();
            for k in 0..=caps_kib.len() {
                let (victim, stream) = &pairs[k.saturating_sub(1)];
                victim.set_eio(k > 0);
                stream.set_eio(k > 0);
                let r = workload(victim, stream, Duration::from_secs_f64(runtime)).await?;
                eprintln!("repeat {rep} config {k}: {r:?}");
                row.push(r);
            }
            runs.push(row);
        }
        anyhow::Ok(runs)
    })?;
    drop(rt);
    drop(control);
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);

    let col = |k: usize, f: fn(&Run) -> f64| -> (f64, f64, f64) {
        let xs: Vec<f64> = runs.iter().map(|row| f(&row[k])).collect();
        let (lo, hi) = report::range(&xs);
        (report::median(&xs), lo, hi)
    };
    // A figure the run could not take (the stall detector without
    // real-time priority) is a dash, not NaN.
    let cell = |(m, lo, hi): (f64, f64, f64)| {
        if m.is_nan() {
            "-".to_owned()
        } else {
            format!("{m:.0} ({lo:.0}-{hi:.0})")
        }
    };
    let mut md = String::new();
    md.push_str(
        "# eIO scheduler: a latency-sensitive volume beside a 128 KiB streamer (Flint Fig. 10)\n\n",
    );
    let caps = caps_kib
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- eio --runtime {runtime} --repeats {repeats} --caps-kib {caps} --target-polling {}`; load average before: {}.\n\n",
        a.target_polling,
        crate::datapath::loadavg()
    ));
    md.push_str(&format!(
        "One emulated SSD (1 GB/s reads, 100k IOPS, 8 channels, 80 µs) on one in-process Sluice target; two volumes on it opened by one client, all in one process on this machine's two vCPUs (the target's worker polls in `{}` mode). The victim reads 4 KiB at random at QD {VICTIM_QD}; the streamer reads 128 KiB at random at QD {STREAM_QD}. Each repeat runs both for {runtime} s with the eIO scheduler off, then on with {} caps on the bytes in flight per drive (`EioConfig::drive_inflight_bytes_max`; 512 KiB is the default; small I/Os have a 64 KiB reserve beyond it, and pass a large I/O that does not fit). Medians over {repeats} repeats, ranges in brackets.\n\n",
        a.target_polling,
        caps_kib.len()
    ));
    md.push_str("| eIO | victim P50 µs | victim P99 µs | victim P999 µs | victim P999 µs, I/Os clear of vCPU stalls | victim IOPS | streamer MB/s | vCPU stalls | ms stalled | victim I/Os touched by a stall |\n|---|---|---|---|---|---|---|---|---|---|\n");
    #[allow(clippy::cast_precision_loss)]
    let fields: [fn(&Run) -> f64; 9] = [
        |r| r.p50_us,
        |r| r.p99_us,
        |r| r.p999_us,
        |r| r.p999_us_unstalled,
        |r| r.victim_iops,
        |r| r.stream_mb_s,
        |r| r.stalls as f64,
        |r| r.stalled_ms,
        |r| r.stalled_io_share * 100.0,
    ];
    for k in 0..=caps_kib.len() {
        let name = if k == 0 {
            "off".to_owned()
        } else {
            format!("on, {} KiB in flight", caps_kib[k - 1])
        };
        let mut cells: Vec<String> = fields.iter().map(|f| cell(col(k, *f))).collect();
        if let Some(c) = cells.last_mut() {
            let (m, lo, hi) = col(k, fields[8]);
            *c = format!("{m:.2} % ({lo:.2}-{hi:.2})");
        }
        md.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    md.push_str("\nVictim latency, off ÷ on (per repeat, median and range); Flint reports 4.8x / 2.6x / 7.5x:\n\n| eIO | P50 | P99 | P999 | P999, I/Os clear of vCPU stalls |\n|---|---|---|---|---|\n");
    for k in 1..=caps_kib.len() {
        let gain = |f: fn(&Run) -> f64| {
            let xs: Vec<f64> = runs.iter().map(|row| f(&row[0]) / f(&row[k])).collect();
            let (lo, hi) = report::range(&xs);
            let m = report::median(&xs);
            if m.is_nan() {
                "-".to_owned()
            } else {
                format!("{m:.1}x ({lo:.1}-{hi:.1})")
            }
        };
        md.push_str(&format!(
            "| on, {} KiB in flight | {} | {} | {} | {} |\n",
            caps_kib[k - 1],
            gain(fields[0]),
            gain(fields[1]),
            gain(fields[2]),
            gain(fields[3])
        ));
    }
    md.push_str(&format!(
        "\n**Where the victim's tail comes from.** The drive model bounds a victim read's wait at the drive: it queues behind at most the cap of large reads in flight (the small reads beside it use the reserve), which at 256 KiB is 262 µs of transfer plus 84 µs of its own, about 350 µs. P50 sits below that, P99 and P999 above it: the rest is the software between the drive and the victim's task, on two vCPUs that target, client and control plane share. Two things add to it:\n\n\
- *vCPU stalls.* This VM's vCPUs disappear for 2-5 ms about once a second: perf's sampling finds no sample at all (thread, kernel or idle) on a CPU at the times the victim's four I/Os stall together. A detector measures them in every run (`crates/sluice-lab/src/stall.rs`): one `SCHED_FIFO` thread per CPU, pinned, sleeps {} ms in a loop and marks each sleep whose wake-up is more than {} µs late. The column *clear of vCPU stalls* takes the percentile over the victim's I/Os that overlapped no marked sleep.\n\
- *Run-queue waits.* `perf sched` during a run showed about 150 wake-ups a second of the client's queue thread and runtime workers waiting more than 0.3 ms to run, and each victim I/O needs several such wake-ups. A target worker that spins (`adaptive`) holds one of the two vCPUs for as long as the streamer keeps it busy, and the client's threads queue on the other: single 10 s runs on 2026-11-28 at 256 KiB gave the victim P99/P999 of 737-765 / 903-1189 µs with the target adaptive and 608-671 / 742-814 µs with it in interrupt mode, and the streamer 718-729 against 751-773 MB/s. On separate machines, as in Flint's testbed, the target's polling takes nothing from the client; here interrupt mode is the one that does not, so it is the default. The client's queue thread spinning too (`adaptive`) made it worse (P999 1441-1906 µs), and so did pinning target and client to one vCPU each (P99 2.6-2.8 ms: the client's threads then queue on one vCPU).\n",
        STALL_PERIOD.as_millis(),
        STALL_LATE_MIN.as_micros()
    ));
    report::write(out, "eio-fig10.md", &md)?;
    Ok(())
}

/// Latencies in µs, sorted: (p50, p99).
fn p50_p99(mut xs: Vec<u32>) -> (f64, f64) {
    xs.sort_unstable();
    (quantile(&xs, 0.5), quantile(&xs, 0.99))
}

/// `view` (Flint Table 1): what the shadow view costs a client.
pub fn run_view(out: &Path, repeats: u32) -> Result<()> {
    use sluice_control::isolation::ClientIsolation;
    use sluice_control::view_pb;
    use sluice_flint::view::{AgentConfig, IoSample, SampleBatch, ViewAgent};
    use sluice_flint::Entity;

    let dir = std::env::temp_dir().join(format!("sluice-lab-view-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let target = drive_target(1, 64 * MIB, None)?;
    let control = {
        let mut cfg =
            sluice_control::server::ControlConfig::new(Metadata::Redb(dir.join("m.redb")));
        cfg.view_listen = Some("127.0.0.1:0".parse()?);
        Control::start_with(cfg)?
    };
    control.add_drives(&[&target], 1)?;
    let client = control.client()?;
    let n_query: u32 = 1_000_000;
    let n_sync: u32 = 2000;
    let echo_rt = control.rt.handle().clone();
    let mut rows: Vec<[f64; 11]> = Vec::new();
    for rep in 0..repeats {
        // 1. view_query from the local copy: the agent alone, and through
        // the client's lock (what the eIO gate and callers use).
        let mut agent = ViewAgent::new("lab", AgentConfig::default());
        let mut iso_snap = None;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let sample = |i: u64| IoSample {
            drive: 0,
            volume: Some(1),
            write: i.is_multiple_of(3),
            bytes: 4096,
            latency_us: 100,
            at_us: i,
        };
        let batch = |n: u64, at: u64| SampleBatch {
            client: "lab".into(),
            sent_at_us: at,
            samples: (0..n).map(|i| sample(at + i)).collect(),
        };
        rt.block_on(async {
            client
                .view_sync(view_pb::batch_to_pb(&batch(64, 0), &[]))
                .await?;
            let snap = client
                .view_query(sluice_control::pb::ViewQueryRequest {
                    entities: vec![view_pb::entity_to_pb(&Entity::Drive(0))],
                    all: false,
                })
                .await?;
            iso_snap = Some(view_pb::snapshot_from_pb(&snap)?);
            anyhow::Ok(())
        })?;
        let snap = iso_snap.context("no snapshot")?;
        agent.handle_snapshot(snap.clone());
        let drive = Entity::Drive(0);
        let t = Instant::now();
        let mut hits = 0u32;
        for _ in 0..n_query {
            hits += u32::from(
                std::hint::black_box(agent.query(std::hint::black_box(&drive))).is_some(),
            );
        }
        let agent_ns = t.elapsed().as_nanos() as f64 / f64::from(n_query);
        anyhow::ensure!(hits == n_query, "the local copy lost the drive");
        let iso = ClientIsolation::new("lab", sluice_flint::EioConfig::default())
            .map_err(anyhow::Error::msg)?;
        let t = Instant::now();
        for _ in 0..n_query / 10 {
            std::hint::black_box(iso.query(std::hint::black_box(&drive)));
        }
        let locked_ns = t.elapsed().as_nanos() as f64 / f64::from(n_query / 10);
        // record(): the agent's per-I/O cost.
        let t = Instant::now();
        for i in 0..u64::from(n_query) {
            iso.record(Some(1), 0, i % 3 == 0, 4096, Duration::from_micros(100));
            if i % 512 == 511 {
                std::hint::black_box(iso.poll_batch());
            }
        }
        let record_ns = t.elapsed().as_nanos() as f64 / f64::from(n_query);

        // 2. view_sync round trips over gRPC, one after another, and their
        // CPU on this (the client's) thread; 3. over the fast channel,
        // against a TCP echo served by the control plane's thread.
        let (sync1, sync512, sync_cpu_ns, tcp, fast1, fast512) = rt.block_on(async {
            let mut one = Vec::new();
            let mut full = Vec::new();
            let cpu0 = sluice_cpu::current_thread_cpu_ns();
            for i in 0..n_sync {
                let b = view_pb::batch_to_pb(&batch(512, u64::from(i) * 1000), &[]);
                let t = Instant::now();
                client.view_sync(b).await?;
                full.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            let cpu = sluice_cpu::current_thread_cpu_ns().saturating_sub(cpu0);
            for i in 0..n_sync {
                let b = view_pb::batch_to_pb(&batch(1, u64::from(i)), &[]);
                let t = Instant::now();
                client.view_sync(b).await?;
                one.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            // The fast channel (`--view-listen`) and a 64-byte TCP echo
            // served by the same runtime thread as the control plane,
            // interleaved one for one: both see the same polling mode
            // (this VM's wake-ups make a round trip either ~5 µs or ~60 µs
            // depending on whether the threads are already awake).
            let view_addr = client.status().await?.view_addr;
            let mut ch = sluice_control::view_wire::ViewChannel::connect(&view_addr, None).await?;
            let mut echo = tcp_echo(&echo_rt).await?;
            let mut tcp = Vec::new();
            let mut fast1 = Vec::new();
            let mut fast512 = Vec::new();
            for i in 0..n_sync {
                tcp.push(echo.round_trip().await?);
                let b = view_pb::batch_to_pb(&batch(1, u64::from(i)), &[]);
                let t = Instant::now();
                ch.view_sync(&b).await?;
                fast1.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            for i in 0..n_sync {
                let b = view_pb::batch_to_pb(&batch(512, u64::from(i) * 1000), &[]);
                let t = Instant::now();
                ch.view_sync(&b).await?;
                fast512.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            #[allow(clippy::cast_precision_loss)]
            anyhow::Ok((
                one,
                full,
                cpu as f64 / f64::from(n_sync),
                tcp,
                fast1,
                fast512,
            ))
        })?;
        let (f1_p50, f1_p99) = p50_p99(fast1);
        let (f512_p50, _) = p50_p99(fast512);
        let (s1_p50, s1_p99) = p50_p99(sync1);
        let (s512_p50, _) = p50_p99(sync512);
        let (tcp_p50, _) = p50_p99(tcp);
        // Agent CPU per 100k IOPS: 100k records plus 100k/512 batches.
        let core_share = (record_ns * 1e5 + sync_cpu_ns * 1e5 / 512.0) / 1e9;
        eprintln!(
            "repeat {rep}: query {agent_ns:.1} ns (locked {locked_ns:.1} ns), record {record_ns:.0} ns, sync(1) p50 {s1_p50} p99 {s1_p99} us, sync(512) p50 {s512_p50} us, cpu/sync {sync_cpu_ns:.0} ns, tcp p50 {tcp_p50} us"
        );
        rows.push([
            agent_ns,
            locked_ns,
            record_ns,
            s1_p50,
            s1_p99,
            s512_p50,
            tcp_p50,
            core_share * 100.0,
            f1_p50,
            f1_p99,
            f512_p50,
        ]);
    }
    drop(control);
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
    let cell = |i: usize, prec: usize| {
        let xs: Vec<f64> = rows.iter().map(|r| r[i]).collect();
        let (lo, hi) = report::range(&xs);
        format!("{:.p$} ({lo:.p$}-{hi:.p$})", report::median(&xs), p = prec)
    };
    let ratio: Vec<f64> = rows.iter().map(|r| r[3] / r[6]).collect();
    let (rlo, rhi) = report::range(&ratio);
    let fast_ratio: Vec<f64> = rows.iter().map(|r| r[8] / r[6]).collect();
    let (flo, fhi) = report::range(&fast_ratio);
    let mut md = String::new();
    md.push_str("# The shadow view's cost on a client (Flint Table 1)\n\n");
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- view --repeats {repeats}`; load average before: {}. Medians over {repeats} repeats, ranges in brackets. The control plane runs in this process on its own runtime thread (gRPC over loopback, and the fast channel of `--view-listen`: the same protobuf messages over a plain TCP stream).\n\n",
        crate::datapath::loadavg()
    ));
    md.push_str("| primitive | figure | goal |\n|---|---|---|\n");
    md.push_str(&format!(
        "| view_query, local copy (`ViewAgent::query`) | {} ns | < 1 µs |\n",
        cell(0, 1)
    ));
    md.push_str(&format!(
        "| view_query through the client's lock, copied out (`ClientIsolation::query`) | {} ns | < 1 µs |\n",
        cell(1, 1)
    ));
    md.push_str(&format!(
        "| view_sync, 1 sample: p50 µs | {} | |\n| view_sync, 1 sample: p99 µs | {} | |\n",
        cell(3, 0),
        cell(4, 0)
    ));
    md.push_str(&format!(
        "| view_sync, 512 samples (the agent's batch): p50 µs | {} | |\n",
        cell(5, 0)
    ));
    md.push_str(&format!(
        "| TCP round trip, 64 bytes, echoed by the control plane's runtime thread, interleaved with the fast channel's syncs: p50 µs | {} | |\n",
        cell(6, 0)
    ));
    md.push_str(&format!(
        "| view_sync (gRPC) p50 ÷ TCP round trip | {:.2} ({rlo:.2}-{rhi:.2}) | |\n",
        report::median(&ratio)
    ));
    md.push_str(&format!(
        "| view_sync over the fast channel (`--view-listen`), 1 sample: p50 µs | {} | |\n| view_sync over the fast channel, 1 sample: p99 µs | {} | |\n| view_sync over the fast channel, 512 samples: p50 µs | {} | |\n",
        cell(8, 0),
        cell(9, 0),
        cell(10, 0)
    ));
    md.push_str(&format!(
        "| view_sync (fast channel) p50 ÷ TCP round trip | {:.2} ({flo:.2}-{fhi:.2}) | ≤ 1.5 |\n",
        report::median(&fast_ratio)
    ));
    md.push_str(&format!(
        "| agent per I/O (`record`, batching included) | {} ns | |\n| agent CPU per 100k IOPS (records + syncs of 512) | {} % of a core | < 2 % |\n",
        cell(2, 0),
        cell(7, 2)
    ));
    report::write(out, "view-table1.md", &md)?;
    Ok(())
}

/// A 64-byte TCP echo served on `rt` (the control plane's runtime), and
/// the client's end.
struct Echo {
    c: tokio::net::TcpStream,
    buf: [u8; 64],
}

async fn tcp_echo(rt: &tokio::runtime::Handle) -> Result<Echo> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    l.set_nonblocking(true)?;
    let addr = l.local_addr()?;
    rt.spawn(async move {
        let l = tokio::net::TcpListener::from_std(l)?;
        let (mut s, _) = l.accept().await?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        while s.read_exact(&mut buf).await.is_ok() {
            s.write_all(&buf).await?;
        }
        anyhow::Ok(())
    });
    let c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    Ok(Echo { c, buf: [7u8; 64] })
}

impl Echo {
    /// One round trip, in µs.
    async fn round_trip(&mut self) -> Result<u32> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let t = Instant::now();
        self.c.write_all(&self.buf).await?;
        self.c.read_exact(&mut self.buf).await?;
        Ok(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX))
    }
}

/// One stream of a workload: block size, queue depth, share of reads.
#[derive(Debug, Clone, Copy)]
struct StreamSpec {
    bs: usize,
    qd: u64,
    read_share: f64,
}

impl StreamSpec {
    const fn new(bs: usize, qd: u64, read_share: f64) -> StreamSpec {
        StreamSpec { bs, qd, read_share }
    }

    fn label(&self) -> String {
        let kind = match self.read_share {
            r if r >= 1.0 => "read".to_owned(),
            r if r <= 0.0 => "write".to_owned(),
            r => format!("{:.0}/{:.0} r/w", r * 100.0, (1.0 - r) * 100.0),
        };
        format!("{}x{}K {kind}", self.qd, self.bs / 1024)
    }
}

/// Flint §5.3's five pairs: the first stream on the small volume, the
/// second on the large one.
const WORKLOADS: [(&str, StreamSpec, StreamSpec); 5] = [
    (
        "W1",
        StreamSpec::new(4096, 16, 1.0),
        StreamSpec::new(128 << 10, 8, 1.0),
    ),
    (
        "W2",
        StreamSpec::new(4096, 8, 1.0),
        StreamSpec::new(4096, 8, 0.0),
    ),
    (
        "W3",
        StreamSpec::new(4096, 8, 0.0),
        StreamSpec::new(128 << 10, 8, 1.0),
    ),
    (
        "W4",
        StreamSpec::new(128 << 10, 8, 1.0),
        StreamSpec::new(128 << 10, 8, 0.0),
    ),
    (
        "W5",
        StreamSpec::new(4096, 8, 0.7),
        StreamSpec::new(4096, 8, 0.3),
    ),
];

/// `spec`'s I/O on `v` over its first `span` bytes until `stop`; bytes moved.
async fn stream(
    v: Arc<Volume>,
    spec: StreamSpec,
    span: u64,
    seed: u64,
    stop: Instant,
) -> Result<u64> {
    let blocks = span / spec.bs as u64;
    let per = (spec.bs / 4096) as u64;
    let tasks: Vec<_> = (0..spec.qd)
        .map(|w| {
            let v = v.clone();
            tokio::spawn(async move {
                let data = vec![0xa5u8; spec.bs];
                let mut x = 0x9e37_79b9_7f4a_7c15 ^ (seed << 8) ^ (w + 1);
                let mut bytes = 0u64;
                while Instant::now() < stop {
                    let lba = (next(&mut x) % blocks) * per;
                    #[allow(clippy::cast_precision_loss)]
                    let coin = (next(&mut x) % 1000) as f64 / 1000.0;
                    if coin < spec.read_share {
                        v.read(lba, spec.bs, IoFlags::default()).await?;
                    } else {
                        v.write(lba, &data, IoFlags::default()).await?;
                    }
                    bytes += spec.bs as u64;
                }
                anyhow::Ok(bytes)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total)
}

/// The drives of the auction's experiment: slower than the default model,
/// so that two streams saturate them before this 2-core machine's CPU does.
fn fair_ssd() -> SsdConfig {
    SsdConfig::default()
        .with_read_bytes_per_sec_max(400_000_000)
        .with_write_bytes_per_sec_max(200_000_000)
        .with_read_iops_max(40_000)
        .with_write_iops_max(20_000)
        .with_parallelism(4)
}

/// `auction` (Flint Fig. 9a): W1-W5, each a stream on a 64 MiB volume
/// against a stream on a 512 MiB volume, over the same two drives, from
/// two clients; the bandwidth auction off, then on, in each repeat.
pub fn run_auction(out: &Path, runtime: f64, repeats: u32) -> Result<()> {
    const SMALL: u64 = 64 * MIB;
    const LARGE: u64 = 512 * MIB;
    let dir = std::env::temp_dir().join(format!("sluice-lab-auction-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let target = drive_target(2, 512 * MIB, Some(fair_ssd()))?;
    let control = Control::start(Metadata::Redb(dir.join("m.redb")))?;
    control.add_drives(&[&target], 2)?;
    control.create("small", SMALL, 1)?;
    control.create("large", LARGE, 1)?;
    let client = control.client()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // (workload, repeat, on) -> (small MB/s, large MB/s)
    let mut results: Vec<Vec<[(f64, f64); 2]>> = vec![Vec::new(); WORKLOADS.len()];
    rt.block_on(async {
        let opts = ConnectOptions {
            hostnqn: "nqn.2026-11.io.sluice:lab-auction".into(),
            queue_depth: 128,
            ..ConnectOptions::default()
        };
        // Every extent written first: streams never wait on allocation,
        // and reads reach the drives.
        {
            let pool = DrivePool::new(opts.clone());
            let chunk = vec![0x5au8; 1 << 20];
            for (name, size) in [("small", SMALL), ("large", LARGE)] {
                let v = Volume::open(client.clone(), pool.clone(), name).await?;
                for i in 0..size / MIB {
                    v.write(i * MIB / 4096, &chunk, IoFlags::default())
                        .await
                        .context("filling the volumes")?;
                }
            }
        }
        let pool = |name: &str| -> Result<Arc<DrivePool>> {
            let iso = ClientIsolation::new(name, EioConfig::default()).map_err(anyhow::Error::msg)?;
            Ok(DrivePool::with_isolation(opts.clone(), iso))
        };
        let small = Arc::new(Volume::open(client.clone(), pool("lab-small")?, "small").await?);
        let large = Arc::new(Volume::open(client.clone(), pool("lab-large")?, "large").await?);
        let settle = Duration::from_secs(1);
        if std::env::var_os("SLUICE_LAB_DEBUG").is_some() {
            let c = client.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if let Ok(a) = c.auction_status().await {
                        eprint!("{}", sluice_control::view::render_auction_brief(&a));
                    }
                }
            });
        }
        for rep in 0..repeats {
            for (w, (name, a, b)) in WORKLOADS.iter().enumerate() {
                let mut row = [(0.0, 0.0); 2];
                for (k, on) in [false, true].into_iter().enumerate() {
                    client.set_auction(on).await?;
                    // Unmeasured: the estimate and the wallets settle.
                    let stop = Instant::now() + settle;
                    let _ = tokio::join!(
                        stream(small.clone(), *a, SMALL, 1, stop),
                        stream(large.clone(), *b, LARGE, 2, stop)
                    );
                    let t = Instant::now();
                    let stop = t + Duration::from_secs_f64(runtime);
                    let (sa, sb) = tokio::join!(
                        stream(small.clone(), *a, SMALL, 3 + rep as u64, stop),
                        stream(large.clone(), *b, LARGE, 4 + rep as u64, stop)
                    );
                    let secs = t.elapsed().as_secs_f64();
                    #[allow(clippy::cast_precision_loss)]
                    let r = (sa? as f64 / secs / 1e6, sb? as f64 / secs / 1e6);
                    eprintln!(
                        "repeat {rep} {name} auction {}: small {:.1} MB/s, large {:.1} MB/s, Jain {:.3}",
                        if on { "on" } else { "off" },
                        r.0,
                        r.1,
                        report::jain(&[r.0, r.1])
                    );
                    row[k] = r;
                }
                results[w].push(row);
            }
        }
        client.set_auction(false).await?;
        anyhow::Ok(())
    })?;
    drop(rt);
    drop(control);
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);

    let stat = |xs: Vec<f64>, prec: usize| {
        let (lo, hi) = report::range(&xs);
        format!("{:.p$} ({lo:.p$}-{hi:.p$})", report::median(&xs), p = prec)
    };
    let mut md = String::new();
    md.push_str(
        "# Bandwidth auction: volumes of different sizes on shared drives (Flint Fig. 9a)\n\n",
    );
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- auction --runtime {runtime} --repeats {repeats}`; load average before: {}.\n\n",
        crate::datapath::loadavg()
    ));
    md.push_str(&format!(
        "Two emulated SSDs (400 MB/s and 40k IOPS reading, 200 MB/s and 20k IOPS writing, 4 channels) behind one in-process Sluice target; a 64 MiB volume and a 512 MiB volume spread over both, each written whole first, each opened by its own client (its own NetPipe, view agent and wallet). Each workload runs its two streams together for {runtime} s with the auction off, then on (after 1 s unmeasured to settle), in every one of {repeats} repeats. Jain's index is over the two streams' bandwidth (1 = equal); medians over the repeats, ranges in brackets.\n\n"
    ));
    md.push_str("| workload | small volume's stream | large volume's stream | off: MB/s small / large | off: Jain | on: MB/s small / large | on: Jain |\n|---|---|---|---|---|---|---|\n");
    let mut jain_off = Vec::new();
    let mut jain_on = Vec::new();
    for (w, (name, a, b)) in WORKLOADS.iter().enumerate() {
        let rows = &results[w];
        let col = |k: usize, f: fn(&(f64, f64)) -> f64| {
            rows.iter().map(|r| f(&r[k])).collect::<Vec<f64>>()
        };
        let jain = |k: usize| {
            rows.iter()
                .map(|r| report::jain(&[r[k].0, r[k].1]))
                .collect::<Vec<f64>>()
        };
        jain_off.push(report::median(&jain(0)));
        jain_on.push(report::median(&jain(1)));
        md.push_str(&format!(
            "| {name} | {} | {} | {} / {} | {} | {} / {} | {} |\n",
            a.label(),
            b.label(),
            stat(col(0, |r| r.0), 0),
            stat(col(0, |r| r.1), 0),
            stat(jain(0), 3),
            stat(col(1, |r| r.0), 0),
            stat(col(1, |r| r.1), 0),
            stat(jain(1), 3),
        ));
    }
    md.push_str("\nGoal: Jain ≥ 0.95 in every workload with the auction on.\n");
    let xs: Vec<String> = WORKLOADS.iter().map(|(n, _, _)| (*n).to_owned()).collect();
    let svg = crate::plot::bars(
        "Fairness between a small and a large volume",
        "workload",
        "Jain's index (bandwidth)",
        &xs,
        &[
            ("auction off".into(), jain_off),
            ("auction on".into(), jain_on),
        ],
        Some(0.95),
    )?;
    report::write(out, "auction-fig9a.svg", &svg)?;
    md.push_str("\n![Jain's index per workload](auction-fig9a.svg)\n");
    report::write(out, "auction-fig9a.md", &md)?;
    Ok(())
}

/// One measured stream of `congestion`: its I/O latencies in µs, sorted.
fn mean_p99(mut lat: Vec<u32>) -> (f64, f64) {
    lat.sort_unstable();
    #[allow(clippy::cast_precision_loss)]
    let mean = lat.iter().map(|&l| f64::from(l)).sum::<f64>() / lat.len().max(1) as f64;
    (mean, quantile(&lat, 0.99))
}

/// `qd` tasks of 32 KiB I/O (`read_share` of them reads) over the first
/// `span` bytes of `v` until `stop`: every I/O's latency.
async fn timed_stream(
    v: Arc<Volume>,
    qd: u64,
    read_share: f64,
    span: u64,
    stop: Instant,
) -> Result<Vec<u32>> {
    const BS: usize = 32 << 10;
    let blocks = span / BS as u64;
    let tasks: Vec<_> = (0..qd)
        .map(|w| {
            let v = v.clone();
            tokio::spawn(async move {
                let data = vec![0x3cu8; BS];
                let mut x = 0x2545_f491_4f6c_dd1d ^ (w + 7);
                let mut lat = Vec::new();
                while Instant::now() < stop {
                    let lba = (next(&mut x) % blocks) * (BS as u64 / 4096);
                    #[allow(clippy::cast_precision_loss)]
                    let coin = (next(&mut x) % 1000) as f64 / 1000.0;
                    let t = Instant::now();
                    if coin < read_share {
                        v.read(lba, BS, IoFlags::default()).await?;
                    } else {
                        v.write(lba, &data, IoFlags::default()).await?;
                    }
                    lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                anyhow::Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// A point of `congestion`: (noise, mode, stream, queue depth) indices.
type Cell = (usize, usize, usize, usize);

/// The drives of `congestion`: 200 MB/s each way, two channels.
fn congestible_ssd() -> SsdConfig {
    SsdConfig::default()
        .with_read_bytes_per_sec_max(200_000_000)
        .with_write_bytes_per_sec_max(200_000_000)
        .with_parallelism(2)
}

/// How the victim avoids the congested drive in [`run_congestion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Avoid {
    /// Its extents are placed while the drive is congested; placement
    /// weighs the view's busy degree (on) or not (off).
    Placement,
    /// Its extents are placed before the drive congests; the control plane
    /// remaps them off it (on) or not (off).
    Remap,
}

/// Seconds between the noise's start and the victim's streams in the
/// remap experiment (congested for 1 s, then the moves).
const REMAP_SETTLE_SECS: u64 = 6;

/// `congestion` (Flint Figs. 9b/c): a victim volume's 32 KiB read, write
/// and mixed streams while another tenant's volume hammers one of the five
/// drives with 128 KiB reads (9b) or writes (9c); the victim's extents
/// placed and its reads served with the shadow view's help (on) and
/// without (off: placement ignores the busy degree). `remap`: the victim
/// is placed before the noise starts, and its extents on the hot drive
/// are remapped (on) or stay (off).
pub fn run_congestion(out: &Path, runtime: f64, repeats: u32, avoid: Avoid) -> Result<()> {
    use sluice_control::server::ControlConfig;
    const NOISY: u64 = 128 * MIB;
    const VICTIM: u64 = 128 * MIB;
    const NOISE_QD: u64 = 16;
    let dir = std::env::temp_dir().join(format!("sluice-lab-congestion-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // The hot drive alone on one target (so that the noisy volume can
    // prefer it by address), four more on another. Drives slow enough that
    // the noise saturates the hot one, not this machine's two cores.
    let model = congestible_ssd();
    let hot = drive_target(1, 512 * MIB, Some(model))?;
    let cold = drive_target(4, 512 * MIB, Some(model))?;
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.to_string()
    };
    let start = |on: bool| -> Result<Control> {
        let mut cfg = ControlConfig::new(Metadata::Redb(dir.join("m.redb")));
        match avoid {
            Avoid::Placement if !on => cfg.weights.gamma_busy = 0.0,
            Avoid::Placement => {}
            Avoid::Remap => {
                // Only remapping differs: placement ignores the busy
                // degree in both modes (the noise of the previous mode
                // would otherwise steer the victim's placement).
                cfg.weights.gamma_busy = 0.0;
                cfg.remap.enabled = on;
                cfg.remap.congested_for = Duration::from_secs(1);
                cfg.remap.extents_per_scan = 32;
            }
        }
        Control::start_at(cfg, &listen)
    };
    let hot_addr = hot.local_addr().to_string();
    {
        let c = start(true)?;
        c.add_drives(&[&hot], 1)?;
        c.add_drives(&[&cold], 4)?;
        c.create_preferring("noisy", NOISY, 1, vec![hot_addr.clone()])?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let opts = ConnectOptions {
        hostnqn: "nqn.2026-11.io.sluice:lab-congestion".into(),
        queue_depth: 128,
        ..ConnectOptions::default()
    };
    let streams: [(&str, f64); 3] = [("read", 1.0), ("write", 0.0), ("mixed 70% read", 0.7)];
    let qds: [u64; 3] = [1, 4, 8];
    // (noise, mode, stream, qd) -> per repeat (mean, p99, share of the
    // victim's extents on the hot drive)
    let mut cells: std::collections::BTreeMap<Cell, Vec<(f64, f64)>> =
        std::collections::BTreeMap::new();
    let mut on_hot: std::collections::BTreeMap<(usize, usize), Vec<f64>> =
        std::collections::BTreeMap::new();
    for rep in 0..repeats {
        for (n, noise_read) in [true, false].into_iter().enumerate() {
            for (m, busy) in [false, true].into_iter().enumerate() {
                let control = start(busy)?;
                let client = control.client()?;
                let victim_name = format!("victim-{rep}-{n}-{m}");
                control.create(&victim_name, VICTIM, 1)?;
                let (rows, hot_share) = rt.block_on(async {
                    let noisy_pool = DrivePool::with_isolation(
                        opts.clone(),
                        ClientIsolation::new("lab-noisy", EioConfig::default())
                            .map_err(anyhow::Error::msg)?,
                    );
                    let noisy = Arc::new(Volume::open(client.clone(), noisy_pool, "noisy").await?);
                    if rep == 0 && n == 0 && m == 0 {
                        let chunk = vec![0x11u8; 1 << 20];
                        for i in 0..NOISY / MIB {
                            noisy
                                .write(i * MIB / 4096, &chunk, IoFlags::default())
                                .await?;
                        }
                    }
                    let pool = DrivePool::with_isolation(
                        opts.clone(),
                        ClientIsolation::new("lab-victim", EioConfig::default())
                            .map_err(anyhow::Error::msg)?,
                    );
                    let victim = Arc::new(Volume::open(client.clone(), pool, &victim_name).await?);
                    // Every extent allocated (placed) by one 4 KiB write
                    // each: little load of the victim's own for the view
                    // to see. Remap: before the noise, on calm drives.
                    let allocate = || async {
                        let block = vec![0x33u8; 4096];
                        for e in 0..VICTIM / sluice_volume::EXTENT_BYTES {
                            victim
                                .write(
                                    e * sluice_volume::EXTENT_BYTES / 4096,
                                    &block,
                                    IoFlags::default(),
                                )
                                .await?;
                        }
                        anyhow::Ok(())
                    };
                    if avoid == Avoid::Remap {
                        allocate().await?;
                    }
                    // The noise runs through the whole mode.
                    let stop_noise = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let noise: Vec<_> = (0..NOISE_QD)
                        .map(|w| {
                            let (v, stop) = (noisy.clone(), stop_noise.clone());
                            tokio::spawn(async move {
                                let data = vec![0x22u8; 128 << 10];
                                let mut x = 0x51ed_270b_1f3c_0a4d ^ (w + 1);
                                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                                    let lba = (next(&mut x) % (NOISY / (128 << 10))) * 32;
                                    if noise_read {
                                        v.read(lba, 128 << 10, IoFlags::default()).await?;
                                    } else {
                                        v.write(lba, &data, IoFlags::default()).await?;
                                    }
                                }
                                anyhow::Ok(())
                            })
                        })
                        .collect();
                    match avoid {
                        // Long enough for the view to call the drive
                        // congested; then placed under the congestion.
                        Avoid::Placement => {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            allocate().await?;
                        }
                        // Congested for a second, then the moves (or not).
                        Avoid::Remap => {
                            tokio::time::sleep(Duration::from_secs(REMAP_SETTLE_SECS)).await;
                        }
                    }
                    let layout = client.open_volume(&victim_name).await?;
                    let hot_id = client
                        .list_drives()
                        .await?
                        .iter()
                        .find(|d| d.addr == hot_addr)
                        .map(|d| d.id)
                        .context("the hot drive is in the pool")?;
                    #[allow(clippy::cast_precision_loss)]
                    let hot_share = layout
                        .extents
                        .iter()
                        .filter(|e| e.chain.iter().any(|r| r.drive == hot_id))
                        .count() as f64
                        / layout.extents.len().max(1) as f64;
                    let mut rows = Vec::new();
                    for (_, read_share) in streams {
                        for qd in qds {
                            let stop = Instant::now() + Duration::from_secs_f64(runtime);
                            let lat =
                                timed_stream(victim.clone(), qd, read_share, VICTIM, stop).await?;
                            rows.push(mean_p99(lat));
                        }
                    }
                    stop_noise.store(true, std::sync::atomic::Ordering::Relaxed);
                    for t in noise {
                        t.await??;
                    }
                    anyhow::Ok((rows, hot_share))
                })?;
                eprintln!(
                    "repeat {rep} noise {} {avoid:?} {}: {:.0} % of the victim's extents on the hot drive; {rows:?}",
                    if noise_read { "reads" } else { "writes" },
                    if busy { "on" } else { "off" },
                    hot_share * 100.0
                );
                on_hot.entry((n, m)).or_default().push(hot_share);
                let mut k = 0;
                for s in 0..streams.len() {
                    for q in 0..qds.len() {
                        cells.entry((n, m, s, q)).or_default().push(rows[k]);
                        k += 1;
                    }
                }
                rt.block_on(client.delete_volume(&victim_name))?;
                drop(control);
            }
        }
    }
    drop(rt);
    drop(hot);
    drop(cold);
    let _ = std::fs::remove_dir_all(&dir);

    let mut md = String::new();
    let (title, command, file) = match avoid {
        Avoid::Placement => (
            "Avoiding a congested drive (Flint Figs. 9b and 9c)",
            "congestion",
            "congestion-fig9bc.md",
        ),
        Avoid::Remap => (
            "Remapping extents off a congested drive (Flint §5.5, the setting of Figs. 9b and 9c)",
            "remap",
            "congestion-remap.md",
        ),
    };
    md.push_str(&format!("# {title}\n\n"));
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- {command} --runtime {runtime} --repeats {repeats}`; load average before: {}.\n\n",
        crate::datapath::loadavg()
    ));
    if avoid == Avoid::Remap {
        md.push_str(&format!(
            "Five emulated SSDs (200 MB/s reading and writing, 2 channels, 80 µs reads and 20 µs writes unloaded), one alone on its own in-process target (the hot drive), four on another. A 128 MiB victim volume (1 replica) is created and each of its extents allocated by a 4 KiB write while every drive is calm, so placement spreads it over all five. Then another tenant's 128 MiB volume, which prefers the hot drive, keeps {NOISE_QD} random 128 KiB reads (9b) or writes (9c) in flight on it. {REMAP_SETTLE_SECS} s later the victim's 32 KiB random read, write and mixed (70 % read) streams run {runtime} s each at queue depths {qds:?}. Placement ignores the busy degree in both modes (γ = 0), so that only remapping differs. *Off*: `sluice control` without `--remap`; *on*: with it (a drive congested for 1 s, up to 32 extents a scan at the default 32 MiB/s rebuild rate; the noisy volume prefers the hot drive, so its extents stay). Medians over {repeats} repeats, ranges in brackets; the gain is off ÷ on per repeat.\n\n"
        ));
    } else {
        md.push_str(&format!(
        "Five emulated SSDs (200 MB/s reading and writing, 2 channels, 80 µs reads and 20 µs writes unloaded), one alone on its own in-process target (the hot drive), four on another. Another tenant's 128 MiB volume lives on the hot drive and keeps {NOISE_QD} random 128 KiB reads (9b) or writes (9c) in flight on it. Two seconds into the noise a 128 MiB victim volume (1 replica) is created and each of its extents allocated by a 4 KiB write, so they are placed while the drive is congested, then its 32 KiB random read, write and mixed (70 % read) streams run {runtime} s each at queue depths {qds:?}. *Off*: placement ignores the shadow view's busy degree (γ = 0); *on*: the default weights (γ = 2). Medians over {repeats} repeats, ranges in brackets; the gain is off ÷ on per repeat.\n\n"
        ));
    }
    let stat = |xs: &[f64]| {
        let (lo, hi) = report::range(xs);
        format!("{:.0} ({lo:.0}-{hi:.0})", report::median(xs))
    };
    for (n, (fig, noise)) in [("9b", "reads"), ("9c", "writes")].into_iter().enumerate() {
        md.push_str(&format!(
            "## Fig. {fig}: the hot drive congested with 128 KiB {noise}\n\nThe victim's extents on the hot drive: off {:.0} %, on {:.0} % (medians).\n\n",
            report::median(&on_hot.get(&(n, 0)).cloned().unwrap_or_default()) * 100.0,
            report::median(&on_hot.get(&(n, 1)).cloned().unwrap_or_default()) * 100.0,
        ));
        md.push_str("| stream | QD | off: mean µs | on: mean µs | mean gain | off: P99 µs | on: P99 µs | P99 gain |\n|---|---|---|---|---|---|---|---|\n");
        for (s, (name, _)) in streams.iter().enumerate() {
            for (q, qd) in qds.iter().enumerate() {
                let off = cells.get(&(n, 0, s, q)).cloned().unwrap_or_default();
                let on = cells.get(&(n, 1, s, q)).cloned().unwrap_or_default();
                let col = |v: &[(f64, f64)], p: bool| -> Vec<f64> {
                    v.iter().map(|(m, p99)| if p { *p99 } else { *m }).collect()
                };
                let gain = |p: bool| {
                    let g: Vec<f64> = off
                        .iter()
                        .zip(&on)
                        .map(|(a, b)| {
                            let (a, b) = if p { (a.1, b.1) } else { (a.0, b.0) };
                            1.0 - b / a
                        })
                        .collect();
                    let (lo, hi) = report::range(&g);
                    format!(
                        "{:.0} % lower ({:.0}-{:.0})",
                        report::median(&g) * 100.0,
                        lo * 100.0,
                        hi * 100.0
                    )
                };
                md.push_str(&format!(
                    "| {name} | {qd} | {} | {} | {} | {} | {} | {} |\n",
                    stat(&col(&off, false)),
                    stat(&col(&on, false)),
                    gain(false),
                    stat(&col(&off, true)),
                    stat(&col(&on, true)),
                    gain(true),
                ));
            }
        }
        md.push('\n');
    }
    md.push_str(
        "Goal: at least 40 % lower mean latency and 30 % lower P99 with the view's help.\n",
    );
    report::write(out, file, &md)?;
    Ok(())
}
