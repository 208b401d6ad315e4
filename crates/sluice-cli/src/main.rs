//! `sluice`: the Sluice command line.
//!
//! * `sluice target`: run an NVMe/TCP target (embedded default or `--config`).
//! * `sluice check-config`: validate a target configuration file.
//! * `sluice bench`: load generator (fio / spdk_nvme_perf style) with tenants
//!   and the raw TCP floor measured in the same run.
//! * `sluice discover`: read a discovery service's log.

mod host_cmd;
mod target_cmd;

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
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
