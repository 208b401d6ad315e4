//! Elastic volumes (docs/volumes.md): what the extent map and the control
//! plane cost, and how an eVol's bandwidth grows with its drives.
//!
//! 1. **Extent map on the fast path**: `VolumeMap::plan` for random 4 KiB
//!    requests on a fully allocated 100 GiB map, ns per request.
//! 2. **Metadata**: `AllocateExtent` through the gRPC API of an in-process
//!    control plane, one after another (each an extent fault), with redb
//!    and, when etcd is installed, with etcd: allocations per second, p50,
//!    p99, max.
//! 3. **Flint Fig. 7c**: a volume over N = 1, 2, 4, 8 emulated-SSD drives
//!    spread over up to 4 `sluice target` processes (one drive each, two
//!    each at N = 8; the CLI binary must be built: `cargo build --release
//!    --bin sluice`), driven by `sluice bench --volume` in this process: 4 KiB sequential
//!    writes (QD 16; they allocate the extents) then 128 KiB random reads
//!    (QD 4 per drive, so each drive sees the same load). The ratio is bandwidth ÷ (N × the N = 1 bandwidth).
//! 4. **Flint Fig. 8**: 4 KiB random writes at QD 1 on 1 and on 3 replicas
//!    (three drives on three targets): latency.
//!
//! And, as its own experiment (`volume-rebuild`, volumes-rebuild.md):
//! 5. **Rebuild under load**: a 2-replica volume over 6 emulated SSDs on 3
//!    targets; a drive is failed and its replicas are rebuilt at the
//!    default rate while a random read/write workload runs: foreground
//!    bandwidth during the rebuild over the same workload's just before.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_bench::{BenchArgs, BlockSizes, RwMode};
use sluice_config::{
    Config, NamespaceConfig, PollingPolicy, SsdConfig, SubsystemConfig, TargetSettings,
};
use sluice_control::server::{ControlConfig, Metadata};
use sluice_control::{pb, ControlClient};
use sluice_target::{Target, TargetHandle};
use sluice_volume::{
    ExtentRecord, Replica, VolumeId, VolumeMap, VolumeRecord, VolumeState, EXTENT_BYTES,
};

use crate::report;

pub(crate) const DRIVE_NQN: &str = "nqn.2026-11.io.sluice:lab-drives";
const MIB: u64 = 1 << 20;

/// A target whose subsystem holds `drives` namespaces.
pub(crate) fn drive_target(
    drives: u32,
    drive_bytes: u64,
    ssd: Option<SsdConfig>,
) -> Result<TargetHandle> {
    drive_target_polling(drives, drive_bytes, ssd, PollingPolicy::ADAPTIVE)
}

/// [`drive_target`] whose worker polls by `polling`.
pub(crate) fn drive_target_polling(
    drives: u32,
    drive_bytes: u64,
    ssd: Option<SsdConfig>,
    polling: PollingPolicy,
) -> Result<TargetHandle> {
    let c = drive_config("127.0.0.1:0".parse()?, drives, drive_bytes, ssd, polling)?;
    Ok(Target::start(&c)?)
}

/// The configuration of a drive target listening on `listen`: `drives`
/// emulated SSDs (RAM namespaces without `ssd`) of 4 KiB blocks.
fn drive_config(
    listen: std::net::SocketAddr,
    drives: u32,
    drive_bytes: u64,
    ssd: Option<SsdConfig>,
    polling: PollingPolicy,
) -> Result<Config> {
    let mut sub = SubsystemConfig::new(DRIVE_NQN).allow_any_host();
    for nsid in 1..=drives {
        let ns = match &ssd {
            Some(m) => NamespaceConfig::emulated_ssd(nsid, drive_bytes, *m),
            None => NamespaceConfig::ram(nsid, drive_bytes),
        };
        sub = sub.with_namespace(ns.with_block_size(4096));
    }
    let settings = TargetSettings::default()
        .with_listen(listen)
        .with_discovery_listen(None)
        .with_workers(1)
        .with_polling(polling);
    Ok(Config::default()
        .with_target(settings)
        .with_subsystem(sub)
        .validated()?)
}

/// A `sluice target` process (the CLI binary next to this one) serving
/// `drives` namespaces; killed when dropped.
struct TargetProcess {
    child: std::process::Child,
    addr: String,
}

impl TargetProcess {
    fn spawn(dir: &Path, drives: u32, drive_bytes: u64, ssd: SsdConfig) -> Result<TargetProcess> {
        let bin = std::env::current_exe()?
            .parent()
            .context("the lab binary has no directory")?
            .join("sluice");
        anyhow::ensure!(
            bin.exists(),
            "{} is missing: build it first (cargo build --release --bin sluice)",
            bin.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let cfg = drive_config(
            addr.parse()?,
            drives,
            drive_bytes,
            Some(ssd),
            PollingPolicy::ADAPTIVE,
        )?;
        let path = dir.join(format!("target-{port}.toml"));
        std::fs::write(&path, cfg.to_toml()?)?;
        let child = std::process::Command::new(&bin)
            .args(["target", "--config"])
            .arg(&path)
            .args(["--log", "warn"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let t = TargetProcess { child, addr };
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(&t.addr).is_err() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "sluice target at {} did not start",
                t.addr
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(t)
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A control plane on its own runtime thread; dropped with the runtime.
pub(crate) struct Control {
    pub(crate) rt: tokio::runtime::Runtime,
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Control {
    pub(crate) fn start(metadata: Metadata) -> Result<Control> {
        Control::start_with(ControlConfig::new(metadata))
    }

    pub(crate) fn start_with(cfg: ControlConfig) -> Result<Control> {
        Control::start_at(cfg, "127.0.0.1:0")
    }

    /// A control plane listening on `listen` (a fixed port lets clients
    /// find a restarted one).
    pub(crate) fn start_at(cfg: ControlConfig, listen: &str) -> Result<Control> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let addr = rt.block_on(async {
            let l = tokio::net::TcpListener::bind(listen).await?;
            let addr = l.local_addr()?.to_string();
            tokio::spawn(sluice_control::serve(cfg, l, async move {
                let _ = rx.await;
            }));
            anyhow::Ok(addr)
        })?;
        Ok(Control {
            rt,
            addr,
            stop: Some(tx),
        })
    }

    pub(crate) fn client(&self) -> Result<ControlClient> {
        let _g = self.rt.enter();
        Ok(ControlClient::new(&self.addr, None)?)
    }

    pub(crate) fn add_drives(&self, targets: &[&TargetHandle], per_target: u32) -> Result<()> {
        let addrs: Vec<String> = targets.iter().map(|t| t.local_addr().to_string()).collect();
        self.add_drives_at(&addrs, per_target)
    }

    fn add_drives_at(&self, addrs: &[String], per_target: u32) -> Result<()> {
        let c = self.client()?;
        self.rt.block_on(async {
            for a in addrs {
                for nsid in 1..=per_target {
                    c.add_drive(a, DRIVE_NQN, nsid).await?;
                }
            }
            anyhow::Ok(())
        })
    }

    pub(crate) fn create(&self, name: &str, size_bytes: u64, replicas: u32) -> Result<()> {
        self.create_preferring(name, size_bytes, replicas, vec![])
    }

    /// A volume whose extents go to the drives `prefer` names (addresses
    /// or NQNs) while they have room.
    pub(crate) fn create_preferring(
        &self,
        name: &str,
        size_bytes: u64,
        replicas: u32,
        prefer: Vec<String>,
    ) -> Result<()> {
        let c = self.client()?;
        let req = pb::CreateVolumeRequest {
            name: name.into(),
            size_bytes,
            replicas,
            prefer,
            ..Default::default()
        };
        self.rt.block_on(c.create_volume(req))?;
        Ok(())
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn bench(
    control: &str,
    volume: &str,
    rw: RwMode,
    bs: u64,
    qd: u32,
    runtime: f64,
    polling: sluice_runtime::PollingPolicy,
) -> Result<sluice_bench::JobReport> {
    let mut a = BenchArgs::new("", "");
    a.volume = Some(volume.into());
    a.control = control.into();
    a.rw = rw;
    a.bs = BlockSizes::fixed(bs);
    a.qd = qd;
    a.runtime = Some(runtime);
    a.polling = polling;
    Ok(sluice_bench::run(a)?.total)
}

/// Writes the first `bytes` of `volume` sequentially in 1 MiB writes (QD 4),
/// so that every extent there is allocated before a measured run.
fn fill(control: &str, volume: &str, bytes: u64) -> Result<()> {
    let mut a = BenchArgs::new("", "");
    a.volume = Some(volume.into());
    a.control = control.into();
    a.rw = RwMode::Write;
    a.bs = BlockSizes::fixed(1 << 20);
    a.qd = 4;
    a.ios = Some(bytes / MIB);
    sluice_bench::run(a)?;
    Ok(())
}

fn map_overhead() -> (f64, usize) {
    let extents: u64 = 51_200; // 100 GiB
    let volume = VolumeRecord {
        id: VolumeId(1),
        name: "m".into(),
        state: VolumeState::Ready,
        size_bytes: extents * EXTENT_BYTES,
        block_size_bytes: 4096,
        replicas: 2,
        tenant: None,
        prefer: vec![],
        epoch: 1,
        extents_per_drive: Default::default(),
        degraded_extents: 0,
    };
    let records = (0..extents).map(|i| ExtentRecord {
        volume: VolumeId(1),
        index: i,
        chain: vec![
            Replica {
                drive: sluice_volume::DriveId((i % 8) as u32),
                slot: i / 8,
            },
            Replica {
                drive: sluice_volume::DriveId(((i + 1) % 8) as u32),
                slot: i / 8,
            },
        ],
        epoch: 1,
        rebuilding: None,
        retiring: None,
    });
    let map = VolumeMap::from_records(volume, records).unwrap_or_else(|e| panic!("lab map: {e}"));
    let n = 5_000_000u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sink = 0u64;
    let t0 = Instant::now();
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let block = x % (extents * EXTENT_BYTES / 4096);
        if let Ok(plan) = map.plan(block * 4096, 4096, 8 << 20) {
            for p in plan {
                if let sluice_volume::PieceTarget::Mapped { extent } = p.target {
                    sink = sink.wrapping_add(
                        map.chain(extent)
                            .map_or(0, |c| p.drive_offset(&c[c.len() - 1])),
                    );
                }
            }
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    std::hint::black_box(sink);
    (ns, map.allocated())
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // q is within 0..=1, so the index is within the slice.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// What the disk under the metadata charges for durability: `n` times a
/// 4 KiB write at a pseudo-random offset of an 8 MiB file, then
/// `fdatasync`. Returns (p50, p99, max) µs of the sync. A redb commit is one
/// such sync (of a few pages), so an extent fault's p99 cannot beat this
/// one's.
fn sync_floor(dir: &Path, n: usize) -> Result<(f64, f64, f64)> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("sync-floor");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    f.set_len(8 << 20)?;
    f.sync_all()?;
    let page = [0x5au8; 4096];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        f.write_all_at(&page, (x >> 33) % 2048 * 4096)?;
        let t0 = Instant::now();
        f.sync_data()?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    drop(f);
    std::fs::remove_file(&path)?;
    lat.sort_by(f64::total_cmp);
    Ok((
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
        quantile(&lat, 1.0),
    ))
}

/// How the extent faults of one measurement find their slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultSlots {
    /// The zeroer keeps `reserve` clean slots per drive and has filled
    /// them before the first fault; the faults fit in the reserve.
    WithinReserve { reserve: usize },
    /// The zeroer keeps its default reserve; the faults come back to back
    /// and outrun it, so some zero inline.
    Sustained,
    /// No zeroer: every fault claims, zeroes and commits its own slot.
    Inline,
}

/// Runs per row of the extent-fault table.
const FAULT_REPEATS: usize = 3;

/// One row of the extent-fault table from its runs: medians, the p99's
/// range, the largest max.
fn fault_row(store: &str, label: &str, runs: &[(f64, f64, f64, f64)]) -> String {
    let median = |f: fn(&(f64, f64, f64, f64)) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        quantile(&v, 0.5)
    };
    let p99s = runs.iter().map(|r| r.2);
    let lo = p99s.clone().fold(f64::INFINITY, f64::min);
    let hi = p99s.fold(0.0, f64::max);
    let max = runs.iter().map(|r| r.3).fold(0.0, f64::max);
    format!(
        "| {store} | {label} | {:.0} | {:.0} | {:.0} | {lo:.0}-{hi:.0} | {max:.0} |\n",
        median(|r| r.0),
        median(|r| r.1),
        median(|r| r.2),
    )
}

/// Sequential extent faults through the API: (allocations/s, p50, p99, max) µs.
fn allocation_latency(
    metadata: Metadata,
    faults: u64,
    slots: FaultSlots,
) -> Result<(f64, f64, f64, f64)> {
    let t = drive_target(2, 4 << 30, None)?;
    let mut cfg = ControlConfig::new(metadata);
    match slots {
        FaultSlots::WithinReserve { reserve } => cfg.zeroer.clean_slots_per_drive = reserve,
        FaultSlots::Sustained => {}
        FaultSlots::Inline => cfg.zeroer.clean_slots_per_drive = 0,
    }
    let want = cfg.zeroer.clean_slots_per_drive as u64;
    let cp = Control::start_with(cfg)?;
    cp.add_drives(&[&t], 2)?;
    cp.create("faults", faults * EXTENT_BYTES, 1)?;
    let c = cp.client()?;
    let lat = cp.rt.block_on(async {
        if slots != FaultSlots::Inline {
            let t0 = Instant::now();
            while !c.list_drives().await?.iter().all(|d| d.slots_clean >= want) {
                anyhow::ensure!(
                    t0.elapsed() < Duration::from_secs(60),
                    "the zeroer did not fill its reserve"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let v = c.open_volume("faults").await?.volume.context("volume")?;
        let mut lat = Vec::with_capacity(usize::try_from(faults)?);
        for i in 0..faults {
            let t0 = Instant::now();
            c.allocate_extent("faults", v.id, i, v.epoch).await?;
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        anyhow::Ok(lat)
    })?;
    drop(cp);
    t.shutdown();
    let total_s: f64 = lat.iter().sum::<f64>() / 1e6;
    let mut s = lat.clone();
    s.sort_by(f64::total_cmp);
    Ok((
        lat.len() as f64 / total_s,
        quantile(&s, 0.5),
        quantile(&s, 0.99),
        quantile(&s, 1.0),
    ))
}

pub fn run(out: &Path, runtime: f64) -> Result<()> {
    let mut md = String::new();
    md.push_str("# Elastic volumes: the extent map, the control plane, bandwidth over drives\n\n");
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- volumes --runtime {runtime}`; load average before: {}.\n\n",
        crate::datapath::loadavg()
    ));

    // 1. The fast path's cost.
    let (ns, allocated) = map_overhead();
    md.push_str("## Extent map on the fast path\n\n");
    md.push_str(&format!(
        "`VolumeMap::plan` plus the chain lookup for a random 4 KiB request on a 100 GiB map ({allocated} extents, 2 replicas each): **{ns:.0} ns per request** (goal: < 1 µs).\n\n"
    ));

    // 2. Metadata.
    md.push_str("## Extent faults through the control plane\n\n");
    md.push_str("Sequential `AllocateExtent` calls over gRPC on loopback to an in-process `sluice control`, each a new extent, 1000 per row over 2 RAM drives of 4 GiB on one target. A fault that finds clean slots (zeroed ahead by the leader's zeroer) is one metadata transaction; one that finds none claims a slot (a transaction), zeroes it and commits the extent (a second). Rows: *within the reserve*: the zeroer keeps 1024 clean slots per drive and has filled them first, so the 500 faults per drive never bring it below half, where it refills; *sustained*: the default reserve of 64 per drive, filled first, then faults back to back, 500 per drive (the zeroer refills beside them, on the same 2 cores); *inline*: no zeroer.\n\n");
    md.push_str(&format!("Each row is {FAULT_REPEATS} runs on fresh pools: the median of each figure, and the range of the p99.\n\n"));
    md.push_str(
        "| store | slots | allocations/s | p50 µs | p99 µs | p99 range µs | max µs |\n|---|---|---|---|---|---|---|\n",
    );
    let dir = std::env::temp_dir().join(format!("sluice-lab-volumes-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let before = sync_floor(&dir, 1000)?;
    let rows = [
        (
            "within the reserve",
            FaultSlots::WithinReserve { reserve: 1024 },
        ),
        ("sustained", FaultSlots::Sustained),
        ("inline", FaultSlots::Inline),
    ];
    for (i, (label, slots)) in rows.into_iter().enumerate() {
        let runs = (0..FAULT_REPEATS)
            .map(|k| {
                allocation_latency(
                    Metadata::Redb(dir.join(format!("meta-{i}-{k}.redb"))),
                    1000,
                    slots,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        md.push_str(&fault_row("redb", label, &runs));
    }
    let after = sync_floor(&dir, 1000)?;
    for (when, (p50, p99, max)) in [("before", before), ("after", after)] {
        md.push_str(&format!(
            "| floor: one 4 KiB write + fdatasync in the same directory, {when} | | | {p50:.0} | {p99:.0} | | {max:.0} |\n"
        ));
    }
    if sluice_meta::testing::EtcdServer::available() {
        let etcd = sluice_meta::testing::EtcdServer::start()?;
        for (i, (label, slots)) in [
            (
                "within the reserve",
                FaultSlots::WithinReserve { reserve: 1024 },
            ),
            ("sustained", FaultSlots::Sustained),
        ]
        .into_iter()
        .enumerate()
        {
            let runs = (0..FAULT_REPEATS)
                .map(|k| {
                    let m: Metadata = format!(
                        "etcd://{}/lab{i}-{k}",
                        etcd.endpoint.trim_start_matches("http://")
                    )
                    .parse()
                    .map_err(anyhow::Error::msg)?;
                    allocation_latency(m, 1000, slots)
                })
                .collect::<Result<Vec<_>>>()?;
            md.push_str(&fault_row("etcd (one local member)", label, &runs));
        }
    } else {
        md.push_str("| etcd | not installed | | | | | |\n");
    }
    md.push('\n');

    // 3. Fig. 7c.
    let ssd = lab_ssd();
    md.push_str("## Flint Fig. 7c: bandwidth over N drives\n\n");
    md.push_str("Emulated SSDs of 150 MB/s read, 75 MB/s write, 20k read / 5k write IOPS each, 4 KiB blocks; N drives spread over separate `sluice target` processes (N = 1, 2, 4: one drive per process; N = 8: 4 processes of 2); one volume, 1 replica, 64 MiB per drive; `sluice bench --volume --polling interrupt`; writes at QD 16, reads at QD 4 × N. The bench sleeps between completions (`SLUICE_LAB_FIG7C_POLLING` overrides it): an `adaptive` host spun 1 ms after each while commands were outstanding and took the CPU the target processes need on these 2 cores (N = 4 / 8: 0.76 / 0.61-0.70, against 0.89 / 0.87 sleeping) until its spin learned to back off when it waits to run (0.88-0.89 / 0.86-0.87). \"× N·one\" is the bandwidth over N times the N = 1 bandwidth (Flint's goal: ≥ 0.8).\n\n");
    md.push_str("| N drives | 4K seq write MiB/s | × N·one | 128K rand read MiB/s | × N·one |\n|---|---|---|---|---|\n");
    let mut base = (0.0, 0.0);
    let mut xs = Vec::new();
    let mut reads = Vec::new();
    let mut ideal = Vec::new();
    for n in [1u32, 2, 4, 8] {
        // One drive per process up to 4 processes, then two each.
        let processes = n.min(4);
        let per = n / processes;
        let targets: Vec<TargetProcess> = (0..processes)
            .map(|_| TargetProcess::spawn(&dir, per, 128 * MIB, ssd))
            .collect::<Result<_>>()?;
        let cp = Control::start(Metadata::Redb(dir.join(format!("fig7c-{n}.redb"))))?;
        let addrs: Vec<String> = targets.iter().map(|t| t.addr.clone()).collect();
        cp.add_drives_at(&addrs, per)?;
        cp.create("evol", u64::from(n) * 64 * MIB, 1)?;
        let w = bench(
            &cp.addr,
            "evol",
            RwMode::Write,
            4096,
            16,
            runtime,
            fig7c_polling(),
        )?;
        // Make sure every extent exists before the read run.
        fill(&cp.addr, "evol", u64::from(n) * 64 * MIB)?;
        let r = bench(
            &cp.addr,
            "evol",
            RwMode::RandRead,
            128 << 10,
            4 * n,
            runtime,
            fig7c_polling(),
        )?;
        if n == 1 {
            base = (w.bandwidth_mib_s, r.bandwidth_mib_s);
        }
        let nf = f64::from(n);
        md.push_str(&format!(
            "| {n} | {:.1} | {:.2} | {:.1} | {:.2} |\n",
            w.bandwidth_mib_s,
            w.bandwidth_mib_s / (nf * base.0),
            r.bandwidth_mib_s,
            r.bandwidth_mib_s / (nf * base.1)
        ));
        xs.push(n.to_string());
        reads.push(r.bandwidth_mib_s);
        ideal.push(nf * base.1);
        drop(cp);
        drop(targets);
    }
    md.push('\n');
    let svg = crate::plot::bars(
        "eVol 128 KiB random reads over N emulated SSDs",
        "drives",
        "MiB/s",
        &xs,
        &[
            ("eVol".to_owned(), reads),
            ("N × one drive".to_owned(), ideal),
        ],
        None,
    )?;
    report::write(out, "volumes-fig7c.svg", &svg)?;
    md.push_str("![eVol bandwidth](volumes-fig7c.svg)\n\n");

    // 4. Fig. 8.
    md.push_str("## Flint Fig. 8: write latency with 1 and 3 replicas\n\n");
    md.push_str("4 KiB random writes at QD 1 after the volume is allocated; RAM drives, one per target, three targets; the client drives the chain (head, then each next replica).\n\n");
    md.push_str("| replicas | IOPS | p50 µs | p99 µs |\n|---|---|---|---|\n");
    let ts: Vec<TargetHandle> = (0..3)
        .map(|_| drive_target(1, 256 * MIB, None))
        .collect::<Result<_>>()?;
    let cp = Control::start(Metadata::Redb(dir.join("fig8.redb")))?;
    cp.add_drives(&ts.iter().collect::<Vec<_>>(), 1)?;
    for replicas in [1u32, 3] {
        let name = format!("r{replicas}");
        cp.create(&name, 64 * MIB, replicas)?;
        fill(&cp.addr, &name, 64 * MIB)?;
        let r = bench(
            &cp.addr,
            &name,
            RwMode::RandWrite,
            4096,
            1,
            runtime,
            sluice_runtime::PollingPolicy::ADAPTIVE,
        )?;
        md.push_str(&format!(
            "| {replicas} | {:.0} | {:.1} | {:.1} |\n",
            r.iops, r.latency_us_p50, r.latency_us_p99
        ));
    }
    drop(cp);
    for t in ts {
        t.shutdown();
    }
    md.push('\n');
    let _ = std::fs::remove_dir_all(&dir);
    report::write(out, "volumes.md", &md)?;
    Ok(())
}

/// The host's polling in Fig. 7c. Up to 4 target processes and this one
/// share 2 cores there. An `adaptive` host spun 1 ms after each completion
/// while its commands were outstanding, which took the targets' CPU (N = 4
/// / 8: 0.76 / 0.61-0.70 of N × one drive, against 0.89 / 0.87 with
/// `interrupt`), until its spin learned to back off when it waits to run
/// (`SpinContention`: 0.88-0.89 / 0.86-0.87 adaptive). The figure is about
/// bandwidth over drives, so the host sleeps. `SLUICE_LAB_FIG7C_POLLING` (a
/// policy name, e.g. `adaptive`) overrides it, for A/B runs.
fn fig7c_polling() -> sluice_runtime::PollingPolicy {
    match std::env::var("SLUICE_LAB_FIG7C_POLLING") {
        Ok(v) => sluice_runtime::PollingPolicy::parse(
            &v,
            sluice_runtime::polling::ADAPTIVE_SPIN_US_DEFAULT,
        )
        .unwrap_or_else(|e| {
            eprintln!("SLUICE_LAB_FIG7C_POLLING: {e}; using interrupt");
            sluice_runtime::PollingPolicy::Interrupt
        }),
        Err(_) => sluice_runtime::PollingPolicy::Interrupt,
    }
}

/// The Fig. 7c drive model: 150 MB/s read, 75 MB/s write.
fn lab_ssd() -> SsdConfig {
    SsdConfig::default()
        .with_read_bytes_per_sec_max(150_000_000)
        .with_write_bytes_per_sec_max(75_000_000)
        .with_read_iops_max(20_000)
        .with_write_iops_max(5_000)
}

/// `volume-rebuild`: foreground bandwidth while a failed target's replicas
/// are rebuilt, over the same workload's bandwidth just before the failure,
/// at two rebuild rates.
pub fn run_rebuild(out: &Path, runtime: f64) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("sluice-lab-rebuild-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut md = String::new();
    md.push_str("# Elastic volumes: rebuilding lost replicas under load\n\n");
    md.push_str(&format!(
        "`cargo run --release -p sluice-lab -- volume-rebuild --runtime {runtime}`; load average before: {}.\n\n",
        crate::datapath::loadavg()
    ));
    md.push_str(&format!(
        "A {} MiB volume with 2 replicas over 6 emulated SSDs (the Fig. 7c model: 150 MB/s read, 75 MB/s write; {} MiB each), 2 per target on 3 targets, filled. Foreground: `sluice bench --volume --polling interrupt` (as in Fig. 7c), 64 KiB random, 70/30 read/write or reads only, at QD 8 for {runtime} s, once before and once right after the first target's two drives are failed (`FailDrive`, forced), while the leader rebuilds their replicas onto the other targets ({} extents at once, fence, drain, copy from the tail, join) at the rate configured. A fresh pool per rate.\n\n",
        REBUILD_VOLUME_BYTES / MIB,
        REBUILD_DRIVE_BYTES / MIB,
        sluice_control::rebuild::RebuildConfig::default().parallel
    ));
    md.push_str("*Fixed*: the configured rate always (`--rebuild-rate-fixed`). *Adaptive* (the default): the configured rate is a ceiling; the rate halves, once per view epoch (100 ms) and down to a sixteenth, while the shadow view reports a surviving replica's drive busy for the foreground (busy degree ≥ 0.8: the foreground's queueing delay near the 1 ms congestion threshold), and climbs back by an eighth per epoch when none is.\n\n");
    md.push_str("A 70/30 foreground's bandwidth during the rebuild is not the whole story: while an extent is degraded its writes go to one replica instead of two, so they cost less, and that can hide what the rebuild takes. The *reads* rows run a 100 % read foreground, which the degraded state does not make cheaper (each read goes to one replica either way) and which competes with the rebuild's reads of the same surviving drives.\n\n");
    md.push_str("| foreground | rebuild rate MiB/s | rate | achieved MiB/s | extents rebuilt | foreground before MiB/s | during MiB/s | during ÷ before | p99 µs before | p99 µs during | degraded left when the run ended |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut result = Ok(());
    for (read_pct, rate_mib, adaptive) in [
        (70u8, 32u64, false),
        (70, 64, false),
        (70, 32, true),
        (70, 64, true),
        (70, 128, true),
        (100, 64, false),
        (100, 64, true),
    ] {
        match rebuild_under_load(&dir, lab_ssd(), runtime, rate_mib * MIB, adaptive, read_pct) {
            Ok(r) => md.push_str(&format!(
                "| {} | {rate_mib} | {} | {:.1} | {} | {:.1} | {:.1} | **{:.2}** | {:.0} | {:.0} | {} |\n",
                if read_pct == 100 { "reads".to_owned() } else { format!("{read_pct}/{} r/w", 100 - read_pct) },
                if adaptive { "adaptive" } else { "fixed" },
                r.achieved_mib_s,
                r.rebuilt,
                r.before.bandwidth_mib_s,
                r.during.bandwidth_mib_s,
                r.during.bandwidth_mib_s / r.before.bandwidth_mib_s.max(f64::MIN_POSITIVE),
                r.before.latency_us_p99,
                r.during.latency_us_p99,
                r.left_at_end
            )),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    md.push_str("\nThe goal is ≥ 0.8 of the foreground's bandwidth. \"Degraded left\" above 0 means the rebuild was still running when the foreground run ended, so the whole run saw it.\n");
    report::write(out, "volumes-rebuild.md", &md)
}

const REBUILD_DRIVE_BYTES: u64 = 384 * MIB;
const REBUILD_VOLUME_BYTES: u64 = 512 * MIB;

struct RebuildRun {
    before: sluice_bench::JobReport,
    during: sluice_bench::JobReport,
    rebuilt: u64,
    achieved_mib_s: f64,
    left_at_end: u64,
}

fn rebuild_under_load(
    dir: &Path,
    ssd: SsdConfig,
    runtime: f64,
    rate: u64,
    adaptive: bool,
    read_pct: u8,
) -> Result<RebuildRun> {
    let ts: Vec<TargetHandle> = (0..3)
        .map(|_| drive_target(2, REBUILD_DRIVE_BYTES, Some(ssd)))
        .collect::<Result<_>>()?;
    let mut cfg = ControlConfig::new(Metadata::Redb(
        dir.join(format!("rebuild-{rate}-{adaptive}-{read_pct}.redb")),
    ));
    cfg.rebuild.rate_bytes_per_sec = rate;
    cfg.rebuild.adaptive = adaptive;
    cfg.rebuild.scan_interval = std::time::Duration::from_millis(200);
    let cp = Control::start_with(cfg)?;
    cp.add_drives(&ts.iter().collect::<Vec<_>>(), 2)?;
    cp.create("r", REBUILD_VOLUME_BYTES, 2)?;
    fill(&cp.addr, "r", REBUILD_VOLUME_BYTES)?;
    let fg = |rt: f64| {
        let mut a = BenchArgs::new("", "");
        a.volume = Some("r".into());
        a.control = cp.addr.clone();
        a.rw = RwMode::RandRw;
        a.rwmixread = read_pct;
        a.bs = BlockSizes::fixed(64 << 10);
        a.qd = 8;
        a.runtime = Some(rt);
        // As in Fig. 7c: an adaptive host's spin takes CPU the drives need.
        a.polling = fig7c_polling();
        sluice_bench::run(a).map(|r| r.total)
    };
    let before = fg(runtime)?;
    let c = cp.client()?;
    let first_target = ts.first().context("no targets")?.local_addr().to_string();
    let started = cp.rt.block_on(async {
        for d in c.list_drives().await? {
            if d.addr == first_target {
                c.fail_drive(d.id, true, "lab: rebuild under load").await?;
            }
        }
        anyhow::Ok(Instant::now())
    })?;
    let during = fg(runtime)?;
    let (rebuilt, copied, secs, left_at_end) = cp.rt.block_on(async {
        let mut left_at_end = None;
        loop {
            let s = c.status().await?.rebuilds.unwrap_or_default();
            let left = c
                .open_volume("r")
                .await?
                .volume
                .map_or(0, |v| v.degraded_extents);
            let left_at_end = *left_at_end.get_or_insert(left);
            if left == 0 {
                return anyhow::Ok((
                    s.extents_rebuilt,
                    s.bytes_copied,
                    started.elapsed().as_secs_f64(),
                    left_at_end,
                ));
            }
            anyhow::ensure!(
                started.elapsed().as_secs() < 600,
                "the rebuild did not finish in 10 minutes"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })?;
    drop(cp);
    for t in ts {
        t.shutdown();
    }
    Ok(RebuildRun {
        before,
        during,
        rebuilt,
        achieved_mib_s: copied as f64 / MIB as f64 / secs.max(f64::MIN_POSITIVE),
        left_at_end,
    })
}
