//! `sluice`: the Sluice command line.
//!
//! * `sluice target`: run an NVMe/TCP target (embedded default or `--config`).
//! * `sluice check-config`: validate a target configuration file.
//! * `sluice bench`: load generator (fio / spdk_nvme_perf style) with tenants
//!   and the TCP wire floor measured in the same run.
//! * `sluice discover`: read a discovery service's log.
//! * `sluice top`: live per-tenant view from a target's admin endpoint.
//! * `sluice control`, `sluice drive`, `sluice volume`: the control plane
//!   and its clients (elastic volumes).
//! * `sluice nbd`, `sluice fuse`: export a remote namespace over NBD or as a
//!   file in a FUSE mount.
//!
//! The papers' experiments are a separate binary, `sluice-lab`
//! (crates/sluice-lab), so this one carries none of their machinery.

mod control_cmd;
mod export_cmd;
mod host_cmd;
mod target_cmd;
mod top_cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Multi-tenant block storage over NVMe/TCP"
)]
struct Cli {
    /// Log filter (RUST_LOG syntax), e.g. `info`, `sluice_target=debug`.
    #[arg(long, global = true, default_value = "info", env = "SLUICE_LOG")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an NVMe/TCP target.
    Target(target_cmd::TargetArgs),
    /// Generate load against an NVMe/TCP target and report IOPS, bandwidth,
    /// latency percentiles and CPU.
    Bench(Box<sluice_bench::BenchArgs>),
    /// Read the discovery log of an NVMe/TCP discovery service.
    Discover(host_cmd::DiscoverArgs),
    /// Serve a remote namespace over NBD (Unix socket or TCP).
    Nbd(export_cmd::NbdArgs),
    /// Mount a remote namespace as a single file in a FUSE filesystem.
    Fuse(export_cmd::FuseArgs),
    /// Show tenants live (IOPS, bandwidth, latency, CPU, throttling) from a
    /// target's admin endpoint.
    Top(top_cmd::TopArgs),
    /// Run the control plane: the pool of drives and the elastic volumes
    /// over them (metadata in redb, or in etcd).
    Control(control_cmd::ControlArgs),
    /// Manage the pool's drives (namespaces on NVMe/TCP targets).
    #[command(subcommand)]
    Drive(control_cmd::DriveCmd),
    /// Manage elastic volumes.
    #[command(subcommand)]
    Volume(control_cmd::VolumeCmd),
    /// Validate a target configuration file and print what it defines.
    CheckConfig {
        /// TOML configuration file.
        config: std::path::PathBuf,
    },
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let r: Result<()> = match cli.command {
        Command::Target(a) => target_cmd::run(a),
        Command::CheckConfig { config } => target_cmd::check(&config),
        Command::Bench(a) => host_cmd::bench(*a),
        Command::Discover(a) => host_cmd::discover(a),
        Command::Top(a) => top_cmd::run(a),
        Command::Nbd(a) => export_cmd::nbd(a),
        Command::Fuse(a) => export_cmd::fuse(a),
        Command::Control(a) => control_cmd::control(a),
        Command::Drive(c) => control_cmd::drive(c),
        Command::Volume(c) => control_cmd::volume(c),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
