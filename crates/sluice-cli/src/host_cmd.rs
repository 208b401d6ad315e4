//! Host-side subcommands: `sluice bench`, `sluice discover`.

use anyhow::{Context, Result};
use clap::Args;
use sluice_host::ConnectOptions;
use std::net::{SocketAddr, ToSocketAddrs};

pub fn bench(args: sluice_bench::BenchArgs) -> Result<()> {
    let json = args.json;
    let report = sluice_bench::run(args).context("running the benchmark")?;
    if json {
        println!("{}", report.to_json());
    } else {
        report.print_table();
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct DiscoverArgs {
    /// Discovery service address, e.g. 127.0.0.1:8009.
    #[arg(long, short = 'a', default_value = "127.0.0.1:8009")]
    pub addr: String,
    /// Host NQN to present.
    #[arg(long)]
    pub hostnqn: Option<String>,
}

pub fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("resolving `{addr}` (expected host:port)"))?
        .next()
        .with_context(|| format!("`{addr}` resolves to no address"))
}

pub fn discover(a: DiscoverArgs) -> Result<()> {
    let addr = resolve(&a.addr)?;
    let mut opts = ConnectOptions::default();
    if let Some(h) = a.hostnqn {
        opts.hostnqn = h;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let entries = rt
        .block_on(sluice_host::discover(addr, &opts))
        .with_context(|| format!("discovering {addr}"))?;
    println!("{} discovery log entries from {addr}", entries.len());
    for (i, e) in entries.iter().enumerate() {
        let kind = match e.subtype {
            1 => "referral",
            2 => "nvme subsystem",
            3 => "current discovery subsystem",
            _ => "unknown",
        };
        println!("=====Discovery Log Entry {i}======");
        println!(
            "subtype: {kind}\ntraddr:  {}\ntrsvcid: {}\nsubnqn:  {}\ntreq:    {:#x}\n",
            e.traddr, e.trsvcid, e.subnqn, e.treq
        );
    }
    Ok(())
}
