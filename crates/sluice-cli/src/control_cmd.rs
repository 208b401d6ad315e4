//! `sluice control` (the control plane), and its clients `sluice drive`,
//! `sluice volume`, `sluice tenant` and `sluice auction`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sluice_admin::BearerToken;
use sluice_control::server::{ControlConfig, Metadata};
use sluice_control::{pb, ControlClient};

/// Where the control plane is, and its token (shared by the client commands).
#[derive(Debug, Args, Clone)]
pub struct ControlAddr {
    /// The control plane's gRPC address; several, comma-separated, when
    /// control planes share one etcd (the client finds the leader).
    #[arg(long, default_value = "127.0.0.1:9500", env = "SLUICE_CONTROL")]
    pub control: String,
    /// File holding the control plane's bearer token.
    #[arg(long, env = "SLUICE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl ControlAddr {
    pub fn client(&self) -> Result<ControlClient> {
        let token = read_token(self.token_file.as_deref())?;
        Ok(ControlClient::new(&self.control, token.as_ref())?)
    }
}

fn read_token(path: Option<&std::path::Path>) -> Result<Option<BearerToken>> {
    path.map(|p| {
        BearerToken::from_file(p).with_context(|| format!("reading the token file {}", p.display()))
    })
    .transpose()
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// Listen address of the gRPC API. Beyond loopback, --token-file is
    /// required.
    #[arg(long, default_value = "127.0.0.1:9500")]
    listen: std::net::SocketAddr,
    /// Metadata store: redb:PATH (embedded, the default) or
    /// etcd://HOST:PORT[,HOST:PORT...][/PREFIX].
    #[arg(long, default_value = "redb:sluice-meta.redb")]
    metadata: String,
    /// File holding the bearer token every API call must carry.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Address clients should use for this process when it leads (several
    /// control planes on one etcd elect one leader); default: --listen.
    #[arg(long)]
    advertise: Option<String>,
    /// Average rate at which lost replicas are rebuilt at most (bytes per
    /// second, e.g. 32MiB, the default; see --rebuild-rate-fixed and
    /// docs/experiments/volumes-rebuild.md).
    #[arg(long, default_value = "32MiB")]
    rebuild_rate: String,
    /// Extents rebuilt at once (each fenced, drained and copied on its own;
    /// the rate spaces their starts).
    #[arg(long, default_value_t = 4)]
    rebuild_parallel: usize,
    /// Rebuild at --rebuild-rate always. By default that rate is a
    /// ceiling: it halves (once per view epoch, down to a sixteenth) while
    /// the shadow view reports a surviving replica's drive busy for the
    /// foreground, and climbs back when it is not.
    #[arg(long)]
    rebuild_rate_fixed: bool,
    /// Clean (zeroed) slots the leader keeps ready per drive in service, so
    /// that an extent fault is one metadata transaction; 0: faults zero
    /// their slots inline.
    #[arg(long, default_value_t = sluice_control::ZeroerConfig::default().clean_slots_per_drive)]
    clean_slots_per_drive: usize,
    /// Serve the shadow view's Prometheus metrics (/metrics) and JSON
    /// (/v1/view) here, with --token-file's token.
    #[arg(long)]
    admin_listen: Option<std::net::SocketAddr>,
    /// Shadow view: time between bottleneck analyses.
    #[arg(long, default_value_t = 100)]
    view_epoch_ms: u64,
    /// Shadow view: span of every sliding window.
    #[arg(long, default_value_t = 1000)]
    view_window_ms: u64,
    /// Shadow view: a drive whose mean queueing delay reaches this is
    /// congested.
    #[arg(long, default_value_t = 1000.0, allow_negative_numbers = true)]
    view_queue_delay_us: f64,
    /// Move extents off drives the shadow view reports congested (Flint
    /// §5.5), onto the best uncongested drive, at the rebuild rate; extents
    /// of volumes that prefer the drive stay.
    #[arg(long)]
    remap: bool,
    /// A drive must stay congested this long before its extents move.
    #[arg(long, default_value_t = 3000)]
    remap_congested_ms: u64,
    /// Extents moved per remap scan (one a second), at most.
    #[arg(long, default_value_t = 8)]
    remap_extents_per_scan: usize,
    /// Start with the bandwidth auction on: volume clients send to a drive
    /// only with a slice of its bandwidth, shared by weighted max-min
    /// fairness (switch it later with `sluice auction on|off`).
    #[arg(long)]
    auction: bool,
    /// Time between auctions.
    #[arg(long, default_value_t = 50)]
    auction_epoch_ms: u64,
    /// The auction backs a drive's estimate off when its I/O waits, on
    /// average, longer than this many of its slowest I/O's unloaded
    /// latencies.
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    auction_inflation: f64,
    /// SLO classes and their weights in the auction, NAME=WEIGHT,...
    #[arg(long, default_value = "gold=4,silver=2,bronze=1")]
    slo_classes: String,
    /// The class of tenants (and volumes) no `sluice tenant set` names.
    #[arg(long, default_value = "bronze")]
    default_slo_class: String,
    /// Serve the view's fast channel here: clients and targets sync their
    /// telemetry over plain TCP (about a round trip) instead of gRPC, with
    /// --token-file's token. Beyond loopback, --token-file is required.
    #[arg(long)]
    view_listen: Option<std::net::SocketAddr>,
}

pub fn control(a: ControlArgs) -> Result<()> {
    let metadata: Metadata = a.metadata.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    let mut cfg = ControlConfig::new(metadata);
    cfg.token = read_token(a.token_file.as_deref())?;
    cfg.advertise = a.advertise.clone();
    cfg.rebuild.rate_bytes_per_sec = sluice_config::parse_size(&a.rebuild_rate)
        .map_err(|e| anyhow::anyhow!("--rebuild-rate {:?}: {e}", a.rebuild_rate))?;
    cfg.rebuild.parallel = a.rebuild_parallel;
    cfg.rebuild.adaptive = !a.rebuild_rate_fixed;
    cfg.rebuild
        .check()
        .map_err(|e| anyhow::anyhow!("--rebuild-rate/--rebuild-parallel: {e}"))?;
    cfg.zeroer.clean_slots_per_drive = a.clean_slots_per_drive;
    cfg.zeroer
        .check()
        .map_err(|e| anyhow::anyhow!("--clean-slots-per-drive: {e}"))?;
    sluice_control::auth::check_listen(a.listen, cfg.token.as_ref())
        .map_err(|e| anyhow::anyhow!(e))?;
    cfg.view.epoch_us = a.view_epoch_ms.saturating_mul(1000);
    cfg.view.window_us = a.view_window_ms.saturating_mul(1000);
    cfg.view.queue_delay_us_congested = a.view_queue_delay_us;
    cfg.view.check().map_err(|e| {
        anyhow::anyhow!("--view-epoch-ms/--view-window-ms/--view-queue-delay-us: {e}")
    })?;
    cfg.remap.enabled = a.remap;
    cfg.remap.congested_for = std::time::Duration::from_millis(a.remap_congested_ms);
    cfg.remap.extents_per_scan = a.remap_extents_per_scan;
    cfg.remap
        .check()
        .map_err(|e| anyhow::anyhow!("--remap-congested-ms/--remap-extents-per-scan: {e}"))?;
    cfg.auction.epoch_us = a.auction_epoch_ms.saturating_mul(1000);
    cfg.auction.inflation_target = a.auction_inflation;
    cfg.auction
        .check()
        .map_err(|e| anyhow::anyhow!("--auction-epoch-ms/--auction-inflation: {e}"))?;
    cfg.auction_on = a.auction;
    cfg.slo = sluice_control::view::SloClasses::parse(&a.slo_classes, &a.default_slo_class)
        .map_err(|e| anyhow::anyhow!("--slo-classes/--default-slo-class: {e}"))?;
    if let Some(addr) = a.view_listen {
        sluice_control::auth::check_listen(addr, cfg.token.as_ref())
            .map_err(|e| anyhow::anyhow!("--view-listen: {e}"))?;
        cfg.view_listen = Some(addr);
    }
    if let Some(addr) = a.admin_listen {
        sluice_control::auth::check_listen(addr, cfg.token.as_ref())
            .map_err(|e| anyhow::anyhow!("--admin-listen: {e}"))?;
        let mut admin = sluice_admin::AdminConfig::new(addr);
        admin.token = cfg.token.clone();
        cfg.admin = Some(admin);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the control plane's runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        eprintln!(
            "sluice control: serving on {} (metadata {})",
            a.listen, a.metadata
        );
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        sluice_control::serve(cfg, listener, shutdown)
            .await
            .context("running the control plane")
    })
}

#[derive(Debug, Subcommand)]
pub enum DriveCmd {
    /// Add a namespace of an NVMe/TCP target to the pool.
    Add {
        /// The target's HOST:PORT.
        addr: String,
        /// The subsystem NQN.
        nqn: String,
        #[arg(long, default_value_t = 1)]
        nsid: u32,
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Add every namespace a discovery service lists (each subsystem's
    /// namespaces become drives).
    Discover {
        /// The discovery service's HOST:PORT.
        addr: String,
        #[command(flatten)]
        at: ControlAddr,
    },
    /// List the pool's drives.
    List {
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Take a drive out of service (no new extents) or back in.
    Set {
        id: u32,
        #[arg(long)]
        down: bool,
        /// Also release the drive's quarantined slots without a fence: a
        /// deleted volume's slots on a drive that cannot fence (Linux
        /// nvmet, SPDK) wait for this. Only when no client still has a
        /// deleted volume open, and no deposed control plane runs.
        #[arg(long)]
        release_quarantined: bool,
        #[command(flatten)]
        at: ControlAddr,
    },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// Create a volume (capacity reserved now, extents allocated on first
    /// write).
    Create {
        name: String,
        /// Size, e.g. 100GiB.
        #[arg(long)]
        size: String,
        #[arg(long, default_value_t = 1)]
        replicas: u32,
        /// Block size the volume exposes: 512 or 4096.
        #[arg(long, default_value_t = 4096)]
        block_size: u32,
        /// Tenant the volume's I/O is accounted to.
        #[arg(long)]
        tenant: Option<String>,
        /// Drive addresses or NQNs to prefer (repeatable).
        #[arg(long)]
        prefer: Vec<String>,
        #[command(flatten)]
        at: ControlAddr,
    },
    /// List volumes.
    List {
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Show a volume's extents per drive.
    Inspect {
        name: String,
        /// Also list every extent's chain.
        #[arg(long)]
        extents: bool,
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Grow a volume online.
    Resize {
        name: String,
        #[arg(long)]
        size: String,
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Delete a volume and free its extents.
    Delete {
        name: String,
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Show the rebuild of lost replicas and the remaps off congested
    /// drives: rate, degraded extents, extents rebuilt and remapped, progress.
    Rebuilds {
        #[command(flatten)]
        at: ControlAddr,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// Put a tenant in an SLO class: its volumes bid with the class's
    /// weight in the bandwidth auction.
    Set {
        /// The tenant, as volumes name it (`volume create --tenant`).
        name: String,
        #[arg(long)]
        slo_class: String,
        #[command(flatten)]
        at: ControlAddr,
    },
    /// List tenants and the SLO classes.
    List {
        #[command(flatten)]
        at: ControlAddr,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuctionCmd {
    /// Show the auction: each drive's estimate and grants, each session's
    /// share.
    Status {
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Switch the auction on: volume clients then send only with slices.
    On {
        #[command(flatten)]
        at: ControlAddr,
    },
    /// Switch the auction off.
    Off {
        #[command(flatten)]
        at: ControlAddr,
    },
}

fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?
        .block_on(f)
}

fn size(s: &str) -> Result<u64> {
    sluice_config::parse_size(s).map_err(|e| anyhow::anyhow!("--size {s:?}: {e}"))
}

fn print_drive(d: &pb::Drive) {
    println!(
        "{:>4}  {:<4}  {:<21}  {}  nsid {}  {} B blocks  {}/{} extents used  {} clean{}{}",
        format!("d{}", d.id),
        if d.up { "up" } else { "down" },
        d.addr,
        d.nqn,
        d.nsid,
        d.block_size_bytes,
        d.slots_used,
        d.slots_total,
        d.slots_clean,
        if d.slots_quarantined > 0 {
            format!("  {} quarantined", d.slots_quarantined)
        } else {
            String::new()
        },
        d.nguid
            .as_ref()
            .map(|g| format!("  nguid {g}"))
            .unwrap_or_default()
    );
}

fn print_volume(v: &pb::Volume) {
    let allocated: u64 = v.extents_per_drive.values().sum::<u64>() / u64::from(v.replicas.max(1));
    println!(
        "{:<20}  v{:<4}  {:>14} B  {} B blocks  {} replica(s)  {} of {} extents allocated  epoch {}{}{}{}",
        v.name,
        v.id,
        v.size_bytes,
        v.block_size_bytes,
        v.replicas,
        allocated,
        v.size_bytes.div_ceil(sluice_volume::EXTENT_BYTES),
        v.epoch,
        v.tenant.as_ref().map(|t| format!("  tenant {t}")).unwrap_or_default(),
        if v.degraded_extents > 0 {
            format!("  {} degraded or remapping", v.degraded_extents)
        } else {
            String::new()
        },
        if v.deleting { "  (deleting)" } else { "" }
    );
}

pub fn drive(cmd: DriveCmd) -> Result<()> {
    block_on(async move {
        match cmd {
            DriveCmd::Add {
                addr,
                nqn,
                nsid,
                at,
            } => {
                let d = at
                    .client()?
                    .add_drive(&addr, &nqn, nsid)
                    .await
                    .context("adding the drive")?;
                print_drive(&d);
            }
            DriveCmd::Discover { addr, at } => {
                let c = at.client()?;
                let sock = tokio::net::lookup_host(addr.as_str())
                    .await
                    .with_context(|| format!("resolving {addr}"))?
                    .next()
                    .with_context(|| format!("{addr} resolves to no address"))?;
                let entries = sluice_host::discover(sock, &sluice_host::ConnectOptions::default())
                    .await
                    .with_context(|| format!("reading the discovery log at {addr}"))?;
                let mut added = 0;
                for e in entries
                    .iter()
                    .filter(|e| e.subtype == sluice_proto::log::subtype::NVME)
                {
                    let target = format!("{}:{}", e.traddr, e.trsvcid);
                    let opts = sluice_host::ConnectOptions::default();
                    let Ok(sa) = target.parse() else { continue };
                    let ctrl = sluice_host::Controller::connect(sa, &e.subnqn, opts)
                        .await
                        .with_context(|| format!("connecting to {target} {}", e.subnqn))?;
                    let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
                    ctrl.disconnect(std::time::Duration::from_millis(50)).await;
                    for nsid in nsids {
                        match c.add_drive(&target, &e.subnqn, nsid).await {
                            Ok(d) => {
                                print_drive(&d);
                                added += 1;
                            }
                            Err(err) => {
                                eprintln!("skipping {target} {} nsid {nsid}: {err}", e.subnqn)
                            }
                        }
                    }
                }
                println!("{added} drive(s) added");
            }
            DriveCmd::List { at } => {
                for d in at.client()?.list_drives().await.context("listing drives")? {
                    print_drive(&d);
                }
            }
            DriveCmd::Set {
                id,
                down,
                release_quarantined,
                at,
            } => {
                let d = at
                    .client()?
                    .set_drive(pb::SetDriveStateRequest {
                        id,
                        up: !down,
                        release_quarantined,
                    })
                    .await
                    .context("changing the drive's state")?;
                print_drive(&d);
            }
        }
        Ok(())
    })
}

pub fn volume(cmd: VolumeCmd) -> Result<()> {
    block_on(async move {
        match cmd {
            VolumeCmd::Create {
                name,
                size: s,
                replicas,
                block_size,
                tenant,
                prefer,
                at,
            } => {
                let req = pb::CreateVolumeRequest {
                    name,
                    size_bytes: size(&s)?,
                    block_size_bytes: block_size,
                    replicas,
                    tenant,
                    prefer,
                };
                let v = at
                    .client()?
                    .create_volume(req)
                    .await
                    .context("creating the volume")?;
                print_volume(&v);
            }
            VolumeCmd::List { at } => {
                for v in at
                    .client()?
                    .list_volumes()
                    .await
                    .context("listing volumes")?
                {
                    print_volume(&v);
                }
            }
            VolumeCmd::Inspect { name, extents, at } => {
                let l = at
                    .client()?
                    .open_volume(&name)
                    .await
                    .with_context(|| format!("inspecting {name:?}"))?;
                let Some(v) = &l.volume else {
                    bail!("the control plane sent no volume")
                };
                print_volume(v);
                println!("extents per drive (replicas):");
                for (d, n) in &v.extents_per_drive {
                    let drive = l.drives.iter().find(|x| x.id == *d);
                    println!(
                        "  d{d:<4} {:>6}  {}",
                        n,
                        drive
                            .map(|x| format!("{} {} nsid {}", x.addr, x.nqn, x.nsid))
                            .unwrap_or_default()
                    );
                }
                if extents {
                    for e in &l.extents {
                        let chain: Vec<String> = e
                            .chain
                            .iter()
                            .map(|r| format!("d{}:{}", r.drive, r.slot))
                            .collect();
                        println!(
                            "  extent {:>8}  {}  epoch {}{}",
                            e.index,
                            chain.join(" -> "),
                            e.epoch,
                            match (&e.rebuilding, &e.retiring) {
                                (Some(r), Some(o)) => format!(
                                    "  remapping d{}:{} onto d{}:{}",
                                    o.drive, o.slot, r.drive, r.slot
                                ),
                                (Some(r), None) =>
                                    format!("  rebuilding onto d{}:{}", r.drive, r.slot),
                                _ => String::new(),
                            }
                        );
                    }
                }
            }
            VolumeCmd::Resize { name, size: s, at } => {
                let v = at
                    .client()?
                    .resize_volume(&name, size(&s)?)
                    .await
                    .context("resizing the volume")?;
                print_volume(&v);
            }
            VolumeCmd::Delete { name, at } => {
                at.client()?
                    .delete_volume(&name)
                    .await
                    .context("deleting the volume")?;
                println!("deleted {name}");
            }
            VolumeCmd::Rebuilds { at } => {
                let s = at
                    .client()?
                    .status()
                    .await
                    .context("asking the control plane for its status")?;
                let r = s.rebuilds.unwrap_or_default();
                if !s.is_leader {
                    println!(
                        "this control plane does not lead ({}); ask the leader",
                        s.leader
                    );
                }
                println!(
                    "rate {} B/s  degraded extents {}  rebuilt {}  remapped {} ({} B copied)  aborted {}{}",
                    r.rate_bytes_per_sec,
                    r.degraded_extents,
                    r.extents_rebuilt,
                    r.extents_remapped,
                    r.bytes_copied,
                    r.extents_aborted,
                    if r.current.is_empty() {
                        String::new()
                    } else {
                        format!("  copying {}", r.current)
                    }
                );
                if !r.last_error.is_empty() {
                    println!("last error: {}", r.last_error);
                }
            }
        }
        Ok(())
    })
}

pub fn tenant(cmd: TenantCmd) -> Result<()> {
    block_on(async move {
        match cmd {
            TenantCmd::Set {
                name,
                slo_class,
                at,
            } => {
                let t = at
                    .client()?
                    .set_tenant(&name, &slo_class)
                    .await
                    .context("setting the tenant's class")?;
                println!("{}  class {}  weight {}", t.name, t.slo_class, t.weight);
            }
            TenantCmd::List { at } => {
                let l = at
                    .client()?
                    .list_tenants()
                    .await
                    .context("listing tenants")?;
                let classes: Vec<String> = l
                    .classes
                    .iter()
                    .map(|c| format!("{}={}", c.name, c.weight))
                    .collect();
                println!(
                    "classes {}  (default {})",
                    classes.join(","),
                    l.default_class
                );
                for t in &l.tenants {
                    println!("{}  class {}  weight {}", t.name, t.slo_class, t.weight);
                }
            }
        }
        Ok(())
    })
}

/// The auction's state as a table.
pub fn render_auction(a: &pb::AuctionStatusResponse) -> String {
    let mut out = format!(
        "auction {}  epoch {} every {} ms\n",
        if a.on { "on" } else { "off" },
        a.epoch,
        a.epoch_us / 1000
    );
    out.push_str(&format!(
        "{:<6} {:<22} {:>10} {:>10} {:>11} {:>9} {:>9} {:>6} {:>6} {:>8}\n",
        "DRIVE",
        "PORT",
        "EST MB/s",
        "DONE MB/s",
        "GRANTED MB",
        "SLICE KiB",
        "QDELAY us",
        "WAITS",
        "CONT",
        "CAP MB/s"
    ));
    for d in &a.drives {
        out.push_str(&format!(
            "{:<6} {:<22} {:>10.1} {:>10.1} {:>11.2} {:>9} {:>9.0} {:>6.2} {:>6.2} {:>8.1}\n",
            format!("d{}", d.drive),
            d.port,
            d.bytes_per_sec / 1e6,
            d.completed_bytes_per_sec / 1e6,
            d.granted_bytes as f64 / 1e6,
            d.slice_bytes / 1024,
            d.queue_delay_us_mean,
            d.inflation_mean,
            d.contention_mean,
            d.heavy_cap_bytes_per_sec / 1e6
        ));
    }
    out.push_str(&format!(
        "{:<28} {:>7} {:>6} {:>7} {:>12} {:>12} {:>6} {}\n",
        "CLIENT", "VOLUME", "DRIVE", "WEIGHT", "GRANTED MB", "SPENT MB", "CONT", "STATE"
    ));
    for s in &a.sessions {
        out.push_str(&format!(
            "{:<28} {:>7} {:>6} {:>7} {:>12.2} {:>12.2} {:>6.2} {}\n",
            s.client,
            format!("v{}", s.volume),
            format!("d{}", s.drive),
            s.weight,
            s.granted_bytes as f64 / 1e6,
            s.spent_last_bytes as f64 / 1e6,
            s.contention_mean,
            if s.idle {
                "idle"
            } else if s.hungry {
                "hungry"
            } else if s.held_back {
                "held back"
            } else {
                "active"
            }
        ));
    }
    out
}

pub fn auction(cmd: AuctionCmd) -> Result<()> {
    block_on(async move {
        let a = match cmd {
            AuctionCmd::Status { at } => at
                .client()?
                .auction_status()
                .await
                .context("asking for the auction's state")?,
            AuctionCmd::On { at } => at
                .client()?
                .set_auction(true)
                .await
                .context("switching the auction on")?,
            AuctionCmd::Off { at } => at
                .client()?
                .set_auction(false)
                .await
                .context("switching the auction off")?,
        };
        print!("{}", render_auction(&a));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each session shows its own I/O's contention and whether the rule
    /// takes it to be held back: what an operator needs to see who the
    /// heavy cap binds, and why.
    #[test]
    fn the_auction_table_shows_each_sessions_contention_and_who_is_held_back() {
        let session = |client: &str, hungry, held_back, contention_mean| pb::AuctionSession {
            client: client.into(),
            volume: 1,
            drive: 3,
            weight: 1.0,
            granted_bytes: 2_000_000,
            spent_last_bytes: 500_000,
            hungry,
            idle: false,
            contention_mean,
            held_back,
        };
        let a = pb::AuctionStatusResponse {
            on: true,
            epoch: 7,
            epoch_us: 50_000,
            drives: vec![pb::AuctionDrive {
                drive: 3,
                port: "127.0.0.1:4420".into(),
                ..Default::default()
            }],
            sessions: vec![
                session("db", false, true, 2.5),
                session("stream", true, false, 0.25),
            ],
        };
        let t = render_auction(&a);
        let row = |c: &str| {
            t.lines()
                .find(|l| l.starts_with(c))
                .unwrap_or_else(|| panic!("no row for {c} in\n{t}"))
                .to_owned()
        };
        assert!(t.lines().any(|l| l.contains("CONT") && l.contains("STATE")));
        assert!(row("db ").ends_with("2.50 held back"), "{t}");
        assert!(row("stream").ends_with("0.25 hungry"), "{t}");
    }
}
