//! `sluice`: the Sluice command line.
//!
//! * `sluice target`: run an NVMe/TCP target (embedded default or `--config`).
//! * `sluice check-config`: validate a target configuration file.
//! * `sluice bench`: load generator (fio / spdk_nvme_perf style) with tenants
//!   and the TCP wire floor measured in the same run.
//! * `sluice discover`: read a discovery service's log.
//! * `sluice resv`: a namespace's reservations (register, acquire, release,
//!   report), as `nvme resv-*` does for a Linux host.
//! * `sluice top`: live per-tenant view from a target's admin endpoint.
//! * `sluice control`, `sluice drive`, `sluice volume`, `sluice tenant`,
//!   `sluice auction`: the control plane and its clients (elastic volumes,
//!   SLO classes, the bandwidth auction).
//! * `sluice nbd`, `sluice fuse`: export a remote namespace over NBD or as a
//!   file in a FUSE mount.
//!
//! The papers' experiments are a separate binary, `sluice-lab`
//! (crates/sluice-lab), so this one carries none of their machinery.

mod control_cmd;
mod export_cmd;
mod host_cmd;
mod resv_cmd;
mod target_cmd;
mod top_cmd;

use anyhow::{Context, Result};
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
    /// A namespace's reservations: register a key, acquire, preempt,
    /// release, clear, report.
    #[command(subcommand)]
    Resv(resv_cmd::ResvCmd),
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
    /// Put tenants in SLO classes (their weights in the bandwidth auction).
    #[command(subcommand)]
    Tenant(control_cmd::TenantCmd),
    /// Show or switch the bandwidth auction (Flint's slices of each
    /// drive's bandwidth, shared fairly between volumes).
    #[command(subcommand)]
    Auction(control_cmd::AuctionCmd),
    /// Print a new DH-HMAC-CHAP secret (`DHHC-1:hh:...:`, as `nvme
    /// gen-dhchap-key` does) for `[[subsystem.dhchap]]` and `nvme connect
    /// --dhchap-secret`.
    GenDhchapKey {
        /// Transform the key per NQN with this hash: 0 (none), 1 (SHA-256),
        /// 2 (SHA-384) or 3 (SHA-512); the key is that hash's length.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=3))]
        hmac: u8,
        /// Key length in bytes without a transform: 32, 48 or 64.
        #[arg(long, default_value_t = 32)]
        key_length: usize,
    },
    /// Validate a target configuration file and print what it defines.
    CheckConfig {
        /// TOML configuration file.
        config: std::path::PathBuf,
    },
}

/// A fresh DH-HMAC-CHAP secret on stdout.
fn gen_dhchap_key(hmac: u8, key_length: usize) -> Result<()> {
    let transform = sluice_auth::HashId::from_id(hmac);
    let len = transform.map_or(key_length, sluice_auth::HashId::len_bytes);
    if !matches!(len, 32 | 48 | 64) {
        anyhow::bail!("--key-length must be 32, 48 or 64 (got {len})");
    }
    let mut key = vec![0u8; len];
    if !sluice_auth::os_random(&mut key) {
        anyhow::bail!("the operating system gave no random bytes");
    }
    let secret = sluice_auth::Secret::new(key, transform).context("building the secret")?;
    println!("{}", secret.to_dhhc());
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs redirected to files stay greppable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let r: Result<()> = match cli.command {
        Command::Target(a) => target_cmd::run(a),
        Command::CheckConfig { config } => target_cmd::check(&config),
        Command::GenDhchapKey { hmac, key_length } => gen_dhchap_key(hmac, key_length),
        Command::Bench(a) => host_cmd::bench(*a),
        Command::Discover(a) => host_cmd::discover(a),
        Command::Resv(c) => resv_cmd::run(c),
        Command::Top(a) => top_cmd::run(a),
        Command::Nbd(a) => export_cmd::nbd(a),
        Command::Fuse(a) => export_cmd::fuse(a),
        Command::Control(a) => control_cmd::control(a),
        Command::Drive(c) => control_cmd::drive(c),
        Command::Volume(c) => control_cmd::volume(c),
        Command::Tenant(c) => control_cmd::tenant(c),
        Command::Auction(c) => control_cmd::auction(c),
    };
    if let Err(e) = r {
        eprintln!("error: {}", error_text(&e));
        std::process::exit(1);
    }
}

/// An error and its causes, `: `-joined as `{:#}` does, leaving out a cause
/// whose text a message before it already holds (library errors such as
/// "cannot listen on ADDR: {source}" print their source and also return it
/// from `source()`).
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_text;
    use std::io;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on {addr}: {source}")]
    struct Listen {
        addr: &'static str,
        source: io::Error,
    }

    #[test]
    fn an_error_prints_each_cause_once() {
        let in_use = || io::Error::from(io::ErrorKind::AddrInUse);
        let e = anyhow::Error::new(Listen {
            addr: "127.0.0.1:4420",
            source: in_use(),
        })
        .context("starting the target");
        assert_eq!(
            error_text(&e),
            format!(
                "starting the target: cannot listen on 127.0.0.1:4420: {}",
                in_use()
            )
        );
        let e = anyhow::anyhow!("no such file").context("reading `x.toml`");
        assert_eq!(error_text(&e), "reading `x.toml`: no such file");
    }
}
