//! Flint's isolation across volumes (docs/isolation-volumes.md).
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
use crate::volumes::{drive_target, Control};

const MIB: u64 = 1 << 20;
/// Bytes of each volume written before the runs (reads of unallocated
/// extents never reach a drive).
const FILLED_BYTES: u64 = 64 * MIB;
const VICTIM_QD: u64 = 4;
const STREAM_QD: u64 = 32;
const STREAM_BYTES: usize = 128 << 10;

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Run {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    victim_iops: f64,
    stream_mb_s: f64,
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
    let mut tasks = Vec::new();
    for w in 0..VICTIM_QD {
        let v = victim.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::with_capacity(1 << 16);
            let mut x = 0x9e37_79b9_7f4a_7c15 ^ (w + 1);
            while Instant::now() < stop {
                let lba = next(&mut x) % blocks;
                let t = Instant::now();
                v.read(lba, 4096, IoFlags::default()).await?;
                lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
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
    lat.sort_unstable();
    #[allow(clippy::cast_precision_loss)]
    Ok(Run {
        p50_us: quantile(&lat, 0.5),
        p99_us: quantile(&lat, 0.99),
        p999_us: quantile(&lat, 0.999),
        victim_iops: lat.len() as f64 / secs,
        stream_mb_s: bytes as f64 / secs / 1e6,
    })
}

/// The drive: a modest NVMe SSD (1 GB/s reads, 8 channels, 80 µs).
fn ssd() -> SsdConfig {
    SsdConfig::default()
}

pub fn run_eio(out: &Path, runtime: f64, repeats: u32) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("sluice-lab-eio-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let target = drive_target(1, 256 * MIB, Some(ssd()))?;
    let control = Control::start(Metadata::Redb(dir.join("m.redb")))?;
    control.add_drives(&[&target], 1)?;
    control.create("victim", 128 * MIB, 1)?;
    control.create("stream", 128 * MIB, 1)?;
    let client = control.client()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The configurations: off, then on with three in-flight caps per drive.
    let caps_kib: [u64; 3] = [1024, 512, 256];
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
        for cap in caps_kib {
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
    let cell = |(m, lo, hi): (f64, f64, f64)| format!("{m:.0} ({lo:.0}-{hi:.0})");
    let mut md = String::new();
    md.push_str(
        "# eIO scheduler: a latency-sensitive volume beside a 128 KiB streamer (Flint Fig. 10)\n\n",
    );
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- eio --runtime {runtime} --repeats {repeats}`; load average before: {}.\n\n",
        crate::datapath::loadavg()
    ));
    md.push_str(&format!(
        "One emulated SSD (1 GB/s reads, 100k IOPS, 8 channels, 80 µs) on one in-process Sluice target; two volumes on it opened by one client. The victim reads 4 KiB at random at QD {VICTIM_QD}; the streamer reads 128 KiB at random at QD {STREAM_QD}. Each repeat runs both for {runtime} s with the eIO scheduler off, then on with three caps on the bytes in flight per drive (`EioConfig::drive_inflight_bytes_max`; 512 KiB is the default). Medians over {repeats} repeats, ranges in brackets.\n\n"
    ));
    md.push_str("| eIO | victim P50 µs | victim P99 µs | victim P999 µs | victim IOPS | streamer MB/s |\n|---|---|---|---|---|---|\n");
    let fields: [fn(&Run) -> f64; 5] = [
        |r| r.p50_us,
        |r| r.p99_us,
        |r| r.p999_us,
        |r| r.victim_iops,
        |r| r.stream_mb_s,
    ];
    for k in 0..=caps_kib.len() {
        let name = if k == 0 {
            "off".to_owned()
        } else {
            format!("on, {} KiB in flight", caps_kib[k - 1])
        };
        let cells: Vec<String> = fields.iter().map(|f| cell(col(k, *f))).collect();
        md.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    md.push_str("\nVictim latency, off ÷ on (per repeat, median and range); Flint reports 4.8x / 2.6x / 7.5x:\n\n| eIO | P50 | P99 | P999 |\n|---|---|---|---|\n");
    for k in 1..=caps_kib.len() {
        let gain = |f: fn(&Run) -> f64| {
            let xs: Vec<f64> = runs.iter().map(|row| f(&row[0]) / f(&row[k])).collect();
            let (lo, hi) = report::range(&xs);
            format!("{:.1}x ({lo:.1}-{hi:.1})", report::median(&xs))
        };
        md.push_str(&format!(
            "| on, {} KiB in flight | {} | {} | {} |\n",
            caps_kib[k - 1],
            gain(fields[0]),
            gain(fields[1]),
            gain(fields[2])
        ));
    }
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
    let control = Control::start(Metadata::Redb(dir.join("m.redb")))?;
    control.add_drives(&[&target], 1)?;
    let client = control.client()?;
    let n_query: u32 = 1_000_000;
    let n_sync: u32 = 2000;
    let mut rows: Vec<[f64; 8]> = Vec::new();
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
            iso.record(0, i % 3 == 0, 4096, Duration::from_micros(100));
            if i % 512 == 511 {
                std::hint::black_box(iso.poll_batch());
            }
        }
        let record_ns = t.elapsed().as_nanos() as f64 / f64::from(n_query);

        // 2. view_sync round trips, one after another, and their CPU on
        // this (the client's) thread; 3. a TCP ping-pong on the same kind
        // of runtime (epoll, no busy polling) as the yardstick.
        let (sync1, sync512, sync_cpu_ns, tcp) = rt.block_on(async {
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
            let tcp = tcp_ping_pong(n_sync).await?;
            #[allow(clippy::cast_precision_loss)]
            anyhow::Ok((one, full, cpu as f64 / f64::from(n_sync), tcp))
        })?;
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
    let mut md = String::new();
    md.push_str("# The shadow view's cost on a client (Flint Table 1)\n\n");
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- view --repeats {repeats}`; load average before: {}. Medians over {repeats} repeats, ranges in brackets. The control plane runs in this process on its own runtime thread (gRPC over loopback).\n\n",
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
        "| TCP ping-pong, 64 bytes, same runtime (epoll): p50 µs | {} | |\n",
        cell(6, 0)
    ));
    md.push_str(&format!(
        "| view_sync p50 ÷ TCP round trip | {:.2} ({rlo:.2}-{rhi:.2}) | ≤ 1.5 |\n",
        report::median(&ratio)
    ));
    md.push_str(&format!(
        "| agent per I/O (`record`, batching included) | {} ns | |\n| agent CPU per 100k IOPS (records + syncs of 512) | {} % of a core | < 2 % |\n",
        cell(2, 0),
        cell(7, 2)
    ));
    report::write(out, "view-table1.md", &md)?;
    Ok(())
}

/// `n` round trips of 64 bytes over loopback TCP on the current runtime.
async fn tcp_ping_pong(n: u32) -> Result<Vec<u32>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let server = std::thread::spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l.into_std()?)?;
            let (mut s, _) = l.accept().await?;
            s.set_nodelay(true)?;
            let mut buf = [0u8; 64];
            while s.read_exact(&mut buf).await.is_ok() {
                s.write_all(&buf).await?;
            }
            anyhow::Ok(())
        })
    });
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let mut buf = [7u8; 64];
    let mut lat = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        c.write_all(&buf).await?;
        c.read_exact(&mut buf).await?;
        lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
    }
    drop(c);
    let _ = server.join();
    Ok(lat)
}
